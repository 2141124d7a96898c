"""Python entry points: rewrite an ir.Module, MLIR source, a Lowered or an Exported."""
from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir

from . import compat
from .pipeline import DEFAULT_PIPELINE, build_pass_manager
from .rewrite_pass import Site, SiteLog


def pass_defaults(options: dict) -> dict[str, str]:
    """Python keyword options (threshold_mib=0, bidirectional=True, ...) as pipeline
    option text for every overlap pass that the pipeline leaves them unset."""
    return {key.replace("_", "-"): str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in options.items() if value is not None}


def rewrite_module(module: ir.Module, pipeline: str = DEFAULT_PIPELINE, *,
                   verify: bool = True, input_name: str | None = None,
                   **options) -> list[Site]:
    """Run `pipeline` on `module` in place; returns every candidate site and its fate.

    `options` are the overlap passes' options in Python spelling: threshold_mib,
    hardware, bidirectional, unroll. Raises `ir.MLIRError` if a pass or the verifier
    fails and `overlap_hlo.PipelineError` for a bad pipeline or option.
    """
    log = SiteLog(input_name=input_name)
    defaults = pass_defaults(options)
    with module.context:
        pm = build_pass_manager(pipeline, log, defaults)
        pm.enable_verifier(verify)
        pm.run(module.operation)
    return log.sites


def parse(source: str | bytes, context: ir.Context | None = None) -> ir.Module:
    """Parse MLIR text or bytecode in a context with every JAX dialect."""
    context = context or compat.make_context()
    return ir.Module.parse(source, context=context)


def serialize(module: ir.Module, bytecode: bool = False) -> str | bytes:
    if bytecode:
        import io

        buffer = io.BytesIO()
        module.operation.write_bytecode(buffer)
        return buffer.getvalue()
    return module.operation.get_asm(enable_debug_info=False, assume_verified=True)


def rewrite_source(source: str | bytes, pipeline: str = DEFAULT_PIPELINE, *,
                   emit_bytecode: bool = False, **options) -> str | bytes:
    """Rewrite MLIR text or bytecode; returns text (or bytecode)."""
    module = parse(source)
    rewrite_module(module, pipeline, **options)
    return serialize(module, emit_bytecode)


def remarks(source: str | bytes | ir.Module, pipeline: str = DEFAULT_PIPELINE,
            **options) -> list[Site]:
    """Every candidate site of `source` and what the pipeline would do with it
    (location, pattern, shapes, group size, decision and reason, predicted times).
    The input is not changed."""
    if isinstance(source, ir.Module):
        source = serialize(source, bytecode=True)
    return rewrite_module(parse(source), pipeline, **options)


def _copy(module: ir.Module) -> ir.Module:
    """A copy in a fresh context: JAX caches the module it hands out."""
    return parse(serialize(module, bytecode=True))


def rewrite_lowered(lowered, pipeline: str = DEFAULT_PIPELINE, **options):
    """A new `jax.stages.Lowered` whose `.compile()` runs the rewritten module.

    `lowered` and JAX's cached lowering are left as they were.
    """
    module = _copy(lowered.compiler_ir("stablehlo"))
    rewrite_module(module, pipeline, **options)
    return compat.replace_lowered_module(lowered, module)


def rewrite_exported(exported, pipeline: str = DEFAULT_PIPELINE, **options):
    """A new `jax.export.Exported` carrying the rewritten module.

    Its `.call()` runs the rewritten module, and it survives serialize()/deserialize().
    """
    module = parse(exported.mlir_module())
    rewrite_module(module, pipeline, **options)
    with module.context:
        payload = compat.serialize_for_export(module)
    return dataclasses.replace(exported, mlir_module_serialized=payload)


class Overlapped:
    """A jitted function whose executables run the rewritten module.

    Calling it lowers the function for the arguments' shapes, dtypes and shardings,
    rewrites the lowering, compiles it once per such signature and runs it.
    `lower(*args)` gives the rewritten `jax.stages.Lowered` itself.
    """

    def __init__(self, jitted, pipeline: str = DEFAULT_PIPELINE, **options):
        import jax

        self.jitted = jitted if hasattr(jitted, "lower") else jax.jit(jitted)
        self.pipeline = pipeline
        self.options = options
        self._compiled: dict = {}

    def lower(self, *args, **kwargs):
        return rewrite_lowered(self.jitted.lower(*args, **kwargs), self.pipeline,
                               **self.options)

    def __call__(self, *args, **kwargs):
        import jax

        leaves, tree = jax.tree.flatten((args, kwargs))
        key = (tree, tuple(_signature(leaf) for leaf in leaves))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self.lower(*args, **kwargs).compile()
        return compiled(*args, **kwargs)


def _signature(leaf):
    import jax

    shape = getattr(leaf, "shape", None)
    dtype = getattr(leaf, "dtype", None)
    sharding = getattr(leaf, "sharding", None) if isinstance(leaf, jax.Array) else None
    if shape is None:
        return ("static", type(leaf), leaf)
    return (tuple(shape), str(dtype), sharding)


def overlap(fn, pipeline: str = DEFAULT_PIPELINE, **options) -> Overlapped:
    """`fn` (a function or a `jax.jit` of one) with its collectives decomposed.

        step = overlap_hlo.overlap(jax.jit(train_step), bidirectional=True)
        state, loss = step(state, batch)

    Options as for `rewrite_module` (threshold_mib, hardware, bidirectional, unroll).
    """
    return Overlapped(fn, pipeline, **options)
