"""Long context: what the measurement callbacks cost as the block grows.

For each block size T, whole ``attnlab train`` runs of one fixed token budget (batch x T x steps
the same at every T, so the training work per token is what changes with T), with the default
callbacks against ``callbacks=none``, alternated (A B, B A, ...: ``endtoend.alternated``) and
timed from outside like the end-to-end section (``endtoend.run_attnlab``). The number of steps,
and so the number of validations and of periodic measurements, is the same at every T as long as
T <= tokens_per_step (the batch shrinks instead); beyond it the batch is 1 and the steps shrink.

Each run goes through ``python -m attnlab.tools.bench.longctx --child STAMPS -- train ...``, which is
``attnlab train`` with its phase recorder on (``attnlab.training.phases``, as the breakdown reads it): when
the last training step ended, and the seconds inside every callback's hooks (Lightning's profiler
actions); plus the process's peak RSS (and the CUDA allocator's peak on a GPU). Per T: wall seconds of each arm (median), their ratio
within each pair (median), the end-of-run analysis share (seconds in the callbacks' end-of-training
hooks: the final head analysis with its knockout, the final statistics and maps, the final checkpoint,
over the run's wall time), the seconds from the last step to the process's exit, and peak memory.
Targets: default callbacks at most 1.10x ``callbacks=none`` at every T, the end-of-run
analysis at most 5 % of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from attnlab.attention.backends import KERNELS, explicit_attention
from attnlab.cli import main as cli_main
from attnlab.tools.bench.endtoend import alternated, run_attnlab
from attnlab.tools.bench.phase_rows import callback_seconds, is_end_of_training
from attnlab.tools.bench.timing import against_target, median_and_range, paired_ratios
from attnlab.training import phases

TARGET_RATIO = 1.10  # default callbacks' wall time over callbacks=none's, at every T
TARGET_END_SHARE = 0.05  # the end-of-run analysis over the run's wall time
ARMS = {"default": [], "none": ["callbacks=none"]}
STEP_END = ".on_train_batch_end"  # the LightningModule's hook, the last of each step ("[LightningModule]GPTModule...")
CHILD = ("-m", "attnlab.tools.bench.longctx", "--child")


@dataclass(frozen=True)
class LongctxPlan:
    """Which block sizes, what budget, how many alternated pairs."""

    seq_lens: tuple[int, ...]
    fused_seq_lens: tuple[
        int, ...
    ] = ()  # only with a fused backend: the explicit kernels' T x T work is too slow there
    tokens_per_step: int = 4096  # batch x T, while T fits in it
    steps: int = 40
    validations: int = 2  # at every T: val_check_interval = steps / validations
    val_batches: int | None = None  # None: the data config's
    repeats: int = 3
    attention: str = "sdpa"
    extra: tuple[str, ...] = ()  # more overrides for every run (the device's trainer)

    @property
    def budget(self) -> int:
        """Training tokens per run, the same at every T."""
        return self.tokens_per_step * self.steps

    def lengths(self) -> tuple[int, ...]:

        fused = KERNELS[self.attention] is not explicit_attention
        return tuple(self.seq_lens) + (tuple(self.fused_seq_lens) if fused else ())


def run_settings(plan: LongctxPlan, seq_len: int) -> dict:
    """Batch, steps and validation interval at block size ``seq_len`` for the plan's fixed budget.

    Raises ValueError (one line) when the budget cannot be split evenly: unequal budgets or
    validation counts would make the rows incomparable.
    """
    if seq_len < 2:
        raise ValueError(f"longctx: T={seq_len}; expected a block size >= 2")
    if seq_len <= plan.tokens_per_step:
        if plan.tokens_per_step % seq_len:
            raise ValueError(
                f"longctx: T={seq_len} does not divide tokens_per_step={plan.tokens_per_step}; "
                "expected a divisor (e.g. a power of two) so every T trains on the same tokens"
            )
        batch, steps = plan.tokens_per_step // seq_len, plan.steps
    else:
        if plan.budget % seq_len:
            raise ValueError(f"longctx: T={seq_len} does not divide the token budget {plan.budget}; expected a divisor")
        batch, steps = 1, plan.budget // seq_len
    if steps < plan.validations or steps % plan.validations:
        raise ValueError(
            f"longctx: T={seq_len} gives {steps} steps, not a multiple of validations={plan.validations}; "
            "expected the same number of validations at every T"
        )
    return {
        "batch_size": batch,
        "steps": steps,
        "val_every": steps // plan.validations,
        "tokens": batch * seq_len * steps,
    }


def run_overrides(plan: LongctxPlan, seq_len: int) -> list[str]:
    """The ``attnlab train`` overrides of one run at ``seq_len`` (both arms; the arm adds its own)."""
    s = run_settings(plan, seq_len)
    return [
        f"attention={plan.attention}",
        f"model.block_size={seq_len}",
        f"data.batch_size={s['batch_size']}",
        f"trainer.max_steps={s['steps']}",
        f"trainer.val_check_interval={s['val_every']}",
        "logger=csv",
        "trainer.enable_progress_bar=false",
        *([f"data.val_batches={plan.val_batches}"] if plan.val_batches else []),
        *plan.extra,
    ]


# ----------------------------------------------------------------------------------------- child


def child(stamps: Path, argv: list[str]) -> int:
    """``attnlab ARGV`` through the CLI's own ``main`` with the phase recorder on; STAMPS gets the
    phases when it returns. Both arms record the same way (two clock reads per Lightning action),
    so both run what ``attnlab train`` runs."""
    import resource

    recorder = phases.enable()
    rc = 1
    try:
        rc = cli_main(argv)
    except SystemExit as err:
        rc = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    finally:
        data = recorder.data()
        step_end = [p for p in data["last_end"] if p.startswith("[LightningModule]") and p.endswith(STEP_END)]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        cuda_peak = None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda_peak = max(torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count()))
        stamps.write_text(
            json.dumps(
                {
                    "rc": rc,
                    "last_step_end": max((data["last_end"][p] for p in step_end), default=None),
                    "steps_seen": sum(data["calls"][p] for p in step_end),
                    "seconds": data["seconds"],
                    "inclusive_s": data["inclusive_s"],
                    "calls": data["calls"],
                    "max_rss_bytes": rss,
                    "cuda_peak_bytes": cuda_peak,
                }
            )
        )
    return rc


# ---------------------------------------------------------------------------------------- parent


def run_arm(overrides: list[str], run_dir: Path) -> dict:
    """One probed ``attnlab train`` run: e2e's sample (wall, step, val loss, kernel) plus the probes."""

    stamps = run_dir.parent / f"{run_dir.name}.stamps.json"
    sample = run_attnlab(overrides, run_dir, command=(*CHILD, str(stamps), "--", "train"))
    probe = json.loads(stamps.read_text())
    if probe["last_step_end"] is None:
        raise RuntimeError(f"longctx: no training step was stamped in {run_dir}")
    seconds = callback_seconds(probe["seconds"])  # per row: "callback X (per step)" / "(end of training)"
    # the end-of-training hooks with what they call (the final checkpoint's write), which the exclusive rows leave out
    end = callback_seconds(probe["inclusive_s"])
    sample.update(
        tail_s=sample["finished_at"] - probe["last_step_end"],
        end_s=sum(sec for row, sec in end.items() if is_end_of_training(row)),
        callbacks_s=sum(seconds.values()),
        max_rss_bytes=probe["max_rss_bytes"],
        cuda_peak_bytes=probe["cuda_peak_bytes"],
        callback_seconds=seconds,
    )
    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints and maps: only the numbers above are kept
    return sample


def summarize(seq_len: int, settings: dict, overrides: list[str], samples: dict[str, list[dict]]) -> dict:
    """One table row from the alternated runs at one T: medians, paired ratios and the targets' verdicts
    (``timing.against_target``: met in every pair, missed in every pair, or open)."""

    d, n = samples["default"], samples["none"]
    wall_d, wall_n = median_and_range([s["wall_s"] for s in d]), median_and_range([s["wall_s"] for s in n])
    ratio = paired_ratios([s["wall_s"] for s in d], [s["wall_s"] for s in n])
    share = median_and_range([s["end_s"] / s["wall_s"] for s in d])

    def median(arm: list[dict], key: str):
        return median_and_range([s[key] for s in arm])["median"]

    def peak(arm: list[dict], key: str):
        values = [s[key] for s in arm if s.get(key) is not None]
        return max(values) if values else None

    return {
        "T": seq_len,
        **settings,
        "overrides": overrides,
        "kernel": d[0].get("kernel"),
        "error": None,
        "repeats": len(d),
        "default_wall_s": wall_d["median"],
        "default_wall_range": [wall_d["min"], wall_d["max"]],
        "none_wall_s": wall_n["median"],
        "none_wall_range": [wall_n["min"], wall_n["max"]],
        "wall_ratio": ratio["median"],
        "wall_ratio_range": [ratio["min"], ratio["max"]],
        "ratio_verdict": against_target(ratio["min"], ratio["max"], TARGET_RATIO),
        "end_s": median(d, "end_s"),
        "end_share": share["median"],
        "end_share_range": [share["min"], share["max"]],
        "end_verdict": against_target(share["min"], share["max"], TARGET_END_SHARE),
        "tail_s": {"default": median(d, "tail_s"), "none": median(n, "tail_s")},
        "callbacks_s": median(d, "callbacks_s"),
        "step_ms": {"default": median(d, "median_step_s") * 1e3, "none": median(n, "median_step_s") * 1e3},
        "max_rss_bytes": {"default": peak(d, "max_rss_bytes"), "none": peak(n, "max_rss_bytes")},
        "cuda_peak_bytes": {"default": peak(d, "cuda_peak_bytes"), "none": peak(n, "cuda_peak_bytes")},
        "val_loss": {"default": [s["val_loss"] for s in d], "none": [s["val_loss"] for s in n]},
        "samples": samples,
    }


def failed_row(seq_len: int, settings: dict, overrides: list[str], error: str) -> dict:
    return {
        "T": seq_len,
        **settings,
        "overrides": overrides,
        "error": error,
        "ratio_verdict": None,
        "end_verdict": None,
    }


def long_context(
    plan: LongctxPlan, log: Callable[[str], None] = print, on_progress: Callable[[dict], None] | None = None
) -> dict:
    """Every T of the plan, shortest first; ``on_progress`` sees the section after each T (the bench
    saves it then, so a killed bench keeps the rows it measured). A T whose run fails (out of
    memory, say) is recorded with its error and the longer T are skipped."""

    lengths = plan.lengths()
    settings = {t: run_settings(plan, t) for t in lengths}  # every T checked before the first run
    section = {
        "plan": asdict(plan) | {"lengths": list(lengths), "budget": plan.budget},
        "targets": {"wall_ratio": TARGET_RATIO, "end_share": TARGET_END_SHARE},
        "arms": ARMS,
        "rows": [],
        "load": [list(os.getloadavg())],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "complete": False,
    }
    failed = None
    with tempfile.TemporaryDirectory(prefix="attnlab-longctx-") as tmp:
        for seq_len in lengths:
            overrides = run_overrides(plan, seq_len)
            if failed is not None:
                row = failed_row(seq_len, settings[seq_len], overrides, f"skipped: T={failed} failed")
            else:
                samples = {arm: [] for arm in ARMS}
                try:
                    for rep in range(plan.repeats):
                        for arm in alternated(list(ARMS), rep):
                            sample = run_arm([*overrides, *ARMS[arm]], Path(tmp) / f"T{seq_len}-r{rep}-{arm}")
                            samples[arm].append(sample)
                            log(
                                f"  longctx T={seq_len} rep {rep + 1}/{plan.repeats} {arm}: {sample['wall_s']:.1f} s, "
                                f"end-of-run analysis {sample['end_s']:.1f} s, after the last step {sample['tail_s']:.1f} s, "
                                f"peak RSS {sample['max_rss_bytes'] / 2**20:.0f} MiB"
                            )
                    row = summarize(seq_len, settings[seq_len], overrides, samples)
                except RuntimeError as err:
                    lines = [line for line in str(err).strip().splitlines() if line.strip()]
                    row = failed_row(seq_len, settings[seq_len], overrides, (lines[-1] if lines else "failed")[:300])
                    row["failure"] = str(err)[-2000:]
                    failed = seq_len
                    log(f"  longctx T={seq_len}: failed ({row['error']})")
            section["rows"].append(row)
            section["load"].append(list(os.getloadavg()))
            if on_progress is not None:
                on_progress(section)
    section["complete"] = True
    return section


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv:
        print(
            "attnlab: error: python -m attnlab.tools.bench.longctx --child STAMPS -- train OVERRIDES (internal: the "
            "longctx bench's probed run)",
            file=sys.stderr,
        )
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m attnlab.tools.bench.longctx")
    p.add_argument("--child", required=True, help="(internal) write this run's probes to this JSON file")
    args = p.parse_args(argv[:cut])
    return child(Path(args.child), argv[cut + 1 :])


if __name__ == "__main__":
    sys.exit(main())
