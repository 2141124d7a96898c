"""What overlap-opt and overlap-report share as command-line tools: exit codes, one-line
errors, closed standard streams, signals, bounded input, checked and atomic output,
the pass flags and the version text.

Every failure the user can cause is a CliError, reported as one `PROG: error: ...`
line; SIGINT, SIGTERM and SIGHUP end the run in one line too (see `guarded`).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import stat
import sys
import tempfile
import textwrap
import threading
import dataclasses
from dataclasses import dataclass, field

from overlap_hlo.api import BYTECODE_MAGIC, UTF8_BOM
from overlap_hlo.rewrite.pipeline import registered_passes
from overlap_hlo.rewrite.module_pass import option_type

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
STDIN_NAME = "<stdin>"
MAX_INPUT_BYTES = 2 << 30   # 2 GiB: more than XLA's protobuf-based compile path takes
READ_CHUNK = 64 << 20
INTERRUPTS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                   if hasattr(signal, name))


class CliError(Exception):
    """Reported as one `PROG: error: ...` line; ends the run with `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE):
        super().__init__(message)
        self.exit_code = exit_code


# Stderr.

def say(text: str) -> None:
    """One line on stderr; a stderr that cannot be written to is not an error."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(text, file=sys.stderr, flush=True)


def error(prog: str, message: str) -> None:
    say(f"{prog}: error: {message.rstrip()}")


def report_errors(prog: str, work) -> int:
    """`work()`'s exit status, or its CliError or running out of memory reported as
    one line and turned into the exit status."""
    try:
        return work()
    except CliError as err:
        error(prog, str(err))
        return err.exit_code
    except MemoryError:
        error(prog, "out of memory")
        return EXIT_FAILURE


# Standard streams and signals.

@contextlib.contextmanager
def guarded(prog: str):
    """Run a tool with closed standard streams guarded and interrupts handled."""
    with _closed_streams_guarded(), _interrupts_handled(prog):
        yield


@contextlib.contextmanager
def _closed_streams_guarded():
    """Run with stdin, stdout or stderr closed (`<&-`, `>&-`, `2>&-`).

    A closed descriptor 0-2 gets /dev/null, so that no file the tool opens takes its
    number (and nothing meant for the terminal lands in an output file); Python has
    already set the matching sys.stdin/sys.stdout to None, which read_input and
    check_stdout report as "closed". A missing sys.stderr writes to /dev/null.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.open(os.devnull, os.O_RDWR)   # the lowest free number: `fd`
    stderr = sys.stderr
    if stderr is None:
        sys.stderr = open(os.devnull, "w")
    try:
        yield
    finally:
        if stderr is None:
            sys.stderr.close()
            sys.stderr = stderr


class _Interrupts:
    """SIGINT, SIGTERM and SIGHUP: say so in one line, delete the temporary output file
    (if one exists), and die of the signal, as the default action would."""

    prog = ""
    temporary: str | None = None
    stderr = 2   # a copy of fd 2: still the user's while a library redirects fd 2

    @classmethod
    def handle(cls, signum, frame) -> None:
        path, cls.temporary = cls.temporary, None
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.write(cls.stderr, f"{cls.prog}: error: interrupted by "
                                 f"{signal.Signals(signum).name}\n".encode())
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def _interrupts_handled(prog: str):
    if threading.current_thread() is not threading.main_thread():
        yield   # signal handlers can only be installed from the main thread
        return
    _Interrupts.prog = prog
    with contextlib.suppress(OSError):
        _Interrupts.stderr = os.dup(2)   # overlap_hlo.targets.tpu sends fd 2 elsewhere at times
    previous = {signum: signal.signal(signum, _Interrupts.handle) for signum in INTERRUPTS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if _Interrupts.stderr != 2:
            os.close(_Interrupts.stderr)
            _Interrupts.stderr = 2


@contextlib.contextmanager
def _interrupts_blocked():
    """Hold the interrupting signals back (while a temporary file is created and
    recorded, so that none is left behind unrecorded)."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    previous = block(signal.SIG_BLOCK, INTERRUPTS)
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, previous)


# Input.

def read_input(path: str) -> bytes:
    """The whole input, at most MAX_INPUT_BYTES of it: stdin for '-', a file, a device."""
    if path == "-":
        if sys.stdin is None:
            raise CliError("cannot read stdin: it is closed")
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:   # a text stream put in place of stdin
            return read_bounded(sys.stdin, "stdin", text=True)
        return read_bounded(stream, "stdin")
    try:
        with open(path, "rb") as file:
            return read_bounded(file, f"'{path}'", size=os.fstat(file.fileno()).st_size)
    except OSError as err:
        raise CliError(f"cannot read '{path}': {err.strerror or err}") from None


def read_bounded(stream, name: str, text: bool = False, size: int = 0) -> bytes:
    """All of `stream`, or CliError once it holds more than MAX_INPUT_BYTES or memory
    runs out (`/dev/zero`, an endless pipe). `size`: what fstat says (0 if unknown)."""
    limit = MAX_INPUT_BYTES
    too_large = f"larger than the input limit of {size_text(limit)}"
    if size > limit:   # a regular file: no need to read it first
        raise CliError(f"cannot read {name}: {size_text(size)}, {too_large}")
    chunks, size = [], 0
    try:
        while size <= limit:
            chunk = stream.read(min(READ_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk.encode("utf-8") if text else chunk)
            size += len(chunks[-1])
        if size > limit:
            raise CliError(f"cannot read {name}: {too_large}")
        return b"".join(chunks)
    except MemoryError:
        chunks.clear()
        raise CliError(f"cannot read {name}: out of memory after {size_text(size)}") from None
    except OSError as err:
        raise CliError(f"cannot read {name}: {err.strerror or err}") from None


def size_text(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g} {unit}"
    return f"{size} bytes"


def decode_input(data: bytes, name: str) -> str | bytes:
    """MLIR bytecode (a portable artifact too) as bytes, else UTF-8 text without a
    leading byte order mark; anything else is a CliError."""
    if data.startswith(BYTECODE_MAGIC):
        return data
    if data.startswith(UTF8_BOM):   # as editors on Windows write it; not MLIR's
        data = data[len(UTF8_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"'{name}' is neither UTF-8 text nor MLIR bytecode") from None


# Output.

def check_stdout() -> None:
    if sys.stdout is None:
        raise CliError("cannot write to stdout: it is closed")


def check_output_path(path: str) -> None:
    """Refuse, before any work, an output file that cannot be written."""
    fail = lambda why: CliError(f"cannot write '{path}': {why}")  # noqa: E731
    if not path:
        raise fail("the file name is empty")
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        raise fail("it is a directory" if os.path.isdir(path) else
                   "not a directory (the name ends with '/')")
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ENOTDIR:
            raise fail(f"'{_first_existing_parent(path)}' is not a directory") from None
        if err.errno != errno.ENOENT:
            raise fail(err.strerror or str(err)) from None
    if os.path.islink(path) and not os.path.exists(path):
        # A dangling link: writing creates its target, if the target's directory exists.
        if not os.path.isdir(os.path.dirname(os.path.realpath(path))):
            raise fail(f"it is a symbolic link to '{os.readlink(path)}', whose "
                       "directory does not exist")
        return
    if not os.path.isdir(os.path.dirname(os.path.realpath(path))):
        raise fail(f"directory '{os.path.dirname(path)}' does not exist")


def _first_existing_parent(path: str) -> str:
    """The nearest ancestor of `path`, as the user spelled it, that exists."""
    parent = os.path.dirname(path.rstrip("/" + os.sep))
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return parent or "."


def write_file(path: str, payload: bytes) -> None:
    """Write `payload` to `path` atomically, or raise CliError (see `replace_file`)."""
    try:
        replace_file(path, payload)
    except OSError as err:
        raise CliError(f"cannot write '{path}': {err.strerror or err}") from None


def replace_file(path: str, payload: bytes) -> None:
    """Replace `path` atomically: a temporary file beside it, then os.replace.

    Through a symlink the target is replaced, not the link; a device or a FIFO
    (/dev/null, /dev/stdout) is written straight into, never replaced. The mode of an
    existing file is kept. A signal that ends the run deletes the temporary file.
    """
    existing = os.stat(path) if os.path.exists(path) else None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        with open(path, "wb") as file:
            file.write(payload)
        return
    target = os.path.realpath(path)
    mode = stat.S_IMODE(existing.st_mode) if existing else 0o666 & ~_umask()
    with _interrupts_blocked():
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(target),
                                         prefix=f".{os.path.basename(target)}.",
                                         suffix=".tmp")
        _Interrupts.temporary = temporary
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(payload)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    finally:
        _Interrupts.temporary = None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_stdout(payload: bytes) -> None:
    """Write to stdout; a reader that went away is not an error, a full disk is."""
    check_stdout()
    stream = getattr(sys.stdout, "buffer", None)
    try:
        sys.stdout.flush()
        if stream is not None:
            stream.write(payload)
            stream.flush()
        else:   # a text stream put in place of stdout
            sys.stdout.write(payload.decode("utf-8"))
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`overlap-opt x.mlir | head`): say nothing more.
        _discard_stdout()
    except OSError as err:   # a full disk (`> /dev/full`), a revoked terminal, ...
        _discard_stdout()
        raise CliError(f"cannot write to stdout: {err.strerror or err}") from None


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's last flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# Flags.

@dataclass(frozen=True)
class PassFlag:
    """A command-line flag for one option, set for every overlap pass that has it. What
    the option means (its help) and its default are the pass field's own; this says only
    how the flag parses."""

    option: str                          # the pass field, e.g. "threshold_mib"
    parse: dict = field(default_factory=dict)   # argparse keywords: type, action, ...
    text: str = ""                       # the field's help

    @classmethod
    def of(cls, f: dataclasses.Field, owner: type) -> PassFlag:
        """The flag of field `f` of pass `owner`: a bool is a switch (with --no-X when
        its default is unset), a number with a `minimum` is checked against it."""
        kind, meta = option_type(owner, f.name), f.metadata
        if kind is bool:
            return cls(f.name, {"action": argparse.BooleanOptionalAction} if f.default is None
                       else {"action": "store_const", "const": True}, meta.get("help", ""))
        parse = {key: meta[key] for key in ("metavar", "choices") if key in meta}
        if "minimum" in meta:
            parse["type"] = _at_least(kind, meta["minimum"],
                                      "a number" if kind is float else "an integer")
        return cls(f.name, parse, meta.get("help", ""))

    @property
    def flag(self) -> str:
        return "--" + self.option.replace("_", "-")

    def help(self, note: str = "") -> str:
        """The field's help, then what `note` adds for this tool, for argparse."""
        text = self.text
        if note:
            text = f"{text.rstrip('.')}. {note}"
        return text.replace("%", "%%")


def add_pass_flags(parser: argparse.ArgumentParser, notes: dict[str, str] | None = None
                   ) -> None:
    """The flags that set options of every overlap pass the pipeline text leaves unset;
    `notes`: option -> what this tool adds to its help (what it sets by default)."""
    for spec in PASS_FLAGS:
        parser.add_argument(spec.flag, dest=spec.option, default=None,
                            help=spec.help((notes or {}).get(spec.option, "")), **spec.parse)


def pass_flags(args: argparse.Namespace) -> dict:
    """The pass options `add_pass_flags` set, as keyword options (unset ones left out)."""
    given = {spec.option: getattr(args, spec.option) for spec in PASS_FLAGS}
    return {key: value for key, value in given.items() if value is not None}


def pass_flag_names() -> str:
    """"--threshold-mib, --hardware, ... and --own-shard-last", for help texts."""
    flags = [spec.flag for spec in PASS_FLAGS]
    return ", ".join(flags[:-1]) + " and " + flags[-1]


HELP_WIDTH = 88


def paragraphs(*texts: str) -> str:
    """Help text for argparse's RawDescriptionHelpFormatter: each text wrapped to
    HELP_WIDTH, except one already broken into lines (a list), kept as it is."""
    return "\n\n".join(text if "\n" in text else textwrap.fill(text, HELP_WIDTH)
                       for text in texts)


def pattern_list() -> str:
    """Every registered pass with its summary, for --help descriptions."""
    return "\n".join(textwrap.fill(f"{name}: {cls.summary}", HELP_WIDTH, initial_indent="  ",
                                   subsequent_indent="      ")
                     for name, cls in registered_passes().items())


def boolean(text: str) -> bool:
    """An argparse type: true/1/on or false/0/off."""
    lowered = text.lower()
    if lowered in ("true", "1", "on"):
        return True
    if lowered in ("false", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"'{text}' is not true or false")


def tpu_slice(text: str) -> str:
    """An argparse type: a TPU slice, GENERATION:SHAPE or an accelerator type such as
    v5e-8 (overlap_hlo.targets.tpu.slice_name), kept as given; another name is a usage
    error. Imports the TPU module, not libtpu, and only when a slice is named."""
    from overlap_hlo.targets import tpu

    try:
        tpu.slice_name(text)
    except tpu.UnknownTopology as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def gpu_target(text: str) -> str:
    """An argparse type: a GPU target such as h100:8 (overlap_hlo.targets.gpu.parse),
    kept as given; another name is a usage error."""
    from overlap_hlo.targets import gpu

    try:
        gpu.parse(text)
    except gpu.UnknownTarget as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _at_least(kind: type, low, name: str):
    """An argparse type: `kind(text)`, not nan, and >= `low`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {name}") from None
        if math.isnan(value) or value < low:
            what = "a number " if kind is float else ""
            raise argparse.ArgumentTypeError(f"'{text}' must be {what}>= {low}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _pass_flags() -> tuple[PassFlag, ...]:
    """One flag per option of the registered passes that the command line sets, in the
    passes' and their declarations' order."""
    flags: dict[str, PassFlag] = {}
    for cls in registered_passes().values():
        for f in cls.options().values():
            if f.metadata.get("flag", True) and f.name not in flags:
                flags[f.name] = PassFlag.of(f, cls)
    return tuple(flags.values())


PASS_FLAGS = _pass_flags()


def version(prog: str) -> str:
    """`PROG (overlap-hlo X, jaxlib Y)`, for --version."""
    from importlib import metadata

    import jaxlib

    try:
        ours = metadata.version("overlap-hlo")
    except metadata.PackageNotFoundError:
        ours = "unknown"
    return f"{prog} (overlap-hlo {ours}, jaxlib {jaxlib.__version__})"
