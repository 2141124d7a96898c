"""overlap-fuzz's generator of tensor-parallel blocks: psums after row-parallel matmuls,
residual adds and norms between them, in a scan or not, the batch split over another mesh
axis or not."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .fuzz_common import AXES, MESHES, Generator, auto_mesh


@dataclass(frozen=True)
class BlockCase:
    """`layers` Megatron MLP sublayers, x + psum(act(norm(x) @ w1) @ w2), over mesh axis
    `axis` (the batch split over `batch_axis` when there is one), in a scan or not,
    manual over every mesh axis or (`partial`) over `axis` only."""

    mesh: tuple[int, ...]
    axis: str
    batch_axis: str | None
    layers: int
    norm: str                      # "rms", "layer" or "none"
    activation: str                # "gelu", "silu" or "relu"
    sizes: tuple[int, int, int, int]   # batch, rows per device, model, hidden per device
    scanned: bool
    dtype: str
    shardy: bool
    seed: int
    bidirectional: bool = False
    unroll: int = 1
    partial: bool = False          # shard_map manual over `axis` only (the others auto)
    target: str = ""               # the forms every backend runs

    def describe(self) -> str:
        return repr(self)


def draw_block(rng: random.Random, seed: int) -> BlockCase:
    mesh = rng.choice(MESHES)
    names = AXES[:len(mesh)]
    axis = rng.choice(names)
    others = [a for a in names if a != axis]
    dtype = rng.choice(("float32", "float32", "bfloat16"))
    # Partially manual: Shardy and f32 only (XLA:CPU aborts on some such originals).
    partial = bool(others) and dtype == "float32" and rng.random() < 0.3
    return BlockCase(mesh, axis, None if partial or not others or rng.random() < 0.5
                     else rng.choice(others),
                     rng.randint(1, 3), rng.choice(("rms", "layer", "none")),
                     rng.choice(("gelu", "silu", "relu")),
                     tuple(rng.randint(1, 4) for _ in range(4)), rng.random() < 0.3,
                     dtype, partial or rng.random() < 0.5, seed,
                     rng.random() < 0.5, rng.choice((1, 1, 2)), partial)


def build_block(case: BlockCase):
    """(jitted shard_map program, inputs) for a BlockCase."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = AXES[:len(case.mesh)]
    mesh = auto_mesh(case.mesh)
    sizes = dict(zip(names, case.mesh))
    g, b = sizes[case.axis], sizes.get(case.batch_axis, 1)
    batch, rows, model, hidden = case.sizes
    act = {"gelu": jax.nn.gelu, "silu": jax.nn.silu, "relu": jax.nn.relu}[case.activation]

    def norm(h):
        if case.norm == "none":
            return h
        if case.norm == "layer":
            h = h - h.mean(-1, keepdims=True)
        return h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5)

    def sublayer(x, w1, w2):
        return x + jax.lax.psum(act(norm(x) @ w1) @ w2, case.axis)

    def fn(x, w1, w2):
        if case.scanned:
            return jax.lax.scan(lambda h, ws: (sublayer(h, *ws), None), x, (w1, w2))[0]
        for i in range(case.layers):
            x = sublayer(x, w1[i], w2[i])
        return x

    shapes = [(b * batch, g * rows, model), (case.layers, model, g * hidden),
              (case.layers, g * hidden, model)]
    in_specs = (P(case.batch_axis), P(None, None, case.axis), P(None, case.axis))
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs,
                                   out_specs=P(case.batch_axis), check_vma=False,
                                   axis_names={case.axis} if case.partial else set(names)))
    rng = np.random.default_rng(case.seed)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal(shape) / math.sqrt(shape[-1]),
                                         getattr(jnp, case.dtype)), NamedSharding(mesh, s))
              for shape, s in zip(shapes, in_specs)]
    return jitted, inputs


GENERATOR = Generator("block", 0.10, BlockCase, draw_block, build=build_block)
