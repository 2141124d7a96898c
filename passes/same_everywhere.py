"""Facts overlap-sequence-parallel proves about values: the ring of an all_gather, and
whether a value is the same on every device of its groups.

"The same on every device of the group" is proved, not assumed: constants, values
entering the shard_map unsharded along the group's mesh axes (Shardy) or replicated
(GSPMD), results of all_reduce or all_gather over the same groups, and pure ops of
those, through loops (an induction over iterations) and calls.
"""
from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.groups.meshes import find_mesh, module_of
from overlap_hlo.ir.dominance import callee, private_calls, replicated_gspmd_input
from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Unsupported

from .row_rules import (DEVICE_DEPENDENT, MAX_PROOF_DEPTH, function_of, groups_key,
                        loop_of)


class ValueFacts:
    """Proofs over a block's values; the block keeps `scan`, `gathered` (value ->
    Gathered), `same` and `rings` (the proofs' caches)."""

    def _ring(self, seed: ir.Operation) -> Ring | None:
        key = hash(seed)
        if key not in self.rings:
            try:
                ring = Ring.from_collective(seed, self.scan)
            except Unsupported:
                ring = None
            self.rings[key] = ring
        return self.rings[key]

    def _same_everywhere(self, value: ir.Value, seed: ir.Operation, depth: int = 0) -> bool:
        """`value` is the same on every device of each of `seed`'s groups."""
        key = (value, groups_key(seed))
        if key in self.same:
            return self.same[key]
        if depth > MAX_PROOF_DEPTH:
            return False
        g = self.gathered.get(value)
        owner = value.owner
        if g is not None:
            found = groups_key(g.seed) == groups_key(seed)
        elif isinstance(owner, ir.Block):
            # Assumed while it is proved: a cycle through a loop or a call comes back
            # here, and the proof is an induction over iterations and calls.
            before = dict(self.same)
            self.same[key] = True
            found = (self._same_carried(value, seed, depth) if loop_of(owner) else
                     self._same_argument(value, seed, depth) if function_of(owner) else
                     self._unsharded_argument(value, seed))
            if not found:
                self.same.clear()
                self.same.update(before)   # facts proved under the failed assumption go
        else:
            op = as_op(owner)
            name = op.name
            if name == "func.call":
                func = callee(op)
                found = func is not None and self._same_everywhere(
                    as_op(func.regions[0].blocks[0].operations[-1]).operands[
                        value.result_number], seed, depth + 1)
            elif name in ("stablehlo.all_reduce", "stablehlo.all_gather"):
                found = groups_key(op) == groups_key(seed)
            elif name == "sdy.sharding_constraint":   # a propagation hint: its operand
                found = self._same_everywhere(op.operands[0], seed, depth + 1)
            elif replicated_gspmd_input(op):
                found = True
            elif (not name.startswith(("stablehlo.", "chlo.")) or name in DEVICE_DEPENDENT
                  or (len(op.regions) and name != "stablehlo.reduce")):
                found = False
            else:
                found = all(self._same_everywhere(v, seed, depth + 1) for v in op.operands)
        self.same[key] = found
        return found

    def _same_carried(self, value: ir.Value, seed: ir.Operation, depth: int) -> bool:
        """A while loop's carried value: the same everywhere when it enters the loop and
        when the body yields it."""
        loop, i = loop_of(value.owner), value.arg_number
        yielded = loop.regions[1].blocks[0].operations[-1].operands[i]
        return (self._same_everywhere(loop.operands[i], seed, depth + 1)
                and self._same_everywhere(yielded, seed, depth + 1))

    def _same_argument(self, value: ir.Value, seed: ir.Operation, depth: int) -> bool:
        """A private function's argument: every call passes a value that is the same
        everywhere."""
        calls = private_calls(function_of(value.owner), self.scan.callers)
        return bool(calls) and all(
            self._same_everywhere(call.operands[value.arg_number], seed, depth + 1)
            for call in calls)

    def _unsharded_argument(self, value: ir.Value, seed: ir.Operation) -> bool:
        """A shard_map input that devices of one group hold the same of: its
        in_sharding does not split it over the mesh axes the group spans."""
        computation = value.owner.owner
        if computation is None or as_op(computation).name != "sdy.manual_computation":
            return False
        computation = as_op(computation)
        shardings = sdy.TensorShardingPerValueAttr(
            computation.attributes["in_shardings"]).shardings
        sharding = sdy.TensorShardingAttr(shardings[value.arg_number])
        axes = []
        for dim in sharding.dimension_shardings:
            for axis in sdy.DimensionShardingAttr(dim).axes:
                axis = sdy.AxisRefAttr(axis)
                if axis.sub_axis_info is not None:
                    return False
                axes.append(axis.name)
        if not axes:
            return True
        ref = sharding.mesh_or_ref
        if not isinstance(ref, ir.FlatSymbolRefAttr):
            return False
        try:
            mesh = find_mesh(module_of(computation), ref.value)
        except Unsupported:
            return False
        ring = self._ring(seed)
        if mesh.has_device_ids or ring is None or ring.kind != "partition":
            return False
        sizes = [size for _, size in mesh.axes]
        coords = np.array(np.unravel_index(np.arange(mesh.size), sizes)).T
        columns = [mesh.names.index(a) for a in axes]
        return all(len({tuple(coords[d][columns]) for d in group}) == 1
                   for group in ring.groups)
