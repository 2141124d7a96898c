"""overlap-stack-in-place as XLA's GPU compiler sees it (ahead of time through JAX's CUDA
plugin, no GPU needed): in the tiny sequence-parallel training step of
benchmarks/training_step.py compiled for h100:8, the rings of the two gathered
activations that the scan saves for the backward pass write their blocks into the stack
itself, the whole-slice copies into the stack go, and the compute the GPU model prices
is not above the one without the pass. Structure and ratios only; no timings."""
import sys

import pytest

from harness import ROOT, update_shapes
from overlap_hlo.targets import gpu

try:
    H100 = gpu.target("h100:8")
except gpu.GpuUnavailable as err:
    pytest.skip(f"no GPU compiler: {err}", allow_module_level=True)

import overlap_hlo  # noqa: E402
from overlap_hlo.targets import aot, report  # noqa: E402
from overlap_hlo.targets.gpu_timing import GpuTiming  # noqa: E402

sys.path.insert(0, str(ROOT))

from benchmarks import training_step  # noqa: E402

WITHOUT = overlap_hlo.DEFAULT_PIPELINE.replace(",overlap-stack-in-place", "")


def test_rings_write_into_the_stack_and_the_copies_go():
    dims = training_step.TINY
    original = gpu.compile_module(aot.as_module(training_step.lower("sp", dims, H100.devices)),
                                  H100)
    options = gpu.gpu_options(dict(threshold_mib=0, bidirectional=True), H100)
    stack = (dims.layers, dims.seq, dims.model)
    whole, block = (1, dims.seq, dims.model), (1, dims.seq // dims.devices, dims.model)
    seen = {}
    for name, pipeline in (("without", WITHOUT), ("with", overlap_hlo.DEFAULT_PIPELINE)):
        module, sites = aot.rewrite(original.module, pipeline, **options)
        assert overlap_hlo.rewrite_summary(sites) == "8 of 8 sites rewritten"
        compiled = gpu.compile_module(module, H100, rewritten=True)
        analysis = report.analyze_compiled(compiled, GpuTiming(H100.hardware, 0.0, 8))
        counts = update_shapes(analysis)
        seen[name] = (counts[stack, whole], counts[stack, block], analysis.compute_us)
    # As on TPU: three whole slices copied into the stack without the pass (one is a
    # loop argument's, not a ring's); with it, one, and each ring's 8 blocks written there.
    assert seen["without"][:2] == (3, 0)
    assert seen["with"][:2] == (1, 2 * dims.devices)
    assert seen["with"][2] <= seen["without"][2]
