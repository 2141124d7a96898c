// RUN: overlap-opt %s --threshold-mib=0 | FileCheck %s

// JAX computes a weight gradient as a product and its transpose. Next to a collective,
// `transpose(dot_general(a, b), [1, 0])` becomes `dot_general(b, a)` before the ring is
// built: the ring sums the transposed product itself, and no transpose of the whole
// sum is left for the compiler to copy afterwards.
// CHECK-LABEL: func.func @weight_gradient
// CHECK-NOT: stablehlo.transpose
// CHECK: stablehlo.while
// CHECK: stablehlo.dot_general {{.*}} -> tensor<8x16xf32>
// CHECK-NOT: stablehlo.transpose
// CHECK: return {{.*}} : tensor<8x16xf32>
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @weight_gradient(%dy: tensor<2x8xf32>, %h: tensor<16x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.all_gather"(%dy) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<2x8xf32>) -> tensor<16x8xf32>
    %1 = stablehlo.dot_general %h, %0, contracting_dims = [0] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<16x8xf32>) -> tensor<8x16xf32>
    return %2 : tensor<8x16xf32>
  }
}
