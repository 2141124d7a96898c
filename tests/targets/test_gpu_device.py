"""benchmarks/gpu_device.py, the script for when a GPU is lent, run as far as this
machine allows: every step on the 8 host CPU devices with small dims (no mock GPU
topology, autotuning or GPU flags), results in one folder."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(out, layers: str, repeats: int) -> dict:
    """Run the script on the host CPU devices; its results.json."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_device.py"),
                          "--out", str(out), "--platform", "cpu", "--layers", layers,
                          "--repeats", str(repeats)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads((out / "results.json").read_text())


def test_every_step_runs_and_lands_in_one_folder(tmp_path):
    out = tmp_path / "device"
    results = run_script(out, "mlp,qkv", 2)
    assert results["errors"] == [] and results["devices"] == 8
    assert [(r["layer"], r["variant"]) for r in results["runs"]] == [
        (layer, variant) for layer in ("mlp", "qkv")
        for variant in ("original", "one stream", "two streams")]
    assert all(r["median_us"] > 0 and r["repeats"] == 2 for r in results["runs"])
    assert sorted(os.listdir(out / "trace")) == sorted(
        f"{layer}-{variant}" for layer in ("mlp", "qkv")
        for variant in ("original", "one-stream", "two-streams"))


def test_a_failing_step_is_recorded_and_the_rest_runs(tmp_path):
    results = run_script(tmp_path / "device", "nope,mlp", 1)
    assert [e["step"] for e in results["errors"]] == ["nope inputs"]
    assert len(results["runs"]) == 3
