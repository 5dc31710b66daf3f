"""attnlab sink-search: the rows' first-token weights, the step each run reached 0.3, the verdict's count."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnlab import cli
from attnlab.studies import sink_search


def config(n_layer: int, seed: int, bos: bool) -> dict:
    """The sections a training run records in results.json that the search reads (the sinks study's shape)."""
    return {
        "study": "text_sinks",
        "seed": seed,
        "data": {
            "_target_": "attnlab.data.TextDataModule",
            "source": "shakespeare",
            "path": None,
            "batch_size": 12,
            "val_fraction": 0.1,
            "val_batches": 20,
            "num_workers": 0,
            "bos": bos,
        },
        "trainer": {"_target_": "lightning.Trainer", "max_steps": 5000, "precision": "32"},
        "model": {"n_layer": n_layer, "n_head": 4, "d_model": 128, "block_size": 128, "attention": {}},
    }


def run_dir(tmp_path, name: str, n_layer: int, weights: list[float], history: list[float]) -> str:
    """A finished run: results.json with per-layer sink scores, heads.json with the best head's course."""
    d = tmp_path / name
    d.mkdir()
    metrics = {"val/loss": 1.5 + n_layer / 100, "heads/sink_max": max(weights), "attn/L0/sink_mass": 0.05}
    metrics |= {f"heads/L{i}/sink_max": w for i, w in enumerate(weights)}
    results = {
        "status": "ok",
        "error": None,
        "overrides": ["experiment=text_sinks"],
        "config": config(n_layer, 0, True),
    }
    (d / "results.json").write_text(json.dumps(results | {"metrics": metrics}))
    steps = [{"step": 500 * i, "sink_max": w} for i, w in enumerate(history)]
    (d / "heads.json").write_text(json.dumps({"heads": [], "summary": {}, "history": steps, "probe": {}}))
    return str(d)


@pytest.fixture
def runs(tmp_path):
    deep = run_dir(tmp_path, "deep", 8, [0.05, 0.2, 0.41, 0.3], [0.02, 0.12, 0.29, 0.33, 0.41])
    shallow = run_dir(tmp_path, "shallow", 4, [0.1, 0.22, 0.06, 0.01], [0.02, 0.22, 0.25])
    return deep, shallow


def test_rows_and_verdict_from_run_dirs(runs, tmp_path, capsys):
    out = tmp_path / "out"
    empty = tmp_path / "reports"
    empty.mkdir()
    assert cli.main(["sink-search", *runs, "--reports", str(empty), "--out", str(out)]) == 0
    table = pd.read_csv(out / "search.csv").set_index("source")
    deep, shallow = table.loc[runs[0]], table.loc[runs[1]]
    assert (deep["first_token_weight"], deep["first_token_layer"], deep["step_reached_0.3"]) == (0.41, 2, 1500)
    assert (shallow["first_token_weight"], shallow["first_token_layer"]) == (0.22, 1)
    assert pd.isna(shallow["step_reached_0.3"]) and pd.isna(deep["attention_free_level"])
    assert (deep["n_layer"], deep["block_size"], deep["max_steps"], bool(deep["bos"])) == (8, 128, 5000, True)
    assert (deep["corpus"], deep["tokenizer"]) == ("TextDataModule:shakespeare", "character")

    verdict = sink_search.verdict(sink_search.settings_table(sink_search.search_table([])))
    assert verdict["settings"] == 0
    settings = sink_search.settings_table(table.reset_index())
    assert sink_search.verdict(settings) | {"where": None} == {
        "reached": 1,
        "settings": 2,
        "unmeasured": 0,
        "largest": 0.41,
        "where": None,
    }
    assert "1 of 2 settings" in (out / "search.md").read_text()


def test_no_setting_reached(tmp_path):
    low = run_dir(tmp_path, "low", 4, [0.1, 0.25], [0.1, 0.25])
    frame = sink_search.search_table([sink_search.run_row(tmp_path / "low")])
    verdict = sink_search.verdict(sink_search.settings_table(frame))
    assert (verdict["reached"], verdict["settings"], verdict["largest"]) == (0, 1, 0.25)
    assert "n_layer=4" in verdict["where"] and frame.loc[0, "source"] == low


@pytest.mark.parametrize("bad", ["missing", "unfinished"])
def test_bad_run_dir_exits_2_before_writing(runs, tmp_path, capsys, bad):
    target = tmp_path / bad
    if bad == "unfinished":
        target.mkdir()
        (target / "results.json").write_text(json.dumps({"status": "interrupted", "config": config(4, 0, True)}))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sink-search", *runs, str(target), "--studies", "", "--out", str(out)])
    assert exit_.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("attnlab: error: ") and str(target) in err


def test_unknown_study_exits_2(runs, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sink-search", *runs, "--studies", "no_such_study", "--reports", str(tmp_path), "--out", str(out)])
    assert exit_.value.code == 2 and not out.exists()
    assert "no_such_study" in capsys.readouterr().err


def test_study_rows_composed_from_the_axes(runs, tmp_path):
    """gqa's runs.csv: each row's setting is experiment=gqa composed with its axes (the real compose)."""
    study = tmp_path / "reports" / "gqa"
    study.mkdir(parents=True)
    pd.DataFrame(
        {
            "model.n_kv_head": ["1", "4", "4"],
            "model.attention.scaling": ["inv_sqrt_d"] * 3,
            "seed": [0, 0, 1],
            "budget": ["default", "default", "trainer.max_steps=7"],
            "status": ["ok"] * 3,
            "error": [""] * 3,
            "run": ["0", "1", "2"],
            "val/loss": [2.1, 2.0, 2.2],
            "heads/sink_max": [0.35, None, 0.1],
            "heads/L0/sink_max": [0.05, None, 0.1],
            "heads/L3/sink_max": [0.35, None, 0.02],
        }
    ).to_csv(study / "runs.csv", index=False)
    (study / "summary.json").write_text(json.dumps({"attention_free_level": {"bigram": 2.54}}))
    out = tmp_path / "out"
    argv = ["sink-search", runs[1], "--studies", "gqa", "--reports", str(tmp_path / "reports"), "--out", str(out)]
    assert cli.main(argv) == 0
    table = pd.read_csv(out / "search.csv")
    rows = table[table["source"] == str(study / "runs.csv")].reset_index(drop=True)
    assert len(rows) == 3 and set(rows["study"]) == {"gqa"}
    assert rows["first_token_weight"].tolist()[0::2] == [0.35, 0.1] and pd.isna(rows.loc[1, "first_token_weight"])
    assert rows["first_token_layer"].tolist()[0::2] == [3, 0]
    assert rows["max_steps"].tolist()[2] == 7 and rows["max_steps"][0] != 7
    assert rows["attention_free_level"].tolist() == [2.54] * 3
    assert (rows["corpus"][0], rows["tokenizer"][0]) == ("TextDataModule:shakespeare", "character")
    assert "model.n_kv_head=1" in rows["overrides"][0]
