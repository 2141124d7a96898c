"""Module-wide facts the passes read before building anything.

Channel handles: every new permute takes a fresh handle above the module's highest;
when they would run past INT64_MAX the site is left unchanged before any op is
built. Attributes of unexpected types on ops the passes do not know are not
channels or shardings. A variadic all_gather is reported. The hardware profile is
read once per pass instance.
"""
import pytest
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

import overlap_hlo
from harness import GATHER_MODULE, SCATTER_MODULE, op_counts, permute_count
from overlap_hlo.passes import ALL_PASSES, all_gather_matmul, matmul_reduce_scatter
from overlap_hlo.passes.all_gather_matmul import OverlapAllGatherMatmul
from overlap_hlo.passes.matmul_reduce_scatter import OverlapMatmulReduceScatter
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.plan import cost
from overlap_hlo.rewrite.scan import INT64_MAX, ModuleScan

TEMPLATES = {"gather": (GATHER_MODULE, all_gather_matmul),
             "scatter": (SCATTER_MODULE, matmul_reduce_scatter)}


def module_for(kind: str, n: int, handle: int = 1) -> ir.Module:
    template, _ = TEMPLATES[kind]
    return overlap_hlo.parse(template.format(n=n, full=2 * n, handle=handle,
                                             group=list(range(n))))


def handles(module: ir.Module) -> list[int]:
    found = []

    def visit(op):
        if op.name == "stablehlo.collective_permute":
            found.append(stablehlo.ChannelHandle(op.attributes["channel_handle"]).handle)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def pass_options(kind, bidirectional, unroll):
    if kind == "gather":
        return OverlapAllGatherMatmul(threshold_mib=0, bidirectional=bidirectional,
                                      unroll=unroll)
    return OverlapMatmulReduceScatter(threshold_mib=0, bidirectional=bidirectional)


OPTION_GRID = [(n, bidi, unroll) for n in range(2, 9) for bidi in (False, True)
               for unroll in (1, 2, 3)]


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_permute_count_is_what_the_ring_builds(kind):
    """The count reserved before building equals the permutes built, for every
    group size and option."""
    _, module_of_pass = TEMPLATES[kind]
    for n, bidi, unroll in OPTION_GRID:
        module = module_for(kind, n)
        (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=bidi,
                                             unroll=unroll)
        assert site.applied
        expected = permute_count(module_of_pass, n, pass_options(kind, bidi, unroll))
        assert len(handles(module)) == expected, (n, bidi, unroll)
        assert sorted(handles(module)) == list(range(2, 2 + expected))


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
@pytest.mark.parametrize("bidi, unroll", [(False, 1), (True, 2)])
def test_channel_handles_exhausted_leave_the_site_unchanged(kind, bidi, unroll):
    module = module_for(kind, 4, handle=INT64_MAX)
    before = op_counts(module)
    (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=bidi,
                                         unroll=unroll)
    assert not site.applied and site.kind == Kind.CHANNELS_EXHAUSTED
    assert f"already uses handle {INT64_MAX}" in site.reason
    assert op_counts(module) == before   # nothing built, nothing left behind


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_channel_handles_up_to_int64_max(kind):
    _, module_of_pass = TEMPLATES[kind]
    needed = permute_count(module_of_pass, 4, pass_options(kind, True, 1))
    fits = module_for(kind, 4, handle=INT64_MAX - needed)
    (site,) = overlap_hlo.rewrite_module(fits, threshold_mib=0, bidirectional=True)
    assert site.applied
    assert max(handles(fits)) == INT64_MAX
    short = module_for(kind, 4, handle=INT64_MAX - needed + 1)
    (site,) = overlap_hlo.rewrite_module(short, threshold_mib=0, bidirectional=True)
    assert not site.applied and f"needs {needed} more" in site.reason


def test_channel_handles_exhausted_through_the_cli(tmp_path, capsys):
    from overlap_hlo.tools import overlap_opt

    src = tmp_path / "in.mlir"
    src.write_text(GATHER_MODULE.format(n=4, full=8, handle=INT64_MAX, group=[0, 1, 2, 3]))
    out = tmp_path / "out.mlir"
    code = overlap_opt.main([str(src), "--threshold-mib=0", "--remarks", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err
    assert "left unchanged: no free channel handles" in err
    assert op_counts(overlap_hlo.parse(out.read_text()))["stablehlo.collective_permute"] == 0


ODD_ATTRIBUTES = """module attributes {{mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @other(%a: tensor<4xf32>) -> tensor<4xf32> attributes {{channel_handle = "seven", mhlo.sharding = 3 : i64}} {{
    %0 = stablehlo.custom_call @foo(%a) {{channel_handle = 42 : i64, mhlo.sharding = [1, 2]}} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }}
  {site}
}}"""

SITE = """func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }"""


@pytest.mark.parametrize("with_site", [False, True])
def test_attributes_of_other_types_are_not_channels_or_shardings(with_site):
    module = overlap_hlo.parse(ODD_ATTRIBUTES.format(site=SITE if with_site else ""))
    scan = ModuleScan(module.operation)
    assert sorted(scan.ignored) == ["func.func channel_handle", "func.func mhlo.sharding",
                                    "stablehlo.custom_call channel_handle",
                                    "stablehlo.custom_call mhlo.sharding"]
    assert scan.last_channel == (1 if with_site else 0)
    assert not scan.partially_manual_gspmd
    sites = overlap_hlo.rewrite_module(module, threshold_mib=0)
    assert [s.applied for s in sites] == ([True] if with_site else [])
    if with_site:
        assert min(handles(module)) == 2


VARIADIC = """module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @f(%x: tensor<2x16xf32>, %y: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0:2 = "stablehlo.all_gather"(%x, %y) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>, tensor<2x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>)
    %1 = stablehlo.transpose %0#1, dims = [0, 1] : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %2 = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %2 : tensor<8x8xf32>
  }
}"""


def test_variadic_all_gather_is_reported():
    module = overlap_hlo.parse(VARIADIC)
    (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0)
    assert not site.applied and site.reason == "variadic all_gather (2 operands)"
    assert op_counts(module)["stablehlo.all_gather"] == 1
    assert op_counts(module)["stablehlo.collective_permute"] == 0


def test_the_profile_is_read_once_per_pass_instance(monkeypatch, tmp_path):
    profile = tmp_path / "chip.json"
    profile.write_text('{"name": "chip", "tflops": {"f32": 100}, "link_gbps": 50, '
                       '"latency_us": 5, "step_overhead_us": 1, "loop_overhead_us": 2}')
    real = cost._read_json

    def reads_for(sites: int) -> int:
        reads = []
        monkeypatch.setattr(cost, "_read_json", lambda path: reads.append(path) or real(path))
        funcs = "\n".join(SITE.replace("@f", f"@f{i}") for i in range(sites))
        module = overlap_hlo.parse(ODD_ATTRIBUTES.format(site=funcs))
        found = overlap_hlo.rewrite_module(module, hardware=str(profile))
        assert len(found) == sites and all(s.estimate.hardware == "chip" for s in found)
        assert set(reads) == {str(profile)}
        return len(reads)

    # As many reads for 40 sites as for one: one per pass instance, none per site.
    assert reads_for(40) == reads_for(1) <= len(ALL_PASSES) + 1


def test_profile_field_is_not_an_option():
    assert "profile" not in OverlapAllGatherMatmul.options()
    assert OverlapAllGatherMatmul().profile.name == "h100-sxm"
    assert OverlapAllGatherMatmul(hardware="tpu-v5e").profile is cost.PROFILES["tpu-v5e"]
    assert OverlapAllGatherMatmul() == OverlapAllGatherMatmul()
