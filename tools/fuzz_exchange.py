"""overlap-fuzz's generator of all_to_alls beside a dot (EXCHANGES: MoE dispatch and
combine, Ulysses, partial sums, a transposed product) on random meshes, axes, sizes and
types."""
from __future__ import annotations

import random
from dataclasses import dataclass

from .fuzz_common import AXES, DTYPES, MESHES, Generator, auto_mesh


@dataclass(frozen=True)
class ExchangeCase:
    """An all_to_all beside a dot, from one of EXCHANGES (sizes a, b, c, d per device
    and group, the exchanged dims multiples of the group)."""

    mesh: tuple[int, ...]
    axis: str
    template: str
    sizes: tuple[int, int, int, int]
    dtype: str
    shardy: bool
    seed: int
    bidirectional: bool = False    # not used by the exchange, passed as pass options
    unroll: int = 1
    target: str = ""               # the forms every backend runs

    def describe(self) -> str:
        return repr(self)


# template -> (einsum, all_to_all before ("in") or after ("out") it, split, concat,
#              operand shapes as functions of (g, a, b, c, d), their sharded dims, out spec)
EXCHANGES = {
    "dispatch": ("ecm,emh->ech", "in", 0, 1,
                 lambda g, a, b, c, d: ((g * a, b, c), (g * a, c, d)), (None, 0), (0,)),
    "ulysses": ("shd,hdf->shf", "in", 1, 0,
                lambda g, a, b, c, d: ((g * a, g * b, c), (g * b, c, d)), (0, 0), (1,)),
    "combine": ("eck,ekm->ecm", "out", 1, 0,
                lambda g, a, b, c, d: ((g * a, g * b, c), (g * a, c, d)), (0, 0), (1,)),
    # the concat dim contracted (partial sums of chunk products)
    "values": ("ekc,kd->ecd", "in", 0, 1,
               lambda g, a, b, c, d: ((g * a, b, c), (g * b, d)), (None, None), (0,)),
    # the dot's result transposed, then exchanged (Ulysses' attention output)
    "attention-out": ("hqd,de->qhe", "out", 0, 1,
                      lambda g, a, b, c, d: ((b, g * a, c), (c, d)), (None, None), (0,)),
}


def draw_exchange(rng: random.Random, seed: int) -> ExchangeCase:
    mesh = rng.choice(MESHES)
    return ExchangeCase(mesh, rng.choice(AXES[:len(mesh)]), rng.choice(sorted(EXCHANGES)),
                        tuple(rng.randint(1, 4) for _ in range(4)),
                        rng.choice(DTYPES), rng.random() < 0.5, seed)


def build_exchange(case: ExchangeCase):
    """(jitted shard_map program, inputs) for an ExchangeCase."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = AXES[:len(case.mesh)]
    mesh = auto_mesh(case.mesh)
    g = dict(zip(names, case.mesh))[case.axis]
    einsum, where, split, concat, shapes, sharded, out_dims = EXCHANGES[case.template]
    dtype = getattr(jnp, case.dtype)

    def spec(rank, dim):
        return P(*[case.axis if d == dim else None for d in range(rank)])

    def fn(x, w):
        if where == "in":
            x = jax.lax.all_to_all(x, case.axis, split, concat, tiled=True)
        y = jnp.einsum(einsum, x, w)
        return jax.lax.all_to_all(y, case.axis, split, concat, tiled=True) \
            if where == "out" else y

    global_shapes = shapes(g, *case.sizes)
    in_specs = tuple(spec(len(shape), dim) for shape, dim in zip(global_shapes, sharded))
    out_specs = spec(3, out_dims[0])
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                   check_vma=False))
    rng = np.random.default_rng(case.seed)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal(shape), dtype),
                             NamedSharding(mesh, s))
              for shape, s in zip(global_shapes, in_specs)]
    return jitted, inputs


GENERATOR = Generator("exchange", 0.10, ExchangeCase, draw_exchange,
                      build=build_exchange)
