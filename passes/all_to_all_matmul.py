"""overlap-all-to-all-matmul: all_to_all -> dot_general as N-1 permutes interleaved with
per-chunk dots (MoE dispatch then the expert matmul, Ulysses' head/sequence exchange
then attention's matmuls).

`all_to_all(x, split_dimension=s, concat_dimension=c)` over a group of N sends chunk j
of x (along s) to group member j and concatenates the N chunks it receives along c, in
member order. When the result's dim c is a free dim of the dot that reads it, the dot
of each received chunk is one block of the dot's result (along the result dim c becomes),
so the exchange is split into its N steps: in step k (k = 0..N-1) the device at
position p sends its chunk (p + k) mod N to position p + k with one collective_permute
and multiplies the chunk it receives, which is position (p - k) mod N's chunk for it and
lands in block (p - k) mod N. Step 0 is the device's own chunk (no permute); each
step's dot runs while the next step's chunk travels. The steps are emitted one after
the other (the shift differs in every step, so there is no loop).

Left unchanged, with a remark: an all_to_all whose result has readers other than one
dot, reaches it through views, or is a contracting or batch dim of it; an all_to_all
that reads a dot's result (an MoE combine: not decomposed yet); variadic all_to_alls.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-all-to-all-matmul{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import DotDims, flops, tensor_bytes, traffic
from overlap_hlo.ir.lookthrough import TRANSPARENT, producer
from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_plan import GATHER, RingPlan
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import NoMatch, RewritePass, require_supported_types
from overlap_hlo.rewrite.site import Match

from .matmul_reduce_scatter import summed_dots


VIEWS = TRANSPARENT | {f"stablehlo.{name}" for name in ("reshape", "transpose", "convert")}


@dataclass(frozen=True)
class OverlapAllToAllMatmul(RewritePass):
    """Decompose all_to_all -> dot_general into permutes interleaved with chunk dots."""

    name = "overlap-all-to-all-matmul"
    root = stablehlo.AllToAllOp
    summary = "all_to_all feeding dot_general -> N-1 permutes interleaved with chunk dots"

    def dots_beside(self, op) -> list[ir.Operation]:
        readers = [as_op(use.owner) for use in op.results[0].uses]
        dots = [r for r in readers if r.name == "stablehlo.dot_general"]
        if dots:
            return dots
        return summed_dots(producer(op.operands[0], _attr(op, "split_dimension"))[0])[0]

    def ring_orders(self, ring) -> Callable[[int], object]:
        """The group's own order: chunk j belongs to member j."""
        return lambda streams: ring

    def match(self, op, scan, settled=None) -> Match:
        exchange = op.operation
        if len(exchange.operands) != 1:
            if self.dots_beside(exchange):
                raise Unsupported(f"an all_to_all of {len(exchange.operands)} operands")
            raise NoMatch
        split, concat = _attr(exchange, "split_dimension"), _attr(exchange, "concat_dimension")
        readers = [as_op(use.owner) for use in exchange.results[0].uses]
        dots = [r for r in readers if r.name == "stablehlo.dot_general"]
        if not dots:
            if summed_dots(producer(exchange.operands[0], split)[0])[0]:
                raise Unsupported("an all_to_all of a dot's result (an MoE combine) is not "
                                  "decomposed yet", kind="dot before an all_to_all")
            if any(r.name in VIEWS and any(as_op(u.owner).name == "stablehlo.dot_general"
                                                  for u in r.results[0].uses)
                   for r in readers):
                raise Unsupported("it reaches its dot through a view (not followed yet)",
                                  kind="view before the dot")
            raise NoMatch
        if len(readers) > 1 or len(dots[0].operands) != 2:
            raise Unsupported("its result has readers other than one dot_general")
        dot = dots[0]
        operand = 0 if dot.operands[0] == exchange.results[0] else 1
        kind, result_dim, _ = DotDims.of(dot).classify(operand, concat)
        if kind != "free":
            raise Unsupported(f"its concat dim is a {kind} dim of the dot (only a free "
                              "dim is split into chunk dots)", kind="concat dim not free")
        ring = Ring.from_collective(exchange, scan)
        count = _attr(exchange, "split_count")
        if count != ring.size:
            raise Unsupported(f"split_count {count} differs from the group size {ring.size}")
        x, y = exchange.operands[0].type, exchange.results[0].type
        require_supported_types(x, y, *(v.type for v in (*dot.operands, dot.results[0])))
        chunk = b.with_dim(x, split, x.shape[split] // count)
        whole, sliced = traffic(dot, {operand})
        shape = cost.SiteShape(ring.size, flops(dot), cost.element_name(x.element_type),
                               tensor_bytes(chunk), _plan(ring.size), whole_bytes=whole,
                               sliced_bytes=sliced)
        detail = (f"{y} from chunks along dim {split} of {x}, concatenated on dim "
                  f"{concat} (free dim of operand {operand}) over groups of {ring.size}")
        return Match(detail, y, ring, shape, lambda bidirectional: _plan(ring.size),
                     build=ExchangeSite(exchange, dot, operand, split, concat, result_dim),
                     dots=[dot.location])

    def emit(self, match, plan, ring, rewriter, scan) -> None:
        s = match.build
        x = s.exchange.operands[0]
        n = ring.size
        chunk_size = x.type.shape[s.split] // n
        block = b.with_dim(x.type, s.split, chunk_size).shape[s.concat]
        result_type = s.dot.results[0].type
        part_type = b.with_dim(result_type, s.result_dim, block)
        with ir.InsertionPoint(s.dot):
            position = b.ring_position(ring)
            result = b.buffer(result_type, self.platform)
            for k in range(n):
                mine = b.slice_dim(x, s.split, b.block_offset(position, k, n, chunk_size),
                                   chunk_size)
                got = mine if k == 0 else b.collective_permute(
                    mine, _shift_pairs(ring, k),
                    scan.new_channel() if ring.uses_channel else None)
                operands = list(s.dot.operands)
                operands[s.operand] = got
                part = b.dot_like(s.dot, *operands, part_type)
                result = b.update_dim(result, part, s.result_dim,
                                      b.block_offset(position, k, n, block, sign=-1))
        rewriter.replace_op(s.dot, [result])
        rewriter.erase_op(s.exchange)


@dataclass(frozen=True)
class ExchangeSite:
    """What the steps replace: the all_to_all, its dot and where the chunks go."""

    exchange: ir.Operation
    dot: ir.Operation
    operand: int          # which operand of the dot the all_to_all's result is
    split: int
    concat: int
    result_dim: int       # the dot's result dim that the concat dim becomes


def _plan(n: int) -> RingPlan:
    """Priced as a one-stream gather ring of the chunks: N-1 transfers of a chunk, each
    beside one chunk's dot."""
    return RingPlan(GATHER, n)


def _shift_pairs(ring: Ring, k: int) -> list[tuple[int, int]]:
    """Position q sends to position q + k in every group."""
    n = ring.size
    return [(ring.member(g, q), ring.member(g, (q + k) % n))
            for g in range(len(ring.groups)) for q in range(n)]


def _attr(op: ir.Operation, name: str) -> int:
    return ir.IntegerAttr(op.attributes[name]).value
