"""overlap-report: compile a module for a TPU slice or NVIDIA GPUs before and after the
rewrite and report, per site, what the compiler's schedule overlaps.

    overlap-report IN (--tpu=v5e:2x4 | --gpu=h100:8) [--bidirectional] [--unroll=U]
                   [--threshold-mib=F] [--f32-sums] [--tpu-summing-rings]
                   [--own-shard-last]
                   [--target=tpu|gpu|cpu]   (default: the TPU forms)
                   [--hardware=NAME] [--pass-pipeline=P] [--json OUT] [--timeline OUT.svg]
                   [-o OUT.mlir]

--tpu needs libtpu (python -m overlap_hlo.targets.tpu_plugin install); --gpu needs
JAX's CUDA plugin (python -m overlap_hlo.targets.gpu_plugin install); --timeline needs
matplotlib (the `bench` extra). Input and output as for overlap-opt (tools/cli.py): MLIR
text (a UTF-8 byte order mark is ignored), bytecode or a portable artifact, at most
cli.MAX_INPUT_BYTES; --json, --timeline and -o (the module the report kept, MLIR text
with locations) are checked before any compile work and replaced atomically.
Exit status: 0 success; 1 failure (unreadable input, libtpu or the CUDA plugin missing,
the module does not fit the slice or does not compile, an output not writable); 2 usage
error (an unknown TPU topology or GPU target among them). Killed
by SIGINT, SIGTERM or SIGHUP it says so in one line, deletes its temporary output file
and dies of that signal.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from jaxlib.mlir import ir

import overlap_hlo
from overlap_hlo.api import InputError
from overlap_hlo.ir.large_stack import on_large_stack
from overlap_hlo.ir.locations import describe
from overlap_hlo.rewrite.pipeline import PipelineError, build_pass_manager
from overlap_hlo.rewrite.site import SiteLog

from . import cli
from .cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, STDIN_NAME, CliError

PROG = "overlap-report"
TIMELINE_SUFFIXES = (".svg", ".png")


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other diagnostic."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=cli.paragraphs(
            "Compile a StableHLO module for a TPU slice or NVIDIA GPUs ahead of time, "
            "original and rewritten by overlap-opt's passes, and report per site the "
            "permutes the schedule overlaps, exposed communication and predicted times. "
            "The passes and what each matches:",
            cli.pattern_list(),
            "By default (no --threshold-mib, no --[no-]bidirectional) the slice's or the "
            "GPU's cost profile decides each site and its form, and the report compiles "
            "up to six candidates (that choice, every site in one and in two streams, "
            "...) and keeps the one whose schedule is predicted fastest, or the original "
            "when none is faster. Times are a model of the compiled schedule, not a "
            "measurement."),
        epilog=cli.paragraphs(
            "Exit status: 0 success, 1 failure, 2 usage error. Interrupted by SIGINT, "
            "SIGTERM or SIGHUP it deletes its temporary output file and dies of the "
            "signal (exit status 128 + the signal number in a shell)."))
    parser.add_argument("input", nargs="?", default="-", metavar="INPUT",
                        help="MLIR text, bytecode or StableHLO portable artifact (at most "
                             f"{cli.MAX_INPUT_BYTES >> 30} GiB); '-' (the default) reads "
                             "stdin")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--tpu", metavar="TOPOLOGY", type=cli.tpu_slice,
                       help="TPU slice to compile for: GENERATION:SHAPE, e.g. "
                            "v5e:2x4, v5p:2x2x2, v6e:2x4, v4:2x2x1, or a Cloud TPU "
                            "accelerator type, which means the shape Google's TPU docs "
                            "give it: v5e-N and v6e-N count chips (v5e-8, v6e-8: 2x4), "
                            "v4-N and v5p-N TensorCores, two per chip (v4-8: 2x2x1, "
                            "v5p-16: 2x2x2); the report names both")
    where.add_argument("--gpu", metavar="TARGET", type=cli.gpu_target,
                       help="NVIDIA GPUs to compile for: MODEL:DEVICES or "
                            "MODEL:HOSTSxDEVICES, MODEL h100, h200, b200 or a100 (the "
                            "80 GB SXM4 part), e.g. h100:8, h100:2x8 (times: kernels "
                            "priced by the analytic model)")
    parser.add_argument("--pass-pipeline", default=overlap_hlo.DEFAULT_PIPELINE,
                        metavar="PIPELINE", help="as for overlap-opt (default: %(default)s)")
    cli.add_pass_flags(parser, {
        "threshold_mib": "Here a profile is always named (the slice's tpu-* profile or "
                         "the GPU's): unset, its cost model decides each site and the "
                         "compiled schedules check the choice",
        "hardware": "Default here: the slice's tpu-* profile, or the GPU's",
        "target": "Default here: tpu with --tpu, gpu with --gpu"})
    parser.add_argument("--json", metavar="OUT", help="write the report as JSON")
    parser.add_argument("-o", dest="output", metavar="OUT.mlir",
                        help="write the module the report kept (the rewritten one, or "
                             "the original when the compiled schedule chose it) as MLIR "
                             "text with locations")
    parser.add_argument("--timeline", metavar="OUT.svg|OUT.png",
                        help="draw the modelled schedules of the original and of the "
                             "module kept, each panel named by what it is (needs "
                             "matplotlib)")
    parser.add_argument("--version", action="version", version=cli.version(PROG))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    with cli.guarded(PROG):
        try:
            args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
            if (args.timeline is not None
                    and not args.timeline.lower().endswith(TIMELINE_SUFFIXES)):
                parser.error("--timeline must name a .svg or .png file")
        except SystemExit as done:  # --help, --version, or a usage error
            return EXIT_OK if done.code is None else int(done.code)
        try:
            return cli.report_errors(PROG, lambda: run(args))
        except Exception as err:  # a bug here, not in the input: still one line
            cli.say(f"{PROG}: internal error (please report it): {type(err).__name__}: "
                    f"{_one_line(err)}")
            return EXIT_FAILURE


def run(args: argparse.Namespace) -> int:
    from overlap_hlo.targets import aot, gpu, report, tpu

    options = cli.pass_flags(args)
    _check_pipeline(args.pass_pipeline, options)
    cli.check_stdout()   # the report itself
    for path in (args.json, args.timeline, args.output):
        if path is not None:
            cli.check_output_path(path)
    if args.timeline is not None:
        _require_matplotlib()
    input_name = STDIN_NAME if args.input == "-" else args.input
    module = _parse(cli.decode_input(cli.read_input(args.input), input_name), input_name)
    try:
        # The report's rows and verdict list the sites left unchanged: no warning too.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", overlap_hlo.SitesLeftUnchanged)
            # Off the main thread, which stays free to handle signals during the compile.
            rep = on_large_stack(lambda: report.build(
                module, gpu.target(args.gpu) if args.gpu else args.tpu, args.pass_pipeline,
                input_name=input_name, timeline=args.timeline is not None, **options))
    except (tpu.UnknownTopology, gpu.UnknownTarget) as err:   # a shape libtpu rejects
        raise CliError(_one_line(err), EXIT_USAGE) from None
    except aot.TargetError as err:
        raise CliError(_one_line(err)) from None
    except ir.MLIRError as err:
        raise CliError(_mlir_error(err, input_name)) from None
    cli.write_stdout(rep.format().encode("utf-8"))
    if args.json is not None:
        payload = json.dumps({"input": input_name, **rep.to_json()}, indent=1) + "\n"
        cli.write_file(args.json, payload.encode("utf-8"))
    if args.output is not None:
        text = on_large_stack(lambda: rep.module.operation.get_asm(enable_debug_info=True))
        cli.write_file(args.output, text.encode("utf-8"))
    if args.timeline is not None:
        from overlap_hlo.targets import schedule_plot

        image = schedule_plot.render(rep.timeline_panels(),
                                     os.path.splitext(args.timeline)[1][1:].lower(),
                                     title=f"{input_name} on {rep.topology}")
        cli.write_file(args.timeline, image)
    return EXIT_OK


def _check_pipeline(pipeline: str, options: dict) -> None:
    defaults = overlap_hlo.api.pass_defaults(options)
    try:
        build_pass_manager(pipeline, SiteLog(), defaults, overlap_hlo.ir.compat.make_context())
    except PipelineError as err:
        raise CliError(str(err), EXIT_USAGE) from None


def _require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise CliError("--timeline needs matplotlib: pip install 'overlap-hlo[bench]'")


def _parse(source: str | bytes, input_name: str) -> ir.Module:
    try:
        return overlap_hlo.parse(source)
    except ir.MLIRError as err:
        raise CliError(_mlir_error(err, input_name)) from None
    except InputError as err:   # nested too deeply, an unreadable portable artifact
        where = input_name if err.line is None else f"{input_name}:{err.line}:{err.column}"
        raise CliError(f"{where}: {err.reason}") from None


def _mlir_error(err: ir.MLIRError, input_name: str) -> str:
    for diagnostic in err.error_diagnostics:
        return (f"{describe(diagnostic.location, input_name)}: "
                f"{_one_line(diagnostic.message)}")
    return _one_line(err.message)


def _one_line(value) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__


if __name__ == "__main__":
    sys.exit(main())
