"""`--verify-diagnostics`: check diagnostics against `expected-*` comments in the input.

Follows mlir's SourceMgrDiagnosticVerifierHandler. A comment

    // expected-error {{text}}          on the line it is written on
    // expected-error@+2 {{text}}       two lines below (@-1: the line above)
    // expected-error@above {{text}}    the closest line above that has no expected-*
    // expected-error@below {{text}}    the closest line below that has no expected-*
    // expected-error@unknown {{text}}  a diagnostic without a location in the input

expects a diagnostic of that kind (error, warning, remark or note) on that line whose
message contains `text`. Every error, warning and remark produced must be expected,
and every expectation must be met. Notes attached to a diagnostic are checked only
against `expected-note` lines: the bindings attach notes mlir-opt would drop in this
mode ("see current operation: ...").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_EXPECTED = re.compile(
    r"//.*?(?P<start>expected-(?P<kind>error|warning|remark|note))"
    r" *(?:@(?P<where>[+-]\d+|above|below|unknown))? *\{\{(?P<text>.*)\}\}\s*$")


@dataclass(frozen=True)
class Diagnostic:
    """A diagnostic as the tool reports it."""

    severity: str                 # "error", "warning", "remark" or "note"
    message: str
    where: str                    # `file:line:col` (or just the file) for printing
    line: int | None              # line in the input; None when elsewhere or unknown
    notes: tuple[Diagnostic, ...] = ()

    def format(self) -> str:
        return f"{self.where}: {self.severity}: {self.message}"


@dataclass
class Expectation:
    kind: str
    text: str
    line: int | None              # None for @unknown
    where: str                    # `file:line:col` of the annotation itself
    matched: bool = False


def parse_expectations(source: str, input_name: str) -> list[Expectation]:
    """The `expected-*` annotations of `source` (line 1 is the input's first line)."""
    found: list[Expectation] = []
    waiting_for_next_line: list[Expectation] = []
    last_plain_line = 0
    lines = source.splitlines()
    for number, text in enumerate(lines, start=1):
        match = _EXPECTED.search(text)
        if match is None:
            last_plain_line = number
            for expectation in waiting_for_next_line:
                expectation.line = number
            waiting_for_next_line.clear()
            continue
        where = match["where"]
        expectation = Expectation(
            match["kind"], match["text"], number,
            f"{input_name}:{number}:{match.start('start') + 1}")
        if where == "unknown":
            expectation.line = None
        elif where == "above":
            expectation.line = last_plain_line
        elif where == "below":
            expectation.line = len(lines) + 1  # stays past the end if nothing follows
            waiting_for_next_line.append(expectation)
        elif where:
            expectation.line = number + int(where)
        found.append(expectation)
    return found


def _claim(expectations: list[Expectation], diagnostic: Diagnostic) -> bool:
    for expectation in expectations:
        if (not expectation.matched and expectation.kind == diagnostic.severity
                and expectation.line == diagnostic.line
                and expectation.text in diagnostic.message):
            expectation.matched = True
            return True
    return False


def verify(diagnostics: list[Diagnostic], expectations: list[Expectation]) -> list[str]:
    """One error line per unexpected diagnostic and per unmet expectation."""
    problems = []
    for diagnostic in diagnostics:
        if not _claim(expectations, diagnostic):
            problems.append(f"{diagnostic.where}: error: unexpected {diagnostic.severity}: "
                            f"{diagnostic.message}")
        for note in diagnostic.notes:
            _claim(expectations, note)
    for expectation in expectations:
        if not expectation.matched:
            problems.append(f"{expectation.where}: error: expected {expectation.kind} "
                            f"\"{expectation.text}\" was not produced")
    return problems
