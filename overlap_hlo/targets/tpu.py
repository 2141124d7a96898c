"""Compile modules for a TPU slice ahead of time, on a machine without a TPU.

    topo = overlap_hlo.targets.tpu.topology("v5e:2x4")
    pair = overlap_hlo.targets.tpu.compile_pair(module_text, topo, bidirectional=True)
    pair.original.hlo_module, pair.rewritten.memory.temp_size_in_bytes

libtpu (`pip install 'overlap-hlo[tpu]'`) holds the TPU compiler; JAX's
`jax.experimental.topologies` describes a slice by name ("v5e:2x4", "v5p:2x2x2",
"v6e:2x4", "v4:2x2x1", ...), and compiling for its devices runs the real TPU compiler.
A module (MLIR text or bytecode, an `ir.Module`, a `jax.export.Exported` or a
`jax.stages.Lowered`) is compiled through a placeholder `jax.jit` lowering for the
slice's devices whose module is swapped for the input's (partition i runs on the
slice's device i). Nothing here runs at import time: `overlap-opt` never imports it.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import tempfile
from dataclasses import dataclass

from jaxlib.mlir import ir

from overlap_hlo import api
from overlap_hlo.ir import compat
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
from overlap_hlo.rewrite.site import Site


class TpuError(Exception):
    """A module cannot be compiled for the named TPU slice."""


class TpuUnavailable(TpuError):
    """libtpu is not installed or cannot be loaded."""


class TopologyMismatch(TpuError):
    """The topology is unknown or its device count does not fit the module."""


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


@dataclass(frozen=True)
class Topology:
    name: str
    generation: str
    devices: tuple
    chip: Chip

    @property
    def hardware(self) -> cost.Hardware:
        return cost.PROFILES[self.chip.profile]

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def links(self) -> Links:
        """Where device i (partition i of a compiled module) sits: its chip's
        coordinates, the slice's extents and their wraparound (docs/reference.md)."""
        extents = tuple(int(n) for n in self.name.split(":", 1)[1].lower().split("x"))
        coords = tuple(tuple(d.coords)[:len(extents)] for d in self.devices)
        return Links(coords, extents, tuple(self.chip.wraps(n) for n in extents))


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


@functools.lru_cache(maxsize=None)
def topology(name: str) -> Topology:
    """The devices of a named TPU slice, e.g. "v5e:2x4" (libtpu's stderr chatter about
    the missing accelerator is kept off the terminal)."""
    generation = name.split(":", 1)[0].lower()
    if ":" not in name or generation not in CHIPS:
        raise TopologyMismatch(f"unknown TPU topology '{name}' (expected GENERATION:SHAPE "
                               f"with GENERATION one of {', '.join(CHIPS)}, e.g. v5e:2x4)")
    if not libtpu_available():
        raise TpuUnavailable("libtpu is not installed; install it with "
                             "pip install 'overlap-hlo[tpu]'")
    from jax.experimental import topologies

    error = None
    with _quiet_stderr() as chatter:
        try:
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
            raise TopologyMismatch(f"TPU topology '{name}': {message}") from None
        details = chatter().splitlines()
        raise TpuUnavailable(f"libtpu could not describe '{name}': {message}"
                             + (f" ({details[-1]})" if details else "")) from None
    return Topology(name, generation, tuple(desc.devices), CHIPS[generation])


@contextlib.contextmanager
def _quiet_stderr():
    """Send the native stderr (fd 2) to a temporary file; yields a reader for it."""
    captured = tempfile.TemporaryFile(mode="w+b")
    saved = os.dup(2)
    text = []
    os.dup2(captured.fileno(), 2)
    try:
        yield lambda: text[0] if text else ""
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        captured.seek(0)
        text.append(captured.read().decode("utf-8", "replace").strip())
        captured.close()


@dataclass
class Compiled:
    """One module compiled for a slice."""

    executable: object          # jaxlib's loaded-or-not executable
    module: ir.Module           # the StableHLO that was compiled

    @property
    def hlo_module(self):
        return self.executable.hlo_modules()[0]

    @property
    def memory(self):
        return self.executable.get_compiled_memory_stats()


@dataclass
class CompiledPair:
    original: Compiled
    rewritten: Compiled
    sites: list[Site]
    topology: Topology


def as_module(source) -> ir.Module:
    """A fresh ir.Module from text, bytecode, an ir.Module, an Exported or a Lowered."""
    if isinstance(source, (str, bytes)):
        return api.parse(source)
    if isinstance(source, ir.Module):
        return api.parse(api.serialize(source, bytecode=True))
    if hasattr(source, "mlir_module_serialized") and hasattr(source, "mlir_module"):
        return api.parse(source.mlir_module())
    if hasattr(source, "compiler_ir"):
        return api.parse(api.serialize(source.compiler_ir("stablehlo"), bytecode=True))
    raise TypeError(f"cannot compile a {type(source).__name__}: expected MLIR text or "
                    "bytecode, an ir.Module, a jax.export.Exported or a jax.stages.Lowered")


def device_count(module: ir.Module) -> tuple[int, int]:
    """(num_partitions, num_replicas) the module is written for."""
    attrs = module.operation.attributes

    def read(name: str) -> int:
        return ir.IntegerAttr(attrs[name]).value if name in attrs else 1

    return read("mhlo.num_partitions"), read("mhlo.num_replicas")


def compile_module(module: ir.Module, topo: Topology) -> Compiled:
    """Compile `module` for `topo` (partition i on the slice's device i). Bare file
    locations in `module` are wrapped in name locations first."""
    partitions, replicas = device_count(module)
    if replicas != 1:
        raise TopologyMismatch(f"the module has mhlo.num_replicas={replicas}; only "
                               "modules with one replica (jax.jit) can be compiled")
    if partitions != topo.device_count:
        raise TopologyMismatch(
            f"the module is written for {partitions} device(s) (mhlo.num_partitions="
            f"{partitions}) but {topo.name} has {topo.device_count}")
    with module.context:
        inputs, outputs = _signature(module)
        _name_file_locations(module)
    lowering = _placeholder_lowering(topo, inputs, outputs, module)
    error = None
    with _quiet_stderr():
        try:
            executable = lowering.compile().xla_executable
        except Exception as err:  # the compiler's errors are runtime errors
            error = err
    if error is not None:
        message = str(error).strip() or repr(error)
        raise TpuError(f"the TPU compiler rejected the module: {message}") from None
    return Compiled(executable, module)


def _name_file_locations(module: ir.Module) -> None:
    """XLA keeps an op's source position in the HLO metadata only under a name
    location (as JAX writes them); wrap bare file locations (text printed without
    them, or hand-written) in one, named after the op, so sites can be found."""
    def visit(op):
        loc = op.location
        if type(loc) is ir.Location:
            loc = ir.Location.from_attr(loc.attr, loc.context)
        if isinstance(loc, ir.FileLineColLoc):
            op.location = ir.Location.name(op.name, loc)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


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


def rewrite(module: ir.Module, pipeline: str = DEFAULT_PIPELINE, *,
            input_name: str | None = None, **options) -> tuple[ir.Module, list[Site]]:
    """A copy of `module` rewritten with pass `options` as given, and its sites."""
    rewritten = api.parse(api.serialize(module, bytecode=True))
    return rewritten, api.rewrite_module(rewritten, pipeline, input_name=input_name,
                                         **options)


def tpu_options(options: dict, topo: Topology) -> dict:
    """Pass `options` for a TPU compile on `topo`: those given (None: the default),
    target tpu and the slice's device coordinates (rings of physical neighbours)
    unless others are given, and, when neither a threshold nor a profile is, the
    slice's profile: its cost model decides each site."""
    given = {k: v for k, v in options.items() if v is not None}
    if "threshold_mib" not in given and "hardware" not in given:
        given["hardware"] = topo.hardware.name
    return {"target": "tpu", "device_coords": topo.links.text(), **given}


# -- the placeholder lowering (its private JAX paths are in compat.py) ----------------

_MLIR_TO_NUMPY = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64",
                  "i1": "bool", "f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2",
                  "complex<f32>": "complex64", "complex<f64>": "complex128"}


def _dtype(element_type: ir.Type):
    import numpy as np

    text = str(element_type)
    name = _MLIR_TO_NUMPY.get(text)
    if name is None and text.startswith("ui"):
        name = "uint" + text[2:]
    elif name is None and text.startswith("i"):
        name = "int" + text[1:]
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 and the f8 types with numpy)

        return np.dtype(name or text)
    except TypeError:
        raise TpuError(f"unsupported element type {text} in the module's signature") from None


def _signature(module: ir.Module) -> tuple[list, list]:
    """(shape, dtype) of @main's arguments and results."""
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            break
    else:
        raise TpuError("the module has no @main function")

    def shaped(t: ir.Type):
        try:
            ranked = ir.RankedTensorType(t)
        except ValueError:
            raise TpuError(f"@main takes or returns {t}, not a ranked tensor") from None
        if not ranked.has_static_shape:
            raise TpuError(f"@main has a dynamic shape {t}")
        return tuple(ranked.shape), _dtype(ranked.element_type)

    return [shaped(t) for t in ftype.inputs], [shaped(t) for t in ftype.results]


def _placeholder_lowering(topo: Topology, inputs: list, outputs: list, module: ir.Module):
    """A jax.jit lowering over the slice's devices with the module's signature that
    compiles `module`, its shardings left to the compiled module (JAX reads them back
    from XLA)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(topo.devices), ("devices",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    specs = [jax.ShapeDtypeStruct(shape, dtype, sharding=replicated) for shape, dtype in inputs]

    def placeholder(*args):
        return tuple(jnp.zeros(shape, dtype) for shape, dtype in outputs)

    lowered = jax.jit(placeholder, out_shardings=replicated, keep_unused=True).lower(*specs)
    return compat.lowering_compiling(lowered, module, shardings_from_module=True)
