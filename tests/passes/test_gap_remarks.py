"""Sites from real programs that stay unchanged get a precise remark, not silence: a
reduce_scatter fed by a dot through a reshape of the scattered dim (MaxText's MoE
combine), and a gather gathered again along another dim (google-research's weight
gathers over two axes)."""
import jax
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program


def sites(fn, inputs, out_specs, mesh=(8,), axes=("x",)):
    program = Program(fn, mesh, axes, inputs, out_specs)
    module = overlap_hlo.parse(program.jitted().lower(*program.args()).as_text())
    return overlap_hlo.rewrite_module(module, threshold_mib=0)


def test_a_scatter_behind_a_reshape_of_the_scattered_dim():
    def combine(h, w):   # (tokens, hidden) @ (hidden, model), tokens split into (8, t)
        y = (h @ w).reshape(8, 8, 32)
        return jax.lax.psum_scatter(y, "x", scatter_dimension=0, tiled=True)

    (site,) = [s for s in sites(combine, [((64, 64), P(None, "x")), ((64, 32), P("x"))],
                                P("x")) if s.pattern == "overlap-matmul-reduce-scatter"]
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
