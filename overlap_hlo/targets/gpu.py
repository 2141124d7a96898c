"""Compile modules for NVIDIA GPUs ahead of time, on a machine without a GPU.

    tgt = overlap_hlo.targets.gpu.target("h100:8")
    pair = overlap_hlo.targets.gpu.compile_pair(module_text, tgt, bidirectional=True)
    pair.rewritten.hlo_module, pair.rewritten.memory.temp_size_in_bytes

A target is a GPU model and a device count: "h100:8" (one host of 8), "h100:2x8" (two
hosts of 8, each its own NVLink domain). XLA's GPU compiler comes from JAX's CUDA plugin
(`gpu_plugin`: installed privately, or a jax[cuda12] install), and so does the model's
target description (plugins before jaxlib 0.12 carry none: this package's copy of the
0.12 plugin's is used, `gpu-configs/`). Compiles run XLA's GPU pipeline with its latency-hiding scheduler
(`COMPILER_OPTIONS`), as `aot` does for every target. Nothing here runs at import time:
`overlap-opt` never imports it.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from jaxlib.mlir import ir

from overlap_hlo.plan import cost
from overlap_hlo.plan.xla_flags import GPU_RING_FLAGS, GPU_SCHEDULER
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
from overlap_hlo.rewrite.site import Site
from overlap_hlo.targets import aot, gpu_plugin


class GpuError(aot.TargetError):
    """A module cannot be compiled for the named GPU target."""


class GpuUnavailable(GpuError):
    """JAX's CUDA plugin is not installed, cannot be loaded or lacks the target."""


class TargetMismatch(GpuError):
    """The target is unknown or its device count does not fit the module."""


class UnknownTarget(TargetMismatch):
    """The name is no GPU target (a usage error on the command line)."""


ERRORS = aot.Errors(GpuError, TargetMismatch, "XLA's GPU compiler")
COMPILER_OPTIONS = GPU_SCHEDULER
# What a rewritten module is compiled with (overlap_hlo.plan.xla_flags says why).
RING_FLAGS = GPU_RING_FLAGS
REWRITTEN_OPTIONS = {**COMPILER_OPTIONS, **RING_FLAGS}


@dataclass(frozen=True)
class Model:
    """A GPU model: its description in XLA's target configs and its cost profile."""

    description: str
    profile: str        # cost.PROFILES entry (datasheet figures)


MODELS = {
    "h100": Model("NVIDIA H100 80GB HBM3", "h100-sxm"),
    "h200": Model("NVIDIA H200 141GB HBM3e", "h200"),
    "b200": Model("NVIDIA B200", "b200"),
    "a100": Model("NVIDIA A100-SXM4-80GB", "a100"),   # the 80 GB SXM4 part
}
_NAME = re.compile(r"^([a-z0-9]+):(?:(\d+)x)?(\d+)$")


@dataclass(frozen=True)
class Target:
    name: str
    model: Model
    hosts: int
    devices: tuple

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def hardware(self) -> cost.Hardware:
        """The model's cost profile (GpuError when the cost model has none)."""
        if self.model.profile not in cost.PROFILES:
            raise GpuError(f"the cost model has no '{self.model.profile}' profile yet "
                           f"(overlap_hlo.plan.cost.PROFILES): {self.name} compiles, but "
                           "its schedule cannot be priced")
        return cost.PROFILES[self.model.profile]


def parse(name: str) -> tuple[Model, int, int]:
    """(model, hosts, devices per host) of a target name such as "h100:8", "b200:2x8"."""
    match = _NAME.match(name.lower())
    if match is None or match.group(1) not in MODELS:
        raise UnknownTarget(
            f"unknown GPU target '{name}' (expected MODEL:DEVICES or MODEL:HOSTSxDEVICES "
            f"with MODEL one of {', '.join(MODELS)}, e.g. h100:8 or h100:2x8)")
    hosts, per_host = int(match.group(2) or 1), int(match.group(3))
    if hosts < 1 or per_host < 1:
        raise UnknownTarget(f"GPU target '{name}' has no devices")
    return MODELS[match.group(1)], hosts, per_host


@functools.lru_cache(maxsize=None)
def target(name: str) -> Target:
    """The devices of a named GPU target (the plugin's stderr chatter is kept off the
    terminal)."""
    model, hosts, per_host = parse(name)
    error = None
    with aot.quiet_stderr():   # the library logs its loading
        try:
            path = gpu_plugin.register()
        except Exception as err:  # missing, or the library does not load
            error = err
    if isinstance(error, gpu_plugin.PluginMissing):
        raise GpuUnavailable(str(error)) from None
    if error is not None:
        raise GpuUnavailable(f"JAX's CUDA plugin cannot be loaded: {_first_line(error)}")
    config = (gpu_plugin.target_config(path, model.description)
              or gpu_plugin.bundled_target_config(model.description))
    if config is None:
        raise GpuUnavailable(
            f"the CUDA plugin for jaxlib {gpu_plugin.jaxlib_version()} carries no target "
            f"description for {model.description} ({path}), and neither does this package")
    from jax.experimental import topologies

    with aot.quiet_stderr():
        try:
            desc = topologies.get_topology_desc(platform="cuda",
                                                topology=f"{hosts}x1x{per_host}",
                                                target_config=config)
        except Exception as err:  # the plugin reports everything as a runtime error
            error = err
    if error is not None:
        raise GpuUnavailable(f"the CUDA plugin could not describe '{name}': "
                             f"{_first_line(error)}") from None
    return Target(name, model, hosts, tuple(desc.devices))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


def compile_module(module: ir.Module, tgt: Target, rewritten: bool = False) -> aot.Compiled:
    """Compile `module` for `tgt` (partition i on device i); a `rewritten` one with
    RING_FLAGS too."""
    return aot.compile_module(module, tgt.devices, tgt.name, ERRORS,
                              REWRITTEN_OPTIONS if rewritten else COMPILER_OPTIONS)


def gpu_options(options: dict, tgt: Target) -> dict:
    """Pass `options` for a GPU compile: those given (None: the default), target gpu,
    and, when neither a threshold nor a profile is given, the model's profile: its cost
    model decides each site."""
    given = {k: v for k, v in options.items() if v is not None}
    if "threshold_mib" not in given and "hardware" not in given:
        given["hardware"] = tgt.hardware.name
    return {"target": "gpu", **given}


@dataclass
class CompiledPair:
    original: aot.Compiled
    rewritten: aot.Compiled
    sites: list[Site]
    target: Target


def compile_pair(source, tgt: Target | str, pipeline: str = DEFAULT_PIPELINE, *,
                 input_name: str | None = None, **options) -> CompiledPair:
    """Compile `source` as it is and rewritten by `pipeline` with pass `options`
    (threshold_mib, hardware, bidirectional, unroll) for `tgt`."""
    tgt = target(tgt) if isinstance(tgt, str) else tgt
    original = compile_module(aot.as_module(source), tgt)
    module, sites = aot.rewrite(original.module, pipeline, input_name=input_name,
                                **gpu_options(options, tgt))
    return CompiledPair(original, compile_module(module, tgt, rewritten=True), sites, tgt)
