"""Compile modules for a TPU slice ahead of time, on a machine without a TPU.

    topo = overlap_hlo.targets.tpu.topology("v5e:2x4")
    pair = overlap_hlo.targets.tpu.compile_pair(module_text, topo, bidirectional=True)
    pair.original.hlo_module, pair.rewritten.memory.temp_size_in_bytes

libtpu holds the TPU compiler (`tpu_plugin`: `python -m overlap_hlo.targets.tpu_plugin
install` keeps it where JAX does not load it in every program); JAX's
`jax.experimental.topologies` describes a slice by name ("v5e:2x4", "v5p:2x2x2",
"v6e:2x4", "v4:2x2x1", ...), and compiling for its devices runs the real TPU compiler.
Cloud TPU's accelerator types ("v5e-8", "v5p-16") name the slice of the shape their
documentation gives (`ACCELERATOR_TYPES`).
A module (MLIR text or bytecode, an `ir.Module`, a `jax.export.Exported` or a
`jax.stages.Lowered`) is compiled through a placeholder `jax.jit` lowering for the
slice's devices whose module is swapped for the input's (partition i runs on the
slice's device i; `aot`, which the GPU target shares). Nothing here runs at import time: `overlap-opt` never imports it.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

from jaxlib.mlir import ir

from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
from overlap_hlo.rewrite.site import Site
from overlap_hlo.targets import aot, tpu_plugin


class TpuError(aot.TargetError):
    """A module cannot be compiled for the named TPU slice."""


class TpuUnavailable(TpuError):
    """libtpu is not installed or cannot be loaded."""


class TopologyMismatch(TpuError):
    """The topology is unknown or its device count does not fit the module."""


class UnknownTopology(TopologyMismatch):
    """The name is no TPU slice (a usage error on the command line)."""


@dataclass(frozen=True)
class Chip:
    """What the schedule model needs of a TPU generation."""

    profile: str        # cost.PROFILES entry with its link figures
    clock_ghz: float    # turns the compiler's estimated_cycles into time
    source: str
    wrap_multiple: int = 0   # an axis whose extent is a multiple of this wraps around
    wrap_extent: int = 0     # an axis of exactly this extent wraps around

    def wraps(self, extent: int) -> bool:
        """Whether an axis of the slice with this many chips has wraparound links."""
        return (extent > 2 and ((self.wrap_multiple and extent % self.wrap_multiple == 0)
                                or extent == self.wrap_extent))


# Clock = datasheet peak / (MXUs x MXU size^2 x 2 FLOPs per cycle).
CHIPS = {
    "v4": Chip("tpu-v4", 1.05, "275 TFLOP/s / (2 TensorCores x 4 MXUs x 128^2 x 2); 1050 MHz "
                              "in Jouppi et al., ISCA 2023", wrap_multiple=4),
    "v5e": Chip("tpu-v5e", 1.5, "197 TFLOP/s / (4 MXUs x 128^2 x 2)", wrap_extent=16),
    "v5p": Chip("tpu-v5p", 1.75, "459 TFLOP/s / (2 TensorCores x 4 MXUs x 128^2 x 2)",
                wrap_multiple=4),
    "v6e": Chip("tpu-v6e", 1.75, "918 TFLOP/s / (4 MXUs x 256^2 x 2)", wrap_extent=16),
}


# Cloud TPU's accelerator types, GENERATION-COUNT: v4 and v5p count TensorCores (two per
# chip), v5e and v6e count chips. Each maps to the slice shape the generation's page on
# cloud.google.com/tpu/docs gives for it (v4, v5p: 3-D; v5e, v6e: 2-D; "v5litepod" is
# v5e's name in the API).
_CUBE_SHAPES = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4",
                256: "4x4x8", 512: "4x8x8", 1024: "8x8x8", 2048: "8x8x16", 4096: "8x16x16"}
_TORUS_SHAPES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
                 128: "8x16", 256: "16x16"}
ACCELERATOR_TYPES = {"v4": ("v4", _CUBE_SHAPES), "v5p": ("v5p", _CUBE_SHAPES),
                     "v5e": ("v5e", _TORUS_SHAPES), "v5litepod": ("v5e", _TORUS_SHAPES),
                     "v6e": ("v6e", _TORUS_SHAPES)}
_SLICE = re.compile(r"^([a-z0-9]+):(\d+(?:x\d+)*)$")
_ACCELERATOR_TYPE = re.compile(r"^([a-z0-9]+)-(\d+)$")


def slice_name(name: str) -> str:
    """The GENERATION:SHAPE slice `name` stands for: itself (in lower case), or the
    shape of an accelerator type ("v5e-8" -> "v5e:2x4", "v5p-16" -> "v5p:2x2x2");
    UnknownTopology for any other name. Whether libtpu knows the shape is not checked."""
    text = name.strip().lower()
    match = _SLICE.match(text)
    if match is not None and match.group(1) in CHIPS:
        return text
    match = _ACCELERATOR_TYPE.match(text)
    if match is not None and match.group(1) in ACCELERATOR_TYPES:
        generation, shapes = ACCELERATOR_TYPES[match.group(1)]
        count = int(match.group(2))
        if count in shapes:
            return f"{generation}:{shapes[count]}"
        raise UnknownTopology(
            f"unknown TPU accelerator type '{name}': {match.group(1)}-N takes N in "
            f"{', '.join(map(str, shapes))} ({_counts(generation)})")
    raise UnknownTopology(
        f"unknown TPU topology '{name}' (expected GENERATION:SHAPE with GENERATION one "
        f"of {', '.join(CHIPS)}, e.g. v5e:2x4 or v5p:2x2x2, or an accelerator type such "
        "as v5e-8, v6e-8 (chips), v4-8 or v5p-16 (TensorCores))")


def _counts(generation: str) -> str:
    return "TensorCores, two per chip" if generation in ("v4", "v5p") else "chips"


@dataclass(frozen=True)
class Topology:
    name: str           # GENERATION:SHAPE
    generation: str
    devices: tuple
    chip: Chip
    requested: str = ""   # the accelerator type it was named by ("v5e-8"), if any

    @property
    def hardware(self) -> cost.Hardware:
        return cost.PROFILES[self.chip.profile]

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def label(self) -> str:
        """The name, with the accelerator type it was asked for: "v5e-8 (v5e:2x4)"."""
        return f"{self.requested} ({self.name})" if self.requested else self.name

    @property
    def links(self) -> Links:
        """Where device i (partition i of a compiled module) sits: its chip's
        coordinates, the slice's extents and their wraparound (docs/reference.md)."""
        extents = tuple(int(n) for n in self.name.split(":", 1)[1].lower().split("x"))
        coords = tuple(tuple(d.coords)[:len(extents)] for d in self.devices)
        return Links(coords, extents, tuple(self.chip.wraps(n) for n in extents))


@functools.lru_cache(maxsize=None)
def topology(name: str) -> Topology:
    """The devices of a named TPU slice, e.g. "v5e:2x4", or of an accelerator type,
    e.g. "v5e-8" (the same slice, `requested` "v5e-8"). libtpu's stderr chatter about
    the missing accelerator is kept off the terminal."""
    canonical = slice_name(name)
    if canonical != name:
        requested = "" if canonical == name.strip().lower() else name.strip().lower()
        return dataclasses.replace(topology(canonical), requested=requested)
    try:
        tpu_plugin.library()
    except tpu_plugin.LibtpuMissing as err:
        raise TpuUnavailable(str(err)) from None
    from jax.experimental import topologies

    error = None
    with _quiet_stderr() as chatter:
        try:
            with tpu_plugin.selected():
                desc = topologies.get_topology_desc(topology_name=name, platform="tpu")
        except Exception as err:  # libtpu reports everything as a runtime error
            error = err
    if error is not None:
        text = str(error).strip()
        message = text.splitlines()[0] if text else repr(error)
        if "lockfile" in message:
            raise TpuUnavailable(
                f"libtpu is in use by another process ({message}); set "
                "ALLOW_MULTIPLE_LIBTPU_LOAD=1 to compile alongside it") from None
        if "topology" in message.lower() or "invalid" in message.lower():
            raise UnknownTopology(f"TPU topology '{name}': {message}") from None
        details = chatter().splitlines()
        raise TpuUnavailable(f"libtpu could not describe '{name}': {message}"
                             + (f" ({details[-1]})" if details else "")) from None
    generation = name.split(":", 1)[0]
    return Topology(name, generation, tuple(desc.devices), CHIPS[generation])


_quiet_stderr = aot.quiet_stderr
Compiled = aot.Compiled
as_module = aot.as_module
device_count = aot.device_count
rewrite = aot.rewrite
ERRORS = aot.Errors(TpuError, TopologyMismatch, "the TPU compiler")


@dataclass
class CompiledPair:
    original: Compiled
    rewritten: Compiled
    sites: list[Site]
    topology: Topology


def compile_module(module: ir.Module, topo: Topology) -> Compiled:
    """Compile `module` for `topo` (partition i on the slice's device i). Bare file
    locations in `module` are wrapped in name locations first."""
    return aot.compile_module(module, topo.devices, topo.name, ERRORS)


def compile_pair(source, topo: Topology | str, pipeline: str = DEFAULT_PIPELINE, *,
                 input_name: str | None = None, **options) -> CompiledPair:
    """Compile `source` as it is and rewritten by `pipeline` with pass `options`
    (threshold_mib, hardware, bidirectional, unroll) for the slice `topo`."""
    topo = topology(topo) if isinstance(topo, str) else topo
    original = compile_module(as_module(source), topo)
    rewritten, sites = compile_rewritten(original.module, topo, pipeline,
                                         input_name=input_name, **tpu_options(options, topo))
    return CompiledPair(original, rewritten, sites, topo)


def compile_rewritten(module: ir.Module, topo: Topology, pipeline: str = DEFAULT_PIPELINE,
                      *, input_name: str | None = None, **options) -> tuple[Compiled, list[Site]]:
    """A copy of `module` rewritten with pass `options` as given (`tpu_options` gives
    the TPU forms for a slice), compiled for `topo`, and its sites."""
    rewritten, sites = rewrite(module, pipeline, input_name=input_name, **options)
    return compile_module(rewritten, topo), sites


def tpu_options(options: dict, topo: Topology) -> dict:
    """Pass `options` for a TPU compile on `topo`: those given (None: the default),
    target tpu and the slice's device coordinates (rings of physical neighbours)
    unless others are given, and, when neither a threshold nor a profile is, the
    slice's profile: its cost model decides each site."""
    given = {k: v for k, v in options.items() if v is not None}
    if "threshold_mib" not in given and "hardware" not in given:
        given["hardware"] = topo.hardware
    return {"target": "tpu", "device_coords": topo.links, **given}
