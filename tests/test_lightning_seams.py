"""Where attnlab leans on Lightning's behaviour: a public rule that must keep matching Lightning's
own, and the one private route left (an interrupted step's logs), which must still exist."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from attnlab.training.lit_module import loggers_write_this_step


class Recorder(L.LightningModule):
    """A one-parameter model that records, at every training step, attnlab's rule and Lightning's."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, bool, bool]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(
            (self.global_step, loggers_write_this_step(self.trainer), self.trainer._logger_connector.should_update_logs)
        )
        return (self.w - batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(24, 1)), batch_size=1)


@pytest.mark.parametrize("every", [1, 3, 5])
def test_the_public_logging_rule_is_lightnings(every, tmp_path):
    model = Recorder()
    trainer = L.Trainer(
        max_steps=12,
        log_every_n_steps=every,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    assert len(model.seen) == 12
    assert [ours for _, ours, _ in model.seen] == [theirs for _, _, theirs in model.seen]
    assert sum(ours for _, ours, _ in model.seen) == 12 // every  # not vacuous: some steps log, some do not


def test_the_private_route_for_an_interrupted_steps_logs_still_exists():
    """callbacks.interrupt.write_step_logs hands a step's values to the loggers before a stop; Lightning
    offers no public call for it. When these names go, that function must change."""
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

    assert callable(getattr(_LoggerConnector, "on_batch_end", None))
    assert callable(getattr(_LoggerConnector, "update_train_step_metrics", None))
