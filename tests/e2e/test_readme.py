"""The README as a newcomer reads it: every shell command in it runs as written (in a
copy of the bundled examples, leaving no file behind but the one it names), its JAX
examples run, what it shows of their output is what they print, and its links resolve."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT

README = (ROOT / "README.md").read_text()
MAX_LINES = 200
INSTALL = "pip install -e '.[test]' && "


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def shown_report() -> list[str]:
    """The lines of the report the README shows (its ```text block with a verdict)."""
    (block,) = [b for b in re.findall(r"```text\n(.*?)```", README, re.S) if "verdict: " in b]
    return block.splitlines()


def commands() -> list[str]:
    """Every command line of the README's ```sh blocks, without its comment."""
    return [line.split("  #")[0].strip()
            for block in re.findall(r"```sh\n(.*?)```", README, re.S)
            for line in block.splitlines() if line.strip()]


# --- every command, and how it is tested ----------------------------------------------

REWRITE = (INSTALL + "overlap-opt examples/transformer_layer.mlir --remarks "
           "-o transformer_layer.overlapped.mlir")
TESTS = INSTALL + "python -m pytest -q && lit -q lit_tests"
TPU_PLUGIN = "python -m overlap_hlo.targets.tpu_plugin install"
TPU_REPORT = "overlap-report examples/tp_mlp_70b.mlir --tpu=v5e:2x4"
GPU_REPORT = "overlap-report examples/tp_mlp_70b.mlir --gpu=h100:8"


def test_every_command_is_tested_here():
    """A command added to the README, or changed, needs its test below."""
    assert sorted(commands()) == sorted([REWRITE, TESTS, TPU_PLUGIN, TPU_REPORT,
                                         GPU_REPORT])


def test_readme_is_read_in_one_sitting():
    assert len(README.splitlines()) <= MAX_LINES


def run_in_copy(command: str, tmp_path: Path, env: dict | None = None):
    """Run `command` (the README's, without its pip install) in a copy of the
    repository's examples; (result, files it created there)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    before = set(tmp_path.rglob("*"))
    env = dict(os.environ, **(env or {}))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", command.removeprefix(INSTALL)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    created = sorted(str(p.relative_to(tmp_path)) for p in set(tmp_path.rglob("*")) - before)
    return done, created


def test_the_rewrite_command(tmp_path):
    done, created = run_in_copy(REWRITE, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert created == ["transformer_layer.overlapped.mlir"]   # the -o it names, only
    summary = done.stderr.splitlines()[-1]
    assert summary == "overlap-opt: 4 of 4 sites rewritten"
    assert f"`{summary}`" in README
    assert done.stderr.count(": remark: ") == 4


def test_the_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]'" in ci
    assert TESTS.removeprefix(INSTALL) in ci


@pytest.mark.parametrize("module", ["tpu_plugin", "gpu_plugin"])
def test_the_plugin_install_commands(module, monkeypatch, capsys):
    """`python -m overlap_hlo.targets.X install` reaches the install (not run here: it
    downloads hundreds of MB; tests/targets/test_*_plugin.py test it)."""
    import importlib

    plugin = importlib.import_module(f"overlap_hlo.targets.{module}")
    assert f"python -m overlap_hlo.targets.{module} install" in README
    calls = []
    monkeypatch.setattr(plugin, "install", lambda *a, **k: calls.append(a) or "/the/library")
    assert plugin.main(["install"]) == 0
    assert calls and "/the/library" in capsys.readouterr().out


def report_lines(done) -> list[str]:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_tpu_report_predicts_the_gain_shown(tmp_path):
    from overlap_hlo.targets import tpu_plugin

    if not tpu_plugin.available():
        pytest.skip("libtpu is not installed (python -m overlap_hlo.targets.tpu_plugin "
                    "install)")
    done, created = run_in_copy(TPU_REPORT, tmp_path, {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
    printed = report_lines(done)
    assert created == []
    shown = shown_report()
    # The rows and the verdict the README shows are what it prints ("..." elides lines).
    assert [line for line in shown if line != "..."] == [
        line for line in printed if line in shown]
    verdict = printed[-1]
    assert verdict.startswith("verdict: predicted faster, ")
    assert float(re.search(r"\((\d+\.\d+)x\) on v5e:2x4", verdict)[1]) >= 1.2


def test_the_gpu_report_predicts_the_gain_stated(tmp_path):
    import jax

    from overlap_hlo.targets import gpu_plugin

    try:
        gpu_plugin.library()
    except gpu_plugin.PluginMissing:
        pytest.skip("the CUDA plugin is not installed (python -m "
                    "overlap_hlo.targets.gpu_plugin install)")
    done, created = run_in_copy(GPU_REPORT, tmp_path)
    printed = report_lines(done)
    assert created == []
    speedup = re.search(r"\((\d+\.\d+)x\) on h100:8", printed[-1])[1]
    stated = re.search(r"It predicts (\d+\.\d+)x \(.*?; (\d+\.\d+)x with jax 0\.10\.2", README,
                       re.S)
    if jax.__version__.startswith("0.12."):
        assert speedup == stated[1]
    elif jax.__version__ == "0.10.2":
        assert speedup == stated[2]
    assert float(speedup) >= 1.1


def test_the_profiles_listed_are_the_cost_models():
    from overlap_hlo.plan.cost import PROFILES

    for name in PROFILES:
        assert f"`{name}`" in README
        assert f"`{name}`" in (ROOT / "docs" / "usage.md").read_text()


# --- the JAX examples ------------------------------------------------------------------

def test_full_training_script_example_runs():
    (block,) = [b for b in python_blocks() if "from examples.transformer import" in b]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", block + "\nprint('README example ok')"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "README example ok" in done.stdout
    # The summary it prints is the one its comment shows.
    (shown,) = re.findall(r"print\(overlap_hlo\.rewrite_summary\(step\.sites\)\)\s*# (.*)",
                          block)
    assert done.stdout.splitlines()[0] == shown == "8 of 8 sites rewritten"


def test_two_line_example_runs(capsys):
    """The README's two-line block, run as written on a small tensor-parallel training
    step (all_gather -> dot -> reduce_scatter, SGD): same results as jax.jit, and the
    records it prints."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from harness import auto_axis_types

    (block,) = [b for b in python_blocks() if "overlap_hlo.overlap(jax.jit(train_step)" in b]
    mesh = jax.make_mesh((8,), ("x",), **auto_axis_types(1))

    def layer(x, w1, w2):
        g = jax.lax.all_gather(x, "x", axis=0, tiled=True)
        return jax.lax.psum_scatter(jnp.tanh(g @ w1) @ w2, "x", scatter_dimension=0,
                                    tiled=True)

    sharded = jax.shard_map(layer, mesh=mesh, in_specs=(P("x"), P(None, "x"), P("x")),
                            out_specs=P("x"), check_vma=False)

    def train_step(params, x, y):
        def loss(params):
            return jnp.mean((sharded(x, *params) - y) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        return [p - 0.1 * g for p, g in zip(params, grads)], value

    rng = np.random.default_rng(0)
    def put(shape, spec):
        return jax.device_put(jnp.asarray(rng.standard_normal(shape) / 8, jnp.float32),
                              NamedSharding(mesh, spec))
    params = [put((256, 512), P(None, "x")), put((512, 256), P("x"))]
    x, y = put((2048, 256), P("x")), put((2048, 256), P("x"))   # 2 MiB gathered
    want_params, want_loss = jax.jit(train_step)(params, x, y)
    scope = {"jax": jax, "train_step": train_step, "params": params, "x": x, "y": y}
    exec(block, scope)
    np.testing.assert_allclose(scope["loss"], want_loss, rtol=1e-5)
    for got, want in zip(scope["params"], want_params):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    sites = scope["step"].sites
    assert sites and any(site.applied for site in sites)
    printed = capsys.readouterr().out.splitlines()
    import overlap_hlo
    assert printed[0] == overlap_hlo.rewrite_summary(sites)
    assert printed[1:] == [site.format() for site in sites]


# --- links -----------------------------------------------------------------------------

def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", "docs/passes.md", "docs/usage.md",
                                  "docs/report.md", "docs/limits.md", "docs/reference.md",
                                  "benchmarks/RESULTS.md"])
def test_links_resolve(page):
    """Every relative link of the README and the pages it sends readers to names a file
    that exists and, with #anchor, a heading of it."""
    path = ROOT / page
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, fragment = target.partition("#")
        linked = (path.parent / name).resolve() if name else path
        assert linked.exists(), f"{page}: {target}"
        if fragment and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
            assert fragment in {anchor(h) for h in headings}, f"{page}: {target}"
