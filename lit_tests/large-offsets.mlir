// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0},overlap-matmul-reduce-scatter{threshold-mib=0})' --split-input-file | FileCheck %s

// Block offsets into a dim whose extent exceeds int32 are computed in i64: the ring
// position (mod N) is an i32, converted to i64 before the multiply by the block size,
// and every start index of a dynamic_slice / dynamic_update_slice is then an i64
// (zeros included). An i32 multiply would wrap: 2^29 rows gathered over 8 devices
// give offsets up to 7 * 2^29, beyond 2^31 - 1.

// CHECK-LABEL: func.func @gather_2p29_rows
// CHECK: %[[G_POS:.*]] = stablehlo.reshape %{{.*}} : (tensor<1xi32>) -> tensor<i32>
// CHECK: %[[G_M0:.*]] = stablehlo.remainder %[[G_POS]], %{{[^ ]+}} : tensor<i32>
// CHECK: %[[G_W0:.*]] = stablehlo.convert %[[G_M0]] : (tensor<i32>) -> tensor<i64>
// CHECK: %[[G_BLOCK:.*]] = stablehlo.constant dense<536870912> : tensor<i64>
// CHECK: %[[G_OFF0:.*]] = stablehlo.multiply %[[G_W0]], %[[G_BLOCK]] : tensor<i64>
// CHECK: %[[G_ZERO:.*]] = stablehlo.constant dense<0> : tensor<i64>
// CHECK: stablehlo.dynamic_update_slice %{{[^ ]+}}, %{{[^ ]+}}, %[[G_OFF0]], %[[G_ZERO]] : (tensor<4294967296x8xf32>, tensor<536870912x8xf32>, tensor<i64>, tensor<i64>) -> tensor<4294967296x8xf32>
// CHECK: } do {
// CHECK: %[[G_J:.*]] = stablehlo.remainder %{{.*}} : tensor<i32>
// CHECK: %[[G_WJ:.*]] = stablehlo.convert %[[G_J]] : (tensor<i32>) -> tensor<i64>
// CHECK: %[[G_BLOCK2:.*]] = stablehlo.constant dense<536870912> : tensor<i64>
// CHECK: %[[G_OFF:.*]] = stablehlo.multiply %[[G_WJ]], %[[G_BLOCK2]] : tensor<i64>
// CHECK: stablehlo.dynamic_update_slice %{{[^ ]+}}, %{{[^ ]+}}, %[[G_OFF]], %{{[^ ]+}} : (tensor<4294967296x8xf32>, tensor<536870912x8xf32>, tensor<i64>, tensor<i64>)
// CHECK-NOT: multiply {{.*}} : tensor<i32>
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @gather_2p29_rows(%x: tensor<536870912x4xf32>, %w: tensor<4x8xf32>) -> tensor<4294967296x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<536870912x4xf32>) -> tensor<4294967296x4xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<4294967296x4xf32>, tensor<4x8xf32>) -> tensor<4294967296x8xf32>
    return %1 : tensor<4294967296x8xf32>
  }
}

// -----

// A block of 3e9 rows (itself beyond int32) scattered over 2 devices: the operand is
// sliced at i64 offsets (the block size an i64 constant), its halves (one a chain) at
// the block's offset and 1.5e9 rows after it.
// CHECK-LABEL: func.func @scatter_3e9_row_block
// CHECK: %[[S_BLOCK:.*]] = stablehlo.constant dense<3000000000> : tensor<i64>
// CHECK: %[[S_OFF:.*]] = stablehlo.multiply %{{[^ ]+}}, %[[S_BLOCK]] : tensor<i64>
// CHECK: %[[S_HALF:.*]] = stablehlo.constant dense<1500000000> : tensor<i64>
// CHECK-NEXT: %[[S_ROWS:.*]] = stablehlo.add %[[S_OFF]], %[[S_HALF]] : tensor<i64>
// CHECK: stablehlo.dynamic_slice %{{[^ ]+}}, %[[S_ROWS]], %{{[^ ]+}}, sizes = [1500000000, 4] : (tensor<6000000000x4xf32>, tensor<i64>, tensor<i64>) -> tensor<1500000000x4xf32>
// CHECK-NOT: stablehlo.reduce_scatter
// CHECK: return
module attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @scatter_3e9_row_block(%x: tensor<6000000000x4xf32>, %w: tensor<4x8xf32>) -> tensor<3000000000x8xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<6000000000x4xf32>, tensor<4x8xf32>) -> tensor<6000000000x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<6000000000x8xf32>) -> tensor<3000000000x8xf32>
    return %1 : tensor<3000000000x8xf32>
  }
}

// -----

// Ordinary extents keep i32 offsets.
// CHECK-LABEL: func.func @ordinary
// CHECK: %[[O_OFF:.*]] = stablehlo.multiply %{{[^ ]+}}, %{{[^ ]+}} : tensor<i32>
// CHECK: stablehlo.dynamic_update_slice %{{[^ ]+}}, %{{[^ ]+}}, %[[O_OFF]], %{{[^ ]+}} : (tensor<8x8xf32>, tensor<2x8xf32>, tensor<i32>, tensor<i32>)
// CHECK-NOT: tensor<i64>
// CHECK: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @ordinary(%x: tensor<2x4xf32>, %w: tensor<4x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x4xf32>) -> tensor<8x4xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}
