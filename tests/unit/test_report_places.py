"""How the TPU report finds a site's instructions: an HLO location ("file:line:col",
the parsed input spelled "-" or "") against a site's or a dot's source position."""
import dataclasses

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
    assert _at(hlo, {where}, input_name) == found


def _report(chosen: str, applied: bool, rewritten: int = 0):
    from overlap_hlo.targets.report import Report, SiteRow

    row = SiteRow("model.mlir:3:5", "overlap-all-gather-matmul", applied, 2, 0, 0, 0,
                  0.0, 1.0, 2.0, 1.0, 1.0, rewritten=rewritten)
    return Report("v5e:2x4", "tpu-v5e", 1.5, {}, [row], "before", "after", 0, 0,
                  chosen=chosen)


@pytest.mark.parametrize("chosen, applied, rewritten, kept", [
    ("per site", True, 2, "rewritten (per site)"),
    ("", True, 2, "rewritten"),                  # a threshold decided: no compiled check
    ("the original", False, 0, "the original, kept (no rewritten candidate was faster)"),
    ("", False, 0, "the original, kept (no site rewritten)"),
    # One of the row's two records rewritten (a forward site; its backward one left):
    ("per site", False, 1, "rewritten (per site)"),
])
def test_the_timeline_names_what_was_kept(chosen, applied, rewritten, kept):
    """The lower panel of --timeline is named by what the report chose, not
    "rewritten" when the original was kept."""
    rep = _report(chosen, applied, rewritten)
    assert rep.kept == kept
    assert rep.any_rewritten == (rewritten > 0)
    assert rep.timeline_panels() == {"original": "before", kept: "after"}


def _analysis(names_by_location: dict, compute_by_name: dict):
    from overlap_hlo.targets.schedule import Analysis

    class Fake(Analysis):   # every instruction a dot: no compiled module needed
        def compute_by_category(self, names=None):
            return {"dots": sum(us for name, us in self.compute_by_name.items()
                                if names is None or name in names)}

    total = sum(compute_by_name.values())
    return Fake(total_us=total, compute_us=total, compute_by_name=compute_by_name,
                names_by_location=names_by_location)


def _site(line: int, dot_lines: tuple[int, ...]):
    from overlap_hlo.rewrite.site import Site
    return Site(Where("m.py", line, 1), "overlap-all-gather-matmul", True,
                dots=tuple(Where("m.py", d, 1) for d in dot_lines))


def test_a_row_holds_the_compute_at_its_own_dots_on_both_sides():
    """A ring moves its dots from their own positions to the site's: a row counts the
    compute at both on both sides, so a site whose ring computes what its dots did is
    not called slower; a position two sites name is counted by neither, and the rows
    and what is outside them add up to the module."""
    from overlap_hlo.targets.report_rows import outside_sites, site_rows

    original = _analysis({"m.py:2:1": {"dot_a"}, "m.py:6:1": {"dot_b", "dot_b_grad"},
                          "m.py:9:1": {"attention"}},
                         {"dot_a": 10.0, "dot_b": 20.0, "dot_b_grad": 5.0, "attention": 7.0})
    rewritten = _analysis({"m.py:1:1": {"ring_a"}, "m.py:5:1": {"ring_b"},
                           "m.py:6:1": {"dot_b_grad"}, "m.py:9:1": {"attention"}},
                          {"ring_a": 10.0, "ring_b": 20.0, "dot_b_grad": 5.0,
                           "attention": 7.0})
    a, b = site_rows([_site(1, (2,)), _site(5, (6,))], original, rewritten, None)
    assert (a.original_compute_us, a.rewritten_compute_us) == (10.0, 10.0)
    assert (b.original_compute_us, b.rewritten_compute_us) == (25.0, 25.0)
    assert not a.got_slower and not b.got_slower
    assert outside_sites([a, b], original, rewritten)["compute_us"] == [7.0, 7.0]

    a, b = site_rows([_site(1, (2,)), _site(5, (6, 2))], original, rewritten, None)
    assert (a.original_compute_us, b.original_compute_us) == (0.0, 25.0)   # m.py:2:1: shared
    assert outside_sites([a, b], original, rewritten)["compute_us"] == [17.0, 7.0]


def _with_gathers(analysis, exposed: dict, beside: dict):
    """`analysis` with all-gathers at `exposed`'s positions (position -> exposed us),
    the matmuls beside the one at a position `beside` names (name -> HLO location)."""
    from overlap_hlo.targets.schedule import Collective

    class Place(str):
        def format(self):
            return str(self)

    class Matmul:
        def __init__(self, name, location):
            self.name, self.location = name, Place(location)

    analysis.collectives = [Collective(f"ag {at}", "all-gather", at, 1, us, 1, us)
                            for at, us in exposed.items()]
    analysis.matmuls_beside = lambda c: [Matmul(n, loc) for n, loc in
                                         beside.get(c.location, {}).items()]
    return analysis


@pytest.mark.parametrize("ring_us, slower", [(15.0, True), (9.0, False)])
def test_rows_sharing_a_dot_are_judged_together(ring_us, slower):
    """Two sites name one dot (m.py:2:1): the sequence gather at m.py:1:1, rewritten,
    and an FSDP weight's gather at m.py:5:1, left, which holds the dot in the original
    (the matmul beside its collective; fsdp_tp on v6e:2x4). The ring moves the dot's
    compute to the first row: alone that row looks slower however fast the ring, so
    the two rows are one group, judged by their sums; the notes name the group once."""
    from overlap_hlo.targets.report import Report
    from overlap_hlo.targets.report_rows import site_rows

    original = _with_gathers(_analysis({"m.py:2:1": {"dot"}, "m.py:9:1": {"attention"}},
                                       {"dot": 10.0, "attention": 7.0}),
                             {"m.py:1:1": 4.0, "m.py:5:1": 3.0},
                             {"m.py:5:1": {"dot": "m.py:2:1"}})
    rewritten = _with_gathers(_analysis({"m.py:1:1": {"ring"}, "m.py:9:1": {"attention"}},
                                        {"ring": ring_us, "attention": 7.0}),
                              {"m.py:5:1": 3.0}, {"m.py:5:1": {"ring": "m.py:1:1"}})
    left = dataclasses.replace(_site(5, (2,)), applied=False)
    a, b = site_rows([_site(1, (2,)), left], original, rewritten, None)
    assert (a.before_us, a.after_us) == (4.0, ring_us) and a.got_slower
    assert (b.before_us, b.after_us) == (13.0, 3.0)
    assert a.group is b.group and a.group.locations == ["m.py:1:1", "m.py:5:1"]
    assert (a.group.before_us, a.group.after_us) == (17.0, ring_us + 3.0)
    assert a.slower == slower and not b.slower and not b.moved_slower
    rep = Report("v5e:2x4", "tpu-v5e", 1.5, {}, [a, b], original, rewritten, 0, 0)
    group = f"group {17.0 / (ring_us + 3.0):.2f}x" + (" SLOWER" if slower else "")
    table = rep.format().splitlines()
    assert f"{4.0 / ring_us:.2f}x, {group}" in table[1] and "4.33x, group" in table[2]
    notes = [line for line in rep.format().splitlines() if "predicted slower (" in line]
    assert notes == ([f"m.py:1:1, m.py:5:1 (their sites share dots): predicted slower "
                      f"(17.0 -> {ring_us + 3.0:.1f} us): dots +{ring_us - 10.0:.1f} us"]
                     if slower else [])
