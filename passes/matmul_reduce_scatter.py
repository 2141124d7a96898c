"""overlap-matmul-reduce-scatter: dot_general -> reduce_scatter(add) as a ring.

Every device holds a partial dot result R_q; ring position p must end with the sum
over q of block p of R_q along the scatter dim. Instead of the data, the accumulator
travels the ring: at step k a device computes only block j = (p + k + 1) mod N of its
own product (slicing the operand, or both operands for a batch dim, that produces the
scatter dim) and adds it to the accumulator it just received. After the remaining
N-1-k shifts that accumulator sits at the device that owns block j.

The ring is pipelined (`ring_plan`): round k adds the accumulator received in round
k-1 to round k-1's partial product and sends the sum on, then computes its own
partial product while the sum travels; the product reaches an accumulator only in
the next round, through an optimization_barrier. So no permute feeds or reads a dot
of its own round, and the compiler cannot fuse a dot with the add of a received
accumulator (which would make the dot wait for the transfer). Round 0 sends nothing,
rounds 2.. run in the loop (one stream: the last round, the device's own block,
included), and the last product is added after the ring. With two streams
(bidirectional) the two accumulators meet at the owner, where the own block is added.
The accumulator keeps the reduce_scatter's element type, so the bytes on the wire are
those of the original collective.

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
from overlap_hlo.dominance import after, as_op
from overlap_hlo.lookthrough import (TRANSPARENT, View, only_transparent, producer, replay,
                                    view_backward)
from overlap_hlo.rewrite_pass import NoMatch, RewritePass, mib, require_supported_types
from overlap_hlo.ring_plan import SCATTER, RingPlan


@dataclass(frozen=True)
class OverlapMatmulReduceScatter(RewritePass):
    """Decompose dot_general -> reduce_scatter into a collective_permute loop."""

    name = "overlap-matmul-reduce-scatter"
    root = stablehlo.ReduceScatterOp
    summary = "dot_general feeding reduce_scatter(add) -> loop of partial dots + permutes"

    def rewrite_site(self, op, rewriter, scan, report=None):
        scatter = op.operation
        scatter_dim = ir.IntegerAttr(scatter.attributes["scatter_dimension"]).value
        top, between, dim = producer(scatter.operands[0], scatter_dim)
        dots, adds, addends = summed_dots(top)
        if not dots:
            if top is not None and top.name == "stablehlo.optimization_barrier":
                raise Unsupported("an optimization_barrier separates it from its operand")
            if top is not None and any(summed_dots(producer(value, 0)[0])[0]
                                       for value in returned(top, scatter.operands[0])):
                where = ("a stablehlo.while body, summed into a carried value"
                         if top.name == "stablehlo.while" else
                         f"the branches of a {top.name} (that differ)")
                raise Unsupported(f"its dot is inside {where}: a ring cannot be placed there",
                                  kind="dot across a region boundary")
            raise NoMatch
        if not is_add_reduction(scatter.regions[0]):
            raise Unsupported("reduction is not a plain add")
        if adds:
            chain = between[0].op if between else scatter
            elsewhere = [as_op(use.owner) for use in top.results[0].uses
                         if as_op(use.owner) != chain]
            if elsewhere:
                raise Unsupported(f"the sum of its dot and added terms is also read by "
                                  f"{elsewhere[0].name}: the ring does not compute that sum",
                                  kind="sum read elsewhere")
        readers = [use for dot in dots for use in dot.results[0].uses
                   if as_op(use.owner) not in adds and as_op(use.owner) not in
                   [view.op for view in between] and as_op(use.owner) != scatter]
        if readers and (len(dots) > 1 or addends
                        or not all(after(scatter, as_op(use.owner)) for use in readers)):
            raise Unsupported("the dot result has users other than the reduce_scatter"
                              + ("" if len(dots) == 1 and not addends else
                                 " (in a sum of dots or with an added term)")
                              + ("" if all(after(scatter, as_op(u.owner)) for u in readers)
                                 else " before it"))
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
        if addends:
            detail += (f"; {len(addends)} added term(s) (a bias) folded in: each device adds "
                       "its own block of it once")
        if readers:
            detail += (f"; the ring assembles the dot's product for {len(readers)} other "
                       "reader(s)")
        plan = ring_plan(ring.size, self)
        decision = self.decide(top.results[0].type, cost.SiteShape(
            ring.size, sum(flops(dot) for dot in dots),
            cost.element_name(dots[0].operands[0].type.element_type),
            mib(result_type) * 2**20, plan), detail)
        ring.require_pairs(plan.permutes)
        if ring.uses_channel:
            scan.require_channels(plan.permutes)
        with ir.InsertionPoint(scatter):
            result, product = emit_loop(dots, addends, dim, block, ring, between, plan,
                                        scan.new_channel, assemble=bool(readers),
                                        sum_type=result_type.element_type,
                                        platform=self.platform)
        location = scatter.location
        rewriter.replace_op(scatter, [result])
        for dead in [*(view.op for view in reversed(between)), *adds]:
            rewriter.erase_op(dead)
        for dot in dots:
            if product is not None:
                _report_shared(dot, location, report)
                rewriter.replace_op(dot, [product])
            else:
                rewriter.erase_op(dot)
        return detail, decision


def scatter_fed_by(dot: ir.Operation) -> ir.Operation | None:
    """The reduce_scatter that `dot` feeds as one of the summed dots of its site (through
    single-use views and adds; the product itself may have other readers), or None."""
    for use in dot.results[0].uses:   # the dot's product may have other readers too
        user = as_op(use.owner)
        while True:
            if user.name == "stablehlo.reduce_scatter":
                dim = ir.IntegerAttr(user.attributes["scatter_dimension"]).value
                top, _, _ = producer(user.operands[0], dim)
                if dot in summed_dots(top)[0]:
                    return user
                break
            if user.name != "stablehlo.add" and view_backward(user, 0) is None:
                break
            uses = list(user.results[0].uses)
            if len(uses) != 1:
                break
            user = as_op(uses[0].owner)
    return None


def _report_shared(dot: ir.Operation, location: ir.Location, report) -> None:
    """A remark for every other reduce_scatter of `dot`'s product: the first ring
    computed the dot once and assembles it; a second ring would compute it again."""
    if report is None:
        return
    for use in dot.results[0].uses:
        user = as_op(use.owner)
        while user.name != "stablehlo.reduce_scatter" and len(user.results) == 1 \
                and len(list(user.results[0].uses)) == 1 and view_backward(user, 0) is not None:
            user = as_op(next(iter(user.results[0].uses)).owner)
        if user.name == "stablehlo.reduce_scatter":
            report(user.location, False, reason=(
                f"its dot also feeds the reduce_scatter at {report.where(location)}, whose ring "
                "computes the dot once and assembles its product for this one: a ring of its "
                "own would compute the dot a second time"),
                kind="dot shared with another reduce_scatter")


def returned(region_op: ir.Operation, value: ir.Value) -> list[ir.Value]:
    """What the regions of an if/case (each branch) or a while (its body) return for
    `value`, a result of `region_op` maybe behind single-use views; [] for other ops."""
    regions = {"stablehlo.case": region_op.regions, "stablehlo.if": region_op.regions,
               "stablehlo.while": region_op.regions[1:]}.get(region_op.name, [])
    while regions and as_op(value.owner) != region_op:
        value = as_op(value.owner).operands[0]
    return [as_op(list(region.blocks[0].operations)[-1]).operands[value.result_number]
            for region in regions]


def summed_dots(top: ir.Operation | None
                ) -> tuple[list[ir.Operation], list[ir.Operation], list[ir.Value]]:
    """The dots whose sum `top` is (a dot, or a tree of single-use adds whose leaves are
    dots and other values, the added terms, e.g. a bias), the adds (outermost first) and
    the added terms; no dots if `top` is anything else or the tree holds no dot."""
    if top is None:
        return [], [], []
    if top.name == "stablehlo.dot_general":
        return [top], [], []
    if top.name != "stablehlo.add":
        return [], [], []
    dots, adds, addends = [], [top], []
    for operand in top.operands:
        inner = as_op(operand.owner) if isinstance(operand, ir.OpResult) else None
        more = ([], [], [])
        if inner is not None and len(list(operand.uses)) == 1:
            more = summed_dots(inner)
        if not more[0]:
            addends.append(operand)   # no dot under it: a term added to the sum
            continue
        dots += more[0]
        adds += more[1]
        addends += more[2]
    return (dots, adds, addends) if dots else ([], [], [])


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


def ring_plan(n: int, options: RewritePass) -> RingPlan:
    """The schedule `emit_loop` builds for a group of `n` with these options."""
    return RingPlan(SCATTER, n, options.bidirectional, options.unroll)


def permute_count(n: int, options: RewritePass) -> int:
    """How many collective_permute ops `emit_loop` builds (each needs a channel handle)."""
    return ring_plan(n, options).permutes


def emit_loop(dots: list[ir.Operation], addends: list[ir.Value], result_dim: int,
              block: int, ring: Ring, views: list[View], plan: RingPlan, channels,
              assemble: bool = False, sum_type: ir.Type | None = None, platform: str = ""
              ) -> tuple[ir.Value, ir.Value | None]:
    """The ring replacing reduce_scatter(sum of dots + added terms), built at the
    current insertion point as `plan` says; returns its result and, with `assemble`,
    the (single) dot's whole product, each block written as the ring computes it.

    Round k first adds the accumulator received in round k-1 to round k-1's partial
    product and sends the sum on, then computes round k's partial product while it
    travels: a round's dot neither reads nor feeds its permute, and the add that
    reads the permute sits in the next round (the next loop iteration, with unroll 1),
    so the compiler cannot fuse it into the dot. With one stream (a = N-1 rounds
    after round 0) the accumulator moves down the ring; with two, a = ceil((N-1)/2)
    rounds down and N-1-a up, the up stream starting late so that both arrive
    together, and a last round with the device's own block. In round k < a the down
    accumulator collects block p + k - a (it reaches its owner after a - k more
    shifts), the up one p + a - k. Every block of this device's product is computed
    exactly once; an added term (a bias) is sliced like the product and added to each
    block once, so the sum over the devices is that of the original (dot + term).
    `sum_type`: the element type the reduce_scatter sums in, when wider than its
    operand's (each part is converted before it is sent).
    """
    n = ring.size
    a = plan.rounds - 1                     # the last round: the device's own block
    two = plan.streams == 2
    up_start = plan.blocks.index(2) if two else a   # the up stream's first round
    sliced = [DotDims.of(dot).result_source(result_dim) for dot in dots]
    part_type = b.with_dim(dots[0].results[0].type, result_dim, block)
    held = 1 if assemble else 0        # carried: [product?] + (received, part) per stream

    def send(value, stream):
        """Shift an accumulator along its stream's direction (a fresh channel each)."""
        return b.collective_permute(value, ring.shift_pairs(1 if stream == 0 else -1),
                                    channels() if ring.uses_channel else None)

    def parts(shifts, invariants, product):
        """This device's share of blocks p + shift (one dot over all of them, per term),
        and the product with those blocks written in."""
        *values, position = invariants
        operand_pairs, terms = values[:2 * len(dots)], values[2 * len(dots):]
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
        if product is not None:
            for i, off in enumerate(offsets):
                product = b.update_dim(product, b.static_slice(whole, result_dim, i * block,
                                                               block), result_dim, off)
        for term in terms:
            whole = b.add(whole, b.concat([b.slice_dim(term, result_dim, off, block)
                                           for off in offsets], result_dim))
        # The adds that read a permute take the parts through a barrier: fused into
        # the dot's output fusion, such an add would make the dot wait for the transfer.
        # One block: the barrier after the views (the dot may still fuse a convert);
        # several: on the whole product (barriers on its slices would copy them).
        if len(shifts) == 1:
            return b.barrier([widen(replay(views, whole))]), product
        (whole,) = b.barrier([whole])
        return [widen(replay(views, b.static_slice(whole, result_dim, i * block, block)))
                for i in range(len(shifts))], product

    def widen(part):
        if sum_type is None or part.type.element_type == sum_type:
            return part
        return stablehlo.convert(ir.RankedTensorType.get(part.type.shape, sum_type), part)

    def round_(k, carried, invariants):
        """Send what round k-1 summed, then compute round k's parts. `carried` is
        [product?] + [received, part] per stream; None where a stream has not
        received yet, or not started (only in rounds before the loop)."""
        product, state = (carried[0] if held else None), list(carried[held:])
        for s in range(plan.streams):
            received, part = state[2 * s:2 * s + 2]
            if part is not None:
                acc = part if received is None else b.add(received, part)
                state[2 * s:2 * s + 2] = [send(acc, s), None]
        last = isinstance(k, int) and k == a
        if last and two:
            shifts = [(+1, 0, 0)]             # the own block, summed with both arrivals
        else:
            up = two and (not isinstance(k, int) or k >= up_start)
            shifts = [(+1, k, -a)] + ([(-1, k, a)] if up else [])
        new, product = parts(shifts, invariants, product)
        for s, part in enumerate(new):
            state[2 * s + 1] = part
        return ([product] if held else []) + state

    position = b.ring_position(ring)
    invariants = ([operand for dot in dots for operand in dot.operands] + list(addends)
                  + [position])
    carried = (([b.buffer(dots[0].results[0].type, platform)] if held else [])
               + [None] * 2 * plan.streams)
    carried = b.planned_rounds(plan, carried, invariants, round_)
    product, state = (carried[0] if held else None), carried[held:]
    result = b.add(state[0], state[1])   # the last sum: own block (and the down arrival)
    if two:
        result = b.add(state[2], result)
    return result, product
