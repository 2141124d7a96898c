"""overlap-all-to-all-matmul: all_to_all <-> dot_general as N-1 permutes interleaved with
per-chunk dots (MoE dispatch then the expert matmul, the expert output then the MoE
combine, Ulysses' head/sequence exchange then attention's matmuls).

`all_to_all(x, split_dimension=s, concat_dimension=c)` over a group of N sends chunk j
of x (along s) to group member j and concatenates the N chunks it receives along c, in
member order. The exchange is split into its N steps: in step k (k = 0..N-1) the device
at position p sends chunk (p + k) mod N to position p + k with one collective_permute;
what it receives is position (p - k)'s chunk for it, block (p - k) mod N along c. Step 0
is the device's own chunk (no permute). The steps are emitted one after the other (the
shift differs in every step, so there is no loop).

- The dot reads the exchanged tensor, c a free dim of it: each received chunk is
  multiplied at once, into block (p - k) of the dot's result; the dot of one step runs
  while the next step's chunk travels. When c is a contracting dim, the chunk is
  multiplied by block (p - k) of the other operand along the paired dim and the
  products are summed (on TPU only with tpu-summing-rings, as for a gather ring that
  sums).
- The exchanged tensor is a dot's result (read by nothing else), possibly through
  views that keep the split dim whole (convert, transpose, reshape): chunk (p + k) of
  the product is computed (the operand, or both for a batch dim, that makes dim s
  sliced), viewed and sent; the next chunk's dot runs while it travels. This side is
  also taken when the exchange feeds a dot that the first side cannot split (the MoE
  combine: the expert matmul's output exchanged, then contracted over the experts).

Left unchanged, with a remark: an all_to_all whose result has readers other than one
dot, or whose concat dim is a batch dim of it; a reading dot reached through views; a
sum of dots; variadic all_to_alls; and a form that would cut a tensor more than
STRIDED_LIMIT (4) times the exchanged one into strided blocks (larger dims before the
cut dim: XLA copies every block), such as Ulysses' attention scores and probabilities.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-all-to-all-matmul{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import DotDims, tensor_bytes
from overlap_hlo.ir.lookthrough import VIEWS, producer, replay
from overlap_hlo.ir.ops import as_op, defining_op
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_plan import GATHER, RingPlan
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import NoMatch, RewritePass, require_supported_types
from overlap_hlo.rewrite.site import Match

from . import rings
from .matmul_reduce_scatter import summed_dots
from .ring_options import SummingRingOptions


@dataclass(frozen=True)
class OverlapAllToAllMatmul(SummingRingOptions, RewritePass):
    """Decompose all_to_all <-> dot_general into permutes interleaved with chunk dots."""

    name = "overlap-all-to-all-matmul"
    root = stablehlo.AllToAllOp
    summary = "all_to_all beside dot_general -> N-1 permutes interleaved with chunk dots"
    summing_ring_refusal = ("its chunks' products are summed, and on TPU each step reads "
                            "and writes the whole sum in HBM; hint: tpu-summing-rings=true "
                            "builds it")
    model_decides_summing_rings = False

    def dots_beside(self, op) -> list[ir.Operation]:
        readers = [as_op(use.owner) for use in op.results[0].uses]
        dots = [r for r in readers if r.name == "stablehlo.dot_general"]
        if dots:
            return dots
        return summed_dots(producer(op.operands[0], _attr(op, "split_dimension"))[0])[0]

    def ring_orders(self, ring) -> Callable[[int], object]:
        """The group's own order: chunk j belongs to member j."""
        return lambda streams: ring

    def planned(self, site: cost.SiteShape, ordered, plan: RingPlan) -> cost.SiteShape:
        """As for a gather ring, but the original all_to_all gets the two directions of a
        ring whatever axes its group spans: its blocks cross several hops each (on a
        2x2x2 cube 12 block-hops a device over 3 links, more than a ring's 7 over 2)."""
        return dataclasses.replace(super().planned(site, ordered, plan),
                                   collective_directions=2)

    def match(self, op, scan, settled=None) -> Match:
        exchange = op.operation
        if len(exchange.operands) != 1:
            if self.dots_beside(exchange):
                raise Unsupported(f"an all_to_all of {len(exchange.operands)} operands")
            raise NoMatch
        split, concat = _attr(exchange, "split_dimension"), _attr(exchange, "concat_dimension")
        readers = [as_op(use.owner) for use in exchange.results[0].uses]
        dots = [r for r in readers if r.name == "stablehlo.dot_general"]
        source = defining_op(exchange.operands[0])
        from_dot = source is not None and source.name == "stablehlo.dot_general"
        viewed = producer(exchange.operands[0], split)   # (op, views, dim) above views
        if dots:
            site = self._reading_side(exchange, dots[0], readers, split, concat,
                                      source if from_dot else None)
        elif viewed[0] is not None and viewed[0].name == "stablehlo.dot_general":
            site = self._producer(exchange, viewed[0], split, concat, viewed[1], viewed[2])
        elif summed_dots(viewed[0])[0]:
            raise Unsupported("its operand is a sum of dots' results (not followed yet)",
                              kind=Kind.SUM_OF_DOTS)
        elif any(r.name in VIEWS and any(as_op(u.owner).name == "stablehlo.dot_general"
                                         for u in r.results[0].uses) for r in readers):
            raise Unsupported("it reaches its dot through a view (not followed yet)",
                              kind=Kind.VIEW_BEFORE_DOT)
        else:
            raise NoMatch
        ring = Ring.from_collective(exchange, scan)
        count = _attr(exchange, "split_count")
        if count != ring.size:
            raise Unsupported(f"split_count {count} differs from the group size {ring.size}")
        dot = site.dot
        x, y = exchange.operands[0].type, exchange.results[0].type
        require_supported_types(x, y, *(v.type for v in (*dot.operands, dot.results[0])))
        chunk = b.with_dim(x, split, x.shape[split] // count)
        sliced = {operand for operand, _ in site.sliced}
        shape = rings.site_shape(ring, [(dot, sliced)], x.element_type, chunk, _plan(ring.size),
                                 sum_bytes=tensor_bytes(dot.results[0].type) if site.sums else 0.0)
        detail = (f"{y} from chunks along dim {split} of {x}, concatenated on dim "
                  f"{concat} over groups of {ring.size}; {site.describe()}")
        return Match(detail, y, ring, shape, lambda bidirectional: _plan(ring.size),
                     build=site, dots=[dot.location])

    def _reading_side(self, exchange, dot, readers, split, concat, source
                      ) -> ExchangeSite:
        """The site for an exchange that a dot reads: chunk dots of that dot when it
        splits into them (a free concat dim); else the producing dot `source`, if any,
        computed chunk by chunk (the MoE combine); else partial sums (a contracting
        concat dim: Ulysses' values)."""
        try:
            site = self._consumer(exchange, dot, readers, split, concat)
        except Unsupported:
            if source is None:
                raise
            return self._producer(exchange, source, split, concat)
        if site.sums and source is not None:
            try:
                return self._producer(exchange, source, split, concat)
            except Unsupported:
                pass
        return site

    def _consumer(self, exchange, dot, readers, split, concat) -> ExchangeSite:
        """The dot reads the exchanged tensor: each received chunk is multiplied."""
        if len(readers) > 1:
            raise Unsupported("its result has readers other than one dot_general")
        operand = 0 if dot.operands[0] == exchange.results[0] else 1
        kind, result_dim, paired = DotDims.of(dot).classify(operand, concat)
        if kind == "contracting":     # each chunk's product is a partial sum of the result
            _require_blocks(exchange, dot.operands[1 - operand].type, paired, "the other operand")
            return ExchangeSite(exchange, dot, split, concat, -1,
                                ((operand, concat), (1 - operand, paired)), before=False)
        if kind != "free":
            raise Unsupported(f"its concat dim is a {kind} dim of the dot (a free dim is "
                              "split into chunk dots, a contracting one into partial "
                              "sums)", kind=Kind.CONCAT_NOT_FREE)
        _require_blocks(exchange, dot.results[0].type, result_dim, "the dot's result")
        return ExchangeSite(exchange, dot, split, concat, result_dim, ((operand, concat),),
                            before=False)

    def _producer(self, exchange, dot, split, concat, views=(), dot_dim=None) -> ExchangeSite:
        """The exchanged tensor is the dot's result (through `views`, single-use ops that
        keep the split dim whole; the split is `dot_dim` of the dot's result): each
        chunk is computed, viewed, then sent."""
        if len(list(dot.results[0].uses)) > 1:
            raise Unsupported("the dot's result has readers other than the all_to_all")
        dot_dim = split if dot_dim is None else dot_dim
        sources = tuple(DotDims.of(dot).result_source(dot_dim))
        for operand, dim in sources:
            _require_blocks(exchange, dot.operands[operand].type, dim, f"operand {operand}")
        return ExchangeSite(exchange, dot, split, concat, dot_dim, sources, before=True,
                            views=tuple(views))

    def emit(self, match, plan, ring, rewriter, scan) -> None:
        s = match.build
        n = ring.size
        with ir.InsertionPoint(s.exchange if s.before else s.dot):
            position = b.ring_position(ring)
            if s.before:
                result = self._send_products(s, n, ring, position, scan)
            else:
                result = self._multiply_received(s, n, ring, position, scan)
        if s.before:
            rewriter.replace_op(s.exchange, [result])
            for view in reversed(s.views):
                rewriter.erase_op(view.op)
            rewriter.erase_op(s.dot)
        else:
            rewriter.replace_op(s.dot, [result])
            rewriter.erase_op(s.exchange)

    def _send(self, value, k, ring, scan):
        return value if k == 0 else rings.shift(value, ring, -k, scan.new_channel)

    def _multiply_received(self, s, n, ring, position, scan) -> ir.Value:
        """Step k: send chunk (p + k) of the operand, multiply the one received."""
        x = s.exchange.operands[0]
        chunk_size = x.type.shape[s.split] // n
        block = b.with_dim(x.type, s.split, chunk_size).shape[s.concat]
        result_type = s.dot.results[0].type
        part_type = result_type if s.sums else b.with_dim(result_type, s.result_dim, block)
        result = None if s.sums else b.buffer(result_type, self.form.allocates)
        operand = s.sliced[0][0]
        parts = []
        for k in range(n):
            mine = b.slice_dim(x, s.split, b.block_offset(position, k, n, chunk_size),
                               chunk_size)
            if self.form.paced_sends and k >= 2:
                # Each send waits for the dot two steps back: XLA's GPU scheduler would
                # start every send at once (each reads only the input) and, with two
                # collectives in flight at most, make the rest synchronous.
                mine = b.barrier([mine, parts[k - 2]])[0]
            operands = list(s.dot.operands)
            operands[operand] = self._send(mine, k, ring, scan)
            if s.sums:     # the received chunk's block of the other operand
                other, dim = s.sliced[1]
                operands[other] = b.slice_dim(operands[other], dim, b.block_offset(
                    position, k, n, block, sign=-1), block)
            part = b.dot_like(s.dot, *operands, part_type)
            parts.append(part)
            if s.sums:
                result = part if result is None else b.add(result, part)
            else:
                result = b.update_dim(result, part, s.result_dim,
                                      b.block_offset(position, k, n, block, sign=-1))
        return result

    def _send_products(self, s, n, ring, position, scan) -> ir.Value:
        """Step k: compute chunk (p + k) of the product, send it, place the one
        received at block (p - k) of the concat dim."""
        product = s.dot.results[0].type
        chunk_size = product.shape[s.result_dim] // n
        part_type = b.with_dim(product, s.result_dim, chunk_size)
        x = s.exchange.operands[0].type
        block = b.with_dim(x, s.split, x.shape[s.split] // n).shape[s.concat]
        result = b.buffer(s.exchange.results[0].type, self.form.allocates)
        for k in range(n):
            offset = b.block_offset(position, k, n, chunk_size)
            operands = list(s.dot.operands)
            for operand, dim in s.sliced:
                operands[operand] = b.slice_dim(operands[operand], dim, offset, chunk_size)
            part = replay(s.views, b.dot_like(s.dot, *operands, part_type))
            result = b.update_dim(result, self._send(part, k, ring, scan), s.concat,
                                  b.block_offset(position, k, n, block, sign=-1))
        return result


@dataclass(frozen=True)
class ExchangeSite:
    """What the steps replace: the all_to_all, its dot and where the chunks go."""

    exchange: ir.Operation
    dot: ir.Operation
    split: int
    concat: int
    result_dim: int       # the dot's result dim that the chunks are blocks of
    sliced: tuple         # (operand, dim) of the dot split into chunks
    before: bool          # the dot makes the exchanged tensor (else it reads it)
    views: tuple = ()     # lookthrough.View: from the dot's result to the exchanged tensor

    @property
    def sums(self) -> bool:
        """The dot contracts the concat dim: each chunk's product is a partial sum."""
        return not self.before and len(self.sliced) == 2

    def describe(self) -> str:
        if self.before:
            through = "".join(f" through {v.op.name}" for v in self.views)
            return f"the dot's result{through or ' (an MoE combine)'} computed chunk by chunk"
        operand = self.sliced[0][0]
        if self.sums:
            return (f"multiplied chunk by chunk, the products summed (contracting dim of "
                    f"operand {operand})")
        return f"multiplied chunk by chunk (free dim of operand {operand})"


# A chunk form reads or writes another tensor in blocks along one dim. Where larger dims
# come before that dim the blocks are strided, and XLA copies each one. Accepted while
# that tensor is at most this many times the exchanged one (an MoE layer's: the FFN
# width over the model width).
STRIDED_LIMIT = 4


def _require_blocks(exchange, tensor: ir.RankedTensorType, dim: int, what: str) -> None:
    """Unsupported when `tensor` (`what`) would be cut into strided blocks along `dim`
    and is more than STRIDED_LIMIT times the exchanged tensor."""
    strided = any(size != 1 for size in tensor.shape[:dim])
    ratio = tensor_bytes(tensor) / tensor_bytes(exchange.operands[0].type)
    if strided and ratio > STRIDED_LIMIT:
        raise Unsupported(
            f"{what} ({tensor}, {ratio:.0f}x the exchanged tensor) would be cut into "
            f"strided blocks along dim {dim}, one copy per step", kind=Kind.STRIDED_BLOCKS)


def _plan(n: int) -> RingPlan:
    """Priced as a one-stream gather ring of the chunks: N-1 transfers of a chunk, each
    beside one chunk's dot."""
    return RingPlan(GATHER, n)


def _attr(op: ir.Operation, name: str) -> int:
    return ir.IntegerAttr(op.attributes[name]).value
