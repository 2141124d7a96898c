"""One walk over a module before a pass run: channel handles, manual computations,
callers, and each site's number."""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.dominance import NAMING_OPS, Callers
from overlap_hlo.ir.locations import describe
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.rewrite.templates import Templates

INT64_MAX = 2**63 - 1


class ModuleScan:
    """What every site of one pass run needs to know of the whole module, gathered in
    one walk: the highest channel handle (new ones go above it), the
    sdy.manual_computation ops, whether GSPMD marks any region partially manual, who
    calls each function, and the number of each op named `root` in program order (by
    identity: a site's number across runs of the pass), which `roots` lists.

    A `channel_handle` or `mhlo.sharding` attribute of another type (on an op the
    passes do not know) is not a channel or a sharding: it is counted in `ignored`.
    """

    def __init__(self, module_op: ir.Operation, root: str = "", input_name: str | None = None):
        self.root = root
        self.input_name = input_name   # names locations as the site log does
        self.last_channel = 0
        self.numbers: dict[int, int] = {}
        self.roots: list[ir.Operation] = []
        self.manual_computations: list[ir.Operation] = []
        self.partially_manual_gspmd = False
        self.ignored: list[str] = []   # "op-name attribute" of attributes not understood
        self.callers = Callers()
        self._memo: dict = {}
        self.templates = Templates(self)   # rings built, cloned for their likes

        def visit(op):
            name, attrs = op.name, op.attributes
            if not name.startswith("stablehlo.") or name in NAMING_OPS:
                self.callers.note(op, name)   # (no other StableHLO op names a function)
            if name == root:
                self.numbers[hash(op)] = len(self.numbers)
                self.roots.append(op)
            if "channel_handle" in attrs:
                attr = attrs["channel_handle"]
                if stablehlo.ChannelHandle.isinstance(attr):
                    handle = stablehlo.ChannelHandle(attr).handle
                    self.last_channel = max(self.last_channel, handle)
                else:
                    self.ignored.append(f"{name} channel_handle")
            if name == "sdy.manual_computation":
                self.manual_computations.append(op)
            if "mhlo.sharding" in attrs:
                attr = attrs["mhlo.sharding"]
                if isinstance(attr, ir.StringAttr):
                    value = attr.value
                    self.partially_manual_gspmd |= "manual" in value and value != "{manual}"
                else:
                    self.ignored.append(f"{name} mhlo.sharding")
            return ir.WalkResult.ADVANCE

        module_op.walk(visit)

    def memo(self, key, compute):
        """`compute()`, once per `key` in this pass run: for what depends only on
        attributes and on ops the ring passes never erase (meshes, manual computations).
        A failure is not kept: each caller gets its own Unsupported."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def where(self, location: ir.Location) -> str:
        """`location` as remarks name it ("file:line:col")."""
        return describe(location, self.input_name)

    def require_channels(self, count: int) -> None:
        """Unsupported unless `count` new handles fit above the highest one (checked
        before a site builds anything)."""
        if count > INT64_MAX - self.last_channel:
            raise Unsupported(f"no free channel handles: the module already uses handle "
                              f"{self.last_channel} and the ring needs {count} more",
                              kind=Kind.CHANNELS_EXHAUSTED)

    def new_channel(self) -> int:
        if self.last_channel >= INT64_MAX:
            raise OverflowError("channel handles exhausted")   # require_channels prevents it
        self.last_channel += 1
        return self.last_channel
