module @jit_gated_mlp attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["tp"=8]> {stablehlo.mesh = {axes = [{name = "tp", size = 8 : i64}]}}
  sdy.mesh @mesh_0 = <["tp"=8]> {stablehlo.mesh = {axes = [{name = "tp", size = 8 : i64}]}}
  func.func public @main(%arg0: tensor<4096x8192xbf16> {sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {}]>}, %arg1: tensor<8192x28672xbf16> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}]>}, %arg2: tensor<8192x28672xbf16> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}]>}, %arg3: tensor<28672x8192xbf16> {sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {}]>}) -> (tensor<4096x8192xbf16> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {}]>}) {
    %0 = sdy.manual_computation(%arg0, %arg1, %arg2, %arg3) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {"tp"}]>, <@mesh, [{}, {"tp"}]>, <@mesh, [{"tp"}, {}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%arg4: tensor<512x8192xbf16>, %arg5: tensor<8192x3584xbf16>, %arg6: tensor<8192x3584xbf16>, %arg7: tensor<3584x8192xbf16>) {
      %2 = "stablehlo.all_gather"(%arg4) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "tp">]>, use_global_device_ids}> : (tensor<512x8192xbf16>) -> tensor<4096x8192xbf16>
      %3 = stablehlo.dot_general %2, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4096x8192xbf16>, tensor<8192x3584xbf16>) -> tensor<4096x3584xbf16>
      %4 = func.call @silu(%3) : (tensor<4096x3584xbf16>) -> tensor<4096x3584xbf16>
      %5 = stablehlo.dot_general %2, %arg6, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4096x8192xbf16>, tensor<8192x3584xbf16>) -> tensor<4096x3584xbf16>
      %6 = stablehlo.multiply %4, %5 : tensor<4096x3584xbf16>
      %7 = stablehlo.dot_general %6, %arg7, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4096x3584xbf16>, tensor<3584x8192xbf16>) -> tensor<4096x8192xbf16>
      %8 = "stablehlo.reduce_scatter"(%7) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "tp">]>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
      ^bb0(%arg8: tensor<bf16>, %arg9: tensor<bf16>):
        %9 = stablehlo.add %arg8, %arg9 : tensor<bf16>
        stablehlo.return %9 : tensor<bf16>
      }) : (tensor<4096x8192xbf16>) -> tensor<512x8192xbf16>
      sdy.return %8 : tensor<512x8192xbf16>
    } : (tensor<4096x8192xbf16>, tensor<8192x28672xbf16>, tensor<8192x28672xbf16>, tensor<28672x8192xbf16>) -> tensor<4096x8192xbf16>
    %1 = sdy.sharding_constraint %0 <@mesh, [{"tp"}, {}]> : tensor<4096x8192xbf16>
    return %1 : tensor<4096x8192xbf16>
  }
  func.func private @silu(%arg0: tensor<4096x3584xbf16>) -> tensor<4096x3584xbf16> {
    %0 = stablehlo.negate %arg0 : tensor<4096x3584xbf16>
    %1 = stablehlo.exponential %0 : tensor<4096x3584xbf16>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<bf16>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<bf16>) -> tensor<4096x3584xbf16>
    %3 = stablehlo.add %2, %1 : tensor<4096x3584xbf16>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<bf16>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<bf16>) -> tensor<4096x3584xbf16>
    %5 = stablehlo.divide %4, %3 : tensor<4096x3584xbf16>
    %6 = stablehlo.multiply %arg0, %5 : tensor<4096x3584xbf16>
    return %6 : tensor<4096x3584xbf16>
  }
}
