"""Idempotence, determinism and round trips of the rewritten modules."""
import pathlib

import jax
import pytest

import overlap_hlo
from harness import ROOT, Program, partitioner
from test_models import SCAN_INPUTS, scanned

EXAMPLES = ROOT / "examples"
OPTIONS = [dict(threshold_mib=0), dict(threshold_mib=0, bidirectional=True, unroll=2)]
OPTION_IDS = ["default", "bidi-unroll2"]


def sources():
    prog = Program(jax.grad(lambda *a: (scanned(*a) ** 2).sum(), argnums=(0, 1, 2)),
                   (4, 2), ("x", "y"), SCAN_INPUTS, (jax.sharding.PartitionSpec("x"),) + (
                       jax.sharding.PartitionSpec(None, None, "x"),
                       jax.sharding.PartitionSpec(None, "x")))
    texts = {"transformer-layer": (EXAMPLES / "transformer_layer.mlir").read_text()}
    for shardy in (True, False):
        with partitioner(shardy):
            texts[f"scan-grad-{'shardy' if shardy else 'gspmd'}"] = \
                prog.jitted().lower(*prog.args()).as_text()
    return texts


SOURCES = sources()


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_idempotent_and_deterministic(name, options):
    once = overlap_hlo.rewrite_source(SOURCES[name], **options)
    assert overlap_hlo.rewrite_source(SOURCES[name], **options) == once   # same bytes
    assert overlap_hlo.rewrite_source(once, **options) == once            # a fixed point
    assert not any(s.applied for s in overlap_hlo.remarks(once, **options))


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_output_verifies_and_round_trips_through_bytecode(name, options):
    text = overlap_hlo.rewrite_source(SOURCES[name], **options)
    module = overlap_hlo.parse(text)
    assert module.operation.verify()
    code = overlap_hlo.rewrite_source(SOURCES[name], emit_bytecode=True, **options)
    assert overlap_hlo.rewrite_source(SOURCES[name], emit_bytecode=True, **options) == code
    assert overlap_hlo.serialize(overlap_hlo.parse(code)) == text


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_exported_round_trip_is_stable(options):
    prog = Program(scanned, (4, 2), ("x", "y"), SCAN_INPUTS, jax.sharding.PartitionSpec("x"))
    exported = jax.export.export(prog.jitted())(*prog.args())
    rewritten = overlap_hlo.rewrite_exported(exported, **options)
    restored = jax.export.deserialize(rewritten.serialize())
    assert restored.mlir_module() == rewritten.mlir_module()
    assert jax.export.deserialize(restored.serialize()).mlir_module() == restored.mlir_module()
