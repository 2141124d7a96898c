"""The tpu-* profiles' calibration (benchmarks/calibrate.py): the fit recovers known
figures, the profiles hold what the script wrote and keep their datasheet figures, and
on a compiled layer the calibrated model is closer to the schedule than the guesses."""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
import pytest
from harness import ROOT

sys.path.insert(0, str(ROOT))

from benchmarks import calibrate  # noqa: E402
from overlap_hlo.plan import cost  # noqa: E402
from overlap_hlo.plan.ring_plan import GATHER, SCATTER, RingPlan  # noqa: E402

# name -> (peak TFLOP/s by element type, link GB/s per direction), from the datasheets
DATASHEET = {"tpu-v4": ({"bf16": 275, "f32": 275, "int8": 275}, 50),
             "tpu-v5e": ({"bf16": 197, "f32": 197, "int8": 393}, 50),
             "tpu-v5p": ({"bf16": 459, "f32": 459, "int8": 918}, 100),
             "tpu-v6e": ({"bf16": 918, "f32": 918, "int8": 1836}, 100)}


def synthetic(hw: cost.Hardware) -> list[calibrate.Sample]:
    """Sites of several rings and sizes, their 'schedule' figures made by the model on
    `hw` itself."""
    samples = []
    for kind in (GATHER, SCATTER):
        for n in (4, 8):
            for bidirectional in (False, True):
                for scale in (0.05, 1.0, 8.0):
                    shape = cost.SiteShape(n, 2e11 * scale, "bf16", 2**22 * scale ** 0.5,
                                           RingPlan(kind, n, bidirectional=bidirectional))
                    sample = calibrate.Sample(hw.name, "synthetic", "fit", "-", kind,
                                              (shape,), 1.0, 1.0)
                    before, after = calibrate.predict(sample, hw)
                    samples.append(dataclasses.replace(sample, schedule_before_us=before,
                                                       schedule_after_us=after))
    return samples


def test_fit_recovers_known_figures():
    truth = dataclasses.replace(calibrate.datasheet("tpu-v5e"), matmul_efficiency=0.62,
                                step_overhead_us=3.0, step_us_per_mib=1.5,
                                loop_overhead_us=0.8)
    fitted = calibrate.fit(synthetic(truth), calibrate.datasheet("tpu-v5e"))
    for name in calibrate.FITTED:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3,
                                                      abs=1e-3), name
    assert abs(calibrate.errors(synthetic(truth), fitted)).max() < 1e-4


def test_fit_keeps_overheads_nonnegative():
    """Figures below zero are not physical: the fit clamps them (here the data were
    made with no overheads at all, and a lower efficiency)."""
    truth = dataclasses.replace(calibrate.datasheet("tpu-v6e"), matmul_efficiency=0.9,
                                step_overhead_us=0.0, step_us_per_mib=0.0,
                                loop_overhead_us=0.0)
    fitted = calibrate.fit(synthetic(truth), calibrate.datasheet("tpu-v6e"))
    assert fitted.matmul_efficiency == pytest.approx(0.9, rel=1e-3)
    assert all(getattr(fitted, name) >= 0 for name in calibrate.OVERHEADS)
    assert abs(calibrate.errors(synthetic(truth), fitted)).max() < 1e-4


def test_samples_round_trip_through_json():
    samples = synthetic(calibrate.datasheet("tpu-v5p"))
    again = [calibrate.Sample.from_json(json.loads(json.dumps(s.to_json())))
             for s in samples]
    assert again == samples


def test_every_shape_field_survives_the_samples_file():
    """A refit from --samples prices the sites as the live run did: every SiteShape field
    is saved (four were once dropped, and the v5p refit then differed)."""
    plan = RingPlan(GATHER, 8, bidirectional=True)
    base = cost.SiteShape(8, 4e11, "bf16", 2**22, plan)
    data_fields = [f for f in dataclasses.fields(cost.SiteShape)
                   if f.name not in ("group_size", "flops", "element_type", "block_bytes",
                                     "plan", "priced_by")]
    changed = {f.name: (not f.default if isinstance(f.default, bool) else f.default + 3 * 2**20)
               for f in data_fields}
    shape = dataclasses.replace(base, **changed)
    sample = calibrate.Sample("tpu-v5p", "l", "fit", "-", GATHER, (shape,), 1.0, 1.0)
    again = calibrate.Sample.from_json(json.loads(json.dumps(sample.to_json())))
    assert again.shapes == (shape,)
    hw = calibrate.datasheet("tpu-v5p")
    assert calibrate.predict(again, hw) == calibrate.predict(sample, hw)
    assert calibrate.predict(sample, hw) != calibrate.predict(
        dataclasses.replace(sample, shapes=(base,)), hw)   # the fields change the price


def test_a_shape_its_pass_prices_is_not_saved():
    shape = cost.SiteShape(8, 4e11, "bf16", 2**22, RingPlan(GATHER, 8),
                           priced_by=lambda shape, hw: None)
    sample = calibrate.Sample("tpu-v5p", "l", "fit", "-", GATHER, (shape,), 1.0, 1.0)
    with pytest.raises(ValueError, match="priced_by"):
        sample.to_json()


def test_profiles_hold_the_written_calibration():
    with open(calibrate.RESULTS) as f:
        written = json.load(f)
    assert cost.CALIBRATION == written["source"]
    assert cost.CALIBRATED == written["profiles"]
    for name, figures in written["profiles"].items():
        profile = cost.PROFILES[name]
        assert {k: getattr(profile, k) for k in figures} == figures
        assert figures != cost.TPU_GUESSES
        assert written["source"] in profile.source


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_calibrated_profiles_keep_datasheet_peaks_and_links(name):
    profile = cost.PROFILES[name]
    tflops, link = DATASHEET[name]
    assert profile.tflops == tflops
    assert profile.link_gbps == link
    assert profile.latency_us == 5.0 and profile.link_efficiency == 0.8
    assert "cloud.google.com/tpu/docs" in profile.source
    assert "calibrated on libtpu" in profile.source
    profile.validate(name)


def test_per_mib_step_overhead_prices_each_round():
    """The new figure adds rounds x MiB x step_us_per_mib to the decomposed time only."""
    hw = calibrate.datasheet("tpu-v5e")
    shape = cost.SiteShape(8, 1e11, "bf16", 3 * 2**20, RingPlan(SCATTER, 8))
    plain = cost.estimate(shape, hw)
    priced = cost.estimate(shape, dataclasses.replace(hw, step_us_per_mib=2.0))
    assert priced.before_us == plain.before_us
    assert priced.after_us - plain.after_us == pytest.approx(shape.plan.rounds * 3 * 2.0)
    assert priced.step_overhead_us == pytest.approx(hw.step_overhead_us + 6.0)


def test_calibrated_model_is_closer_to_a_compiled_schedule():
    """The four layers at a size no fit saw (4096 tokens, d_model 2048) on v5e:2x4: the
    median |error| over their sites, before and after, is smaller with the calibrated
    figures than with the guesses. (Not every site's is: qkv's after is overestimated
    more; nor at every size: benchmarks/calibrate.py prints the other held-out one.)"""
    from harness import require_libtpu

    require_libtpu()
    samples = calibrate.collect(["tpu-v5e"], ["mlp", "swiglu", "qkv", "fsdp"],
                                [("check", calibrate.HELD_OUT_DIMS[0])])
    # mlp and swiglu 2 sites, qkv 1, two variants each; the TPU forms leave fsdp's.
    assert len(samples) == 10
    guessed = abs(calibrate.errors(samples, calibrate.datasheet("tpu-v5e")))
    calibrated = abs(calibrate.errors(samples, cost.PROFILES["tpu-v5e"]))
    assert np.median(calibrated) < np.median(guessed)
