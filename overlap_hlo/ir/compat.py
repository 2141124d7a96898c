"""The one place that touches private or version-specific jax/jaxlib paths.

Everything else imports the MLIR bindings' rewrite API, the IR context factory and
the JAX-internal hooks (Lowered rebuilding, Exported serialization) from here.
"""
from __future__ import annotations

import copy

from jaxlib.mlir import ir
from jaxlib.mlir._mlir_libs._mlir import rewrite as _rewrite

RewritePatternSet = _rewrite.RewritePatternSet
GreedyRewriteConfig = _rewrite.GreedyRewriteConfig
GreedySimplifyRegionLevel = _rewrite.GreedySimplifyRegionLevel
apply_patterns_and_fold_greedily = _rewrite.apply_patterns_and_fold_greedily


def make_context() -> ir.Context:
    """An MLIR context with every dialect JAX emits (stablehlo, sdy, chlo, func, ...)."""
    from jax._src.interpreters import mlir as jax_mlir

    return jax_mlir.make_ir_context()


def replace_lowered_module(lowered, module: ir.Module, compiler_options: dict | None = None):
    """A new `jax.stages.Lowered` that compiles `module` instead of `lowered`'s own,
    with `compiler_options` (XLA options for this executable only) under the ones the
    lowering or `.compile()` gives."""
    import jax

    lowering = lowering_compiling(lowered, module)
    if compiler_options:
        given = tuple(getattr(lowering, "_compiler_options_kvs", ()) or ())
        lowering._compiler_options_kvs = tuple(compiler_options.items()) + given
    return jax.stages.Lowered(
        lowering, lowered.args_info, lowered.out_tree, lowered._no_kwargs,
        lowered._in_types, lowered._out_types)


def lowering_compiling(lowered, module: ir.Module, shardings_from_module: bool = False):
    """`lowered`'s internal lowering, copied to compile `module` instead; with
    `shardings_from_module`, JAX reads the in/out shardings back from the compiled
    module (for a module compiled under a placeholder function's signature)."""
    from jax._src import sharding_impls

    lowering = copy.copy(lowered._lowering)
    lowering._hlo = module
    lowering._executable = None
    if shardings_from_module:
        args = dict(lowering.compile_args)
        args["in_shardings"] = (sharding_impls.UNSPECIFIED,) * len(args["in_shardings"])
        args["out_shardings"] = (sharding_impls.UNSPECIFIED,) * len(args["out_shardings"])
        lowering.compile_args = args
    return lowering


def serialize_for_export(module: ir.Module) -> bytes:
    """Serialize as JAX does for `Exported.mlir_module_serialized` (portable artifact)."""
    from jax._src.export import _export

    return _export._module_to_bytecode(module)


def deserialize_portable_artifact(data: bytes, context: ir.Context) -> ir.Module:
    """A StableHLO portable artifact (VHLO bytecode, `Exported.mlir_module_serialized`)
    read back as a StableHLO module; ValueError when it cannot be read."""
    from jaxlib.mlir.dialects import stablehlo

    return stablehlo.deserialize_portable_artifact(context, data)


def stablehlo_version() -> str:
    """The StableHLO version of this jaxlib ("1.15.0")."""
    from jaxlib.mlir.dialects import stablehlo

    return stablehlo.get_current_version()


def static_arguments(jitted) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The static_argnums and static_argnames of a `jax.jit` function (resolved against
    its signature, as jit itself does); empty for anything else."""
    info = getattr(jitted, "_jit_info", None)
    if info is None:
        return (), ()
    return tuple(info.static_argnums), tuple(info.static_argnames)


def trace_context():
    """The configuration state that jax.jit keys its cache on besides the arguments
    (default_matmul_precision, the mesh context, x64, ...): hashable."""
    from jax._src import config

    return config.trace_context()


def lowering_platforms(lowered) -> tuple[str, ...]:
    """The platforms a `jax.stages.Lowered` was lowered for ("cpu", "tpu", "cuda"...)."""
    return tuple(getattr(lowered._lowering, "_platforms", None) or ())
