"""The paper table in W&B: `make report` logs the study's table and plots to one run in the study's
W&B group; a training run's offline file holds the per-layer attention and memory keys.

wandb 0.31 writes offline runs from its Go core and ships no Python reader, so ``records`` reads
the file's framing (LevelDB log blocks) and parses each record with wandb's own protobuf schema.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnlab.studies.report.wandb_summary import read_csv, wandb_target

BLOCK = 32 * 1024
HEADER = 7  # b":W&B", a 2-byte magic, a version byte


def records(path: Path):
    """wandb_internal_pb2.Record objects of an offline ``run-<id>.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, parts = HEADER, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a record header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        parts = chunk if kind in (1, 2) else parts + chunk  # FULL, FIRST / MIDDLE, LAST
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def history(run_dir: Path) -> dict[str, list]:
    """Every logged key of an offline run, with its values in step order. wandb stores a logged
    dict (a Table, an Image) as one item per field, ``nested_key = [key, field]``: rebuilt here."""
    (path,) = run_dir.glob("run-*.wandb")
    keys: dict[str, list] = {}
    for record in records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        step: dict = {}
        for item in record.history.item:
            *parents, leaf = [item.key] if item.key else list(item.nested_key)
            node = step
            for name in parents:
                node = node.setdefault(name, {})
            node[leaf] = json.loads(item.value_json)
        for key, value in step.items():
            keys.setdefault(key, []).append(value)
    return keys


def fake_run(tmp_path, logger: dict, run_group=None):
    return SimpleNamespace(
        dir=tmp_path / "2026-01-01_dk_scaling" / "0", results={"config": {"logger": logger, "run_group": run_group}}
    )


def test_summary_joins_the_group_and_mode_of_the_runs(tmp_path):
    wandb_logger = {"wandb": {"project": "p", "mode": "offline"}, "csv": {}}
    # runs recorded without a group: the summary follows them into their sweep dir's group
    assert wandb_target([fake_run(tmp_path, wandb_logger)]) == {
        "project": "p",
        "mode": "offline",
        "group": "2026-01-01_dk_scaling",
        "sweeps": [],
    }
    assert wandb_target([fake_run(tmp_path, wandb_logger, run_group="mine")])["group"] == "mine"
    assert wandb_target([fake_run(tmp_path, {"csv": {}})]) is None
    assert wandb_target([fake_run(tmp_path, {"wandb": {"mode": "disabled"}})]) is None


def test_table_keeps_numbers_as_numbers_and_one_type_per_column():
    columns, rows = read_csv("model.d_k,model.init_std,status,val/loss\n16,0.02,ok,1.886\n32,fan_in,FAILED,\n")
    assert columns == ["model.d_k", "model.init_std", "status", "val/loss"]
    assert rows == [[16.0, "0.02", "ok", 1.886], [32.0, "fan_in", "FAILED", None]]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two smoke training runs with W&B offline, laid out as a two-job sweep whose init_std column
    mixes a number and a name (W&B wants one type per column), then `make report` on it."""
    from attnlab.config.compose import compose_config
    from attnlab.studies.report import build_report
    from attnlab.training.train import train

    root = tmp_path_factory.mktemp("wandb")
    sweep_dir = root / "2026-01-01_smoke"
    for job, init in enumerate(("0.02", "fan_in")):
        cfg = compose_config(
            [
                "debug=smoke",
                "logger=wandb",
                "study=smoke",
                "model.d_k=8",
                f"model.init_std={init}",
                "callbacks=none",
                "+callbacks.attention_stats._target_=attnlab.callbacks.AttentionStats",
                "+callbacks.attention_stats.every_n_steps=3",
                "+callbacks.peak_memory._target_=attnlab.callbacks.PeakMemoryMonitor",
                "+callbacks.peak_memory.every_n_steps=3",
            ],
            sweep_dir / str(job),
        )
        train(cfg)
        results = sweep_dir / str(job) / "results.json"  # the job's override, as a Hydra multirun records it
        results.write_text(json.dumps({**json.loads(results.read_text()), "overrides": [f"model.init_std={init}"]}))
    build_report(sweep_dir, root / "reports")
    return sweep_dir, root / "reports" / "smoke"


@pytest.mark.slow
def test_training_run_logs_per_layer_attention_and_memory(sweep):
    sweep_dir, _ = sweep
    (run_dir,) = (sweep_dir / "0" / "wandb").glob("offline-run-*")
    keys = history(run_dir)
    for layer in range(4):
        for stat in ("entropy", "max_prob"):
            values = keys[f"attn/L{layer}/{stat}"]
            assert values and all(isinstance(v, float) and v > 0 for v in values), (layer, stat, values)
    assert keys["mem/peak_bytes"] and all(v > 0 for v in keys["mem/peak_bytes"])


@pytest.mark.slow
def test_make_table_logs_the_table_and_plots_to_one_run(sweep):
    sweep_dir, out = sweep
    (run_dir,) = (sweep_dir / "wandb").glob("offline-run-*")
    keys = history(run_dir)
    (table,) = keys["ablation"]
    assert table["_type"] == "table-file"
    logged = json.loads((run_dir / "files" / table["path"]).read_text())
    with open(out / "ablation.csv") as f:
        header = f.readline().strip().split(",")
    assert logged["columns"] == header and "model.init_std" in header and len(logged["data"]) == 2
    plots = {k.removeprefix("plots/") for k in keys if k.startswith("plots/")}
    assert plots == {p.stem for p in out.glob("*.png")} and plots
    assert all(keys[f"plots/{p}"][0]["_type"] == "image-file" for p in plots)


class FakeRun:
    """What a W&B run is sent: the logged dicts and the summary."""

    def __init__(self, root: Path, **kwargs):
        self.kwargs, self.logged, self.summary = kwargs, [], {}
        self.dir = str(root / "wandb" / "offline-run-x" / "files")

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        pass


def test_the_repro_run_holds_every_verdict_its_failing_checks_and_the_tally(tmp_path, monkeypatch):
    import wandb

    from attnlab.repro.wandb_run import log_repro_summary
    from attnlab.writing.pages import VERDICTS

    runs = []
    monkeypatch.setattr(wandb, "init", lambda **kw: runs.append(FakeRun(tmp_path, **kw)) or runs[-1])
    monkeypatch.setattr(wandb, "Table", lambda columns, data: {"columns": columns, "data": data})

    def check(name, passed):
        return {"name": name, "passed": passed}

    claims = [
        {"id": 1, "claim": "a", "verdict": "agrees", "checks": [check("x", True)]},
        {"id": 2, "claim": "b", "verdict": "differs", "checks": [check("y", False), check("z", True)]},
        {"id": 3, "claim": "c", "verdict": "untested", "checks": [check("u", None), check("v", False)]},
        {"id": 4, "claim": "d", "verdict": "agrees", "checks": []},
    ]
    assert log_repro_summary(claims, tmp_path, mode="offline") == tmp_path / "wandb" / "offline-run-x"
    (run,) = runs
    assert run.kwargs["group"] == "repro" and run.kwargs["mode"] == "offline" and run.kwargs["dir"] == str(tmp_path)
    (logged,) = run.logged
    assert logged["verdicts"]["columns"] == ["id", "claim", "verdict", "not holding"]
    assert logged["verdicts"]["data"] == [
        [1, "a", "agrees", ""],
        [2, "b", "differs", "y"],
        [3, "c", "untested", "u; v"],
        [4, "d", "agrees", ""],
    ]
    assert run.summary == {f"verdicts/{v}": {"agrees": 2, "differs": 1, "untested": 1}.get(v, 0) for v in VERDICTS}


def test_a_failed_repro_run_leaves_none_and_says_so(tmp_path, monkeypatch, capsys):
    import wandb

    from attnlab.repro.wandb_run import log_repro_summary

    def refuse(**kwargs):
        raise RuntimeError("no W&B here")

    monkeypatch.setattr(wandb, "init", refuse)
    assert log_repro_summary([], tmp_path) is None and "no W&B here" in capsys.readouterr().out
