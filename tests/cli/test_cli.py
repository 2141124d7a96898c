"""overlap-opt, run in-process through `main(argv)`: every flag and every exit status.

MLIR's IR printing and timing write to the native stderr, so those tests use capfd;
the rest use capsys. Nothing here runs on a device.
"""
from __future__ import annotations

import io
import os
import re
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from jaxlib.mlir import ir

import overlap_hlo
from overlap_hlo.api import BYTECODE_MAGIC
from overlap_hlo.passes import ALL_PASSES
from overlap_hlo.rewrite import pipeline
from overlap_hlo.rewrite.rewrite_pass import RewritePass
from overlap_hlo.tools import cli
from overlap_hlo.tools.overlap_opt import main
from overlap_hlo.tools.verify_diagnostics import parse_expectations
from harness import DATA

SDY = DATA / "shard_map_sdy.mlir"      # all_gather -> dot -> dot -> reduce_scatter
GSPMD = DATA / "shard_map_gspmd.mlir"  # the same function lowered without Shardy

SIMPLE = """\
func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
"""

MALFORMED = """\
func.func @f() {

  %0 = foo.bar
  return
}
"""


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


# Default run, threshold, pipeline.

@pytest.mark.parametrize("source", [SDY, GSPMD], ids=["shardy", "gspmd"])
def test_threshold_zero_rewrites_both_collectives(source, capsys):
    assert main([str(source), "--threshold-mib=0"]) == 0
    out, err = capsys.readouterr()
    assert "stablehlo.collective_permute" in out
    assert "stablehlo.all_gather" not in out
    assert "stablehlo.reduce_scatter" not in out
    assert err == "overlap-opt: 2 of 2 sites rewritten\n"


def test_default_threshold_leaves_small_module_unchanged(capsys):
    assert main([str(SDY)]) == 0
    out, err = capsys.readouterr()
    assert "stablehlo.all_gather" in out
    assert "stablehlo.reduce_scatter" in out
    assert "stablehlo.collective_permute" not in out
    assert lines_of(err)[0] == ("overlap-opt: 0 of 2 sites rewritten; 2 left unchanged "
                                "(below threshold-mib)")


def _declared_help(option: str) -> str:
    """The help of the pass field named `option`, from the first pass that has it."""
    for cls in overlap_hlo.registered_passes().values():
        for f in cls.options().values():
            if f.name == option:
                return f.metadata["help"]
    raise KeyError(option)


def test_help_comes_from_the_passes(capsys):
    """Each pass flag's help is its RewritePass field's, and the description lists every
    registered pass with its summary."""
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    packed = "".join(out.split())   # argparse breaks lines after hyphens too
    for spec in cli.PASS_FLAGS:
        field_help = _declared_help(spec.option)
        assert "".join(field_help.split()).rstrip(".") in packed, spec.flag
    for name, cls in overlap_hlo.registered_passes().items():
        assert f"{name}: {' '.join(cls.summary.split())}" in out
    # What the default does: the size threshold, unless a profile is named.
    assert f"default {overlap_hlo.DEFAULT_THRESHOLD_MIB:g} when no hardware is named" in out
    assert "Unset, with --hardware or --tpu: that profile's cost model decides" in out


def test_stdin_is_the_default_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SDY.read_bytes())))
    assert main(["--threshold-mib=0"]) == 0
    assert "stablehlo.collective_permute" in capsys.readouterr().out


def test_pipeline_option_wins_over_flag_and_mixes_with_upstream_passes(capsys):
    text = "builtin.module(overlap-all-gather-matmul{threshold-mib=0},canonicalize,cse)"
    assert main([str(SDY), "--threshold-mib=100", f"--pass-pipeline={text}"]) == 0
    out, _ = capsys.readouterr()
    assert "stablehlo.collective_permute" in out
    assert "stablehlo.all_gather" not in out
    assert "stablehlo.reduce_scatter" in out  # its pass is not in the pipeline


def test_empty_pipeline_round_trips(capsys):
    assert main([str(SDY), "--pass-pipeline=builtin.module()"]) == 0
    out, _ = capsys.readouterr()
    assert overlap_hlo.parse(out).operation.verify()
    assert "stablehlo.all_gather" in out


@pytest.mark.parametrize("text, message", [
    ("builtin.module(no-such-pass)", "unknown pass or bad pipeline element 'no-such-pass'"),
    ("builtin.module(overlap-all-gather-matmul{size=1})",
     "pass 'overlap-all-gather-matmul' has no option 'size'"),
    ("builtin.module(overlap-matmul-reduce-scatter{threshold-mib=big})",
     "option 'threshold-mib' expects float, got 'big'"),
    ("builtin.module(overlap-all-gather-matmul{threshold-mib})", "is not key=value"),
    ("builtin.module(overlap-all-gather-matmul{threshold-mib=-1})", "must be >= 0"),
    ("builtin.module(canonicalize", "malformed pipeline"),
], ids=["unknown-pass", "unknown-option", "bad-value", "no-value", "negative", "unbalanced"])
def test_bad_pipeline_is_a_usage_error(text, message, tmp_path, capsys):
    output = tmp_path / "out.mlir"
    assert main([str(SDY), f"--pass-pipeline={text}", "-o", str(output)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("overlap-opt: error: ") and message in err
    assert "Traceback" not in err
    assert not output.exists()


@pytest.mark.parametrize("argv", [
    ["--no-such-flag"],
    ["--threshold-mib=-1"],
    ["--threshold-mib=nan"],
    ["--threshold-mib=lots"],
    ["--verify-each=maybe"],
    ["--emit-bytecode", "--split-input-file"],
    ["a.mlir", "b.mlir"],
    ["--tpu=v9x:2x2"],
    ["--tpu=v5e-7"],
])
def test_bad_flags_are_usage_errors(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "overlap-opt: error:" in err and "Traceback" not in err


# Input and output.

def test_parse_error_is_reported_at_file_line_col(tmp_path, capsys):
    path = write(tmp_path, "bad.mlir", MALFORMED)
    assert main([str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert lines_of(err)[0] == (f"{path}:3:8: error: Dialect `foo' not found for "
                                "custom op 'foo.bar'")
    assert lines_of(err)[1].startswith(f"{path}:3:8: note: ")


def test_parse_error_on_stdin_names_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(MALFORMED.encode())))
    assert main(["-"]) == 1
    assert capsys.readouterr().err.startswith("<stdin>:3:8: error: ")


def test_empty_file_is_an_empty_module(tmp_path, capsys):
    assert main([str(write(tmp_path, "empty.mlir", ""))]) == 0
    assert capsys.readouterr().out == "module {\n}\n"


@pytest.mark.parametrize("make_path, reason", [
    (lambda tmp: tmp / "missing.mlir", "No such file or directory"),
    (lambda tmp: tmp, "Is a directory"),
], ids=["missing", "directory"])
def test_unreadable_input(make_path, reason, tmp_path, capsys):
    path = make_path(tmp_path)
    assert main([str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"overlap-opt: error: cannot read '{path}': {reason}\n"


def test_input_neither_text_nor_bytecode(tmp_path, capsys):
    path = write(tmp_path, "binary.mlir", b"\xff\xfe\x00module")
    assert main([str(path)]) == 1
    assert "neither UTF-8 text nor MLIR bytecode" in capsys.readouterr().err


def test_output_written_on_success_without_temporary_files(tmp_path, capsys):
    output = write(tmp_path, "out.mlir", "old contents\n")
    assert main([str(SDY), "--threshold-mib=0", "-o", str(output)]) == 0
    assert capsys.readouterr().out == ""
    assert "stablehlo.collective_permute" in output.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir"]


def test_output_in_place(tmp_path):
    path = write(tmp_path, "module.mlir", SDY.read_text())
    assert main([str(path), "--threshold-mib=0", "-o", str(path)]) == 0
    assert "stablehlo.collective_permute" in path.read_text()


def test_output_through_a_symlink_replaces_its_target(tmp_path):
    target = write(tmp_path, "real.mlir", "old contents\n")
    link = tmp_path / "link.mlir"
    link.symlink_to(target)
    assert main([str(SDY), "-o", str(link)]) == 0
    assert link.is_symlink() and "stablehlo.all_gather" in target.read_text()


def test_output_to_a_fifo_is_written_into_not_replaced(tmp_path):
    # Like /dev/null or /dev/stdout: never replace a file that is not a regular one.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()),
                              daemon=True)
    reader.start()
    try:
        assert main([str(SDY), "-o", str(fifo)]) == 0
    finally:
        reader.join(timeout=10)
        if reader.is_alive():  # main never opened it: let the reader go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert b"stablehlo.all_gather" in received[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_failed_run_never_clobbers_output(tmp_path, capsys):
    bad = write(tmp_path, "bad.mlir", MALFORMED)
    output = write(tmp_path, "out.mlir", "old contents\n")
    assert main([str(bad), "-o", str(output)]) == 1
    assert output.read_text() == "old contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.mlir", "out.mlir"]


def test_failed_write_removes_temporary_and_keeps_output(tmp_path, monkeypatch, capsys):
    output = write(tmp_path, "out.mlir", "old contents\n")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    assert main([str(SDY), "-o", str(output)]) == 1
    assert capsys.readouterr().err == (f"overlap-opt: error: cannot write '{output}': "
                                       "Permission denied\n")
    assert output.read_text() == "old contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir"]


def test_missing_output_directory(tmp_path, capsys):
    output = tmp_path / "no" / "such" / "out.mlir"
    assert main([str(SDY), "-o", str(output)]) == 1
    err = capsys.readouterr().err
    assert lines_of(err) == [f"overlap-opt: error: cannot write '{output}': directory "
                             f"'{output.parent}' does not exist"]


def test_output_is_a_directory(tmp_path, capsys):
    assert main([str(SDY), "-o", str(tmp_path)]) == 1
    assert "it is a directory" in capsys.readouterr().err


def test_bytecode_out_and_in(tmp_path, capsys):
    bytecode = tmp_path / "module.mlirbc"
    assert main([str(SDY), "--threshold-mib=0", "--emit-bytecode", "-o", str(bytecode)]) == 0
    assert bytecode.read_bytes().startswith(BYTECODE_MAGIC)
    assert main([str(bytecode), "--pass-pipeline=builtin.module()"]) == 0
    out, _ = capsys.readouterr()
    assert "stablehlo.collective_permute" in out and "stablehlo.all_gather" not in out


def test_bytecode_to_stdout(capsysbinary):
    assert main([str(SDY), "--emit-bytecode"]) == 0
    out = capsysbinary.readouterr().out
    assert out.startswith(BYTECODE_MAGIC)
    assert "stablehlo.all_gather" in str(overlap_hlo.parse(out))


def test_print_debuginfo(capsys):
    argv = [str(SDY), "--pass-pipeline=builtin.module()"]
    assert main(argv + ["--mlir-print-debuginfo"]) == 0
    assert "loc(" in capsys.readouterr().out
    assert main(argv) == 0
    assert "loc(" not in capsys.readouterr().out


# --split-input-file

SPLIT = f"""\
{SIMPLE.replace("@f", "@first")}// -----
func.func @second() -> tensor<2xf32> {{
  return %undefined : tensor<2xf32>
}}
// -----
{SIMPLE.replace("@f", "@third")}"""


def test_split_input_file_keeps_going_and_keeps_line_numbers(tmp_path, capsys):
    path = write(tmp_path, "split.mlir", SPLIT)
    assert main([str(path), "--split-input-file"]) == 1
    out, err = capsys.readouterr()
    assert lines_of(err) == [f"{path}:6:10: error: use of undeclared SSA value name"]
    first, third = out.split("// -----\n")
    assert "@first" in first and "@third" in third


def test_split_input_file_success_and_output_file(tmp_path, capsys):
    path = write(tmp_path, "split.mlir", SPLIT.replace("return %undefined", "return %a")
                 .replace("@second()", "@second(%a: tensor<2xf32>)"))
    output = tmp_path / "out.mlir"
    assert main([str(path), "--split-input-file", "-o", str(output)]) == 0
    chunks = output.read_text().split("// -----\n")
    assert [re.search(r"@\w+", c).group() for c in chunks] == ["@first", "@second", "@third"]


def test_split_input_file_failure_writes_no_output_file(tmp_path, capsys):
    path = write(tmp_path, "split.mlir", SPLIT)
    output = tmp_path / "out.mlir"
    assert main([str(path), "--split-input-file", "-o", str(output)]) == 1
    assert not output.exists()


def test_without_split_the_marker_is_a_comment(tmp_path, capsys):
    path = write(tmp_path, "two.mlir", SIMPLE.replace("@f", "@g") + "// -----\n" + SIMPLE)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "@g" in out and "@f" in out and "// -----" not in out


# --verify-diagnostics

VERIFY = """\
func.func @parse_error() {
  // expected-error@+1 {{Dialect `foo' not found}}
  %0 = foo.bar
}
// -----
func.func @verifier_error(%a: tensor<2xf32>) -> tensor<3xf32> {
  // expected-error@below {{doesn't match function result type}}
  // expected-note@below {{see current operation}}
  return %a : tensor<2xf32>
}
// -----
func.func @fine(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
"""


def test_verify_diagnostics_all_matched(tmp_path, capsys):
    path = write(tmp_path, "verify.mlir", VERIFY)
    assert main([str(path), "--split-input-file", "--verify-diagnostics"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "@fine" in out and "@verifier_error" not in out


def test_verify_diagnostics_mismatch(tmp_path, capsys):
    text = VERIFY.replace("{{Dialect `foo' not found}}", "{{some other message}}")
    path = write(tmp_path, "verify.mlir", text)
    assert main([str(path), "--split-input-file", "--verify-diagnostics"]) == 1
    assert lines_of(capsys.readouterr().err) == [
        f"{path}:3:8: error: unexpected error: Dialect `foo' not found for custom op "
        "'foo.bar'",
        f"{path}:2:6: error: expected error \"some other message\" was not produced",
    ]


def test_verify_diagnostics_with_remarks(tmp_path, capsys):
    lines = SDY.read_text().splitlines()
    gather = next(i for i, line in enumerate(lines) if '"stablehlo.all_gather"' in line)
    lines.insert(gather, "// expected-remark@+1 {{overlap-all-gather-matmul: rewritten}}")
    scatter = next(i for i, line in enumerate(lines) if '"stablehlo.reduce_scatter"' in line)
    lines.insert(scatter + 1,
                 "// expected-remark@-1 {{overlap-matmul-reduce-scatter: rewritten}}")
    path = write(tmp_path, "remarks.mlir", "\n".join(lines) + "\n")
    argv = [str(path), "--verify-diagnostics", "--remarks"]
    assert main(argv + ["--threshold-mib=0"]) == 0
    capsys.readouterr()
    assert main(argv) == 1  # under the default threshold both are left unchanged
    err = capsys.readouterr().err
    assert err.count("unexpected remark:") == 2 and err.count("was not produced") == 2
    assert main([str(path), "--verify-diagnostics", "--threshold-mib=0"]) == 1  # no --remarks
    assert capsys.readouterr().err.count("expected remark") == 2


def test_expectation_designators():
    text = "\n".join([
        "a",                                      # 1
        "b // expected-error {{here}}",           # 2
        "// expected-warning@+2 {{plus}}",        # 3
        "// expected-remark@below {{below}}",     # 4
        "c",                                      # 5
        "// expected-note@above {{above}}",       # 6
        "// expected-error@-5 {{minus}}",         # 7
        "// expected-error@unknown {{nowhere}}",  # 8
        "// expected-error@below {{dangling}}",   # 9
    ])
    found = {e.text: (e.kind, e.line) for e in parse_expectations(text, "f.mlir")}
    assert found == {"here": ("error", 2), "plus": ("warning", 5), "below": ("remark", 5),
                     "above": ("note", 5), "minus": ("error", 2),
                     "nowhere": ("error", None), "dangling": ("error", 10)}


# --remarks

def test_remarks_report_each_site(capsys):
    assert main([str(SDY), "--remarks", "--threshold-mib=0"]) == 0
    err = lines_of(capsys.readouterr().err)
    assert len(err) == 3
    assert err[0].startswith(f"{SDY}:8:12: remark: overlap-all-gather-matmul: rewritten: ")
    assert err[1].startswith(f"{SDY}:12:12: remark: overlap-matmul-reduce-scatter: "
                             "rewritten: ")
    assert err[2] == "overlap-opt: 2 of 2 sites rewritten"   # the tally, as compilers end


def test_remarks_for_sites_left_unchanged(capsys):
    assert main([str(SDY), "--remarks"]) == 0
    err = lines_of(capsys.readouterr().err)
    assert len(err) == 3
    assert all(": left unchanged: " in line and "below threshold-mib=1" in line
               for line in err[:2])
    assert err[2] == ("overlap-opt: 0 of 2 sites rewritten; 2 left unchanged "
                      "(below threshold-mib)")


@pytest.mark.parametrize("named, left", [
    ("shard_map_sdy.mlir:12:12", 1),                          # a trailing part of the path
    ("other.mlir:8:12,data/shard_map_sdy.mlir:12:12", 1),     # one of several
    ("shard_map_sdy.mlir:12:13", 0),                          # another column
    ("sdy.mlir:12:12", 0),                                    # not a whole path component
])
def test_keep_sites_leaves_the_sites_named(named, left, capsys):
    assert main([str(SDY), "--remarks", "--threshold-mib=0", f"--keep-sites={named}"]) == 0
    captured = capsys.readouterr()
    err = lines_of(captured.err)
    kept = [line for line in err if "left unchanged: its position is named by keep-sites" in line]
    assert len(kept) == left
    if left:
        assert kept[0].startswith(f"{SDY}:12:12: remark: overlap-matmul-reduce-scatter: ")
        assert "stablehlo.reduce_scatter" in captured.out
        assert err[-1] == ("overlap-opt: 1 of 2 sites rewritten; 1 left unchanged "
                           "(named by keep-sites)")
    else:
        assert err[-1] == "overlap-opt: 2 of 2 sites rewritten"


def test_keep_sites_in_pipeline_text(capsys):
    text = ("builtin.module(overlap-all-gather-matmul{threshold-mib=0 "
            "keep-sites=shard_map_sdy.mlir:8:12},overlap-matmul-reduce-scatter{threshold-mib=0})")
    assert main([str(SDY), f"--pass-pipeline={text}"]) == 0
    captured = capsys.readouterr()
    assert "stablehlo.all_gather" in captured.out and "stablehlo.reduce_scatter" not in captured.out
    assert captured.err == ("overlap-opt: 1 of 2 sites rewritten; 1 left unchanged "
                            "(named by keep-sites)\n")


def test_no_remarks_without_flag(capsys):
    assert main([str(SDY), "--threshold-mib=0"]) == 0
    assert capsys.readouterr().err == "overlap-opt: 2 of 2 sites rewritten\n"


# The one-line summary of a successful run (stderr; -q leaves it out).

@pytest.mark.parametrize("flag", ["-q", "--quiet"])
def test_quiet_leaves_out_the_summary(flag, tmp_path, capsys):
    assert main([str(SDY), "--threshold-mib=0", flag]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "stablehlo.collective_permute" in out
    # Warnings still come: every site below the threshold, nothing rewritten.
    assert main([str(SDY), flag, "-o", str(tmp_path / "out.mlir")]) == 0
    err = lines_of(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("overlap-opt: warning: ")


def test_summary_leaves_stdout_as_it_was(capsys):
    assert main([str(SDY), "--threshold-mib=0", "-q"]) == 0
    quiet = capsys.readouterr().out
    assert main([str(SDY), "--threshold-mib=0"]) == 0
    out, err = capsys.readouterr()
    assert out == quiet and "sites rewritten" not in out
    assert err == "overlap-opt: 2 of 2 sites rewritten\n"


def test_summary_counts_every_chunk(tmp_path, capsys):
    path = write(tmp_path, "two.mlir", SDY.read_text() + "// -----\n" + SDY.read_text())
    assert main([str(path), "--split-input-file", "--threshold-mib=0"]) == 0
    assert capsys.readouterr().err == "overlap-opt: 4 of 4 sites rewritten\n"


def test_summary_of_a_module_without_sites(tmp_path, capsys):
    assert main([str(write(tmp_path, "f.mlir", SIMPLE))]) == 0
    assert capsys.readouterr().err == "overlap-opt: no candidate sites\n"


def test_no_summary_after_a_failure_or_when_verifying_diagnostics(tmp_path, capsys):
    assert main([str(write(tmp_path, "bad.mlir", MALFORMED))]) == 1
    assert "sites" not in capsys.readouterr().err
    path = write(tmp_path, "split.mlir", SPLIT)   # one chunk of three fails
    assert main([str(path), "--split-input-file"]) == 1
    assert "sites" not in capsys.readouterr().err
    assert main([str(SDY), "--threshold-mib=0", "--verify-diagnostics"]) == 0
    assert capsys.readouterr().err == ""


# --verify-each, and what happens when a pass breaks the IR or crashes.

@dataclass(frozen=True)
class BreakResultType(RewritePass):
    """Test pass: changes the first function's result type without touching its body."""

    name = "test-break-result-type"
    summary = "leaves invalid IR"

    def run(self, module_op, log):
        func = module_op.regions[0].blocks[0].operations[0]
        with ir.Location.unknown():
            f32 = ir.F32Type.get()
            func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
                [ir.RankedTensorType.get([2], f32)], [ir.RankedTensorType.get([3], f32)]))


@dataclass(frozen=True)
class Crash(RewritePass):
    """Test pass: a bug."""

    name = "test-crash"
    summary = "raises"

    def run(self, module_op, log):
        raise ZeroDivisionError("bug in a pass")


@pytest.fixture
def extra_passes(monkeypatch):
    passes = {**pipeline.registered_passes(), BreakResultType.name: BreakResultType,
              Crash.name: Crash}
    monkeypatch.setattr(pipeline, "registered_passes", lambda: passes)


def test_verifier_runs_after_each_pass(extra_passes, tmp_path, capsys):
    path = write(tmp_path, "f.mlir", SIMPLE)
    output = tmp_path / "out.mlir"
    argv = [str(path), "--pass-pipeline=builtin.module(test-break-result-type)",
            "-o", str(output)]
    assert main(argv) == 1
    err = lines_of(capsys.readouterr().err)
    assert err[0] == (f"{path}:2:3: error: type of return operand 0 ('tensor<2xf32>') "
                      "doesn't match function result type ('tensor<3xf32>') in function @f")
    assert err[1].startswith(f"{path}:2:3: note: see current operation")
    assert not output.exists()


@pytest.mark.parametrize("flag", ["--verify-each=false", "--verify-each=0",
                                  "--no-verify-each"])
def test_verify_each_off(flag, extra_passes, tmp_path, capsys):
    path = write(tmp_path, "f.mlir", SIMPLE)
    assert main([str(path), "--pass-pipeline=builtin.module(test-break-result-type)",
                 flag]) == 0
    out = capsys.readouterr().out
    # Not verified, so printed in the generic form.
    assert '"func.func"()' in out and "-> tensor<3xf32>" in out


@pytest.mark.parametrize("flags", [[], ["--verify-each=true"], ["--verify-each"]])
def test_the_result_is_verified_by_default(flags, extra_passes, tmp_path, capsys):
    """By default once, on the pipeline's result; with --verify-each after each pass."""
    path = write(tmp_path, "f.mlir", SIMPLE)
    # A bare --verify-each takes no value: the path after it stays the input.
    assert main(flags + [str(path),
                         "--pass-pipeline=builtin.module(test-break-result-type)"]) == 1
    assert "doesn't match function result type" in capsys.readouterr().err


def test_crashing_pass_is_an_internal_error(extra_passes, tmp_path, capsys):
    path = write(tmp_path, "f.mlir", SIMPLE)
    output = tmp_path / "out.mlir"
    assert main([str(path), "--pass-pipeline=builtin.module(test-crash)",
                 "-o", str(output)]) == 1
    err = capsys.readouterr().err
    assert "overlap-opt: internal error" in err and "ZeroDivisionError: bug in a pass" in err
    assert not output.exists()


# Native-stderr reports, --list-passes, --version.

def test_mlir_timing(capfd):
    assert main([str(SDY), "--mlir-timing"]) == 0
    err = capfd.readouterr().err
    assert "Execution time report" in err
    assert "OverlapAllGatherMatmul" in err and "CSEPass" in err


def test_mlir_print_ir_after_all(capfd):
    assert main([str(SDY), "--threshold-mib=0", "--mlir-print-ir-after-all"]) == 0
    err = capfd.readouterr().err
    assert "IR Dump After OverlapAllGatherMatmul: overlap-all-gather-matmul" in err
    assert "IR Dump After CSEPass" in err
    assert "stablehlo.collective_permute" in err


def test_mlir_print_ir_before_all(capfd):
    assert main([str(SDY), "--mlir-print-ir-before-all",
                 "--pass-pipeline=builtin.module(cse)"]) == 0
    assert "IR Dump Before CSEPass" in capfd.readouterr().err


def test_list_passes(capsys):
    assert main(["--list-passes"]) == 0
    out = capsys.readouterr().out
    for name, cls in overlap_hlo.registered_passes().items():
        assert f"  {name}\n" in out and cls.summary in out
    # overlap-sequence-parallel and overlap-stack-in-place have no options
    every_pass = len(ALL_PASSES) - 2
    assert out.count("Options: none") == 2
    assert out.count("threshold-mib=<float>  (default: unset)") == every_pass
    assert out.count("bidirectional=<bool>  (default: unset)") == every_pass  # by the model
    # The gather pass's own option (2 for TPU and GPU, else 1).
    assert out.count("unroll=<int>  (default: unset)") == 1
    assert out.count("target=<str>  (default: unset)") == every_pass
    for profile in ("tpu-v4", "tpu-v5e", "tpu-v5p", "h100-sxm", "h200", "a100", "host-cpu"):
        assert f"  {profile}: " in out
    assert "canonicalize and cse" in out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("overlap-opt (overlap-hlo ")


@pytest.mark.parametrize("flags", [["--target=gpu"], ["--hardware=h100-sxm"]])
def test_gpu_output_names_the_flags_its_rings_need(flags, capsys):
    assert main([str(SDY), "--threshold-mib=0", *flags]) == 0
    err = lines_of(capsys.readouterr().err)
    assert err[0] == "overlap-opt: 2 of 2 sites rewritten"
    assert err[1].startswith('overlap-opt: compile the output for GPU with XLA_FLAGS="'
                             "--xla_gpu_enable_latency_hiding_scheduler=true ")
    assert "--xla_gpu_dot_merger_threshold_mb=0" in err[1]
    assert main([str(SDY), "--threshold-mib=0", "--target=tpu"]) == 0   # none on TPU
    assert "XLA_FLAGS" not in capsys.readouterr().err
