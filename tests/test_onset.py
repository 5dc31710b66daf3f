"""An onset study's runs stop at the evaluation where they have learned, and record that step; a run
that never learns is censored at its last step."""

from __future__ import annotations

import json

import pytest

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
    results = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert results["onset/censored"] == 0.0
    assert results["onset/step"] == metrics["step"] < 1500
    assert results["onset/step"] % 250 == 0 and results["val/acc"] >= 0.9
    assert results["machine/cpus"] >= 1 and results["machine/load"] >= 0
