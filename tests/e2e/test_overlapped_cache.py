"""overlap(): executables keyed as jax.jit keys its own (weak types, static arguments,
the configuration that affects lowering), Python scalars traced, a bounded cache, and
a clear error for JAX transformations; rewrite_exported's backward module."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import overlap_hlo
from overlap_hlo import api
from harness import assert_close, auto_axis_types, gathered_dot, op_counts


@pytest.fixture(scope="module")
def mesh():
    return jax.sharding.Mesh(np.array(jax.devices()), ("x",), **auto_axis_types(1))


def scaled_layer(mesh, dtype=jnp.bfloat16):
    """all_gather -> dot, times a scalar argument; inputs in `dtype`."""
    def body(x, w, scale):
        return (jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w) * scale

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=P(),
                               check_vma=False))
    rng = np.random.default_rng(0)
    x = jax.device_put(jnp.asarray(rng.standard_normal((64, 32)), dtype),
                       NamedSharding(mesh, P("x")))
    w = jax.device_put(jnp.asarray(rng.standard_normal((32, 16)), dtype),
                       NamedSharding(mesh, P()))
    return fn, x, w


def test_weak_and_strong_scalars_get_their_own_executables(mesh):
    fn, x, w = scaled_layer(mesh)
    step = overlap_hlo.overlap(fn, threshold_mib=0)
    strong = step(x, w, jnp.float32(0.1))           # promotes the product to float32
    weak = step(x, w, jnp.asarray(0.1))             # weakly typed: stays bfloat16
    assert strong.dtype == fn(x, w, jnp.float32(0.1)).dtype == jnp.float32
    assert weak.dtype == fn(x, w, jnp.asarray(0.1)).dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(weak, np.float32),
                               np.asarray(fn(x, w, jnp.asarray(0.1)), np.float32))
    assert len(step._compiled) == 2


def test_python_scalars_are_traced_not_compiled_in(mesh):
    fn, x, w = scaled_layer(mesh)
    step = overlap_hlo.overlap(fn, threshold_mib=0)
    for lr in (0.1, 0.2, 0.3):
        np.testing.assert_allclose(np.asarray(step(x, w, lr), np.float32),
                                   np.asarray(fn(x, w, lr), np.float32))
    assert len(step._compiled) == 1


def test_lowering_context_is_part_of_the_key(mesh):
    fn, x, w = scaled_layer(mesh, jnp.float32)
    step = overlap_hlo.overlap(fn, threshold_mib=0)
    step(x, w, 1.0)
    with jax.default_matmul_precision("highest"):
        step(x, w, 1.0)
    assert len(step._compiled) == 2
    step(x, w, 2.0)
    assert len(step._compiled) == 2


def test_static_arguments(mesh):
    fn, x, w = scaled_layer(mesh, jnp.float32)

    def scaled(x, w, times, *, offset=0.0):
        return fn(x, w, 1.0) * times + offset

    jitted = jax.jit(scaled, static_argnums=(2,), static_argnames=("offset",))
    step = overlap_hlo.overlap(jitted, threshold_mib=0)
    for times, offset in ((3, 0.5), (3, 0.5), (4, 0.5), (4, 1.5)):
        assert_close(step(x, w, times, offset=offset), jitted(x, w, times, offset=offset),
                     (jnp.float32,))
    assert len(step._compiled) == 3
    with pytest.raises(ValueError, match="hashable"):
        step(x, w, [3])


def test_cache_is_bounded(mesh, monkeypatch):
    monkeypatch.setattr(api, "MAX_EXECUTABLES", 2)
    fn, x, w = scaled_layer(mesh, jnp.float32)
    step = overlap_hlo.overlap(fn, threshold_mib=0)
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        step(x, w, jnp.asarray(1.0, dtype))
    assert len(step._compiled) == 2


TRANSFORMS = {
    "grad": lambda f, x, w: jax.grad(lambda x: f(x, w, 1.0).sum())(x),
    "vmap": lambda f, x, w: jax.vmap(lambda w: f(x, w, 1.0))(jnp.stack([w, w])),
    "eval_shape": lambda f, x, w: jax.eval_shape(f, x, w, 1.0),
    "jit": lambda f, x, w: jax.jit(lambda x: f(x, w, 1.0))(x),
}


@pytest.mark.parametrize("name", TRANSFORMS)
def test_transformations_fail_before_any_work(mesh, monkeypatch, name):
    fn, x, w = scaled_layer(mesh, jnp.float32)
    step = overlap_hlo.overlap(fn, threshold_mib=0)
    monkeypatch.setattr(step, "_lower", lambda *a, **k: pytest.fail("lowered"))
    with pytest.raises(TypeError, match="cannot be transformed"):
        TRANSFORMS[name](step, x, w)


def test_rewrite_exported_rewrites_the_backward_module(mesh):
    fn, x, w = gathered_dot(mesh, seed=1)
    exported = jax.export.export(fn)(x, w)
    new = overlap_hlo.rewrite_exported(exported, threshold_mib=0)

    def counts(exp):
        return op_counts(overlap_hlo.parse(exp.vjp().mlir_module()))

    before, after = counts(exported), counts(new)
    assert after["stablehlo.collective_permute"] > 0
    collectives = ("stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_reduce")
    assert sum(after[c] for c in collectives) < sum(before[c] for c in collectives)
    want = jax.grad(lambda a, b: exported.call(a, b).sum(), argnums=(0, 1))(x, w)
    got = jax.grad(lambda a, b: new.call(a, b).sum(), argnums=(0, 1))(x, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-5)
    back = jax.export.deserialize(new.serialize(vjp_order=1))
    assert op_counts(overlap_hlo.parse(back.vjp().mlir_module()))[
        "stablehlo.collective_permute"] == after["stablehlo.collective_permute"]
