// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 unroll=2},overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=U2
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 unroll=3},overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=U3
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 unroll=4},overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=U4
// RUN: overlap-opt %s --threshold-mib=0 --unroll=2 --split-input-file | FileCheck %s --check-prefix=FLAG

// unroll=U: the loop body runs U ring rounds, its induction variable steps by U,
// and the middle rounds that do not fill a whole iteration run inline after the
// loop (before the peeled last round); a loop that would run once is not built
// (its rounds run inline). Inside an iteration each round's permute
// reads the shard (or accumulator) the previous round moved, so every round keeps
// one permute next to one dot that does not read it; in the all_gather ring that
// shard passes, with the previous round's result, through an optimization_barrier
// first, so the previous round's dot runs while its own shift travels. The FLAG prefix checks that
// --unroll=2 reaches the passes of the default pipeline (canonicalize and cse hoist
// the constants there).

// All_gather over one group of 8: rounds 1..6 are the middle rounds.
// unroll=2: three iterations of two rounds (k and k + 1), stop at 7, step 2, no
//   remainder; round 7 after the loop.
// unroll=3: two iterations of three rounds.
// unroll=4: one iteration of four rounds would run once, and such a loop is not
//   built: rounds 1..6 inline (each with its permute, after the optimization_barrier
//   that ties the shard it sends to the previous round's product), then round 7
//   without one.
// U2-LABEL: func.func @ag8
// U2-SAME: (%[[U2A_X:.*]]: tensor<1x16xf32>, %[[U2A_W:.*]]: tensor<16x8xf32>)
// U2: %[[U2A_SENT:.*]] = "stablehlo.collective_permute"(%[[U2A_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// U2: %[[U2A_LOOP:.*]]:5 = stablehlo.while(%[[U2A_K:[^ ]+]] = %{{[^ ]+}}, %[[U2A_CUR:[^ ]+]] = %[[U2A_SENT]], %[[U2A_ACC:[^ ]+]] = %{{[^ ]+}}, %[[U2A_OTHER:[^ ]+]] = %[[U2A_W]], %[[U2A_P:[^ ]+]] = %{{[^ ]+}})
// U2: cond {
// U2-NEXT: %[[U2A_STOP:.*]] = stablehlo.constant dense<7> : tensor<i32>
// U2-NEXT: stablehlo.compare LT, %[[U2A_K]], %[[U2A_STOP]], SIGNED
// U2: } do {
// U2-NEXT: %[[U2A_M1:.*]] = "stablehlo.collective_permute"(%[[U2A_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// U2-NEXT: %[[U2A_J1:.*]] = stablehlo.add %[[U2A_P]], %[[U2A_K]] : tensor<i32>
// U2: %[[U2A_OFF1:.*]] = stablehlo.multiply
// U2-NEXT: %[[U2A_D1:.*]] = stablehlo.dot_general %[[U2A_CUR]], %[[U2A_OTHER]]
// U2: %[[U2A_A1:.*]] = stablehlo.dynamic_update_slice %[[U2A_ACC]], %[[U2A_D1]], %[[U2A_OFF1]],
// U2: %[[U2A_K1:.*]] = stablehlo.add %[[U2A_K]], %{{[^ ]+}} : tensor<i32>
// U2-NEXT: %[[U2A_T:.*]]:2 = stablehlo.optimization_barrier %[[U2A_M1]], %[[U2A_A1]] : tensor<1x16xf32>, tensor<8x8xf32>
// U2-NEXT: %[[U2A_M2:.*]] = "stablehlo.collective_permute"(%[[U2A_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// U2-NEXT: %[[U2A_J2:.*]] = stablehlo.add %[[U2A_P]], %[[U2A_K1]] : tensor<i32>
// U2: %[[U2A_OFF2:.*]] = stablehlo.multiply
// U2-NEXT: %[[U2A_D2:.*]] = stablehlo.dot_general %[[U2A_T]]#0, %[[U2A_OTHER]]
// U2: %[[U2A_A2:.*]] = stablehlo.dynamic_update_slice %[[U2A_T]]#1, %[[U2A_D2]], %[[U2A_OFF2]],
// U2-NEXT: %[[U2A_STEP:.*]] = stablehlo.constant dense<2> : tensor<i32>
// U2-NEXT: %[[U2A_NEXT:.*]] = stablehlo.add %[[U2A_K]], %[[U2A_STEP]] : tensor<i32>
// U2-NEXT: stablehlo.return %[[U2A_NEXT]], %[[U2A_M2]], %[[U2A_A2]], %[[U2A_OTHER]], %[[U2A_P]] :
// U2-NEXT: }
// U2-NOT: stablehlo.collective_permute
// U2: %[[U2A_LAST:.*]] = stablehlo.dot_general %[[U2A_LOOP]]#1, %[[U2A_W]]
// U2-NOT: stablehlo.collective_permute
// U2: return
// U3-LABEL: func.func @ag8
// U3: stablehlo.while(%[[U3A_K:[^ ]+]] = %{{[^ ]+}}, %[[U3A_CUR:[^ ]+]] = %{{[^ ]+}},
// U3: cond {
// U3-NEXT: stablehlo.constant dense<7> : tensor<i32>
// U3: } do {
// U3-NEXT: %[[U3A_M1:.*]] = "stablehlo.collective_permute"(%[[U3A_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// U3: stablehlo.dot_general %[[U3A_CUR]],
// U3: %[[U3A_M1_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U3A_M1]],
// U3-NEXT: %[[U3A_M2:.*]] = "stablehlo.collective_permute"(%[[U3A_M1_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>
// U3: stablehlo.dot_general %[[U3A_M1_T]]#0,
// U3: %[[U3A_C2:.*]] = stablehlo.constant dense<2> : tensor<i32>
// U3-NEXT: %[[U3A_K2:.*]] = stablehlo.add %[[U3A_K]], %[[U3A_C2]]
// U3-NEXT: %[[U3A_M2_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U3A_M2]],
// U3-NEXT: %[[U3A_M3:.*]] = "stablehlo.collective_permute"(%[[U3A_M2_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>
// U3-NEXT: stablehlo.add %{{[^ ]+}}, %[[U3A_K2]]
// U3: stablehlo.dot_general %[[U3A_M2_T]]#0,
// U3-NOT: stablehlo.collective_permute
// U3-NOT: stablehlo.dot_general
// U3: %[[U3A_STEP:.*]] = stablehlo.constant dense<3> : tensor<i32>
// U3-NEXT: %[[U3A_NEXT:.*]] = stablehlo.add %[[U3A_K]], %[[U3A_STEP]]
// U3-NEXT: stablehlo.return %[[U3A_NEXT]], %[[U3A_M3]],
// U3-NEXT: }
// U3-NOT: stablehlo.collective_permute
// U3: return
// U4-LABEL: func.func @ag8
// U4-NOT: stablehlo.while
// U4: %[[U4A_R0:.*]] = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// U4: %[[U4A_R0_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U4A_R0]],
// U4-NEXT: %[[U4A_R1:.*]] = "stablehlo.collective_permute"(%[[U4A_R0_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// U4: stablehlo.dot_general %[[U4A_R0_T]]#0, %arg1
// U4: %[[U4A_R1_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U4A_R1]],
// U4-NEXT: %[[U4A_R2:.*]] = "stablehlo.collective_permute"(%[[U4A_R1_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>
// U4: stablehlo.dot_general %[[U4A_R1_T]]#0, %arg1
// U4: %[[U4A_R2_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U4A_R2]],
// U4-NEXT: %[[U4A_R3:.*]] = "stablehlo.collective_permute"(%[[U4A_R2_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>
// U4: stablehlo.dot_general %[[U4A_R2_T]]#0, %arg1
// U4: %[[U4A_R3_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U4A_R3]],
// U4-NEXT: %[[U4A_R4:.*]] = "stablehlo.collective_permute"(%[[U4A_R3_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>
// U4: stablehlo.dot_general %[[U4A_R3_T]]#0, %arg1
// U4: %[[U4A_R4_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U4A_R4]],
// U4-NEXT: %[[U4A_R5:.*]] = "stablehlo.collective_permute"(%[[U4A_R4_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 7, type = 1>
// U4: stablehlo.dot_general %[[U4A_R4_T]]#0, %arg1
// U4: %[[U4A_R5_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U4A_R5]],
// U4-NEXT: %[[U4A_R6:.*]] = "stablehlo.collective_permute"(%[[U4A_R5_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 8, type = 1>
// U4: stablehlo.dot_general %[[U4A_R5_T]]#0, %arg1
// U4-NOT: stablehlo.collective_permute
// U4: stablehlo.dot_general %[[U4A_R6]], %arg1
// U4-NOT: {{stablehlo.collective_permute|stablehlo.while}}
// U4: return
// FLAG-LABEL: func.func @ag8
// FLAG: %[[FA_TWO:.*]] = stablehlo.constant dense<2> : tensor<i32>
// FLAG: %[[FA_SEVEN:.*]] = stablehlo.constant dense<7> : tensor<i32>
// FLAG: stablehlo.while(%[[FA_K:[^ ]+]] = %{{[^ ]+}},
// FLAG: stablehlo.compare LT, %[[FA_K]], %[[FA_SEVEN]], SIGNED
// FLAG: } do {
// FLAG-NEXT: "stablehlo.collective_permute"
// FLAG: "stablehlo.collective_permute"
// FLAG-NOT: "stablehlo.collective_permute"
// FLAG: stablehlo.add %[[FA_K]], %[[FA_TWO]] : tensor<i32>
// FLAG-NEXT: stablehlo.return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag8(%arg0: tensor<1x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<1x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Reduce_scatter over one group of 8 with blocks of one row: one chain, which adds
// its part to the accumulator it received and sends the sum on, one round per
// iteration whatever the all_gather pass's unroll (round 0 before the loop, rounds
// 1..6 in it, the own block's round after it).
// U2-LABEL: func.func @rs8
// U2: %[[U2R_D0:.*]] = stablehlo.dot_general
// U2-NEXT: %[[U2R_R0:.*]] = "stablehlo.collective_permute"(%[[U2R_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// U2: %[[U2R_LOOP:.*]]:5 = stablehlo.while(%[[U2R_K:[^ ]+]] = %{{[^ ]+}}, %[[U2R_RECV:[^ ]+]] = %[[U2R_R0]],
// U2: cond {
// U2-NEXT: stablehlo.constant dense<7> : tensor<i32>
// U2: } do {
// U2: %[[U2R_D:.*]] = stablehlo.dot_general
// U2-NEXT: %[[U2R_S:.*]] = stablehlo.add %[[U2R_D]], %[[U2R_RECV]]
// U2-NEXT: %[[U2R_M:.*]] = "stablehlo.collective_permute"(%[[U2R_S]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// U2-NOT: "stablehlo.collective_permute"
// U2: %[[U2R_NEXT:.*]] = stablehlo.add %[[U2R_K]], %{{[^ ]+}} : tensor<i32>
// U2-NEXT: stablehlo.return %[[U2R_NEXT]], %[[U2R_M]],
// U2: %[[U2R_OWN:.*]] = stablehlo.dot_general
// U2-NEXT: %[[U2R_OUT:.*]] = stablehlo.add %[[U2R_OWN]], %[[U2R_LOOP]]#1
// U2-NEXT: return %[[U2R_OUT]]
// U3-LABEL: func.func @rs8
// U3: %[[U3R_D0:.*]] = stablehlo.dot_general
// U3-NEXT: %[[U3R_R0:.*]] = "stablehlo.collective_permute"(%[[U3R_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// U3: %[[U3R_LOOP:.*]]:5 = stablehlo.while(%[[U3R_K:[^ ]+]] = %{{[^ ]+}}, %[[U3R_RECV:[^ ]+]] = %[[U3R_R0]],
// U3: cond {
// U3-NEXT: stablehlo.constant dense<7> : tensor<i32>
// U3: } do {
// U3: %[[U3R_D:.*]] = stablehlo.dot_general
// U3-NEXT: %[[U3R_S:.*]] = stablehlo.add %[[U3R_D]], %[[U3R_RECV]]
// U3-NEXT: %[[U3R_M:.*]] = "stablehlo.collective_permute"(%[[U3R_S]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// U3-NOT: "stablehlo.collective_permute"
// U3: %[[U3R_NEXT:.*]] = stablehlo.add %[[U3R_K]], %{{[^ ]+}} : tensor<i32>
// U3-NEXT: stablehlo.return %[[U3R_NEXT]], %[[U3R_M]],
// U3: %[[U3R_OWN:.*]] = stablehlo.dot_general
// U3-NEXT: %[[U3R_OUT:.*]] = stablehlo.add %[[U3R_OWN]], %[[U3R_LOOP]]#1
// U3-NEXT: return %[[U3R_OUT]]
// U4-LABEL: func.func @rs8
// U4: %[[U4R_D0:.*]] = stablehlo.dot_general
// U4-NEXT: %[[U4R_R0:.*]] = "stablehlo.collective_permute"(%[[U4R_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// U4: %[[U4R_LOOP:.*]]:5 = stablehlo.while(%[[U4R_K:[^ ]+]] = %{{[^ ]+}}, %[[U4R_RECV:[^ ]+]] = %[[U4R_R0]],
// U4: cond {
// U4-NEXT: stablehlo.constant dense<7> : tensor<i32>
// U4: } do {
// U4: %[[U4R_D:.*]] = stablehlo.dot_general
// U4-NEXT: %[[U4R_S:.*]] = stablehlo.add %[[U4R_D]], %[[U4R_RECV]]
// U4-NEXT: %[[U4R_M:.*]] = "stablehlo.collective_permute"(%[[U4R_S]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// U4-NOT: "stablehlo.collective_permute"
// U4: %[[U4R_NEXT:.*]] = stablehlo.add %[[U4R_K]], %{{[^ ]+}} : tensor<i32>
// U4-NEXT: stablehlo.return %[[U4R_NEXT]], %[[U4R_M]],
// U4: %[[U4R_OWN:.*]] = stablehlo.dot_general
// U4-NEXT: %[[U4R_OUT:.*]] = stablehlo.add %[[U4R_OWN]], %[[U4R_LOOP]]#1
// U4-NEXT: return %[[U4R_OUT]]
// FLAG-LABEL: func.func @rs8
// FLAG: stablehlo.while(%[[FR_K:[^ ]+]] = %{{[^ ]+}},
// FLAG: } do {
// FLAG: "stablehlo.collective_permute"
// FLAG-NOT: "stablehlo.collective_permute"
// FLAG: stablehlo.return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs8(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<1x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<1x8xf32>
    return %1 : tensor<1x8xf32>
  }
}

// -----

// All_gather over 2 groups of 4 (blocks of 3 rows): rounds 1 and 2 are the middle
// rounds. unroll=2 would fill exactly one iteration and unroll=3 none: a loop that
// would run once is not built either, so in both rounds 1 and 2 are inline, each
// with its permute, and round 3 follows without one.
// U2-LABEL: func.func @ag4
// U2-NOT: stablehlo.while
// U2: %[[U2G_R0:.*]] = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// U2-NOT: stablehlo.while
// U2: %[[U2G_R0_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U2G_R0]],
// U2-NEXT: %[[U2G_R1:.*]] = "stablehlo.collective_permute"(%[[U2G_R0_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// U2: stablehlo.dot_general %[[U2G_R0_T]]#0, %arg1
// U2: %[[U2G_R1_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U2G_R1]],
// U2-NEXT: %[[U2G_R2:.*]] = "stablehlo.collective_permute"(%[[U2G_R1_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>
// U2-NOT: stablehlo.while
// U2: stablehlo.dot_general %[[U2G_R1_T]]#0, %arg1
// U2-NOT: stablehlo.collective_permute
// U2: stablehlo.dot_general %[[U2G_R2]], %arg1
// U2-NOT: stablehlo.collective_permute
// U2-NOT: stablehlo.while
// U2: return
// U3-LABEL: func.func @ag4
// U3-NOT: stablehlo.while
// U3: %[[U3G_R0:.*]] = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// U3-NOT: stablehlo.while
// U3: %[[U3G_R0_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U3G_R0]],
// U3-NEXT: %[[U3G_R1:.*]] = "stablehlo.collective_permute"(%[[U3G_R0_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// U3: stablehlo.dot_general %[[U3G_R0_T]]#0, %arg1
// U3: %[[U3G_R1_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[U3G_R1]],
// U3-NEXT: %[[U3G_R2:.*]] = "stablehlo.collective_permute"(%[[U3G_R1_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>
// U3-NOT: stablehlo.while
// U3: stablehlo.dot_general %[[U3G_R1_T]]#0, %arg1
// U3-NOT: stablehlo.collective_permute
// U3: stablehlo.dot_general %[[U3G_R2]], %arg1
// U3-NOT: stablehlo.collective_permute
// U3-NOT: stablehlo.while
// U3: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag4(%arg0: tensor<3x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<12x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<3x16xf32>) -> tensor<12x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<12x16xf32>, tensor<16x8xf32>) -> tensor<12x8xf32>
    return %1 : tensor<12x8xf32>
  }
}

// -----

// A ring that sums (the gathered dim is contracting) over one group of 8.
// unroll=2: rounds 1..7 do not fill whole iterations but all 8 rounds do, so round 0
//   runs in the loop too and the sum starts from zeros: no dot before the loop, the
//   loop counts 0..8 by 2, and its result is the function's.
// unroll=3: rounds 0 and 1 run before the loop (round 0's product starts the sum),
//   rounds 2..7 in two iterations.
// U2-LABEL: func.func @sum8
// U2-NOT: stablehlo.dot_general
// U2: %[[U2S_ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<16x8xf32>
// U2: %[[U2S_START:.*]] = stablehlo.constant dense<0> : tensor<i32>
// U2-NOT: stablehlo.dot_general
// U2: %[[U2S_LOOP:.*]]:5 = stablehlo.while(%[[U2S_K:[^ ]+]] = %[[U2S_START]], %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %[[U2S_ZERO]],
// U2: stablehlo.constant dense<8> : tensor<i32>
// U2: } do {
// U2-COUNT-2: stablehlo.dot_general
// U2: stablehlo.return
// U2-NEXT: }
// U2-NEXT: return %[[U2S_LOOP]]#2
// U3-LABEL: func.func @sum8
// U3: %[[U3S_TWO:.*]] = stablehlo.constant dense<2> : tensor<i32>
// U3-COUNT-2: stablehlo.dot_general
// U3: stablehlo.while(%{{[^ ]+}} = %[[U3S_TWO]],
// U3: } do {
// U3-COUNT-3: stablehlo.dot_general
// U3: stablehlo.return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @sum8(%arg0: tensor<16x2xf32>, %arg1: tensor<16x8xf32>) -> tensor<16x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<16x2xf32>) -> tensor<16x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }
}
