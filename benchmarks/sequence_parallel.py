"""What overlap-sequence-parallel adds: a Megatron block's compiled schedule with and
without it, on TPU slices and NVIDIA targets, ahead of time (no TPU or GPU needed).

    python benchmarks/sequence_parallel.py [--targets v5e:2x4,h100:8,...] [--json PATH]

The block: two tensor-parallel MLP sublayers, `x + psum(gelu(rms(x) @ w1) @ w2)`, bf16,
70B-class dims (4096 tokens, d_model 8192, hidden 28672), over the 8 chips of the slice
or the 8 GPUs of one host. Each target compiles the shard_map original and the module
`overlap-report` keeps (the target's profile decides each site and the compiled schedule
checks the choice) with the default pipeline minus overlap-sequence-parallel, and with
the default pipeline. Per column: permutes with a matmul between start and done /
permutes, and the predicted step time.

Every time is a MODEL of the compiled schedule (TPU: the TPU compiler's cycle estimates
and datasheet link figures; GPU: kernels priced by the analytic cost model on the
datasheet profile), not a measurement.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from benchmarks.tpu import write_outputs  # noqa: E402
from overlap_hlo import DEFAULT_PIPELINE  # noqa: E402
from overlap_hlo.targets import gpu, report, tpu  # noqa: E402

TOKENS, MODEL, HIDDEN = 4096, 8192, 28672
TARGETS = ("v5e:2x4", "v6e:2x4", "v5p:2x2x2", "h100:8", "h200:8", "b200:8")
WITHOUT = DEFAULT_PIPELINE.replace("overlap-sequence-parallel,", "")
PIPELINES = {"without sequence-parallel": WITHOUT, "default pipeline": DEFAULT_PIPELINE}


def rms(h, g):
    square = jnp.mean(jnp.square(h.astype(jnp.float32)), -1, keepdims=True)
    return h * jax.lax.rsqrt(square + 1e-5).astype(h.dtype) * g


def block(x, g1, w1, w2, g2, w3, w4):
    x = x + jax.lax.psum(jax.nn.gelu(rms(x, g1) @ w1) @ w2, "tp")
    return x + jax.lax.psum(jax.nn.gelu(rms(x, g2) @ w3) @ w4, "tp")


def lowered(devices):
    mesh = Mesh(np.array(devices), ("tp",))
    specs = (P(), P(), P(None, "tp"), P("tp", None), P(), P(None, "tp"), P("tp", None))
    shapes = [(TOKENS, MODEL), (MODEL,), (MODEL, HIDDEN), (HIDDEN, MODEL), (MODEL,),
              (MODEL, HIDDEN), (HIDDEN, MODEL)]
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, p))
            for s, p in zip(shapes, specs)]
    return jax.jit(jax.shard_map(block, mesh=mesh, in_specs=specs, out_specs=P())).lower(*args)


def measure(name: str) -> dict:
    target = gpu.target(name) if name.split(":")[0] in gpu.MODELS else tpu.topology(name)
    source = lowered(target.devices)
    row = {"target": name}
    for column, pipeline in PIPELINES.items():
        rep = report.build(source, target, pipeline)
        row["original_us"] = rep.original.total_us
        row[column] = {"us": rep.rewritten.total_us, "overlapped": rep.overlapped,
                       "permutes": rep.permutes, "chosen": rep.chosen}
    return row


def table(rows: list[dict]) -> str:
    lines = ["| target | original | " + " | ".join(PIPELINES) + " |",
             "|---|---|" + "---|" * len(PIPELINES)]
    for row in rows:
        cells = [f"{row[c]['overlapped']}/{row[c]['permutes']}, {row[c]['us']:.0f} us "
                 f"({row['original_us'] / row[c]['us']:.2f}x)" for c in PIPELINES]
        lines.append(f"| {row['target']} | {row['original_us']:.0f} us | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = [measure(name) for name in args.targets.split(",")]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, jax {jax.__version__}, "
          f"{time.perf_counter() - start:.0f} s. A MODEL of the compiled schedules "
          "(overlap-report's choice per pipeline), not a measurement.")
    print(table(rows))
    write_outputs(table(rows), None, args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
