"""A streaming study's table: every run of a sweep decoded past its block with rolling KV caches.

    attnlab stream-study SWEEP_DIR [SWEEP_DIR ...] --cache C [--sinks 0,1,2,4] [--tokens N] [--sequences S] [--out DIR]
    attnlab stream-study --render REPORT_DIR

Each finished run's last checkpoint goes through ``stream.stream_report`` on the same tokens (S stretches of
its validation split, or S long validation sequences of a task, pooled): perplexity with the first k tokens
kept in a rolling cache of C entries, the recomputed window (the oracle) and dense attention within
the block; beside them the run's first-token weight from its own statistics. Per arm (a cell of the
sweep's axes) the cost of evicting the first tokens is StreamingLLM's measure (Xiao et al. 2023,
Table 3): PPL(0 kept) / PPL(most kept) per seed, over seeds its median with a bootstrap interval and the
sign test (the ratios are skewed: one seed can sit far out), and a verdict from them. Writes ``<out>/stream.{md,json,png}``
(default out: reports/<study>); ``--render`` rebuilds a report's derived fields, stream.md and
stream.png from the per-seed values its stream.json holds, decoding nothing.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from attnlab.attention.stats import SINK_EPSILON
from attnlab.inference.analyze import run_datamodule
from attnlab.inference.stream import DEFAULT_SINKS, parse_sinks, run_tokens, stream_report
from attnlab.studies.report.aggregate import RunResult, group_cells, load_sweeps, swept_axes
from attnlab.studies.report.plots import colours, legend_outside, save
from attnlab.training.checkpointing import load_model
from attnlab.util import significance
from attnlab.util.cli import command_parser
from attnlab.util.files import atomic_write_text, json_safe
from attnlab.writing.pages import TEMPLATES

DEFAULT_TOKENS = 2048
# The verdict's bounds on PPL(0 kept) / PPL(most kept): StreamingLLM reports perplexity many times
# higher without the first tokens, so "collapse" asks that it at least doubles; "no cost" that it
# moves by under 1 % either way.
COLLAPSE, NO_COST, UNTESTED = "collapse", "no cost", "untested"
COST, GAIN = "cost", "gain"  # every seed, or nearly, on one side of 1 by the sign test, short of a collapse
COLLAPSE_RATIO = 2.0
NO_COST_RATIO = 1.01
# what a stream.json arm holds as measured; every other field is derived from these
MEASURED = (
    "arm",
    "seeds",
    "val_loss",
    "first_token_weight",
    "dormant_first_token_weight",
    "ppl",
    "oracle",
    "dense",
    "by_class",
)


def shown(path) -> str:
    """A run or sweep dir as the report names it: from its logs/ folder on, wherever the checkout is."""
    parts = Path(path).parts
    return str(Path(*parts[parts.index("logs") :])) if "logs" in parts else str(path)


def attention_label(run: RunResult) -> str:
    """What the run's attention normalises with: softmax, softmax with an escape slot, or sigmoid."""
    att = run.results.get("config", {}).get("model", {}).get("attention", {})
    escape = att.get("escape", "none")
    return att.get("normalize", "softmax") + ("" if escape in (None, "none") else f" + {escape} escape")


def first_token_weight(run: RunResult) -> dict[str, float | None]:
    """The run's final first-token weight: its largest layer mean (``attn/L{i}/sink_mass``) and, on
    the sinks testbed, the dormant queries' (``attn/L0/sink_mass_dormant``)."""
    metrics = run.results.get("metrics", {})
    layers = [v for key in metrics if key.endswith("/sink_mass") and (v := run.metric(key)) is not None]
    return {"max_layer": max(layers, default=None), "dormant": run.metric("attn/L0/sink_mass_dormant")}


def evaluate_run(
    run: RunResult, capacity: int, sinks: list[int], tokens: int, oracle_positions: int, sequences: int = 1
) -> dict:
    """One run's stream report (stream.stream_report) on its own validation tokens, kept in the run
    dir beside its checkpoint: a study evaluated while its sweep runs redoes only the new runs."""

    ckpt = run.dir / "checkpoints" / "last.ckpt"
    many = f"_s{sequences}" if sequences > 1 else ""
    saved = (
        run.dir / f"stream_c{capacity}_k{'-'.join(map(str, sinks))}_n{tokens}{many}_o{oracle_positions}_classes.json"
    )
    if saved.is_file() and saved.stat().st_mtime >= ckpt.stat().st_mtime:
        return json.loads(saved.read_text())
    module = load_model(ckpt)[0].eval()
    ids, source = run_tokens(run.dir, module, ckpt, None, tokens, sequences)
    dm = run_datamodule(run.dir)
    # a task with query classes (the sinks testbed's dormant and active queries): the cost and the
    # attention's writes per class, where a sink's eviction shows first
    classes = dm.query_classes(ids) if hasattr(dm, "query_classes") else None
    report = {"source": source, **stream_report(module.model, ids, capacity, sinks, oracle_positions, classes)}
    atomic_write_text(saved, json.dumps(report))
    return report


def summarise(records: list[dict], sinks: list[int]) -> list[dict]:
    """Per arm: the per-seed perplexities and first-token weights, then the eviction measure (derive)."""
    arms: dict[str, list[dict]] = {}
    for r in records:
        arms.setdefault(r["arm"], []).append(r)
    kept = max(sinks)
    out = []
    for arm, rs in arms.items():
        ppl = {k: [r["stream"]["rolling"][sinks.index(k)]["ppl"] for r in rs] for k in sinks}
        weights = [r["first_token_weight"]["max_layer"] for r in rs if r["first_token_weight"]["max_layer"] is not None]
        dormant = [r["first_token_weight"]["dormant"] for r in rs if r["first_token_weight"]["dormant"] is not None]
        measured = {
            "arm": arm,
            "seeds": sorted(r["seed"] for r in rs),
            "val_loss": [r["val_loss"] for r in rs],
            "first_token_weight": weights,
            "dormant_first_token_weight": dormant,
            "ppl": {str(k): v for k, v in ppl.items()},
            "oracle": [r["stream"]["oracle"]["ppl"] for r in rs],
            "dense": [r["stream"]["dense"]["ppl"] for r in rs],
            # ln PPL(0 kept) - ln PPL(most kept) per seed, from the unrounded perplexities: the exact
            # per-seed value the ratio is built on (and what attnlab.studies.findings reads)
            "drop_cost": {"per_seed": [math.log(a) - math.log(b) for a, b in zip(ppl[0], ppl[kept])]}
            if 0 in sinks and kept
            else None,
            "by_class": class_values(rs, sinks) if 0 in sinks and kept else None,
        }
        out.append(derive(measured, kept))
    return out


def class_values(records: list[dict], sinks: list[int]) -> dict | None:
    """Per query class, per seed: ln PPL(0 kept) - ln PPL(most kept) over the positions past the first
    eviction, and each layer's attention write norm there with 0 and with the most kept."""
    rows = [{r["sinks"]: r.get("classes") for r in rec["stream"]["rolling"]} for rec in records]
    kept = max(sinks)
    if not all(row.get(0) and row.get(kept) for row in rows):
        return None
    names = [c for c in rows[0][0] if all(c in row[0] and c in row[kept] for row in rows)]
    return {
        c: {
            "positions": rows[0][0][c]["positions"],
            "log_ratio": [math.log(row[0][c]["ppl"]) - math.log(row[kept][c]["ppl"]) for row in rows],
            "write_norm": {str(k): [row[k][c]["write_norm"] for row in rows] for k in (0, kept)},
        }
        for c in names
    }


def derive(arm: dict, kept: int) -> dict:
    """An arm's measured fields (MEASURED and the per-seed log ratios) with the eviction measure built on them:
    over all positions, and per query class where the task has classes."""
    cost = arm.get("drop_cost")
    measured = {k: arm.get(k) for k in MEASURED}
    if not cost:
        return {**measured, "drop_cost": None, "eviction": None}
    classes = {}
    for name, c in (arm.get("by_class") or {}).items():
        writes = [[a / b for a, b in zip(w0, wk)] for w0, wk in zip(c["write_norm"]["0"], c["write_norm"][str(kept)])]
        classes[name] = {
            **eviction(c["log_ratio"]),
            "positions": c["positions"],
            # per layer: the geometric mean over seeds of (write norm with 0 kept) / (with the most kept)
            "write_ratio": [statistics.geometric_mean(layer) for layer in zip(*writes)],
        }
    return {
        **measured,
        "drop_cost": {"per_seed": cost["per_seed"]},
        "eviction": {"kept": kept, **eviction(cost["per_seed"]), "by_class": classes or None},
    }


def eviction(log_ratios: list[float]) -> dict:
    """PPL(0 kept) / PPL(most kept) per seed and over seeds, read as the skewed ratios they are: the median
    with its percentile-bootstrap 95 % interval, how many seeds lie above 1, the sign test and Wilcoxon's
    signed-rank test on the log ratios (``significance.ratios``), and the verdict: collapse where the
    interval's lower bound reaches COLLAPSE_RATIO, no cost where it lies within NO_COST_RATIO of 1, a cost
    (or a gain) where the sign test finds the seeds on one side of 1, else untested. Under three seeds: untested."""
    ratios = [math.exp(d) for d in log_ratios]
    n = len(ratios)
    summary = significance.ratios(ratios)
    if summary is None:
        return {"ratio": ratios, "median": ratios[0] if ratios else None, "ci": None, "n": n, "verdict": UNTESTED}
    lo, hi = summary.lo, summary.hi
    if lo >= COLLAPSE_RATIO:
        verdict = COLLAPSE
    elif 1 / NO_COST_RATIO <= lo and hi <= NO_COST_RATIO:
        verdict = NO_COST
    elif summary.p_sign < significance.ALPHA:
        verdict = COST if summary.median > 1 else GAIN
    else:
        verdict = UNTESTED
    return {
        "ratio": ratios,
        "median": summary.median,
        "ci": [lo, hi],
        "above": summary.above,
        "p_sign": summary.p_sign,
        "p_wilcoxon": summary.p_wilcoxon,
        "n": n,
        "verdict": verdict,
    }


def markdown(report: dict) -> str:
    """stream.md from stream.json's content alone (templates/stream.md.j2)."""
    return TEMPLATES.get_template("stream.md.j2").render(
        **report,
        collapse_ratio=COLLAPSE_RATIO,
        no_cost_ratio=NO_COST_RATIO,
        sink_threshold=SINK_EPSILON,
        min_ratios=significance.MIN_RATIOS,
    )


def plot(report: dict, path: Path) -> Path:
    """Perplexity relative to the most kept first tokens' against the kept first tokens: one line per
    arm (the geometric mean over seeds, as the eviction measure), every seed a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sinks = report["setup"]["sinks"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for colour, arm in zip(colours(len(report["arms"])), report["arms"]):
        rel = [[p / o for p, o in zip(arm["ppl"][str(k)], arm["ppl"][str(max(sinks))])] for k in sinks]
        ax.plot(sinks, [statistics.geometric_mean(r) for r in rel], "-o", color=colour, label=arm["arm"])
        for k, values in zip(sinks, rel):
            ax.scatter([k] * len(values), values, color=colour, s=10, alpha=0.5)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(sinks)
    ax.set_xlabel(f"first tokens kept in a rolling cache of {report['setup']['cache']}")
    ax.set_ylabel(f"perplexity / with {max(sinks)} kept")
    ax.set_title(f"{report['study']}: streaming past the block", fontsize=10)
    legend_outside(fig, ax)
    return save(fig, path)


def stream_study(
    sweep_dirs: list[Path],
    capacity: int,
    sinks: list[int],
    tokens: int,
    oracle_positions: int,
    sequences: int = 1,
    log=print,
) -> dict:
    runs = [r for r in load_sweeps(sweep_dirs) if r.ok]
    if not runs:
        raise SystemExit(f"attnlab: error: DIR={' '.join(map(str, sweep_dirs))} holds no finished run")
    axes = swept_axes(runs)
    records, source = [], None
    for cell in group_cells(runs, axes):
        arm = ", ".join(f"{v}" for v in cell.axes.values()) or "all"
        if cell.ok_runs and attention_label(cell.ok_runs[0]) not in arm:
            arm += f" ({attention_label(cell.ok_runs[0])})"
        for run in cell.ok_runs:
            log(f"{arm} seed {run.results['config'].get('seed')}: {run.dir}")
            stream = evaluate_run(run, capacity, sinks, tokens, oracle_positions, sequences)
            source = stream.pop("source")
            records.append(
                {
                    "arm": arm,
                    "seed": run.results["config"].get("seed"),
                    "run": shown(run.dir),
                    "val_loss": run.metric("val/loss"),
                    "first_token_weight": first_token_weight(run),
                    "stream": stream,
                }
            )
    study = runs[0].results["config"].get("study", "stream")
    first = records[0]["stream"]
    return {
        "study": study,
        "sweep_dirs": [shown(d) for d in sweep_dirs],
        "axes": axes,
        "setup": {
            "cache": capacity,
            "sinks": sinks,
            "tokens": first["tokens"],
            "sequences": first.get("sequences", 1),
            "source": source,
            "block_size": first["block_size"],
            "oracle_positions": first["oracle"]["positions"],
        },
        "arms": summarise(records, sinks),
        "runs": records,
    }


def write(report: dict, out: Path) -> None:
    """stream.json, then the page and the figure from what it keeps (the measured values at its precision, the
    derived fields rebuilt from them), so that --render gives them again."""
    out.mkdir(parents=True, exist_ok=True)
    report = rerender(json_safe(report, digits=6))
    atomic_write_text(out / "stream.json", json.dumps(json_safe(report, digits=6), indent=1) + "\n")
    plot(report, out / "stream.png")
    atomic_write_text(out / "stream.md", markdown(report))


def rerender(report: dict) -> dict:
    """A stream.json's content with every derived field rebuilt from its measured per-seed values."""
    kept = max(report["setup"]["sinks"])
    return {**report, "arms": [derive(a, kept) for a in report["arms"]]}


def main(argv: list[str] | None = None) -> None:

    parser = command_parser("stream-study", __doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, metavar="SWEEP_DIR", help="the study's sweep dirs")
    parser.add_argument("--cache", type=int, metavar="C", help="rolling cache entries (1..block_size); required")
    parser.add_argument(
        "--sinks", default=DEFAULT_SINKS, metavar="K,K,...", help=f"kept-token counts ({DEFAULT_SINKS})"
    )
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help=f"tokens per run (default {DEFAULT_TOKENS})")
    parser.add_argument(
        "--sequences",
        type=int,
        default=1,
        help="validation sequences of --tokens per run, pooled into each perplexity: each seed's ratio then holds "
        "less of one sequence's noise (default 1)",
    )
    parser.add_argument("--oracle-positions", type=int, default=512, help="at most this many oracle positions")
    parser.add_argument("--out", type=Path, help="output dir (default reports/<study>)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="REPORT_DIR",
        help="decode nothing: rebuild REPORT_DIR's report from its stream.json",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        if args.dirs:
            parser.error("--render takes no SWEEP_DIR; expected --render REPORT_DIR alone")
        if not (args.render / "stream.json").is_file():
            parser.error(f"--render={args.render} holds no stream.json; expected a stream-study report dir")
        write(rerender(json.loads((args.render / "stream.json").read_text())), args.render)
        print(f"rendered {args.render / 'stream.md'}, stream.json, stream.png from {args.render / 'stream.json'}")
        return
    if not args.dirs:
        parser.error("SWEEP_DIR is required; expected one or more sweep dirs (or --render REPORT_DIR)")
    if args.cache is None:
        parser.error("--cache is required; expected a positive integer (rolling cache entries)")
    for flag, value in (
        ("--cache", args.cache),
        ("--tokens", args.tokens),
        ("--sequences", args.sequences),
        ("--threads", args.threads),
    ):
        if value < 1:
            parser.error(f"{flag}={value}; expected a positive integer")
    sinks = parse_sinks(parser, args.sinks, args.cache)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"SWEEP_DIR={missing[0]} is not a directory; expected a sweep dir under logs/train/multiruns")
    import torch

    torch.set_num_threads(args.threads)
    report = stream_study(args.dirs, args.cache, sinks, args.tokens, args.oracle_positions, args.sequences)
    report["setup"]["command"] = "attnlab stream-study <sweep dirs> " + " ".join(
        [f"--cache {args.cache}", f"--sinks {args.sinks}", f"--tokens {args.tokens}"]
        + ([f"--sequences {args.sequences}"] if args.sequences > 1 else [])
    )
    out = args.out or Path("reports") / report["study"]
    write(report, out)
    print(f"wrote {out / 'stream.md'}, stream.json, stream.png")
    for a in report["arms"]:
        e = a["eviction"]
        if e:
            print(
                f"{a['arm']}: PPL(0 kept) / PPL({e['kept']} kept) {e['median']:.3f} (median) over {e['n']} seeds: {e['verdict']}"
            )
