"""JAX's CUDA plugin for GPU targets: where it is found, how it is installed, what a
target name means, and that installing it adds nothing to other JAX programs. None of
these compiles (tests/targets/test_gpu.py does)."""
import os
import subprocess
import sys

import pytest

from overlap_hlo.targets import gpu, gpu_plugin


def test_unknown_targets_are_clear_errors():
    for name in ("h100", "h100:", "v5e:2x4", "v100:8", "h100:2x", "h100:0", "h100:1x2x8"):
        with pytest.raises(gpu.UnknownTarget, match="unknown GPU target|no devices"):
            gpu.target(name)


def test_target_names():
    assert gpu.parse("h100:8") == (gpu.MODELS["h100"], 1, 8)
    assert gpu.parse("H200:2x8") == (gpu.MODELS["h200"], 2, 8)
    assert gpu.parse("b200:4") == (gpu.MODELS["b200"], 1, 4)
    assert gpu.parse("a100:8") == (gpu.MODELS["a100"], 1, 8)
    assert gpu.MODELS["a100"].description == "NVIDIA A100-SXM4-80GB"   # the a100 profile's


def test_missing_plugin_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_plugin, "private_dir", lambda: str(tmp_path / "none"))
    monkeypatch.setattr(gpu_plugin, "site_library", lambda: None)
    gpu.target.cache_clear()
    try:
        with pytest.raises(gpu.GpuUnavailable, match=r"-m overlap_hlo.targets.gpu_plugin "
                                                     r"install"):
            gpu.target("h100:8")
    finally:
        gpu.target.cache_clear()


def test_target_config_is_read_from_the_library(tmp_path):
    """The text from the last `gpu_device_info {` before the model's description through
    the description; None for a model the library does not describe."""
    library = tmp_path / "plugin.so"
    first = b'gpu_device_info {\n  core_count: 1\n}\ndevice_description_str: "GPU A"'
    second = b'gpu_device_info {\n  core_count: 2\n}\ndevice_description_str: "GPU B"'
    library.write_bytes(b"\x7fELF\x00junk gpu_device_info {" + b"\x00" + first + b"\n\x00"
                        + second + b"\n\x00tail")
    assert gpu_plugin.target_config(str(library), "GPU A") == first.decode()
    assert gpu_plugin.target_config(str(library), "GPU B") == second.decode()
    assert gpu_plugin.target_config(str(library), "GPU C") is None


def test_bundled_descriptions_cover_every_model():
    """The package's copies of XLA's descriptions (for plugins that carry none, jaxlib
    0.10) describe every model by its description string, without comments and without
    the fields older XLA rejects; where the installed plugin carries the description
    too, the copy is that text with only those fields left out."""
    library = None
    try:
        library = gpu_plugin.library()
    except gpu_plugin.PluginMissing:
        pass
    for model in gpu.MODELS.values():
        text = gpu_plugin.bundled_target_config(model.description)
        assert text and text.startswith("gpu_device_info {")
        assert text.rstrip().endswith(f'device_description_str: "{model.description}"')
        assert not any(line.lstrip().startswith("#") or line.split(":")[0].strip()
                       in gpu_plugin.NEWER_FIELDS for line in text.splitlines())
        carried = library and gpu_plugin.target_config(library, model.description)
        if carried:
            kept = [line for line in carried.splitlines()
                    if line.split(":")[0].strip() not in gpu_plugin.NEWER_FIELDS]
            assert text.splitlines() == kept
    assert gpu_plugin.bundled_target_config("NVIDIA A100 80GB PCIe") is None


def test_install_replaces_the_private_copy(tmp_path):
    commands = []

    def fake_pip(command, check):
        commands.append(command)
        target = command[command.index("--target") + 1]
        os.makedirs(os.path.join(target, os.path.dirname(gpu_plugin.LIBRARY)))
        with open(os.path.join(target, gpu_plugin.LIBRARY), "w") as file:
            file.write(f"build {len(commands)}")

    directory = tmp_path / "plugin"
    for build in (1, 2):
        path = gpu_plugin.install(str(directory), run=fake_pip)
        assert path == str(directory / gpu_plugin.LIBRARY)
        assert open(path).read() == f"build {build}"
    assert commands[0][1:5] == ["-m", "pip", "install", "--quiet"]
    assert "--no-deps" in commands[0]
    assert commands[0][-1] == f"{gpu_plugin.PACKAGE}=={gpu_plugin.jaxlib_version()}"
    assert sorted(os.listdir(tmp_path)) == ["plugin"]     # no staging directory left


def test_failed_install_leaves_nothing(tmp_path):
    def failing_pip(command, check):
        raise subprocess.CalledProcessError(1, command)

    with pytest.raises(subprocess.CalledProcessError):
        gpu_plugin.install(str(tmp_path / "plugin"), run=failing_pip)
    assert os.listdir(tmp_path) == []


def test_installed_plugin_is_not_loaded_by_other_programs():
    """With the plugin installed, a JAX program that starts its backends finds no CUDA
    plugin: nothing logged, no "cuda" backend registered (JAX_PLATFORMS unset)."""
    path = os.path.join(gpu_plugin.private_dir(), gpu_plugin.LIBRARY)
    if not os.path.isfile(path):
        pytest.skip("the CUDA plugin is not installed (python -m "
                    "overlap_hlo.targets.gpu_plugin install)")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run(
        [sys.executable, "-c", "import jax._src.xla_bridge as xb; "
         "xb._discover_and_register_pjrt_plugins(); print('cuda' in xb._backend_factories)"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("False\n", "")
