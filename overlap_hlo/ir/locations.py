"""`file:line:col` for MLIR locations, through the typed location classes."""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir


def file_line_col(loc: ir.Location) -> ir.FileLineColLoc | None:
    """The first file location inside `loc` (through names, call sites, fusions).

    Iterative, depth first: a location nested thousands deep (from bytecode, which
    the nesting check does not see) cannot exhaust Python's recursion limit.
    """
    pending = [loc]
    while pending:
        loc = pending.pop()
        if type(loc) is ir.Location:
            # Diagnostics hand out plain `ir.Location`s; get the concrete location class.
            loc = ir.Location.from_attr(loc.attr, loc.context)
        if isinstance(loc, ir.FileLineColLoc):
            return loc
        if isinstance(loc, ir.NameLoc):
            pending.append(loc.child_loc)
        elif isinstance(loc, ir.CallSiteLoc):
            pending.append(loc.callee)
        elif isinstance(loc, ir.FusedLoc):
            pending.extend(reversed(list(loc.locations)))
    return None


@dataclass(frozen=True)
class Where:
    """A source position: the file (the parser's "-" renamed to the input's name) and,
    when the location holds one, its line and column."""

    file: str
    line: int | None = None
    column: int | None = None

    @classmethod
    def of(cls, location: ir.Location, input_name: str | None = None) -> Where:
        flc = file_line_col(location)
        if flc is None:
            return cls(input_name or "<unknown>")
        return cls(_input_named(flc.filename, input_name), flc.start_line, flc.start_col)

    @classmethod
    def parse(cls, text: str, input_name: str | None = None) -> Where:
        """A position written "file:line:col" (as HLO metadata writes one); text
        without a line and column is a file alone."""
        parts = text.rsplit(":", 2)
        if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
            return cls(text)
        return cls(_input_named(parts[0], input_name), int(parts[1]), int(parts[2]))

    def __str__(self) -> str:
        return self.file if self.line is None else f"{self.file}:{self.line}:{self.column}"


def _input_named(name: str, input_name: str | None) -> str:
    """A file name, the parser's "-" (or "") for its input renamed `input_name`."""
    return input_name if name in ("-", "") and input_name else name


def describe(loc: ir.Location, input_name: str | None = None) -> str:
    """`file:line:col`, with the parser's "-" replaced by `input_name`."""
    return str(Where.of(loc, input_name))
