// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=GONE

// Scatter dim 0 comes from a free dim of the lhs; 2 contiguous groups of 4. The
// ring is pipelined: round 0 computes this device's block (p + 1) mod 4 of the
// product (lhs rows sliced) without a permute; round 1 sends it (the accumulator
// starts as that block) and computes block (p + 2) mod 4. The loop runs rounds 2..3
// (it starts at 2 and stops at 4), carrying the received accumulator and the
// previous round's part: each iteration adds them, sends the sum, then computes its
// own part from the loop-invariant operands, so the permute neither feeds nor reads
// the iteration's dot. Every part goes through an optimization_barrier, so that the
// compiler cannot fuse the dot with the add that reads a permute. The last round
// (k = 3, the own block p) runs inside the loop; after it, the received accumulator
// and the own part are added. The full 8x8 product is never built (GONE prefix).
// (Where the i32 constants of the index arithmetic are placed is not checked.)
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
// CHECK-NEXT: %[[RL_D0:.*]] = stablehlo.dot_general %[[RL_S0]], %[[RL_B]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[RL_P0:.*]] = stablehlo.optimization_barrier %[[RL_D0]] : tensor<2x8xf32>
// CHECK-NEXT: %[[RL_R1:.*]] = "stablehlo.collective_permute"(%[[RL_P0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[RL_S1:.*]] = stablehlo.dynamic_slice %[[RL_A]], %{{[^ ]+}}, %{{[^ ]+}}, sizes = [2, 16]
// CHECK-NEXT: %[[RL_D1:.*]] = stablehlo.dot_general %[[RL_S1]], %[[RL_B]]
// CHECK-NEXT: %[[RL_P1:.*]] = stablehlo.optimization_barrier %[[RL_D1]] : tensor<2x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[RL_LOOP:.*]]:6 = stablehlo.while(%[[RL_K:[^ ]+]] = %{{[^ ]+}}, %[[RL_RECV:[^ ]+]] = %[[RL_R1]], %[[RL_PART:[^ ]+]] = %[[RL_P1]], %[[RL_LHS:[^ ]+]] = %[[RL_A]], %[[RL_RHS:[^ ]+]] = %[[RL_B]], %[[RL_P:[^ ]+]] = %[[RL_POS]])
// CHECK: cond {
// CHECK-NEXT: %[[RL_STOP:.*]] = stablehlo.constant dense<4> : tensor<i32>
// CHECK-NEXT: stablehlo.compare LT, %[[RL_K]], %[[RL_STOP]], SIGNED
// CHECK: } do {
// CHECK-NEXT: %[[RL_SUM:.*]] = stablehlo.add %[[RL_RECV]], %[[RL_PART]] : tensor<2x8xf32>
// CHECK-NEXT: %[[RL_MOVED:.*]] = "stablehlo.collective_permute"(%[[RL_SUM]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[RL_JK:.*]] = stablehlo.add %[[RL_P]], %[[RL_K]]
// CHECK: %[[RL_J:.*]] = stablehlo.add %[[RL_JK]], %{{[^ ]+}}
// CHECK: %[[RL_M:.*]] = stablehlo.remainder %[[RL_J]], %{{[^ ]+}}
// CHECK: %[[RL_OFF:.*]] = stablehlo.multiply %[[RL_M]], %{{[^ ]+}}
// CHECK: %[[RL_SLICE:.*]] = stablehlo.dynamic_slice %[[RL_LHS]], %[[RL_OFF]], %{{[^ ]+}}, sizes = [2, 16]
// CHECK-NEXT: %[[RL_D:.*]] = stablehlo.dot_general %[[RL_SLICE]], %[[RL_RHS]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[RL_NEXT:.*]] = stablehlo.optimization_barrier %[[RL_D]] : tensor<2x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[RL_MOVED]], %[[RL_NEXT]], %[[RL_LHS]], %[[RL_RHS]], %[[RL_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: %[[RL_OUT:.*]] = stablehlo.add %[[RL_LOOP]]#1, %[[RL_LOOP]]#2 : tensor<2x8xf32>
// CHECK-NEXT: return %[[RL_OUT]] : tensor<2x8xf32>
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
// rounds 0 and 1 and in the loop (rounds 2..3, the own block's included); the
// received accumulator and the last part are added after the loop.
// CHECK-LABEL: func.func @free_rhs
// CHECK-SAME: (%[[RR_A:.*]]: tensor<8x16xf32>, %[[RR_B:.*]]: tensor<16x8xf32>)
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: %[[RR_S0:.*]] = stablehlo.dynamic_slice %[[RR_B]], %{{.*}}, %{{.*}}, sizes = [16, 2]
// CHECK-NEXT: %[[RR_D0:.*]] = stablehlo.dot_general %[[RR_A]], %[[RR_S0]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x2xf32>) -> tensor<8x2xf32>
// CHECK-NEXT: %[[RR_P0:.*]] = stablehlo.optimization_barrier %[[RR_D0]]
// CHECK-NEXT: %[[RR_R1:.*]] = "stablehlo.collective_permute"(%[[RR_P0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}> : (tensor<8x2xf32>) -> tensor<8x2xf32>
// CHECK: %[[RR_P1:.*]] = stablehlo.optimization_barrier
// CHECK: %[[RR_LOOP:.*]]:6 = stablehlo.while(%[[RR_K:[^ ]+]] = %{{[^ ]+}}, %[[RR_RECV:[^ ]+]] = %[[RR_R1]], %[[RR_PART:[^ ]+]] = %[[RR_P1]], %[[RR_LHS:[^ ]+]] = %[[RR_A]], %[[RR_RHS:[^ ]+]] = %[[RR_B]], %[[RR_P:[^ ]+]] = %{{[^ ]+}})
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<4> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[RR_SUM:.*]] = stablehlo.add %[[RR_RECV]], %[[RR_PART]] : tensor<8x2xf32>
// CHECK-NEXT: %[[RR_MOVED:.*]] = "stablehlo.collective_permute"(%[[RR_SUM]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}> : (tensor<8x2xf32>) -> tensor<8x2xf32>
// CHECK: %[[RR_OFF:.*]] = stablehlo.multiply
// CHECK: %[[RR_SLICE:.*]] = stablehlo.dynamic_slice %[[RR_RHS]], %{{.*}}, %[[RR_OFF]], sizes = [16, 2]
// CHECK-NEXT: %[[RR_D:.*]] = stablehlo.dot_general %[[RR_LHS]], %[[RR_SLICE]]
// CHECK-NEXT: %[[RR_NEXT:.*]] = stablehlo.optimization_barrier %[[RR_D]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[RR_MOVED]], %[[RR_NEXT]], %[[RR_LHS]], %[[RR_RHS]], %[[RR_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: %[[RR_OUT:.*]] = stablehlo.add %[[RR_LOOP]]#1, %[[RR_LOOP]]#2 : tensor<8x2xf32>
// CHECK-NEXT: return %[[RR_OUT]] : tensor<8x2xf32>
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

// Scatter dim 0 is a batch dim; groups of 2 [[0,1],[2,3],[4,5],[6,7]]: two rounds
// and no loop. Both operands are sliced at the same batch offset, for round 0's
// block (p + 1) mod 2 (no permute there) and for round 1's own block p, computed
// while one permute moves round 0's block to the other device; the received block
// and the own block are added last.
// CHECK-LABEL: func.func @batch
// CHECK-SAME: (%[[RB_A:.*]]: tensor<4x8x16xf32>, %[[RB_B:.*]]: tensor<4x16x8xf32>)
// CHECK: stablehlo.constant dense<[0, 1, 0, 1, 0, 1, 0, 1]> : tensor<8xi32>
// CHECK: %[[RB_POS:.*]] = stablehlo.reshape
// CHECK-NOT: stablehlo.while
// CHECK: %[[RB_OFF0:.*]] = stablehlo.multiply
// CHECK: %[[RB_SA0:.*]] = stablehlo.dynamic_slice %[[RB_A]], %[[RB_OFF0]], %{{.*}}, %{{.*}}, sizes = [2, 8, 16]
// CHECK: %[[RB_SB0:.*]] = stablehlo.dynamic_slice %[[RB_B]], %[[RB_OFF0]], %{{.*}}, %{{.*}}, sizes = [2, 16, 8]
// CHECK-NEXT: %[[RB_D0:.*]] = stablehlo.dot_general %[[RB_SA0]], %[[RB_SB0]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x16xf32>, tensor<2x16x8xf32>) -> tensor<2x8x8xf32>
// CHECK-NEXT: %[[RB_P0:.*]] = stablehlo.optimization_barrier %[[RB_D0]]
// CHECK-NEXT: %[[RB_MOVED:.*]] = "stablehlo.collective_permute"(%[[RB_P0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NEXT: %[[RB_M:.*]] = stablehlo.remainder %[[RB_POS]], %{{[^ ]+}}
// CHECK-NEXT: %[[RB_OFF:.*]] = stablehlo.multiply %[[RB_M]], %{{[^ ]+}}
// CHECK-NEXT: %[[RB_SA:.*]] = stablehlo.dynamic_slice %[[RB_A]], %[[RB_OFF]], %{{.*}}, %{{.*}}, sizes = [2, 8, 16]
// CHECK-NEXT: %[[RB_SB:.*]] = stablehlo.dynamic_slice %[[RB_B]], %[[RB_OFF]], %{{.*}}, %{{.*}}, sizes = [2, 16, 8]
// CHECK-NEXT: %[[RB_D1:.*]] = stablehlo.dot_general %[[RB_SA]], %[[RB_SB]], batching_dims = [0] x [0], contracting_dims = [2] x [1]
// CHECK-NEXT: %[[RB_OWN:.*]] = stablehlo.optimization_barrier %[[RB_D1]]
// CHECK-NEXT: %[[RB_SUM:.*]] = stablehlo.add %[[RB_MOVED]], %[[RB_OWN]] : tensor<2x8x8xf32>
// CHECK-NEXT: return %[[RB_SUM]] : tensor<2x8x8xf32>
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
// a plain add. One group of all 8 partitions: rounds 0 and 1 before the loop, the
// loop runs rounds 2..7 (the last, own-block round included), and the received
// accumulator and the own part are added after it.
// CHECK-LABEL: func.func @add_swapped
// CHECK: stablehlo.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>
// CHECK: "stablehlo.collective_permute"({{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[AS_LOOP:.*]]:6 = stablehlo.while(%[[AS_K:[^ ]+]] = %{{[^ ]+}}, %[[AS_RECV:[^ ]+]] = %{{[^ ]+}}, %[[AS_PART:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}}) : tensor<i32>, tensor<1x8xf32>, tensor<1x8xf32>,
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<8> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[AS_SUM:.*]] = stablehlo.add %[[AS_RECV]], %[[AS_PART]]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[AS_SUM]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[AS_OUT:.*]] = stablehlo.add %[[AS_LOOP]]#1, %[[AS_LOOP]]#2 : tensor<1x8xf32>
// CHECK-NEXT: return %[[AS_OUT]] : tensor<1x8xf32>
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
// position and the two permutes (round 1's, the loop's) carry no channel handle.
// CHECK-LABEL: func.func @replica_ids
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.partition_id
// CHECK: stablehlo.replica_id
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%{{[^ ]+}}) <{source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[RI_LOOP:.*]]:6 = stablehlo.while(%[[RI_K:[^ ]+]] = %{{[^ ]+}}, %[[RI_RECV:[^ ]+]] = %{{[^ ]+}}, %[[RI_PART:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}})
// CHECK-NOT: channel_handle
// CHECK: %[[RI_SUM:.*]] = stablehlo.add %[[RI_RECV]], %[[RI_PART]]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[RI_SUM]]) <{source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[RI_OUT:.*]] = stablehlo.add %[[RI_LOOP]]#1, %[[RI_LOOP]]#2
// CHECK-NEXT: return %[[RI_OUT]] : tensor<2x8xf32>
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

// bf16: the accumulator keeps the reduce_scatter's element type, so the permutes
// move bf16 like the original collective would, and the bf16 sum of the received
// accumulator and the own part is returned; nothing is widened to f32.
// CHECK-LABEL: func.func @bf16
// CHECK-NOT: f32
// CHECK: %[[BF_LOOP:.*]]:6 = stablehlo.while(%[[BF_K:[^ ]+]] = %{{[^ ]+}}, %[[BF_RECV:[^ ]+]] = %{{[^ ]+}}, %[[BF_PART:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}}) : tensor<i32>, tensor<2x8xbf16>, tensor<2x8xbf16>,
// CHECK: %[[BF_SUM:.*]] = stablehlo.add %[[BF_RECV]], %[[BF_PART]] : tensor<2x8xbf16>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[BF_SUM]]) {{.*}} : (tensor<2x8xbf16>) -> tensor<2x8xbf16>
// CHECK: stablehlo.dot_general {{.*}} -> tensor<2x8xbf16>
// CHECK-NOT: f32
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[BF_OUT:.*]] = stablehlo.add %[[BF_LOOP]]#1, %[[BF_LOOP]]#2 : tensor<2x8xbf16>
// CHECK-NEXT: return %[[BF_OUT]] : tensor<2x8xbf16>
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
// CHECK: %[[SU_D0:.*]] = stablehlo.dot_general %{{[^ ]+}}, %arg1, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[SU_B0:.*]] = stablehlo.dynamic_update_slice %[[SU_ZERO]], %[[SU_D0]],
// CHECK: %[[SU_D1:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[SU_B1:.*]] = stablehlo.dynamic_update_slice %[[SU_B0]], %[[SU_D1]],
// CHECK: %[[SU_LOOP:.*]]:7 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[SU_BUF:[^ ]+]] = %[[SU_B1]], %[[SU_RECV:[^ ]+]] = %{{[^ ]+}}, %[[SU_PART:[^ ]+]] = %{{[^ ]+}},
// CHECK: %[[SU_SUM:.*]] = stablehlo.add %[[SU_RECV]], %[[SU_PART]]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[SU_SUM]])
// CHECK: %[[SU_P:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[SU_NEXT:.*]] = stablehlo.dynamic_update_slice %[[SU_BUF]], %[[SU_P]],
// CHECK: stablehlo.return %{{[^ ]+}}, %[[SU_NEXT]],
// CHECK: %[[SU_OUT:.*]] = stablehlo.add %[[SU_LOOP]]#2, %[[SU_LOOP]]#3
// CHECK-NEXT: return %[[SU_OUT]], %[[SU_LOOP]]#1
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
