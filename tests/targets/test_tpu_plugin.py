"""libtpu for TPU targets: which release is installed, where, which copy is used, how
JAX is pointed at it, and that installing it leaves every other JAX program silent.
None of these compiles (tests/targets/test_tpu*.py do)."""
import os
import subprocess
import sys

import pytest

from overlap_hlo.targets import tpu_plugin


def test_the_release_is_the_one_jax_tpu_installs():
    """What `pip install 'jax[tpu]'` of this jax would bring, e.g. libtpu==0.0.50.*."""
    assert tpu_plugin.requirement().startswith("libtpu==")
    assert tpu_plugin.private_dir().endswith(f"libtpu-for-jax-{tpu_plugin.jax_version()}")


def fake_pip(commands):
    def run(command, check):
        commands.append(command)
        target = command[command.index("--target") + 1]
        os.makedirs(os.path.join(target, os.path.dirname(tpu_plugin.LIBRARY)))
        with open(os.path.join(target, tpu_plugin.LIBRARY), "w") as file:
            file.write(f"build {len(commands)}")
    return run


def test_install_replaces_the_private_copy(tmp_path):
    commands = []
    directory = tmp_path / "libtpu"
    for build in (1, 2):
        path = tpu_plugin.install(str(directory), run=fake_pip(commands))
        assert path == str(directory / tpu_plugin.LIBRARY)
        assert open(path).read() == f"build {build}"
    assert commands[0][1:5] == ["-m", "pip", "install", "--quiet"]
    assert "--no-deps" in commands[0]
    assert commands[0][-1] == tpu_plugin.requirement()
    assert sorted(os.listdir(tmp_path)) == ["libtpu"]     # no staging directory left


def test_failed_install_leaves_nothing(tmp_path):
    def failing_pip(command, check):
        raise subprocess.CalledProcessError(1, command)

    with pytest.raises(subprocess.CalledProcessError):
        tpu_plugin.install(str(tmp_path / "libtpu"), run=failing_pip)
    assert os.listdir(tmp_path) == []


def test_which_copy_is_used(tmp_path, monkeypatch):
    """The libtpu JAX finds by itself (TPU_LIBRARY_PATH, then the libtpu package), else
    the private copy, else a clear error naming the install command."""
    private = tmp_path / "private"
    monkeypatch.setattr(tpu_plugin, "private_dir", lambda: str(private))
    monkeypatch.delenv(tpu_plugin.ENV, raising=False)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "no-packages")])   # no libtpu package
    with pytest.raises(tpu_plugin.LibtpuMissing,
                       match=r"python -m overlap_hlo.targets.tpu_plugin install"):
        tpu_plugin.library()
    assert not tpu_plugin.available()
    (private / "libtpu").mkdir(parents=True)
    (private / tpu_plugin.LIBRARY).write_text("")
    assert tpu_plugin.library() == str(private / tpu_plugin.LIBRARY)
    chosen = tmp_path / "chosen.so"
    chosen.write_text("")
    monkeypatch.setenv(tpu_plugin.ENV, str(chosen))
    assert tpu_plugin.library() == str(chosen)


def test_selected_names_the_library_only_within(tmp_path, monkeypatch):
    private = tmp_path / "private"
    monkeypatch.setattr(tpu_plugin, "private_dir", lambda: str(private))
    monkeypatch.setattr(tpu_plugin, "site_library", lambda: None)
    tpu_plugin.install(str(private), run=fake_pip([]))
    monkeypatch.delenv(tpu_plugin.ENV, raising=False)
    with tpu_plugin.selected() as path:
        assert os.environ[tpu_plugin.ENV] == path == str(private / tpu_plugin.LIBRARY)
    assert tpu_plugin.ENV not in os.environ
    monkeypatch.setenv(tpu_plugin.ENV, "/elsewhere/libtpu.so")
    with tpu_plugin.selected():
        pass
    assert os.environ[tpu_plugin.ENV] == "/elsewhere/libtpu.so"


def test_usage(capsys):
    assert tpu_plugin.main(["frobnicate"]) == 2
    assert "install | where" in capsys.readouterr().err


def test_a_plain_jax_program_prints_nothing():
    """With libtpu installed (and JAX's CUDA plugin, where it is), a JAX program that
    lists its devices, with no JAX_PLATFORMS and no TPU_* variables set, starts no TPU
    backend and prints nothing on stderr (libtpu would print "Failed to find host
    bounds for accelerator type" and "unexpected worker hostname" errors)."""
    path = os.path.join(tpu_plugin.private_dir(), tpu_plugin.LIBRARY)
    if not os.path.isfile(path):
        pytest.skip("libtpu is not installed privately (python -m "
                    "overlap_hlo.targets.tpu_plugin install)")
    env = {k: v for k, v in os.environ.items()
           if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
    done = subprocess.run(
        [sys.executable, "-c",
         "import jax; print(jax.devices()); print(jax.default_backend())"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines()[-1] == "cpu" and "CpuDevice" in done.stdout
