"""The package's layers point one way: the core (what trains and measures one run) imports nothing of
the studies built on runs, the studies nothing of the tools around them, and no package imports one
that imports it back. Function-level imports count too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "attnlab"
STUDIES = {"sweep", "report", "repro"}
TOOLS = {"bench", "gpu_check", "wheelhouse", "dashboard"}
DISPATCH = {"cli"}  # the command line names every entry point


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the attnlab modules (or packages) it imports, anywhere in its body."""
    out: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, node.module] if node.module else base)
                found.add(target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[name] = {t for t in found if t == "attnlab" or t.startswith("attnlab.")}
    return out


def top(name: str) -> str:
    """The first part below attnlab: the package or top-level module a name belongs to."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer(name: str) -> int:
    t = top(name)
    return 2 if t in TOOLS else 1 if t in STUDIES else 0


def test_no_layer_imports_a_layer_above_it():
    bad = [
        (m, t)
        for m, targets in imports().items()
        if top(m) not in DISPATCH
        for t in targets
        if top(t) and layer(t) > layer(m)
    ]
    assert not bad, bad


def test_no_two_packages_import_each_other():
    edges = {(top(m), top(t)) for m, targets in imports().items() for t in targets if top(t) and top(m) != top(t)}
    cycles = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
    assert not cycles, cycles


def test_the_check_sees_relative_and_lazy_imports(tmp_path):
    tree = ast.parse("def f():\n    from ..bench import kernels\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert node.level == 2 and node.module == "bench"
    assert layer("attnlab.bench.kernels") == 2 > layer("attnlab.report.layout") == 1 > layer("attnlab.train") == 0
