"""Training end to end through train(cfg): composition, determinism, results.json, loggers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.attention import BACKENDS
from attnlab.config.compose import CONF_DIR, compose_config
from attnlab.training.results import training_fingerprint
from attnlab.training.train import train

GROUPS = ["attention", "model", "data", "trainer", "logger", "callbacks"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group, tmp_path):
    extra = {"data": {"textfile": ["data.path=x.txt"]}}
    for option in options(group):
        cfg = compose_config([f"{group}={option}", *extra.get(group, {}).get(option, [])], tmp_path)
        assert cfg.model.attention.backend in BACKENDS


def test_attention_presets_set_defaults_only(tmp_path):
    cfg = compose_config(["attention=naive"], tmp_path)
    assert (cfg.model.attention.backend, cfg.model.attention.scaling) == ("naive", "none")
    cfg = compose_config(["attention=sdpa", "model.attention.scaling=none"], tmp_path)
    assert (cfg.model.attention.backend, cfg.model.attention.scaling) == ("sdpa", "none")


def test_tiny_preset_is_nanogpt_cpu_preset(tmp_path):
    cfg = compose_config([], tmp_path)
    m = cfg.model
    assert (m.n_layer, m.n_head, m.d_model, m.block_size, m.dropout) == (4, 4, 128, 64, 0.0)
    assert (cfg.data.batch_size, cfg.trainer.max_steps, cfg.trainer.gradient_clip_val) == (12, 2000, 1.0)
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.optim.betas[1]) == (1e-3, 1e-4, 100, 0.99)
    small = compose_config(["model=small"], tmp_path)
    assert small.model.d_model > m.d_model and small.trainer.max_steps == 5000


@pytest.mark.parametrize("model", ["tiny", "llama_tiny"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_smoke_training_every_backend_writes_results(backend, model, make_cfg):
    cfg = make_cfg(f"attention={backend}", f"model={model}", "callbacks=none")
    metrics = train(cfg)
    results = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert results["status"] == "ok" and results["error"] is None
    assert results["attention"]["backend"] == backend
    expected_kernel = {"naive": "eager", "scaled": "eager", "flash": "sdpa:flash"}.get(backend)
    if expected_kernel:
        assert results["attention"]["kernel"] == expected_kernel
    else:
        assert results["attention"]["kernel"].startswith("sdpa:")
    for key in ("train/loss", "val/loss", "val/ppl", "val/acc", "perf/tokens_per_s"):
        assert key in results["metrics"] and results["metrics"][key] == pytest.approx(metrics[key])
    assert results["config"]["model"]["attention"]["backend"] == backend
    assert set(results) >= {"status", "error", "overrides", "config", "attention", "metrics", "wall_s", "provenance"}
    made = results["provenance"]
    assert made["config"] == training_fingerprint(results["config"]) and made["threads"] == torch.get_num_threads()
    assert made["torch"] == torch.__version__ and made["device"].split(":")[0] == "cpu"
    assert made["version"] == attnlab.__version__ and made["dirty"] in (True, False)
    assert len(made["commit"]) == 40  # the checkout the tests run in


def test_llama_preset_trains_with_the_default_callbacks(make_cfg):
    """RMSNorm, SwiGLU, grouped-query RoPE attention and an untied head: the statistics and maps
    measure it as they measure the GPT-2 block."""
    cfg = make_cfg("model=llama_tiny")
    metrics = train(cfg)
    model = cfg.model
    assert (model.norm, model.mlp, model.pos_encoding, model.n_kv_head, model.tie_embeddings) == (
        "rmsnorm",
        "swiglu",
        "rope",
        2,
        False,
    )
    stats = {k: v for k, v in metrics.items() if k.startswith("attn/")}
    assert stats and all(math.isfinite(v) for v in stats.values())
    assert math.isfinite(metrics["val/loss"])


def test_same_seed_same_loss(make_cfg):
    a = train(make_cfg("callbacks=none", "seed=7"))
    b = train(make_cfg("callbacks=none", "seed=7"))
    c = train(make_cfg("callbacks=none", "seed=8"))
    assert a["train/loss"] == b["train/loss"] and a["val/loss"] == b["val/loss"]
    assert a["val/loss"] != c["val/loss"]


def test_final_validation_always_runs(make_cfg):
    m = train(make_cfg("callbacks=none", "trainer.max_steps=7", "trainer.val_check_interval=5"))
    assert m["step"] == 7 and "val/loss" in m


def test_training_lowers_the_loss(make_cfg):
    m = train(make_cfg("callbacks=none", "trainer.max_steps=60", "optim.warmup_steps=5"))
    # uniform guess over ~70 characters is ln(70) = 4.25 nats; 60 steps learn character frequencies
    assert m["val/loss"] < 3.3


@pytest.mark.parametrize("logger", ["csv", "tensorboard", "wandb", "none"])
def test_each_logger_runs(logger, make_cfg):
    cfg = make_cfg("callbacks=none", f"logger={logger}", "trainer.max_steps=2", fast=False)
    cfg.trainer.enable_progress_bar = False
    train(cfg)
    out = Path(cfg.paths.output_dir)
    expected = {"csv": "csv", "tensorboard": "tensorboard", "wandb": "wandb"}.get(logger)
    if expected:
        assert (out / expected).is_dir()
    if logger == "wandb":
        assert list((out / "wandb").glob("offline-run-*")), "W&B must default to offline mode"


def test_wandb_disabled_truly_disables(make_cfg):
    cfg = make_cfg("callbacks=none", "logger=wandb", "logger.wandb.mode=disabled", "trainer.max_steps=2", fast=False)
    train(cfg)
    assert not (Path(cfg.paths.output_dir) / "wandb").exists()


def test_vocab_saved_with_run(make_cfg):
    cfg = make_cfg("callbacks=none")
    train(cfg)
    vocab = json.loads((Path(cfg.paths.output_dir) / "vocab.json").read_text())["chars"]
    assert "a" in vocab and len(vocab) == len(set(vocab))


def test_gradient_clipping_reads_the_one_norm_of_the_step_and_matches_torch():
    """GPTModule computes the step's gradient norm once (the non-finite guard reads it too) and clips
    with it: the gradients equal torch.nn.utils.clip_grad_norm_'s; a new backward makes a new norm."""
    import torch

    from attnlab.training.lit_module import GPTModule

    optim = dict(lr=1e-3, min_lr=1e-4, warmup_steps=0, weight_decay=0.1, betas=[0.9, 0.95])
    model = dict(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=16)
    modules = []
    for _ in range(2):
        torch.manual_seed(0)
        modules.append(GPTModule(model, optim, max_steps=10))
    x = torch.randint(11, (4, 8))
    for module in modules:
        (module.model(x, x)[1] * 50).backward()  # a large loss: the norm exceeds the clip value
        module.on_after_backward()
    ours, reference = modules
    norm = ours.gradient_norm()
    assert norm > 1.0 and ours.gradient_norm() is norm  # computed once
    ours.configure_gradient_clipping(None, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    assert torch.equal(norm, expected)
    for a, b in zip(ours.parameters(), reference.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert float(torch.nn.utils.get_total_norm([p.grad for p in ours.parameters()])) == pytest.approx(1.0, rel=1e-5)
    ours.model(x, x)[1].backward()
    ours.on_after_backward()
    assert ours.gradient_norm() is not norm  # the next step's gradients, the next norm


def test_the_corpus_encodes_by_table_lookup_as_the_character_list_does():
    """CharTokenizer.encode_tensor (the data module's) gives encode's ids, a BOS entry left out of
    the table, and the same KeyError for a character outside the vocabulary, below or above it."""
    import torch

    from attnlab.data.text import BOS, CharTokenizer

    text = "To be, or not to be: that is the question.\nÆ—é"
    tok = CharTokenizer([*CharTokenizer.from_text(text).chars, BOS])
    assert torch.equal(tok.encode_tensor(text), torch.tensor(tok.encode(text)))
    assert tok.encode_tensor("").shape == (0,)
    for unknown in ("\x01", "z", "\U0001f600"):
        with pytest.raises(KeyError) as err:
            tok.encode_tensor("To " + unknown)
        assert err.value.args == (unknown,)


class FakeRun:
    """What Lightning's W&B logger calls on a wandb run: ``log`` and ``config.update``, recorded in order."""

    def __init__(self):
        self.calls = []
        self.config = self

    def log(self, row):
        self.calls.append(("log", row))

    def update(self, params, allow_val_change=False):
        self.calls.append(("config", dict(params)))


def background_logger(monkeypatch, tmp_path, start):
    """attnlab's W&B logger whose wandb.init is ``start()`` (run in the logger's start thread)."""
    from lightning.pytorch import loggers as lightning_loggers

    from attnlab.training.console import WandbLogger

    def experiment(self):
        if self._experiment is None:
            self._experiment = start()
        return self._experiment

    monkeypatch.setattr(lightning_loggers.WandbLogger, "experiment", property(experiment))
    return WandbLogger(project="p", mode="offline", save_dir=str(tmp_path))


def test_wandb_starts_in_a_thread_and_what_is_logged_meanwhile_reaches_it_in_order(monkeypatch, tmp_path):
    """The run does not wait for wandb.init: calls made while it runs are kept, then replayed in the
    order they were made, before the call that found the W&B run up."""
    import threading

    up, run, threads = threading.Event(), FakeRun(), []

    def start():
        threads.append(threading.current_thread().name)
        up.wait(10)
        return run

    lg = background_logger(monkeypatch, tmp_path, start)
    lg.start()
    lg.log_hyperparams({"lr": 0.001})
    lg.log_metrics({"train/loss": 3.0}, step=10)
    handle = lg.experiment  # what Lightning touches before fit: it must not wait either
    lg.log_metrics({"train/loss": 2.5}, step=20)
    assert lg.starting and run.calls == []  # nothing waited: the calls are kept
    up.set()
    lg._starting.join(10)
    lg.log_metrics({"train/loss": 2.0}, step=30)
    handle.log({"direct": 1.0})  # the handle is the run once it is up
    assert threads == ["attnlab-wandb-init"]
    assert run.calls == [
        ("config", {"lr": 0.001}),
        ("log", {"train/loss": 3.0, "trainer/global_step": 10}),
        ("log", {"train/loss": 2.5, "trainer/global_step": 20}),
        ("log", {"train/loss": 2.0, "trainer/global_step": 30}),
        ("log", {"direct": 1.0}),
    ]


def test_a_handle_taken_while_wandb_starts_waits_for_the_run_at_its_first_use(monkeypatch, tmp_path):
    import threading

    up, run = threading.Event(), FakeRun()

    def start():
        up.wait(10)
        return run

    lg = background_logger(monkeypatch, tmp_path, start)
    lg.start()
    lg.log_metrics({"train/loss": 3.0}, step=10)
    handle = lg.experiment
    threading.Timer(0.2, up.set).start()
    assert handle.config is run  # waited for the start, and what was kept was logged first
    assert run.calls == [("log", {"train/loss": 3.0, "trainer/global_step": 10})]


def test_a_failed_wandb_start_is_raised_in_the_run_once_and_not_retried(monkeypatch, tmp_path):
    import threading

    go, starts = threading.Event(), []

    def start():
        starts.append(threading.current_thread().name)
        go.wait(10)
        raise RuntimeError("service did not start")

    lg = background_logger(monkeypatch, tmp_path, start)
    lg.start()
    lg.log_metrics({"train/loss": 3.0}, step=10)  # kept while the start runs
    go.set()
    lg._starting.join(10)
    with pytest.raises(RuntimeError, match="service did not start"):
        lg.log_metrics({"train/loss": 2.0}, step=20)
    lg.log_metrics({"train/loss": 1.0}, step=30)  # dropped: no second wandb.init, in the run's thread
    lg.settle()
    assert starts == ["attnlab-wandb-init"]


def test_a_run_profiles_nothing_through_one_shared_no_op(make_cfg, monkeypatch):
    """Without a recorder or trainer.profiler, the trainer's profiler is train.NoProfiler: every
    action Lightning brackets gets the same no-op context, and it reports nothing."""
    import pickle

    import lightning as L

    import attnlab.training.train as train_module

    seen = []

    class Look(L.Callback):
        def on_train_start(self, trainer, pl_module):
            seen.append(trainer.profiler)

    original = train_module.build_callbacks
    monkeypatch.setattr(train_module, "build_callbacks", lambda cfg: [Look(), *original(cfg)])
    train_module.train(make_cfg())
    profiler = seen[0]
    assert type(profiler) is train_module.NoProfiler
    assert profiler.profile("[Callback]X.on_train_batch_end") is profiler.profile("save_checkpoint")
    with profiler.profile("an action"):
        pass
    assert profiler.summary() == ""
    assert type(pickle.loads(pickle.dumps(profiler))) is train_module.NoProfiler  # a spawned process gets it too
