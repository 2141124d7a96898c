"""Run modules on the host CPU devices, as the tests and the fuzzer do.

`run_per_device` runs a hand-written module whose arguments and results are each
device's own (`{mhlo.sharding = "{manual}"}`), before and after a rewrite; it needs
`--xla_force_host_platform_device_count` devices. `poison_buffers` makes the TPU and GPU
forms runnable here; `rewrite_runnable` rewrites a lowering into them.
"""
from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo import api
from overlap_hlo.ir import compat
from overlap_hlo.ir.ops import is_allocation


def poison_buffers(module: ir.Module) -> int:
    """Replace every custom_call @AllocateBuffer (a buffer the TPU and GPU forms leave
    uninitialised, which XLA:CPU cannot run) by a constant of NaN (floats) or of a
    sentinel (integers), so that an element a ring fails to write shows in its results;
    returns how many."""
    found = []

    def visit(op):
        if is_allocation(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in found:
        tensor_type = ir.RankedTensorType(op.results[0].type)
        elt = tensor_type.element_type
        with ir.InsertionPoint(op), op.location:
            fill = (ir.FloatAttr.get(elt, float("nan")) if isinstance(elt, ir.FloatType)
                    else ir.IntegerAttr.get(elt, -12345))
            poison = stablehlo.constant(ir.DenseElementsAttr.get_splat(tensor_type, fill))
        op.results[0].replace_all_uses_with(poison)
        op.erase()
    return len(found)


def rewrite_runnable(lowered, **options) -> tuple[list, ir.Module, object]:
    """`lowered` (a jax.stages.Lowered) rewritten with pass `options` into a module this
    backend runs (the TPU and GPU forms' buffers poisoned): (sites, module, a Lowered
    that compiles it)."""
    module = api.parse(lowered.as_text())
    sites = api.rewrite_module(module, **options)
    poison_buffers(module)
    return sites, module, compat.replace_lowered_module(lowered, module)


def run_per_device(text: str, replicas: int, partitions: int,
                   per_device_inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Compile `text` for replicas x partitions host devices and run it.

    Input i holds one slice per device along axis 0 (device d = replica * partitions +
    partition); returns each output stacked the same way.
    """
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import xla_client
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()[:replicas * partitions]
    options = xla_client.CompileOptions()
    options.num_replicas, options.num_partitions = replicas, partitions
    options.executable_build_options.use_spmd_partitioning = partitions > 1
    options.device_assignment = xla_client.DeviceAssignment.create(
        np.arange(len(devices)).reshape(replicas, partitions))
    backend = xla_bridge.get_backend()
    executable = backend.compile_and_load(text, xla_client.DeviceList(tuple(devices)), options)
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    args = [jax.device_put(np.concatenate(list(a)), NamedSharding(mesh, P("d")))
            for a in per_device_inputs]
    results = executable.execute_sharded(args).disassemble_into_single_device_arrays()
    return [np.stack([np.asarray(r) for r in per_device]) for per_device in results]
