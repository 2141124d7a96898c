"""libtpu's estimate of one matmul against the same rows split into ring blocks.

    python benchmarks/dot_blocks.py [SLICE] [N]     (default v6e:2x4, N 7168)

Per device: x [1024, 8192] @ w [8192, N] bf16 as one dot, as two 512-row dots, and two
512-row blocks sliced from [4096, 8192] either concatenated into one dot or multiplied
apart (what a two-stream ring's round computes). Each is compiled ahead of time for the
slice and its compute summed from the compiler's own estimates (a PREDICTION, not a
measurement): whether a ring's partial dots are bound by reading the weight.
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

from overlap_hlo.targets import tpu  # noqa: E402
from overlap_hlo.targets.report_build import _Kind, analyze_compiled  # noqa: E402

ROWS, K = 512, 8192


def _slices(x, i):
    return (jax.lax.dynamic_slice_in_dim(x, i[0] * ROWS, ROWS),
            jax.lax.dynamic_slice_in_dim(x, i[1] * ROWS, ROWS))


FORMS = {   # name -> (function, operand shapes; "i" is two block indices)
    "one 1024-row dot": (lambda x, w: x @ w, [(2 * ROWS, K), (K, None)]),
    "two 512-row dots": (lambda x, w: jnp.concatenate([x[:ROWS] @ w, x[ROWS:] @ w]),
                         [(2 * ROWS, K), (K, None)]),
    "two sliced blocks, concatenated": (lambda x, w, i: jnp.concatenate(_slices(x, i)) @ w,
                                        [(8 * ROWS, K), (K, None), "i"]),
    "two sliced blocks, apart": (lambda x, w, i: tuple(b @ w for b in _slices(x, i)),
                                 [(8 * ROWS, K), (K, None), "i"]),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    topo = tpu.topology(argv[0] if argv else "v6e:2x4")
    n = int(argv[1]) if len(argv) > 1 else 7168
    kind = _Kind.of(topo)
    mesh = Mesh(np.array(topo.devices).reshape(-1), ("x",))
    print(f"{topo.name}: x @ w[{K}, {n}] bf16, libtpu's estimates (predictions)")
    for name, (fn, shapes) in FORMS.items():
        specs = [jax.ShapeDtypeStruct((2,), jnp.int32, sharding=NamedSharding(mesh, P()))
                 if s == "i" else jax.ShapeDtypeStruct(tuple(n if d is None else d for d in s),
                                                       jnp.bfloat16,
                                                       sharding=NamedSharding(mesh, P()))
                 for s in shapes]
        step = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(P() for _ in shapes),
                                     out_specs=P(), check_vma=False))
        analysis = analyze_compiled(kind.compile(step.lower(*specs).compiler_ir("stablehlo")),
                                    kind.timing)
        parts = sorted(analysis.compute_by_name.items(), key=lambda t: -t[1])[:3]
        print(f"  {name:32s} {analysis.compute_us:8.1f} us  ("
              + ", ".join(f"{k} {v:.1f}" for k, v in parts) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
