// RUN: overlap-opt %s --threshold-mib=0 --split-input-file | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK

// A dot between an all_gather and a reduce_scatter (FSDP x TP: the weight gathered
// over groups of 4 along its contracting dim, the product scattered over groups of 2
// along the weight's free dim) gets both rings. The scatter's ring comes first: its
// partial dots read the gathered weight sliced along its free dim (4 columns a chain).
// Then the gather's ring is built before the scatter ring's first partial dot, its
// consumer (through the dynamic_slice, replayed on each shard), and assembles the
// gathered weight as it goes (its last round in the loop too: the sum stays in the
// loop's buffer); the scatter ring's other dots read that buffer. No collective is
// left.
// CHECK-LABEL: func.func @gather_dot_scatter
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: "stablehlo.collective_permute"(%arg1) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 2], [6, 4], [1, 7], [3, 1], [5, 3], [7, 5]]>
// CHECK: %[[GDS_AG:.*]]:8 = stablehlo.while
// CHECK: } do {
// CHECK: stablehlo.dynamic_slice %iterArg{{[_0-9]*}}, %{{[^ ]+}}, %{{[^ ]+}}, sizes = [4, 4] : (tensor<4x16xf32>, tensor<i32>, tensor<i32>) -> tensor<4x4xf32>
// CHECK: stablehlo.dynamic_update_slice %iterArg{{[_0-9]*}}, %iterArg{{[_0-9]*}}, %{{[^ ]+}}, %{{[^ ]+}} : (tensor<16x16xf32>, tensor<4x16xf32>, tensor<i32>, tensor<i32>) -> tensor<16x16xf32>
// CHECK: %[[GDS_M:.*]] = "stablehlo.collective_permute"(%[[GDS_AG]]#2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4], [6, 7], [7, 6]]>
// CHECK: stablehlo.dynamic_slice %[[GDS_AG]]#3, %{{[^ ]+}}, %{{[^ ]+}}, sizes = [16, 4]
// CHECK-NEXT: %[[GDS_K:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[GDS_A:.*]] = "stablehlo.collective_permute"(%[[GDS_K]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>
// CHECK: %[[GDS_H1:.*]] = stablehlo.add %{{[^ ]+}}, %[[GDS_M]]
// CHECK: %[[GDS_H0:.*]] = stablehlo.add %{{[^ ]+}}, %[[GDS_A]]
// CHECK-NEXT: %[[GDS_W:.*]] = stablehlo.dynamic_update_slice %{{[^ ]+}}, %[[GDS_H0]]
// CHECK-NEXT: %[[GDS_OUT:.*]] = stablehlo.dynamic_update_slice %[[GDS_W]], %[[GDS_H1]]
// CHECK-NEXT: return %[[GDS_OUT]]
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gather_dot_scatter(%x: tensor<8x16xf32>, %w: tensor<4x16xf32>) -> tensor<8x8xf32> {
    // REMARK: combined-sites.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (contracting dim through stablehlo.dynamic_slice), tensor<16x16xf32> gathered over groups of 4; its dot is decomposed inside the reduce_scatter ring at {{.*}}combined-sites.mlir:[[# @LINE + 4]]:10; the ring assembles the gathered tensor for 3 other reader(s), 3 of them dot(s) with no ring of their own;
    %0 = "stablehlo.all_gather"(%w) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<4x16xf32>) -> tensor<16x16xf32>
    %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    // REMARK: combined-sites.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x16xf32> scattered on dim 1 (free dim of operand 1) over groups of 2; the dot reads an all_gather whose ring runs inside;
    %2 = "stablehlo.reduce_scatter"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1], [2, 3], [4, 5], [6, 7]]> : tensor<4x2xi64>, scatter_dimension = 1 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %3 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<8x16xf32>) -> tensor<8x8xf32>
    return %2 : tensor<8x8xf32>
  }
}

// -----

// A bias added between the dot and the reduce_scatter: each part adds this device's
// rows of the bias before the accumulator takes it, so every device adds its own bias
// block exactly once, as in the original sum. The bias is a broadcast: its vector enters
// the loop and is broadcast to each block (the whole broadcast is never written).
// CHECK-LABEL: func.func @bias
// CHECK-NOT: stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<8xf32>) -> tensor<8x8xf32>
// CHECK: %[[BI_P0:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[BI_S0:.*]] = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<8xf32>) -> tensor<1x8xf32>
// CHECK-NEXT: %[[BI_A0:.*]] = stablehlo.add %[[BI_P0]], %[[BI_S0]] : tensor<1x8xf32>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[BI_A0]])
// CHECK: stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %{{[^ ]+}}, %[[BI_RECV:[^ ]+]] = %{{[^ ]+}}, %{{[^ ]+}} = %arg0, %{{[^ ]+}} = %arg1, %[[BI_BB:[^ ]+]] = %arg2,
// CHECK: } do {
// CHECK: %[[BI_P:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[BI_S:.*]] = stablehlo.broadcast_in_dim %[[BI_BB]], dims = [1] : (tensor<8xf32>) -> tensor<1x8xf32>
// CHECK-NEXT: %[[BI_A:.*]] = stablehlo.add %[[BI_P]], %[[BI_S]] : tensor<1x8xf32>
// CHECK-NEXT: stablehlo.add %[[BI_A]], %[[BI_RECV]] : tensor<1x8xf32>
// CHECK-NOT: stablehlo.reduce_scatter
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @bias(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>, %b: tensor<8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.add %0, %1 : tensor<8x8xf32>
    // REMARK: combined-sites.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 4; 1 added term(s) (a bias) folded in: each device adds its own block of it once;
    %3 = "stablehlo.reduce_scatter"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %c: tensor<f32>):
      %4 = stablehlo.add %a, %c : tensor<f32>
      stablehlo.return %4 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %3 : tensor<2x8xf32>
  }
}

// -----

// A gather over groups of 2 ([0, 4], ...) gathered again over groups of 4
// ([0, 1, 2, 3], ...) along the same dim: one ring over the combined group of 8 in
// the order of the result's blocks, 0, 4, 1, 5, 2, 6, 3, 7; both all_gathers go.
// CHECK-LABEL: func.func @chained
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.constant dense<[0, 2, 4, 6, 1, 3, 5, 7]> : tensor<8xi32>
// CHECK: "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 7], [4, 0], [1, 4], [5, 1], [2, 5], [6, 2], [3, 6], [7, 3]]>
// CHECK: stablehlo.while
// CHECK-NOT: stablehlo.all_gather
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @chained(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<16x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<4x16xf32>
    // REMARK: combined-sites.mlir:[[# @LINE + 1]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<16x16xf32> gathered over groups of 8 (an all_gather of the all_gather at {{.*}}combined-sites.mlir:[[# @LINE - 1]]:10, both in one ring);
    %1 = "stablehlo.all_gather"(%0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<4x16xf32>) -> tensor<16x16xf32>
    %2 = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    return %2 : tensor<16x8xf32>
  }
}

// -----

// One product scattered twice (JAX's test_matmul_reduce_scatter): the first
// reduce_scatter's ring computes the product once and assembles it; the second keeps
// its collective, with a remark saying why.
// CHECK-LABEL: func.func @two_scatters
// CHECK: stablehlo.while
// CHECK: %[[TS_SECOND:.*]] = "stablehlo.reduce_scatter"
// CHECK: return %{{[^ ]+}}, %[[TS_SECOND]]
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @two_scatters(%x: tensor<8x16xf32>, %w: tensor<16x8xf32>) -> (tensor<2x8xf32>, tensor<1x8xf32>) {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    // REMARK: combined-sites.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8x8xf32> scattered on dim 0 (free dim of operand 0) over groups of 4; the ring assembles the dot's product for 1 other reader(s);
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %3 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    // REMARK: combined-sites.mlir:[[# @LINE + 1]]:10: remark: overlap-matmul-reduce-scatter: left unchanged: its dot also feeds the reduce_scatter at {{.*}}combined-sites.mlir:[[# @LINE - 5]]:10, whose ring computes the dot once and assembles its product for this one: a ring of its own would compute the dot a second time{{$}}
    %2 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %3 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<1x8xf32>
    return %1, %2 : tensor<2x8xf32>, tensor<1x8xf32>
  }
}
