"""The reduce_scatter ring as the TPU compiler schedules it (ahead of time through
libtpu, no TPU needed): every permute of the ring has a matmul between its start and
its done, in every option setting; structure only, never times.

Skipped only when libtpu is not installed (python -m overlap_hlo.targets.tpu_plugin
install).
"""
import pytest

from harness import require_libtpu  # noqa: E402

require_libtpu()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import overlap_hlo  # noqa: E402
from overlap_hlo.ir.unsupported import Kind  # noqa: E402
from overlap_hlo.plan.ring_plan import SCATTER, RingPlan  # noqa: E402
from overlap_hlo.targets import report, schedule, tpu  # noqa: E402

TOPOLOGY = "v5e:2x4"
SCATTER_PASS = "overlap-matmul-reduce-scatter"
B, S, D, F = 1, 1024, 512, 2048      # small: a few seconds per compile
OPTIONS = {"one stream": {"unroll": 1}, "bidirectional": {"bidirectional": True, "unroll": 1},
           "unroll=2": {"unroll": 2}, "unroll=3": {"unroll": 3},
           "bidirectional, unroll=2": {"bidirectional": True, "unroll": 2}}


def down_projection(h, w):
    """The second half of a sequence-parallel MLP: the product scattered on the
    sequence dim."""
    return jax.lax.psum_scatter(h @ w, "x", scatter_dimension=1, tiled=True)


def lower(body, shapes, specs, out_spec):
    """`body` under shard_map on the topology's 8 devices, lowered for bf16 inputs."""
    mesh = Mesh(np.array(tpu.topology(TOPOLOGY).devices), ("x",))
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_spec))
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in zip(shapes, specs)]
    return fn.lower(*args)


@pytest.fixture(scope="module")
def lowered():
    return lower(down_projection, [(B, S, F), (F, D)], (P(None, None, "x"), P("x", None)),
                 P(None, "x"))


def variant_reports(lowered, options: dict) -> dict:
    """One report per option setting, every site rewritten."""
    variants = {name: dict(opts, threshold_mib=0) for name, opts in options.items()}
    return report.build_variants(lowered, TOPOLOGY, variants)


def compiled_trip_counts(rep) -> list:
    """The trip count of every while loop in the rewritten executable, read from its
    instructions."""
    proto = rep.rewritten.proto
    return [schedule.trip_count(proto, instr) for comp in proto.computations.values()
            for instr in comp.instructions if instr.opcode == "while"]


@pytest.fixture(scope="module")
def reports(lowered):
    return variant_reports(lowered, OPTIONS)


@pytest.mark.parametrize("name", OPTIONS)
def test_every_scatter_permute_overlaps_a_matmul(reports, lowered, name):
    rep = reports[name]
    (row,) = rep.sites
    assert row.pattern == SCATTER_PASS and row.applied
    assert row.permutes > 0
    assert row.overlapped == row.permutes, row.permute_details
    assert all(p["overlapped"] and p["window"] for p in row.permute_details)
    # Every block moves once (N - 1 shifts), in two halves with one stream (two chains).
    assert row.permute_executions == (7 if rep.options.get("bidirectional") else 14)
    left = {c.opcode for c in rep.rewritten.collectives}
    assert not left & {"reduce-scatter", "all-reduce", "all-gather"}, left
    original = {c.opcode for c in rep.original.collectives}
    assert original & {"reduce-scatter", "all-reduce"}


@pytest.mark.parametrize("name", ["one stream", "unroll=2", "unroll=3"])
def test_compiled_loop_runs_the_plans_trip_count(reports, lowered, name):
    """The TPU compiler keeps the ring's loop, and its own loop (read from the
    compiled HLO's induction variable) runs the plan's trip count (one round per
    iteration, whatever unroll says)."""
    (site,) = overlap_hlo.remarks(lowered.as_text(), threshold_mib=0, **OPTIONS[name])
    plan = site.plan
    assert plan == RingPlan(SCATTER, 8) and plan.trip_count >= 2
    assert compiled_trip_counts(reports[name]) == [plan.trip_count]


# --- an FSDP weight gather: the gathered dim is the dot's contracting dim ----------------

GATHER_PASS = "overlap-all-gather-matmul"
# The TPU forms leave a summing ring unchanged (below); these build it as another
# target's forms would, to check what the TPU compiler does with it.
SUM_OPTIONS = {"one stream": {"unroll": 1}, "bidirectional": {"bidirectional": True, "unroll": 1},
               "unroll=2": {"unroll": 2},
               "bidirectional, unroll=2": {"bidirectional": True, "unroll": 2}}
SUM_OPTIONS = {name: dict(options, target="gpu") for name, options in SUM_OPTIONS.items()}


def fsdp(x, w):
    return x @ jax.lax.all_gather(w, "x", axis=0, tiled=True)


@pytest.fixture(scope="module")
def fsdp_lowered():
    return lower(fsdp, [(8 * S, D), (D, F)], (P("x", None), P("x", None)), P("x", None))


@pytest.fixture(scope="module")
def fsdp_reports(fsdp_lowered):
    return variant_reports(fsdp_lowered, SUM_OPTIONS)


@pytest.mark.parametrize("name", SUM_OPTIONS)
def test_summing_gather_ring_ends_in_its_loop(fsdp_reports, fsdp_lowered, name):
    """The sum of a contracting gather stays in the loop: the compiled loop runs the
    plan's trip count, which covers every round of the loop's form (the last one
    included), every permute overlaps a matmul and no all-gather is left."""
    (site,) = overlap_hlo.remarks(fsdp_lowered.as_text(), threshold_mib=0, **SUM_OPTIONS[name])
    plan = site.plan
    assert site.pattern == GATHER_PASS and plan.in_loop_sum
    assert plan.loop_end == plan.loop_stop and plan.sends[plan.loop_stop - 1] == plan.streams
    rep = fsdp_reports[name]
    (row,) = rep.sites
    assert row.overlapped == row.permutes > 0, row.permute_details
    assert compiled_trip_counts(rep) == [plan.trip_count]
    assert not {c.opcode for c in rep.rewritten.collectives} & {"all-gather"}
    # The module is this one site: its times are the module's, the copies the compiler
    # put in its loop included (they carry no location of their own).
    assert row.after_us == pytest.approx(rep.rewritten_us)
    assert row.before_us == pytest.approx(rep.original_us)


def test_tpu_forms_leave_a_summing_ring_unchanged(fsdp_lowered):
    """On TPU a ring that sums over the gathered dim costs several times the dot's
    compute (its sum goes through HBM every round): the TPU forms leave the site, and
    the remark says what to do instead."""
    rep = variant_reports(fsdp_lowered, {"tpu": {}})["tpu"]
    (row,) = rep.sites
    assert not row.applied and rep.rewritten.compute_us == rep.original.compute_us
    (site,) = overlap_hlo.remarks(fsdp_lowered.as_text(), threshold_mib=0, target="tpu")
    assert site.kind == Kind.TPU_SUMMING_RING and "prefetch" in site.reason


@pytest.fixture(scope="module")
def fsdp_larger():
    """Large enough that a summing ring pays on v5e (at the small shapes it does not)."""
    return lower(fsdp, [(8 * 2048, 2048), (2048, 8192)], (P("x", None), P("x", None)),
                 P("x", None))


def test_tpu_summing_form_contracts_two_shards_per_dot(fsdp_larger):
    """tpu-summing-rings, own-shard-last: the TPU form's dots each contract two shards
    (the own one beside the last arrival), so it reads and writes the sum once fewer
    than the other targets' ring (own shard alone in round 0, a shared last round):
    less compute in the compiler's estimates. Only round 0's two shifts have no dot
    beside them."""
    reps = variant_reports(fsdp_larger, {
        "tpu": {"bidirectional": True, "target": "tpu", "tpu_summing_rings": True,
                "own_shard_last": True},
        "gpu": {"bidirectional": True, "target": "gpu", "unroll": 2}})
    (row,) = reps["tpu"].sites
    assert row.applied and (row.overlapped, row.permutes) == (5, 7), row.permute_details
    assert not {c.opcode for c in reps["tpu"].rewritten.collectives} & {"all-gather"}
    assert reps["tpu"].rewritten.compute_us < 0.9 * reps["gpu"].rewritten.compute_us
    assert reps["tpu"].rewritten_us < reps["tpu"].original_us


@pytest.mark.parametrize("topology, kept", [("v5e:2x4", True), ("v6e:2x4", False)])
def test_report_keeps_a_summing_ring_only_where_the_schedule_is_faster(fsdp_larger, topology,
                                                                       kept):
    """With the slice's profile deciding, the report tries the summing ring in every
    candidate layout and keeps it where the compiled schedule is faster (v5e), else the
    original with the remark that says why (v6e: slower in libtpu's estimates, and in
    the tpu-v6e model, which decides such rings)."""
    rep = report.build(fsdp_larger, topology)
    (row,) = rep.sites
    if kept:
        assert rep.chosen.startswith("every site, two streams, summing rings") and row.applied
        assert rep.rewritten_us < rep.original_us
    else:
        assert rep.chosen == report.ORIGINAL and not row.applied
        assert rep.candidates["every site, two streams, summing rings"] > rep.original_us
        assert row.left_because == "not profitable"


def test_tpu_summing_form_ties_its_sum(fsdp_larger):
    """tpu-summing-rings on v6e: each round's sum passes a barrier before the next
    round's dot adds to it. Untied, libtpu reassociated the sum into independent
    products added at the end (at these dims 68 MiB of temporaries against the
    original's none, 474 against 312 us; tied 0.6 MiB). The own shard's dot runs
    beside round 0's shifts, so every permute overlaps a dot."""
    rep = report.build_variants(fsdp_larger, "v6e:2x4", {"tpu": {
        "threshold_mib": 0, "bidirectional": True, "target": "tpu",
        "tpu_summing_rings": True}})["tpu"]
    (row,) = rep.sites
    assert row.applied and row.overlapped == row.permutes == 7, row.permute_details
    assert rep.rewritten_temp_bytes <= rep.original_temp_bytes + 2**20, (
        rep.rewritten_temp_bytes, rep.original_temp_bytes)


def test_unrolled_gather_ring_keeps_a_dot_beside_every_permute():
    """unroll=2 at sizes where the TPU scheduler used to run both of an iteration's
    dots while its second permute travelled, leaving the first bare: each round's
    shift now waits for the previous round's product (an optimization_barrier), so
    every permute has a dot of its own."""
    lowered = lower(fsdp, [(8 * 2048, 8192), (8192, 8192)], (P("x", None), P("x", None)),
                    P("x", None))
    rep = variant_reports(lowered, {"unroll=2": {"unroll": 2, "target": "gpu"}})["unroll=2"]
    (row,) = rep.sites
    assert row.pattern == GATHER_PASS and row.permutes == 2   # the loop body's
    assert row.overlapped == row.permutes, row.permute_details


@pytest.fixture(scope="module")
def large_fsdp_reports():
    """FSDP at the paper's dims (4096 tokens per device, d_model 4096, 16384 outputs):
    the sum and the gathered weight (128 MiB each) live in HBM."""
    lowered = lower(fsdp, [(8 * 4096, 4096), (4096, 16384)], (P("x", None), P("x", None)),
                    P("x", None))
    return variant_reports(lowered, SUM_OPTIONS)


@pytest.mark.parametrize("name", SUM_OPTIONS)
def test_summing_ring_needs_no_buffer_beyond_the_original(large_fsdp_reports, name):
    """The sum stays in the loop's buffer in every option (with two streams the last
    round, which holds one block on both, runs in the loop too): TPU temporaries at
    or below the original's (its gathered weight); with two rounds per iteration no
    loop body copies a carried buffer."""
    rep = large_fsdp_reports[name]
    assert rep.rewritten_temp_bytes <= rep.original_temp_bytes, (
        rep.rewritten_temp_bytes, rep.original_temp_bytes)
    if SUM_OPTIONS[name]["unroll"] == 2:
        assert rep.rewritten.loop_copies == []
