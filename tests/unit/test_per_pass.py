"""The report's PER_PASS candidate leaves a pass whose original sites are fastest out of
its pipeline (no impossible threshold), and reports that pass's sites where it stood."""
from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.pipeline import (DEFAULT_PIPELINE, Element, parse_pipeline,
                                          pipeline_text)
from overlap_hlo.rewrite.site import Site
from overlap_hlo.targets.candidates import _left_by_pass, _PerPass, _with_passes_left_out

GATHER, SCATTER = "overlap-all-gather-matmul", "overlap-matmul-reduce-scatter"
EXCHANGE = "overlap-all-to-all-matmul"


def test_pipeline_text_is_the_inverse_of_parsing():
    assert pipeline_text(parse_pipeline(DEFAULT_PIPELINE)) == DEFAULT_PIPELINE
    text = "builtin.module(a{x=1 y=true},func.func(cse),b)"
    assert pipeline_text(parse_pipeline(text)) == text
    element = Element.of(GATHER, {"threshold-mib": "0", "bidirectional": "true"})
    assert element.text == f"{GATHER}{{threshold-mib=0 bidirectional=true}}"
    assert parse_pipeline(pipeline_text([element]))[0] == element
    assert Element.of(GATHER, {}).text == GATHER


def site(pattern: str, line: int, kind: Kind = Kind.NONE, applied: bool = True) -> Site:
    return Site(Where("m.mlir", line, 1), pattern, applied, kind=kind)


def test_the_sites_of_a_pass_left_out_go_where_it_stood():
    """The module's own records keep their order; the left-out pass's, as the first
    candidate met them, go before the next pass's, and its coverage records last."""
    mixed = [site(GATHER, 1), site(EXCHANGE, 9),
             site(GATHER, 7, Kind.NOT_HANDLED, applied=False)]
    first = [site(GATHER, 1), site(SCATTER, 3), site(SCATTER, 4, Kind.NOT_PROFITABLE, False),
             site(EXCHANGE, 9), site(SCATTER, 8, Kind.NOT_HANDLED, applied=False)]
    per_pass = _PerPass("unused", {SCATTER: (60.0, 70.0)})
    sites = [_left_by_pass(s, per_pass)
             for s in _with_passes_left_out(mixed, first, per_pass, DEFAULT_PIPELINE)]
    assert [(s.pattern, s.where.line) for s in sites] == [
        (GATHER, 1), (SCATTER, 3), (SCATTER, 4), (EXCHANGE, 9), (GATHER, 7), (SCATTER, 8)]
    assert [s.applied for s in sites] == [True, False, False, True, False, False]
    assert all(s.kind is Kind.KEPT and "(70.0 us against 60.0 us)" in s.reason
               for s in sites if s.pattern == SCATTER)
