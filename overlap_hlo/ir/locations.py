"""`file:line:col` for MLIR locations, through the typed location classes."""
from __future__ import annotations

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


def describe(loc: ir.Location, input_name: str | None = None) -> str:
    """`file:line:col`, with the parser's "-" replaced by `input_name`."""
    flc = file_line_col(loc)
    if flc is None:
        return input_name or "<unknown>"
    name = flc.filename
    if name in ("-", "") and input_name:
        name = input_name
    return f"{name}:{flc.start_line}:{flc.start_col}"
