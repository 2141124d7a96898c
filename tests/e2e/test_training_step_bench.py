"""benchmarks/training_step.py builds the steps it claims: at tiny dims, lowered on the 8
host devices (no TPU or GPU compile), each step holds its layers in a scan, the
collectives of its parallelism forward and backward, and sites every one of which the
rewrite takes at threshold 0."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import overlap_hlo
from harness import ROOT, op_counts

sys.path.insert(0, str(ROOT))

from benchmarks import training_step  # noqa: E402

TINY = training_step.TINY


@pytest.fixture(scope="module", params=training_step.MODELS)
def lowered(request):
    return request.param, training_step.lower(request.param, TINY, jax.devices())


def test_step_structure(lowered):
    model, low = lowered
    counts = op_counts(overlap_hlo.parse(low.as_text()))
    assert counts["stablehlo.while"] >= 2   # the scanned layers, forward and backward
    # Per layer 7 projections and 2 attention einsums forward, about twice that backward.
    assert counts["stablehlo.dot_general"] >= 3 * 9
    if model == "sp":
        # Gathers before Q/K/V and the MLP, scatters after wo and w_down, and their
        # transposes in the backward pass.
        assert counts["stablehlo.all_gather"] == 4
        assert counts["stablehlo.reduce_scatter"] == 4
    elif model == "moe":
        # sp's attention gathers and scatters; the dispatch and combine all_to_alls,
        # forward and backward.
        assert counts["stablehlo.all_gather"] == counts["stablehlo.reduce_scatter"] == 2
        assert counts["stablehlo.all_to_all"] == 4
    elif model == "fsdp_tp":
        # sp's four and four, and each of the seven weights gathered over the FSDP axis
        # (forward) with its gradient scattered back (backward).
        assert counts["stablehlo.all_gather"] == 4 + 7
        assert counts["stablehlo.reduce_scatter"] == 4 + 7
    else:
        assert counts["stablehlo.all_gather"] == counts["stablehlo.reduce_scatter"] == 0
        assert counts["stablehlo.all_reduce"] >= 4   # two forward, two input gradients


def test_sites_rewritten_at_threshold_zero(lowered):
    """Every gather and scatter of the sequence-parallel step; in the plain Megatron
    step every psum but one the all_reduce pass keeps by its own rule (its all_gather
    would move more bytes than the all_reduce)."""
    model, low = lowered
    sites = overlap_hlo.remarks(low.as_text(), threshold_mib=0, bidirectional=True)
    left = [site for site in sites if not site.applied]
    assert len(sites) == {"fsdp_tp": 22, "moe": 9}.get(model, 8), \
        overlap_hlo.rewrite_summary(sites)
    if model in ("sp", "fsdp_tp"):
        assert not left, overlap_hlo.rewrite_summary(sites)
    elif model == "moe":   # the dispatch read by the gate and up projections
        assert [(site.pattern, site.reason) for site in left] == [(
            "overlap-all-to-all-matmul", "its result has readers other than one "
            "dot_general")], overlap_hlo.rewrite_summary(sites)
    else:
        assert len(left) <= 1 and all("more bytes to gather" in site.kind for site in left), \
            overlap_hlo.rewrite_summary(sites)


@pytest.mark.parametrize("model, summary", [
    ("fsdp_tp", "22 of 22 sites rewritten"),
    # The dispatch that both the gate and the up projection read stays.
    ("moe", "8 of 9 sites rewritten; 1 left unchanged (its result has readers other than "
            "one dot_general)")])
def test_step_rewritten_computes_the_same(model, summary):
    """The FSDP x TP and MoE steps run on the 8 host devices, original and rewritten
    (every site, two streams), on random parameters and data: the same loss and new
    parameters."""
    # In f32 (bf16 sums in another order differ by roundings the updates amplify).
    low = training_step.lower(model, TINY, jax.devices(), lr=1.0, dtype=jnp.float32)
    rewritten = overlap_hlo.rewrite_lowered(low, threshold_mib=0, bidirectional=True)
    assert overlap_hlo.rewrite_summary(rewritten.sites) == summary
    assert_same_step(low, rewritten.compile(), seed=0)


def assert_same_step(low, other, seed: int) -> None:
    """Step `low` (lowered) and the compiled `other`, run on the same random parameters
    and data on the 8 host devices, give the same loss and SGD updates (to a few
    roundings of each new weight)."""
    original = low.compile()
    keys = iter(jax.random.split(jax.random.key(seed), 32))
    args = jax.tree.map(
        lambda info, sharding: jax.device_put(
            0.05 * jax.random.normal(next(keys), info.shape, info.dtype), sharding),
        low.args_info[0], original.input_shardings[0],
        is_leaf=lambda x: hasattr(x, "shape"))
    want_params, want_loss = original(*args)
    got_params, got_loss = other(*args)
    assert float(want_loss) > 0
    assert abs(float(got_loss) - float(want_loss)) <= 1e-5 * float(want_loss)
    for name in want_params:   # the SGD updates, to a few roundings of the new weight
        before = np.asarray(args[0][name])
        want = np.asarray(want_params[name]) - before
        got = np.asarray(got_params[name]) - before
        assert np.count_nonzero(want), name
        tolerance = 4 * np.spacing(np.abs(before) + np.abs(want)) + 1e-3 * np.abs(want).max()
        assert np.all(np.abs(got - want) <= tolerance), name


@pytest.mark.parametrize("model", training_step.AUTO_MODELS)
def test_auto_sharded_step_is_the_same_step(model):
    """The step XLA partitions itself (the column XLA's answer is read from) computes
    what the shard_map step computes: the same loss and new parameters on the 8 host
    devices, and no shard_map in it."""
    manual = training_step.lower(model, TINY, jax.devices(), lr=1.0, dtype=jnp.float32)
    auto = training_step.lower(model, TINY, jax.devices(), lr=1.0, dtype=jnp.float32,
                               auto=True)
    assert "manual_computation" not in auto.as_text()
    assert "all_gather" not in auto.as_text() and "reduce_scatter" not in auto.as_text()
    assert_same_step(manual, auto.compile(), seed=1)


def test_row_and_table_render():
    row = {"model": "sp", "target": "v5e:2x4", "original_us": 100.0, "rewritten_us": 80.0,
           "speedup": 1.25, "perfect_overlap_speedup": 1.5, "original_compute_us": 66.7,
           "rewritten_compute_us": 70.0, "original_exposed_us": 33.3,
           "rewritten_exposed_us": 10.0, "overlapped": 3, "permutes": 4, "synchronous": 0,
           "outside_exposed_us": [5.0, 5.0], "kept": "rewritten (per site)"}
    failed = {"model": "tp", "target": "h100:8", "error": "GpuUnavailable: missing"}
    table = training_step.summary_table([row, failed, dict(row, xla_auto_us=120.0)])
    assert "| sp | v5e:2x4 | 100 | 80 | 1.25x | 1.50x |" in table
    assert "failed: GpuUnavailable" in table
    rows = table.splitlines()
    assert rows[2].endswith("| rewritten (per site) | - |")   # no auto-sharded step
    assert rows[4].endswith("| rewritten (per site) | 120, 1.50x |")


def test_tpu_form_stacks_in_place_and_computes_the_same():
    """In the TPU form (uninitialised buffers) the sp step's gathered activations, which
    the scan saves for the backward pass, are assembled by the rings in the stack
    itself (overlap-stack-in-place), and the stacks start uninitialised. Run on the 8
    host devices with those buffers poisoned (NaN), the step gives the original's loss
    and updates: every element the backward pass reads was written."""
    from overlap_hlo.targets import cpu

    low = training_step.lower("sp", TINY, jax.devices(), lr=1.0, dtype=jnp.float32)
    whole = f"{TINY.seq}x{TINY.model}xf32>"
    allocations = f"@AllocateBuffer() : () -> tensor<{TINY.layers}x{whole}"
    copies = f"tensor<1x{whole}, tensor<i32>, tensor<i32>, tensor<i32>)"
    options = dict(threshold_mib=0, bidirectional=True, target="tpu", tpu_summing_rings=True)
    without = overlap_hlo.DEFAULT_PIPELINE.replace(",overlap-stack-in-place", "")
    texts = {}
    for name, pipeline in (("without", without), ("with", overlap_hlo.DEFAULT_PIPELINE)):
        module = overlap_hlo.parse(low.as_text())
        sites = overlap_hlo.rewrite_module(module, pipeline, **options)
        assert overlap_hlo.rewrite_summary(sites) == "8 of 8 sites rewritten"
        texts[name] = overlap_hlo.serialize(module)
    # Both gathered activations: copied into their stacks without the pass (a third
    # copy is of a loop argument, not a ring's buffer), assembled there with it, each
    # stack starting as its own uninitialised buffer.
    counts = {name: (text.count(copies), text.count(allocations))
              for name, text in texts.items()}
    assert counts == {"without": (3, 0), "with": (1, 2)}
    _, _, rewritten = cpu.rewrite_runnable(low, **options)
    assert_same_step(low, rewritten.compile(), seed=1)


@pytest.mark.parametrize("model", ["fsdp_tp", "moe"])
def test_tpu_form_computes_the_same(model):
    """The FSDP x TP and MoE steps in the TPU form (every site, two streams, summing
    rings; stacks assembled in place where proved), their uninitialised buffers poisoned
    (NaN) on the 8 host devices: the original's loss and updates."""
    from overlap_hlo.targets import cpu

    low = training_step.lower(model, TINY, jax.devices(), lr=1.0, dtype=jnp.float32)
    _, module, rewritten = cpu.rewrite_runnable(low, threshold_mib=0, bidirectional=True,
                                                target="tpu", tpu_summing_rings=True)
    assert "stablehlo.collective_permute" in overlap_hlo.serialize(module)
    assert_same_step(low, rewritten.compile(), seed=2)
