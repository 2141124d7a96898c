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
from dataclasses import dataclass, field
from typing import NoReturn

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.dots import DotDims, tensor_bytes
from overlap_hlo.ir.lookthrough import (ViewedUse, dot_across_regions, erase_unused, producer,
                                        users_through_views)
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.passes import rings
from overlap_hlo.passes.gather_consumers import (SUMS_LEFT_OUT, Assembly, Consumer, Fused,
                                                 accumulator_type, fuse_epilogue,
                                                 narrow_range, sums_left_out)
from overlap_hlo.passes.gather_ring import emit_loop, plan_of
from overlap_hlo.passes.gather_site import (GatherSite, consumers_detail, epilogues_detail,
                                            placed_consumers, readers_detail, ring_of,
                                            rings_and_other_readers)
from overlap_hlo.passes.matmul_reduce_scatter import OverlapMatmulReduceScatter, scatter_fed_by
from overlap_hlo.passes.ring_options import GatherRingOptions
from overlap_hlo.plan import cost
from overlap_hlo.rewrite.rewrite_pass import NoMatch, RewritePass
from overlap_hlo.rewrite.site import Match, Outcome, Site

__all__ = ["Assembly", "Consumer", "Fused", "GatherSite", "OverlapAllGatherMatmul",
           "accumulator_type", "emit_loop", "narrow_range", "plan_of"]


@dataclass(frozen=True)
class OverlapAllGatherMatmul(GatherRingOptions, RewritePass):
    """Decompose all_gather -> dot_general into a collective_permute loop."""

    # The reduce_scatter pass with the same options, for dots between both collectives.
    scatter_pass: OverlapMatmulReduceScatter = field(init=False, repr=False, compare=False)

    name = "overlap-all-gather-matmul"
    root = stablehlo.AllGatherOp
    creates = frozenset({"stablehlo.all_gather"})   # a loop's carried shard, gathered
    keeps_normal_form = True   # rings of dot_generals: no dot, call or branch built
    composite_note = "; the dot reads an all_gather whose ring runs inside"
    summing_ring_refusal = (
        "a ring that sums over the gathered (contracting) dim reads and writes its whole "
        "sum in HBM every round on TPU; hint: overlap-report --tpu=SLICE keeps it where "
        "the compiled schedule is faster, tpu-summing-rings=true builds it, or prefetch "
        "the weight one layer ahead")
    summary = "all_gather feeding dot_general -> loop of collective_permute + partial dots"

    def __post_init__(self):
        # The options both passes have, as given.
        options = {f.name: getattr(self, f.name)
                   for f in dataclasses.fields(OverlapMatmulReduceScatter) if f.init}
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
                         ) -> tuple[bool, list[str], list[Site]]:
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
                pending.append(Site.of(
                    outcome.location, scan.input_name, name, False, reason=str(reason),
                    kind=reason.kind, detail=reason.detail, estimate=reason.estimate,
                    dots=reason.dots))
                notes.append(f"its dot feeds the reduce_scatter at {where}, which keeps its "
                             f"collective ({reason.kind or reason})")
            elif outcome.skipped:   # the scatter dim is the gathered dim
                reason = ("the scatter dim is the gathered dim: its ring would read blocks "
                          f"of the gathered dim; its dot is decomposed by the all_gather "
                          f"ring at {scan.where(gather.location)} instead")
                pending.append(Site.of(outcome.location, scan.input_name, name, False,
                                       reason=reason, kind=Kind.SCATTER_DIM_GATHERED))
                notes.append(f"its dot feeds the reduce_scatter at {where}, which keeps its "
                             "collective (the scatter dim is the gathered dim)")
        return built, notes, pending

    def settles_first(self, op, scan) -> list[tuple[object, ir.Operation]]:
        """A composite site's reduce_scatters (`scatters_fed`) when one of them is
        settled by the scatter pass; none for a site `match` refuses before."""
        gather = op.operation
        dim = _gather_dim(gather)
        uses, values = users_through_views(gather.results[0], dim)
        dots = _distinct_dots(uses)
        if len(gather.operands) != 1 or not dots:
            return []
        first = self.scatters_fed(gather, dots, values)
        if all(owner is None for owner, _ in first):
            return []
        try:
            ring_of(gather, dim, scan)
        except (Unsupported, NoMatch):
            return []
        return first

    def match(self, op, scan, settled=None):
        gather = op.operation
        dim = _gather_dim(gather)
        uses, values = users_through_views(gather.results[0], dim)
        dots = _distinct_dots(uses)
        if len(gather.operands) != 1:
            _refuse_variadic(gather, dim)
        if settled is not None:   # its scatters were settled: their rings read the gather
            built, notes, pending = self.settled_scatters(gather, settled, scan)
            if built and not dots:
                raise Unsupported("its dots were decomposed into reduce_scatter rings that "
                                  "read blocks of the gathered dim: " + "; ".join(notes),
                                  kind=Kind.IN_SCATTER_RING)
        if not dots:
            _refuse_without_dots(gather, dim, uses)
        ring, inner, shard = ring_of(gather, dim, scan)
        block = shard.type.shape[dim]
        if settled is None:   # no scatter ring reads it: its scatters are left to it
            _, notes, pending = self.settled_scatters(gather, [
                Outcome(scatter.location, skipped=True)
                for _, scatter in self.scatters_fed(gather, dots, values)], scan)
        placed, unplaced = placed_consumers(dots, values, block, self.f32_sums, gather, scan)

        def form(placed: list[Consumer]) -> Match:
            groups, others, reused, moved = rings_and_other_readers(placed, uses)
            consumers = [c for group in groups for c in group]
            detail = (consumers_detail(consumers, gather, ring, inner, len(groups), scan)
                      + readers_detail(unplaced, notes, reused, others))
            groups = [fuse_epilogue(group) for group in groups]
            detail += epilogues_detail(groups)
            assembly = None if reused is None else Assembly(gather.results[0].type, block)
            sums = any(c.result_dim is None for c in consumers)
            shape = self.site_shape(ring, consumers, shard, sums)
            if assembly is not None:
                shape = dataclasses.replace(
                    shape, assembled_bytes=tensor_bytes(gather.results[0].type))
            return Match(detail, gather.results[0].type, ring, shape,
                         lambda bidirectional: plan_of(ring.size, self, sums, bidirectional),
                         loops=len(groups), others=pending,
                         dots=[c.dot.location for c in consumers],
                         build=GatherSite(gather, inner, shard, dim, groups, assembly,
                                          values, moved))

        match = form(placed)
        products_only = sums_left_out(placed) if match.shape.sum_bytes else None
        if products_only is not None:   # the ring sums: the other form leaves them out
            alternative = form(products_only)
            if alternative.build.assembly is not None:   # the sums read its buffer
                match = dataclasses.replace(match, alternative=dataclasses.replace(
                    alternative, detail=alternative.detail + SUMS_LEFT_OUT))
        return match

    def site_shape(self, ring, consumers: list[Consumer], shard: ir.Value,
                   sums: bool) -> cost.SiteShape:
        """What the cost model weighs: the ring's dots, shard and sums."""
        return rings.site_shape(ring, [(c.dot, {c.gathered}) for c in consumers],
                                consumers[0].dot.operands[0].type.element_type, shard.type,
                                plan_of(ring.size, self, sums),
                                sum_bytes=sum(tensor_bytes(c.acc_type) for c in consumers
                                              if c.result_dim is None))


    def emit(self, match, plan, ring, rewriter, scan) -> None:
        s = match.build
        buffer = None
        for i, group in enumerate(s.groups):
            extra = [s.assembly] if s.assembly is not None and i == 0 else []
            consumers = group + extra
            with ir.InsertionPoint(group[0].anchor):
                results = scan.templates.build(
                    None if plan.views_in_loop else (consumers, s.dim, ring, plan, self.form),
                    [s.shard, *(value for c in consumers for value in c.inputs)],
                    lambda: emit_loop(consumers, s.shard, s.dim, ring, plan,
                                      scan.new_channel, self.form))
            for consumer, result in zip(group, results):
                consumer.replace(rewriter, result)
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


def _distinct_dots(uses: list[ViewedUse]) -> list[ViewedUse]:
    """The uses of the gathered tensor by dots, one per dot."""
    dots = []
    for use in uses:
        if use.user.name == "stablehlo.dot_general" and all(d.user != use.user for d in dots):
            dots.append(use)
    return dots


def _refuse_variadic(gather: ir.Operation, dim: int) -> NoReturn:
    """A variadic all_gather is refused where a dot reads it, else no site."""
    if any(use.user.name == "stablehlo.dot_general"
           for result in gather.results
           for use in users_through_views(result, dim)[0]):
        raise Unsupported(f"variadic all_gather ({len(gather.operands)} operands)",
                          kind=Kind.VARIADIC_GATHER)
    raise NoMatch


def _refuse_without_dots(gather: ir.Operation, dim: int, uses: list[ViewedUse]) -> NoReturn:
    """Why no dot reads the gathered tensor where a ring could replace it, when one
    reads it further away; else no site."""
    if any(use.user.name == "stablehlo.optimization_barrier" for use in uses):
        raise Unsupported("an optimization_barrier separates it from its users")
    crossing = dot_across_regions(gather.results[0])
    if crossing is not None:
        raise Unsupported(f"its dot reads it {crossing}: a ring cannot be placed "
                          "there (gather inside the region to have it decomposed)",
                          kind=Kind.ACROSS_REGION)
    for use in uses:
        outer = use.user
        if outer.name == "stablehlo.all_gather" and _gather_dim(outer) != dim and any(
                u.user.name == "stablehlo.dot_general" for u in users_through_views(
                    outer.results[0], _gather_dim(outer))[0]):
            raise Unsupported(
                f"another all_gather gathers it again along dim {_gather_dim(outer)} "
                f"before its dot: gathers of gathers along different dims are not "
                "combined into one ring (the outer gather is decomposed alone)",
                kind=Kind.GATHER_OF_GATHER)
    raise NoMatch


def _gather_dim(op: ir.Operation) -> int:
    return ir.IntegerAttr(op.attributes["all_gather_dim"]).value
