"""overlap-all-gather-matmul: all_gather -> dot_general as a ring of collective_permutes.

For each dot_general that reads the result of a stablehlo.all_gather, the dot is
replaced by a loop in which every step multiplies the shard it holds while a
collective_permute moves that shard to the neighbouring device. After k shifts the
device at ring position p holds the shard of position (p + k) mod N, so its block
index is j = (p + k) mod N:

- gathered dim is a free dim of the dot: the step's product is block j of the result
  (written with dynamic_update_slice);
- a contracting dim: the other operand is sliced to block j (dynamic_slice) and the
  products are summed in the result's type, as XLA's windowed einsum and a
  reduce_scatter sum (`f32-sums`: in f32 for narrower float types, at the cost of an
  f32 buffer of the result's size; f16 and 8-bit floats, whose range the per-round
  sums overflow, always sum in f32);
- a batch dim: the other operand's batch block j is sliced and the result's batch
  block j written.

The last step is peeled out of the loop, so the loop runs N-1 steps, each with one
permute that neither feeds nor reads that step's dot. A step that follows another in
the same block (unrolled loop bodies, inline rounds) sends its shard through an
optimization_barrier with the previous step's result, so the compiler runs each dot
while its own step's permute travels. When something else reads the
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
from dataclasses import dataclass, field

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dominance import after, divergent_between, dominates, program_order
from overlap_hlo.ir.dots import DotDims, flops, tensor_bytes, traffic
from overlap_hlo.ir.lookthrough import (View, ViewedUse, dot_across_regions, erase_unused,
                                        producer, replay, users_through_views)
from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.passes.epilogue import Epilogue, block_type_for, find_epilogue
from overlap_hlo.passes.matmul_reduce_scatter import OverlapMatmulReduceScatter, scatter_fed_by
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_plan import GATHER, RingPlan
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import NoMatch, RewritePass, require_supported_types
from overlap_hlo.rewrite.site import Match, Outcome, Record


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
class OverlapAllGatherMatmul(RewritePass):
    """Decompose all_gather -> dot_general into a collective_permute loop."""

    # The reduce_scatter pass with the same options, for dots between both collectives.
    scatter_pass: OverlapMatmulReduceScatter = field(init=False, repr=False, compare=False)

    name = "overlap-all-gather-matmul"
    root = stablehlo.AllGatherOp
    # The carried shard alternates between two buffers, not copied (TPU); on GPU the
    # MLP, SwiGLU and Q/K/V rings were 1-13% faster so (modelled, benchmarks/gpu.py).
    default_unroll = {"tpu": 2, "gpu": 2}
    composite_note = "; the dot reads an all_gather whose ring runs inside"
    summary = "all_gather feeding dot_general -> loop of collective_permute + partial dots"

    def __post_init__(self):
        # The options as given (an unset unroll takes each pass's own default).
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        super().__post_init__()
        object.__setattr__(self, "scatter_pass", OverlapMatmulReduceScatter(**options))

    def dots_beside(self, op) -> list[ir.Operation]:
        dim = ir.IntegerAttr(op.attributes["all_gather_dim"]).value
        users = [use.user for result in op.results
                 for use in users_through_views(result, dim)[0]]
        return list({hash(u): u for u in users if u.name == "stablehlo.dot_general"}.values())

    def scatters_fed(self, gather: ir.Operation, dots: list[ViewedUse],
                     gathered: list[ir.Value]) -> list[tuple[object, ir.Operation]]:
        """The reduce_scatters these dots feed, each with the pass that settles it first
        (None when the scatter dim is the gathered dim: its ring would read blocks of the
        gathered dim, so only this gather's ring is built).

        A dot between an all_gather and a reduce_scatter is one composite site of this
        pass: the scatter's ring first (its partial dots read the gathered tensor, sliced
        along another dim or whole), then this gather's ring, whose consumer is the
        scatter ring's first partial dot and which assembles the gathered tensor for the
        scatter ring's other rounds."""
        found = []
        for use in dots:
            scatter = scatter_fed_by(use.user)
            if scatter is None:
                continue
            operands = [i for i, v in enumerate(use.user.operands) if v in gathered]
            dim = ir.IntegerAttr(scatter.attributes["scatter_dimension"]).value
            top, _, top_dim = producer(scatter.operands[0], dim)
            same_dim = len(operands) == 1 and (operands[0], use.dim) in DotDims.of(
                use.user).result_source(top_dim)
            found.append((None if same_dim else self.scatter_pass, scatter))
        return found

    def settled_scatters(self, gather: ir.Operation, settled: list[Outcome], scan
                         ) -> tuple[bool, list[str], list[Record]]:
        """Whether a scatter ring was built, notes for the remark, and the records of the
        scatters left unchanged, which are this site's to report only if its ring
        replaces their dots (otherwise the reduce_scatter pass meets them)."""
        built, notes, pending = False, [], []
        name = self.scatter_pass.name
        for outcome in settled:
            where = scan.where(outcome.location)
            if outcome.built:
                notes.append(f"its dot is decomposed inside the reduce_scatter ring at {where}")
                built = True
            elif outcome.reason is not None:
                reason = outcome.reason
                pending.append(Record(outcome.location, name, False, dict(
                    reason=str(reason), kind=reason.kind, detail=reason.detail,
                    estimate=reason.estimate, dots=reason.dots)))
                notes.append(f"its dot feeds the reduce_scatter at {where}, which keeps its "
                             f"collective ({reason.kind})")
            elif outcome.skipped:   # the scatter dim is the gathered dim
                reason = ("the scatter dim is the gathered dim: its ring would read blocks "
                          f"of the gathered dim; its dot is decomposed by the all_gather "
                          f"ring at {scan.where(gather.location)} instead")
                pending.append(Record(outcome.location, name, False, dict(
                    reason=reason, kind="scatter dim is the gathered dim")))
                notes.append(f"its dot feeds the reduce_scatter at {where}, which keeps its "
                             "collective (the scatter dim is the gathered dim)")
        return built, notes, pending

    def match(self, op, scan, settled=None):
        gather = op.operation
        dim = _gather_dim(gather)
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
        if settled is not None:   # its scatters were settled: their rings read the gather
            built, notes, pending = self.settled_scatters(gather, settled, scan)
            if built and not dots:
                raise Unsupported("its dots were decomposed into reduce_scatter rings that "
                                  "read blocks of the gathered dim: " + "; ".join(notes),
                                  kind="dot decomposed by a reduce_scatter ring")
        if not dots:
            if any(use.user.name == "stablehlo.optimization_barrier" for use in uses):
                raise Unsupported("an optimization_barrier separates it from its users")
            crossing = dot_across_regions(gather.results[0])
            if crossing is not None:
                raise Unsupported(f"its dot reads it {crossing}: a ring cannot be placed "
                                  "there (gather inside the region to have it decomposed)",
                                  kind="dot across a region boundary")
            for use in uses:
                outer = use.user
                if outer.name == "stablehlo.all_gather" and _gather_dim(outer) != dim and any(
                        u.user.name == "stablehlo.dot_general" for u in users_through_views(
                            outer.results[0], _gather_dim(outer))[0]):
                    raise Unsupported(
                        f"another all_gather gathers it again along dim {_gather_dim(outer)} "
                        f"before its dot: gathers of gathers along different dims are not "
                        "combined into one ring (the outer gather is decomposed alone)",
                        kind="gather of a gather along another dim")
            raise NoMatch
        ring = Ring.from_collective(gather, scan)
        inner = chained_gather(gather, scan)
        if inner is not None:   # a gather of a gather: one ring over the combined groups
            combined = combine_rings(inner[1], ring)
            inner, ring = (inner[0], combined) if combined else (None, ring)
        shard = (inner or gather).operands[0]
        require_supported_types(shard.type, gather.results[0].type)
        block = shard.type.shape[dim]
        if block * ring.size != gather.results[0].type.shape[dim]:
            raise Unsupported(f"gathered dim {gather.results[0].type.shape[dim]} is not "
                              f"{ring.size} x {block}")
        if settled is None:
            first = self.scatters_fed(gather, dots, values)
            if any(owner is not None for owner, _ in first):   # a composite site
                return Match(first=first)
            _, notes, pending = self.settled_scatters(
                gather, [Outcome(scatter.location, skipped=True) for _, scatter in first], scan)
        placed, unplaced = [], []
        for use in dots:
            consumer = place(consumer_of(use, values, block, self.f32_sums), gather.block,
                             scan.callers)
            (placed if isinstance(consumer, Consumer) else unplaced).append(consumer)
        if not placed:
            raise Unsupported(unplaced[0], kind="divergent control flow")
        groups = share_loops(sorted(placed, key=functools.cmp_to_key(_program_order)))
        others = [use for use in uses if all(use.user != c.dot for c in groups[0])]
        reused, moved = None, reroutable(others, groups[0][0].anchor)
        if others and moved is not None:
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
        if inner is not None:
            detail += (f" (an all_gather of the all_gather at {scan.where(inner.location)}, "
                       "both in one ring)")
        if len(groups) > 1:
            detail += f", {len(groups)} loops"
        if unplaced:
            detail += f"; {len(unplaced)} dot(s) left reading it: " + "; ".join(unplaced)
        if notes:
            detail += "; " + "; ".join(notes)
        if reused is not None:
            detail += (f"; the ring assembles the gathered tensor for {len(others)} other "
                       "reader(s)" + (f", {len(reused)} of them dot(s) with no ring of their "
                                      "own" if reused else ""))
        elif others:
            detail += (f"; the all_gather stays for {len(others)} other reader(s) that the "
                       "ring's result would not reach")
        groups = [fuse_epilogue(group) for group in groups]
        for fused in (c for group in groups for c in group if isinstance(c, Fused)):
            ops = len(fused.epilogue.ops)
            detail += (f"; an elementwise epilogue of {len(fused.members)} of its dots "
                       f"({ops} op(s)) runs on each block: the ring keeps one buffer "
                       "for their products" if len(fused.members) > 1 else
                       f"; its dot's elementwise epilogue ({ops} op(s)) runs on each "
                       "block, fused into the block's dot")
        assembly = None if reused is None else Assembly(gather.results[0].type, block)
        ring_dots = [c.dot for c in consumers]
        sums = any(c.result_dim is None for c in consumers)
        traffics = [traffic(c.dot, {c.gathered}) for c in consumers]
        site = cost.SiteShape(ring.size, sum(flops(dot) for dot in ring_dots),
                              cost.element_name(ring_dots[0].operands[0].type.element_type),
                              tensor_bytes(shard.type), plan_of(ring.size, self, sums),
                              whole_bytes=sum(w for w, _ in traffics),
                              sliced_bytes=sum(c for _, c in traffics),
                              spans_all_devices=ring.spans_all_devices,
                              sum_bytes=sum(tensor_bytes(c.acc_type) for c in consumers
                                            if c.result_dim is None))

        refusal = None
        if sums and self.platform == "tpu" and not self.builds_tpu_summing_rings():
            refusal = Unsupported(
                "a ring that sums over the gathered (contracting) dim reads and writes its "
                "whole sum in HBM every round on TPU; hint: overlap-report --tpu=SLICE "
                "keeps it where the compiled schedule is faster, tpu-summing-rings=true "
                "builds it, or prefetch the weight one layer ahead",
                kind="summing ring on TPU")
        return Match(detail, gather.results[0].type, ring, site,
                     lambda bidirectional: plan_of(ring.size, self, sums, bidirectional),
                     loops=len(groups), refusal=refusal, others=pending,
                     dots=[dot.location for dot in ring_dots],
                     build=GatherSite(gather, inner, shard, dim, groups, assembly, values,
                                      moved))

    def emit(self, match, plan, ring, rewriter, scan) -> None:
        s = match.build
        buffer = None
        for i, group in enumerate(s.groups):
            extra = [s.assembly] if s.assembly is not None and i == 0 else []
            with ir.InsertionPoint(group[0].anchor):
                results = emit_loop(group + extra, s.shard, s.dim, ring, plan, scan.new_channel,
                                    self.platform)
            for consumer, result in zip(group, results):
                if isinstance(consumer, Fused):
                    consumer.replace(rewriter, result)
                else:
                    rewriter.replace_op(consumer.dot, [result])
            if extra:
                buffer = results[-1]
        erase_unused(rewriter, s.values)
        if buffer is not None:
            cursor = buffer.owner.operation
            for view in s.moved:   # views the other readers read through, now after the buffer
                view.move_after(cursor)
                cursor = view
            rewriter.replace_op(s.gather, [buffer])
        if s.inner is not None and not list(s.inner.results[0].uses):
            rewriter.erase_op(s.inner)


@dataclass(frozen=True)
class GatherSite:
    """What the all_gather ring replaces: the gather (and the gather it gathers, if
    one), the shard each device holds, its loops of consumers, and the buffer that
    assembles the gathered tensor for other readers (with the views they read through)."""

    gather: ir.Operation
    inner: ir.Operation | None
    shard: ir.Value
    dim: int
    groups: list
    assembly: Assembly | None
    values: list[ir.Value]
    moved: list[ir.Operation] | None


def chained_gather(gather: ir.Operation, scan) -> tuple[ir.Operation, Ring] | None:
    """The all_gather (and its ring) whose result `gather` gathers again along the same
    dim, when nothing else reads it and its groups combine with `gather`'s; else None."""
    value = gather.operands[0]
    if not isinstance(value, ir.OpResult) or len(list(value.uses)) != 1:
        return None
    inner = as_op(value.owner)
    if inner.name != "stablehlo.all_gather" or len(inner.operands) != 1 or (
            ir.IntegerAttr(inner.attributes["all_gather_dim"]).value
            != ir.IntegerAttr(gather.attributes["all_gather_dim"]).value):
        return None
    try:
        return inner, Ring.from_collective(inner, scan)
    except Unsupported:
        return None


def combine_rings(inner: Ring, outer: Ring) -> Ring | None:
    """One ring for all_gather(all_gather(x, inner), outer) along one dim: the group of
    device d lists, for each member e of d's outer group in order, the members of e's
    inner group in order (the order of the blocks in the result). None when these lists
    do not partition the devices consistently."""
    if (inner.kind, inner.num_ids, inner.auto) != (outer.kind, outer.num_ids, outer.auto):
        return None
    inner_of = {d: g for g in inner.groups for d in g}
    outer_of = {d: g for g in outer.groups for d in g}
    combined = {d: tuple(m for e in outer_of[d] for m in inner_of[e]) for d in outer_of}
    if any(len(group) != len(set(group)) or any(combined[m] != group for m in group)
           for group in combined.values()):
        return None
    return Ring(tuple(dict.fromkeys(combined[d] for d in sorted(combined))), outer.kind,
                outer.num_ids, outer.auto)


def reroutable(others: list[ViewedUse], anchor: ir.Operation) -> list[ir.Operation] | None:
    """Whether a buffer built just before `anchor` can replace the gathered tensor for
    every reader in `others`: each reader comes after it, through views that do too
    or that can move there (what they read besides the chain already exists at
    `anchor`). Returns the views to move, in program order, or None."""
    moved: list[ir.Operation] = []
    for use in others:
        for view in use.views:
            if after(anchor, view.op):
                break
            if not all(dominates(value, anchor) for value in view.reads):
                return None
            if view.op not in moved:
                moved.append(view.op)
        else:
            if not after(anchor, use.user):
                return None
    return moved


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


def plan_of(n: int, options: RewritePass, sums: bool = False,
            bidirectional: bool | None = None) -> RingPlan:
    """The schedule `emit_loop` builds for a group of `n` with these options; `sums`:
    a consumer sums products (a contracting gathered dim)."""
    if bidirectional is None:
        bidirectional = bool(options.bidirectional)
    # Outside the TPU forms a ring that sums keeps one round per iteration unless asked
    # (XLA's GPU pipeline left unrolled ones' sends bare); the TPU forms (RingPlan
    # `tied_sums`) unroll, as one round per iteration copied the carried shards
    # (benchmarks/RESULTS.md).
    tpu = options.platform == "tpu"
    unroll = options.unroll if options.unroll_given or not sums or tpu else 1
    return RingPlan(GATHER, n, bidirectional, unroll, in_loop_sum=sums,
                    single_trip_loop=options.single_trip_loop, tied_sums=tpu,
                    views_in_loop=options.views_in_loop,
                    own_last=tpu and options.own_shard_last)


def emit_loop(consumers: list[Consumer], shard: ir.Value, gather_dim: int,
              ring: Ring, plan: RingPlan, channels, platform: str = "") -> list[ir.Value]:
    """One ring for all `consumers`, built at the current insertion point as `plan`
    says; the buffers it writes whole are `builders.buffer`s for `platform`.

    Round 0 multiplies the device's own shard while sending it on (the own-last TPU
    form of a two-stream ring that sums multiplies it in the last round instead,
    RingPlan `own_last`); round r multiplies
    the shard of position p + r (and p - r from the second stream when bidirectional)
    while sending both on; the last round sends nothing. For even N the two streams
    meet at p + N/2: the up stream's last send is left out. The TPU form of a ring
    that sums ties each inline round's sum before the next adds to it (`tied_sums`).
    """
    n, streams = ring.size, plan.streams

    def send(values):
        """Shift stream 0 down the ring and stream 1 up (each permute a fresh channel)."""
        return [b.collective_permute(v, ring.shift_pairs(sign),
                                     channels() if ring.uses_channel else None)
                for v, sign in zip(values, (+1, -1))]

    shared = bool(plan.shared_rounds)   # a loop round may hold one block twice
    # Outside the TPU forms, where a round multiplies more than two blocks: a dot's second
    # block waits for its first to be written (one barrier), or XLA's GPU scheduler runs
    # a round's GEMMs ahead of their writes with every product live at once. Not with
    # two blocks or fewer, where the waits cost overlap (benchmarks/RESULTS.md).
    serial = platform != "tpu" and plan.streams * sum(c.dots for c in consumers) > 2

    def step(k, shards, accs, invariants, shifts=None):
        *inputs, position = invariants
        shifts = shifts or [(+1, k), (-1, k)][:len(shards)]
        results = []
        for consumer, acc in zip(consumers, accs):
            mine, inputs = inputs[:len(consumer.inputs)], inputs[len(consumer.inputs):]
            results.append(consumer.accumulate(acc, shards, shifts, mine, position, n,
                                               gather_dim, shared and len(shards) == 2,
                                               serial))
        return results

    def round_(k, carried, invariants):
        """Send the shards held on (the streams the plan says), multiply them."""
        held, accs = carried[:streams], carried[streams:]
        fixed = isinstance(k, int)
        blocks = plan.blocks[k] if fixed else streams
        sending = plan.sends[k] if fixed else streams
        if fixed and k != 0 and plan.tied_sums and plan.in_loop_sum:
            # An inline round of the TPU form of a ring that sums: the sum so far, alone
            # (RingPlan `tied_sums`); tying the shards too keeps each add out of the
            # next dot's fusion.
            accs = [b.barrier([acc])[0] if _made_here(acc) else acc for acc in accs]
        elif k != 0 and sending and any(_made_here(acc) for acc in accs):
            # The previous round's products first (one optimization_barrier): the
            # compiler then runs that round's dots while its shifts travel, not while
            # these do (an unrolled TPU loop left one permute per iteration bare).
            tied = iter(b.barrier([v for v in held + accs if v is not None]))
            held, accs = ([None if v is None else next(tied) for v in values]
                          for values in (held, accs))
        if fixed and k == 0:   # the own shard: multiplied first (if at all), then sent
            if blocks:
                accs = step(k, held[:blocks], accs, invariants)
            return send(held[:sending]) + [None] * (streams - sending) + accs
        sent = send(held[:sending]) + [None] * (streams - sending)
        if fixed and k == plan.rounds - 1 and plan.own_in_last_round:
            # p+N/2 (down stream) beside the device's own shard, still held as `shard`
            return sent + step(k, [held[0], shard], accs, invariants, [(+1, k), (+1, 0)])
        return sent + step(k, held[:blocks], accs, invariants)

    position = b.ring_position(ring)
    invariants = [value for c in consumers for value in c.inputs] + [position]
    accs = [b.buffer(c.acc_type, platform) if c.result_dim is not None
            else b.zeros(c.acc_type) if plan.sums_from_zeros else None for c in consumers]
    carried = b.planned_rounds(plan, [shard] * streams + accs, invariants, round_)
    return [c.finish(acc) for c, acc in zip(consumers, carried[streams:])]


def _made_here(value: ir.Value | None) -> bool:
    """Whether `value` was computed by a round in the block being built (not a loop's
    block argument or result)."""
    if value is None or not isinstance(value, ir.OpResult):
        return False
    owner = as_op(value.owner)
    return (owner.name != "stablehlo.while"
            and owner.block == ir.InsertionPoint.current.block)


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


def _gather_dim(op: ir.Operation) -> int:
    return ir.IntegerAttr(op.attributes["all_gather_dim"]).value
