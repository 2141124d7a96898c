"""Bidirectional rings and unrolling, on every pattern variant and group layout."""
import itertools

import jax
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, check, permutes, ring_pipeline
from test_differential import GATHER_CASES, LAYOUTS, SCATTER_CASES, VIEW_CASES

OPTION_SETS = [dict(bidirectional=bidi, unroll=unroll)
               for bidi, unroll in itertools.product((False, True), (1, 2, 3))]


def pipeline(bidirectional: bool, unroll: int) -> str:
    return ring_pipeline(bidirectional, unroll)


def option_id(options):
    return ("bidi" if options["bidirectional"] else "uni") + f"-unroll{options['unroll']}"


VARIANTS = {**{f"gather-{k}": v for k, v in GATHER_CASES.items()},
            **{f"scatter-{k}": v for k, v in SCATTER_CASES.items()},
            **{f"view-{k}": v for k, v in VIEW_CASES.items()}}


@pytest.mark.parametrize("options", [o for o in OPTION_SETS if o["unroll"] < 3], ids=option_id)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants(variant, options):
    fn, inputs, out_specs = VARIANTS[variant]
    dtype = jax.numpy.bfloat16 if variant == "view-gather-convert" else jax.numpy.float32
    check(Program(fn, (4, 2), ("x", "y"), inputs, out_specs, dtype=dtype),
          pipeline=pipeline(**options))


@pytest.mark.parametrize("options", OPTION_SETS, ids=option_id)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts(layout, options):
    mesh_shape, axes, axis = LAYOUTS[layout]

    def mlp(x, w1, w2):
        h = jax.lax.all_gather(x, axis, axis=0, tiled=True) @ w1
        return jax.lax.psum_scatter(jax.nn.relu(h) @ w2, axis, scatter_dimension=0, tiled=True)

    inputs = [((64, 32), P(axis)), ((32, 48), P(None, axis)), ((48, 32), P(axis))]
    prog = Program(mlp, mesh_shape, axes, inputs, P(axis))
    check(prog, rewritten=2, pipeline=pipeline(**options))
    # Both ring directions carry data when bidirectional (and the groups exceed 2).
    lowered = prog.jitted().lower(*prog.args())
    module = overlap_hlo.parse(lowered.as_text())
    overlap_hlo.rewrite_module(module, pipeline(**options), threshold_mib=0)
    directions = {pairs for _, pairs in permutes(module)}
    group = prog.mesh().shape[axis] if isinstance(axis, str) else 4
    assert len(directions) == (2 if options["bidirectional"] and group > 2 else 1)
