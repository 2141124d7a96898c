// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0},overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0},overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK

// Replica groups given as mesh axes, as JAX >= 0.11 exports them. Axis "a" of the
// mesh a=2, b=4 gives the strided groups [[0,4],[1,5],[2,6],[3,7]]: the ring shifts
// within each pair and every device is position 0 or 1 (ids 0-3 first, 4-7 second).
// CHECK-LABEL: func.func @leading_axis
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.constant dense<[0, 0, 0, 0, 1, 1, 1, 1]> : tensor<8xi32>
// CHECK: "stablehlo.collective_permute"
// CHECK-SAME: source_target_pairs = dense<{{\[}}[0, 4], [4, 0], [1, 5], [5, 1], [2, 6], [6, 2], [3, 7], [7, 3]]>
// CHECK-NOT: stablehlo.all_gather
// REMARK: mesh-axes.mlir:[[# @LINE + 4]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<4x16xf32> gathered over groups of 2
module @leading attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh_0 = <["a"=2, "b"=4]>
  func.func @leading_axis(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<4x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "a">]>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<4x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    return %1 : tensor<4x8xf32>
  }
}

// -----

// Two axes, minor first: ("b", "a") is one group [0,4,1,5,2,6,3,7]; position of id d
// is 2 * (d mod 4) + d / 4. The reduce_scatter's accumulator moves down that ring.
// CHECK-LABEL: func.func @two_axes_reversed
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: stablehlo.constant dense<[0, 2, 4, 6, 1, 3, 5, 7]> : tensor<8xi32>
// CHECK: "stablehlo.collective_permute"
// CHECK-SAME: source_target_pairs = dense<{{\[}}[0, 7], [4, 0], [1, 4], [5, 1], [2, 5], [6, 2], [3, 6], [7, 3]]>
// REMARK: mesh-axes.mlir:[[# @LINE + 5]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<16x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 8
module @reversed attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh_0 = <["a"=2, "b"=4]>
  func.func @two_axes_reversed(%arg0: tensor<16x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "b">, #stablehlo.axis_ref<name = "a">]>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<16x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}

// -----

// An inline mesh x=4, y=2 (axis x: groups [[0,2,4,6],[1,3,5,7]]); a sub-axis
// ("b":(2)2, the minor half of b) with "a": groups [[0,4,1,5],[2,6,3,7]].
// CHECK-LABEL: func.func @inline_mesh
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: "stablehlo.collective_permute"
// CHECK-SAME: source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]>
// CHECK-LABEL: func.func @sub_axis
// CHECK: stablehlo.constant dense<[0, 2, 0, 2, 1, 3, 1, 3]> : tensor<8xi32>
// CHECK: "stablehlo.collective_permute"
// CHECK-SAME: source_target_pairs = dense<{{\[}}[0, 5], [4, 0], [1, 4], [5, 1], [2, 7], [6, 2], [3, 6], [7, 3]]>
module @more attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh_0 = <["a"=2, "b"=4]>
  func.func @inline_mesh(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = #stablehlo.mesh<axes = [<name = "x", size = 4>, <name = "y", size = 2>]>, axes = [#stablehlo.axis_ref<name = "x">]>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
  func.func @sub_axis(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "b", sub_axis_info = (2)2>, #stablehlo.axis_ref<name = "a">]>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// A mesh with device_ids is left unchanged: how XLA orders its groups is unproven.
// CHECK-LABEL: func.func @device_ids
// CHECK: "stablehlo.all_gather"
// CHECK-NOT: stablehlo.collective_permute
// REMARK: mesh-axes.mlir:[[# @LINE + 4]]:10: remark: overlap-all-gather-matmul: left unchanged: mesh with device_ids: how XLA orders its groups is unproven
module @ids attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh_0 = <["a"=2, "b"=4], device_ids=[7, 6, 5, 4, 3, 2, 1, 0]>
  func.func @device_ids(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "b">]>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}
