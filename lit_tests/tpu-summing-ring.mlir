// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --target=tpu --remarks 2>&1 | FileCheck %s --check-prefix=REFUSED
// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --target=tpu --tpu-summing-rings | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true target=tpu tpu-summing-rings=true})' | FileCheck %s
// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --target=tpu --tpu-summing-rings --own-shard-last | FileCheck %s --check-prefix=LAST
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 bidirectional=true target=tpu tpu-summing-rings=true own-shard-last=true})' | FileCheck %s --check-prefix=LAST
// RUN: overlap-opt %s --threshold-mib=0 --bidirectional --target=gpu | FileCheck %s --check-prefix=GPU

// A dot that sums over the gathered (contracting) dim, FSDP's weight gather. The TPU
// forms leave it unchanged and say why, unless tpu-summing-rings is given.
// REFUSED: remark: overlap-all-gather-matmul: left unchanged: a ring that sums over the gathered (contracting) dim {{.*}} tpu-summing-rings=true builds it
// REFUSED: "stablehlo.all_gather"

// The TPU form (two streams): the own shard's product (tensor<4x4> x tensor<4x16>)
// beside round 0's shifts, then one dot over both arrivals a round (tensor<4x8> x
// tensor<8x16>) whose sum passes a barrier before the next round adds to it, and the
// shard where the streams meet alone last; no loop at 8 devices.
// CHECK-LABEL: func.func @fsdp8
// CHECK: %[[OWN:.*]] = stablehlo.dot_general %{{.*}}, %arg1, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
// CHECK: %[[DOWN:.*]] = "stablehlo.collective_permute"(%arg1)
// CHECK-NEXT: %[[UP:.*]] = "stablehlo.collective_permute"(%arg1)
// CHECK-NEXT: %[[SUM0:.*]] = stablehlo.optimization_barrier %[[OWN]]
// CHECK: stablehlo.concatenate %[[DOWN]], %[[UP]], dim = 0
// CHECK: %[[P1:.*]] = stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK-NEXT: %[[S1:.*]] = stablehlo.add %[[P1]], %[[SUM0]]
// CHECK-NEXT: stablehlo.optimization_barrier %[[S1]]
// CHECK-COUNT-2: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
// CHECK-NOT: stablehlo.dot_general
// CHECK-NOT: stablehlo.while
// CHECK: return

// own-shard-last: round 0 only sends, every dot contracts two shards, the last one the
// shard where the streams meet beside the device's own (%arg1); each sum tied.
// LAST-LABEL: func.func @fsdp8
// LAST-NOT: stablehlo.dot_general
// LAST: %[[DOWN:.*]] = "stablehlo.collective_permute"(%arg1)
// LAST-NEXT: %[[UP:.*]] = "stablehlo.collective_permute"(%arg1)
// LAST-NOT: stablehlo.dot_general
// LAST: "stablehlo.collective_permute"(%[[DOWN]])
// LAST-NEXT: "stablehlo.collective_permute"(%[[UP]])
// LAST: stablehlo.concatenate %[[DOWN]], %[[UP]], dim = 0
// LAST-COUNT-3: stablehlo.optimization_barrier
// LAST: stablehlo.concatenate %{{.*}}, %arg1, dim = 0
// LAST: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// LAST-NOT: stablehlo.dot_general
// LAST-NOT: stablehlo.while
// LAST: return

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
