"""Replica-group modes JAX's jit does not emit, checked on hand-written modules.

Each module is compiled for 8 host devices as replicas or partitions, run before and
after the rewrite with the same per-device inputs, and compared.
"""
import numpy as np
import pytest

import overlap_hlo
from harness import op_counts, ring_pipeline, run_spmd_module

GATHER = """
module @m attributes {{mhlo.num_partitions = {partitions} : i32, mhlo.num_replicas = {replicas} : i32}} {{
  func.func public @main(%x: tensor<2x16xf32>{manual}, %w: tensor<16x8xf32>{manual}) -> (tensor<{full}x8xf32>{manual}) {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, {attrs}}}> : (tensor<2x16xf32>) -> tensor<{full}x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{full}x16xf32>, tensor<16x8xf32>) -> tensor<{full}x8xf32>
    return %1 : tensor<{full}x8xf32>
  }}
}}
"""

SCATTER = """
module @m attributes {{mhlo.num_partitions = {partitions} : i32, mhlo.num_replicas = {replicas} : i32}} {{
  func.func public @main(%x: tensor<{full}x16xf32>{manual}, %w: tensor<16x8xf32>{manual}) -> (tensor<2x8xf32>{manual}) {{
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{full}x16xf32>, tensor<16x8xf32>) -> tensor<{full}x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{{scatter_dimension = 0 : i64, {attrs}}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %b, %a : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }}) : (tensor<{full}x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }}
}}
"""

CHANNEL = "channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>"
MODES = {
    # cross-replica: no channel handle, groups of replica ids
    "replica-ids": (8, 1, "replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>", 4),
    # cross-replica, empty groups: all replicas
    "replica-all": (8, 1, "replica_groups = dense<> : tensor<0x0xi64>", 8),
    # flattened ids over replicas only
    "flattened-replicas": (8, 1, f"{CHANNEL}, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids", 4),
    # flattened ids over partitions (what JAX emits)
    "flattened-partitions": (1, 8, f"{CHANNEL}, replica_groups = dense<[[3, 1, 2, 0], [4, 6, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids", 4),
    # cross-replica-and-partition with one replica: one group of all partitions
    "replica-and-partition": (1, 8, f"{CHANNEL}, replica_groups = dense<[[0]]> : tensor<1x1xi64>", 8),
    # odd group sizes, for the bidirectional ring
    "groups-of-3": (1, 6, f"{CHANNEL}, replica_groups = dense<[[0, 1, 2], [3, 4, 5]]> : tensor<2x3xi64>, use_global_device_ids", 3),
    "group-of-5": (1, 5, f"{CHANNEL}, replica_groups = dense<[[4, 0, 3, 1, 2]]> : tensor<1x5xi64>, use_global_device_ids", 5),
    "group-of-7": (7, 1, "replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6]]> : tensor<1x7xi64>", 7),
}
ODD = ["groups-of-3", "group-of-5", "group-of-7"]


def run_both(template, mode, pipeline=overlap_hlo.DEFAULT_PIPELINE):
    replicas, partitions, attrs, group = MODES[mode]
    # Partitioned modules are already per-device programs: their values are manual.
    manual = ' {mhlo.sharding = "{manual}"}' if partitions > 1 else ""
    text = template.format(replicas=replicas, partitions=partitions, attrs=attrs,
                           full=2 * group, manual=manual)
    module = overlap_hlo.parse(text)
    sites = overlap_hlo.rewrite_module(module, pipeline, threshold_mib=0)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]
    counts = op_counts(module)
    assert counts["stablehlo.collective_permute"] >= 1
    assert counts["stablehlo.all_gather"] == counts["stablehlo.reduce_scatter"] == 0
    uses_replica_id = counts["stablehlo.replica_id"] == 1
    assert uses_replica_id == (replicas > 1)
    rng = np.random.default_rng(0)
    return text, overlap_hlo.serialize(module), rng, replicas, partitions, group


def options_pipeline(bidirectional, unroll):
    return ring_pipeline(bidirectional, unroll)


CASES = ([(mode, False, 1) for mode in sorted(MODES)]
         + [(mode, bidi, unroll) for mode in ODD for bidi in (False, True)
            for unroll in (1, 2, 3) if (bidi, unroll) != (False, 1)])


def case_id(case):
    mode, bidi, unroll = case
    return mode + ("-bidi" if bidi else "") + (f"-unroll{unroll}" if unroll > 1 else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_gather_modes(case):
    mode, bidi, unroll = case
    text, rewritten, rng, replicas, partitions, group = run_both(
        GATHER, mode, options_pipeline(bidi, unroll))
    devices = replicas * partitions
    inputs = [rng.standard_normal((devices, 2, 16), np.float32),
              np.repeat(rng.standard_normal((1, 16, 8), np.float32), devices, axis=0)]
    want = run_spmd_module(text, replicas, partitions, inputs)[0]
    got = run_spmd_module(rewritten, replicas, partitions, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_scatter_modes(case):
    mode, bidi, unroll = case
    text, rewritten, rng, replicas, partitions, group = run_both(
        SCATTER, mode, options_pipeline(bidi, unroll))
    devices = replicas * partitions
    inputs = [rng.standard_normal((devices, 2 * group, 16), np.float32),
              rng.standard_normal((devices, 16, 8), np.float32)]
    want = run_spmd_module(text, replicas, partitions, inputs)[0]
    got = run_spmd_module(rewritten, replicas, partitions, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
