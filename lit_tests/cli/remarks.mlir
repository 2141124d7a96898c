// RUN: overlap-opt %s --threshold-mib=0 --remarks --split-input-file --verify-diagnostics | FileCheck %s
// RUN: overlap-opt %s --remarks --split-input-file -o %t 2>&1 | FileCheck %s --check-prefix=SMALL

// --remarks reports each candidate site at its collective. Its tensors are 8 KiB:
// rewritten with --threshold-mib=0, left unchanged under the default 1 MiB.

// CHECK-LABEL: func.func @gather_dot
// CHECK: stablehlo.collective_permute
// CHECK-NOT: stablehlo.all_gather
// SMALL: remarks.mlir:14:10: remark: overlap-all-gather-matmul: left unchanged: {{.*}} below threshold-mib=1
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @gather_dot(%x: tensor<16x32xf32>, %w: tensor<32x16xf32>) -> tensor<64x16xf32> {
    // expected-remark@below {{overlap-all-gather-matmul: rewritten}}
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    return %d : tensor<64x16xf32>
  }
}

// -----

// CHECK-LABEL: func.func @dot_scatter
// CHECK: stablehlo.collective_permute
// CHECK-NOT: stablehlo.reduce_scatter
// SMALL: remarks.mlir:30:10: remark: overlap-matmul-reduce-scatter: left unchanged: {{.*}} below threshold-mib=1
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @dot_scatter(%a: tensor<64x16xf32>, %b: tensor<16x32xf32>) -> tensor<16x32xf32> {
    %d = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<64x16xf32>, tensor<16x32xf32>) -> tensor<64x32xf32>
    // expected-remark@+1 {{overlap-matmul-reduce-scatter: rewritten}}
    %s = "stablehlo.reduce_scatter"(%d) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%l: tensor<f32>, %r: tensor<f32>):
      %sum = stablehlo.add %l, %r : tensor<f32>
      stablehlo.return %sum : tensor<f32>
    }) : (tensor<64x32xf32>) -> tensor<16x32xf32>
    return %s : tensor<16x32xf32>
  }
}

// -----

// A site the passes cannot rewrite at any threshold: groups of one device.
// CHECK-LABEL: func.func @single_device_groups
// CHECK: stablehlo.all_gather
// SMALL: remarks.mlir:48:10: remark: overlap-all-gather-matmul: left unchanged: group size 1
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @single_device_groups(%x: tensor<16x32xf32>, %w: tensor<32x16xf32>) -> tensor<16x16xf32> {
    // expected-remark@+1 {{overlap-all-gather-matmul: left unchanged: group size 1}}
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0], [1], [2], [3]]> : tensor<4x1xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<16x32xf32>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x16xf32>
    return %d : tensor<16x16xf32>
  }
}
