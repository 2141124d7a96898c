"""Hostile and unsupported input to overlap-opt: one clear diagnostic, the documented
exit code, never a traceback, and an existing output file never clobbered."""
import io

import pytest
from jaxlib.mlir import ir

import overlap_hlo
from overlap_hlo.tools.overlap_opt import main

GATHER = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<{s}x16xf32>, %w: tensor<16x8xf32>) -> tensor<{full}x8xf32> {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = {groups}, use_global_device_ids}}> : (tensor<{s}x16xf32>) -> tensor<{full}x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{full}x16xf32>, tensor<16x8xf32>) -> tensor<{full}x8xf32>
    return %1 : tensor<{full}x8xf32>
  }}
}}
"""


def gather(n=8, groups=None, s=2, full=16):
    groups = groups or f"dense<[{list(range(n))}]> : tensor<1x{n}xi64>"
    return GATHER.format(n=n, groups=groups, s=s, full=full)


def run(tmp_path, source, *flags, mode="w"):
    """Run overlap-opt on `source` with an existing output file; return (code, out path)."""
    src = tmp_path / "in.mlir"
    src.write_text(source) if mode == "w" else src.write_bytes(source)
    out = tmp_path / "out.mlir"
    out.write_text("precious")
    return main([str(src), "-o", str(out), *flags]), out


def assert_clean_failure(code, out, err, expected_code=1):
    assert code == expected_code
    assert "Traceback" not in err
    assert out.read_text() == "precious"
    assert len([line for line in err.splitlines() if ": error: " in line]) >= 1


def bytecode(text: str) -> bytes:
    buffer = io.BytesIO()
    overlap_hlo.parse(text).operation.write_bytecode(buffer)
    return buffer.getvalue()


def test_truncated_bytecode(tmp_path, capsys):
    data = bytecode(gather())
    code, out = run(tmp_path, data[: len(data) // 2], mode="wb")
    err = capsys.readouterr().err
    assert_clean_failure(code, out, err)
    assert err.count("error:") == 1


def test_bytecode_magic_then_garbage(tmp_path, capsys):
    code, out = run(tmp_path, b"ML\xefR" + bytes(range(256)) * 4, mode="wb")
    assert_clean_failure(code, out, capsys.readouterr().err)


def test_binary_garbage(tmp_path, capsys):
    code, out = run(tmp_path, bytes(range(256)) * 8, mode="wb")
    assert_clean_failure(code, out, capsys.readouterr().err)


@pytest.mark.parametrize("body, message", [
    ('"foo.bar"() : () -> ()', "unregistered dialect"),     # unknown dialect
    ('"stablehlo.no_such_op"() : () -> ()', "no_such_op"),  # unknown op of a known dialect
    ("%0 = stablehlo.add %a, %a : tensor<4xf32>", "undeclared"),
])
def test_unknown_dialects_and_ops(tmp_path, capsys, body, message):
    source = f"func.func @f(%b: tensor<4xf32>) {{\n  {body}\n  return\n}}\n"
    code, out = run(tmp_path, source)
    err = capsys.readouterr().err
    assert_clean_failure(code, out, err)
    assert "in.mlir:2:" in err and message in err


def test_dynamic_shapes_are_left_unchanged(tmp_path, capsys):
    source = GATHER.format(n=8, groups="dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>",
                           s="?", full="?")
    code, out = run(tmp_path, source, "--threshold-mib=0", "--remarks")
    err = capsys.readouterr().err
    assert code == 0, err
    assert "left unchanged: dynamic or unranked shape" in err
    assert "stablehlo.all_gather" in out.read_text()


@pytest.mark.parametrize("groups, reason", [
    ("dense<[[0, 1, 2, 3, 4, 5, 6, 9]]> : tensor<1x8xi64>", "do not partition"),
    ("dense<[[0, 1, 2, 3], [0, 1, 2, 3]]> : tensor<2x4xi64>", None),
])
def test_inconsistent_replica_groups(tmp_path, capsys, groups, reason):
    n = 8
    full = 2 * len(groups.split("], [")[0].split(","))
    source = gather(n=n, groups=groups, full=full)
    code, out = run(tmp_path, source, "--threshold-mib=0", "--remarks")
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code == 0:   # the verifier accepted it: the pass must leave it unchanged
        assert "left unchanged" in err and (reason is None or reason in err)
        assert "collective_permute" not in out.read_text()
    else:           # the verifier rejected it: one diagnostic, output kept
        assert_clean_failure(code, out, err)


def test_huge_group(tmp_path, capsys):
    n = 2048
    code, out = run(tmp_path, gather(n=n, full=2 * n), "--threshold-mib=0", "--remarks")
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"over groups of {n}" in err
    text = out.read_text()
    assert "collective_permute" in text and "all_gather" not in text


@pytest.mark.parametrize("flags", [["--pass-pipeline=builtin.module(nope)"],
                                   ["--hardware=no-such-chip"], ["--unroll=0"],
                                   ["--threshold-mib=-3"], ["--no-such-flag"]])
def test_usage_errors_keep_the_output(tmp_path, capsys, flags):
    code, out = run(tmp_path, gather(), *flags)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and out.read_text() == "precious"


def test_directory_and_missing_inputs(tmp_path, capsys):
    out = tmp_path / "out.mlir"
    out.write_text("precious")
    for source in (tmp_path, tmp_path / "missing.mlir"):
        assert main([str(source), "-o", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("overlap-opt: error: ") and "Traceback" not in err
    assert out.read_text() == "precious"


GUARDED = """module attributes {{mhlo.num_partitions = {p} : i32, mhlo.num_replicas = {r} : i32}} {{
  func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %c: tensor<i1>) -> tensor<8x8xf32> {{
    {body}
  }}
}}
"""
AG = ('"stablehlo.all_gather"({x}) <{{all_gather_dim = 0 : i64, channel_handle = '
      '#stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> '
      ': tensor<1x4xi64>, use_global_device_ids}}> : (tensor<2x16xf32>) -> tensor<8x16xf32>')
DOT = ("stablehlo.dot_general {g}, %w, contracting_dims = [1] x [0] : "
       "(tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>")


@pytest.mark.parametrize("p, r, body, reason", [
    (4, 1, f"%0 = {AG.format(x='%x')}\n    %1 = stablehlo.optimization_barrier %0 : "
     f"tensor<8x16xf32>\n    %2 = {DOT.format(g='%1')}\n    return %2 : tensor<8x8xf32>",
     "an optimization_barrier separates it"),
    (4, 1, f"%0 = \"stablehlo.if\"(%c) ({{\n      %1 = {AG.format(x='%x')}\n      %2 = "
     f"{DOT.format(g='%1')}\n      stablehlo.return %2 : tensor<8x8xf32>\n    }}, {{\n      "
     f"%3 = stablehlo.constant dense<0.0> : tensor<8x8xf32>\n      stablehlo.return %3 : "
     f"tensor<8x8xf32>\n    }}) : (tensor<i1>) -> tensor<8x8xf32>\n    return %0 : tensor<8x8xf32>",
     "inside a stablehlo.if branch"),
    (2, 2, f"%0 = {AG.format(x='%x')}\n    %1 = {DOT.format(g='%0')}\n    return %1 : "
     "tensor<8x8xf32>", "replica and partition ids mixed"),
])
def test_semantics_guards_leave_sites_unchanged_with_a_remark(tmp_path, capsys, p, r, body,
                                                              reason):
    code, out = run(tmp_path, GUARDED.format(p=p, r=r, body=body), "--threshold-mib=0",
                    "--remarks")
    err = capsys.readouterr().err
    assert code == 0, err
    assert "left unchanged: " + reason in err
    assert "collective_permute" not in out.read_text()


# Nesting MLIR's recursive parser cannot take: refused before it is parsed.

DEEP = {
    "modules": ("module {" * 5000 + "}" * 5000, 1, 8 * 257),
    "tuple": ("func.func private @f(" + "tuple<" * 100_000 + "i32" + ">" * 100_000 + ")\n",
              1, 21 + 6 * 255 + 6),
    # `->` and brackets in strings are no closers: they cannot hide the nesting.
    "after-arrows": ("func.func private @g() -> ()\n" * 300 + "module {" * 5000
                     + "}" * 5000, 301, 8 * 257),
    "after-string": ('module attributes {a = "' + ")" * 5000 + '"} {\n' + "module {" * 5000
                     + "}" * 5000 + "}\n", 2, 8 * 256),
}


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_deep_nesting_is_refused_before_parsing(tmp_path, capsys, kind):
    source, line, column = DEEP[kind]
    code, out = run(tmp_path, source, "--pass-pipeline=builtin.module()")
    err = capsys.readouterr().err
    assert_clean_failure(code, out, err)
    assert err == (f"{tmp_path / 'in.mlir'}:{line}:{column}: error: nested deeper than "
                   f"{overlap_hlo.api.MAX_NESTING} levels (brackets, regions and types "
                   "together); refused before parsing, since MLIR's parser would overflow "
                   "its stack\n")
    with pytest.raises(overlap_hlo.InputError) as info:
        overlap_hlo.parse(source)
    assert isinstance(info.value, ValueError)
    assert (info.value.line, info.value.column) == (line, column)


def test_nesting_up_to_the_limit_parses(tmp_path, capsys):
    depth = overlap_hlo.api.MAX_NESTING
    noise = ('module attributes {test.s = "' + "(" * 1000 + '"} {\n// ' + "[" * 1000 + "\n"
             + "".join(f"func.func private @g{i}() -> ()\n" for i in range(300)) + "}\n")
    source = noise + "module {" * depth + "}" * depth + "\n"
    code, out = run(tmp_path, source, "--pass-pipeline=builtin.module()")
    assert code == 0, capsys.readouterr().err
    modules = []
    overlap_hlo.parse(source).operation.walk(
        lambda op: modules.append(op.name == "builtin.module") or ir.WalkResult.ADVANCE)
    assert sum(modules) == depth + 2   # the implicit top module and the noise module
    deeper = noise + "module {" * (depth + 1) + "}" * (depth + 1) + "\n"
    with pytest.raises(overlap_hlo.InputError):
        overlap_hlo.parse(deeper)


def test_byte_order_mark_is_ignored(tmp_path, capsys):
    source = gather()
    code, out = run(tmp_path, b"\xef\xbb\xbf" + source.encode(), "--threshold-mib=0",
                    mode="wb")
    assert code == 0, capsys.readouterr().err
    plain = overlap_hlo.rewrite_source(source, threshold_mib=0)
    assert out.read_text() == plain
    assert overlap_hlo.rewrite_source("\ufeff" + source, threshold_mib=0) == plain


def test_deeply_nested_location_is_described():
    # Bytecode is not checked for nesting: locations thousands deep must not exhaust
    # Python's recursion while sites and diagnostics are described.
    from overlap_hlo.ir.locations import describe

    with overlap_hlo.ir.compat.make_context():
        loc = ir.Location.file("model.py", 3, 4)
        for i in range(5000):
            loc = (ir.Location.name(f"n{i}", childLoc=loc) if i % 2 else
                   ir.Location.callsite(loc, [ir.Location.file("caller.py", 1, 1)]))
        assert describe(loc) == "model.py:3:4"
        fused = ir.Location.fused([ir.Location.unknown(),
                                   ir.Location.name("q", childLoc=ir.Location.file("a.py", 7, 8)),
                                   ir.Location.file("b.py", 1, 1)])
        assert describe(fused) == "a.py:7:8"
