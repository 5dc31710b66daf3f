"""What made a row: a cell pools rows of one training fingerprint, a row without one never pools with rows
that have one, and a new run with provenance replaces an old row of its cell and seed that has none."""

from __future__ import annotations

import pandas as pd
import pytest

from attnlab.studies.report.data import merge, provenance_of
from attnlab.studies.report.provenance import made_by, one_experiment

AXES = ["model.n_kv_head"]


def rows(*spec) -> pd.DataFrame:
    """(n_kv_head, seed, fingerprint, val/loss) rows as runs.csv holds them."""
    return pd.DataFrame(
        [
            {"model.n_kv_head": kv, "seed": seed, "budget": "default", "status": "ok", "error": "", "config": fp}
            | {"run": f"{kv}-{seed}", "val/loss": loss}
            for kv, seed, fp, loss in spec
        ]
    )


def test_a_cell_of_two_fingerprints_is_refused_naming_its_rows():
    frame = rows(("1", 0, "aaa", 2.0), ("1", 1, "bbb", 2.1), ("2", 0, "aaa", 2.2))
    with pytest.raises(SystemExit) as refused:
        one_experiment(frame, AXES, "reports/x/runs.csv")
    line = str(refused.value)
    assert "\n" not in line and "model.n_kv_head=1" in line and "aaa: seeds 0" in line and "bbb: seeds 1" in line


def test_rows_without_a_fingerprint_beside_rows_with_one_are_left_out():
    frame = rows(("1", 0, "", 9.0), ("1", 1, "aaa", 2.0), ("1", 2, "aaa", 2.1), ("2", 0, "", 2.2), ("2", 1, "", 2.3))
    kept, notes = one_experiment(frame, AXES, "runs.csv")
    assert list(kept["seed"]) == [1, 2, 0, 1]  # cell 2 has no fingerprint at all: nothing to tell apart
    assert notes == ["model.n_kv_head=1: seeds 0"]
    assert made_by(frame).startswith("2 of 5 rows carry a training fingerprint")


def test_a_new_run_with_provenance_replaces_an_old_row_without_it():
    committed = rows(("1", 0, "", 9.0), ("1", 1, "aaa", 2.0))
    new = rows(("1", 0, "aaa", 2.05), ("1", 1, "aaa", 7.0))
    merged, left_out = merge(committed, new)
    assert sorted(zip(merged["seed"], merged["val/loss"])) == [(0, 2.05), (1, 2.0)]  # seed 1's committed row stays
    assert list(left_out["val/loss"]) == [7.0]


def test_a_record_written_before_the_provenance_block_keeps_what_it_said():
    old = {"config": {"model": {"d_k": 16}, "seed": 0}, "git_sha": "abc123-dirty", "metrics": {"machine/threads": 1.0}}
    made = provenance_of(old)
    assert made["commit"] == "abc123" and made["dirty"] == "True" and made["threads"] == "1"
    assert len(made["config"]) == 12 and made["torch"] == "" and made["device"] == ""
