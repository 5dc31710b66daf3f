"""The ablation study end to end: experiments, multirun, failure isolation, aggregation, W&B sweeps."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from attnlab.config import CONF_DIR, compose_config
from attnlab.dashboard import main as dashboard_main
from attnlab.report import build_report
from attnlab.report.aggregate import group_cells, load_runs, lr_sensitivity, swept_axes
from attnlab.sweep import studies

ROOT = Path(__file__).resolve().parents[1]


def run_sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnlab.sweep", "--logs", str(tmp_path / "logs"), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(tmp_path)},
    )


def test_smoke_sweep_end_to_end_with_a_failing_cell(tmp_path):
    """The smoke grid through the real entry point; one d_k value is invalid, the rest must finish."""
    proc = run_sweep(tmp_path, "--study", "smoke", "model.d_k=16,32,-1", "logger=csv")
    assert proc.returncode == 1, proc.stderr[-2000:]  # a failed cell makes the sweep exit non-zero
    report = tmp_path / "reports" / "smoke"
    lines = (report / "ablation.csv").read_text().splitlines()
    header, rows = lines[0].split(","), [r.split(",") for r in lines[1:]]
    assert len(rows) == 6  # 3 d_k x 2 scalings, one row per cell
    col = {name: i for i, name in enumerate(header)}
    for row in rows:
        if row[col["model.d_k"]] == "-1":
            assert row[col["n_failed"]] == "1" and "model.d_k" in row[col["errors"]]
        else:
            assert row[col["n_ok"]] == "1" and float(row[col["val/loss_mean"]]) < 10
            assert float(row[col["attn/L0/entropy_norm_mean"]]) > 0
    md = (report / "ablation.md").read_text()
    assert md.count("FAILED") == 2 and "## Failed runs" in md
    assert (report / "index.html").read_text().count('class="failed"') == 2
    assert (report / "val_loss_vs_dk.png").exists() and (report / "max_logit_over_training.png").exists()


def fake_run(root: Path, name: str, overrides: list[str], loss: float | None, n_layer: int = 2, vocab: int = 10,
             extra: dict | None = None):
    run = root / name
    run.mkdir(parents=True)
    metrics = {"val/loss": loss, **{f"attn/L{i}/entropy_norm": 0.5 + i for i in range(n_layer)}} if loss is not None else {}
    metrics.update(extra or {})
    results = {"status": "ok" if loss is not None else "failed", "error": None if loss is not None else "boom",
               "overrides": overrides, "config": {"study": "fake", "model": {"n_layer": n_layer}}, "metrics": metrics}
    (run / "results.json").write_text(json.dumps(results))
    (run / "vocab.json").write_text(json.dumps({"chars": [str(i) for i in range(vocab)]}))


def test_aggregation_means_and_std_over_seeds(tmp_path):
    losses = {("16", "none"): [2.0, 2.2, 2.6], ("16", "inv_sqrt_d"): [1.5, 1.7, 1.6], ("32", "none"): [2.4, 2.5, 2.9]}
    for (dk, sc), values in losses.items():
        for seed, loss in enumerate(values):
            fake_run(tmp_path / "sweep", f"{dk}-{sc}-{seed}", [f"model.d_k={dk}", f"model.attention.scaling={sc}", f"seed={seed}"], loss)
    fake_run(tmp_path / "sweep", "32-inv-0", ["model.d_k=32", "model.attention.scaling=inv_sqrt_d", "seed=0"], None)
    runs = load_runs(tmp_path / "sweep")
    axes = swept_axes(runs)
    assert axes == ["model.d_k", "model.attention.scaling"]  # seed is not an axis
    cells = {tuple(c.axes.values()): c for c in group_cells(runs, axes)}
    for key, values in losses.items():
        assert cells[key].mean("val/loss") == pytest.approx(statistics.fmean(values))
        assert cells[key].std("val/loss") == pytest.approx(statistics.stdev(values))
    assert len(cells[("32", "inv_sqrt_d")].failed) == 1 and cells[("32", "inv_sqrt_d")].mean("val/loss") is None
    summary = build_report(tmp_path / "sweep", reports=tmp_path / "reports")
    assert summary["cells"] == 4 and summary["failed"] == 1
    md = (tmp_path / "reports" / "fake" / "ablation.md").read_text()
    assert f"{statistics.fmean(losses[('16', 'none')]):.3f} ± {statistics.stdev(losses[('16', 'none')]):.3f}" in md


def test_head_columns_appear_only_when_the_runs_logged_them(tmp_path):
    heads = {"heads/repeat_acc": 0.9, "heads/induction_max": 0.12, "heads/induction_control_max": 0.1,
             "heads/L0/induction_knockout_all_heads": 0.78, "heads/L1/induction_knockout_all_heads": -0.001}
    fake_run(tmp_path / "tasks", "a", ["model.n_layer=2"], 0.5, extra=heads)
    fake_run(tmp_path / "text", "a", ["model.n_layer=2"], 0.5)
    history = [{"step": s, "repeat_acc": s / 10, "L0/induction_max": 0.1, "L1/induction_max": 0.0,
                "L0/induction_knockout_all_heads": s / 20, "L1/induction_knockout_all_heads": 0.0} for s in (0, 5, 10)]
    (tmp_path / "tasks" / "a" / "heads.json").write_text(json.dumps({"heads": [], "history": history}))
    build_report(tmp_path / "tasks", reports=tmp_path / "r1")
    assert (tmp_path / "r1" / "fake" / "heads_over_training.png").stat().st_size > 0
    build_report(tmp_path / "text", reports=tmp_path / "r2")
    md = (tmp_path / "r1" / "fake" / "ablation.md").read_text()
    assert "| repeat acc (probe) | induction (best head) | control (best head) |" in md
    assert "| 0.78 / -0.001 |" in md  # knockout per layer, L0 then L1
    csv_header = (tmp_path / "r1" / "fake" / "ablation.csv").read_text().splitlines()[0]
    assert "heads/L1/induction_knockout_all_heads_mean" in csv_header
    plain = (tmp_path / "r2" / "fake" / "ablation.md").read_text()
    assert "repeat acc" not in plain and "knockout" not in plain
    assert not (tmp_path / "r2" / "fake" / "heads_over_training.png").exists()


def test_lr_sensitivity_definition(tmp_path):
    """Wortsman et al.: mean over LRs of min(loss, initial loss) - best loss; a diverged LR counts as the initial loss."""
    import math

    grid = {"1e-3": 2.0, "1e-2": 3.0, "1e-1": None}
    for lr, loss in grid.items():
        fake_run(tmp_path / "s", f"lr{lr}", [f"optim.lr={lr}"], loss, vocab=100)
    cells = group_cells(load_runs(tmp_path / "s"), ["optim.lr"])
    expected = statistics.fmean([2.0, 3.0, math.log(100)]) - 2.0
    assert lr_sensitivity(cells) == {"all": pytest.approx(expected)}


@pytest.mark.parametrize("study", studies())
def test_every_experiment_composes(study, tmp_path):
    cfg = compose_config([f"experiment={study}"], tmp_path)
    assert cfg.study == study


def config_has(cfg, key: str) -> bool:
    if (CONF_DIR / key).is_dir():  # a config group, e.g. attention=sdpa
        return True
    return OmegaConf.select(cfg, key, default="__missing__") != "__missing__"


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_wandb_sweeps_name_only_existing_keys(path, tmp_path):
    spec = yaml.safe_load(path.read_text())
    assert spec["method"] in ("grid", "bayes", "random") and spec["metric"]["name"] == "val/loss"
    assert "${args_no_hyphens}" in spec["command"]
    assert spec["name"] in studies()
    cfg = compose_config([], tmp_path)
    for key in spec["parameters"]:
        assert config_has(cfg, key), f"{path.name}: {key} is not a config key"
    experiment = yaml.safe_load((CONF_DIR / "experiment" / f"{spec['name']}.yaml").read_text())
    swept = set(experiment["hydra"]["sweeper"]["params"])
    assert swept <= set(spec["parameters"]), f"{path.name} must mirror the Hydra experiment's axes"


def test_dashboard_without_login_prints_plan_and_exits_zero(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dashboard_main(["--layers", "2"]) == 0
    out = capsys.readouterr().out
    assert "attn/L1/max_logit" in out and "Not logged in" in out


def test_compare_plots_runs_side_by_side(tmp_path, monkeypatch):
    from attnlab.report.__main__ import main as report_main

    for name in ("a", "b"):
        run = tmp_path / name
        run.mkdir()
        lines = [{"step": s, **{f"attn/L{i}/{k}": 0.1 * s + i for i in range(2) for k in ("entropy_norm", "max_logit", "sink_mass")}}
                 for s in (1, 101)]
        (run / "attention_stats.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    monkeypatch.chdir(tmp_path)
    assert report_main(["--compare", f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"]) == 0
    assert (tmp_path / "reports" / "compare" / "stats_over_training.png").stat().st_size > 0
    assert report_main(["--compare", "no-label"]) == 2
