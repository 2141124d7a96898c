// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true device-coords=2x4:0,0;1,0;0,1;1,1;0,2;1,2;0,3;1,3})' | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 device-coords=2x4:0,0;1,0;0,1;1,1;0,2;1,2;0,3;1,3})' | FileCheck %s --check-prefix=ONE
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{device-coords=2x4:0,0;9,9})' 2>&1 | FileCheck %s --check-prefix=BAD

// device-coords: device d of 8 sits at the d-th coordinates of a 2x4 slice without
// wraparound (x = d mod 2, y = d / 2, as libtpu numbers a v5e:2x4). In the group's
// own order 0..7 consecutive members are up to 4 hops apart, and the two streams of
// a bidirectional ring share links (device 1's x link towards 0 carries 1->0 of one
// stream and 1->2, routed x first, of the other), so the ring visits the group in
// an order of neighbours instead: 0 1 3 5 7 6 4 2 (down one column, up the other). The down stream sends each
// position's shard to the previous position, the up stream to the next one.
// Each device finds the blocks it holds after k shifts in a constant visit table
// (row d: the group index of the device k positions on), not by (p + k) mod 8.

// CHECK-LABEL: func.func @gather
// CHECK-DAG: stablehlo.constant dense<{{\[}}0, 1, 3, 5, 7, 6, 4, 2, 1, 3, 5, 7, 6, 4, 2, 0,
// CHECK: "stablehlo.collective_permute"
// CHECK-SAME{LITERAL}: source_target_pairs = dense<[[0, 2], [1, 0], [3, 1], [5, 3], [7, 5], [6, 7], [4, 6], [2, 4]]>
// CHECK: "stablehlo.collective_permute"
// CHECK-SAME{LITERAL}: source_target_pairs = dense<[[0, 1], [1, 3], [3, 5], [5, 7], [7, 6], [6, 4], [4, 2], [2, 0]]>

// One stream: the closing pair 7 -> 0 would cross 4 hops (libtpu keeps such permutes
// synchronous on large v5e slices); the ring visits neighbours here too.
// ONE-LABEL: func.func @gather
// ONE: stablehlo.constant dense<{{\[}}0, 1, 3, 5, 7, 6, 4, 2,
// ONE: "stablehlo.collective_permute"
// ONE-SAME{LITERAL}: source_target_pairs = dense<[[0, 2], [1, 0], [3, 1], [5, 3], [7, 5], [6, 7], [4, 6], [2, 4]]>

// BAD: error: pass 'overlap-all-gather-matmul': device-coords: coordinates '9,9' lie outside 2x4

// Coordinates of a 4-device slice for a module of 8: the site is left unchanged.
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 device-coords=2x2:0,0;1,0;0,1;1,1})' --remarks 2>&1 >/dev/null | FileCheck %s --check-prefix=FEW
// FEW: remark: overlap-all-gather-matmul: left unchanged: device-coords places 4 devices but the group's ids run to 8

module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gather(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<16x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<16x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }
}
