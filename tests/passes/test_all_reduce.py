"""dot -> all_reduce: a reduce_scatter ring then an all_gather, run before and after the
rewrite on 8 host CPU devices; sites it cannot take are left unchanged with a remark."""
from collections import Counter

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import overlap_hlo
from overlap_hlo.plan import cost
from harness import Program, check, op_counts

PSUM = jax.lax.psum
ONLY = "builtin.module(overlap-matmul-all-reduce{options},canonicalize)"
# After the rewrite: the all_reduce gone, one all_gather in its place.
GATHER_LEFT = Counter({"stablehlo.all_reduce": 0, "stablehlo.all_gather": 1})

CASES = {
    # Megatron's tensor-parallel MLP: column- then row-parallel matmul, then psum
    "megatron-mlp": (lambda x, w1, w2: PSUM(jax.nn.gelu(x @ w1) @ w2, "x"),
                     [((2, 64, 32), P()), ((32, 128), P(None, "x")),
                      ((128, 32), P("x", None))], P(), (8,), ("x",)),
    # a bias added before the psum: each device's copy is summed, as in the original
    "with-bias": (lambda x, w, bias: PSUM(x @ w + bias, "x"),
                  [((64, 32), P(None, "x")), ((32, 24), P("x")), ((64, 24), P())], P(),
                  (8,), ("x",)),
    # dim 0 (6) is not divisible by the group: the ring scatters dim 1
    "second-dim": (lambda x, w: PSUM(jnp.einsum("bsk,kd->bsd", x, w), "x"),
                   [((6, 16, 32), P(None, None, "x")), ((32, 24), P("x"))], P(),
                   (8,), ("x",)),
    # a data-parallel weight gradient averaged over a subgroup (4 of the 8 devices)
    "gradient-mean": (lambda x, dy: PSUM(x.T @ dy, "x") / 4,
                      [((64, 32), P("x")), ((64, 16), P("x"))], P(), (4, 2), ("x", "y")),
}


@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-stream", "two-streams"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_all_reduce_of_a_dot(case, bidirectional):
    fn, inputs, out_specs, mesh, axes = CASES[case]
    options = "{bidirectional=true}" if bidirectional else ""
    check(Program(fn, mesh, axes, inputs, out_specs), left=GATHER_LEFT,
          pipeline=ONLY.format(options=options))


def test_bf16_megatron_mlp_in_the_default_pipeline():
    fn, inputs, out_specs, mesh, axes = CASES["megatron-mlp"]
    check(Program(fn, mesh, axes, inputs, out_specs, dtype=jnp.bfloat16), left=GATHER_LEFT)


def _sites(fn, inputs, out_specs):
    program = Program(fn, (8,), ("x",), inputs, out_specs)
    lowered = program.jitted().lower(*program.args())
    module = overlap_hlo.parse(lowered.as_text())
    sites = overlap_hlo.rewrite_module(module, threshold_mib=0)
    return [s for s in sites if s.pattern == "overlap-matmul-all-reduce"], op_counts(module)


def test_no_divisible_dim_is_left_unchanged_with_a_remark():
    (site,), counts = _sites(lambda x, w: PSUM(x @ w, "x"),
                             [((6, 32), P(None, "x")), ((32, 10), P("x"))], P())
    assert not site.applied and site.kind == "no divisible dim"
    assert "divisible by the group size 8" in site.reason
    assert counts["stablehlo.all_reduce"] == 1 and counts["stablehlo.all_gather"] == 0


def test_an_all_reduce_without_a_dot_is_not_a_site():
    sites, counts = _sites(lambda x: PSUM(jnp.sum(x * x), "x"), [((64, 32), P("x"))], P())
    assert sites == [] and counts["stablehlo.all_reduce"] == 1


@pytest.mark.parametrize("dots", [1, 2])
def test_an_all_reduce_that_dots_read_becomes_their_gather_ring(dots):
    """psum of something other than a dot, read only by dots, each along a free dim: a
    reduce_scatter, then an all_gather that overlap-all-gather-matmul makes the dots'
    ring."""
    def fn(x, w):
        g = PSUM(x * x, "x")
        return (g @ w,) if dots == 1 else (g @ w, g @ (2 * w))
    program = Program(fn, (8,), ("x",), [((64, 32), P()), ((32, 16), P())], (P(),) * dots)
    check(program, rewritten=2, left=Counter({
        "stablehlo.all_reduce": 0, "stablehlo.reduce_scatter": 1, "stablehlo.all_gather": 0}))


@pytest.mark.parametrize("profile", ["tpu-v5p", "tpu-v5e"])
def test_the_gather_side_prices_the_scatter_as_the_compiler_runs_it(profile):
    """After the split, a reduce_scatter over every device: on v4 and v5p the TPU
    compiler makes it an all-reduce, so it is priced twice there."""
    program = Program(lambda x, w: PSUM(x * x, "x") @ w, (8,), ("x",),
                      [((64, 32), P()), ((32, 16), P())], P())
    text = program.jitted().lower(*program.args()).as_text()
    (site, _) = overlap_hlo.remarks(text, threshold_mib=0, hardware=profile)
    e, hw = site.estimate, cost.hardware(profile)
    ring = cost.estimate(e.shape, hw)
    scatter = hw.collective_us(e.shape.block_bytes, 8)
    assert e.before_us == pytest.approx(ring.before_us + scatter)
    twice = profile == "tpu-v5p"
    assert e.after_us == pytest.approx(ring.after_us + scatter * (2 if twice else 1))


def _megatron_70b(residual: bool) -> str:
    """The psum MLP at 70B-class dims (8192 tokens, 8192 into 28672, bf16), its sum
    returned as it is or after a residual add; lowered only, never run."""
    mesh = jax.make_mesh((8,), ("x",))

    def fn(x, w1, w2):
        y = PSUM(jax.nn.gelu(x @ w1) @ w2, "x")
        return x + y if residual else y

    specs = (P(), P(None, "x"), P("x", None))
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=P()))
    shapes = [(8192, 8192), (8192, 28672), (28672, 8192)]
    return jitted.lower(*[jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(
        mesh, spec)) for shape, spec in zip(shapes, specs)]).as_text()


# Where each device sits on the slice (what `--tpu=SLICE` passes): the cube's links.
V5P_CUBE = "2x2x2:0,0,0;1,0,0;0,1,0;1,1,0;0,0,1;1,0,1;0,1,1;1,1,1"


@pytest.mark.parametrize("profile, coords", [("tpu-v5e", ""), ("tpu-v5p", V5P_CUBE),
                                             ("tpu-v6e", "")])
def test_a_returned_sum_prices_the_copy_of_its_all_gather(profile, coords):
    """On TPU the all_gather that completes a returned sum is copied into the output
    (128 MiB here; tests/targets/test_tpu.py checks the compiler does so), which the
    ring's gain does not pay for (compiled, libtpu 0.0.50.1: the layer 3453 -> 3602 us
    on v5p:2x2x2, 2870 -> 3145 us on v6e:2x4; v5e:2x4 8175 -> 7975 us, under the 5%
    margin); after a residual add there is no copy, and the site is rewritten. On GPU
    there is no copy either."""
    (returned,) = overlap_hlo.remarks(_megatron_70b(False), hardware=profile,
                                      device_coords=coords)
    assert not returned.applied and returned.kind == "not profitable"
    assert "returned by the program: the TPU compiler copies it out" in returned.message()
    hw = cost.hardware(profile)
    assert returned.estimate.shape.returned_bytes == 8192 * 8192 * 2
    (added,) = overlap_hlo.remarks(_megatron_70b(True), hardware=profile, device_coords=coords)
    assert added.applied and added.estimate.shape.returned_bytes == 0
    assert returned.estimate.after_us == pytest.approx(
        added.estimate.after_us + hw.returned_gather_us(8192 * 8192 * 2), rel=1e-6)
    (gpu,) = overlap_hlo.remarks(_megatron_70b(False), hardware="h100-sxm")
    assert gpu.applied and "copies it out" not in gpu.message()


def _read_by_an_add(x, w):
    g = PSUM(x * x, "x")
    return g @ w, g + x


def _read_twice_by_one_dot(x, w):
    g = PSUM(x * x, "x")
    return g @ g.T, w


def _read_by_a_contracting_dot(x, w):
    g = PSUM(x * x, "x")     # no dim both dots read as a free one (a backward's gradients)
    return g @ w, g.T @ x


@pytest.mark.parametrize("fn", [_read_by_an_add, _read_twice_by_one_dot,
                                _read_by_a_contracting_dot])
def test_an_all_reduce_read_by_more_than_dots_is_left_with_a_remark(fn):
    (site,), counts = _sites(fn, [((64, 32), P()), ((32, 16), P())], (P(), P()))
    assert not site.applied and site.kind == "operand not a dot's result"
    assert counts["stablehlo.all_reduce"] >= 1 and counts["stablehlo.reduce_scatter"] == 0


def test_all_reduce_inside_a_scan_body():
    """A row-parallel matmul and its psum inside a scanned layer stack (each layer keeps
    its own slice of the sum): the ring and its all_gather are built inside the loop
    body."""
    def layers(x, w):
        def step(h, wi):
            y = PSUM(h @ wi, "x")
            return jax.lax.dynamic_slice_in_dim(y, jax.lax.axis_index("x") * 8, 8, 1), None
        return jax.lax.scan(step, x, w)[0]

    check(Program(layers, (8,), ("x",), [((16, 64), P(None, "x")),
                                         ((3, 64, 64), P(None, "x", None))], P(None, "x")),
          left=GATHER_LEFT, pipeline=ONLY.format(options=""))
