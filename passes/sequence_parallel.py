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

from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.module_pass import ModulePass, verification_error
from overlap_hlo.rewrite.site import Site, SiteLog

from .carried_shard import carry_shard, gather_at_top
from .row_rules import rows_of
from .shard_plan import BlockPlan, Component, Gathered, Move

__all__ = ["Component", "Gathered", "Move", "OverlapSequenceParallel"]


@dataclass(frozen=True)
class OverlapSequenceParallel(ModulePass):
    """Move row-wise ops after an all_gather onto the shard, up to the next dot."""

    name: ClassVar[str] = "overlap-sequence-parallel"
    root: ClassVar[type] = stablehlo.AllGatherOp
    creates: ClassVar[frozenset[str]] = frozenset({"stablehlo.all_gather"})
    summary: ClassVar[str] = (
        "all_gather -> row-wise ops (residual add, norms, activations) -> dot: the ops "
        "run on the shard, the all_gather moves next to the dot")
    # No options: nothing to decide, the bytes gathered never grow.

    def apply(self, module_op: ir.Operation, records: list[Site], broken: dict[int, str],
              careful: bool, log: SiteLog) -> tuple[int, str] | None:
        """Plan every block (no IR touched), then build the kept components, numbered
        in order as the driver's sites."""
        scan = self.module_scan(module_op, log)
        blocks: dict[int, ir.Block] = {}
        for op in scan.roots:
            blocks.setdefault(hash(op.block), op.block)
        notes: list = []   # (location, applied, facts), in the order they are found
        try:
            halves = {site.where for site in log.sites
                      if site.applied and site.pattern == "overlap-matmul-all-reduce"}
            planned = [_Block(block, scan, notes, halves) for block in blocks.values()]
            kept = [_carrying_shards(block, block.plan()) for block in planned]
        except Exception as err:   # noqa: BLE001 - nothing was touched: report and stop
            records.append(Site.of(module_op.location, log.input_name, self.name, False,
                                   **_internal(err)))
            return None
        number = 0
        for block, components in kept:
            for component in components:
                if number in broken:
                    notes.append((component.seeds[0].location, False,
                                  _internal(broken[number])))
                else:
                    try:
                        block.build(component)
                    except Exception as err:   # noqa: BLE001 - the driver restores the module
                        return number, f"{type(err).__name__}: {err}"
                    error = verification_error(module_op) if careful else None
                    if error is not None:
                        return number, f"the rewritten module does not verify: {error}"
                number += 1
        records.extend(Site.of(where, log.input_name, self.name, applied, **facts)
                       for where, applied, facts in notes)
        return None


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
    return dict(kind=Kind.INTERNAL_ERROR, reason=(
        f"internal error: moving ops onto the shard failed ({error}); these ops are left "
        "as they were (please report it)"))


class _Block(BlockPlan):
    """A block's plan (`BlockPlan`), and the building of the components it keeps."""

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
            carry_shard(c, ring, rows_of, self.scan)
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
                        operands.append(rows_of(value, dim, ring.size, position))
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
