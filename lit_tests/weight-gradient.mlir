// RUN: overlap-opt %s --hardware=tpu-v5e --tpu-summing-rings --split-input-file --remarks -o %t 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: FileCheck %s --input-file %t
// RUN: overlap-opt %s --threshold-mib=0 --split-input-file -o %t.threshold
// RUN: FileCheck %s --check-prefix=SUMMED --input-file %t.threshold

// A backward-pass all_gather (of the output gradient) feeds two dots: the input
// gradient, whose free dim is the gathered one, and the weight gradient, whose
// contracting dim is. In the ring, the weight gradient adds a product of its whole
// result's size every round. Where the cost model decides, the pass weighs a second
// form: the ring computes the free-dim dot and assembles the gathered tensor, and the
// weight gradient reads that buffer once, whole, after the ring. It builds the form
// predicted to save more: on tpu-v5e (summing rings allowed) the second for a SwiGLU
// down projection's gradient (a 3584x8192 weight: its sum would cost more than the
// ring hides), the first for an attention output projection's (1024x8192). An
// explicit threshold keeps the first form.

// REMARK: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<4096x8192xbf16> gathered over groups of 8; the ring assembles the gathered tensor for 1 other reader(s); its contracting-dim dot(s) read the gathered tensor the ring assembles (predicted faster than summing them in the ring); decided by the cost model for tpu-v5e
// CHECK-LABEL: func.func @down_projection_gradient
// CHECK-NOT: stablehlo.all_gather
// CHECK-NOT: contracting_dims = [0] x [0]
// CHECK: stablehlo.while
// CHECK: } do {
// CHECK: stablehlo.return
// CHECK-NEXT: }
// CHECK: stablehlo.dot_general %arg2, %{{[0-9]+}}, contracting_dims = [0] x [0] : (tensor<4096x3584xbf16>, tensor<4096x8192xbf16>) -> tensor<3584x8192xbf16>
// CHECK-NEXT: return
// SUMMED-LABEL: func.func @down_projection_gradient
// SUMMED-NOT: stablehlo.all_gather
// SUMMED: contracting_dims = [0] x [0] : (tensor<512x3584xbf16>, tensor<512x8192xbf16>) -> tensor<3584x8192xbf16>
// SUMMED: stablehlo.while
// SUMMED-NOT: tensor<4096x8192xbf16>
// SUMMED: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @down_projection_gradient(%dy: tensor<512x8192xbf16>, %w: tensor<3584x8192xbf16>, %h: tensor<4096x3584xbf16>) -> (tensor<3584x8192xbf16>, tensor<4096x3584xbf16>) {
    %g = "stablehlo.all_gather"(%dy) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<512x8192xbf16>) -> tensor<4096x8192xbf16>
    %dw = stablehlo.dot_general %h, %g, contracting_dims = [0] x [0] : (tensor<4096x3584xbf16>, tensor<4096x8192xbf16>) -> tensor<3584x8192xbf16>
    %dh = stablehlo.dot_general %g, %w, contracting_dims = [1] x [1] : (tensor<4096x8192xbf16>, tensor<3584x8192xbf16>) -> tensor<4096x3584xbf16>
    return %dw, %dh : tensor<3584x8192xbf16>, tensor<4096x3584xbf16>
  }
}

// -----

// REMARK: remark: overlap-all-gather-matmul: rewritten: 2 dot(s) (contracting dim, free dim), tensor<4096x8192xbf16> gathered over groups of 8; decided by the cost model for tpu-v5e
// CHECK-LABEL: func.func @output_projection_gradient
// CHECK-NOT: stablehlo.all_gather
// CHECK: stablehlo.dot_general %{{[0-9]+}}, %arg0, contracting_dims = [0] x [0] : (tensor<512x1024xbf16>, tensor<512x8192xbf16>) -> tensor<1024x8192xbf16>
// CHECK: stablehlo.collective_permute
// CHECK: stablehlo.add {{.*}} : tensor<1024x8192xbf16>
// CHECK-NOT: tensor<4096x8192xbf16>
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @output_projection_gradient(%dy: tensor<512x8192xbf16>, %w: tensor<1024x8192xbf16>, %h: tensor<4096x1024xbf16>) -> (tensor<1024x8192xbf16>, tensor<4096x1024xbf16>) {
    %g = "stablehlo.all_gather"(%dy) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<512x8192xbf16>) -> tensor<4096x8192xbf16>
    %dw = stablehlo.dot_general %h, %g, contracting_dims = [0] x [0] : (tensor<4096x1024xbf16>, tensor<4096x8192xbf16>) -> tensor<1024x8192xbf16>
    %dh = stablehlo.dot_general %g, %w, contracting_dims = [1] x [1] : (tensor<4096x8192xbf16>, tensor<1024x8192xbf16>) -> tensor<4096x1024xbf16>
    return %dw, %dh : tensor<1024x8192xbf16>, tensor<4096x1024xbf16>
  }
}

// -----

// Neither form pays at this size: the site is left unchanged, and its remark is the
// matched form's (both dots listed, its prediction).
// REMARK: remark: overlap-all-gather-matmul: left unchanged: not profitable on tpu-v5e (the cost model: less than 5% faster); 2 dot(s) (contracting dim, free dim), tensor<64x256xbf16> gathered over groups of 8; predicted
// CHECK-LABEL: func.func @small_gradient
// CHECK: stablehlo.all_gather
// CHECK-NOT: stablehlo.collective_permute
// CHECK: return
module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @small_gradient(%dy: tensor<8x256xbf16>, %w: tensor<128x256xbf16>, %h: tensor<64x128xbf16>) -> (tensor<128x256xbf16>, tensor<64x128xbf16>) {
    %g = "stablehlo.all_gather"(%dy) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<8x256xbf16>) -> tensor<64x256xbf16>
    %dw = stablehlo.dot_general %h, %g, contracting_dims = [0] x [0] : (tensor<64x128xbf16>, tensor<64x256xbf16>) -> tensor<128x256xbf16>
    %dh = stablehlo.dot_general %g, %w, contracting_dims = [1] x [1] : (tensor<64x256xbf16>, tensor<128x256xbf16>) -> tensor<64x128xbf16>
    return %dw, %dh : tensor<128x256xbf16>, tensor<64x128xbf16>
  }
}
