"""What attnlab does differently inside, and around, SLURM jobs (docs/configuration.md, "A study
on a SLURM cluster").

- ``scheduler_restarts``: how often SLURM has requeued this job; a requeued attempt resumes its
  own run dir (``continuation.resume_checkpoint``). ``being_requeued``: whether a SIGTERM is SLURM
  requeueing the job itself (a preemption), so the run says so and leaves submitit no result.
- ``cluster_plugins``: Lightning's SLURM environment with its auto-requeue off, so requeueing has
  one owner, submitit (callbacks/interrupt.py says why).
- ``SlurmWatcher``: submitit follows its jobs with ``sacct``; on a cluster without accounting
  storage every poll fails, sacct prints its error and submitit logs "Bypassing sacct error ..."
  through three handlers, for as long as the study runs. With it that is said once, in one line,
  and the jobs' states come from squeue.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

from hydra.experimental.callback import Callback


def scheduler_restarts() -> int:
    """How often SLURM has requeued this job (``SLURM_RESTART_COUNT``; 0 outside SLURM)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def being_requeued() -> bool:
    """Whether the SIGTERM this SLURM job got comes from a requeue (a preemption with
    PreemptMode=REQUEUE, ``scontrol requeue``, a node failure), not a cancel: SLURM has already
    counted the restart that this attempt's ``SLURM_RESTART_COUNT`` does not have yet."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or shutil.which("scontrol") is None:
        return False
    try:
        out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    found = re.search(r"\bRestarts=(\d+)", out)
    return found is not None and int(found.group(1)) > scheduler_restarts()


def slurm_job() -> dict | None:
    """For results.json: the SLURM job this run is (array task, how often requeued), or None."""
    if not os.environ.get("SLURM_JOB_ID"):
        return None
    return {
        "job_id": os.environ["SLURM_JOB_ID"],
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "restarts": scheduler_restarts(),
    }


def cluster_plugins() -> list:
    """Inside a SLURM job: Lightning's SLURM environment without its auto-requeue (which would save
    an ``hpc_ckpt`` from inside the signal handler, mid-step, and requeue on SIGUSR1 itself)."""
    if "SLURM_NTASKS" not in os.environ:
        return []
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def squeue_states(job_ids: set[str]) -> str:
    """What ``sacct -o JobID,State,NodeList --parsable2`` would say about these jobs, from squeue
    (which knows a job until MinJobAge after it ends); a job it no longer knows is GONE, i.e. ended."""
    lines = ["JobID|State|NodeList"]
    if job_ids:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N", "-j", ",".join(sorted(job_ids))],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines += out.stdout.split()  # an unknown id makes squeue fail: every id it could not list is gone
    return "\n".join(lines) + "\n"


def _watcher_class():
    from submitit.slurm.slurm import SlurmInfoWatcher

    class SqueueWhenNoSacct(SlurmInfoWatcher):
        """submitit's job watcher, asking squeue once sacct has said accounting storage is disabled
        (said in one line): without it every poll would warn, and a job that ended without a result
        file (killed, cancelled) would be waited for forever."""

        no_accounting = False

        def update(self) -> None:
            command = self._make_command()
            if command is None:
                return
            self._num_calls += 1
            if not self.no_accounting:
                proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
                if proc.returncode == 0:
                    self._info_dict.update(self.read_info(proc.stdout))
                elif "accounting storage is disabled" in proc.stderr:
                    self.no_accounting = True
                    print(
                        "attnlab: sacct: accounting storage is disabled on this cluster; following the jobs "
                        "with squeue instead",
                        file=sys.stderr,
                        flush=True,
                    )
                else:
                    reason = " ".join(proc.stderr.split())[:200] or f"exit {proc.returncode}"
                    print(f"attnlab: sacct failed ({reason}); job states may be late", file=sys.stderr, flush=True)
            if self.no_accounting:
                pending = {x.split("_")[0] for x in self._registered - self._finished}
                info = self.read_info(squeue_states(pending))
                for job_id in self._registered - self._finished:
                    self._info_dict[job_id] = info.get(job_id) or {"JobID": job_id, "State": "GONE"}
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

    return SqueueWhenNoSacct


class SlurmWatcher(Callback):
    """Hydra callback of ``hydra/launcher=slurm``: before the jobs are submitted, submitit's SLURM
    jobs get the watcher above."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from submitit.slurm.slurm import SlurmJob

        watcher = _watcher_class()
        if not isinstance(SlurmJob.watcher, watcher):
            SlurmJob.watcher = watcher(delay_s=SlurmJob.watcher._delay_s)
