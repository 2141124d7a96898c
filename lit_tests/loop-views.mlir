// RUN: overlap-opt %s --threshold-mib=0 --target=tpu | FileCheck %s --check-prefix=TPU
// RUN: overlap-opt %s --threshold-mib=0 --target=gpu | FileCheck %s --check-prefix=GPU

// A scanned layer's weight is a slice of the stacked weights. The TPU forms pass the
// stack and the layer's index into the ring's loop and slice it there, the index
// through an optimization_barrier with the loop counter: given the slice, libtpu
// hoists it and copies the whole weight out of the stack before the loop; sliced in
// the loop, the slice fuses into each dot. The GPU forms pass the slice.
// TPU-LABEL: func.func @layer
// TPU: stablehlo.while({{.*}}= %arg1, {{.*}}= %arg2{{.*}}tensor<3x16x8xf32>, tensor<i32>
// TPU: } do {
// TPU: %[[TIED:.*]]:2 = stablehlo.optimization_barrier
// TPU: stablehlo.dynamic_slice {{.*}}, %[[TIED]]#1, {{.*}} sizes = [1, 16, 8]
// TPU: stablehlo.dot_general
// TPU: stablehlo.return
// GPU-LABEL: func.func @layer
// GPU: stablehlo.while
// GPU-NOT: tensor<3x16x8xf32>
// GPU: } do {
// GPU-NOT: sizes = [1, 16, 8]
// GPU: stablehlo.return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @layer(%x: tensor<2x16xf32>, %stack: tensor<3x16x8xf32>, %i: tensor<i32>) -> tensor<16x8xf32> {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %s = stablehlo.dynamic_slice %stack, %i, %c0, %c0, sizes = [1, 16, 8] : (tensor<3x16x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x16x8xf32>
    %w = stablehlo.reshape %s : (tensor<1x16x8xf32>) -> tensor<16x8xf32>
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<16x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }
}
