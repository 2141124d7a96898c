"""libtpu, the TPU compiler, for compiling for TPU slices ahead of time without a TPU.

JAX imports the `libtpu` package when it is in site-packages (what `pip install
'jax[tpu]'` puts there) and starts a TPU backend from it in every program that asks for
devices; on a machine without a TPU libtpu then prints errors ("Failed to find host
bounds for accelerator type", "unexpected worker hostname") before the CPU devices
come. So this project keeps its copy in a private directory that JAX never scans
(`install`, `python -m overlap_hlo.targets.tpu_plugin install`: the libtpu release that
this environment's jax pairs with) and points JAX at it only in a process that names
a TPU slice, for the call that describes the slice (`selected`). A libtpu that JAX finds
by itself (`TPU_LIBRARY_PATH`, or `jax[tpu]` on a TPU VM) is used as it is. Nothing
here runs at import time.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys

from overlap_hlo.targets import private_install

PACKAGE = "libtpu"
LIBRARY = os.path.join("libtpu", "libtpu.so")
ENV = "TPU_LIBRARY_PATH"   # JAX's own override of where libtpu is


class LibtpuMissing(private_install.Missing):
    """No libtpu is installed, privately or where JAX finds it."""


def jax_version() -> str:
    return importlib.metadata.version("jax")


def requirement() -> str:
    """The libtpu that `jax[tpu]` of this jax installs, e.g. "libtpu==0.0.50.*"."""
    for line in importlib.metadata.requires("jax") or ():
        spec, _, marker = line.partition(";")
        if (re.match(r"\s*libtpu\b", spec)
                and re.search(r"""extra\s*==\s*["']tpu["']""", marker)):
            return spec.replace(" ", "")
    raise LibtpuMissing(f"jax {jax_version()} names no libtpu for its [tpu] extra")


def private_dir() -> str:
    """Where `install` puts the libtpu of this environment's jax."""
    return os.path.join(private_install.root(), f"{PACKAGE}-for-jax-{jax_version()}")


def site_library() -> str | None:
    """The libtpu JAX itself would load: `TPU_LIBRARY_PATH`, else the `libtpu` package
    (found without importing it: its import sets `TPU_LIBRARY_PATH` for good)."""
    path = os.environ.get(ENV)
    if path and os.path.isfile(path):
        return path
    return private_install.site_library(PACKAGE, LIBRARY)


def library() -> str:
    """The libtpu to compile with: the one JAX finds by itself, else the private copy."""
    site = site_library()
    if site is not None:
        return site
    private = os.path.join(private_dir(), LIBRARY)
    if os.path.isfile(private):
        return private
    raise LibtpuMissing(
        f"libtpu (the TPU compiler) is not installed; install it with: python -m "
        f"overlap_hlo.targets.tpu_plugin install  (about 700 MB, into {private_dir()}, "
        "where JAX does not load it by itself)")


def version() -> str | None:
    """The release of the libtpu `library()` loads, from its package's metadata (None
    when there is none, or no libtpu)."""
    try:
        path = library()
    except LibtpuMissing:
        return None
    packages = os.path.dirname(os.path.dirname(path))
    for dist in importlib.metadata.distributions(name=PACKAGE, path=[packages]):
        return dist.version
    return None


def available() -> bool:
    try:
        library()
    except LibtpuMissing:
        return False
    return True


@contextlib.contextmanager
def selected():
    """Within: JAX's TPU functions (`jax.experimental.topologies.get_topology_desc`)
    load `library()` if no libtpu is loaded yet. `TPU_LIBRARY_PATH` is set for the
    duration only, so that processes started later do not load libtpu. Yields the
    library's path."""
    path = library()
    saved = os.environ.get(ENV)
    os.environ[ENV] = path
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved


def install(directory: str | None = None, run=subprocess.run) -> str:
    """Install the libtpu this jax pairs with into `directory` (default `private_dir()`)
    with pip, replacing what is there; returns the library's path. `run` runs the pip
    command."""
    return private_install.install(requirement(), directory or private_dir(), LIBRARY, run)


def site_package() -> str | None:
    """The directory of a `libtpu` package in site-packages, which JAX loads in every
    program (an install of `jax[tpu]`, or of this project's old `tpu` extra)."""
    spec = importlib.util.find_spec(PACKAGE)
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _install_and_advise() -> str:
    path = install()
    site = site_package()
    if site is not None:
        print(f"tpu_plugin: note: JAX still loads the libtpu in {site} in every program "
              "(and prints its errors where there is no TPU); `pip uninstall libtpu` "
              "leaves the private copy the only one", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    """`install`: install libtpu privately; `where`: print the library used."""
    return private_install.main(argv, "overlap_hlo.targets.tpu_plugin", _install_and_advise,
                                library)


if __name__ == "__main__":
    sys.exit(main())
