// RUN: overlap-opt %s --pass-pipeline='builtin.module(overlap-stack-in-place)' --split-input-file | FileCheck %s

// A buffer assembled from uninitialised storage (as the TPU and GPU rings do), through a
// loop and an optimization_barrier, then copied whole into slice %i of a stack that the
// scan carries: the blocks are written into the stack's slice, the copy goes, and the
// stack starts uninitialised.
// CHECK-LABEL: func.func @stacked
// CHECK: %[[INIT:.*]] = stablehlo.custom_call @AllocateBuffer() : () -> tensor<2x8x4xf32>
// CHECK: stablehlo.while({{.*}} = %[[INIT]])
// CHECK: %[[B0:.*]] = stablehlo.reshape %{{.*}} : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}}, %[[B0]], %[[I:iterArg[_0-9]*]], %{{.*}}, %{{.*}} : (tensor<2x8x4xf32>, tensor<1x4x4xf32>
// CHECK: stablehlo.optimization_barrier %{{.*}} : tensor<2x8x4xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}}, %{{.*}}, %[[I]], %{{.*}}, %{{.*}} : (tensor<2x8x4xf32>, tensor<1x4x4xf32>
// CHECK-NOT: tensor<1x8x4xf32>
// CHECK: return
func.func @stacked(%x: tensor<4x4xf32>) -> tensor<2x8x4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %c4 = stablehlo.constant dense<4> : tensor<i32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<2x8x4xf32>
  %r:2 = stablehlo.while(%i = %c0, %stack = %init) : tensor<i32>, tensor<2x8x4xf32>
   cond {
    %p = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %a = stablehlo.custom_call @AllocateBuffer() : () -> tensor<8x4xf32>
    %u0 = stablehlo.dynamic_update_slice %a, %x, %c0, %c0 : (tensor<8x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %w:2 = stablehlo.while(%k = %c0, %b = %u0) : tensor<i32>, tensor<8x4xf32>
     cond {
      %q = stablehlo.compare LT, %k, %c1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %q : tensor<i1>
    } do {
      %bb = stablehlo.optimization_barrier %b : tensor<8x4xf32>
      %u1 = stablehlo.dynamic_update_slice %bb, %x, %c4, %c0 : (tensor<8x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
      %k1 = stablehlo.add %k, %c1 : tensor<i32>
      stablehlo.return %k1, %u1 : tensor<i32>, tensor<8x4xf32>
    }
    %bc = stablehlo.broadcast_in_dim %w#1, dims = [1, 2] : (tensor<8x4xf32>) -> tensor<1x8x4xf32>
    %s2 = stablehlo.dynamic_update_slice %stack, %bc, %i, %c0, %c0 : (tensor<2x8x4xf32>, tensor<1x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x4xf32>
    %i1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %i1, %s2 : tensor<i32>, tensor<2x8x4xf32>
  }
  return %r#1 : tensor<2x8x4xf32>
}

// -----

// The scan's counter starts at 1: slice 0 keeps the stack's initial zeros, so nothing
// changes.
// CHECK-LABEL: func.func @counter_from_one
// CHECK-NOT: AllocateBuffer() : () -> tensor<2x8x4xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}} : (tensor<2x8x4xf32>, tensor<1x8x4xf32>
func.func @counter_from_one(%x: tensor<8x4xf32>) -> tensor<2x8x4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<2x8x4xf32>
  %r:2 = stablehlo.while(%i = %c1, %stack = %init) : tensor<i32>, tensor<2x8x4xf32>
   cond {
    %p = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %a = stablehlo.custom_call @AllocateBuffer() : () -> tensor<8x4xf32>
    %u0 = stablehlo.dynamic_update_slice %a, %x, %c0, %c0 : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %bc = stablehlo.broadcast_in_dim %u0, dims = [1, 2] : (tensor<8x4xf32>) -> tensor<1x8x4xf32>
    %s2 = stablehlo.dynamic_update_slice %stack, %bc, %i, %c0, %c0 : (tensor<2x8x4xf32>, tensor<1x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x4xf32>
    %i1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %i1, %s2 : tensor<i32>, tensor<2x8x4xf32>
  }
  return %r#1 : tensor<2x8x4xf32>
}

// -----

// The assembled buffer is also read by something else: nothing changes.
// CHECK-LABEL: func.func @buffer_read_twice
// CHECK-NOT: AllocateBuffer() : () -> tensor<2x8x4xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}} : (tensor<2x8x4xf32>, tensor<1x8x4xf32>
func.func @buffer_read_twice(%x: tensor<8x4xf32>) -> (tensor<2x8x4xf32>, tensor<8x4xf32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<2x8x4xf32>
  %r:3 = stablehlo.while(%i = %c0, %stack = %init, %last = %x) : tensor<i32>, tensor<2x8x4xf32>, tensor<8x4xf32>
   cond {
    %p = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %a = stablehlo.custom_call @AllocateBuffer() : () -> tensor<8x4xf32>
    %u0 = stablehlo.dynamic_update_slice %a, %x, %c0, %c0 : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %bc = stablehlo.broadcast_in_dim %u0, dims = [1, 2] : (tensor<8x4xf32>) -> tensor<1x8x4xf32>
    %s2 = stablehlo.dynamic_update_slice %stack, %bc, %i, %c0, %c0 : (tensor<2x8x4xf32>, tensor<1x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x4xf32>
    %i1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %i1, %s2, %u0 : tensor<i32>, tensor<2x8x4xf32>, tensor<8x4xf32>
  }
  return %r#1, %r#2 : tensor<2x8x4xf32>, tensor<8x4xf32>
}

// -----

// The buffer enters the inner loop in one slot and leaves it in another: not a chain
// the stack can be carried along, so nothing changes.
// CHECK-LABEL: func.func @buffer_changes_slot
// CHECK-NOT: AllocateBuffer() : () -> tensor<2x8x4xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}} : (tensor<2x8x4xf32>, tensor<1x8x4xf32>
func.func @buffer_changes_slot(%x: tensor<4x4xf32>, %y: tensor<8x4xf32>) -> tensor<2x8x4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %c4 = stablehlo.constant dense<4> : tensor<i32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<2x8x4xf32>
  %r:2 = stablehlo.while(%i = %c0, %stack = %init) : tensor<i32>, tensor<2x8x4xf32>
   cond {
    %p = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %a = stablehlo.custom_call @AllocateBuffer() : () -> tensor<8x4xf32>
    %u0 = stablehlo.dynamic_update_slice %a, %x, %c0, %c0 : (tensor<8x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %w:3 = stablehlo.while(%k = %c0, %b = %u0, %other = %y) : tensor<i32>, tensor<8x4xf32>, tensor<8x4xf32>
     cond {
      %q = stablehlo.compare LT, %k, %c1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %q : tensor<i1>
    } do {
      %u1 = stablehlo.dynamic_update_slice %b, %x, %c4, %c0 : (tensor<8x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
      %k1 = stablehlo.add %k, %c1 : tensor<i32>
      stablehlo.return %k1, %other, %u1 : tensor<i32>, tensor<8x4xf32>, tensor<8x4xf32>
    }
    %bc = stablehlo.broadcast_in_dim %w#2, dims = [1, 2] : (tensor<8x4xf32>) -> tensor<1x8x4xf32>
    %s2 = stablehlo.dynamic_update_slice %stack, %bc, %i, %c0, %c0 : (tensor<2x8x4xf32>, tensor<1x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x4xf32>
    %i1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %i1, %s2 : tensor<i32>, tensor<2x8x4xf32>
  }
  return %r#1 : tensor<2x8x4xf32>
}

// -----

// The copy written as JAX writes it in a scan's body: a call of a private function that
// is only the whole-slice update (`dynamic_update_index_in_dim`). The call goes, the
// blocks are written into the stack's slice; the function stays for its other callers.
// CHECK-LABEL: func.func @stacked_through_call
// CHECK: %[[INIT:.*]] = stablehlo.custom_call @AllocateBuffer() : () -> tensor<2x8x4xf32>
// CHECK: stablehlo.while({{.*}} = %[[INIT]])
// CHECK: stablehlo.dynamic_update_slice %{{.*}}, %{{.*}}, %[[I:iterArg[_0-9]*]], %{{.*}}, %{{.*}} : (tensor<2x8x4xf32>, tensor<1x4x4xf32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}}, %{{.*}}, %[[I]], %{{.*}}, %{{.*}} : (tensor<2x8x4xf32>, tensor<1x4x4xf32>
// CHECK-NOT: call @update_index
// CHECK: return
// CHECK: func.func private @update_index
func.func @stacked_through_call(%x: tensor<4x4xf32>) -> tensor<2x8x4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %c4 = stablehlo.constant dense<4> : tensor<i32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<2x8x4xf32>
  %r:2 = stablehlo.while(%i = %c0, %stack = %init) : tensor<i32>, tensor<2x8x4xf32>
   cond {
    %p = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %a = stablehlo.custom_call @AllocateBuffer() : () -> tensor<8x4xf32>
    %u0 = stablehlo.dynamic_update_slice %a, %x, %c0, %c0 : (tensor<8x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %u1 = stablehlo.dynamic_update_slice %u0, %x, %c4, %c0 : (tensor<8x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %s2 = func.call @update_index(%stack, %u1, %i) : (tensor<2x8x4xf32>, tensor<8x4xf32>, tensor<i32>) -> tensor<2x8x4xf32>
    %i1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %i1, %s2 : tensor<i32>, tensor<2x8x4xf32>
  }
  return %r#1 : tensor<2x8x4xf32>
}
func.func private @update_index(%arg0: tensor<2x8x4xf32>, %arg1: tensor<8x4xf32>, %arg2: tensor<i32>) -> tensor<2x8x4xf32> {
  %c = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.broadcast_in_dim %arg1, dims = [1, 2] : (tensor<8x4xf32>) -> tensor<1x8x4xf32>
  %1 = stablehlo.dynamic_update_slice %arg0, %0, %arg2, %c, %c : (tensor<2x8x4xf32>, tensor<1x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}

// -----

// The called function does more than the update (it scales R first): nothing changes.
// CHECK-LABEL: func.func @call_does_more
// CHECK-NOT: AllocateBuffer() : () -> tensor<2x8x4xf32>
// CHECK: call @scaled_update
func.func @call_does_more(%x: tensor<8x4xf32>) -> tensor<2x8x4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<2x8x4xf32>
  %r:2 = stablehlo.while(%i = %c0, %stack = %init) : tensor<i32>, tensor<2x8x4xf32>
   cond {
    %p = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %a = stablehlo.custom_call @AllocateBuffer() : () -> tensor<8x4xf32>
    %u0 = stablehlo.dynamic_update_slice %a, %x, %c0, %c0 : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    %s2 = func.call @scaled_update(%stack, %u0, %i) : (tensor<2x8x4xf32>, tensor<8x4xf32>, tensor<i32>) -> tensor<2x8x4xf32>
    %i1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %i1, %s2 : tensor<i32>, tensor<2x8x4xf32>
  }
  return %r#1 : tensor<2x8x4xf32>
}
func.func private @scaled_update(%arg0: tensor<2x8x4xf32>, %arg1: tensor<8x4xf32>, %arg2: tensor<i32>) -> tensor<2x8x4xf32> {
  %c = stablehlo.constant dense<0> : tensor<i32>
  %twice = stablehlo.add %arg1, %arg1 : tensor<8x4xf32>
  %0 = stablehlo.broadcast_in_dim %twice, dims = [1, 2] : (tensor<8x4xf32>) -> tensor<1x8x4xf32>
  %1 = stablehlo.dynamic_update_slice %arg0, %0, %arg2, %c, %c : (tensor<2x8x4xf32>, tensor<1x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}

// -----

// A scalar update has no start index (no slice to stack): nothing changes, no crash.
// CHECK-LABEL: func.func @scalar_update
// CHECK: stablehlo.dynamic_update_slice %{{.*}}, %{{.*}} : (tensor<f32>, tensor<f32>) -> tensor<f32>
func.func @scalar_update(%x: tensor<f32>) -> tensor<f32> {
  %a = stablehlo.custom_call @AllocateBuffer() : () -> tensor<f32>
  %u = stablehlo.dynamic_update_slice %a, %x : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %u : tensor<f32>
}
