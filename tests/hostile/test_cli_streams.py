"""overlap-opt with broken streams, signals and odd paths: one diagnostic line, the
documented exit status, no traceback, no temporary file left behind.

Most tests run `main` in-process; closed descriptors, a full disk, memory limits and
signals need a process of their own.
"""
from __future__ import annotations

import io
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import DATA, ROOT, one_error_line
from overlap_hlo.tools import cli
from overlap_hlo.tools.overlap_opt import main

SDY = DATA / "shard_map_sdy.mlir"
TOOL = [sys.executable, "-m", "overlap_hlo.tools.overlap_opt"]


def tool(*args: str, stdout=subprocess.PIPE, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*TOOL, *args], stdout=stdout, stderr=subprocess.PIPE, cwd=ROOT,
                          **kwargs)


# Streams.

def test_stdout_on_a_full_disk():
    with open("/dev/full", "wb") as full:
        done = tool(str(SDY), stdout=full)
    assert done.returncode == 1
    assert one_error_line(done.stderr) == ("overlap-opt: error: cannot write to stdout: "
                                           "No space left on device")


def test_output_file_on_a_full_disk(capsys):
    assert main([str(SDY), "-o", "/dev/full"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-opt: error: cannot write '/dev/full': No space left on device")


@pytest.mark.parametrize("redirect, flags, code, message", [
    ("<&-", [], 1, "overlap-opt: error: cannot read stdin: it is closed"),
    (">&-", [str(SDY)], 1, "overlap-opt: error: cannot write to stdout: it is closed"),
    ("<&-", [str(SDY), "-o", "{out}"], 0, None),
    (">&-", [str(SDY), "-o", "{out}"], 0, None),
    ("2>&-", ["/no/such/input.mlir", "-o", "{out}"], 1, None),
], ids=["stdin-closed", "stdout-closed", "stdin-closed-unused", "stdout-closed-unused",
        "stderr-closed"])
def test_closed_standard_streams(redirect, flags, code, message, tmp_path):
    out = tmp_path / "out.mlir"
    argv = " ".join(f"'{arg.format(out=out)}'" for arg in [*TOOL, *flags])
    done = subprocess.run(f"exec {argv} {redirect}", shell=True, capture_output=True,
                          cwd=ROOT)
    assert done.returncode == code, done.stderr
    if message is not None:
        assert one_error_line(done.stderr) == message
    elif redirect == "2>&-":
        assert done.stdout == b"" and not out.exists()
    else:   # the run succeeds: its summary, then a warning (every site below the threshold)
        summary, warning = done.stderr.decode().splitlines()
        assert summary == ("overlap-opt: 0 of 2 sites rewritten; 2 left unchanged "
                           "(below threshold-mib)")
        assert warning.startswith("overlap-opt: warning: ") and "below threshold-mib" in warning
        assert b"stablehlo.all_gather" in out.read_bytes()


def test_closed_streams_in_process(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", None)
    assert main([]) == 1
    assert one_error_line(capsys.readouterr().err).endswith("cannot read stdin: it is closed")
    monkeypatch.setattr(sys, "stdout", None)
    assert main([str(SDY)]) == 1
    assert one_error_line(capsys.readouterr().err).endswith(
        "cannot write to stdout: it is closed")


# Inputs without an end.

def test_input_over_the_size_limit(monkeypatch, capsys):
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 20)
    assert main(["/dev/zero"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-opt: error: cannot read '/dev/zero': larger than the input limit of 1 MiB")


def test_stdin_out_of_memory(monkeypatch, capsys):
    class Endless(io.RawIOBase):
        calls = 0

        def readable(self):
            return True

        def readinto(self, buffer):
            Endless.calls += 1
            if Endless.calls > 2:
                raise MemoryError
            buffer[:] = bytes(len(buffer))
            return len(buffer)

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Endless())))
    assert main([]) == 1
    assert one_error_line(capsys.readouterr().err).startswith(
        "overlap-opt: error: cannot read stdin: out of memory after ")


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")   # preexec_fn sets the limit
def test_dev_zero_under_a_memory_limit():
    limit = 1 << 30   # well above the ~450 MB an idle overlap-opt maps

    def restrict():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = tool("/dev/zero", preexec_fn=restrict)
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert line.startswith("overlap-opt: error: cannot read '/dev/zero': ")
    assert "out of memory after" in line or "larger than the input limit" in line


# Signals: the child stops at a chosen point and says so; then the signal comes.

STOP_IN_WRITE = """
import faulthandler, os, sys, signal
faulthandler.enable()
from overlap_hlo.tools import overlap_opt
real_chmod = os.chmod
def chmod(path, mode):      # the temporary file is written and not yet renamed
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    signal.pause()
os.chmod = chmod
sys.exit(overlap_opt.main(sys.argv[1:]))
"""

STOP_IN_PASS = """
import faulthandler, sys, signal
faulthandler.enable()
from overlap_hlo.rewrite.scan import ModuleScan
from overlap_hlo.tools import overlap_opt
def scan(self, *args):      # inside pm.run: MLIR's pass manager is on the stack
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    signal.pause()
ModuleScan.__init__ = scan
sys.exit(overlap_opt.main(sys.argv[1:]))
"""


def interrupted(script: str, signum: int, out: Path) -> subprocess.CompletedProcess:
    child = subprocess.Popen([sys.executable, "-c", script, str(SDY), "--threshold-mib=0",
                              "-o", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert child.stdout.readline() == b"ready\n"
        child.send_signal(signum)
        stdout, stderr = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:   # say where it waits (faulthandler, below)
        child.send_signal(signal.SIGABRT)
        stdout, stderr = child.communicate(timeout=30)
        raise AssertionError(f"no exit 120 s after the signal:\n{stderr.decode()}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


# The kernel may hand a process's signal to any thread that does not block it, not
# only to the main thread, which runs Python's handlers: here a bystander thread gets
# it while the pass waits (before, the main thread then waited for the pass forever).
SIGNAL_TO_ANOTHER_THREAD = """
import sys, signal, threading, time
from overlap_hlo.rewrite.scan import ModuleScan
from overlap_hlo.tools import overlap_opt
bystander = threading.Thread(target=lambda: time.sleep(600), daemon=True)
bystander.start()
def scan(self, *args):
    time.sleep(0.5)   # the main thread is in its join by now
    signal.pthread_kill(bystander.ident, signal.SIGTERM)
    signal.pause()
ModuleScan.__init__ = scan
sys.exit(overlap_opt.main(sys.argv[1:]))
"""


def test_a_signal_another_thread_receives_ends_the_run(tmp_path):
    out = tmp_path / "out.mlir"
    done = subprocess.run([sys.executable, "-c", SIGNAL_TO_ANOTHER_THREAD, str(SDY),
                           "--threshold-mib=0", "-o", str(out)], capture_output=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == -signal.SIGTERM
    assert one_error_line(done.stderr) == "overlap-opt: error: interrupted by SIGTERM"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", [STOP_IN_WRITE, STOP_IN_PASS], ids=["write", "pass"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT],
                         ids=["SIGTERM", "SIGINT"])
def test_signal_leaves_no_temporary_file(script, signum, tmp_path):
    out = tmp_path / "out.mlir"
    out.write_text("precious")
    done = interrupted(script, signum, out)
    assert done.returncode == -signum    # dies of the signal: the shell shows 128 + signum
    assert one_error_line(done.stderr) == (f"overlap-opt: error: interrupted by "
                                           f"{signal.Signals(signum).name}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir"]
    assert out.read_text() == "precious"


# Output paths.

def test_output_name_ending_in_a_slash(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([str(SDY), "-o", "notexist.mlir/"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-opt: error: cannot write 'notexist.mlir/': not a directory (the name "
        "ends with '/')")
    assert list(tmp_path.iterdir()) == []


def test_output_below_a_regular_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("file.mlir").write_text("precious")
    assert main([str(SDY), "-o", "file.mlir/out.mlir"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-opt: error: cannot write 'file.mlir/out.mlir': 'file.mlir' is not a "
        "directory")
    assert Path("file.mlir").read_text() == "precious"


def test_dangling_symlink_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("nowhere/x.mlir", "lost.mlir")
    assert main([str(SDY), "-o", "lost.mlir"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-opt: error: cannot write 'lost.mlir': it is a symbolic link to "
        "'nowhere/x.mlir', whose directory does not exist")
    # A dangling link into a directory that exists is written through, as open() would.
    os.symlink("target.mlir", "link.mlir")
    assert main([str(SDY), "-o", "link.mlir"]) == 0
    assert os.path.islink("link.mlir") and "stablehlo" in Path("target.mlir").read_text()


def test_symlink_loop_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("loop.mlir", "loop.mlir")
    assert main([str(SDY), "-o", "loop.mlir"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-opt: error: cannot write 'loop.mlir': Too many levels of symbolic links")
    assert os.path.islink("loop.mlir")


def test_empty_output_name(capsys):
    assert main([str(SDY), "-o", ""]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "overlap-opt: error: cannot write '': the file name is empty")


def test_pipeline_nested_too_deeply_is_one_short_usage_error(capsys):
    pipeline = "builtin.module(" + "func.func(" * 10_000 + "cse" + ")" * 10_001
    assert main([str(SDY), f"--pass-pipeline={pipeline}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("overlap-opt: error: malformed pipeline 'builtin.module(func.func(")
    assert line.endswith("...': anchors nested deeper than 64 levels at column 656")


def test_large_regular_file_is_refused_unread(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 20)
    big = tmp_path / "big.mlir"
    with open(big, "wb") as file:
        file.truncate(3 << 20)   # sparse: nothing to read until someone reads it
    assert main([str(big)]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"overlap-opt: error: cannot read '{big}': 3 MiB, larger than the input limit of "
        "1 MiB")
