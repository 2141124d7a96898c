// RUN: overlap-opt %s --threshold-mib=0 | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: overlap-opt %s | FileCheck %s --check-prefix=DEFAULT

// The default pipeline (overlap-all-gather-matmul, overlap-matmul-reduce-scatter,
// canonicalize, cse) on a sequence-parallel MLP as jax.shard_map emits it over a
// 4x2 mesh (tensor axis "x"): all_gather(x) -> dot(w1) -> tanh -> dot(w2) ->
// reduce_scatter. Both collectives become collective_permute rings: the gather's
// round 0 and first permute before its loop; the scatter's two chains (the halves
// of each block) with round 0 before their loop, rounds 1..2 inside it and the own
// block's round after it, tanh applied to each block the gather ring computes (an
// epilogue: fused into that block's dot) instead of to the whole product. The six permutes get
// distinct fresh channels 2..7 (JAX gave both collectives channel 1), and cse leaves
// one ring position computation for the two rings.
// CHECK-LABEL: func.func public @main
// CHECK: sdy.manual_computation(%arg0, %arg1, %arg2) {{.*}} manual_axes={"x", "y"} (%[[X:.*]]: tensor<16x32xf32>, %[[W1:.*]]: tensor<32x16xf32>, %[[W2:.*]]: tensor<16x32xf32>) {
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.constant dense<[0, 0, 1, 1, 2, 2, 3, 3]> : tensor<8xi32>
// CHECK: stablehlo.partition_id
// CHECK-NOT: stablehlo.partition_id
// CHECK: %[[AG_P0:.*]] = stablehlo.dot_general %[[X]], %[[W1]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x16xf32>
// CHECK-NEXT: %[[AG_T0:.*]] = stablehlo.tanh %[[AG_P0]] : tensor<16x16xf32>
// CHECK-NEXT: %[[AG_ACC0:.*]] = stablehlo.dynamic_update_slice %{{.*}}, %[[AG_T0]],
// CHECK-NEXT: %[[AG_SENT:.*]] = "stablehlo.collective_permute"(%[[X]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK-NEXT: %[[AG:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[AG_CUR:[^ ]+]] = %[[AG_SENT]], %[[AG_ACC:[^ ]+]] = %[[AG_ACC0]], %[[AG_W:[^ ]+]] = %[[W1]], %{{.*}})
// CHECK: } do {
// CHECK-NEXT: %[[AG_MOVED:.*]] = "stablehlo.collective_permute"(%[[AG_CUR]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK: %[[AG_PART:.*]] = stablehlo.dot_general %[[AG_CUR]], %[[AG_W]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x16xf32>
// CHECK-NEXT: %[[AG_T:.*]] = stablehlo.tanh %[[AG_PART]]
// CHECK-NEXT: %[[AG_UPD:.*]] = stablehlo.dynamic_update_slice %[[AG_ACC]], %[[AG_T]]
// CHECK: stablehlo.return %{{.*}}, %[[AG_MOVED]], %[[AG_UPD]],
// CHECK-NOT: stablehlo.collective_permute
// CHECK: %[[AG_LAST:.*]] = stablehlo.dot_general %[[AG]]#1, %[[W1]]
// CHECK-NEXT: %[[AG_TLAST:.*]] = stablehlo.tanh %[[AG_LAST]]
// CHECK-NEXT: %[[H:.*]] = stablehlo.dynamic_update_slice %[[AG]]#2, %[[AG_TLAST]]
// CHECK-NOT: stablehlo.tanh
// CHECK-NOT: stablehlo.partition_id
// CHECK: %[[RS_S0:.*]] = stablehlo.dynamic_slice %[[H]], %{{.*}}, %{{.*}}, sizes = [8, 16]
// CHECK-NEXT: %[[RS_D0:.*]] = stablehlo.dot_general %[[RS_S0]], %[[W2]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
// CHECK-NEXT: %[[RS_R1:.*]] = "stablehlo.collective_permute"(%[[RS_D0]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK: stablehlo.dynamic_slice %[[H]]
// CHECK-NEXT: %[[RS_D1:.*]] = stablehlo.dot_general %{{[^ ]+}}, %[[W2]]
// CHECK-NEXT: %[[RS:.*]]:6 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[RS_KEPT:[^ ]+]] = %[[RS_D1]], %[[RS_RECV:[^ ]+]] = %[[RS_R1]], %[[RS_H:[^ ]+]] = %[[H]], %[[RS_W:[^ ]+]] = %[[W2]], %{{.*}})
// CHECK: } do {
// CHECK-NEXT: %[[RS_ARRIVED:.*]] = "stablehlo.collective_permute"(%[[RS_KEPT]]) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK: %[[RS_SLICE:.*]] = stablehlo.dynamic_slice %[[RS_H]], %{{.*}}, %{{.*}}, sizes = [8, 16]
// CHECK-NEXT: %[[RS_D:.*]] = stablehlo.dot_general %[[RS_SLICE]], %[[RS_W]]
// CHECK-NEXT: %[[RS_SUM:.*]] = stablehlo.add %[[RS_D]], %[[RS_RECV]] : tensor<8x32xf32>
// CHECK-NEXT: %[[RS_MOVED:.*]] = "stablehlo.collective_permute"(%[[RS_SUM]]) <{channel_handle = #stablehlo.channel_handle<handle = 6, type = 1>
// CHECK: %[[RS_KEEP:.*]] = stablehlo.add %{{[^ ]+}}, %[[RS_ARRIVED]] : tensor<8x32xf32>
// CHECK: stablehlo.return %{{.*}}, %[[RS_KEEP]], %[[RS_MOVED]],
// CHECK-NEXT: }
// CHECK-NEXT: %[[RS_LAST:.*]] = "stablehlo.collective_permute"(%[[RS]]#1) <{channel_handle = #stablehlo.channel_handle<handle = 7, type = 1>
// CHECK: %[[RS_HALF1:.*]] = stablehlo.add %{{[^ ]+}}, %[[RS]]#2 : tensor<8x32xf32>
// CHECK: %[[RS_HALF0:.*]] = stablehlo.add %{{[^ ]+}}, %[[RS_LAST]] : tensor<8x32xf32>
// CHECK-NEXT: %[[RS_W0:.*]] = stablehlo.dynamic_update_slice %{{[^ ]+}}, %[[RS_HALF0]],
// CHECK-NEXT: %[[RS_OUT:.*]] = stablehlo.dynamic_update_slice %[[RS_W0]], %[[RS_HALF1]],
// CHECK-NEXT: sdy.return %[[RS_OUT]] : tensor<16x32xf32>
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: return

// Under the default threshold (1 MiB) these 8 KiB collectives stay as they are.
// DEFAULT-LABEL: func.func public @main
// DEFAULT: stablehlo.all_gather
// DEFAULT: stablehlo.reduce_scatter
// DEFAULT-NOT: stablehlo.collective_permute
// DEFAULT-NOT: stablehlo.while
module @jit_mlp attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4, "y"=2]>
  func.func public @main(%arg0: tensor<64x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %arg1: tensor<32x64xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>}, %arg2: tensor<64x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> (tensor<64x32xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) {
    %0 = sdy.manual_computation(%arg0, %arg1, %arg2) in_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{}, {"x"}]>, <@mesh, [{"x"}, {}]>] out_shardings=[<@mesh, [{"x"}, {}]>] manual_axes={"x", "y"} (%arg3: tensor<16x32xf32>, %arg4: tensor<32x16xf32>, %arg5: tensor<16x32xf32>) {
      // REMARK: default-pipeline.mlir:[[# @LINE + 1]]:12: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<64x32xf32> gathered over groups of 4; its dot's elementwise epilogue (1 op(s)) runs on each block, fused into the block's dot; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
      %1 = "stablehlo.all_gather"(%arg3) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
      %2 = stablehlo.dot_general %1, %arg4, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
      %3 = stablehlo.tanh %2 : tensor<64x16xf32>
      %4 = stablehlo.dot_general %3, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<64x16xf32>, tensor<16x32xf32>) -> tensor<64x32xf32>
      // REMARK: default-pipeline.mlir:[[# @LINE + 1]]:12: remark: overlap-matmul-reduce-scatter: rewritten: tensor<64x32xf32> scattered on dim 0 (free dim of operand 0) over groups of 4; decided by threshold-mib=0 (explicit): {{.*}} MiB communicated{{$}}
      %5 = "stablehlo.reduce_scatter"(%4) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
      ^bb0(%arg6: tensor<f32>, %arg7: tensor<f32>):
        %6 = stablehlo.add %arg6, %arg7 : tensor<f32>
        stablehlo.return %6 : tensor<f32>
      }) : (tensor<64x32xf32>) -> tensor<16x32xf32>
      sdy.return %5 : tensor<16x32xf32>
    } : (tensor<64x32xf32>, tensor<32x64xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
    return %0 : tensor<64x32xf32>
  }
}
