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
permute that neither feeds nor reads that step's dot. The all_gather stays only if
something other than a rewritten dot still reads it.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo import builders as b
from overlap_hlo.collectives import Ring, Unsupported
from overlap_hlo.dots import DotDims
from overlap_hlo.lookthrough import (ViewedUse, dim_after, erase_unused, replay,
                                     users_through_views)
from overlap_hlo.rewrite_pass import NoMatch, RewritePass, require_supported_types


@dataclass(frozen=True)
class GatherSite:
    dot: ir.Operation
    gathered: int          # which dot operand is the all_gather result
    kind: str              # "free", "contracting" or "batch"
    result_dim: int | None
    other_dim: int | None
    block: int             # shard size along the gathered dim
    ring: Ring
    views: tuple[ir.Operation, ...]  # transposes/converts between gather and dot


@dataclass(frozen=True)
class OverlapAllGatherMatmul(RewritePass):
    """Decompose all_gather -> dot_general into a collective_permute loop."""

    name = "overlap-all-gather-matmul"
    root = stablehlo.AllGatherOp
    summary = "all_gather feeding dot_general -> loop of collective_permute + partial dots"

    def rewrite_site(self, op, rewriter, channels) -> str:
        gather = op.operation
        uses, values = users_through_views(gather.results[0])
        dots = []
        for use in uses:
            if use.user.name == "stablehlo.dot_general" and all(d.user != use.user for d in dots):
                dots.append(use)
        if len(gather.operands) != 1 or not dots:
            raise NoMatch
        ring = Ring.from_collective(gather)
        shard = gather.operands[0]
        require_supported_types(shard.type, gather.results[0].type)
        self.check_size(gather.results[0].type)
        sites = [self.analyze(gather, use, values, ring) for use in dots]
        kinds = ", ".join(f"{s.kind} dim" + "".join(f" through {v.name}" for v in s.views)
                          for s in sites)
        detail = (f"{len(sites)} dot(s) ({kinds}), {gather.results[0].type} gathered "
                  f"over groups of {ring.size}")
        for site in sites:
            with ir.InsertionPoint(site.dot), site.dot.location:
                result = emit_loop(site, shard, channels())
            rewriter.replace_op(site.dot, [result])
        erase_unused(rewriter, values)
        return detail

    @staticmethod
    def analyze(gather: ir.Operation, use: ViewedUse, gathered: list[ir.Value],
                ring: Ring) -> GatherSite:
        dot = use.user
        operands = [i for i, operand in enumerate(dot.operands) if operand in gathered]
        if len(operands) != 1:
            raise Unsupported("the gathered tensor is both operands of the dot")
        require_supported_types(dot.results[0].type, dot.operands[1 - operands[0]].type)
        dim = ir.IntegerAttr(gather.attributes["all_gather_dim"]).value
        full = gather.results[0].type.shape[dim]
        block = gather.operands[0].type.shape[dim]
        if block * ring.size != full:
            raise Unsupported(f"gathered dim {full} is not {ring.size} x {block}")
        for view in use.views:
            dim = dim_after(view, dim)
        kind, result_dim, other_dim = DotDims.of(dot).classify(operands[0], dim)
        return GatherSite(dot, operands[0], kind, result_dim, other_dim, block, ring,
                          use.views)


def emit_loop(site: GatherSite, shard: ir.Value, channel: int) -> ir.Value:
    """The loop replacing `site.dot`, built at the current insertion point."""
    ring, dot = site.ring, site.dot
    n = ring.size
    result_type = dot.results[0].type
    acc_type = accumulator_type(result_type) if site.kind == "contracting" else result_type
    part_type = (acc_type if site.result_dim is None
                 else b.with_dim(result_type, site.result_dim, site.block))
    pairs = ring.shift_pairs()
    permute_channel = channel if ring.uses_channel else None

    def step(k, cur, acc, other, position):
        offset = b.block_offset(position, k, n, site.block)
        if site.other_dim is not None:
            other = b.slice_dim(other, site.other_dim, offset, site.block)
        viewed = replay(site.views, cur)
        operands = [viewed, other] if site.gathered == 0 else [other, viewed]
        part = b.dot_like(dot, *operands, part_type)
        if site.result_dim is None:
            return b.add(acc, part)
        return b.update_dim(acc, part, site.result_dim, offset)

    def body(k, carried, invariants):
        cur, acc = carried
        moved = b.collective_permute(cur, pairs, permute_channel)
        return [moved, step(k, cur, acc, *invariants)]

    position = b.ring_position(ring)
    other = dot.operands[1 - site.gathered]
    cur, acc = b.counted_loop(0, n - 1, [shard, b.zeros(acc_type)], [other, position], body)
    acc = step(n - 1, cur, acc, other, position)
    if acc_type != result_type:
        acc = stablehlo.convert(result_type, acc)
    return acc


def accumulator_type(result_type: ir.RankedTensorType) -> ir.RankedTensorType:
    """Sums of partial products run in f32 for float types narrower than 32 bits."""
    elt = result_type.element_type
    if isinstance(elt, ir.FloatType) and elt.width < 32:
        return ir.RankedTensorType.get(result_type.shape, ir.F32Type.get())
    return result_type
