// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' --split-input-file | FileCheck %s --check-prefix=INLINE
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul)' --split-input-file | FileCheck %s --check-prefix=DEFAULT
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul)' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=DEFAULT-REMARK

// Gathered dim is a free dim of the lhs, 2 contiguous groups of 4 partitions.
// Round 0 multiplies the device's own shard (block p mod 4 of the result) and sends
// it on: the first permute comes before the loop. The loop runs rounds 1 and 2: in
// each the permute and the dot both read the carried shard (a block argument), so
// neither feeds the other; the dot's block goes to offset ((p + k) mod 4) * 2. The
// last round (p + 3) is peeled after the loop and sends nothing. Every permute gets
// its own fresh channel (2, then 3), above the module's channel 1. (Where the i32
// constants of the index arithmetic are placed is not checked.)
// CHECK-LABEL: func.func @free_lhs
// CHECK-SAME: (%[[FL_X:.*]]: tensor<2x16xf32>, %[[FL_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[FL_PID:.*]] = stablehlo.partition_id
// CHECK: %[[FL_ID:.*]] = stablehlo.convert %[[FL_PID]] : (tensor<ui32>) -> tensor<i32>
// CHECK: %[[FL_TABLE:.*]] = stablehlo.constant dense<[0, 1, 2, 3, 0, 1, 2, 3]> : tensor<8xi32>
// CHECK: %[[FL_SLOT:.*]] = stablehlo.dynamic_slice %[[FL_TABLE]], %[[FL_ID]], sizes = [1]
// CHECK: %[[FL_POS:.*]] = stablehlo.reshape %[[FL_SLOT]] : (tensor<1xi32>) -> tensor<i32>
// CHECK: %[[FL_ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<8x8xf32>
// CHECK: %[[FL_M0:.*]] = stablehlo.remainder %[[FL_POS]], %{{[^ ]+}} : tensor<i32>
// CHECK: %[[FL_OFF0:.*]] = stablehlo.multiply %[[FL_M0]], %{{[^ ]+}} : tensor<i32>
// CHECK: %[[FL_PART0:.*]] = stablehlo.dot_general %[[FL_X]], %[[FL_W]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[FL_ACC0:.*]] = stablehlo.dynamic_update_slice %[[FL_ZERO]], %[[FL_PART0]], %[[FL_OFF0]], %{{[^ ]+}} : (tensor<8x8xf32>, tensor<2x8xf32>, tensor<i32>, tensor<i32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[FL_SENT:.*]] = "stablehlo.collective_permute"(%[[FL_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<2x16xf32>) -> tensor<2x16xf32>
// CHECK: %[[FL_LOOP:.*]]:5 = stablehlo.while(%[[FL_K:[^ ]+]] = %{{[^ ]+}}, %[[FL_CUR:[^ ]+]] = %[[FL_SENT]], %[[FL_ACC:[^ ]+]] = %[[FL_ACC0]], %[[FL_OTHER:[^ ]+]] = %[[FL_W]], %[[FL_P:[^ ]+]] = %[[FL_POS]])
// CHECK: cond {
// CHECK-NEXT: %[[FL_STOP:.*]] = stablehlo.constant dense<3> : tensor<i32>
// CHECK-NEXT: stablehlo.compare LT, %[[FL_K]], %[[FL_STOP]], SIGNED
// CHECK: } do {
// CHECK-NEXT: %[[FL_MOVED:.*]] = "stablehlo.collective_permute"(%[[FL_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<2x16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT: %[[FL_J:.*]] = stablehlo.add %[[FL_P]], %[[FL_K]] : tensor<i32>
// CHECK: %[[FL_JMOD:.*]] = stablehlo.remainder %[[FL_J]], %{{[^ ]+}}
// CHECK: %[[FL_OFF:.*]] = stablehlo.multiply %[[FL_JMOD]], %{{[^ ]+}}
// CHECK: %[[FL_PART:.*]] = stablehlo.dot_general %[[FL_CUR]], %[[FL_OTHER]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[FL_UPD:.*]] = stablehlo.dynamic_update_slice %[[FL_ACC]], %[[FL_PART]], %[[FL_OFF]], %{{[^ ]+}} : (tensor<8x8xf32>, tensor<2x8xf32>, tensor<i32>, tensor<i32>) -> tensor<8x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.dot_general
// CHECK: %[[FL_NEXT:.*]] = stablehlo.add %[[FL_K]], %{{[^ ]+}} : tensor<i32>
// CHECK-NEXT: stablehlo.return %[[FL_NEXT]], %[[FL_MOVED]], %[[FL_UPD]], %[[FL_OTHER]], %[[FL_P]] :
// CHECK-NEXT: }
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[FL_THREE:.*]] = stablehlo.constant dense<3> : tensor<i32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[FL_J3:.*]] = stablehlo.add %[[FL_POS]], %[[FL_THREE]] : tensor<i32>
// CHECK: %[[FL_M3:.*]] = stablehlo.remainder %[[FL_J3]], %{{[^ ]+}}
// CHECK: %[[FL_OFF3:.*]] = stablehlo.multiply %[[FL_M3]], %{{[^ ]+}}
// CHECK: %[[FL_LAST:.*]] = stablehlo.dot_general %[[FL_LOOP]]#1, %[[FL_W]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[FL_OUT:.*]] = stablehlo.dynamic_update_slice %[[FL_LOOP]]#2, %[[FL_LAST]], %[[FL_OFF3]], %{{[^ ]+}}
// CHECK-NEXT: return %[[FL_OUT]] : tensor<8x8xf32>
// CHECK-NOT: stablehlo.all_gather
// DEFAULT-LABEL: func.func @free_lhs
// DEFAULT: stablehlo.all_gather
// DEFAULT-NOT: stablehlo.collective_permute
// DEFAULT: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @free_lhs(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    // REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 2]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
    // DEFAULT-REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: communicated tensor is {{.*}} MiB, below threshold-mib=1 (the default: neither threshold-mib nor hardware given); 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4{{$}}
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Gathered dim is a free dim of the rhs, one group of all 8 partitions: round 0
// before the loop, rounds 1..6 in it, round 7 after it. The gathered operand stays
// on the right of each partial dot and the block is written along result dim 1.
// CHECK-LABEL: func.func @free_rhs
// CHECK-SAME: (%[[FR_A:.*]]: tensor<8x16xf32>, %[[FR_X:.*]]: tensor<16x1xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>
// CHECK: %[[FR_FIRST:.*]] = stablehlo.dot_general %[[FR_A]], %[[FR_X]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK: %[[FR_SENT:.*]] = "stablehlo.collective_permute"(%[[FR_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[FR_LOOP:.*]]:5 = stablehlo.while(%[[FR_K:[^ ]+]] = %{{[^ ]+}}, %[[FR_CUR:[^ ]+]] = %[[FR_SENT]], %[[FR_ACC:[^ ]+]] = %{{[^ ]+}}, %[[FR_OTHER:[^ ]+]] = %[[FR_A]], %[[FR_P:[^ ]+]] = %{{[^ ]+}})
// CHECK: stablehlo.constant dense<7> : tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[FR_MOVED:.*]] = "stablehlo.collective_permute"(%[[FR_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: %[[FR_OFF:.*]] = stablehlo.multiply
// CHECK-NEXT: %[[FR_PART:.*]] = stablehlo.dot_general %[[FR_OTHER]], %[[FR_CUR]], contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x1xf32>) -> tensor<8x1xf32>
// CHECK: %[[FR_UPD:.*]] = stablehlo.dynamic_update_slice %[[FR_ACC]], %[[FR_PART]], %{{[^ ]+}}, %[[FR_OFF]] : (tensor<8x8xf32>, tensor<8x1xf32>, tensor<i32>, tensor<i32>) -> tensor<8x8xf32>
// CHECK: stablehlo.return %{{.*}}, %[[FR_MOVED]], %[[FR_UPD]], %[[FR_OTHER]], %[[FR_P]] :
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[FR_LAST:.*]] = stablehlo.dot_general %[[FR_A]], %[[FR_LOOP]]#1
// CHECK: %[[FR_OUT:.*]] = stablehlo.dynamic_update_slice %[[FR_LOOP]]#2, %[[FR_LAST]]
// CHECK: return %[[FR_OUT]]
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @free_rhs(%arg0: tensor<8x16xf32>, %arg1: tensor<16x1xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg1) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<16x1xf32>) -> tensor<16x8xf32>
    %1 = stablehlo.dot_general %arg0, %0, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Gathered dim is the lhs's contracting dim, strided groups [[0,2,4,6],[1,3,5,7]]
// (position table [0,0,1,1,2,2,3,3]): the rhs is sliced to the matching block of
// its contracting dim and the partial products are summed. Round 0 (own shard,
// before the first permute) starts the sum: its product is the accumulator's
// first value, with no zero constant and no add. The loop runs rounds 1..3 (the
// last round's shift is one that nothing reads), so the sum never leaves the loop's
// buffer: the loop's result is the function's.
// CHECK-LABEL: func.func @contracting_lhs
// CHECK-SAME: (%[[CL_X:.*]]: tensor<8x4xf32>, %[[CL_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[CL_S0:.*]] = stablehlo.dynamic_slice %[[CL_W]], %{{.*}}, %{{.*}}, sizes = [4, 8] : (tensor<16x8xf32>, tensor<i32>, tensor<i32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[CL_ACC0:.*]] = stablehlo.dot_general %[[CL_X]], %[[CL_S0]], contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[CL_SENT:.*]] = "stablehlo.collective_permute"(%[[CL_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.add {{.*}} : tensor<8x8xf32>
// CHECK: %[[CL_LOOP:.*]]:5 = stablehlo.while(%[[CL_K:[^ ]+]] = %{{[^ ]+}}, %[[CL_CUR:[^ ]+]] = %[[CL_SENT]], %[[CL_ACC:[^ ]+]] = %[[CL_ACC0]], %[[CL_OTHER:[^ ]+]] = %[[CL_W]], %[[CL_P:[^ ]+]] = %{{[^ ]+}})
// CHECK: } do {
// CHECK-NEXT: %[[CL_MOVED:.*]] = "stablehlo.collective_permute"(%[[CL_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK: %[[CL_OFF:.*]] = stablehlo.multiply
// CHECK: %[[CL_SLICE:.*]] = stablehlo.dynamic_slice %[[CL_OTHER]], %[[CL_OFF]], %{{.*}}, sizes = [4, 8] : (tensor<16x8xf32>, tensor<i32>, tensor<i32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[CL_PART:.*]] = stablehlo.dot_general %[[CL_CUR]], %[[CL_SLICE]], contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[CL_SUM:.*]] = stablehlo.add %[[CL_PART]], %[[CL_ACC]] : tensor<8x8xf32>
// CHECK: stablehlo.return %{{.*}}, %[[CL_MOVED]], %[[CL_SUM]], %[[CL_OTHER]], %[[CL_P]] :
// CHECK-NEXT: }
// CHECK-NEXT: return %[[CL_LOOP]]#2 : tensor<8x8xf32>
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @contracting_lhs(%arg0: tensor<8x4xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<8x4xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Gathered dim is the rhs's contracting dim, groups of 2 [[0,1],[2,3],[4,5],[6,7]]:
// no round is left for a loop iteration, so both rounds are inline (INLINE prefix:
// no stablehlo.while in the function): round 0 on the
// own shard (lhs sliced along its dim 1 at block p; its product is the sum so far,
// with no zero constant or add), one permute, round 1 on the received shard (lhs
// block p + 1) added to it.
// CHECK-LABEL: func.func @contracting_rhs
// CHECK-SAME: (%[[CR_A:.*]]: tensor<8x16xf32>, %[[CR_X:.*]]: tensor<8x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[CR_POS:.*]] = stablehlo.reshape {{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[CR_M0:.*]] = stablehlo.remainder %[[CR_POS]], %{{.*}}
// CHECK: %[[CR_OFF0:.*]] = stablehlo.multiply %[[CR_M0]], %{{[^ ]+}}
// CHECK: %[[CR_S0:.*]] = stablehlo.dynamic_slice %[[CR_A]], %{{.*}}, %[[CR_OFF0]], sizes = [8, 8] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[CR_ACC0:.*]] = stablehlo.dot_general %[[CR_S0]], %[[CR_X]], contracting_dims = [1] x [0]
// CHECK-NEXT: %[[CR_SENT:.*]] = "stablehlo.collective_permute"(%[[CR_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.add {{.*}} : tensor<8x8xf32>
// CHECK: %[[CR_J1:.*]] = stablehlo.add %[[CR_POS]], %{{[^ ]+}}
// CHECK: %[[CR_S1:.*]] = stablehlo.dynamic_slice %[[CR_A]], %{{.*}}, %{{.*}}, sizes = [8, 8]
// CHECK-NEXT: %[[CR_P1:.*]] = stablehlo.dot_general %[[CR_S1]], %[[CR_SENT]], contracting_dims = [1] x [0]
// CHECK-NEXT: %[[CR_OUT:.*]] = stablehlo.add %[[CR_P1]], %[[CR_ACC0]]
// CHECK-NEXT: return %[[CR_OUT]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.all_gather
// INLINE-LABEL: func.func @contracting_rhs
// INLINE-NOT: stablehlo.while
// INLINE: return
// INLINE-NOT: stablehlo.while
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @contracting_rhs(%arg0: tensor<8x16xf32>, %arg1: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg1) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, use_global_device_ids}> : (tensor<8x8xf32>) -> tensor<16x8xf32>
    %1 = stablehlo.dot_general %arg0, %0, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Gathered dim is a batch dim of the lhs, groups of 2 along the middle axis of a
// 2x2x2 mesh ([[0,2],[1,3],[4,6],[5,7]]): in each (inline) round the rhs's batch
// block is sliced and the result's batch block written, both at the same offset.
// CHECK-LABEL: func.func @batch_lhs
// CHECK-SAME: (%[[BL_X:.*]]: tensor<2x4x16xf32>, %[[BL_W:.*]]: tensor<4x16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 0, 0, 1, 1]> : tensor<8xi32>
// CHECK: %[[BL_OFF0:.*]] = stablehlo.multiply
// CHECK: %[[BL_S0:.*]] = stablehlo.dynamic_slice %[[BL_W]], %[[BL_OFF0]], %{{.*}}, %{{.*}}, sizes = [2, 16, 8]
// CHECK-NEXT: %[[BL_P0:.*]] = stablehlo.dot_general %[[BL_X]], %[[BL_S0]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x4x16xf32>, tensor<2x16x8xf32>) -> tensor<2x4x8xf32>
// CHECK: %[[BL_ACC0:.*]] = stablehlo.dynamic_update_slice %{{.*}}, %[[BL_P0]], %[[BL_OFF0]], %{{.*}}, %{{.*}} : (tensor<4x4x8xf32>, tensor<2x4x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x4x8xf32>
// CHECK-NEXT: %[[BL_SENT:.*]] = "stablehlo.collective_permute"(%[[BL_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 2], [2, 0], [1, 3], [3, 1], [4, 6], [6, 4], [5, 7], [7, 5]]> : tensor<8x2xi64>}>
// CHECK: %[[BL_OFF1:.*]] = stablehlo.multiply
// CHECK: %[[BL_S1:.*]] = stablehlo.dynamic_slice %[[BL_W]], %[[BL_OFF1]], %{{.*}}, %{{.*}}, sizes = [2, 16, 8]
// CHECK-NEXT: %[[BL_P1:.*]] = stablehlo.dot_general %[[BL_SENT]], %[[BL_S1]], batching_dims = [0] x [0], contracting_dims = [2] x [1]
// CHECK: %[[BL_OUT:.*]] = stablehlo.dynamic_update_slice %[[BL_ACC0]], %[[BL_P1]], %[[BL_OFF1]], %{{.*}}, %{{.*}} :
// CHECK-NEXT: return %[[BL_OUT]]
// CHECK-NOT: stablehlo.all_gather
// INLINE-LABEL: func.func @batch_lhs
// INLINE-NOT: stablehlo.while
// INLINE: return
// INLINE-NOT: stablehlo.while
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @batch_lhs(%arg0: tensor<2x4x16xf32>, %arg1: tensor<4x16x8xf32>) -> tensor<4x4x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2], [1, 3], [4, 6], [5, 7]]> : tensor<4x2xi64>, use_global_device_ids}> : (tensor<2x4x16xf32>) -> tensor<4x4x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x4x16xf32>, tensor<4x16x8xf32>) -> tensor<4x4x8xf32>
    return %1 : tensor<4x4x8xf32>
  }
}

// -----

// Gathered dim is a batch dim of the rhs, groups of 2 along the outer axis of a
// 2x2x2 mesh ([[0,4],[1,5],[2,6],[3,7]]): two inline rounds, the lhs's batch block
// sliced in each.
// CHECK-LABEL: func.func @batch_rhs
// CHECK-SAME: (%[[BR_A:.*]]: tensor<4x8x16xf32>, %[[BR_X:.*]]: tensor<2x16x4xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.constant dense<[0, 0, 0, 0, 1, 1, 1, 1]> : tensor<8xi32>
// CHECK: %[[BR_OFF0:.*]] = stablehlo.multiply
// CHECK: %[[BR_S0:.*]] = stablehlo.dynamic_slice %[[BR_A]], %[[BR_OFF0]], %{{.*}}, %{{.*}}, sizes = [2, 8, 16]
// CHECK-NEXT: %[[BR_P0:.*]] = stablehlo.dot_general %[[BR_S0]], %[[BR_X]], batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x16xf32>, tensor<2x16x4xf32>) -> tensor<2x8x4xf32>
// CHECK: %[[BR_ACC0:.*]] = stablehlo.dynamic_update_slice %{{.*}}, %[[BR_P0]], %[[BR_OFF0]], %{{.*}}, %{{.*}} :
// CHECK-NEXT: %[[BR_SENT:.*]] = "stablehlo.collective_permute"(%[[BR_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 4], [4, 0], [1, 5], [5, 1], [2, 6], [6, 2], [3, 7], [7, 3]]> : tensor<8x2xi64>}>
// CHECK: %[[BR_OFF1:.*]] = stablehlo.multiply
// CHECK: %[[BR_S1:.*]] = stablehlo.dynamic_slice %[[BR_A]], %[[BR_OFF1]], %{{.*}}, %{{.*}}, sizes = [2, 8, 16]
// CHECK-NEXT: %[[BR_P1:.*]] = stablehlo.dot_general %[[BR_S1]], %[[BR_SENT]], batching_dims = [0] x [0], contracting_dims = [2] x [1]
// CHECK: %[[BR_OUT:.*]] = stablehlo.dynamic_update_slice %[[BR_ACC0]], %[[BR_P1]], %[[BR_OFF1]], %{{.*}}, %{{.*}} :
// CHECK-NEXT: return %[[BR_OUT]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.all_gather
// INLINE-LABEL: func.func @batch_rhs
// INLINE-NOT: stablehlo.while
// INLINE: return
// INLINE-NOT: stablehlo.while
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @batch_rhs(%arg0: tensor<4x8x16xf32>, %arg1: tensor<2x16x4xf32>) -> tensor<4x8x4xf32> {
    %0 = "stablehlo.all_gather"(%arg1) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, use_global_device_ids}> : (tensor<2x16x4xf32>) -> tensor<4x16x4xf32>
    %1 = stablehlo.dot_general %arg0, %0, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x8x16xf32>, tensor<4x16x4xf32>) -> tensor<4x8x4xf32>
    return %1 : tensor<4x8x4xf32>
  }
}

// -----

// Replica ids: no channel handle, 8 replicas of 1 partition. The position comes
// from stablehlo.replica_id and no permute (before or inside the loop) has a
// channel handle (so its pairs are replica ids too).
// CHECK-LABEL: func.func @replica_ids
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.partition_id
// CHECK: %[[RI_RID:.*]] = stablehlo.replica_id : tensor<ui32>
// CHECK-NEXT: %[[RI_ID:.*]] = stablehlo.convert %[[RI_RID]]
// CHECK-NEXT: %[[RI_TABLE:.*]] = stablehlo.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>
// CHECK-NEXT: stablehlo.dynamic_slice %[[RI_TABLE]], %[[RI_ID]]
// CHECK-NOT: channel_handle
// CHECK: %[[RI_SENT:.*]] = "stablehlo.collective_permute"(%arg0) <{source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: stablehlo.while(%[[RI_K:[^ ]+]] = %{{[^ ]+}}, %[[RI_CUR:[^ ]+]] = %[[RI_SENT]],
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%[[RI_CUR]]) <{source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.all_gather
// INLINE-LABEL: func.func @replica_ids
module attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 8 : i32} {
  func.func @replica_ids(%arg0: tensor<1x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>}> : (tensor<1x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Empty replica_groups with a channel handle (cross-replica-and-partition, one
// replica): one group of all 8 partitions.
// CHECK-LABEL: func.func @empty_groups
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.partition_id
// CHECK: stablehlo.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : tensor<8xi32>
// CHECK: %[[EG_SENT:.*]] = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK: stablehlo.while(%[[EG_K:[^ ]+]] = %{{[^ ]+}}, %[[EG_CUR:[^ ]+]] = %[[EG_SENT]],
// CHECK: stablehlo.constant dense<7> : tensor<i32>
// CHECK: "stablehlo.collective_permute"(%[[EG_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}>
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @empty_groups(%arg0: tensor<1x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<> : tensor<0x0xi64>}> : (tensor<1x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Two sites in a module whose highest channel handle is 7 (an unrelated permute):
// each ring has two permutes (round 0 before its loop, one in it), and all four get
// fresh handles 8, 9, 10 and 11, each used once; no handle of the module is reused
// and the module's own permute keeps 7.
// CHECK-LABEL: func.func @fresh_channels
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%arg0)
// CHECK-SAME: <{channel_handle = #stablehlo.channel_handle<handle = 8, type = 1>
// CHECK-NOT: channel_handle
// CHECK: stablehlo.while
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%iterArg
// CHECK-SAME: <{channel_handle = #stablehlo.channel_handle<handle = 9, type = 1>
// CHECK-NOT: channel_handle
// CHECK: %[[FC_OLD:.*]] = "stablehlo.collective_permute"(%arg2)
// CHECK-SAME: <{channel_handle = #stablehlo.channel_handle<handle = 7, type = 1>
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%[[FC_OLD]])
// CHECK-SAME: <{channel_handle = #stablehlo.channel_handle<handle = 10, type = 1>
// CHECK-NOT: channel_handle
// CHECK: stablehlo.while
// CHECK-NOT: channel_handle
// CHECK: "stablehlo.collective_permute"(%iterArg
// CHECK-SAME: <{channel_handle = #stablehlo.channel_handle<handle = 11, type = 1>
// CHECK-NOT: channel_handle
// CHECK-NOT: stablehlo.all_gather
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @fresh_channels(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>, %arg2: tensor<2x16xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>, tensor<2x16xf32>) {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = "stablehlo.collective_permute"(%arg2) <{channel_handle = #stablehlo.channel_handle<handle = 7, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<2x16xf32>) -> tensor<2x16xf32>
    %3 = "stablehlo.all_gather"(%2) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %4 = stablehlo.dot_general %3, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1, %4, %2 : tensor<8x8xf32>, tensor<8x8xf32>, tensor<2x16xf32>
  }
}

// -----

// bf16 with the gathered dim contracting: the partial products are summed in bf16,
// the result's type, as XLA's windowed einsum does (f32-sums.mlir: in f32). Round
// 0's product is the accumulator's first value (no zero constant, no add); the loop
// runs every other round and its result is returned, with no convert.
// CHECK-LABEL: func.func @bf16_contracting
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[BF_ACC0:.*]] = stablehlo.dot_general %arg0, %{{.*}}, contracting_dims = [1] x [0] : (tensor<8x4xbf16>, tensor<4x8xbf16>) -> tensor<8x8xbf16>
// CHECK-NEXT: %[[BF_SENT:.*]] = "stablehlo.collective_permute"(%arg0) {{.*}} : (tensor<8x4xbf16>) -> tensor<8x4xbf16>
// CHECK-NOT: stablehlo.add
// CHECK: %[[BF_LOOP:.*]]:5 = stablehlo.while(%[[BF_K:[^ ]+]] = %{{[^ ]+}}, %[[BF_CUR:[^ ]+]] = %[[BF_SENT]], %[[BF_ACC:[^ ]+]] = %[[BF_ACC0]], %{{.*}}) : tensor<i32>, tensor<8x4xbf16>, tensor<8x8xbf16>, tensor<16x8xbf16>, tensor<i32>
// CHECK: "stablehlo.collective_permute"(%[[BF_CUR]]) {{.*}} : (tensor<8x4xbf16>) -> tensor<8x4xbf16>
// CHECK: %[[BF_PART:.*]] = stablehlo.dot_general %[[BF_CUR]], %{{.*}}, contracting_dims = [1] x [0] : (tensor<8x4xbf16>, tensor<4x8xbf16>) -> tensor<8x8xbf16>
// CHECK-NEXT: stablehlo.add %[[BF_PART]], %[[BF_ACC]] : tensor<8x8xbf16>
// CHECK: return %[[BF_LOOP]]#2 : tensor<8x8xbf16>
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @bf16_contracting(%arg0: tensor<8x4xbf16>, %arg1: tensor<16x8xbf16>) -> tensor<8x8xbf16> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<8x4xbf16>) -> tensor<8x16xbf16>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xbf16>, tensor<16x8xbf16>) -> tensor<8x8xbf16>
    return %1 : tensor<8x8xbf16>
  }
}

// -----

// A site in a private function reached by func.call: the callee is rewritten, the
// caller is left as it is. Groups of 2: two inline rounds, one permute.
// CHECK-LABEL: func.func @called
// CHECK: call @shard_matmul(%arg0, %arg1)
// CHECK-LABEL: func.func private @shard_matmul
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.constant dense<[0, 1, 0, 1, 0, 1, 0, 1]> : tensor<8xi32>
// CHECK: stablehlo.dot_general %arg0, %arg1
// CHECK: %[[CA_SENT:.*]] = "stablehlo.collective_permute"(%arg0)
// CHECK: stablehlo.dot_general %[[CA_SENT]], %arg1
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.all_gather
// INLINE-LABEL: func.func private @shard_matmul
// INLINE-NOT: stablehlo.while
// INLINE: return
// INLINE-NOT: stablehlo.while
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @called(%arg0: tensor<4x32xf32>, %arg1: tensor<32x16xf32>) -> tensor<8x16xf32> {
    %0 = call @shard_matmul(%arg0, %arg1) : (tensor<4x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
  func.func private @shard_matmul(%arg0: tensor<4x32xf32>, %arg1: tensor<32x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, use_global_device_ids}> : (tensor<4x32xf32>) -> tensor<8x32xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
    return %1 : tensor<8x16xf32>
  }
}

// -----

// A site inside a stablehlo.while body (a scanned layer): the new ring is nested in
// that body; its round 0 and first permute read the outer loop's block argument.
// CHECK-LABEL: func.func @in_while
// CHECK: stablehlo.while(%[[IW_I:[^ ]+]] = %{{[^ ]+}}, %[[IW_X:[^ ]+]] = %arg0)
// CHECK: } do {
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.partition_id
// CHECK: stablehlo.dot_general %[[IW_X]], %arg1
// CHECK: %[[IW_SENT:.*]] = "stablehlo.collective_permute"(%[[IW_X]])
// CHECK: %[[IW_LOOP:.*]]:5 = stablehlo.while(%[[IW_K:[^ ]+]] = %{{[^ ]+}}, %[[IW_CUR:[^ ]+]] = %[[IW_SENT]], %[[IW_ACC:[^ ]+]] = %{{[^ ]+}}, %[[IW_OTHER:[^ ]+]] = %arg1,
// CHECK: } do {
// CHECK-NEXT: "stablehlo.collective_permute"(%[[IW_CUR]])
// CHECK: stablehlo.dot_general %[[IW_CUR]], %[[IW_OTHER]]
// CHECK: %[[IW_LAST:.*]] = stablehlo.dot_general %[[IW_LOOP]]#1, %arg1
// CHECK: %[[IW_OUT:.*]] = stablehlo.dynamic_update_slice %[[IW_LOOP]]#2, %[[IW_LAST]]
// CHECK: stablehlo.slice %[[IW_OUT]]
// CHECK-NOT: stablehlo.all_gather
// INLINE-LABEL: func.func @in_while
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @in_while(%arg0: tensor<2x16xf32>, %arg1: tensor<16x16xf32>) -> tensor<2x16xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = stablehlo.while(%iterArg = %c, %iterArg_0 = %arg0) : tensor<i32>, tensor<2x16xf32>
    cond {
      %c_1 = stablehlo.constant dense<3> : tensor<i32>
      %1 = stablehlo.compare LT, %iterArg, %c_1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %1 : tensor<i1>
    } do {
      %1 = "stablehlo.all_gather"(%iterArg_0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
      %2 = stablehlo.dot_general %1, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
      %3 = stablehlo.slice %2 [0:2, 0:16] : (tensor<8x16xf32>) -> tensor<2x16xf32>
      %c_1 = stablehlo.constant dense<1> : tensor<i32>
      %4 = stablehlo.add %iterArg, %c_1 : tensor<i32>
      stablehlo.return %4, %3 : tensor<i32>, tensor<2x16xf32>
    }
    return %0#1 : tensor<2x16xf32>
  }
}

// -----

// A site inside an sdy.manual_computation body (jax.shard_map over both mesh axes,
// gathering over "x", as JAX emits it): the ring lives in the body and reads the
// body's block arguments; the dot's precision config is kept on every partial dot.
// CHECK-LABEL: func.func public @manual
// CHECK: sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"x", "y"} (%[[MC_X:.*]]: tensor<16x32xf32>, %[[MC_W:.*]]: tensor<32x16xf32>) {
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.partition_id
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: stablehlo.dot_general %[[MC_X]], %[[MC_W]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x16xf32>
// CHECK: %[[MC_SENT:.*]] = "stablehlo.collective_permute"(%[[MC_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK: %[[MC_LOOP:.*]]:5 = stablehlo.while(%[[MC_K:[^ ]+]] = %{{[^ ]+}}, %[[MC_CUR:[^ ]+]] = %[[MC_SENT]], %[[MC_ACC:[^ ]+]] = %{{[^ ]+}}, %[[MC_OTHER:[^ ]+]] = %[[MC_W]],
// CHECK: "stablehlo.collective_permute"(%[[MC_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK: stablehlo.dot_general %[[MC_CUR]], %[[MC_OTHER]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x16xf32>
// CHECK: %[[MC_LAST:.*]] = stablehlo.dot_general %[[MC_LOOP]]#1, %[[MC_W]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT]
// CHECK: %[[MC_OUT:.*]] = stablehlo.dynamic_update_slice %[[MC_LOOP]]#2, %[[MC_LAST]]
// CHECK: sdy.return %[[MC_OUT]] : tensor<64x16xf32>
// CHECK-NOT: stablehlo.all_gather
module @jit_manual attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4, "y"=2]>
  func.func public @manual(%arg0: tensor<64x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %arg1: tensor<32x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) -> (tensor<64x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) {
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"x", "y"} (%arg2: tensor<16x32xf32>, %arg3: tensor<32x16xf32>) {
      %1 = "stablehlo.all_gather"(%arg2) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
      %2 = stablehlo.dot_general %1, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
      sdy.return %2 : tensor<64x16xf32>
    } : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    return %0 : tensor<64x16xf32>
  }
}

// -----

// The all_gather has a user besides the dot, after it: the ring assembles the
// gathered tensor as it goes (round 0 writes the own shard at block p, each round the
// shard it holds at its block, the last round the last shard), the buffer travels
// the loop beside the accumulator, and the other user reads the buffer: the
// all_gather goes away and the data is sent once.
// CHECK-LABEL: func.func @extra_user
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[EU_ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<8x16xf32>
// CHECK: stablehlo.dot_general %arg0, %arg1
// CHECK: %[[EU_BUF0:.*]] = stablehlo.dynamic_update_slice %[[EU_ZERO]], %arg0, %{{[^ ]+}}, %{{[^ ]+}} : (tensor<8x16xf32>, tensor<2x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
// CHECK: %[[EU_SENT:.*]] = "stablehlo.collective_permute"(%arg0)
// CHECK: %[[EU_LOOP:.*]]:6 = stablehlo.while(%[[EU_K:[^ ]+]] = %{{[^ ]+}}, %[[EU_CUR:[^ ]+]] = %[[EU_SENT]], %[[EU_ACC:[^ ]+]] = %{{[^ ]+}}, %[[EU_BUF:[^ ]+]] = %[[EU_BUF0]], %[[EU_OTHER:[^ ]+]] = %arg1,
// CHECK: %[[EU_MOVED:.*]] = "stablehlo.collective_permute"(%[[EU_CUR]])
// CHECK: stablehlo.dot_general %[[EU_CUR]], %[[EU_OTHER]]
// CHECK: %[[EU_NEXT:.*]] = stablehlo.dynamic_update_slice %[[EU_BUF]], %[[EU_CUR]], %{{[^ ]+}}, %{{[^ ]+}} : (tensor<8x16xf32>, tensor<2x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
// CHECK: stablehlo.return %{{[^ ]+}}, %[[EU_MOVED]], %{{[^ ]+}}, %[[EU_NEXT]],
// CHECK: %[[EU_OUT:.*]] = stablehlo.dynamic_update_slice %[[EU_LOOP]]#2
// CHECK: %[[EU_FULL:.*]] = stablehlo.dynamic_update_slice %[[EU_LOOP]]#3, %[[EU_LOOP]]#1,
// CHECK: %[[EU_NEG:.*]] = stablehlo.negate %[[EU_FULL]]
// CHECK: return %[[EU_OUT]], %[[EU_NEG]]
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @extra_user(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> (tensor<8x8xf32>, tensor<8x16xf32>) {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.negate %0 : tensor<8x16xf32>
    return %1, %2 : tensor<8x8xf32>, tensor<8x16xf32>
  }
}

// -----

// Two dots read one all_gather, and both other operands are function arguments:
// ONE ring serves both. Round 0 multiplies the own shard by each weight, one
// permute sends it; the loop carries the shard once and one accumulator per dot;
// each round's one permute and both dots read the carried shard; the last round
// feeds both dots from the loop's shard. The all_gather goes away.
// CHECK-LABEL: func.func @two_dots
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.dot_general %arg0, %arg1
// CHECK: stablehlo.dot_general %arg0, %arg2
// CHECK: %[[TD_SENT:.*]] = "stablehlo.collective_permute"(%arg0)
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[TD_LOOP:.*]]:7 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[TD_CUR:[^ ]+]] = %[[TD_SENT]], %[[TD_ACC1:[^ ]+]] = %{{[^ ]+}}, %[[TD_ACC2:[^ ]+]] = %{{[^ ]+}}, %[[TD_W1:[^ ]+]] = %arg1, %[[TD_W2:[^ ]+]] = %arg2,
// CHECK: } do {
// CHECK-NEXT: %[[TD_MOVED:.*]] = "stablehlo.collective_permute"(%[[TD_CUR]])
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[TD_D1:.*]] = stablehlo.dot_general %[[TD_CUR]], %[[TD_W1]]
// CHECK: %[[TD_U1:.*]] = stablehlo.dynamic_update_slice %[[TD_ACC1]], %[[TD_D1]]
// CHECK: %[[TD_D2:.*]] = stablehlo.dot_general %[[TD_CUR]], %[[TD_W2]]
// CHECK: %[[TD_U2:.*]] = stablehlo.dynamic_update_slice %[[TD_ACC2]], %[[TD_D2]]
// CHECK: stablehlo.return %{{.*}}, %[[TD_MOVED]], %[[TD_U1]], %[[TD_U2]], %[[TD_W1]], %[[TD_W2]],
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.while
// CHECK: %[[TD_L1:.*]] = stablehlo.dot_general %[[TD_LOOP]]#1, %arg1
// CHECK: %[[TD_OUT1:.*]] = stablehlo.dynamic_update_slice %[[TD_LOOP]]#2, %[[TD_L1]]
// CHECK: %[[TD_L2:.*]] = stablehlo.dot_general %[[TD_LOOP]]#1, %arg2
// CHECK: %[[TD_OUT2:.*]] = stablehlo.dynamic_update_slice %[[TD_LOOP]]#3, %[[TD_L2]]
// CHECK: return %[[TD_OUT1]], %[[TD_OUT2]]
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @two_dots(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>, %arg2: tensor<16x4xf32>) -> (tensor<8x8xf32>, tensor<8x4xf32>) {
    // REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 2 dot(s) (free dim, free dim), tensor<8x16xf32> gathered over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.dot_general %0, %arg2, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    return %1, %2 : tensor<8x8xf32>, tensor<8x4xf32>
  }
}

// -----

// Exactly 1 MiB gathered (512x512xf32): at or above the default threshold, so the
// default pipeline (third RUN line) rewrites it, unlike the tiny @free_lhs.
// CHECK-LABEL: func.func @default_threshold
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.collective_permute
// CHECK: stablehlo.while
// DEFAULT-LABEL: func.func @default_threshold
// DEFAULT-NOT: stablehlo.all_gather
// DEFAULT: stablehlo.collective_permute
// DEFAULT: stablehlo.while
// DEFAULT: stablehlo.collective_permute
// DEFAULT-NOT: stablehlo.all_gather
// DEFAULT: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @default_threshold(%arg0: tensor<128x512xf32>, %arg1: tensor<512x8xf32>) -> tensor<512x8xf32> {
    // DEFAULT-REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<512x512xf32> gathered over groups of 4; decided by threshold-mib=1 (the default: neither threshold-mib nor hardware given): {{.*}} MiB communicated{{$}}
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<128x512xf32>) -> tensor<512x512xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x8xf32>) -> tensor<512x8xf32>
    return %1 : tensor<512x8xf32>
  }
}

// -----

// Left unchanged: the replica groups cover only 4 of the 8 partitions.
// CHECK-LABEL: func.func @groups_not_partition
// CHECK: %[[GN_G:.*]] = "stablehlo.all_gather"
// CHECK-NEXT: stablehlo.dot_general %[[GN_G]], %arg1
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @groups_not_partition(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    // REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: replica groups do not partition the 8 device ids
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Left unchanged: dynamic shapes.
// CHECK-LABEL: func.func @dynamic_shape
// CHECK: %[[DS_G:.*]] = "stablehlo.all_gather"
// CHECK-NEXT: stablehlo.dot_general %[[DS_G]], %arg1
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @dynamic_shape(%arg0: tensor<?x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<?x8xf32> {
    // REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: dynamic or unranked shape tensor<?x16xf32>
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<?x16xf32>) -> tensor<?x16xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<?x16xf32>, tensor<16x8xf32>) -> tensor<?x8xf32>
    return %1 : tensor<?x8xf32>
  }
}

// -----

// Left unchanged: the gathered tensor is both operands of the dot.
// CHECK-LABEL: func.func @both_operands
// CHECK: %[[BO_G:.*]] = "stablehlo.all_gather"
// CHECK-NEXT: stablehlo.dot_general %[[BO_G]], %[[BO_G]]
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @both_operands(%arg0: tensor<2x8xf32>) -> tensor<8x8xf32> {
    // REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: the gathered tensor is both operands of the dot
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.dot_general %0, %0, contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}

// -----

// Left unchanged: the gathered tensor is both operands, once through a transpose
// (a regression: this once rewrote the same dot twice and crashed).
// CHECK-LABEL: func.func @both_operands_through_view
// CHECK: %[[BV_G:.*]] = "stablehlo.all_gather"
// CHECK-NEXT: %[[BV_T:.*]] = stablehlo.transpose %[[BV_G]]
// CHECK-NEXT: stablehlo.dot_general %[[BV_G]], %[[BV_T]]
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @both_operands_through_view(%arg0: tensor<2x8xf32>) -> tensor<8x8xf32> {
    // REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: the gathered tensor is both operands of the dot
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.dot_general %0, %1, contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    return %2 : tensor<8x8xf32>
  }
}

// -----

// Left unchanged: an optimization_barrier separates the all_gather from the dot
// (the barrier forbids moving the dot's work across it). Nothing changes, and the
// remark says why.
// CHECK-LABEL: func.func @barrier
// CHECK: %[[OB_G:.*]] = "stablehlo.all_gather"
// CHECK-NEXT: %[[OB_B:.*]] = stablehlo.optimization_barrier %[[OB_G]]
// CHECK-NEXT: stablehlo.dot_general %[[OB_B]], %arg1
// CHECK-NOT: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @barrier(%arg0: tensor<2x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<8x8xf32> {
    // REMARK: overlap-all-gather-matmul.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: left unchanged: an optimization_barrier separates it from its users{{$}}
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.optimization_barrier %0 : tensor<8x16xf32>
    %2 = stablehlo.dot_general %1, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %2 : tensor<8x8xf32>
  }
}
