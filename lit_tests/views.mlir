// RUN: overlap-opt %s --threshold-mib=0 --split-input-file | FileCheck %s

// A bf16 gather upcast and transposed before the dot: the permute carries the bf16
// shard; the convert and transpose are replayed on each block inside the loop, where
// the gathered dim (now dim 1 of the dot's lhs) is contracted.
// CHECK-LABEL: func.func @gather_convert_transpose
// CHECK-SAME: (%[[GT_X:.*]]: tensor<2x16xbf16>, %[[GT_W:.*]]: tensor<8x4xf32>)
// CHECK: stablehlo.while(%{{[^,]+}} = %{{[^,]+}}, %[[GT_CUR:[^ ]+]] = %[[GT_X]]
// CHECK: "stablehlo.collective_permute"(%[[GT_CUR]])
// CHECK-SAME: (tensor<2x16xbf16>) -> tensor<2x16xbf16>
// CHECK: %[[GT_C:.*]] = stablehlo.convert %[[GT_CUR]] : (tensor<2x16xbf16>) -> tensor<2x16xf32>
// CHECK: %[[GT_T:.*]] = stablehlo.transpose %[[GT_C]], dims = [1, 0] : (tensor<2x16xf32>) -> tensor<16x2xf32>
// CHECK: stablehlo.dot_general %[[GT_T]], %{{.*}} : (tensor<16x2xf32>, tensor<2x4xf32>) -> tensor<16x4xf32>
// CHECK-NOT: stablehlo.all_gather
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gather_convert_transpose(%arg0: tensor<2x16xbf16>, %arg1: tensor<8x4xf32>) -> tensor<16x4xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xbf16>) -> tensor<8x16xbf16>
    %1 = stablehlo.convert %0 : (tensor<8x16xbf16>) -> tensor<8x16xf32>
    %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
    %3 = stablehlo.dot_general %2, %arg1, contracting_dims = [1] x [0] : (tensor<16x8xf32>, tensor<8x4xf32>) -> tensor<16x4xf32>
    return %3 : tensor<16x4xf32>
  }
}

// -----

// f32 partial sums transposed and rounded to bf16 before the scatter: the scatter dim
// (dim 0 after the transpose) is dim 1 of the dot, the rhs's free dim, so the rhs is
// sliced; each block is transposed and converted, and the bf16 accumulator travels.
// CHECK-LABEL: func.func @scatter_transpose_convert
// CHECK-SAME: (%[[ST_A:.*]]: tensor<8x16xf32>, %[[ST_B:.*]]: tensor<16x8xf32>)
// CHECK: %[[ST_S0:.*]] = stablehlo.dynamic_slice %[[ST_B]], %{{.*}}, %{{.*}}, sizes = [16, 2]
// CHECK: %[[ST_D0:.*]] = stablehlo.dot_general %[[ST_A]], %[[ST_S0]], {{.*}} -> tensor<8x2xf32>
// CHECK: %[[ST_T0:.*]] = stablehlo.transpose %[[ST_D0]], dims = [1, 0] : (tensor<8x2xf32>) -> tensor<2x8xf32>
// CHECK: %[[ST_C0:.*]] = stablehlo.convert %[[ST_T0]] : (tensor<2x8xf32>) -> tensor<2x8xbf16>
// CHECK: stablehlo.while(%{{[^,]+}} = %{{[^,]+}}, %[[ST_ACC:[^ ]+]] = %[[ST_C0]]
// CHECK: %[[ST_P:.*]] = "stablehlo.collective_permute"(%[[ST_ACC]])
// CHECK-SAME: (tensor<2x8xbf16>) -> tensor<2x8xbf16>
// CHECK: stablehlo.convert %{{.*}} : (tensor<2x8xf32>) -> tensor<2x8xbf16>
// CHECK: stablehlo.add %[[ST_P]]
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @scatter_transpose_convert(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xbf16> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.convert %1 : (tensor<8x8xf32>) -> tensor<8x8xbf16>
    %3 = "stablehlo.reduce_scatter"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<bf16>, %b: tensor<bf16>):
      %4 = stablehlo.add %a, %b : tensor<bf16>
      stablehlo.return %4 : tensor<bf16>
    }) : (tensor<8x8xbf16>) -> tensor<2x8xbf16>
    return %3 : tensor<2x8xbf16>
  }
}
