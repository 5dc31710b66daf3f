"""A streaming study's table: every run of a sweep decoded past its block with rolling KV caches.

    attnlab stream-study SWEEP_DIR [SWEEP_DIR ...] --cache C [--sinks 0,1,2,4] [--tokens N] [--out DIR]

Each finished run's last checkpoint goes through ``stream.stream_report`` on the same tokens (its
validation split, or one long validation sequence of a task): perplexity with the first k tokens
kept in a rolling cache of C entries, the recomputed window (the oracle) and dense attention within
the block; beside them the run's first-token weight from its own statistics. Per arm (a cell of the
sweep's axes) the cost of dropping the first tokens is the per-seed difference in mean NLL between
0 kept tokens and the most kept, a one-sample t-test over seeds, Holm-corrected over the arms: the
small-scale version of StreamingLLM's Table 3 (Xiao et al. 2023). Writes
``<out>/stream.{md,json,png}`` (default out: reports/<study>).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ...cli import command_parser
from ...results import atomic_write_text, json_safe
from ..stats import ALPHA, holm, one_sample
from .aggregate import RunResult, group_cells, load_sweeps, swept_axes

DEFAULT_TOKENS = 2048


def shown(path) -> str:
    """A run or sweep dir as the report names it: from its logs/ folder on, wherever the checkout is."""
    parts = Path(path).parts
    return str(Path(*parts[parts.index("logs") :])) if "logs" in parts else str(path)


# a seed "changes" when dropping moves its mean NLL by more than this (0.1 % perplexity): the same
# model on the same tokens is deterministic, so below it is rounding, above it the model's own response
CHANGE_NATS = 1e-3


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


def evaluate_run(run: RunResult, capacity: int, sinks: list[int], tokens: int, oracle_positions: int) -> dict:
    """One run's stream report (stream.stream_report) on its own validation tokens, kept in the run
    dir beside its checkpoint: a study evaluated while its sweep runs redoes only the new runs."""
    from ...checkpointing import load_model
    from ...stream import run_tokens, stream_report

    ckpt = run.dir / "checkpoints" / "last.ckpt"
    saved = run.dir / f"stream_c{capacity}_k{'-'.join(map(str, sinks))}_n{tokens}_o{oracle_positions}.json"
    if saved.is_file() and saved.stat().st_mtime >= ckpt.stat().st_mtime:
        return json.loads(saved.read_text())
    module = load_model(ckpt)[0].eval()
    ids, source = run_tokens(run.dir, module, ckpt, None, tokens)
    report = {"source": source, **stream_report(module.model, ids, capacity, sinks, oracle_positions)}
    atomic_write_text(saved, json.dumps(report))
    return report


def summarise(records: list[dict], sinks: list[int]) -> list[dict]:
    """Per arm: the perplexities over seeds, the first-token weight, and the cost of dropping the
    first tokens (0 kept against the most kept), tested over seeds and Holm-corrected over arms."""
    arms: dict[str, list[dict]] = {}
    for r in records:
        arms.setdefault(r["arm"], []).append(r)
    kept = max(sinks)
    out = []
    for arm, rs in arms.items():
        ppl = {k: [r["stream"]["rolling"][sinks.index(k)]["ppl"] for r in rs] for k in sinks}
        diffs = [math.log(a) - math.log(b) for a, b in zip(ppl[0], ppl[kept])] if 0 in sinks and kept else []
        weights = [r["first_token_weight"]["max_layer"] for r in rs if r["first_token_weight"]["max_layer"] is not None]
        dormant = [r["first_token_weight"]["dormant"] for r in rs if r["first_token_weight"]["dormant"] is not None]
        out.append(
            {
                "arm": arm,
                "seeds": sorted(r["seed"] for r in rs),
                "val_loss": [r["val_loss"] for r in rs],
                "first_token_weight": weights,
                "dormant_first_token_weight": dormant,
                "ppl": {str(k): v for k, v in ppl.items()},
                "oracle": [r["stream"]["oracle"]["ppl"] for r in rs],
                "dense": [r["stream"]["dense"]["ppl"] for r in rs],
                "drop_cost": {
                    "kept": kept,
                    "per_seed": diffs,
                    "raised": sum(d > CHANGE_NATS for d in diffs),
                    "changed": sum(abs(d) > CHANGE_NATS for d in diffs),
                    **_one_sample(diffs),
                }
                if diffs
                else None,
            }
        )
    adjusted = holm([a["drop_cost"]["p"] if a["drop_cost"] else None for a in out])
    for a, p in zip(out, adjusted):
        if a["drop_cost"]:
            a["drop_cost"]["p_holm"] = p
            a["drop_cost"]["beyond_noise"] = p is not None and p < ALPHA
    return out


def _one_sample(diffs: list[float]) -> dict:
    """The mean per-seed difference with its 95 % t interval, p against 0 and detectable size (scipy's
    ttest_1samp); no p where there is no spread to test (one seed, or every seed the same)."""
    test, mean = one_sample(diffs), statistics.fmean(diffs)
    if test is None or statistics.stdev(diffs) == 0:
        return {"mean": mean, "ci": [mean, mean], "p": None, "n": len(diffs)}
    return {"mean": test.diff, "ci": [test.lo, test.hi], "p": test.p, "n": len(diffs), "detectable": test.detectable}


def pct(nats: float) -> str:
    """A change in mean NLL as the change in perplexity it makes, signed: "+0.8 %"."""
    return f"{100 * math.expm1(nats):+.1f} %"


def _range(values: list[float], digits: int = 3) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f}-{hi:.{digits}f}"


def drop_sentence(arm: dict) -> str:
    """What dropping the first tokens does to this arm's perplexity: the t-test over seeds where it
    finds an effect, else what each seed did (all within rounding, all raised, or mixed)."""
    c = arm["drop_cost"]
    if c is None:
        return f"{arm['arm']}: no kept-token count to compare against none."
    n, kept = c["n"], f"{c['kept']} kept"
    seeds = ", ".join(pct(d) for d in c["per_seed"])
    if c.get("beyond_noise"):
        verb = "raises" if c["mean"] > 0 else "lowers"
        return (
            f"{arm['arm']}: dropping every first token {verb} perplexity by {pct(c['mean'])} against {kept} "
            f"(95 % interval {pct(c['ci'][0])} to {pct(c['ci'][1])}, Holm p = {c['p_holm']:.2g}; per seed {seeds})."
        )
    if c["changed"] == 0:
        return (
            f"{arm['arm']}: dropping every first token changes perplexity by less than "
            f"{100 * math.expm1(CHANGE_NATS):.1f} % against {kept} in every seed ({n} of {n})."
        )
    p = "untested" if c.get("p_holm") is None else f"Holm p = {c['p_holm']:.2g}"
    if c["raised"] == n:
        return (
            f"{arm['arm']}: dropping every first token raises perplexity in {n} of {n} seeds against {kept} "
            f"({seeds}), too unevenly for the mean to stand beyond seed noise ({p})."
        )
    return (
        f"{arm['arm']}: dropping every first token makes no difference beyond seed noise against {kept} "
        f"({c['raised']} of {n} seeds raise it; per seed {seeds}; {p})."
    )


def markdown(report: dict) -> str:
    s = report["setup"]
    sinks = s["sinks"]
    lines = [
        f"# {report['study']}: decoding past the block with rolling KV caches",
        "",
        f"Runs: {', '.join(report['sweep_dirs'])} ({len(report['runs'])} runs, seeds "
        f"{_range([float(x) for a in report['arms'] for x in a['seeds']], 0)} per arm). Each run's last checkpoint "
        f"decodes {s['source']} ({s['tokens']} tokens) one token at a time through a rolling cache of {s['cache']} "
        f"entries that keeps the first k tokens and the most recent {s['cache']} - k (`attnlab stream`); the oracle is "
        f"the window of the last {s['cache']} tokens recomputed at {s['oracle_positions']} positions, dense is the "
        f"text cut into block-long windows. Perplexity = exp(mean NLL of the next token). Generated by "
        f"`{s['command']}`.",
        "",
        "## Findings",
        "",
        *[f"- {drop_sentence(a)}" for a in report["arms"]],
        "",
        "## Perplexity per arm (range over seeds)",
        "",
        "| arm | first-token weight | "
        + " | ".join(f"{k} kept" for k in sinks)
        + " | oracle | dense | dropping: Δ NLL per seed | mean (95 % interval) | Holm p |",
        "|---|---:|" + "---:|" * len(sinks) + "---:|---:|---:|---:|---:|",
    ]
    for a in report["arms"]:
        c = a["drop_cost"]
        weight = _range(a["dormant_first_token_weight"] or a["first_token_weight"])
        per_seed = "-" if c is None else ", ".join(f"{d:+.4f}" for d in c["per_seed"])
        cost = "-" if c is None else f"{c['mean']:+.4f} ({c['ci'][0]:+.4f} to {c['ci'][1]:+.4f})"
        p = "-" if c is None or c.get("p_holm") is None else f"{c['p_holm']:.2g}"
        lines.append(
            f"| {a['arm']} | {weight} | "
            + " | ".join(_range(a["ppl"][str(k)]) for k in sinks)
            + f" | {_range(a['oracle'])} | {_range(a['dense'])} | {per_seed} | {cost} | {p} |"
        )
    lines += [
        "",
        "First-token weight: the dormant queries' mean weight on the first token where the task has them (the sinks "
        "testbed), else the largest layer's mean over queries; a sink head is above 0.3 (Gu et al. 2024). Δ NLL: mean "
        f"NLL with 0 first tokens kept minus with {max(sinks)}, per seed (nats per token), then a one-sample t-test "
        "over seeds, Holm-corrected over the arms. The oracle is evaluated on a subset of positions; its perplexity "
        "is over those positions only.",
        "",
        "![perplexity against kept first tokens](stream.png)",
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> Path:
    """Perplexity relative to the most kept first tokens' against the kept first tokens: one line per
    arm (the mean over seeds), every seed a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import _legend_outside, _save, colours

    sinks = report["setup"]["sinks"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for colour, arm in zip(colours(len(report["arms"])), report["arms"]):
        rel = [[p / o for p, o in zip(arm["ppl"][str(k)], arm["ppl"][str(max(sinks))])] for k in sinks]
        ax.plot(sinks, [statistics.fmean(r) for r in rel], "-o", color=colour, label=arm["arm"])
        for k, values in zip(sinks, rel):
            ax.scatter([k] * len(values), values, color=colour, s=10, alpha=0.5)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(sinks)
    ax.set_xlabel(f"first tokens kept in a rolling cache of {report['setup']['cache']}")
    ax.set_ylabel(f"perplexity / with {max(sinks)} kept")
    ax.set_title(f"{report['study']}: streaming past the block", fontsize=10)
    _legend_outside(fig, ax)
    return _save(fig, path)


def stream_study(
    sweep_dirs: list[Path], capacity: int, sinks: list[int], tokens: int, oracle_positions: int, log=print
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
            stream = evaluate_run(run, capacity, sinks, tokens, oracle_positions)
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
            "source": source,
            "block_size": first["block_size"],
            "oracle_positions": first["oracle"]["positions"],
        },
        "arms": summarise(records, sinks),
        "runs": records,
    }


def main(argv: list[str] | None = None) -> None:
    from ...stream import DEFAULT_SINKS, parse_sinks

    parser = command_parser("stream-study", __doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="SWEEP_DIR", help="the study's sweep dirs")
    parser.add_argument("--cache", type=int, required=True, metavar="C", help="rolling cache entries (1..block_size)")
    parser.add_argument(
        "--sinks", default=DEFAULT_SINKS, metavar="K,K,...", help=f"kept-token counts ({DEFAULT_SINKS})"
    )
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help=f"tokens per run (default {DEFAULT_TOKENS})")
    parser.add_argument("--oracle-positions", type=int, default=512, help="at most this many oracle positions")
    parser.add_argument("--out", type=Path, help="output dir (default reports/<study>)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    for flag, value in (("--cache", args.cache), ("--tokens", args.tokens), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag}={value}; expected a positive integer")
    sinks = parse_sinks(parser, args.sinks, args.cache)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"SWEEP_DIR={missing[0]} is not a directory; expected a sweep dir under logs/train/multiruns")
    import torch

    torch.set_num_threads(args.threads)
    report = stream_study(args.dirs, args.cache, sinks, args.tokens, args.oracle_positions)
    report["setup"]["command"] = "attnlab stream-study <sweep dirs> " + " ".join(
        [f"--cache {args.cache}", f"--sinks {args.sinks}", f"--tokens {args.tokens}"]
    )
    out = args.out or Path("reports") / report["study"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "stream.json", json.dumps(json_safe(report, digits=6), indent=1) + "\n")
    plot(report, out / "stream.png")
    atomic_write_text(out / "stream.md", markdown(report))
    print(f"wrote {out / 'stream.md'}, stream.json, stream.png")
    for a in report["arms"]:
        print(drop_sentence(a))
