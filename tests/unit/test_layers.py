"""The package's layers import one way: each module imports only from its own layer and
the layers before it (overlap_hlo/__init__.py lists them), at any nesting level."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Package -> (rank, directory). ir and plan are both first and must not import each other.
LAYERS = {
    "overlap_hlo.ir": (1, "overlap_hlo/ir"),
    "overlap_hlo.plan": (1, "overlap_hlo/plan"),
    "overlap_hlo.groups": (2, "overlap_hlo/groups"),
    "overlap_hlo.rewrite": (3, "overlap_hlo/rewrite"),
    "overlap_hlo.passes": (4, "passes"),
    "overlap_hlo.api": (5, "overlap_hlo/api.py"),
    "overlap_hlo.targets": (6, "overlap_hlo/targets"),
    "overlap_hlo.tools": (7, "tools"),
}


def layer_of(module: str) -> str:
    for name in sorted(LAYERS, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    raise AssertionError(f"{module} is in no layer")


def modules():
    for package, (_, where) in LAYERS.items():
        path = ROOT / where
        for file in ([path] if path.suffix == ".py" else sorted(path.glob("*.py"))):
            name = package if file.suffix and path.suffix else f"{package}.{file.stem}"
            yield name.removesuffix(".__init__"), file


def imported(name: str, file: Path):
    """(module imported, line) for every import of overlap_hlo in `file`."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [base] if node.module else [f"{base}.{a.name}" for a in node.names]
            if base == "overlap_hlo":   # from overlap_hlo import api, ...
                targets = [f"overlap_hlo.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if target.startswith("overlap_hlo"):
                yield target, node.lineno


def test_every_module_is_in_a_layer():
    listed = {file.resolve() for _, file in modules()}
    on_disk = set((ROOT / "overlap_hlo").rglob("*.py")) - {ROOT / "overlap_hlo/__init__.py"}
    assert on_disk - listed == set()


def test_imports_run_one_way():
    upward = []
    for name, file in modules():
        mine = layer_of(name)
        for target, line in imported(name, file):
            if target == "overlap_hlo":   # the public API, above every layer but tools
                if mine != "overlap_hlo.tools":
                    upward.append(f"{file.relative_to(ROOT)}:{line} imports the package")
                continue
            theirs = layer_of(target)
            rank, other = LAYERS[mine][0], LAYERS[theirs][0]
            if other > rank or (other == rank and theirs != mine):
                upward.append(f"{file.relative_to(ROOT)}:{line} ({mine}) imports {target}")
    assert upward == []


def test_the_check_sees_an_upward_import(tmp_path):
    file = tmp_path / "x.py"
    file.write_text("def f():\n    from overlap_hlo.passes import ALL_PASSES\n")
    assert list(imported("overlap_hlo.rewrite.x", file)) == [("overlap_hlo.passes", 2)]
    assert LAYERS[layer_of("overlap_hlo.passes")][0] > LAYERS["overlap_hlo.rewrite"][0]
