"""An auto-sharded jax.jit holds no collective (XLA's partitioner adds them when it
compiles): the rewrite changes nothing and says why, from Python and on the command
line; a module with collectives, or on one device, gets no such note."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import ROOT, auto_axis_types


def auto_sharded():
    mesh = jax.make_mesh((8,), ("x",), **auto_axis_types(1))
    args = [jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("x"))),
            jax.ShapeDtypeStruct((32, 16), jnp.float32, sharding=NamedSharding(mesh, P()))]
    return jax.jit(lambda x, w: x @ w).lower(*args)


def test_the_api_warns_that_there_is_nothing_to_overlap():
    with pytest.warns(overlap_hlo.NoCollectives, match="holds no collective to overlap"):
        overlap_hlo.rewrite_lowered(auto_sharded(), threshold_mib=0)


def test_overlap_opt_says_so_without_remarks(tmp_path):
    source = tmp_path / "auto.mlir"
    source.write_text(auto_sharded().as_text())
    done = subprocess.run([sys.executable, "-m", "overlap_hlo.tools.overlap_opt", str(source),
                           "-o", str(tmp_path / "out.mlir")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "overlap-opt: note: the module runs on 8 devices but holds no collective" \
        in done.stderr


def test_no_note_for_modules_with_collectives_or_one_device():
    example = overlap_hlo.parse((ROOT / "examples" / "tp_mlp.mlir").read_text())
    assert overlap_hlo.no_collectives_note(example, []) is None
    single = overlap_hlo.parse("module { func.func @f() { return } }")
    assert overlap_hlo.no_collectives_note(single, []) is None
    odd = overlap_hlo.parse('module attributes {mhlo.num_partitions = "8"} {}')
    assert overlap_hlo.no_collectives_note(odd, []) is None      # not an integer: no claim
