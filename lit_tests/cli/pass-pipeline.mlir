// RUN: overlap-opt %s | FileCheck %s --check-prefix=DEFAULT
// RUN: overlap-opt %s --threshold-mib=0 | FileCheck %s --check-prefix=REWRITTEN
// RUN: overlap-opt %s --threshold-mib=100 --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0},canonicalize,cse)' | FileCheck %s --check-prefix=REWRITTEN
// RUN: overlap-opt %s --threshold-mib=0 --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter,canonicalize)' | FileCheck %s --check-prefix=DEFAULT
// RUN: overlap-opt %s --pass-pipeline='builtin.module()' --verify-each=false | FileCheck %s --check-prefix=DEFAULT

// The default pipeline leaves this 8 KiB gather alone; --threshold-mib=0 or a
// pipeline option rewrites it (an option in the pipeline text wins over the flag);
// a pipeline without overlap-all-gather-matmul leaves it.

// DEFAULT-LABEL: func.func @gather_dot
// DEFAULT: stablehlo.all_gather
// DEFAULT-NOT: stablehlo.collective_permute

// REWRITTEN-LABEL: func.func @gather_dot
// REWRITTEN: stablehlo.while
// REWRITTEN: stablehlo.collective_permute
// REWRITTEN-NOT: stablehlo.all_gather
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @gather_dot(%x: tensor<16x32xf32>, %w: tensor<32x16xf32>) -> tensor<64x16xf32> {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    return %d : tensor<64x16xf32>
  }
}
