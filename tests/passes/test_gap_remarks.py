"""Sites from real programs: a reduce_scatter fed by a dot through a reshape of the
scattered dim (MaxText's MoE combine) is decomposed when each device's block is
contiguous rows of the dot's result, and stays with a precise remark otherwise; a gather
gathered again along another dim (google-research's weight gathers over two axes) keeps
its inner gather, with a remark."""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, check


def sites(fn, inputs, out_specs, mesh=(8,), axes=("x",)):
    program = Program(fn, mesh, axes, inputs, out_specs)
    module = overlap_hlo.parse(program.jitted().lower(*program.args()).as_text())
    return overlap_hlo.rewrite_module(module, threshold_mib=0)


def split_tokens(h, w):   # (tokens, hidden) @ (hidden, model), tokens split into (8, t)
    y = (h @ w).reshape(8, 8, 32)
    return jax.lax.psum_scatter(y, "x", scatter_dimension=0, tiled=True)


def merge_batch(h, w):    # (batch, seq) merged into one scattered dim; batch divides by 8
    y = jnp.einsum("btk,km->btm", h, w).reshape(-1, 32)
    return jax.lax.psum_scatter(y, "x", scatter_dimension=0, tiled=True)


@pytest.mark.parametrize("fn, inputs", [
    (split_tokens, [((64, 64), P(None, "x")), ((64, 32), P("x"))]),
    (merge_batch, [((8, 8, 64), P(None, None, "x")), ((64, 32), P("x"))]),
], ids=["split", "merge"])
def test_a_scatter_behind_a_reshape_of_the_scattered_dim(fn, inputs):
    """The reduce_scatter moves before the reshape (the same rows on each device) and
    becomes a ring."""
    check(Program(fn, (8,), ("x",), inputs, P("x")))


def test_a_reshape_that_interleaves_the_blocks_stays_with_a_remark():
    """Batch 4 and 16 positions merged, scattered over 8: a device's rows are half a
    batch element, not a block of either dim of the dot's result."""
    (site,) = [s for s in sites(merge_batch, [((4, 16, 64), P(None, None, "x")),
                                              ((64, 32), P("x"))], P("x"))
               if s.pattern == "overlap-matmul-reduce-scatter"]
    assert not site.applied and site.kind == "reshape of the scattered dim"
    assert "through a reshape" in site.reason


def test_a_gather_gathered_again_along_another_dim():
    def weights(x, w):
        inner = jax.lax.all_gather(w, "x", axis=0, tiled=True)
        return x @ jax.lax.all_gather(inner, "y", axis=1, tiled=True)

    found = sites(weights, [((16, 64), P()), ((64, 32), P("x", "y"))], P(), mesh=(4, 2),
                  axes=("x", "y"))
    inner = [s for s in found if s.kind == "gather of a gather along another dim"]
    assert len(inner) == 1 and not inner[0].applied
    assert "gathers it again along dim 1" in inner[0].reason
    assert any(s.applied for s in found)       # the outer gather is decomposed
