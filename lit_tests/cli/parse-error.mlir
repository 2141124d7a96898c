// RUN: not overlap-opt %s 2>&1 | FileCheck %s
// RUN: not overlap-opt < %s 2>&1 | FileCheck %s --check-prefix=STDIN
// RUN: echo "old output" > %t
// RUN: not overlap-opt %s -o %t
// RUN: FileCheck %s --check-prefix=KEPT < %t

// A parse error is reported at its file:line:col (<stdin> for stdin) and the run
// fails; an existing -o file is left as it was.

// CHECK: parse-error.mlir:15:8: error: Dialect `foo' not found for custom op 'foo.bar'
// STDIN: <stdin>:15:8: error: Dialect `foo' not found for custom op 'foo.bar'
// KEPT: old output
// KEPT-NOT: module
func.func @f() {
  %0 = foo.bar
  return
}
