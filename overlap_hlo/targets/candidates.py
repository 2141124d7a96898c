"""The option sets the report compiles when the slice's profile decides, and the choice
among their compiled schedules: the fastest, each pass its fastest form, or the
original (`choose`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Callable

from jaxlib.mlir import ir

from overlap_hlo import api
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.pipeline import (Element, parse_pipeline, pipeline_text,
                                          registered_passes)
from overlap_hlo.targets.report_rows import SLOWER_TOLERANCE, _row, site_rows
from overlap_hlo.targets.schedule import Analysis


# When the slice's profile decides (no threshold-mib, no form given), the report compiles
# these option sets and keeps the module whose schedule is predicted fastest, or the
# original when none is faster: the cost model prices sites one at a time, the compiled
# schedule sees what they do to each other (a weight no longer prefetched into fast
# memory beside a ring). They are made from the options' `tried` declarations
# (`declared_candidates`): the first is the cost model's own choice (its sites' records
# say what was decided when the original is kept); then every site in two streams and
# one; then the TPU summing rings the cost model otherwise leaves unchanged (FSDP), with
# the own shard first or last (neither is faster everywhere). A module one of them leaves
# as another made it is compiled once.
PER_SITE = "per site"


def _tried_options() -> dict[str, dataclasses.Field]:
    """Python name -> field of each option some registered pass declares `tried`, in
    declaration order (the first pass to declare it)."""
    found: dict[str, dataclasses.Field] = {}
    for cls in registered_passes().values():
        for f in cls.options().values():
            if "tried" in f.metadata:
                found.setdefault(f.name, f)
    return found


def declared_candidates() -> dict[str, dict]:
    """Label -> options: PER_SITE (every option its default), a base with each tried
    option at its first value, then the base with each further value of one option at
    a time (and the values it is `tried_with`); a label names the values set, each by
    its declared label."""
    fields = _tried_options()
    labels = {(name, value): label for name, f in fields.items()
              for value, label in f.metadata["tried"]}
    base = {name: f.metadata["tried"][0][0] for name, f in fields.items()
            if f.metadata["tried"][0] != (f.default, "")}

    def label_of(options: dict) -> str:
        return ", ".join(labels[item] for item in options.items() if labels[item])

    forms = {PER_SITE: {}, label_of(base): base}
    for name, f in fields.items():
        for value, _ in f.metadata["tried"][1:]:
            options = dict(base, **f.metadata.get("tried_with", {}))
            options[name] = value
            forms[label_of(options)] = options
    return forms


def tried_on(options: dict, platform: str) -> bool:
    """Whether a candidate's `options` are tried for `platform` ("TPU", "GPU")."""
    fields = _tried_options()
    return all(platform in fields[name].metadata.get("tried_on", (platform,))
               for name in options if name in fields)


CANDIDATES = declared_candidates()
ORIGINAL = "the original"
# A sixth candidate, built when the five disagree on which is fastest for different
# passes: each ring pass with the options of the candidate whose sites of that pass
# took least time in the compiled schedules, or left out of the pipeline where the
# original's sites took less (a gather ring in two streams beside the original scatter).
PER_PASS = "each pass its fastest form"
# Rounds of the search that compiles the fastest candidate again with the sites whose
# rows it found slower left unchanged (keep-sites), stopping when that is not faster.
KEEP_ROUNDS = 2


def profile_decides(options: dict) -> bool:
    """Whether the cost model decides each site and its form (tpu_options given)."""
    return options.get("threshold_mib") is None and options.get("bidirectional") is None


@dataclass
class _Candidate:
    module: ir.Module
    sites: list
    analysis: Analysis
    # The options and pipeline that rewrote `module` (None: the original, not rewritten).
    built_with: tuple[dict, str] | None = None


@dataclass(frozen=True)
class _PerPass:
    """The pipeline of the PER_PASS candidate, and the passes it leaves out, each with
    its sites' time in the original and in the fastest of the forms."""

    pipeline: str
    unchanged: dict[str, tuple[float, float]]   # pass -> (original us, fastest form us)


def _close(tried: dict[str, _Candidate], times: dict[str, float]) -> list[str]:
    """The candidates within SLOWER_TOLERANCE of the fastest."""
    best = min(times[label] for label in tried)
    return [label for label in tried if times[label] <= best * (1 + SLOWER_TOLERANCE)]


def _fastest(tried: dict[str, _Candidate], times: dict[str, float]) -> str:
    """The candidate predicted fastest; of those within SLOWER_TOLERANCE of it, the one
    with the fewest temporaries (one stream where two streams gain nothing)."""
    return min(_close(tried, times),
               key=lambda label: (tried[label].analysis.temp_bytes, times[label]))


def fastest_per_pass(pipeline: str, tried: dict[str, _Candidate], original: Analysis,
                     input_name: str | None, *, forms: dict[str, dict] = CANDIDATES,
                     row_of: Callable = _row) -> _PerPass | None:
    """`pipeline` with each ring pass given the options of the candidate whose sites of
    that pass took least time in their compiled schedules (a tie: the first listed),
    or left out where the original's sites of that pass took less than every form's;
    None when one candidate (or the original) is fastest for every pass, or when the
    pipeline nests anchors or gives a ring pass options of its own."""
    # pass -> candidate (the original last) -> location -> that site's time
    sites: dict[str, dict[str, dict[str, float]]] = {}
    first: dict[int, str] = {}                  # one label per distinct module
    for label, candidate in tried.items():
        if first.setdefault(id(candidate.analysis), label) != label:
            continue
        for row in site_rows(candidate.sites, original, candidate.analysis, input_name,
                             row_of):
            per = sites.setdefault(row.pattern, {})
            per.setdefault(label, {})[row.location] = row.after_us
            per.setdefault(ORIGINAL, {})[row.location] = row.before_us
    times: dict[str, dict[str, float]] = {}
    for name, per in sites.items():
        per[ORIGINAL] = per.pop(ORIGINAL)       # last: chosen only when faster
        if len({frozenset(at) for at in per.values()}) != 1 or len(per) != len(first) + 1:
            return None     # the candidates' pipelines met different sites of this pass
        times[name] = {label: sum(at.values()) for label, at in per.items()}
    best = {name: min(per, key=per.get) for name, per in times.items()}
    if len(set(best.values())) < 2:
        return None
    elements, passes = parse_pipeline(pipeline), registered_passes()
    if any(e.nested is not None or (e.name in best and e.options) for e in elements):
        return None
    kept, unchanged = [], {}
    for element in elements:
        choice = best.get(element.name)
        if choice == ORIGINAL:   # left out: its sites stay as they are
            per = times[element.name]
            unchanged[element.name] = (per[ORIGINAL], min(v for k, v in per.items()
                                                         if k != ORIGINAL))
            continue
        cls = passes.get(element.name)
        known = cls.options() if cls else {}
        extra = {key.replace("_", "-"): cls.option_text(key, value)
                 for key, value in api.pass_defaults(forms.get(choice, {})).items()
                 if key.replace("_", "-") in known}
        kept.append(Element.of(element.name, extra) if extra else element)
    return _PerPass(pipeline_text(kept), unchanged)


def _with_passes_left_out(sites: list, first: list, per_pass: _PerPass, pipeline: str):
    """The PER_PASS module's `sites` with, where each pass it left out would have run,
    that pass's sites as the first candidate (the cost model's choice) met them; those
    no pass reported (coverage's) last."""
    order = {element.name: i for i, element in enumerate(parse_pipeline(pipeline))}
    result = list(sites)
    for name in sorted(per_pass.unchanged, key=order.get):
        met = {site.location for site in result if site.pattern == name}
        own = [site for site in first if site.pattern == name and site.location not in met]
        at = next((i for i, site in enumerate(result) if site.kind is Kind.NOT_HANDLED
                   or order.get(site.pattern, -1) > order[name]), len(result))
        handled = [site for site in own if site.kind is not Kind.NOT_HANDLED]
        result[at:at] = handled
        result += [site for site in own if site.kind is Kind.NOT_HANDLED]
    return result


def _left_by_pass(site, per_pass: _PerPass):
    """A site of a pass the PER_PASS candidate leaves unchanged, saying why."""
    if site.pattern not in per_pass.unchanged:
        return site
    before, after = per_pass.unchanged[site.pattern]
    return replace(site, applied=False, kind=Kind.KEPT, rule="",
                   reason=f"{Kind.KEPT}: every form of this pass's sites is slower than the "
                          f"original ({after:.1f} us against {before:.1f} us)")


def _kept(site, best_us: float, original_us: float):
    """A rewritten site of a module the check did not keep, as left unchanged."""
    if not site.applied:
        return site
    return replace(site, applied=False, kind=Kind.KEPT, rule="",
                   reason=f"{Kind.KEPT}: no candidate is faster than the original "
                          f"({best_us:.1f} us against {original_us:.1f} us)")


def _slower_sites(candidate: _Candidate, original: Analysis, input_name: str | None,
                  row_of: Callable) -> dict[str, tuple[float, float]]:
    """Position -> (original us, rewritten us) of the candidate's rewritten sites whose
    row took longer than the original's, beyond SLOWER_TOLERANCE: a proposal, checked
    by compiling it. Rows are taken one by one, not by the groups the report judges
    together (`RowGroup`): a row of a group that lost leaves fewer sites, and on
    fsdp_tp h100:8 that variant was the faster (46033 us against 46516 leaving groups)."""
    rewritten = {site.location for site in candidate.sites if site.applied}
    return {row.location: (row.before_us, row.after_us)
            for row in site_rows(candidate.sites, original, candidate.analysis,
                                 input_name, row_of)
            if row.location in rewritten
            and row.after_us > row.before_us * (1 + SLOWER_TOLERANCE)}


def _kept_at(site, slower: dict[str, tuple[float, float]]):
    """A site the keep-sites candidate left at a position found slower, saying why."""
    if site.location not in slower:
        return site
    before, after = slower[site.location]
    return replace(site, applied=False, kind=Kind.KEPT, rule="",
                   reason=f"{Kind.KEPT}: rewritten, its row took {after:.1f} us against "
                          f"{before:.1f} us in the original")


def _keep_slower_sites(chosen: str, tried: dict, candidates: dict, settings: dict,
                       rewritten: Callable[..., _Candidate], original: Analysis,
                       input_name: str | None, row_of: Callable) -> str:
    """The faster label once `chosen` is built again with the sites whose rows it
    found slower left unchanged (keep-sites), for up to KEEP_ROUNDS rounds while each
    is faster than the one before; each such candidate is added to `tried`,
    `candidates` and `settings`."""
    base, (options, text, finish) = chosen, settings[chosen]
    slower: dict[str, tuple[float, float]] = {}
    for _ in range(KEEP_ROUNDS):
        found = _slower_sites(tried[chosen], original, input_name, row_of)
        if not found:
            break
        slower.update(found)
        label = f"{base}, its {len(slower)} slower site(s) kept"
        settings[label] = (dict(options, keep_sites=",".join(slower)), text, finish)
        kept = rewritten(*settings[label][:2])
        tried[label] = replace(kept, sites=[_kept_at(site, slower)
                                            for site in finish(kept.sites)])
        candidates[label] = kept.analysis.total_us
        if _fastest({k: tried[k] for k in (chosen, label)}, candidates) != label:
            break
        chosen = label
    return chosen


def choose(options: dict, rewritten: Callable[..., _Candidate], pipeline: str,
           original_module: ir.Module, original: Analysis, input_name: str | None,
           platform: str, *, forms: dict[str, dict] = CANDIDATES,
           row_of: Callable = _row) -> tuple[str, dict[str, float], _Candidate]:
    """(label kept, each candidate's predicted us, the candidate kept) of `forms` (the
    TPU-only ones on TPU) and PER_PASS, each built by `rewritten(options[, pipeline])`:
    the fastest, or ORIGINAL with its sites left unchanged when none is faster."""
    # label -> (options, pipeline, what makes its sites' records from the pass's)
    settings = {label: (dict(options, **extra), pipeline, list) for label, extra in forms.items()
                if tried_on(extra, platform)}
    tried = {label: rewritten(*setting[:2]) for label, setting in settings.items()}
    per_pass = fastest_per_pass(pipeline, tried, original, input_name, forms=forms,
                                row_of=row_of)
    mixed = None if per_pass is None else rewritten(options, per_pass.pipeline)
    # A pass left out whose sites another pass built (a dot between a gather and a
    # scatter is the gather pass's): not what was measured.
    if mixed is not None and not any(site.applied and site.pattern in
                                     per_pass.unchanged for site in mixed.sites):
        first = next(iter(tried.values())).sites

        def finish(sites):
            return [_left_by_pass(site, per_pass)
                    for site in _with_passes_left_out(sites, first, per_pass, pipeline)]

        tried[PER_PASS] = replace(mixed, sites=finish(mixed.sites))
        settings[PER_PASS] = (options, per_pass.pipeline, finish)
    candidates = {label: c.analysis.total_us for label, c in tried.items()}
    # From each candidate about as fast as the fastest: the one kept for its fewer
    # temporaries may gain less by leaving its slower sites than another.
    for label in _close(tried, candidates):
        _keep_slower_sites(label, tried, candidates, settings, rewritten, original,
                           input_name, row_of)
    chosen = _fastest(tried, candidates)
    result = tried[chosen]
    if result.analysis.total_us >= original.total_us * (1 - SLOWER_TOLERANCE):
        chosen = ORIGINAL
        result = _Candidate(original_module,
                            [_kept(site, min(candidates.values()), original.total_us)
                             for site in next(iter(tried.values())).sites],
                            original)
    return chosen, candidates, result
