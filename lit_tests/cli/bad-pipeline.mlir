// RUN: not overlap-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{size=3})' 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-all-gather-matmul{threshold-mib=big})' 2>&1 | FileCheck %s --check-prefix=VALUE
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(func.func(overlap-all-gather-matmul))' 2>&1 | FileCheck %s --check-prefix=NESTED
// RUN: not overlap-opt %s --threshold-mib=-1 2>&1 | FileCheck %s --check-prefix=FLAG

// Usage errors (exit status 2) are reported before the input is read.

// UNKNOWN: overlap-opt: error: unknown pass or bad pipeline element 'no-such-pass'
// OPTION: overlap-opt: error: pass 'overlap-all-gather-matmul' has no option 'size' (options: threshold-mib)
// VALUE: overlap-opt: error: pass 'overlap-all-gather-matmul': option 'threshold-mib' expects float, got 'big'
// NESTED: overlap-opt: error: {{.*}}overlap passes run on builtin.module only
// FLAG: overlap-opt: error: argument --threshold-mib: '-1' must be a number >= 0
func.func @f() {
  return
}
