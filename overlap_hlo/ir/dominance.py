"""Program-order and execution questions within one function's nested regions.

`dominates`: is a value available at an op (structured control flow: no CFG needed).
`divergent_between`: the regions between a collective's block and an op nested in it
that the devices may not all execute the same number of times, so a ring (whose
permutes every device of the module must reach) must not be placed inside them.
`not_run_by_all`: the same question for a collective itself, across function calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from jaxlib.mlir import ir

from overlap_hlo.ir.ops import as_op

# Ops whose region every device that reaches the op executes exactly once.
ONCE = frozenset({"sdy.manual_computation", "sdy.named_computation"})

# Ops whose result is the same on every device when their operands are: no device
# ids, no data from arguments, no collectives (the loop-counter arithmetic of a scan).
DEVICE_INVARIANT_OPS = frozenset({
    "stablehlo.constant", "stablehlo.iota", "stablehlo.add", "stablehlo.subtract",
    "stablehlo.multiply", "stablehlo.divide", "stablehlo.remainder", "stablehlo.negate",
    "stablehlo.abs", "stablehlo.sign", "stablehlo.maximum", "stablehlo.minimum",
    "stablehlo.clamp", "stablehlo.compare", "stablehlo.select", "stablehlo.and",
    "stablehlo.or", "stablehlo.xor", "stablehlo.not", "stablehlo.convert",
    "stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.slice",
    "stablehlo.concatenate", "stablehlo.transpose", "stablehlo.shift_left",
    "stablehlo.shift_right_arithmetic", "stablehlo.shift_right_logical",
})


def callee(call: ir.Operation) -> ir.Operation | None:
    """The single-block func.func a func.call names in its module, or None."""
    module = call.parent
    while module is not None and module.name != "builtin.module":
        module = module.parent
    if module is None:
        return None
    table = ir.SymbolTable(module)
    name = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
    func = as_op(table[name]) if name in table else None
    return func if (func is not None and func.name == "func.func"
                    and len(func.regions[0].blocks) == 1) else None


def ancestor_in(block: ir.Block, op: ir.Operation) -> ir.Operation | None:
    """`op` or the op enclosing it that sits directly in `block`."""
    while op is not None and op.name != "builtin.module":
        if op.block == block:
            return op
        op = op.parent
    return None


def dominates(value: ir.Value, op: ir.Operation) -> bool:
    """`value` is available at `op` (structured control flow: no CFG needed)."""
    if isinstance(value, ir.BlockArgument):
        return ancestor_in(value.owner, op) is not None
    owner = as_op(value.owner)
    at = ancestor_in(owner.block, op)
    return at is not None and at != owner and owner.is_before_in_block(at)


def after(anchor: ir.Operation, op: ir.Operation) -> bool:
    """A value built just before `anchor` is available at `op`: `op` is `anchor`, is
    nested in it, or comes after it (or after an op enclosing it) in its block."""
    at = ancestor_in(anchor.block, op)
    return at is not None and (at == anchor or anchor.is_before_in_block(at))


def program_order(x: ir.Operation, y: ir.Operation) -> int:
    """-1 when `x` comes before `y` in the function's text (an op before the ops nested
    in it), 1 when after, 0 when they are the same op or in different functions."""
    if x == y:
        return 0
    chain_x, chain_y = _with_ancestors(x), _with_ancestors(y)
    for ax in chain_x:
        for ay in chain_y:
            if ax.block == ay.block:
                if ax == ay:   # one encloses the other
                    return -1 if ax == x else 1
                return -1 if ax.is_before_in_block(ay) else 1
    return 0


def _with_ancestors(op: ir.Operation) -> list[ir.Operation]:
    chain = []
    while op is not None and op.name != "builtin.module":
        chain.append(op)
        op = op.parent
    return chain


def enclosing_ops(block: ir.Block, op: ir.Operation) -> list[ir.Operation] | None:
    """The ops enclosing `op` up to the one sitting directly in `block`, innermost
    first (empty when `op` itself sits in `block`); None if `op` is not nested in it."""
    chain = []
    while op.block != block:
        op = op.parent
        if op is None or op.name == "builtin.module":
            return None
        chain.append(op)
    return chain


def divergent_between(block: ir.Block, op: ir.Operation, callers: Callers | None = None
                      ) -> list[ir.Operation] | None:
    """The enclosing ops between `block` and `op` (innermost first) whose regions the
    devices may not all execute equally often: if/case branches on a value that may
    differ between devices, while loops whose trip count is not provably the same on
    every device, any other region op (a reduction body...). None if `op` is not
    nested in `block`."""
    chain = enclosing_ops(block, op)
    if chain is None:
        return None
    return [e for e in chain if not runs_alike(e, callers)]


def runs_alike(region_op: ir.Operation, callers: Callers | None = None) -> bool:
    """Every device that reaches `region_op` runs each of its regions equally often:
    manual computations, if/case on a value the same on every device (a multi-platform
    export's platform index), while loops with a uniform trip count."""
    if region_op.name in ONCE:
        return True
    if region_op.name in ("stablehlo.if", "stablehlo.case"):
        return is_uniform(region_op.operands[0], set(), callers)
    return region_op.name == "stablehlo.while" and uniform_trip_count(region_op, callers)


def not_run_by_all(op: ir.Operation, callers: Callers) -> str | None:
    """Why the devices may not all run `op` equally often, or None when they do: it sits
    in a region some devices skip or repeat, or in a function called from one (every
    caller is followed up to a public function, the module's entry)."""
    return _divergence(op, callers, ())


def _divergence(op: ir.Operation, callers: Callers, through: tuple[str, ...]) -> str | None:
    parent = op.parent
    while parent is not None and parent.name != "builtin.module":
        if parent.name == "func.func":
            return _caller_divergence(parent, callers, through)
        if not runs_alike(parent, callers):
            kind = ("branch: the devices may not all take it"
                    if parent.name in ("stablehlo.if", "stablehlo.case") else
                    "loop whose trip count may differ between devices"
                    if parent.name == "stablehlo.while" else "region")
            where = "".join(f"in @{name}, called " for name in through)
            return f"{where}inside a {parent.name} {kind}"
        parent = parent.parent
    return None


def _caller_divergence(func: ir.Operation, callers: Callers, through: tuple[str, ...]
                       ) -> str | None:
    if "sym_visibility" not in func.attributes or \
            ir.StringAttr(func.attributes["sym_visibility"]).value == "public":
        return None   # an entry: every device runs it
    name = ir.StringAttr(func.attributes["sym_name"]).value
    if name in through:
        return f"function @{name} calls itself"
    if name in callers.other:
        return (f"function @{name} is referenced by {callers.other[name]}: its callers "
                "are unknown")
    for call in callers.calls.get(name, ()):
        reason = _divergence(call, callers, (*through, name))
        if reason is not None:
            return reason
    return None


# The StableHLO ops that name functions: a custom_call's called_computations, a
# composite's decomposition.
NAMING_OPS = frozenset({"stablehlo.custom_call", "stablehlo.composite"})


@dataclass
class Callers:
    """The func.call ops of a module by callee, and the functions that something other
    than a func.call names (a custom_call's called_computations, a composite's
    decomposition): filled by `note` during one walk of the module."""

    calls: dict[str, list[ir.Operation]] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)

    def note(self, op: ir.Operation, kind: str | None = None) -> None:
        """Record `op` (whose name is `kind`, when the caller has read it)."""
        kind = kind or op.name
        if kind.startswith("stablehlo.") and kind not in NAMING_OPS:
            return   # no other StableHLO op names a function
        attrs = op.attributes
        if kind == "func.call":
            name = ir.FlatSymbolRefAttr(attrs["callee"]).value
            self.calls.setdefault(name, []).append(op)
            return
        for key in ("called_computations", "decomposition"):
            if key in attrs:
                for ref in _symbol_refs(attrs[key]):
                    self.other.setdefault(ref, op.name)


def _symbol_refs(attr: ir.Attribute) -> list[str]:
    if isinstance(attr, ir.FlatSymbolRefAttr):
        return [attr.value]
    if isinstance(attr, ir.ArrayAttr):
        return [name for inner in attr for name in _symbol_refs(inner)]
    return []


def uniform_trip_count(loop: ir.Operation, callers: Callers | None = None) -> bool:
    """The while's condition depends only on constants and on carried values that
    start from constants and are updated from constants: the trip count of a scan or
    of a fori_loop with constant bounds, the same on every device."""
    cond = loop.regions[0].blocks[0]
    terminator = as_op(list(cond.operations)[-1])
    return all(is_uniform(v, set(), callers) for v in terminator.operands)


def is_uniform(value: ir.Value, assumed: set, callers: Callers | None = None) -> bool:
    """`value` is the same on every device (conservative: False when unsure).

    `assumed` holds the (op, index) pairs being checked, so that a loop-carried cycle
    is accepted when everything else along it is uniform. Beside the ops of
    DEVICE_INVARIANT_OPS: an entry function's arguments that JAX marks `jax.global_constant`
    (a multi-platform export's platform index), a private function's arguments when
    every caller (`callers`) passes a uniform value, an input that a manual computation
    receives split over no mesh axis (a global value: one array, whole on every device),
    a GSPMD export's replicated shard_map input, and the results of an if/case on a uniform value whose branches return
    uniform values."""
    if isinstance(value, ir.BlockArgument):
        parent = value.owner.owner
        parent = as_op(parent) if parent is not None else None
        if parent is None:
            return False
        key = (parent, value.arg_number)
        if key in assumed:
            return True
        assumed.add(key)
        if parent.name == "stablehlo.while":
            body = parent.regions[1].blocks[0]
            update = as_op(list(body.operations)[-1]).operands[value.arg_number]
            return (is_uniform(parent.operands[value.arg_number], assumed, callers)
                    and is_uniform(update, assumed, callers))
        if parent.name == "sdy.manual_computation":
            return (_replicated_input(parent, value.arg_number)
                    and (_enclosing(parent, "sdy.manual_computation") is None
                         or is_uniform(parent.operands[value.arg_number], assumed, callers)))
        if parent.name == "func.func":
            return _uniform_argument(parent, value.arg_number, assumed, callers)
        return False   # per-device data
    owner = as_op(value.owner)
    if replicated_gspmd_input(owner):
        return True
    if owner.name in ("stablehlo.if", "stablehlo.case"):
        index = value.result_number
        return is_uniform(owner.operands[0], assumed, callers) and all(
            is_uniform(as_op(list(region.blocks[0].operations)[-1]).operands[index],
                       assumed, callers) for region in owner.regions)
    if owner.name not in DEVICE_INVARIANT_OPS:
        return False
    return all(is_uniform(operand, assumed, callers) for operand in owner.operands)


def _custom_call(op: ir.Operation, target: str) -> bool:
    return (op.name == "stablehlo.custom_call"
            and ir.StringAttr(op.attributes["call_target_name"]).value == target)


def replicated_gspmd_input(op: ir.Operation) -> bool:
    """A GSPMD export's shard_map input that is replicated: SPMDFullToShardShape of a
    value sharded `{replicated}` (every device holds the whole value)."""
    if not _custom_call(op, "SPMDFullToShardShape") or len(op.operands) != 1:
        return False
    source = op.operands[0].owner
    if isinstance(source, ir.Block):
        return False
    source = as_op(source)
    return (_custom_call(source, "Sharding") and "mhlo.sharding" in source.attributes
            and ir.StringAttr(source.attributes["mhlo.sharding"]).value == "{replicated}")


def _replicated_input(computation: ir.Operation, index: int) -> bool:
    """Input `index` of a manual computation is split over no mesh axis: every device
    receives the whole value (a scalar always is)."""
    from jaxlib.mlir.dialects import sdy

    if "in_shardings" not in computation.attributes:
        return False
    shardings = sdy.TensorShardingPerValueAttr(computation.attributes["in_shardings"]).shardings
    if index >= len(shardings):
        return False
    sharding = sdy.TensorShardingAttr(shardings[index])
    return all(len(sdy.DimensionShardingAttr(dim).axes) == 0
               for dim in sharding.dimension_shardings)


def _enclosing(op: ir.Operation, name: str) -> ir.Operation | None:
    """The nearest op named `name` that holds `op` in one of its regions."""
    parent = op.parent
    while parent is not None and parent.name != "builtin.module":
        if parent.name == name:
            return as_op(parent)
        parent = parent.parent
    return None


def _uniform_argument(func: ir.Operation, index: int, assumed: set,
                      callers: Callers | None) -> bool:
    """Argument `index` of `func` is the same on every device."""
    if is_public(func):
        if "arg_attrs" not in func.attributes:
            return False
        attrs = ir.ArrayAttr(func.attributes["arg_attrs"])[index]
        return "jax.global_constant" in ir.DictAttr(attrs)
    calls = private_calls(func, callers)
    return bool(calls) and all(is_uniform(call.operands[index], assumed, callers)
                               for call in calls)


def is_public(func: ir.Operation) -> bool:
    return "sym_visibility" not in func.attributes or \
        ir.StringAttr(func.attributes["sym_visibility"]).value == "public"


def private_calls(func: ir.Operation, callers: Callers | None) -> list[ir.Operation] | None:
    """Every func.call of a non-public `func`, when only func.calls name it (`callers`
    lists them); else None: a caller may be out of sight."""
    if callers is None or is_public(func):
        return None
    name = ir.StringAttr(func.attributes["sym_name"]).value
    return None if name in callers.other else callers.calls.get(name)
