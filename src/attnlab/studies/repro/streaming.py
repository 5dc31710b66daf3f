"""Claim 16: because the first token is where attention parks, streaming inference must keep the
first few KV entries (article B, §4, its closing remark on the attention sink).

Read back from the committed streaming studies (``attnlab stream-study``, reports/<study>/stream.json):
RoPE models trained with softmax, softmax + 1, a learned escape logit and sigmoid attention, decoded
past their block with rolling caches that keep 0..k first tokens. An arm "has a sink" when its
first-token weight (the dormant queries' on the sinks testbed, else the largest layer's) is above
Gu et al.'s 0.3 in most seeds. The claim is graded on the arms with a sink (does dropping the first
tokens cost perplexity in every seed?) and checked against the arms without one (does it cost
nothing there?). No arm with a sink leaves the claim untested; the command that produces each study
is named.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..report.streaming import CHANGE_NATS, pct
from .verdict import UNTESTED, Claim, Finding, Table, depends, fmt, grade

STUDIES = {
    "streaming_bb": (
        "the sinks testbed (one layer, one head, block 64)",
        "make sweep SWEEP=streaming_bb SEEDS=3, then attnlab stream-study <sweep dir> --cache 32 --tokens 1024",
    ),
    "streaming": (
        "text (4 layers, block 256, 500 steps)",
        "make sweep SWEEP=streaming SEEDS=3, then attnlab stream-study <sweep dir> --cache 128",
    ),
}
SINK_THRESHOLD = 0.3  # Gu et al. 2024's sink-head threshold, as in claim 13
CLAIM_16 = "Streaming inference must not drop the first KV entries: the first token is the attention sink"


def _weights(arm: dict) -> list[float]:
    return arm["dormant_first_token_weight"] or arm["first_token_weight"]


def arm_measurements(arm: dict) -> dict:
    weights, cost = _weights(arm), arm["drop_cost"]
    sink = sum(w > SINK_THRESHOLD for w in weights) * 2 > len(weights) if weights else False
    n = cost["n"] if cost else 0
    return {
        "arm": arm["arm"],
        "seeds": n,
        "weights": weights,
        "dormant": bool(arm["dormant_first_token_weight"]),
        "sink": sink,
        "per_seed": cost["per_seed"] if cost else [],
        "raised": cost["raised"] if cost else 0,
        "changed": cost["changed"] if cost else 0,
        "beyond_noise": bool(cost and cost.get("beyond_noise") and cost["mean"] > 0),
        "costs": bool(cost) and n > 0 and (cost["raised"] == n or bool(cost.get("beyond_noise") and cost["mean"] > 0)),
        "kept": cost["kept"] if cost else None,
    }


def streaming_measurements(reports: Path) -> dict:
    """Each committed streaming study's arms, or where a study is missing, the command that writes it."""
    studies, missing = {}, {}
    for study, (setting, command) in STUDIES.items():
        path = Path(reports) / study / "stream.json"
        if not path.is_file():
            missing[study] = command
            continue
        report = json.loads(path.read_text())
        studies[study] = {
            "setting": setting,
            "source": f"reports/{study}/stream.md",
            "cache": report["setup"]["cache"],
            "arms": [arm_measurements(a) for a in report["arms"]],
        }
    return {"studies": studies, "missing": missing, "threshold": SINK_THRESHOLD, "change_nats": CHANGE_NATS}


def _spread(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return pct(lo) if f"{lo:.4f}" == f"{hi:.4f}" else f"{pct(lo)} to {pct(hi)}"


def judge_16(m: dict) -> tuple[str, str, str]:
    """(verdict, reason, detail) from the studies' arms."""
    with_sink = [(s, a) for s, st in m["studies"].items() for a in st["arms"] if a["sink"]]
    without = [(s, a) for s, st in m["studies"].items() for a in st["arms"] if not a["sink"]]
    missing = "; ".join(f"{s}: `{c}`" for s, c in m["missing"].items())
    detail = (
        f"A sink: first-token weight above {m['threshold']} in most seeds. Dropping costs when perplexity with no "
        f"first token kept exceeds that with the most kept by more than {100 * math.expm1(m['change_nats']):.1f} % in "
        "every seed, or the mean over seeds does beyond seed noise."
        + (f" Studies without a report here: {missing}." if missing else "")
    )
    if not with_sink:
        where = "; ".join(m["studies"][s]["setting"] for s in m["studies"]) or "no committed streaming study"
        return (
            UNTESTED,
            f"Not tested here: no arm formed a sink ({where}), so there was no sink to drop"
            + (f"; the missing studies would test it ({missing})." if missing else "."),
            detail,
        )
    costing = [(s, a) for s, a in with_sink if a["costs"]]
    free = [(s, a) for s, a in without if a["changed"] == 0 or not (a["raised"] == a["seeds"] or a["beyond_noise"])]
    if costing and len(costing) < len(with_sink):
        holds = ", ".join(f"{a['arm']} ({m['studies'][s]['setting']})" for s, a in costing)
        fails = ", ".join(f"{a['arm']} ({m['studies'][s]['setting']})" for s, a in with_sink if not a["costs"])
        verdict, reason = depends("Dropping the first KV entries costs perplexity where a sink forms:", holds, fails)
        return verdict, reason, detail
    main = {"where a sink forms, dropping the first KV entries raises perplexity": bool(costing)}
    details = {
        "where no sink forms (softmax + 1, a learned escape logit, sigmoid), dropping them costs nothing": (
            len(free) == len(without)
            if without
            else "needs arms without a sink (experiment=streaming's escape and sigmoid arms)"
        )
    }
    if missing:
        details["both settings measured"] = f"missing: {missing}"
    verdict, reason = grade(main, details)
    return verdict, reason, detail


def finding_16(m: dict) -> Finding:
    """One sentence per study: where a sink forms, what dropping it costs; elsewhere, what it costs."""
    parts, choices, numbers = [], {}, {}
    for study, st in m["studies"].items():
        sink = [a for a in st["arms"] if a["sink"]]
        free = [a for a in st["arms"] if not a["sink"]]
        choices[f"{study}_sink"] = bool(sink)
        if sink:
            a = sink[0]
            choices[f"{study}_costs"] = a["costs"]
            numbers[f"{study}_cost_per_seed"] = a["per_seed"]
            cost = (
                f"evicting the first tokens from a {st['cache']}-entry rolling cache raises perplexity in {a['raised']} of "
                f"{a['seeds']} seeds ({_spread(a['per_seed'])} against {a['kept']} kept)"
                if a["costs"]
                else f"evicting the first tokens from a {st['cache']}-entry rolling cache raises perplexity in only {a['raised']} "
                f"of {a['seeds']} seeds ({_spread(a['per_seed'])})"
            )
            whose = "its dormant queries' weight" if a["dormant"] else "its weight (the largest layer's mean)"
            parts.append(
                f"On {st['setting']}, {a['arm']} puts {fmt(min(a['weights']), 2)}-{fmt(max(a['weights']), 2)} of "
                f"{whose} on the first token, and {cost}"
            )
        else:
            weights = [w for a in st["arms"] for w in a["weights"]]
            parts.append(
                f"On {st['setting']} no arm forms a sink (first-token weight {min(weights):.3f}-"
                f"{max(weights):.3f}, below {SINK_THRESHOLD})"
            )
        if free:
            unchanged = [a for a in free if a["changed"] == 0]
            choices[f"{study}_free_unchanged"] = len(unchanged) == len(free)
            names = ", ".join(a["arm"] for a in free)
            worst = max((abs(d) for a in free for d in a["per_seed"]), default=0.0)
            numbers[f"{study}_free_worst"] = worst
            parts[-1] += (
                f"; in {names} dropping them changes perplexity by under "
                f"{100 * math.expm1(m['change_nats']):.1f} % in every seed."
                if len(unchanged) == len(free)
                else f"; in {names} dropping them changes perplexity by up to {pct(worst)}."
            )
        else:
            parts[-1] += "."
    if not parts:
        return Finding("No streaming study is committed, so nothing was dropped.", {"measured": False})
    return Finding(" ".join(parts), choices, numbers)


def claim_16(reports: Path) -> Claim:
    m = streaming_measurements(reports)
    verdict, reason, detail = judge_16(m)
    tables = [
        Table(
            f"{st['setting']} ({st['source']}): dropping the first tokens from a {st['cache']}-entry rolling cache",
            ["arm", "first-token weight", "a sink", "Δ NLL per seed (0 kept - most kept)", "seeds raised"],
            [
                [
                    a["arm"],
                    f"{fmt(min(a['weights']), 3)}-{fmt(max(a['weights']), 3)}" if a["weights"] else "-",
                    "yes" if a["sink"] else "no",
                    ", ".join(f"{d:+.4f}" for d in a["per_seed"]),
                    f"{a['raised']} of {a['seeds']}",
                ]
                for a in st["arms"]
            ],
        )
        for st in m["studies"].values()
    ]
    return Claim(
        16,
        CLAIM_16,
        {"statement": "streaming inference must not drop the first KV entries", "why": "the first token is the sink"},
        m,
        verdict,
        reason,
        detail,
        tables,
        finding=finding_16(m),
    )
