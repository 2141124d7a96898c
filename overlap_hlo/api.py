"""Python entry points: rewrite an ir.Module, MLIR source, a Lowered or an Exported."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import re
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable

import numpy as np
from jaxlib.mlir import ir

import overlap_hlo.passes  # noqa: F401  (registers the passes with the pipeline)
from overlap_hlo.ir import compat
from overlap_hlo.ir.large_stack import on_large_stack
from overlap_hlo.ir.ops import contains
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.plan.xla_flags import ring_options
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE, registered_passes, run_pipeline
from overlap_hlo.rewrite.site import Site, SiteLog

BYTECODE_MAGIC = b"ML\xefR"
UTF8_BOM = b"\xef\xbb\xbf"
# Brackets, regions and types nested deeper than this are refused before parsing:
# MLIR's parser recurses once per level and overflows the stack at a few thousand
# (about 3500 nested modules with an 8 MiB stack, 300 with 1 MiB).
MAX_NESTING = 256
# Sites found not worth rewriting (by the cost model or the compiled schedule).
PROFIT_KINDS = frozenset({Kind.NOT_PROFITABLE, Kind.KEPT})
# Reasons a user chose (a size threshold, profit): not worth a warning.
EXPECTED_KINDS = PROFIT_KINDS | {Kind.BELOW_THRESHOLD, Kind.ZERO_SIZE, Kind.NAMED_KEPT}
# Every rewriting entry point logs its rewrite_summary() here, at INFO.
logger = logging.getLogger(__name__)


class InputError(ValueError):
    """Input refused before it reaches MLIR's parser (nested too deeply, an unreadable
    portable artifact). `line` and `column` (1-based, bytes) say where, when known."""

    def __init__(self, reason: str, line: int | None = None, column: int | None = None):
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(where + reason)
        self.reason, self.line, self.column = reason, line, column


class SitesLeftUnchanged(UserWarning):
    """Candidate sites were left unchanged for a reason other than size or profit
    (replica groups the rewrite cannot read, a site inside a conditional, ...)."""


class NoCollectives(UserWarning):
    """A module partitioned over several devices holds no collective to rewrite (an
    auto-sharded jax.jit: XLA's partitioner adds the collectives when it compiles)."""


COLLECTIVE_OPS = frozenset(f"stablehlo.{name}" for name in (
    "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute",
    "collective_broadcast"))


# Options and pipelines.

def option_names() -> list[str]:
    """The overlap passes' options in Python spelling (threshold_mib, hardware, ...)."""
    names: dict[str, None] = {}
    for cls in registered_passes().values():
        names.update((f.name, None) for f in cls.options().values())
    return list(names)


def pass_defaults(options: dict, caller: str = "overlap_hlo") -> dict:
    """Python keyword options (threshold_mib=0, bidirectional=True, hardware=a name or
    a `cost.Hardware`, device_coords=a `Links` or its text, ...), the unset (None) ones
    left out: the values every overlap pass takes where the pipeline text leaves them
    unset.

    Raises TypeError for an option no overlap pass has."""
    valid = option_names()
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument '{key}'{hint} "
                            f"(options: {', '.join(valid)})")
    return {key: value for key, value in options.items() if value is not None}


def _pipeline_text(pipeline: str | None) -> str:
    if pipeline is None:
        return DEFAULT_PIPELINE
    if not isinstance(pipeline, str):
        raise TypeError(f"pipeline must be pipeline text (a str) or None, got "
                        f"{type(pipeline).__name__}")
    return pipeline


# Never silent.

def rewrite_summary(sites: list[Site]) -> str:
    """One line on what a run did with its candidate sites, as overlap-opt prints it
    and the Python entry points log it:

        4 of 4 sites rewritten
        2 of 3 sites rewritten; 1 left unchanged (not profitable)
        1 of 4 sites rewritten; 3 left unchanged (2 below threshold-mib, 1 inside a
        stablehlo.case branch)
        no candidate sites

    The reasons are the sites' `kind`, most frequent first, counted when there are
    several."""
    if not sites:
        return "no candidate sites"
    noun = "site" if len(sites) == 1 else "sites"
    line = f"{sum(site.applied for site in sites)} of {len(sites)} {noun} rewritten"
    counts = Counter(site.counted_as for site in sites if not site.applied)
    if counts:
        ranked = sorted(counts.items(), key=lambda item: -item[1])   # ties: first seen
        reasons = (ranked[0][0] if len(ranked) == 1 else
                   ", ".join(f"{count} {kind}" for kind, count in ranked))
        line += f"; {counts.total()} left unchanged ({reasons})"
    return line


def unchanged_summary(sites: list[Site], see: str) -> str | None:
    """One line on the sites left unchanged for a reason other than size or profit,
    counted by reason, or None when there are none:

        3 of 12 candidate sites left unchanged (2 replica groups ..., 1 inside a
        stablehlo.case branch); see --remarks

    When nothing was rewritten, sites below the size threshold count too: every
    collective beside a dot is still there, and the run says so."""
    quiet = EXPECTED_KINDS if any(site.applied for site in sites) else PROFIT_KINDS
    left = [site for site in sites if not site.applied and site.kind not in quiet]
    if not left:
        return None
    counts = Counter(site.counted_as for site in left)   # in order of first appearance
    reasons = ", ".join(f"{count} {kind}" for kind, count
                        in sorted(counts.items(), key=lambda item: -item[1]))
    noun = "site" if len(sites) == 1 else "sites"
    return (f"{len(left)} of {len(sites)} candidate {noun} left unchanged ({reasons}); "
            f"see {see}")


def no_collectives_note(module: ir.Module, sites: list[Site]) -> str | None:
    """One line when a module partitioned over several devices gave no candidate site
    because it holds no collective at all, else None."""
    attrs = module.operation.attributes
    if sites or "mhlo.num_partitions" not in attrs:
        return None
    attr = attrs["mhlo.num_partitions"]
    partitions = ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else 1
    if partitions < 2 or contains(module.operation, COLLECTIVE_OPS):
        return None
    return (f"the module runs on {partitions} devices but holds no collective to overlap: "
            "XLA's SPMD partitioner adds them when it compiles (an auto-sharded jax.jit). "
            "overlap-hlo rewrites the collectives a module holds (jax.shard_map); for the "
            "dots XLA partitions itself, see its windowed einsum (docs/report.md, "
            "'Making the permutes overlap on GPU and TPU')")


def _report(sites: list[Site], stacklevel: int, module: ir.Module,
            name: str | None = None) -> list[Site]:
    """Log the run's rewrite_summary() at INFO (after `name`, the function's, when
    known); warn about sites left unchanged and about a module without collectives."""
    logger.info("overlap-hlo: %s%s", f"{name}: " if name else "", rewrite_summary(sites))
    summary = unchanged_summary(sites, see="overlap_hlo.remarks()")
    if summary is not None:
        warnings.warn(f"overlap-hlo: {summary}", SitesLeftUnchanged, stacklevel=stacklevel + 1)
    note = no_collectives_note(module, sites)
    if note is not None:
        warnings.warn(f"overlap-hlo: {note}", NoCollectives, stacklevel=stacklevel + 1)
    return sites


# Parsing and printing.

_SKIPPED = re.compile(rb'"(?:[^"\\\n]|\\.)*"|//[^\n]*')   # strings and comments
_TOKENS = re.compile(rb'"(?:[^"\\\n]|\\.)*"|//[^\n]*|->|>=|<=|[(\[{<)\]}>]')
_BRACKETS = b"([{<)]}>"
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(_BRACKETS)))
_STEP = np.zeros(256, np.int8)
_STEP[list(b"([{<")] = 1
_STEP[list(b")]}>")] = -1


def check_nesting(data: bytes, limit: int = MAX_NESTING) -> None:
    """Raise InputError where MLIR text nests brackets, regions and types deeper than
    `limit`. Strings and comments do not count, nor the `>` of `->` and `>=`.

    A fast pass over the brackets alone (the maximum of their running depth); only
    when it exceeds `limit` a second, slower pass finds the position.
    """
    kept = _SKIPPED.sub(b" ", data)
    for token in (b"->", b">=", b"<="):
        kept = kept.replace(token, b"")
    brackets = np.frombuffer(kept.translate(None, _NOT_BRACKETS), np.uint8)
    if not brackets.size or int(np.cumsum(_STEP[brackets], dtype=np.int64).max()) <= limit:
        return
    depth = 0
    for match in _TOKENS.finditer(data):
        token = match[0]
        if len(token) == 1:
            depth += int(_STEP[token[0]])
            if depth > limit:
                position = match.start()
                line_start = data.rfind(b"\n", 0, position) + 1
                raise InputError(f"nested deeper than {limit} levels (brackets, regions and "
                                 "types together); refused before parsing, since MLIR's "
                                 "parser would overflow its stack",
                                 data.count(b"\n", 0, position) + 1, position - line_start + 1)


def check_region_nesting(module: ir.Module, limit: int = MAX_NESTING) -> None:
    """Raise InputError when regions nest deeper than `limit` (bytecode input, whose
    depth is only known once parsed: the text the tool would print grows with the
    square of the depth, and could not be read back)."""
    stack = [(module.operation, 0)]
    while stack:
        op, depth = stack.pop()
        if depth > limit:
            raise InputError(f"regions nested deeper than {limit} levels")
        for region in op.regions:
            for block in region.blocks:
                stack.extend((inner.operation, depth + 1) for inner in block.operations)


def portable_artifact_producer(data: bytes) -> str | None:
    """"StableHLO_v1.15.0" for a StableHLO portable artifact (VHLO bytecode, what
    `jax.export` stores in `mlir_module_serialized`), else None.

    MLIR bytecode starts with its magic, a version (a prefix varint: the trailing zero
    bits of the first byte count the bytes that follow) and a NUL-terminated producer.
    """
    if not data.startswith(BYTECODE_MAGIC) or len(data) <= len(BYTECODE_MAGIC):
        return None
    first = data[len(BYTECODE_MAGIC)]
    start = len(BYTECODE_MAGIC) + (9 if first == 0 else (first & -first).bit_length())
    end = data.find(b"\0", start, start + 64)
    producer = data[start:end] if end > 0 else b""
    return producer.decode("ascii", "replace") if producer.startswith(b"StableHLO_v") else None


def _deserialize(data: bytes, producer: str, context: ir.Context) -> ir.Module:
    messages = []

    def collect(diagnostic) -> bool:
        messages.append(str(diagnostic.message).strip())
        return True

    handler = context.attach_diagnostic_handler(collect)
    try:
        return compat.deserialize_portable_artifact(data, context)
    except ValueError as err:
        reason = messages[0] if messages else str(err)
        raise InputError(f"cannot read this StableHLO portable artifact (written by "
                         f"{producer}, read with StableHLO_v{compat.stablehlo_version()}): "
                         f"{reason}") from None
    finally:
        handler.detach()


def parse(source: str | bytes, context: ir.Context | None = None) -> ir.Module:
    """Parse MLIR text or bytecode in a context with every JAX dialect.

    A StableHLO portable artifact (`Exported.mlir_module_serialized`) is read back as
    StableHLO; a leading UTF-8 byte order mark is ignored. Raises `InputError` (a
    ValueError) for text nested deeper than MAX_NESTING and for an unreadable
    portable artifact, `ir.MLIRError` for anything MLIR's parser rejects.
    """
    if isinstance(source, str):
        source = source.encode("utf-8")
    elif not isinstance(source, (bytes, bytearray, memoryview)):
        raise TypeError(f"parse() takes MLIR text (str) or bytes, got {type(source).__name__}")
    data = bytes(source)
    context = context or compat.make_context()
    if data.startswith(BYTECODE_MAGIC):
        producer = portable_artifact_producer(data)
        if producer is not None:
            module = on_large_stack(lambda: _deserialize(data, producer, context))
        else:
            module = on_large_stack(lambda: ir.Module.parse(data, context=context))
        check_region_nesting(module)
        return module
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    check_nesting(data)
    return on_large_stack(lambda: ir.Module.parse(data, context=context))


def serialize(module: ir.Module, bytecode: bool = False,
              portable_artifact: bool = False) -> str | bytes:
    """Text, MLIR bytecode, or a StableHLO portable artifact as `jax.export` writes it."""
    if portable_artifact:
        with module.context:
            return compat.serialize_for_export(module)
    if bytecode:
        import io

        buffer = io.BytesIO()
        on_large_stack(lambda: module.operation.write_bytecode(buffer))
        return buffer.getvalue()
    return on_large_stack(lambda: module.operation.get_asm(enable_debug_info=False,
                                                           assume_verified=True))


# Rewriting.

def _rewrite(module: ir.Module, pipeline: str | None, verify: bool, input_name: str | None,
             options: dict, caller: str) -> list[Site]:
    if not isinstance(module, ir.Module):
        raise TypeError(f"{caller}() takes an ir.Module, got {type(module).__name__}")
    defaults = pass_defaults(options, caller)
    with module.context:
        log = on_large_stack(lambda: run_pipeline(
            module.operation, _pipeline_text(pipeline),
            lambda deferred: SiteLog(input_name=input_name, deferred=deferred), defaults,
            verify=verify, context=module.context,
            configure=lambda pm: pm.enable_verifier(False)))
    return log.sites


def rewrite_module(module: ir.Module, pipeline: str | None = DEFAULT_PIPELINE, *,
                   verify: bool = True, input_name: str | None = None,
                   **options) -> list[Site]:
    """Run `pipeline` on `module` in place; returns every candidate site and its fate.

    `options` are the overlap passes' options in Python spelling: threshold_mib,
    hardware, bidirectional, unroll (an unknown one raises TypeError). `pipeline=None`
    is the default pipeline. `input_name` replaces the parser's "-" in site
    locations. Raises `ir.MLIRError` if a pass or the verifier fails and
    `overlap_hlo.PipelineError` for a bad pipeline or option. Logs `rewrite_summary`
    at INFO (logger "overlap_hlo.api") and warns with `SitesLeftUnchanged` when sites
    are left unchanged for a reason other than size or profit.
    """
    sites = _rewrite(module, pipeline, verify, input_name, options, "rewrite_module")
    return _report(sites, stacklevel=2, module=module)


def rewrite_source(source: str | bytes, pipeline: str | None = DEFAULT_PIPELINE, *,
                   emit_bytecode: bool = False, emit_portable_artifact: bool = False,
                   input_name: str | None = None, **options) -> str | bytes:
    """Rewrite MLIR text, bytecode or a StableHLO portable artifact; returns text, or
    bytecode, or a portable artifact (as `jax.export` writes it) when asked."""
    pass_defaults(options, "rewrite_source")
    module = parse(source)
    _report(_rewrite(module, pipeline, True, input_name, options, "rewrite_source"),
            stacklevel=2, module=module)
    return serialize(module, emit_bytecode, emit_portable_artifact)


def remarks(source: str | bytes | ir.Module, pipeline: str | None = DEFAULT_PIPELINE, *,
            input_name: str | None = None, **options) -> list[Site]:
    """Every candidate site of `source` and what the pipeline would do with it
    (location, pattern, shapes, group size, decision and reason, predicted times).
    The input is not changed."""
    pass_defaults(options, "remarks")
    if isinstance(source, ir.Module):
        source = serialize(source, bytecode=True)
    return _rewrite(parse(source), pipeline, True, input_name, options, "remarks")


def _copy(module: ir.Module) -> ir.Module:
    """A copy in a fresh context: JAX caches the module it hands out."""
    return parse(serialize(module, bytecode=True))


def target_of(platforms) -> str:
    """The `target` option for a module lowered for `platforms` (JAX's names): its
    backend when there is one, else "" (forms every backend runs)."""
    names = {{"cuda": "gpu", "rocm": "gpu", "gpu": "gpu"}.get(p, p) for p in platforms}
    return names.pop() if len(names) == 1 and names <= {"cpu", "gpu", "tpu"} else ""


def _with_target(options: dict, platforms) -> dict:
    """`options`, with the target of `platforms` unless one is given."""
    target = target_of(platforms)
    return {"target": target, **options} if target and "target" not in options else options


def _carrying_sites(rewritten, sites: list[Site]):
    """`rewritten` (a Lowered, an Exported) with its site records as `.sites`. Exported
    is a frozen dataclass: the records are no field of it (not compared, not
    serialized, not kept by dataclasses.replace)."""
    object.__setattr__(rewritten, "sites", sites)
    return rewritten


def _rewrite_lowered(lowered, pipeline, options, stacklevel: int, name: str | None = None,
                     reasons: Callable[[list[Site]], list[Site]] | None = None):
    """`rewrite_lowered`; `reasons(sites)`: the sites as reported (a decision made
    elsewhere saying why a site was kept)."""
    platforms = compat.lowering_platforms(lowered)
    options = _with_target(options, platforms)
    module = _copy(lowered.compiler_ir("stablehlo"))
    sites = _rewrite(module, pipeline, True, None, options, "rewrite_lowered")
    if reasons is not None:
        sites = reasons(sites)
    _report(sites, stacklevel + 1, module, name)
    flags = ring_options(platforms) if any(site.applied for site in sites) else {}
    return _carrying_sites(compat.replace_lowered_module(lowered, module, flags), sites)


def rewrite_lowered(lowered, pipeline: str | None = DEFAULT_PIPELINE, **options):
    """A new `jax.stages.Lowered` whose `.compile()` runs the rewritten module.

    `lowered` and JAX's cached lowering are left as they were. Unless `target` is
    given, the forms are those of the backend it was lowered for. Lowered for a GPU
    with a site rewritten, it compiles with the XLA options its rings need
    (`overlap_hlo.plan.xla_flags.ring_options`), for this executable only; options
    given to `jax.jit` or `.compile()` override them. The new Lowered's
    `.sites` lists every candidate site and what became of it (`Site` records:
    rewritten or left unchanged and why, what decided); `rewrite_summary` of them is
    logged at INFO.
    """
    pass_defaults(options, "rewrite_lowered")
    return _rewrite_lowered(lowered, pipeline, options, stacklevel=2)


def rewrite_exported(exported, pipeline: str | None = DEFAULT_PIPELINE, **options):
    """A new `jax.export.Exported` carrying the rewritten module.

    Its `.call()` runs the rewritten module, and it survives serialize()/deserialize().
    Its backward module is rewritten too: `.vjp()`, `serialize(vjp_order=...)` and
    `jax.grad` of `.call` run the rewritten VJP. Its `.sites` lists the forward
    module's candidate sites and what became of them (the Exported that `.vjp()`
    returns carries its own; a deserialized one has none); `rewrite_summary` of them
    is logged at INFO.
    """
    pass_defaults(options, "rewrite_exported")
    return _rewrite_exported(exported, pipeline, options, stacklevel=2)


def _rewrite_exported(exported, pipeline, options, stacklevel: int):
    options = _with_target(options, exported.platforms)
    module = parse(exported.mlir_module())
    sites = _rewrite(module, pipeline, True, None, options, "rewrite_exported")
    _report(sites, stacklevel + 1, module, exported.fun_name)
    payload = serialize(module, portable_artifact=True)
    get_vjp = exported._get_vjp
    if get_vjp is not None:
        get_vjp = functools.partial(_rewritten_vjp, get_vjp, pipeline, options)
    return _carrying_sites(dataclasses.replace(exported, mlir_module_serialized=payload,
                                               _get_vjp=get_vjp), sites)


def _rewritten_vjp(get_vjp, pipeline, options, exported):
    """The VJP that `get_vjp` exports for `exported`, rewritten the same way."""
    return _rewrite_exported(get_vjp(exported), pipeline, options, stacklevel=3)


# Executables an Overlapped keeps, least recently used dropped first; each holds a
# compiled program.
MAX_EXECUTABLES = 64


class Overlapped:
    """A jitted function whose executables run the rewritten module.

    Calling it lowers the function for the arguments, rewrites the lowering, compiles
    it once per signature and runs it. The signature is what `jax.jit` keys its own
    cache on: each argument's shape, dtype, weak type and sharding, the values of
    static arguments (`static_argnums` / `static_argnames` of the jitted function),
    and the configuration that affects lowering (`jax.default_matmul_precision`, the
    mesh context, ...). Python scalars are traced arguments, as in `jax.jit`: a new
    learning rate reuses the executable. At most MAX_EXECUTABLES are kept.
    `lower(*args)` gives the rewritten `jax.stages.Lowered` itself.

    `sites` lists the candidate sites of the module that the last call ran (or the
    last `lower()` rewrote) and what became of each (`Site` records: rewritten or
    left unchanged and why, what decided); None before the first. Each rewrite logs
    their `rewrite_summary` at INFO, `overlap-hlo: train_step: 4 of 4 sites rewritten`.

    JAX transformations (`jax.grad`, `jax.vmap`, `jax.eval_shape`) cannot look into
    a compiled executable: apply them first and wrap the result,
    `overlap(jax.jit(jax.grad(loss)))`.
    """

    def __init__(self, jitted, pipeline: str | None = DEFAULT_PIPELINE, **options):
        import jax

        pass_defaults(options, "overlap")
        self.jitted = jitted if hasattr(jitted, "lower") else jax.jit(jitted)
        self.pipeline = _pipeline_text(pipeline)
        self.options = options
        self._static = compat.static_arguments(self.jitted)
        self._compiled: OrderedDict = OrderedDict()   # key -> (executable, its sites)
        self.sites: list[Site] | None = None

    def lower(self, *args, **kwargs):
        _refuse_tracers(args, kwargs)
        return self._lower(args, kwargs, stacklevel=2)

    def _lower(self, args, kwargs, stacklevel: int):
        lowered = self._rewrite(self.jitted.lower(*args, **kwargs), stacklevel + 1)
        self.sites = lowered.sites
        return lowered

    @property
    def name(self) -> str | None:
        """The function's name, as the logged summaries say it."""
        return getattr(self.jitted, "__name__", None)

    def _rewrite(self, lowered, stacklevel: int):
        """`lowered` rewritten, its `Site` records as `.sites`."""
        return _rewrite_lowered(lowered, self.pipeline, self.options, stacklevel + 1,
                                self.name)

    def __call__(self, *args, **kwargs):
        _refuse_tracers(args, kwargs)
        key, dynamic_args, dynamic_kwargs = self._signature(args, kwargs)
        entry = self._compiled.get(key)
        if entry is None:
            lowered = self._lower(args, kwargs, stacklevel=2)
            entry = self._compiled[key] = (lowered.compile(), lowered.sites)
            if len(self._compiled) > MAX_EXECUTABLES:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        compiled, self.sites = entry
        return compiled(*dynamic_args, **dynamic_kwargs)

    def _signature(self, args, kwargs):
        """(cache key, dynamic positional args, dynamic keyword args)."""
        import jax

        argnums, argnames = self._static
        static = {i if i >= 0 else len(args) + i for i in argnums}
        statics = (tuple((i, args[i]) for i in sorted(static) if i < len(args))
                   + tuple(sorted((k, v) for k, v in kwargs.items() if k in argnames)))
        try:
            hash(statics)
        except TypeError as err:
            raise ValueError(f"overlap(): static arguments must be hashable, as for "
                             f"jax.jit ({err})") from None
        dynamic_args = tuple(a for i, a in enumerate(args) if i not in static)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in argnames}
        leaves, tree = jax.tree.flatten((dynamic_args, dynamic_kwargs))
        key = (tree, statics, tuple(_leaf_signature(leaf) for leaf in leaves),
               compat.trace_context())
        return key, dynamic_args, dynamic_kwargs


def _leaf_signature(leaf):
    """Shape, dtype, weak type and (for a jax.Array) sharding, as jax.jit sees them."""
    import jax
    from jax.api_util import shaped_abstractify

    aval = shaped_abstractify(leaf)
    sharding = leaf.sharding if isinstance(leaf, jax.Array) else None
    return (tuple(aval.shape), aval.dtype, aval.weak_type, sharding)


def _refuse_tracers(args, kwargs) -> None:
    """A clear error, before any work, when a JAX transformation calls the wrapper."""
    import jax

    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((args, kwargs))):
        raise TypeError(
            "an overlap()-wrapped function runs a compiled executable and cannot be "
            "transformed (jax.grad, jax.vmap, jax.eval_shape, or a call inside another "
            "jax.jit); transform first and wrap the result: "
            "overlap_hlo.overlap(jax.jit(jax.grad(loss)))")


def overlap(fn, pipeline: str | None = DEFAULT_PIPELINE, **options) -> Overlapped:
    """`fn` (a function or a `jax.jit` of one) with its collectives decomposed.

        step = overlap_hlo.overlap(jax.jit(train_step), bidirectional=True)
        state, loss = step(state, batch)

    Options as for `rewrite_module` (threshold_mib, hardware, bidirectional, unroll);
    an unknown one raises TypeError here.
    """
    return Overlapped(fn, pipeline, **options)
