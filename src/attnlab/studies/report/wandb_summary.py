"""The study's table and plots as one W&B run in the study's W&B group, next to its training runs.

``make report`` calls :func:`log_summary_run` after writing ``reports/<study>/``. The run goes where
the training runs went: the same project and group, offline unless they were online, its files
under the sweep dir (``<sweep dir>/wandb/offline-run-*``) so that ``make sync`` uploads it with them.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd


def read_csv(text: str) -> tuple[list[str], list[list]]:
    """ablation.csv as W&B's Table wants it, one type per column: a column whose cells all read as
    numbers holds floats, any other strings (an axis such as init_std mixes 0.02 and fan_in); empty
    cells are None."""
    frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    columns = {}
    for name, column in frame.items():
        numbers = pd.to_numeric(column.where(column != ""), errors="coerce")
        numeric = not (numbers.isna() & (column != "")).any()
        columns[name] = [None if c == "" else float(n) if numeric else c for c, n in zip(column, numbers)]
    return list(frame.columns), [list(row) for row in zip(*columns.values())] if columns else []


def wandb_target(runs) -> dict | None:
    """Project, group and mode of the study's W&B runs, and the sweep dirs they came from; None when
    none of them logged to W&B."""
    for run in runs:
        config = run.results.get("config") or {}
        wandb_cfg = (config.get("logger") or {}).get("wandb")
        if wandb_cfg and wandb_cfg.get("mode", "offline") != "disabled":
            # the group the run recorded (its study); runs recorded before it was: run_group, else the sweep dir's name
            group = (
                (run.results.get("wandb") or {}).get("group")
                or wandb_cfg.get("group")
                or config.get("run_group")
                or run.dir.parent.name
            )
            sweeps = sorted({s for r in runs if (s := (r.results.get("wandb") or {}).get("sweep"))})
            return {
                "project": wandb_cfg.get("project") or "attnlab",
                "mode": wandb_cfg.get("mode") or "offline",
                "group": group,
                "sweeps": sweeps,
            }
    return None


def log_summary_run(study: str, out: Path, plots: list[Path], runs, sweep_dir: Path) -> Path | None:
    """Log ``out/ablation.csv`` as the Table ``ablation`` and each plot as ``plots/<name>`` to one
    run named ``<study>-table`` (job type ``summary``); return its run dir, or None when the study's
    runs did not use W&B."""
    target = wandb_target(runs)
    if target is None:
        return None
    import wandb

    columns, data = read_csv((out / "ablation.csv").read_text())
    try:
        run = wandb.init(
            project=target["project"],
            group=target["group"],
            mode=target["mode"],
            name=f"{study}-table",
            job_type="summary",
            dir=str(sweep_dir),
            tags=[f"sweep={s}"[:64] for s in target["sweeps"]],
            config={"study": study, "sweep_dir": str(sweep_dir), "sweeps": target["sweeps"], "runs": len(runs)},
            settings=wandb.Settings(quiet=True, silent=True),
            reinit="create_new",
        )
        try:
            run.log(
                {
                    "ablation": wandb.Table(columns=columns, data=data),
                    **{f"plots/{plot.stem}": wandb.Image(str(plot)) for plot in plots},
                }
            )
            run_dir = Path(run.dir).parent
        finally:
            run.finish()
    except Exception as err:  # the report files are written; W&B holds a copy of them
        print(
            f"attnlab: the W&B summary run was not written ({type(err).__name__}: {str(err)[:300]}); {out}/ is complete"
        )
        return None
    where = "make sync uploads it" if target["mode"] == "offline" else "online"
    print(
        f"attnlab: W&B run {study}-table (group {target['group']}) with the table and {len(plots)} plots; {where}: {run_dir}"
    )
    return run_dir
