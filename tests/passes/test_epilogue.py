"""Elementwise epilogues of an all_gather ring's dots run on each block: the ring
keeps one buffer for a gated MLP's silu(gate) * up instead of one per dot, with the
numbers of the original; anything else reading a product, or a non-elementwise op,
keeps the products whole."""
import jax
import pytest
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir

import overlap_hlo
from harness import Program, check

GATED = """module attributes {{mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<2x16xf32>, %wg: tensor<16x8xf32>, %wu: tensor<16x8xf32>) -> {results} {{
    %g = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %a = stablehlo.dot_general %g, %wg, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %u = stablehlo.dot_general %g, %wu, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    {body}
  }}
  func.func private @silu(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {{
    %0 = stablehlo.negate %arg0 : tensor<8x8xf32>
    %1 = stablehlo.exponential %0 : tensor<8x8xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x8xf32>
    %3 = stablehlo.add %2, %1 : tensor<8x8xf32>
    %4 = stablehlo.divide %2, %3 : tensor<8x8xf32>
    %5 = stablehlo.multiply %arg0, %4 : tensor<8x8xf32>
    return %5 : tensor<8x8xf32>
  }}
}}"""

SILU_TIMES_UP = """%s = func.call @silu(%a) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %h = stablehlo.multiply %s, %u : tensor<8x8xf32>
    return %h : tensor<8x8xf32>"""


def module(body: str, results: str = "tensor<8x8xf32>") -> ir.Module:
    return overlap_hlo.parse(GATED.format(body=body, results=results))


def loop_carried_full_tensors(mod: ir.Module) -> int:
    """Loop-carried values of the products' full shape (8x8) in the ring's while."""
    found = []

    def visit(op):
        if op.name == "stablehlo.while":
            found.append(sum(1 for v in op.operands if list(v.type.shape) == [8, 8]))
        return ir.WalkResult.ADVANCE

    mod.operation.walk(visit)
    (count,) = found
    return count


def ops_named(mod: ir.Module, name: str, shape: list[int]) -> int:
    """Ops `name` with a result of `shape` in @f (not in the private @silu)."""
    found = 0

    def visit(op):
        nonlocal found
        found += op.name == name and list(op.results[0].type.shape) == shape
        return ir.WalkResult.ADVANCE

    (f,) = [op for op in mod.body.operations
            if ir.StringAttr(op.attributes["sym_name"]).value == "f"]
    f.operation.walk(visit)
    return found


def test_silu_times_up_runs_on_blocks_with_one_buffer():
    mod = module(SILU_TIMES_UP)
    (site,) = overlap_hlo.rewrite_module(mod, threshold_mib=0)
    assert site.applied and "elementwise epilogue of 2 of its dots (2 op(s))" in site.detail
    assert loop_carried_full_tensors(mod) == 1
    # The epilogue runs on 2x8 blocks (the call inlined); nothing multiplies whole tensors.
    assert ops_named(mod, "stablehlo.multiply", [8, 8]) == 0
    assert ops_named(mod, "stablehlo.exponential", [2, 8]) == 3   # round 0, loop, last
    assert ops_named(mod, "func.call", [8, 8]) == 0


@pytest.mark.parametrize("body, reason", [
    ("""%h = stablehlo.multiply %a, %u : tensor<8x8xf32>
    return %h, %a : tensor<8x8xf32>, tensor<8x8xf32>""", "a product is also returned"),
    ("""%t = stablehlo.transpose %a, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %h = stablehlo.multiply %t, %u : tensor<8x8xf32>
    return %h, %a : tensor<8x8xf32>, tensor<8x8xf32>""", "a transpose is not elementwise"),
    ("""%h = stablehlo.multiply %a, %u : tensor<8x8xf32>
    %k = stablehlo.add %a, %u : tensor<8x8xf32>
    return %h, %k : tensor<8x8xf32>, tensor<8x8xf32>""", "two values leave the epilogue"),
])
def test_products_stay_whole_when_the_epilogue_does_not_own_them(body, reason):
    mod = module(body, results="(tensor<8x8xf32>, tensor<8x8xf32>)")
    (site,) = overlap_hlo.rewrite_module(mod, threshold_mib=0)
    assert site.applied and "epilogue" not in site.detail, reason
    assert loop_carried_full_tensors(mod) == 2, reason


def test_non_splat_constant_operand_keeps_products_whole():
    body = """%c = stablehlo.constant dense<[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]> : tensor<8x8xf32>
    %m = stablehlo.multiply %a, %c : tensor<8x8xf32>
    %h = stablehlo.multiply %m, %u : tensor<8x8xf32>
    return %h : tensor<8x8xf32>"""
    mod = module(body)
    (site,) = overlap_hlo.rewrite_module(mod, threshold_mib=0)
    assert site.applied and "epilogue" not in site.detail
    assert loop_carried_full_tensors(mod) == 2


@pytest.mark.parametrize("options", [{}, {"bidirectional": True}, {"unroll": 2},
                                     {"bidirectional": True, "unroll": 3}])
def test_gated_mlp_numbers_match_in_every_option(options):
    """silu(g @ wg) * (g @ wu) with the gather on the sequence dim (free), and a
    convert and a constant in the epilogue, on 8 host devices."""
    def gated(x, wg, wu):
        g = jax.lax.all_gather(x, "x", axis=0, tiled=True)
        return (jax.nn.silu(g @ wg) * (g @ wu) * 0.5).astype(jax.numpy.bfloat16)

    inputs = [((64, 16), P("x")), ((16, 32), P(None, "x")), ((16, 32), P(None, "x"))]
    given = " ".join(f"{k}={str(v).lower()}" for k, v in options.items())
    pipeline = (f"builtin.module(overlap-all-gather-matmul{{{given}}},canonicalize,cse)"
                if given else "builtin.module(overlap-all-gather-matmul,canonicalize,cse)")
    program = Program(gated, (8,), ("x",), inputs, P(None, "x"))
    counts = check(program, pipeline=pipeline)
    assert counts["stablehlo.while"] <= 1 and counts["stablehlo.all_gather"] == 0
    (site,) = overlap_hlo.remarks(program.jitted().lower(*program.args()).as_text(),
                                  pipeline, threshold_mib=0)
    assert "elementwise epilogue of 2 of its dots" in site.detail, site.detail
