"""overlap-all-gather-matmul: all_gather -> dot_general as a ring of collective_permutes.

For each dot_general that reads the result of a stablehlo.all_gather, the dot is
replaced by a loop in which every step multiplies the shard it holds while a
collective_permute moves that shard to the neighbouring device. After k shifts the
device at ring position p holds the shard of position (p + k) mod N, so its block
index is j = (p + k) mod N:

- gathered dim is a free dim of the dot: the step's product is block j of the result
  (written with dynamic_update_slice);
- a contracting dim: the other operand is sliced to block j (dynamic_slice) and the
  products are summed (in f32 for narrower float types);
- a batch dim: the other operand's batch block j is sliced and the result's batch
  block j written.

The last step is peeled out of the loop, so the loop runs N-1 steps, each with one
permute that neither feeds nor reads that step's dot. When something else reads the
gathered tensor after the first ring (a residual kept for the backward pass, a later
dot whose other operand does not exist yet), that ring also writes each shard it
holds into a buffer that replaces the all_gather: the data travels once. A reader
before the ring keeps the all_gather.

A ring is placed where every device of its groups executes it: a dot inside an
if/case branch or a while whose trip count may differ between devices gets its ring
before that region (when its other operand exists there), or is left unchanged.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo import builders as b
from overlap_hlo import cost
from overlap_hlo.collectives import Ring, Unsupported
from overlap_hlo.dominance import ancestor_in, divergent_between, dominates
from overlap_hlo.dots import DotDims, flops
from overlap_hlo.lookthrough import View, ViewedUse, erase_unused, replay, users_through_views
from overlap_hlo.rewrite_pass import NoMatch, RewritePass, mib, require_supported_types


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
    scales: tuple[ir.Value, ...]  # what the views' dequantizing multiplies broadcast
    block: int               # one shard's size along `dim` (after the views)
    anchor: ir.Operation | None = None  # where its ring goes: the dot, or the region op
                                        # (if/case, device-dependent while) it sits in

    @property
    def inputs(self) -> list[ir.Value]:
        """Values each round reads besides the shard: the other operand, the scales."""
        return [self.dot.operands[1 - self.gathered], *self.scales]

    @property
    def result_type(self) -> ir.RankedTensorType:
        return self.dot.results[0].type

    @property
    def acc_type(self) -> ir.RankedTensorType:
        return accumulator_type(self.result_type) if self.result_dim is None else self.result_type

    def accumulate(self, acc: ir.Value | None, shards: list[ir.Value],
                   shifts: list[tuple[int, object]], inputs: list[ir.Value],
                   position: ir.Value, n: int, gather_dim: int) -> ir.Value:
        """Add this step's blocks to `acc`: one dot over the shards side by side.

        `acc` is None in round 0 of a contracting dim: the first sum is the product."""
        other, *scales = inputs
        block = self.block
        offsets = [b.block_offset(position, step, n, block, sign) for sign, step in shifts]
        viewed = replay(self.views, b.concat(shards, gather_dim), scales)
        if self.other_dim is not None:
            other = b.concat([b.slice_dim(other, self.other_dim, off, block) for off in offsets],
                             self.other_dim)
        operands = [viewed, other] if self.gathered == 0 else [other, viewed]
        if self.result_dim is None:
            part = b.dot_like(self.dot, *operands, self.acc_type)
            return part if acc is None else b.add(acc, part)
        part_type = b.with_dim(self.result_type, self.result_dim, block * len(shards))
        part = b.dot_like(self.dot, *operands, part_type)
        for i, offset in enumerate(offsets):
            piece = b.static_slice(part, self.result_dim, i * block, block)
            acc = b.update_dim(acc, piece, self.result_dim, offset)
        return acc

    def finish(self, acc: ir.Value) -> ir.Value:
        return acc if acc.type == self.result_type else stablehlo.convert(self.result_type, acc)


@dataclass(frozen=True)
class OverlapAllGatherMatmul(RewritePass):
    """Decompose all_gather -> dot_general into a collective_permute loop."""

    name = "overlap-all-gather-matmul"
    root = stablehlo.AllGatherOp
    summary = "all_gather feeding dot_general -> loop of collective_permute + partial dots"

    def rewrite_site(self, op, rewriter, scan):
        gather = op.operation
        dim = ir.IntegerAttr(gather.attributes["all_gather_dim"]).value
        uses, values = users_through_views(gather.results[0], dim)
        dots = []
        for use in uses:
            if use.user.name == "stablehlo.dot_general" and all(d.user != use.user for d in dots):
                dots.append(use)
        if len(gather.operands) != 1:
            if any(use.user.name == "stablehlo.dot_general"
                   for result in gather.results
                   for use in users_through_views(result, dim)[0]):
                raise Unsupported(f"variadic all_gather ({len(gather.operands)} operands)",
                                  kind="variadic all_gather")
            raise NoMatch
        if not dots:
            if any(use.user.name == "stablehlo.optimization_barrier" for use in uses):
                raise Unsupported("an optimization_barrier separates it from its users")
            raise NoMatch
        ring = Ring.from_collective(gather, scan)
        shard = gather.operands[0]
        require_supported_types(shard.type, gather.results[0].type)
        block = shard.type.shape[dim]
        if block * ring.size != gather.results[0].type.shape[dim]:
            raise Unsupported(f"gathered dim {gather.results[0].type.shape[dim]} is not "
                              f"{ring.size} x {block}")
        placed, unplaced = [], []
        for use in dots:
            consumer = place(analyze(use, values, block), gather.block)
            (placed if isinstance(consumer, Consumer) else unplaced).append(consumer)
        if not placed:
            raise Unsupported(unplaced[0], kind="divergent control flow")
        groups = share_loops(sorted(placed, key=functools.cmp_to_key(_program_order)))
        others = [use for use in uses if all(use.user != c.dot for c in groups[0])]
        reused = None
        if others and all(after(groups[0][0].anchor, use.views[0].op if use.views else use.user)
                          for use in others):
            # Everything else reads the gathered tensor after the first ring: that ring
            # writes each shard it holds into a buffer that replaces the all_gather, and
            # the other readers (later dots included) read the buffer; nothing is sent twice.
            reused = [c for group in groups[1:] for c in group]
            groups = groups[:1]
        consumers = [c for group in groups for c in group]
        kinds = ", ".join(f"{c.kind} dim" + "".join(f" through {v.op.name}" for v in c.views)
                          + (f" hoisted out of {c.anchor.name}" if c.anchor != c.dot else "")
                          for c in consumers)
        detail = (f"{len(consumers)} dot(s) ({kinds}), {gather.results[0].type} gathered "
                  f"over groups of {ring.size}")
        if len(groups) > 1:
            detail += f", {len(groups)} loops"
        if unplaced:
            detail += f"; {len(unplaced)} dot(s) left reading it: " + "; ".join(unplaced)
        if reused is not None:
            detail += (f"; the ring assembles the gathered tensor for {len(others)} other "
                       "reader(s)" + (f", {len(reused)} of them dot(s) with no ring of their "
                                      "own" if reused else ""))
        elif others:
            detail += (f"; the all_gather stays for {len(others)} other reader(s) that the "
                       "ring's result would not reach")
        assembly = None if reused is None else Assembly(gather.results[0].type, block)
        ring_dots = [c.dot for c in consumers]
        rounds = cost.gather_rounds(ring.size, self.bidirectional)
        estimate = self.decide(gather.results[0].type, cost.SiteShape(
            ring.size, sum(flops(dot) for dot in ring_dots),
            cost.element_name(ring_dots[0].operands[0].type.element_type),
            mib(shard.type) * 2**20, rounds, exposed_round=-1,
            loop_iterations=uniform_rounds(rounds) // self.unroll), detail)
        if ring.uses_channel:
            scan.require_channels(len(groups) * permute_count(ring.size, self))
        buffer = None
        for i, group in enumerate(groups):
            extra = [assembly] if assembly is not None and i == 0 else []
            with ir.InsertionPoint(group[0].anchor):
                results = emit_loop(group + extra, shard, dim, ring, self, scan.new_channel)
            for consumer, result in zip(group, results):
                rewriter.replace_op(consumer.dot, [result])
            if extra:
                buffer = results[-1]
        erase_unused(rewriter, values)
        if buffer is not None:
            rewriter.replace_op(gather, [buffer])
        return detail, estimate


@dataclass(frozen=True)
class Assembly:
    """A pseudo-consumer of the ring: writes each shard it holds at its block of the
    gathered tensor, for readers other than the ring's dots."""

    gathered_type: ir.RankedTensorType
    block: int                # one shard's size along the gathered dim

    inputs = ()
    result_dim = 0            # not None: the buffer starts as zeros

    @property
    def acc_type(self) -> ir.RankedTensorType:
        return self.gathered_type

    def accumulate(self, acc, shards, shifts, inputs, position, n, gather_dim):
        for shard, (sign, step) in zip(shards, shifts):
            offset = b.block_offset(position, step, n, self.block, sign)
            acc = b.update_dim(acc, shard, gather_dim, offset)
        return acc

    def finish(self, acc: ir.Value) -> ir.Value:
        return acc


def after(anchor: ir.Operation, op: ir.Operation) -> bool:
    """A value built just before `anchor` is available at `op`."""
    at = ancestor_in(anchor.block, op)
    return at is not None and (at == anchor or anchor.is_before_in_block(at))


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
            if (consumer.anchor.block == head.block
                    and all(dominates(value, head) for value in consumer.inputs)):
                group.append(consumer)
                break
        else:
            groups.append([consumer])
    return groups


def _program_order(a: Consumer, b: Consumer) -> int:
    x, y = (a.anchor, b.anchor) if a.anchor != b.anchor else (a.dot, b.dot)
    if x.block != y.block:
        return 0
    return -1 if x.is_before_in_block(y) else (1 if x != y else 0)


def place(consumer: Consumer, block: ir.Block) -> Consumer | str:
    """`consumer` with the op its ring is built before, or why no place is legal.

    Every device of a group must reach the ring's permutes. Inside regions that the
    devices may not all execute equally often (if/case branches, a while whose trip
    count may differ), the ring goes before the outermost of them, in a block that
    executes like the all_gather's own, when the dot's other operand already exists
    there."""
    divergent = divergent_between(block, consumer.dot)
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


def analyze(use: ViewedUse, gathered: list[ir.Value], block: int) -> Consumer:
    dot = use.user
    operands = [i for i, operand in enumerate(dot.operands) if operand in gathered]
    if len(operands) != 1:
        raise Unsupported("the gathered tensor is both operands of the dot")
    require_supported_types(dot.results[0].type, dot.operands[1 - operands[0]].type)
    kind, result_dim, other_dim = DotDims.of(dot).classify(operands[0], use.dim)
    return Consumer(dot, operands[0], kind, use.dim, result_dim, other_dim, use.views,
                    tuple(use.scales), block * use.factor)


def emit_loop(consumers: list[Consumer], shard: ir.Value, gather_dim: int,
              ring: Ring, options: RewritePass, channels) -> list[ir.Value]:
    """One ring for all `consumers`, built at the current insertion point.

    Round 0 multiplies the device's own shard while sending it on; round r multiplies
    the shard of position p + r (and p - r from the second stream when bidirectional)
    while sending both on; the last round sends nothing. For even N the two streams
    meet at p + N/2: the up stream's last send is left out.
    """
    n = ring.size
    plan = cost.gather_rounds(n, options.bidirectional)   # blocks per round
    streams = max(plan)
    rounds = len(plan) - 1                                # rounds after round 0
    last_has_up = plan[-1] == 2

    def send(values):
        """Shift stream 0 down the ring and stream 1 up (each permute a fresh channel)."""
        return [b.collective_permute(v, ring.shift_pairs(sign),
                                     channels() if ring.uses_channel else None)
                for v, sign in zip(values, (+1, -1))]

    def step(k, held, accs, invariants, up=True):
        *inputs, position = invariants
        shifts = [(+1, k), (-1, k)][:len(held) if up else 1]
        results = []
        for consumer, acc in zip(consumers, accs):
            mine, inputs = inputs[:len(consumer.inputs)], inputs[len(consumer.inputs):]
            results.append(consumer.accumulate(acc, held[:len(shifts)], shifts, mine,
                                               position, n, gather_dim))
        return results

    def middle(k, carried, invariants):
        held, accs = carried[:streams], carried[streams:]
        return [*send(held), *step(k, held, accs, invariants)]

    position = b.ring_position(ring)
    invariants = [value for c in consumers for value in c.inputs] + [position]
    accs = [None if c.result_dim is None else b.zeros(c.acc_type) for c in consumers]
    accs = step(0, [shard], accs, invariants)
    carried = send([shard] * streams) + accs
    uniform_end = 1 + uniform_rounds(plan)
    carried = b.unrolled_rounds(1, uniform_end, options.unroll, carried, invariants, middle)
    held = streams
    if uniform_end < rounds:   # both streams multiply, only the down stream sends on
        shards, accs = carried[:streams], carried[streams:]
        carried = send(shards[:1]) + step(uniform_end, shards, accs, invariants)
        held = 1
    accs = step(rounds, carried[:held], carried[held:], invariants, up=last_has_up)
    return [c.finish(acc) for c, acc in zip(consumers, accs)]


def permute_count(n: int, options: RewritePass) -> int:
    """How many collective_permute ops `emit_loop` builds for one ring (each needs a
    channel handle): the first sends, one loop body, the rounds after the loop."""
    plan = cost.gather_rounds(n, options.bidirectional)
    streams, rounds = max(plan), len(plan) - 1
    uniform_end = 1 + uniform_rounds(plan)
    loop_rounds = uniform_end - 1
    iterations = loop_rounds // options.unroll
    inline = loop_rounds - iterations * options.unroll
    body = options.unroll if iterations else 0
    return streams * (1 + body + inline) + (1 if uniform_end < rounds else 0)


def uniform_rounds(plan: list[int]) -> int:
    """Rounds of the ring's loop: all but round 0 and the last, and for even N with two
    streams also the round before the last (its up stream does not send)."""
    return max(len(plan) - 2 - (max(plan) == 2 and plan[-1] == 1), 0)


def accumulator_type(result_type: ir.RankedTensorType) -> ir.RankedTensorType:
    """Sums of partial products run in f32 for float types narrower than 32 bits."""
    elt = result_type.element_type
    if isinstance(elt, ir.FloatType) and elt.width < 32:
        return ir.RankedTensorType.get(result_type.shape, ir.F32Type.get())
    return result_type
