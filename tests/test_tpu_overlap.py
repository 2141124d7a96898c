"""The reduce_scatter ring as the TPU compiler schedules it (ahead of time through
libtpu, no TPU needed): every permute of the ring has a matmul between its start and
its done, in every option setting; structure only, never times.

Skipped only when libtpu cannot be imported (pip install -e '.[tpu]').
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
from overlap_hlo import report, schedule, tpu  # noqa: E402
from overlap_hlo.ring_plan import SCATTER, RingPlan  # noqa: E402

TOPOLOGY = "v5e:2x4"
SCATTER_PASS = "overlap-matmul-reduce-scatter"
B, S, D, F = 1, 1024, 512, 2048      # small: a few seconds per compile
OPTIONS = {"one stream": {}, "bidirectional": {"bidirectional": True},
           "unroll=2": {"unroll": 2}, "unroll=3": {"unroll": 3},
           "bidirectional, unroll=2": {"bidirectional": True, "unroll": 2}}


def down_projection(h, w):
    """The second half of a sequence-parallel MLP: the product scattered on the
    sequence dim."""
    return jax.lax.psum_scatter(h @ w, "x", scatter_dimension=1, tiled=True)


@pytest.fixture(scope="module")
def lowered():
    mesh = Mesh(np.array(tpu.topology(TOPOLOGY).devices), ("x",))
    specs = (P(None, None, "x"), P("x", None))
    fn = jax.jit(jax.shard_map(down_projection, mesh=mesh, in_specs=specs,
                               out_specs=P(None, "x")))
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in zip([(B, S, F), (F, D)], specs)]
    return fn.lower(*args)


@pytest.fixture(scope="module")
def reports(lowered):
    variants = {name: dict(options, threshold_mib=0) for name, options in OPTIONS.items()}
    return report.build_variants(lowered, TOPOLOGY, variants)


@pytest.mark.parametrize("name", OPTIONS)
def test_every_scatter_permute_overlaps_a_matmul(reports, lowered, name):
    rep = reports[name]
    (row,) = rep.sites
    assert row.pattern == SCATTER_PASS and row.applied
    assert row.permutes > 0
    assert row.overlapped == row.permutes, row.permute_details
    assert all(p["overlapped"] and p["window"] for p in row.permute_details)
    assert row.permute_executions == 7              # every block moves once: N - 1
    left = {c.opcode for c in rep.rewritten.collectives}
    assert not left & {"reduce-scatter", "all-reduce", "all-gather"}, left
    original = {c.opcode for c in rep.original.collectives}
    assert original & {"reduce-scatter", "all-reduce"}


@pytest.mark.parametrize("name", ["one stream", "unroll=2", "unroll=3"])
def test_compiled_loop_runs_the_plans_trip_count(reports, lowered, name):
    """The TPU compiler keeps the ring's loop, and its own loop (read from the
    compiled HLO's induction variable) runs the plan's trip count."""
    (site,) = overlap_hlo.remarks(lowered.as_text(), threshold_mib=0, **OPTIONS[name])
    plan = site.plan
    assert plan == RingPlan(SCATTER, 8, **OPTIONS[name]) and plan.trip_count >= 2
    proto = reports[name].rewritten.proto
    loops = [instr for comp in proto.computations.values() for instr in comp.instructions
             if instr.opcode == "while"]
    assert [schedule.trip_count(proto, loop) for loop in loops] == [plan.trip_count]
