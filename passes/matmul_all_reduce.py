"""overlap-matmul-all-reduce: dot_general -> all_reduce(add) as a reduce_scatter ring
followed by an all_gather.

An all_reduce is a reduce_scatter followed by an all_gather (a ring all-reduce runs
exactly these two halves). The reduce half becomes the ring of
overlap-matmul-reduce-scatter, which overlaps it with the dot; the all_gather of the
device's block restores the whole sum, so every reader sees the all_reduce's value.
The scattered dim is the first dim of the all_reduce's result that is divisible by
the group size and that the ring can slice (a free or batch dim of the dots).

The cost model prices the site as the all_reduce (or the two halves it is made of)
and the dot before, and the ring plus the all_gather after.

An all_reduce (add) whose operand is not a dot's result but whose result only dots read,
each along a free dim (a vocabulary-parallel embedding's psum into a projection),
becomes a reduce_scatter, then an all_gather that the dots read:
overlap-all-gather-matmul turns that into their ring, so the gather half overlaps them
(the reduce half has no dot to overlap and stays whole). Where no dim is free in every
dot (a backward's cotangent psum: the weight gradient contracts the dim the input
gradient keeps) or other ops read it too (an embedding's psum before a norm), it is left
unchanged with a remark. Not done either: all_reduces of more than one operand (left
with a remark). overlap-sequence-parallel moves the ops after the all_gather onto the
shard.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-matmul-all-reduce{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import DotDims, tensor_bytes
from overlap_hlo.ir.lookthrough import (DOTS, dots_reading, producer, returned_by_program,
                                        users_through_views)
from overlap_hlo.ir.ops import defining_op
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.plan import cost
from overlap_hlo.plan.cost import SiteShape
from overlap_hlo.plan.ring_plan import GATHER, RingPlan
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import NoMatch, require_supported_types
from overlap_hlo.rewrite.site import Match

from . import rings
from .matmul_reduce_scatter import (OverlapMatmulReduceScatter, ScatterSite, is_add_reduction,
                                    summed_dots)


@dataclass(frozen=True)
class OverlapMatmulAllReduce(OverlapMatmulReduceScatter):
    """Decompose dot_general -> all_reduce into a reduce_scatter ring and an all_gather.

    Its patterns (`PATTERNS`) are tried in order: the first that does not raise NoMatch
    describes the site, and prices and builds it (`Match.pattern`)."""

    name = "overlap-matmul-all-reduce"
    root = stablehlo.AllReduceOp
    creates = frozenset({"stablehlo.reduce_scatter", "stablehlo.all_gather"})
    summary = ("dot_general feeding all_reduce(add) -> loop of partial dots + permutes, "
               "then all_gather")

    def dots_beside(self, op) -> list[ir.Operation]:
        for pattern in PATTERNS:
            dots = pattern.dots_beside(op)
            if dots:
                return dots
        return []

    def match(self, op, scan, settled=None) -> Match:
        for pattern in PATTERNS:
            try:
                return pattern.match(self, op.operation, scan)
            except NoMatch:
                continue
        raise NoMatch

    def estimate(self, shape: SiteShape, profile: cost.Hardware) -> cost.Estimate:
        """As the pattern that matched the site prices it."""
        return shape.priced_by(shape, profile)

    def emit(self, match, plan, ring, rewriter, scan) -> None:
        """As the pattern that matched the site builds it."""
        match.pattern.emit(self, match, plan, ring, rewriter, scan)

    def completed(self, site: ScatterSite, block: ir.Value, scan) -> ir.Value:
        """The all_gather of this device's block over the all_reduce's groups."""
        return b.all_gather_like(site.scatter, block, site.scatter_dim,
                                 site.scatter.results[0].type, scan)


class ScatterRing:
    """The all_reduce sums dots: a reduce_scatter ring over them, then an all_gather."""

    @staticmethod
    def dots_beside(op) -> list[ir.Operation]:
        """The dots whose products the all_reduce sums (through views and adds)."""
        for dim in range(_rank(op)):
            dots = summed_dots(producer(op.operands[0], dim)[0])[0]
            if dots:
                return dots
        return []

    def match(self, owner: OverlapMatmulAllReduce, reduce: ir.Operation, scan) -> Match:
        """The first dim of the result divisible by the group size that the ring can
        slice (a free or batch dim of the dots)."""
        if _rank(reduce) == 0 and reduce.operands and \
                getattr(defining_op(reduce.operands[0]), "name", "") in DOTS:
            raise Unsupported("its result is a scalar: no dim to scatter over the group",
                              kind=Kind.NO_DIVISIBLE_DIM)
        if not self.dots_beside(reduce):
            raise NoMatch
        result_type = _single_operand_type(reduce)
        ring = Ring.from_collective(reduce, scan)
        refusal = None
        for dim in range(_rank(reduce)):
            size = result_type.shape[dim]
            if size % ring.size or not summed_dots(producer(reduce.operands[0], dim)[0])[0]:
                continue
            try:
                match = owner.match_sum(reduce, dim, b.with_dim(result_type, dim,
                                                                size // ring.size), scan)
            except (Unsupported, NoMatch) as reason:
                refusal = refusal or reason
                continue
            returned = tensor_bytes(result_type) if returned_by_program(
                reduce.results[0]) else 0.0
            copied = returned and owner.hardware and owner.profile.copies_returned_gathers
            note = " (returned by the program: the TPU compiler copies it out)" if copied else ""
            return dataclasses.replace(
                match, shape=dataclasses.replace(match.shape, returned_bytes=returned,
                                                 priced_by=self.estimate),
                detail=f"as a reduce_scatter on dim {dim} then an all_gather{note}: "
                       f"{match.detail}", pattern=self)
        if isinstance(refusal, Unsupported):
            raise refusal
        raise Unsupported(f"no dim of {result_type} is divisible by the group size "
                          f"{ring.size} and sliceable by the ring",
                          kind=Kind.NO_DIVISIBLE_DIM)

    @staticmethod
    def estimate(shape: SiteShape, profile: cost.Hardware) -> cost.Estimate:
        """The ring's estimate with the all_gather that follows it added after, and to
        the original's all_reduce where the model priced only its reduce half, and after
        it the copy the compiler makes of an all_gather the program returns."""
        ring = cost.estimate(shape, profile)
        gather = profile.collective_us(shape.block_bytes, shape.group_size,
                                       shape.collective_directions)
        copy = profile.returned_gather_us(shape.returned_bytes)   # not the all_reduce's
        priced_whole = shape.spans_all_devices and profile.all_reduce_whole_scatter
        return dataclasses.replace(ring, after_us=ring.after_us + gather + copy,
                                   before_us=ring.before_us + (0.0 if priced_whole
                                                               else gather))

    @staticmethod
    def emit(owner: OverlapMatmulAllReduce, match, plan, ring, rewriter, scan) -> None:
        """The reduce_scatter pass's ring, completed by `owner.completed`."""
        OverlapMatmulReduceScatter.emit(owner, match, plan, ring, rewriter, scan)


class GatherSide:
    """The all_reduce's result only dots read, each along a free dim (a
    vocabulary-parallel embedding's psum into a projection): a reduce_scatter, then an
    all_gather that the dots read, which overlap-all-gather-matmul makes their ring.
    Tried after `ScatterRing`: its operand is not a sum of dots."""

    @staticmethod
    def dots_beside(op) -> list[ir.Operation]:
        return dots_reading(op.results[0])

    def match(self, owner: OverlapMatmulAllReduce, reduce: ir.Operation, scan) -> Match:
        """The dim: the first divisible one that every dot reads as a free dim (a ring
        that sums over a contracting one reads and writes its sum every round: slower
        in a backward step, benchmarks/RESULTS.md)."""
        if len(reduce.results) != 1 or not is_add_reduction(reduce.regions[0]) \
                or not dots_reading(reduce.results[0]):
            raise NoMatch
        result_type = _single_operand_type(reduce)
        ring = Ring.from_collective(reduce, scan)
        dim, uses = _read_by_dots(reduce, ring.size)
        dots = [use.user for use in uses]
        block = b.with_dim(result_type, dim, result_type.shape[dim] // ring.size)
        sliced = [(use.user, {list(use.user.operands).index(use.value)}) for use in uses]
        shape = rings.site_shape(ring, sliced, result_type.element_type, block,
                                 RingPlan(GATHER, ring.size), priced_by=self.estimate)
        detail = (f"as a reduce_scatter on dim {dim} then an all_gather that "
                  f"{len(dots)} dot(s) read (overlap-all-gather-matmul makes it their "
                  f"ring; its operand is not a dot's result, so the reduce half stays "
                  f"whole): {result_type} over groups of {ring.size}")
        return Match(detail, result_type, ring, shape,
                     lambda bidirectional: RingPlan(GATHER, ring.size, bidirectional),
                     loops=0, build=SplitAllReduce(reduce, dim, block),
                     dots=[dot.location for dot in dots], pattern=self)

    @staticmethod
    def estimate(shape: SiteShape, profile: cost.Hardware) -> cost.Estimate:
        """The gather ring's estimate (its shape is one) with the reduce_scatter before
        it added to both, after the rewrite as the all-reduce the compiler makes of a
        reduce-scatter over every device where it does."""
        ring = cost.estimate(shape, profile)
        scatter = profile.collective_us(shape.block_bytes, shape.group_size,
                                        shape.collective_directions)
        whole = shape.spans_all_devices and profile.all_reduce_whole_scatter
        return dataclasses.replace(ring, before_us=ring.before_us + scatter,
                                   after_us=ring.after_us + scatter * (2 if whole else 1))

    @staticmethod
    def emit(owner: OverlapMatmulAllReduce, match, plan, ring, rewriter, scan) -> None:
        """The reduce_scatter and the all_gather in place of the all_reduce."""
        s = match.build
        with ir.InsertionPoint(s.reduce), s.reduce.location:
            scattered = b.reduce_scatter_like(s.reduce, s.reduce.operands[0], s.dim,
                                              s.block, scan)
            result = b.all_gather_like(s.reduce, scattered, s.dim,
                                       s.reduce.results[0].type, scan)
        rewriter.replace_op(s.reduce, [result])


# Tried in this order (`OverlapMatmulAllReduce.match`).
PATTERNS = (ScatterRing(), GatherSide())


@dataclass(frozen=True)
class SplitAllReduce:
    """An all_reduce split so that its all_gather half reaches the dots that read it."""

    reduce: ir.Operation
    dim: int                           # scattered, then gathered
    block: ir.RankedTensorType         # this device's share


def _single_operand_type(reduce: ir.Operation) -> ir.RankedTensorType:
    """The result type of an all_reduce of one operand, or Unsupported."""
    if len(reduce.operands) != 1:
        raise Unsupported(f"an all_reduce of {len(reduce.operands)} operands")
    result_type = reduce.results[0].type
    require_supported_types(result_type)
    return result_type


def _read_by_dots(reduce: ir.Operation, group: int) -> tuple[int, list]:
    """The first dim of the result divisible by `group` that only dots read, each
    along a free dim and through one use, with those uses; else Unsupported."""
    result_type = reduce.results[0].type
    for dim in range(_rank(reduce)):
        if result_type.shape[dim] % group:
            continue
        uses, _ = users_through_views(reduce.results[0], dim)
        if uses and all(use.user.name in DOTS for use in uses) and \
                len({hash(use.user) for use in uses}) == len(uses) and \
                all(DotDims.of(use.user).classify(list(use.user.operands).index(
                    use.value), use.dim)[0] == "free" for use in uses):
            return dim, uses
    raise Unsupported(
        "its operand is not a dot's result, and no dim of its result divisible by "
        "the group size is read only by dots, each as a free dim (where the "
        "all_gather half would overlap them)",
        kind=Kind.NOT_A_DOT_RESULT)


def _rank(op: ir.Operation) -> int:
    t = op.results[0].type if len(op.results) == 1 else None
    return len(t.shape) if isinstance(t, ir.RankedTensorType) else 0
