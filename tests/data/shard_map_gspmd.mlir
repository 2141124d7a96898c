// jax 0.10.2: jax.jit(shard_map(f, mesh=make_mesh((4, 2), ("x", "y")), in_specs=(P("x"), P()),
// out_specs=P("x"))).lower(f32[64,32], f32[32,16]).as_text() (gspmd), where f(x, w) =
// psum_scatter((all_gather(x, "x", axis=0, tiled=True) @ w) @ w.T, "x", scatter_dimension=0, tiled=True).
module @jit_f attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<64x32xf32> {mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"}, %arg1: tensor<32x16xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<64x32xf32> {jax.result_info = "result", mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"}) {
    %0 = stablehlo.custom_call @Sharding(%arg0) {backend_config = "", mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"} : (tensor<64x32xf32>) -> tensor<64x32xf32>
    %1 = stablehlo.custom_call @SPMDFullToShardShape(%0) {backend_config = "", mhlo.sharding = "{manual}"} : (tensor<64x32xf32>) -> tensor<16x32xf32>
    %2 = stablehlo.custom_call @Sharding(%arg1) {backend_config = "", mhlo.sharding = "{replicated}"} : (tensor<32x16xf32>) -> tensor<32x16xf32>
    %3 = stablehlo.custom_call @SPMDFullToShardShape(%2) {backend_config = "", mhlo.sharding = "{manual}"} : (tensor<32x16xf32>) -> tensor<32x16xf32>
    %4 = call @shmap_body(%1, %3) : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x32xf32>
    %5 = stablehlo.custom_call @Sharding(%4) {backend_config = "", mhlo.sharding = "{manual}"} : (tensor<16x32xf32>) -> tensor<16x32xf32>
    %6 = stablehlo.custom_call @SPMDShardToFullShape(%5) {backend_config = "", mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"} : (tensor<16x32xf32>) -> tensor<64x32xf32>
    return %6 : tensor<64x32xf32>
  }
  func.func private @shmap_body(%arg0: tensor<16x32xf32>, %arg1: tensor<32x16xf32>) -> (tensor<16x32xf32> {jax.result_info = "[('x',), None]"}) {
    %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<16x32xf32>) -> tensor<64x32xf32>
    %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    %2 = stablehlo.transpose %arg1, dims = [1, 0] : (tensor<32x16xf32>) -> tensor<16x32xf32>
    %3 = stablehlo.dot_general %1, %2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<64x16xf32>, tensor<16x32xf32>) -> tensor<64x32xf32>
    %4 = "stablehlo.reduce_scatter"(%3) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %5 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %5 : tensor<f32>
    }) : (tensor<64x32xf32>) -> tensor<16x32xf32>
    return %4 : tensor<16x32xf32>
  }
}

