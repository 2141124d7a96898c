// RUN: overlap-opt --list-passes | FileCheck %s

// CHECK: overlap-all-gather-matmul
// CHECK-NEXT: all_gather feeding dot_general
// CHECK: threshold-mib=<float> (default: 1.0)
// CHECK: overlap-matmul-reduce-scatter
// CHECK-NEXT: dot_general feeding reduce_scatter
// CHECK: threshold-mib=<float> (default: 1.0)
// CHECK: Upstream MLIR passes such as canonicalize and cse can be used in --pass-pipeline
