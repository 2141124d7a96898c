module @jit__lambda attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["tp"=8]> {stablehlo.mesh = {axes = [{name = "tp", size = 8 : i64}]}}
  func.func public @main(%arg0: tensor<1024x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {}]>}, %arg1: tensor<1x2048x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}, {}]>}, %arg2: tensor<1x512x2048xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg3: tensor<1x512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg4: tensor<1x256x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}, {}]>}, %arg5: tensor<1x512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg6: tensor<1x512x2048xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg7: tensor<1x512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}) -> (tensor<1024x512xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {}]>}) {
    %0 = sdy.manual_computation(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5, %arg6, %arg7) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {"tp"}, {}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {"tp"}, {}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {}, {"tp"}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%arg8: tensor<128x512xf32>, %arg9: tensor<1x256x512xf32>, %arg10: tensor<1x512x256xf32>, %arg11: tensor<1x512x32xf32>, %arg12: tensor<1x32x512xf32>, %arg13: tensor<1x512x32xf32>, %arg14: tensor<1x512x256xf32>, %arg15: tensor<1x512x32xf32>) {
      %c = stablehlo.constant dense<0> : tensor<i32>
      %1:9 = stablehlo.while(%iterArg = %arg9, %iterArg_0 = %arg10, %iterArg_1 = %arg11, %iterArg_2 = %arg12, %iterArg_3 = %arg13, %iterArg_4 = %arg14, %iterArg_5 = %arg15, %iterArg_6 = %c, %iterArg_7 = %arg8) : tensor<1x256x512xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<1x32x512xf32>, tensor<1x512x32xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<i32>, tensor<128x512xf32>
      cond {
        %c_8 = stablehlo.constant dense<1> : tensor<i32>
        %2 = stablehlo.compare LT, %iterArg_6, %c_8, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %2 : tensor<i1>
      } do {
        %2 = func.call @dynamic_index_in_dim(%iterArg, %iterArg_6) : (tensor<1x256x512xf32>, tensor<i32>) -> tensor<256x512xf32>
        %3 = func.call @dynamic_index_in_dim_0(%iterArg_0, %iterArg_6) : (tensor<1x512x256xf32>, tensor<i32>) -> tensor<512x256xf32>
        %4 = func.call @dynamic_index_in_dim_1(%iterArg_1, %iterArg_6) : (tensor<1x512x32xf32>, tensor<i32>) -> tensor<512x32xf32>
        %5 = func.call @dynamic_index_in_dim_2(%iterArg_2, %iterArg_6) : (tensor<1x32x512xf32>, tensor<i32>) -> tensor<32x512xf32>
        %6 = func.call @dynamic_index_in_dim_1(%iterArg_3, %iterArg_6) : (tensor<1x512x32xf32>, tensor<i32>) -> tensor<512x32xf32>
        %7 = func.call @dynamic_index_in_dim_0(%iterArg_4, %iterArg_6) : (tensor<1x512x256xf32>, tensor<i32>) -> tensor<512x256xf32>
        %8 = func.call @dynamic_index_in_dim_1(%iterArg_5, %iterArg_6) : (tensor<1x512x32xf32>, tensor<i32>) -> tensor<512x32xf32>
        %9 = func.call @closed_call(%iterArg_7, %2, %3, %4, %5, %6, %7, %8) : (tensor<128x512xf32>, tensor<256x512xf32>, tensor<512x256xf32>, tensor<512x32xf32>, tensor<32x512xf32>, tensor<512x32xf32>, tensor<512x256xf32>, tensor<512x32xf32>) -> tensor<128x512xf32>
        %c_8 = stablehlo.constant dense<1> : tensor<i32>
        %10 = stablehlo.add %iterArg_6, %c_8 : tensor<i32>
        stablehlo.return %iterArg, %iterArg_0, %iterArg_1, %iterArg_2, %iterArg_3, %iterArg_4, %iterArg_5, %10, %9 : tensor<1x256x512xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<1x32x512xf32>, tensor<1x512x32xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<i32>, tensor<128x512xf32>
      }
      sdy.return %1#8 : tensor<128x512xf32>
    } : (tensor<1024x512xf32>, tensor<1x2048x512xf32>, tensor<1x512x2048xf32>, tensor<1x512x256xf32>, tensor<1x256x512xf32>, tensor<1x512x256xf32>, tensor<1x512x2048xf32>, tensor<1x512x256xf32>) -> tensor<1024x512xf32>
    return %0 : tensor<1024x512xf32>
  }
  func.func private @dynamic_index_in_dim(%arg0: tensor<1x256x512xf32>, %arg1: tensor<i32>) -> tensor<256x512xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, sizes = [1, 256, 512] : (tensor<1x256x512xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x256x512xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x256x512xf32>) -> tensor<256x512xf32>
    return %1 : tensor<256x512xf32>
  }
  func.func private @dynamic_index_in_dim_0(%arg0: tensor<1x512x256xf32>, %arg1: tensor<i32>) -> tensor<512x256xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, sizes = [1, 512, 256] : (tensor<1x512x256xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x512x256xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x512x256xf32>) -> tensor<512x256xf32>
    return %1 : tensor<512x256xf32>
  }
  func.func private @dynamic_index_in_dim_1(%arg0: tensor<1x512x32xf32>, %arg1: tensor<i32>) -> tensor<512x32xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, sizes = [1, 512, 32] : (tensor<1x512x32xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x512x32xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x512x32xf32>) -> tensor<512x32xf32>
    return %1 : tensor<512x32xf32>
  }
  func.func private @dynamic_index_in_dim_2(%arg0: tensor<1x32x512xf32>, %arg1: tensor<i32>) -> tensor<32x512xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, sizes = [1, 32, 512] : (tensor<1x32x512xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x32x512xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x32x512xf32>) -> tensor<32x512xf32>
    return %1 : tensor<32x512xf32>
  }
  func.func private @closed_call(%arg0: tensor<128x512xf32>, %arg1: tensor<256x512xf32>, %arg2: tensor<512x256xf32>, %arg3: tensor<512x32xf32>, %arg4: tensor<32x512xf32>, %arg5: tensor<512x32xf32>, %arg6: tensor<512x256xf32>, %arg7: tensor<512x32xf32>) -> tensor<128x512xf32> {
    %0 = stablehlo.multiply %arg0, %arg0 : tensor<128x512xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<128x512xf32>, tensor<f32>) -> tensor<128xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<128xf32>) -> tensor<128x1xf32>
    %cst_0 = stablehlo.constant dense<5.120000e+02> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
    %4 = stablehlo.divide %2, %3 : tensor<128x1xf32>
    %cst_1 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
    %6 = stablehlo.add %4, %5 : tensor<128x1xf32>
    %7 = stablehlo.rsqrt %6 : tensor<128x1xf32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [0, 1] : (tensor<128x1xf32>) -> tensor<128x512xf32>
    %9 = stablehlo.multiply %arg0, %8 : tensor<128x512xf32>
    %10 = "stablehlo.all_gather"(%9) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<128x512xf32>) -> tensor<1024x512xf32>
    %11 = stablehlo.dot_general %10, %arg5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x32xf32>) -> tensor<1024x32xf32>
    %12 = stablehlo.dot_general %10, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x32xf32>) -> tensor<1024x32xf32>
    %13 = stablehlo.dot_general %10, %arg7, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x32xf32>) -> tensor<1024x32xf32>
    %14 = stablehlo.reshape %11 : (tensor<1024x32xf32>) -> tensor<1024x1x32xf32>
    %15 = stablehlo.reshape %12 : (tensor<1024x32xf32>) -> tensor<1024x1x32xf32>
    %16 = stablehlo.reshape %13 : (tensor<1024x32xf32>) -> tensor<1024x1x32xf32>
    %17 = stablehlo.dot_general %14, %15, batching_dims = [1] x [1], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1024x1x32xf32>, tensor<1024x1x32xf32>) -> tensor<1x1024x1024xf32>
    %cst_2 = stablehlo.constant dense<5.65685415> : tensor<f32>
    %18 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x1024x1024xf32>
    %19 = stablehlo.divide %17, %18 : tensor<1x1024x1024xf32>
    %c = stablehlo.constant dense<true> : tensor<i1>
    %20 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i1>) -> tensor<1024x1024xi1>
    %21 = call @tril(%20) : (tensor<1024x1024xi1>) -> tensor<1024x1024xi1>
    %cst_3 = stablehlo.constant dense<-1.000000e+09> : tensor<f32>
    %22 = call @_where(%21, %19, %cst_3) : (tensor<1024x1024xi1>, tensor<1x1024x1024xf32>, tensor<f32>) -> tensor<1x1024x1024xf32>
    %cst_4 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %23 = stablehlo.reduce(%22 init: %cst_4) applies stablehlo.maximum across dimensions = [2] : (tensor<1x1024x1024xf32>, tensor<f32>) -> tensor<1x1024xf32>
    %cst_5 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %24 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<1x1024xf32>
    %25 = stablehlo.maximum %24, %23 : tensor<1x1024xf32>
    %26 = stablehlo.broadcast_in_dim %25, dims = [0, 1] : (tensor<1x1024xf32>) -> tensor<1x1024x1xf32>
    %27 = stablehlo.broadcast_in_dim %26, dims = [0, 1, 2] : (tensor<1x1024x1xf32>) -> tensor<1x1024x1024xf32>
    %28 = stablehlo.subtract %22, %27 : tensor<1x1024x1024xf32>
    %29 = stablehlo.exponential %28 : tensor<1x1024x1024xf32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %30 = stablehlo.reduce(%29 init: %cst_6) applies stablehlo.add across dimensions = [2] : (tensor<1x1024x1024xf32>, tensor<f32>) -> tensor<1x1024xf32>
    %31 = stablehlo.broadcast_in_dim %30, dims = [0, 1] : (tensor<1x1024xf32>) -> tensor<1x1024x1xf32>
    %32 = stablehlo.broadcast_in_dim %31, dims = [0, 1, 2] : (tensor<1x1024x1xf32>) -> tensor<1x1024x1024xf32>
    %33 = stablehlo.divide %29, %32 : tensor<1x1024x1024xf32>
    %34 = stablehlo.dot_general %16, %33, batching_dims = [1] x [0], contracting_dims = [0] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1024x1x32xf32>, tensor<1x1024x1024xf32>) -> tensor<1x32x1024xf32>
    %35 = stablehlo.transpose %34, dims = [2, 0, 1] : (tensor<1x32x1024xf32>) -> tensor<1024x1x32xf32>
    %36 = stablehlo.reshape %35 : (tensor<1024x1x32xf32>) -> tensor<1024x32xf32>
    %37 = stablehlo.dot_general %36, %arg4, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x32xf32>, tensor<32x512xf32>) -> tensor<1024x512xf32>
    %38 = "stablehlo.reduce_scatter"(%37) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg8: tensor<f32>, %arg9: tensor<f32>):
      %58 = stablehlo.add %arg8, %arg9 : tensor<f32>
      stablehlo.return %58 : tensor<f32>
    }) : (tensor<1024x512xf32>) -> tensor<128x512xf32>
    %39 = stablehlo.add %arg0, %38 : tensor<128x512xf32>
    %40 = stablehlo.multiply %39, %39 : tensor<128x512xf32>
    %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %41 = stablehlo.reduce(%40 init: %cst_7) applies stablehlo.add across dimensions = [1] : (tensor<128x512xf32>, tensor<f32>) -> tensor<128xf32>
    %42 = stablehlo.broadcast_in_dim %41, dims = [0] : (tensor<128xf32>) -> tensor<128x1xf32>
    %cst_8 = stablehlo.constant dense<5.120000e+02> : tensor<f32>
    %43 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
    %44 = stablehlo.divide %42, %43 : tensor<128x1xf32>
    %cst_9 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %45 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
    %46 = stablehlo.add %44, %45 : tensor<128x1xf32>
    %47 = stablehlo.rsqrt %46 : tensor<128x1xf32>
    %48 = stablehlo.broadcast_in_dim %47, dims = [0, 1] : (tensor<128x1xf32>) -> tensor<128x512xf32>
    %49 = stablehlo.multiply %39, %48 : tensor<128x512xf32>
    %50 = "stablehlo.all_gather"(%49) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<128x512xf32>) -> tensor<1024x512xf32>
    %51 = stablehlo.dot_general %50, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x256xf32>) -> tensor<1024x256xf32>
    %52 = call @silu(%51) : (tensor<1024x256xf32>) -> tensor<1024x256xf32>
    %53 = stablehlo.dot_general %50, %arg6, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x256xf32>) -> tensor<1024x256xf32>
    %54 = stablehlo.multiply %52, %53 : tensor<1024x256xf32>
    %55 = stablehlo.dot_general %54, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x256xf32>, tensor<256x512xf32>) -> tensor<1024x512xf32>
    %56 = "stablehlo.reduce_scatter"(%55) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%arg8: tensor<f32>, %arg9: tensor<f32>):
      %58 = stablehlo.add %arg8, %arg9 : tensor<f32>
      stablehlo.return %58 : tensor<f32>
    }) : (tensor<1024x512xf32>) -> tensor<128x512xf32>
    %57 = stablehlo.add %39, %56 : tensor<128x512xf32>
    return %57 : tensor<128x512xf32>
  }
  func.func private @tril(%arg0: tensor<1024x1024xi1>) -> tensor<1024x1024xi1> {
    %0 = stablehlo.iota dim = 0 : tensor<1024x1024xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1024x1024xi32>
    %2 = stablehlo.add %0, %1 : tensor<1024x1024xi32>
    %3 = stablehlo.iota dim = 1 : tensor<1024x1024xi32>
    %4 = stablehlo.compare GE, %2, %3, SIGNED : (tensor<1024x1024xi32>, tensor<1024x1024xi32>) -> tensor<1024x1024xi1>
    %c_0 = stablehlo.constant dense<false> : tensor<i1>
    %5 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i1>) -> tensor<1024x1024xi1>
    %6 = stablehlo.select %4, %arg0, %5 : tensor<1024x1024xi1>, tensor<1024x1024xi1>
    return %6 : tensor<1024x1024xi1>
  }
  func.func private @_where(%arg0: tensor<1024x1024xi1>, %arg1: tensor<1x1024x1024xf32>, %arg2: tensor<f32>) -> tensor<1x1024x1024xf32> {
    %0 = stablehlo.convert %arg2 : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %arg0, dims = [1, 2] : (tensor<1024x1024xi1>) -> tensor<1x1024x1024xi1>
    %2 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<1x1024x1024xf32>
    %3 = stablehlo.select %1, %arg1, %2 : tensor<1x1024x1024xi1>, tensor<1x1024x1024xf32>
    return %3 : tensor<1x1024x1024xf32>
  }
  func.func private @silu(%arg0: tensor<1024x256xf32>) -> tensor<1024x256xf32> {
    %0 = stablehlo.negate %arg0 : tensor<1024x256xf32>
    %1 = stablehlo.exponential %0 : tensor<1024x256xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<1024x256xf32>
    %3 = stablehlo.add %2, %1 : tensor<1024x256xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<1024x256xf32>
    %5 = stablehlo.divide %4, %3 : tensor<1024x256xf32>
    %6 = stablehlo.multiply %arg0, %5 : tensor<1024x256xf32>
    return %6 : tensor<1024x256xf32>
  }
}
