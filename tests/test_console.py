"""Console output: attnlab's progress line, readable on a terminal and in a log file; Lightning
quieted in one place, its levels restored."""

from __future__ import annotations

import io
import logging
import os
import warnings
from types import SimpleNamespace

import pytest

from attnlab.training.console import LIGHTNING_LOGGERS, RUN_LOG, RUN_LOG_ENV, ProgressLine, quiet_lightning, run_output


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drive(bar: ProgressLine, steps: int, val_at: int | None = None) -> None:
    """Run the bar through ``steps`` training steps of 64 tokens with a fake trainer."""
    trainer = SimpleNamespace(global_step=0, max_steps=steps, callback_metrics={}, is_global_zero=True)
    bar._trainer = trainer
    bar.on_train_start(trainer, None)
    batch = (SimpleNamespace(numel=lambda: 64), None)
    for step in range(1, steps + 1):
        trainer.global_step = step
        trainer.callback_metrics["train/loss"] = 4.0 - step / 100
        if val_at and step >= val_at:
            trainer.callback_metrics["val/loss"] = 3.5
        bar.on_train_batch_end(trainer, None, None, batch, step - 1)
    bar.on_train_end(trainer, None)


def test_piped_output_is_one_plain_line_every_n_steps():
    out = io.StringIO()
    drive(ProgressLine(every=10, stream=out), steps=35, val_at=20)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["10/35", "20/35", "30/35", "35/35"]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert "loss 3.900 | val - |" in lines[0] and "loss 3.650 | val 3.500 |" in lines[-1]
    assert all(" tok/s | " in line and "elapsed" in line for line in lines)


def test_default_cadence_is_a_twentieth_of_the_run():
    out = io.StringIO()
    drive(ProgressLine(stream=out), steps=200)
    assert len(out.getvalue().splitlines()) == 20


def test_terminal_output_redraws_one_line_with_a_bar():
    out = Terminal()
    drive(ProgressLine(stream=out, min_interval_s=0.0), steps=5)
    text = out.getvalue()
    assert text.count("\r") == 5 and text.endswith("\n") and text.count("\n") == 1
    assert "step 5/5 [####################]" in text


def test_quiet_lightning_restores_levels_and_warning_filters():
    logger = logging.getLogger(LIGHTNING_LOGGERS[1])
    logger.setLevel(logging.DEBUG)
    filters = list(warnings.filters)
    with quiet_lightning():
        assert logger.level == logging.WARNING
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn("isinstance(treespec, LeafSpec) is deprecated", UserWarning, stacklevel=1)
            warnings.warn("a warning worth reading", UserWarning, stacklevel=1)
        assert [str(w.message) for w in seen] == ["a warning worth reading"]
    assert logger.level == logging.DEBUG and warnings.filters == filters
    with pytest.raises(RuntimeError), quiet_lightning(silence_output=True):
        assert logger.level == logging.ERROR
        raise RuntimeError("levels come back on errors too")
    assert logger.level == logging.DEBUG
    logger.setLevel(logging.NOTSET)


@pytest.mark.parametrize("flag", ["1", None])
def test_a_sweep_job_prints_into_its_run_dir_and_the_descriptors_come_back(tmp_path, monkeypatch, capfd, flag):
    """Written at the descriptors, as torch's C++ side writes: inside the block into console.log with the flag,
    to the console without it; after the block, to the console again."""
    if flag:
        monkeypatch.setenv(RUN_LOG_ENV, flag)
    else:
        monkeypatch.delenv(RUN_LOG_ENV, raising=False)
    os.write(1, b"before\n")
    with run_output(tmp_path):
        os.write(1, b"fd 1\n")
        os.write(2, b"fd 2\n")
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    if flag:
        assert (tmp_path / RUN_LOG).read_text().splitlines() == ["fd 1", "fd 2"]
        assert out.splitlines() == ["before", "after"] and err == ""
    else:
        assert not (tmp_path / RUN_LOG).exists()
        assert out.splitlines() == ["before", "fd 1", "after"] and err.splitlines() == ["fd 2"]
