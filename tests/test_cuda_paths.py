"""The GPU code paths, exercised where a CPU can take them.

bf16-mixed on CPU stands in for a GPU's autocast, 16-mixed on CPU has a real GradScaler, a
stand-in module plays flash_attn, the profiler shows which SDPA kernel really ran, and DDP runs
over gloo on CPU.
"""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import run_cli
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab.attention import backends
from attnlab.attention.module import Attention
from attnlab.callbacks.guard import NonFiniteError
from attnlab.model.gpt import CausalSelfAttention, GPTConfig
from attnlab.training.train import train
from attnlab.util.errors import KernelUnavailable


def reference_attention(q, k, v, scale, causal=True):
    """Softmax attention in float64, (B, H, T, d); causal is bottom-right aligned when there are
    fewer queries than keys (the queries are the last ones), as flash_attn >= 2.1 aligns it."""
    q, k, v = q.double(), k.double(), v.double()
    t_q, t_k = q.shape[-2], k.shape[-2]
    logits = (q @ k.transpose(-2, -1)) * scale
    if causal:
        logits = logits.masked_fill(~torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q), -math.inf)
    return torch.softmax(logits, -1) @ v


# ----------------------------------------------------------------- precision of measurement forwards


def test_bf16_mixed_measurements_see_bf16_q_and_k(make_cfg, monkeypatch):
    """Every forward of a bf16-mixed run (training steps, statistics, maps, head analysis with its
    knockout, the guard) reaches attention with bf16 q, k, v, as the training step does."""
    seen: list[tuple[bool, torch.dtype, torch.dtype]] = []
    forward = Attention.forward

    def spy(self, q, k, v, key_padding_mask=None):
        seen.append((self.training and torch.is_grad_enabled(), q.dtype, k.dtype))
        return forward(self, q, k, v, key_padding_mask)

    monkeypatch.setattr(Attention, "forward", spy)
    cfg = make_cfg(
        "attention=sdpa",
        "trainer.precision=bf16-mixed",
        "callbacks=default",
        "callbacks.heads.knockout=always",
        "callbacks.heads.every_n_steps=3",
        "callbacks.attention_stats.every_n_steps=3",
        "callbacks.attention_maps.every_n_steps=3",
        "trainer.max_steps=3",
        "model.n_layer=2",
    )
    metrics = train(cfg)
    measured = [(q, k) for training, q, k in seen if not training]
    assert any(training for training, _, _ in seen) and len(measured) > 10
    assert {q for q, _ in measured} == {torch.bfloat16} and {k for _, k in measured} == {torch.bfloat16}
    assert all(math.isfinite(metrics[f"attn/L{i}/entropy"]) for i in range(2))
    # the statistics are still computed in fp32: uniform-free but finite and in range
    assert 0 < metrics["attn/L0/max_prob_max"] <= 1


def test_kernel_is_recorded_from_training_forwards_only(make_cfg, monkeypatch):
    """Probes run after fit (eval, no grad) must not decide results.json's attention.kernel."""

    def name(q, k, v, *args, **kwargs):
        return "sdpa:train" if torch.is_grad_enabled() else "sdpa:probe"

    monkeypatch.setattr(backends, "sdpa_kernel_name", name)
    cfg = make_cfg("attention=sdpa", "callbacks=default", "trainer.max_steps=2", "model.n_layer=2")
    train(cfg)
    results = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert results["attention"]["kernel"] == "sdpa:train"
    assert results["attention"]["kernel_changed"] is False


def test_kernel_choice_is_asked_with_the_autocast_dtype(monkeypatch):
    asked = []
    real = torch._fused_sdp_choice
    monkeypatch.setattr(
        torch, "_fused_sdp_choice", lambda q, k, v, *a, **kw: asked.append(q.dtype) or real(q, k, v, *a, **kw)
    )
    backends._KERNEL_CHOICE.clear()
    q = torch.randn(2, 3, 9, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = backends.sdpa_attention(q, q, q, 0.3)
    assert asked == [torch.bfloat16] and out.dtype == torch.bfloat16
    backends.sdpa_attention(q, q, q, 0.3)
    backends.sdpa_attention(q, q, q, 0.3)  # same signature: answered from the cache
    assert asked == [torch.bfloat16, torch.float32]


# ----------------------------------------------------------------------------------- flash_attn


class FlashAttnStandIn:
    """flash_attn's contract: (B, T, H, D) inputs of one dtype, fp16/bf16 only, softmax_scale, causal;
    k and v may have fewer heads, a divisor of q's (MQA/GQA), and more positions than q (causal
    then aligns bottom-right), as flash_attn_func takes them."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        assert q.dtype in (torch.float16, torch.bfloat16), "flash_attn only supports fp16 and bf16"
        assert q.dtype == k.dtype == v.dtype, "flash_attn needs q, k, v of one dtype"
        assert k.shape == v.shape and q.dim() == 4 and q.shape[0] == k.shape[0] and q.shape[3] == k.shape[3]
        assert q.shape[2] % k.shape[2] == 0, "flash_attn: the number of heads in q must be a multiple of k's"
        self.calls.append(
            {
                "shape": tuple(q.shape),
                "scale": softmax_scale,
                "causal": causal,
                "dtype": q.dtype,
                **({"kv_heads": k.shape[2]} if k.shape[2] != q.shape[2] else {}),
            }
        )
        groups = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        out = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale, causal)
        return out.transpose(1, 2).to(q.dtype)


@pytest.fixture
def flash_attn_on_cpu(monkeypatch):
    """A flash_attn package in sys.modules, used on CPU as it would be on CUDA."""
    fn = FlashAttnStandIn()
    module = types.ModuleType("flash_attn")
    module.flash_attn_func = fn
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.setattr(backends, "FLASH_ATTN_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(backends, "_FLASH_ATTN", {})
    return fn


@pytest.mark.parametrize("qk_norm", [False, True])
def test_flash_attn_contract_under_autocast(flash_attn_on_cpu, qk_norm):
    torch.manual_seed(0)
    b, t, h, d = 2, 7, 3, 8  # all different: a wrong layout cannot pass
    cfg = GPTConfig(
        vocab_size=11,
        block_size=t,
        n_head=h,
        d_model=24,
        d_k=d,
        attention={"backend": "flash", "scaling": "inv_sqrt_d", "qk_norm": qk_norm},
    )
    layer = CausalSelfAttention(cfg)
    x = torch.randn(b, t, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert layer.attention.kernel == "flash_attn"
    call = flash_attn_on_cpu.calls[-1]
    assert call == {
        "shape": (b, t, h, d),
        "scale": pytest.approx(1 / math.sqrt(d)),
        "causal": True,
        "dtype": torch.bfloat16,
    }
    layer.attention.cfg.backend = "scaled"  # the same weights through the explicit kernel, in fp32
    torch.testing.assert_close(y.float(), layer(x), atol=3e-2, rtol=3e-2)


def test_flash_attn_takes_grouped_keys_and_values_natively(flash_attn_on_cpu):
    """model.n_kv_head < n_head: flash_attn gets k, v with the fewer heads (no copy to every query
    head), and the result is the explicit kernel's broadcast."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=11, block_size=7, n_head=4, n_kv_head=2, d_model=32, attention={"backend": "flash"})
    layer = CausalSelfAttention(cfg)
    x = torch.randn(2, 7, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert layer.attention.kernel == "flash_attn" and flash_attn_on_cpu.calls[-1]["kv_heads"] == 2
    layer.attention.cfg.backend = "scaled"
    torch.testing.assert_close(y.float(), layer(x), atol=3e-2, rtol=3e-2)


def test_flash_attn_refuses_fp32_in_one_line(flash_attn_on_cpu):
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(KernelUnavailable, match="fp16/bf16") as err:
        backends.flash_attention(q, q, q, 0.3)
    assert "\n" not in str(err.value)


def test_flash_attn_is_imported_once(flash_attn_on_cpu):
    q = torch.randn(1, 2, 5, 8, dtype=torch.bfloat16)
    backends.flash_attention(q, q, q, 0.3)
    del sys.modules["flash_attn"]  # a second import attempt would now find nothing
    _, kernel = backends.flash_attention(q, q, q, 0.3)
    assert kernel == "flash_attn" and len(flash_attn_on_cpu.calls) == 2


def test_broken_flash_attn_install_is_an_error_not_a_fallback(monkeypatch):
    broken = types.ModuleType("flash_attn")  # imports, but without its function: like an ABI mismatch
    monkeypatch.setitem(sys.modules, "flash_attn", broken)
    monkeypatch.setattr(backends, "FLASH_ATTN_DEVICES", {"cpu"})
    monkeypatch.setattr(backends, "_FLASH_ATTN", {})
    q = torch.randn(1, 2, 5, 8, dtype=torch.bfloat16)
    with pytest.raises(KernelUnavailable, match="flash_attn is installed but does not import .*ImportError") as err:
        backends.flash_attention(q, q, q, 0.3)
    assert "\n" not in str(err.value)


def test_without_flash_attn_the_forced_pytorch_kernel_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed
    monkeypatch.setattr(backends, "FLASH_ATTN_DEVICES", {"cpu"})
    monkeypatch.setattr(backends, "_FLASH_ATTN", {})
    q = torch.randn(1, 2, 5, 8)
    assert backends.flash_attention(q, q, q, 0.3)[1] == "sdpa:flash"


def ops_that_ran(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def test_profiler_shows_flash_is_forced_where_sdpa_would_not_pick_it():
    """With only the math kernel enabled around the call, sdpa runs math; attention=flash still runs
    the flash kernel, because it forces it (the test fails if the forcing is removed)."""
    q = torch.randn(2, 2, 16, 8)
    with sdpa_kernel([SDPBackend.MATH]):
        sdpa_ops = ops_that_ran(lambda: backends.sdpa_attention(q, q, q, 0.3))
        flash_ops = ops_that_ran(lambda: backends.flash_attention(q, q, q, 0.3))
    assert any("flash" in name for name in flash_ops), sorted(flash_ops)
    assert not any("flash" in name for name in sdpa_ops) and any("math" in name for name in sdpa_ops), sorted(sdpa_ops)


# ------------------------------------------------------------------------------- 16-mixed guard


class PoisonGradients(L.Callback):
    """Sets one gradient to Inf after the backward of the given steps (what an fp16 overflow does)."""

    def __init__(self, steps):
        self.steps = set(steps)

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step in self.steps:
            next(p for p in pl_module.parameters() if p.grad is not None).grad.fill_(float("inf"))


def fit_16_mixed(make_cfg, poison_steps, max_skipped, steps=6):
    """Lightning's 16-mixed plugin with a real GradScaler, on CPU (``trainer.precision=16-mixed`` is
    refused on CPU, where Lightning would quietly use bf16): the guard sees what it sees on a GPU."""
    from hydra.utils import instantiate
    from lightning.pytorch.plugins.precision import MixedPrecision
    from omegaconf import OmegaConf

    from attnlab.callbacks.guard import NonFiniteGuard
    from attnlab.training.lit_module import GPTModule

    cfg = make_cfg("model.n_layer=1", f"trainer.max_steps={steps}")
    dm = instantiate(cfg.data, block_size=cfg.model.block_size, steps=steps, seed=0)
    dm.setup("fit")
    module = GPTModule(
        OmegaConf.to_container(cfg.model, resolve=True) | {"vocab_size": dm.vocab_size},
        OmegaConf.to_container(cfg.optim, resolve=True),
        steps,
    )
    guard = NonFiniteGuard(max_skipped_steps=max_skipped)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=cfg.paths.output_dir,
        callbacks=[guard, PoisonGradients(poison_steps)],
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))],
    )
    scale = trainer.precision_plugin.scaler.get_scale()
    trainer.fit(module, datamodule=dm)
    return trainer, guard, scale


def test_16_mixed_a_skipped_step_is_not_a_failure(make_cfg):
    trainer, guard, scale = fit_16_mixed(make_cfg, poison_steps=[2, 3], max_skipped=3)
    assert trainer.global_step == 6 and guard.skipped_in_a_row == 0  # two overflows in a row, then finite again
    assert trainer.precision_plugin.scaler.get_scale() < scale  # the scaler did skip and back off


def test_16_mixed_too_many_skipped_steps_in_a_row_fail(make_cfg):
    with pytest.raises(NonFiniteError, match="3 steps in a row") as err:
        fit_16_mixed(make_cfg, poison_steps=range(1, 100), max_skipped=3)
    assert "\n" not in str(err.value) and "max_skipped_steps=3" in str(err.value)


def test_fp32_non_finite_gradient_still_fails_at_once(make_cfg, monkeypatch):
    from attnlab.training import train as train_module

    build = train_module.build_callbacks
    monkeypatch.setattr(train_module, "build_callbacks", lambda cfg: [*build(cfg), PoisonGradients([2])])
    cfg = make_cfg(
        "callbacks=none", "+callbacks.nonfinite_guard._target_=attnlab.callbacks.NonFiniteGuard", "model.n_layer=1"
    )
    with pytest.raises(NonFiniteError, match="Inf in gradient of .* at step 2"):
        train(cfg)


# -------------------------------------------------------------------------------- GPU defaults


def test_precision_auto_resolves_to_what_the_device_supports(monkeypatch):
    from attnlab.training import devices

    assert devices.resolve_precision("auto", "cpu") == ("32", None)
    assert devices.resolve_precision("auto", "gpu") == ("32", None)  # no CUDA: the config check refuses gpu
    assert devices.resolve_precision("bf16-mixed", "gpu") == ("bf16-mixed", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert devices.resolve_precision("auto", "gpu") == ("bf16-mixed", None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    precision, note = devices.resolve_precision("auto", "gpu")
    assert precision == "16-mixed" and "Tesla V100 has no bf16" in note and "\n" not in note


def test_gpu_trainer_allows_tf32_and_resolves_precision(make_cfg, monkeypatch):
    from attnlab.config.run import RunSpec
    from attnlab.training import devices
    from attnlab.training.settle import settle

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    cfg = make_cfg("trainer=gpu")
    assert cfg.trainer.precision == "auto"
    assert settle(cfg) == []
    assert cfg.trainer.precision == "bf16-mixed"
    schema = RunSpec.of(cfg).schema
    devices.set_matmul_precision(schema.trainer, schema.tf32)
    assert calls == ["high"]
    cfg = make_cfg("trainer=gpu", "tf32=false")
    settle(cfg)
    schema = RunSpec.of(cfg).schema
    devices.set_matmul_precision(schema.trainer, schema.tf32)
    assert calls == ["high", "highest"]


def test_cpu_runs_do_not_touch_matmul_precision(make_cfg, monkeypatch):
    from attnlab.config.run import RunSpec
    from attnlab.training import devices
    from attnlab.training.settle import settle

    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    cfg = make_cfg("trainer=ddp")
    settle(cfg)
    schema = RunSpec.of(cfg).schema
    devices.set_matmul_precision(schema.trainer, schema.tf32)
    assert calls == [] and cfg.trainer.precision == "32"
    assert devices.is_multiprocess(schema.trainer)  # ddp on 2 devices: Lightning starts a second process


# ------------------------------------------------------------------------------------------ DDP


def test_ddp_multirun_runs_each_job_as_one_process_group(tmp_path):
    """Rank 1 must run this job only: one "Launching" line, two job dirs, both ok, nothing else."""
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m",
        "trainer=ddp",
        "trainer.devices=2",
        "debug=smoke",
        "logger=csv",
        "callbacks=none",
        "model.n_layer=1",
        "seed=1,2",
        f"hydra.sweep.dir={sweep}",
        f"paths.log_dir={tmp_path / 'logs'}",
        cwd=tmp_path,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("Launching 2 jobs") == 1, out[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1"], jobs
    for job in jobs:
        results = json.loads((sweep / job / "results.json").read_text())
        assert results["status"] == "ok", results["error"]
        assert results["config"]["trainer"]["strategy"] == "ddp"
    assert not (tmp_path / "logs").exists()  # rank 1 left no run dir of its own


def test_ddp_sweep_with_parallel_jobs_is_refused_in_one_line(capsys):
    from attnlab.sweeps.sweep import main

    assert main(["--study", "smoke", "--jobs", "2", "trainer=ddp"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab: error:") and "JOBS=1" in err and "\n" not in err


# ------------------------------------------------------------------------ correctness on a GPU


def test_checkpoints_carry_the_cuda_rng_when_cuda_is_in_use(monkeypatch):
    """Dropout on a GPU draws from the CUDA generators: a resume restores them too (stand-ins here)."""
    from attnlab.training import rng

    saved = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: saved)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = rng.rng_state()
    assert state["cuda"] is saved
    rng.set_rng_state(state)
    assert restored == [saved]


def test_a_cpu_run_neither_saves_nor_touches_cuda_rng(monkeypatch):
    from attnlab.training import rng

    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: pytest.fail("CUDA RNG set on a CPU run"))
    state = rng.rng_state()
    assert "cuda" not in state
    rng.set_rng_state({**state, "cuda": [torch.zeros(8, dtype=torch.uint8)]})  # a GPU checkpoint resumed on CPU


def test_knockout_reweights_in_fp32_under_bf16_autocast():
    """The cut head's new output is p @ v in fp32 (then cast), not a bf16 matmul."""
    from attnlab.analysis.heads import cut_edges
    from attnlab.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=32, block_size=24)).eval()
    layer = model.attention_layers()[0]
    seen = {}
    capture = layer.register_forward_hook(lambda m, args, out: seen.update(q=args[0], k=args[1], v=args[2], out=out))
    idx = torch.randint(0, 16, (2, 24))
    edges = torch.zeros(2, 24, 24, dtype=torch.bool)
    edges[:, 12:, :6] = True
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), cut_edges(model, 0, 1, edges):
        model(idx)
    capture.remove()
    cut = torch.zeros(1, 2, 1, 1, dtype=torch.bool)
    cut[:, 1] = True
    p = layer.weights(seen["q"], seen["k"], cut=cut & edges.unsqueeze(1)).p[:, 1:2]  # fp32, the cut edges out
    fp32 = (p @ seen["v"][:, 1:2].float()).to(seen["out"].dtype)
    bf16 = (p.bfloat16() @ seen["v"][:, 1:2].bfloat16()).to(seen["out"].dtype)
    assert not torch.equal(fp32, bf16)  # the two differ, so the test can tell them apart
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), cut_edges(model, 0, 1, edges):
        out = {}
        h = layer.register_forward_hook(lambda m, a, o: out.update(o=o))
        model(idx)
        h.remove()
    torch.testing.assert_close(out["o"][:, 1:2], fp32, atol=0, rtol=0)


def test_ddp_ranks_read_different_task_batches(tmp_path):
    """Two gloo ranks on a generated task: rank r trains on batches r, r + 2, ... of the stream, so
    the ranks see different samples and a step's global batch is 2 x data.batch_size rows."""
    import os
    import subprocess

    from conftest import ROOT
    from hydra.utils import instantiate

    from attnlab.config.compose import compose_config

    steps, batch = 4, 3
    common = [
        "data=mqar",
        "data.num_pairs=4",
        "model.block_size=24",
        "debug=smoke",
        f"trainer.max_steps={steps}",
        f"data.batch_size={batch}",
        "callbacks=none",
        "logger=csv",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.training.train",
            *common,
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "+callbacks.recorder._target_=batch_recorder.RecordBatches",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"batches_rank{r}.json").read_text()) for r in (0, 1)]
    assert [len(s) for s in seen] == [steps, steps] and all(len(b) == batch for s in seen for b in s)
    cfg = compose_config(common)
    dm = instantiate(cfg.data, block_size=cfg.model.block_size, steps=steps, seed=cfg.seed)
    dm.setup("fit")
    dm.train_set.n_batches = 2 * steps
    for step in range(steps):
        for rank in (0, 1):
            assert seen[rank][step] == dm.train_set[2 * step + rank][0].tolist(), (step, rank)
    rows = [tuple(row) for s in seen for b in s for row in b]
    assert len(set(rows)) == len(rows)  # no sample trained twice
