"""The base of every overlap pass (`ModulePass`): options declared once as dataclass
fields, typed from the caller to the pass, and a run that never leaves a broken module.

A pass's options are its init fields: each field's metadata carries its help and how its
text parses (`parse`, else by its type; `metavar`, `minimum`, `choices`, `flag` for the
command line), and the values overlap-report tries (`tried`: (value, label) pairs, the
first its base; `tried_with`: options set with them; `tried_on`: only for these
platforms; see targets/candidates.py). Pipeline text (`threshold-mib=0`) and Python values
(`threshold_mib=0`, a `Hardware`, a `Links`) both end as the field's type.

`run` snapshots the module, lets the pass `apply` its sites one by one, and verifies the
result. A site whose rewrite raises or leaves the module invalid is left unchanged and
reported as an internal error: the pass starts over from the snapshot without it (after
a module that did not verify, verifying after every site to find the one to blame).
Where the log is `deferred` (`pipeline.run_pipeline`), `run` only applies, and the
pipeline verifies its result once, running again this way should anything fail.
"""
from __future__ import annotations

import dataclasses
import functools
import numbers
import typing
from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir

from overlap_hlo.ir.ops import contains
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.rewrite.scan import ModuleScan
from overlap_hlo.rewrite.site import Site, SiteLog


@dataclass(frozen=True)
class ModulePass:
    """A pass over a module, rooted at ops of type `root`; its options are its fields."""

    name: ClassVar[str] = ""
    root: ClassVar[type] = object
    summary: ClassVar[str] = ""
    # Tracked ops (ops.TRACKED: collectives, buffers) its rewrites may create
    # (SiteLog.may_hold: a later pass whose root is none of the module's tracked ops is
    # skipped without a walk; `created` adds what its options make it create).
    creates: ClassVar[frozenset[str]] = frozenset()
    # An op (ops.TRACKED) without which it finds nothing; None: its root.
    requires: ClassVar[str | None] = None
    # Its rewrites log no sites (they are not the user's): every run that finds its
    # root is verified, not only one that logs a rewritten site.
    logs_sites: ClassVar[bool] = True
    # Its rewrites leave a normalized module normalized (they build only what
    # `normalize` leaves as it is): a later pass does not normalize it again.
    keeps_normal_form: ClassVar[bool] = False

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.init and getattr(self, f.name) is not None:
                object.__setattr__(self, f.name, self._typed(f, getattr(self, f.name)))

    @classmethod
    def options(cls) -> dict[str, dataclasses.Field]:
        return {f.name.replace("_", "-"): f for f in dataclasses.fields(cls) if f.init}

    @classmethod
    def from_options(cls, options: dict[str, str], defaults: dict | None = None
                     ) -> ModulePass:
        """Build from pipeline-text `options` over typed `defaults` (Python names: the
        ones this pass has are used); raises ValueError on a bad option."""
        known = cls.options()
        values = {f.name: defaults[f.name] for f in known.values()
                  if defaults and f.name in defaults}
        for key, text in options.items():
            if key not in known:
                listed = f"options: {', '.join(known)}" if known else "it has none"
                raise ValueError(f"pass '{cls.name}' has no option '{key}' ({listed})")
            values[known[key].name] = cls._parsed(known[key], text)
        return cls(**values)

    @classmethod
    def _parsed(cls, f: dataclasses.Field, text: str):
        """Option `f`'s value written as `text`; ValueError naming the pass."""
        parse = f.metadata.get("parse")
        if parse is None:
            return _convert(f, option_type(cls, f.name), text, cls.name)
        if not text:
            return None   # unset
        try:
            return parse(text)
        except (OSError, TypeError, ValueError) as err:
            named = f"{f.name.replace('_', '-')}: " if f.metadata.get("errors_named") else ""
            raise ValueError(f"pass '{cls.name}': {named}{err}") from None

    @classmethod
    def _typed(cls, f: dataclasses.Field, value):
        """Option `f`'s `value` as its type: text parsed, numbers converted; ValueError
        for a value of another type."""
        kind = option_type(cls, f.name)
        if isinstance(value, str) and kind is not str:
            return cls._parsed(f, value)
        if kind in (int, float) and isinstance(value, numbers.Real) and \
                not isinstance(value, bool) and (kind is float or float(value).is_integer()):
            return kind(value)
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            raise ValueError(f"pass '{cls.name}': option '{f.name.replace('_', '-')}' "
                             f"expects {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    @classmethod
    def option_text(cls, name: str, value) -> str:
        """Option `name`'s typed `value` as pipeline text (`_parsed`'s inverse)."""
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, Links):
            return value.text()
        if isinstance(value, cost.Hardware):
            if cost.PROFILES.get(value.name) != value:
                raise ValueError(f"hardware profile '{value.name}' is not built in: "
                                 "name its .json file in pipeline text")
            return value.name
        return str(value)

    def prepare(self, module_op: ir.Operation, log: SiteLog) -> None:
        """What the pass does to the module before its snapshot (kept on failure)."""

    def apply(self, module_op: ir.Operation, records: list[Site], broken: dict[int, str],
              careful: bool, log: SiteLog) -> tuple[int, str] | None:
        """Rewrite the module's sites, recording each one's fate in `records`; returns
        (site number, error) for the first site whose rewrite raised (or, when
        `careful`, left the module invalid), after which it stops rewriting. `broken`
        sites (number -> error) are left as they are and recorded as internal errors. `log`:
        the sites earlier passes logged, and the input's name."""
        raise NotImplementedError

    def module_scan(self, module_op: ir.Operation, log: SiteLog) -> ModuleScan:
        """A ModuleScan of `module_op` numbering this pass's root ops: the one an
        earlier pass made, when it left the module unchanged (`SiteLog.scan`), or a
        new walk, which the log keeps for the passes after."""
        root = self.root.OPERATION_NAME
        if not (isinstance(log.scan, ModuleScan) and log.scan.root == root):
            log.scan = ModuleScan(module_op, root, log.input_name)
        return log.scan

    def run(self, module_op: ir.Operation, log: SiteLog) -> None:
        """Apply this pass to `module_op` and log its sites; see the module's doc."""
        root = self.root.OPERATION_NAME
        if not log.may_hold(module_op, self.requires or root) or \
                not contains(module_op, root):
            return             # nothing to find: nothing to snapshot
        self.prepare(module_op, log)
        if log.deferred:   # no snapshot, no verification: the pipeline's end checks
            records: list[Site] = []
            failure = self.apply(module_op, records, {}, False, log)
            if failure is not None:
                raise DeferredFailure(f"{self.name}: site {failure[0]}: {failure[1]}")
            self._log(records, log)
            return
        snapshot = module_op.clone()
        broken: dict[int, str] = {}
        careful = False
        while True:
            records: list[Site] = []   # logged when the run succeeds
            failure = self.apply(module_op, records, broken, careful, log)
            if failure is None:
                rewrote = not self.logs_sites or any(site.applied for site in records)
                error = verification_error(module_op) if rewrote else None
                if error is None:
                    self._log(records, log)
                    return
                if careful:   # every site verified: something else broke the module
                    raise RuntimeError(f"{self.name}: the module does not verify: {error}")
                careful = True
            else:
                broken[failure[0]] = failure[1]
            restore(module_op, snapshot)
            log.scan = None

    def _log(self, records: list[Site], log: SiteLog) -> None:
        for site in records:
            log.add(site)
        if any(site.applied for site in records):
            log.changed(self.created(), self.keeps_normal_form)

    def created(self) -> frozenset[str]:
        """The tracked ops (ops.TRACKED) its rewrites may create."""
        return self.creates


def _convert(f: dataclasses.Field, kind: type, text: str, pass_name: str):
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        return kind(text)
    except ValueError:
        raise ValueError(f"pass '{pass_name}': option '{f.name.replace('_', '-')}' "
                         f"expects {kind.__name__}, got '{text}'") from None


def option_type(cls: type, name: str) -> type:
    """The type of option `name` of pass `cls` (`X | None` read as X)."""
    hint = _type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


@functools.cache
def _type_hints(cls: type) -> dict:
    return typing.get_type_hints(cls)   # slow: it evaluates every annotation's text


class DeferredFailure(RuntimeError):
    """A site's rewrite failed while verification was deferred: the pipeline is rerun
    with each pass verifying (and blaming) its own sites."""


def verification_error(op: ir.Operation) -> str | None:
    """What the verifier says of `op`, or None when it verifies."""
    try:
        op.verify()
    except ir.MLIRError as err:
        return "; ".join(str(d.message) for d in err.error_diagnostics) or str(err)
    return None


def restore(module_op: ir.Operation, snapshot: ir.Operation) -> None:
    """Replace the body of `module_op` with a copy of `snapshot`'s."""
    body = module_op.regions[0].blocks[0]
    for op in list(body.operations):
        op.erase()
    copy = snapshot.clone()
    for op in list(copy.regions[0].blocks[0].operations):
        op.detach_from_parent()
        ir.InsertionPoint(body).insert(op)
