"""The package's layers point one way: the core (what trains and measures one run) imports nothing of
the studies built on runs, the studies nothing of the tools around them, and no package imports one
that imports it back. A module's layer is the folder it sits in: ``attnlab/studies/`` above the core,
``attnlab/repro/`` and ``attnlab/sweeps/`` above the studies they read, ``attnlab/tools/`` above them, anything
else the core. Function-level imports count too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "attnlab"
LAYERS = {"studies": 1, "repro": 2, "sweeps": 2, "tools": 3}  # the folders above the core, by rank
DISPATCH = {"cli"}  # the command line names every entry point


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, name: str, is_package: bool = False) -> set[str]:
    """The attnlab modules (or packages) that module ``name`` imports, anywhere in its body."""
    package = name if is_package else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            # `from ... import timing`, `from .studies import sweep`: a name may be a module of the package
            found.update([target] if node.module else [], (f"{target}.{a.name}" for a in node.names))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {t for t in found if t == "attnlab" or t.startswith("attnlab.")}


def imports() -> dict[str, set[str]]:
    """Module -> the attnlab modules (or packages) it imports, anywhere in its body."""
    return {
        module_name(path): imported(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
        for path in ROOT.rglob("*.py")
    }


def layer(name: str) -> int:
    """0 for the core, 1 for a module under attnlab/studies/, 2 under repro/ or sweeps/, 3 under tools/."""
    parts = name.split(".")
    return LAYERS.get(parts[1], 0) if len(parts) > 1 else 0


def unit(name: str) -> str:
    """The package or module a name belongs to: the first part below attnlab, or below its layer's folder."""
    parts = name.split(".")[1:]
    return ".".join(parts[:2] if parts and parts[0] in LAYERS else parts[:1])


def test_no_layer_imports_a_layer_above_it():
    bad = [
        (m, t)
        for m, targets in imports().items()
        if unit(m) not in DISPATCH
        for t in targets
        if unit(t) and layer(t) > layer(m)
    ]
    assert not bad, bad


def test_no_two_packages_import_each_other():
    edges = {(unit(m), unit(t)) for m, targets in imports().items() for t in targets if unit(t) and unit(m) != unit(t)}
    cycles = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
    assert not cycles, cycles


def test_the_top_of_the_package_is_the_core():
    """Every module or package directly under attnlab/ is the core, or one of the layers' folders: none
    of them but the command line reaches into a layer's folder."""
    top = {p.stem for p in ROOT.iterdir() if (p.suffix == ".py" or (p / "__init__.py").is_file())} - {"__init__"}
    assert set(LAYERS) <= top
    reaching = sorted(
        (m, t)
        for m, targets in imports().items()
        if layer(m) == 0 and unit(m) not in DISPATCH
        for t in targets
        if layer(t) > 0
    )
    assert not reaching, reaching


def test_the_layer_packages_import_nothing():
    """``attnlab.tools`` and ``attnlab.studies`` are a docstring each, so a tool imports only what it uses
    (gpu_check and wheelhouse run where hydra and wandb are not installed)."""
    for name in LAYERS:
        body = ast.parse((ROOT / name / "__init__.py").read_text(encoding="utf-8")).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), name
        assert isinstance(body[0].value.value, str) and len(body[0].value.value.splitlines()) == 1, name


def test_the_check_sees_relative_and_lazy_imports():
    lazy = "def f():\n    from ...tools.bench import kernels\n    from ... import timing\n"
    found = imported(lazy, "attnlab.studies.report.layout")
    assert found == {"attnlab.tools.bench", "attnlab.tools.bench.kernels", "attnlab.timing"}
    assert layer("attnlab.tools.bench.kernels") == 3 > layer("attnlab.studies.report.layout") == 1
    assert layer("attnlab.studies.report.layout") > layer("attnlab.training.train") == layer("attnlab") == 0
    assert imported("from . import layout\n", "attnlab.studies.report", is_package=True) == {
        "attnlab.studies.report.layout"
    }
    assert unit(max(imported("from .studies import sweep\n", "attnlab.sample"))) == "studies.sweep"
    assert unit("attnlab.studies.report.layout") == "studies.report" != unit("attnlab.sweeps.sweep") == "sweeps.sweep"
    assert unit("attnlab.training.train") == "training" and unit("attnlab.attention.masks") == "attention"


# the core modules that may hold the composed DictConfig, and why: above them the entry hands down a RunSpec
READS_THE_COMPOSED_CONFIG = {
    "attnlab.config.compose": "composes it",
    "attnlab.config.schema": "the gate: reads each declared key once into the typed Schema",
    "attnlab.config.run": "builds the RunSpec from the gate",
    "attnlab.config.study": "composes an experiment into its Study",
    "attnlab.training.train": "the entry point: settles, gates, and instantiates the data, callbacks and Trainer",
    "attnlab.training.settle": "renamed keys and the resolved precision, written before the config is recorded",
    "attnlab.training.init_from": "the checkpoint's architecture, written before the gate",
    "attnlab.training.loggers": "instantiates the logger blocks",
    "attnlab.training.devices": "edits Hydra's own job record so DDP's ranks rerun one job",
}


def test_below_the_entry_point_the_config_is_the_typed_run_spec():
    """Outside the modules that compose, settle, gate or instantiate, no core module imports omegaconf:
    the model, attention, callbacks, data, interop and inference read the typed spec or plain values."""
    holders = {
        module_name(path)
        for path in ROOT.rglob("*.py")
        if layer(module_name(path)) == 0
        and unit(module_name(path)) not in DISPATCH
        and any(
            (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "omegaconf")
            or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "omegaconf" for a in node.names))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    }
    assert holders <= set(READS_THE_COMPOSED_CONFIG), sorted(holders - set(READS_THE_COMPOSED_CONFIG))
    assert "attnlab.training.wandb_runs" not in holders and "attnlab.training.results" not in holders
