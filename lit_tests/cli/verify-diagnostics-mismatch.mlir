// RUN: not overlap-opt %s --split-input-file --verify-diagnostics 2>&1 | FileCheck %s

// An error nobody expected, and an expectation nothing met, both fail the run;
// chunks whose diagnostics match still count as passing.

// CHECK: verify-diagnostics-mismatch.mlir:8:8: error: unexpected error: Dialect `foo' not found
func.func @unexpected() {
  %0 = foo.bar
  return
}

// -----

// CHECK: verify-diagnostics-mismatch.mlir:16:6: error: expected error "never produced" was not produced
func.func @missing() {
  // expected-error@+1 {{never produced}}
  return
}

// -----

// CHECK-NOT: error
func.func @matched(%a: tensor<2xf32>) -> tensor<3xf32> {
  // expected-error@+1 {{doesn't match function result type}}
  return %a : tensor<2xf32>
}
