// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-sequence-parallel)' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-sequence-parallel)' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK

// The residual add and an RMS-style scale after the all_gather move onto this
// device's 2 rows: the residual %x enters the shard_map unsharded, so it is sliced at
// the device's row offset (position * 2); the row statistics reduce over dim 1 only.
// The all_gather (fresh channel) then sits right before the dot: one gather of 8x4
// before and after.
// CHECK-LABEL: func.func @residual_norm
// CHECK: sdy.manual_computation
// CHECK: stablehlo.partition_id
// CHECK: %[[OFFSET:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<i32>
// CHECK: %[[ROWS:.*]] = stablehlo.dynamic_slice %{{[^,]+}}, %[[OFFSET]], %{{.*}}, sizes = [2, 4] : (tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
// CHECK: %[[RES:.*]] = stablehlo.add %[[ROWS]], %[[BLOCK:[^ ]+]] : tensor<2x4xf32>
// CHECK: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.add across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
// CHECK: %[[NORMED:.*]] = stablehlo.multiply {{.*}} : tensor<2x4xf32>
// CHECK: %[[NORMED_ALL:.*]] = "stablehlo.all_gather"(%[[NORMED]]) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>{{.*}} : (tensor<2x4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT: stablehlo.dot_general %[[NORMED_ALL]]
// CHECK-NOT: "stablehlo.all_gather"
// CHECK: sdy.return
// CHECK-LABEL: func.func @residual_returned
// CHECK: %[[G:.*]] = "stablehlo.all_gather"
// CHECK-NEXT: stablehlo.add %{{.*}}, %[[G]] : tensor<8x4xf32>
// REMARK: remark: overlap-sequence-parallel: rewritten: 6 ops after 1 all_gather(s) moved onto the shard
module @residual_norm attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func @residual_norm(%x: tensor<8x4xf32>, %b: tensor<8x4xf32>, %w: tensor<4x16xf32>) -> tensor<8x16xf32> {
    %0 = sdy.manual_computation(%x, %b, %w) in_shardings=[<@mesh, [{}, {}]>, <@mesh, [{"x"}, {}]>, <@mesh, [{}, {"x"}]>] out_shardings=[<@mesh, [{}, {"x"}]>] manual_axes={"x"} (%xs: tensor<8x4xf32>, %bs: tensor<2x4xf32>, %ws: tensor<4x4xf32>) {
      %g = "stablehlo.all_gather"(%bs) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x4xf32>) -> tensor<8x4xf32>
      %r = stablehlo.add %xs, %g : tensor<8x4xf32>
      %sq = stablehlo.multiply %r, %r : tensor<8x4xf32>
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
      %inv = stablehlo.rsqrt %sum : tensor<8xf32>
      %bc = stablehlo.broadcast_in_dim %inv, dims = [0] : (tensor<8xf32>) -> tensor<8x4xf32>
      %n = stablehlo.multiply %r, %bc : tensor<8x4xf32>
      %y = stablehlo.dot_general %n, %ws, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
      sdy.return %y : tensor<8x4xf32>
    } : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}

// -----

// The residual stream is returned and its square feeds the dot: each would need its
// own all_gather, two gathers where there was one, so nothing moves (with a remark).
// REMARK: remark: overlap-sequence-parallel: left unchanged: moving the 2 ops after the all_gather onto the shard would gather 0.000122 MiB more than now
module @residual_returned attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func @residual_returned(%x: tensor<8x4xf32>, %b: tensor<8x4xf32>, %w: tensor<4x16xf32>) -> (tensor<8x4xf32>, tensor<8x16xf32>) {
    %0:2 = sdy.manual_computation(%x, %b, %w) in_shardings=[<@mesh, [{}, {}]>, <@mesh, [{"x"}, {}]>, <@mesh, [{}, {"x"}]>] out_shardings=[<@mesh, [{}, {}]>, <@mesh, [{}, {"x"}]>] manual_axes={"x"} (%xs: tensor<8x4xf32>, %bs: tensor<2x4xf32>, %ws: tensor<4x4xf32>) {
      %g = "stablehlo.all_gather"(%bs) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x4xf32>) -> tensor<8x4xf32>
      %r = stablehlo.add %xs, %g : tensor<8x4xf32>
      %sq = stablehlo.multiply %r, %r : tensor<8x4xf32>
      %y = stablehlo.dot_general %sq, %ws, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
      sdy.return %r, %y : tensor<8x4xf32>, tensor<8x4xf32>
    } : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<4x16xf32>) -> (tensor<8x4xf32>, tensor<8x16xf32>)
    return %0#0, %0#1 : tensor<8x4xf32>, tensor<8x16xf32>
  }
}

// -----

// The residual %x is split over the same axis: each device adds its own rows of a
// different tensor, so the add stays after the all_gather.
// CHECK-LABEL: func.func @residual_differs
// CHECK: %[[G:.*]] = "stablehlo.all_gather"
// CHECK-NEXT: %[[R:.*]] = stablehlo.add %{{.*}}, %[[G]] : tensor<8x4xf32>
// CHECK-NEXT: stablehlo.dot_general %[[R]]
module @residual_differs attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func @residual_differs(%x: tensor<32x4xf32>, %b: tensor<8x4xf32>, %w: tensor<4x16xf32>) -> tensor<8x16xf32> {
    %0 = sdy.manual_computation(%x, %b, %w) in_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{"x"}, {}]>, <@mesh, [{}, {"x"}]>] out_shardings=[<@mesh, [{}, {"x"}]>] manual_axes={"x"} (%xs: tensor<8x4xf32>, %bs: tensor<2x4xf32>, %ws: tensor<4x4xf32>) {
      %g = "stablehlo.all_gather"(%bs) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x4xf32>) -> tensor<8x4xf32>
      %r = stablehlo.add %xs, %g : tensor<8x4xf32>
      %y = stablehlo.dot_general %r, %ws, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
      sdy.return %y : tensor<8x4xf32>
    } : (tensor<32x4xf32>, tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}

// -----

// A softmax-like sum over the gathered rows (dim 0) reads every row: nothing moves.
// The divide after it could, but the all_gather would stay for the sum.
// REMARK: remark: overlap-sequence-parallel: left unchanged: moving the 1 ops after the all_gather onto the shard would gather
// CHECK-LABEL: func.func @reduce_over_rows
// CHECK: %[[G:.*]] = "stablehlo.all_gather"
// CHECK: stablehlo.reduce(%[[G]] init
// CHECK-SAME: across dimensions = [0]
module @reduce_over_rows attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @reduce_over_rows(%b: tensor<2x4xf32>, %w: tensor<4x4xf32>) -> tensor<8x4xf32> {
    %g = "stablehlo.all_gather"(%b) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x4xf32>) -> tensor<8x4xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%g init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<4xf32>
    %bc = stablehlo.broadcast_in_dim %sum, dims = [1] : (tensor<4xf32>) -> tensor<8x4xf32>
    %n = stablehlo.divide %g, %bc : tensor<8x4xf32>
    %y = stablehlo.dot_general %n, %w, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
    return %y : tensor<8x4xf32>
  }
}
