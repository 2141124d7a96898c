"""The report's compile-checked choice: with the slice's profile deciding, the module
kept is the candidate the compiled schedule predicts fastest, or the original when
none is faster. Ratios of the compiler's estimates only; no timings."""
import json

import pytest

from harness import ROOT, permutes, require_libtpu  # noqa: E402

require_libtpu()

from test_tpu import lowered_mlp  # noqa: E402

import overlap_hlo  # noqa: E402
from overlap_hlo.ir.unsupported import Kind  # noqa: E402
from overlap_hlo.targets import report  # noqa: E402
from overlap_hlo.targets.report_rows import SiteRow  # noqa: E402
from overlap_hlo.tools import report as report_cli  # noqa: E402

EXAMPLE = ROOT / "examples" / "tp_mlp.mlir"     # small: every rewrite is slower on TPU


def row(where, before_us: float, after_us: float) -> SiteRow:
    """A rewritten site's row with these times (nothing else of it is read here)."""
    return SiteRow(str(where), "p", True, 1, 0, 0, 0, 0.0, 0.0, before_us, after_us, 0.0)


@pytest.mark.parametrize("topology", ["v5p:2x2x2", "v5e:2x4", "v4:2x2x1"])
def test_the_fastest_candidate_is_kept_and_never_slower_than_the_original(topology):
    """At these small dims a rewrite pays on v4:2x2x1 (on the 2x2x2 cube the original's
    collectives use three links into each chip, a ring two: there it does not)."""
    rep = report.build(lowered_mlp(topology), topology)
    assert list(rep.candidates)[:len(report.CANDIDATES)] == list(report.CANDIDATES)
    assert all(label in report.CANDIDATES or label.startswith(report.PER_PASS)
               or "slower site(s) kept" in label for label in rep.candidates)
    assert len(set(rep.candidates.values())) > 1        # the candidates differ
    best = min(rep.candidates, key=rep.candidates.get)
    if rep.candidates[best] < rep.original_us * (1 - report.SLOWER_TOLERANCE):
        assert rep.candidates[rep.chosen] <= rep.candidates[best] * (1 + report.SLOWER_TOLERANCE)
        assert rep.rewritten_us == rep.candidates[rep.chosen]
        assert permutes(rep.module) and any(row.applied for row in rep.sites)
    else:
        assert rep.chosen == report.ORIGINAL
        assert rep.rewritten is rep.original and not permutes(rep.module)
    assert rep.chosen != report.ORIGINAL or topology != "v4:2x2x1"   # a rewrite pays
    assert rep.rewritten_us <= rep.original_us
    assert f"chosen by the compiled schedule: {rep.chosen} (candidates: " in rep.format()


def test_each_pass_gets_the_form_fastest_for_its_sites_or_stays(monkeypatch):
    """Where the candidates disagree per pass, a fifth gives each ring pass the options
    of the candidate whose sites of that pass were fastest, or leaves the pass out of
    the pipeline where the original's sites were faster (the times of each site per
    candidate stand in for compiled schedules here)."""
    gather, scatter = "overlap-all-gather-matmul", "overlap-matmul-reduce-scatter"
    times = {"per site": {gather: 90, scatter: 70}, "two": {gather: 50, scatter: 80},
             "one": {gather: 60, scatter: 75}}
    original = {gather: 100, scatter: 60}

    class Row:
        def __init__(self, location, pattern, label):
            self.pattern, self.after_us = pattern, times[label][pattern]
            self.location, self.before_us = location, original[pattern]

    monkeypatch.setattr(report, "_row", lambda location, group, orig, analysis, name, **_:
                        Row(location, group[0].pattern, analysis))
    monkeypatch.setattr(report, "CANDIDATES", {"per site": {}, "two": {
        "threshold_mib": 0, "bidirectional": True}, "one": {"threshold_mib": 0}})

    class Site:
        def __init__(self, pattern):
            self.pattern, self.location, self.where, self.dots = pattern, pattern, pattern, ()

    sites = [Site(gather), Site(scatter)]
    tried = {label: report._Candidate(None, sites, label) for label in times}
    per_pass = report._per_pass(report.DEFAULT_PIPELINE, tried, None, None)
    assert per_pass.pipeline == (
        "builtin.module(overlap-matmul-all-reduce,overlap-sequence-parallel,"
        f"{gather}{{threshold-mib=0 bidirectional=true}},overlap-all-to-all-matmul,"
        "canonicalize,cse,overlap-stack-in-place)")
    assert per_pass.unchanged == {scatter: (60, 70)}
    times["two"][scatter] = 55                    # one candidate fastest everywhere
    assert report._per_pass(report.DEFAULT_PIPELINE, tried, None, None) is None
    given = report.DEFAULT_PIPELINE.replace(gather, gather + "{unroll=1}")
    times["two"][scatter] = 80
    assert report._per_pass(given, tried, None, None) is None   # options of its own


@pytest.mark.parametrize("kept_us, chosen", [(90.0, "two, its 1 slower site(s) kept"),
                                             (105.0, "two")])
def test_sites_whose_rows_are_slower_are_tried_unchanged(kept_us, chosen):
    """The fastest candidate is built again with the sites its rows found slower named
    in keep-sites; that candidate is kept when its compiled schedule is faster, and
    the search stops when it is not (rows and totals stand in for compiled ones)."""
    from overlap_hlo.ir.locations import Where
    from overlap_hlo.rewrite.site import Site
    from overlap_hlo.targets import candidates

    class Analysis:
        def __init__(self, total_us):
            self.total_us, self.temp_bytes = total_us, 0

    slow, fast = Where("model.py", 1, 1), Where("model.py", 2, 2)

    built = []

    def rewritten(options, text):
        built.append((options, text))
        keep = options.get("keep_sites", "")
        sites = [Site(slow, "p", applied=str(slow) not in keep,
                      kind=Kind.NAMED_KEPT if str(slow) in keep else Kind.NONE),
                 Site(fast, "p", applied=True)]
        return report._Candidate(None, sites, Analysis(kept_us if keep else 100.0))

    rows = {str(slow): row(slow, 100.0, 120.0), str(fast): row(fast, 80.0, 50.0)}
    tried = {"two": rewritten({"bidirectional": True}, "PIPE")}
    times = {"two": 100.0}
    settings = {"two": ({"bidirectional": True}, "PIPE", list)}
    label = candidates._keep_slower_sites(
        "two", tried, times, settings, rewritten, None, None,
        lambda location, group, orig, analysis, name, **_: rows[location])
    assert label == chosen
    kept = "two, its 1 slower site(s) kept"
    assert built[1] == ({"bidirectional": True, "keep_sites": "model.py:1:1"}, "PIPE")
    assert times[kept] == kept_us and len(built) == 2    # one round: nothing else slower
    site = tried[kept].sites[0]
    assert not site.applied and site.kind is Kind.KEPT
    assert "its row took 120.0 us against 100.0 us" in site.reason
    assert tried[kept].sites[1].applied


def test_slower_sites_are_left_from_each_candidate_about_as_fast(monkeypatch):
    """Two candidates within 0.5%: the one with fewer temporaries has no slower site,
    the other has one, and leaving it makes that candidate 10% faster. Its keep-sites
    variant is built and kept (fsdp_tp on h100:8, 2026-12-07: the first search kept
    the original, missing 46033 us against 46608)."""
    from overlap_hlo.ir.locations import Where
    from overlap_hlo.rewrite.site import Site
    from overlap_hlo.targets import candidates

    class Analysis:
        def __init__(self, total_us, temp_bytes):
            self.total_us, self.temp_bytes = total_us, temp_bytes

    slow, fast = Where("model.py", 1, 1), Where("model.py", 2, 2)
    built = []

    def rewritten(options, text):
        built.append(options)
        kept = str(slow) in options.get("keep_sites", "")
        sites = [Site(slow, "p", applied=not kept,
                      kind=Kind.NAMED_KEPT if kept else Kind.NONE),
                 Site(fast, "p", applied=True)]
        total = {"one": 100.0, "two": 90.0 if kept else 100.2}[options["form"]]
        return report._Candidate(None, sites, Analysis(total, 40 if options["form"] == "one"
                                                       else 80))

    def row_of(location, group, original, analysis, name, **_):
        slower = analysis.total_us == 100.2 and location == str(slow)
        return row(location, 100.0, 120.0 if slower else 90.0)

    monkeypatch.setattr(candidates, "fastest_per_pass", lambda *a, **k: None)
    forms = {"one": {"form": "one"}, "two": {"form": "two"}}
    chosen, times, result = candidates.choose({}, rewritten, "PIPE", None,
                                              Analysis(200.0, 0), None, "TPU",
                                              forms=forms, row_of=row_of)
    assert chosen == "two, its 1 slower site(s) kept" and times[chosen] == 90.0
    assert len(built) == 3 and built[2] == {"form": "two", "keep_sites": "model.py:1:1"}
    assert not result.sites[0].applied and result.sites[1].applied


def test_of_candidates_equally_fast_the_one_with_fewest_temporaries_is_kept():
    """A tie (within 0.5%) goes to the smaller temporaries: one stream where two streams
    gain nothing (Q/K/V at 70B on h100:8 under jax 0.10.2: 341 us either way, 40
    against 80 MiB)."""
    class Analysis:
        def __init__(self, temp_bytes):
            self.temp_bytes = temp_bytes

    tried = {label: report._Candidate(None, [], Analysis(temp)) for label, temp in
             [("two", 80), ("one", 40), ("slow", 10)]}
    assert report._fastest(tried, {"two": 341.0, "one": 341.5, "slow": 400.0}) == "one"
    assert report._fastest(tried, {"two": 300.0, "one": 341.0, "slow": 400.0}) == "two"


def test_the_original_is_kept_when_every_candidate_is_slower(monkeypatch):
    """Rewritten whatever the model says (threshold 0), the small example is slower on
    TPU: the report keeps the original and says why for each site."""
    monkeypatch.setattr(report, "CANDIDATES", {"every site": {"threshold_mib": 0}})
    rep = report.build(EXAMPLE.read_text(), "v5e:2x4")
    assert rep.candidates["every site"] > rep.original_us
    assert rep.chosen == report.ORIGINAL
    assert rep.rewritten is rep.original and not permutes(rep.module)
    assert rep.sites and all(not row.applied and row.left_because == Kind.KEPT
                             and row.after_us == row.before_us for row in rep.sites)
    verdict = rep.verdict()
    assert "predicted no faster" in verdict and f"({Kind.KEPT})" in verdict


def test_a_threshold_or_a_form_given_is_built_as_asked():
    """No check: a threshold decides by size, a form given is the one built."""
    rep = report.build(EXAMPLE.read_text(), "v5e:2x4", threshold_mib=0)
    assert rep.chosen == "" and rep.candidates == {}
    assert permutes(rep.module) and rep.rewritten_us > rep.original_us   # as asked
    rep = report.build(EXAMPLE.read_text(), "v5e:2x4", bidirectional=True)
    assert rep.chosen == "" and rep.candidates == {}


def test_cli_json_names_the_choice(tmp_path):
    out = tmp_path / "report.json"
    assert report_cli.main([str(EXAMPLE), "--tpu=v5e:2x4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["chosen"] == report.ORIGINAL
    assert set(report.CANDIDATES) <= set(data["candidates"]) <= set(report.CANDIDATES) | {
        report.PER_PASS}
    assert data["rewritten_us"] == data["original_us"]


def test_cli_writes_the_module_it_kept(tmp_path):
    """-o writes the module kept: here the original (every candidate is slower), which
    still parses and has its collectives; with a threshold, the rewritten one."""
    kept, rewritten = tmp_path / "kept.mlir", tmp_path / "rewritten.mlir"
    assert report_cli.main([str(EXAMPLE), "--tpu=v5e:2x4", "-o", str(kept)]) == 0
    assert report_cli.main([str(EXAMPLE), "--tpu=v5e:2x4", "--threshold-mib=0",
                            "-o", str(rewritten)]) == 0
    module = overlap_hlo.parse(kept.read_text())
    assert not permutes(module) and "stablehlo.all_gather" in kept.read_text()
    assert permutes(overlap_hlo.parse(rewritten.read_text()))
    assert "loc(" in rewritten.read_text()       # locations kept, for overlap-report again


def test_rewrite_lowered_compiles_the_module_the_schedule_keeps():
    """From JAX: the Lowered runs the module the report chose (a rewrite pays on
    v4:2x2x1) and compiles ahead of time for the slice; where no site is rewritten the
    Lowered is the user's own."""
    lowered = lowered_mlp("v4:2x2x1")
    rewritten, rep = report.rewrite_lowered(lowered, "v4:2x2x1")
    assert rep.chosen != report.ORIGINAL and rewritten is not lowered
    module = rewritten.compiler_ir("stablehlo")
    assert permutes(module) and permutes(module) == permutes(rep.module)
    assert not permutes(lowered.compiler_ir("stablehlo"))   # JAX's own lowering untouched
    hlo = rewritten.compile().as_text()
    gathers_kept = any(not row.applied for row in rep.sites
                       if row.pattern == "overlap-all-gather-matmul")
    assert "collective-permute" in hlo and ("all-gather(" in hlo) == gathers_kept
    original = lowered_mlp("v5e:2x4")   # a threshold no site reaches: none rewritten
    kept, rep = report.rewrite_lowered(original, "v5e:2x4", threshold_mib=1e6)
    assert not any(row.applied for row in rep.sites) and kept is original
