"""The README's JAX examples run as written (in a fresh process, from the repo root) and
name the real API."""
import os
import re
import subprocess
import sys

from harness import ROOT


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


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


def test_two_line_example_names_the_real_api():
    (block,) = [b for b in python_blocks() if "overlap_hlo.overlap(jax.jit(train_step)" in b]
    import overlap_hlo

    assert callable(overlap_hlo.overlap)
    assert "bidirectional=True" in block
    # Reading what it did: the records of the last compile and their summary line.
    assert "overlap_hlo.rewrite_summary(step.sites)" in block and "site.format()" in block
    assert overlap_hlo.overlap(lambda x: x).sites is None   # before the first call
    assert callable(overlap_hlo.rewrite_summary) and callable(overlap_hlo.Site.format)
