"""Every MLIR binding the code names exists in the installed jaxlib (CI runs this under
jaxlib 0.10.2 and 0.12): `ir.RankedTensorType.isinstance`, gone in both, had sent every
site under a branch on a shard_map input to the internal-error path."""
import ast
from pathlib import Path

import pytest
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"ir": ir, "stablehlo": stablehlo, "sdy": sdy}
SOURCES = sorted(p for folder in ("overlap_hlo", "passes", "tools")
                 for p in (ROOT / folder).rglob("*.py"))


def binding_chains(path: Path) -> set[tuple[str, ...]]:
    """("stablehlo", "ChannelHandle", "isinstance")-like chains of attribute reads on
    the binding modules whose first name is a class (capitalised) in `path`."""
    chains = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        names, inner = [], node
        while isinstance(inner, ast.Attribute):
            names.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in MODULES and names[-1][:1].isupper():
            chains.add((inner.id, *reversed(names)))
    return chains


CHAINS = sorted({chain for path in SOURCES for chain in binding_chains(path)})


def test_the_scan_finds_the_bindings():
    assert ("stablehlo", "ChannelHandle", "isinstance") in CHAINS
    assert ("ir", "RankedTensorType", "get") in CHAINS


@pytest.mark.parametrize("chain", CHAINS, ids=".".join)
def test_binding_exists(chain):
    value = MODULES[chain[0]]
    for name in chain[1:]:
        try:
            value = getattr(value, name)
        except AttributeError:
            pytest.fail(f"{'.'.join(chain)}: no '{name}' in this jaxlib")
        except ValueError:   # a property that needs a context (InsertionPoint.current)
            return
