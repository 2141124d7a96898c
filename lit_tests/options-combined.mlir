// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true unroll=2},overlap-matmul-reduce-scatter{threshold-mib=0 bidirectional=true})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --unroll=2 --split-input-file | FileCheck %s --check-prefix=FLAG

// bidirectional=true together with unroll=2: each loop iteration runs two
// bidirectional rounds (two permutes, one down and one up, per round; the gather
// ring multiplies each stream's shard in a dot of its own, the scatter ring both lhs
// blocks in one dot), the induction variable steps by 2, and the round left over
// runs inline after the loop, still bidirectional. An all_gather ring over an even
// group runs the round before the last after the loop in any case: it multiplies
// both shards but sends only the down one on. The FLAG prefix checks the same
// through the command-line flags and the default pipeline.

// All_gather over one group of 12: rounds 1..4 are the uniform bidirectional
// rounds and form two loop iterations (stop 5, step 2): no round is left over from
// the unroll. Round 5, the round before the last, runs after the loop: a dot for
// each of the loop's two carried shards, and only the down shard is sent on (block
// p + 6 is reached by the down stream). The last round (block p + 6) multiplies
// that shard. 7 permutes built: 4 down, 3 up. (In a group of 8 the uniform rounds
// would fill one iteration, and a loop that would run once is not built: the
// rounds are emitted inline; bidirectional.mlir checks that form.)
// CHECK-LABEL: func.func @gather
// CHECK-SAME: (%[[G_X:.*]]: tensor<1x16xf32>, %[[G_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[G_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK: %[[G_D0:.*]] = "stablehlo.collective_permute"(%[[G_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 11], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10]]> : tensor<12x2xi64>}>
// CHECK-NEXT: %[[G_U0:.*]] = "stablehlo.collective_permute"(%[[G_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 10], [10, 11], [11, 0]]> : tensor<12x2xi64>}>
// CHECK: %[[G_LOOP:.*]]:6 = stablehlo.while(%[[G_K:[^ ]+]] = %{{[^ ]+}}, %[[G_DOWN:[^ ]+]] = %[[G_D0]], %[[G_UP:[^ ]+]] = %[[G_U0]], %[[G_ACC:[^ ]+]] = %{{[^ ]+}}, %[[G_OTHER:[^ ]+]] = %[[G_W]], %{{.*}})
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<5> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[G_D1:.*]] = "stablehlo.collective_permute"(%[[G_DOWN]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 11], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10]]> : tensor<12x2xi64>}>
// CHECK-NEXT: %[[G_U1:.*]] = "stablehlo.collective_permute"(%[[G_UP]]) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 10], [10, 11], [11, 0]]> : tensor<12x2xi64>}>
// CHECK: stablehlo.dot_general %[[G_DOWN]], %[[G_OTHER]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK: stablehlo.dot_general %[[G_UP]], %[[G_OTHER]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK: %[[G_K1:.*]] = stablehlo.add %[[G_K]], %{{[^ ]+}} : tensor<i32>
// CHECK-NEXT: %[[G_D1_T:.*]]:3 = stablehlo.optimization_barrier %[[G_D1]], %[[G_U1]], %{{[^ ]+}} :
// CHECK-NEXT: %[[G_D2:.*]] = "stablehlo.collective_permute"(%[[G_D1_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>, source_target_pairs = dense<{{\[}}[0, 11], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10]]> : tensor<12x2xi64>}>
// CHECK-NEXT: %[[G_U2:.*]] = "stablehlo.collective_permute"(%[[G_D1_T]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 7, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 10], [10, 11], [11, 0]]> : tensor<12x2xi64>}>
// CHECK: stablehlo.dot_general %[[G_D1_T]]#0, %[[G_OTHER]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK: stablehlo.subtract %{{.*}}, %[[G_K1]] : tensor<i32>
// CHECK: stablehlo.dot_general %[[G_D1_T]]#1, %[[G_OTHER]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[G_STEP:.*]] = stablehlo.constant dense<2> : tensor<i32>
// CHECK-NEXT: %[[G_NEXT:.*]] = stablehlo.add %[[G_K]], %[[G_STEP]] : tensor<i32>
// CHECK-NEXT: stablehlo.return %[[G_NEXT]], %[[G_D2]], %[[G_U2]],
// CHECK-NEXT: }
// CHECK-NEXT: %[[G_D3:.*]] = "stablehlo.collective_permute"(%[[G_LOOP]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 8, type = 1>, source_target_pairs = dense<{{\[}}[0, 11], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10]]> : tensor<12x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[G_LOOP]]#1, %[[G_W]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[G_LOOP]]#2, %[[G_W]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[G_SIX:.*]] = stablehlo.constant dense<6> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[G_POS]], %[[G_SIX]] : tensor<i32>
// CHECK: stablehlo.dot_general %[[G_D3]], %[[G_W]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
// FLAG-LABEL: func.func @gather
// FLAG: stablehlo.while
// FLAG: } do {
// FLAG-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 11], [1, 0]
// FLAG-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2]
// FLAG: stablehlo.dot_general
// FLAG: stablehlo.dot_general
// FLAG: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 11], [1, 0]
// FLAG-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2]
// FLAG: stablehlo.dot_general
// FLAG: stablehlo.dot_general
// FLAG: stablehlo.return
// FLAG: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 11], [1, 0]
// FLAG-NOT: "stablehlo.collective_permute"
// FLAG: return
module attributes {mhlo.num_partitions = 12 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gather(%arg0: tensor<1x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<12x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]> : tensor<1x12xi64>, use_global_device_ids}> : (tensor<1x16xf32>) -> tensor<12x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<12x16xf32>, tensor<16x8xf32>) -> tensor<12x8xf32>
    return %1 : tensor<12x8xf32>
  }
}

// -----

// All_gather over one group of 14: rounds 1..5 are the uniform bidirectional
// rounds: rounds 1..4 form two loop iterations (stop 5, step 2), and round 5,
// left over from the unroll, runs inline after the loop, still bidirectional: it
// sends both of the loop's shards on (handles 8 and 9) and multiplies them (blocks
// p + 5 and p + 9). Round 6, the round before the last, multiplies
// round 5's two shards (blocks p + 6 and p + 8) and sends only the down one on
// (handle 10); the last round (block p + 7) multiplies that shard. 9 permutes
// built: 5 down, 4 up.
// CHECK-LABEL: func.func @gather_14
// CHECK-SAME: (%[[G10_X:.*]]: tensor<1x16xf32>, %[[G10_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[G10_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK: %[[G10_D0:.*]] = "stablehlo.collective_permute"(%[[G10_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 13], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10], [12, 11], [13, 12]]> : tensor<14x2xi64>}>
// CHECK-NEXT: %[[G10_U0:.*]] = "stablehlo.collective_permute"(%[[G10_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 10], [10, 11], [11, 12], [12, 13], [13, 0]]> : tensor<14x2xi64>}>
// CHECK-NEXT: %[[G10_LOOP:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[G10_DOWN:[^ ]+]] = %[[G10_D0]], %[[G10_UP:[^ ]+]] = %[[G10_U0]],
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<5> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[G10_D1:.*]] = "stablehlo.collective_permute"(%[[G10_DOWN]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 13], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10], [12, 11], [13, 12]]> : tensor<14x2xi64>}>
// CHECK-NEXT: %[[G10_U1:.*]] = "stablehlo.collective_permute"(%[[G10_UP]]) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 10], [10, 11], [11, 12], [12, 13], [13, 0]]> : tensor<14x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[G10_DOWN]],
// CHECK: stablehlo.dot_general %[[G10_UP]],
// CHECK: %[[G10_D1_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[G10_D1]], %[[G10_U1]],
// CHECK-NEXT: %[[G10_D2:.*]] = "stablehlo.collective_permute"(%[[G10_D1_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>, source_target_pairs = dense<{{\[}}[0, 13], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10], [12, 11], [13, 12]]> : tensor<14x2xi64>}>
// CHECK-NEXT: %[[G10_U2:.*]] = "stablehlo.collective_permute"(%[[G10_D1_T]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 7, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 10], [10, 11], [11, 12], [12, 13], [13, 0]]> : tensor<14x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[G10_D1_T]]#0,
// CHECK: stablehlo.dot_general %[[G10_D1_T]]#1,
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{[^ ]+}}, %[[G10_D2]], %[[G10_U2]],
// CHECK-NEXT: }
// CHECK-NEXT: %[[G10_D3:.*]] = "stablehlo.collective_permute"(%[[G10_LOOP]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 8, type = 1>, source_target_pairs = dense<{{\[}}[0, 13], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10], [12, 11], [13, 12]]> : tensor<14x2xi64>}>
// CHECK-NEXT: %[[G10_U3:.*]] = "stablehlo.collective_permute"(%[[G10_LOOP]]#2) <{channel_handle = #stablehlo.channel_handle<handle = 9, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 10], [10, 11], [11, 12], [12, 13], [13, 0]]> : tensor<14x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[G10_C3:.*]] = stablehlo.constant dense<5> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[G10_POS]], %[[G10_C3]] : tensor<i32>
// CHECK: stablehlo.dot_general %[[G10_LOOP]]#1, %[[G10_W]]
// CHECK: %[[G10_C7:.*]] = stablehlo.constant dense<9> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[G10_POS]], %[[G10_C7]] : tensor<i32>
// CHECK: stablehlo.dot_general %[[G10_LOOP]]#2, %[[G10_W]]
// CHECK: %[[G10_D3_T:.*]]:{{[0-9]+}} = stablehlo.optimization_barrier %[[G10_D3]], %[[G10_U3]],
// CHECK-NEXT: %[[G10_D4:.*]] = "stablehlo.collective_permute"(%[[G10_D3_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 10, type = 1>, source_target_pairs = dense<{{\[}}[0, 13], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8], [10, 9], [11, 10], [12, 11], [13, 12]]> : tensor<14x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[G10_C4:.*]] = stablehlo.constant dense<6> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[G10_POS]], %[[G10_C4]] : tensor<i32>
// CHECK: stablehlo.dot_general %[[G10_D3_T]]#0, %[[G10_W]]
// CHECK: %[[G10_C6:.*]] = stablehlo.constant dense<8> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[G10_POS]], %[[G10_C6]] : tensor<i32>
// CHECK: stablehlo.dot_general %[[G10_D3_T]]#1, %[[G10_W]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[G10_C5:.*]] = stablehlo.constant dense<7> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[G10_POS]], %[[G10_C5]] : tensor<i32>
// CHECK: stablehlo.dot_general %[[G10_D4]], %[[G10_W]], contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
// FLAG-LABEL: func.func @gather_14
// FLAG: } do {
// FLAG: stablehlo.return
// FLAG-NEXT: }
// FLAG-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 13], [1, 0]
// FLAG-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2]
// FLAG: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 13], [1, 0]
// FLAG-NOT: "stablehlo.collective_permute"
// FLAG: return
module attributes {mhlo.num_partitions = 14 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gather_14(%arg0: tensor<1x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<14x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]> : tensor<1x14xi64>, use_global_device_ids}> : (tensor<1x16xf32>) -> tensor<14x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<14x16xf32>, tensor<16x8xf32>) -> tensor<14x8xf32>
    return %1 : tensor<14x8xf32>
  }
}

// -----

// Reduce_scatter over one group of 10 (5 rounds down, 4 up, then the own block): the
// down and up streams are the ring's two chains, one round per loop iteration (unroll
// applies to all_gather rings). Round 0: the down stream's first part, kept. Round 1:
// the kept part goes down, the up stream starts (its part goes up at once), and the
// down stream adds its part to the sum that arrived and keeps it. Rounds 2..4 run in
// the loop (stop 5) in that order; each add reads its own round's dot. The last
// round: the kept sum goes down, and the own block adds both arrivals: the up
// stream's first, behind an optimization_barrier, then the one that just arrived (so a
// GPU GEMM, which fuses its adds, does not wait for the last transfer).
// CHECK-LABEL: func.func @scatter
// CHECK-SAME: (%[[S_A:.*]]: tensor<10x16xf32>, %[[S_B:.*]]: tensor<16x8xf32>)
// CHECK: %[[S_D0:.*]] = stablehlo.dot_general %{{[^ ]+}}, %[[S_B]]
// CHECK-NEXT: %[[S_A1:.*]] = "stablehlo.collective_permute"(%[[S_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 9], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6], [8, 7], [9, 8]]> : tensor<10x2xi64>}>
// CHECK: %[[S_U0:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[S_MU0:.*]] = "stablehlo.collective_permute"(%[[S_U0]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9], [9, 0]]> : tensor<10x2xi64>}>
// CHECK: %[[S_D1:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[S_K1:.*]] = stablehlo.add %[[S_D1]], %[[S_A1]] : tensor<1x8xf32>
// CHECK: %[[S_LOOP:.*]]:6 = stablehlo.while(%[[S_K:[^ ]+]] = %{{[^ ]+}}, %[[S_KEPT:[^ ]+]] = %[[S_K1]], %[[S_URECV:[^ ]+]] = %[[S_MU0]], %[[S_LHS:[^ ]+]] = %[[S_A]], %[[S_RHS:[^ ]+]] = %[[S_B]], %{{.*}})
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<5> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[S_AD:.*]] = "stablehlo.collective_permute"(%[[S_KEPT]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 9], [1, 0]
// CHECK: %[[S_PU:.*]] = stablehlo.dot_general %{{[^ ]+}}, %[[S_RHS]]
// CHECK-NEXT: %[[S_U:.*]] = stablehlo.add %[[S_PU]], %[[S_URECV]] : tensor<1x8xf32>
// CHECK-NEXT: %[[S_MU:.*]] = "stablehlo.collective_permute"(%[[S_U]]) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2]
// CHECK: %[[S_PD:.*]] = stablehlo.dot_general %{{[^ ]+}}, %[[S_RHS]]
// CHECK-NEXT: %[[S_D:.*]] = stablehlo.add %[[S_PD]], %[[S_AD]] : tensor<1x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{[^ ]+}}, %[[S_D]], %[[S_MU]], %[[S_LHS]], %[[S_RHS]],
// CHECK-NEXT: }
// CHECK-NEXT: %[[S_LAST:.*]] = "stablehlo.collective_permute"(%[[S_LOOP]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>
// CHECK-NOT: stablehlo.concatenate
// CHECK: %[[S_OWN:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[S_SUM:.*]] = stablehlo.add %[[S_OWN]], %[[S_LOOP]]#2
// CHECK-NEXT: %[[S_TIED:.*]] = stablehlo.optimization_barrier %[[S_SUM]]
// CHECK-NEXT: %[[S_OUT:.*]] = stablehlo.add %[[S_TIED]], %[[S_LAST]]
// CHECK-NEXT: return %[[S_OUT]] : tensor<1x8xf32>
// CHECK-NOT: stablehlo.reduce_scatter
// FLAG-LABEL: func.func @scatter
// FLAG: stablehlo.while
// FLAG: } do {
// FLAG: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 9], [1, 0]
// FLAG: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2]
// FLAG-NOT: stablehlo.concatenate
// FLAG-NOT: "stablehlo.collective_permute"
// FLAG: stablehlo.return
module attributes {mhlo.num_partitions = 10 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @scatter(%arg0: tensor<10x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<1x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<10x16xf32>, tensor<16x8xf32>) -> tensor<10x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]]> : tensor<1x10xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<10x8xf32>) -> tensor<1x8xf32>
    return %1 : tensor<1x8xf32>
  }
}
