"""Where `partition_id` means this device's id: manual regions of Shardy and GSPMD exports.

Inside an `sdy.manual_computation` that is manual over only some mesh axes, XLA
rejects a bare `partition_id` (the remaining axes are still auto-partitioned). JAX
then computes `axis_index` in a nested manual_computation over the remaining axes;
the passes do the same. GSPMD exports mark such regions with `last_tile_dims={manual,
...}` shardings; there the passes leave sites unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from overlap_hlo.groups.meshes import find_mesh, module_of
from overlap_hlo.ir.unsupported import Unsupported


@dataclass(frozen=True)
class AutoAxes:
    """Mesh `mesh` (a symbol name) still has the automatic `axes` at a site."""

    mesh: str
    axes: tuple[str, ...]


def auto_axes_at(op: ir.Operation, scan) -> AutoAxes | None:
    """The axes that are not manual where `op` sits; None if all are (or no mesh).

    `scan` (a ModuleScan) lists the module's manual computations and GSPMD marks."""
    module = module_of(op)
    regions = _enclosing_manual_computations(op)
    if not regions:
        if any(_auto_axes(c, scan) for c in scan.manual_computations):
            raise Unsupported("site outside the partially manual sdy.manual_computation "
                              "that may reach it: its manual axes are unknown")
        if scan.partially_manual_gspmd:
            raise Unsupported("partially manual GSPMD region: partition_id is ambiguous")
        return None
    manual, mesh = set(), None
    for region in regions:
        found = _auto_axes(region, scan)
        if found is None:
            return None
        mesh = found.mesh
        manual |= set(_mesh_axes(module, mesh, scan)) - set(found.axes)
    auto = tuple(a for a in _mesh_axes(module, mesh, scan) if a not in manual)
    return AutoAxes(mesh, auto) if auto else None


def manual_axes_attr(axes) -> ir.Attribute:
    return sdy.ManualAxesAttr.get([ir.StringAttr.get(a) for a in axes])


def _auto_axes(computation: ir.Operation, scan) -> AutoAxes | None:
    """Axes of its mesh that `computation` leaves automatic (None: fully manual), read
    once per pass run (`scan.memo`: the passes never erase a manual computation)."""
    return scan.memo(("auto axes", hash(computation)),
                     lambda: _read_auto_axes(computation, scan))


def _read_auto_axes(computation: ir.Operation, scan) -> AutoAxes | None:
    mesh = _mesh_name(computation)
    if mesh is None:
        raise Unsupported("sdy.manual_computation without shardings naming its mesh")
    axes = _mesh_axes(module_of(computation), mesh, scan)
    declared = computation.attributes["manual_axes"]
    # ManualAxesAttr has no accessor in the bindings: the printed form proposes the
    # subset (each axis name is a quoted string in it), the typed equality confirms it.
    text = str(declared)
    named = sorted((a for a in axes if str(ir.StringAttr.get(a)) in text),
                   key=lambda a: text.index(str(ir.StringAttr.get(a))))
    if manual_axes_attr(named) != declared:
        raise Unsupported("manual axes not on the mesh of the sdy.manual_computation")
    auto = tuple(a for a in axes if a not in named)
    return AutoAxes(mesh, auto) if auto else None


def _mesh_name(computation: ir.Operation) -> str | None:
    for key in ("in_shardings", "out_shardings"):
        for sharding in sdy.TensorShardingPerValueAttr(computation.attributes[key]).shardings:
            ref = sdy.TensorShardingAttr(sharding).mesh_or_ref
            if isinstance(ref, ir.FlatSymbolRefAttr):
                return ref.value
    return None


def _mesh_axes(module: ir.Operation, name: str, scan) -> list[str]:
    return scan.memo(("mesh axes", name), lambda: find_mesh(module, name).names)


def _enclosing_manual_computations(op: ir.Operation) -> list[ir.Operation]:
    found, parent = [], op.parent
    while parent is not None and parent.name != "builtin.module":
        if parent.name == "sdy.manual_computation":
            found.append(parent)
        parent = parent.parent
    return found
