// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-all-reduce{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-all-reduce{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK

// all_reduce(dot) over one group of 4: the reduce half is the reduce_scatter ring on
// dim 0 (a free dim of the lhs; blocks of 2 rows, two chains of one row each), with
// the full 8x8 product never built; the all_gather of this device's 2x8 block over the
// same group, on a fresh channel, gives every device the whole sum.
// CHECK-LABEL: func.func @free_lhs
// CHECK-NOT: stablehlo.all_reduce
// CHECK: stablehlo.dot_general {{.*}} -> tensor<1x8xf32>
// CHECK: "stablehlo.collective_permute"({{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]>
// CHECK: stablehlo.while
// CHECK: "stablehlo.collective_permute"({{.*}}handle = 5
// CHECK: stablehlo.dynamic_update_slice {{.*}} -> tensor<2x8xf32>
// CHECK: stablehlo.dynamic_update_slice {{.*}} -> tensor<2x8xf32>
// CHECK-NEXT: %[[WHOLE:.*]] = "stablehlo.all_gather"(%{{[^)]+}}) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>, replica_groups = dense<{{\[}}[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: return %[[WHOLE]] : tensor<8x8xf32>
// CHECK-NOT: stablehlo.all_reduce
// REMARK: remark: overlap-matmul-all-reduce: rewritten: as a reduce_scatter on dim 0 then an all_gather: tensor<8x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 4
module @free_lhs attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @free_lhs(%a: tensor<8x16xf32>, %b: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %2 = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Neither dim of the 6x10 product divides by 4: left unchanged, with a remark.
// CHECK-LABEL: func.func @no_divisible_dim
// CHECK: %[[SUM:.*]] = "stablehlo.all_reduce"
// CHECK: return %[[SUM]]
// REMARK: remark: overlap-matmul-all-reduce: left unchanged: no dim of tensor<6x10xf32> is divisible by the group size 4 and sliceable by the ring
module @no_divisible_dim attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @no_divisible_dim(%a: tensor<6x16xf32>, %b: tensor<16x10xf32>) -> tensor<6x10xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<6x16xf32>, tensor<16x10xf32>) -> tensor<6x10xf32>
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %2 = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<6x10xf32>) -> tensor<6x10xf32>
    return %1 : tensor<6x10xf32>
  }
}

// -----

// A max-reduction is not a sum: left unchanged, with a remark.
// CHECK-LABEL: func.func @max_reduction
// CHECK: "stablehlo.all_reduce"
// REMARK: remark: overlap-matmul-all-reduce: left unchanged: reduction is not a plain add
module @max_reduction attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @max_reduction(%a: tensor<8x16xf32>, %b: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %2 = stablehlo.maximum %x, %y : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// An all_reduce whose operand is not a dot's result, read only by a dot (a cotangent's
// psum in a backward pass): a reduce_scatter, then an all_gather along a free dim of
// the dot, which overlap-all-gather-matmul makes the dot's ring.
// CHECK-LABEL: func.func @operand_not_a_dot
// CHECK-NOT: "stablehlo.all_reduce"
// CHECK: %[[RS:.*]] = "stablehlo.reduce_scatter"(%{{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<{{\[}}[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}>
// CHECK: stablehlo.add
// CHECK: }) : (tensor<8x16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT: %[[AG:.*]] = "stablehlo.all_gather"(%[[RS]]) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// CHECK-NEXT: stablehlo.dot_general %[[AG]], %arg1
// REMARK: remark: overlap-matmul-all-reduce: rewritten: as a reduce_scatter on dim 0 then an all_gather that 1 dot(s) read (overlap-all-gather-matmul makes it their ring; its operand is not a dot's result, so the reduce half stays whole): tensor<8x16xf32> over groups of 4
module @operand_not_a_dot attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @operand_not_a_dot(%a: tensor<8x16xf32>, %b: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = stablehlo.multiply %a, %a : tensor<8x16xf32>
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %2 = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %3 = stablehlo.dot_general %1, %b, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %3 : tensor<8x8xf32>
  }
}

// -----

// The same all_reduce read by a dot and by an add (an embedding's psum before a norm):
// the gather half would not reach only dots. Left unchanged, and said.
// CHECK-LABEL: func.func @also_read_by_an_add
// CHECK: "stablehlo.all_reduce"
// REMARK: remark: overlap-matmul-all-reduce: left unchanged: its operand is not a dot's result, and no dim of its result divisible by the group size is read only by dots
module @also_read_by_an_add attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @also_read_by_an_add(%a: tensor<8x16xf32>, %b: tensor<16x8xf32>) -> (tensor<8x8xf32>, tensor<8x16xf32>) {
    %0 = stablehlo.multiply %a, %a : tensor<8x16xf32>
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %2 = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %3 = stablehlo.dot_general %1, %b, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %4 = stablehlo.add %1, %a : tensor<8x16xf32>
    return %3, %4 : tensor<8x8xf32>, tensor<8x16xf32>
  }
}
