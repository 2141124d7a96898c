"""A sequence-parallel gated MLP block written with jax.shard_map, on 8 devices.

    python examples/tp_mlp.py --export examples/tp_mlp.mlir   # write the bundled module
    python examples/tp_mlp.py --dims 70b --export examples/tp_mlp_70b.mlir
    python examples/tp_mlp.py                                 # rewrite, run both, compare

The activations are sharded along the sequence; one all_gather feeds the gate and up
projections, and the down projection's partial sums are reduce-scattered back.
`--dims 70b` is the same block at Llama-70B's sizes in bf16 (4096 tokens, d_model 8192,
MLP width 28672): its export needs only shapes, no memory, and it is the size at which
the rewrite pays on a TPU or GPU (`overlap-report examples/tp_mlp_70b.mlir --tpu=v5e:2x4`).
"""
import argparse
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")   # host devices; no TPU backend start-up

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import overlap_hlo  # noqa: E402

# (tokens, d_model, MLP width, dtype): small enough to run on host devices, or 70B-class.
DIMS = {"small": (1024, 512, 2048, jnp.float32),
        "70b": (4096, 8192, 28672, jnp.bfloat16)}


def gated_mlp(x, w_gate, w_up, w_down):
    x = jax.lax.all_gather(x, "tp", axis=0, tiled=True)
    h = jax.nn.silu(x @ w_gate) * (x @ w_up)
    return jax.lax.psum_scatter(h @ w_down, "tp", scatter_dimension=0, tiled=True)


def build(dims: str = "small", shapes_only: bool = False):
    """The jitted block and its arguments: random arrays, or (`shapes_only`)
    ShapeDtypeStructs, enough to lower and export it."""
    seq, model, hidden, dtype = DIMS[dims]
    mesh = jax.make_mesh((8,), ("tp",))
    specs = (P("tp"), P(None, "tp"), P(None, "tp"), P("tp"))
    fn = jax.jit(jax.shard_map(gated_mlp, mesh=mesh, in_specs=specs, out_specs=P("tp")))
    shapes = [(seq, model), (model, hidden), (model, hidden), (hidden, model)]
    shardings = [NamedSharding(mesh, spec) for spec in specs]
    if shapes_only:
        return fn, [jax.ShapeDtypeStruct(s, dtype, sharding=sharding)
                    for s, sharding in zip(shapes, shardings)]
    rng = np.random.default_rng(0)
    scales = [1.0] + [1 / np.sqrt(s[0]) for s in shapes[1:]]  # unit-scale activations
    args = [jax.device_put(jnp.asarray(rng.standard_normal(s) * c, dtype), sharding)
            for s, c, sharding in zip(shapes, scales, shardings)]
    return fn, args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", metavar="PATH", help="write the StableHLO module and exit")
    parser.add_argument("--dims", choices=DIMS, default="small",
                        help="sizes: small (runs on 8 host CPU devices; the default) or "
                             "70b (export only)")
    options = parser.parse_args(argv)
    if options.dims != "small" and not options.export:
        parser.error(f"--dims {options.dims} is too large to run here: add --export PATH")
    fn, args = build(options.dims, shapes_only=bool(options.export))
    lowered = fn.lower(*args)
    if options.export:
        with open(options.export, "w") as out:
            out.write(lowered.as_text())
        return 0
    sites = overlap_hlo.remarks(lowered.as_text())
    for site in sites:
        print(site.format())
    summary = overlap_hlo.unchanged_summary(sites, see="the remarks above")
    if summary:
        print(f"warning: {summary}")
    rewritten = overlap_hlo.rewrite_lowered(lowered)
    want = np.asarray(lowered.compile()(*args))
    got = np.asarray(rewritten.compile()(*args))
    error = float(np.max(np.abs(got - want)))
    print(f"max |rewritten - original| = {error:.3g} (output scale {np.max(np.abs(want)):.3g})")
    return 0 if error <= 1e-4 * max(1.0, float(np.max(np.abs(want)))) and not summary else 1


if __name__ == "__main__":
    sys.exit(main())
