// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=GONE

// Scatter dim 0 comes from a free dim of the lhs; 2 contiguous groups of 4. Round 0
// is peeled before the loop: this device's block (p + 1) mod 4 of the product (lhs
// rows sliced), without a permute. The loop runs rounds 1..3 (it starts at 1 and
// stops at 4): each computes block (p + k + 1) mod 4 from the loop-invariant
// operands while the permute moves the carried accumulator (a block argument),
// then adds the two. The last round (k = 3, the device's own block p plus the
// arrived accumulator) runs inside the loop, so the function returns the loop's
// accumulator directly: nothing is computed or permuted after the loop. The full
// 8x8 product is never built (GONE prefix). (Where the i32 constants of the index
// arithmetic are placed is not checked.)
// CHECK-LABEL: func.func @free_lhs
// CHECK-SAME: (%[[RL_A:.*]]: tensor<8x16xf32>, %[[RL_B:.*]]: tensor<16x8xf32>)
// CHECK: %[[RL_PID:.*]] = stablehlo.partition_id
// CHECK-NEXT: %[[RL_ID:.*]] = stablehlo.convert %[[RL_PID]]
// CHECK-NEXT: %[[RL_TABLE:.*]] = stablehlo.constant dense<[0, 1, 2, 3, 0, 1, 2, 3]> : tensor<8xi32>
// CHECK-NEXT: %[[RL_SLOT:.*]] = stablehlo.dynamic_slice %[[RL_TABLE]], %[[RL_ID]], sizes = [1]
// CHECK-NEXT: %[[RL_POS:.*]] = stablehlo.reshape %[[RL_SLOT]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[RL_ONE:.*]] = stablehlo.constant dense<1> : tensor<i32>
// CHECK-NEXT: %[[RL_J0:.*]] = stablehlo.add %[[RL_POS]], %[[RL_ONE]]
// CHECK: %[[RL_M0:.*]] = stablehlo.remainder %[[RL_J0]], %{{[^ ]+}}
// CHECK: %[[RL_OFF0:.*]] = stablehlo.multiply %[[RL_M0]], %{{[^ ]+}}
// CHECK: %[[RL_S0:.*]] = stablehlo.dynamic_slice %[[RL_A]], %[[RL_OFF0]], %{{[^ ]+}}, sizes = [2, 16] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<2x16xf32>
// CHECK-NEXT: %[[RL_FIRST:.*]] = stablehlo.dot_general %[[RL_S0]], %[[RL_B]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[RL_LOOP:.*]]:5 = stablehlo.while(%[[RL_K:[^ ]+]] = %[[RL_ONE]], %[[RL_ACC:[^ ]+]] = %[[RL_FIRST]], %[[RL_LHS:[^ ]+]] = %[[RL_A]], %[[RL_RHS:[^ ]+]] = %[[RL_B]], %[[RL_P:[^ ]+]] = %[[RL_POS]])
// CHECK: cond {
// CHECK-NEXT: %[[RL_STOP:.*]] = stablehlo.constant dense<4> : tensor<i32>
// CHECK-NEXT: stablehlo.compare LT, %[[RL_K]], %[[RL_STOP]], SIGNED
// CHECK: } do {
// CHECK-NEXT: %[[RL_JK:.*]] = stablehlo.add %[[RL_P]], %[[RL_K]]
// CHECK: %[[RL_J:.*]] = stablehlo.add %[[RL_JK]], %{{[^ ]+}}
// CHECK: %[[RL_M:.*]] = stablehlo.remainder %[[RL_J]], %{{[^ ]+}}
// CHECK: %[[RL_OFF:.*]] = stablehlo.multiply %[[RL_M]], %{{[^ ]+}}
// CHECK: %[[RL_SLICE:.*]] = stablehlo.dynamic_slice %[[RL_LHS]], %[[RL_OFF]], %{{[^ ]+}}, sizes = [2, 16]
// CHECK-NEXT: %[[RL_PART:.*]] = stablehlo.dot_general %[[RL_SLICE]], %[[RL_RHS]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[RL_MOVED:.*]] = "stablehlo.collective_permute"(%[[RL_ACC]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[RL_SUM:.*]] = stablehlo.add %[[RL_MOVED]], %[[RL_PART]] : tensor<2x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[RL_SUM]], %[[RL_LHS]], %[[RL_RHS]], %[[RL_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: return %[[RL_LOOP]]#1 : tensor<2x8xf32>
// GONE-LABEL: func.func @free_lhs
// GONE-NOT: tensor<8x8xf32>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @free_lhs(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated; predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on h100-sxm (default profile, not chosen){{(: predicted slower than the original)?$}}
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}

// -----

// Scatter dim 1 comes from a free dim of the rhs; strided groups [[0,2,4,6],
// [1,3,5,7]]: the rhs columns are sliced, the lhs is used whole, in the peeled
// round 0 and in the loop, whose last iteration (round 3) computes the own block;
// the loop's accumulator is returned directly.
// CHECK-LABEL: func.func @free_rhs
// CHECK-SAME: (%[[RR_A:.*]]: tensor<8x16xf32>, %[[RR_B:.*]]: tensor<16x8xf32>)
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: %[[RR_S0:.*]] = stablehlo.dynamic_slice %[[RR_B]], %{{.*}}, %{{.*}}, sizes = [16, 2]
// CHECK-NEXT: %[[RR_FIRST:.*]] = stablehlo.dot_general %[[RR_A]], %[[RR_S0]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x2xf32>) -> tensor<8x2xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[RR_LOOP:.*]]:5 = stablehlo.while(%[[RR_K:[^ ]+]] = %{{[^ ]+}}, %[[RR_ACC:[^ ]+]] = %[[RR_FIRST]], %[[RR_LHS:[^ ]+]] = %[[RR_A]], %[[RR_RHS:[^ ]+]] = %[[RR_B]], %[[RR_P:[^ ]+]] = %{{[^ ]+}})
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<4> : tensor<i32>
// CHECK: } do {
// CHECK: %[[RR_OFF:.*]] = stablehlo.multiply
// CHECK: %[[RR_SLICE:.*]] = stablehlo.dynamic_slice %[[RR_RHS]], %{{.*}}, %[[RR_OFF]], sizes = [16, 2]
// CHECK-NEXT: %[[RR_PART:.*]] = stablehlo.dot_general %[[RR_LHS]], %[[RR_SLICE]]
// CHECK-NEXT: %[[RR_MOVED:.*]] = "stablehlo.collective_permute"(%[[RR_ACC]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}> : (tensor<8x2xf32>) -> tensor<8x2xf32>
// CHECK-NEXT: %[[RR_SUM:.*]] = stablehlo.add %[[RR_MOVED]], %[[RR_PART]] : tensor<8x2xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[RR_SUM]], %[[RR_LHS]], %[[RR_RHS]], %[[RR_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: return %[[RR_LOOP]]#1 : tensor<8x2xf32>
// GONE-LABEL: func.func @free_rhs
// GONE-NOT: tensor<8x8xf32>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @free_rhs(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x2xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 1 (free dim of operand 1) over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated; predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on h100-sxm (default profile, not chosen){{(: predicted slower than the original)?$}}
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, scatter_dimension = 1 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<8x2xf32>
    return %1 : tensor<8x2xf32>
  }
}

// -----

// Scatter dim 0 is a batch dim; groups of 2 [[0,1],[2,3],[4,5],[6,7]]: the loop
// has a single iteration (round 1, which is also the last round). Both operands
// are sliced at the same batch offset, for round 0's block (p + 1) mod 2 before
// the loop (no permute there) and for the own block p in the loop, where one
// permute moves round 0's accumulator (the carried block argument) and adds it to
// the own block; the loop's accumulator is returned directly.
// CHECK-LABEL: func.func @batch
// CHECK-SAME: (%[[RB_A:.*]]: tensor<4x8x16xf32>, %[[RB_B:.*]]: tensor<4x16x8xf32>)
// CHECK: stablehlo.constant dense<[0, 1, 0, 1, 0, 1, 0, 1]> : tensor<8xi32>
// CHECK: %[[RB_POS:.*]] = stablehlo.reshape
// CHECK: %[[RB_ONE:.*]] = stablehlo.constant dense<1> : tensor<i32>
// CHECK: %[[RB_OFF0:.*]] = stablehlo.multiply
// CHECK: %[[RB_SA0:.*]] = stablehlo.dynamic_slice %[[RB_A]], %[[RB_OFF0]], %{{.*}}, %{{.*}}, sizes = [2, 8, 16]
// CHECK: %[[RB_SB0:.*]] = stablehlo.dynamic_slice %[[RB_B]], %[[RB_OFF0]], %{{.*}}, %{{.*}}, sizes = [2, 16, 8]
// CHECK-NEXT: %[[RB_FIRST:.*]] = stablehlo.dot_general %[[RB_SA0]], %[[RB_SB0]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x16xf32>, tensor<2x16x8xf32>) -> tensor<2x8x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[RB_LOOP:.*]]:5 = stablehlo.while(%[[RB_K:[^ ]+]] = %[[RB_ONE]], %[[RB_ACC:[^ ]+]] = %[[RB_FIRST]], %[[RB_LHS:[^ ]+]] = %[[RB_A]], %[[RB_RHS:[^ ]+]] = %[[RB_B]], %[[RB_P:[^ ]+]] = %[[RB_POS]])
// CHECK: cond {
// CHECK-NEXT: %[[RB_STOP:.*]] = stablehlo.constant dense<2> : tensor<i32>
// CHECK-NEXT: stablehlo.compare LT, %[[RB_K]], %[[RB_STOP]], SIGNED
// CHECK: } do {
// CHECK-NEXT: stablehlo.add %[[RB_P]], %[[RB_K]]
// CHECK: %[[RB_OFF:.*]] = stablehlo.multiply
// CHECK: %[[RB_SA:.*]] = stablehlo.dynamic_slice %[[RB_LHS]], %[[RB_OFF]], %{{.*}}, %{{.*}}, sizes = [2, 8, 16]
// CHECK-NEXT: %[[RB_SB:.*]] = stablehlo.dynamic_slice %[[RB_RHS]], %[[RB_OFF]], %{{.*}}, %{{.*}}, sizes = [2, 16, 8]
// CHECK-NEXT: %[[RB_OWN:.*]] = stablehlo.dot_general %[[RB_SA]], %[[RB_SB]], batching_dims = [0] x [0], contracting_dims = [2] x [1]
// CHECK-NEXT: %[[RB_MOVED:.*]] = "stablehlo.collective_permute"(%[[RB_ACC]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NEXT: %[[RB_SUM:.*]] = stablehlo.add %[[RB_MOVED]], %[[RB_OWN]] : tensor<2x8x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[RB_SUM]], %[[RB_LHS]], %[[RB_RHS]], %[[RB_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: return %[[RB_LOOP]]#1 : tensor<2x8x8xf32>
// GONE-LABEL: func.func @batch
// GONE-NOT: tensor<4x8x8xf32>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @batch(%arg0: tensor<4x8x16xf32>, %arg1: tensor<4x16x8xf32>) -> tensor<2x8x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<4x8x8xf32> scattered on dim 0 (batch) over groups of 2; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated; predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on h100-sxm (default profile, not chosen){{(: predicted slower than the original)?$}}
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<4x8x8xf32>) -> tensor<2x8x8xf32>
    return %1 : tensor<2x8x8xf32>
  }
}

// -----

// The reduction adds its block arguments in the other order (add %rhs, %lhs): still
// a plain add. One group of all 8 partitions: the loop runs rounds 1..7 (the
// last, own-block round included) and its accumulator is returned directly.
// CHECK-LABEL: func.func @add_swapped
// CHECK: stablehlo.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>
// CHECK: %[[AS_LOOP:.*]]:5 = stablehlo.while(%[[AS_K:[^ ]+]] = %{{[^ ]+}}, %[[AS_ACC:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}}) : tensor<i32>, tensor<1x8xf32>,
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<8> : tensor<i32>
// CHECK: "stablehlo.collective_permute"(%[[AS_ACC]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return %[[AS_LOOP]]#1 : tensor<1x8xf32>
// GONE-LABEL: func.func @add_swapped
// GONE-NOT: tensor<8x8xf32>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @add_swapped(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<1x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg3, %arg2 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<1x8xf32>
    return %1 : tensor<1x8xf32>
  }
}

// -----

// Replica ids (no channel handle, 8 replicas): stablehlo.replica_id gives the
// position and the loop's permute (the only one) carries no channel handle.
// CHECK-LABEL: func.func @replica_ids
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.partition_id
// CHECK: stablehlo.replica_id
// CHECK: %[[RI_LOOP:.*]]:5 = stablehlo.while(%[[RI_K:[^ ]+]] = %{{[^ ]+}}, %[[RI_ACC:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}})
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%[[RI_ACC]]) <{source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return %[[RI_LOOP]]#1 : tensor<2x8xf32>
// CHECK-NOT: channel_handle
// GONE-LABEL: func.func @replica_ids
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 8 : i32} {
  func.func @replica_ids(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}

// -----

// bf16: the accumulator keeps the reduce_scatter's element type, so the loop's
// permute moves bf16 like the original collective would, and the loop's bf16
// accumulator is returned directly; nothing is widened to f32.
// CHECK-LABEL: func.func @bf16
// CHECK-NOT: f32
// CHECK: %[[BF_LOOP:.*]]:5 = stablehlo.while(%[[BF_K:[^ ]+]] = %{{[^ ]+}}, %[[BF_ACC:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}}) : tensor<i32>, tensor<2x8xbf16>,
// CHECK: stablehlo.dot_general {{.*}} -> tensor<2x8xbf16>
// CHECK: "stablehlo.collective_permute"(%[[BF_ACC]]) {{.*}} : (tensor<2x8xbf16>) -> tensor<2x8xbf16>
// CHECK-NOT: f32
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return %[[BF_LOOP]]#1 : tensor<2x8xbf16>
// GONE-LABEL: func.func @bf16
// GONE-NOT: f32
// GONE-NOT: tensor<8x8xbf16>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @bf16(%arg0: tensor<8x16xbf16>, %arg1: tensor<16x8xbf16>) -> tensor<2x8xbf16> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xbf16>, tensor<16x8xbf16>) -> tensor<8x8xbf16>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<bf16>, %arg3: tensor<bf16>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<bf16>
      stablehlo.return %2 : tensor<bf16>
    }) : (tensor<8x8xbf16>) -> tensor<2x8xbf16>
    return %1 : tensor<2x8xbf16>
  }
}

// -----

// Left unchanged: the reduction is a maximum, not an add.
// CHECK-LABEL: func.func @max_reduction
// CHECK: %[[MX_D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: "stablehlo.reduce_scatter"(%[[MX_D]])
// CHECK: stablehlo.maximum
// CHECK-NOT: stablehlo.collective_permute
// GONE-LABEL: func.func @max_reduction
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @max_reduction(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: left unchanged: reduction is not a plain add
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.maximum %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}

// -----

// The dot's full result is also returned (after the scatter): the ring computes every
// block of this device's product exactly once anyway, so it writes each block into a
// buffer (carried by the loop) that replaces the dot for the other reader.
// CHECK-LABEL: func.func @dot_second_user
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: %[[SU_ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<8x8xf32>
// CHECK: %[[SU_P0:.*]] = stablehlo.dot_general %{{[^ ]+}}, %arg1, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[SU_B0:.*]] = stablehlo.dynamic_update_slice %[[SU_ZERO]], %[[SU_P0]],
// CHECK: %[[SU_LOOP:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[SU_BUF:[^ ]+]] = %[[SU_B0]], %[[SU_ACC:[^ ]+]] = %[[SU_P0]],
// CHECK: %[[SU_P:.*]] = stablehlo.dot_general
// CHECK: %[[SU_NEXT:.*]] = stablehlo.dynamic_update_slice %[[SU_BUF]], %[[SU_P]],
// CHECK: "stablehlo.collective_permute"(%[[SU_ACC]])
// CHECK: stablehlo.return %{{[^ ]+}}, %[[SU_NEXT]],
// CHECK: return %[[SU_LOOP]]#2, %[[SU_LOOP]]#1
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @dot_second_user(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> (tensor<2x8xf32>, tensor<8x8xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 4; the ring assembles the dot's product for 1 other reader(s);
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1, %0 : tensor<2x8xf32>, tensor<8x8xf32>
  }
}

// -----

// Left unchanged: the dot's result is also read before the scatter, where the ring's
// product does not exist yet.
// CHECK-LABEL: func.func @dot_read_before
// CHECK: %[[RB_D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK: "stablehlo.reduce_scatter"(%[[RB_D]])
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @dot_read_before(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> (tensor<2x8xf32>, tensor<8x8xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %n = stablehlo.negate %0 : tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: left unchanged: the dot result has users other than the reduce_scatter before it
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1, %n : tensor<2x8xf32>, tensor<8x8xf32>
  }
}

// -----

// Left unchanged: the scatter dim (6) is not group size (4) x result dim (2). The
// StableHLO verifier accepts this reduce_scatter.
// CHECK-LABEL: func.func @not_divisible
// CHECK: %[[ND_D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: "stablehlo.reduce_scatter"(%[[ND_D]])
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @not_divisible(%arg0: tensor<6x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<6x16xf32>, tensor<16x8xf32>) -> tensor<6x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: left unchanged: scatter dim 6 is not 4 x 2
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<6x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}

// -----

// Left unchanged: the replica groups cover only 4 of the 8 partitions.
// CHECK-LABEL: func.func @groups_not_partition
// CHECK: %[[GN_D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: "stablehlo.reduce_scatter"(%[[GN_D]])
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @groups_not_partition(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: left unchanged: replica groups do not partition the 8 device ids
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}

// -----

// Left unchanged: an optimization_barrier separates the dot from the
// reduce_scatter. Nothing changes, and the remark says why.
// CHECK-LABEL: func.func @barrier
// CHECK: %[[OB_D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[OB_B:.*]] = stablehlo.optimization_barrier %[[OB_D]]
// CHECK-NEXT: "stablehlo.reduce_scatter"(%[[OB_B]])
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @barrier(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.optimization_barrier %0 : tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: left unchanged: an optimization_barrier separates it from its operand{{$}}
    %2 = "stablehlo.reduce_scatter"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %3 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %2 : tensor<2x8xf32>
  }
}
