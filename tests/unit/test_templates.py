"""Rings cloned from templates (overlap_hlo/rewrite/templates.py): the layers of an
unrolled model get one ring built and the rest cloned, byte for byte what building each
would give; a signature that misses what a builder reads is caught by the check mode
the test suite runs in, and the site is left unchanged as an internal error."""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import overlap_hlo
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite import templates


def layers_text(activations) -> str:
    """A shard_map of one sequence-parallel MLP layer per activation (two sites each)."""
    mesh = jax.make_mesh((8,), ("x",))
    count = len(activations)

    def mlp(x, w1, w2):
        for i, act in enumerate(activations):
            h = jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w1[i]
            x = x + jax.lax.psum_scatter(act(h) @ w2[i], "x", scatter_dimension=0,
                                         tiled=True)
        return x

    specs = (P("x"), P(None, None, "x"), P(None, "x"))
    shapes = [(64, 32), (count, 32, 64), (count, 64, 32)]
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
            for s, spec in zip(shapes, specs)]
    fn = jax.jit(jax.shard_map(mlp, mesh=mesh, in_specs=specs, out_specs=P("x")))
    return fn.lower(*args).as_text(debug_info=True)


def rewritten(text: str):
    module = overlap_hlo.parse(text)
    sites = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=True)
    return overlap_hlo.serialize(module), sites


def test_clones_are_what_building_each_site_gives(monkeypatch):
    text = layers_text([jnp.tanh] * 4)
    counts = {"record": 0, "clone": 0}
    record, clone = templates.Templates._record, templates.Templates._clone

    def counting(name, method):
        def wrapped(self, *args):
            counts[name] += 1
            return method(self, *args)
        return wrapped

    monkeypatch.setattr(templates.Templates, "_record", counting("record", record))
    monkeypatch.setattr(templates.Templates, "_clone", counting("clone", clone))
    cloned, sites = rewritten(text)
    assert overlap_hlo.rewrite_summary(sites) == "8 of 8 sites rewritten"
    assert counts == {"record": 2, "clone": 6}   # a gather and a scatter ring built
    monkeypatch.setattr(templates.Templates, "build",
                        lambda self, parts, inputs, make: make())
    built, _ = rewritten(text)
    assert cloned == built


def test_layers_that_differ_get_their_own_rings(monkeypatch):
    """The gather ring's epilogue (tanh, exp) is in its signature: two templates each."""
    monkeypatch.setenv("OVERLAP_HLO_CHECK_TEMPLATES", "1")
    text = layers_text([jnp.tanh, jnp.exp, jnp.tanh, jnp.exp])
    cloned, sites = rewritten(text)
    assert overlap_hlo.rewrite_summary(sites) == "8 of 8 sites rewritten"
    monkeypatch.setattr(templates.Templates, "build",
                        lambda self, parts, inputs, make: make())
    assert rewritten(text)[0] == cloned


def test_a_signature_missing_what_the_builder_reads_is_caught(monkeypatch):
    monkeypatch.setenv("OVERLAP_HLO_CHECK_TEMPLATES", "1")
    monkeypatch.setattr(templates, "signature", lambda parts: "the same for every site")
    _, sites = rewritten(layers_text([jnp.tanh, jnp.exp]))
    broken = [site for site in sites if not site.applied]
    assert broken and all(site.kind == Kind.INTERNAL_ERROR for site in broken)
    assert any("a cloned ring differs from a fresh build" in site.reason for site in broken)


@pytest.mark.parametrize("value", [object(), lambda: None])
def test_what_has_no_signature_is_built_not_cloned(value):
    with pytest.raises(TypeError):
        templates.signature((1, value))


def _layer_a(x, w1, w2):
    h = jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w1
    return x + jax.lax.psum_scatter(jnp.tanh(h) @ w2, "x", scatter_dimension=0, tiled=True)


def _layer_b(x, w1, w2):
    h = jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w1
    return x + jax.lax.psum_scatter(jnp.tanh(h) @ w2, "x", scatter_dimension=0, tiled=True)


def test_clones_take_each_site_location(monkeypatch):
    """Layers at source lines A, B, A: each clone carries its own site's location (a
    template keeps the last one it was given, set again only when it differs)."""
    monkeypatch.setenv("OVERLAP_HLO_CHECK_TEMPLATES", "1")   # clone == fresh build, locations too
    mesh = jax.make_mesh((8,), ("x",))

    def mlp(x, w1, w2):
        for i in range(3):
            x = (_layer_b if i == 1 else _layer_a)(x, w1[i], w2[i])
        return x

    specs = (P("x"), P(None, None, "x"), P(None, "x"))
    shapes = [(64, 32), (3, 32, 64), (3, 64, 32)]
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
            for s, spec in zip(shapes, specs)]
    fn = jax.jit(jax.shard_map(mlp, mesh=mesh, in_specs=specs, out_specs=P("x")))
    module = overlap_hlo.parse(fn.lower(*args).as_text(debug_info=True))
    sites = overlap_hlo.rewrite_module(module, threshold_mib=0)
    assert overlap_hlo.rewrite_summary(sites) == "6 of 6 sites rewritten"
    gathers = [s.where.line for s in sites if s.pattern == "overlap-all-gather-matmul"]
    assert gathers[0] == gathers[2] != gathers[1]
