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

An all_reduce (add) whose operand is not a dot's result but whose result feeds one (the
cotangent's psum in a backward pass written with `check_vma=False`, an embedding's
psum before the first layer) is left unchanged with a remark: its reduce half has no
dot to overlap. Not done either: all_reduces of more than one operand (left with a
remark). overlap-sequence-parallel moves the ops after the all_gather onto the shard.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-matmul-all-reduce{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.lookthrough import dots_reading, producer
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.plan import cost
from overlap_hlo.plan.cost import SiteShape
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import NoMatch, require_supported_types
from overlap_hlo.rewrite.site import Match

from .matmul_reduce_scatter import (OverlapMatmulReduceScatter, ScatterSite, is_add_reduction,
                                    summed_dots)


@dataclass(frozen=True)
class OverlapMatmulAllReduce(OverlapMatmulReduceScatter):
    """Decompose dot_general -> all_reduce into a reduce_scatter ring and an all_gather."""

    name = "overlap-matmul-all-reduce"
    root = stablehlo.AllReduceOp
    summary = ("dot_general feeding all_reduce(add) -> loop of partial dots + permutes, "
               "then all_gather")

    def dots_beside(self, op) -> list[ir.Operation]:
        return self.summed(op) or dots_reading(op.results[0])

    @staticmethod
    def summed(op) -> list[ir.Operation]:
        """The dots whose products the all_reduce sums (through views and adds)."""
        for dim in range(_rank(op)):
            dots = summed_dots(producer(op.operands[0], dim)[0])[0]
            if dots:
                return dots
        return []

    def match(self, op, scan, settled=None) -> Match:
        reduce = op.operation
        if not self.summed(reduce):
            if len(reduce.results) != 1 or not is_add_reduction(reduce.regions[0]) \
                    or not dots_reading(reduce.results[0]):
                raise NoMatch
            raise Unsupported(
                "its operand is not a dot's result (the reduce half has no dot to overlap), "
                "though its result feeds a dot; psum_scatter then all_gather by hand lets "
                "overlap-all-gather-matmul take the gather half",
                kind="operand not a dot's result")
        if len(reduce.operands) != 1:
            raise Unsupported(f"an all_reduce of {len(reduce.operands)} operands")
        result_type = reduce.results[0].type
        require_supported_types(result_type)
        ring = Ring.from_collective(reduce, scan)
        refusal = None
        for dim in range(_rank(reduce)):
            size = result_type.shape[dim]
            if size % ring.size or not summed_dots(producer(reduce.operands[0], dim)[0])[0]:
                continue
            try:
                match = self.match_sum(reduce, dim, b.with_dim(result_type, dim,
                                                               size // ring.size), scan)
            except (Unsupported, NoMatch) as reason:
                refusal = refusal or reason
                continue
            return dataclasses.replace(match, detail=(
                f"as a reduce_scatter on dim {dim} then an all_gather: {match.detail}"))
        if isinstance(refusal, Unsupported):
            raise refusal
        raise Unsupported(f"no dim of {result_type} is divisible by the group size "
                          f"{ring.size} and sliceable by the ring",
                          kind="no divisible dim")

    def estimate(self, shape: SiteShape, profile: cost.Hardware) -> cost.Estimate:
        """The ring's estimate with the all_gather that follows it added after, and to
        the original's all_reduce where the model priced only its reduce half."""
        ring = cost.estimate(shape, profile)
        gather = profile.collective_us(shape.block_bytes, shape.group_size)
        priced_whole = shape.spans_all_devices and profile.all_reduce_whole_scatter
        return dataclasses.replace(ring, after_us=ring.after_us + gather,
                                   before_us=ring.before_us + (0.0 if priced_whole
                                                               else gather))

    def completed(self, site: ScatterSite, block: ir.Value, scan) -> ir.Value:
        """The all_gather of this device's block over the all_reduce's groups."""
        return b.all_gather_like(site.scatter, block, site.scatter_dim,
                                 site.scatter.results[0].type, scan)


def _rank(op: ir.Operation) -> int:
    t = op.results[0].type if len(op.results) == 1 else None
    return len(t.shape) if isinstance(t, ir.RankedTensorType) else 0
