"""The repro's verdicts as one W&B run, beside the report files (which are complete without it)."""

from __future__ import annotations

from pathlib import Path

from attnlab.writing.pages import VERDICTS


def log_repro_summary(results: list[dict], logs: Path, mode: str = "offline", project: str = "attnlab") -> Path | None:
    """The repro's verdicts as one W&B run (``repro``, group ``repro``, job type ``summary``): a Table of every
    claim with its verdict and its checks that did not hold, and the tally (``verdicts/<value>``: claims with that verdict) as the
    run's summary. Files under ``logs`` (``make sync`` uploads offline runs); returns the run dir, or None when
    W&B failed (the report files are complete without it)."""
    import wandb

    try:
        run = wandb.init(
            project=project,
            group="repro",
            mode=mode,
            name="repro",
            job_type="summary",
            dir=str(logs),
            config={"claims": len(results)},
            settings=wandb.Settings(quiet=True, silent=True),
            reinit="create_new",
        )
        try:
            table = wandb.Table(
                columns=["id", "claim", "verdict", "not holding"],
                data=[
                    [
                        r["id"],
                        r["claim"],
                        r["verdict"],
                        "; ".join(k["name"] for k in r["checks"] if k["passed"] is not True),
                    ]
                    for r in results
                ],
            )
            run.log({"verdicts": table})
            for v in VERDICTS:
                run.summary[f"verdicts/{v}"] = sum(r["verdict"] == v for r in results)
            run_dir = Path(run.dir).parent
        finally:
            run.finish()
    except Exception as err:
        print(f"attnlab: the W&B repro run was not written ({type(err).__name__}: {str(err)[:300]})")
        return None
    return run_dir
