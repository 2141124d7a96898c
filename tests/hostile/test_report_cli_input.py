"""overlap-report with hostile input, odd output paths, closed streams and signals: the
same behaviour as overlap-opt (both use tools/cli.py), one line per failure.

Most tests fail before compiling (`no_compile` makes sure); two compile a tiny module
for v5e:2x4 with libtpu, a few seconds each.
"""
from __future__ import annotations

import errno
import io
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from jaxlib.mlir import ir

import overlap_hlo
from harness import ROOT, one_error_line
from overlap_hlo.api import BYTECODE_MAGIC, UTF8_BOM
from overlap_hlo.targets import report, tpu_plugin
from overlap_hlo.tools import cli
from overlap_hlo.tools.report import main

EXAMPLE = ROOT / "examples" / "tp_mlp.mlir"   # 8 partitions: one gather, one scatter
TOOL = [sys.executable, "-m", "overlap_hlo.tools.report"]
TPU = "--tpu=v5e:2x4"
needs_libtpu = pytest.mark.skipif(not tpu_plugin.available(),
                                  reason="libtpu is not installed: no TPU compiler")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@pytest.fixture
def no_compile(monkeypatch):
    monkeypatch.setattr(report, "build", lambda *a, **k: pytest.fail("compiled"))


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "in.mlir"
    path.write_bytes(EXAMPLE.read_bytes())
    return path


class StubReport:
    """What report.build returns, without compiling anything."""

    original = rewritten = None
    topology = "v5e:2x4"

    def format(self) -> str:
        return ""

    def to_json(self) -> dict:
        return {}


# Input.

def test_file_over_the_size_limit(source, monkeypatch, capsys, no_compile):
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 10)
    size = cli.size_text(source.stat().st_size)
    assert main([str(source), TPU]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"overlap-report: error: cannot read '{source}': {size}, larger than the input "
        "limit of 1 KiB")


def test_stdin_over_the_size_limit(monkeypatch, capsys, no_compile):
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 10)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"/" * 5000)))
    assert main([TPU]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-report: error: cannot read stdin: larger than the input limit of 1 KiB")


def test_binary_garbage(tmp_path, capsys, no_compile):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 8)
    assert main([str(garbage), TPU]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"overlap-report: error: '{garbage}' is neither UTF-8 text nor MLIR bytecode")


def test_bytecode_is_read_as_bytecode(tmp_path, monkeypatch, capsys):
    buffer = io.BytesIO()
    overlap_hlo.parse(EXAMPLE.read_text()).operation.write_bytecode(buffer)
    assert buffer.getvalue().startswith(BYTECODE_MAGIC)
    (tmp_path / "in.mlirbc").write_bytes(buffer.getvalue())
    modules = []
    monkeypatch.setattr(report, "build", lambda module, *a, **k: modules.append(module)
                        or StubReport())
    assert main([str(tmp_path / "in.mlirbc"), TPU]) == 0, capsys.readouterr().err
    (module,) = modules
    assert isinstance(module, ir.Module) and "stablehlo.all_gather" in str(module)
    (tmp_path / "bad.mlirbc").write_bytes(BYTECODE_MAGIC + bytes(range(256)) * 4)
    assert main([str(tmp_path / "bad.mlirbc"), TPU]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("overlap-report: error: ") and "neither UTF-8" not in line


def test_deep_nesting_is_one_line(tmp_path, capsys, no_compile):
    deep = tmp_path / "deep.mlir"
    deep.write_text("module {" * 300 + "}" * 300 + "\n")
    assert main([str(deep), TPU]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"overlap-report: error: {deep}:1:")
    assert f"nested deeper than {overlap_hlo.api.MAX_NESTING} levels" in line


@needs_libtpu
def test_byte_order_mark_then_json_replaced_atomically(source, tmp_path, capsys):
    """A BOM-prefixed module compiles (sites keep their lines) and an existing --json
    file is replaced, keeping its mode, with no temporary file left beside it."""
    source.write_bytes(UTF8_BOM + EXAMPLE.read_bytes())
    out = tmp_path / "out.json"
    out.write_text("old")
    os.chmod(out, 0o640)
    code = main([str(source), TPU, f"--json={out}"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert printed.err == "" and printed.out.startswith("location")
    data = json.loads(out.read_text())
    assert [site["location"] for site in data["sites"]] == [f"{source}:6:12",
                                                            f"{source}:12:12"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["in.mlir", "out.json"]


# Output paths: refused before reading the input or compiling.

@pytest.mark.parametrize("flag, path, why", [
    ("--json", "", "the file name is empty"),
    ("--json", "{dir}", "it is a directory"),
    ("--json", "{dir}/no/such/dir/out.json", "directory '{dir}/no/such/dir' does not exist"),
    ("--json", "{dir}/in.mlir/out.json", "'{dir}/in.mlir' is not a directory"),
    ("--timeline", "{dir}/pictures.svg", "it is a directory"),
    ("--timeline", "{dir}/no/t.svg", "directory '{dir}/no' does not exist"),
], ids=["json-empty", "json-directory", "json-missing-dir", "json-below-a-file",
        "timeline-directory", "timeline-missing-dir"])
def test_output_paths_are_checked_first(flag, path, why, source, tmp_path, capsys,
                                        no_compile):
    (tmp_path / "pictures.svg").mkdir()
    path, why = path.format(dir=tmp_path), why.format(dir=tmp_path)
    # The other output is fine: each is checked.
    other = (f"--timeline={tmp_path / 't.svg'}" if flag == "--json"
             else f"--json={tmp_path / 'r.json'}")
    assert main([str(source), TPU, other, f"{flag}={path}"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"overlap-report: error: cannot write '{path}': {why}")
    assert sorted(os.listdir(tmp_path)) == ["in.mlir", "pictures.svg"]


@needs_libtpu
def test_failed_write_leaves_no_temporary_file(source, tmp_path, monkeypatch, capsys):
    out, svg = tmp_path / "out.json", tmp_path / "t.svg"
    svg.write_text("precious")
    real_replace = os.replace

    def replace(temporary, target):
        if os.fspath(target) == str(svg):
            raise OSError(errno.EACCES, "Permission denied")
        real_replace(temporary, target)

    monkeypatch.setattr(os, "replace", replace)
    assert main([str(source), TPU, f"--json={out}", f"--timeline={svg}"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"overlap-report: error: cannot write '{svg}': Permission denied")
    assert sorted(os.listdir(tmp_path)) == ["in.mlir", "out.json", "t.svg"]
    assert svg.read_text() == "precious" and out.read_text().startswith("{")


def test_usage_errors_exit_2(source, capsys, no_compile):
    assert main([str(source), TPU, "--unroll=0"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-report: error: argument --unroll: '0' must be >= 1 (see --help)")


@pytest.mark.parametrize("flag, message", [
    ("--tpu=v9x:2x2", "argument --tpu: unknown TPU topology 'v9x:2x2' (expected "
                      "GENERATION:SHAPE"),
    ("--tpu=v5e-7", "argument --tpu: unknown TPU accelerator type 'v5e-7': v5e-N takes N "
                    "in 1, 4, 8,"),
    ("--tpu=h100:8", "argument --tpu: unknown TPU topology 'h100:8'"),
    ("--gpu=a100:7x", "argument --gpu: unknown GPU target 'a100:7x'"),
    ("--gpu=v5e:2x4", "argument --gpu: unknown GPU target 'v5e:2x4'"),
])
def test_unknown_topology_or_target_is_a_usage_error(source, capsys, no_compile, flag,
                                                     message):
    """Refused before the input is read or libtpu loaded: exit status 2, one line."""
    assert main([str(source), flag]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"overlap-report: error: {message}") and line.endswith(
        "(see --help)")


@pytest.mark.parametrize("name", ["v5e-8", "v5p-16", "v6e-8", "v4-8", "v5e:2x4"])
def test_accelerator_types_reach_the_report_as_given(source, monkeypatch, capsys, name):
    """The report describes the slice (tpu.topology maps an accelerator type to its
    shape, tests/targets/test_tpu_names.py) and names it as the user did."""
    asked = []
    monkeypatch.setattr(report, "build", lambda module, topology, *a, **k:
                        asked.append(topology) or StubReport())
    assert main([str(source), f"--tpu={name}"]) == 0, capsys.readouterr().err
    assert asked == [name]


# Closed streams and signals: a process of their own.

@pytest.mark.parametrize("redirect, flags, message", [
    ("<&-", [], "overlap-report: error: cannot read stdin: it is closed"),
    (">&-", [str(EXAMPLE)], "overlap-report: error: cannot write to stdout: it is closed"),
    ("2>&-", ["/no/such/input.mlir"], None),
], ids=["stdin-closed", "stdout-closed", "stderr-closed"])
def test_closed_standard_streams(redirect, flags, message):
    argv = " ".join(f"'{arg}'" for arg in [*TOOL, *flags, TPU])
    done = subprocess.run(f"exec {argv} {redirect}", shell=True, capture_output=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 1, done.stderr
    if message is None:
        assert done.stdout == b""
    else:
        assert one_error_line(done.stderr) == message


STUB = """
import os, sys, signal, time
from overlap_hlo.targets import report, tpu_plugin
from overlap_hlo.tools import report as report_cli
sys.path[:0] = sys.argv.pop(1).split(os.pathsep)
from test_report_cli_input import StubReport
report.build = lambda *args, **kwargs: StubReport()
"""

STOP_IN_WRITE = STUB + """
def chmod(path, mode):      # the temporary file is written and not yet renamed
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    signal.pause()
os.chmod = chmod
sys.exit(report_cli.main(sys.argv[1:]))
"""

STOP_IN_BUILD = STUB + """
def build(*args, **kwargs):  # as overlap_hlo.targets.tpu compiles: fd 2 sent elsewhere
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    time.sleep(100)
report.build = build
sys.exit(report_cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("script, signum", [(STOP_IN_WRITE, signal.SIGTERM),
                                            (STOP_IN_BUILD, signal.SIGINT)],
                         ids=["write-SIGTERM", "build-SIGINT"])
def test_signal_leaves_no_temporary_file(script, signum, source, tmp_path):
    out = tmp_path / "out.json"
    out.write_text("precious")
    here = os.pathsep.join([str(Path(__file__).parent), str(ROOT / "tests")])
    child = subprocess.Popen([sys.executable, "-c", script, here,
                              str(source), TPU, f"--json={out}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert child.stdout.readline() == b"ready\n"
        child.send_signal(signum)
        _, stderr = child.communicate(timeout=30)   # at once, not after the build
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signum
    assert one_error_line(stderr) == (f"overlap-report: error: interrupted by "
                                      f"{signal.Signals(signum).name}")
    assert sorted(os.listdir(tmp_path)) == ["in.mlir", "out.json"]
    assert out.read_text() == "precious"
