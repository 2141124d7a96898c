"""Sizes read from the module are bounded before anything is allocated or enumerated,
and module attributes of unexpected types leave a site unchanged instead of crashing."""
import pytest

import overlap_hlo
from harness import op_counts

GATHER = """module attributes {{{attrs}}} {{
  func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<16x8xf32> {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}}> : (tensor<2x16xf32>) -> tensor<16x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }}
}}
"""


@pytest.mark.parametrize("attrs,reason", [
    ("mhlo.num_partitions = 2147483647 : i32", "outside 1..65536"),
    ("mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1000000 : i32", "outside 1..65536"),
    ('mhlo.num_partitions = "8"', "is not an integer"),
    ("mhlo.num_partitions = 8.0 : f32", "is not an integer"),
])
def test_module_sizes(attrs, reason):
    module = overlap_hlo.parse(GATHER.format(attrs=attrs))
    sites = overlap_hlo.rewrite_module(module, threshold_mib=0)
    assert [s.applied for s in sites] == [False]
    assert reason in sites[0].reason
    assert op_counts(module)["stablehlo.all_gather"] == 1


# A partially manual computation on a mesh with many size-1 axes: finding which axes are
# manual must not enumerate subsets (2^40 here would never end).
MANY_AXES = """module @m attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh = <[{axes}]>
  func.func public @main(%arg0: tensor<64x32xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{"x"}}, {{}}]>}}, %arg1: tensor<32x16xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{}}, {{}}]>}}) -> (tensor<64x16xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{}}, {{}}]>}}) {{
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{{"x"}}, {{}}]>, <@mesh, [{{}}, {{}}]>] out_shardings=[<@mesh, [{{}}, {{}}]>] manual_axes={{{manual}}} (%arg2: tensor<8x32xf32>, %arg3: tensor<32x16xf32>) {{
      %1 = "stablehlo.all_gather"(%arg2) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}}> : (tensor<8x32xf32>) -> tensor<64x32xf32>
      %2 = stablehlo.dot_general %1, %arg3, contracting_dims = [1] x [0] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
      sdy.return %2 : tensor<64x16xf32>
    }} : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    return %0 : tensor<64x16xf32>
  }}
}}
"""


def test_many_mesh_axes_partially_manual():
    names = ["x"] + [f"u{i}" for i in range(40)]
    axes = ", ".join(f'"{n}"={8 if n == "x" else 1}' for n in names)
    manual = ", ".join(f'"{n}"' for n in names[:21])   # x and 20 size-1 axes manual
    module = overlap_hlo.parse(MANY_AXES.format(axes=axes, manual=manual))
    sites = overlap_hlo.rewrite_module(module, "builtin.module(overlap-all-gather-matmul)",
                                       threshold_mib=0)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]
    # The position is computed over the 20 axes still automatic, as JAX's axis_index
    # (canonicalize would fold that computation away: its axes all have size 1).
    assert op_counts(module)["sdy.manual_computation"] == 2


BIG_GROUP = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<1x16xf32>, %w: tensor<16x8xf32>) -> tensor<{n}x8xf32> {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[{ids}]> : tensor<1x{n}xi64>, use_global_device_ids}}> : (tensor<1x16xf32>) -> tensor<{n}x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{n}x16xf32>, tensor<16x8xf32>) -> tensor<{n}x8xf32>
    return %1 : tensor<{n}x8xf32>
  }}
}}
"""


@pytest.mark.parametrize("n,options,applied", [
    (65536, {}, False),                                   # 2 permutes x 65536 pairs
    (4096, {"bidirectional": True, "unroll": 3}, True),   # 10 permutes x 4096 pairs
])
def test_permute_pairs_are_bounded(n, options, applied):
    """Each permute lists every device of the group: a site whose permutes would list
    more than 2^16 pairs is left unchanged: the rings add at most about 1.5 MB of text."""
    text = BIG_GROUP.format(n=n, ids=list(range(n)))
    module = overlap_hlo.parse(text)
    (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, **options)
    assert site.applied == applied, site.format()
    if not applied:
        assert site.kind == "ring too large" and "source-target pairs" in site.reason
    assert len(overlap_hlo.serialize(module)) < 2 * len(text) + 2_000_000


def test_unroll_is_bounded():
    """Rounds that fill no loop iteration are inlined: an unroll near the group size would
    inline every round, so it is refused beyond 16."""
    with pytest.raises(overlap_hlo.PipelineError, match="unroll must be at most 16, got 17"):
        overlap_hlo.rewrite_module(overlap_hlo.parse(GATHER.format(
            attrs="mhlo.num_partitions = 8 : i32")), threshold_mib=0, unroll=17)
