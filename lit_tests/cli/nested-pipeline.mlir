// RUN: overlap-opt %s --pass-pipeline='builtin.module(func.func(canonicalize{max-iterations=2}))' | FileCheck %s --check-prefix=CANON
// RUN: overlap-opt %s --pass-pipeline='builtin.module(func.func(cse,canonicalize{max-iterations=2 region-simplify=disabled}))' | FileCheck %s --check-prefix=CSE
// RUN: overlap-opt %s --pass-pipeline='func.func(cse,canonicalize{max-iterations=2})' | FileCheck %s --check-prefix=CSE
// RUN: overlap-opt %s --pass-pipeline='builtin.module(any(cse))' | FileCheck %s --check-prefix=CSE
// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=0}, func.func(canonicalize{max-iterations=2}), any(cse))' | FileCheck %s --check-prefix=BOTH
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(func.func(canonicalize{no-such-option=1}))' 2>&1 | FileCheck %s --check-prefix=BADOPT
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(any(overlap-all-gather-matmul{threshold-mib=0}))' 2>&1 | FileCheck %s --check-prefix=NESTED
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(func.func(cse)' 2>&1 | FileCheck %s --check-prefix=UNCLOSED

// Pipelines as mlir-opt reads them: nested anchors (func.func, any) with pass options
// go to MLIR's pipeline parser; the overlap passes stay at the top level of
// builtin.module. canonicalize removes the dead add; cse also merges the multiplies.

// CANON-LABEL: func.func @dead_and_duplicate
// CANON-COUNT-2: stablehlo.multiply
// CANON-NOT: stablehlo.multiply
// CANON-COUNT-1: stablehlo.add
// CANON-NOT: stablehlo.add
// CANON-LABEL: func.func @gather_dot
// CANON: stablehlo.all_gather

// CSE-LABEL: func.func @dead_and_duplicate
// CSE-COUNT-1: stablehlo.multiply
// CSE-NOT: stablehlo.multiply
// CSE-LABEL: func.func @gather_dot

// BOTH-LABEL: func.func @dead_and_duplicate
// BOTH-COUNT-1: stablehlo.multiply
// BOTH-NOT: stablehlo.multiply
// BOTH-LABEL: func.func @gather_dot
// BOTH: stablehlo.collective_permute
// BOTH-NOT: stablehlo.all_gather

// BADOPT: overlap-opt: error: unknown pass or bad pipeline element 'func.func(canonicalize{no-such-option=1})'
// NESTED: overlap-opt: error: 'any(overlap-all-gather-matmul{threshold-mib=0})': overlap passes run on builtin.module only
// UNCLOSED: overlap-opt: error: malformed pipeline 'builtin.module(func.func(cse)': expected ',' or ')' at column 30
module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @dead_and_duplicate(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.multiply %a, %a : tensor<4xf32>
    %1 = stablehlo.multiply %a, %a : tensor<4xf32>
    %dead = stablehlo.add %a, %a : tensor<4xf32>
    %2 = stablehlo.add %0, %1 : tensor<4xf32>
    return %2 : tensor<4xf32>
  }
  func.func @gather_dot(%x: tensor<16x32xf32>, %w: tensor<32x16xf32>) -> tensor<64x16xf32> {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    return %d : tensor<64x16xf32>
  }
}
