// RUN: not overlap-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{size=3})' 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=big})' 2>&1 | FileCheck %s --check-prefix=VALUE
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(func.func(overlap-all-gather-matmul))' 2>&1 | FileCheck %s --check-prefix=NESTED
// RUN: not overlap-opt %s --threshold-mib=-1 2>&1 | FileCheck %s --check-prefix=FLAG
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{unroll=0})' 2>&1 | FileCheck %s --check-prefix=UNROLL0
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{unroll=2})' 2>&1 | FileCheck %s --check-prefix=NOTHERS
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{unroll=1.5})' 2>&1 | FileCheck %s --check-prefix=UNROLLINT
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{bidirectional=maybe})' 2>&1 | FileCheck %s --check-prefix=BOOL
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{hardware=no-such-chip})' 2>&1 | FileCheck %s --check-prefix=HARDWARE
// RUN: not overlap-opt %s --unroll=0 2>&1 | FileCheck %s --check-prefix=UNROLLFLAG

// Usage errors (exit status 2) are reported before the input is read.

// UNKNOWN: overlap-opt: error: unknown pass or bad pipeline element 'no-such-pass'
// OPTION: overlap-opt: error: pass 'overlap-all-gather-matmul' has no option 'size' (options: threshold-mib, hardware, bidirectional, target, device-coords, keep-sites, tpu-summing-rings, unroll, f32-sums, own-shard-last)
// VALUE: overlap-opt: error: pass 'overlap-all-gather-matmul': option 'threshold-mib' expects float, got 'big'
// NESTED: overlap-opt: error: {{.*}}overlap passes run on builtin.module only
// FLAG: overlap-opt: error: argument --threshold-mib: '-1' must be a number >= 0
// UNROLL0: overlap-opt: error: pass 'overlap-all-gather-matmul': unroll must be >= 1, got 0
// An option is declared on the passes that read it: unroll is the all_gather ring's.
// NOTHERS: overlap-opt: error: pass 'overlap-matmul-reduce-scatter' has no option 'unroll' (options: threshold-mib, hardware, bidirectional, target, device-coords, keep-sites)
// UNROLLINT: overlap-opt: error: pass 'overlap-all-gather-matmul': option 'unroll' expects int, got '1.5'
// BOOL: overlap-opt: error: pass 'overlap-all-gather-matmul': option 'bidirectional' expects bool, got 'maybe'
// HARDWARE: overlap-opt: error: pass 'overlap-all-gather-matmul': unknown hardware 'no-such-chip' (profiles: {{.*}}tpu-v5e{{.*}}; or a .json profile file)
// UNROLLFLAG: overlap-opt: error: argument --unroll: '0' must be >= 1
func.func @f() {
  return
}
