// RUN: overlap-opt %s --threshold-mib=0 --target=tpu --split-input-file | FileCheck %s --check-prefix=TPU
// RUN: overlap-opt %s --threshold-mib=0 --hardware=tpu-v5e --split-input-file | FileCheck %s --check-prefix=TPU
// RUN: overlap-opt %s --threshold-mib=0 --target=gpu --split-input-file | FileCheck %s --check-prefix=GPU
// RUN: overlap-opt %s --threshold-mib=0 --split-input-file | FileCheck %s --check-prefix=ANY
// RUN: overlap-opt %s --threshold-mib=0 --target=tpu --unroll=1 --split-input-file | FileCheck %s --check-prefix=TPU1

// target=tpu (also what a tpu-* hardware profile implies): the buffer the all_gather
// ring writes whole starts as an uninitialised custom_call @AllocateBuffer, not as a
// zero constant the compiler must fill, and the loop runs two rounds per iteration
// (unroll 2), so the shard it carries alternates between two buffers instead of being
// copied once per iteration. target=gpu: the same buffer and unroll.
// Without a target the forms run on every backend: zeros, one round per iteration.
// TPU-LABEL: func.func @ag8
// TPU-NOT: stablehlo.constant dense<0.000000e+00> : tensor<16x8xf32>
// TPU: %[[TPU_BUF:.*]] = stablehlo.custom_call @AllocateBuffer() : () -> tensor<16x8xf32>
// TPU: stablehlo.dynamic_update_slice %[[TPU_BUF]]
// TPU: } do {
// TPU-COUNT-2: "stablehlo.collective_permute"
// TPU-NOT: "stablehlo.collective_permute"
// TPU: stablehlo.return
// GPU-LABEL: func.func @ag8
// GPU: %[[GPU_BUF:.*]] = stablehlo.custom_call @AllocateBuffer() : () -> tensor<16x8xf32>
// GPU: } do {
// GPU-COUNT-2: "stablehlo.collective_permute"
// GPU-NOT: "stablehlo.collective_permute"
// GPU: stablehlo.return
// ANY-LABEL: func.func @ag8
// ANY-NOT: AllocateBuffer
// ANY: stablehlo.constant dense<0.000000e+00> : tensor<16x8xf32>
// ANY: } do {
// ANY-COUNT-1: "stablehlo.collective_permute"
// ANY-NOT: "stablehlo.collective_permute"
// ANY: stablehlo.return
// TPU1-LABEL: func.func @ag8
// TPU1: custom_call @AllocateBuffer
// TPU1: } do {
// TPU1-COUNT-1: "stablehlo.collective_permute"
// TPU1-NOT: "stablehlo.collective_permute"
// TPU1: stablehlo.return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ag8(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<16x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<16x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }
}

// -----

// A one-stream reduce_scatter ring (two chains of one row): for the GPU, the last
// round's dot is kept apart from the add of the last arrival by an
// optimization_barrier, so XLA's GPU GEMM does not fuse that add and wait for the
// transfer: the dot runs while the last send travels. Other targets add directly.
// GPU-LABEL: func.func @rs8
// GPU: } do {
// GPU: stablehlo.return
// GPU: %[[LAST:.*]] = "stablehlo.collective_permute"
// GPU: stablehlo.dot_general
// GPU-NEXT: stablehlo.add
// GPU: %[[DOT:.*]] = stablehlo.dot_general
// GPU-NEXT: %[[KEPT:.*]] = stablehlo.optimization_barrier %[[DOT]]
// GPU-NEXT: stablehlo.add %[[KEPT]], %[[LAST]]
// ANY-LABEL: func.func @rs8
// ANY-NOT: stablehlo.optimization_barrier
// ANY: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @rs8(%x: tensor<16x4xf32>, %w: tensor<4x8xf32>) -> tensor<2x8xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x4xf32>, tensor<4x8xf32>) -> tensor<16x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<16x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }
}
