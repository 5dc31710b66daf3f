"""The training device: what ``trainer=gpu`` resolves to, and DDP inside a Hydra multirun.

- ``trainer.precision=auto`` (the ``trainer=gpu`` default) becomes ``bf16-mixed`` on a GPU that
  supports bf16, else ``16-mixed`` (said in one line), and ``32`` on CPU (training/settle.py writes it).
- On CUDA, fp32 matmuls may use TF32 (``tf32: true``, the default): the speed GPU users expect;
  ``tf32=false`` keeps full fp32 matmuls for exact comparisons.
- DDP in a multirun: Lightning starts ranks 1.. by re-running ``sys.argv`` (the ``-m`` flag and
  the sweep list included), so every extra rank would run the whole sweep. ``ddp_multirun_job``
  makes them run this job only, in this job's dir, and cleans up the environment Lightning leaves
  behind so the next job starts its own process group.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch
from omegaconf import OmegaConf, read_write

from attnlab.config.run import Job
from attnlab.config.schema import TrainerConfig
from attnlab.util.errors import ConfigError

# environment Lightning's launcher sets in rank 0; left in place, the next job of a multirun
# would believe an outside launcher created its processes and wait for ranks that never come
LAUNCHER_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT")


def uses_cuda(accelerator: str) -> bool:
    """True when the run will train on CUDA (trainer=gpu on a machine without CUDA is refused by
    the config check, not here)."""
    return accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def resolve_precision(precision: str, accelerator: str) -> tuple[str, str | None]:
    """``auto`` -> what the device supports best, and a one-line note when it is not bf16."""
    if str(precision) != "auto":
        return str(precision), None
    if not uses_cuda(accelerator):
        return "32", None
    if torch.cuda.is_bf16_supported():
        return "bf16-mixed", None
    name = torch.cuda.get_device_name()
    return "16-mixed", f"trainer.precision=auto: {name} has no bf16, using 16-mixed (fp16 with a gradient scaler)"


def set_matmul_precision(trainer: TrainerConfig, tf32: bool) -> None:
    """On CUDA, let fp32 matmuls use TF32 (``tf32``) or keep them full fp32."""
    if uses_cuda(trainer.accelerator):
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def is_multiprocess(trainer: TrainerConfig) -> bool:
    """True when Lightning will start more than one process for this run."""
    devices = trainer.devices
    n = len(devices) if isinstance(devices, list) else (int(devices) if str(devices).lstrip("-").isdigit() else 1)
    if str(devices) in ("-1", "auto"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 1
    strategy = str(trainer.strategy)
    return strategy.startswith("ddp") and strategy != "ddp_spawn" and (n > 1 or int(trainer.num_nodes) > 1)


@contextmanager
def ddp_multirun_job(trainer: TrainerConfig, job: Job):
    """Within the block, Lightning's launcher starts the other ranks on this multirun job alone."""
    from hydra.core.hydra_config import HydraConfig

    if not (job.multirun and is_multiprocess(trainer)):
        yield
        return
    hc = HydraConfig.get()
    launcher = str(OmegaConf.select(hc, "launcher._target_", default=""))
    if not launcher.endswith("BasicLauncher"):
        raise ConfigError(
            "trainer.strategy",
            trainer.strategy,
            f"ddp only with Hydra's basic launcher (make sweep JOBS=1): {launcher.rsplit('.', 1)[-1]} runs jobs in "
            "worker processes whose ranks Lightning cannot relaunch",
        )
    argv, run_dir = list(sys.argv), hc.run.dir
    sys.argv = [sys.argv[0], *job.overrides]  # this job's overrides, no -m, no sweep lists
    with read_write(hc):
        hc.run.dir = hc.runtime.output_dir  # Lightning passes it to the ranks as hydra.run.dir
    try:
        yield
    finally:
        sys.argv = argv
        with read_write(hc):
            hc.run.dir = run_dir
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for name in LAUNCHER_ENV:
            os.environ.pop(name, None)
