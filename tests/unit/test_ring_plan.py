"""One ring plan: the loops the passes emit are the plan's (trip counts of the
stablehlo.while ops, permutes built and executed), for every group size, direction
and unroll; the remarks' sites carry the plan the ring was built from."""
import itertools

import numpy as np
import pytest
from jaxlib.mlir import ir

import overlap_hlo
from harness import (GATHER_MODULE, MANUAL, SCATTER_MODULE, SUMMING_GATHER_MODULE, ops_named,
                     run_spmd_module)
from overlap_hlo.plan.ring_plan import GATHER, SCATTER, RingPlan

TEMPLATES = {GATHER: GATHER_MODULE, SCATTER: SCATTER_MODULE}
GRID = list(itertools.product(range(2, 9), (False, True), range(1, 5)))


def module_for(kind: str, n: int) -> ir.Module:
    return overlap_hlo.parse(TEMPLATES[kind].format(n=n, full=2 * n, group=list(range(n)), handle=1))


def _int(value: ir.Value) -> int:
    """The integer a scalar stablehlo.constant holds."""
    op = value.owner.operation
    assert op.name == "stablehlo.constant", op
    return int(ir.DenseIntElementsAttr(op.attributes["value"])[0])


def trip_count(loop: ir.Operation) -> int:
    """Iterations of a counted stablehlo.while as the passes build it: the induction
    variable (operand 0) starts at a constant, the condition compares it LT a
    constant, the body adds a constant."""
    start = _int(loop.operands[0])
    cond = list(loop.regions[0].blocks[0].operations)
    compare = cond[-1].operands[0].owner.operation
    assert compare.name == "stablehlo.compare"
    assert compare.operands[0] == loop.regions[0].blocks[0].arguments[0]
    stop = _int(compare.operands[1])
    body = loop.regions[1].blocks[0]
    step_op = list(body.operations)[-1].operands[0].owner.operation
    assert step_op.name == "stablehlo.add" and step_op.operands[0] == body.arguments[0]
    step = _int(step_op.operands[1])
    return max(0, -(-(stop - start) // step))


def structure(module: ir.Module) -> tuple[list[int], int, int]:
    """(trip counts of the while ops, permutes built, permutes executed)."""
    trips, built, executed = [], 0, 0
    loops = ops_named(module, "stablehlo.while")
    inside = 0
    for loop in loops:
        trips.append(trip_count(loop))
        count = sum(1 for op in loop.regions[1].blocks[0].operations
                    if op.operation.name == "stablehlo.collective_permute")
        inside += count
        executed += count * trips[-1]

    def count_all(op):
        nonlocal built
        built += op.name == "stablehlo.collective_permute"
        return ir.WalkResult.ADVANCE

    module.operation.walk(count_all)
    return trips, built, executed + built - inside


@pytest.mark.parametrize("kind", [GATHER, SCATTER])
def test_emitted_loops_are_the_plan(kind):
    for n, bidi, unroll in GRID:
        module = module_for(kind, n)
        (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=bidi,
                                             unroll=unroll)
        # A reduce_scatter ring runs one round per iteration whatever unroll says.
        plan = RingPlan(kind, n, bidi, unroll if kind == GATHER else 1)
        assert site.applied and site.plan == plan and site.rings == 1, (n, bidi, unroll)
        trips, built, executed = structure(module)
        assert trips == ([plan.trip_count] if plan.trip_count else []), (plan, trips)
        assert built == plan.permutes, plan
        assert executed == plan.transfers == moves(plan), plan


@pytest.mark.parametrize("target, trips", [("tpu", [1]), ("gpu", []), ("cpu", [])])
def test_a_loop_that_runs_once_only_on_tpu(target, trips):
    """Two streams, unroll=2 over 8 devices: rounds 1 and 2 fill one iteration. The TPU
    forms keep that loop; the others emit its rounds inline (the same permutes)."""
    module = module_for(GATHER, 8)
    (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=True,
                                         unroll=2, target=target)
    assert site.applied and site.plan.trip_count == len(trips)
    assert structure(module) == (trips, 7, 7)


@pytest.mark.parametrize("target, unroll", [("tpu", 2), ("gpu", 2), ("cpu", 1), ("", 1)])
def test_default_unroll_per_target(target, unroll):
    """An unset unroll: 2 for the TPU and GPU forms of a gather ring, else 1; a ring that
    sums keeps 1 unless unroll is given (XLA's GPU pipeline left its unrolled sends
    bare)."""
    (site,) = overlap_hlo.rewrite_module(module_for(GATHER, 8), threshold_mib=0,
                                         target=target)
    assert site.plan.unroll == unroll
    summing = SUMMING_GATHER_MODULE.format(n=8, full=16, group=list(range(8)), handle=1,
                                           manual="")
    for given, expected in ((None, 1), (2, 2)):
        if target == "tpu":   # a summing ring is left unchanged on TPU
            continue
        (site,) = overlap_hlo.rewrite_module(overlap_hlo.parse(summing), threshold_mib=0,
                                             target=target, unroll=given)
        assert site.applied and site.plan.unroll == expected, (target, given)


def moves(plan: RingPlan) -> int:
    """Shifts a ring makes: every block moves N-1 times, in two halves for a one-stream
    reduce_scatter ring (its two chains)."""
    halves = plan.kind == SCATTER and plan.streams == 1 and plan.chains == 2
    return (plan.group_size - 1) * (2 if halves else 1)


def test_plan_invariants():
    for kind, (n, bidi, unroll) in itertools.product((GATHER, SCATTER), GRID):
        plan = RingPlan(kind, n, bidi, unroll)
        assert sum(plan.blocks) == n and plan.transfers == moves(plan)
        assert plan.streams == (2 if bidi and n > 2 else 1)
        assert plan.loop_start <= plan.loop_end <= plan.loop_stop <= plan.rounds
        assert plan.loop_end - plan.loop_start == plan.trip_count * unroll
        assert plan.remainder == plan.loop_stop - plan.loop_end < unroll
        assert plan.trip_count != 1, plan   # a loop that would run once is not built
        assert list(plan.rounds_before_loop) + list(range(plan.loop_start, plan.loop_end)) \
            + list(plan.rounds_after_loop) == list(range(plan.rounds))
        # The loop's rounds have one form: every stream (chain) multiplies and sends.
        sending = 2 if kind == SCATTER and plan.streams == 1 else plan.streams
        for k in range(plan.loop_start, plan.loop_stop):
            assert (plan.blocks[k], plan.sends[k]) == (plan.streams, sending), (plan, k)
        # A shift is in flight in every round but the gather's last (nothing left to
        # send) and, with two streams and even N, the scatter's first (the up stream
        # starts a round late and the down stream has nothing summed yet).
        idle = ((plan.rounds - 1,) if kind == GATHER else
                (0,) if plan.streams == 2 and n % 2 == 0 else ())
        assert plan.idle_rounds == idle, plan


def test_plan_by_hand():
    one = RingPlan(SCATTER, 8)   # chain 1 sends in rounds 0..6, chain 0 in 1..7
    assert (one.blocks, one.sends) == ((1,) * 8, (1,) + (2,) * 6 + (1,))
    assert (one.loop_start, one.loop_stop, one.trip_count, one.permutes) == (1, 7, 6, 4)
    lone = RingPlan(SCATTER, 8, chains=1)   # blocks of one row: one chain
    assert (lone.sends, lone.transfers) == ((1,) * 7 + (0,), 7)
    two = RingPlan(SCATTER, 8, bidirectional=True)
    assert (two.blocks, two.sends) == ((1, 2, 2, 2, 1), (0, 2, 2, 2, 1))
    assert (two.loop_start, two.trip_count, list(two.rounds_after_loop)) == (2, 2, [4])
    gather = RingPlan(GATHER, 8, bidirectional=True, unroll=2)
    assert (gather.blocks, gather.sends) == ((1, 2, 2, 2, 1), (2, 2, 2, 1, 0))
    assert (gather.trip_count, gather.remainder, gather.permutes) == (0, 0, 7)  # no 1-trip loop
    assert gather.describe() == "5 rounds, no loop, 7 shifts (2 streams)"
    # The TPU forms keep a loop that runs once (the compiler inlines it itself).
    tpu = RingPlan(GATHER, 8, bidirectional=True, unroll=2, single_trip_loop=True)
    assert (tpu.trip_count, tpu.permutes) == (1, 7)
    assert tpu.describe() == "5 rounds, rounds 1..2 in a loop of 1 x 2, 7 shifts (2 streams)"
    # Groups of 2 use one stream whatever was asked.
    assert RingPlan(GATHER, 2, bidirectional=True) == RingPlan(GATHER, 2, bidirectional=True)
    assert RingPlan(GATHER, 2, bidirectional=True).streams == 1


@pytest.mark.parametrize("args, message", [
    (("ring", 4), "ring kind"), ((GATHER, 1), "2 or more devices"),
    ((GATHER, 4, False, 0), "unroll >= 1"), ((SCATTER, 4, False, 1, False, 3), "chains")])
def test_plan_refuses_nonsense(args, message):
    with pytest.raises(ValueError, match=message):
        RingPlan(*args)


def test_unchanged_sites_carry_the_plan_they_were_predicted_with():
    (site,) = overlap_hlo.remarks(module_for(GATHER, 4), threshold_mib=1e9, unroll=2)
    assert not site.applied and site.plan == RingPlan(GATHER, 4, unroll=2)
    assert site.estimate.blocks_per_round == site.plan.blocks


@pytest.mark.parametrize("n, bidi, unroll, blocks, sends, start, stop, after", [
    # One stream: every round but round 0 in the loop; the last one's send is unread.
    (8, False, 1, (1,) * 8, (1,) * 8, 1, 8, ()),
    # Unrolled: when all N rounds fill whole iterations, round 0 runs in the loop too
    # (the sum starts from zeros); otherwise the rounds that fill none go before it.
    (8, False, 2, (1,) * 8, (1,) * 8, 0, 8, ()),
    (8, False, 4, (1,) * 8, (1,) * 8, 0, 8, ()),
    (8, False, 3, (1,) * 8, (1,) * 8, 2, 8, ()),
    (7, False, 2, (1,) * 7, (1,) * 7, 1, 7, ()),
    # Two streams, even N: both hold p+4 in round 4 (a shared round), in the loop too.
    (8, True, 1, (1, 2, 2, 2, 2), (2, 2, 2, 2, 2), 1, 5, ()),
    (8, True, 2, (1, 2, 2, 2, 2), (2, 2, 2, 2, 2), 1, 5, ()),
    (6, True, 1, (1, 2, 2, 2), (2, 2, 2, 2), 1, 4, ()),
    # Two streams, odd N: every round after 0 in the loop.
    (7, True, 1, (1, 2, 2, 2), (2, 2, 2, 2), 1, 4, ()),
    # Fewer than two rounds of the loop's form: the plain gather ring.
    (2, False, 1, (1, 1), (1, 0), 1, 1, (1,)),
    (3, True, 1, (1, 2), (2, 0), 1, 1, (1,)),
    (4, True, 1, (1, 2, 1), (2, 1, 0), 1, 1, (1, 2)),  # a shared round would double the shifts
])
def test_summing_gather_rounds(n, bidi, unroll, blocks, sends, start, stop, after):
    plan = RingPlan(GATHER, n, bidi, unroll, in_loop_sum=True)
    assert (plan.blocks, plan.sends, plan.loop_start, plan.loop_stop) == (blocks, sends,
                                                                          start, stop)
    assert tuple(plan.rounds_after_loop) == after and plan.remainder == 0
    assert plan.sums_from_zeros == (start == 0)
    shared = (n // 2,) if bidi and n % 2 == 0 and plan.loop_stop == plan.rounds else ()
    assert plan.shared_rounds == shared
    assert sum(plan.blocks) - len(shared) == n   # every block multiplied once
    assert plan.transfers >= RingPlan(GATHER, n, bidi, unroll).transfers


@pytest.mark.parametrize("n, unroll, blocks, sends, start, stop", [
    # Round 0 only sends; the last round multiplies p+4 beside the own shard.
    (8, 2, (0, 2, 2, 2, 2), (2, 2, 2, 1, 0), 4, 4),   # a one-trip loop: inline
    (8, 1, (0, 2, 2, 2, 2), (2, 2, 2, 2, 0), 2, 4),   # rounds 2..3 in a loop (one unread)
    (8, 3, (0, 2, 2, 2, 2), (2, 2, 2, 1, 0), 4, 4),
    (4, 1, (0, 2, 2), (2, 1, 0), 2, 2),
    (6, 2, (0, 2, 2, 2), (2, 2, 1, 0), 3, 3),
    (10, 2, (0, 2, 2, 2, 2, 2), (2, 2, 2, 2, 1, 0), 5, 5),
    (16, 2, (0,) + (2,) * 8, (2,) * 8 + (0,), 2, 8),   # 3 iterations of 2 rounds
    (16, 4, (0,) + (2,) * 8, (2,) * 7 + (1, 0), 8, 8),  # 6 rounds, one trip: inline
    (18, 2, (0,) + (2,) * 9, (2,) * 9 + (0,), 3, 9),   # round 2 before the loop
])
def test_tpu_summing_gather_rounds(n, unroll, blocks, sends, start, stop):
    """The own-last TPU form of a two-stream summing ring: every dot multiplies two
    shards, each shard once; the first shifts have no dot beside them."""
    plan = RingPlan(GATHER, n, True, unroll, in_loop_sum=True, tied_sums=True, own_last=True,
                    single_trip_loop=True)
    assert plan.own_in_last_round
    assert (plan.blocks, plan.sends, plan.loop_start, plan.loop_stop) == (blocks, sends,
                                                                          start, stop)
    assert plan.trip_count != 1 and plan.remainder == 0 and not plan.sums_from_zeros
    assert plan.shared_rounds == () and sum(plan.blocks) == n
    assert plan.dots(0) == 0 and all(plan.dots(k) == 1 for k in range(1, plan.rounds))
    assert plan.transfers >= RingPlan(GATHER, n, True, unroll).transfers


@pytest.mark.parametrize("n, bidi", [(7, True), (8, False), (2, True)])
def test_own_last_needs_two_streams_and_even_n(n, bidi):
    """Odd groups and one stream keep the own shard in round 0 (the TPU layout of two
    streams, the summing layout of one); own_last needs tied_sums (the TPU form)."""
    plan = RingPlan(GATHER, n, bidi, 1, in_loop_sum=True, tied_sums=True, own_last=True)
    first = RingPlan(GATHER, n, bidi, 1, in_loop_sum=True, tied_sums=True)
    assert not plan.own_in_last_round and plan.blocks[0] == 1
    assert (plan.blocks, plan.sends, plan.loop_start) == (first.blocks, first.sends,
                                                          first.loop_start)
    assert not RingPlan(GATHER, 8, True, 1, in_loop_sum=True, own_last=True).own_in_last_round


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8, 10, 16, 17, 32])
@pytest.mark.parametrize("unroll", [1, 2, 3, 4])
def test_tpu_summing_gather_rounds_own_first(n, unroll):
    """The TPU form of a two-stream summing ring (tied_sums): the all_gather ring's
    layout (own shard alone in round 0 beside the first shifts, p+N/2 alone last, no
    shared round), inline unless its uniform rounds fill two iterations or more."""
    plan = RingPlan(GATHER, n, True, unroll, in_loop_sum=True, tied_sums=True,
                    single_trip_loop=True)
    last = n // 2
    uniform = last - 2 if n % 2 == 0 else last - 1     # rounds 1.. that send on both
    trips = uniform // unroll if uniform // unroll >= 2 else 0
    assert plan.blocks == (1,) + (2,) * (last - 1) + ((1,) if n % 2 == 0 else (2,))
    assert plan.sends[-1] == 0 and sum(plan.sends) == n - 1 and plan.trip_count == trips
    assert plan.loop_start == (1 if trips else plan.loop_stop)
    assert plan.shared_rounds == () and not plan.sums_from_zeros and sum(plan.blocks) == n
    assert not plan.own_in_last_round and plan.idle_rounds == (plan.rounds - 1,)


def test_emitted_summing_loops_are_the_plan():
    """A contracting gathered dim: the loops are the in_loop_sum plan's, in the forms
    every backend runs and in both layouts of the TPU form."""
    tpu = dict(single_trip_loop=True, tied_sums=True, views_in_loop=True)
    forms = [({}, {}), (dict(target="tpu", tpu_summing_rings=True), tpu),
             (dict(target="tpu", tpu_summing_rings=True, own_shard_last=True),
              dict(tpu, own_last=True))]
    for (n, bidi, unroll), (options, plan_options) in itertools.product(GRID, forms):
        module = overlap_hlo.parse(SUMMING_GATHER_MODULE.format(
            n=n, full=2 * n, group=list(range(n)), handle=1, manual=""))
        (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=bidi,
                                             unroll=unroll, **options)
        plan = RingPlan(GATHER, n, bidi, unroll, in_loop_sum=True, **plan_options)
        assert site.applied and site.plan == plan, (n, bidi, unroll, options)
        trips, built, executed = structure(module)
        assert trips == ([plan.trip_count] if plan.trip_count else []), (plan, trips)
        assert built == plan.permutes and executed == plan.transfers, plan


@pytest.mark.parametrize("n", range(2, 9))
def test_summing_rings_compute_the_gathered_dot(n):
    """Every plan form of a summing ring over a group of n (one or two streams, unroll
    1-3: product- or zero-started sums, rounds before the loop, shared last rounds)
    gives the original's result on n host CPU devices."""
    text = SUMMING_GATHER_MODULE.format(n=n, full=2 * n, group=list(range(n)), handle=1,
                                        manual=MANUAL)
    rng = np.random.default_rng(n)
    inputs = [rng.standard_normal((n, 16, 2), np.float32),
              np.repeat(rng.standard_normal((1, 2 * n, 8), np.float32), n, axis=0)]
    want = run_spmd_module(text, 1, n, inputs)[0]
    for bidi, unroll in itertools.product((False, True), (1, 2, 3)):
        module = overlap_hlo.parse(text)
        (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=bidi,
                                             unroll=unroll)
        assert site.applied, site.format()
        got = run_spmd_module(overlap_hlo.serialize(module), 1, n, inputs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=site.plan.describe())
    # The TPU forms (the own shard first, or last) run on CPU too.
    for unroll, last in itertools.product((1, 2, 3), (False, True)):
        module = overlap_hlo.parse(text)
        (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=True,
                                             unroll=unroll, target="tpu",
                                             tpu_summing_rings=True, own_shard_last=last)
        assert site.applied and site.plan.tied_sums, site.format()
        assert site.plan.own_in_last_round == (last and n % 2 == 0 and n >= 4)
        got = run_spmd_module(overlap_hlo.serialize(module), 1, n, inputs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=site.plan.describe())
