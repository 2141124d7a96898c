// RUN: overlap-opt %s --split-input-file --hardware=h100-sxm --remarks -o %t.h100 2>&1 | FileCheck %s --check-prefix=H100-REMARK
// RUN: FileCheck %s --check-prefix=H100-TWO --input-file %t.h100
// RUN: overlap-opt %s --split-input-file --hardware=h100-sxm --no-bidirectional -o %t.one
// RUN: FileCheck %s --check-prefix=H100 --input-file %t.one
// RUN: overlap-opt %s --split-input-file --hardware=tpu-v5e --remarks -o %t.v5e 2>&1 | FileCheck %s --check-prefix=V5E-REMARK
// RUN: FileCheck %s --check-prefix=V5E --input-file %t.v5e
// RUN: overlap-opt %s --split-input-file --hardware=host-cpu --remarks -o %t.cpu 2>&1 | FileCheck %s --check-prefix=CPU-REMARK
// RUN: overlap-opt %s --split-input-file --hardware=h100-sxm --threshold-mib=0 --remarks -o %t.thr 2>&1 | FileCheck %s --check-prefix=THR-REMARK
// RUN: FileCheck %s --check-prefix=THR --input-file %t.thr
// RUN: overlap-opt %s --split-input-file --pass-pipeline='builtin.module(overlap-all-gather-matmul{hardware=tpu-v5e},overlap-matmul-reduce-scatter{hardware=tpu-v5e})' --remarks -o %t.pipe 2>&1 | FileCheck %s --check-prefix=V5E-REMARK
// RUN: overlap-opt %s --split-input-file --hardware=%S/Inputs/slow-link.json --remarks -o %t.json 2>&1 | FileCheck %s --check-prefix=JSON-REMARK
// RUN: overlap-opt %s --split-input-file --hardware=h100-sxm --pass-statistics -o %t.stats 2>&1 | FileCheck %s --check-prefix=STATS
// RUN: overlap-opt %s --split-input-file --hardware=h100-sxm --threshold-mib=0 --pass-statistics -o %t.stats0 2>&1 | FileCheck %s --check-prefix=STATS0
// RUN: not overlap-opt %s --hardware=no-such-chip 2>&1 | FileCheck %s --check-prefix=BADHW
// RUN: not overlap-opt %s --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{hardware=no-such-chip})' 2>&1 | FileCheck %s --check-prefix=BADHW-PIPE
// RUN: not overlap-opt %s --hardware=%S/Inputs/bad-field.json 2>&1 | FileCheck %s --check-prefix=BADJSON
// RUN: not overlap-opt %s --hardware=%S/Inputs/empty-tflops.json 2>&1 | FileCheck %s --check-prefix=NOTFLOPS
// RUN: not overlap-opt %s --hardware=%S/Inputs/zero-link.json 2>&1 | FileCheck %s --check-prefix=ZEROLINK
// RUN: not overlap-opt %s --hardware=%S/Inputs/negative-latency.json 2>&1 | FileCheck %s --check-prefix=NEGLAT
// RUN: not overlap-opt %s --hardware=%S/Inputs/not-json.json 2>&1 | FileCheck %s --check-prefix=NOTJSON

// --hardware names a profile (or a .json profile file): with no explicit
// threshold-mib, each site is decided by the cost model, and every remark carries
// the predicted time before and after on that profile. An explicit threshold-mib
// overrides the cost model (the prediction is still reported). A hardware name that
// is neither a profile nor a .json file is a usage error (exit status 2, before the
// input is read); so is a .json profile with an unknown field, with a value out of
// range (an empty tflops map, a zero link bandwidth, a negative latency) or with
// text that is not JSON. The one error line names the file and the field.

// BADHW: overlap-opt: error: pass 'overlap-matmul-all-reduce': unknown hardware 'no-such-chip' (profiles: {{.*}}; or a .json profile file)
// BADHW-NOT: remark
// BADHW-PIPE: overlap-opt: error: pass 'overlap-matmul-reduce-scatter': unknown hardware 'no-such-chip'
// BADJSON: overlap-opt: error: pass 'overlap-matmul-all-reduce': {{.*}}bad-field.json: unknown hardware fields ['warp_speed']
// NOTFLOPS: {{^}}overlap-opt: error: pass 'overlap-matmul-all-reduce': {{.*}}Inputs/empty-tflops.json: 'tflops' must map element types to positive numbers{{$}}
// NOTFLOPS-NOT: {{.}}
// ZEROLINK: {{^}}overlap-opt: error: pass 'overlap-matmul-all-reduce': {{.*}}Inputs/zero-link.json: 'link_gbps' must be a positive number{{$}}
// ZEROLINK-NOT: {{.}}
// NEGLAT: {{^}}overlap-opt: error: pass 'overlap-matmul-all-reduce': {{.*}}Inputs/negative-latency.json: 'latency_us' must be a number >= 0{{$}}
// NEGLAT-NOT: {{.}}
// NOTJSON: {{^}}overlap-opt: error: pass 'overlap-matmul-all-reduce': {{.*}}Inputs/not-json.json: not valid JSON: {{.+}}
// NOTJSON-NOT: {{.}}

// Statistics (stderr): per pass, sites seen and rewritten and the skipped ones by
// reason; with threshold-mib=0 nothing is skipped.
// STATS: ===-------------------- overlap-hlo pass statistics --------------------===
// STATS-NEXT: overlap-all-gather-matmul: 2 sites seen, 1 rewritten
// STATS-NEXT: 1 skipped: not profitable
// STATS-NEXT: overlap-matmul-reduce-scatter: 1 sites seen, 1 rewritten
// STATS-NOT: skipped
// STATS0: ===-------------------- overlap-hlo pass statistics --------------------===
// STATS0-NEXT: overlap-all-gather-matmul: 2 sites seen, 2 rewritten
// STATS0-NEXT: overlap-matmul-reduce-scatter: 1 sites seen, 1 rewritten
// STATS0-NOT: skipped

// A tiny gather-matmul (8x16 by 16x8 f32 over a group of 4): the shifts are pure
// latency and the partial dots nearly free, so the ring loses on every built-in
// profile and the all_gather stays. threshold-mib=0 rewrites it anyway, still
// reporting the (slower) prediction. On the slow-link profile (a shift costs as
// much as a partial dot) it pays: the all_gather's 2 bidirectional steps and 4 dots,
// 6 t, against 4 t for the two-stream ring, the faster form.
// H100-REMARK: cost-model.mlir:[[# @LINE + 18]]:10: remark: overlap-all-gather-matmul: left unchanged: not profitable on h100-sxm (the cost model: less than 5% faster); 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4; predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on h100-sxm{{$}}
// V5E-REMARK: cost-model.mlir:[[# @LINE + 17]]:10: remark: overlap-all-gather-matmul: left unchanged: not profitable on tpu-v5e (the cost model: less than 5% faster); 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4; predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on tpu-v5e{{$}}
// CPU-REMARK: cost-model.mlir:[[# @LINE + 16]]:10: remark: overlap-all-gather-matmul: left unchanged: not profitable on host-cpu (the cost model: less than 5% faster);
// THR-REMARK: cost-model.mlir:[[# @LINE + 15]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4; decided by threshold-mib=0 (explicit, over the cost model for h100-sxm): {{.*}} MiB communicated; predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on h100-sxm{{(: predicted slower than the original)?$}}
// JSON-REMARK: cost-model.mlir:[[# @LINE + 14]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<8x16xf32> gathered over groups of 4; decided by the cost model for slow-link, two streams (the faster form); predicted 3072.0 us -> 2048.0 us (1.50x) on slow-link{{$}}
// H100-LABEL: func.func @tiny
// H100: "stablehlo.all_gather"(%arg0)
// H100-NOT: stablehlo.collective_permute
// H100-NOT: stablehlo.while
// H100: return
// V5E-LABEL: func.func @tiny
// V5E: "stablehlo.all_gather"(%arg0)
// V5E-NOT: stablehlo.collective_permute
// THR-LABEL: func.func @tiny
// THR-NOT: stablehlo.all_gather
// THR: stablehlo.collective_permute
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @tiny(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %d : tensor<8x8xf32>
  }
}

// -----

// A large one: tensor<8192x8192xbf16> gathered from 4 shards of 2048 rows, times an
// 8192x8192 bf16 weight. Each partial dot outlasts a shift, so the ring hides the
// communication: rewritten on h100-sxm and tpu-v5e, with the predicted times in the
// remark. On host-cpu (matmul-bound) it stays; on slow-link the dots are far too
// slow for the shifts to matter. (Only the slow-link numbers are checked exactly:
// with T_c = T_m = 512 us and no overheads, 2 T_m + 4 T_c -> 4 T_c.)
// H100-REMARK: cost-model.mlir:[[# @LINE + 28]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<8192x8192xbf16> gathered over groups of 4; decided by the cost model for h100-sxm, two streams (the faster form); predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on h100-sxm{{(: predicted slower than the original)?$}}
// V5E-REMARK: cost-model.mlir:[[# @LINE + 27]]:10: remark: overlap-all-gather-matmul: rewritten: 1 dot(s) (free dim), tensor<8192x8192xbf16> gathered over groups of 4; decided by the cost model for tpu-v5e, two streams (the faster form); predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on tpu-v5e{{(: predicted slower than the original)?$}}
// CPU-REMARK: cost-model.mlir:[[# @LINE + 26]]:10: remark: overlap-all-gather-matmul: left unchanged: not profitable on host-cpu (the cost model: less than 5% faster); 1 dot(s) (free dim), tensor<8192x8192xbf16> gathered over groups of 4; predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on host-cpu{{$}}
// JSON-REMARK: cost-model.mlir:[[# @LINE + 25]]:10: remark: overlap-all-gather-matmul: left unchanged: not profitable on slow-link (the cost model: less than 5% faster);
// With no stream count given, the cost model builds the faster form: two streams (the
// --no-bidirectional run below checks the one-stream ring).
// H100-TWO-LABEL: func.func @large
// H100-TWO: "stablehlo.collective_permute"(%arg0) {{.*}} source_target_pairs = dense<{{\[\[}}0, 3], [1, 0], [2, 1], [3, 2]]>
// H100-TWO-NEXT: "stablehlo.collective_permute"(%arg0) {{.*}} source_target_pairs = dense<{{\[\[}}0, 1], [1, 2], [2, 3], [3, 0]]>
// H100-TWO-NOT: stablehlo.all_gather
// H100-TWO: return
// One stream on the GPU profile: unroll 2 (the GPU forms' default) fills one iteration
// of the group of 4, and a loop that would run once is emitted inline.
// H100-LABEL: func.func @large
// H100-NOT: {{stablehlo.all_gather|stablehlo.while}}
// H100: "stablehlo.collective_permute"(%arg0)
// H100: %[[H100_T:.*]]:2 = stablehlo.optimization_barrier
// H100-NEXT: "stablehlo.collective_permute"(%[[H100_T]]#0)
// H100: stablehlo.dot_general %[[H100_T]]#0, %arg1, contracting_dims = [1] x [0] : (tensor<2048x8192xbf16>, tensor<8192x8192xbf16>) -> tensor<2048x8192xbf16>
// H100-NOT: {{stablehlo.all_gather|stablehlo.while}}
// H100: return
// V5E-LABEL: func.func @large
// V5E-NOT: stablehlo.all_gather
// V5E: "stablehlo.collective_permute"
// V5E-NOT: stablehlo.all_gather
// V5E: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @large(%x: tensor<2048x8192xbf16>, %w: tensor<8192x8192xbf16>) -> tensor<8192x8192xbf16> {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2048x8192xbf16>) -> tensor<8192x8192xbf16>
    %d = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0] : (tensor<8192x8192xbf16>, tensor<8192x8192xbf16>) -> tensor<8192x8192xbf16>
    return %d : tensor<8192x8192xbf16>
  }
}

// -----

// The matching large dot -> reduce_scatter, rewritten on h100-sxm and tpu-v5e.
// H100-REMARK: cost-model.mlir:[[# @LINE + 20]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8192x8192xbf16> scattered on dim 0 (free dim of operand 0) over groups of 4; decided by the cost model for h100-sxm, two streams (the faster form); predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on h100-sxm{{(: predicted slower than the original)?$}}
// V5E-REMARK: cost-model.mlir:[[# @LINE + 19]]:10: remark: overlap-matmul-reduce-scatter: rewritten: tensor<8192x8192xbf16> scattered on dim 0 (free dim of operand 0) over groups of 4; decided by the cost model for tpu-v5e, two streams (the faster form); predicted {{[0-9.]+}} us -> {{[0-9.]+}} us ({{[0-9.]+}}x) on tpu-v5e{{(: predicted slower than the original)?$}}
// CPU-REMARK: cost-model.mlir:[[# @LINE + 18]]:10: remark: overlap-matmul-reduce-scatter: left unchanged: not profitable on host-cpu (the cost model: less than 5% faster);
// H100-LABEL: func.func @large_scatter
// H100-NOT: stablehlo.reduce_scatter
// H100: stablehlo.while
// H100: } do {
// H100-NEXT: "stablehlo.collective_permute"(%iterArg{{[_0-9]*}})
// H100: %[[LS_SUM:.*]] = stablehlo.add %{{[^ ]+}}, %iterArg{{[_0-9]*}} : tensor<1024x8192xbf16>
// H100-NEXT: "stablehlo.collective_permute"(%[[LS_SUM]])
// H100-NOT: stablehlo.reduce_scatter
// H100: return
// V5E-LABEL: func.func @large_scatter
// V5E-NOT: stablehlo.reduce_scatter
// V5E: "stablehlo.collective_permute"
// V5E-NOT: stablehlo.reduce_scatter
// V5E: return
module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @large_scatter(%a: tensor<8192x8192xbf16>, %b: tensor<8192x8192xbf16>) -> tensor<2048x8192xbf16> {
    %d = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8192x8192xbf16>, tensor<8192x8192xbf16>) -> tensor<8192x8192xbf16>
    %s = "stablehlo.reduce_scatter"(%d) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%l: tensor<bf16>, %r: tensor<bf16>):
      %sum = stablehlo.add %l, %r : tensor<bf16>
      stablehlo.return %sum : tensor<bf16>
    }) : (tensor<8192x8192xbf16>) -> tensor<2048x8192xbf16>
    return %s : tensor<2048x8192xbf16>
  }
}
