"""overlap-fuzz's generator of sites wrapped in what users write around them.

A psum, all_to_all or all_gather next to a dot, with the dot or the collective wrapped
in: jnp functions that lower to calls between a psum and the next block's norm and dot
(`jnp.where`, `jnp.clip`, `jax.nn.silu`, `jax.nn.leaky_relu`, dropout); linear forms of
a product under a psum (scaled, negated, subtracted, reshaped, transposed, scaled by a
replicated input) and nonlinear ones (a maximum, a product with a split input);
zero-size tensors; a multi-platform export (cpu and tpu); two collectives of one
product (dispatch and combine around one einsum, two psums over two mesh axes); a
lax.cond on a predicate the shard_map receives whole or split; nested jax.jit calls.
Each either becomes a ring or is named in a remark; overlap-fuzz checks which.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .fuzz_common import Generator, auto_mesh

# form -> the kinds of collective it wraps
FORMS = {
    "between": ("psum",),
    "linear": ("psum",),
    "nonlinear": ("psum",),
    "zero_size": ("psum", "all_to_all", "all_gather"),
    "multi_platform": ("psum", "all_to_all", "all_gather"),
    "two_collectives": ("all_to_all", "psum"),
    "predicate": ("psum", "all_gather"),
    "nested_jit": ("psum", "all_to_all", "all_gather"),
}
BETWEEN = ("where", "clip", "silu", "leaky_relu", "dropout")
LINEAR = ("scaled", "negated", "difference", "from_a_term", "by_a_replicated_input",
          "reshaped", "transposed")
NONLINEAR = ("maximum", "by_a_split_input")
GROUPS = (2, 4, 8)


@dataclass(frozen=True)
class WrappedCase:
    """A site of `kind` wrapped in `form` (`variant` picks among its forms) over a
    group of `group` devices (a 2-D mesh for two psums), sizes per device."""

    form: str
    kind: str
    variant: str
    group: int
    sizes: tuple[int, int, int]
    dtype: str
    shardy: bool
    seed: int
    bidirectional: bool = False
    unroll: int = 1
    target: str = ""

    @property
    def platforms(self) -> tuple[str, ...]:
        return ("cpu", "tpu") if self.form == "multi_platform" else ()

    def describe(self) -> str:
        return repr(self)


def draw_wrapped(rng: random.Random, seed: int) -> WrappedCase:
    form = rng.choice(sorted(FORMS))
    variant = {"between": BETWEEN, "linear": LINEAR, "nonlinear": NONLINEAR,
               "predicate": ("replicated", "split")}.get(form, ("",))
    return WrappedCase(form, rng.choice(FORMS[form]), rng.choice(variant),
                       rng.choice(GROUPS), tuple(rng.randint(1, 4) for _ in range(3)),
                       rng.choice(("float32", "float32", "bfloat16")),
                       form in ("between", "two_collectives", "multi_platform") or rng.random() < 0.5,
                       seed,
                       rng.random() < 0.5, rng.choice((1, 1, 2)))


def build_wrapped(case: WrappedCase):
    """(jitted shard_map program, inputs) for a WrappedCase."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    g = case.group
    a, b, c = case.sizes
    two_axes = case.form == "two_collectives" and case.kind == "psum"
    mesh = auto_mesh((2, 4) if two_axes else (g,))
    axis = ("x", "y") if two_axes else "x"
    if two_axes:
        g = 8
    fn, specs, shapes, out = _program(case, axis, g, a, b, c)
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(specs), out_specs=out,
                                   check_vma=False))
    rng = np.random.default_rng(case.seed)
    dtype = getattr(jnp, case.dtype)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal(shape)
                                         / math.sqrt(max(shape[-1], 1)), dtype),
                             NamedSharding(mesh, spec))
              for shape, spec in zip(shapes, specs)]
    return jitted, inputs


def _program(case: WrappedCase, axis, g: int, a: int, b: int, c: int):
    """(fn, in_specs, global shapes, out_specs)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    psum = jax.lax.psum
    rows, k, n = 8 * a, 8 * b, 8 * c
    row_parallel = [(rows, g * k), (g * k, n)]
    row_specs = [P(None, axis), P(axis, None)]
    exchange = [(g * g * a, 4 * b, 8 * c), (8 * c, 8 * c)]
    exchange_specs = [P(axis), P()]

    def einsum(y, w):
        return jnp.einsum("ecd,df->ecf", y, w)

    def a2a(v):
        return jax.lax.all_to_all(v, axis, 0, 0, tiled=True)

    def gather(v):
        return jax.lax.all_gather(v, axis, axis=0, tiled=True)

    form, kind, variant = case.form, case.kind, case.variant
    if form == "between":
        return _between(case, axis, g, a, b, c)
    if form in ("linear", "nonlinear"):
        terms = _term(variant)
        split = variant == "by_a_split_input"
        return ((lambda *v: psum(terms(*v), axis)), row_specs * 2 + [P(axis) if split else P()],
                row_parallel * 2 + [((g if split else 1) * rows, n)], P())
    if form == "zero_size":
        if kind == "psum":
            return ((lambda x, w: psum(x @ w, axis)), row_specs, [(0, g * k), (g * k, n)], P())
        if kind == "all_to_all":
            return ((lambda x, w: einsum(a2a(x), w)), exchange_specs,
                    [(g * g * a, 0, 8 * c), (8 * c, 8 * c)], P(axis))
        return ((lambda x, w: gather(x) @ w), [P(axis), P()], [(g * a, 0), (0, n)], P())
    if form == "predicate":
        return _predicate(case, axis, g, (a, k, n), row_specs, row_parallel)
    if form == "two_collectives":
        if kind == "all_to_all":
            return ((lambda x, w: a2a(einsum(a2a(x), w))), exchange_specs, exchange, P(axis))

        def fn(x, w):
            y = x @ w
            return psum(y, "x"), psum(y, "y")
        return fn, row_specs, row_parallel, (P(), P())
    wrap = jax.jit if form == "nested_jit" else (lambda f: f)
    if kind == "psum":
        matmul = wrap(lambda x, w: x @ w)
        return ((lambda x, w: psum(matmul(x, w), axis)), row_specs, row_parallel, P())
    if kind == "all_to_all":
        inner = wrap(einsum)
        return ((lambda x, w: inner(a2a(x), w)), exchange_specs, exchange, P(axis))
    matmul = wrap(lambda x, w: x @ w)
    return ((lambda x, w: matmul(gather(x), w)), [P(axis), P()],
            [(g * rows, k), (k, n)], P())


def _term(variant: str):
    """The product under a psum, of (x, w, x2, w2, r), in a linear or nonlinear form."""
    import jax.numpy as jnp

    return {
        "scaled": lambda x, w, x2, w2, r: 2 * (x @ w),
        "negated": lambda x, w, x2, w2, r: -(x @ w),
        "difference": lambda x, w, x2, w2, r: x @ w - x2 @ w2,
        "from_a_term": lambda x, w, x2, w2, r: r - x @ w,
        "by_a_replicated_input": lambda x, w, x2, w2, r: (x @ w) * r,
        "reshaped": lambda x, w, x2, w2, r: (x @ w).reshape(-1),
        "transposed": lambda x, w, x2, w2, r: (x @ w).T,
        "maximum": lambda x, w, x2, w2, r: jnp.maximum(x @ w, r),
        "by_a_split_input": lambda x, w, x2, w2, r: (x @ w) * r,
    }[variant]


def _predicate(case: WrappedCase, axis, g: int, sizes, row_specs, row_parallel):
    """A lax.cond on a predicate the shard_map receives whole or split, around a psum of
    a product or a dot of a gathered operand."""
    import jax
    from jax.sharding import PartitionSpec as P

    a, k, n = sizes
    p_spec, p_shape = (P(axis), (g,)) if case.variant == "split" else (P(), (1,))
    if case.kind == "psum":
        def fn(p, x, w):
            return jax.lax.cond(p[0] > 0, lambda: jax.lax.psum(x @ w, axis),
                                lambda: jax.lax.psum(x @ (2 * w), axis))
        return fn, [p_spec] + row_specs, [p_shape] + row_parallel, P()

    def fn(p, x, w):
        h = jax.lax.all_gather(x, axis, axis=0, tiled=True)
        return jax.lax.cond(p[0] > 0, lambda: h @ w, lambda: h @ (2 * w))
    return fn, [p_spec, P(axis), P()], [p_shape, (g * a * 8, k), (k, n)], P()


def _between(case: WrappedCase, axis, g: int, a: int, b: int, c: int):
    """Two Megatron sublayers with a jnp function between them."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    between = {
        "where": lambda h: jnp.where(h > 0, h, 0.1 * h),
        "clip": lambda h: jnp.clip(h, -1.0, 1.0),
        "silu": jax.nn.silu,
        "leaky_relu": jax.nn.leaky_relu,
        "dropout": lambda h: jnp.where(jnp.abs(h) > 0.05, h / 0.9, 0),
    }[case.variant]

    def norm(h):
        return h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5)

    def fn(x, w1, w2, w3, w4):
        x = between(x + jax.lax.psum(jax.nn.gelu(norm(x) @ w1) @ w2, axis))
        return x + jax.lax.psum(jax.nn.gelu(norm(x) @ w3) @ w4, axis)

    rows, model, hidden = g * a, 8 * b, g * c
    specs = [P(), P(None, axis), P(axis, None), P(None, axis), P(axis, None)]
    shapes = [(rows, model), (model, hidden), (hidden, model), (model, hidden),
              (hidden, model)]
    return fn, specs, shapes, P()


GENERATOR = Generator("wrapped", 0.15, WrappedCase, draw_wrapped,
                      build=build_wrapped)
