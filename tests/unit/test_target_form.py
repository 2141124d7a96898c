"""Target differences are one `TargetForm`, chosen from the target and read by plans and
emitters: no pass module branches on the platform."""
import ast
from pathlib import Path

from overlap_hlo.passes.all_gather_matmul import OverlapAllGatherMatmul
from overlap_hlo.plan.target_form import DEFAULT, TargetForm

ROOT = Path(__file__).resolve().parents[2]


def test_no_pass_module_reads_the_platform():
    read = [f"{path.name}:{node.lineno}" for path in sorted((ROOT / "passes").glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if (isinstance(node, ast.Attribute) and node.attr == "platform")
            or (isinstance(node, ast.Name) and node.id == "platform")]
    assert read == []


def test_the_form_follows_the_target():
    assert TargetForm.of("cpu") is TargetForm.of("") is DEFAULT
    tpu, gpu = TargetForm.of("tpu"), TargetForm.of("gpu")
    assert tpu.allocates and gpu.allocates and not DEFAULT.allocates
    assert tpu.tied_sums and tpu.views_in_loop and not tpu.serial_blocks
    assert gpu.paced_sends and gpu.last_add_apart and not DEFAULT.paced_sends
    assert OverlapAllGatherMatmul(target="tpu").form is tpu
    assert OverlapAllGatherMatmul(hardware="h100-sxm").form is gpu   # the profile's
    assert OverlapAllGatherMatmul().form is DEFAULT
