"""tools/cli.py, the command-line core of overlap-opt and overlap-report, on its own:
bounded reads, input decoding, output-path checks, atomic writes, stdout, pass flags.
Nothing here parses or compiles a module."""
from __future__ import annotations

import argparse
import errno
import io
import os
import stat
import sys

import pytest

import overlap_hlo
from overlap_hlo.api import BYTECODE_MAGIC, UTF8_BOM
from overlap_hlo.tools import cli
from overlap_hlo.tools.cli import CliError


def refused(call, *args) -> str:
    with pytest.raises(CliError) as info:
        call(*args)
    assert info.value.exit_code == cli.EXIT_FAILURE
    return str(info.value)


# Input.

def test_read_bounded_stops_past_the_limit(monkeypatch):
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 10)
    monkeypatch.setattr(cli, "READ_CHUNK", 100)
    assert cli.read_bounded(io.BytesIO(b"x" * 1024), "stdin") == b"x" * 1024
    stream = io.BytesIO(b"x" * 5000)
    assert refused(cli.read_bounded, stream, "stdin") == (
        "cannot read stdin: larger than the input limit of 1 KiB")
    assert stream.tell() == 1025   # read one byte past the limit, no more


def test_read_bounded_refuses_a_large_file_unread(monkeypatch):
    class Unreadable(io.RawIOBase):
        def read(self, size=-1):
            pytest.fail("read")

    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 20)
    assert refused(cli.read_bounded, Unreadable(), "'big.mlir'", False, 3 << 20) == (
        "cannot read 'big.mlir': 3 MiB, larger than the input limit of 1 MiB")


def test_read_bounded_text_stream_and_errors():
    assert cli.read_bounded(io.StringIO("é"), "stdin", text=True) == "é".encode()

    class Failing(io.RawIOBase):
        def read(self, size=-1):
            raise OSError(errno.EIO, "Input/output error")

    assert refused(cli.read_bounded, Failing(), "stdin") == (
        "cannot read stdin: Input/output error")


def test_read_input(tmp_path, monkeypatch):
    source = tmp_path / "in.mlir"
    source.write_bytes(b"module {}\n")
    assert cli.read_input(str(source)) == b"module {}\n"
    assert refused(cli.read_input, str(tmp_path / "missing.mlir")) == (
        f"cannot read '{tmp_path / 'missing.mlir'}': No such file or directory")
    assert refused(cli.read_input, str(tmp_path)) == f"cannot read '{tmp_path}': Is a directory"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"module {}\n")))
    assert cli.read_input("-") == b"module {}\n"
    monkeypatch.setattr(sys, "stdin", None)
    assert refused(cli.read_input, "-") == "cannot read stdin: it is closed"


@pytest.mark.parametrize("size, text", [(0, "0 bytes"), (1023, "1023 bytes"),
                                        (1536, "1.5 KiB"), (1 << 20, "1 MiB"),
                                        (2 << 30, "2 GiB")])
def test_size_text(size, text):
    assert cli.size_text(size) == text


def test_decode_input():
    assert cli.decode_input(b"module {}", "in.mlir") == "module {}"
    assert cli.decode_input(UTF8_BOM + "// é\n".encode(), "in.mlir") == "// é\n"
    bytecode = BYTECODE_MAGIC + bytes(range(256))   # not UTF-8, and not read here
    assert cli.decode_input(bytecode, "in.mlirbc") is bytecode
    assert refused(cli.decode_input, bytes(range(256)), "<stdin>") == (
        "'<stdin>' is neither UTF-8 text nor MLIR bytecode")
    assert refused(cli.decode_input, UTF8_BOM + b"\xff", "in.mlir") == (
        "'in.mlir' is neither UTF-8 text nor MLIR bytecode")


# Output paths.

@pytest.mark.parametrize("make, path, why", [
    (None, "", "the file name is empty"),
    (None, "dir", "it is a directory"),
    (None, "new.json/", "not a directory (the name ends with '/')"),
    (None, "file.json/out.json", "'file.json' is not a directory"),
    (None, "file.json/a/b/out.json", "'file.json' is not a directory"),
    (None, "missing/out.json", "directory 'missing' does not exist"),
    ("nowhere/x.json", "lost.json",
     "it is a symbolic link to 'nowhere/x.json', whose directory does not exist"),
    ("loop.json", "loop.json", "Too many levels of symbolic links"),
], ids=["empty", "directory", "slash", "below-a-file", "below-a-file-deeper", "missing-dir",
        "dangling-symlink", "symlink-loop"])
def test_check_output_path_refuses(tmp_path, monkeypatch, make, path, why):
    monkeypatch.chdir(tmp_path)
    os.mkdir("dir")
    open("file.json", "w").close()
    if make is not None:
        os.symlink(make, path)
    assert refused(cli.check_output_path, path) == f"cannot write '{path}': {why}"


def test_check_output_path_accepts(tmp_path, monkeypatch):
    """Each path it accepts, the tool's writer then writes (a dangling link's target
    is created)."""
    monkeypatch.chdir(tmp_path)
    open("file.json", "w").close()
    os.symlink("target.json", "link.json")   # dangling, into a directory that exists
    for path in ("new.json", "file.json", "link.json", str(tmp_path / "x.json"), os.devnull):
        assert cli.check_output_path(path) is None
        cli.write_file(path, b"{}")
        if path != os.devnull:
            assert open(path, "rb").read() == b"{}"
    assert (tmp_path / "target.json").read_bytes() == b"{}"


def test_check_stdout(monkeypatch):
    cli.check_stdout()
    monkeypatch.setattr(sys, "stdout", None)
    assert refused(cli.check_stdout) == "cannot write to stdout: it is closed"


# Writing.

def test_write_file_replaces_and_keeps_the_mode(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("old")
    os.chmod(out, 0o640)
    inode = os.stat(out).st_ino
    cli.write_file(str(out), b"new")
    assert out.read_bytes() == b"new" and os.stat(out).st_ino != inode
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    assert os.listdir(tmp_path) == ["out.json"]
    fresh = tmp_path / "fresh.json"
    cli.write_file(str(fresh), b"x")
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o666 & ~cli._umask()


def test_write_file_through_a_symlink_and_into_a_device(tmp_path):
    (tmp_path / "target.json").write_text("old")
    os.symlink("target.json", tmp_path / "link.json")
    cli.write_file(str(tmp_path / "link.json"), b"new")
    assert os.path.islink(tmp_path / "link.json")
    assert (tmp_path / "target.json").read_bytes() == b"new"
    cli.write_file(os.devnull, b"discarded")   # written into, never replaced
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    out.write_text("precious")

    def refuse(source, target):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    assert refused(cli.write_file, str(out), b"new") == (
        f"cannot write '{out}': Permission denied")
    assert os.listdir(tmp_path) == ["out.json"] and out.read_text() == "precious"
    assert cli._Interrupts.temporary is None


def test_write_file_to_a_full_disk():
    assert refused(cli.write_file, "/dev/full", b"x") == (
        "cannot write '/dev/full': No space left on device")


class FailingStdout(io.TextIOWrapper):
    def __init__(self, error: OSError):
        class Raw(io.RawIOBase):
            def writable(self):
                return True

            def write(self, data):
                raise error

        super().__init__(io.BufferedWriter(Raw()))


def test_write_stdout(monkeypatch, capsys):
    cli.write_stdout("é\n".encode())
    assert capsys.readouterr().out == "é\n"
    monkeypatch.setattr(sys, "stdout", FailingStdout(BrokenPipeError()))
    cli.write_stdout(b"x")   # the reader went away: nothing to say
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(sys, "stdout", FailingStdout(OSError(errno.ENOSPC,
                                                             "No space left on device")))
    assert refused(cli.write_stdout, b"x") == (
        "cannot write to stdout: No space left on device")


def test_error_never_fails(monkeypatch, capsys):
    cli.error("tool", "it broke \n")
    assert capsys.readouterr().err == "tool: error: it broke\n"
    monkeypatch.setattr(sys, "stderr", None)
    cli.error("tool", "nobody hears this")


# Flags.

def test_pass_flags():
    parser = argparse.ArgumentParser()
    cli.add_pass_flags(parser)
    assert cli.pass_flags(parser.parse_args([])) == {}
    args = parser.parse_args(["--threshold-mib=0.5", "--no-bidirectional", "--unroll=2",
                              "--f32-sums", "--target=tpu", "--hardware=tpu-v5e"])
    assert cli.pass_flags(args) == {"threshold_mib": 0.5, "bidirectional": False,
                                    "unroll": 2, "f32_sums": True, "target": "tpu",
                                    "hardware": "tpu-v5e"}


@pytest.mark.parametrize("argv, message", [
    (["--threshold-mib=nan"], "'nan' must be a number >= 0"),
    (["--threshold-mib=-1"], "'-1' must be a number >= 0"),
    (["--threshold-mib=lots"], "'lots' is not a number"),
    (["--unroll=0"], "'0' must be >= 1"),
    (["--unroll=1.5"], "'1.5' is not an integer"),
])
def test_pass_flag_values_are_checked(argv, message, capsys):
    parser = argparse.ArgumentParser(prog="tool")
    cli.add_pass_flags(parser)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(argv)
    assert info.value.code == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_boolean_and_version():
    assert [cli.boolean(t) for t in ("true", "ON", "1", "false", "Off", "0")] == [
        True, True, True, False, False, False]
    with pytest.raises(argparse.ArgumentTypeError, match="'maybe' is not true or false"):
        cli.boolean("maybe")
    assert cli.version("tool").startswith("tool (overlap-hlo ")
    assert ", jaxlib " in cli.version("tool")


def _declarations() -> dict:
    """Every registered pass's option fields by Python name, each from the first pass
    that declares it."""
    found = {}
    for cls in overlap_hlo.registered_passes().values():
        for f in cls.options().values():
            found.setdefault(f.name, f)
    return found


declared = _declarations()


@pytest.mark.parametrize("tool", ["overlap_opt", "report"])
def test_help_is_generated_from_the_passes(tool, capsys):
    """Both tools' --help: each pass flag's text is its RewritePass field's help (one
    declaration), the description lists every registered pass by its summary, and the
    threshold's default says what the tool does when it is unset."""
    import importlib

    import overlap_hlo
    module = importlib.import_module(f"overlap_hlo.tools.{tool}")
    assert module.main(["--help"]) == cli.EXIT_OK
    out = " ".join(capsys.readouterr().out.split())
    packed = "".join(out.split())   # argparse breaks lines after hyphens too
    for spec in cli.PASS_FLAGS:
        help_text = declared[spec.option].metadata["help"]
        assert "".join(help_text.split()).rstrip(".") in packed, spec.flag
    for name, cls in overlap_hlo.registered_passes().items():
        assert f"{name}: {' '.join(cls.summary.split())}" in out
    unset = {"overlap_opt": "Unset, with --hardware or --tpu: that profile's cost model "
                            "decides",
             "report": "Here a profile is always named (the slice's tpu-* profile or the "
                       "GPU's): unset, its cost model decides each site"}[tool]
    assert unset in out
    assert "(default: 1 MiB)" not in out


def test_pass_flags_are_the_pass_options():
    """Every flag names an option of a registered pass; the flags pass_flag_names lists."""
    assert cli.pass_flag_names() == ", ".join(s.flag for s in cli.PASS_FLAGS[:-1]) + \
        f" and {cli.PASS_FLAGS[-1].flag}"
    # Made from the declarations: every option but those no flag sets, each once, in the
    # passes' and their declarations' order.
    assert [spec.option for spec in cli.PASS_FLAGS] == [
        name for name, f in declared.items() if f.metadata.get("flag", True)]
    assert {"unroll", "f32_sums", "tpu_summing_rings"} <= {s.option for s in cli.PASS_FLAGS}
    assert "device_coords" not in {spec.option for spec in cli.PASS_FLAGS}   # --tpu sets it


def test_an_option_declared_once_gets_its_flag():
    """A new RewritePass field is a flag with nothing else to write: a switch for a
    bool, --no-X too when unset by default, a checked minimum for a number."""
    import argparse
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Declared:
        switch: bool = dataclasses.field(default=False, metadata={"help": "h"})
        either: bool | None = dataclasses.field(default=None, metadata={"help": "h"})
        count: int | None = dataclasses.field(default=None, metadata={
            "help": "h", "metavar": "N", "minimum": 2})

    parser = argparse.ArgumentParser(exit_on_error=False)
    for f in dataclasses.fields(Declared):
        spec = cli.PassFlag.of(f, Declared)
        parser.add_argument(spec.flag, dest=spec.option, default=None, **spec.parse)
    args = parser.parse_args(["--switch", "--no-either", "--count=3"])
    assert (args.switch, args.either, args.count) == (True, False, 3)
    with pytest.raises(argparse.ArgumentError, match="must be >= 2"):
        parser.parse_args(["--count=1"])
