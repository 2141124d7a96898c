"""What jaxlib's typed HLO bindings leave out, read from the serialized HloModuleProto.

`HloModule`, `HloComputation` and `HloInstruction` in jaxlib give the schedule, opcodes,
operands and users, but not an instruction's shape, metadata (its source location),
backend config (the TPU compiler's cycle estimate), called computations or literal
values. Those are fields of `HloModule.as_serialized_hlo_module_proto()`; jaxlib ships
no Python classes for that proto, so this module decodes the few fields it needs from
the protobuf wire format, by field number (xla/service/hlo.proto, xla/xla_data.proto).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from overlap_hlo.groups.meshes import Mesh, dense_groups
from overlap_hlo.ir.unsupported import Unsupported

# Bytes per element of xla.PrimitiveType values (sub-byte types rounded up).
_ELEMENT_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4,
                  12: 8, 15: 8, 16: 2, 18: 16, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1, 24: 1,
                  25: 1, 26: 1, 27: 1, 28: 1, 29: 1, 30: 1, 31: 1, 32: 1, 33: 1}
_TUPLE = 13


def _fields(data: bytes) -> dict[int, list]:
    """Field number -> values (ints for varint and fixed fields, bytes otherwise)."""
    out: dict[int, list] = {}
    i, end = 0, len(data)
    while i < end:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 1:
            value, i = int.from_bytes(data[i:i + 8], "little"), i + 8
        elif wire == 5:
            value, i = int.from_bytes(data[i:i + 4], "little"), i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7


def _ints(values: list, signed: bool = True) -> list[int]:
    """A repeated integer field, packed (bytes) or not (ints)."""
    out: list[int] = []
    for value in values:
        if isinstance(value, bytes):
            i = 0
            while i < len(value):
                number, i = _varint(value, i)
                out.append(number)
        else:
            out.append(value)
    return [v - (1 << 64) if signed and v >= 1 << 63 else v for v in out]


def _one(fields: dict, number: int, default=None):
    values = fields.get(number)
    return values[-1] if values else default


def _text(fields: dict, number: int) -> str:
    return _one(fields, number, b"").decode("utf-8", "replace")


@dataclass(frozen=True)
class Shape:
    element_type: int
    dims: tuple[int, ...]
    tuple_shapes: tuple[Shape, ...] = ()

    @classmethod
    def parse(cls, data: bytes) -> Shape:
        f = _fields(data)
        return cls(_one(f, 2, 0), tuple(_ints(f.get(3, []))),
                   tuple(cls.parse(s) for s in f.get(4, [])))

    @property
    def nbytes(self) -> int:
        """Bytes of an array shape (for a tuple: of all its arrays)."""
        if self.element_type == _TUPLE:
            return sum(s.nbytes for s in self.tuple_shapes)
        count = 1
        for d in self.dims:
            count *= d
        return count * _ELEMENT_BYTES.get(self.element_type, 0)


@dataclass(frozen=True)
class SourceLocation:
    file: str
    line: int
    column: int

    def format(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Instruction:
    """The fields of one HloInstructionProto the schedule analysis reads."""

    name: str
    opcode: str
    id: int
    shape: Shape
    operand_ids: tuple[int, ...]
    called_ids: tuple[int, ...]
    op_name: str
    location: SourceLocation | None
    backend_config: bytes
    literal: tuple[int, ...]            # integer literal values (constants)
    tuple_index: int
    comparison: str                     # compare direction ("LT", ...)
    pairs: tuple[tuple[int, int], ...]  # collective-permute source_target_pairs
    group: tuple[int, ...]              # a collective's first replica group, () if none
    contracting: tuple[int, ...] = ()   # a dot's lhs contracting dimensions
    custom_call_target: str = ""

    @property
    def group_size(self) -> int:
        """Members of one replica group of a collective (0 if none)."""
        return len(self.group)

    def config(self) -> dict:
        """The backend config as JSON (what TPU instructions carry), {} otherwise."""
        if not self.backend_config:
            return {}
        try:
            value = json.loads(self.backend_config)
        except (ValueError, UnicodeDecodeError):
            return {}
        return value if isinstance(value, dict) else {}

    def estimated_cycles(self) -> int | None:
        """The TPU compiler's cycle estimate for this instruction, if it gave one."""
        window = self.config().get("window_config")
        if isinstance(window, dict) and "estimated_cycles" in window:
            try:
                return int(window["estimated_cycles"])
            except (TypeError, ValueError):
                return None
        return None


@dataclass(frozen=True)
class Computation:
    name: str
    id: int
    root_id: int
    instructions: tuple[Instruction, ...]

    @property
    def root(self) -> Instruction:
        return next(i for i in self.instructions if i.id == self.root_id)


@dataclass
class ModuleProto:
    """Computations and instructions by id and by name."""

    computations: dict[int, Computation]
    entry_id: int
    by_id: dict[int, Instruction] = field(default_factory=dict)
    by_name: dict[str, Instruction] = field(default_factory=dict)
    computation_of: dict[int, Computation] = field(default_factory=dict)

    def __post_init__(self):
        for comp in self.computations.values():
            for instr in comp.instructions:
                self.by_id[instr.id] = instr
                self.by_name[instr.name] = instr
                self.computation_of[instr.id] = comp

    def operands(self, instr: Instruction) -> list[Instruction]:
        return [self.by_id[i] for i in instr.operand_ids]

    def called(self, instr: Instruction) -> list[Computation]:
        return [self.computations[i] for i in instr.called_ids if i in self.computations]


def parse_module(serialized: bytes) -> ModuleProto:
    """Decode an HloModuleProto (from `HloModule.as_serialized_hlo_module_proto()`)."""
    f = _fields(serialized)
    locations = _stack_frame_locations(_one(f, 17, b""))
    computations = {}
    for data in f.get(3, []):
        c = _fields(data)
        instructions = tuple(_instruction(i, locations) for i in c.get(2, []))
        comp = Computation(_text(c, 1), _one(c, 5, 0), _one(c, 6, 0), instructions)
        computations[comp.id] = comp
    return ModuleProto(computations, _one(f, 6, 0))


def _stack_frame_locations(data: bytes) -> dict[int, SourceLocation]:
    """Stack frame id (1-based) -> the frame's own file location."""
    if not data:
        return {}
    f = _fields(data)
    files = [v.decode("utf-8", "replace") for v in f.get(1, [])]
    file_locations = []
    for raw in f.get(3, []):
        loc = _fields(raw)
        file_id = _one(loc, 1, 0)
        file_locations.append(SourceLocation(files[file_id - 1] if 0 < file_id <= len(files)
                                             else "", _one(loc, 3, 0), _one(loc, 4, 0)))
    frames = {}
    for number, raw in enumerate(f.get(4, []), start=1):
        location_id = _one(_fields(raw), 1, 0)
        if 0 < location_id <= len(file_locations):
            frames[number] = file_locations[location_id - 1]
    return frames


def _instruction(data: bytes, frames: dict[int, SourceLocation]) -> Instruction:
    f = _fields(data)
    meta = _fields(_one(f, 7, b""))
    location = frames.get(_one(meta, 15, 0))
    if location is None and _one(meta, 3):
        location = SourceLocation(_text(meta, 3), _one(meta, 4, 0), _one(meta, 18, 0))
    literal = _fields(_one(f, 8, b""))
    values = []
    for number in (4, 5):                       # s32s, s64s
        values += _ints(literal.get(number, []))
    for number in (6, 7):                       # u32s, u64s
        values += _ints(literal.get(number, []), signed=False)
    pairs = tuple((_one(p, 1, 0), _one(p, 2, 0))
                  for p in (_fields(raw) for raw in f.get(52, [])))
    return Instruction(
        name=_text(f, 1), opcode=_text(f, 2), id=_one(f, 35, 0),
        shape=Shape.parse(_one(f, 3, b"")),
        operand_ids=tuple(_ints(f.get(36, []))), called_ids=tuple(_ints(f.get(38, []))),
        op_name=_text(meta, 2), location=location, backend_config=_one(f, 43, b""),
        literal=tuple(values), tuple_index=_one(f, 13, 0), comparison=_text(f, 63),
        pairs=pairs, group=_first_group(f),
        contracting=tuple(_ints(_fields(_one(f, 30, b"")).get(1, []))),
        custom_call_target=_text(f, 28))


MAX_IOTA_IDS = 1 << 16   # an iota group list larger than this is not expanded


def _first_group(f: dict) -> tuple[int, ...]:
    """The members of a collective's first replica group, from replica_groups or
    collective_device_list (an iota list expanded: its ids reshaped, transposed and
    split into groups); () if none."""
    groups = f.get(49, [])
    if groups:
        return tuple(_ints(_fields(groups[0]).get(1, [])))
    if _one(f, 93):
        return _mesh_axes_group(_fields(_one(f, 93)))
    device_list = _one(f, 87)
    if not device_list:
        return ()
    d = _fields(device_list)
    if d.get(1):
        return tuple(_ints(_fields(d[1][0]).get(1, [])))
    iota = _one(d, 2)
    if not iota:
        return ()
    i = _fields(iota)
    count, size = _one(i, 1, 0), _one(i, 2, 0)
    dims, perm = _ints(i.get(3, [])), _ints(i.get(4, []))
    if not 0 < count * size <= MAX_IOTA_IDS or (dims and math.prod(dims) != count * size) \
            or sorted(perm) != list(range(len(dims))):
        return tuple(range(size)) if 0 < size <= MAX_IOTA_IDS and count == 1 else ()
    ids = np.arange(count * size).reshape(dims or [count * size])
    return tuple(int(x) for x in ids.transpose(perm or None).reshape(count, size)[0])


def _mesh_axes_group(f: dict) -> tuple[int, ...]:
    """The first group of replica groups given as mesh axes (newer XLA: a mesh of
    named axes, major to minor, and the indices of the axes each group runs over, as
    `#stablehlo.replica_group_mesh_axes`; `meshes.dense_groups` lays them out); () for
    a form not read here (sub-axes, device ids)."""
    mesh, refs = _fields(_one(f, 1, b"")), f.get(2, [])
    if set(mesh) - {1} or not refs:
        return ()
    axes = tuple((_text(axis, 1), _one(axis, 2, 0))
                 for axis in (_fields(raw) for raw in mesh.get(1, [])))
    sizes = [size for _, size in axes]
    if not axes or len({name for name, _ in axes}) != len(axes) \
            or any(size < 1 for size in sizes) or math.prod(sizes) > MAX_IOTA_IDS:
        return ()
    named = []
    for ref in (_fields(raw) for raw in refs):
        index = _one(ref, 1, 0)
        if set(ref) - {1} or not 0 <= index < len(axes):
            return ()
        named.append((axes[index][0], None))
    try:
        return tuple(dense_groups(Mesh(axes), named)[0])
    except Unsupported:      # an axis named twice
        return ()
