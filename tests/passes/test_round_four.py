"""Fourth robustness round: every collective next to a dot ends rewritten or named in a
remark, whatever wraps the dot (calls, linear ops, per-platform branches, scans,
predicates from shard_map inputs, zero-size tensors). Rewritten forms are run before
and after on 8 host CPU devices."""
from collections import Counter

import jax
import jax.numpy as jnp
import pytest
from jax import export
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, check, partitioner
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.coverage import candidates, unreported

PSUM = jax.lax.psum
M, K, N = 64, 32, 64
DOTS_IN = [((M, 8 * K), P(None, "x")), ((8 * K, N), P("x", None))]
TWO_DOTS_IN = DOTS_IN + DOTS_IN + [((M, N), P())]
AR_LEFT = Counter({"stablehlo.all_reduce": 0})


def sites_of(program: Program, shardy: bool = True):
    with partitioner(shardy):
        text = program.jitted().lower(*program.args()).as_text()
    sites = overlap_hlo.remarks(text, threshold_mib=0)
    assert_every_collective_reported(text, sites)
    return sites


def assert_every_collective_reported(text: str, sites) -> None:
    """The rule this round enforces, checked independently of the pipeline's own
    step: each collective next to a dot has a site record."""
    module = overlap_hlo.parse(text)
    from overlap_hlo.ir.normalize import normalize
    with module.context:
        normalize(module.operation)
    found = [c for c in candidates(module.operation) if c.where.line is not None]
    assert not unreported(found, sites), [str(c.where) for c in unreported(found, sites)]


def applied_check(fn, inputs, out_specs=P(), rewritten=1, left=AR_LEFT, **kw):
    program = Program(fn, (8,), ("x",), inputs, out_specs, **kw)
    sites = sites_of(program)
    assert all(s.kind != Kind.NOT_HANDLED for s in sites), [s.format() for s in sites]
    return check(program, rewritten=rewritten, left=left), sites


# 1. A branch chosen by a predicate the shard_map receives whole.

def test_psum_in_a_cond_on_a_shard_map_input_is_rewritten():
    def fn(p, x, w):
        return jax.lax.cond(p > 0, lambda: PSUM(x @ w, "x"), lambda: PSUM(2 * (x @ w), "x"))

    applied_check(fn, [((), P(), jnp.int32)] + DOTS_IN, rewritten=2)


def test_gather_in_a_cond_on_a_shard_map_input_is_rewritten():
    def fn(p, x, w):
        g = jax.lax.all_gather(x, "x", axis=0, tiled=True)
        return jax.lax.cond(p > 0, lambda: g @ w, lambda: g @ (2 * w))

    applied_check(fn, [((), P(), jnp.int32), ((M, K), P("x")), ((K, N), P())], left=None)


def test_a_predicate_split_over_the_group_is_not_uniform():
    def fn(p, x, w):
        return jax.lax.cond(p[0] > 0, lambda: PSUM(x @ w, "x"),
                            lambda: PSUM(x @ (2 * w), "x"))

    program = Program(fn, (8,), ("x",), [((8,), P("x"), jnp.int32)] + DOTS_IN, P())
    sites = sites_of(program)
    assert sites and not any(s.applied for s in sites)
    assert all("may not all take it" in s.reason for s in sites), [s.format() for s in sites]


# 2, 3. Zero-size tensors: nothing to communicate.

@pytest.mark.parametrize("case", ["psum", "all_to_all", "all_gather"])
def test_zero_size_sites_are_left_with_an_ordinary_remark(case):
    if case == "psum":
        fn, inputs = (lambda x, w: PSUM(x @ w, "x")), [((0, 8 * K), P(None, "x")),
                                                        ((8 * K, N), P("x", None))]
    elif case == "all_to_all":
        def fn(x, w):
            y = jax.lax.all_to_all(x, "x", 0, 0, tiled=True)
            return jnp.einsum("ecd,df->ecf", y, w)
        inputs = [((128, 0, 8), P("x")), ((8, 8), P())]
    else:
        def fn(x, w):
            return jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w
        inputs = [((64, 0), P("x")), ((0, 8), P())]
    program = Program(fn, (8,), ("x",), inputs, P() if case != "all_to_all" else P("x"))
    sites = sites_of(program)
    assert [s.kind for s in sites] == ["zero-size tensor"], [s.format() for s in sites]
    assert "nothing to communicate" in sites[0].reason
    if case != "all_gather":   # XLA's CPU compiler rejects the original's zero-size gather
        check(program, rewritten=0, left=Counter())


# 4. Sequence parallelism through jnp functions that lower to calls.

def rms(h, g):
    return h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5) * g


D, F = 32, 128
BLOCK_WEIGHTS = [((D,), P()), ((D, F), P(None, "x")), ((F, D), P("x", None)),
                 ((D,), P()), ((D, F), P(None, "x")), ((F, D), P("x", None))]


def two_blocks(between):
    def fn(x, g1, w1, w2, g2, w3, w4):
        x = between(x + PSUM(jax.nn.gelu(rms(x, g1) @ w1) @ w2, "x"))
        return x + PSUM(jax.nn.gelu(rms(x, g2) @ w3) @ w4, "x")
    return fn


BETWEEN = {
    "where": lambda h: jnp.where(h > 0, h, 0.1 * h),
    "clip": lambda h: jnp.clip(h, -1.0, 1.0),
    "silu": jax.nn.silu,
    "leaky_relu": jax.nn.leaky_relu,
    "dropout": lambda h: jnp.where(jnp.abs(h) > 0.05, h / 0.9, 0),
}


@pytest.mark.parametrize("name", list(BETWEEN))
def test_sequence_parallel_moves_through_inlined_calls(name):
    counts, sites = applied_check(
        two_blocks(BETWEEN[name]), [((64, D), P())] + BLOCK_WEIGHTS, rewritten=4,
        left=Counter({"stablehlo.all_reduce": 0, "stablehlo.all_gather": 1}))
    assert [s.pattern for s in sites if s.applied].count("overlap-sequence-parallel") == 1
    assert counts["func.call"] == 0


# 5. Sequence parallelism in GSPMD exports and under scan.

def test_sequence_parallel_in_a_gspmd_export():
    program = Program(two_blocks(lambda h: h), (8,), ("x",), [((64, D), P())] + BLOCK_WEIGHTS,
                      P())
    sites = sites_of(program, shardy=False)
    assert [s.pattern for s in sites if s.applied].count("overlap-sequence-parallel") == 1
    check(program, shardy=False, rewritten=4, left=Counter({"stablehlo.all_reduce": 0}))


@pytest.mark.parametrize("loop,norm", [("scan", True), ("fori_loop", True),
                                       ("scan", False)])
def test_a_scanned_residual_is_carried_as_its_shard(loop, norm):
    """The loop carries the residual's rows: the norm and the add run on them and the
    all_gather before the next layer's first dot (at the body's top, without a norm)
    becomes its ring (jax 0.10.2's scan body, a called function, is inlined first)."""
    def layer(h, g, w1, w2):
        return h + PSUM(jax.nn.gelu((rms(h, g) if norm else h) @ w1) @ w2, "x")

    def fn(x, g, w1, w2):
        if loop == "scan":
            return jax.lax.scan(lambda h, p: (layer(h, *p), None), x, (g, w1, w2))[0]
        return jax.lax.fori_loop(0, 3, lambda i, h: layer(h, g[i], w1[i], w2[i]), x)

    program = Program(fn, (8,), ("x",), [((64, D), P()), ((3, D), P()),
                                         ((3, D, F), P(None, None, "x")),
                                         ((3, F, D), P(None, "x", None))], P())
    sites = sites_of(program)
    (moved,) = [s for s in sites if s.pattern == "overlap-sequence-parallel"]
    assert moved.applied and "the loop carries the residual's shard" in moved.detail
    assert [s.pattern for s in sites if s.applied].count("overlap-all-gather-matmul") == 1
    counts = check(program, rewritten=3, left=Counter({"stablehlo.all_reduce": 0,
                                                       "stablehlo.all_gather": 1}))
    assert counts["stablehlo.while"] >= 3   # the layer loop and two rings


# 6. Linear forms of dots fold into the all_reduce ring; the others get a remark.

LINEAR = {
    "scaled": lambda x, w, x2, w2, r: 2 * (x @ w),
    "negated": lambda x, w, x2, w2, r: -(x @ w),
    "difference": lambda x, w, x2, w2, r: x @ w - x2 @ w2,
    "from_a_term": lambda x, w, x2, w2, r: r - x @ w,
    "by_a_replicated_input": lambda x, w, x2, w2, r: (x @ w) * r,
    "reshaped": lambda x, w, x2, w2, r: (x @ w).reshape(-1),
    "transposed": lambda x, w, x2, w2, r: (x @ w).T,
}


@pytest.mark.parametrize("name", list(LINEAR))
def test_linear_forms_of_dots_fold_into_the_ring(name):
    form = LINEAR[name]
    applied_check(lambda *a: PSUM(form(*a), "x"), TWO_DOTS_IN)


@pytest.mark.parametrize("name,op", [("maximum", "stablehlo.maximum"),
                                     ("by_a_split_input", "stablehlo.multiply")])
def test_nonlinear_forms_are_named(name, op):
    forms = {"maximum": lambda x, w, r: jnp.maximum(x @ w, r),
             "by_a_split_input": lambda x, w, r: (x @ w) * r}
    inputs = DOTS_IN + [((M, N), P() if name == "maximum" else P("x"))]
    shape = (M, N) if name == "maximum" else (8 * M, N)
    inputs[-1] = (shape, inputs[-1][1])
    program = Program(lambda x, w, r: PSUM(forms[name](x, w, r), "x"), (8,), ("x",),
                      inputs, P())
    sites = sites_of(program)
    assert len(sites) == 1 and not sites[0].applied
    assert op in sites[0].reason and sites[0].kind == Kind.NOT_HANDLED


# 7. Nested jits and legacy dots next to psum and all_to_all.

def test_psum_of_a_nested_jit():
    matmul = jax.jit(lambda a, b: a @ b)
    applied_check(lambda x, w: PSUM(matmul(x, w), "x"), DOTS_IN)


EXPERTS = [((128, 16, 32), P("x")), ((32, 32), P())]


def test_all_to_all_into_a_nested_jit():
    einsum = jax.jit(lambda y, w: jnp.einsum("ecd,df->ecf", y, w))
    applied_check(lambda x, w: einsum(jax.lax.all_to_all(x, "x", 0, 0, tiled=True), w),
                  EXPERTS, out_specs=P("x"), left=Counter({"stablehlo.all_to_all": 0}))


def test_all_to_all_of_a_nested_jit():
    einsum = jax.jit(lambda y, w: jnp.einsum("ecd,df->ecf", y, w))
    applied_check(lambda x, w: jax.lax.all_to_all(einsum(x, w), "x", 0, 0, tiled=True),
                  EXPERTS, out_specs=P("x"), left=Counter({"stablehlo.all_to_all": 0}))


LEGACY_PSUM = """module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @main(%x: tensor<16x64xf32>, %w: tensor<64x32xf32>) -> tensor<16x32xf32> {
    %0 = stablehlo.dot %x, %w : (tensor<16x64xf32>, tensor<64x32xf32>) -> tensor<16x32xf32>
    %1 = "stablehlo.all_reduce"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<16x32xf32>) -> tensor<16x32xf32>
    return %1 : tensor<16x32xf32>
  }
}"""


def test_legacy_dot_before_an_all_reduce():
    sites = overlap_hlo.remarks(LEGACY_PSUM, threshold_mib=0)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]


# 8. Multi-platform exports of a psum or an all_to_all alone.

@pytest.mark.parametrize("case", ["psum", "all_to_all"])
def test_multi_platform_exports_of_psum_and_all_to_all(case):
    if case == "psum":
        fn, inputs, out = (lambda x, w: PSUM(x @ w, "x")), DOTS_IN, P()
    else:
        def fn(x, w):
            return jnp.einsum("ecd,df->ecf", jax.lax.all_to_all(x, "x", 0, 0, tiled=True), w)
        inputs, out = EXPERTS, P("x")
    program = Program(fn, (8,), ("x",), inputs, out)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
              for a in program.args()]
    exported = export.export(program.jitted(), platforms=("cpu", "tpu"))(*shapes)
    sites = overlap_hlo.remarks(exported.mlir_module(), threshold_mib=0)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]
    rewritten = overlap_hlo.rewrite_exported(exported, threshold_mib=0)
    args = program.args()
    want, got = exported.call(*args), rewritten.call(*args)
    assert jnp.allclose(want, got, rtol=1e-5, atol=1e-4)


# 9. A second collective of one product.

def test_dispatch_and_combine_around_one_einsum():
    def fn(x, w):
        y = jnp.einsum("ecd,df->ecf", jax.lax.all_to_all(x, "x", 0, 0, tiled=True), w)
        return jax.lax.all_to_all(y, "x", 0, 0, tiled=True)

    program = Program(fn, (8,), ("x",), EXPERTS, P("x"))
    sites = sites_of(program)
    assert [s.applied for s in sites] == [True, False], [s.format() for s in sites]
    assert f"computed by the ring at {sites[0].location}" in sites[1].reason
    check(program, rewritten=1, left=Counter({"stablehlo.all_to_all": 1}))


def test_two_psums_of_one_product():
    def fn(x, w):
        y = x @ w
        return PSUM(y, "x"), PSUM(y, "y")

    program = Program(fn, (2, 4), ("x", "y"), [((M, 8 * K), P(None, ("x", "y"))),
                                                ((8 * K, N), P(("x", "y"), None))],
                      (P(), P()))
    sites = sites_of(program)
    assert [s.applied for s in sites] == [True, False], [s.format() for s in sites]
    assert "computed by the ring at" in sites[1].reason


# 10. A remark names the collective it is about.

def test_all_reduce_refusal_names_the_all_reduce():
    def fn(x, w):
        y = x @ w
        return PSUM(y + 1.0, "x") + y.sum()   # y read before the psum: not a ring

    program = Program(fn, (8,), ("x",), DOTS_IN, P())
    for site in sites_of(program):
        assert "reduce_scatter" not in site.reason, site.format()


def test_a_scalar_psum_of_a_dot_says_why():
    program = Program(lambda x, w: PSUM(jnp.dot(x, w), "x"), (8,), ("x",),
                      [((64,), P("x")), ((64,), P("x"))], P())
    (site,) = sites_of(program)
    assert not site.applied and site.reason.startswith("its result is a scalar")
