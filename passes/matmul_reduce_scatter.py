"""overlap-matmul-reduce-scatter: dot_general -> reduce_scatter(add) as a ring.

Every device holds a partial dot result R_q; ring position p must end with the sum
over q of block p of R_q along the scatter dim. Instead of the data, the accumulator
travels the ring: at step k a device computes only block j = (p + k + 1) mod N of its
own product (slicing the operand, or both operands for a batch dim, that produces the
scatter dim) and adds it to the accumulator it just received. After the remaining
N-1-k shifts that accumulator sits at the device that owns block j.

Two accumulators travel the ring, skewed by half a round (`plan_of`): in each round
a chain computes its partial product, adds the accumulator it received and sends the
sum on. The add reads its own round's product, so the compiler fuses it into the
dot's output fusion instead of running it as an instruction of its own, and each
chain's transfer runs while the other chain's dot does. One stream: the chains are
the two halves of each block's rows; two streams (bidirectional): the down and up
streams, which meet at the owner, where the own block is added. The accumulator
keeps the reduce_scatter's element type, so the bytes on the wire are those of the
original collective.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dominance import after
from overlap_hlo.ir.dots import DotDims, flops, tensor_bytes, traffic
from overlap_hlo.ir.lookthrough import (TRANSPARENT, View, add_leaves, only_transparent,
                                        producer, replay, view_backward)
from overlap_hlo.ir.ops import as_op, broadcast_source, defining_op
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.passes.epilogue import Epilogue, block_type_for, find_prologue
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_plan import SCATTER, RingPlan
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import NoMatch, RewritePass, require_supported_types
from overlap_hlo.rewrite.site import Match, Record


@dataclass(frozen=True)
class OverlapMatmulReduceScatter(RewritePass):
    """Decompose dot_general -> reduce_scatter into a collective_permute loop."""

    name = "overlap-matmul-reduce-scatter"
    root = stablehlo.ReduceScatterOp
    summary = "dot_general feeding reduce_scatter(add) -> loop of partial dots + permutes"

    def dots_beside(self, op) -> list[ir.Operation]:
        dim = ir.IntegerAttr(op.attributes["scatter_dimension"]).value
        return summed_dots(producer(op.operands[0], dim)[0])[0]

    def match(self, op, scan, settled=None) -> Match:
        scatter = op.operation
        scatter_dim = ir.IntegerAttr(scatter.attributes["scatter_dimension"]).value
        return self.match_sum(scatter, scatter_dim, scatter.results[0].type, scan)

    def match_sum(self, scatter: ir.Operation, scatter_dim: int,
                  result_type: ir.RankedTensorType, scan) -> Match:
        """The ring computing `result_type` (one device's block along `scatter_dim`) of
        the sum the collective `scatter` makes of its operand (dots, added terms)."""
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
            if top is not None and top.name == "stablehlo.add" and _viewed_dot_in_sum(top):
                raise Unsupported("a dot of its sum reaches the add through a transpose, "
                                  "reshape or convert: not followed inside a sum",
                                  kind="dot behind a view inside a sum")
            behind = _dot_behind_reshapes(top)
            if behind:
                raise Unsupported(f"its dot reaches it through a {behind} that splits or "
                                  "merges the scattered dim: not followed",
                                  kind="reshape of the scattered dim")
            raise NoMatch
        if not is_add_reduction(scatter.regions[0]):
            raise Unsupported("reduction is not a plain add")
        readers = [use for dot in dots for use in dot.results[0].uses
                   if as_op(use.owner) not in adds and as_op(use.owner) not in
                   [view.op for view in between] and as_op(use.owner) != scatter]
        sum_read = False   # the sum (dots and added terms) has readers besides the chain
        if adds:
            chain = between[0].op if between else scatter
            # The dots of a sum are single-use (summed_dots): only the sum has readers.
            readers = [use for use in top.results[0].uses if as_op(use.owner) != chain]
            before = [use for use in readers if not after(scatter, as_op(use.owner))]
            if before:
                raise Unsupported(f"the sum of its dot and added terms is also read by "
                                  f"{as_op(before[0].owner).name} before it: the ring "
                                  "does not compute that sum there", kind="sum read elsewhere")
            sum_read = bool(readers)
        if readers and not sum_read and (
                len(dots) > 1 or addends
                or not all(after(scatter, as_op(use.owner)) for use in readers)):
            raise Unsupported("the dot result has users other than the "
                              + scatter.name.removeprefix("stablehlo.")
                              + ("" if len(dots) == 1 and not addends else
                                 " (in a sum of dots or with an added term)")
                              + ("" if all(after(scatter, as_op(u.owner)) for u in readers)
                                 else " before it"))
        ring = Ring.from_collective(scatter, scan)
        require_supported_types(result_type, *(v.type for d in dots
                                               for v in (*d.operands, d.results[0])))
        block = result_type.shape[scatter_dim]
        full = top.results[0].type.shape[dim]
        if block * ring.size != full:
            raise Unsupported(f"scatter dim {full} is not {ring.size} x {block}")
        sources, traffics = [], []
        for dot in dots:
            sliced = DotDims.of(dot).result_source(dim)
            sources.append("batch" if len(sliced) == 2 else f"free dim of operand {sliced[0][0]}")
            traffics.append(traffic(dot, {operand for operand, _ in sliced}))
        through = "".join(f" through {view.op.name}" for view in between)
        summed = f"sum of {len(dots)} dots, " if len(dots) > 1 else ""
        detail = (f"{top.results[0].type} scattered on dim {dim} ({summed}"
                  f"{', '.join(sources)}){through} over groups of {ring.size}")
        if addends:
            detail += (f"; {len(addends)} added term(s) (a bias) folded in: each device adds "
                       "its own block of it once")
        if readers:
            what = "the sum of its dots and added terms" if sum_read else "the dot's product"
            detail += f"; the ring assembles {what} for {len(readers)} other reader(s)"
        if self.unroll > 1:
            detail += (f"; unroll={self.unroll} applies to all_gather rings only (this ring "
                       "runs one round per iteration)")
        prologues = sliced_prologues(dots, dim)
        if prologues:
            detail += (f"; the elementwise ops making {len(prologues)} of its dots' operands "
                       f"({sum(len(p.ops) for p in prologues.values())} op(s)) run on each "
                       "block, fused into its dot")
        site = cost.SiteShape(ring.size, sum(flops(dot) for dot in dots),
                              cost.element_name(dots[0].operands[0].type.element_type),
                              tensor_bytes(result_type), plan_of(ring.size, self, block),
                              whole_bytes=sum(w for w, _ in traffics),
                              sliced_bytes=sum(c for _, c in traffics),
                              spans_all_devices=ring.spans_all_devices)
        others = shared_scatters(dots[0], scatter, scan) if readers and not sum_read else []
        return Match(detail, top.results[0].type, ring, site,
                     lambda bidirectional: plan_of(ring.size, self, block, bidirectional),
                     build=ScatterSite(scatter, dots, adds, addends, between, dim, block,
                                       readers, prologues, scatter_dim, sum_read),
                     others=others,
                     dots=[dot.location for dot in dots])

    def emit(self, match, plan, ring, rewriter, scan) -> None:
        s = match.build
        scatter = s.scatter
        with ir.InsertionPoint(scatter):
            result, product = emit_loop(s.dots, s.addends, s.dim, s.block, ring, s.between,
                                        plan, scan.new_channel, assemble=bool(s.readers),
                                        sum_type=scatter.results[0].type.element_type,
                                        platform=self.platform, out_dim=s.scatter_dim,
                                        prologues=s.prologues)
            result = self.completed(s, result, scan)
        rewriter.replace_op(scatter, [result])
        for view in reversed(s.between):
            rewriter.erase_op(view.op)
        for i, add in enumerate(s.adds):   # the outermost first: the whole sum
            if i == 0 and s.sum_read:
                rewriter.replace_op(add, [product])
            else:
                rewriter.erase_op(add)
        for dot in s.dots:
            if product is not None and not s.sum_read:
                rewriter.replace_op(dot, [product])
            else:
                rewriter.erase_op(dot)
        erased = set()   # the prologues' ops: only the erased dots read them
        for prologue in s.prologues.values():
            for op in reversed(prologue.ops):
                if hash(op) not in erased:
                    erased.add(hash(op))
                    rewriter.erase_op(op)

    def completed(self, site: ScatterSite, block: ir.Value, scan) -> ir.Value:
        """What replaces the collective, from this device's block of the sum."""
        return block


@dataclass(frozen=True)
class ScatterSite:
    """What the reduce_scatter ring replaces: the scatter, its summed dots, the adds and
    added terms between, the views after the sum, and the operand prologues it fuses."""

    scatter: ir.Operation
    dots: list[ir.Operation]
    adds: list[ir.Operation]
    addends: list[ir.Value]
    between: list[View]
    dim: int                      # the scattered dim of the dots' product
    block: int
    readers: list                 # other readers of the product: the ring assembles it
    prologues: dict
    scatter_dim: int              # of the collective's result
    sum_read: bool = False        # the readers read the sum (dots and added terms)


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


def shared_scatters(dot: ir.Operation, scatter: ir.Operation, scan) -> list[Record]:
    """A record for every other reduce_scatter of `dot`'s product: the ring of `scatter`
    computes the dot once and assembles it; a second ring would compute it again."""
    records, where = [], scan.where(scatter.location)
    for use in dot.results[0].uses:
        user = as_op(use.owner)
        while user.name != "stablehlo.reduce_scatter" and len(user.results) == 1 \
                and len(list(user.results[0].uses)) == 1 and view_backward(user, 0) is not None:
            user = as_op(next(iter(user.results[0].uses)).owner)
        if user.name == "stablehlo.reduce_scatter" and user != scatter:
            records.append(Record(user.location, OverlapMatmulReduceScatter.name, False, dict(
                reason=(f"its dot also feeds the reduce_scatter at {where}, whose ring "
                        "computes the dot once and assembles its product for this one: a ring "
                        "of its own would compute the dot a second time"),
                kind="dot shared with another reduce_scatter")))
    return records


def returned(region_op: ir.Operation, value: ir.Value) -> list[ir.Value]:
    """What the regions of an if/case (each branch) or a while (its body) return for
    `value`, a result of `region_op` maybe behind single-use views; [] for other ops."""
    regions = {"stablehlo.case": region_op.regions, "stablehlo.if": region_op.regions,
               "stablehlo.while": region_op.regions[1:]}.get(region_op.name, [])
    while regions and as_op(value.owner) != region_op:
        value = as_op(value.owner).operands[0]
    return [as_op(list(region.blocks[0].operations)[-1]).operands[value.result_number]
            for region in regions]


# Views (of shape or element type) a dot reaches an add of its sum through: reported.
VIEWS = frozenset({"stablehlo.transpose", "stablehlo.reshape", "stablehlo.convert"})


def _viewed_dot_in_sum(top: ir.Operation) -> bool:
    """Whether a leaf of the add tree `top` is a dot behind single-use views."""
    for inner in add_leaves(top):
        while inner.name in VIEWS and len(list(inner.results[0].uses)) == 1 \
                and isinstance(inner.operands[0], ir.OpResult):
            inner = as_op(inner.operands[0].owner)
            if inner.name == "stablehlo.dot_general":
                return True
    return False


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


def _dot_behind_reshapes(top: ir.Operation | None, limit: int = 8) -> str:
    """The first reshape or transpose ("reshape", "transpose") on a chain of reshapes,
    transposes and converts from `top` back to a dot_general, or "" when the chain
    reaches no dot or holds only converts."""
    chain, op = [], top
    while op is not None and len(chain) < limit and op.name in (
            "stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert"):
        chain.append(op.name.removeprefix("stablehlo."))
        op = defining_op(op.operands[0])
    shaping = [name for name in chain if name != "convert"]
    return shaping[0] if shaping and op is not None and op.name == "stablehlo.dot_general" \
        else ""


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


def sliced_prologues(dots: list[ir.Operation], result_dim: int
                     ) -> dict[tuple[int, int], Epilogue]:
    """(dot index, operand index) -> the elementwise prologue of an operand the ring
    slices (one that makes `result_dim`), when only these dots read it."""
    found = {}
    for i, dot in enumerate(dots):
        for index, _ in DotDims.of(dot).result_source(result_dim):
            operand = dot.operands[index]
            readers = {as_op(use.owner) for use in operand.uses}
            if not readers <= set(dots):
                continue
            prologue = find_prologue(operand)
            if prologue is not None:
                found[(i, index)] = prologue
    return found


def plan_of(n: int, options: RewritePass, block: int = 2,
            bidirectional: bool | None = None) -> RingPlan:
    """The schedule `emit_loop` builds for a group of `n` with these options; `block`:
    the rows of the scattered block (one row cannot be split into two chains). One
    round per loop iteration, whatever `unroll` says: the two chains copy no buffer,
    and in a second round of one iteration the TPU compiler split an add from its dot
    (the add then waited for a transfer)."""
    if bidirectional is None:
        bidirectional = bool(options.bidirectional)
    return RingPlan(SCATTER, n, bidirectional, 1, chains=2 if block >= 2 else 1,
                    single_trip_loop=options.single_trip_loop,
                    views_in_loop=options.views_in_loop)


def emit_loop(dots: list[ir.Operation], addends: list[ir.Value], result_dim: int,
              block: int, ring: Ring, views: list[View], plan: RingPlan, channels,
              assemble: bool = False, sum_type: ir.Type | None = None, platform: str = "",
              out_dim: int | None = None, prologues: dict | None = None
              ) -> tuple[ir.Value, ir.Value | None]:
    """The ring replacing reduce_scatter(sum of dots + added terms), built at the
    current insertion point as `plan` says; returns its result and, with `assemble`,
    this device's whole sum (of a single dot: its product), each block written as the
    ring computes it.

    Two chains of accumulators travel the ring, skewed by half a round: in each round
    a chain computes its partial product, adds the accumulator it received and sends
    the sum on. The add reads the product of its own round, so the compiler fuses it
    into the dot's output; the dot waits for the accumulator, which arrived while the
    other chain's dot ran. One stream (a = N-1 rounds after round 0): the chains are
    the two halves of each block's rows (`plan.chains`), both moving down the ring,
    and their last sums, the halves of the device's own block, are written into one
    buffer at their rows along `out_dim` (the scattered dim after the views). Two
    streams: a = ceil((N-1)/2) rounds down and N-1-a up, the up stream starting late
    so that both arrive together, and a last round with the device's own block, to
    which both arrivals add. In round k < a the down accumulator collects block p + k - a (it reaches its
    owner after a - k more shifts), the up one p + a - k. Every block of this device's
    product is computed exactly once; an added term (a bias) is sliced like the
    product and added to each block once, so the sum over the devices is that of the
    original (dot + term). `sum_type`: the element type the reduce_scatter sums in,
    when wider than its operand's (each part is converted before it is added).
    `prologues`: (dot, operand) -> elementwise ops making that operand, replayed on
    each block of their sliced sources.
    """
    n = ring.size
    a = plan.rounds - 1                     # the last round: the device's own block
    two = plan.streams == 2
    up_start = plan.blocks.index(2) if two else a   # the up stream's first round
    sliced = [DotDims.of(dot).result_source(result_dim) for dot in dots]
    part_type = dots[0].results[0].type
    held = 1 if assemble else 0        # carried: [product?] + the accumulator per chain
    half = block // 2
    chains = ([(+1, 0, block), (-1, 0, block)] if two else        # (direction, rows)
              [(+1, 0, half), (+1, half, block - half)] if plan.chains == 2 else
              [(+1, 0, block)])

    def send(value, sign):
        """Shift an accumulator along its chain's direction (a fresh channel each)."""
        return b.collective_permute(value, ring.shift_pairs(sign),
                                    channels() if ring.uses_channel else None)

    prologues = prologues or {}
    # What each dot's operand is in the invariants: the operand, or its prologue's sources.
    layout = [[len(prologues[(i, index)].sources) if (i, index) in prologues else 1
               for index in range(2)] for i in range(len(dots))]

    def part(sign, step, extra, first, rows, invariants, product):
        """This device's share of rows first..first+rows of block p + sign*step + extra
        (views replayed, added terms added, in the sum's type) and the product with
        those rows written in."""
        *rest, position = invariants
        offset = b.plus_rows(b.block_offset(position, step, n, block, sign, extra), first)
        whole = None
        for i, (dot, dot_sliced) in enumerate(zip(dots, sliced)):
            groups = []   # per operand: the operand, or its prologue's sources
            for count in layout[i]:
                groups.append(rest[:count])
                rest = rest[count:]
            operands = [group[0] for group in groups]
            for index, operand_dim in dot_sliced:
                blocks = [b.slice_dim(v, operand_dim, offset, rows) for v in groups[index]]
                prologue = prologues.get((i, index))
                operands[index] = (blocks[0] if prologue is None else prologue.replay(
                    blocks, block_type_for(operand_dim, rows)))
            term = b.dot_like(dot, *operands, b.with_dim(part_type, result_dim, rows))
            whole = term if whole is None else b.add(whole, term)
        for term, dims in zip(rest, broadcasts):   # what is left: the added terms
            whole = b.add(whole, b.slice_dim(term, result_dim, offset, rows) if dims is None
                          else b.broadcast_rows(term, dims, whole.type, result_dim, offset))
        if product is not None:   # the dots' sum and the added terms
            product = b.update_dim(product, whole, result_dim, offset)
        return widen(replay(views, whole)), product

    def widen(value):
        if sum_type is None or value.type.element_type == sum_type:
            return value
        return stablehlo.convert(ir.RankedTensorType.get(value.type.shape, sum_type), value)

    def round_(k, carried, invariants):
        """Chain 0 sends the sum it kept from the previous round; chain 1 adds its part
        to what it received and sends the sum on; chain 0 adds its part to the sum
        that just arrived and keeps it. Each transfer runs beside the next dot, and
        both end within the round (a loop iteration ends with no transfer in flight).
        `carried` is [product?] + per chain (chain 0's kept sum, chain 1's received
        accumulator); None where a chain has not started (only before the loop)."""
        product, carry = (carried[0] if held else None), list(carried[held:])
        last = isinstance(k, int) and k == a
        arrived = None
        if len(chains) == 2 and carry[0] is not None:
            arrived = send(carry[0], chains[0][0])
        immediate = len(chains) - 1
        sign, first, rows = chains[immediate]
        # Two streams: the up stream starts late and ends before the own block.
        if not (two and (last or (isinstance(k, int) and k < up_start))):
            value, product = part(sign, k, -a * sign, first, rows, invariants, product)
            acc = value if carry[immediate] is None else b.add(value, carry[immediate])
            carry[immediate] = acc if last else send(acc, sign)   # last: the own rows
        if len(chains) == 2:
            sign, first, rows = chains[0]
            if last and two:        # the own block, with both arrivals
                value, product = part(+1, 0, 0, 0, block, invariants, product)
                if platform == "tpu":
                    return ([product] if held else []) + [
                        b.add(b.add(value, arrived), carry[1]), None]
                # XLA's GPU GEMMs fuse both adds and wait for the down stream's last
                # transfer: the barrier keeps that add out, so the own block's dot runs
                # while the transfer does (on TPU it would unfuse the other add too).
                # The forms every backend runs too: compiled for h100:8 they kept that
                # transfer synchronous (70B MLP, two streams).
                (own,) = b.barrier([b.add(value, carry[1])])
                return ([product] if held else []) + [b.add(own, arrived), None]
            value, product = part(sign, k, -a * sign, first, rows, invariants, product)
            if last and platform == "gpu" and arrived is not None:
                # As above: keep the add of the last arrival out of the GEMM's fusion,
                # so that this dot runs while the last transfer does.
                (value,) = b.barrier([value])
            carry[0] = value if arrived is None else b.add(value, arrived)
        return ([product] if held else []) + carry

    position = b.ring_position(ring)
    # A broadcast term (a bias) enters as its source, broadcast again per block: sliced
    # from the whole broadcast, the compiler writes the whole broadcast out.
    terms, broadcasts = zip(*map(broadcast_source, addends)) if addends else ((), ())
    invariants = ([value for i, dot in enumerate(dots) for index in range(2)
                   for value in (prologues[(i, index)].sources if (i, index) in prologues
                                 else [dot.operands[index]])] + list(terms) + [position])
    carried = (([b.buffer(dots[0].results[0].type, platform)] if held else [])
               + [None] * len(chains))
    carried = b.planned_rounds(plan, carried, invariants, round_)
    product, sums = (carried[0] if held else None), carried[held:]
    if two or len(sums) == 1:
        return sums[0], product
    # The halves written into one buffer (a concatenate would copy both).
    whole = b.with_dim(ir.RankedTensorType(sums[0].type), out_dim, block)
    result = b.buffer(whole, platform)
    for value, (_, first, _) in zip(sums, chains):
        result = b.update_dim(result, value, out_dim, b.scalar(first, b.index_dtype(n * block)))
    return result, product
