module @jit__lambda attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["tp"=8]> {stablehlo.mesh = {axes = [{name = "tp", size = 8 : i64}]}}
  sdy.mesh @mesh_0 = <["tp"=8]> {stablehlo.mesh = {axes = [{name = "tp", size = 8 : i64}]}}
  func.func public @main(%arg0: tensor<1024x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {}]>}, %arg1: tensor<1x2048x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}, {}]>}, %arg2: tensor<1x512x2048xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg3: tensor<1x512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg4: tensor<1x256x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}, {}]>}, %arg5: tensor<1x512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg6: tensor<1x512x2048xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}, %arg7: tensor<1x512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {"tp"}]>}) -> (tensor<1024x512xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {}]>}) {
    %0 = sdy.manual_computation(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5, %arg6, %arg7) in_shardings=[<@mesh, [{"tp"}, {}]>, <@mesh, [{}, {"tp"}, {}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {"tp"}, {}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {}, {"tp"}]>, <@mesh, [{}, {}, {"tp"}]>] out_shardings=[<@mesh, [{"tp"}, {}]>] manual_axes={"tp"} (%arg8: tensor<128x512xf32>, %arg9: tensor<1x256x512xf32>, %arg10: tensor<1x512x256xf32>, %arg11: tensor<1x512x32xf32>, %arg12: tensor<1x32x512xf32>, %arg13: tensor<1x512x32xf32>, %arg14: tensor<1x512x256xf32>, %arg15: tensor<1x512x32xf32>) {
      %c = stablehlo.constant dense<0> : tensor<i32>
      %2:9 = stablehlo.while(%iterArg = %arg9, %iterArg_0 = %arg10, %iterArg_1 = %arg11, %iterArg_2 = %arg12, %iterArg_3 = %arg13, %iterArg_4 = %arg14, %iterArg_5 = %arg15, %iterArg_6 = %c, %iterArg_7 = %arg8) : tensor<1x256x512xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<1x32x512xf32>, tensor<1x512x32xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<i32>, tensor<128x512xf32>
      cond {
        %c_8 = stablehlo.constant dense<1> : tensor<i32>
        %3 = stablehlo.compare LT, %iterArg_6, %c_8, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %3 : tensor<i1>
      } do {
        %3 = func.call @dynamic_index_in_dim(%iterArg, %iterArg_6) : (tensor<1x256x512xf32>, tensor<i32>) -> tensor<256x512xf32>
        %4 = func.call @dynamic_index_in_dim_0(%iterArg_0, %iterArg_6) : (tensor<1x512x256xf32>, tensor<i32>) -> tensor<512x256xf32>
        %5 = func.call @dynamic_index_in_dim_1(%iterArg_1, %iterArg_6) : (tensor<1x512x32xf32>, tensor<i32>) -> tensor<512x32xf32>
        %6 = func.call @dynamic_index_in_dim_2(%iterArg_2, %iterArg_6) : (tensor<1x32x512xf32>, tensor<i32>) -> tensor<32x512xf32>
        %7 = func.call @dynamic_index_in_dim_1(%iterArg_3, %iterArg_6) : (tensor<1x512x32xf32>, tensor<i32>) -> tensor<512x32xf32>
        %8 = func.call @dynamic_index_in_dim_0(%iterArg_4, %iterArg_6) : (tensor<1x512x256xf32>, tensor<i32>) -> tensor<512x256xf32>
        %9 = func.call @dynamic_index_in_dim_1(%iterArg_5, %iterArg_6) : (tensor<1x512x32xf32>, tensor<i32>) -> tensor<512x32xf32>
        %10 = stablehlo.multiply %iterArg_7, %iterArg_7 : tensor<128x512xf32>
        %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
        %11 = stablehlo.reduce(%10 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<128x512xf32>, tensor<f32>) -> tensor<128xf32>
        %12 = stablehlo.broadcast_in_dim %11, dims = [0] : (tensor<128xf32>) -> tensor<128x1xf32>
        %cst_8 = stablehlo.constant dense<5.120000e+02> : tensor<f32>
        %13 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
        %14 = stablehlo.divide %12, %13 : tensor<128x1xf32>
        %cst_9 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
        %15 = stablehlo.convert %cst_9 : tensor<f32>
        %16 = stablehlo.broadcast_in_dim %15, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
        %17 = stablehlo.add %14, %16 : tensor<128x1xf32>
        %18 = stablehlo.rsqrt %17 : tensor<128x1xf32>
        %19 = stablehlo.broadcast_in_dim %18, dims = [0, 1] : (tensor<128x1xf32>) -> tensor<128x512xf32>
        %20 = stablehlo.multiply %iterArg_7, %19 : tensor<128x512xf32>
        %21 = "stablehlo.all_gather"(%20) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "tp">]>, use_global_device_ids}> : (tensor<128x512xf32>) -> tensor<1024x512xf32>
        %22 = stablehlo.dot_general %21, %7, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x32xf32>) -> tensor<1024x32xf32>
        %23 = stablehlo.dot_general %21, %5, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x32xf32>) -> tensor<1024x32xf32>
        %24 = stablehlo.dot_general %21, %9, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x32xf32>) -> tensor<1024x32xf32>
        %25 = stablehlo.reshape %22 : (tensor<1024x32xf32>) -> tensor<1024x1x32xf32>
        %26 = stablehlo.reshape %23 : (tensor<1024x32xf32>) -> tensor<1024x1x32xf32>
        %27 = stablehlo.reshape %24 : (tensor<1024x32xf32>) -> tensor<1024x1x32xf32>
        %28 = stablehlo.dot_general %25, %26, batching_dims = [1] x [1], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1024x1x32xf32>, tensor<1024x1x32xf32>) -> tensor<1x1024x1024xf32>
        %cst_10 = stablehlo.constant dense<5.65685415> : tensor<f32>
        %29 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<1x1024x1024xf32>
        %30 = stablehlo.divide %28, %29 : tensor<1x1024x1024xf32>
        %c_11 = stablehlo.constant dense<true> : tensor<i1>
        %31 = stablehlo.broadcast_in_dim %c_11, dims = [] : (tensor<i1>) -> tensor<1024x1024xi1>
        %32 = func.call @tril(%31) : (tensor<1024x1024xi1>) -> tensor<1024x1024xi1>
        %cst_12 = stablehlo.constant dense<-1.000000e+09> : tensor<f32>
        %33 = func.call @_where(%32, %30, %cst_12) : (tensor<1024x1024xi1>, tensor<1x1024x1024xf32>, tensor<f32>) -> tensor<1x1024x1024xf32>
        %cst_13 = stablehlo.constant dense<0xFF800000> : tensor<f32>
        %34 = stablehlo.reduce(%33 init: %cst_13) applies stablehlo.maximum across dimensions = [2] : (tensor<1x1024x1024xf32>, tensor<f32>) -> tensor<1x1024xf32>
        %cst_14 = stablehlo.constant dense<0xFF800000> : tensor<f32>
        %35 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<1x1024xf32>
        %36 = stablehlo.maximum %35, %34 : tensor<1x1024xf32>
        %37 = stablehlo.broadcast_in_dim %36, dims = [0, 1] : (tensor<1x1024xf32>) -> tensor<1x1024x1xf32>
        %38 = stablehlo.broadcast_in_dim %37, dims = [0, 1, 2] : (tensor<1x1024x1xf32>) -> tensor<1x1024x1024xf32>
        %39 = stablehlo.subtract %33, %38 : tensor<1x1024x1024xf32>
        %40 = stablehlo.exponential %39 : tensor<1x1024x1024xf32>
        %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
        %41 = stablehlo.reduce(%40 init: %cst_15) applies stablehlo.add across dimensions = [2] : (tensor<1x1024x1024xf32>, tensor<f32>) -> tensor<1x1024xf32>
        %42 = stablehlo.broadcast_in_dim %41, dims = [0, 1] : (tensor<1x1024xf32>) -> tensor<1x1024x1xf32>
        %43 = stablehlo.broadcast_in_dim %42, dims = [0, 1, 2] : (tensor<1x1024x1xf32>) -> tensor<1x1024x1024xf32>
        %44 = stablehlo.divide %40, %43 : tensor<1x1024x1024xf32>
        %45 = stablehlo.dot_general %27, %44, batching_dims = [1] x [0], contracting_dims = [0] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1024x1x32xf32>, tensor<1x1024x1024xf32>) -> tensor<1x32x1024xf32>
        %46 = stablehlo.transpose %45, dims = [2, 0, 1] : (tensor<1x32x1024xf32>) -> tensor<1024x1x32xf32>
        %47 = stablehlo.reshape %46 : (tensor<1024x1x32xf32>) -> tensor<1024x32xf32>
        %48 = stablehlo.dot_general %47, %6, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x32xf32>, tensor<32x512xf32>) -> tensor<1024x512xf32>
        %49 = "stablehlo.reduce_scatter"(%48) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "tp">]>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
        ^bb0(%arg16: tensor<f32>, %arg17: tensor<f32>):
          %71 = stablehlo.add %arg16, %arg17 : tensor<f32>
          stablehlo.return %71 : tensor<f32>
        }) : (tensor<1024x512xf32>) -> tensor<128x512xf32>
        %50 = stablehlo.add %iterArg_7, %49 : tensor<128x512xf32>
        %51 = stablehlo.multiply %50, %50 : tensor<128x512xf32>
        %cst_16 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
        %52 = stablehlo.reduce(%51 init: %cst_16) applies stablehlo.add across dimensions = [1] : (tensor<128x512xf32>, tensor<f32>) -> tensor<128xf32>
        %53 = stablehlo.broadcast_in_dim %52, dims = [0] : (tensor<128xf32>) -> tensor<128x1xf32>
        %cst_17 = stablehlo.constant dense<5.120000e+02> : tensor<f32>
        %54 = stablehlo.broadcast_in_dim %cst_17, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
        %55 = stablehlo.divide %53, %54 : tensor<128x1xf32>
        %cst_18 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
        %56 = stablehlo.convert %cst_18 : tensor<f32>
        %57 = stablehlo.broadcast_in_dim %56, dims = [] : (tensor<f32>) -> tensor<128x1xf32>
        %58 = stablehlo.add %55, %57 : tensor<128x1xf32>
        %59 = stablehlo.rsqrt %58 : tensor<128x1xf32>
        %60 = stablehlo.broadcast_in_dim %59, dims = [0, 1] : (tensor<128x1xf32>) -> tensor<128x512xf32>
        %61 = stablehlo.multiply %50, %60 : tensor<128x512xf32>
        %62 = "stablehlo.all_gather"(%61) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "tp">]>, use_global_device_ids}> : (tensor<128x512xf32>) -> tensor<1024x512xf32>
        %63 = stablehlo.dot_general %62, %4, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x256xf32>) -> tensor<1024x256xf32>
        %64 = func.call @silu(%63) : (tensor<1024x256xf32>) -> tensor<1024x256xf32>
        %65 = stablehlo.dot_general %62, %8, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x512xf32>, tensor<512x256xf32>) -> tensor<1024x256xf32>
        %66 = stablehlo.multiply %64, %65 : tensor<1024x256xf32>
        %67 = stablehlo.dot_general %66, %3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1024x256xf32>, tensor<256x512xf32>) -> tensor<1024x512xf32>
        %68 = "stablehlo.reduce_scatter"(%67) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "tp">]>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
        ^bb0(%arg16: tensor<f32>, %arg17: tensor<f32>):
          %71 = stablehlo.add %arg16, %arg17 : tensor<f32>
          stablehlo.return %71 : tensor<f32>
        }) : (tensor<1024x512xf32>) -> tensor<128x512xf32>
        %69 = stablehlo.add %50, %68 : tensor<128x512xf32>
        %c_19 = stablehlo.constant dense<1> : tensor<i32>
        %70 = stablehlo.add %iterArg_6, %c_19 : tensor<i32>
        stablehlo.return %iterArg, %iterArg_0, %iterArg_1, %iterArg_2, %iterArg_3, %iterArg_4, %iterArg_5, %70, %69 : tensor<1x256x512xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<1x32x512xf32>, tensor<1x512x32xf32>, tensor<1x512x256xf32>, tensor<1x512x32xf32>, tensor<i32>, tensor<128x512xf32>
      }
      sdy.return %2#8 : tensor<128x512xf32>
    } : (tensor<1024x512xf32>, tensor<1x2048x512xf32>, tensor<1x512x2048xf32>, tensor<1x512x256xf32>, tensor<1x256x512xf32>, tensor<1x512x256xf32>, tensor<1x512x2048xf32>, tensor<1x512x256xf32>) -> tensor<1024x512xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{"tp"}, {}]> : tensor<1024x512xf32>
    return %1 : tensor<1024x512xf32>
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
