// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --target=tpu --remarks 2>&1 | FileCheck %s --check-prefix=REFUSED
// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --target=tpu --tpu-summing-rings | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true target=tpu tpu-summing-rings=true})' | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --target=gpu | FileCheck %s --check-prefix=GPU

// A dot that sums over the gathered (contracting) dim, FSDP's weight gather. The TPU
// forms leave it unchanged and say why, unless tpu-summing-rings is given.
// REFUSED: remark: overlap-all-gather-matmul: left unchanged: a ring that sums over the gathered (contracting) dim {{.*}} tpu-summing-rings=true builds it
// REFUSED: "stablehlo.all_gather"

// The TPU form (two streams): round 0 only sends, every dot contracts two shards
// (tensor<4x8> x tensor<8x16>), the last one the shard where the streams meet beside
// the device's own (%arg1); no barrier between the rounds, no loop at 8 devices.
// CHECK-LABEL: func.func @fsdp8
// CHECK-NOT: stablehlo.dot_general
// CHECK: %[[DOWN:.*]] = "stablehlo.collective_permute"(%arg1)
// CHECK-NEXT: %[[UP:.*]] = "stablehlo.collective_permute"(%arg1)
// CHECK-NOT: stablehlo.dot_general
// CHECK: "stablehlo.collective_permute"(%[[DOWN]])
// CHECK-NEXT: "stablehlo.collective_permute"(%[[UP]])
// CHECK: stablehlo.concatenate %[[DOWN]], %[[UP]], dim = 0
// CHECK-COUNT-4: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK-NOT: stablehlo.dot_general
// CHECK-NOT: stablehlo.while
// CHECK-NOT: optimization_barrier
// CHECK: return

// The other targets keep round 0's own product (a shard, tensor<4x4> x tensor<4x16>).
// GPU-LABEL: func.func @fsdp8
// GPU: stablehlo.dot_general %{{.*}}, %arg1, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
// GPU: stablehlo.while
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @fsdp8(%x: tensor<4x32xf32>, %w: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %0 = "stablehlo.all_gather"(%w) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<4x16xf32>) -> tensor<32x16xf32>
    %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0] : (tensor<4x32xf32>, tensor<32x16xf32>) -> tensor<4x16xf32>
    return %1 : tensor<4x16xf32>
  }
}
