"""Claim 16: because the first token is where attention parks, streaming inference must keep the
first few KV entries (article B, §4, its closing remark on the attention sink).

Read back from the committed streaming studies (``attnlab stream-study``, reports/<study>/stream.json):
RoPE models trained with softmax, softmax + 1, a learned escape logit and sigmoid attention, decoded
past their block with rolling caches that keep 0..k first tokens. An arm "has a sink" when its
first-token weight (the dormant queries' on the sinks testbed, else the largest layer's) is above
Gu et al.'s 0.3 in most seeds. The study's eviction verdict decides (StreamingLLM's PPL(0 kept) /
PPL(4 kept) per seed, read as skewed ratios): for an arm with a sink, the main check is that evicting
costs perplexity (a cost or a collapse over at least three seeds; no cost or a gain fails it), and a
detail is that the cost is a collapse (the ratio's interval at or above 2), StreamingLLM's magnitude.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.attention.stats import SINK_EPSILON, is_sink
from attnlab.repro.verdict import DETAIL, KEPT_DIGITS, Check, Claim, Table
from attnlab.studies.stream_study import COLLAPSE, COLLAPSE_RATIO, COST, GAIN, NO_COST, NO_COST_RATIO
from attnlab.util.files import json_safe
from attnlab.writing.pages import fmt, span

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
MIN_SEEDS = 3  # a collapse over fewer seeds is not yet evidence
CLAIM_16 = "Streaming inference must not drop the first KV entries: the first token is the attention sink"
COSTS = (
    "with a sink, evicting the first tokens costs perplexity (PPL(0 kept) / PPL(most kept), the sign test over seeds)"
)
COLLAPSES = "the cost is a collapse: perplexity at least doubles (the ratio's 95 % interval)"
FREE = "without a sink, evicting them costs nothing (the ratio's interval within 1 %)"


def arm_measurements(arm: dict) -> dict:
    weights = arm["dormant_first_token_weight"] or arm["first_token_weight"]
    return {
        "arm": arm["arm"],
        "weights": weights,
        "dormant": bool(arm["dormant_first_token_weight"]),
        "sink": bool(weights) and 2 * sum(is_sink(w) for w in weights) > len(weights),
        "eviction": arm["eviction"],
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
    e = a["eviction"] or {}
    return {k: e.get(k) for k in ("ratio", "median", "ci", "n", "p_sign", "verdict")}


def _costs(a: dict) -> bool | None:
    """A sink arm, the main check: evicting the first tokens costs perplexity (a cost or a collapse over enough
    seeds) holds; no cost, or a gain, fails; anything else is untested."""
    e = a["eviction"] or {}
    if e.get("verdict") in (COST, COLLAPSE) and e["n"] >= MIN_SEEDS:
        return True
    return False if e.get("verdict") in (NO_COST, GAIN) else None


def _collapses(a: dict) -> bool | None:
    """A sink arm, the detail: the cost is StreamingLLM's collapse (the interval at or above COLLAPSE_RATIO);
    a cost whose interval lies below it is a smaller cost than the source's."""
    e = a["eviction"] or {}
    if e.get("verdict") == COLLAPSE and e["n"] >= MIN_SEEDS:
        return True
    if e.get("verdict") in (COST, NO_COST, GAIN) and e["n"] >= MIN_SEEDS and e["ci"] and e["ci"][1] < COLLAPSE_RATIO:
        return False
    return None


def _free(a: dict) -> bool | None:
    """An arm without a sink: no cost agrees with the claim's reason, collapse does not."""
    verdict = (a["eviction"] or {}).get("verdict")
    return True if verdict == NO_COST else False if verdict == COLLAPSE else None


def checks_16(m: dict) -> list[Check]:
    """Per study: each arm with a sink, does evicting the first tokens collapse perplexity; each arm without
    one, does it cost nothing (a detail). A study with no sink, or missing, leaves the claim untested there."""
    checks = []
    for st in m["studies"].values():
        sinks = [a for a in st["arms"] if a["sink"]]
        for a in sinks:
            checks.append(
                Check(
                    "sink-eviction-costs",
                    COSTS,
                    _test(a),
                    f"a {COST} or {COLLAPSE} over >= {MIN_SEEDS} seeds ({NO_COST} or a gain: fails)",
                    _costs(a),
                    condition=f"{st['setting']}: {a['arm']}",
                    needs=f"a {COST}, {COLLAPSE} or {NO_COST} verdict over >= {MIN_SEEDS} seeds",
                )
            )
            checks.append(
                Check(
                    "sink-eviction-collapses",
                    COLLAPSES,
                    _test(a),
                    f"an interval at or above {COLLAPSE_RATIO:g} over >= {MIN_SEEDS} seeds",
                    _collapses(a),
                    DETAIL,
                    f"{st['setting']}: {a['arm']}",
                    needs=f"an interval that lies above or below {COLLAPSE_RATIO:g} over >= {MIN_SEEDS} seeds",
                )
            )
        if not sinks:
            top = max((w for a in st["arms"] for w in a["weights"]), default=None)
            checks.append(
                Check(
                    "sink-eviction-costs",
                    COSTS,
                    {"largest first-token weight": top},
                    f"a sink (> {SINK_EPSILON})",
                    None,
                    condition=st["setting"],
                    needs="an arm in which a sink forms",
                )
            )
        checks += [
            Check(
                "no-sink-no-cost",
                FREE,
                _test(a),
                NO_COST,
                _free(a),
                DETAIL,
                f"{st['setting']}: {a['arm']}",
                needs=f"a {NO_COST} verdict (more seeds, or seeds that agree)",
            )
            for a in st["arms"]
            if not a["sink"] and a["eviction"]
        ]
    for study, command in m["missing"].items():
        checks.append(
            Check(
                "sink-eviction-costs",
                COSTS,
                "-",
                "a committed study",
                None,
                condition=STUDIES[study][0],
                needs=f"`{command}`",
            )
        )
    return checks


def _row(a: dict) -> list:
    e = a["eviction"]
    if not e:
        return [a["arm"], span(a["weights"]), "yes" if a["sink"] else "no", "-", "-", "-"]
    ci = f" [{fmt(e['ci'][0], 3)}, {fmt(e['ci'][1], 3)}]" if e["ci"] else ""
    ratios = ", ".join(fmt(r, 3) for r in e["ratio"])
    return [a["arm"], span(a["weights"]), "yes" if a["sink"] else "no", ratios, fmt(e["median"], 3) + ci, e["verdict"]]


def claim_16(reports: Path) -> Claim:
    m = json_safe(streaming_measurements(reports), digits=KEPT_DIGITS)  # judged on the values repro.json keeps
    tables = [
        Table(
            f"{st['setting']} ({st['source']}): evicting the first tokens from a {st['cache']}-entry rolling cache",
            "arm | first-token weight | a sink | PPL(0 kept) / PPL(most kept) per seed | median [95 % bootstrap interval] "
            "| verdict",
            [_row(a) for a in st["arms"]],
            note=f"First-token weight: the dormant queries' on the testbed, else the largest layer's mean; a sink: above "
            f"{SINK_EPSILON} in most seeds. Verdict: the study's own ({COLLAPSE}: the interval's lower bound >= "
            f"{COLLAPSE_RATIO:g}; {NO_COST}: the interval within [1/{NO_COST_RATIO:g}, {NO_COST_RATIO:g}]).",
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
