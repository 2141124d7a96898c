"""Device meshes and replica groups given as mesh axes (JAX 0.11 and later).

`#stablehlo.replica_group_mesh_axes<mesh = @m, axes = [...]>` names a mesh (an
`sdy.mesh` symbol or an inline `#stablehlo.mesh`) and some of its axes. The dense
groups follow the rule XLA applies (checked against its compiled groups):

- split each mesh axis into the referenced sub-axes and the leftover pieces, major
  to minor (`sub_axis_info = (pre)size`: `size` elements after `pre` more-major ones);
- a device's id is its row-major position in the mesh;
- a group's members run over the referenced factors, the first listed axis most major;
- groups are listed over the remaining factors in row-major order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

from overlap_hlo.ir.unsupported import Unsupported

MAX_DEVICES = 1 << 16   # larger meshes and id spaces are refused before anything is built


@dataclass(frozen=True)
class Mesh:
    """Axis names and sizes, major to minor."""

    axes: tuple[tuple[str, int], ...]
    has_device_ids: bool = False

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.axes]

    @property
    def size(self) -> int:
        return int(np.prod([size for _, size in self.axes], dtype=object))


def module_of(op: ir.Operation) -> ir.Operation:
    while op.name != "builtin.module":
        op = op.parent
    return op


def find_mesh(module: ir.Operation, name: str) -> Mesh:
    """The `sdy.mesh @name` declared in `module`."""
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name != "sdy.mesh":
            continue
        sym = op.operation.attributes["sym_name"]
        if isinstance(sym, ir.StringAttr) and sym.value == name:
            return _read(op.operation.attributes["mesh"], sdy.MeshAttr, sdy.MeshAxisAttr)
    raise Unsupported(f"mesh @{name} not found")


def _read(attr: ir.Attribute, mesh_cls, axis_cls) -> Mesh:
    if not mesh_cls.isinstance(attr):
        raise Unsupported(f"mesh attribute of unexpected type: {attr}")
    mesh = mesh_cls(attr)
    axes = []
    for axis in mesh.axes:
        axis = axis_cls(axis)
        if axis.size < 1:
            raise Unsupported(f"mesh axis '{axis.name}' of size {axis.size}")
        axes.append((axis.name, axis.size))
    device_ids = mesh.device_ids
    result = Mesh(tuple(axes), has_device_ids=device_ids is not None and len(device_ids) > 0)
    if result.size > MAX_DEVICES:
        raise Unsupported(f"mesh of {result.size} devices (more than {MAX_DEVICES})")
    return result


def is_mesh_axes(attr: ir.Attribute) -> bool:
    return stablehlo.ReplicaGroupMeshAxesAttr.isinstance(attr)


def mesh_axes_groups(attr: ir.Attribute, op: ir.Operation) -> tuple[Mesh, list[list[int]]]:
    """The mesh a `replica_group_mesh_axes` attribute names, and its dense groups."""
    groups_attr = stablehlo.ReplicaGroupMeshAxesAttr(attr)
    ref = groups_attr.mesh
    if isinstance(ref, ir.FlatSymbolRefAttr):
        mesh = find_mesh(module_of(op), ref.value)
    else:
        mesh = _read(ref, stablehlo.MeshAttr, stablehlo.MeshAxisAttr)
    if mesh.has_device_ids:
        raise Unsupported("mesh with device_ids: how XLA orders its groups is unproven")
    refs = []
    for axis in groups_attr.axes:
        axis = stablehlo.AxisRefAttr(axis)
        info = axis.sub_axis_info
        if info is None:
            refs.append((axis.name, None))
        else:
            info = stablehlo.SubAxisInfoAttr(info)
            refs.append((axis.name, (info.pre_size, info.size)))
    return mesh, dense_groups(mesh, refs)


def dense_groups(mesh: Mesh, refs: list[tuple[str, tuple[int, int] | None]]) -> list[list[int]]:
    """Groups of `mesh` over the referenced axes or sub-axes `refs` ((pre, size) or None)."""
    sizes = dict(mesh.axes)
    cuts: dict[str, set[int]] = {name: {1, size} for name, size in mesh.axes}
    spans = []   # per ref: (axis, first cut, last cut) in cumulative-product units
    for name, info in refs:
        if name not in sizes:
            raise Unsupported(f"axis '{name}' is not an axis of the mesh")
        pre, size = info if info is not None else (1, sizes[name])
        if pre < 1 or size < 1 or sizes[name] % (pre * size):
            raise Unsupported(f"sub-axis ({pre}){size} does not divide axis '{name}' "
                              f"of size {sizes[name]}")
        cuts[name] |= {pre, pre * size}
        spans.append((name, pre, pre * size))
    factors = []   # (axis, start, stop, size) major to minor over the whole mesh
    for name, _ in mesh.axes:
        points = sorted(cuts[name])
        for lo, hi in zip(points, points[1:]):
            if hi % lo:
                raise Unsupported(f"sub-axes of '{name}' overlap")
            factors.append((name, lo, hi))
    chosen = []
    for name, lo, hi in spans:
        members = [i for i, (axis, a, b) in enumerate(factors) if axis == name and lo <= a and b <= hi]
        if any(i in chosen for i in members):
            raise Unsupported(f"axis '{name}' referenced twice")
        chosen += members
    rest = [i for i in range(len(factors)) if i not in chosen]
    ids = np.arange(mesh.size, dtype=np.int64).reshape([hi // lo for _, lo, hi in factors] or [1])
    group_size = int(np.prod([factors[i][2] // factors[i][1] for i in chosen], dtype=np.int64))
    return ids.transpose(rest + chosen).reshape(-1, group_size).tolist()
