"""Run a per-device (already partitioned) module on the host CPU devices.

What the tests and the fuzzer use to run hand-written modules whose arguments and
results are each device's own (`{mhlo.sharding = "{manual}"}`), before and after a
rewrite. Needs `--xla_force_host_platform_device_count` devices.
"""
from __future__ import annotations

import numpy as np


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
