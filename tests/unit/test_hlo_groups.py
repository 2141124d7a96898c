"""A compiled collective's first replica group, read from each form XLA writes it in:
explicit groups, an iota device list, and mesh axes (newer XLA). The schedule model
prices the original's collective with the links that group spans."""
import numpy as np

from overlap_hlo.targets.hlo_proto import _fields, _first_group


def varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def msg(*fields) -> bytes:
    """Protobuf wire bytes of (number, int | bytes | str) fields."""
    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += varint(number << 3) + varint(value)
        else:
            data = value.encode() if isinstance(value, str) else value
            out += varint(number << 3 | 2) + varint(len(data)) + data
    return out


def first_group(*fields) -> tuple:
    return _first_group(_fields(msg(*fields)))


def test_explicit_groups():
    groups = [msg(*[(1, d) for d in (1, 3, 5, 7)]), msg(*[(1, d) for d in (0, 2, 4, 6)])]
    assert first_group(*[(49, g) for g in groups]) == (1, 3, 5, 7)


def test_an_iota_list_is_reshaped_transposed_and_split():
    # [2,4]<=[4,2]T(1,0): iota(8).reshape(4, 2).T -> groups (0 2 4 6), (1 3 5 7).
    iota = msg((1, 2), (2, 4), (3, 4), (3, 2), (4, 1), (4, 0))
    assert first_group((87, msg((2, iota)))) == (0, 2, 4, 6)
    assert first_group((87, msg((2, msg((1, 1), (2, 8)))))) == tuple(range(8))
    assert first_group((87, msg((2, msg((1, 1 << 20), (2, 1 << 20)))))) == ()   # too large


def test_mesh_axes_name_a_group_over_the_listed_axes():
    mesh = msg((1, msg((1, "a"), (2, 2))), (1, msg((1, "b"), (2, 4))))
    ids = np.arange(8).reshape(2, 4)
    assert first_group((93, msg((1, mesh), (2, msg((1, 1)))))) == tuple(ids[0])     # over b
    assert first_group((93, msg((1, mesh), (2, msg((1, 0)))))) == tuple(ids[:, 0])  # over a
    both = msg((1, mesh), (2, msg((1, 1))), (2, msg((1, 0))))    # b major, then a
    assert first_group((93, both)) == tuple(ids.T.reshape(-1))
    sub_axis = msg((1, mesh), (2, msg((1, 1), (2, msg((1, 1), (2, 2))))))
    assert first_group((93, sub_axis)) == ()                      # not read: no group
    assert first_group((93, msg((1, mesh), (2, msg((1, 5)))))) == ()
    twice = msg((1, mesh), (2, msg((1, 1))), (2, msg((1, 1))))
    assert first_group((93, twice)) == ()                         # an axis named twice
