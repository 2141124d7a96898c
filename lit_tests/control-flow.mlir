// RUN: overlap-opt %s --threshold-mib=0 --split-input-file | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK

// Every device of a group must reach a ring's permutes. A dot inside an if/case
// branch, or inside a while whose trip count is not provably the same on every device,
// that reads an all_gather from outside, gets its ring in front of the outermost such
// region (in a block that runs like the all_gather's own), when its other operand
// already exists there; the branch then reads the ring's result. Otherwise the site is
// left unchanged with a remark. A while whose trip count depends only on constants (a
// scan) runs the same on every device: the ring stays inside it.

// CHECK-LABEL: func.func @dot_in_branch
// CHECK: "stablehlo.collective_permute"
// CHECK: %[[B_LOOP:.*]]:5 = stablehlo.while
// CHECK: %[[B_OUT:.*]] = stablehlo.dynamic_update_slice %[[B_LOOP]]#2
// CHECK: "stablehlo.case"
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.return %[[B_OUT]] : tensor<8x8xf32>
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @dot_in_branch(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %i: tensor<i32>) -> tensor<8x8xf32> {
    // REMARK: control-flow.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim hoisted out of stablehlo.case), tensor<8x16xf32> gathered over groups of 4;
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = "stablehlo.case"(%i) ({
      %2 = stablehlo.constant dense<0.0> : tensor<8x8xf32>
      stablehlo.return %2 : tensor<8x8xf32>
    }, {
      %3 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
      stablehlo.return %3 : tensor<8x8xf32>
    }) : (tensor<i32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// The branch computes the dot's other operand itself: no place is legal.
// CHECK-LABEL: func.func @operand_in_branch
// CHECK: stablehlo.all_gather
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @operand_in_branch(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %c: tensor<i1>) -> tensor<8x8xf32> {
    // REMARK: control-flow.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: dot inside a stablehlo.if branch, its other operand computed there: not every device would reach a ring placed there{{$}}
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = "stablehlo.if"(%c) ({
      %2 = stablehlo.add %w, %w : tensor<16x8xf32>
      %3 = stablehlo.dot_general %0, %2, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
      stablehlo.return %3 : tensor<8x8xf32>
    }, {
      %4 = stablehlo.constant dense<0.0> : tensor<8x8xf32>
      stablehlo.return %4 : tensor<8x8xf32>
    }) : (tensor<i1>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// A fori_loop up to this device's id: the ring goes before the loop, whose body
// reads its result; no permute inside the device-dependent loop.
// CHECK-LABEL: func.func @device_dependent_loop
// CHECK: %[[D_RING:.*]]:5 = stablehlo.while
// CHECK: "stablehlo.collective_permute"
// CHECK: %[[D_OUT:.*]] = stablehlo.dynamic_update_slice %[[D_RING]]#2
// CHECK: stablehlo.while
// CHECK: stablehlo.compare LT, %{{[^ ]+}}, %{{[^ ]+}}, SIGNED
// CHECK: } do {
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.add %{{[^ ]+}}, %[[D_OUT]] : tensor<8x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @device_dependent_loop(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    // REMARK: control-flow.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim hoisted out of stablehlo.while),
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %n = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %init = stablehlo.constant dense<0.0> : tensor<8x8xf32>
    %r:2 = stablehlo.while(%k = %zero, %acc = %init) : tensor<i32>, tensor<8x8xf32>
      cond {
        %c = stablehlo.compare LT, %k, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      } do {
        %one = stablehlo.constant dense<1> : tensor<i32>
        %k1 = stablehlo.add %k, %one : tensor<i32>
        %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
        %a = stablehlo.add %acc, %d : tensor<8x8xf32>
        stablehlo.return %k1, %a : tensor<i32>, tensor<8x8xf32>
      }
    return %r#1 : tensor<8x8xf32>
  }
}

// -----

// The same loop with a constant bound (a scan): every device runs it three times, so
// the ring is built at the dot, inside the body.
// CHECK-LABEL: func.func @constant_trip_count
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: "stablehlo.collective_permute"
// CHECK: stablehlo.while
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @constant_trip_count(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    // REMARK: control-flow.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4;
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %three = stablehlo.constant dense<3> : tensor<i32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %init = stablehlo.constant dense<0.0> : tensor<8x8xf32>
    %r:2 = stablehlo.while(%k = %zero, %acc = %init) : tensor<i32>, tensor<8x8xf32>
      cond {
        %c = stablehlo.compare LT, %k, %three, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      } do {
        %one = stablehlo.constant dense<1> : tensor<i32>
        %k1 = stablehlo.add %k, %one : tensor<i32>
        %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
        %a = stablehlo.add %acc, %d : tensor<8x8xf32>
        stablehlo.return %k1, %a : tensor<i32>, tensor<8x8xf32>
      }
    return %r#1 : tensor<8x8xf32>
  }
}

// -----

// A device-dependent loop whose body computes the other operand from a carried value:
// left unchanged.
// CHECK-LABEL: func.func @carried_operand
// CHECK: stablehlo.all_gather
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @carried_operand(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    // REMARK: control-flow.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: dot inside a stablehlo.while loop whose trip count may differ between devices, its other operand computed there: not every device would reach a ring placed there{{$}}
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %n = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%k = %zero, %v = %w) : tensor<i32>, tensor<16x8xf32>
      cond {
        %c = stablehlo.compare LT, %k, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      } do {
        %one = stablehlo.constant dense<1> : tensor<i32>
        %k1 = stablehlo.add %k, %one : tensor<i32>
        %d = stablehlo.dot_general %g, %v, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
        %v1 = stablehlo.slice %d [0:8, 0:8] : (tensor<8x8xf32>) -> tensor<8x8xf32>
        %v2 = stablehlo.concatenate %v1, %v1, dim = 0 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
        stablehlo.return %k1, %v2 : tensor<i32>, tensor<16x8xf32>
      }
    %out = stablehlo.slice %r#1 [0:8, 0:8] : (tensor<16x8xf32>) -> tensor<8x8xf32>
    return %out : tensor<8x8xf32>
  }
}

// -----

// reduce_scatter side: the ring is built at the collective, where every device that
// ran the reduce_scatter runs it, here inside a scan-like loop (its dot outside).
// CHECK-LABEL: func.func @scatter_in_loop
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general
// CHECK: "stablehlo.collective_permute"
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: "stablehlo.collective_permute"
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @scatter_in_loop(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %three = stablehlo.constant dense<3> : tensor<i32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %init = stablehlo.constant dense<0.0> : tensor<2x8xf32>
    %r:2 = stablehlo.while(%k = %zero, %acc = %init) : tensor<i32>, tensor<2x8xf32>
      cond {
        %c = stablehlo.compare LT, %k, %three, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      } do {
        %one = stablehlo.constant dense<1> : tensor<i32>
        %k1 = stablehlo.add %k, %one : tensor<i32>
        // REMARK: control-flow.mlir:[[# @LINE + 1]]:14: remark: overlap-matmul-reduce-scatter: rewritten:
        %s = "stablehlo.reduce_scatter"(%d) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
        ^bb0(%a0: tensor<f32>, %b0: tensor<f32>):
          %t = stablehlo.add %a0, %b0 : tensor<f32>
          stablehlo.return %t : tensor<f32>
        }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
        %a = stablehlo.add %acc, %s : tensor<2x8xf32>
        stablehlo.return %k1, %a : tensor<i32>, tensor<2x8xf32>
      }
    return %r#1 : tensor<2x8xf32>
  }
}
