// RUN: overlap-opt %s --threshold-mib=0 --split-input-file | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK

// A bf16 gather upcast and transposed before the dot: the permutes (before and in
// the loop) carry the bf16 shard; the convert and transpose are replayed on each
// block (round 0 and every loop round, the last included), where the gathered dim
// (now dim 1 of the dot's lhs) is contracted; the loop's sum is the result.
// CHECK-LABEL: func.func @gather_convert_transpose
// CHECK-SAME: (%[[GT_X:.*]]: tensor<2x16xbf16>, %[[GT_W:.*]]: tensor<8x4xf32>)
// CHECK-NOT: stablehlo.all_gather
// CHECK: %[[GT_C0:.*]] = stablehlo.convert %[[GT_X]] : (tensor<2x16xbf16>) -> tensor<2x16xf32>
// CHECK-NEXT: %[[GT_T0:.*]] = stablehlo.transpose %[[GT_C0]], dims = [1, 0] : (tensor<2x16xf32>) -> tensor<16x2xf32>
// CHECK-NEXT: %[[GT_S0:.*]] = stablehlo.dynamic_slice %[[GT_W]], %{{.*}}, %{{.*}}, sizes = [2, 4]
// CHECK-NEXT: stablehlo.dot_general %[[GT_T0]], %[[GT_S0]], {{.*}} : (tensor<16x2xf32>, tensor<2x4xf32>) -> tensor<16x4xf32>
// CHECK: %[[GT_SENT:.*]] = "stablehlo.collective_permute"(%[[GT_X]])
// CHECK-SAME: (tensor<2x16xbf16>) -> tensor<2x16xbf16>
// CHECK: %[[GT_LOOP:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[GT_CUR:[^ ]+]] = %[[GT_SENT]],
// CHECK: } do {
// CHECK-NEXT: "stablehlo.collective_permute"(%[[GT_CUR]])
// CHECK-SAME: (tensor<2x16xbf16>) -> tensor<2x16xbf16>
// CHECK: %[[GT_C:.*]] = stablehlo.convert %[[GT_CUR]] : (tensor<2x16xbf16>) -> tensor<2x16xf32>
// CHECK-NEXT: %[[GT_T:.*]] = stablehlo.transpose %[[GT_C]], dims = [1, 0] : (tensor<2x16xf32>) -> tensor<16x2xf32>
// CHECK-NEXT: %[[GT_S:.*]] = stablehlo.dynamic_slice
// CHECK-NEXT: stablehlo.dot_general %[[GT_T]], %[[GT_S]], {{.*}} : (tensor<16x2xf32>, tensor<2x4xf32>) -> tensor<16x4xf32>
// CHECK: return %[[GT_LOOP]]#2 : tensor<16x4xf32>
// CHECK-NOT: stablehlo.all_gather
// REMARK: views.mlir:[[# @LINE + 3]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (contracting dim through stablehlo.convert through stablehlo.transpose), tensor<8x16xbf16> gathered over groups of 4;
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gather_convert_transpose(%arg0: tensor<2x16xbf16>, %arg1: tensor<8x4xf32>) -> tensor<16x4xf32> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x16xbf16>) -> tensor<8x16xbf16>
    %1 = stablehlo.convert %0 : (tensor<8x16xbf16>) -> tensor<8x16xf32>
    %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
    %3 = stablehlo.dot_general %2, %arg1, contracting_dims = [1] x [0] : (tensor<16x8xf32>, tensor<8x4xf32>) -> tensor<16x4xf32>
    return %3 : tensor<16x4xf32>
  }
}

// -----

// f32 partial sums transposed and rounded to bf16 before the scatter (batched, so the
// transpose is not folded into the product): the scatter dim (dim 1 after the
// transpose) is dim 2 of the dot, the rhs's free dim, so the rhs is
// sliced (one column per chain); each part is transposed and converted (round 0, each
// loop round and the own block's round), the converted part is added to the bf16
// accumulator received, and the bf16 accumulators travel.
// CHECK-LABEL: func.func @scatter_transpose_convert
// CHECK-SAME: (%[[ST_A:.*]]: tensor<2x8x16xf32>, %[[ST_B:.*]]: tensor<2x16x8xf32>)
// CHECK: %[[ST_S0:.*]] = stablehlo.dynamic_slice %[[ST_B]], %{{.*}}, %{{.*}}, %{{.*}}, sizes = [2, 16, 1]
// CHECK: %[[ST_D0:.*]] = stablehlo.dot_general %[[ST_A]], %[[ST_S0]], {{.*}} -> tensor<2x8x1xf32>
// CHECK: %[[ST_T0:.*]] = stablehlo.transpose %[[ST_D0]], dims = [0, 2, 1] : (tensor<2x8x1xf32>) -> tensor<2x1x8xf32>
// CHECK: %[[ST_C0:.*]] = stablehlo.convert %[[ST_T0]] : (tensor<2x1x8xf32>) -> tensor<2x1x8xbf16>
// CHECK-NEXT: %[[ST_R1:.*]] = "stablehlo.collective_permute"(%[[ST_C0]])
// CHECK: %[[ST_K0:.*]] = stablehlo.convert %{{.*}} : (tensor<2x1x8xf32>) -> tensor<2x1x8xbf16>
// CHECK: %[[ST_LOOP:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[ST_KEPT:[^ ]+]] = %[[ST_K0]], %[[ST_RECV:[^ ]+]] = %[[ST_R1]]
// CHECK: } do {
// CHECK-NEXT: %[[ST_ARRIVED:.*]] = "stablehlo.collective_permute"(%[[ST_KEPT]])
// CHECK: %[[ST_D:.*]] = stablehlo.dot_general {{.*}} -> tensor<2x8x1xf32>
// CHECK-NEXT: %[[ST_T:.*]] = stablehlo.transpose %[[ST_D]], dims = [0, 2, 1] : (tensor<2x8x1xf32>) -> tensor<2x1x8xf32>
// CHECK-NEXT: %[[ST_C:.*]] = stablehlo.convert %[[ST_T]] : (tensor<2x1x8xf32>) -> tensor<2x1x8xbf16>
// CHECK-NEXT: %[[ST_SUM:.*]] = stablehlo.add %[[ST_C]], %[[ST_RECV]] : tensor<2x1x8xbf16>
// CHECK-NEXT: %[[ST_M:.*]] = "stablehlo.collective_permute"(%[[ST_SUM]])
// CHECK: %[[ST_KEEP:.*]] = stablehlo.add %{{[^ ]+}}, %[[ST_ARRIVED]] : tensor<2x1x8xbf16>
// CHECK: stablehlo.return %{{[^ ]+}}, %[[ST_KEEP]], %[[ST_M]],
// CHECK: %[[ST_LAST:.*]] = "stablehlo.collective_permute"(%[[ST_LOOP]]#1)
// CHECK: stablehlo.add %{{[^ ]+}}, %[[ST_LOOP]]#2 : tensor<2x1x8xbf16>
// CHECK: stablehlo.add %{{[^ ]+}}, %[[ST_LAST]] : tensor<2x1x8xbf16>
// CHECK: stablehlo.dynamic_update_slice
// CHECK-NEXT: %[[ST_OUT:.*]] = stablehlo.dynamic_update_slice {{.*}} -> tensor<2x2x8xbf16>
// CHECK-NEXT: return %[[ST_OUT]]
// CHECK-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @scatter_transpose_convert(%arg0: tensor<2x8x16xf32>, %arg1: tensor<2x16x8xf32>) -> tensor<2x2x8xbf16> {
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x16xf32>, tensor<2x16x8xf32>) -> tensor<2x8x8xf32>
    %1 = stablehlo.transpose %0, dims = [0, 2, 1] : (tensor<2x8x8xf32>) -> tensor<2x8x8xf32>
    %2 = stablehlo.convert %1 : (tensor<2x8x8xf32>) -> tensor<2x8x8xbf16>
    // REMARK: views.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<2x8x8xf32> scattered on dim 2 (free dim of operand 1) through stablehlo.transpose through stablehlo.convert over groups of 4;
    %3 = "stablehlo.reduce_scatter"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 1 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<bf16>, %b: tensor<bf16>):
      %4 = stablehlo.add %a, %b : tensor<bf16>
      stablehlo.return %4 : tensor<bf16>
    }) : (tensor<2x8x8xbf16>) -> tensor<2x2x8xbf16>
    return %3 : tensor<2x2x8xbf16>
  }
}

// -----

// An sdy.sharding_constraint between the all_gather and the dot (JAX puts one after
// ops in a partially manual shard_map), manual over "x" only: the constraint is a
// propagation hint, seen through and not rebuilt on the blocks, so the permutes carry
// the shard and the gathered tensor and its constraint are gone. The ring position
// is computed in a nested manual_computation over the automatic axis "y"; the
// constraint after the dot stays.
// CHECK-LABEL: func.func public @gather_constraint
// CHECK: sdy.manual_computation(%arg0, %arg1) {{.*}} manual_axes={"x"} (%[[SC_X:.*]]: tensor<8x16xf32>, %[[SC_W:.*]]: tensor<16x8xf32>) {
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: tensor<32x16xf32>
// CHECK: %[[SC_POS:.*]] = sdy.manual_computation() in_shardings=[] out_shardings=[<@mesh, []>] manual_axes={"y"} () {
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: stablehlo.partition_id
// CHECK: sdy.return %{{.*}} : tensor<i32>
// CHECK: stablehlo.dot_general %[[SC_X]], %[[SC_W]]
// CHECK: %[[SC_SENT:.*]] = "stablehlo.collective_permute"(%[[SC_X]])
// CHECK-SAME: (tensor<8x16xf32>) -> tensor<8x16xf32>
// CHECK: %[[SC_LOOP:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[SC_CUR:[^ ]+]] = %[[SC_SENT]], %{{[^ ]+}} = %{{[^ ]+}}, %[[SC_OTHER:[^ ]+]] = %[[SC_W]], %{{[^ ]+}} = %[[SC_POS]])
// CHECK: } do {
// CHECK-NEXT: "stablehlo.collective_permute"(%[[SC_CUR]])
// CHECK-NOT: sdy.sharding_constraint
// CHECK: stablehlo.dot_general %[[SC_CUR]], %[[SC_OTHER]]
// CHECK-NOT: sdy.sharding_constraint
// CHECK: %[[SC_LAST:.*]] = stablehlo.dot_general %[[SC_LOOP]]#1, %[[SC_W]]
// CHECK-NEXT: %[[SC_OUT:.*]] = stablehlo.dynamic_update_slice %[[SC_LOOP]]#2, %[[SC_LAST]]
// CHECK-NEXT: %[[SC_C:.*]] = sdy.sharding_constraint %[[SC_OUT]] <@mesh, [{}, {}]> : tensor<32x8xf32>
// CHECK-NEXT: sdy.return %[[SC_C]] : tensor<32x8xf32>
// CHECK-NOT: stablehlo.all_gather
module @jit_f attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4, "y"=2]>
  func.func public @gather_constraint(%arg0: tensor<32x16xf32>, %arg1: tensor<16x8xf32>) -> (tensor<32x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) {
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"x"} (%arg2: tensor<8x16xf32>, %arg3: tensor<16x8xf32>) {
      // REMARK: views.mlir:[[# @LINE + 1]]:12: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim through sdy.sharding_constraint), tensor<32x16xf32> gathered over groups of 4;
      %1 = "stablehlo.all_gather"(%arg2) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<8x16xf32>) -> tensor<32x16xf32>
      %2 = sdy.sharding_constraint %1 <@mesh, [{}, {}]> : tensor<32x16xf32>
      %3 = stablehlo.dot_general %2, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<32x16xf32>, tensor<16x8xf32>) -> tensor<32x8xf32>
      %4 = sdy.sharding_constraint %3 <@mesh, [{}, {}]> : tensor<32x8xf32>
      sdy.return %4 : tensor<32x8xf32>
    } : (tensor<32x16xf32>, tensor<16x8xf32>) -> tensor<32x8xf32>
    return %0 : tensor<32x8xf32>
  }
}
