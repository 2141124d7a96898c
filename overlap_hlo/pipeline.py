"""Pass registry and pipeline text -> PassManager.

A Python pass added with `PassManager.add(callable)` cannot be named inside pipeline
text that MLIR parses, so the pipeline text is split here into its top-level
elements: names of our passes (with `{key=value ...}` options) become Python passes,
everything else (`canonicalize`, `cse`, `func.func(cse)`, ...) goes to MLIR's own
parser. All of them join one PassManager, in order.
"""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.passmanager import PassManager

from .rewrite_pass import RewritePass, SiteLog

DEFAULT_PIPELINE = ("builtin.module(overlap-all-gather-matmul,"
                    "overlap-matmul-reduce-scatter,canonicalize,cse)")


class PipelineError(ValueError):
    """Pipeline text that names an unknown pass or option, or is malformed."""


def registered_passes() -> dict[str, type[RewritePass]]:
    from overlap_hlo.passes import ALL_PASSES

    return {cls.name: cls for cls in ALL_PASSES}


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
                raise PipelineError(f"unbalanced '{ch}' in pipeline '{text}'")
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth or quote:
        raise PipelineError(f"unbalanced brackets or quotes in pipeline '{text}'")
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def pipeline_elements(text: str) -> list[str]:
    """The passes of `builtin.module(a,b{k=v},func.func(c))`, or of `a,b`."""
    text = text.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module("):-1]
    elif text.startswith("builtin.module"):
        raise PipelineError(f"malformed pipeline '{text}'")
    return split_top_level(text)


def parse_options(element: str) -> tuple[str, dict[str, str]]:
    """`name{k=v k2=v2}` -> (name, {k: v})."""
    if "{" not in element:
        return element, {}
    if not element.endswith("}"):
        raise PipelineError(f"malformed pass options in '{element}'")
    name, body = element[:-1].split("{", 1)
    options = {}
    for item in split_top_level(body, " "):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise PipelineError(f"option '{item}' of '{name}' is not key=value")
        options[key] = value.strip("\"'")
    return name.strip(), options


def build_pass_manager(text: str, log: SiteLog, defaults: dict[str, str] | None = None,
                       context: ir.Context | None = None) -> PassManager:
    """A PassManager running `text`; `defaults` fill options the text leaves unset."""
    passes = registered_passes()
    pm = PassManager("builtin.module", context=context)
    for element in pipeline_elements(text):
        name, options = parse_options(element)
        cls = passes.get(name)
        if cls is None:
            if any(p in element for p in passes):
                raise PipelineError(f"'{element}': overlap passes run on builtin.module only")
            try:
                pm.add(element)
            except ValueError as err:
                raise PipelineError(f"unknown pass or bad pipeline element '{element}': "
                                    f"{err}") from None
            continue
        merged = {k: v for k, v in (defaults or {}).items() if k in cls.options()}
        merged.update(options)
        try:
            instance = cls.from_options(merged)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        pm.add(_runner(instance, log), name=cls.__name__, argument=cls.name,
               description=cls.summary)
    return pm


def _runner(instance: RewritePass, log: SiteLog):
    def run(op, pass_):
        with op.context:
            instance.run(op, log)

    return run
