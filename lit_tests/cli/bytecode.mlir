// RUN: overlap-opt %s --pass-pipeline='builtin.module()' --emit-bytecode -o %t.mlirbc
// RUN: overlap-opt %t.mlirbc --threshold-mib=0 | FileCheck %s
// RUN: overlap-opt < %t.mlirbc --threshold-mib=0 --emit-bytecode | overlap-opt --pass-pipeline='builtin.module()' | FileCheck %s

// Bytecode in and out: the input is read as bytecode whatever its name.

// CHECK-LABEL: func.func @gather_dot
// CHECK: stablehlo.collective_permute
// CHECK-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @gather_dot(%x: tensor<16x32xf32>, %w: tensor<32x16xf32>) -> tensor<64x16xf32> {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    return %d : tensor<64x16xf32>
  }
}
