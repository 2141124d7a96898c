"""Compile a module ahead of time for devices without the hardware (a TPU slice, NVIDIA
GPUs): what `tpu` and `gpu` share.

A module (MLIR text or bytecode, an `ir.Module`, a `jax.export.Exported` or a
`jax.stages.Lowered`) is compiled through a placeholder `jax.jit` lowering for the
devices whose module is swapped for the input's (partition i runs on device i). Each
target names its own exception classes (`Errors`) and compiler options. Nothing here
runs at import time.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass

from jaxlib.mlir import ir

from overlap_hlo import api
from overlap_hlo.ir import compat
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
from overlap_hlo.rewrite.site import Site


class TargetError(Exception):
    """A module cannot be compiled for a named target (tpu.TpuError, gpu.GpuError)."""


@dataclass(frozen=True)
class Errors:
    """How a target reports what goes wrong."""

    error: type[Exception]       # the module cannot be compiled
    mismatch: type[Exception]    # it is written for another number of devices
    compiler: str                # "the TPU compiler", in messages


@dataclass
class Compiled:
    """One module compiled for a target's devices."""

    executable: object          # jaxlib's loaded-or-not executable
    module: ir.Module           # the StableHLO that was compiled

    @property
    def hlo_module(self):
        return self.executable.hlo_modules()[0]

    @property
    def memory(self):
        return self.executable.get_compiled_memory_stats()


@contextlib.contextmanager
def quiet_stderr():
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


def compile_module(module: ir.Module, devices: tuple, name: str, errors: Errors,
                   compiler_options: dict | None = None) -> Compiled:
    """Compile `module` for `devices` of the target `name` (partition i on device i).
    Bare file locations in `module` are wrapped in name locations first."""
    partitions, replicas = device_count(module)
    if replicas != 1:
        raise errors.mismatch(f"the module has mhlo.num_replicas={replicas}; only "
                              "modules with one replica (jax.jit) can be compiled")
    if partitions != len(devices):
        raise errors.mismatch(
            f"the module is written for {partitions} device(s) (mhlo.num_partitions="
            f"{partitions}) but {name} has {len(devices)}")
    with module.context:
        inputs, outputs = _signature(module, errors)
        _name_file_locations(module)
    lowering = _placeholder_lowering(devices, inputs, outputs, module)
    error = None
    with quiet_stderr():
        try:
            executable = lowering.compile(compiler_options).xla_executable
        except Exception as err:  # the compiler's errors are runtime errors
            error = err
    if error is not None:
        message = str(error).strip() or repr(error)
        raise errors.error(f"{errors.compiler} rejected the module: {message}") from None
    return Compiled(executable, module)


def rewrite(module: ir.Module, pipeline: str = DEFAULT_PIPELINE, *,
            input_name: str | None = None, **options) -> tuple[ir.Module, list[Site]]:
    """A copy of `module` rewritten with pass `options` as given, and its sites."""
    rewritten = api.parse(api.serialize(module, bytecode=True))
    return rewritten, api.rewrite_module(rewritten, pipeline, input_name=input_name,
                                         **options)


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


# -- the placeholder lowering (its private JAX paths are in compat.py) ----------------

_MLIR_TO_NUMPY = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64",
                  "i1": "bool", "f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2",
                  "complex<f32>": "complex64", "complex<f64>": "complex128"}


def _dtype(element_type: ir.Type, errors: Errors):
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
        raise errors.error(f"unsupported element type {text} in the module's "
                           "signature") from None


def _signature(module: ir.Module, errors: Errors) -> tuple[list, list]:
    """(shape, dtype) of @main's arguments and results."""
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            break
    else:
        raise errors.error("the module has no @main function")

    def shaped(t: ir.Type):
        try:
            ranked = ir.RankedTensorType(t)
        except ValueError:
            raise errors.error(f"@main takes or returns {t}, not a ranked tensor") from None
        if not ranked.has_static_shape:
            raise errors.error(f"@main has a dynamic shape {t}")
        return tuple(ranked.shape), _dtype(ranked.element_type, errors)

    return [shaped(t) for t in ftype.inputs], [shaped(t) for t in ftype.results]


def _placeholder_lowering(devices: tuple, inputs: list, outputs: list, module: ir.Module):
    """A jax.jit lowering over `devices` with the module's signature that compiles
    `module`, its shardings left to the compiled module (JAX reads them back from
    XLA)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    specs = [jax.ShapeDtypeStruct(shape, dtype, sharding=replicated) for shape, dtype in inputs]

    def placeholder(*args):
        return tuple(jnp.zeros(shape, dtype) for shape, dtype in outputs)

    lowered = jax.jit(placeholder, out_shardings=replicated, keep_unused=True).lower(*specs)
    return compat.lowering_compiling(lowered, module, shardings_from_module=True)
