"""Claim 16: because the first token is where attention parks, streaming inference must keep the
first few KV entries (article B, §4, its closing remark on the attention sink).

Read back from the committed streaming studies (``attnlab stream-study``, reports/<study>/stream.json):
RoPE models trained with softmax, softmax + 1, a learned escape logit and sigmoid attention, decoded
past their block with rolling caches that keep 0..k first tokens. An arm "has a sink" when its
first-token weight (the dormant queries' on the sinks testbed, else the largest layer's) is above
Gu et al.'s 0.3 in most seeds. Where an arm has one, evicting the first tokens must raise the mean
NLL beyond seed noise: the study's one-sample test of the per-seed differences (mean, 95 % interval,
Holm p) decides it, not the count of seeds that rose.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .verdict import DETAIL, Check, Claim, Table, fmt, span

STUDIES = {
    "streaming_bb": (
        "the sinks testbed with RoPE (one layer, one head, block 64)",
        "make sweep SWEEP=streaming_bb SEEDS=3, then attnlab stream-study <sweep dir> --cache 32 --tokens 1024",
    ),
    "streaming": (
        "text with RoPE (4 layers, block 256, 500 steps)",
        "make sweep SWEEP=streaming SEEDS=3, then attnlab stream-study <sweep dir> --cache 128",
    ),
}
SINK_THRESHOLD = 0.3  # Gu et al. 2024's sink-head threshold, as in claim 13
CHANGE_NATS = 1e-3  # the stream study's smallest change of mean NLL it counts (0.1 % perplexity)
CLAIM_16 = "Streaming inference must not drop the first KV entries: the first token is the attention sink"
COSTS = "evicting the first tokens raises mean NLL (0 kept - most kept; 95 % interval of the mean over seeds)"
FREE = f"without a sink, evicting them changes mean NLL by less than {CHANGE_NATS} nats (95 % interval)"


def arm_measurements(arm: dict) -> dict:
    weights = arm["dormant_first_token_weight"] or arm["first_token_weight"]
    cost = arm["drop_cost"] or {}
    return {
        "arm": arm["arm"],
        "weights": weights,
        "dormant": bool(arm["dormant_first_token_weight"]),
        "sink": bool(weights) and 2 * sum(w > SINK_THRESHOLD for w in weights) > len(weights),
        **{k: cost.get(k) for k in ("kept", "per_seed", "raised", "n", "mean", "ci", "p_holm")},
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
    return {"studies": studies, "missing": missing}


def _test(a: dict) -> dict:
    return {"mean": a["mean"], "ci95": a["ci"], "p_holm": a["p_holm"], "seeds raised": f"{a['raised']} of {a['n']}"}


def _interval(a: dict) -> tuple[float, float] | None:
    """The arm's 95 % interval of the mean change; a point where the seeds agree exactly (no spread, no interval)."""
    if a["mean"] is None:
        return None
    lo, hi = a["ci"] or (math.nan, math.nan)
    return (a["mean"], a["mean"]) if math.isnan(lo) or math.isnan(hi) else (lo, hi)


def _costs(a: dict) -> bool | None:
    """Evicting costs: the interval lies above 0 (True), below the smallest change counted (False), else None."""
    ci = _interval(a)
    return None if ci is None else True if ci[0] > 0 else False if ci[1] < CHANGE_NATS else None


def checks_16(m: dict) -> list[Check]:
    """Per study: each arm with a sink, does evicting the first tokens cost (its interval above 0; across 0:
    untested); each arm without one, does it cost nothing (a detail). A study with no sink, or missing, leaves
    the claim untested there."""
    # fmt: off
    checks = []
    for st in m["studies"].values():
        sinks = [a for a in st["arms"] if a["sink"]]
        checks += [Check(COSTS, _test(a), f"interval above 0 (wholly below {CHANGE_NATS}: no cost)", _costs(a),
                         condition=f"{st['setting']}: {a['arm']}", needs="more seeds: the interval spans 0") for a in sinks]
        if not sinks:
            top = max((w for a in st["arms"] for w in a["weights"]), default=None)
            checks.append(Check(COSTS, {"largest first-token weight": top}, f"a sink (> {SINK_THRESHOLD})", None,
                                condition=st["setting"], needs="an arm in which a sink forms"))
        for a in st["arms"]:
            if not a["sink"] and (ci := _interval(a)) is not None:
                inside, outside = -CHANGE_NATS < ci[0] and ci[1] < CHANGE_NATS, ci[0] > CHANGE_NATS or ci[1] < -CHANGE_NATS
                checks.append(Check(FREE, _test(a), f"interval within +-{CHANGE_NATS}", True if inside else False if outside else None,
                                    DETAIL, f"{st['setting']}: {a['arm']}", needs="more seeds: the interval is wider than the band"))
    for study, command in m["missing"].items():
        checks.append(Check(COSTS, "-", "a committed study", None, condition=STUDIES[study][0], needs=f"`{command}`"))
    return checks
    # fmt: on


def _row(a: dict) -> list:
    test = f"{a['mean']:+.4f} [{a['ci'][0]:+.4f}, {a['ci'][1]:+.4f}]" if a["mean"] is not None else "-"
    deltas = ", ".join(f"{d:+.4f}" for d in a["per_seed"] or [])
    return [a["arm"], span(a["weights"]), "yes" if a["sink"] else "no", deltas, test, fmt(a["p_holm"], 2)]


def claim_16(reports: Path) -> Claim:
    m = streaming_measurements(reports)
    tables = [
        Table(
            f"{st['setting']} ({st['source']}): dropping the first tokens from a {st['cache']}-entry rolling cache",
            "arm | first-token weight | a sink | Δ NLL per seed (0 kept - most kept) | mean Δ NLL [95 % interval] | Holm p",
            [_row(a) for a in st["arms"]],
            note=f"First-token weight: the dormant queries' on the testbed, else the largest layer's mean; a sink: above "
            f"{SINK_THRESHOLD} in most seeds. Holm p over the study's arms (its own report).",
        )
        for st in m["studies"].values()
    ]
    return Claim(
        16,
        CLAIM_16,
        {"statement": "streaming inference must not drop the first KV entries", "why": "the first token is the sink"},
        m,
        checks_16(m),
        tables,
        method="Read from the committed streaming studies' reports (`attnlab stream-study`).",
    )
