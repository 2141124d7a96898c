// RUN: overlap-opt %s --mlir-timing -o %t 2>&1 | FileCheck %s --check-prefix=TIMING
// RUN: overlap-opt %s --mlir-print-ir-after-all -o %t 2>&1 | FileCheck %s --check-prefix=AFTER
// RUN: overlap-opt %s --pass-pipeline='builtin.module(cse)' --mlir-print-ir-before-all -o %t 2>&1 | FileCheck %s --check-prefix=BEFORE

// Pass timing and IR dumps go to stderr.

// TIMING: Execution time report
// TIMING: OverlapAllGatherMatmul
// TIMING: OverlapMatmulReduceScatter
// TIMING: Canonicalizer
// TIMING: CSE

// AFTER: IR Dump After OverlapAllGatherMatmul: overlap-all-gather-matmul
// AFTER: func.func @f
// AFTER: IR Dump After OverlapMatmulReduceScatter: overlap-matmul-reduce-scatter
// AFTER: IR Dump After CanonicalizerPass
// AFTER: IR Dump After CSEPass

// BEFORE: IR Dump Before CSEPass
// BEFORE: func.func @f
func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
