"""attnlab verify: a committed row trained again alone comes back bit for bit, an altered metric is found
and named, a row without provenance that repeats is stamped, and a row it cannot train here is said so."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from attnlab.studies.report.aggregate import load_sweeps
from attnlab.studies.report.data import frame_from_runs, read_runs, write_runs
from attnlab.studies.verify import compare, main, train_again
from attnlab.training.results import PROVENANCE

# a smoke cell small enough to train in a few seconds; the budget every row of the table records
TINY = ["model.d_k=16", "model.n_layer=1", "model.d_model=32", "model.n_head=2", "data.batch_size=2", "logger=csv"]
AXIS = "model.attention.scaling"


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """reports/smoke/runs.csv of two cells (scaling none and inv_sqrt_d, seed 0), trained as verify trains."""
    root = tmp_path_factory.mktemp("verify")
    sweep = root / "logs" / "sweep"
    for i, scaling in enumerate(("none", "inv_sqrt_d")):
        row = pd.Series({AXIS: scaling, "budget": ",".join(sorted(TINY)), "seed": 0})
        results = train_again("smoke", row, [AXIS], "1", sweep / str(i))
        assert results["status"] == "ok", results.get("error")
    frame = frame_from_runs(load_sweeps([sweep]), [AXIS])
    write_runs(frame, root / "reports" / "smoke" / "runs.csv")
    return root / "reports"


def verify_copy(committed: Path, tmp_path: Path, edit, *args) -> tuple[int, dict, pd.DataFrame]:
    reports = tmp_path / "reports"
    (reports / "smoke").mkdir(parents=True)
    frame = read_runs(committed / "smoke" / "runs.csv")
    edit(frame)
    write_runs(frame, reports / "smoke" / "runs.csv")
    code = main(["smoke", "--reports", str(reports), *args])
    record = json.loads((reports / "smoke" / "verify.json").read_text())
    return code, {c["cell"][AXIS]: c for c in record["cells"]}, read_runs(reports / "smoke" / "runs.csv")


@pytest.mark.slow
def test_a_row_comes_back_bit_for_bit_and_an_altered_one_is_found(committed, tmp_path):
    def alter(frame):
        frame.loc[frame[AXIS] == "inv_sqrt_d", "val/loss"] += 1e-9

    code, cells, _ = verify_copy(committed, tmp_path, alter, "--jobs", "2")  # two runs at once
    assert cells["none"]["verdict"] == "identical" and cells["none"]["compared"] > 5
    assert cells["inv_sqrt_d"]["verdict"] == "differs" and cells["inv_sqrt_d"]["metric"] == "val/loss"
    assert cells["inv_sqrt_d"]["difference"] == pytest.approx(1e-9, rel=1e-3)
    assert code == 1  # a difference found is a failed check


@pytest.mark.slow
def test_a_row_without_provenance_that_repeats_is_stamped(committed, tmp_path):
    def forget(frame):
        for column in PROVENANCE:
            frame[column] = ""
        frame.loc[frame[AXIS] == "inv_sqrt_d", "device"] = "cuda: NVIDIA H100"

    code, cells, frame = verify_copy(committed, tmp_path, forget, "--stamp")
    assert cells["none"]["verdict"] == "identical" and code == 0
    assert cells["inv_sqrt_d"]["verdict"] == "not checkable" and "cuda" in cells["inv_sqrt_d"]["detail"]
    stamped = frame[frame[AXIS] == "none"].iloc[0]
    original = read_runs(committed / "smoke" / "runs.csv").set_index(AXIS)
    assert stamped["config"] == original.loc["none", "config"] != ""  # today's fingerprint of that cell
    assert stamped["threads"] == "1" and frame[frame[AXIS] == "inv_sqrt_d"].iloc[0]["config"] == ""


def test_compare_reads_only_the_trained_model():
    row = pd.Series({"seed": 0, "config": "abc", "val/loss": 1.5, "attn/L0/entropy": 0.25, "perf/tokens_per_s": 9.0})
    same = {"val/loss": 1.5, "attn/L0/entropy": 0.25, "perf/tokens_per_s": 11.0}  # throughput is the machine's
    assert compare(row, same)[0] == "identical"
    assert compare(row, same | {"attn/L0/entropy": 0.25000000000000006})[:3][::2] == ("differs", "attn/L0/entropy")
    assert compare(row, {"other": 1.0})[0] == "not checkable"


def test_a_study_without_runs_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["nosuch", "--reports", str(tmp_path)])
    assert exit_.value.code == 2
    assert "STUDY='nosuch'" in capsys.readouterr().err
