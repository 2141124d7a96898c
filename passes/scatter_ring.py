"""The reduce_scatter ring: its schedule (`plan_of`) and the IR of its rounds
(`emit_loop`)."""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import DotDims
from overlap_hlo.ir.lookthrough import View, replay
from overlap_hlo.ir.ops import broadcast_source
from overlap_hlo.passes.epilogue import block_type_for
from overlap_hlo.passes.rings import options_plan, shift
from overlap_hlo.plan.ring_plan import SCATTER, RingPlan
from overlap_hlo.plan.target_form import DEFAULT, TargetForm
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import RewritePass


def plan_of(n: int, options: RewritePass, block: int = 2,
            bidirectional: bool | None = None) -> RingPlan:
    """The schedule `emit_loop` builds for a group of `n` with these options; `block`:
    the rows of the scattered block (one row cannot be split into two chains). One
    round per loop iteration, whatever `unroll` says: the two chains copy no buffer,
    and in a second round of one iteration the TPU compiler split an add from its dot
    (the add then waited for a transfer)."""
    return options_plan(SCATTER, n, options, bidirectional, unroll=1,
                        chains=2 if block >= 2 else 1)


def emit_loop(dots: list[ir.Operation], addends: list[ir.Value], result_dim: int,
              block: int, ring: Ring, views: list[View], plan: RingPlan, channels,
              assemble: bool = False, sum_type: ir.Type | None = None,
              form: TargetForm = DEFAULT,
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
    which both arrivals add. In round k < a the down accumulator collects block
    p + k - a (it reaches its owner after a - k more shifts), the up one p + a - k.
    Every block of this device's product is computed exactly once; an added term (a
    bias) is sliced like the product and added to each block once, so the sum over the
    devices is that of the original (dot + term). `sum_type`: the element type the
    reduce_scatter sums in, when wider than its operand's (each part is converted
    before it is added). `prologues`: (dot, operand) -> elementwise ops making that
    operand, replayed on each block of their sliced sources. `form`: the target's.
    """
    rounds = ScatterRounds(dots, addends, result_dim, block, ring, views, plan, channels,
                           assemble, sum_type, form, prologues or {})
    position = b.ring_position(ring)
    prologues, held = rounds.prologues, rounds.held
    invariants = ([value for i, dot in enumerate(dots) for index in range(2)
                   for value in (prologues[(i, index)].sources if (i, index) in prologues
                                 else [dot.operands[index]])] + list(rounds.terms) + [position])
    carried = (([b.buffer(dots[0].results[0].type, form.allocates)] if held else [])
               + [None] * len(rounds.chains))
    carried = b.planned_rounds(plan, carried, invariants, rounds.round_)
    product, sums = (carried[0] if held else None), carried[held:]
    if rounds.two or len(sums) == 1:
        return sums[0], product
    # The halves written into one buffer (a concatenate would copy both).
    whole = b.with_dim(ir.RankedTensorType(sums[0].type), out_dim, block)
    result = b.buffer(whole, form.allocates)
    for value, (_, first, _) in zip(sums, rounds.chains):
        result = b.update_dim(result, value, out_dim,
                              b.scalar(first, b.index_dtype(ring.size * block)))
    return result, product


class ScatterRounds:
    """The rounds of one reduce_scatter ring: in `round_` each chain adds its part of
    a block to the accumulator it received and sends the sum on."""

    def __init__(self, dots: list[ir.Operation], addends: list[ir.Value], result_dim: int,
                 block: int, ring: Ring, views: list[View], plan: RingPlan, channels,
                 assemble: bool, sum_type: ir.Type | None, form: TargetForm, prologues: dict):
        self.dots, self.result_dim, self.block, self.ring = dots, result_dim, block, ring
        self.views, self.plan, self.channels = views, plan, channels
        self.sum_type, self.form, self.prologues = sum_type, form, prologues
        self.n = ring.size
        self.a = plan.rounds - 1                     # the last round: the device's own block
        self.two = plan.streams == 2
        # the up stream's first round
        self.up_start = plan.blocks.index(2) if self.two else self.a
        self.sliced = [DotDims.of(dot).result_source(result_dim) for dot in dots]
        self.part_type = dots[0].results[0].type
        self.held = 1 if assemble else 0        # carried: [product?] + the accumulator per chain
        half = block // 2
        self.chains = ([(+1, 0, block), (-1, 0, block)] if self.two else   # (direction, rows)
                       [(+1, 0, half), (+1, half, block - half)] if plan.chains == 2 else
                       [(+1, 0, block)])
        # What each dot's operand is in the invariants: the operand, or its prologue's sources.
        self.layout = [[len(prologues[(i, index)].sources) if (i, index) in prologues else 1
                        for index in range(2)] for i in range(len(dots))]
        # A broadcast term (a bias) enters as its source, broadcast again per block: sliced
        # from the whole broadcast, the compiler writes the whole broadcast out.
        self.terms, self.broadcasts = (zip(*map(broadcast_source, addends)) if addends
                                       else ((), ()))

    def send(self, value: ir.Value, sign: int) -> ir.Value:
        """Shift an accumulator along its chain's direction (a fresh channel each)."""
        return shift(value, self.ring, sign, self.channels)

    def part(self, sign, step, extra, first, rows, invariants, product):
        """This device's share of rows first..first+rows of block p + sign*step + extra
        (views replayed, added terms added, in the sum's type) and the product with
        those rows written in."""
        result_dim = self.result_dim
        *rest, position = invariants
        offset = b.plus_rows(b.block_offset(position, step, self.n, self.block, sign, extra),
                             first)
        whole = None
        for i, (dot, dot_sliced) in enumerate(zip(self.dots, self.sliced)):
            groups = []   # per operand: the operand, or its prologue's sources
            for count in self.layout[i]:
                groups.append(rest[:count])
                rest = rest[count:]
            operands = [group[0] for group in groups]
            for index, operand_dim in dot_sliced:
                blocks = [b.slice_dim(v, operand_dim, offset, rows) for v in groups[index]]
                prologue = self.prologues.get((i, index))
                operands[index] = (blocks[0] if prologue is None else prologue.replay(
                    blocks, block_type_for(operand_dim, rows)))
            term = b.dot_like(dot, *operands, b.with_dim(self.part_type, result_dim, rows))
            whole = term if whole is None else b.add(whole, term)
        for term, dims in zip(rest, self.broadcasts):   # what is left: the added terms
            whole = b.add(whole, b.slice_dim(term, result_dim, offset, rows) if dims is None
                          else b.broadcast_rows(term, dims, whole.type, result_dim, offset))
        if product is not None:   # the dots' sum and the added terms
            product = b.update_dim(product, whole, result_dim, offset)
        return self.widen(replay(self.views, whole)), product

    def widen(self, value: ir.Value) -> ir.Value:
        """`value` in the reduce_scatter's sum type."""
        sum_type = self.sum_type
        if sum_type is None or value.type.element_type == sum_type:
            return value
        return stablehlo.convert(ir.RankedTensorType.get(value.type.shape, sum_type), value)

    def round_(self, k, carried, invariants) -> list:
        """Chain 0 sends the sum it kept from the previous round; chain 1 adds its part
        to what it received and sends the sum on; chain 0 adds its part to the sum
        that just arrived and keeps it. Each transfer runs beside the next dot, and
        both end within the round (a loop iteration ends with no transfer in flight).
        `carried` is [product?] + per chain (chain 0's kept sum, chain 1's received
        accumulator); None where a chain has not started (only before the loop)."""
        a, two, chains, held = self.a, self.two, self.chains, self.held
        product, carry = (carried[0] if held else None), list(carried[held:])
        last = isinstance(k, int) and k == a
        arrived = None
        if len(chains) == 2 and carry[0] is not None:
            arrived = self.send(carry[0], chains[0][0])
        immediate = len(chains) - 1
        sign, first, rows = chains[immediate]
        # Two streams: the up stream starts late and ends before the own block.
        if not (two and (last or (isinstance(k, int) and k < self.up_start))):
            value, product = self.part(sign, k, -a * sign, first, rows, invariants, product)
            acc = value if carry[immediate] is None else b.add(value, carry[immediate])
            carry[immediate] = acc if last else self.send(acc, sign)   # last: the own rows
        if len(chains) == 2:
            if last and two:        # the own block, with both arrivals
                return self.own_block(invariants, product, arrived, carry[1])
            sign, first, rows = chains[0]
            value, product = self.part(sign, k, -a * sign, first, rows, invariants, product)
            if last and self.form.last_add_apart and arrived is not None:
                # As in `own_block`: keep the add of the last arrival out of the GEMM's
                # fusion, so that this dot runs while the last transfer does.
                (value,) = b.barrier([value])
            carry[0] = value if arrived is None else b.add(value, arrived)
        return ([product] if held else []) + carry

    def own_block(self, invariants, product, arrived, up_arrived) -> list:
        """The last round of two streams: the device's own block, to which the down
        stream's arrival (`arrived`) and the up stream's both add."""
        value, product = self.part(+1, 0, 0, 0, self.block, invariants, product)
        kept = [product] if self.held else []
        if not self.form.own_add_apart:
            return kept + [b.add(b.add(value, arrived), up_arrived), None]
        # XLA's GPU GEMMs fuse both adds and wait for the down stream's last
        # transfer: the barrier keeps that add out, so the own block's dot runs
        # while the transfer does (on TPU it would unfuse the other add too).
        # The forms every backend runs too: compiled for h100:8 they kept that
        # transfer synchronous (70B MLP, two streams).
        (own,) = b.barrier([b.add(value, up_arrived)])
        return kept + [b.add(own, arrived), None]
