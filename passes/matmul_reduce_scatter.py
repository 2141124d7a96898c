"""overlap-matmul-reduce-scatter: dot_general -> reduce_scatter(add) as a ring.

Every device holds a partial dot result R_q; ring position p must end with the sum
over q of block p of R_q along the scatter dim. Instead of the data, the accumulator
travels the ring: at step k a device computes only block j = (p + k + 1) mod N of its
own product (slicing the operand, or both operands for a batch dim, that produces the
scatter dim) and adds it to the accumulator it just received. After the remaining
N-1-k shifts that accumulator sits at the device that owns block j.

Two accumulators travel the ring, skewed by half a round (`plan_of`): in each round
a chain computes its partial product, adds the accumulator it received and sends the
sum on. The add reads its own round's product, so the compiler fuses it into the
dot's output fusion instead of running it as an instruction of its own, and each
chain's transfer runs while the other chain's dot does. One stream: the chains are
the two halves of each block's rows; two streams (bidirectional): the down and up
streams, which meet at the owner, where the own block is added. The accumulator
keeps the reduce_scatter's element type, so the bytes on the wire are those of the
original collective.

Example:
  overlap-opt --pass-pipeline='builtin.module(overlap-matmul-reduce-scatter{threshold-mib=0})' in.mlir
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import DotDims
from overlap_hlo.ir.lookthrough import View, producer, view_backward
from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.passes import rings
from overlap_hlo.passes.scatter_ring import emit_loop, plan_of
from overlap_hlo.passes.scatter_sums import (is_add_reduction, other_readers, refuse_without_dots,
                                             returned, scatter_fed_by, sliced_prologues,
                                             summed_dots)
from overlap_hlo.plan import cost
from overlap_hlo.rewrite.rewrite_pass import RewritePass, require_supported_types
from overlap_hlo.rewrite.site import Match, Site

__all__ = ["OverlapMatmulReduceScatter", "ScatterSite", "emit_loop", "is_add_reduction",
           "plan_of", "returned", "scatter_fed_by", "shared_scatters", "sliced_prologues",
           "summed_dots"]


@dataclass(frozen=True)
class OverlapMatmulReduceScatter(RewritePass):
    """Decompose dot_general -> reduce_scatter into a collective_permute loop."""

    name = "overlap-matmul-reduce-scatter"
    root = stablehlo.ReduceScatterOp
    keeps_normal_form = True   # rings of dot_generals and adds: no dot, call or branch built
    summary = "dot_general feeding reduce_scatter(add) -> loop of partial dots + permutes"

    def dots_beside(self, op) -> list[ir.Operation]:
        dim = ir.IntegerAttr(op.attributes["scatter_dimension"]).value
        return summed_dots(producer(op.operands[0], dim)[0])[0]

    def match(self, op, scan, settled=None) -> Match:
        scatter = op.operation
        scatter_dim = ir.IntegerAttr(scatter.attributes["scatter_dimension"]).value
        return self.match_sum(scatter, scatter_dim, scatter.results[0].type, scan)

    def match_sum(self, scatter: ir.Operation, scatter_dim: int,
                  result_type: ir.RankedTensorType, scan) -> Match:
        """The ring computing `result_type` (one device's block along `scatter_dim`) of
        the sum the collective `scatter` makes of its operand (dots, added terms)."""
        top, between, dim = producer(scatter.operands[0], scatter_dim)
        dots, adds, addends = summed_dots(top)
        if not dots:
            refuse_without_dots(top, scatter)
        if not is_add_reduction(scatter.regions[0]):
            raise Unsupported("reduction is not a plain add")
        readers, sum_read = other_readers(scatter, top, between, dots, adds, addends)
        ring = Ring.from_collective(scatter, scan)
        require_supported_types(result_type, *(v.type for d in dots
                                               for v in (*d.operands, d.results[0])))
        block = result_type.shape[scatter_dim]
        full = top.results[0].type.shape[dim]
        if block * ring.size != full:
            raise Unsupported(f"scatter dim {full} is not {ring.size} x {block}")
        prologues = sliced_prologues(dots, dim)
        detail = (_sum_detail(top, dim, dots, between, ring)
                  + self.folded_detail(addends, readers, sum_read, prologues))
        others = shared_scatters(dots[0], scatter, scan) if readers and not sum_read else []
        return Match(detail, top.results[0].type, ring,
                     self.site_shape(ring, dots, dim, result_type, block),
                     lambda bidirectional: plan_of(ring.size, self, block, bidirectional),
                     build=ScatterSite(scatter, dots, adds, addends, between, dim, block,
                                       readers, prologues, scatter_dim, sum_read),
                     others=others,
                     dots=[dot.location for dot in dots])

    def folded_detail(self, addends: list[ir.Value], readers: list, sum_read: bool,
                      prologues: dict) -> str:
        """The remark's account of what the ring folds in besides the dots."""
        detail = ""
        if addends:
            detail += (f"; {len(addends)} added term(s) (a bias) folded in: each device adds "
                       "its own block of it once")
        if readers:
            what = "the sum of its dots and added terms" if sum_read else "the dot's product"
            detail += f"; the ring assembles {what} for {len(readers)} other reader(s)"
        if prologues:
            detail += (f"; the elementwise ops making {len(prologues)} of its dots' operands "
                       f"({sum(len(p.ops) for p in prologues.values())} op(s)) run on each "
                       "block, fused into its dot")
        return detail

    def site_shape(self, ring: Ring, dots: list[ir.Operation], dim: int,
                   result_type: ir.RankedTensorType, block: int) -> cost.SiteShape:
        """What the cost model weighs: the dots, the block each device ends with."""
        sliced = [(dot, {operand for operand, _ in DotDims.of(dot).result_source(dim)})
                  for dot in dots]
        return rings.site_shape(ring, sliced, dots[0].operands[0].type.element_type,
                                result_type, plan_of(ring.size, self, block))

    def emit(self, match, plan, ring, rewriter, scan) -> None:
        s = match.build
        scatter = s.scatter
        sum_type = scatter.results[0].type.element_type

        def make() -> list[ir.Value]:
            result, product = emit_loop(s.dots, s.addends, s.dim, s.block, ring, s.between,
                                        plan, scan.new_channel, assemble=bool(s.readers),
                                        sum_type=sum_type, form=self.form,
                                        out_dim=s.scatter_dim, prologues=s.prologues)
            return [result] + ([] if product is None else [product])

        with ir.InsertionPoint(scatter):
            parts = (s.dots, s.addends, s.dim, s.block, ring, s.between, plan,
                     bool(s.readers), sum_type, self.form, s.scatter_dim, s.prologues)
            built = scan.templates.build(None if plan.views_in_loop else parts,
                                         _ring_inputs(s), make)
            result, product = built[0], (built[1] if len(built) > 1 else None)
            result = self.completed(s, result, scan)
        rewriter.replace_op(scatter, [result])
        for view in reversed(s.between):
            rewriter.erase_op(view.op)
        for i, add in enumerate(s.adds):   # the outermost first: the whole sum
            if i == 0 and s.sum_read:
                rewriter.replace_op(add, [product])
            else:
                rewriter.erase_op(add)
        for dot in s.dots:
            if product is not None and not s.sum_read:
                rewriter.replace_op(dot, [product])
            else:
                rewriter.erase_op(dot)
        erased = set()   # the prologues' ops: only the erased dots read them
        for prologue in s.prologues.values():
            for op in reversed(prologue.ops):
                if hash(op) not in erased:
                    erased.add(hash(op))
                    rewriter.erase_op(op)

    def completed(self, site: ScatterSite, block: ir.Value, scan) -> ir.Value:
        """What replaces the collective, from this device's block of the sum."""
        return block


def _ring_inputs(site: ScatterSite) -> list[ir.Value]:
    """Every value a ring of `site` may read: the dots' operands, the prologues'
    sources, the added terms and what makes them."""
    values = [operand for dot in site.dots for operand in dot.operands]
    values += [v for prologue in site.prologues.values() for v in prologue.sources]
    for term in site.addends:
        values.append(term)
        owner = term.owner
        if isinstance(owner, (ir.Operation, ir.OpView)):
            values += list(owner.operands)
    return values


@dataclass(frozen=True)
class ScatterSite:
    """What the reduce_scatter ring replaces: the scatter, its summed dots, the adds and
    added terms between, the views after the sum, and the operand prologues it fuses."""

    scatter: ir.Operation
    dots: list[ir.Operation]
    adds: list[ir.Operation]
    addends: list[ir.Value]
    between: list[View]
    dim: int                      # the scattered dim of the dots' product
    block: int
    readers: list                 # other readers of the product: the ring assembles it
    prologues: dict
    scatter_dim: int              # of the collective's result
    sum_read: bool = False        # the readers read the sum (dots and added terms)


def shared_scatters(dot: ir.Operation, scatter: ir.Operation, scan) -> list[Site]:
    """A record for every other reduce_scatter of `dot`'s product: the ring of `scatter`
    computes the dot once and assembles it; a second ring would compute it again."""
    records, where = [], scan.where(scatter.location)
    for use in dot.results[0].uses:
        user = as_op(use.owner)
        while user.name != "stablehlo.reduce_scatter" and len(user.results) == 1 \
                and len(list(user.results[0].uses)) == 1 and view_backward(user, 0) is not None:
            user = as_op(next(iter(user.results[0].uses)).owner)
        if user.name == "stablehlo.reduce_scatter" and user != scatter:
            records.append(Site.of(
                user.location, scan.input_name, OverlapMatmulReduceScatter.name, False,
                reason=(f"its dot also feeds the reduce_scatter at {where}, whose ring "
                        "computes the dot once and assembles its product for this one: a ring "
                        "of its own would compute the dot a second time"),
                kind=Kind.SHARED_DOT))
    return records


def _sum_detail(top: ir.Operation, dim: int, dots: list[ir.Operation], between: list[View],
                ring: Ring) -> str:
    """The remark's account of the scattered sum: its dots, views and groups."""
    sources = []
    for dot in dots:
        sliced = DotDims.of(dot).result_source(dim)
        sources.append("batch" if len(sliced) == 2 else f"free dim of operand {sliced[0][0]}")
    through = "".join(f" through {view.op.name}" for view in between)
    summed = f"sum of {len(dots)} dots, " if len(dots) > 1 else ""
    return (f"{top.results[0].type} scattered on dim {dim} ({summed}"
            f"{', '.join(sources)}){through} over groups of {ring.size}")
