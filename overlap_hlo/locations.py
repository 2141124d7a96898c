"""`file:line:col` for MLIR locations, through the typed location classes."""
from __future__ import annotations

from jaxlib.mlir import ir


def file_line_col(loc: ir.Location) -> ir.FileLineColLoc | None:
    """The first file location inside `loc` (through names, call sites, fusions)."""
    if type(loc) is ir.Location:
        # Diagnostics hand out plain `ir.Location`s; get the concrete location class.
        loc = ir.Location.from_attr(loc.attr, loc.context)
    if isinstance(loc, ir.FileLineColLoc):
        return loc
    if isinstance(loc, ir.NameLoc):
        return file_line_col(loc.child_loc)
    if isinstance(loc, ir.CallSiteLoc):
        return file_line_col(loc.callee)
    if isinstance(loc, ir.FusedLoc):
        for inner in loc.locations:
            found = file_line_col(inner)
            if found is not None:
                return found
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
