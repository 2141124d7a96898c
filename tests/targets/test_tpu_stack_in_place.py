"""overlap-stack-in-place as the TPU compiler sees it (ahead of time through libtpu, no
TPU needed): in the tiny sequence-parallel training step of benchmarks/training_step.py,
the rings of the two gathered activations that the scan saves for the backward pass write
their blocks into the stack itself, the whole-slice copies into the stack go, and the
compiler's compute estimate is not above the one without the pass. Structure and ratios
of the compiler's estimates only; no timings."""
import sys

from harness import ROOT, require_libtpu, update_shapes  # noqa: E402

require_libtpu()

import overlap_hlo  # noqa: E402
from overlap_hlo.targets import aot, report, tpu  # noqa: E402
from overlap_hlo.targets.schedule import Timing  # noqa: E402

sys.path.insert(0, str(ROOT))

from benchmarks import training_step  # noqa: E402

TOPOLOGY = "v5e:2x4"
WITHOUT = overlap_hlo.DEFAULT_PIPELINE.replace(",overlap-stack-in-place", "")


def test_rings_write_into_the_stack_and_the_copies_go():
    topo = tpu.topology(TOPOLOGY)
    dims = training_step.TINY
    module = aot.as_module(training_step.lower("sp", dims, topo.devices))
    timing = Timing(topo.hardware, topo.chip.clock_ghz, topo.device_count, topo.links)
    options = tpu.tpu_options(dict(threshold_mib=0, bidirectional=True,
                                   tpu_summing_rings=True), topo)
    stack = (dims.layers, dims.seq, dims.model)
    whole, block = (1, dims.seq, dims.model), (1, dims.seq // dims.devices, dims.model)
    seen = {}
    for name, pipeline in (("without", WITHOUT), ("with", overlap_hlo.DEFAULT_PIPELINE)):
        compiled, sites = tpu.compile_rewritten(module, topo, pipeline, **options)
        assert overlap_hlo.rewrite_summary(sites) == "8 of 8 sites rewritten"
        analysis = report.analyze_compiled(compiled, timing)
        counts = update_shapes(analysis)
        seen[name] = (counts[stack, whole], counts[stack, block], analysis.compute_us)
    # Three whole slices copied into a stack without the pass (a third is a loop
    # argument's, not a ring's); with it, one, and each ring's 8 blocks written there.
    assert seen["without"][:2] == (3, 0)
    assert seen["with"][:2] == (1, 2 * dims.devices)
    assert seen["with"][2] <= seen["without"][2]
