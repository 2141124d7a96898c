"""libtpu's estimates of a gather ring's block dots inside a scan over stacked weights.

    python benchmarks/dot_blocks_in_scan.py [SLICE]     (default v6e:2x4)

benchmarks/dot_blocks.py compiles the dots alone, where libtpu may keep the weight in
fast memory; in a training step the layer's weight is a slice of the stacked weights and
stays in HBM. Here, per device and layer of a two-layer scan, the eight received 512-row
shards (each a collective_permute's result, as in a ring) multiply w [8192, 3584] bf16
three ways: one dot per shard (what a ring computes), one dot per pair of shards
concatenated (a two-stream round as one dot), and one dot over all eight concatenated.
Each is compiled ahead of time and its instructions' cycles summed from the compiler's
own estimates (a PREDICTION, not a measurement), the dots apart from the rest.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from overlap_hlo.targets import aot, schedule, tpu  # noqa: E402
from overlap_hlo.targets.hlo_proto import parse_module  # noqa: E402

ROWS, SHARDS, K, N, LAYERS = 512, 8, 8192, 3584, 2
FORMS = {"a dot per shard": 1, "a dot per two shards": 2, "one dot": SHARDS}
SKIPPED = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")


def layer(shards, w, per_dot: int):
    """The shards' products written to the rows a ring writes them to."""
    out = jnp.zeros((ROWS * SHARDS, N), jnp.bfloat16)
    for i in range(0, SHARDS, per_dot):
        block = (jnp.concatenate(shards[i:i + per_dot]) if per_dot > 1 else shards[i])
        block, out = jax.lax.optimization_barrier((block, out))   # one dot per round
        product = block @ w
        for j in range(per_dot):
            out = jax.lax.dynamic_update_slice_in_dim(
                out, product[j * ROWS:(j + 1) * ROWS], (i + j) * 3 % SHARDS * ROWS, 0)
    return out


def step(per_dot: int):
    ring = [(d, (d + 1) % SHARDS) for d in range(SHARDS)]

    def fn(x, ws):
        def body(h, w):
            shards = [jax.lax.ppermute(h[k * ROWS:(k + 1) * ROWS], "d", ring)
                      for k in range(SHARDS)]
            y = layer(shards, w, per_dot)
            return h.at[:, :N].add(y), y.sum()
        return jax.lax.scan(body, x, ws)
    return fn


def cycles(compiled: aot.Compiled) -> tuple[list[int], int]:
    """(each dot's estimated cycles, all other instructions' cycles summed)."""
    proto = parse_module(compiled.hlo_module.as_serialized_hlo_module_proto())
    dots, other = [], 0
    for comp in proto.computations.values():
        for instr in comp.instructions:
            estimate = instr.estimated_cycles()
            if not estimate or instr.opcode in SKIPPED:
                continue
            if schedule.instruction_category(proto, instr) == "dots":
                dots.append(estimate)
            else:
                other += estimate
    return dots, other


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    topo = tpu.topology(argv[0] if argv else "v6e:2x4")
    mesh = Mesh(np.array(topo.devices).reshape(-1), ("d",))
    whole = NamedSharding(mesh, P())
    args = (jax.ShapeDtypeStruct((ROWS * SHARDS, K), jnp.bfloat16, sharding=whole),
            jax.ShapeDtypeStruct((LAYERS, K, N), jnp.bfloat16, sharding=whole))
    print(f"{topo.name}: {SHARDS} shards of [{ROWS}, {K}] @ w[{K}, {N}] bf16 per layer, "
          f"{LAYERS} scanned layers; libtpu's estimated cycles (predictions)")
    print(f"  {'form':24s} {'dots':>5s} {'cycles each':>12s} {'dot cycles':>11s} "
          f"{'other cycles':>13s} {'total':>10s}")
    for name, per_dot in FORMS.items():
        fn = jax.jit(jax.shard_map(step(per_dot), mesh=mesh, in_specs=(P(), P()),
                                   out_specs=(P(), P()), check_vma=False))
        dots, other = cycles(tpu.compile_module(aot.as_module(fn.lower(*args)), topo))
        print(f"  {name:24s} {len(dots):5d} {max(dots):12d} {sum(dots):11d} {other:13d} "
              f"{sum(dots) + other:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
