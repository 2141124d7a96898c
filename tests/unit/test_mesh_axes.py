"""Replica groups given as mesh axes (`#stablehlo.replica_group_mesh_axes`, JAX >= 0.11).

Hand-written modules run on both JAX versions: XLA reads the original's mesh axes
itself, so a ring built from wrong groups shows up as a numeric mismatch on the 8
host devices. JAX-exported programs (mesh axes under 0.12, dense groups under 0.10)
cover permuted device orders, strided and multi-axis groups and manual bodies.
"""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir

import overlap_hlo
from harness import (Program, check, mesh_axes_forms, op_counts, permutes, ring_pipeline,
                     run_spmd_module)
from overlap_hlo.groups.meshes import Mesh, dense_groups

MODULE = """
module @m attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh_0 = <[{mesh}]{device_ids}>
  func.func public @main(%x: tensor<{xs}x16xf32> {{mhlo.sharding = "{{manual}}"}}, %w: tensor<16x8xf32> {{mhlo.sharding = "{{manual}}"}}) -> (tensor<{ys}x8xf32> {{mhlo.sharding = "{{manual}}"}}) {{
    {body}
  }}
}}
"""
GATHER_BODY = """%0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = {groups}, use_global_device_ids}}> : (tensor<{xs}x16xf32>) -> tensor<{ys}x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{ys}x16xf32>, tensor<16x8xf32>) -> tensor<{ys}x8xf32>
    return %1 : tensor<{ys}x8xf32>"""
SCATTER_BODY = """%0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{xs}x16xf32>, tensor<16x8xf32>) -> tensor<{xs}x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{{scatter_dimension = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = {groups}, use_global_device_ids}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }}) : (tensor<{xs}x8xf32>) -> tensor<{ys}x8xf32>
    return %1 : tensor<{ys}x8xf32>"""

MESHES = {"2x4": (("a", 2), ("b", 4)), "2x2x2": (("a", 2), ("b", 2), ("c", 2)),
          "8": (("x", 8),)}

# name -> (mesh, referenced axes: (name, (pre, size) or None))
LAYOUTS = {
    "leading-axis": ("2x4", [("a", None)]),          # strided groups [[0,4],[1,5],...]
    "minor-axis": ("2x4", [("b", None)]),
    "two-axes": ("2x4", [("a", None), ("b", None)]),
    "two-axes-reversed": ("2x4", [("b", None), ("a", None)]),
    "3d-middle": ("2x2x2", [("b", None)]),
    "3d-outer-two": ("2x2x2", [("c", None), ("a", None)]),
    "sub-axis-major": ("8", [("x", (1, 4))]),
    "sub-axis-minor": ("8", [("x", (2, 4))]),
    "sub-axis-and-axis": ("2x4", [("b", (2, 2)), ("a", None)]),
}


def axis_ref(name, info):
    sub = "" if info is None else f", sub_axis_info = ({info[0]}){info[1]}"
    return f'#stablehlo.axis_ref<name = "{name}"{sub}>'


def mesh_text(mesh):
    return ", ".join(f'"{name}"={size}' for name, size in mesh)


def group_size(mesh, refs):
    sizes = dict(mesh)
    return int(np.prod([sizes[n] if i is None else i[1] for n, i in refs]))


def module(kind, mesh, groups, n, device_ids=""):
    shard, full = (2, 2 * n) if kind == "gather" else (2 * n, 2)
    body = (GATHER_BODY if kind == "gather" else SCATTER_BODY).format(groups=groups, xs=shard,
                                                                      ys=full)
    return MODULE.format(mesh=mesh_text(mesh), device_ids=device_ids, xs=shard, ys=full,
                         body=body)


def mesh_axes_module(kind, layout):
    mesh_name, refs = LAYOUTS[layout]
    mesh = MESHES[mesh_name]
    groups = ("#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = ["
              + ", ".join(axis_ref(*r) for r in refs) + "]>")
    return module(kind, mesh, groups, group_size(mesh, refs))


def dense_module(kind, layout):
    mesh_name, refs = LAYOUTS[layout]
    groups = np.array(dense_groups(Mesh(MESHES[mesh_name]), refs))
    attr = f"dense<{groups.tolist()}> : tensor<{groups.shape[0]}x{groups.shape[1]}xi64>"
    return module(kind, MESHES[mesh_name], attr, groups.shape[1])


def test_rule_on_a_2x4_mesh():
    """The groups XLA compiles for a=2, b=4 (checked with dense groups under 0.12)."""
    mesh = Mesh((("a", 2), ("b", 4)))
    assert dense_groups(mesh, [("a", None)]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dense_groups(mesh, [("b", None)]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert dense_groups(mesh, [("b", None), ("a", None)]) == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert dense_groups(mesh, []) == [[d] for d in range(8)]
    assert dense_groups(mesh, [("b", (1, 2))]) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dense_groups(mesh, [("b", (2, 2))]) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def pipeline(bidirectional, unroll):
    return ring_pipeline(bidirectional, unroll, "threshold-mib=0")


def rewrite(text, bidirectional=False, unroll=1):
    mod = overlap_hlo.parse(text)
    sites = overlap_hlo.rewrite_module(mod, pipeline(bidirectional, unroll))
    return mod, sites


CASES = ([(kind, layout, False, 1) for kind in ("gather", "scatter") for layout in LAYOUTS]
         + [(kind, layout, True, 2) for kind in ("gather", "scatter")
            for layout in ("leading-axis", "two-axes-reversed", "sub-axis-minor")])


@pytest.mark.parametrize("kind,layout,bidirectional,unroll", CASES,
                         ids=[f"{k}-{l}" + ("-bidi-unroll2" if b else "") for k, l, b, _ in CASES])
def test_runs_like_xla_reads_the_mesh_axes(kind, layout, bidirectional, unroll):
    text = mesh_axes_module(kind, layout)
    mod, sites = rewrite(text, bidirectional, unroll)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]
    counts = op_counts(mod)
    assert counts["stablehlo.all_gather"] == counts["stablehlo.reduce_scatter"] == 0
    rng = np.random.default_rng(0)
    shard = 2 if kind == "gather" else 2 * group_size(MESHES[LAYOUTS[layout][0]],
                                                       LAYOUTS[layout][1])
    inputs = [rng.standard_normal((8, shard, 16), np.float32),
              rng.standard_normal((8, 16, 8), np.float32)]
    want = run_spmd_module(text, 1, 8, inputs)[0]
    got = run_spmd_module(overlap_hlo.serialize(mod), 1, 8, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["gather", "scatter"])
def test_inline_mesh(kind):
    """A mesh written inline in the attribute reads like a referenced one. (XLA 0.10
    resolves an inline mesh against the module's `sdy.mesh`: they agree here.)"""
    groups = ("#stablehlo.replica_group_mesh_axes<mesh = #stablehlo.mesh<axes = "
              "[<name = \"x\", size = 4>, <name = \"y\", size = 2>]>, axes = "
              "[#stablehlo.axis_ref<name = \"x\">]>")
    text = module(kind, (("x", 4), ("y", 2)), groups, 4)
    mod, sites = rewrite(text)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((8, 2 if kind == "gather" else 8, 16), np.float32),
              rng.standard_normal((8, 16, 8), np.float32)]
    want = run_spmd_module(text, 1, 8, inputs)[0]
    got = run_spmd_module(overlap_hlo.serialize(mod), 1, 8, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def constants(mod):
    """Every integer constant table the rewrite built (the position tables among them)."""
    found = []

    def visit(op):
        if op.name == "stablehlo.constant":
            value = op.attributes["value"]
            if isinstance(value, ir.DenseIntElementsAttr):
                found.append(np.array(value).tolist())
        return ir.WalkResult.ADVANCE

    mod.operation.walk(visit)
    return found


@pytest.mark.parametrize("kind", ["gather", "scatter"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_same_ring_as_the_dense_groups(kind, layout):
    """Permute pairs, channel handles and position tables equal the dense form's."""
    got, _ = rewrite(mesh_axes_module(kind, layout), bidirectional=True)
    want, _ = rewrite(dense_module(kind, layout), bidirectional=True)
    assert permutes(got) == permutes(want)
    assert constants(got) == constants(want)


@pytest.mark.parametrize("groups,reason", [
    ("#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = \"z\">]>",
     "not an axis of the mesh"),
    ("#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = \"b\", sub_axis_info = (1)2>, #stablehlo.axis_ref<name = \"b\", sub_axis_info = (1)4>]>",
     "referenced twice"),
    ("#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = \"b\", sub_axis_info = (1)3>]>",
     "does not divide"),
    ("#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = \"a\">, #stablehlo.axis_ref<name = \"a\">]>",
     "referenced twice"),
])
def test_bad_mesh_axes_are_left_unchanged(groups, reason):
    text = module("gather", MESHES["2x4"], groups, 2)
    mod, sites = rewrite(text)
    assert len(sites) == 1 and not sites[0].applied
    assert reason in sites[0].reason
    assert op_counts(mod)["stablehlo.all_gather"] == 1


def test_mesh_with_device_ids_is_left_unchanged():
    groups = ("#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = "
              "[#stablehlo.axis_ref<name = \"b\">]>")
    text = module("gather", MESHES["2x4"], groups, 4,
                  device_ids=", device_ids=[7, 6, 5, 4, 3, 2, 1, 0]")
    mod, sites = rewrite(text)
    assert [s.applied for s in sites] == [False]
    assert "device_ids" in sites[0].reason
    assert op_counts(mod)["stablehlo.collective_permute"] == 0


def test_mesh_that_does_not_fit_the_module_is_left_unchanged():
    groups = ("#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = "
              "[#stablehlo.axis_ref<name = \"x\">]>")
    text = module("gather", (("x", 4),), groups, 4)
    _, sites = rewrite(text)
    assert [s.applied for s in sites] == [False]
    assert "mesh of 4 devices in a module of 8" in sites[0].reason


# Programs as JAX exports them: under JAX >= 0.11 the groups are mesh axes.
AG, RS = jax.lax.all_gather, jax.lax.psum_scatter
PERMUTED = (3, 6, 0, 5, 1, 7, 2, 4)
PROGRAMS = {
    "strided-axis": Program(lambda x, w: AG(x, "a", axis=0, tiled=True) @ w, (2, 4), ("a", "b"),
                            [((16, 16), P("a")), ((16, 8), P())], P()),
    "two-axes": Program(lambda x, w: AG(x, ("b", "a"), axis=0, tiled=True) @ w, (2, 4),
                        ("a", "b"), [((64, 16), P(("b", "a"))), ((16, 8), P())], P()),
    "3d-mesh": Program(lambda x, w: RS(x @ w, ("c", "a"), scatter_dimension=0, tiled=True),
                       (2, 2, 2), ("a", "b", "c"),
                       [((32, 16), P(None, "b")), ((16, 8), P("b"))], P(("c", "a"))),
    "permuted-devices": Program(lambda x, w: AG(x, "b", axis=0, tiled=True) @ w, (2, 4),
                                ("a", "b"), [((32, 16), P("b")), ((16, 8), P())], P(),
                                devices=PERMUTED),
    "permuted-scatter": Program(lambda x, w: RS(x @ w, "a", scatter_dimension=1, tiled=True),
                                (2, 4), ("a", "b"),
                                [((16, 32), P(None, "b")), ((32, 16), P("b"))],
                                P(None, "a"), devices=PERMUTED),
    "partially-manual": Program(lambda x, w: AG(x, "b", axis=0, tiled=True) @ w, (2, 4),
                                ("a", "b"), [((32, 16), P("b")), ((16, 8), P())], P(),
                                manual_axes=frozenset({"b"})),
    # psum_scatter in a partially manual shard_map: JAX 0.12 lowers it on an Auto mesh
    "partially-manual-scatter": Program(
        lambda x, w: RS(x @ w, "b", scatter_dimension=0, tiled=True), (2, 4), ("a", "b"),
        [((32, 16), P(None, "b")), ((16, 8), P("b"))], P("b"), manual_axes=frozenset({"b"})),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_jax_exports(name):
    program = PROGRAMS[name]
    counts = check(program, rewritten=1)
    assert counts["stablehlo.collective_permute"] >= 1
    text = program.jitted().lower(*program.args()).as_text()
    forms = mesh_axes_forms(text)
    newer = tuple(int(v) for v in jax.__version__.split(".")[:2]) >= (0, 11)
    assert forms and all(forms) == newer, (jax.__version__, forms)
