"""How the TPU report finds a site's instructions: an HLO location ("file:line:col",
the parsed input spelled "-" or "") against a site's or a dot's source position."""
import pytest

from overlap_hlo.ir.locations import Where
from overlap_hlo.targets.report import _at


@pytest.mark.parametrize("hlo, where, input_name, found", [
    ("model.mlir:12:5", Where("model.mlir", 12, 5), None, True),
    ("-:12:5", Where("model.mlir", 12, 5), "model.mlir", True),    # parsed from text
    (":12:5", Where("model.mlir", 12, 5), "model.mlir", True),
    ("-:12:5", Where("-", 12, 5), None, True),
    ("-:12:5", Where("other.mlir", 12, 5), "model.mlir", False),   # another file
    ("model.mlir:12:6", Where("model.mlir", 12, 5), None, False),  # another column
    ("c:/x/model.mlir:3:1", Where("c:/x/model.mlir", 3, 1), None, True),  # colons in the name
    ("", Where("model.mlir"), None, False),                         # no position
    ("model.mlir", Where("model.mlir"), None, False),
])
def test_an_hlo_location_is_a_source_position(hlo, where, input_name, found):
    assert _at(hlo, where, input_name) == found
