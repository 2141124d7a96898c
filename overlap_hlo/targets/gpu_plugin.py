"""JAX's CUDA plugin, for compiling for NVIDIA GPUs ahead of time without a GPU.

XLA's GPU compiler is in the `jax-cuda12-pjrt` wheel (`xla_cuda_plugin.so`), which also
carries XLA's target descriptions (`GpuTargetConfigProto` text, one per GPU model).
Installed into site-packages, JAX loads that wheel in every program that starts a
backend, and on a machine without NVIDIA's libraries each such program logs a "Jax
plugin configuration error" traceback. So this project keeps its copy in a private
directory that JAX never scans (`install`, `python -m overlap_hlo.targets.gpu_plugin
install`) and registers it only in a process that names a GPU target (`register`).
A `jax[cuda12]` install in site-packages is used as it is. Nothing here runs at import
time.
"""
from __future__ import annotations

import mmap
import os
import subprocess
import sys

from overlap_hlo.targets import private_install

PACKAGE = "jax-cuda12-pjrt"
LIBRARY = os.path.join("jax_plugins", "xla_cuda12", "xla_cuda_plugin.so")
SITE_MODULE = "jax_plugins.xla_cuda12"   # where jax[cuda12] installs it


class PluginMissing(private_install.Missing):
    """No CUDA plugin is installed, privately or in site-packages."""


def jaxlib_version() -> str:
    from jaxlib import version

    return version.__version__


def private_dir() -> str:
    """Where `install` puts the plugin of this environment's jaxlib (under sys.prefix,
    so that it goes with the environment)."""
    return os.path.join(private_install.root(), f"{PACKAGE}-{jaxlib_version()}")


def site_library() -> str | None:
    """The plugin library of a jax[cuda12] install in site-packages, if any (found
    without importing the plugin module, which would initialize CUDA)."""
    return private_install.site_library(SITE_MODULE, LIBRARY)


def library() -> str:
    """The plugin library to compile with: the private copy, else a site-packages one."""
    private = os.path.join(private_dir(), LIBRARY)
    if os.path.isfile(private):
        return private
    site = site_library()
    if site is not None:
        return site
    raise PluginMissing(
        f"JAX's CUDA plugin ({PACKAGE}=={jaxlib_version()}) is not installed; install it "
        f"with: {sys.executable} -m overlap_hlo.targets.gpu_plugin install  (about 190 "
        f"MB, into {private_dir()}, where JAX does not load it by itself)")


def register() -> str:
    """Make JAX's "cuda" platform able to describe GPU topologies in this process; the
    library used. JAX's own registration (a working jax[cuda12] install) comes first."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    path = library()
    if "cuda" in xla_bridge._topology_factories:
        return path
    if path == site_library():
        # JAX registers it when the plugin initializes (it fails without CUDA libraries).
        xla_bridge._discover_and_register_pjrt_plugins()
        if "cuda" in xla_bridge._topology_factories:
            return path
    xla_bridge.register_plugin("cuda", priority=500, library_path=path,
                               options=xla_client.generate_pjrt_gpu_plugin_options())
    return path


def target_config(path: str, description: str) -> str | None:
    """XLA's GpuTargetConfigProto text for the GPU model `description` ("NVIDIA H100
    80GB HBM3": its `device_description_str`) as the plugin library at `path` carries
    it, or None when it carries none for that model."""
    key = f'device_description_str: "{description}"'.encode()
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        end = data.find(key)
        if end < 0:
            return None
        start = data.rfind(b"gpu_device_info {", 0, end)
        if start < 0:
            return None
        return data[start:end + len(key)].decode("utf-8", "replace")


# XLA's target descriptions of the MODELS (gpu.py) as the 0.12.0.1 plugin carries them,
# for plugins that carry none (jaxlib 0.10); their XLA rejects these newer fields.
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu-configs")
NEWER_FIELDS = frozenset({"collective_memory_granularity", "max_blocks_per_multiprocessor",
                          "mem_clock_ghz", "reserved_shared_memory_per_block"})


def bundled_target_config(description: str) -> str | None:
    """The GpuTargetConfigProto text this package carries for `description`, without
    comments and without the fields older XLA does not know; None for another model."""
    key = f'device_description_str: "{description}"'
    for name in sorted(os.listdir(CONFIGS)):
        with open(os.path.join(CONFIGS, name), encoding="utf-8") as file:
            text = file.read()
        if key in text:
            return "".join(line for line in text.splitlines(keepends=True)
                           if not line.lstrip().startswith("#")
                           and line.split(":")[0].strip() not in NEWER_FIELDS)
    return None


def install(directory: str | None = None, run=subprocess.run) -> str:
    """Install the plugin matching this jaxlib into `directory` (default `private_dir()`)
    with pip, without dependencies (no NVIDIA libraries: compiling needs none), replacing
    what is there; returns the library's path. `run` runs the pip command."""
    return private_install.install(f"{PACKAGE}=={jaxlib_version()}",
                                   directory or private_dir(), LIBRARY, run)


def main(argv: list[str] | None = None) -> int:
    """`install`: install the plugin privately; `where`: print the library used."""
    return private_install.main(argv, "overlap_hlo.targets.gpu_plugin", install, library)


if __name__ == "__main__":
    sys.exit(main())
