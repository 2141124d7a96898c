"""The all_gather ring: its schedule (`plan_of`) and the IR of its rounds (`emit_loop`)."""
from __future__ import annotations

from jaxlib.mlir import ir

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.ops import as_op
from overlap_hlo.passes.gather_consumers import RingConsumer
from overlap_hlo.passes.rings import options_plan, shift
from overlap_hlo.plan.ring_plan import GATHER, RingPlan
from overlap_hlo.plan.target_form import DEFAULT, TargetForm
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import RewritePass


def plan_of(n: int, options: RewritePass, sums: bool = False,
            bidirectional: bool | None = None) -> RingPlan:
    """The schedule `emit_loop` builds for a group of `n` with these options; `sums`:
    a consumer sums products (a contracting gathered dim)."""
    # Outside the TPU forms a ring that sums keeps one round per iteration unless asked
    # (XLA's GPU pipeline left unrolled ones' sends bare); the TPU forms (RingPlan
    # `tied_sums`) unroll, as one round per iteration copied the carried shards
    # (benchmarks/RESULTS.md).
    tied = options.form.tied_sums
    unroll = options.unroll if options.unroll_given or not sums or tied else 1
    return options_plan(GATHER, n, options, bidirectional, unroll=unroll, in_loop_sum=sums,
                        tied_sums=tied, own_last=tied and options.own_shard_last)


def emit_loop(consumers: list[RingConsumer], shard: ir.Value, gather_dim: int,
              ring: Ring, plan: RingPlan, channels, form: TargetForm = DEFAULT
              ) -> list[ir.Value]:
    """One ring for all `consumers`, built at the current insertion point as `plan`
    says, in the target's `form`.

    Round 0 multiplies the device's own shard while sending it on (the own-last TPU
    form of a two-stream ring that sums multiplies it in the last round instead,
    RingPlan `own_last`); round r multiplies
    the shard of position p + r (and p - r from the second stream when bidirectional)
    while sending both on; the last round sends nothing. For even N the two streams
    meet at p + N/2: the up stream's last send is left out. The TPU form of a ring
    that sums ties each inline round's sum before the next adds to it (`tied_sums`).
    """
    rounds = GatherRounds(consumers, shard, gather_dim, ring, plan, channels, form)
    position = b.ring_position(ring)
    invariants = [value for c in consumers for value in c.inputs] + [position]
    accs = [b.buffer(c.acc_type, form.allocates) if c.result_dim is not None
            else b.zeros(c.acc_type) if plan.sums_from_zeros else None for c in consumers]
    carried = b.planned_rounds(plan, [shard] * plan.streams + accs, invariants, rounds.round_)
    return [c.finish(acc) for c, acc in zip(consumers, carried[plan.streams:])]


class GatherRounds:
    """The rounds of one all_gather ring: `round_` sends the shards held on and adds
    their products to each consumer's accumulator."""

    def __init__(self, consumers: list[RingConsumer], shard: ir.Value, gather_dim: int,
                 ring: Ring, plan: RingPlan, channels, form: TargetForm):
        self.consumers, self.shard, self.gather_dim = consumers, shard, gather_dim
        self.ring, self.plan, self.channels = ring, plan, channels
        self.n, self.streams = ring.size, plan.streams
        self.shared = bool(plan.shared_rounds)   # a loop round may hold one block twice
        # Outside the TPU forms, where a round multiplies more than two blocks: a dot's second
        # block waits for its first to be written (one barrier), or XLA's GPU scheduler runs
        # a round's GEMMs ahead of their writes with every product live at once. Not with
        # two blocks or fewer, where the waits cost overlap (benchmarks/RESULTS.md).
        self.serial = (form.serial_blocks
                       and plan.streams * sum(c.dots for c in consumers) > 2)

    def send(self, values: list[ir.Value]) -> list[ir.Value]:
        """Shift stream 0 down the ring and stream 1 up (each permute a fresh channel)."""
        return [shift(v, self.ring, sign, self.channels)
                for v, sign in zip(values, (+1, -1))]

    def step(self, k, shards, accs, invariants, shifts=None) -> list[ir.Value]:
        """Each consumer's accumulator with the products of `shards` added."""
        *inputs, position = invariants
        shifts = shifts or [(+1, k), (-1, k)][:len(shards)]
        shared = self.shared and len(shards) == 2
        results = []
        for consumer, acc in zip(self.consumers, accs):
            mine, inputs = inputs[:len(consumer.inputs)], inputs[len(consumer.inputs):]
            results.append(consumer.accumulate(acc, shards, shifts, mine, position, self.n,
                                               self.gather_dim, shared, self.serial))
        return results

    def round_(self, k, carried, invariants) -> list:
        """Send the shards held on (the streams the plan says), multiply them."""
        plan, streams = self.plan, self.streams
        held, accs = carried[:streams], carried[streams:]
        fixed = isinstance(k, int)
        blocks = plan.blocks[k] if fixed else streams
        sending = plan.sends[k] if fixed else streams
        held, accs = self.tie_previous_round(k, sending, held, accs)
        if fixed and k == 0:   # the own shard: multiplied first (if at all), then sent
            if blocks:
                accs = self.step(k, held[:blocks], accs, invariants)
            return self.send(held[:sending]) + [None] * (streams - sending) + accs
        sent = self.send(held[:sending]) + [None] * (streams - sending)
        if fixed and k == plan.rounds - 1 and plan.own_in_last_round:
            # p+N/2 (down stream) beside the device's own shard, still held as `shard`
            return sent + self.step(k, [held[0], self.shard], accs, invariants,
                                    [(+1, k), (+1, 0)])
        return sent + self.step(k, held[:blocks], accs, invariants)

    def tie_previous_round(self, k, sending, held: list, accs: list) -> tuple[list, list]:
        """`held` and `accs` behind an optimization_barrier where round `k` must not
        start before the previous round's products."""
        plan = self.plan
        if isinstance(k, int) and k != 0 and plan.tied_sums and plan.in_loop_sum:
            # An inline round of the TPU form of a ring that sums: the sum so far, alone
            # (RingPlan `tied_sums`); tying the shards too keeps each add out of the
            # next dot's fusion.
            accs = [b.barrier([acc])[0] if _made_here(acc) else acc for acc in accs]
        elif k != 0 and sending and any(_made_here(acc) for acc in accs):
            # The previous round's products first (one optimization_barrier): the
            # compiler then runs that round's dots while its shifts travel, not while
            # these do (an unrolled TPU loop left one permute per iteration bare).
            tied = iter(b.barrier([v for v in held + accs if v is not None]))
            held, accs = ([None if v is None else next(tied) for v in values]
                          for values in (held, accs))
        return held, accs


def _made_here(value: ir.Value | None) -> bool:
    """Whether `value` was computed by a round in the block being built (not a loop's
    block argument or result)."""
    if value is None or not isinstance(value, ir.OpResult):
        return False
    owner = as_op(value.owner)
    return (owner.name != "stablehlo.while"
            and owner.block == ir.InsertionPoint.current.block)
