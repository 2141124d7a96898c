"""Pass registry and pipeline text -> PassManager.

A Python pass added with `PassManager.add(callable)` cannot be named inside pipeline
text that MLIR parses, so the pipeline text is parsed here, with MLIR's grammar:

    pipeline ::= element (',' element)*
    element  ::= name ('{' options '}')? | anchor '(' pipeline? ')'

Names of our passes (with `{key=value ...}` options) at the top level of
`builtin.module(...)` become Python passes; every other element (`canonicalize`,
`cse{...}`, `func.func(cse,canonicalize{max-iterations=2})`, `any(...)`) is handed,
as written, to MLIR's own parser. All of them join one PassManager, in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from jaxlib.mlir import ir
from jaxlib.mlir.passmanager import PassManager

from overlap_hlo.rewrite.coverage import PASS_OF, Coverage
from overlap_hlo.rewrite.module_pass import DeferredFailure, ModulePass, restore
from overlap_hlo.rewrite.site import SiteLog

DEFAULT_PIPELINE = ("builtin.module(overlap-matmul-all-reduce,overlap-sequence-parallel,"
                    "overlap-all-gather-matmul,overlap-matmul-reduce-scatter,"
                    "overlap-all-to-all-matmul,canonicalize,cse,overlap-stack-in-place)")
# MLIR passes that create no op SiteLog.may_hold tracks (collectives, buffers).
SIMPLIFIERS = frozenset({"canonicalize", "cse"})
MAX_PIPELINE_NESTING = 64   # anchors inside anchors; MLIR's own parser recurses too
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class PipelineError(ValueError):
    """Pipeline text that names an unknown pass or option, or is malformed."""


_REGISTRY: dict[str, type[ModulePass]] = {}


def register(cls: type[ModulePass]) -> type[ModulePass]:
    """Make `cls` nameable in pipeline text (overlap_hlo.passes registers its passes)."""
    if _REGISTRY.get(cls.name, cls) is not cls:
        raise ValueError(f"two passes are named {cls.name}")
    _REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> dict[str, type[ModulePass]]:
    """Pass name -> class, in registration order."""
    return dict(_REGISTRY)


@dataclass(frozen=True)
class Element:
    """One pipeline element: a pass with its options, or an anchor with its pipeline."""

    name: str
    text: str                                  # as written, for MLIR's parser
    options: str | None = None                 # the text between '{' and '}'
    nested: tuple[Element, ...] | None = None  # an anchor's elements

    def names(self):
        """This element's name and those of every element nested in it."""
        yield self.name
        for inner in self.nested or ():
            yield from inner.names()

    @classmethod
    def of(cls, name: str, options: dict[str, str]) -> Element:
        """The pass `name` with `options` (`name{k=v ...}`; `name` without any)."""
        text = " ".join(f"{key}={value}" for key, value in options.items())
        return cls(name, f"{name}{{{text}}}" if text else name, text or None)


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside (), {}, [] and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"unbalanced '{ch}' in '{text}'")
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth or quote:
        raise PipelineError(f"unbalanced brackets or quotes in '{text}'")
    parts.append(text[start:].strip())
    return [p for p in parts if p]


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, message: str):
        shown = self.text if len(self.text) <= 200 else self.text[:120] + "..."
        raise PipelineError(f"malformed pipeline '{shown}': {message} at column "
                            f"{self.pos + 1}")

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def elements(self, depth: int, closing: str) -> tuple[Element, ...]:
        """Comma-separated elements up to `closing` (")" or "" for the end)."""
        if depth > MAX_PIPELINE_NESTING:
            self.fail(f"anchors nested deeper than {MAX_PIPELINE_NESTING} levels")
        found = []
        self.skip_space()
        if self.peek() == closing:
            return ()
        while True:
            found.append(self.element(depth))
            self.skip_space()
            if self.peek() == ",":
                self.pos += 1
                continue
            if self.peek() == closing:
                return tuple(found)
            self.fail(f"expected ',' or {repr(closing) if closing else 'the end'}")

    def element(self, depth: int) -> Element:
        self.skip_space()
        start = self.pos
        while self.peek() and self.peek() in _NAME_CHARS:
            self.pos += 1
        name = self.text[start:self.pos]
        if not name:
            self.fail("expected a pass name")
        self.skip_space()
        options = nested = None
        if self.peek() == "{":
            body_start = self.pos + 1
            self.pos = self._matching_brace(self.pos)
            options = self.text[body_start:self.pos]
            self.pos += 1
        elif self.peek() == "(":
            self.pos += 1
            nested = self.elements(depth + 1, ")")
            self.pos += 1
        return Element(name, self.text[start:self.pos].strip(), options, nested)

    def _matching_brace(self, pos: int) -> int:
        """The index of the '}' that closes the '{' at `pos` (quotes respected)."""
        depth, quote = 0, None
        for i in range(pos, len(self.text)):
            ch = self.text[i]
            if quote:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return i
        self.pos = pos
        self.fail("unclosed '{'")


def parse_pipeline(text: str) -> tuple[Element, ...]:
    """The elements of pipeline text (`builtin.module(...)` unwrapped, or `a,b`)."""
    parser = _Parser(text)
    elements = parser.elements(0, "")
    if len(elements) == 1 and elements[0].name == "builtin.module" \
            and elements[0].nested is not None:
        return elements[0].nested
    return elements


def pipeline_text(elements) -> str:
    """`builtin.module(...)` pipeline text running `elements` (parse_pipeline's inverse)."""
    return f"builtin.module({','.join(element.text for element in elements)})"


def parse_options(element: Element) -> dict[str, str]:
    """The options of `name{k=v k2="v 2"}` as {k: v}."""
    options = {}
    for item in split_top_level(element.options or "", " "):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise PipelineError(f"option '{item}' of '{element.name}' is not key=value")
        options[key] = value.strip("\"'")
    return options


def build_pass_manager(text: str, log: SiteLog, defaults: dict | None = None,
                       context: ir.Context | None = None) -> PassManager:
    """A PassManager running `text`; `defaults` (typed values by Python name:
    threshold_mib=0.5, hardware=..., device_coords=Links) fill options the text leaves
    unset."""
    passes = registered_passes()
    pm = PassManager("builtin.module", context=context)
    elements = parse_pipeline(text)
    ours = frozenset(e.name for e in elements if e.nested is None and e.name in passes)
    coverage = Coverage(ours & frozenset(PASS_OF.values()), log)
    if coverage.patterns:
        pm.add(_step(coverage.begin), name="OverlapSitesBefore",
               argument="overlap-sites-before",
               description="list the collectives next to dots (for overlap-sites-after)")
    foreign: list[Element] = []   # the passes not of ours since the last of ours
    for element in elements:
        cls = passes.get(element.name) if element.nested is None else None
        if cls is None:
            ours = [name for name in element.names() if name in passes]
            if ours:
                raise PipelineError(f"'{element.text}': overlap passes run on builtin.module "
                                    f"only ({ours[0]} is nested in an anchor)")
            try:
                pm.add(element.text)
            except ValueError as err:
                raise PipelineError(f"unknown pass or bad pipeline element "
                                    f"'{element.text}': {err}") from None
            foreign.append(element)
            continue
        try:
            instance = cls.from_options(parse_options(element), defaults)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        pm.add(_runner(instance, log, foreign), name=cls.__name__, argument=cls.name,
               description=cls.summary)
        foreign = []
    if coverage.patterns:
        pm.add(_step(coverage.end), name="OverlapSitesAfter", argument="overlap-sites-after",
               description="a remark for each collective next to a dot that no pass reported")
    return pm


def _step(function):
    def run(op, pass_):
        with op.context:
            function(op)

    return run


def _runner(instance: ModulePass, log: SiteLog, after: list[Element]):
    """`instance` as a pass run after `after`, the passes not of ours since the last of
    ours: they may have changed the module, and created anything unless SIMPLIFIERS."""
    created = None if any(e.nested is not None or e.name not in SIMPLIFIERS
                          for e in after) else frozenset()

    def run(op, pass_):
        with op.context:
            if after:
                log.changed(created)
            instance.run(op, log)

    return run


def run_pipeline(module_op: ir.Operation, text: str, make_log: Callable[[bool], SiteLog],
                 defaults: dict | None = None, *, verify: bool = True,
                 defer: bool = True, context: ir.Context | None = None,
                 configure: Callable[[PassManager], None] | None = None) -> SiteLog:
    """Run pipeline `text` on `module_op` in place and return its log
    (`make_log(deferred)` makes it; `configure` sets up each PassManager). With
    `verify`, the overlap passes leave verification to the end, where the result is
    verified once; should a site's rewrite fail or the result not verify, the module is
    restored and the pipeline run again with each pass verifying its own sites (and
    leaving a broken one unchanged), as without `defer`."""
    def attempt(deferred: bool) -> SiteLog:
        log = make_log(deferred)
        pm = build_pass_manager(text, log, defaults, context)
        if configure is not None:
            configure(pm)
        try:
            pm.run(module_op)
            if verify:
                module_op.verify()
            return log
        finally:
            log.scan = None   # its op handles would keep the module alive with the log
            del pm   # a timing report is printed when its PassManager goes away

    if defer and verify:
        snapshot = module_op.clone()
        try:
            return attempt(True)
        except (DeferredFailure, ir.MLIRError):
            restore(module_op, snapshot)
    return attempt(False)
