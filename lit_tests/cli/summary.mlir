// RUN: overlap-opt %s --threshold-mib=0 -o %t 2>&1 | FileCheck %s --check-prefix=ALL
// RUN: overlap-opt %s -o %t 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: overlap-opt %s --threshold-mib=0 -q -o %t 2>&1 | FileCheck %s --check-prefix=QUIET --allow-empty
// RUN: overlap-opt %s --threshold-mib=0 2>/dev/null | FileCheck %s --check-prefix=MODULE

// A successful run says in one line on stderr how many sites it rewrote and why it left
// the others (a warning may follow). -q leaves it out; stdout holds the module alone.

// ALL: overlap-opt: 2 of 2 sites rewritten
// ALL-NOT: {{.}}

// NONE: overlap-opt: 0 of 2 sites rewritten; 2 left unchanged (below threshold-mib)
// NONE-NEXT: overlap-opt: warning: 2 of 2 candidate sites left unchanged

// QUIET-NOT: {{.}}

module attributes {mhlo.num_partitions = 4 : i32} {
  // MODULE-LABEL: func.func @gather_dot
  func.func @gather_dot(%x: tensor<16x32xf32>, %w: tensor<32x16xf32>) -> tensor<64x16xf32> {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    return %d : tensor<64x16xf32>
  }

  // MODULE-LABEL: func.func @dot_scatter
  // MODULE-NOT: sites rewritten
  func.func @dot_scatter(%a: tensor<64x16xf32>, %b: tensor<16x32xf32>) -> tensor<16x32xf32> {
    %d = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<64x16xf32>, tensor<16x32xf32>) -> tensor<64x32xf32>
    %s = "stablehlo.reduce_scatter"(%d) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%l: tensor<f32>, %r: tensor<f32>):
      %sum = stablehlo.add %l, %r : tensor<f32>
      stablehlo.return %sum : tensor<f32>
    }) : (tensor<64x32xf32>) -> tensor<16x32xf32>
    return %s : tensor<16x32xf32>
  }
}
