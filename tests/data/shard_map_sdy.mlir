// jax 0.10.2: jax.jit(shard_map(f, mesh=make_mesh((4, 2), ("x", "y")), in_specs=(P("x"), P()),
// out_specs=P("x"))).lower(f32[64,32], f32[32,16]).as_text() (sdy), where f(x, w) =
// psum_scatter((all_gather(x, "x", axis=0, tiled=True) @ w) @ w.T, "x", scatter_dimension=0, tiled=True).
module @jit_f attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4, "y"=2]> {stablehlo.mesh = {axes = [{name = "x", size = 4 : i64}, {name = "y", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<64x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %arg1: tensor<32x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) -> (tensor<64x32xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) {
    %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"x"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"x"}, {}]>] manual_axes={"x", "y"} (%arg2: tensor<16x32xf32>, %arg3: tensor<32x16xf32>) {
      %1 = "stablehlo.all_gather"(%arg2) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
      %2 = stablehlo.dot_general %1, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
      %3 = stablehlo.transpose %arg3, dims = [1, 0] : (tensor<32x16xf32>) -> tensor<16x32xf32>
      %4 = stablehlo.dot_general %2, %3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<64x16xf32>, tensor<16x32xf32>) -> tensor<64x32xf32>
      %5 = "stablehlo.reduce_scatter"(%4) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
      ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
        %6 = stablehlo.add %arg4, %arg5 : tensor<f32>
        stablehlo.return %6 : tensor<f32>
      }) : (tensor<64x32xf32>) -> tensor<16x32xf32>
      sdy.return %5 : tensor<16x32xf32>
    } : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x32xf32>
    return %0 : tensor<64x32xf32>
  }
}
