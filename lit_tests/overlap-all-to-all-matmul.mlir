// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-to-all-matmul{threshold-mib=0})' --split-input-file | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-to-all-matmul{threshold-mib=0})' --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-to-all-matmul{threshold-mib=0 target=gpu})' --split-input-file | FileCheck %s --check-prefix=GPU

// MoE dispatch over one group of 4: all_to_all(split experts dim 0, concat capacity
// dim 1), then the expert matmul (experts a batch dim, capacity a free dim). Step 0
// multiplies the device's own chunk; step k sends chunk (p + k) mod 4 to position
// p + k (pairs q -> q + k) and multiplies the chunk received from p - k, written at
// block (p - k) mod 4 of the capacity dim. No all_to_all is left.
// CHECK-LABEL: func.func @moe
// CHECK-NOT: stablehlo.all_to_all
// CHECK: %[[OWN:.*]] = stablehlo.dynamic_slice %arg0, {{.*}} sizes = [2, 2, 16]
// CHECK-NEXT: stablehlo.dot_general %[[OWN]], %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x2x16xf32>, tensor<2x16x8xf32>) -> tensor<2x2x8xf32>
// CHECK: %[[R1:.*]] = "stablehlo.collective_permute"({{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0]]>
// CHECK-NEXT: stablehlo.dot_general %[[R1]], %arg1
// CHECK: %[[R2:.*]] = "stablehlo.collective_permute"({{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 2], [1, 3], [2, 0], [3, 1]]>
// CHECK-NEXT: stablehlo.dot_general %[[R2]], %arg1
// CHECK: %[[R3:.*]] = "stablehlo.collective_permute"({{.*}}) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]>
// CHECK-NEXT: %[[D3:.*]] = stablehlo.dot_general %[[R3]], %arg1
// CHECK: %[[OUT:.*]] = stablehlo.dynamic_update_slice %{{.*}}, %[[D3]], {{.*}} -> tensor<2x8x8xf32>
// CHECK-NEXT: return %[[OUT]] : tensor<2x8x8xf32>
// CHECK-NOT: stablehlo.all_to_all
// For the GPU, the sends of steps 2 and 3 wait for the dots of steps 0 and 1 (an
// optimization_barrier): XLA's GPU scheduler would start every send at once.
// GPU-LABEL: func.func @moe
// GPU: %[[D0:.*]] = stablehlo.dot_general
// GPU: %[[D1:.*]] = stablehlo.dot_general
// GPU: %[[T2:.*]]:2 = stablehlo.optimization_barrier %{{.*}}, %[[D0]]
// GPU-NEXT: "stablehlo.collective_permute"(%[[T2]]#0)
// GPU: %[[D2:.*]] = stablehlo.dot_general
// GPU: %[[T3:.*]]:2 = stablehlo.optimization_barrier %{{.*}}, %[[D1]]
// GPU-NEXT: "stablehlo.collective_permute"(%[[T3]]#0)
// REMARK: remark: overlap-all-to-all-matmul: rewritten: tensor<2x8x16xf32> from chunks along dim 0 of tensor<8x2x16xf32>, concatenated on dim 1 over groups of 4; multiplied chunk by chunk (free dim of operand 0)
module @moe attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @moe(%x: tensor<8x2x16xf32>, %w: tensor<2x16x8xf32>) -> tensor<2x8x8xf32> {
    %0 = "stablehlo.all_to_all"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 0 : i64}> : (tensor<8x2x16xf32>) -> tensor<2x8x16xf32>
    %1 = stablehlo.dot_general %0, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x16xf32>, tensor<2x16x8xf32>) -> tensor<2x8x8xf32>
    return %1 : tensor<2x8x8xf32>
  }
}

// -----

// The MoE combine: the exchanged tensor is the expert matmul's result. Step k computes
// chunk (p + k) mod 4 of the product (rows of the lhs's free dim 1, which becomes the
// split dim) and sends it to position p + k; the chunk received from p - k is written at
// block (p - k) mod 4 of the concat dim 0. The whole product is never built.
// CHECK-LABEL: func.func @combine
// CHECK-NOT: stablehlo.all_to_all
// CHECK: %[[ROWS0:.*]] = stablehlo.dynamic_slice %arg0, {{.*}} sizes = [2, 2, 8]
// CHECK-NEXT: %[[OWN:.*]] = stablehlo.dot_general %[[ROWS0]], %arg1, {{.*}} -> tensor<2x2x16xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}}, %[[OWN]], {{.*}} : (tensor<8x2x16xf32>, tensor<2x2x16xf32>
// CHECK: %[[PART1:.*]] = stablehlo.dot_general {{.*}} -> tensor<2x2x16xf32>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[PART1]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0]]>
// CHECK: %[[PART2:.*]] = stablehlo.dot_general {{.*}} -> tensor<2x2x16xf32>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[PART2]]) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<{{\[}}[0, 2], [1, 3], [2, 0], [3, 1]]>
// CHECK: %[[PART3:.*]] = stablehlo.dot_general {{.*}} -> tensor<2x2x16xf32>
// CHECK-NEXT: "stablehlo.collective_permute"(%[[PART3]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 1], [3, 2]]>
// CHECK: return %{{.*}} : tensor<8x2x16xf32>
// CHECK-NOT: stablehlo.all_to_all
// REMARK: remark: overlap-all-to-all-matmul: rewritten: tensor<8x2x16xf32> from chunks along dim 1 of tensor<2x8x16xf32>, concatenated on dim 0 over groups of 4; the dot's result (an MoE combine) computed chunk by chunk
module @combine attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @combine(%h: tensor<2x8x8xf32>, %w: tensor<2x8x16xf32>) -> tensor<8x2x16xf32> {
    %0 = stablehlo.dot_general %h, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x8xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %1 = "stablehlo.all_to_all"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64}> : (tensor<2x8x16xf32>) -> tensor<8x2x16xf32>
    return %1 : tensor<8x2x16xf32>
  }
}

// -----

// Ulysses' attention output: the per-head product [heads, seq, d] transposed to
// [seq, heads, d], then exchanged back (sequence split, heads concatenated). Each
// step computes its chunk of the product, replays the transpose on it and sends it.
// CHECK-LABEL: func.func @ulysses_out
// CHECK-NOT: stablehlo.all_to_all
// CHECK: %[[P0:.*]] = stablehlo.dot_general {{.*}} -> tensor<2x2x16xf32>
// CHECK-NEXT: %[[T0:.*]] = stablehlo.transpose %[[P0]], dims = [1, 0, 2] : (tensor<2x2x16xf32>) -> tensor<2x2x16xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}}, %[[T0]]
// CHECK: %[[P1:.*]] = stablehlo.dot_general {{.*}} -> tensor<2x2x16xf32>
// CHECK-NEXT: %[[T1:.*]] = stablehlo.transpose %[[P1]], dims = [1, 0, 2]
// CHECK-NEXT: "stablehlo.collective_permute"(%[[T1]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>
// CHECK: return %{{.*}} : tensor<2x8x16xf32>
// CHECK-NOT: stablehlo.all_to_all
// REMARK: remark: overlap-all-to-all-matmul: rewritten: tensor<2x8x16xf32> from chunks along dim 0 of tensor<8x2x16xf32>, concatenated on dim 1 over groups of 4; the dot's result through stablehlo.transpose computed chunk by chunk
module @ulysses_out attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ulysses_out(%p: tensor<2x8x8xf32>, %v: tensor<2x8x16xf32>) -> tensor<2x8x16xf32> {
    %0 = stablehlo.dot_general %p, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x8xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %1 = stablehlo.transpose %0, dims = [1, 0, 2] : (tensor<2x8x16xf32>) -> tensor<8x2x16xf32>
    %2 = "stablehlo.all_to_all"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 0 : i64}> : (tensor<8x2x16xf32>) -> tensor<2x8x16xf32>
    return %2 : tensor<2x8x16xf32>
  }
}

// -----

// Ulysses' values: the exchanged tensor contracted over its concat dim. The chunk
// received in step k (from p - k) multiplies rows (p - k) mod 4 of %w; the products
// are summed.
// CHECK-LABEL: func.func @contracted
// CHECK-NOT: stablehlo.all_to_all
// CHECK: %[[W0:.*]] = stablehlo.dynamic_slice %arg1, {{.*}} sizes = [4, 8]
// CHECK: %[[OWN:.*]] = stablehlo.dot_general %{{.*}}, %[[W0]], contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x8xf32>) -> tensor<2x8xf32>
// CHECK: %[[R1:.*]] = "stablehlo.collective_permute"
// CHECK: %[[W1:.*]] = stablehlo.dynamic_slice %arg1, {{.*}} sizes = [4, 8]
// CHECK-NEXT: %[[P1:.*]] = stablehlo.dot_general %[[R1]], %[[W1]]
// CHECK-NEXT: stablehlo.add %[[OWN]], %[[P1]] : tensor<2x8xf32>
// CHECK-NOT: stablehlo.all_to_all
// REMARK: remark: overlap-all-to-all-matmul: rewritten: tensor<2x16xf32> from chunks along dim 0 of tensor<8x4xf32>, concatenated on dim 1 over groups of 4; multiplied chunk by chunk, the products summed (contracting dim of operand 0)
module @contracted attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @contracted(%x: tensor<8x4xf32>, %w: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = "stablehlo.all_to_all"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 1 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 0 : i64}> : (tensor<8x4xf32>) -> tensor<2x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}
