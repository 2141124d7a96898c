// RUN: overlap-opt --list-passes | FileCheck %s

// Every overlap pass lists its options with their types and defaults:
// threshold-mib is unset by default (1 MiB applies unless a hardware profile is
// named), hardware is unset, bidirectional is unset, target is unset (the hardware
// profile's); unroll, the all_gather pass's own, is unset (1, but 2 on TPU and GPU).
// The built-in hardware profiles are listed at the end.

// CHECK-LABEL: overlap-all-gather-matmul
// CHECK-NEXT: all_gather feeding dot_general
// CHECK: Options:
// CHECK-NEXT: threshold-mib=<float>  (default: unset)
// CHECK: hardware=<NAME|FILE.json>  (default: unset)
// CHECK: bidirectional=<bool>  (default: unset)
// CHECK: target=<str>  (default: unset)
// CHECK: unroll=<int>  (default: unset)
// CHECK: but 2 on TPU and GPU
// CHECK-LABEL: overlap-matmul-reduce-scatter
// CHECK-NEXT: dot_general feeding reduce_scatter
// CHECK: Options:
// CHECK-NEXT: threshold-mib=<float>  (default: unset)
// CHECK: hardware=<NAME|FILE.json>  (default: unset)
// CHECK: bidirectional=<bool>  (default: unset)
// CHECK: target=<str>  (default: unset)
// CHECK-NOT: unroll=
// CHECK-LABEL: overlap-matmul-all-reduce
// CHECK-NEXT: dot_general feeding all_reduce(add)
// CHECK: Options:
// CHECK-NEXT: threshold-mib=<float>  (default: unset)
// CHECK-LABEL: overlap-sequence-parallel
// CHECK-NEXT: all_gather -> row-wise ops
// CHECK-NOT: threshold-mib
// CHECK-LABEL: overlap-all-to-all-matmul
// CHECK-NEXT: all_to_all beside dot_general
// CHECK: Options:
// CHECK-NEXT: threshold-mib=<float>  (default: unset)
// CHECK-LABEL: overlap-stack-in-place
// CHECK-NEXT: a ring's buffer copied whole into a scanned loop's stacked residuals
// CHECK: Upstream MLIR passes such as canonicalize and cse can be used in --pass-pipeline
// CHECK: Default pipeline: builtin.module(overlap-matmul-all-reduce,overlap-sequence-parallel,overlap-all-gather-matmul,overlap-matmul-reduce-scatter,overlap-all-to-all-matmul,canonicalize,cse,overlap-stack-in-place)
// CHECK: Hardware profiles:
// CHECK-DAG: tpu-v5e:
// CHECK-DAG: h100-sxm:
// CHECK-DAG: host-cpu:
// CHECK-NOT: threshold-mib=<float>  (default: 1.0)
