"""A small tensor- and sequence-parallel transformer written with jax.shard_map.

Each layer: RMS norm, attention (Q/K/V projections from one all_gather of the
sequence-sharded activations, heads split over the "tp" axis, an output projection
whose partial sums are reduce-scattered back), RMS norm, gated MLP (one all_gather
feeding the gate and up projections, a reduce-scattered down projection). Layers are
stacked with lax.scan; the training step is plain SGD on a squared error.

    python examples/transformer.py                 # rewrite, run both, compare, remarks
    python examples/transformer.py --export PATH   # write one forward layer's module
    python examples/transformer.py --export-train-step PATH   # the training step's
"""
from __future__ import annotations

import argparse
import dataclasses
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

AXIS = "tp"


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 2
    seq: int = 256
    model: int = 256
    heads: int = 8
    head_dim: int = 32
    hidden: int = 1024
    devices: int = 8


PARAM_SPECS = {   # stacked over layers (dim 0); heads and hidden units split over "tp"
    "wq": P(None, None, AXIS), "wk": P(None, None, AXIS), "wv": P(None, None, AXIS),
    "wo": P(None, AXIS), "wg": P(None, None, AXIS), "wu": P(None, None, AXIS),
    "wd": P(None, AXIS),
}


def init_params(cfg: Config, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    qkv = cfg.heads * cfg.head_dim
    shapes = {"wq": (cfg.model, qkv), "wk": (cfg.model, qkv), "wv": (cfg.model, qkv),
              "wo": (qkv, cfg.model), "wg": (cfg.model, cfg.hidden),
              "wu": (cfg.model, cfg.hidden), "wd": (cfg.hidden, cfg.model)}
    return {name: (rng.standard_normal((cfg.layers, *shape)) / np.sqrt(shape[0]))
            .astype(np.float32) for name, shape in shapes.items()}


def rms_norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def gather(x):
    return jax.lax.all_gather(x, AXIS, axis=0, tiled=True)


def scatter(y):
    return jax.lax.psum_scatter(y, AXIS, scatter_dimension=0, tiled=True)


def layer(x, p, head_dim: int):
    """One layer on the local shard: x is [seq / tp, model]."""
    g = gather(rms_norm(x))                                     # [seq, model]
    q, k, v = (g @ p[w] for w in ("wq", "wk", "wv"))            # [seq, heads/tp * dim]
    seq = g.shape[0]
    q, k, v = (t.reshape(seq, -1, head_dim) for t in (q, k, v))
    scores = jnp.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    attended = jnp.einsum("hqk,khd->qhd", weights, v).reshape(seq, -1)
    x = x + scatter(attended @ p["wo"])
    g = gather(rms_norm(x))
    hidden = jax.nn.silu(g @ p["wg"]) * (g @ p["wu"])
    return x + scatter(hidden @ p["wd"])


def forward(x, params, head_dim: int):
    def body(h, p):
        return layer(h, p, head_dim), None

    return jax.lax.scan(body, x, params)[0]


def train_step(params, x, target, head_dim: int, lr: float = 1e-2):
    def loss_fn(params):
        error = forward(x, params, head_dim) - target
        return jax.lax.psum(jnp.sum(error * error), AXIS) / (error.size * jax.lax.axis_size(AXIS))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda w, g: w - lr * g, params, grads), loss


def build(cfg: Config):
    """(jitted forward, jitted train step, forward args, train args), on a 1-D mesh."""
    mesh = jax.make_mesh((cfg.devices,), (AXIS,))
    act = P(AXIS)
    fwd = jax.jit(jax.shard_map(lambda x, p: forward(x, p, cfg.head_dim), mesh=mesh,
                                in_specs=(act, PARAM_SPECS), out_specs=act))
    step = jax.jit(jax.shard_map(lambda p, x, y: train_step(p, x, y, cfg.head_dim),
                                 mesh=mesh, in_specs=(PARAM_SPECS, act, act),
                                 out_specs=(PARAM_SPECS, P())))
    rng = np.random.default_rng(1)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    params = {k: put(v, PARAM_SPECS[k]) for k, v in init_params(cfg).items()}
    x = put(rng.standard_normal((cfg.seq, cfg.model)).astype(np.float32), act)
    y = put(rng.standard_normal((cfg.seq, cfg.model)).astype(np.float32), act)
    return fwd, step, (x, params), (params, x, y)


def layer_export() -> str:
    """One forward layer (the bundled examples/transformer_layer.mlir)."""
    fwd, _, fwd_args, _ = build(Config(layers=1, seq=1024, model=512, hidden=2048))
    return fwd.lower(*fwd_args).as_text()


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", metavar="PATH", help="write one forward layer's module")
    parser.add_argument("--export-train-step", metavar="PATH",
                        help="write the training step's module (two layers, jax.grad, SGD)")
    parser.add_argument("--bidirectional", action="store_true")
    parser.add_argument("--unroll", type=int, default=1)
    args = parser.parse_args(argv)
    import overlap_hlo

    if args.export:
        with open(args.export, "w") as out:
            out.write(layer_export())
        return 0
    fwd, step, fwd_args, step_args = build(Config())
    if args.export_train_step:
        with open(args.export_train_step, "w") as out:
            out.write(step.lower(*step_args).as_text())
        return 0
    options = dict(threshold_mib=0, bidirectional=args.bidirectional, unroll=args.unroll)
    worst, unchanged = 0.0, False
    for name, fn, fn_args in (("forward", fwd, fwd_args), ("train step", step, step_args)):
        lowered = fn.lower(*fn_args)
        print(f"== {name}: sites")
        sites = overlap_hlo.remarks(lowered.as_text(), **options)
        for site in sites:
            print("  " + site.format())
        summary = overlap_hlo.unchanged_summary(sites, see="the remarks above")
        if summary:
            print(f"== {name}: warning: {summary}")
            unchanged = True
        want = jax.tree.leaves(fn(*fn_args))
        got = jax.tree.leaves(overlap_hlo.overlap(fn, **options)(*fn_args))
        error = max(relative_error(g, w) for g, w in zip(got, want))
        worst = max(worst, error)
        print(f"== {name}: max relative difference rewritten vs original = {error:.2e}")
    return 0 if worst < 1e-4 and not unchanged else 1


if __name__ == "__main__":
    sys.exit(main())
