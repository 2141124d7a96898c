"""overlap-sequence-parallel: move the ops after an all_gather onto the shard, so that
the all_gather reaches the next dot (Megatron's sequence parallelism, done by the
compiler).

After overlap-matmul-all-reduce, a tensor-parallel block reads
`x + all_gather(block)` and normalises it before the next dot. Those ops act on each
row of the gathered dim on its own, so they can run on this device's rows instead:
`slice(x) + block`, normalised, then gathered right before the dot. The all_gather
then feeds the dot and overlap-all-gather-matmul turns it into a ring, and the ops
run on 1/N of the rows.

An op moves onto the shard when each operand is either gathered (along one dim, over
one group) or the same on every device of the group (then it is sliced to this
device's rows), and the op keeps rows apart:
- elementwise ops (and `sdy.sharding_constraint`s that do not shard the dim);
- `broadcast_in_dim`, `transpose`, and a `reshape` that keeps the dim whole;
- a `reduce` over other dims (layernorm and RMSnorm statistics).
Any other reader of a moved value gets an all_gather of its shard. A group of moved
ops is kept only when one of those all_gathers feeds a dot and they move no more
bytes than the all_gathers that disappear; otherwise nothing changes.

"The same on every device of the group" is proved, not assumed: constants, values
entering the shard_map (`sdy.manual_computation`) unsharded along the group's mesh
axes, results of all_reduce or all_gather over the same groups, and pure ops of those.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-matmul-all-reduce{threshold-mib=0},overlap-sequence-parallel,overlap-all-gather-matmul{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.groups.meshes import find_mesh, module_of
from overlap_hlo.ir.dominance import callee, private_calls, replicated_gspmd_input
from overlap_hlo.ir.dots import tensor_bytes
from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.lookthrough import DOTS, users_through_views
from overlap_hlo.ir import ops
from overlap_hlo.ir.ops import as_op, contains
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import restore, verification_error
from overlap_hlo.rewrite.scan import ModuleScan
from overlap_hlo.rewrite.site import SiteLog

from .carried_shard import (Carried, can_carry_shard, carry_shard, gather_at_top,
                            loop_of_body)

# The shared elementwise ops, and more that keep elements apart (integer and bit ops,
# complex parts, CHLO's: `jnp.square` is `chlo.square`).
ELEMENTWISE = ops.ELEMENTWISE | frozenset(f"stablehlo.{name}" for name in (
    "bitcast_convert count_leading_zeros imag popcnt real reduce_precision shift_left "
    "shift_right_arithmetic shift_right_logical").split()) | frozenset(
    f"chlo.{name}" for name in (
        "acos acosh asin asinh atan atanh conj cosh digamma erf erf_inv erfc is_inf "
        "is_neg_inf is_pos_inf lgamma next_after polygamma sinh square tan zeta").split())
SHAPE_OPS = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.transpose",
                       "stablehlo.reshape", "stablehlo.reduce"})
# Ops whose result may differ between devices that read the same operands.
DEVICE_DEPENDENT = frozenset(f"stablehlo.{name}" for name in (
    "partition_id", "replica_id", "rng", "rng_bit_generator", "collective_permute",
    "collective_broadcast", "all_to_all", "reduce_scatter", "custom_call", "infeed",
    "outfeed", "send", "recv"))
VIEWS = frozenset({"sdy.sharding_constraint", "stablehlo.convert", "stablehlo.transpose",
                   "stablehlo.reshape"})
MAX_PROOF_DEPTH = 256   # deeper operand chains are not proved the same on every device


@dataclass
class Gathered:
    """A value that is the all_gather (along `dim`, like `seed`) of a shard."""

    dim: int
    seed: ir.Operation            # the all_gather whose groups it is gathered over
    component: int                # the group of moved ops it belongs to
    shard: ir.Value | None = None  # the seed's operand; a moved op's, once it is built


@dataclass
class Move:
    """An op to rebuild on the shard: per operand, its gathered dim (None: sliced
    along `slice_dims[i]`, or kept as it is when that is None too)."""

    op: ir.Operation
    result_dims: list[int]
    slice_dims: list[int | None]
    component: int


@dataclass
class Component:
    seeds: list[ir.Operation] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)


@dataclass(frozen=True)
class OverlapSequenceParallel:
    """Move row-wise ops after an all_gather onto the shard, up to the next dot."""

    name: ClassVar[str] = "overlap-sequence-parallel"
    root: ClassVar[type] = stablehlo.AllGatherOp
    summary: ClassVar[str] = (
        "all_gather -> row-wise ops (residual add, norms, activations) -> dot: the ops "
        "run on the shard, the all_gather moves next to the dot")

    @classmethod
    def options(cls) -> dict:
        return {}   # nothing to decide: the bytes gathered never grow

    @classmethod
    def from_options(cls, options: dict[str, str]) -> OverlapSequenceParallel:
        for key in options:
            raise ValueError(f"pass '{cls.name}' has no option '{key}' (it has none)")
        return cls()

    def run(self, module_op: ir.Operation, log: SiteLog) -> None:
        if not contains(module_op, self.root.OPERATION_NAME):
            return
        scan = ModuleScan(module_op, "", log.input_name)
        blocks: dict[int, ir.Block] = {}

        def visit(op):
            if op.name == self.root.OPERATION_NAME:
                block = op.block
                blocks.setdefault(hash(block), block)
            return ir.WalkResult.ADVANCE

        module_op.walk(visit)
        records: list = []
        try:
            halves = {site.where for site in log.sites
                      if site.applied and site.pattern == "overlap-matmul-all-reduce"}
            planned = [_Block(block, scan, records, halves) for block in blocks.values()]
            kept = [_carrying_shards(block, block.plan()) for block in planned]
        except Exception as err:   # noqa: BLE001 - nothing was touched: report and stop
            log.add(module_op.location, self.name, False, **_internal(err))
            return
        kept = [(block, components) for block, components in kept if components]
        if kept:
            where = kept[0][1][0].seeds[0].location   # read before building erases it
            snapshot = module_op.clone()
            try:
                for block, components in kept:
                    for component in components:
                        block.build(component)
                error = verification_error(module_op)
            except Exception as err:   # noqa: BLE001 - the module goes back as it was
                error = f"{type(err).__name__}: {err}"
            if error is not None:
                restore(module_op, snapshot)
                records = [r for r in records if not r[1]] + [(where, False, _internal(error))]
        for location, applied, facts in records:
            log.add(location, self.name, applied, **facts)


def _carrying_shards(block: _Block, components: list) -> tuple[_Block, list]:
    """`block` and its components, or, where a moved value is what its loop carries
    (a scanned layer's residual) and nothing else moved, the same block planned again
    with the loop carrying the shard. When that moves nothing either, the carried
    values' remarks."""
    if components or not block.carry_candidates:
        block.records.extend(block.carry_remarks)
        return block, components
    before = len(block.records)
    again = _Block(block.block, block.scan, block.records, block.halves,
                   {c.index: c for c in block.carry_candidates})
    moved = again.plan()
    if moved:
        return again, moved
    del block.records[before:]   # the second plan's remarks: the first one's stand
    block.records.extend(block.carry_remarks)
    return block, components


def _internal(error) -> dict:
    if isinstance(error, Exception):
        error = f"{type(error).__name__}: {error}"
    return dict(kind="internal error", reason=(
        f"internal error: moving ops onto the shard failed ({error}); the module is left "
        "as it was (please report it)"))


class _Block:
    """The moves in one block: planned from its all_gathers, then kept or dropped per
    component."""

    def __init__(self, block: ir.Block, scan: ModuleScan, records: list, halves: set,
                 carried: dict[int, Carried] | None = None):
        self.block, self.scan, self.records = block, scan, records
        self.halves = halves   # where all_reduce rings left their all_gather half
        self.carried = carried or {}   # the loop's carried shards, by index
        self.carry_candidates: list[Carried] = []   # values the loop could carry so
        self.carry_remarks: list = []   # their remarks, if it cannot
        self.gathered: dict[ir.Value, Gathered] = {}
        self.parent: list[int] = []              # union-find over components
        self.moved: set[ir.Operation] = set()
        self.moves: list[Move] = []
        self.same: dict[tuple[ir.Value, tuple], bool] = {}
        self.rings: dict[int, Ring | None] = {}
        self.stops: dict[int, tuple[ir.Operation, str]] = {}   # component -> (op, why)
        self.reported: set[int] = set()   # components with a remark

    # Planning: no IR is touched.

    def plan(self) -> list[Component]:
        """The components worth building (no IR touched)."""
        for index, carried in self.carried.items():   # the loop's argument is the shard
            argument = self.block.arguments[index]
            self.gathered[argument] = Gathered(carried.dim, carried.seed,
                                               self._new_component(), shard=argument)
        for op in self.block.operations:
            op = op.operation
            if op.name == "stablehlo.all_gather":
                if self._seed(op):
                    continue
            self._plan(op)
        if not self.moves:
            self.unmoved_remarks([])
            return []
        components: dict[int, Component] = {}
        for value, g in self.gathered.items():
            if isinstance(value, ir.OpResult) and g.seed == as_op(value.owner) \
                    and self._ring(g.seed) is not None:
                components.setdefault(self._find(g.component), Component()).seeds.append(g.seed)
        for move in self.moves:
            components.setdefault(self._find(move.component), Component()).moves.append(move)
        kept = [c for c in components.values() if c.moves and c.seeds and self._worth_it(c)]
        self.unmoved_remarks(kept)
        return kept

    def _seed(self, op: ir.Operation) -> bool:
        result = op.results[0].type
        if (len(op.operands) != 1 or len(op.results) != 1
                or not isinstance(result, ir.RankedTensorType) or not result.has_static_shape):
            return False
        dim = ir.IntegerAttr(op.attributes["all_gather_dim"]).value
        self.gathered[op.results[0]] = Gathered(dim, op, self._new_component(),
                                                shard=op.operands[0])
        return True

    def _plan(self, op: ir.Operation) -> None:
        inputs = [self.gathered.get(v) for v in op.operands]
        if not any(inputs) or op.name in DOTS:
            return
        stop = self._stop(op, inputs)
        if stop is not None:
            for g in inputs:
                if g:
                    self.stops.setdefault(g.component, (op, stop))
            return
        seed = next(g for g in inputs if g).seed
        result_dims, slice_dims = _row_rule(op, [g.dim if g else None for g in inputs])
        component = self._new_component()
        for g in inputs:
            if g:
                self._union(component, g.component)
        self.moves.append(Move(op, result_dims, slice_dims, component))
        self.moved.add(op)
        for value, dim in zip(op.results, result_dims):
            self.gathered[value] = Gathered(dim, seed, component)

    def _stop(self, op: ir.Operation, inputs: list) -> str | None:
        """Why `op`, which reads a gathered value, cannot move onto the shard (None:
        it can)."""
        if op.name not in ELEMENTWISE | SHAPE_OPS | {"sdy.sharding_constraint"}:
            return f"{op.name} is not an op that keeps the rows of the gathered dim apart"
        if len({_groups_key(g.seed) for g in inputs if g}) != 1:
            return f"{op.name} reads values gathered over different groups"
        seed = next(g for g in inputs if g).seed
        if self._ring(seed) is None:
            return "the all_gather's groups do not form a ring"
        if _row_rule(op, [g.dim if g else None for g in inputs]) is None:
            return f"{op.name} mixes the rows of the gathered dim"
        # an operand read whole (a reduce's init) or sliced must be the same everywhere
        for i, (v, g) in enumerate(zip(op.operands, inputs)):
            if not g and not self._same_everywhere(v, seed):
                source = v.owner
                made = ("a block argument" if isinstance(source, ir.Block)
                        else as_op(source).name)
                return (f"operand {i} of {op.name} ({made}) is not proved the same on "
                        "every device of the group")
        return None

    def _after_a_ring(self, seed: ir.Operation) -> bool:
        """`seed` is the all_gather half an all_reduce ring left (what this pass is
        for: other all_gathers' sites are the gather pass's to report)."""
        return Where.of(seed.location, self.scan.input_name) in self.halves

    def unmoved_remarks(self, kept: list[Component]) -> None:
        """A remark for each component after an all_reduce ring left where it is
        although its values reach a dot: the op that stopped it and why."""
        kept_roots = {self._find(m.component) for c in kept for m in c.moves}
        for component, (op, why) in self.stops.items():
            root = self._find(component)
            if (root in kept_roots or root in self.reported
                    or not _reaches_dot(op, self.scan.callers)):
                continue
            self.reported.add(root)
            seed = next(g.seed for g in self.gathered.values()
                        if self._find(g.component) == root)
            if not self._after_a_ring(seed):
                continue
            self.records.append((seed.location, False, dict(
                kind="not moved onto the shard", reason=(
                    f"the ops after the all_gather stay on the gathered rows: {why}, so "
                    "the all_gather does not reach the next dot"))))

    def _worth_it(self, component: Component) -> bool:
        """One of the new all_gathers feeds a dot, they move at most the bytes of the
        all_gathers that go, and not only views move (the gather pass sees through
        those). A component that would feed a dot but gathers more is reported."""
        added, feeds_dot = 0.0, False
        for move in component.moves:
            for value, dim in zip(move.op.results, move.result_dims):
                if self._read_elsewhere(value):
                    added += tensor_bytes(value.type)
                    feeds_dot |= any(use.user.name in DOTS
                                     for use in users_through_views(value, dim)[0])
        for index, carried in self.carried.items():   # the shard the loop carries
            argument = self.block.arguments[index]
            if self._find(self.gathered[argument].component) == \
                    self._find(component.moves[0].component) and self._read_elsewhere(argument):
                added += tensor_bytes(carried.loop.results[index].type)
                feeds_dot |= any(use.user.name in DOTS for use in
                                 users_through_views(argument, carried.dim)[0])
        removed = sum(tensor_bytes(seed.results[0].type) for seed in component.seeds
                      if not self._read_elsewhere(seed.results[0]))
        if all(move.op.name in VIEWS for move in component.moves):
            return False
        if not feeds_dot:
            callers = self.scan.callers
            carried = [m.op for m in component.moves for v in m.op.results
                       if _carried_by_loop(v, callers)]
            if carried and _reaches_dot(carried[0], callers) and \
                    self._after_a_ring(component.seeds[0]):
                self._carry_candidate(component)
                self.carry_remarks.append((component.seeds[0].location, False, dict(
                    kind="not moved onto the shard", reason=(
                        "the ops after the all_gather make a value the loop carries to "
                        "its next iteration (a scanned layer's residual), where a dot "
                        "reads it: moving them would need the loop to carry the shard, "
                        "which this pass does not do"))))
                self.reported.add(self._find(component.moves[0].component))
            return False
        if added > removed:
            self.reported.add(self._find(component.moves[0].component))
            self.records.append((component.seeds[0].location, False, dict(
                kind="more bytes to gather", reason=(
                    f"moving the {len(component.moves)} ops after the all_gather onto the "
                    f"shard would gather {(added - removed) / 2**20:.3g} MiB more than now "
                    "(values read whole elsewhere: the block's output, a reduction over "
                    "the gathered dim, a backward pass)"))))
            return False
        return True

    def _carry_candidate(self, component: Component) -> None:
        """Note the value of `component` that the loop around this block could carry
        as its shard: yielded as it is, whole when it enters the loop (the same on
        every device of the group), unread by the condition."""
        loop = loop_of_body(self.block)
        if loop is None or self.carried:
            return
        seed = component.seeds[0]
        terminator = as_op(list(self.block.operations)[-1])
        for move in component.moves:
            for value, dim in zip(move.op.results, move.result_dims):
                for use in value.uses:
                    index = use.operand_number
                    if (as_op(use.owner) == terminator and self._ring(seed) is not None
                            and can_carry_shard(loop, index, self._ring(seed).size, dim)
                            and self._same_everywhere(loop.operands[index], seed)):
                        self.carry_candidates.append(Carried(loop, index, dim, seed))

    def _read_elsewhere(self, value: ir.Value) -> bool:
        """Read by an op that does not move onto the shard (nor as the shard the loop
        carries)."""
        return any(as_op(use.owner) not in self.moved and not self._carried_yield(use)
                   for use in value.uses)

    def _carried_yield(self, use) -> bool:
        """`use` is the yield of a value the loop carries as its shard."""
        return (use.operand_number in self.carried
                and as_op(use.owner) == as_op(list(self.block.operations)[-1]))

    # Building.

    def build(self, component: Component) -> None:
        ring = self._ring(component.seeds[0])
        carried = [c for i, c in self.carried.items() if self._find(
            self.gathered[self.block.arguments[i]].component) ==
            self._find(component.moves[0].component)]
        for c in carried:
            argument = self.block.arguments[c.index]
            readers = [(as_op(u.owner), u.operand_number) for u in argument.uses
                       if as_op(u.owner) not in self.moved]
            whole = argument.type   # read before the loop carries the shard
            carry_shard(c, ring, _rows_of, self.scan)
            gather_at_top(self.block, argument, readers, c.seed, c.dim, whole, self.scan)
        first = self.block.operations[0]
        with first.location, ir.InsertionPoint(first):
            position = b.ring_position(ring)
        moved_here = [m.op for m in component.moves]
        location = component.seeds[0].location   # read before the seed goes
        for move in component.moves:
            op = move.op
            with op.location, ir.InsertionPoint(op):
                operands = []
                for value, dim in zip(op.operands, move.slice_dims):
                    g = self.gathered.get(value)
                    if g is not None:   # a seed's operand, or a moved op's clone
                        operands.append(g.shard)
                    elif dim is not None:
                        operands.append(_rows_of(value, dim, ring.size, position))
                    else:
                        operands.append(value)
                clone = op.clone(ip=ir.InsertionPoint(op))
                for i, value in enumerate(operands):
                    clone.operands[i] = value
                for result, dim in zip(clone.results, move.result_dims):
                    shape = result.type
                    result.set_type(b.with_dim(shape, dim, shape.shape[dim] // ring.size))
            for value, new in zip(op.results, clone.results):
                self.gathered[value].shard = new
        terminator = as_op(list(self.block.operations)[-1])
        for move in component.moves:
            for value in move.op.results:
                for use in list(value.uses):
                    if self._carried_yield(use):
                        terminator.operands[use.operand_number] = self.gathered[value].shard
                if self._read_elsewhere(value):
                    self._gather_before(move.op, value, component.seeds[0])
        for op in reversed(moved_here):
            op.erase()
        for seed in component.seeds:
            if not list(seed.results[0].uses):
                seed.erase()
        carries = "; the loop carries the residual's shard" if carried else ""
        self.records.append((location, True, dict(detail=(
            f"{len(moved_here)} ops after {len(component.seeds)} all_gather(s) moved onto "
            f"the shard; the all_gathers now feed the next dots{carries}"))))

    def _gather_before(self, op: ir.Operation, value: ir.Value, seed: ir.Operation) -> None:
        """Readers of `value` other than the moved ops read an all_gather of its shard,
        built right before `op` (its producer)."""
        g = self.gathered[value]
        with op.location, ir.InsertionPoint(op):
            gather = b.all_gather_like(seed, g.shard, g.dim, value.type, self.scan)
        value.replace_all_uses_with(gather)

    # Facts about values.

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
        key = (value, _groups_key(seed))
        if key in self.same:
            return self.same[key]
        if depth > MAX_PROOF_DEPTH:
            return False
        g = self.gathered.get(value)
        owner = value.owner
        if g is not None:
            found = _groups_key(g.seed) == _groups_key(seed)
        elif isinstance(owner, ir.Block):
            # Assumed while it is proved: a cycle through a loop or a call comes back
            # here, and the proof is an induction over iterations and calls.
            before = dict(self.same)
            self.same[key] = True
            found = (self._same_carried(value, seed, depth) if _loop_of(owner) else
                     self._same_argument(value, seed, depth) if _function_of(owner) else
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
                found = _groups_key(op) == _groups_key(seed)
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
        loop, i = _loop_of(value.owner), value.arg_number
        yielded = loop.regions[1].blocks[0].operations[-1].operands[i]
        return (self._same_everywhere(loop.operands[i], seed, depth + 1)
                and self._same_everywhere(yielded, seed, depth + 1))

    def _same_argument(self, value: ir.Value, seed: ir.Operation, depth: int) -> bool:
        """A private function's argument: every call passes a value that is the same
        everywhere."""
        calls = private_calls(_function_of(value.owner), self.scan.callers)
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

    def _new_component(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def _find(self, c: int) -> int:
        while self.parent[c] != c:
            self.parent[c] = self.parent[self.parent[c]]
            c = self.parent[c]
        return c

    def _union(self, a: int, b_: int) -> None:
        self.parent[self._find(b_)] = self._find(a)


MAX_DOT_SEARCH = 64   # ops looked at for a dot after an op that stopped a move


def _reaches_dot(op: ir.Operation, callers) -> bool:
    """A dot reads `op`'s results, through other ops, a loop's carry, an if/case or a
    private function that returns them (at most MAX_DOT_SEARCH ops)."""
    pending, seen = list(op.results), set()
    while pending and len(seen) < MAX_DOT_SEARCH:
        value = pending.pop()
        for use in value.uses:
            user = as_op(use.owner)
            if user.name in DOTS:
                return True
            if hash(user) in seen:
                continue
            seen.add(hash(user))
            pending.extend(_passed_on(use, callers))
    return False


def _passed_on(use, callers) -> list[ir.Value]:
    """The values that carry what `use` reads on: a loop's carried block argument, an
    if/case's or a private function's callers' results, a callee's argument, or the
    reader's results."""
    user = as_op(use.owner)
    if _yields_to_loop(use):
        return [user.block.arguments[use.operand_number]]
    if user.name == "stablehlo.return" and user.parent is not None:
        return [as_op(user.parent).results[use.operand_number]]
    if user.name == "func.return":
        calls = private_calls(as_op(user.parent), callers) or []
        return [call.results[use.operand_number] for call in calls]
    if user.name == "func.call":
        func = callee(user)
        return [] if func is None else [func.regions[0].blocks[0].arguments[use.operand_number]]
    return list(user.results)


def _carried_by_loop(value: ir.Value, callers, limit: int = 8) -> bool:
    """`value` is what a while body yields, directly or returned by the functions that
    body calls."""
    pending = [value]
    while pending and limit > 0:
        limit -= 1
        for use in pending.pop().uses:
            if _yields_to_loop(use):
                return True
            if as_op(use.owner).name == "func.return":
                pending.extend(_passed_on(use, callers))
    return False


def _yields_to_loop(use) -> bool:
    """`use` is a while body's return of the value the loop carries next."""
    user = as_op(use.owner)
    parent = user.parent
    return (user.name == "stablehlo.return" and parent is not None
            and parent.name == "stablehlo.while"
            and user.block == as_op(parent).regions[1].blocks[0])


def _groups_key(collective: ir.Operation) -> tuple:
    """Equal for collectives over the same groups of the same kind of ids."""
    attrs = collective.attributes
    return (hash(attrs["replica_groups"]), "use_global_device_ids" in attrs,
            "channel_handle" in attrs)


def _row_rule(op: ir.Operation, dims: list[int | None]
              ) -> tuple[list[int], list[int | None]] | None:
    """(each result's gathered dim, each operand's slice dim) when `op` keeps the rows of
    the gathered dim apart, else None. `dims`: each operand's gathered dim or None."""
    name = op.name
    known = {d for d in dims if d is not None}
    if len(known) != 1:
        return None
    dim = known.pop()
    shapes = [v.type for v in op.operands] + [r.type for r in op.results]
    if not all(isinstance(t, ir.RankedTensorType) and t.has_static_shape for t in shapes):
        return None
    if name in ELEMENTWISE or name == "sdy.sharding_constraint":
        shape = op.results[0].type.shape
        if any(list(v.type.shape) != list(shape) for v in op.operands):
            return None
        if name == "sdy.sharding_constraint" and _shards_dim(op, dim):
            return None
        return [dim] * len(op.results), [None if d is not None else dim for d in dims]
    if name == "stablehlo.broadcast_in_dim":
        mapped = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        return [mapped[dim]], [None]
    if name == "stablehlo.transpose":
        permutation = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        return [permutation.index(dim)], [None]
    if name == "stablehlo.reshape":
        before, after = op.operands[0].type.shape, op.results[0].type.shape
        prefix = int(np.prod(before[:dim], dtype=object))
        for out in range(len(after)):
            if int(np.prod(after[:out], dtype=object)) == prefix and after[out] == before[dim]:
                return [out], [None]
        return None
    if name == "stablehlo.reduce":
        half = len(op.operands) // 2
        if any(d != dim for d in dims[:half]) or any(d is not None for d in dims[half:]):
            return None
        reduced = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        if dim in reduced:
            return None
        out = dim - sum(1 for r in reduced if r < dim)
        return [out] * len(op.results), [None] * len(op.operands)
    return None


def _function_of(block: ir.Block) -> ir.Operation | None:
    """The func.func whose body is `block`, if it is one."""
    parent = block.owner
    if parent is None or as_op(parent).name != "func.func":
        return None
    return as_op(parent)


def _loop_of(block: ir.Block) -> ir.Operation | None:
    """The stablehlo.while whose region holds `block`, if it is one."""
    parent = block.owner
    if parent is None or as_op(parent).name != "stablehlo.while":
        return None
    return as_op(parent)


def _shards_dim(op: ir.Operation, dim: int) -> bool:
    sharding = sdy.TensorShardingAttr(op.attributes["sharding"])
    dims = list(sharding.dimension_shardings)
    return dim < len(dims) and len(sdy.DimensionShardingAttr(dims[dim]).axes) > 0


def _rows_of(value: ir.Value, dim: int, parts: int, position: ir.Value) -> ir.Value:
    """This device's rows of `value` (the same on every device of the group) along
    `dim`: a smaller broadcast of the source's rows when `value` is a broadcast (the
    whole one is never built), else a dynamic_slice."""
    vtype = value.type
    rows = vtype.shape[dim] // parts
    source, dims = ops.broadcast_source(value)
    offset = None
    if dims is None or ops.varies_along(source, dims, dim):
        offset = b.block_offset(position, 0, parts, rows)
    if dims is not None:
        return b.broadcast_rows(source, dims, b.with_dim(vtype, dim, rows), dim, offset)
    return b.slice_dim(value, dim, offset, rows)
