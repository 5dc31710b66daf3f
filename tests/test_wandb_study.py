"""A study is one W&B group: runs named by the axes they set, every swept axis a top-level config
field, pictures as W&B images, a dashboard per study, and its offline runs browsable together.

The end-to-end tests read the offline ``.wandb`` files with wandb's own protobuf schema
(``test_wandb_summary.records``) and with ``wandb leet inspect``, not with attnlab's logging code.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from test_wandb_summary import records

from attnlab.config.compose import compose_config
from attnlab.config.run import Job, RunSpec, default_choices
from attnlab.config.study import file_sweeps, load_study, study_names, swept_keys
from attnlab.studies.report.wandb_summary import wandb_target
from attnlab.tools.dashboard import build_plan, link_offline_runs, offline_runs
from attnlab.training import wandb_runs

STUDIES = [s for s, keys in swept_keys().items() if keys]


def spec_of(overrides: list[str], swept=(), stamp=None) -> RunSpec:
    """The spec a job of these overrides hands below the entry point."""
    return RunSpec.of(compose_config(overrides, "unwritten"), Job.of(overrides, swept=swept, stamp=stamp))


def hydra_text(value) -> str:
    return str(value)  # how a multirun job's override writes a value (True for a bool)


def grid_jobs(study: str, seeds=(0, 1)):
    grid = load_study(study).grid
    for values in itertools.product(*grid.values(), seeds):
        *cell, seed = values
        yield grid, dict(zip(grid, cell)), seed


@pytest.mark.parametrize("study", STUDIES)
def test_every_swept_key_is_a_top_level_field_with_the_runs_value(study):
    for key, values in load_study(study).grid.items():
        name = wandb_runs.axis_name(key)
        assert wandb_runs.AXES.get(name) == key, (study, key, name)
        value = values[-1]
        overrides = [f"experiment={study}", f"{key}={hydra_text(value)}"]
        if name in wandb_runs.GROUP_AXES:
            assert wandb_runs.axes(spec_of(overrides))[name] == str(value)
        else:
            job = compose_config(overrides)
            assert wandb_runs.axes(spec_of(overrides))[name] == OmegaConf.select(job, key) == value
    assert wandb_runs.axes(spec_of([f"experiment={study}"]))["study"] == study


def test_the_resolved_head_width_and_kv_heads_are_axes():
    """d_k and n_kv_head are the model's resolved values, not the config's nulls."""
    fields = wandb_runs.axes(spec_of(["model.d_model=96", "model.n_head=3"]))
    assert (fields["d_k"], fields["n_kv_head"], fields["n_head"]) == (32, 3, 3)
    assert wandb_runs.axes(spec_of(["model.d_k=16", "model.n_kv_head=1"]))[("d_k")] == 16


def test_the_keys_read_as_plain_yaml_are_those_omegaconf_reads():
    """file_sweeps and default_choices read plain YAML: the keys OmegaConf's reading gives, for each
    committed experiment file and train.yaml's defaults."""
    from attnlab.config.compose import CONF_DIR

    paths = sorted((CONF_DIR / "experiment").glob("*.yaml"))
    assert paths
    for path in paths:
        params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params", default=None)
        assert file_sweeps(path) == [str(k) for k in (params or {})], path.name
    defaults = OmegaConf.load(CONF_DIR / "train.yaml").defaults
    read = {str(g): str(o) for e in defaults if not isinstance(e, str) for g, o in e.items() if o is not None}
    assert default_choices() == {g: o for g, o in read.items() if not g.startswith("optional ")}
    assert default_choices()["attention"] == "scaled"


def test_the_plainly_read_swept_keys_are_each_studys_grid():
    """What a training process reads cheaply (each experiment file's own swept keys) is what the study
    loader composes, but for the keys a study takes from the experiment it extends."""
    for name in study_names():
        own, grid = swept_keys()[name], list(load_study(name).grid)
        assert set(own) <= set(grid), name
        assert set(grid) - set(own) <= set(wandb_runs.AXES.values()), name


def test_axes_are_read_from_the_experiment_files(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "new.yaml").write_text(
        "hydra:\n  sweeper:\n    params:\n      model.foo: 1,2\n      optim.name: a,b\n"
    )
    keys = swept_keys(tmp_path)["new"]
    assert keys == ["model.foo", "optim.name"]
    derived = wandb_runs.derive_axes(["model.attention.scaling", *keys, "data.scaling"])
    assert derived == {
        "scaling": "model.attention.scaling",
        "foo": "model.foo",
        "optim_name": "optim.name",
        "data_scaling": "data.scaling",
    }


@pytest.mark.parametrize("study", STUDIES)
def test_run_names_are_unique_within_a_study_and_carry_the_swept_values(study):
    names = []
    for grid, cell, seed in grid_jobs(study):
        overrides = [
            f"experiment={study}",
            "debug=smoke",
            *(f"{k}={hydra_text(v)}" for k, v in cell.items()),
            f"seed={seed}",
        ]
        name = wandb_runs.run_name(overrides, seed, list(grid))
        parts = name.split(" ")
        expected = [
            f"{wandb_runs.axis_name(k)}={str(v).lower() if isinstance(v, bool) else v}" for k, v in cell.items()
        ]
        assert parts == [*expected, f"seed={seed}"], name  # the study's axes in its file's order, the seed last
        names.append(name)
    assert len(set(names)) == len(names) > 1


def test_a_single_run_is_named_by_the_axes_it_sets():
    assert wandb_runs.run_name([], 1337) == "default seed=1337"
    name = wandb_runs.run_name(
        [
            "model.d_k=16",
            "trainer.max_steps=5",
            "logger=csv",
            "attention=sdpa",
            "+debug=smoke",
            "optim.weight_decay=0",
            "callbacks.heads.every_n_steps=10",
        ],
        3,
    )
    assert name == "d_k=16 attention=sdpa weight_decay=0 seed=3"


def test_the_group_is_the_study_and_run_group_wins():
    assert wandb_runs.run_group(spec_of(["experiment=sinks"]).schema) == "sinks"
    assert wandb_runs.run_group(spec_of([]).schema) == "adhoc"
    assert wandb_runs.run_group(spec_of(["experiment=sinks", "run_group=mine"]).schema) == "mine"


def test_a_continued_run_keeps_its_group_and_name_and_explicit_ones_win():
    kept = wandb_runs.wandb_identity(
        spec_of(["experiment=sinks"]),
        earlier={"group": "sinks", "name": "bos=true escape=learned seed=2", "sweep": "s"},
    )
    assert (kept["group"], kept["name"], kept["sweep"]) == ("sinks", "bos=true escape=learned seed=2", "s")
    mine = wandb_runs.wandb_identity(spec_of(["logger.wandb.name=mine", "logger.wandb.group=g", "model.d_k=8"]))
    assert (mine["group"], mine["name"]) == ("g", "mine") and "d_k=8" in mine["tags"]
    fresh = wandb_runs.wandb_identity(spec_of(["experiment=sinks", "model.d_k=8", "seed=4"]))
    assert (fresh["group"], fresh["name"], fresh["sweep"]) == ("sinks", "d_k=8 seed=4", None)


def test_tags_carry_each_axis_and_the_seed_when_swept():
    spec = spec_of(
        ["experiment=sinks", "data.bos=True", "model.attention.escape=learned", "seed=2", "debug=smoke"],
        swept=["data.bos", "model.attention.escape"],
        stamp="2026-01-01_00-00-00_sinks",
    )
    tags = wandb_runs.run_tags(spec)
    assert {"bos=true", "escape=learned", "seed=2", "sweep=2026-01-01_00-00-00_sinks", "debug=smoke"} <= set(tags)
    assert spec.job.multirun and wandb_runs.wandb_identity(spec)["sweep"] == "2026-01-01_00-00-00_sinks"
    long = wandb_runs.run_tags(spec_of([f"data.path={'x' * 80}"]))
    assert f"data_path={'x' * 54}" in long and all(len(t) <= 64 for t in long)


def test_summary_joins_the_recorded_group(tmp_path):
    def run(job, results):
        return SimpleNamespace(dir=tmp_path / "2026-01-01_sinks" / job, results=results)

    logger = {"logger": {"wandb": {"project": "p", "mode": "offline"}}, "study": "sinks"}
    runs = [
        run("0", {"config": logger, "wandb": {"group": "sinks", "sweep": "2026-01-01_sinks"}}),
        run("1", {"config": logger, "wandb": {"group": "sinks", "sweep": "2026-02-01_sinks"}}),
    ]
    target = wandb_target(runs)
    assert target["group"] == "sinks" and target["sweeps"] == ["2026-01-01_sinks", "2026-02-01_sinks"]


@pytest.mark.parametrize("study", STUDIES)
def test_dashboard_plan_groups_by_the_studys_axes_and_leads_with_its_headline(study):
    plan = build_plan(study, n_layer=2)
    axes = [wandb_runs.axis_name(k) for k in load_study(study).grid]
    assert plan.group_by == axes and plan.study == study
    title, headline = next(iter(plan.sections.items()))
    assert title.startswith("Headline")
    assert {p.x for p in headline} == set(axes)
    assert {y for p in headline for y in p.y} >= {
        m.format(i=i) for m in load_study(study).question.headline for i in range(2)
    }
    assert "val/loss" in plan.metrics()["Loss"]
    media = {y for panels in plan.sections.values() for p in panels if p.kind == "media" for y in p.y}
    assert media == {"attn/maps", "heads/heatmap"}
    assert any("mem/peak_bytes" in p.y for p in plan.sections["Cost"])


def test_dashboard_headline_puts_a_wide_numeric_axis_on_a_log_scale():
    panels = next(iter(build_plan("lr_sensitivity", n_layer=1).sections.values()))
    kinds = {(p.x, p.kind, p.log_x) for p in panels}
    assert ("lr", "scatter", True) in kinds and ("scaling", "bar", False) in kinds
    assert ("d_k", "scatter", True) in {
        (p.x, p.kind, p.log_x) for p in next(iter(build_plan("dk_scaling", n_layer=1).sections.values()))
    }


def test_dashboard_for_sinks_prints_a_plan_grouped_by_bos_and_escape(monkeypatch, capsys):
    from attnlab.tools.dashboard import main

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent")
    monkeypatch.setattr("attnlab.tools.dashboard.logged_in", lambda: False)
    assert main(["--study", "sinks"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.rstrip(":").endswith("grouped by bos, escape")
    assert main(["--study", "nope"]) == 2
    assert "--study" in capsys.readouterr().err


def test_dashboard_workspace_builds_offline():
    pytest.importorskip("wandb_workspaces")
    from attnlab.tools.dashboard import workspace

    view = workspace(build_plan("sinks", n_layer=2), "entity", "attnlab")._to_model()
    spec = view.model_dump_json()
    assert "sinks" in spec and "attn/maps" in spec


def fake_run(root: Path, sweep: str, job: str, results: dict) -> Path:
    run_dir = root / sweep / job
    (run_dir / "wandb" / f"offline-run-2026_{sweep}_{job}").mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps(results))
    return run_dir


def test_offline_runs_of_a_study_are_linked_into_one_folder(tmp_path):
    logs = tmp_path / "logs"
    fake_run(logs, "a_sinks", "0", {"wandb": {"group": "sinks"}})
    fake_run(logs, "b_sinks", "0", {"config": {"study": "sinks"}})  # recorded without a group
    fake_run(logs, "c_gqa", "0", {"wandb": {"group": "gqa"}})
    (logs / "a_sinks" / "wandb" / "offline-run-2026_table").mkdir(parents=True)
    found = {p.name for p in offline_runs("sinks", logs)}
    assert found == {"offline-run-2026_a_sinks_0", "offline-run-2026_b_sinks_0", "offline-run-2026_table"}
    out = logs / "wandb" / "sinks"
    links = link_offline_runs("sinks", logs, out)
    assert {p.name for p in links} == found and all(p.is_symlink() and p.is_dir() for p in links)
    assert len(link_offline_runs("sinks", logs, out)) == 3  # linking again replaces, never nests


def test_a_resumed_run_keeps_the_group_and_name_its_w_and_b_run_has(tmp_path):
    from attnlab.training.train import train

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb_run_id").write_text("abcd1234")  # the run dir's W&B run, started by an earlier attempt
    (run_dir / "results.json").write_text(
        json.dumps(
            {
                "status": "interrupted",
                "wandb": {
                    "group": "sinks",
                    "name": "bos=true escape=learned seed=2",
                    "sweep": "2026-01-01_00-00-00_sinks",
                },
            }
        )
    )
    train(compose_config(["debug=smoke", "logger=wandb", "callbacks=none", "trainer.max_steps=2"], run_dir))
    assert json.loads((run_dir / "results.json").read_text())["wandb"]["name"] == "bos=true escape=learned seed=2"
    (offline,) = (run_dir / "wandb").glob("offline-run-*abcd1234")
    shown = run_records(offline, wait_s=30)
    assert (shown["group"], shown["name"]) == ("sinks", "bos=true escape=learned seed=2")
    assert shown["config"]["sweep"] == "2026-01-01_00-00-00_sinks"


# --- end to end: a smoke sweep read back from its offline files ------------------------------------


def run_records(run_dir: Path, wait_s: float = 0) -> dict:
    """Group, name, job type, tags, config and the images (key -> how many steps logged one) of one
    offline run, from its records. ``wait_s``: wait that long for the run's exit record (W&B's own
    process may still be writing the file of a run finished in this process)."""
    (path,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not any(r.WhichOneof("record_type") == "exit" for r in records(path)):
        time.sleep(0.2)
    out = {"config": {}, "images": {}}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.update(
                group=record.run.run_group,
                name=record.run.display_name,
                job_type=record.run.job_type,
                tags=list(record.run.tags),
            )
            out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":  # an image list is stored field by field: nested_key = [key, "_type"]
            for item in record.history.item:
                if list(item.nested_key[-1:]) == ["_type"] and "image" in json.loads(item.value_json):
                    out["images"][item.nested_key[0]] = out["images"].get(item.nested_key[0], 0) + 1
    return out


SMOKE = {  # two axes each, a tiny grid: 4 runs
    "sinks": ["model.attention.escape=none,learned"],
    "dk_scaling": ["model.d_k=16,32", "model.init_std=0.02"],
}


@pytest.fixture(scope="module", params=sorted(SMOKE))
def smoke_sweep(request, tmp_path_factory):
    study = request.param
    root = tmp_path_factory.mktemp(f"sweep_{study}")  # the report lands in <cwd>/reports: not the checkout's
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.sweeps.sweep",
            "--study",
            study,
            "--jobs",
            "1",
            "--seeds",
            "1",  # the study declares more; one seed a cell is the 4 runs this checks
            "--logs",
            str(root / "logs"),
            "debug=smoke",
            "callbacks.attention_maps.every_n_steps=3",
            *SMOKE[study],
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (sweep_dir,) = (root / "logs").glob(f"*_{study}")
    return study, root, sweep_dir


@pytest.mark.slow
def test_smoke_sweep_is_one_group_with_named_runs_axes_and_images(smoke_sweep):
    study, _, sweep_dir = smoke_sweep
    grid = load_study(study).grid
    jobs = [run_records(d) for d in sorted(sweep_dir.glob("*/wandb/offline-run-*"))]
    assert len(jobs) == 4
    assert {j["group"] for j in jobs} == {study}
    names = [j["name"] for j in jobs]
    assert len(set(names)) == len(names)
    swept = [wandb_runs.axis_name(k) for k in grid]
    for job in jobs:
        for axis in swept:
            value = job["config"][axis]
            assert f"{axis}={str(value).lower() if isinstance(value, bool) else value}" in job["name"].split(" ")
            assert any(t.startswith(f"{axis}=") for t in job["tags"])
        assert job["config"]["study"] == study and job["config"]["sweep"] == sweep_dir.name
        assert job["images"].get("attn/maps", 0) >= 2 and job["images"].get("heads/heatmap") == 1, job[
            "images"
        ]  # maps at steps 3 and 6
    assert len({tuple(j["config"][a] for a in swept) for j in jobs}) == 4  # the 4 cells, each once
    (summary,) = [run_records(d) for d in (sweep_dir / "wandb").glob("offline-run-*")]
    assert summary["group"] == study and summary["job_type"] == "summary"
    assert summary["name"] == f"{study}-table"


@pytest.mark.slow
def test_a_studys_offline_runs_open_together_in_wandb_leet(smoke_sweep):
    study, root, _ = smoke_sweep
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab.tools.dashboard", "--study", study, "--offline", "--logs", str(root / "logs")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    links = sorted((root / "logs" / "wandb" / study).glob("offline-run-*"))
    assert len(links) == 5  # 4 runs and the summary run
    wandb_bin = Path(sys.executable).parent / "wandb"
    names = set()
    for link in links:
        shown = subprocess.run(
            [str(wandb_bin), "leet", "inspect", "--summary", "--json", str(link)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        names.add(json.loads(shown.stdout)["name"])
    assert f"{study}-table" in names and len(names) == 5
