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


def _report(chosen: str, applied: bool):
    from overlap_hlo.targets.report import Report, SiteRow

    row = SiteRow("model.mlir:3:5", "overlap-all-gather-matmul", applied, 1, 0, 0, 0,
                  0.0, 1.0, 2.0, 1.0, 1.0)
    return Report("v5e:2x4", "tpu-v5e", 1.5, {}, [row], "before", "after", 0, 0,
                  chosen=chosen)


@pytest.mark.parametrize("chosen, applied, kept", [
    ("per site", True, "rewritten (per site)"),
    ("", True, "rewritten"),                     # a threshold decided: no compiled check
    ("the original", False, "the original, kept (no rewritten candidate was faster)"),
    ("", False, "the original, kept (no site rewritten)"),
])
def test_the_timeline_names_what_was_kept(chosen, applied, kept):
    """The lower panel of --timeline is named by what the report chose, not
    "rewritten" when the original was kept."""
    rep = _report(chosen, applied)
    assert rep.kept == kept
    assert rep.timeline_panels() == {"original": "before", kept: "after"}
