"""Pass options keep their types from the caller to the pass: a `Hardware` profile and
the slice's `Links` go in as objects (or as their text, parsed once by the pass), and
the pipeline text of a typed value parses back to it."""
from __future__ import annotations

import pytest

import overlap_hlo
from harness import DATA
from overlap_hlo.ir import compat
from overlap_hlo.passes import OverlapAllGatherMatmul, OverlapSequenceParallel
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.rewrite.pipeline import PipelineError, build_pass_manager
from overlap_hlo.rewrite.site import SiteLog

SLICE_2X2 = "2x2:0,0;1,0;0,1;1,1"
SDY = (DATA / "shard_map_sdy.mlir").read_text()


def test_objects_and_their_text_give_the_same_pass():
    v5e = cost.PROFILES["tpu-v5e"]
    by_object = OverlapAllGatherMatmul(hardware=v5e, device_coords=Links.parse(SLICE_2X2))
    by_text = OverlapAllGatherMatmul(hardware="tpu-v5e", device_coords=SLICE_2X2)
    assert by_object == by_text
    assert by_object.hardware is v5e and isinstance(by_text.device_coords, Links)
    assert by_object.profile is v5e and by_object.platform == "tpu"


@pytest.mark.parametrize("name, value", [
    ("hardware", cost.PROFILES["h100-sxm"]), ("device_coords", Links.parse(SLICE_2X2)),
    ("bidirectional", False), ("unroll", 3), ("threshold_mib", 0.25), ("target", "gpu"),
    ("keep_sites", "model.py:3:4")])
def test_option_text_parses_back_to_the_value(name, value):
    text = OverlapAllGatherMatmul.option_text(name, value)
    built = OverlapAllGatherMatmul.from_options({name.replace("_", "-"): text})
    assert getattr(built, name) == value


def test_text_options_override_typed_defaults():
    defaults = {"hardware": cost.PROFILES["tpu-v5p"], "unroll": 2, "threshold_mib": 0.0}
    built = OverlapAllGatherMatmul.from_options({"unroll": "3"}, defaults)
    assert (built.hardware.name, built.unroll, built.threshold_mib) == ("tpu-v5p", 3, 0.0)
    assert OverlapSequenceParallel.from_options({}, defaults) == OverlapSequenceParallel()


@pytest.mark.parametrize("given, message", [
    (dict(hardware=5), "option 'hardware' expects Hardware, got int 5"),
    (dict(unroll=1.5), "option 'unroll' expects int, got float 1.5"),
    (dict(unroll=True), "option 'unroll' expects int, got bool True"),
    (dict(bidirectional=1), "option 'bidirectional' expects bool, got int 1"),
    (dict(device_coords="2x2:0,0;9,9"), "device-coords: coordinates '9,9' lie outside 2x2"),
    (dict(hardware="no-such-chip"), "unknown hardware 'no-such-chip'")])
def test_a_value_of_another_type_is_refused_by_name(given, message):
    with pytest.raises(ValueError, match=f"pass 'overlap-all-gather-matmul': .*{message}"):
        OverlapAllGatherMatmul(**given)


def test_numbers_of_other_types_are_converted():
    import numpy as np

    built = OverlapAllGatherMatmul(unroll=np.int64(2), threshold_mib=1)
    assert (built.unroll, built.threshold_mib) == (2, 1.0)
    assert type(built.unroll) is int and type(built.threshold_mib) is float


def test_a_file_profile_has_no_pipeline_text(tmp_path):
    path = tmp_path / "chip.json"
    path.write_text('{"name": "chip", "tflops": {"f32": 100}, "link_gbps": 50, '
                    '"latency_us": 5, "step_overhead_us": 1, "loop_overhead_us": 2}')
    with pytest.raises(ValueError, match="name its .json file"):
        OverlapAllGatherMatmul.option_text("hardware", cost.hardware(str(path)))


def test_typed_defaults_reach_every_pass_of_a_pipeline():
    """The API's options (objects) decide as their names do."""
    v5e, links = cost.PROFILES["tpu-v5e"], Links.parse("2x4:" + ";".join(
        f"{d % 2},{d // 2}" for d in range(8)))
    by_objects = overlap_hlo.remarks(SDY, hardware=v5e, device_coords=links)
    by_text = overlap_hlo.remarks(SDY, hardware="tpu-v5e", device_coords=links.text())
    assert [s.format() for s in by_objects] == [s.format() for s in by_text]
    assert by_objects and all(s.estimate.hardware == "tpu-v5e" for s in by_objects
                              if s.estimate is not None)


def test_a_bad_default_is_a_pipeline_error():
    with pytest.raises(PipelineError, match="option 'unroll' expects int"):
        build_pass_manager("builtin.module(overlap-all-gather-matmul)", SiteLog(),
                           {"unroll": "many"}, compat.make_context())


def test_report_candidates_come_from_the_tried_declarations():
    """overlap-report's option sets are made from the options' `tried` metadata: the
    cost model's choice, a base, and the base with one option varied at a time (with
    the options it is tried with); the TPU-only ones are not tried on GPU."""
    from overlap_hlo.targets import candidates
    forms = candidates.declared_candidates()
    assert forms == {
        "per site": {},
        "every site, two streams": {"threshold_mib": 0, "bidirectional": True},
        "every site, one stream": {"threshold_mib": 0, "bidirectional": False},
        "every site, two streams, summing rings": {
            "threshold_mib": 0, "bidirectional": True, "tpu_summing_rings": True},
        "every site, two streams, summing rings, own shard last": {
            "threshold_mib": 0, "bidirectional": True, "tpu_summing_rings": True,
            "own_shard_last": True}}
    assert [label for label, options in forms.items()
            if not candidates.tried_on(options, "GPU")] == list(forms)[3:]
    assert all(candidates.tried_on(options, "TPU") for options in forms.values())


def test_a_new_tried_option_is_one_declaration(monkeypatch):
    """Declaring `tried` on a new pass's option adds its candidate, labelled by it."""
    import dataclasses

    from overlap_hlo.rewrite import pipeline
    from overlap_hlo.rewrite.rewrite_pass import RewritePass
    from overlap_hlo.targets import candidates

    @dataclasses.dataclass(frozen=True)
    class Probe(RewritePass):
        name = "test-probe-pass"
        stripes: int = dataclasses.field(default=1, metadata={
            "tried": ((1, ""), (4, "four stripes")), "tried_with": {"bidirectional": False},
            "help": "a test option"})

    monkeypatch.setitem(pipeline._REGISTRY, Probe.name, Probe)
    forms = candidates.declared_candidates()
    assert forms["every site, one stream, four stripes"] == {
        "threshold_mib": 0, "bidirectional": False, "stripes": 4}
    assert len(forms) == 6
