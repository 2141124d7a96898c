// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true target=gpu})' --split-input-file | FileCheck %s --check-prefix=GPU

// Several dots reading one all_gather share ONE ring when every dot's other operand
// already exists at the first dot: the shard travels once (one permute per round)
// and feeds every dot; each dot keeps its own accumulator. A dot whose other operand
// is computed after the first dot (a backward-pass use) reads the gathered tensor
// that the first ring assembles (no second ring, nothing sent twice). Elementwise ops
// that combine the products of two or more of the dots (a gated MLP's activation) run
// on each block inside the ring, which then keeps one buffer for the combination.
// The REMARK prefix checks that a site's dots are listed in program order (a free
// dim dot written before a contracting dim one is listed first).

// A gated MLP body: the gathered activations feed the gate and the up projections,
// and silu(gate) * up combines them elementwise. One while loop carrying one shard
// and ONE accumulator, the combination's: every round multiplies its shard by both
// weights, applies the elementwise epilogue (logistic, two multiplies) to the two
// blocks, and writes the result's block; round 0 does so on the own shard before the
// one first permute, each loop round has one permute and two dots, both reading the
// carried shard, and the last round feeds both dots from the loop's shard. The
// products of the two dots are never built whole.
// CHECK-LABEL: func.func @gated_mlp
// CHECK-SAME: (%[[GM_X:.*]]: tensor<2x16xf32>, %[[GM_WG:.*]]: tensor<16x32xf32>, %[[GM_WU:.*]]: tensor<16x32xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[GM_G0:.*]] = stablehlo.dot_general %[[GM_X]], %[[GM_WG]]
// CHECK: %[[GM_U0:.*]] = stablehlo.dot_general %[[GM_X]], %[[GM_WU]]
// CHECK-NEXT: %[[GM_S0:.*]] = stablehlo.logistic %[[GM_G0]] : tensor<2x32xf32>
// CHECK-NEXT: %[[GM_A0:.*]] = stablehlo.multiply %[[GM_G0]], %[[GM_S0]] : tensor<2x32xf32>
// CHECK-NEXT: %[[GM_H0:.*]] = stablehlo.multiply %[[GM_A0]], %[[GM_U0]] : tensor<2x32xf32>
// CHECK: %[[GM_ACC0:.*]] = stablehlo.dynamic_update_slice %{{[^ ]+}}, %[[GM_H0]],
// CHECK-NEXT: %[[GM_SENT:.*]] = "stablehlo.collective_permute"(%[[GM_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]> : tensor<4x2xi64>}>
// CHECK: %[[GM_LOOP:.*]]:6 = stablehlo.while(%[[GM_K:[^ ]+]] = %{{[^ ]+}}, %[[GM_CUR:[^ ]+]] = %[[GM_SENT]], %[[GM_ACC:[^ ]+]] = %[[GM_ACC0]], %[[GM_OG:[^ ]+]] = %[[GM_WG]], %[[GM_OU:[^ ]+]] = %[[GM_WU]], %{{.*}}) : tensor<i32>, tensor<2x16xf32>, tensor<8x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<i32>
// CHECK: } do {
// CHECK-NEXT: %[[GM_MOVED:.*]] = "stablehlo.collective_permute"(%[[GM_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[GM_DG:.*]] = stablehlo.dot_general %[[GM_CUR]], %[[GM_OG]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x32xf32>) -> tensor<2x32xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[GM_DU:.*]] = stablehlo.dot_general %[[GM_CUR]], %[[GM_OU]], contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x32xf32>) -> tensor<2x32xf32>
// CHECK-NEXT: %[[GM_SIG:.*]] = stablehlo.logistic %[[GM_DG]]
// CHECK-NEXT: %[[GM_ACT:.*]] = stablehlo.multiply %[[GM_DG]], %[[GM_SIG]]
// CHECK-NEXT: %[[GM_HB:.*]] = stablehlo.multiply %[[GM_ACT]], %[[GM_DU]]
// CHECK: %[[GM_UPD:.*]] = stablehlo.dynamic_update_slice %[[GM_ACC]], %[[GM_HB]],
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[GM_MOVED]], %[[GM_UPD]], %[[GM_OG]], %[[GM_OU]],
// CHECK-NEXT: }
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.while
// CHECK: %[[GM_LG:.*]] = stablehlo.dot_general %[[GM_LOOP]]#1, %[[GM_WG]]
// CHECK: %[[GM_LU:.*]] = stablehlo.dot_general %[[GM_LOOP]]#1, %[[GM_WU]]
// CHECK-NEXT: %[[GM_LS:.*]] = stablehlo.logistic %[[GM_LG]]
// CHECK-NEXT: %[[GM_LA:.*]] = stablehlo.multiply %[[GM_LG]], %[[GM_LS]]
// CHECK-NEXT: %[[GM_LH:.*]] = stablehlo.multiply %[[GM_LA]], %[[GM_LU]]
// CHECK-NEXT: %[[GM_H:.*]] = stablehlo.dynamic_update_slice %[[GM_LOOP]]#2, %[[GM_LH]],
// CHECK-NEXT: return %[[GM_H]]
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gated_mlp(%x: tensor<2x16xf32>, %wg: tensor<16x32xf32>, %wu: tensor<16x32xf32>) -> tensor<8x32xf32> {
    // REMARK: shared-gather.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 2 dot(s) (free dim, free dim), tensor<8x16xf32> gathered over groups of 4; an elementwise epilogue of 2 of its dots (3 op(s)) runs on each block: the ring keeps one buffer for their products; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %gate = stablehlo.dot_general %g, %wg, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
    %up = stablehlo.dot_general %g, %wu, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
    %s = stablehlo.logistic %gate : tensor<8x32xf32>
    %a = stablehlo.multiply %gate, %s : tensor<8x32xf32>
    %h = stablehlo.multiply %a, %up : tensor<8x32xf32>
    return %h : tensor<8x32xf32>
  }
}

// -----

// Backward-style use: y = g @ w, then dw = g^T @ dy with dy = tanh(y) computed from
// the first dot's result. dy does not exist at the first dot, so the second dot
// cannot join its ring; instead of a second ring sending the shards again, the
// first ring assembles the gathered tensor (a buffer beside its accumulator) and the
// second dot reads it: one ring, permutes on channels 2 and 3 only.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[BW_X:.*]]: tensor<2x16xf32>, %[[BW_W:.*]]: tensor<16x8xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: "stablehlo.collective_permute"(%[[BW_X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// CHECK: %[[BW_L1:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %[[BW_W]],
// CHECK: "stablehlo.collective_permute"(%iterArg{{[_0-9]*}}) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
// CHECK: %[[BW_Y:.*]] = stablehlo.dynamic_update_slice %[[BW_L1]]#2,
// CHECK: %[[BW_G:.*]] = stablehlo.dynamic_update_slice %[[BW_L1]]#3, %[[BW_L1]]#1,
// CHECK-NEXT: %[[BW_DY:.*]] = stablehlo.tanh %[[BW_Y]]
// CHECK-NEXT: %[[BW_DW:.*]] = stablehlo.dot_general %[[BW_G]], %[[BW_DY]], contracting_dims = [0] x [0] : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NEXT: return %[[BW_Y]], %[[BW_DW]]
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @backward(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> (tensor<8x8xf32>, tensor<16x8xf32>) {
    // REMARK: shared-gather.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4; the ring assembles the gathered tensor for 1 other reader(s), 1 of them dot(s) with no ring of their own; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %y = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %dy = stablehlo.tanh %y : tensor<8x8xf32>
    %dw = stablehlo.dot_general %g, %dy, contracting_dims = [0] x [0] : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
    return %y, %dw : tensor<8x8xf32>, tensor<16x8xf32>
  }
}

// -----

// Q/K/V projections of one gathered input: one ring, three accumulators, one
// permute per round feeding the three dots.
// CHECK-LABEL: func.func @qkv
// CHECK-SAME: (%[[QKV_X:.*]]: tensor<2x16xf32>, %[[QKV_WQ:.*]]: tensor<16x8xf32>, %[[QKV_WK:.*]]: tensor<16x4xf32>, %[[QKV_WV:.*]]: tensor<16x4xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[QKV_SENT:.*]] = "stablehlo.collective_permute"(%[[QKV_X]])
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[QKV_LOOP:.*]]:9 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[QKV_CUR:[^ ]+]] = %[[QKV_SENT]], %[[QKV_AQ:[^ ]+]] = %{{[^ ]+}}, %[[QKV_AK:[^ ]+]] = %{{[^ ]+}}, %[[QKV_AV:[^ ]+]] = %{{[^ ]+}}, %[[QKV_OQ:[^ ]+]] = %[[QKV_WQ]], %[[QKV_OK:[^ ]+]] = %[[QKV_WK]], %[[QKV_OV:[^ ]+]] = %[[QKV_WV]],
// CHECK: } do {
// CHECK-NEXT: %[[QKV_MOVED:.*]] = "stablehlo.collective_permute"(%[[QKV_CUR]])
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.dot_general %[[QKV_CUR]], %[[QKV_OQ]]
// CHECK: stablehlo.dot_general %[[QKV_CUR]], %[[QKV_OK]]
// CHECK: stablehlo.dot_general %[[QKV_CUR]], %[[QKV_OV]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK: stablehlo.return %{{.*}}, %[[QKV_MOVED]],
// CHECK-NOT: stablehlo.collective_permute
// CHECK-NOT: stablehlo.while
// CHECK: stablehlo.dot_general %[[QKV_LOOP]]#1, %[[QKV_WQ]]
// CHECK: stablehlo.dot_general %[[QKV_LOOP]]#1, %[[QKV_WK]]
// CHECK: stablehlo.dot_general %[[QKV_LOOP]]#1, %[[QKV_WV]]
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @qkv(%x: tensor<2x16xf32>, %wq: tensor<16x8xf32>, %wk: tensor<16x4xf32>, %wv: tensor<16x4xf32>) -> (tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x4xf32>) {
    // REMARK: shared-gather.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 3 dot(s) (free dim, free dim, free dim), tensor<8x16xf32> gathered over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %q = stablehlo.dot_general %g, %wq, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %k = stablehlo.dot_general %g, %wk, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    %v = stablehlo.dot_general %g, %wv, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    return %q, %k, %v : tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x4xf32>
  }
}

// -----

// Dots of different kinds share a ring too: y = g @ w (gathered dim free) and
// z = g^T @ e (gathered dim contracting, e an argument): one permute per round, one
// dot writing a block of y, one dot summing into z (e sliced to the round's block).
// CHECK-LABEL: func.func @mixed_kinds
// CHECK-SAME: (%[[MK_X:.*]]: tensor<2x16xf32>, %[[MK_W:.*]]: tensor<16x8xf32>, %[[MK_E:.*]]: tensor<8x4xf32>)
// CHECK: %[[MK_SENT:.*]] = "stablehlo.collective_permute"(%[[MK_X]])
// CHECK: %[[MK_LOOP:.*]]:7 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[MK_CUR:[^ ]+]] = %[[MK_SENT]], %[[MK_AY:[^ ]+]] = %{{[^ ]+}}, %[[MK_AZ:[^ ]+]] = %{{[^ ]+}}, %[[MK_OW:[^ ]+]] = %[[MK_W]], %[[MK_OE:[^ ]+]] = %[[MK_E]],
// CHECK: } do {
// CHECK-NEXT: %[[MK_MOVED:.*]] = "stablehlo.collective_permute"(%[[MK_CUR]])
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[MK_DY:.*]] = stablehlo.dot_general %[[MK_CUR]], %[[MK_OW]], contracting_dims = [1] x [0]
// CHECK: %[[MK_UY:.*]] = stablehlo.dynamic_update_slice %[[MK_AY]], %[[MK_DY]],
// CHECK: %[[MK_SE:.*]] = stablehlo.dynamic_slice %[[MK_OE]], %{{.*}}, %{{.*}}, sizes = [2, 4]
// CHECK-NEXT: %[[MK_DZ:.*]] = stablehlo.dot_general %[[MK_CUR]], %[[MK_SE]], contracting_dims = [0] x [0] : (tensor<2x16xf32>, tensor<2x4xf32>) -> tensor<16x4xf32>
// CHECK-NEXT: %[[MK_UZ:.*]] = stablehlo.add %[[MK_DZ]], %[[MK_AZ]]
// CHECK: stablehlo.return %{{.*}}, %[[MK_MOVED]], %[[MK_UY]], %[[MK_UZ]],
// CHECK-NOT: stablehlo.while
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @mixed_kinds(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %e: tensor<8x4xf32>) -> (tensor<8x8xf32>, tensor<16x4xf32>) {
    // REMARK: shared-gather.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 2 dot(s) (free dim, contracting dim), tensor<8x16xf32> gathered over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %y = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %z = stablehlo.dot_general %g, %e, contracting_dims = [0] x [0] : (tensor<8x16xf32>, tensor<8x4xf32>) -> tensor<16x4xf32>
    return %y, %z : tensor<8x8xf32>, tensor<16x4xf32>
  }
}

// -----

// GPU form, two streams, two dots on one gather (four blocks a round): each dot's
// second block waits for its first to be written (an optimization_barrier of the
// written buffer and the dot's other operand), so XLA's GPU scheduler does not run
// the round's GEMMs ahead of their writes with every product live at once.
// GPU-LABEL: func.func @two_dots_gpu
// GPU: %[[GT:.*]]:4 = stablehlo.optimization_barrier
// GPU: %[[GQ0:.*]] = stablehlo.dot_general %[[GT]]#0, %[[GT_WQ:[^ ,]+]],
// GPU-NEXT: %[[GQW:.*]] = stablehlo.dynamic_update_slice %[[GT]]#2, %[[GQ0]],
// GPU-NEXT: %[[GQB:.*]]:2 = stablehlo.optimization_barrier %[[GQW]], %[[GT_WQ]] : tensor<8x8xf32>, tensor<16x8xf32>
// GPU: %[[GQ1:.*]] = stablehlo.dot_general %[[GT]]#1, %[[GQB]]#1,
// GPU-NEXT: stablehlo.dynamic_update_slice %[[GQB]]#0, %[[GQ1]],
// GPU: %[[GK0:.*]] = stablehlo.dot_general %[[GT]]#0, %[[GT_WK:[^ ,]+]],
// GPU-NEXT: %[[GKW:.*]] = stablehlo.dynamic_update_slice %[[GT]]#3, %[[GK0]],
// GPU-NEXT: %[[GKB:.*]]:2 = stablehlo.optimization_barrier %[[GKW]], %[[GT_WK]] : tensor<8x8xf32>, tensor<16x8xf32>
// GPU: stablehlo.dot_general %[[GT]]#1, %[[GKB]]#1,
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @two_dots_gpu(%x: tensor<2x16xf32>, %wq: tensor<16x8xf32>, %wk: tensor<16x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>) {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %q = stablehlo.dot_general %g, %wq, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %k = stablehlo.dot_general %g, %wk, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %q, %k : tensor<8x8xf32>, tensor<8x8xf32>
  }
}
