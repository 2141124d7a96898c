// RUN: overlap-opt %s --split-input-file --verify-diagnostics

// Parse errors, verifier errors and their notes, with each line designator.

func.func @unknown_dialect() {
  // expected-error@+1 {{Dialect `foo' not found for custom op 'foo.bar'}}
  %0 = foo.bar
  return
}

// -----

func.func @wrong_return_type(%a: tensor<2xf32>) -> tensor<3xf32> {
  // expected-error@below {{type of return operand 0 ('tensor<2xf32>') doesn't match}}
  // expected-note@below {{see current operation}}
  return %a : tensor<2xf32>
}

// -----

func.func @same_line(%a: tensor<2xf32>) -> tensor<2xf32> {
  %b = stablehlo.add %a, %a : tensor<3xf32>  // expected-error {{use of value '%a' expects different type}}
  return %b : tensor<2xf32>
}

// -----

func.func @undefined_value() -> tensor<2xf32> {
  return %nope : tensor<2xf32>
  // expected-error@above {{use of undeclared SSA value name}}
}

// -----

// A chunk without errors is printed and needs no annotation.
func.func @fine(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
