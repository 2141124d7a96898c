"""Compiler libraries kept where JAX does not look for them by itself (JAX's CUDA plugin,
`gpu_plugin`; libtpu, `tpu_plugin`).

Installed into site-packages, JAX loads either in every program that starts a backend,
and on a machine without the hardware each such program prints errors. So this
project installs them with pip into a directory of the environment that JAX never
scans, `sys.prefix/share/overlap-hlo`, and loads them only in a process that names a
target of theirs. Nothing here runs at import time.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


class Missing(LookupError):
    """A library is not installed, privately or where JAX finds it."""


def site_library(module: str, library: str) -> str | None:
    """File `library` (its base name) beside package `module` in site-packages, found
    without importing the module (its import may start a backend), if it is there."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), os.path.basename(library))
    return path if os.path.isfile(path) else None


def root() -> str:
    """Where the private copies of this environment live (they go with it)."""
    return os.path.join(sys.prefix, "share", "overlap-hlo")


def install(requirement: str, directory: str, library: str, run=subprocess.run) -> str:
    """Install `requirement` with pip into `directory`, without dependencies, replacing
    what is there; the path of its `library` (relative to `directory`). `run` runs the
    pip command. A failed install leaves `directory` as it was."""
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".install-", dir=parent)
    try:
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
             "--target", staging, requirement], check=True)
        if not os.path.isfile(os.path.join(staging, library)):
            raise Missing(f"{requirement} installed no {library}")
        if os.path.isdir(directory):
            shutil.rmtree(directory)
        os.rename(staging, directory)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
    return os.path.join(directory, library)


def main(argv: list[str] | None, module: str, install_fn, where_fn) -> int:
    """`install` (install_fn()) or `where` (where_fn()): print the library's path."""
    args = sys.argv[1:] if argv is None else list(argv)
    name = module.rsplit(".", 1)[-1]
    if args not in (["install"], ["where"]):
        print(f"usage: python -m {module} install | where", file=sys.stderr)
        return 2
    try:
        print(install_fn() if args == ["install"] else where_fn())
    except (OSError, subprocess.CalledProcessError, Missing) as err:
        print(f"{name}: {'install failed: ' if args == ['install'] else ''}{err}",
              file=sys.stderr)
        return 1
    return 0
