// RUN: not overlap-opt %s --split-input-file 2>&1 | FileCheck %s

// Each chunk is parsed and rewritten on its own, diagnostics keep the line numbers
// of the whole file, a failing chunk fails the run without stopping the others, and
// the outputs are joined with "// -----" lines.

// CHECK: split-input-file.mlir:19:10: error: use of undeclared SSA value name
// CHECK-LABEL: func.func @first
// CHECK-NEXT: return
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: // -----
// CHECK-LABEL: func.func @third
func.func @first() {
  return
}
// -----
func.func @second() -> tensor<2xf32> {
  return %undefined : tensor<2xf32>
}
// -----
func.func @third() {
  return
}
