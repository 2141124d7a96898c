// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0 f32-sums=true})' | FileCheck %s
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0})' | FileCheck %s --check-prefix=DEFAULT

// f32-sums: a bf16 dot whose gathered dim is contracting sums its partial products in
// f32 (the partial dots return f32) and converts the sum to bf16 once, after the
// loop; the shard itself travels in bf16. Round 0's f32 product is the first sum (no
// zero constant, no add); the loop runs rounds 1..3, the last one included.
// CHECK-LABEL: func.func @bf16_contracting
// CHECK-NOT: stablehlo.constant dense<0.000000e+00>
// CHECK: %[[ACC0:.*]] = stablehlo.dot_general %arg0, %{{.*}}, contracting_dims = [1] x [0] : (tensor<8x4xbf16>, tensor<4x8xbf16>) -> tensor<8x8xf32>
// CHECK-NEXT: %[[SENT:.*]] = "stablehlo.collective_permute"(%arg0) {{.*}} : (tensor<8x4xbf16>) -> tensor<8x4xbf16>
// CHECK: %[[LOOP:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %[[CUR:[^ ]+]] = %[[SENT]], %[[ACC:[^ ]+]] = %[[ACC0]], %{{.*}}) : tensor<i32>, tensor<8x4xbf16>, tensor<8x8xf32>, tensor<16x8xbf16>, tensor<i32>
// CHECK: "stablehlo.collective_permute"(%[[CUR]]) {{.*}} : (tensor<8x4xbf16>) -> tensor<8x4xbf16>
// CHECK: %[[PART:.*]] = stablehlo.dot_general %[[CUR]], %{{.*}} -> tensor<8x8xf32>
// CHECK-NEXT: stablehlo.add %[[PART]], %[[ACC]] : tensor<8x8xf32>
// CHECK: %[[OUT:.*]] = stablehlo.convert %[[LOOP]]#2 : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-NEXT: return %[[OUT]] : tensor<8x8xbf16>
// DEFAULT-LABEL: func.func @bf16_contracting
// DEFAULT-NOT: f32
// DEFAULT: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @bf16_contracting(%arg0: tensor<8x4xbf16>, %arg1: tensor<16x8xbf16>) -> tensor<8x8xbf16> {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<8x4xbf16>) -> tensor<8x16xbf16>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xbf16>, tensor<16x8xbf16>) -> tensor<8x8xbf16>
    return %1 : tensor<8x8xbf16>
  }
}
