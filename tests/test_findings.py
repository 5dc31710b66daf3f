"""README.md's findings block is a render of the committed reports, and each verdict follows its data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnlab.attention.stats import SINK_EPSILON
from attnlab.studies import findings
from attnlab.writing import pages

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def reports(tmp_path) -> Path:
    """A copy of the committed files the block reads, to edit."""
    for rel in findings.INPUTS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "reports" / rel, tmp_path / rel)
    return tmp_path


def edit(reports: Path, rel: str, change) -> None:
    data = json.loads((reports / rel).read_text())
    change(data)
    (reports / rel).write_text(json.dumps(data))


def test_readme_block_is_the_render_of_the_committed_reports():
    assert findings.main(["--check"]) == 0, "README.md's findings are stale: python -m attnlab.studies.findings --write"


def test_check_fails_on_a_stale_block_and_write_repairs_it(tmp_path):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    start, end = "<!-- findings:start -->", "<!-- findings:end -->"
    head, rest = text.split(start)
    readme.write_text(head + start + "\n- a typed finding\n" + end + rest.split(end)[1])
    assert findings.main(["--check", "--readme", str(readme)]) == 1
    assert findings.main(["--write", "--readme", str(readme)]) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()


def test_missing_markers_are_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no block here\n")
    with pytest.raises(SystemExit, match="markers"):
        findings.main(["--check", "--readme", str(readme)])


def test_a_missing_report_or_key_is_one_line_and_exit_2(reports, capsys):
    (reports / "repro" / "repro.json").unlink()
    assert findings.main(["--check", "--reports", str(reports)]) == 2
    assert "repro.json is missing" in capsys.readouterr().err
    edit(reports, "dk_scaling/summary.json", lambda data: data.pop("cells_ci95"))
    assert findings.main(["--check", "--reports", str(reports)]) == 2
    assert "cells_ci95" in capsys.readouterr().err


def dk_row(reports: Path, init: str, d_k: int) -> dict:
    groups = dict(findings.dk_scaling(reports)["by_init"])[init]
    return next(r for _, rows in groups for r in rows if r["d_k"] == d_k)


def test_dk_verdict_flips_when_the_unscaled_cell_matches_the_scaled_one(reports):
    """The block reads the report's own tests: at six seeds a side (what the exact test needs after Holm over
    the 8 cells) a cell whose unscaled runs end far lower reads "raises"; give them the scaled runs' losses,
    re-render the report from its runs, and the finding for that cell reads no difference."""
    import numpy as np
    import pandas as pd

    from attnlab.studies.report import write_report

    runs = pd.read_csv(ROOT / "reports" / "dk_scaling" / "runs.csv")
    cell = (runs["model.init_std"] == "fan_in") & (runs["model.d_k"] == 128)
    more = runs[cell].copy()
    more["seed"] += 3  # three more seeds of the cell, a little apart from the first three
    more["val/loss"] += np.tile([0.001, -0.002, 0.0015], len(more) // 3)
    runs = pd.concat([runs, more], ignore_index=True)
    write = lambda: (
        runs.to_csv(reports / "dk_scaling" / "runs.csv", index=False),
        write_report(reports / "dk_scaling", draw=False),
    )  # noqa: E731
    write()
    assert dk_row(reports, "fan_in", 128)["verdict"] == "raises"
    cell = (runs["model.init_std"] == "fan_in") & (runs["model.d_k"] == 128)
    scaled = runs[cell & (runs["model.attention.scaling"] == "inv_sqrt_d")].set_index("seed")["val/loss"]
    unscaled = cell & (runs["model.attention.scaling"] == "none")
    runs.loc[unscaled, "val/loss"] = runs.loc[unscaled, "seed"].map(scaled)
    write()
    row = dk_row(reports, "fan_in", 128)
    assert row["verdict"] == "none" and row["diff"] == pytest.approx(0, abs=1e-12) and 0 < row["detectable"] < 0.05


def test_eviction_with_one_far_seed_is_a_cost_and_consistent_seeds_collapse(reports):
    def one_far_seed(data):  # every seed a little above 1, one far out
        data["arms"][0]["drop_cost"]["per_seed"] = [0.01, 0.02, 0.015, 0.012, 0.018, 0.011, 0.014, 0.016, 0.013, 0.5]

    edit(reports, "streaming_bb/stream.json", one_far_seed)
    softmax = findings.streaming(reports, "streaming_bb")["sink"][0]
    # the median and the sign test read a cost, short of a collapse, and say one seed carries the mean
    assert softmax["verdict"] == "cost" and softmax["one_seed_carries"]
    assert 1 < softmax["lo"] <= softmax["median"] <= softmax["hi"] < 2

    def every_seed_collapses(data):
        data["arms"][0]["drop_cost"]["per_seed"] = [0.90, 0.95, 0.92]  # PPL ratios 2.46, 2.59, 2.51

    edit(reports, "streaming_bb/stream.json", every_seed_collapses)
    softmax = findings.streaming(reports, "streaming_bb")["sink"][0]
    assert softmax["verdict"] == "collapse" and not softmax["one_seed_carries"]
    assert softmax["lo"] >= 2


def test_escape_arm_counts_as_a_sink_once_its_weight_crosses_the_threshold(reports):
    arms = {a["arm"]: a for a in findings.sinks(reports)["rope"]}
    assert arms["escape"]["k"] == 0 and arms["softmax"]["k"] == arms["softmax"]["n"]

    def park_on_first_token(data):
        cell = next(c for c in data["per_seed"] if c["axes"]["variant"] == "escape")
        cell["runs"][0]["metrics"]["attn/L0/sink_mass_dormant"] = SINK_EPSILON + 1e-3  # just past the strict rule

    edit(reports, "streaming_bb/summary.json", park_on_first_token)
    assert {a["arm"]: a for a in findings.sinks(reports)["rope"]}["escape"]["k"] == 1


def test_qk_norm_finding_follows_the_reports_tested_verdicts(reports):
    def verdicts():
        return {r["setting"]: v for v, rows in findings.lr_sensitivity(reports)["groups"] for r in rows}

    assert verdicts()["proxy_l"] == "lowers"

    def inside_noise(data):
        c = next(c for c in data["contrasts"]["lr_sensitivity"] if c["where"].startswith("model=proxy_l"))
        c["verdict"] = "none"

    edit(reports, "lr_sensitivity/summary.json", inside_noise)
    assert verdicts()["proxy_l"] == "none"


def test_an_lr_setting_whose_reference_is_at_the_attention_free_level_reads_untested(reports):
    """The report's budget rule reaches the finding per model size: a size whose reference arm does not
    beat the attention-free level reads untested, with the report's reason, and the others keep their verdict."""

    def groups():
        return {r["setting"]: (v, r.get("why")) for v, rows in findings.lr_sensitivity(reports)["groups"] for r in rows}

    before = groups()

    def above_the_level(data):
        c = next(c for c in data["contrasts"]["lr_sensitivity"] if c["where"].startswith("model=proxy_l"))
        c["verdict"], c["untested_because"] = "untested", "the reference arm is not below the attention-free level"

    edit(reports, "lr_sensitivity/summary.json", above_the_level)
    after = groups()
    assert before["proxy_l"][0] == "lowers"
    assert after["proxy_l"] == ("untested", "the reference arm is not below the attention-free level")
    assert {k: v for k, v in after.items() if k != "proxy_l"} == {k: v for k, v in before.items() if k != "proxy_l"}


def test_induction_count_and_interval_follow_the_phase_change_steps(reports):
    formed = findings.induction_heads(reports)["formed"]
    assert [(c["k"], c["n"]) for c in formed] == [(8, 10)]

    def stall_all_but_one(data):
        cell = next(c for c in data["phase_change_steps"] if any(c["steps"]))
        cell["steps"] = [1000] + [None] * (len(cell["steps"]) - 1)

    edit(reports, "induction_heads/summary.json", stall_all_but_one)
    (cell,) = findings.induction_heads(reports)["formed"]
    assert (cell["k"], cell["median_step"]) == (1, 1000)
    assert (cell["lo"], cell["hi"]) == pytest.approx(findings.significance.wilson(1, 10))


def test_repro_tally_counts_verdicts_and_refuses_an_unknown_one(reports):
    assert sum(n for _, n in findings.repro(reports)["tally"]) == findings.repro(reports)["claims"]
    edit(reports, "repro/repro.json", lambda data: data["claims"][0].update(verdict="maybe"))
    with pytest.raises(ValueError, match="maybe"):
        findings.repro(reports)


def test_number_format_keeps_significant_digits_in_fixed_notation():
    assert [pages.sig(x) for x in (0.0023, 0.33, 599470.2, 0)] == ["0.0023", "0.33", "599470", "0"]
    assert pages.sig(-0.048, 2, True) == "−0.048" and pages.sig(0.5, 2, True) == "+0.50"
    assert pages.p_text(0.0004, fixed=True) == "< 0.001" and pages.p_text(0.5, fixed=True) == "0.50"
