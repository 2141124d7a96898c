"""overlap-matmul-reduce-scatter: dot_general -> reduce_scatter(add) as a ring.

Every device holds a partial dot result R_q; ring position p must end with the sum
over q of block p of R_q along the scatter dim. Instead of the data, the accumulator
travels the ring: at step k a device computes only block j = (p + k + 1) mod N of its
own product (slicing the operand, or both operands for a batch dim, that produces the
scatter dim) and adds it to the accumulator it just received. After the remaining
N-1-k shifts that accumulator sits at the device that owns block j.

Step 0 is peeled (no permute); the loop runs steps 1..N-1, the last (the device's
own block) included, each permuting the previous accumulator while computing its own
partial dot, so the permute neither feeds nor reads that step's dot, and the loop's
buffers are reused to the end. With two streams (bidirectional) the two accumulators
meet after the loop, where the own block is added. The accumulator keeps the
reduce_scatter's element type, so the bytes on the wire are those of the original
collective.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo import builders as b
from overlap_hlo import cost
from overlap_hlo.collectives import Ring, Unsupported
from overlap_hlo.dots import DotDims, flops
from overlap_hlo.lookthrough import TRANSPARENT, View, only_transparent, producer, replay
from overlap_hlo.rewrite_pass import NoMatch, RewritePass, mib, require_supported_types


@dataclass(frozen=True)
class OverlapMatmulReduceScatter(RewritePass):
    """Decompose dot_general -> reduce_scatter into a collective_permute loop."""

    name = "overlap-matmul-reduce-scatter"
    root = stablehlo.ReduceScatterOp
    summary = "dot_general feeding reduce_scatter(add) -> loop of partial dots + permutes"

    def rewrite_site(self, op, rewriter, scan):
        scatter = op.operation
        scatter_dim = ir.IntegerAttr(scatter.attributes["scatter_dimension"]).value
        top, between, dim = producer(scatter.operands[0], scatter_dim)
        dots, adds = summed_dots(top)
        if not dots:
            if top is not None and top.name == "stablehlo.optimization_barrier":
                raise Unsupported("an optimization_barrier separates it from its operand")
            raise NoMatch
        if not is_add_reduction(scatter.regions[0]):
            raise Unsupported("reduction is not a plain add")
        if any(len(list(dot.results[0].uses)) != 1 for dot in dots):
            raise Unsupported("the dot result has users other than the reduce_scatter")
        ring = Ring.from_collective(scatter, scan)
        result_type = scatter.results[0].type
        require_supported_types(result_type, *(v.type for d in dots
                                               for v in (*d.operands, d.results[0])))
        block = result_type.shape[scatter_dim]
        full = top.results[0].type.shape[dim]
        if block * ring.size != full:
            raise Unsupported(f"scatter dim {full} is not {ring.size} x {block}")
        sources = []
        for dot in dots:
            sliced = DotDims.of(dot).result_source(dim)
            sources.append("batch" if len(sliced) == 2 else f"free dim of operand {sliced[0][0]}")
        through = "".join(f" through {view.op.name}" for view in between)
        summed = f"sum of {len(dots)} dots, " if len(dots) > 1 else ""
        detail = (f"{top.results[0].type} scattered on dim {dim} ({summed}"
                  f"{', '.join(sources)}){through} over groups of {ring.size}")
        rounds = cost.scatter_rounds(ring.size, self.bidirectional)
        # Loop rounds: one stream, all but round 0; two, those after both have started.
        uniform = len(rounds) - 1 - (rounds.index(2) + 1) if 2 in rounds else len(rounds) - 1
        estimate = self.decide(top.results[0].type, cost.SiteShape(
            ring.size, sum(flops(dot) for dot in dots),
            cost.element_name(dots[0].operands[0].type.element_type),
            mib(result_type) * 2**20, rounds, exposed_round=0,
            loop_iterations=max(uniform, 0) // self.unroll), detail)
        if ring.uses_channel:
            scan.require_channels(permute_count(ring.size, self))
        with ir.InsertionPoint(scatter):
            result = emit_loop(dots, dim, block, ring, between, self, scan.new_channel)
        rewriter.replace_op(scatter, [result])
        for dead in [*(view.op for view in reversed(between)), *adds, *dots]:
            rewriter.erase_op(dead)
        return detail, estimate


def summed_dots(top: ir.Operation | None) -> tuple[list[ir.Operation], list[ir.Operation]]:
    """The dots whose sum `top` is (a dot, or a tree of single-use adds of dots), and the
    adds (outermost first); no dots if `top` is anything else."""
    if top is None:
        return [], []
    if top.name == "stablehlo.dot_general":
        return [top], []
    if top.name != "stablehlo.add":
        return [], []
    dots, adds = [], [top]
    for operand in top.operands:
        inner = operand.owner if isinstance(operand, ir.OpResult) else None
        inner = inner if inner is None or isinstance(inner, ir.Operation) else inner.operation
        if inner is None or len(list(operand.uses)) != 1:
            return [], []
        more, more_adds = summed_dots(inner)
        if not more:
            return [], []
        dots += more
        adds += more_adds
    return dots, adds


def is_add_reduction(region: ir.Region) -> bool:
    """The region returns add(arg0, arg1), in either order, maybe through constraints."""
    block = region.blocks[0]
    ops = [op.operation for op in block.operations]
    add = only_transparent(ops[-1].operands[0]) if len(ops[-1].operands) == 1 else None
    if add is None or add.name != "stablehlo.add" or add.block != block:
        return False
    if any(op.name not in TRANSPARENT for op in ops if op != add and op != ops[-1]):
        return False
    args, operands = list(block.arguments), list(add.operands)
    return len(args) == 2 and (operands == args or operands == args[::-1])


def permute_count(n: int, options: RewritePass) -> int:
    """How many collective_permute ops `emit_loop` builds (each needs a channel
    handle): the sends before the loop, one loop body, the rounds after it, and with
    two streams the two final sends."""
    a = len(cost.scatter_rounds(n, options.bidirectional)) - 1
    two = a < n - 1
    up_start = a - (n - 1 - a)
    first_uniform = up_start + 1 if two else 1
    before = sum((k != 0) + (two and up_start < k) for k in range(min(first_uniform, a)))
    loop_rounds = (a if two else a + 1) - first_uniform
    iterations = loop_rounds // options.unroll
    inline = loop_rounds - iterations * options.unroll
    per_round = 2 if two else 1
    body = options.unroll if iterations else 0
    return before + per_round * (body + inline) + (2 if two else 0)


def emit_loop(dots: list[ir.Operation], result_dim: int, block: int, ring: Ring,
              views: list[View], options: RewritePass, channels) -> ir.Value:
    """The ring replacing reduce_scatter(sum of dots), built at the current insertion
    point.

    With one stream (a = N-1 rounds) the accumulator moves down the ring; with two,
    a = ceil((N-1)/2) rounds down and b = N-1-a up, the up stream starting late so
    that both arrive together. In round k the down accumulator collects block
    p + k - a (it reaches its owner after a - k more shifts), the up one p + a - k.
    """
    n = ring.size
    a = len(cost.scatter_rounds(n, options.bidirectional)) - 1   # rounds before the last
    up_start = a - (n - 1 - a)   # round in which the up stream starts (if any)
    streams = [+1] + ([-1] if a < n - 1 else [])   # down, then up
    sliced = [DotDims.of(dot).result_source(result_dim) for dot in dots]
    part_type = b.with_dim(dots[0].results[0].type, result_dim, block)

    def send(value, stream):
        """Shift an accumulator along its stream's direction (a fresh channel each)."""
        return b.collective_permute(value, ring.shift_pairs(streams[stream]),
                                    channels() if ring.uses_channel else None)

    def parts(shifts, *invariants):
        """This device's share of blocks p + shift (one dot over all of them, per term)."""
        *operand_pairs, position = invariants
        offsets = [b.block_offset(position, step, n, block, sign, extra)
                   for sign, step, extra in shifts]
        whole = None
        for dot, dot_sliced, i in zip(dots, sliced, range(0, len(operand_pairs), 2)):
            operands = list(operand_pairs[i:i + 2])
            for index, operand_dim in dot_sliced:
                operands[index] = b.concat(
                    [b.slice_dim(operands[index], operand_dim, off, block) for off in offsets],
                    operand_dim)
            term = b.dot_like(dot, *operands,
                              b.with_dim(part_type, result_dim, block * len(shifts)))
            whole = term if whole is None else b.add(whole, term)
        return [replay(views, b.static_slice(whole, result_dim, i * block, block))
                for i in range(len(shifts))]

    def round_(k, accs, invariants):
        up = len(streams) == 2 and (not isinstance(k, int) or k >= up_start)
        shifts = [(+1, k, -a)] + ([(-1, k, a)] if up else [])
        new = parts(shifts, *invariants)
        starts = [k == 0, k == up_start] if isinstance(k, int) else [False, False]
        return [part if starts[i] else b.add(send(accs[i], i), part)
                for i, part in enumerate(new)]

    position = b.ring_position(ring)
    invariants = [operand for dot in dots for operand in dot.operands] + [position]
    first_uniform = up_start + 1 if len(streams) == 2 else 1
    accs = []
    for k in range(min(first_uniform, a)):
        accs = round_(k, accs, invariants)
    if len(streams) == 1:
        # The last round, own block plus the arrived accumulator, has the loop body's
        # form (round a: block p + a - a); inside the loop it reuses the loop's buffers.
        (result,) = b.unrolled_rounds(first_uniform, a + 1, options.unroll, accs, invariants,
                                      round_)
        return result
    accs = b.unrolled_rounds(first_uniform, a, options.unroll, accs, invariants, round_)
    (own,) = parts([(+1, 0, 0)], *invariants)
    arrived = [send(acc, i) for i, acc in enumerate(accs)]
    result = own
    for value in arrived:
        result = b.add(value, result)
    return result
