"""The README's findings block, rendered from the committed reports so that no result there is typed by hand.

Each finding reads one report's data, recomputes its test with ``attnlab.util.significance`` and hands the
template a verdict with the numbers behind it; the template only prints them. A difference whose Holm p is
not below alpha reads "no difference beyond seed noise" with the smallest difference its seeds could detect.

    python -m attnlab.studies.findings --check   # exit 1 when README.md differs from a fresh render
    python -m attnlab.studies.findings --write   # rewrite the block between the markers
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from attnlab.analysis.phase import PHASE_LEVEL
from attnlab.attention.stats import SINK_EPSILON, is_sink
from attnlab.studies.report.data import axes_of, read_runs
from attnlab.studies.report.provenance import one_experiment
from attnlab.studies.stream_study import COLLAPSE_RATIO, NO_COST, NO_COST_RATIO, eviction
from attnlab.util import significance
from attnlab.writing import markdown
from attnlab.writing.pages import TEMPLATES, VERDICTS, short

ROOT = Path(__file__).resolve().parents[3]
# the committed files the block reads, relative to reports/
INPUTS = (
    "dk_scaling/summary.json",
    "induction_heads/summary.json",
    "sinks_bb/summary.json",
    "sinks_bb_gate/summary.json",
    "streaming_bb/summary.json",
    "streaming_bb/stream.json",
    "streaming/stream.json",
    "lr_sensitivity/summary.json",
    "lr_sensitivity/runs.csv",
    "kv_frontier/summary.json",
    "kv_frontier/plan.json",
    "repro/repro.json",
)


# ---------------------------------------------------------------- reading
class ReportMissing(Exception):
    """A committed report, or a key in it, that the findings read is not there."""


def _json(reports: Path, rel: str):
    path = reports / rel
    if not path.is_file():
        raise ReportMissing(f"{path} is missing; the findings read {', '.join(INPUTS)} under {reports}")
    return json.loads(path.read_text(encoding="utf-8"))


def dk_scaling(reports: Path) -> dict:
    """Removing the scale (none minus inv_sqrt_d) in each d_k x init_std cell: the report's own Welch tests
    and Holm family (summary.json's contrasts, which are inv_sqrt_d minus none), read with the sign flipped."""
    summary = _json(reports, "dk_scaling/summary.json")
    flipped = {"higher": "lowers", "lower": "raises", "none": "none", "untested": "untested"}
    rows = []
    for c in summary["contrasts"]["val/loss"]:
        at = dict(part.split("=", 1) for part in c["where"].split(", "))
        row = {"init_std": at["init_std"], "d_k": int(at["d_k"]), "verdict": flipped[c["verdict"]]}
        if c.get("ci95") is not None:
            lo, hi = c["ci95"]
            row |= {"diff": -c["diff"], "lo": -hi, "hi": -lo, "p": c["p_holm"], "detectable": c["detectable"]}
            row["n"] = min(c["n"])
        rows.append(row)
    rows.sort(key=lambda r: (r["init_std"], r["d_k"]))
    inits = sorted({r["init_std"] for r in rows}, key=lambda s: s != "fan_in")
    return {
        "by_init": [(i, _by_verdict([r for r in rows if r["init_std"] == i])) for i in inits],
        "seeds": sorted({c["n"] for c in summary["cells_ci95"]}),
        "tests": len(rows),
    }


def _by_verdict(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Rows grouped by verdict, in the order a reader wants them: effects first, then no difference."""
    order = ("raises", "lowers", "none", "untested")
    return [(v, [r for r in rows if r["verdict"] == v]) for v in order if any(r["verdict"] == v for r in rows)]


def induction_heads(reports: Path) -> dict:
    """Seeds whose copying crosses the phase-change level, per cell, with a Wilson interval."""
    summary = _json(reports, "induction_heads/summary.json")
    rows = []
    for cell in summary["phase_change_steps"]:
        steps = [s for s in cell["steps"] if s is not None]
        n_layer = int(cell["axes"]["model.n_layer"])
        scaled = cell["axes"]["model.attention.scaling"] != "none"
        lo, hi = significance.wilson(len(steps), len(cell["steps"]))
        rows.append(
            {
                "cell": f"{n_layer} layer{'s' if n_layer > 1 else ''}" + ("" if scaled else " without the scale"),
                "k": len(steps),
                "n": len(cell["steps"]),
                "lo": lo,
                "hi": hi,
                "median_step": statistics.median(steps) if steps else None,
                "order": (-n_layer, not scaled),
            }
        )
    rows.sort(key=lambda r: r["order"])
    return {
        "level": PHASE_LEVEL,
        "seeds": sorted({r["n"] for r in rows}),
        "formed": [r for r in rows if r["k"]],
        "none": [r for r in rows if not r["k"]],
    }


def _arm_label(axes: dict) -> str:
    """A cell's name from the axes that differ from plain softmax with AdamW."""
    if axes.get("experiment") == "sinks_bb_sgd":
        return "SGD"
    parts = [f"{short(k)}={v}" for k, v in axes.items() if k != "experiment" and v not in ("-", "none", "baseline")]
    return ", ".join(p.removeprefix("variant=") for p in parts) or "softmax"


# normalised entropy at or above which a layer's attention is uniform: it reads nothing, so whether a sink
# forms is not asked of it
UNIFORM = 0.99


def _sink_arms(reports: Path, study: str, label: str | None = None) -> list[dict]:
    """Per arm: the seeds whose dormant queries put at least the sink threshold on the first token; an arm
    whose attention stays uniform in every seed, or whose models do not clear the attention-free level,
    is untested (its attention does nothing for a sink to form in)."""
    summary = _json(reports, f"{study}/summary.json")
    level = (summary.get("attention_free_level") or {}).get("bigram")
    arms = []
    for cell in summary["per_seed"]:
        metrics = [r["metrics"] for r in cell["runs"]]
        weights = [m["attn/L0/sink_mass_dormant"] for m in metrics]
        uniform = all(m.get("attn/L0/entropy_norm", 0.0) >= UNIFORM for m in metrics)
        unused = level is not None and all(m.get("val/loss", level) >= level for m in metrics)
        arms.append(
            {
                "arm": label or _arm_label(cell["axes"]),
                "k": sum(is_sink(w) for w in weights),
                "n": len(weights),
                "max": max(weights),
                "untested": "uniform attention" if uniform else "above the attention-free level" if unused else None,
            }
        )
    return sorted(arms, key=lambda a: (a["arm"] != "softmax", -a["k"], a["arm"]))


def sinks(reports: Path) -> dict:
    learned = _sink_arms(reports, "sinks_bb") + _sink_arms(reports, "sinks_bb_gate", "per-head output gate")
    return {"threshold": SINK_EPSILON, "learned_pos": learned, "rope": _sink_arms(reports, "streaming_bb")}


def streaming(reports: Path, study: str) -> dict:
    """What evicting the first tokens costs, per arm: PPL(0 kept) / PPL(most kept) over seeds and its verdict,
    by the stream report's own measure (``report.streaming.eviction``); arms split by whether a sink formed."""
    data = _json(reports, f"{study}/stream.json")
    rows = []
    for arm in data["arms"]:
        per_seed = arm["drop_cost"]["per_seed"]
        weights = arm["dormant_first_token_weight"] or arm["first_token_weight"]
        total = sum(abs(x) for x in per_seed)
        e = eviction(per_seed)
        rows.append(
            {
                "arm": arm["arm"].split(" (", 1)[-1].rstrip(")"),
                "ratios": e["ratio"],
                "median": e["median"],
                "lo": e["ci"][0] if e["ci"] else None,
                "hi": e["ci"][1] if e["ci"] else None,
                "verdict": e["verdict"],
                # one seed carries the mean when it holds more than the others together
                "one_seed_carries": len(per_seed) > 2 and total > 0 and max(abs(x) for x in per_seed) > total / 2,
                "sink_seeds": sum(is_sink(w) for w in weights),
                # the queries that need no attention, where an evicted sink's weight goes (stream.md's table)
                "dormant": ((arm.get("eviction") or {}).get("by_class") or {}).get("dormant"),
            }
        )
    rest = [r for r in rows if not r["sink_seeds"]]
    return {
        "setup": data["setup"],
        "kept": max(data["setup"]["sinks"]),
        "sink": [r for r in rows if r["sink_seeds"]],
        "rest": rest,
        "rest_no_cost": [r for r in rest if r["verdict"] == NO_COST],
    }


def lr_sensitivity(reports: Path) -> dict:
    """qk-norm's effect on the LR sensitivity at each size (with minus without) and its change across sizes,
    as the report tested them (summary.json's contrasts and interactions)."""
    summary = _json(reports, "lr_sensitivity/summary.json")
    arms = summary["lr_sensitivity"]["arms"]
    words = {
        "lower": "lowers",
        "higher": "raises",
        "none": "none",
        "untested": "untested",
        "smaller": "lowers",
        "larger": "raises",
    }

    def row(c: dict, setting: str) -> dict:
        # the report's budget rule included: a reference arm above the attention-free level leaves it untested
        if c.get("ci95") is None or c["verdict"] == "untested":
            return {"setting": setting, "verdict": "untested", "why": c.get("untested_because")}
        lo, hi = c["ci95"]
        n = min(c["n"]) if "n" in c else None
        return {
            "setting": setting,
            "verdict": words[c["verdict"]],
            "diff": c["diff"],
            "lo": lo,
            "hi": hi,
            "p": c["p_holm"],
            "detectable": c["detectable"],
            "n": n,
        }

    rows = [row(c, c["where"].split(",")[0].removeprefix("model=")) for c in summary["contrasts"]["lr_sensitivity"]]
    crossed = [x for x in summary["interactions"] if x["metric"] == "lr_sensitivity"]

    runs = read_runs(reports / "lr_sensitivity" / "runs.csv")
    runs, _ = one_experiment(runs, axes_of(runs), "lr_sensitivity/runs.csv")  # the rows the report pools
    logits = runs.filter(regex=r"^attn/L\d+/max_logit$")

    def largest_logit(qk_norm: bool) -> float:
        """The largest max logit any pooled run logged in any layer, at any rate and size."""
        chosen = runs["model.attention.qk_norm"].astype(str) == str(qk_norm)
        values = logits[chosen & (runs["status"] == "ok")].to_numpy(float)
        return float(np.nanmax(values[np.isfinite(values)]))

    return {
        "groups": _by_verdict(rows),
        "tests": len(rows),
        "rates": len(arms[0]["loss"]),
        "seeds": sorted({a["seeds"] for a in arms}),
        "interaction": row(crossed[0], "size") if crossed else None,
        "across": f"{crossed[0]['first']} to {crossed[0]['last']}" if crossed else "",
        "max_logit_without": largest_logit(False),
        "max_logit_with": largest_logit(True),
    }


def repro(reports: Path) -> dict:
    claims = _json(reports, "repro/repro.json")["claims"]
    counts = Counter(c["verdict"] for c in claims)
    unknown = set(counts) - set(VERDICTS)
    if unknown:
        raise ValueError(f"repro.json: verdict {sorted(unknown)} is not one of {list(VERDICTS)}")
    return {"claims": len(claims), "tally": [(v, counts[v]) for v in VERDICTS if counts[v]]}


def kv_frontier(reports: Path) -> dict:
    """Each way of shrinking the KV cache against multi-head attention on recall, as the onset study reads it:
    per arm, k of n runs that learned the lookup within the budget, its cache bytes, and the log-rank verdict
    against multi-head attention (summary.json's ``learning``, Holm over the arms)."""
    learning = _json(reports, "kv_frontier/summary.json")["learning"]
    arms = {a["axes"][learning["axis"]]: a for a in learning["arms"]}
    comparisons = learning["comparisons"]
    reference = comparisons[0]["reference"]
    rows = [
        {
            "arm": c["level"],
            "k": c["k"][1],
            "n": c["n"][1],
            "bytes": arms[c["level"]]["kv_bytes_per_token"],
            "verdict": c["verdict"],
        }
        for c in comparisons
    ]
    ref = arms[reference]
    return {
        "rows": sorted(rows, key=lambda r: -r["bytes"]),
        "reference": reference,
        "reference_k": ref["k"],
        "reference_n": ref["n"],
        "reference_bytes": ref["kv_bytes_per_token"],
        "cap": max(a["cap"] for a in arms.values()),  # the budget: the last step any run was followed to
    }


def findings(reports: Path = ROOT / "reports") -> dict:
    return {
        "kv": kv_frontier(reports),
        "dk": dk_scaling(reports),
        "induction": induction_heads(reports),
        "sinks": sinks(reports),
        "stream_bb": streaming(reports, "streaming_bb"),
        "stream_text": streaming(reports, "streaming"),
        "lr": lr_sensitivity(reports),
        "repro": repro(reports),
        "alpha": significance.ALPHA,
    }


# ---------------------------------------------------------------- rendering
def render(reports: Path = ROOT / "reports") -> str:
    """The block, from templates/findings.md.j2."""
    return TEMPLATES.get_template("findings.md.j2").render(
        no_cost_pct=round((NO_COST_RATIO - 1) * 100),
        collapse_ratio=f"{COLLAPSE_RATIO:g}",
        **findings(reports),
    )


def splice(readme: str, block: str) -> str:
    """README text with the block between the markers replaced."""
    return markdown.splice(readme, "findings", block, "README.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.studies.findings", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when README.md differs from a fresh render")
    mode.add_argument("--write", action="store_true", help="rewrite README.md's findings block")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--reports", type=Path, default=ROOT / "reports")
    args = parser.parse_args(argv)
    current = args.readme.read_text(encoding="utf-8")
    try:
        fresh = splice(current, render(args.reports))
    except KeyError as err:
        print(f"attnlab findings: error: a report under {args.reports} lacks the key {err}", file=sys.stderr)
        return 2
    except ReportMissing as err:
        print(f"attnlab findings: error: {err}", file=sys.stderr)
        return 2
    if args.write:
        if fresh != current:
            args.readme.write_text(fresh, encoding="utf-8")
        return 0
    if fresh != current:
        print(
            f"{args.readme}: the findings block differs from a render of {args.reports}; run --write", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
