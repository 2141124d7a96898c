"""overlap-report: compile a module for a TPU slice before and after the rewrite and
report, per site, what the TPU compiler's schedule overlaps.

    overlap-report IN --tpu=v5e:2x4 [--bidirectional] [--unroll=U] [--threshold-mib=F] [--f32-sums]
                   [--target=tpu|gpu|cpu]   (default: the TPU forms)
                   [--hardware=NAME] [--pass-pipeline=P] [--json OUT] [--timeline OUT.svg]

Needs libtpu (pip install 'overlap-hlo[tpu]'); --timeline needs matplotlib (the `bench`
extra). Exit status: 0 success; 1 failure (unreadable input, libtpu missing, the
module does not fit the slice or does not compile); 2 usage error.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys

from jaxlib.mlir import ir

import overlap_hlo
from overlap_hlo.atomic import replace_file
from overlap_hlo.locations import describe
from overlap_hlo.pipeline import PipelineError, build_pass_manager
from overlap_hlo.rewrite_pass import SiteLog

from .overlap_opt import add_pass_flags, pass_flags

PROG = "overlap-report"
STDIN_NAME = "<stdin>"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
TIMELINE_SUFFIXES = (".svg", ".png")


class CliError(Exception):
    def __init__(self, message: str, exit_code: int = EXIT_FAILURE):
        super().__init__(message)
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other diagnostic."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, allow_abbrev=False,
        description="Compile a StableHLO module for a TPU slice, original and rewritten, "
                    "and report per site the permutes the schedule overlaps, exposed "
                    "communication and predicted times.",
        epilog="Exit status: 0 success, 1 failure, 2 usage error.")
    parser.add_argument("input", nargs="?", default="-", metavar="INPUT",
                        help="MLIR text or bytecode file; '-' (the default) reads stdin")
    parser.add_argument("--tpu", required=True, metavar="TOPOLOGY",
                        help="TPU slice to compile for, e.g. v5e:2x4, v5p:2x2x2, v6e:2x4, "
                             "v4:2x2x1")
    parser.add_argument("--pass-pipeline", default=overlap_hlo.DEFAULT_PIPELINE,
                        metavar="PIPELINE", help="as for overlap-opt (default: %(default)s)")
    add_pass_flags(parser)
    parser.add_argument("--json", metavar="OUT", help="write the report as JSON")
    parser.add_argument("--timeline", metavar="OUT.svg|OUT.png",
                        help="draw the modelled schedules, before and after (needs "
                             "matplotlib)")
    parser.add_argument("--version", action="version", version=f"{PROG} (overlap-hlo "
                        f"{_package_version()})")
    return parser


def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("overlap-hlo")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
        if args.timeline and not args.timeline.lower().endswith(TIMELINE_SUFFIXES):
            parser.error("--timeline must name a .svg or .png file")
    except SystemExit as done:
        return EXIT_OK if done.code is None else int(done.code)
    try:
        return run(args)
    except CliError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except Exception as err:  # a bug here, not in the input: still one line
        print(f"{PROG}: internal error (please report it): {type(err).__name__}: "
              f"{_one_line(err)}", file=sys.stderr, flush=True)
        return EXIT_FAILURE


def run(args: argparse.Namespace) -> int:
    from overlap_hlo import report, tpu

    options = pass_flags(args)
    _check_pipeline(args.pass_pipeline, options)
    for path in (args.json, args.timeline):
        _check_output_path(path)
    if args.timeline:
        _require_matplotlib()
    input_name = STDIN_NAME if args.input == "-" else args.input
    module = _parse(_read(args.input), input_name)
    try:
        rep = report.build(module, args.tpu, args.pass_pipeline, input_name=input_name,
                           timeline=bool(args.timeline), **options)
    except tpu.TpuError as err:
        raise CliError(_one_line(err)) from None
    except ir.MLIRError as err:
        raise CliError(_mlir_error(err, input_name)) from None
    sys.stdout.write(rep.format())
    if args.json:
        payload = json.dumps({"input": input_name, **rep.to_json()}, indent=1) + "\n"
        _write(args.json, payload.encode())
    if args.timeline:
        from overlap_hlo import schedule_plot

        try:
            schedule_plot.draw({"original": rep.original, "rewritten": rep.rewritten},
                               args.timeline, title=f"{input_name} on {rep.topology}")
        except OSError as err:
            raise CliError(f"cannot write '{args.timeline}': {err.strerror or err}") from None
    return EXIT_OK


def _check_pipeline(pipeline: str, options: dict) -> None:
    defaults = overlap_hlo.api.pass_defaults(options)
    try:
        build_pass_manager(pipeline, SiteLog(), defaults, overlap_hlo.compat.make_context())
    except PipelineError as err:
        raise CliError(str(err), EXIT_USAGE) from None


def _check_output_path(path: str | None) -> None:
    if not path:
        return
    directory = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(directory):
        raise CliError(f"cannot write '{path}': directory '{os.path.dirname(path)}' "
                       "does not exist")
    if os.path.isdir(path):
        raise CliError(f"cannot write '{path}': it is a directory")


def _require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise CliError("--timeline needs matplotlib: pip install 'overlap-hlo[bench]'")


def _read(path: str) -> bytes:
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)
        return stream.read() if stream is not None else sys.stdin.read().encode()
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as err:
        raise CliError(f"cannot read '{path}': {err.strerror or err}") from None


def _parse(data: bytes, input_name: str) -> ir.Module:
    """MLIR text, or bytecode (anything that is not UTF-8 is tried as bytecode)."""
    with contextlib.suppress(UnicodeDecodeError):
        data = data.decode("utf-8")
    try:
        return overlap_hlo.parse(data)
    except ir.MLIRError as err:
        raise CliError(_mlir_error(err, input_name)) from None


def _mlir_error(err: ir.MLIRError, input_name: str) -> str:
    for diagnostic in err.error_diagnostics:
        return (f"{describe(diagnostic.location, input_name)}: "
                f"{_one_line(diagnostic.message)}")
    return _one_line(err.message)


def _one_line(value) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__


def _write(path: str, payload: bytes) -> None:
    """Replace `path` atomically (a temporary file beside it, then a rename)."""
    try:
        target = os.path.realpath(path)
        if os.path.exists(target) and not stat.S_ISREG(os.stat(target).st_mode):
            with open(target, "wb") as file:   # /dev/stdout, a FIFO: write straight in
                file.write(payload)
            return
        def write(temporary: str) -> None:
            with open(temporary, "wb") as file:
                file.write(payload)

        replace_file(target, write)
    except OSError as err:
        raise CliError(f"cannot write '{path}': {err.strerror or err}") from None


if __name__ == "__main__":
    sys.exit(main())
