"""overlap-opt: run the overlap passes on StableHLO modules, as mlir-opt would.

    overlap-opt [INPUT|-] [-o OUTPUT] [--pass-pipeline='builtin.module(...)'] ...

Reads MLIR text, bytecode or a StableHLO portable artifact (stdin by default; at most
cli.MAX_INPUT_BYTES; text nested deeper than overlap_hlo.api.MAX_NESTING is refused before
MLIR's parser sees it), runs the pipeline
(`overlap_hlo.DEFAULT_PIPELINE` unless --pass-pipeline says otherwise) and writes the
module (stdout by default). Exit status: 0 success; 1 failure (unreadable or malformed
input, a pass or the verifier failed, diagnostics not as expected, output not
writable, input over cli.MAX_INPUT_BYTES); 2 usage error (bad flag, unknown pass or pass
option). On success it prints one line to stderr, `overlap-opt: 4 of 4 sites rewritten`
(`overlap_hlo.rewrite_summary`; not with -q or --verify-diagnostics). Killed by SIGINT,
SIGTERM or SIGHUP it says so in one line, deletes its temporary output file and dies of
that signal (the shell reports 128 + its number).
Reading, writing, signals and the pass flags are tools/cli.py's, shared with
overlap-report.
"""
from __future__ import annotations

import argparse
import inspect
import sys
import traceback
from dataclasses import MISSING, dataclass
from typing import Callable

from jaxlib.mlir import ir
from jaxlib.mlir.passmanager import PassManager

import overlap_hlo
from overlap_hlo.api import (InputError, no_collectives_note, pass_defaults, rewrite_summary,
                             unchanged_summary)
from overlap_hlo.ir import compat
from overlap_hlo.ir.large_stack import on_large_stack
from overlap_hlo.ir.locations import describe, file_line_col
from overlap_hlo.plan import cost
from overlap_hlo.plan.cost import PROFILES
from overlap_hlo.plan.xla_flags import as_xla_flags, ring_options
from overlap_hlo.rewrite.pipeline import (PipelineError, build_pass_manager, registered_passes,
                                          run_pipeline)
from overlap_hlo.rewrite.module_pass import option_type
from overlap_hlo.rewrite.site import Site, SiteLog, statistics

from . import cli
from .cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, STDIN_NAME, CliError, say
from .verify_diagnostics import Diagnostic, parse_expectations, verify

PROG = "overlap-opt"
SPLIT_MARKER = "// -----"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # Boolean flags read as in mlir-opt: a bare `--verify-each` means true and a value
    # comes only after "=", so `--verify-each input.mlir` keeps input.mlir an input.
    argv = ["--verify-each=true" if arg == "--verify-each" else arg for arg in argv]
    with cli.guarded(PROG):
        try:
            args = parser.parse_args(argv)
            outputs = [flag for flag, on in (("--emit-bytecode", args.emit_bytecode),
                                              ("--emit-portable-artifact",
                                               args.emit_portable_artifact)) if on]
            if len(outputs) > 1:
                parser.error(f"{outputs[0]} cannot be combined with {outputs[1]}")
            if outputs and args.split_input_file:
                parser.error(f"{outputs[0]} cannot be combined with --split-input-file")
        except SystemExit as done:  # --help, --version, or a usage error argparse reported
            return EXIT_OK if done.code is None else int(done.code)
        return cli.report_errors(PROG, lambda: Driver(args).run())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=cli.paragraphs(
            "Rewrite each collective that sits beside a matmul in a StableHLO module into "
            "collective_permute steps interleaved with partial matmuls, so that the "
            "transfers overlap the compute. The passes and what each matches:",
            cli.pattern_list(),
            "Sites are decided by size (--threshold-mib) unless a hardware profile is "
            "named (--hardware, or --tpu=SLICE) and no threshold is: then the cost model "
            "decides each site and its form."),
        epilog=cli.paragraphs(
            "Exit status: 0 success, 1 failure, 2 usage error. Interrupted by SIGINT, "
            "SIGTERM or SIGHUP it deletes its temporary output file and dies of the "
            "signal (exit status 128 + the signal number in a shell)."))
    parser.add_argument("input", nargs="?", default="-", metavar="INPUT",
                        help="MLIR text, bytecode or StableHLO portable artifact (at most "
                             f"{cli.MAX_INPUT_BYTES >> 30} GiB); '-' (the default) reads "
                             "stdin")
    parser.add_argument("-o", dest="output", default="-", metavar="OUTPUT",
                        help="output file, written only on success; '-' (the default) "
                             "is stdout")
    parser.add_argument("--pass-pipeline", default=overlap_hlo.DEFAULT_PIPELINE,
                        metavar="PIPELINE",
                        help="pipeline such as 'builtin.module(overlap-all-gather-matmul"
                             "{threshold-mib=4},canonicalize,cse)' (default: "
                             "%(default)s)")
    cli.add_pass_flags(parser, {
        "threshold_mib": "Unset, with --hardware or --tpu: that profile's cost model "
                         "decides",
        "hardware": "--tpu=SLICE names the slice's profile when neither this nor "
                    "--threshold-mib is given"})
    parser.add_argument("--tpu", metavar="SLICE", type=cli.tpu_slice,
                        help="the TPU slice the output will run on, e.g. v5e:2x4 or "
                             "v5e-8 (needs libtpu): TPU forms, rings that visit physical neighbours, "
                             "and its tpu-* profile deciding unless --hardware or "
                             "--threshold-mib is given")
    parser.add_argument("--remarks", action="store_true",
                        help="report every candidate site: what it is, whether it was "
                             "rewritten (or why not) and its predicted times")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not print the one-line summary of a successful run "
                             "('overlap-opt: 4 of 4 sites rewritten', to stderr); "
                             "warnings and errors are still printed")
    parser.add_argument("--pass-statistics", action="store_true",
                        help="print sites seen, rewritten and skipped by reason, per pass "
                             "(to stderr)")
    parser.add_argument("--split-input-file", action="store_true",
                        help=f"process each chunk between '{SPLIT_MARKER}' lines on its own")
    parser.add_argument("--verify-diagnostics", action="store_true",
                        help="check diagnostics against '// expected-error {{...}}' "
                             "comments in the input")
    parser.add_argument("--verify-each", type=cli.boolean, metavar="BOOL",
                        help="run the verifier after each pass: true (also a bare "
                             "--verify-each) or false (not at all); by default it runs "
                             "once, on the pipeline's result (each overlap pass also "
                             "checks the module it leaves)")
    parser.add_argument("--no-verify-each", dest="verify_each", action="store_false",
                        help="same as --verify-each=false")
    parser.add_argument("--emit-bytecode", action="store_true",
                        help="write MLIR bytecode instead of text")
    parser.add_argument("--emit-portable-artifact", action="store_true",
                        help="write a StableHLO portable artifact (VHLO bytecode, at the "
                             "version jax.export writes) that can replace an Exported's "
                             "mlir_module_serialized; portable artifacts are read "
                             "whether or not this is given")
    parser.add_argument("--mlir-print-debuginfo", action="store_true",
                        help="print locations in the output")
    parser.add_argument("--mlir-print-ir-before-all", action="store_true",
                        help="print the IR before each pass (to stderr)")
    parser.add_argument("--mlir-print-ir-after-all", action="store_true",
                        help="print the IR after each pass (to stderr)")
    parser.add_argument("--mlir-timing", action="store_true",
                        help="report the time each pass took (to stderr)")
    parser.add_argument("--list-passes", action="store_true",
                        help="list the overlap passes and their options, then exit")
    parser.add_argument("--version", action="version", version=cli.version(PROG))
    parser.set_defaults(verify_each=None)
    return parser


def list_passes() -> str:
    lines = ["Overlap passes (name them in --pass-pipeline='builtin.module(...)'):"]
    for name, cls in registered_passes().items():
        lines += [f"  {name}", f"      {cls.summary}"]
        doc = inspect.getdoc(cls) or ""
        lines += [f"      {line}" for line in doc.split("\n\n")[0].splitlines()]
        lines.append("      Options:" if cls.options() else "      Options: none")
        for option, spec in cls.options().items():
            kind = spec.metadata.get("metavar") if "parse" in spec.metadata else \
                option_type(cls, spec.name).__name__
            default = ("required" if spec.default is MISSING else
                       "default: unset" if spec.default in (None, "") else
                       f"default: {str(spec.default).lower() if kind == 'bool' else spec.default}")
            lines.append(f"        {option}=<{kind}>  ({default})")
            help_text = spec.metadata.get("help")
            if help_text:
                lines.append(f"            {help_text}")
    lines += [
        "Upstream MLIR passes such as canonicalize and cse can be used in --pass-pipeline",
        "too, e.g. --pass-pipeline='builtin.module(overlap-all-gather-matmul"
        "{threshold-mib=0},canonicalize,cse)'.",
        f"Default pipeline: {overlap_hlo.DEFAULT_PIPELINE}",
        f"{cli.pass_flag_names()} set these options for every overlap pass",
        "whose pipeline text leaves them unset. Sites are decided by size "
        f"(threshold-mib, default {overlap_hlo.DEFAULT_THRESHOLD_MIB:g} MiB)",
        "unless a hardware profile is named and no threshold is: then by the cost model.",
        "Hardware profiles:",
    ]
    for profile in PROFILES.values():
        lines.append(f"  {profile.name}: {profile.source}")
    return "\n".join(lines) + "\n"


def format_statistics(sites: list[Site]) -> str:
    lines = ["===" + "-" * 20 + " overlap-hlo pass statistics " + "-" * 20 + "==="]
    for pattern, row in statistics(sites).items():
        lines.append(f"{pattern}: {row['seen']} sites seen, {row['rewritten']} rewritten")
        lines += [f"  {count:5d} {key}" for key, count in row.items()
                  if key.startswith("skipped")]
    if len(lines) == 1:
        lines.append("no candidate sites")
    return "\n".join(lines) + "\n"


@dataclass
class ReportingSiteLog(SiteLog):
    """A SiteLog that also hands every new site to `report`."""

    report: Callable[[Site], None] | None = None

    def add(self, site: Site) -> None:
        super().add(site)
        if self.report is not None:
            self.report(site)


@dataclass(frozen=True)
class Chunk:
    source: str | bytes   # text prefixed with newlines so lines keep their numbers
    text: str             # the same text, for the expected-* comments ("" for bytecode)


@dataclass(frozen=True)
class ChunkResult:
    ok: bool
    output: bytes | None  # the printed module, when the pipeline succeeded


def _slice_options(args: argparse.Namespace) -> dict:
    """The pass flags, and with --tpu the slice's: target tpu, its device coordinates
    and (without --hardware or --threshold-mib) its profile, as overlap-report uses."""
    options = cli.pass_flags(args)
    if not args.tpu:
        return options
    from overlap_hlo.targets import tpu   # loads libtpu: only when a slice is named

    try:
        return tpu.tpu_options(options, tpu.topology(args.tpu))
    except tpu.TpuError as err:
        raise CliError(str(err).strip().splitlines()[0]) from None


class Driver:
    """One run of the tool: read, split, parse, run the pipeline, report, write."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.input_name = STDIN_NAME if args.input == "-" else args.input
        self.defaults = pass_defaults(_slice_options(args), PROG)
        self.diagnostics: list[Diagnostic] = []
        self.context: ir.Context | None = None
        self.sites: list[Site] = []   # every chunk's, for --pass-statistics

    def _platform(self) -> str:
        """The backend the output's forms are for: --target, else --hardware's."""
        if self.defaults.get("target"):
            return self.defaults["target"]
        hardware = self.defaults.get("hardware")
        if isinstance(hardware, str):   # as typed; --tpu gives the slice's profile
            hardware = cost.hardware(hardware) if hardware else None
        return hardware.platform if hardware else ""

    def run(self) -> int:
        if self.args.list_passes:
            self._write_stdout(list_passes().encode())
            return EXIT_OK
        self.context = compat.make_context()
        handler = self.context.attach_diagnostic_handler(self._on_diagnostic)
        try:
            self._check_pipeline()
            self._check_output_path()
            chunks = self._chunks(cli.read_input(self.args.input))
            # MLIR recurses once per nesting level: parse, passes and printing run on
            # a large stack (signal handlers stay on the main thread).
            results = on_large_stack(lambda: [self._process(chunk) for chunk in chunks])
        finally:
            handler.detach()
        ok = all(result.ok for result in results)
        if self.args.pass_statistics:
            say(format_statistics(self.sites).rstrip("\n"))
        outputs = [result.output for result in results if result.output is not None]
        if ok or self.args.output == "-":  # a failed run never touches an output file
            separator = f"{SPLIT_MARKER}\n".encode()
            self._write(separator.join(outputs))
        # After the output: a run that cannot write says only that.
        if ok and not (self.args.quiet or self.args.verify_diagnostics):
            say(f"{PROG}: {rewrite_summary(self.sites)}")
            flags = ring_options((self._platform(),)) if any(
                site.applied for site in self.sites) else {}
            if flags:
                say(f"{PROG}: compile the output for GPU with XLA_FLAGS=\"{as_xla_flags(flags)}\" "
                    "(overlap() and rewrite_lowered set them for that executable alone)")
        summary = unchanged_summary(self.sites, see="--remarks")
        if summary and not (self.args.remarks or self.args.verify_diagnostics):
            say(f"{PROG}: warning: {summary}")
        return EXIT_OK if ok else EXIT_FAILURE

    # Input and output.

    def _check_pipeline(self) -> None:
        try:
            build_pass_manager(self.args.pass_pipeline, SiteLog(), self.defaults,
                               self.context)
        except PipelineError as err:
            raise CliError(str(err), EXIT_USAGE) from None

    def _check_output_path(self) -> None:
        """Refuse, before any work, an output that cannot be written."""
        if self.args.output == "-":
            cli.check_stdout()
        else:
            cli.check_output_path(self.args.output)

    def _chunks(self, data: bytes) -> list[Chunk]:
        text = cli.decode_input(data, self.input_name)
        if isinstance(text, bytes):   # MLIR bytecode
            return [Chunk(text, "")]
        if not self.args.split_input_file:
            return [Chunk(text, text)]
        chunks, current, start = [], [], 0
        lines = text.splitlines(keepends=True)
        for number, line in enumerate(lines):
            if line.rstrip("\r\n") == SPLIT_MARKER:
                chunks.append((start, current))
                current, start = [], number + 1
            else:
                current.append(line)
        chunks.append((start, current))
        result = []
        for start, chunk_lines in chunks:
            source = "\n" * start + "".join(chunk_lines)
            result.append(Chunk(source, source))
        return result

    def _write(self, payload: bytes) -> None:
        if self.args.output == "-":
            self._write_stdout(payload)
        else:
            cli.write_file(self.args.output, payload)

    def _write_stdout(self, payload: bytes) -> None:
        binary = self.args.emit_bytecode or self.args.emit_portable_artifact
        if binary and sys.stdout is not None and getattr(sys.stdout, "buffer", None) is None:
            raise CliError("stdout does not accept bytes; use -o to write bytecode")
        cli.write_stdout(payload)

    # One chunk.

    def _process(self, chunk: Chunk) -> ChunkResult:
        self.diagnostics = []
        output = None
        with self.context:
            try:
                module = overlap_hlo.parse(chunk.source, self.context)
            except ir.MLIRError as err:
                self._add_mlir_error(err)
            except InputError as err:   # nested too deeply, an unreadable artifact
                where = self.input_name if err.line is None else \
                    f"{self.input_name}:{err.line}:{err.column}"
                self.diagnostics.append(Diagnostic("error", err.reason, where, err.line))
            else:
                if self._run_pipeline(module):
                    output = self._print(module)
        failed = any(d.severity == "error" for d in self.diagnostics)
        if self.args.verify_diagnostics:
            expectations = parse_expectations(chunk.text, self.input_name)
            problems = verify(self.diagnostics, expectations)
            for problem in problems:
                say(problem)
            ok = not problems
        else:
            for diagnostic in self.diagnostics:
                self._print_diagnostic(diagnostic)
            ok = not failed
        return ChunkResult(ok, None if failed else output)

    def _run_pipeline(self, module: ir.Module) -> bool:
        held: list[Site] = []   # the last attempt's sites, reported after the run
        before = len(self.diagnostics)

        def make_log(deferred: bool) -> SiteLog:   # an attempt: only the last one speaks
            held.clear()
            del self.diagnostics[before:]
            return ReportingSiteLog(input_name=self.input_name, deferred=deferred,
                                    report=held.append if self.args.remarks else None)

        def configure(pm: PassManager) -> None:
            pm.enable_verifier(self.args.verify_each is True)
            if printing:
                pm.enable_ir_printing(print_before_all=self.args.mlir_print_ir_before_all,
                                      print_after_all=self.args.mlir_print_ir_after_all)
            if self.args.mlir_timing:
                pm.enable_timing()

        printing = self.args.mlir_print_ir_before_all or self.args.mlir_print_ir_after_all
        try:
            log = run_pipeline(module.operation, self.args.pass_pipeline, make_log,
                               self.defaults, verify=self.args.verify_each is None,
                               defer=not printing, context=self.context,
                               configure=configure)
            self.sites += log.sites
            note = no_collectives_note(module, log.sites)
            if note is not None and not self.args.verify_diagnostics:
                say(f"{PROG}: note: {note}")
            return True
        except ir.MLIRError as err:
            self._add_mlir_error(err)
            return False
        except Exception as err:  # a bug in a pass, not in the input
            say(f"{PROG}: internal error while running the pipeline (please report "
                 f"it):\n{traceback.format_exc().rstrip()}")
            self.diagnostics.append(Diagnostic(
                "error", f"internal error: {type(err).__name__}: {err}",
                self.input_name, None))
            return False
        finally:
            for site in held:
                self._on_site(site)

    def _print(self, module: ir.Module) -> bytes | None:
        if self.args.emit_bytecode:
            return overlap_hlo.serialize(module, bytecode=True)
        if self.args.emit_portable_artifact:
            try:
                return overlap_hlo.serialize(module, portable_artifact=True)
            except (ValueError, RuntimeError) as err:   # ops VHLO cannot hold
                self.diagnostics.append(Diagnostic(
                    "error", f"cannot write a StableHLO portable artifact: {err}",
                    self.input_name, None))
                return None
        # With --verify-each=false the module may be invalid: let the printer check it
        # and fall back to the generic form instead of crashing.
        return module.operation.get_asm(binary=True,   # UTF-8 bytes, no str between
                                        enable_debug_info=self.args.mlir_print_debuginfo,
                                        assume_verified=self.args.verify_each is not False)

    # Diagnostics.

    def _line(self, location: ir.Location) -> int | None:
        flc = file_line_col(location)
        if flc is None or flc.filename not in ("-", "", self.input_name):
            return None
        return flc.start_line

    def _convert(self, diagnostic) -> Diagnostic:
        return Diagnostic(
            diagnostic.severity.name.lower(), diagnostic.message.strip(),
            describe(diagnostic.location, self.input_name),
            self._line(diagnostic.location),
            tuple(self._convert(note) for note in diagnostic.notes))

    def _add_mlir_error(self, err: ir.MLIRError) -> None:
        if not err.error_diagnostics:
            self.diagnostics.append(Diagnostic("error", err.message, self.input_name, None))
        self.diagnostics.extend(self._convert(d) for d in err.error_diagnostics)

    def _on_diagnostic(self, diagnostic) -> bool:
        """Diagnostics MLIR does not raise as MLIRError: warnings, remarks, stray errors."""
        try:
            self.diagnostics.append(self._convert(diagnostic))
        except Exception:  # never let an exception cross into MLIR
            return False
        return True

    def _on_site(self, site: Site) -> None:
        line = site.where.line if site.where.file == self.input_name else None
        self.diagnostics.append(Diagnostic("remark", site.message(), site.location, line))

    def _print_diagnostic(self, diagnostic: Diagnostic) -> None:
        say(diagnostic.format())
        for note in diagnostic.notes:
            self._print_diagnostic(note)


if __name__ == "__main__":
    sys.exit(main())
