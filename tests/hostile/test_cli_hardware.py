"""Hostile `--hardware FILE.json` profiles: each one usage error (exit 2) in one line,
no traceback, no hang, the output file kept."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from overlap_hlo.plan import cost
from overlap_hlo.tools.overlap_opt import main
from harness import DATA

SDY = DATA / "shard_map_sdy.mlir"
BASE = {"name": "chip", "tflops": {"f32": 100}, "link_gbps": 50, "latency_us": 5,
        "step_overhead_us": 1, "loop_overhead_us": 2}


def profile_text(**fields) -> str:
    return json.dumps({**BASE, **fields})


CASES = {
    "deep-array": ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),
    "400-digits": (profile_text(link_gbps=0).replace('"link_gbps": 0', '"link_gbps": '
                                                     + "9" * 400),
                   "'link_gbps' must be at most 1e+12"),
    "5000-digits": (profile_text(link_gbps=0).replace('"link_gbps": 0', '"link_gbps": '
                                                      + "9" * 5000), "not valid JSON: "),
    "flops-underflow": (profile_text(tflops={"f32": 1e-200}, matmul_efficiency=1e-200),
                        "'tflops' x 'matmul_efficiency' gives 0 FLOP/s; at least 1 is needed"),
    "link-underflow": (profile_text(link_gbps=1e-300, link_efficiency=1e-300),
                       "'link_gbps' x 'link_efficiency' gives 0 bytes/s; at least 1 is needed"),
    "infinite-latency": (profile_text(latency_us=1).replace('"latency_us": 1',
                                                            '"latency_us": Infinity'),
                         "'latency_us' must be at most 1e+12"),
    "nan-link": (profile_text(link_gbps=1).replace('"link_gbps": 1', '"link_gbps": NaN'),
                 "'link_gbps' must be a positive number"),
    "huge-file": (profile_text(source="x" * (cost.MAX_PROFILE_BYTES + 1)),
                  "larger than the 1 MiB limit for a profile file"),
    "not-utf8": (b'{"name": "\xff"}', "not valid JSON: not UTF-8 text"),
    "source-not-text": (profile_text(source=3), "'source' must be a string"),
}


def run_with_profile(tmp_path: Path, profile: Path, capsys) -> tuple[int, str]:
    output = tmp_path / "out.mlir"
    output.write_text("precious")
    code = main([str(SDY), f"--hardware={profile}", "-o", str(output)])
    err = capsys.readouterr().err
    assert output.read_text() == "precious"
    return code, err


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_profile_is_one_usage_error(case, tmp_path, capsys):
    text, message = CASES[case]
    path = tmp_path / f"{case}.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, err = run_with_profile(tmp_path, path, capsys)
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"overlap-opt: error: pass 'overlap-matmul-all-reduce': {path}: ")
    assert message in err
    with pytest.raises(ValueError, match=f"^{path}: "):
        cost.hardware(str(path))


@pytest.mark.parametrize("make", ["fifo", "device", "directory", "missing"])
def test_profile_that_is_not_a_regular_file(make, tmp_path, capsys):
    path = tmp_path / "profile.json"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "device":
        path.symlink_to(os.devnull)
    elif make == "directory":
        path.mkdir()
    result = {}
    # A FIFO with no writer must not block the open (it did); the thread only keeps a
    # regression from hanging the suite.
    worker = threading.Thread(target=lambda: result.update(
        run=run_with_profile(tmp_path, path, capsys)), daemon=True)
    worker.start()
    worker.join(timeout=120)
    if worker.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        worker.join()
        pytest.fail("overlap-opt blocked on the profile")
    code, err = result["run"]
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    expected = {"fifo": "not a regular file", "device": "not a regular file",
                "directory": "not a regular file", "missing": "cannot read: No such file"}
    assert f"{path}: {expected[make]}" in err


def test_good_profile_still_reads(tmp_path):
    path = tmp_path / "chip.json"
    path.write_text(profile_text(tflops={"f32": 1e-6}, link_gbps=1e-8))
    profile = cost.hardware(str(path))
    assert profile.tflops == {"f32": 1e-6} and profile.link_gbps == 1e-8
