// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true},overlap-matmul-reduce-scatter{threshold-mib=0 bidirectional=true})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --split-input-file | FileCheck %s --check-prefix=FLAG
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0},overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=ONEWAY
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true},overlap-matmul-reduce-scatter{threshold-mib=0 bidirectional=true})' --split-input-file | FileCheck %s --check-prefix=SENDS
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0 bidirectional=true target=gpu})' --split-input-file | FileCheck %s --check-prefix=GPU

// bidirectional=true: two streams, one shifting down the ring (position q sends to
// q-1, so after k shifts p holds the shard of p+k) and one shifting up (q sends to
// q+1: p holds p-k). Each round multiplies the two held shards: a dot for each
// where they are disjoint blocks of the result (free and batch dims), one dot over
// the two side by side (a stablehlo.concatenate) where they are summed
// (contracting dims); a reduce_scatter ring's round multiplies both lhs blocks in
// one dot. Every all_gather ring sends N - 1 shards in
// all. Odd groups use both streams in every round after round 0: (N - 1) / 2
// permutes each way. Even groups: the down stream alone reaches block p + N/2, so
// in the round before the last both shards are multiplied but only the down one
// is sent on: N/2 permutes down and N/2 - 1 up. Groups of 2 fall back to one
// stream. The FLAG prefix checks that the --bidirectional flag reaches the passes
// through the default pipeline; ONEWAY that without it every ring has one
// direction only. SENDS lists every permute of an all_gather ring in order, with
// its direction, and nothing else that sends (nor a loop where no round is
// uniform), independently of how the index arithmetic is laid out.

// All_gather, free dim of the lhs, one group of 4 (N = 4, rounds 1 and 2 after
// round 0): 3 permutes, 2 down and 1 up, and no loop (no round is uniform).
// Round 0 multiplies the own shard and sends it both ways (handles 2 and 3).
// Round 1 sends only the down shard on (handle 4) while a dot for each received
// shard writes blocks p + 1 and p + 3 (= p - 1): the result blocks are disjoint, so
// the shards are not concatenated (that would copy them into a buffer of twice
// their size). Round 2 multiplies round 1's down shard (block p + 2). Round 1's
// shards and round 0's result pass one optimization_barrier before its permute.
// CHECK-LABEL: func.func @ag_free_lhs_4
// CHECK-SAME: (%[[A4_X:.*]]: tensor<2x16xf32>, %[[A4_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.while
// CHECK: %[[A4_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK: %[[A4_TWO:.*]] = stablehlo.constant dense<2> : tensor<i32>
// CHECK: %[[A4_P0:.*]] = stablehlo.dot_general %[[A4_X]], %[[A4_W]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[A4_ACC0:.*]] = stablehlo.dynamic_update_slice %{{.*}}, %[[A4_P0]],
// CHECK-NEXT: %[[A4_DOWN0:.*]] = "stablehlo.collective_permute"(%[[A4_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]> : tensor<4x2xi64>}>
// CHECK-NEXT: %[[A4_UP0:.*]] = "stablehlo.collective_permute"(%[[A4_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}>
// CHECK-NEXT: %[[A4_DOWN0_T:.*]]:3 = stablehlo.optimization_barrier %[[A4_DOWN0]], %[[A4_UP0]], %[[A4_ACC0]]
// CHECK-NEXT: %[[A4_DOWN1:.*]] = "stablehlo.collective_permute"(%[[A4_DOWN0_T]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]> : tensor<4x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[A4_ONE:.*]] = stablehlo.constant dense<1> : tensor<i32>
// CHECK-NEXT: %[[A4_JD:.*]] = stablehlo.add %[[A4_POS]], %[[A4_ONE]] : tensor<i32>
// CHECK: %[[A4_MD:.*]] = stablehlo.remainder %[[A4_JD]], %{{[^ ]+}}
// CHECK: %[[A4_OFFD:.*]] = stablehlo.multiply %[[A4_MD]], %{{[^ ]+}}
// CHECK-NEXT: %[[A4_HD:.*]] = stablehlo.dot_general %[[A4_DOWN0_T]]#0, %[[A4_W]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[A4_U1:.*]] = stablehlo.dynamic_update_slice %[[A4_DOWN0_T]]#2, %[[A4_HD]], %[[A4_OFFD]], %{{[^ ]+}}
// CHECK: %[[A4_THREE:.*]] = stablehlo.constant dense<3> : tensor<i32>
// CHECK-NEXT: %[[A4_JU:.*]] = stablehlo.add %[[A4_POS]], %[[A4_THREE]] : tensor<i32>
// CHECK: %[[A4_MU:.*]] = stablehlo.remainder %[[A4_JU]], %{{[^ ]+}}
// CHECK: %[[A4_OFFU:.*]] = stablehlo.multiply %[[A4_MU]], %{{[^ ]+}}
// CHECK-NEXT: %[[A4_HU:.*]] = stablehlo.dot_general %[[A4_DOWN0_T]]#1, %[[A4_W]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[A4_U2:.*]] = stablehlo.dynamic_update_slice %[[A4_U1]], %[[A4_HU]], %[[A4_OFFU]], %{{[^ ]+}}
// CHECK-NOT: stablehlo.concatenate
// CHECK-NEXT: %[[A4_JL:.*]] = stablehlo.add %[[A4_POS]], %[[A4_TWO]] : tensor<i32>
// CHECK: %[[A4_ML:.*]] = stablehlo.remainder %[[A4_JL]], %{{[^ ]+}}
// CHECK: %[[A4_OFFL:.*]] = stablehlo.multiply %[[A4_ML]], %{{[^ ]+}}
// CHECK-NEXT: %[[A4_LAST:.*]] = stablehlo.dot_general %[[A4_DOWN1]], %[[A4_W]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[A4_OUT:.*]] = stablehlo.dynamic_update_slice %[[A4_U2]], %[[A4_LAST]], %[[A4_OFFL]], %{{[^ ]+}}
// CHECK-NEXT: return %[[A4_OUT]] : tensor<8x8xf32>
// FLAG-LABEL: func.func @ag_free_lhs_4
// FLAG: "stablehlo.collective_permute"(%arg0) {{.*}}source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]>
// FLAG: "stablehlo.collective_permute"(%arg0) {{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0]]>
// ONEWAY-LABEL: func.func @ag_free_lhs_4
// ONEWAY-NOT: {{\[}}[0, 1], [1, 2], [2, 3], [3, 0]]
// ONEWAY: return
// SENDS-LABEL: func.func @ag_free_lhs_4
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0]]
// SENDS-NEXT: stablehlo.optimization_barrier
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]
// SENDS-NOT: {{stablehlo.while|collective_permute}}
// SENDS: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_free_lhs_4(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// All_gather, free dim of the rhs, one group of 8 (4 rounds after round 0): 7
// permutes, 4 down and 3 up. Round 0 sends both ways; the loop runs rounds 1 and
// 2, each sending both carried shards on; round 3, peeled, multiplies both
// carried shards (blocks p + 3 and p + 5) but sends only the down one on; round 4
// multiplies that shard (block p + 4). Each shard is the rhs of a dot of its own.
// CHECK-LABEL: func.func @ag_free_rhs_8
// CHECK-SAME: (%[[A8_A:.*]]: tensor<8x16xf32>, %[[A8_X:.*]]: tensor<16x1xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[A8_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK: %[[A8_DOWN0:.*]] = "stablehlo.collective_permute"(%[[A8_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NEXT: %[[A8_UP0:.*]] = "stablehlo.collective_permute"(%[[A8_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]> : tensor<8x2xi64>}>
// CHECK-NEXT: %[[A8_LOOP:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[A8_DOWN:[^ ]+]] = %[[A8_DOWN0]], %[[A8_UP:[^ ]+]] = %[[A8_UP0]], %{{[^ ]+}} = %{{[^ ]+}}, %[[A8_OTHER:[^ ]+]] = %[[A8_A]], %{{.*}})
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<3> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: "stablehlo.collective_permute"(%[[A8_DOWN]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[A8_UP]]) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[A8_OTHER]], %[[A8_DOWN]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK: stablehlo.dot_general %[[A8_OTHER]], %[[A8_UP]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK: stablehlo.return
// CHECK-NEXT: }
// CHECK-NEXT: %[[A8_DOWN3:.*]] = "stablehlo.collective_permute"(%[[A8_LOOP]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[A8_THREE:.*]] = stablehlo.constant dense<3> : tensor<i32>
// CHECK-NEXT: %[[A8_J3:.*]] = stablehlo.add %[[A8_POS]], %[[A8_THREE]] : tensor<i32>
// CHECK: %[[A8_M3:.*]] = stablehlo.remainder %[[A8_J3]], %{{[^ ]+}}
// CHECK: %[[A8_OFF3:.*]] = stablehlo.multiply %[[A8_M3]], %{{[^ ]+}}
// CHECK-NEXT: %[[A8_H3:.*]] = stablehlo.dot_general %[[A8_A]], %[[A8_LOOP]]#1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK-NEXT: %[[A8_U3:.*]] = stablehlo.dynamic_update_slice %[[A8_LOOP]]#3, %[[A8_H3]], %{{[^ ]+}}, %[[A8_OFF3]]
// CHECK: %[[A8_FIVE:.*]] = stablehlo.constant dense<5> : tensor<i32>
// CHECK-NEXT: %[[A8_J5:.*]] = stablehlo.add %[[A8_POS]], %[[A8_FIVE]] : tensor<i32>
// CHECK: %[[A8_M5:.*]] = stablehlo.remainder %[[A8_J5]], %{{[^ ]+}}
// CHECK: %[[A8_OFF5:.*]] = stablehlo.multiply %[[A8_M5]], %{{[^ ]+}}
// CHECK-NEXT: %[[A8_H5:.*]] = stablehlo.dot_general %[[A8_A]], %[[A8_LOOP]]#2, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK-NEXT: %[[A8_U5:.*]] = stablehlo.dynamic_update_slice %[[A8_U3]], %[[A8_H5]], %{{[^ ]+}}, %[[A8_OFF5]]
// CHECK: %[[A8_FOUR:.*]] = stablehlo.constant dense<4> : tensor<i32>
// CHECK-NEXT: %[[A8_J4:.*]] = stablehlo.add %[[A8_POS]], %[[A8_FOUR]] : tensor<i32>
// CHECK: %[[A8_M4:.*]] = stablehlo.remainder %[[A8_J4]], %{{[^ ]+}}
// CHECK: %[[A8_OFF4:.*]] = stablehlo.multiply %[[A8_M4]], %{{[^ ]+}}
// CHECK-NEXT: %[[A8_LAST:.*]] = stablehlo.dot_general %[[A8_A]], %[[A8_DOWN3]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK: %[[A8_OUT:.*]] = stablehlo.dynamic_update_slice %[[A8_U5]], %[[A8_LAST]], %{{[^ ]+}}, %[[A8_OFF4]]
// CHECK-NEXT: return %[[A8_OUT]] : tensor<8x8xf32>
// FLAG-LABEL: func.func @ag_free_rhs_8
// FLAG: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4]
// FLAG-NOT: stablehlo.concatenate
// FLAG: return
// SENDS-LABEL: func.func @ag_free_rhs_8
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4]
// SENDS-NOT: collective_permute
// SENDS: stablehlo.while
// SENDS-NOT: collective_permute
// SENDS: } do {
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4]
// SENDS-NOT: collective_permute
// SENDS: stablehlo.return
// SENDS-NEXT: }
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NOT: collective_permute
// SENDS: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_free_rhs_8(%arg0: tensor<8x16xf32>, %arg1: tensor<16x1xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg1) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<16x1xf32>) -> tensor<16x8xf32>
    %1 = stablehlo.dot_general %arg0, %0, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// All_gather, contracting dim of the lhs, one group of 8: round 0's product is
// the accumulator's first value (no zero constant, no add before the loop). In
// the loop the two carried shards are concatenated along the gathered
// (contracting) dim, the rhs blocks of both streams are sliced and concatenated
// along the paired contracting dim, and one dot sums both blocks into the
// accumulator. The loop runs rounds 1..4, each sending both shards on (nothing
// reads the last ones): in round 4 both streams hold block p + 4, and where the
// two offsets match the rhs block is split between them so that it counts once:
// each element halved where that is exact (at least twice the smallest normal
// number), else whole in the down stream's and zero in the up stream's. The sum
// stays in the loop: the loop's result is the function's.
// CHECK-LABEL: func.func @ag_contracting_lhs_8
// CHECK-SAME: (%[[C8_X:.*]]: tensor<8x2xf32>, %[[C8_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[C8_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[C8_S0:.*]] = stablehlo.dynamic_slice %[[C8_W]], %{{.*}}, %{{.*}}, sizes = [2, 8] : (tensor<16x8xf32>, tensor<i32>, tensor<i32>) -> tensor<2x8xf32>
// CHECK-NEXT: %[[C8_ACC0:.*]] = stablehlo.dot_general %[[C8_X]], %[[C8_S0]], contracting_dims = [1] x [0] : (tensor<8x2xf32>, tensor<2x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[C8_DOWN0:.*]] = "stablehlo.collective_permute"(%[[C8_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]>
// CHECK-NEXT: %[[C8_UP0:.*]] = "stablehlo.collective_permute"(%[[C8_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]>
// CHECK-NOT: stablehlo.add
// CHECK: %[[C8_LOOP:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[C8_DOWN:[^ ]+]] = %[[C8_DOWN0]], %[[C8_UP:[^ ]+]] = %[[C8_UP0]], %[[C8_ACC:[^ ]+]] = %[[C8_ACC0]], %[[C8_OTHER:[^ ]+]] = %[[C8_W]], %{{.*}})
// CHECK-NEXT: cond {
// CHECK-NEXT: stablehlo.constant dense<5> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: "stablehlo.collective_permute"(%[[C8_DOWN]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[C8_UP]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[C8_OFFD:.*]] = stablehlo.multiply
// CHECK: stablehlo.subtract
// CHECK: %[[C8_OFFU:.*]] = stablehlo.multiply
// CHECK-NEXT: %[[C8_CAT:.*]] = stablehlo.concatenate %[[C8_DOWN]], %[[C8_UP]], dim = 1 : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x4xf32>
// CHECK: %[[C8_SD:.*]] = stablehlo.dynamic_slice %[[C8_OTHER]], %[[C8_OFFD]], %{{.*}}, sizes = [2, 8]
// CHECK: %[[C8_SU:.*]] = stablehlo.dynamic_slice %[[C8_OTHER]], %[[C8_OFFU]], %{{.*}}, sizes = [2, 8]
// CHECK-NEXT: %[[C8_SAME:.*]] = stablehlo.compare EQ, %[[C8_OFFD]], %[[C8_OFFU]]
// CHECK-NEXT: %[[C8_HALF:.*]] = stablehlo.constant dense<5.000000e-01> : tensor<2x8xf32>
// CHECK-NEXT: %[[C8_HD:.*]] = stablehlo.multiply %[[C8_SD]], %[[C8_HALF]]
// CHECK-NEXT: %[[C8_ABS:.*]] = stablehlo.abs %[[C8_SD]]
// CHECK-NEXT: %[[C8_NORMAL:.*]] = stablehlo.constant dense<2.3509887E-38> : tensor<2x8xf32>
// CHECK-NEXT: %[[C8_EXACT:.*]] = stablehlo.compare GE, %[[C8_ABS]], %[[C8_NORMAL]]
// CHECK-NEXT: %[[C8_KD:.*]] = stablehlo.select %[[C8_EXACT]], %[[C8_HD]], %[[C8_SD]]
// CHECK-NEXT: %[[C8_WD:.*]] = stablehlo.select %[[C8_SAME]], %[[C8_KD]], %[[C8_SD]]
// CHECK-NEXT: %[[C8_ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<2x8xf32>
// CHECK-NEXT: %[[C8_KU:.*]] = stablehlo.select %[[C8_EXACT]], %[[C8_HD]], %[[C8_ZERO]]
// CHECK-NEXT: %[[C8_WU:.*]] = stablehlo.select %[[C8_SAME]], %[[C8_KU]], %[[C8_SU]]
// CHECK-NEXT: %[[C8_WCAT:.*]] = stablehlo.concatenate %[[C8_WD]], %[[C8_WU]], dim = 0 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[C8_PART:.*]] = stablehlo.dot_general %[[C8_CAT]], %[[C8_WCAT]], contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: stablehlo.add %[[C8_PART]], %[[C8_ACC]] : tensor<8x8xf32>
// CHECK: stablehlo.return
// CHECK-NEXT: }
// CHECK-NEXT: return %[[C8_LOOP]]#3
// SENDS-LABEL: func.func @ag_contracting_lhs_8
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4]
// SENDS-NOT: collective_permute
// SENDS: stablehlo.while
// SENDS-NOT: collective_permute
// SENDS: } do {
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4]
// SENDS-NOT: collective_permute
// SENDS: stablehlo.return
// SENDS-NEXT: }
// SENDS-NOT: collective_permute
// SENDS: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_contracting_lhs_8(%arg0: tensor<8x2xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<8x2xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// All_gather, contracting dim of the rhs, strided groups of 4 [[0,2,4,6],[1,3,5,7]]:
// the down stream sends 2 -> 0, 4 -> 2, ... and the up stream 0 -> 2, 2 -> 4, ...
// within each group. No loop: 3 permutes, 2 down and 1 up. Round 0's product (lhs
// block p) is the accumulator's first value, with no zero constant and no add.
// Round 1 sends only the down shard on and adds one dot over both received shards,
// the lhs blocks p + 1 and p + 3 concatenated along dim 1; round 2 adds lhs block
// p + 2 times round 1's down shard.
// CHECK-LABEL: func.func @ag_contracting_rhs_4
// CHECK-SAME: (%[[CR4_A:.*]]: tensor<8x16xf32>, %[[CR4_X:.*]]: tensor<4x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.while
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: %[[CR4_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[CR4_S0:.*]] = stablehlo.dynamic_slice %[[CR4_A]], %{{.*}}, %{{.*}}, sizes = [8, 4] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
// CHECK-NEXT: %[[CR4_ACC0:.*]] = stablehlo.dot_general %[[CR4_S0]], %[[CR4_X]], contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[CR4_DOWN0:.*]] = "stablehlo.collective_permute"(%[[CR4_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]>
// CHECK-NEXT: %[[CR4_UP0:.*]] = "stablehlo.collective_permute"(%[[CR4_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]>
// CHECK-NEXT: %[[CR4_DOWN0_T:.*]]:3 = stablehlo.optimization_barrier %[[CR4_DOWN0]], %[[CR4_UP0]], %[[CR4_ACC0]]
// CHECK-NEXT: %[[CR4_DOWN1:.*]] = "stablehlo.collective_permute"(%[[CR4_DOWN0_T]]#0) {{.*}}source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[CR4_ONE:.*]] = stablehlo.constant dense<1> : tensor<i32>
// CHECK-NEXT: %[[CR4_J1:.*]] = stablehlo.add %[[CR4_POS]], %[[CR4_ONE]] : tensor<i32>
// CHECK: %[[CR4_M1:.*]] = stablehlo.remainder %[[CR4_J1]], %{{[^ ]+}}
// CHECK: %[[CR4_OFF1:.*]] = stablehlo.multiply %[[CR4_M1]], %{{[^ ]+}}
// CHECK: %[[CR4_THREE:.*]] = stablehlo.constant dense<3> : tensor<i32>
// CHECK-NEXT: %[[CR4_J3:.*]] = stablehlo.add %[[CR4_POS]], %[[CR4_THREE]] : tensor<i32>
// CHECK: %[[CR4_M3:.*]] = stablehlo.remainder %[[CR4_J3]], %{{[^ ]+}}
// CHECK: %[[CR4_OFF3:.*]] = stablehlo.multiply %[[CR4_M3]], %{{[^ ]+}}
// CHECK-NEXT: %[[CR4_CAT:.*]] = stablehlo.concatenate %[[CR4_DOWN0_T]]#0, %[[CR4_DOWN0_T]]#1, dim = 0 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
// CHECK: %[[CR4_S1:.*]] = stablehlo.dynamic_slice %[[CR4_A]], %{{[^ ]+}}, %[[CR4_OFF1]], sizes = [8, 4]
// CHECK: %[[CR4_S3:.*]] = stablehlo.dynamic_slice %[[CR4_A]], %{{[^ ]+}}, %[[CR4_OFF3]], sizes = [8, 4]
// CHECK-NEXT: %[[CR4_ACAT:.*]] = stablehlo.concatenate %[[CR4_S1]], %[[CR4_S3]], dim = 1 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[CR4_PART:.*]] = stablehlo.dot_general %[[CR4_ACAT]], %[[CR4_CAT]], contracting_dims = [1] x [0]
// CHECK-NEXT: %[[CR4_SUM:.*]] = stablehlo.add %[[CR4_PART]], %[[CR4_DOWN0_T]]#2 : tensor<8x8xf32>
// CHECK: %[[CR4_TWO:.*]] = stablehlo.constant dense<2> : tensor<i32>
// CHECK-NEXT: %[[CR4_J2:.*]] = stablehlo.add %[[CR4_POS]], %[[CR4_TWO]] : tensor<i32>
// CHECK: %[[CR4_M2:.*]] = stablehlo.remainder %[[CR4_J2]], %{{[^ ]+}}
// CHECK: %[[CR4_OFF2:.*]] = stablehlo.multiply %[[CR4_M2]], %{{[^ ]+}}
// CHECK: %[[CR4_S2:.*]] = stablehlo.dynamic_slice %[[CR4_A]], %{{[^ ]+}}, %[[CR4_OFF2]], sizes = [8, 4]
// CHECK-NEXT: %[[CR4_LAST:.*]] = stablehlo.dot_general %[[CR4_S2]], %[[CR4_DOWN1]], contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[CR4_OUT:.*]] = stablehlo.add %[[CR4_LAST]], %[[CR4_SUM]] : tensor<8x8xf32>
// CHECK-NEXT: return %[[CR4_OUT]] : tensor<8x8xf32>
// SENDS-LABEL: func.func @ag_contracting_rhs_4
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 2], [2, 4], [4, 6], [6, 0]
// SENDS-NEXT: stablehlo.optimization_barrier
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4]
// SENDS-NOT: {{stablehlo.while|collective_permute}}
// SENDS: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_contracting_rhs_4(%arg0: tensor<8x16xf32>, %arg1: tensor<4x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg1) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<4x8xf32>) -> tensor<16x8xf32>
    %1 = stablehlo.dot_general %arg0, %0, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// All_gather, batch dim of the lhs, 2 groups of 4: no loop, 3 permutes (2 down,
// 1 up). In round 1 each received shard meets its own rhs batch block in a dot of
// its own, and the result's two batch blocks are written at the two offsets; only
// the down shard is sent on, and round 2 multiplies it.
// CHECK-LABEL: func.func @ag_batch_lhs_4
// CHECK-SAME: (%[[B4_X:.*]]: tensor<1x4x16xf32>, %[[B4_W:.*]]: tensor<4x16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.while
// CHECK: %[[B4_ACC0:.*]] = stablehlo.dynamic_update_slice
// CHECK-NEXT: %[[B4_DOWN0:.*]] = "stablehlo.collective_permute"(%[[B4_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]>
// CHECK-NEXT: %[[B4_UP0:.*]] = "stablehlo.collective_permute"(%[[B4_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]>
// CHECK-NEXT: %[[B4_DOWN0_T:.*]]:3 = stablehlo.optimization_barrier %[[B4_DOWN0]], %[[B4_UP0]], %[[B4_ACC0]]
// CHECK-NEXT: %[[B4_DOWN1:.*]] = "stablehlo.collective_permute"(%[[B4_DOWN0_T]]#0) {{.*}}source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[B4_OFFD:.*]] = stablehlo.multiply
// CHECK-NEXT: %[[B4_SD:.*]] = stablehlo.dynamic_slice %[[B4_W]], %[[B4_OFFD]], %{{.*}}, %{{.*}}, sizes = [1, 16, 8]
// CHECK-NEXT: %[[B4_HD:.*]] = stablehlo.dot_general %[[B4_DOWN0_T]]#0, %[[B4_SD]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x4x16xf32>, tensor<1x16x8xf32>) -> tensor<1x4x8xf32>
// CHECK-NEXT: %[[B4_U1:.*]] = stablehlo.dynamic_update_slice %[[B4_DOWN0_T]]#2, %[[B4_HD]], %[[B4_OFFD]],
// CHECK: %[[B4_OFFU:.*]] = stablehlo.multiply
// CHECK-NEXT: %[[B4_SU:.*]] = stablehlo.dynamic_slice %[[B4_W]], %[[B4_OFFU]], %{{.*}}, %{{.*}}, sizes = [1, 16, 8]
// CHECK-NEXT: %[[B4_HU:.*]] = stablehlo.dot_general %[[B4_DOWN0_T]]#1, %[[B4_SU]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x4x16xf32>, tensor<1x16x8xf32>) -> tensor<1x4x8xf32>
// CHECK-NEXT: %[[B4_U2:.*]] = stablehlo.dynamic_update_slice %[[B4_U1]], %[[B4_HU]], %[[B4_OFFU]],
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.concatenate
// CHECK: %[[B4_OFFL:.*]] = stablehlo.multiply
// CHECK: %[[B4_SL:.*]] = stablehlo.dynamic_slice %[[B4_W]], %[[B4_OFFL]], %{{.*}}, %{{.*}}, sizes = [1, 16, 8]
// CHECK-NEXT: %[[B4_LAST:.*]] = stablehlo.dot_general %[[B4_DOWN1]], %[[B4_SL]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x4x16xf32>, tensor<1x16x8xf32>) -> tensor<1x4x8xf32>
// CHECK: %[[B4_OUT:.*]] = stablehlo.dynamic_update_slice %[[B4_U2]], %[[B4_LAST]], %[[B4_OFFL]],
// CHECK-NEXT: return %[[B4_OUT]] : tensor<4x4x8xf32>
// SENDS-LABEL: func.func @ag_batch_lhs_4
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0], [4, 5]
// SENDS-NEXT: stablehlo.optimization_barrier
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7]
// SENDS-NOT: {{stablehlo.while|collective_permute}}
// SENDS: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_batch_lhs_4(%arg0: tensor<1x4x16xf32>, %arg1: tensor<4x16x8xf32>) -> tensor<4x4x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<1x4x16xf32>) -> tensor<4x4x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x4x16xf32>, tensor<4x16x8xf32>) -> tensor<4x4x8xf32>
    return %1 : tensor<4x4x8xf32>
  }
}

// -----

// All_gather, batch dim of the rhs, one group of 8: 7 permutes, 4 down and 3 up.
// The loop (rounds 1 and 2) sends both carried shards; round 3, after it, sends
// only the down shard on while a dot for each of the loop's shards multiplies it;
// round 4 multiplies the shard round 3 sent.
// CHECK-LABEL: func.func @ag_batch_rhs_8
// CHECK-SAME: (%[[B8_A:.*]]: tensor<8x8x16xf32>, %[[B8_X:.*]]: tensor<1x16x4xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: "stablehlo.collective_permute"(%[[B8_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[B8_X]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]>
// CHECK-NEXT: %[[B8_LOOP:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[B8_DOWN:[^ ]+]] = %{{[^ ]+}}, %[[B8_UP:[^ ]+]] = %{{[^ ]+}},
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<3> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: "stablehlo.collective_permute"(%[[B8_DOWN]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[B8_UP]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %{{.*}}, %[[B8_DOWN]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x8x16xf32>, tensor<1x16x4xf32>) -> tensor<1x8x4xf32>
// CHECK: stablehlo.dot_general %{{.*}}, %[[B8_UP]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x8x16xf32>, tensor<1x16x4xf32>) -> tensor<1x8x4xf32>
// CHECK: stablehlo.return
// CHECK-NEXT: }
// CHECK-NEXT: %[[B8_DOWN3:.*]] = "stablehlo.collective_permute"(%[[B8_LOOP]]#1) {{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %{{.*}}, %[[B8_LOOP]]#1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x8x16xf32>, tensor<1x16x4xf32>) -> tensor<1x8x4xf32>
// CHECK: stablehlo.dot_general %{{.*}}, %[[B8_LOOP]]#2, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x8x16xf32>, tensor<1x16x4xf32>) -> tensor<1x8x4xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.concatenate
// CHECK: stablehlo.dot_general %{{.*}}, %[[B8_DOWN3]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x8x16xf32>, tensor<1x16x4xf32>) -> tensor<1x8x4xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
// SENDS-LABEL: func.func @ag_batch_rhs_8
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4]
// SENDS-NOT: collective_permute
// SENDS: stablehlo.while
// SENDS-NOT: collective_permute
// SENDS: } do {
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4]
// SENDS-NOT: collective_permute
// SENDS: stablehlo.return
// SENDS-NEXT: }
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1]
// SENDS-NOT: collective_permute
// SENDS: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_batch_rhs_8(%arg0: tensor<8x8x16xf32>, %arg1: tensor<1x16x4xf32>) -> tensor<8x8x4xf32> {
    %0 = "stablehlo.all_gather"(%arg1) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<1x16x4xf32>) -> tensor<8x16x4xf32>
    %1 = stablehlo.dot_general %arg0, %0, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x8x16xf32>, tensor<8x16x4xf32>) -> tensor<8x8x4xf32>
    return %1 : tensor<8x8x4xf32>
  }
}

// -----

// Groups of 2: both directions would send to the same neighbour, so the ring falls
// back to one stream: one permute (round 0's), no concatenate, two inline rounds.
// CHECK-LABEL: func.func @ag_pairs
// CHECK-NOT: stablehlo.concatenate
// CHECK: %[[AP_SENT:.*]] = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.concatenate
// CHECK: stablehlo.dot_general %[[AP_SENT]], %arg1, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.concatenate
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_pairs(%arg0: tensor<4x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, use_global_device_ids}> : (tensor<4x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// An odd group: 3 of 6 partitions, groups [[0,1,2],[3,4,5]]. Round 0 sends the own
// shard (5 rows) both ways; round 1 is the last and uses BOTH streams: the down shard is
// block p + 1, the up shard block p - 1 = p + 2 (mod 3); no loop iteration remains.
// 2 permutes in all, one each way (N - 1 = 2 shards received).
// CHECK-LABEL: func.func @ag_odd
// CHECK-SAME: (%[[AO_X:.*]]: tensor<5x16xf32>, %[[AO_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.while
// CHECK: %[[AO_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK: %[[AO_DOWN:.*]] = "stablehlo.collective_permute"(%[[AO_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 2], [1, 0], [2, 1], [3, 5], [4, 3], [5, 4]]> : tensor<6x2xi64>}>
// CHECK-NEXT: %[[AO_UP:.*]] = "stablehlo.collective_permute"(%[[AO_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 0], [3, 4], [4, 5], [5, 3]]> : tensor<6x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[AO_JD:.*]] = stablehlo.add %[[AO_POS]], %{{[^ ]+}}
// CHECK: %[[AO_MD:.*]] = stablehlo.remainder %[[AO_JD]],
// CHECK: %[[AO_OFFD:.*]] = stablehlo.multiply %[[AO_MD]],
// CHECK-NEXT: %[[AO_HD:.*]] = stablehlo.dot_general %[[AO_DOWN]], %[[AO_W]]
// CHECK-NEXT: %[[AO_U1:.*]] = stablehlo.dynamic_update_slice %{{.*}}, %[[AO_HD]], %[[AO_OFFD]],
// CHECK: %[[AO_TWO:.*]] = stablehlo.constant dense<2> : tensor<i32>
// CHECK-NEXT: %[[AO_JU:.*]] = stablehlo.add %[[AO_POS]], %[[AO_TWO]]
// CHECK: %[[AO_MU:.*]] = stablehlo.remainder %[[AO_JU]],
// CHECK: %[[AO_OFFU:.*]] = stablehlo.multiply %[[AO_MU]],
// CHECK-NEXT: %[[AO_HU:.*]] = stablehlo.dot_general %[[AO_UP]], %[[AO_W]]
// CHECK-NEXT: %[[AO_OUT:.*]] = stablehlo.dynamic_update_slice %[[AO_U1]], %[[AO_HU]], %[[AO_OFFU]],
// CHECK-NEXT: return %[[AO_OUT]]
// SENDS-LABEL: func.func @ag_odd
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 2], [1, 0], [2, 1], [3, 5]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 0], [3, 4]
// SENDS-NOT: {{stablehlo.while|collective_permute}}
// SENDS: return
module attributes {mhlo.num_partitions = 6 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_odd(%arg0: tensor<5x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<15x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2], [3, 4, 5]]> : tensor<2x3xi64>, use_global_device_ids}> : (tensor<5x16xf32>) -> tensor<15x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<15x16xf32>, tensor<16x8xf32>) -> tensor<15x8xf32>
    return %1 : tensor<15x8xf32>
  }
}

// -----

// An odd group of 5: 4 permutes, 2 each way. Round 0 sends both ways; round 1
// (one round of the loop's form: a loop that would run once is not built) sends
// both received shards on, after an optimization_barrier that ties them to round
// 0's product; round 2 (blocks p + 2 and p + 3, both streams) sends nothing.
// CHECK-LABEL: func.func @ag_odd_5
// CHECK-NOT: stablehlo.while
// CHECK: stablehlo.constant dense<[0, 1, 2, 3, 4]> : tensor<5xi32>
// CHECK: %[[A5_D0:.*]] = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 4], [1, 0], [2, 1], [3, 2], [4, 3]]> : tensor<5x2xi64>}>
// CHECK-NEXT: %[[A5_U0:.*]] = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]]> : tensor<5x2xi64>}>
// CHECK-NEXT: %[[A5_TIED:.*]]:3 = stablehlo.optimization_barrier %[[A5_D0]], %[[A5_U0]],
// CHECK-NEXT: %[[A5_D1:.*]] = "stablehlo.collective_permute"(%[[A5_TIED]]#0) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 4], [1, 0], [2, 1], [3, 2], [4, 3]]> : tensor<5x2xi64>}>
// CHECK-NEXT: %[[A5_U1:.*]] = "stablehlo.collective_permute"(%[[A5_TIED]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]]> : tensor<5x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[A5_TIED]]#0, %arg1,
// CHECK: stablehlo.dot_general %[[A5_TIED]]#1, %arg1,
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[A5_D1]], %arg1, contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[A5_U1]], %arg1, contracting_dims = [1] x [0] : (tensor<1x16xf32>, tensor<16x8xf32>) -> tensor<1x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
// SENDS-LABEL: func.func @ag_odd_5
// SENDS-NOT: stablehlo.while
// SENDS: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 4], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3]
// SENDS-NEXT: stablehlo.optimization_barrier
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 4], [1, 0], [2, 1]
// SENDS-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3]
// SENDS-NOT: {{stablehlo.while|collective_permute}}
// SENDS: return
module attributes {mhlo.num_partitions = 5 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag_odd_5(%arg0: tensor<1x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<5x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4]]> : tensor<1x5xi64>, use_global_device_ids}> : (tensor<1x16xf32>) -> tensor<5x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<5x16xf32>, tensor<16x8xf32>) -> tensor<5x8xf32>
    return %1 : tensor<5x8xf32>
  }
}

// -----

// Reduce_scatter, free dim of the lhs, 2 groups of 4: a = 2 rounds before the own
// block. The down and up streams are the ring's two chains. Round 0: the down
// stream's part of block p + 2, kept. Round 1: the kept part goes down; the up
// stream's part of block p + 1 goes up at once; the down stream adds its part of
// block p + 3 to the part that arrived and keeps the sum. No loop iteration remains.
// The last round: the kept sum goes down, and the own block p adds both arrivals:
// the up stream's (arrived last round) behind an optimization_barrier, then the down
// stream's (sent this round), so XLA's GPU GEMM, which fuses its adds, does not wait
// for the last transfer (the TPU form adds both in one fusion). Every other add reads
// its own round's dot (no optimization_barrier, no concatenate).
// CHECK-LABEL: func.func @rs_free_lhs_4
// CHECK-SAME: (%[[R4_A:.*]]: tensor<8x16xf32>, %[[R4_B:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.while
// CHECK: %[[R4_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK-NEXT: %[[R4_C2:.*]] = stablehlo.constant dense<2> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[R4_POS]], %[[R4_C2]]
// CHECK: %[[R4_S0:.*]] = stablehlo.dynamic_slice %[[R4_A]], %{{.*}}, %{{.*}}, sizes = [2, 16]
// CHECK-NEXT: %[[R4_D0:.*]] = stablehlo.dot_general %[[R4_S0]], %[[R4_B]], {{.*}} -> tensor<2x8xf32>
// CHECK-NEXT: %[[R4_M1:.*]] = "stablehlo.collective_permute"(%[[R4_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NEXT: %[[R4_C1:.*]] = stablehlo.constant dense<1> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[R4_POS]], %[[R4_C1]]
// CHECK: %[[R4_PU:.*]] = stablehlo.dot_general %{{.*}}, %[[R4_B]]
// CHECK-NEXT: %[[R4_AU:.*]] = "stablehlo.collective_permute"(%[[R4_PU]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}>
// CHECK-NEXT: %[[R4_C3:.*]] = stablehlo.constant dense<3> : tensor<i32>
// CHECK-NEXT: stablehlo.add %[[R4_POS]], %[[R4_C3]]
// CHECK: %[[R4_PD:.*]] = stablehlo.dot_general %{{.*}}, %[[R4_B]]
// CHECK-NEXT: %[[R4_DOWN:.*]] = stablehlo.add %[[R4_PD]], %[[R4_M1]] : tensor<2x8xf32>
// CHECK-NEXT: %[[R4_AD:.*]] = "stablehlo.collective_permute"(%[[R4_DOWN]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[R4_OWN:.*]] = stablehlo.dot_general %{{.*}}, %[[R4_B]]
// CHECK-NEXT: %[[R4_S1:.*]] = stablehlo.add %[[R4_OWN]], %[[R4_AU]]
// CHECK-NEXT: %[[R4_B:.*]] = stablehlo.optimization_barrier %[[R4_S1]]
// CHECK-NEXT: %[[R4_OUT:.*]] = stablehlo.add %[[R4_B]], %[[R4_AD]]
// CHECK-NEXT: return %[[R4_OUT]] : tensor<2x8xf32>
// CHECK-NOT: stablehlo.reduce_scatter
// target=gpu: the same as the forms every backend runs.
// GPU-LABEL: func.func @rs_free_lhs_4
// GPU: %[[G_AD:.*]] = "stablehlo.collective_permute"({{.*}}handle = 4, type = 1>
// GPU: %[[G_OWN:.*]] = stablehlo.dot_general
// GPU-NEXT: %[[G_S1:.*]] = stablehlo.add %[[G_OWN]], %[[G_AU:.*]] : tensor<2x8xf32>
// GPU-NEXT: %[[G_B:.*]] = stablehlo.optimization_barrier %[[G_S1]]
// GPU-NEXT: %[[G_OUT:.*]] = stablehlo.add %[[G_B]], %[[G_AD]]
// GPU-NEXT: return %[[G_OUT]] : tensor<2x8xf32>
// FLAG-LABEL: func.func @rs_free_lhs_4
// FLAG: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]>
// ONEWAY-LABEL: func.func @rs_free_lhs_4
// ONEWAY-NOT: {{\[}}[0, 1], [1, 2], [2, 3], [3, 0]
// ONEWAY: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_free_lhs_4(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}

// -----

// Reduce_scatter, free dim of the rhs, one group of 8 (a = 4): round 0 keeps the down
// part; round 1 sends it down, starts the up stream (its part goes up at once) and
// keeps the down sum; the loop runs rounds 2..3 in that order: the kept down sum goes
// down, the up stream adds its rhs block's part to what it received and sends it up,
// the down stream adds its part to what just arrived and keeps it. After the loop,
// the last round: the kept sum goes down onto the own block, which adds both
// arrivals (the up stream's first, behind an optimization_barrier).
// CHECK-LABEL: func.func @rs_free_rhs_8
// CHECK-SAME: (%[[R8_A:.*]]: tensor<8x16xf32>, %[[R8_B:.*]]: tensor<16x8xf32>)
// CHECK: %[[R8_D0:.*]] = stablehlo.dot_general %[[R8_A]], %{{.*}} -> tensor<8x1xf32>
// CHECK-NEXT: %[[R8_M1:.*]] = "stablehlo.collective_permute"(%[[R8_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[R8_U1:.*]] = stablehlo.dot_general %[[R8_A]]
// CHECK-NEXT: %[[R8_MU1:.*]] = "stablehlo.collective_permute"(%[[R8_U1]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]> : tensor<8x2xi64>}>
// CHECK: %[[R8_P1:.*]] = stablehlo.dot_general %[[R8_A]]
// CHECK-NEXT: %[[R8_K1:.*]] = stablehlo.add %[[R8_P1]], %[[R8_M1]] : tensor<8x1xf32>
// CHECK: %[[R8_LOOP:.*]]:6 = stablehlo.while(%[[R8_K:[^ ]+]] = %{{[^ ]+}}, %[[R8_KEPT:[^ ]+]] = %[[R8_K1]], %[[R8_URECV:[^ ]+]] = %[[R8_MU1]], %[[R8_LHS:[^ ]+]] = %[[R8_A]], %[[R8_RHS:[^ ]+]] = %[[R8_B]], %{{.*}})
// CHECK: cond {
// CHECK-NEXT: stablehlo.constant dense<4> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[R8_AD:.*]] = "stablehlo.collective_permute"(%[[R8_KEPT]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[R8_BU:.*]] = stablehlo.dynamic_slice %[[R8_RHS]], %{{.*}}, %{{.*}}, sizes = [16, 1]
// CHECK-NEXT: %[[R8_PU:.*]] = stablehlo.dot_general %[[R8_LHS]], %[[R8_BU]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK-NEXT: %[[R8_SU:.*]] = stablehlo.add %[[R8_PU]], %[[R8_URECV]]
// CHECK-NEXT: %[[R8_MU:.*]] = "stablehlo.collective_permute"(%[[R8_SU]]) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]> : tensor<8x2xi64>}>
// CHECK: %[[R8_BD:.*]] = stablehlo.dynamic_slice %[[R8_RHS]], %{{.*}}, %{{.*}}, sizes = [16, 1]
// CHECK-NEXT: %[[R8_PD:.*]] = stablehlo.dot_general %[[R8_LHS]], %[[R8_BD]]
// CHECK-NEXT: %[[R8_SD:.*]] = stablehlo.add %[[R8_PD]], %[[R8_AD]]
// CHECK: stablehlo.return %{{.*}}, %[[R8_SD]], %[[R8_MU]], %[[R8_LHS]], %[[R8_RHS]],
// CHECK: %[[R8_LAST:.*]] = "stablehlo.collective_permute"(%[[R8_LOOP]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[R8_OWN:.*]] = stablehlo.dot_general %[[R8_A]], %{{.*}} -> tensor<8x1xf32>
// CHECK-NEXT: %[[R8_S1:.*]] = stablehlo.add %[[R8_OWN]], %[[R8_LOOP]]#2
// CHECK-NEXT: %[[R8_B:.*]] = stablehlo.optimization_barrier %[[R8_S1]]
// CHECK-NEXT: %[[R8_OUT:.*]] = stablehlo.add %[[R8_B]], %[[R8_LAST]]
// CHECK-NEXT: return %[[R8_OUT]] : tensor<8x1xf32>
// CHECK-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_free_rhs_8(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x1xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 1 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<8x1xf32>
    return %1 : tensor<8x1xf32>
  }
}

// -----

// Reduce_scatter, batch dim, strided groups of 4: both operands are sliced at one
// batch block per part; the down stream's part goes down a round late, the up
// stream's at once.
// CHECK-LABEL: func.func @rs_batch_4
// CHECK-SAME: (%[[RB4_A:.*]]: tensor<4x8x16xf32>, %[[RB4_B:.*]]: tensor<4x16x8xf32>)
// CHECK-NOT: stablehlo.while
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: stablehlo.dot_general {{.*}}, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<1x8x16xf32>, tensor<1x16x8xf32>) -> tensor<1x8x8xf32>
// CHECK-NEXT: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]>
// CHECK: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]>
// CHECK: "stablehlo.collective_permute"{{.*}}source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]>
// CHECK-NOT: stablehlo.concatenate
// CHECK: return %{{.*}} : tensor<1x8x8xf32>
// CHECK-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_batch_4(%arg0: tensor<4x8x16xf32>, %arg1: tensor<4x16x8xf32>) -> tensor<1x8x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<4x8x8xf32>) -> tensor<1x8x8xf32>
    return %1 : tensor<1x8x8xf32>
  }
}

// -----

// Reduce_scatter, batch dim, one group of 8: the loop carries the kept down sum and
// the received up accumulator, and slices both operands twice per round.
// CHECK-LABEL: func.func @rs_batch_8
// CHECK: %[[RB8_LOOP:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[RB8_KEPT:[^ ]+]] = %{{[^ ]+}}, %[[RB8_URECV:[^ ]+]] = %{{[^ ]+}}, %[[RB8_LHS:[^ ]+]] = %arg0, %[[RB8_RHS:[^ ]+]] = %arg1,
// CHECK: } do {
// CHECK-NEXT: %[[RB8_AD:.*]] = "stablehlo.collective_permute"(%[[RB8_KEPT]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]>
// CHECK: %[[RB8_PU:.*]] = stablehlo.dot_general {{.*}} -> tensor<1x8x8xf32>
// CHECK-NEXT: %[[RB8_SU:.*]] = stablehlo.add %[[RB8_PU]], %[[RB8_URECV]]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[RB8_SU]]) {{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]]>
// CHECK: %[[RB8_PD:.*]] = stablehlo.dot_general {{.*}} -> tensor<1x8x8xf32>
// CHECK-NEXT: stablehlo.add %[[RB8_PD]], %[[RB8_AD]]
// CHECK: stablehlo.return
// CHECK: "stablehlo.collective_permute"(%[[RB8_LOOP]]#1)
// CHECK: return %{{.*}} : tensor<1x8x8xf32>
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_batch_8(%arg0: tensor<8x8x16xf32>, %arg1: tensor<8x16x8xf32>) -> tensor<1x8x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x8x16xf32>, tensor<8x16x8xf32>) -> tensor<8x8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8x8xf32>) -> tensor<1x8x8xf32>
    return %1 : tensor<1x8x8xf32>
  }
}

// -----

// Reduce_scatter over groups of 2: one stream only (two chains, the halves of each
// block, moving the same way; no concatenate).
// CHECK-LABEL: func.func @rs_pairs
// CHECK-NOT: stablehlo.concatenate
// CHECK: "stablehlo.collective_permute"(%{{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: "stablehlo.collective_permute"(%{{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.concatenate
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_pairs(%arg0: tensor<8x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<4x8xf32>
    return %1 : tensor<4x8xf32>
  }
}

// -----

// Reduce_scatter over an odd group (3 of 6): both streams start in round 0 (up:
// block p + 1, sent at once; down: block p + 2, kept); the last round sends the kept
// down part and adds both arrivals to the own block (the up stream's first, behind an
// optimization_barrier).
// CHECK-LABEL: func.func @rs_odd
// CHECK-NOT: stablehlo.while
// CHECK: %[[RO_PU:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RO_AU:.*]] = "stablehlo.collective_permute"(%[[RO_PU]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 0], [3, 4], [4, 5], [5, 3]]> : tensor<6x2xi64>}>
// CHECK: %[[RO_PD:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RO_AD:.*]] = "stablehlo.collective_permute"(%[[RO_PD]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 2], [1, 0], [2, 1], [3, 5], [4, 3], [5, 4]]> : tensor<6x2xi64>}>
// CHECK: %[[RO_OWN:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[RO_S1:.*]] = stablehlo.add %[[RO_OWN]], %[[RO_AU]]
// CHECK-NEXT: %[[RO_B:.*]] = stablehlo.optimization_barrier %[[RO_S1]]
// CHECK-NEXT: %[[RO_OUT:.*]] = stablehlo.add %[[RO_B]], %[[RO_AD]]
// CHECK-NEXT: return %[[RO_OUT]] : tensor<2x8xf32>
module attributes {mhlo.num_partitions = 6 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs_odd(%arg0: tensor<6x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<6x16xf32>, tensor<16x8xf32>) -> tensor<6x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2], [3, 4, 5]]> : tensor<2x3xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<6x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}
