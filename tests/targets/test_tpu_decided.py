"""overlap() deciding by the compiled program for a TPU slice (targets.decided): the
decision is the report's, the executable runs on host CPU devices and computes what the
original does. Ratios and structure only; no timings."""
import logging
import warnings

import pytest

from harness import assert_close, permutes, require_libtpu  # noqa: E402

require_libtpu()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from test_tpu import B, D, F, SPECS, S, mlp  # noqa: E402

from overlap_hlo import rewrite_summary  # noqa: E402
from overlap_hlo.ir.unsupported import Kind  # noqa: E402
from overlap_hlo.targets import decided, report, tpu  # noqa: E402


def cpu_step(devices: int):
    mesh = Mesh(np.array(jax.devices("cpu")[:devices]), ("x",))
    return jax.jit(jax.shard_map(mlp, mesh=mesh, in_specs=SPECS, out_specs=P(None, "x")))


def inputs(dims, seed: int = 0) -> list:
    b, s, d, f = dims
    keys = jax.random.split(jax.random.key(seed), 4)
    shapes = [(b, s, d), (d, f), (d, f), (f, d)]
    return [jax.random.normal(key, shape, jnp.bfloat16) / np.sqrt(shape[-2] if i else 1)
            for i, (key, shape) in enumerate(zip(keys, shapes))]


# Where a rewrite pays at test_tpu's dims, and where every rewrite is slower (tiny dims:
# each permute's latency against a few microseconds of matmul), under both JAX versions.
CASES = {"pays": ("v4:2x2x1", (B, S, D, F)), "slower": ("v5p:2x2x2", (1, 256, 128, 512))}


@pytest.mark.parametrize("case", CASES)
def test_the_compiled_schedule_decides_and_the_result_is_the_originals(case, monkeypatch,
                                                                        caplog):
    """Where a rewrite pays, the executable holds its rings; where none does, the
    original runs, its sites saying why, without a warning. Either way the numbers are
    the plain jax.jit's, the summary logged is that of the sites' records, and the
    module is compiled for the slice once."""
    caplog.set_level(logging.INFO, logger="overlap_hlo")
    topology, dims = CASES[case]
    built = []
    monkeypatch.setattr(report, "build", lambda *a, _build=report.build, **k: built.append(
        a[1]) or _build(*a, **k))
    plain = cpu_step(tpu.topology(topology).device_count)
    step = decided.overlap(plain, topology)
    args = inputs(dims)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = step(*args)
    assert_close(got, plain(*args), [jnp.bfloat16])
    rep = step.report
    assert rep is not None and step.sites
    applied = {site.location for site in step.sites if site.applied}
    assert applied == {row.location for row in rep.sites if row.applied}
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("overlap_hlo")]
    assert logged and logged[0].endswith(rewrite_summary(step.sites)), logged
    module = step.lower(*args).compiler_ir("stablehlo")   # the same module again
    assert built == [topology]
    if case == "pays":
        assert rep.chosen != report.ORIGINAL and rep.rewritten_us < rep.original_us
        assert applied and permutes(module)
    else:
        assert rep.chosen == report.ORIGINAL and rep.built_with is None
        assert not applied and not permutes(module)
        assert {site.kind for site in step.sites} <= {Kind.KEPT, Kind.NOT_PROFITABLE}


def test_the_pass_option_target_is_not_the_slice_decided_for():
    """`target` (the forms built) is a pass option like any other; the slice decided
    for is named apart, and an unknown option is refused before anything compiles."""
    step = decided.overlap(cpu_step(8), "v4:2x2x1", target="cpu", bidirectional=None)
    assert step.decide_for == "v4:2x2x1" and step.options["target"] == "cpu"
    with pytest.raises(TypeError, match="no_such_option"):
        decided.overlap(cpu_step(8), "v4:2x2x1", no_such_option=1)
