// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=GONE

// Scatter dim 0 comes from a free dim of the lhs; 2 contiguous groups of 4 (blocks of
// 2 rows). Two chains of accumulators, one per half of each block (row 0 and row 1 of
// the block), travel the ring skewed by half a round. Round 0: chain 1 computes row 1
// of block (p + 1) mod 4 and sends it at once; chain 0 computes row 0 of that block
// and keeps it. The loop runs rounds 1..2 (it stops at 3): chain 0 first sends the
// sum it kept, chain 1 adds its part to the accumulator it received and sends the
// sum on, then chain 0 adds its part to the sum that has just arrived and keeps it.
// Each add reads its own round's dot (no optimization_barrier), so the compiler fuses
// it into the dot; each transfer runs beside the other chain's dot. The last round
// (the own block p) runs after the loop: chain 0's kept sum goes out, both chains add
// their part of the own block, and the halves are written into the result. The full
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
// CHECK-NEXT: %[[RL_ROW1:.*]] = stablehlo.add %[[RL_OFF0]], %[[RL_ONE]]
// CHECK: %[[RL_S0:.*]] = stablehlo.dynamic_slice %[[RL_A]], %[[RL_ROW1]], %{{[^ ]+}}, sizes = [1, 16] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<1x16xf32>
// CHECK-NEXT: %[[RL_D0:.*]] = stablehlo.dot_general %[[RL_S0]], %[[RL_B]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NEXT: %[[RL_R1:.*]] = "stablehlo.collective_permute"(%[[RL_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<1x8xf32>) -> tensor<1x8xf32>
// CHECK: %[[RL_S1:.*]] = stablehlo.dynamic_slice %[[RL_A]], %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 16]
// CHECK-NEXT: %[[RL_KEPT0:.*]] = stablehlo.dot_general %[[RL_S1]], %[[RL_B]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: %[[RL_LOOP:.*]]:6 = stablehlo.while(%[[RL_K:[^ ]+]] = %{{[^ ]+}}, %[[RL_KEPT:[^ ]+]] = %[[RL_KEPT0]], %[[RL_RECV:[^ ]+]] = %[[RL_R1]], %[[RL_LHS:[^ ]+]] = %[[RL_A]], %[[RL_RHS:[^ ]+]] = %[[RL_B]], %[[RL_P:[^ ]+]] = %[[RL_POS]])
// CHECK: cond {
// CHECK-NEXT: %[[RL_STOP:.*]] = stablehlo.constant dense<3> : tensor<i32>
// CHECK-NEXT: stablehlo.compare LT, %[[RL_K]], %[[RL_STOP]], SIGNED
// CHECK: } do {
// CHECK-NEXT: %[[RL_ARRIVED:.*]] = "stablehlo.collective_permute"(%[[RL_KEPT]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<1x8xf32>) -> tensor<1x8xf32>
// CHECK-NEXT: %[[RL_JK:.*]] = stablehlo.add %[[RL_P]], %[[RL_K]]
// CHECK: %[[RL_SLICE1:.*]] = stablehlo.dynamic_slice %[[RL_LHS]], %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 16]
// CHECK-NEXT: %[[RL_D1:.*]] = stablehlo.dot_general %[[RL_SLICE1]], %[[RL_RHS]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NEXT: %[[RL_SUM1:.*]] = stablehlo.add %[[RL_D1]], %[[RL_RECV]] : tensor<1x8xf32>
// CHECK-NEXT: %[[RL_MOVED:.*]] = "stablehlo.collective_permute"(%[[RL_SUM1]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<1x8xf32>) -> tensor<1x8xf32>
// CHECK: %[[RL_SLICE0:.*]] = stablehlo.dynamic_slice %[[RL_LHS]], %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 16]
// CHECK-NEXT: %[[RL_D2:.*]] = stablehlo.dot_general %[[RL_SLICE0]], %[[RL_RHS]]
// CHECK-NEXT: %[[RL_SUM0:.*]] = stablehlo.add %[[RL_D2]], %[[RL_ARRIVED]] : tensor<1x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[RL_SUM0]], %[[RL_MOVED]], %[[RL_LHS]], %[[RL_RHS]], %[[RL_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: %[[RL_LAST:.*]] = "stablehlo.collective_permute"(%[[RL_LOOP]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>
// CHECK: %[[RL_OWN1:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RL_HALF1:.*]] = stablehlo.add %[[RL_OWN1]], %[[RL_LOOP]]#2 : tensor<1x8xf32>
// CHECK: %[[RL_OWN0:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RL_HALF0:.*]] = stablehlo.add %[[RL_OWN0]], %[[RL_LAST]] : tensor<1x8xf32>
// CHECK-NEXT: %[[RL_BUF:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<2x8xf32>
// CHECK-NEXT: %[[RL_W0:.*]] = stablehlo.dynamic_update_slice %[[RL_BUF]], %[[RL_HALF0]], %{{[^ ]+}}, %{{[^ ]+}}
// CHECK-NEXT: %[[RL_OUT:.*]] = stablehlo.dynamic_update_slice %[[RL_W0]], %[[RL_HALF1]], %[[RL_ONE]], %{{[^ ]+}}
// CHECK-NEXT: return %[[RL_OUT]] : tensor<2x8xf32>
// GONE-LABEL: func.func @free_lhs
// GONE-NOT: tensor<8x8xf32>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @free_lhs(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
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
// [1,3,5,7]]: the rhs columns are sliced (one column per chain), the lhs is used
// whole, in round 0, in the loop (rounds 1..2) and in the own block's round after it,
// whose halves are written into the result along dim 1.
// CHECK-LABEL: func.func @free_rhs
// CHECK-SAME: (%[[RR_A:.*]]: tensor<8x16xf32>, %[[RR_B:.*]]: tensor<16x8xf32>)
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: %[[RR_S0:.*]] = stablehlo.dynamic_slice %[[RR_B]], %{{.*}}, %{{.*}}, sizes = [16, 1]
// CHECK-NEXT: %[[RR_D0:.*]] = stablehlo.dot_general %[[RR_A]], %[[RR_S0]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK-NEXT: %[[RR_R1:.*]] = "stablehlo.collective_permute"(%[[RR_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}> : (tensor<8x1xf32>) -> tensor<8x1xf32>
// CHECK: %[[RR_KEPT0:.*]] = stablehlo.dot_general %[[RR_A]]
// CHECK: %[[RR_LOOP:.*]]:6 = stablehlo.while(%[[RR_K:[^ ]+]] = %{{[^ ]+}}, %[[RR_KEPT:[^ ]+]] = %[[RR_KEPT0]], %[[RR_RECV:[^ ]+]] = %[[RR_R1]], %[[RR_LHS:[^ ]+]] = %[[RR_A]], %[[RR_RHS:[^ ]+]] = %[[RR_B]], %[[RR_P:[^ ]+]] = %{{[^ ]+}})
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<3> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[RR_ARRIVED:.*]] = "stablehlo.collective_permute"(%[[RR_KEPT]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}> : (tensor<8x1xf32>) -> tensor<8x1xf32>
// CHECK: %[[RR_SLICE1:.*]] = stablehlo.dynamic_slice %[[RR_RHS]], %{{.*}}, %{{.*}}, sizes = [16, 1]
// CHECK-NEXT: %[[RR_D1:.*]] = stablehlo.dot_general %[[RR_LHS]], %[[RR_SLICE1]]
// CHECK-NEXT: %[[RR_SUM1:.*]] = stablehlo.add %[[RR_D1]], %[[RR_RECV]] : tensor<8x1xf32>
// CHECK-NEXT: %[[RR_MOVED:.*]] = "stablehlo.collective_permute"(%[[RR_SUM1]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>
// CHECK: %[[RR_D2:.*]] = stablehlo.dot_general %[[RR_LHS]]
// CHECK-NEXT: %[[RR_SUM0:.*]] = stablehlo.add %[[RR_D2]], %[[RR_ARRIVED]] : tensor<8x1xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[RR_SUM0]], %[[RR_MOVED]], %[[RR_LHS]], %[[RR_RHS]], %[[RR_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: %[[RR_LAST:.*]] = "stablehlo.collective_permute"(%[[RR_LOOP]]#1)
// CHECK: %[[RR_HALF1:.*]] = stablehlo.add %{{[^ ]+}}, %[[RR_LOOP]]#2 : tensor<8x1xf32>
// CHECK: %[[RR_HALF0:.*]] = stablehlo.add %{{[^ ]+}}, %[[RR_LAST]] : tensor<8x1xf32>
// CHECK-NEXT: %[[RR_BUF:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<8x2xf32>
// CHECK-NEXT: %[[RR_W0:.*]] = stablehlo.dynamic_update_slice %[[RR_BUF]], %[[RR_HALF0]], %{{[^ ]+}}, %{{[^ ]+}}
// CHECK-NEXT: %[[RR_OUT:.*]] = stablehlo.dynamic_update_slice %[[RR_W0]], %[[RR_HALF1]], %{{[^ ]+}}, %{{[^ ]+}}
// CHECK-NEXT: return %[[RR_OUT]] : tensor<8x2xf32>
// GONE-LABEL: func.func @free_rhs
// GONE-NOT: tensor<8x8xf32>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @free_rhs(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x2xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 1 (free dim of operand 1) over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
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
// and no loop. Both operands are sliced at the same batch offset (one batch per
// chain). Round 0: chain 1's part of block (p + 1) mod 2 goes out at once, chain 0's
// is kept. Round 1: chain 0's kept part goes out, and each chain adds its part of the
// own block p to what it received; the halves are written into the result.
// CHECK-LABEL: func.func @batch
// CHECK-SAME: (%[[RB_A:.*]]: tensor<4x8x16xf32>, %[[RB_B:.*]]: tensor<4x16x8xf32>)
// CHECK: stablehlo.constant dense<[0, 1, 0, 1, 0, 1, 0, 1]> : tensor<8xi32>
// CHECK: %[[RB_POS:.*]] = stablehlo.reshape
// CHECK-NOT: stablehlo.while
// CHECK: %[[RB_M0:.*]] = stablehlo.multiply
// CHECK-NEXT: %[[RB_OFF0:.*]] = stablehlo.add %[[RB_M0]]
// CHECK: %[[RB_SA0:.*]] = stablehlo.dynamic_slice %[[RB_A]], %[[RB_OFF0]], %{{.*}}, %{{.*}}, sizes = [1, 8, 16]
// CHECK-NEXT: %[[RB_SB0:.*]] = stablehlo.dynamic_slice %[[RB_B]], %[[RB_OFF0]], %{{.*}}, %{{.*}}, sizes = [1, 16, 8]
// CHECK-NEXT: %[[RB_D0:.*]] = stablehlo.dot_general %[[RB_SA0]], %[[RB_SB0]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x8x16xf32>, tensor<1x16x8xf32>) -> tensor<1x8x8xf32>
// CHECK-NEXT: %[[RB_MOVED:.*]] = "stablehlo.collective_permute"(%[[RB_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[RB_KEPT:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RB_ARRIVED:.*]] = "stablehlo.collective_permute"(%[[RB_KEPT]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// CHECK: %[[RB_OWN1:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RB_HALF1:.*]] = stablehlo.add %[[RB_OWN1]], %[[RB_MOVED]] : tensor<1x8x8xf32>
// CHECK: %[[RB_OWN0:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RB_HALF0:.*]] = stablehlo.add %[[RB_OWN0]], %[[RB_ARRIVED]] : tensor<1x8x8xf32>
// CHECK: stablehlo.dynamic_update_slice %{{[^ ]+}}, %[[RB_HALF0]]
// CHECK-NEXT: %[[RB_OUT:.*]] = stablehlo.dynamic_update_slice %{{[^ ]+}}, %[[RB_HALF1]]
// CHECK-NEXT: return %[[RB_OUT]] : tensor<2x8x8xf32>
// GONE-LABEL: func.func @batch
// GONE-NOT: tensor<4x8x8xf32>
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @batch(%arg0: tensor<4x8x16xf32>, %arg1: tensor<4x16x8xf32>) -> tensor<2x8x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<4x8x8xf32> scattered on dim 0 (batch) over groups of 2; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
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
// a plain add. One group of all 8 partitions, blocks of one row: one chain, which
// adds its part to the accumulator it received and sends the sum on (no other
// chain's dot to overlap). Round 0 before the loop, rounds 1..6 in it, and the own
// block's round after it.
// CHECK-LABEL: func.func @add_swapped
// CHECK: stablehlo.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>
// CHECK: "stablehlo.collective_permute"({{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[AS_LOOP:.*]]:5 = stablehlo.while(%[[AS_K:[^ ]+]] = %{{[^ ]+}}, %[[AS_RECV:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}}) : tensor<i32>, tensor<1x8xf32>,
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<7> : tensor<i32>
// CHECK: } do {
// CHECK: %[[AS_D:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[AS_SUM:.*]] = stablehlo.add %[[AS_D]], %[[AS_RECV]]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[AS_SUM]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[AS_OWN:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[AS_OUT:.*]] = stablehlo.add %[[AS_OWN]], %[[AS_LOOP]]#1 : tensor<1x8xf32>
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
// position and the permutes (round 0's, the loop's two, the last round's) carry no
// channel handle.
// CHECK-LABEL: func.func @replica_ids
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.partition_id
// CHECK: stablehlo.replica_id
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%{{[^ ]+}}) <{source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[RI_LOOP:.*]]:6 = stablehlo.while(%[[RI_K:[^ ]+]] = %{{[^ ]+}}, %[[RI_KEPT:[^ ]+]] = %{{[^ ]+}}, %[[RI_RECV:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}})
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%[[RI_KEPT]]) <{source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[RI_SUM:.*]] = stablehlo.add %{{[^ ]+}}, %[[RI_RECV]]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[RI_SUM]]) <{source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%[[RI_LOOP]]#1) <{source_target_pairs
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dynamic_update_slice
// CHECK-NEXT: %[[RI_OUT:.*]] = stablehlo.dynamic_update_slice
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

// bf16: the accumulators keep the reduce_scatter's element type, so the permutes
// move bf16 like the original collective would, and the bf16 sums are written into
// the bf16 result; nothing is widened to f32.
// CHECK-LABEL: func.func @bf16
// CHECK-NOT: f32
// CHECK: %[[BF_LOOP:.*]]:6 = stablehlo.while(%[[BF_K:[^ ]+]] = %{{[^ ]+}}, %[[BF_KEPT:[^ ]+]] = %{{[^ ]+}}, %[[BF_RECV:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %{{.*}}) : tensor<i32>, tensor<1x8xbf16>, tensor<1x8xbf16>,
// CHECK: stablehlo.dot_general {{.*}} -> tensor<1x8xbf16>
// CHECK-NEXT: %[[BF_SUM:.*]] = stablehlo.add %{{[^ ]+}}, %[[BF_RECV]] : tensor<1x8xbf16>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[BF_SUM]]) {{.*}} : (tensor<1x8xbf16>) -> tensor<1x8xbf16>
// CHECK-NOT: f32
// CHECK: stablehlo.dynamic_update_slice
// CHECK-NEXT: %[[BF_OUT:.*]] = stablehlo.dynamic_update_slice {{.*}} : (tensor<2x8xbf16>, tensor<1x8xbf16>, tensor<i32>, tensor<i32>) -> tensor<2x8xbf16>
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
// block of this device's product exactly once anyway (each chain its half), so it
// writes each part into a buffer (carried by the loop) that replaces the dot for the
// other reader.
// CHECK-LABEL: func.func @dot_second_user
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: %[[SU_ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<8x8xf32>
// CHECK: %[[SU_D0:.*]] = stablehlo.dot_general %{{[^ ]+}}, %arg1, contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NEXT: %[[SU_B0:.*]] = stablehlo.dynamic_update_slice %[[SU_ZERO]], %[[SU_D0]],
// CHECK: %[[SU_D1:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[SU_B1:.*]] = stablehlo.dynamic_update_slice %[[SU_B0]], %[[SU_D1]],
// CHECK: %[[SU_LOOP:.*]]:7 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[SU_BUF:[^ ]+]] = %[[SU_B1]], %[[SU_KEPT:[^ ]+]] = %{{[^ ]+}}, %[[SU_RECV:[^ ]+]] = %{{[^ ]+}},
// CHECK: %[[SU_P:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[SU_B2:.*]] = stablehlo.dynamic_update_slice %[[SU_BUF]], %[[SU_P]],
// CHECK-NEXT: %[[SU_SUM:.*]] = stablehlo.add %[[SU_P]], %[[SU_RECV]]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[SU_SUM]])
// CHECK: %[[SU_Q:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[SU_NEXT:.*]] = stablehlo.dynamic_update_slice %[[SU_B2]], %[[SU_Q]],
// CHECK: stablehlo.return %{{[^ ]+}}, %[[SU_NEXT]],
// CHECK: %[[SU_P1:.*]] = stablehlo.dynamic_update_slice %[[SU_LOOP]]#1,
// CHECK: %[[SU_PROD:.*]] = stablehlo.dynamic_update_slice %[[SU_P1]],
// CHECK: stablehlo.dynamic_update_slice
// CHECK-NEXT: %[[SU_OUT:.*]] = stablehlo.dynamic_update_slice
// CHECK-NEXT: return %[[SU_OUT]], %[[SU_PROD]]
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

// -----

// The dot's 16 rows reshaped to 4x4 and scattered on the first (MaxText's MoE combine:
// tokens split into experts x capacity): each device's block is 4 contiguous rows of
// the product, so the reduce_scatter moves before the reshape and becomes the ring;
// the reshape then applies to the device's 4x8 block.
// CHECK-LABEL: func.func @rs_behind_split
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: stablehlo.while
// CHECK: stablehlo.dynamic_update_slice {{.*}} -> tensor<4x8xf32>
// CHECK: %[[OUT:.*]] = stablehlo.reshape %{{.*}} : (tensor<4x8xf32>) -> tensor<1x4x8xf32>
// CHECK-NEXT: return %[[OUT]]
// REMARK: remark: overlap-matmul-reduce-scatter: rewritten: tensor<16x8xf32> scattered on dim 0
module @rs_behind_split attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_behind_split(%x: tensor<16x4xf32>, %w: tensor<4x8xf32>) -> tensor<1x4x8xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x4xf32>, tensor<4x8xf32>) -> tensor<16x8xf32>
    %1 = stablehlo.reshape %0 : (tensor<16x8xf32>) -> tensor<4x4x8xf32>
    %2 = "stablehlo.reduce_scatter"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %3 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<4x4x8xf32>) -> tensor<1x4x8xf32>
    return %2 : tensor<1x4x8xf32>
  }
}

// -----

// A prologue: the dot's lhs is h * broadcast(convert(0.5)) (JAX writes a Python float
// in a bf16 expression so). The ring slices h and replays the multiply on each block,
// the converted scalar rebuilt as a uniform value, so the multiply fuses into the
// block's dot; the whole product h * 0.5 is never built.
// CHECK-LABEL: func.func @rs_prologue
// CHECK-SAME: (%[[PH:.*]]: tensor<8x16xbf16>, %[[PW:.*]]: tensor<16x8xbf16>)
// CHECK-NOT: tensor<8x16xbf16> = stablehlo.multiply
// CHECK: %[[PS:.*]] = stablehlo.dynamic_slice %[[PH]], %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 16]
// CHECK: %[[PC:.*]] = stablehlo.convert %{{[^ ]+}} : (tensor<f32>) -> tensor<bf16>
// CHECK-NEXT: %[[PB:.*]] = stablehlo.broadcast_in_dim %[[PC]], dims = [] : (tensor<bf16>) -> tensor<1x16xbf16>
// CHECK-NEXT: %[[PM:.*]] = stablehlo.multiply %[[PS]], %[[PB]] : tensor<1x16xbf16>
// CHECK-NEXT: stablehlo.dot_general %[[PM]], %[[PW]]
// CHECK-NOT: stablehlo.reduce_scatter
// REMARK: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xbf16> scattered on dim 0 (free dim of operand 0) over groups of 4; the elementwise ops making 1 of its dots' operands (1 op(s)) run on each block, fused into its dot;
module @rs_prologue attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_prologue(%h: tensor<8x16xbf16>, %w: tensor<16x8xbf16>) -> tensor<2x8xbf16> {
    %c = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %cv = stablehlo.convert %c : (tensor<f32>) -> tensor<bf16>
    %half = stablehlo.broadcast_in_dim %cv, dims = [] : (tensor<bf16>) -> tensor<8x16xbf16>
    %x = stablehlo.multiply %h, %half : tensor<8x16xbf16>
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xbf16>, tensor<16x8xbf16>) -> tensor<8x8xbf16>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<bf16>, %b: tensor<bf16>):
      %2 = stablehlo.add %a, %b : tensor<bf16>
      stablehlo.return %2 : tensor<bf16>
    }) : (tensor<8x8xbf16>) -> tensor<2x8xbf16>
    return %1 : tensor<2x8xbf16>
  }
}

// -----

// The sum of the dot and a bias is returned too (read after the scatter): each block of
// this device's sum (its dot block plus its block of the bias) is written into a buffer
// as the ring computes it, and that buffer replaces the sum.
// CHECK-LABEL: func.func @biased_sum_second_user
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: %[[BS_D0:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[BS_T0:.*]] = stablehlo.dynamic_slice %arg2,
// CHECK-NEXT: %[[BS_S0:.*]] = stablehlo.add %[[BS_D0]], %[[BS_T0]]
// CHECK-NEXT: stablehlo.dynamic_update_slice %{{[^ ]+}}, %[[BS_S0]],
// CHECK-NEXT: "stablehlo.collective_permute"(%[[BS_S0]])
// CHECK: stablehlo.while
// CHECK: "stablehlo.collective_permute"(%{{[^ ]+}}#2)
// CHECK: %[[BS_P1:.*]] = stablehlo.dynamic_update_slice %{{[^ ]+}}#1,
// CHECK: %[[BS_SUM:.*]] = stablehlo.dynamic_update_slice %[[BS_P1]],
// CHECK: return %{{[^ ]+}}, %[[BS_SUM]]
// GONE-LABEL: func.func @biased_sum_second_user
// GONE-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @biased_sum_second_user(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>, %bias: tensor<8x8xf32>) -> (tensor<2x8xf32>, tensor<8x8xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.add %0, %bias : tensor<8x8xf32>
    // REMARK: overlap-matmul-reduce-scatter.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 4; 1 added term(s) (a bias) folded in: each device adds its own block of it once; the ring assembles the sum of its dots and added terms for 1 other reader(s);
    %2 = "stablehlo.reduce_scatter"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %3 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %2, %1 : tensor<2x8xf32>, tensor<8x8xf32>
  }
}
