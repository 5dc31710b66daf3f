"""An onset study's runs stop at the evaluation where they have learned, and record that step; a run
that never learns is censored at its last step."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.callbacks.onset import StopWhenLearned
from attnlab.config.compose import compose_config
from attnlab.training.train import train


class FakeTrainer:
    def __init__(self):
        self.sanity_checking = False
        self.should_stop = False
        self.global_step = 0
        self.callback_metrics = {}


def evaluate(cb: StopWhenLearned, trainer: FakeTrainer, step: int, acc: float) -> None:
    trainer.global_step, trainer.callback_metrics = step, {"val/acc": acc}
    cb.on_validation_end(trainer, None)


def test_the_first_evaluation_at_the_threshold_is_the_onset_and_stops_the_run():
    cb, trainer = StopWhenLearned(0.9), FakeTrainer()
    for step, acc in [(250, 0.2), (500, 0.89), (750, 0.9), (1000, 0.2)]:
        evaluate(cb, trainer, step, acc)
        if trainer.should_stop:
            break
    assert trainer.should_stop and step == 750
    assert cb.summary() == {"onset/step": 750.0, "onset/censored": 0.0}


def test_a_run_that_never_learns_is_censored_at_its_last_evaluation():
    cb, trainer = StopWhenLearned(0.9), FakeTrainer()
    for step in (250, 500, 750):
        evaluate(cb, trainer, step, 0.21)
    assert not trainer.should_stop
    assert cb.summary() == {"onset/step": 750.0, "onset/censored": 1.0}


def test_the_onset_survives_a_resume():
    cb, trainer = StopWhenLearned(0.9), FakeTrainer()
    evaluate(cb, trainer, 500, 0.95)
    again = StopWhenLearned(0.9)
    again.load_state_dict(cb.state_dict())
    assert again.summary() == cb.summary()


@pytest.mark.parametrize("threshold", [0, 1.5])
def test_a_threshold_outside_a_fraction_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold"):
        StopWhenLearned(threshold)


def test_kv_frontier_stops_multi_head_at_its_onset_and_records_it(tmp_path):
    """Multi-head attention learns recall at vocabulary 32 within a few hundred steps: the run ends at
    that evaluation, before its cap, and results.json holds the step and the machine's load."""
    cfg = compose_config(
        [
            "experiment=kv_frontier",
            "variant=baseline",
            "trainer.max_steps=1500",
            "logger=none",
            "callbacks=none",  # the experiment's stop_when_learned stays
            "+callbacks.load._target_=attnlab.callbacks.machine_load.MachineLoad",
        ],
        tmp_path,
    )
    metrics = train(cfg)
    record = json.loads((tmp_path / "results.json").read_text())
    results = record["metrics"]
    assert results["onset/censored"] == 0.0
    assert results["onset/step"] == metrics["step"] < 1500
    assert results["onset/step"] % 250 == 0 and results["val/acc"] >= 0.9
    assert results["machine/cpus"] >= 1 and results["machine/load"] >= 0
    assert record["provenance"]["threads"] == torch.get_num_threads()


def onset_runs(arms: dict[str, list[tuple[int, bool]]]):
    """A kv_frontier runs.csv: per arm, (step, learned) per seed."""
    import pandas as pd

    rows = []
    for arm, runs in arms.items():
        for seed, (step, learned) in enumerate(runs):
            rows.append(
                {
                    "variant": arm,
                    "attention": "sdpa",
                    "model.attention.scaling": "inv_sqrt_d",
                    "model.block_size": 64,
                    "seed": seed,
                    "budget": "default",
                    "status": "ok",
                    "error": "",
                    "config": "",
                    "run": f"{arm}{seed}",
                    "val/loss": 0.01 if learned else 1.86,
                    "val/acc": 0.95 if learned else 0.21,
                    "mem/kv_cache_bytes_per_token": 2048.0 if arm == "baseline" else 512.0,
                    "mem/kv_cache_context": 64.0,
                    "onset/step": float(step),
                    "onset/censored": 0.0 if learned else 1.0,
                }
            )
    return pd.DataFrame(rows)


def test_an_onset_report_compares_arms_by_log_rank_and_k_of_n(tmp_path):
    """Multi-head learns in every seed by step 500; multi-query in none by 6,000; grouped-query as multi-head.
    The report reads multi-query as later (log-rank, Holm over both arms) and grouped-query as not resolved:
    its runs show no difference, against which no number of runs has power, so a tie is no answer; with k of n
    and the median onsets the curves give."""
    from attnlab.studies.report import write_report
    from attnlab.studies.report.data import write_runs
    from attnlab.util import significance

    early = [(250, True), (500, True), (250, True), (500, True), (250, True)]
    arms = {"baseline": early, "gqa_kv2": early[::-1], "mqa": [(6000, False)] * 5}
    out = tmp_path / "kv_frontier"
    out.mkdir()
    write_runs(onset_runs(arms), out / "runs.csv")
    data = write_report(out, {"study": "kv_frontier"}, draw=True)
    learning = data["learning"]
    by_level = {c["level"]: c for c in learning["comparisons"]}
    assert by_level["mqa"]["verdict"] == "later"
    assert by_level["gqa_kv2"]["verdict"] == "untested"
    assert by_level["gqa_kv2"]["untested_because"].startswith("not resolved: the log-rank's power")
    assert by_level["mqa"]["k"] == [5, 0] and by_level["mqa"]["n"] == [5, 5]
    p = [by_level[a]["p_logrank"] for a in ("gqa_kv2", "mqa")]
    assert [by_level[a]["p_holm"] for a in ("gqa_kv2", "mqa")] == pytest.approx(significance.holm(p))
    assert by_level["mqa"]["p_fisher"] == pytest.approx(2 / 252)
    medians = {a["axes"]["variant"]: a["median"] for a in learning["arms"]}
    assert medians == {"baseline": 250.0, "gqa_kv2": 250.0, "mqa": None}
    assert (out / "onset.png").is_file()
    assert data["contrasts"] == {}  # no means of a bimodal outcome


def test_an_unknown_outcome_is_refused_naming_the_accepted_ones():
    from attnlab.config.study import Question
    from attnlab.util.errors import ConfigError

    block = {"ask": "a", "axis": "variant", "reference": "baseline", "outcome": "average"}
    with pytest.raises(ConfigError, match="question.outcome.*continuous, learned, onset, ratio"):
        Question.from_block(block)


def test_an_arm_leaves_the_frontier_when_a_cheaper_one_learns_earlier_beyond_noise():
    from attnlab.studies.report import analysis, onset

    early, never = [(250, True)] * 5, [(6000, False)] * 5
    frame = onset_runs({"baseline": never, "gqa_kv2": early, "mqa": never})
    frame.loc[frame["variant"] == "gqa_kv2", "mem/kv_cache_bytes_per_token"] = 1024.0
    question = analysis.question_of("kv_frontier", ["variant"])
    arms = onset.arms_of(frame, ["variant"], question)
    nbytes = onset.cache_bytes(frame, "variant")
    assert nbytes == {"baseline": 2048.0, "gqa_kv2": 1024.0, "mqa": 512.0}
    # gqa_kv2 holds half multi-head's bytes and learns in every seed where it never does: multi-head is off;
    # multi-query is cheaper than both and dominated by neither cheaper arm
    assert onset.frontier(arms, "variant", nbytes) == ["gqa_kv2", "mqa"]
    # the same onsets at equal bytes dominate nothing beyond noise
    same = onset.arms_of(onset_runs({"baseline": early, "gqa_kv2": early[::-1], "mqa": early}), ["variant"], question)
    assert onset.frontier(same, "variant", {"baseline": 2048.0, "gqa_kv2": 1024.0, "mqa": 512.0}) == [
        "baseline",
        "gqa_kv2",
        "mqa",
    ]
