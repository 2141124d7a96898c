"""StableHLO portable artifacts (what `jax.export` stores in `mlir_module_serialized`):
read as StableHLO by overlap-opt and the API, and written back with
--emit-portable-artifact so that the bytes go back into an Exported and run."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import auto_axis_types, permutes
from overlap_hlo.api import portable_artifact_producer
from overlap_hlo.tools.overlap_opt import main


def _gather_matmul(x, w):
    return jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w


@pytest.fixture(scope="module")
def exported():
    """An Exported of all_gather -> dot over 8 devices, and its arguments."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",), **auto_axis_types(1))
    fn = jax.jit(jax.shard_map(_gather_matmul, mesh=mesh, in_specs=(P("x"), P()),
                               out_specs=P(), check_vma=False))
    rng = np.random.default_rng(0)
    x = jax.device_put(jnp.asarray(rng.standard_normal((64, 32)), jnp.float32),
                       NamedSharding(mesh, P("x")))
    w = jax.device_put(jnp.asarray(rng.standard_normal((32, 16)), jnp.float32),
                       NamedSharding(mesh, P()))
    return jax.export.export(fn)(x, w), (x, w)


def test_exported_bytes_are_a_portable_artifact(exported):
    exp, _ = exported
    assert portable_artifact_producer(exp.mlir_module_serialized).startswith("StableHLO_v")
    assert portable_artifact_producer(overlap_hlo.serialize(
        overlap_hlo.parse(exp.mlir_module()), bytecode=True)) is None  # plain bytecode


def test_portable_artifact_in_text_out(exported, tmp_path, capsys):
    exp, _ = exported
    source = tmp_path / "exported.mlirbc"
    source.write_bytes(exp.mlir_module_serialized)
    assert main([str(source), "--threshold-mib=0", "--remarks"]) == 0
    out, err = capsys.readouterr()
    assert "overlap-all-gather-matmul: rewritten" in err
    module = overlap_hlo.parse(out)
    assert permutes(module)
    assert not any(op.operation.name.startswith("vhlo.") for op in module.body.operations)


def test_round_trip_through_jax_export(exported, tmp_path, capsys):
    exp, args = exported
    source, output = tmp_path / "in.mlirbc", tmp_path / "out.mlirbc"
    source.write_bytes(exp.mlir_module_serialized)
    assert main([str(source), "--threshold-mib=0", "--emit-portable-artifact",
                 "-o", str(output)]) == 0
    payload = output.read_bytes()
    assert portable_artifact_producer(payload) is not None
    rewritten = dataclasses.replace(exp, mlir_module_serialized=payload)
    assert permutes(overlap_hlo.parse(rewritten.mlir_module()))
    want = exp.call(*args)
    got = rewritten.call(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    # And it still survives Exported serialization.
    again = jax.export.deserialize(rewritten.serialize())
    np.testing.assert_allclose(np.asarray(again.call(*args)), np.asarray(want),
                               rtol=1e-5, atol=1e-5)


def test_api_reads_and_writes_portable_artifacts(exported):
    exp, args = exported
    payload = overlap_hlo.rewrite_source(exp.mlir_module_serialized, threshold_mib=0,
                                         emit_portable_artifact=True)
    assert portable_artifact_producer(payload) is not None
    rewritten = dataclasses.replace(exp, mlir_module_serialized=payload)
    np.testing.assert_allclose(np.asarray(rewritten.call(*args)),
                               np.asarray(exp.call(*args)), rtol=1e-5, atol=1e-5)


def test_truncated_portable_artifact_is_one_error(exported, tmp_path, capsys):
    exp, _ = exported
    data = exp.mlir_module_serialized
    source = tmp_path / "cut.mlirbc"
    source.write_bytes(data[: len(data) // 2])
    output = tmp_path / "out.mlir"
    assert main([str(source), "-o", str(output)]) == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert err.startswith(f"{source}: error: cannot read this StableHLO portable artifact "
                          f"(written by {portable_artifact_producer(data)}")
    assert not output.exists()
    with pytest.raises(overlap_hlo.InputError, match="portable artifact"):
        overlap_hlo.parse(data[: len(data) // 2])


@pytest.mark.parametrize("flags", [["--emit-portable-artifact", "--emit-bytecode"],
                                   ["--emit-portable-artifact", "--split-input-file"]])
def test_portable_artifact_flag_combinations_are_usage_errors(flags, capsys):
    assert main(flags) == 2
    assert "cannot be combined with" in capsys.readouterr().err
