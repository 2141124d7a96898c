"""The readers of an all_gather ring: what each round computes from the shards it holds.

A `Consumer` is one dot reading the gathered tensor; a `Fused` consumer is several dots
whose products an elementwise epilogue combines; an `Assembly` writes the shards into
the gathered tensor for other readers. Each adds a round's blocks to its accumulator
(`accumulate`) and turns the last one into its result (`finish`): the `RingConsumer`
protocol the ring's rounds read. Also here: which dots become consumers, where their
rings go and which of them share one ring.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Protocol

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.dominance import after, divergent_between, dominates, program_order
from overlap_hlo.ir.dots import DotDims
from overlap_hlo.ir.lookthrough import View, ViewedUse, replay
from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.passes.epilogue import Epilogue, block_type_for, find_epilogue
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import require_supported_types


class RingConsumer(Protocol):
    """What an all_gather ring's rounds read of each of its consumers."""

    inputs: list[ir.Value] | tuple   # values each round reads besides the shard
    dots: int                        # products per shard
    result_dim: int | None           # None: the rounds sum into one accumulator

    @property
    def acc_type(self) -> ir.RankedTensorType: ...   # what the ring carries for it

    def accumulate(self, acc: ir.Value | None, shards: list[ir.Value],
                   shifts: list[tuple[int, object]], inputs: list[ir.Value],
                   position: ir.Value, n: int, gather_dim: int,
                   shared: bool = False, serial: bool = False) -> ir.Value: ...

    def finish(self, acc: ir.Value) -> ir.Value: ...   # the ring's result for it


@dataclass(frozen=True)
class Consumer:
    """One dot reading the gathered tensor, and how the gathered dim enters it."""

    dot: ir.Operation
    gathered: int          # which dot operand reads the gathered tensor
    kind: str              # "free", "contracting" or "batch"
    dim: int               # the gathered dim in that operand (after the views)
    result_dim: int | None
    other_dim: int | None
    views: tuple[View, ...]  # between the gather and the dot, replayed on each block
    reads: tuple[ir.Value, ...]   # what the views read: scales, slice start indices
    block: int               # one shard's size along `dim` (after the views)
    f32_sums: bool = False   # sum a contracting dim's products in f32 (narrow floats)
    anchor: ir.Operation | None = None  # where its ring goes: the dot, or the region op
                                        # (if/case, device-dependent while) it sits in

    @property
    def inputs(self) -> list[ir.Value]:
        """Values each round reads besides the shard: the other operand, the views'."""
        return [self.dot.operands[1 - self.gathered], *self.reads]

    dots = 1   # products per shard

    @property
    def result_type(self) -> ir.RankedTensorType:
        return self.dot.results[0].type

    @property
    def acc_type(self) -> ir.RankedTensorType:
        if self.result_dim is None and (self.f32_sums
                                        or narrow_range(self.result_type.element_type)):
            return accumulator_type(self.result_type)
        return self.result_type

    def accumulate(self, acc: ir.Value | None, shards: list[ir.Value],
                   shifts: list[tuple[int, object]], inputs: list[ir.Value],
                   position: ir.Value, n: int, gather_dim: int,
                   shared: bool = False, serial: bool = False) -> ir.Value:
        """Add this step's blocks to `acc`.

        Blocks of a free or batch dim are disjoint blocks of the result: one dot per
        shard, each written in place (side by side, the shards would be copied into a
        buffer of twice their size first). Blocks of a contracting dim all add to the
        whole result: one dot over the shards side by side, so that one product of the
        result's size is added per round. `acc` is None in round 0 of a contracting
        dim: the first sum is the product. `shared`: the two shards may be one block
        (a shared round of the plan); where their offsets match, a contracting dim
        weights the other operand's two slices so that the block counts once
        (`builders.split_weight`), and a free or batch dim writes that block twice.
        `serial`: each block after the first waits for the one before to be written."""
        if self.result_dim is not None:
            for j, (shard, shift) in enumerate(zip(shards, shifts)):
                if serial and j:
                    acc, *inputs = b.barrier([acc, *inputs])
                part, offset = self.block_product(shard, shift, inputs, position, n)
                acc = b.update_dim(acc, part, self.result_dim, offset)
            return acc
        other, *reads = inputs
        block = self.block
        offsets = [b.block_offset(position, step, n, block, sign) for sign, step in shifts]
        viewed = replay(self.views, b.concat(shards, gather_dim), reads)
        slices = [b.slice_dim(other, self.other_dim, off, block) for off in offsets]
        if shared:
            slices = b.split_weight(b.equal(*offsets), *slices)
        other = b.concat(slices, self.other_dim)
        operands = [viewed, other] if self.gathered == 0 else [other, viewed]
        part = b.dot_like(self.dot, *operands, self.acc_type)
        return part if acc is None else b.add(part, acc)

    def block_product(self, shard: ir.Value, shift: tuple[int, object],
                      inputs: list[ir.Value], position: ir.Value, n: int
                      ) -> tuple[ir.Value, ir.Value]:
        """One shard's block of the result (free or batch dim) and its offset."""
        other, *reads = inputs
        sign, step = shift
        offset = b.block_offset(position, step, n, self.block, sign)
        viewed = replay(self.views, shard, reads)
        if self.other_dim is not None:
            other = b.slice_dim(other, self.other_dim, offset, self.block)
        operands = [viewed, other] if self.gathered == 0 else [other, viewed]
        part_type = b.with_dim(self.result_type, self.result_dim, self.block)
        return b.dot_like(self.dot, *operands, part_type), offset

    def finish(self, acc: ir.Value) -> ir.Value:
        return acc if acc.type == self.result_type else stablehlo.convert(self.result_type, acc)

    def replace(self, rewriter, result: ir.Value) -> None:
        """The dot's result becomes `result`."""
        rewriter.replace_op(self.dot, [result])


@dataclass(frozen=True)
class Fused:
    """Consumers whose products an elementwise epilogue combines (a gated MLP's
    `silu(g @ w_gate) * (g @ w_up)`): the ring computes every product's block and
    writes the epilogue's, so it keeps one buffer instead of one per dot."""

    members: tuple[Consumer, ...]
    epilogue: Epilogue

    @property
    def inputs(self) -> list[ir.Value]:
        return [value for member in self.members for value in member.inputs]

    @property
    def dots(self) -> int:
        return len(self.members)

    @property
    def result_dim(self) -> int:
        return self.members[0].result_dim

    @property
    def anchor(self) -> ir.Operation:
        return self.members[0].anchor

    @property
    def acc_type(self) -> ir.RankedTensorType:
        return self.epilogue.output.type

    def accumulate(self, acc, shards, shifts, inputs, position, n, gather_dim, shared=False,
                   serial=False):
        block_type = block_type_for(self.result_dim, self.members[0].block)
        for j, (shard, shift) in enumerate(zip(shards, shifts)):
            if serial and j:
                acc, *inputs = b.barrier([acc, *inputs])
            parts, rest = [], inputs
            for member in self.members:
                mine, rest = rest[:len(member.inputs)], rest[len(member.inputs):]
                part, offset = member.block_product(shard, shift, mine, position, n)
                parts.append(part)
            acc = b.update_dim(acc, self.epilogue.replay(parts, block_type), self.result_dim,
                               offset)
        return acc

    def finish(self, acc: ir.Value) -> ir.Value:
        return acc

    def replace(self, rewriter, result: ir.Value) -> None:
        """The epilogue's output becomes `result`; its ops and the dots go."""
        output = as_op(self.epilogue.output.owner)
        for op in reversed(self.epilogue.ops):
            if op == output:
                rewriter.replace_op(op, [result])
            else:
                rewriter.erase_op(op)
        for member in self.members:
            rewriter.erase_op(member.dot)


def fuse_epilogue(group: list[Consumer]) -> list[Consumer | Fused]:
    """`group` with the consumers whose results an elementwise epilogue combines (or
    one consumer's result that it transforms) replaced by one Fused consumer (placed
    where the first of them was), when there is one."""
    members = [c for c in group if c.result_dim is not None and c.anchor == c.dot]
    layouts = {(c.result_dim, c.block, tuple(c.result_type.shape)) for c in members}
    if not members or len(layouts) != 1:
        return group
    found = find_epilogue([c.dot.results[0] for c in members])
    if found is None:
        return group
    fused = Fused(tuple(members), found)
    first = group.index(members[0])
    return [c for c in group[:first]] + [fused] + [c for c in group[first:] if c not in members]


@dataclass(frozen=True)
class Assembly:
    """A pseudo-consumer of the ring: writes each shard it holds at its block of the
    gathered tensor, for readers other than the ring's dots."""

    gathered_type: ir.RankedTensorType
    block: int                # one shard's size along the gathered dim

    inputs = ()
    result_dim = 0            # not None: a buffer the ring writes whole
    dots = 0

    @property
    def acc_type(self) -> ir.RankedTensorType:
        return self.gathered_type

    def accumulate(self, acc, shards, shifts, inputs, position, n, gather_dim, shared=False,
                   serial=False):
        for shard, (sign, step) in zip(shards, shifts):
            offset = b.block_offset(position, step, n, self.block, sign)
            acc = b.update_dim(acc, shard, gather_dim, offset)
        return acc

    def finish(self, acc: ir.Value) -> ir.Value:
        return acc


def share_loops(consumers: list[Consumer]) -> list[list[Consumer]]:
    """Consumers (in program order) that can share one ring, built before the first.

    A consumer joins a group when its anchor sits in the same block as the group's
    first anchor and its other operand already exists there; the rest start groups of
    their own (e.g. a backward-pass dot whose other operand is computed later).
    """
    groups: list[list[Consumer]] = []
    for consumer in consumers:   # in program order
        for group in groups:
            head = group[0].anchor
            if (consumer.anchor.block == head.block and after(head, consumer.anchor)
                    and all(dominates(value, head) for value in consumer.inputs)):
                group.append(consumer)
                break
        else:
            groups.append([consumer])
    return groups


SUMS_LEFT_OUT = ("; its contracting-dim dot(s) read the gathered tensor the ring assembles "
                 "(predicted faster than summing them in the ring)")


def sums_left_out(placed: list[Consumer]) -> list[Consumer] | None:
    """The consumers of the site's other form: its free and batch dims' dots in the
    ring, its contracting dims' dots (a weight gradient, which in the ring would add a
    product of its result's size each round) reading the tensor the ring assembles,
    once, whole. The ring goes before the first of them all. None when the consumers
    are not of both kinds or the ring's inputs do not exist there."""
    ordered = in_program_order(placed)
    kept = [c for c in ordered if c.result_dim is not None]
    if not kept or len(kept) == len(ordered):
        return None
    first = ordered[0].anchor
    if first.block != kept[0].anchor.block or not all(
            dominates(value, first) for c in kept for value in c.inputs):
        return None
    return [dataclasses.replace(kept[0], anchor=first), *kept[1:]]


def in_program_order(consumers: list[Consumer]) -> list[Consumer]:
    """`consumers` sorted by where their rings go, then by their dots."""
    return sorted(consumers, key=functools.cmp_to_key(_program_order))


def _program_order(a: Consumer, b: Consumer) -> int:
    if a.anchor != b.anchor:
        return program_order(a.anchor, b.anchor)
    return program_order(a.dot, b.dot)


def place(consumer: Consumer, block: ir.Block, callers=None) -> Consumer | str:
    """`consumer` with the op its ring is built before, or why no place is legal.

    Every device of a group must reach the ring's permutes. Inside regions that the
    devices may not all execute equally often (if/case branches, a while whose trip
    count may differ), the ring goes before the outermost of them, in a block that
    executes like the all_gather's own, when the dot's other operand already exists
    there."""
    divergent = divergent_between(block, consumer.dot, callers)
    if not divergent:
        return dataclasses.replace(consumer, anchor=consumer.dot)
    outermost = divergent[-1]
    if all(dominates(value, outermost) for value in consumer.inputs):
        return dataclasses.replace(consumer, anchor=outermost)
    region = ("branch" if outermost.name in ("stablehlo.if", "stablehlo.case")
              else "loop whose trip count may differ between devices"
              if outermost.name == "stablehlo.while" else "region")
    return (f"dot inside a {outermost.name} {region}, its other operand computed there: "
            f"not every device would reach a ring placed there")


def consumer_of(use: ViewedUse, gathered: list[ir.Value], block: int,
                f32_sums: bool = False) -> Consumer:
    """The ring's consumer for one dot reading the gathered tensor (through `use`'s
    views): which operand, and what the gathered dim is to the dot."""
    dot = use.user
    operands = [i for i, operand in enumerate(dot.operands) if operand in gathered]
    if len(operands) != 1:
        raise Unsupported("the gathered tensor is both operands of the dot")
    require_supported_types(dot.results[0].type, dot.operands[1 - operands[0]].type)
    kind, result_dim, other_dim = DotDims.of(dot).classify(operands[0], use.dim)
    return Consumer(dot, operands[0], kind, use.dim, result_dim, other_dim, use.views,
                    tuple(use.reads), block * use.factor, f32_sums)

def narrow_range(element_type: ir.Type) -> bool:
    """f16 and 8-bit floats: per-round partial sums overflow where one dot, which
    accumulates in f32, does not; their rings always sum in f32."""
    return isinstance(element_type, ir.FloatType) and (
        element_type.width < 16 or isinstance(element_type, ir.F16Type))


def accumulator_type(result_type: ir.RankedTensorType) -> ir.RankedTensorType:
    """With f32-sums, partial products are summed in f32 for floats narrower than 32 bits."""
    elt = result_type.element_type
    if isinstance(elt, ir.FloatType) and elt.width < 32:
        return ir.RankedTensorType.get(result_type.shape, ir.F32Type.get())
    return result_type
