"""Every figure README.md's "Headline findings" and docs/{results,studies,metrics}.md quote is what a committed
report file says.

Each checked text has a list of fragments, each built here from the report file it cites (reports/*/summary.json,
ablation.csv, reports/bench/*.json, reports/repro/repro.json) with the project's own formatting helpers. The test
asserts that every fragment appears in its text, and that every decimal number of the text lies inside one of
them: a figure with no file behind it, or one that drifted from its file, fails. Integers are mostly settings and
counts; those that state a result (repeats, k of n seeds, steps of a phase change) are inside fragments too.
Constants the code defines (thresholds, the uniform sink level) come from the code, not from this file.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from functools import cache
from pathlib import Path

import pytest

from attnlab.analysis.heads import THRESHOLDS
from attnlab.analysis.phase import PHASE_LEVEL
from attnlab.attention.stats import uniform_sink_mass
from attnlab.studies.report import head_type_text
from attnlab.studies.report.numbers import mean_pm_std
from attnlab.studies.report.significance import ALPHA, _p, _p_clause, k_of_n_text
from attnlab.studies.report.tables import read_csv
from attnlab.studies.repro import judge
from attnlab.studies.repro.report import tally
from attnlab.tools.bench.endtoend import TARGET_RATIO as E2E_TARGET
from attnlab.tools.bench.report import e2e_pairs, outside_the_steps
from attnlab.tools.bench.timing import against_target

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
MiB = 2**20


# ---------------------------------------------------------------- reading the reports
@cache
def summary(study: str) -> dict:
    return json.loads((REPORTS / study / "summary.json").read_text())


@cache
def cells(study: str) -> list[dict]:
    header, rows = read_csv((REPORTS / study / "ablation.csv").read_text())
    return [dict(zip(header, r)) for r in rows]


def _axis(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def cell(study: str, **axes) -> dict:
    """The ablation.csv row whose axes read as given (keys: the last name of the axis)."""
    match = [
        c
        for c in cells(study)
        if all(_axis(c[next(k for k in c if k.rsplit(".", 1)[-1] == a)]) == str(v) for a, v in axes.items())
    ]
    assert len(match) == 1, (study, axes, len(match))
    return match[0]


def ms(study: str, key: str, **axes) -> str:
    """A cell's mean ± std as the study's table prints it."""
    c = cell(study, **axes)
    return mean_pm_std(c[f"{key}_mean"], c[f"{key}_std"], int(c["n_ok"]))


def per_layer(study: str, stat: str, layers: int, digits: int = 2, **axes) -> str:
    """A per-layer column as the table prints it (means over seeds, L0 / L1 / ...)."""
    from attnlab.studies.report.numbers import plain

    c = cell(study, **axes)
    return " / ".join(plain(c[f"attn/L{i}/{stat}_mean"], digits) for i in range(layers))


def layer_means(study: str, template: str, layers: int, **axes) -> list[float]:
    c = cell(study, **axes)
    return [c[f"{template.format(i=i)}_mean"] for i in range(layers)]


def pair(study: str, where: str) -> dict:
    return next(p for p in summary(study)["scaled_vs_unscaled"] if p["where"] == where)


@cache
def bench() -> dict:
    return json.loads((REPORTS / "bench" / "bench.json").read_text())


def kernel(backend: str, t: int) -> dict:
    return next(k for k in bench()["kernels"] if k["backend"] == backend and k["T"] == t)


@cache
def repro() -> dict:
    return {r["id"]: r for r in json.loads((REPORTS / "repro" / "repro.json").read_text())}


def f(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def span(values, digits: int, sep: str = "–") -> str:
    lo, hi = f(min(values), digits), f(max(values), digits)
    return lo if lo == hi else f"{lo}{sep}{hi}"


def pct(x: float) -> str:
    return f"{x:.0%}"


# ---------------------------------------------------------------- shared figures
def dk_figures() -> dict[str, str]:
    pairs = summary("dk_scaling")["scaled_vs_unscaled"]
    beyond = sum(p["beyond_noise"] for p in pairs)
    raw = sum(p["p"] < ALPHA for p in pairs)
    out = {
        "holm": f"{beyond} of {len(pairs)} pairs differ beyond seed noise after the Holm correction ({raw} at raw p < {ALPHA})"
    }
    for d in (32, 64, 128):
        out[f"fanin{d}"] = f(-pair("dk_scaling", f"d_k={d}, init_std=fan_in")["diff"], 2)
    out["fanin128_means"] = (
        f"{ms('dk_scaling', 'val/loss', d_k=128, scaling='none', init_std='fan_in')} vs "
        f"{ms('dk_scaling', 'val/loss', d_k=128, scaling='inv_sqrt_d', init_std='fan_in')}"
    )
    p16 = pair("dk_scaling", "d_k=16, init_std=fan_in")
    out["fanin16"] = f"p = {p16['p']:.2g}, Holm {p16['p_holm']:.2g}"
    small = [pair("dk_scaling", f"d_k={d}, init_std=0.02") for d in (16, 32)]
    out["small_better"] = span([p["diff"] for p in small], 3)
    p64 = pair("dk_scaling", "d_k=64, init_std=0.02")
    out["small64"] = f"{p64['diff']:.3f} at d_k 64 (raw p = {p64['p']:.2g}, Holm {p64['p_holm']:.2g})"
    out["small128"] = f(-pair("dk_scaling", "d_k=128, init_std=0.02")["diff"], 3)
    unscaled = [c for c in cells("dk_scaling") if c["model.attention.scaling"] == "none"]
    out["max_logit"] = f"{max(c[f'attn/L{i}/max_logit_mean'] for c in unscaled for i in range(4)):.0f}"
    out["max_prob"] = f(max(c[f"attn/L{i}/max_prob_mean"] for c in unscaled for i in range(4)), 2)
    study = repro()[8]["measured"]["judged"]
    level = study["level"]["bigram"]
    out["bigram"] = f(level, 3)
    shares = {
        c["d_k"]: judge.gain_share(c["unscaled"]["mean"], c["scaled"]["mean"], level)
        for c in study["study"]["cells"]
        if c["init_std"] == "fan_in"
    }
    out["shares"] = f"{pct(shares[64])} and {pct(shares[128])} of the scaled runs' gain"
    return out


def induction_figures() -> dict[str, str]:
    steps = next(
        c["steps"]
        for c in summary("induction_heads")["phase_change_steps"]
        if c["axes"] == {"model.n_layer": "2", "model.attention.scaling": "inv_sqrt_d"}
    )
    reached = sorted(s for s in steps if s is not None)
    two = summary("induction_heads")["head_types"]
    l1 = next(c for c in two if c["axes"] == {"model.n_layer": "2", "model.attention.scaling": "inv_sqrt_d"})["layers"][
        1
    ]
    formed = sum(n > 0 for n in l1["induction"])
    sink = next(c for c in two if c["axes"] == {"model.n_layer": "2", "model.attention.scaling": "none"})["layers"][1]
    nothing = [
        c
        for c in summary("induction_heads")["phase_change_steps"]
        if c["axes"]["model.n_layer"] == "1" or c["axes"]["model.attention.scaling"] == "none"
    ]
    assert all(s is None for c in nothing for s in c["steps"])
    return {
        "formed": k_of_n_text(formed, len(l1["induction"])),
        "phase": f"step {statistics.median(reached):g} (median; {reached[0]}–{reached[-1]})",
        "phase_seeds": k_of_n_text(len(reached), len(steps)),
        "nothing": k_of_n_text(0, len(nothing[0]["steps"])),
        "level": f"{PHASE_LEVEL}",
        "sink_seeds": f"{sum(n > 0 for n in sink['sink'])} of {len(sink['sink'])} seeds",
        "knockout": ms("induction_heads", "heads/L1/induction_knockout_all_heads", n_layer=2, scaling="inv_sqrt_d"),
        "induction_score": ms("induction_heads", "heads/L1/induction_max", n_layer=2, scaling="inv_sqrt_d"),
        "control": ms("induction_heads", "heads/induction_control_max", n_layer=2, scaling="inv_sqrt_d"),
        "l1_types": head_type_text(l1),
    }


def sinks_figures() -> dict[str, str]:
    s = summary("sinks")
    best = max(c[f"heads/L{i}/sink_max_mean"] for c in cells("sinks") for i in range(4))
    bos = next(e for e in s["pooled_effects"] if e["axis"] == "data.bos")
    l0 = [cell("sinks", bos=b, sink="none")["attn/L0/sink_mass_mean"] for b in ("False", "True")]
    escape = [
        c[f"attn/L{i}/escape_mass_mean"]
        for c in cells("sinks")
        if c["model.attention.sink"] != "none"
        for i in range(4)
    ]
    block = 128  # the sinks study's block size (conf/experiment/sinks.yaml), checked below
    from attnlab.config import compose_config

    assert int(compose_config(["experiment=sinks"]).model.block_size) == block
    return {
        "runs": f"{s['runs']} runs",
        "best": f(best, 3),
        "threshold": f"{judge.SINK_THRESHOLD}",
        "bos": f"{bos['diff']:+.3f} nats (p = {bos['p']:.2g}, Holm {bos['p_holm']:.2g})",
        "l0": f"{f(l0[0], 3)} → {f(l0[1], 3)}",
        "uniform": f(uniform_sink_mass(block), 3),
        "escape": span(escape, 2),
    }


def bb_arm_runs(escape: str, experiment: str = "sinks_bb", normalize: str = "-") -> list[dict]:
    """Every seed's run of one sinks_bb arm, from reports/sinks_bb/summary.json's per-seed values."""
    from attnlab.studies.repro.studies import escape_axis

    return next(
        c["runs"]
        for c in summary("sinks_bb")["per_seed"]
        if c["axes"][escape_axis(c["axes"])] == escape
        and c["axes"]["experiment"] == experiment
        and c["axes"].get("model.attention.normalize", "-") == normalize
    )


def sinks_testbed_figures() -> dict[str, str]:
    """The sinks testbed's figures, from the per-seed values in reports/sinks_bb/summary.json."""

    def arm(escape: str, experiment: str = "sinks_bb", normalize: str = "-") -> dict[str, list[float]]:
        runs = bb_arm_runs(escape, experiment, normalize)
        return {
            k: [r["metrics"][f"attn/L0/{k}"] for r in runs if f"attn/L0/{k}" in r["metrics"]]
            for k in ("sink_mass_dormant", "value_drain", "escape_mass", "row_mass")
        }

    base, zero, learned, sigmoid = arm("none"), arm("zero_logit"), arm("learned"), arm("none", normalize="sigmoid")
    formed = lambda a: sum(x > judge.SINK_THRESHOLD for x in a["sink_mass_dormant"])  # noqa: E731
    n = len(base["sink_mass_dormant"])
    return {
        "base": f"{span(base['sink_mass_dormant'], 3)} of their weight on `<bos>` in {k_of_n_text(formed(base), n)}",
        "drain": f"{span(base['value_drain'], 3)} of the others' norm",
        "slots": f"{formed(zero)} of {n} and {formed(learned)} of {n} seeds (first-token weight {span(zero['sink_mass_dormant'], 3)} "
        f"with softmax + 1, {span(learned['sink_mass_dormant'], 3)} with a learned logit)",
        "escape": f"the slot takes {span(zero['escape_mass'] + learned['escape_mass'], 3)}",
        "sigmoid": f"in {formed(sigmoid)} of {len(sigmoid['sink_mass_dormant'])} seeds (first-token weight at most "
        f"{max(sigmoid['sink_mass_dormant']):.0e}, a row's total weight {span(sigmoid['row_mass'], 2)})",
    }


def gqa_figures() -> dict[str, str]:
    """The grouped-query study: KV-cache bytes per token at n_kv_head 4 and 1, and multi-head vs
    multi-query pooled over the scaling axis, its wording chosen by the test's outcome."""
    effect = next(e for e in summary("gqa")["pooled_effects"] if e["axis"] == "model.n_kv_head" and e["level"] == "4")
    kv = {n: cell("gqa", n_kv_head=n, scaling="none")["mem/kv_cache_bytes_per_token_mean"] for n in (4, 1)}
    verdict = "beyond seed noise" if effect["beyond_noise"] else "no difference beyond seed noise"
    return {
        "kv": f"from {kv[4]:.0f} to {kv[1]:.0f} bytes per token",
        "loss": f"differs by {effect['diff']:+.3f} ({_p_clause(effect['p'])}, Holm {_p(effect['p_holm'])}): {verdict}",
        "seeds": f"**{summary('gqa')['seeds_per_cell']} seeds**",
    }


def e2e_verdict(ranges: dict[str, list[float]], repeats: int) -> str:
    """Each arm against the target, read with the pairs' spread: met when every pair is within it,
    missed when none is, and otherwise not resolved by these repeats (a median on either side of
    the target within that spread is no finding)."""
    states = {arm: against_target(*r, E2E_TARGET) for arm, r in ranges.items()}
    words = {
        "met": "within the target in every pair",
        "missed": "over the target in every pair",
        "open": f"not resolved by {repeats} pairs",
    }
    return "; ".join(f"{arm} {words[st]}" for arm, st in states.items())


ARM_WORDS = {
    "defaults": "the defaults",
    "sdpa": "`attention=sdpa`",
    "sdpa_no_callbacks": "`attention=sdpa callbacks=none`, the stack alone",
}


def e2e_rows() -> dict[str, dict]:
    return {r["arm"]: r for r in bench()["e2e"]["rows"]}


def e2e_figures() -> dict[str, str]:
    rows = e2e_rows()
    d = rows["defaults"]
    return {
        "ratio": f"**{d['wall_ratio']:.3f}** ({span(d['wall_ratio_range'], 2)} over {bench()['e2e']['repeats']} alternated repeats",
        "sdpa": f"{rows['sdpa']['wall_ratio']:.3f} with `attention=sdpa`",
        "val_loss": f(d["val_loss"]["attnlab"][0], 4),
    }


def performance_figures() -> dict[str, str]:
    """docs/performance.md's tables, row by row, from reports/bench/."""
    out: dict[str, str] = {}
    for t in (256, 1024, 4096, 8192):
        ex, fu = kernel("naive", t), kernel("sdpa", t)
        out[f"kernel{t}"] = (
            f"| {t} | {ms_time(ex['fwd_bwd_ms'])} | {ms_time(fu['fwd_bwd_ms'])} | {mib(ex['peak_bytes'])} | "
            f"{mib(fu['peak_bytes'])} |"
        )
    exp = bench()["memory_exponent"]
    out["exponent"] = f"T^{exp['naive']:.2f} explicit, T^{exp['sdpa']:.2f} fused"
    out["kernel_repeats"] = f"median of {bench()['kernel_setup']['repeats']} repeats"
    for t in bench()["train"]:
        out[f"train_{t['backend']}"] = (
            f"| {t['backend']} | {t['lightning_tokens_per_s']:.0f} | {t['ratio']:.3f} ({span(t['ratio_range'], 3)}) | "
            f"{t['ratio_to_scaled']:.3f} ({span(t['ratio_to_scaled_range'], 3)}) |"
        )
    out["train_repeats"] = f"{bench()['train'][0]['setup']['repeats']} repeats"
    cb = bench()["callbacks"]
    out["cb"] = (
        f"default callbacks over none **{cb['overhead_ratio']:.3f}** ({span(cb['overhead_ratio_range'], 3)}), over the plain "
        f"loop {cb['ratio_to_plain']:.3f} ({span(cb['ratio_to_plain_range'], 3)})"
    )
    out["cb_setup"] = f"{cb['measured_steps']} steps, {cb['repeats']} repeats"
    hooks = cb["hook_ms_per_step"]
    out["cb_hooks"] = f"{sum(hooks.values()):.1f} ms a step in all"
    out["cb_step"] = f"{cb['step_ms_with']:.0f} ms step"
    rows = e2e_rows()
    for arm in ("defaults", "sdpa", "sdpa_no_callbacks"):
        r = rows[arm]
        out[f"e2e_{arm}"] = (
            f"| {r['attnlab_wall_s']:.1f} | {r['plain_wall_s']:.1f} | **{r['wall_ratio']:.3f}** ({span(r['wall_ratio_range'], 3)}) | "
            f"{r['step_ratio']:.3f} | {outside_the_steps(r, 'attnlab'):.1f} / {outside_the_steps(r, 'plain'):.1f} |"
        )
    out["e2e_repeats"] = f"{bench()['e2e']['repeats']} alternated pairs per arm"
    out["e2e_target"] = f"Against the target of {E2E_TARGET:.2f}"
    out["e2e_verdict"] = e2e_verdict(
        {arm: rows[arm]["wall_ratio_range"] for arm in ("defaults", "sdpa", "sdpa_no_callbacks")},
        bench()["e2e"]["repeats"],
    )
    for line in e2e_pairs(bench()["e2e"]):
        out[f"e2e_pairs_{line.split(':')[0][2:]}"] = line
    out["e2e_loss"] = f"val loss {f(rows['defaults']['val_loss']['attnlab'][0], 4)}"
    lo = min(r["step_ratio_range"][0] for r in rows.values())
    hi = max(r["step_ratio_range"][1] for r in rows.values())
    than = "more" if hi - lo > E2E_TARGET - 1 else "less"
    out["e2e_step_span"] = f"single pairs' step ratios span {lo:.2f}–{hi:.2f}, {than} than the target's margin"
    within = {r["wall_ratio"] <= E2E_TARGET for r in rows.values()}
    out["e2e_sides"] = (
        "The medians fall on both sides of the target"
        if len(within) == 2
        else f"The medians are all {'within' if True in within else 'over'} the target"
    )
    gaps = {arm: outside_the_steps(r, "attnlab") - outside_the_steps(r, "plain") for arm, r in rows.items()}
    out["e2e_outside_gap"] = ", ".join(f"{gap:.1f} s ({ARM_WORDS[arm]})" for arm, gap in gaps.items())
    gap = json.loads((REPORTS / "bench" / "breakdown.json").read_text())
    out["gap_wall"] = f"**{gap['wall_s']:.1f} s**"
    for group, seconds in ((g, x) for g, x in gap["groups"].items() if x >= 0.05):
        out[f"gap_{group}"] = f"| {group} | {seconds:.1f} | {100 * seconds / gap['wall_s']:.1f} % |"
    lc = bench()["longctx"]
    for r in lc["rows"]:
        if r.get("error"):
            continue
        out[f"longctx{r['T']}"] = (
            f"| {r['T']} | {r['wall_ratio']:.3f} ({span(r['wall_ratio_range'], 2)}) | {r['ratio_verdict']} | "
            f"{r['end_s']:.2f} | {100 * r['end_share']:.1f} % ({span([100 * x for x in r['end_share_range']], 1)}) | "
            f"{r['end_verdict']} |"
        )
    out["longctx_header"] = f"| ≤ {lc['targets']['wall_ratio']:.2f}× |"
    out["longctx_pairs"] = f"{min(r['repeats'] for r in lc['rows'])} alternated pairs per T"
    out["longctx_targets"] = (
        f"at most {lc['targets']['wall_ratio']:.2f}× `callbacks=none`, end-of-run work at most {100 * lc['targets']['end_share']:.0f} %"
    )
    return out


def verdict_counts(rows: list[dict], key: str, within: str) -> str:
    """How many rows met a target in every pair, how many are unresolved, how many missed it in
    every pair (bench.timing.against_target): the first count always, the others when not zero."""
    count = {v: sum(r[key] == v for r in rows) for v in ("met", "open", "missed")}
    text = f"{count['met']} of {len(rows)} {within} in every pair"
    if count["open"]:
        text += f", {count['open']} unresolved"
    if count["missed"]:
        text += f", {count['missed']} over in every pair"
    return text


def longctx_figures() -> dict[str, str]:
    """The long-context bench (bench.json's longctx) and the same section before the statistics were
    bounded (reports/bench/longctx_before.json): the wall ratios over T, and the verdict's count."""
    now = bench()["longctx"]
    before = json.loads((REPORTS / "bench" / "longctx_before.json").read_text())
    rows = [r for r in now["rows"] if not r.get("error")]
    ratio = {r["T"]: r["wall_ratio"] for r in rows}
    worst_before = max(before["rows"], key=lambda r: r["wall_ratio"])
    share_target = f"within {100 * now['targets']['end_share']:.0f} %"
    return {
        "ratios": ", ".join(f"{ratio[t]:.3f} at T = {t}" for t in sorted(ratio)),
        "end": (
            f"end-of-run work {min(r['end_s'] for r in rows):.1f}-{max(r['end_s'] for r in rows):.1f} s, "
            f"{100 * min(r['end_share'] for r in rows):.1f}-{100 * max(r['end_share'] for r in rows):.1f} % of the run "
            f"({verdict_counts(rows, 'end_verdict', share_target)})"
        ),
        "before": f"from {worst_before['wall_ratio']:.2f} at T = {worst_before['T']}",
        "met": "block sizes: " + verdict_counts(rows, "ratio_verdict", f"within {now['targets']['wall_ratio']:.2f}×"),
        "pairs": f"{min(r['repeats'] for r in rows)} alternated pairs",
        "spread": (
            f"single pairs {min(r['wall_ratio_range'][0] for r in rows):.2f}-"
            f"{max(r['wall_ratio_range'][1] for r in rows):.2f}"
        ),
    }


def memory_figures() -> dict[str, str]:
    return {
        "peak": f"{kernel('naive', 4096)['peak_bytes'] / MiB:.0f} MiB explicit vs {kernel('sdpa', 4096)['peak_bytes'] / MiB:.0f} MiB fused"
    }


def repro_tally() -> str:
    return tally([r["verdict"] for r in repro().values()])


# ---------------------------------------------------------------- the texts and their fragments
def readme_findings() -> str:
    """README.md's findings, whitespace collapsed so that a sentence may wrap anywhere."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Findings")
    end = text.index("\n## ", start + 1)
    return re.sub(r"\s+", " ", text[start:end])


def readme_claims() -> dict[str, str]:
    """Each README finding's sentence, its numbers and its words both chosen by the report it links:
    a comparison that no longer holds in the report changes the expected sentence, and the test fails."""
    out: dict[str, str] = {}
    fan = [pair("dk_scaling", f"d_k={d}, init_std=fan_in") for d in (32, 64, 128)]
    small = [pair("dk_scaling", f"d_k={d}, init_std=0.02") for d in (16, 32, 64, 128)]
    if all(p["beyond_noise"] and p["diff"] < 0 for p in fan):
        out["dk_title"] = "The 1/√d_k scale matters when q and k start with unit variance."
    out["dk_fan"] = (
        "Removing it raises the val loss by "
        + ", ".join(f(-p["diff"], 2) for p in fan[:-1])
        + f" and {f(-fan[-1]['diff'], 2)} nats at d_k 32, 64 and 128 with `init_std=fan_in`"
    )
    either = "either way" if min(p["diff"] for p in small) < 0 < max(p["diff"] for p in small) else "in one direction"
    out["dk_small"] = (
        f"with the default init it changes the loss by {max(abs(p['diff']) for p in small):.3f} nats or less {either}"
    )

    ind = induction_figures()
    out["induction"] = (
        f"in {ind['formed']} of a two-layer attention-only model, and in {ind['nothing']} with one layer or without the scale"
    )

    bb = sinks_testbed_counts()
    n = bb["n"]
    escape = (
        f"in {bb['zero_logit']} of {n} seeds with either escape slot"
        if bb["zero_logit"] == bb["learned"]
        else f"in {bb['zero_logit']} and {bb['learned']} of {n} seeds with the two escape slots"
    )
    gate = [r["metrics"]["attn/L0/sink_mass_dormant"] for c in summary("sinks_bb_gate")["per_seed"] for r in c["runs"]]
    gated = sum(x > judge.SINK_THRESHOLD for x in gate)
    out["sinks_bb"] = (
        f"the first token takes over {judge.SINK_THRESHOLD} of the weight of those queries (a sink) in "
        f"{bb['softmax']} of {n} seeds with softmax, {escape}, in {gated} of {len(gate)} seeds with a "
        f"per-head output gate and in {bb['sigmoid']} of {n} seeds with sigmoid attention"
    )
    if bb["softmax"] == n and bb["sigmoid"] == 0 and gated == 0:
        out["sinks_bb_title"] = (
            "A sink forms where most queries need no attention; sigmoid attention or an output gate prevents it"
        )
    best = max(c[f"heads/L{i}/sink_max_mean"] for c in cells("sinks") for i in range(4))
    out["sinks_text"] = "in Shakespeare at this budget " + (
        "no head becomes a sink" if best < judge.SINK_THRESHOLD else "a head becomes a sink"
    )

    out.update(streaming_claims())
    out.update(lr_claims())
    out["repro"] = f"of the {len(repro())} claims `make repro` checks, {repro_tally()}"
    return out


def streaming_claims() -> dict[str, str]:
    """The streaming finding: what evicting the first tokens costs on the testbed, where softmax
    forms a sink, against the arms that form none, and on text; each clause chosen by the reports."""
    from attnlab.studies.repro.streaming import streaming_measurements

    m = streaming_measurements(REPORTS)
    bb, text = m["studies"]["streaming_bb"], m["studies"]["streaming"]
    base = next(a for a in bb["arms"] if a["arm"].startswith("baseline"))
    free = [a for a in bb["arms"] if not a["sink"]]
    pct = sorted(100 * math.expm1(d) for d in base["per_seed"])
    out = {
        "stream_bb": (
            f"a {bb['cache']}-entry rolling cache that evicts them "
            + ("raises" if base["costs"] else "does not reliably raise")
            + f" softmax's perplexity in {base['raised']} of {base['seeds']} seeds (+{pct[0]:.1f} % to +{pct[-1]:.1f} %)"
        )
    }
    if free and all(a["changed"] == 0 for a in free):
        out["stream_bb_free"] = (
            "changes it by under 0.1 % in every seed with softmax + 1, a learned escape logit or sigmoid "
            "attention, which form no sink"
        )
    sinks = [a for a in text["arms"] if a["sink"]]
    unchanged = all(a["changed"] == 0 for a in text["arms"])
    out["stream_text"] = (
        f"on text at block 256 {'no arm forms a sink' if not sinks else f'{len(sinks)} arms form a sink'} and "
        + (
            "dropping changes perplexity by under 0.1 % in every seed of every arm"
            if unchanged
            else "dropping changes it"
        )
    )
    if base["costs"] and len(free) == len(bb["arms"]) - 1 and all(a["changed"] == 0 for a in free):
        out["stream_title"] = (
            "Evicting the first tokens from a streaming KV cache costs perplexity only where a sink formed"
        )
    return out


def lr_claims() -> dict[str, str]:
    """The LR-sensitivity finding: how far the attention logits grow with and without qk-norm, whether qk-norm
    changes the sensitivity beyond the seed spread, and where the proxies end against the attention-free level."""
    from attnlab.studies.report.numbers import plain

    s = summary("lr_sensitivity")
    lr = s["lr_sensitivity"]

    def peak(qk: str) -> float:
        return max(
            v
            for a in lr["arms"]
            if a["arm"].endswith(f"qk_norm={qk}")
            for layers in a["max_logit"].values()
            for v in layers or []
            if v is not None
        )

    qk = lr["qk_norm"]
    lowered = [f for f in qk if f["beyond_spread"] and f["difference"] > 0]
    sizes = list(dict.fromkeys(a["size"] for a in lr["arms"]))
    where = {f["size"] for f in lowered}
    at = "at the largest proxy only" if where == {sizes[-1]} else f"at {len(where)} of {len(sizes)} sizes"
    diffs = sorted(f["difference"] for f in lowered)
    out = {
        "lr_logits": (
            f"the largest attention logit reaches {plain(peak('False'))} without qk-norm and {plain(peak('True'))} "
            "with it"
        ),
        "lr_sensitivity": (
            f"qk-norm lowers the LR sensitivity beyond the seed-to-seed spread in {len(lowered)} of {len(qk)} size "
            f"and scaling settings, {at}" + (f" (by {diffs[0]:.3f} to {diffs[-1]:.3f})" if diffs else "")
        ),
    }
    bigram = s["attention_free_level"]["bigram"]
    above = all(a["best_loss"] > bigram for a in lr["arms"])
    out["lr_level"] = (
        f"after 300 steps every proxy still ends {'above' if above else 'below'} the attention-free (bigram) level"
    )
    if lowered and where == {sizes[-1]} and peak("False") > 10 * peak("True"):
        out["lr_title"] = "qk-norm's benefit to the learning-rate sensitivity appears with size, as in Wortsman et al."
    return out


def readme_fragments() -> list[str]:
    return list(readme_claims().values())


def readme_make_train() -> str:
    """README.md's paragraph on what `make train` costs, whitespace collapsed."""
    text = (ROOT / "README.md").read_text()
    start = text.index("`make train` installs once")
    return re.sub(r"\s+", " ", text[start : text.index("It prints", start)])


def readme_make_train_fragments() -> list[str]:
    """make train's time and its ratio to the plain loop, from the end-to-end bench's default arm; the
    words on the ratio and on the steps chosen by whether their pairs' range holds 1."""
    d = e2e_rows()["defaults"]
    lo, hi = d["attnlab_wall_range"]
    rlo, rhi = d["wall_ratio_range"]

    def reading(low: float, high: float, same: str) -> str:
        return same if low <= 1 <= high else ("faster in every pair" if high < 1 else "slower in every pair")

    return [
        f"about {round(d['attnlab_wall_s'] / 60)} minutes on 2 cores ({lo:.0f}-{hi:.0f} s in the end-to-end "
        f"benchmark's {bench()['e2e']['repeats']} runs)",
        f"the median pair {d['wall_ratio']:.2f} times a plain PyTorch loop doing the same training with every "
        f"measurement on (pairs {rlo:.2f}-{rhi:.2f}: {reading(rlo, rhi, 'no difference these pairs resolve')})",
        f"the steps themselves {reading(*d['step_ratio_range'], 'at the same speed')}",
    ]


def sinks_testbed_counts() -> dict[str, int]:
    """Seeds of each sinks_bb arm whose dormant queries put more than the sink threshold on `<bos>`."""

    def formed(escape: str, normalize: str = "-") -> tuple[int, int]:
        runs = bb_arm_runs(escape, normalize=normalize)
        mass = [r["metrics"]["attn/L0/sink_mass_dormant"] for r in runs]
        return sum(x > judge.SINK_THRESHOLD for x in mass), len(mass)

    (softmax, n), (zero, _), (learned, _), (sigmoid, _) = (
        formed("none"),
        formed("zero_logit"),
        formed("learned"),
        formed("none", "sigmoid"),
    )
    return {"n": n, "softmax": softmax, "zero_logit": zero, "learned": learned, "sigmoid": sigmoid}


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def studies_fragments() -> list[str]:
    rows = []
    for study in (
        "dk_scaling",
        "sinks_scaling_qk_norm",
        "sinks",
        "mqar",
        "induction_heads",
        "induction_backends",
        "sinks_bb",
        "sinks_bb_gate",
        "sinks_bb_window",
        "variants",
        "lr_sensitivity",
    ):
        s = summary(study)
        seeds = s.get("seeds_per_cell") or (
            str(s["runs"] // s["cells"]) if s["runs"] % s["cells"] == 0 else "?"
        )  # older summaries
        rows.append(f"`reports/{study}/` | {s['runs']} / {s['cells']} | {seeds} |")
    return rows + lr_sentences()


def lr_sentences() -> list[str]:
    """What docs/studies.md quotes of the LR study: the report's own sentences, one list item each."""
    return [f"- {sentence}" for sentence in summary("lr_sensitivity")["lr_sensitivity"]["sentences"]]


def metrics_fragments() -> list[str]:
    t = THRESHOLDS
    return [
        f"induction − control ≥ {t['induction']}",
        f"previous_token ≥ {t['previous_token']}",
        f"sink ≥ {t['sink']}",
        f"entropy_norm ≥ {t['uniform']}",
        f"positional ≥ {t['positional']}",
    ]


def ms_time(ms_: float) -> str:
    """A kernel time as the benchmark table prints it."""
    return f"{ms_:.1f} ms" if ms_ < 10 else f"{ms_:.0f} ms" if ms_ < 1000 else f"{ms_ / 1000:.1f} s"


def mib(b: float) -> str:
    return f"{b / MiB:.1f}" if b < 10 * MiB else f"{b / MiB:.0f}"


def results_figures() -> dict[str, str]:
    """Every figure docs/results.md quotes, by name, from the report it cites."""
    from attnlab.config import compose_config

    out: dict[str, str] = {}
    tiny_block = int(compose_config([]).model.block_size)
    # unscaled vs scaled over training: the default model's cells of dk_scaling (d_k 32, init 0.02)
    for sc in ("none", "inv_sqrt_d"):
        for stat, digits in (("entropy_norm", 2), ("max_logit", 2), ("sink_mass", 2)):
            out[f"d32_{sc}_{stat}"] = per_layer("dk_scaling", stat, 4, digits, d_k=32, scaling=sc, init_std="0.02")
    out["uniform_tiny"] = f(uniform_sink_mass(tiny_block), 3)
    # make train and the backends' throughput (bench.json)
    e2e = e2e_figures()
    out["e2e_val_loss"] = e2e["val_loss"]
    train = {t["backend"]: t for t in bench()["train"]}
    out["to_scaled"] = ", ".join(f"{b} {train[b]['ratio_to_scaled']:.3f}" for b in ("naive", "sdpa", "flash"))
    out["to_scaled_range"] = span([x for b in ("naive", "sdpa", "flash") for x in train[b]["ratio_to_scaled_range"]], 2)
    out["to_plain"] = ", ".join(f"{b} {train[b]['ratio']:.3f}" for b in ("naive", "scaled", "sdpa", "flash"))
    out["train_repeats"] = f"median of {train['scaled']['setup']['repeats']} repeats"
    # the main ablation
    dk = dk_figures()
    out.update({f"dk_{k}": v for k, v in dk.items() if k not in ("shares", "small_better", "small128")})
    small = [pair("dk_scaling", f"d_k={d}, init_std=0.02") for d in (16, 32)]
    out["dk_small_diffs"] = ", ".join(f"{p['diff']:+.3f}" for p in small)
    out["dk_128_002"] = (
        f"{ms('dk_scaling', 'val/loss', d_k=128, scaling='none', init_std='0.02')} unscaled vs "
        f"{ms('dk_scaling', 'val/loss', d_k=128, scaling='inv_sqrt_d', init_std='0.02')} scaled"
    )
    ent = [
        statistics.fmean(layer_means("dk_scaling", "attn/L{i}/entropy_norm", 4, d_k=d, scaling="none", init_std="0.02"))
        for d in (16, 32, 64, 128)
    ]
    out["dk_ent_none"] = ", ".join(f(x, 2) for x in ent)
    out["dk_128_maxprob"] = per_layer("dk_scaling", "max_prob", 4, 2, d_k=128, scaling="none", init_std="0.02")
    out["dk_128_maxlogit"] = per_layer("dk_scaling", "max_logit", 4, 2, d_k=128, scaling="none", init_std="0.02")
    scaled002 = [
        c
        for c in cells("dk_scaling")
        if c["model.attention.scaling"] == "inv_sqrt_d" and _axis(c["model.init_std"]) == "0.02"
    ]
    out["dk_scaled_ent"] = span([c[f"attn/L{i}/entropy_norm_mean"] for c in scaled002 for i in range(4)], 2)
    out["dk_scaled_logit"] = span([c[f"attn/L{i}/max_logit_mean"] for c in scaled002 for i in range(4)], 0)
    fan_none = [
        c
        for c in cells("dk_scaling")
        if c["model.attention.scaling"] == "none"
        and _axis(c["model.init_std"]) == "fan_in"
        and int(c["model.d_k"]) >= 64
    ]
    out["dk_fan_maxprob"] = span([c[f"attn/L{i}/max_prob_mean"] for c in fan_none for i in range(4)], 2)
    best = [
        c["val/loss_mean"]
        for c in cells("dk_scaling")
        if c["model.attention.scaling"] == "inv_sqrt_d" and _axis(c["model.init_std"]) == "fan_in"
    ]
    out["dk_best"] = span(best, 3)
    out["dk_sink"] = span([c[f"attn/L{i}/sink_mass_mean"] for c in cells("dk_scaling") for i in range(4)], 3)
    study = repro()[8]["measured"]["judged"]
    level = study["level"]["bigram"]
    for c in study["study"]["cells"]:
        share = judge.gain_share(c["unscaled"]["mean"], c["scaled"]["mean"], level)
        out[f"share_{c['init_std']}_{c['d_k']}"] = (
            f"| {c['init_std']} | {c['d_k']} | {f(c['unscaled']['mean'], 3)} | {f(c['scaled']['mean'], 3)} | {pct(share)} |"
        )
    out["unigram"] = f(study["level"]["unigram"], 3)
    out["grad_ratio"] = f"the unscaled q/k gradient at init is {study['fanin']['grad_ratio']:.1f}x the scaled one"
    out["fail_ratio"] = pct(judge.FAIL_RATIO)
    # tasks and head types
    out.update({f"ind_{k}": v for k, v in induction_figures().items()})
    heads_md = (REPORTS / "heads" / "text_model_heads.md").read_text()
    rows = [r.strip("|").split("|") for r in heads_md.splitlines() if re.match(r"^\| \d+ \| \d+ \|", r)]
    rows = [[c.strip() for c in r] for r in rows if len(r) == 10]  # the per-head table, not the types-per-layer one
    col = {
        name: i
        for i, name in enumerate(
            [
                "layer",
                "head",
                "type",
                "previous_token",
                "induction",
                "induction_control",
                "induction_knockout",
                "sink",
                "positional",
                "entropy_norm",
            ]
        )
    }
    l0 = [r for r in rows if r[0] == "0"]
    out["text_l0"] = f"all {len(l0)} heads of layer 0 (positional {span([float(r[col['positional']]) for r in l0], 2)})"
    assert all(r[col["type"]] == "positional" for r in l0)
    out["text_induction"] = (
        f"score <= {max(float(r[col['induction']]) for r in rows):.3f}, knockout {max(float(r[col['induction_knockout']]) for r in rows) + 0.0:.3f}"
    )
    out["text_sink"] = f"first-token weight <= {max(float(r[col['sink']]) for r in rows):.3f}"
    sink_types = next(
        c for c in summary("sinks")["head_types"] if c["axes"] == {"data.bos": "True", "model.attention.sink": "none"}
    )["layers"]
    out["sinks_l0_types"] = head_type_text(sink_types[0])
    # MQAR
    for sc in ("inv_sqrt_d", "none"):
        for t in (64, 128):
            accs = [
                f(cell("mqar", attention=b, scaling=sc, block_size=t)["val/acc_mean"], 3)
                for b in ("naive", "scaled", "sdpa", "flash")
            ]
            out[f"mqar_{sc}_{t}"] = f"| {sc} | {t} | " + " | ".join(accs) + " |"
    acc = {
        sc: [c["val/acc_mean"] for c in cells("mqar") if c["model.attention.scaling"] == sc]
        for sc in ("inv_sqrt_d", "none")
    }
    out["mqar_scaled"], out["mqar_none"] = span(acc["inv_sqrt_d"], 3), span(acc["none"], 3)
    l0logit = [c["attn/L0/max_logit_mean"] for c in cells("mqar") if c["model.attention.scaling"] == "none"]
    out["mqar_l0_logit"] = span(l0logit, 0)
    out["mqar_l0_ent"] = f(
        max(c["attn/L0/entropy_norm_mean"] for c in cells("mqar") if c["model.attention.scaling"] == "none"), 2
    )
    # the first sinks study (scaling x qk_norm, one seed)
    for sc in ("none", "inv_sqrt_d"):
        for qk in ("False", "True"):
            c = cell("sinks_scaling_qk_norm", scaling=sc, qk_norm=qk)
            out[f"sq_{sc}_{qk}"] = (
                f"| {sc} | {qk.lower()} | {f(c['val/loss_mean'], 3)} | "
                f"{per_layer('sinks_scaling_qk_norm', 'sink_mass', 4, 2, scaling=sc, qk_norm=qk)} | "
                f"{per_layer('sinks_scaling_qk_norm', 'max_logit', 4, 2, scaling=sc, qk_norm=qk)} |"
            )
    # the sinks study (BOS x escape slot)
    out.update({f"snk_{k}": v for k, v in sinks_figures().items()})
    for c in cells("sinks"):
        name = f"bos={c['data.bos']}, sink={c['model.attention.sink']}"
        out[f"snk_row_{name}"] = (
            f"| {name} | {ms('sinks', 'val/loss', bos=c['data.bos'], sink=c['model.attention.sink'])} | "
            + " / ".join(f(c[f"heads/L{i}/sink_max_mean"], 3) for i in range(4))
            + " |"
        )
    # the callbacks' cost
    cb = bench()["callbacks"]
    out["cb_ratio"] = f"**{cb['overhead_ratio']:.3f}** ({span(cb['overhead_ratio_range'], 3)})"
    out["cb_repeats"] = f"{cb['measured_steps']} steps, {cb['repeats']} alternating repeats"
    hooks = cb["hook_ms_per_step"]
    out["cb_hooks"] = (
        f"heads {hooks['HeadAnalysis']:.2f}, guard {hooks['NonFiniteGuard']:.2f}, maps {hooks['AttentionMaps']:.2f}, "
        f"statistics {hooks['AttentionStats']:.2f}"
    )
    runs = json.loads((REPORTS / "bench" / "callback_overhead_runs.json").read_text())
    out["cb_runs"] = (
        f"**{runs['wall_ratio_median']:.3f}** (median; pairs {span(runs['wall_ratio'], 2)}), median step-time ratio "
        f"{runs['median_step_ratio_median']:.2f} ({span(runs['median_step_ratio'], 2)})"
    )
    # kernels
    m = bench()["machine"]
    out["matmul"] = f"{m['matmul_gflops']:.1f} GFLOP/s"
    out["kernel_repeats"] = f"median of {bench()['kernel_setup']['repeats']}"
    for t in (256, 1024, 4096, 8192):
        ex = [kernel(b, t) for b in ("naive", "scaled")]
        fu = [kernel(b, t) for b in ("sdpa", "flash")]
        out[f"k{t}"] = (
            f"| {t} | {ms_time(ex[0]['fwd_bwd_ms'])} | {ms_time(fu[0]['fwd_bwd_ms'])} | "
            f"{span([100 * k['peak_fraction'] for k in ex], 0)} | {span([100 * k['peak_fraction'] for k in fu], 0)} | "
            f"{mib(ex[0]['peak_bytes'])} / {mib(fu[0]['peak_bytes'])} |"
        )
    exp, ratio = bench()["memory_exponent"], bench()["memory_ratio_8192_1024"]
    out["mem_exp"] = (
        f"T^{exp['naive']:.2f} for the explicit kernels (×{ratio['naive']:.1f} from T = 1024 to 8192) and as "
        f"T^{exp['sdpa']:.2f} for the fused ones (×{ratio['sdpa']:.1f})"
    )
    out["frac_256_8192"] = (
        f"{100 * kernel('sdpa', 256)['peak_fraction']:.0f} % at T = 256, {100 * kernel('sdpa', 8192)['peak_fraction']:.0f} % at T = 8192"
    )
    out["peak4096"] = memory_figures()["peak"]
    out["tally"] = repro_tally()
    from attnlab.tools.bench.kernels import BACKWARD_FACTOR

    out["backward"] = f"backward counted as {BACKWARD_FACTOR}× forward"  # a definition of the benchmark, from its code
    return out


def results_fragments() -> list[str]:
    return [*results_figures().values(), *sinks_testbed_figures().values(), *gqa_figures().values()]


TEXTS = {
    "README.md Findings": (readme_findings, readme_fragments),
    "README.md make train": (readme_make_train, readme_make_train_fragments),
    "docs/results.md": (lambda: doc("results.md"), results_fragments),
    "docs/studies.md": (lambda: doc("studies.md"), studies_fragments),
    "docs/metrics.md": (lambda: doc("metrics.md"), metrics_fragments),
    "docs/performance.md": (
        lambda: re.sub(r"\s+", " ", doc("performance.md")),
        lambda: list(performance_figures().values()),
    ),
}


def mechanisms_claims() -> dict[str, str]:
    """The comparisons docs/mechanisms.md states in words, each sentence chosen by its report."""
    s = summary("sinks")
    effects = {(e["axis"], e["level"]): e for e in s["pooled_effects"]}
    bos = effects[("data.bos", "True")]
    verb = "raises" if bos["diff"] > 0 else "lowers"
    noise = "beyond seed noise" if bos["beyond_noise"] else "within seed noise"
    slots = [e for (axis, _), e in effects.items() if axis == "model.attention.sink"]
    slot = (
        "an escape slot makes no difference beyond seed noise"
        if not any(e["beyond_noise"] for e in slots)
        else "an escape slot changes the loss beyond seed noise"
    )
    diffs = sorted(f"{e['diff']:+.3f}" for e in slots)
    holm = sorted({f"{e['p_holm']:.2g}" for e in slots})
    runs = bb_arm_runs("zero_logit")
    heads = [r["metrics"]["heads/L0/sink_max"] >= THRESHOLDS["sink"] for r in runs]
    dormant = [r["metrics"]["attn/L0/sink_mass_dormant"] > judge.SINK_THRESHOLD for r in runs]
    odd = [r for r, h, d in zip(runs, heads, dormant) if d and not h]
    assert len(odd) == 1, "the sentence explains exactly one seed that is a sink by its dormant weight only"
    return {
        "bos": f"BOS {verb} the val loss by {sinks_figures()['bos']}: {noise}",
        "slot": f"{slot} ({' and '.join(diffs)} nats, Holm p = {', '.join(holm)})",
        "head_count": f"counts {sum(heads)} of {len(runs)} sink heads in the `zero_logit` arm",
        "odd_seed": (
            f"ends at {odd[0]['metrics']['attn/L0/sink_mass_dormant']:.3f} scores "
            f"{odd[0]['metrics']['heads/L0/sink_max']:.3f} there, below {THRESHOLDS['sink']}"
        ),
    }


def variants_claim() -> str:
    """docs/mechanisms.md's sentence on the variants study: which variants move the val loss beyond
    seed noise, in which direction, and which do not, from the study's contrasts."""
    contrasts = summary("variants")["contrasts"]["val/loss"]
    up = sorted(c["level"] for c in contrasts if c["beyond_noise"] and c["diff"] > 0)
    down = sorted(c["level"] for c in contrasts if c["beyond_noise"] and c["diff"] < 0)
    same = sorted(c["level"] for c in contrasts if not c["beyond_noise"])
    parts = [
        f"{', '.join(up)} raise{'s' if len(up) == 1 else ''} the val loss" if up else "",
        f"{', '.join(down)} lower{'s' if len(down) == 1 else ''} it" if down else "",
        f"{', '.join(same)} make no difference beyond seed noise" if same else "",
    ]
    return "Against the baseline, " + "; ".join(p for p in parts if p) + "."


def test_mechanisms_states_the_comparisons_its_reports_make():
    text = re.sub(r"\s+", " ", doc("mechanisms.md"))
    missing = [claim for claim in [*mechanisms_claims().values(), variants_claim()] if claim not in text]
    assert not missing, missing


# ---------------------------------------------------------------- the check
def masked(text: str) -> str:
    """The text with code blocks, inline code and link targets blanked (same length): their digits are not figures."""
    out = re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), text, flags=re.S)
    out = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), out)
    return re.sub(r"\]\([^)]*\)", lambda m: " " * len(m.group(0)), out)


def decimals(text: str) -> list[re.Match]:
    return list(re.finditer(r"(?<![\w.])\d+\.\d+(?![\w.]*\d)", masked(text)))


def uncovered(text: str, fragments: list[str]) -> list[str]:
    spans = [(m.start(), m.start() + len(frag)) for frag in fragments for m in re.finditer(re.escape(frag), text)]
    bad = []
    for m in decimals(text):
        if not any(a <= m.start() and m.end() <= b for a, b in spans):
            bad.append(text[max(0, m.start() - 60) : m.end() + 20].replace("\n", " "))
    return bad


@pytest.mark.parametrize("name", list(TEXTS))
def test_every_quoted_figure_is_what_its_report_says(name):
    text_of, fragments_of = TEXTS[name]
    text, fragments = text_of(), fragments_of()
    missing = [frag for frag in fragments if frag not in text]
    assert not missing, f"{name}: not quoted as the reports say: {missing}"
    bad = uncovered(text, fragments)
    assert not bad, f"{name}: figures that no report file backs: {bad}"


def test_the_check_catches_a_drifted_and_an_unbacked_figure():
    frag = dk_figures()["fanin128_means"]
    text = f"unscaled {frag} at d_k 128"
    assert uncovered(text, [frag]) == []
    drifted = text.replace(frag.split(" ")[0], f"{float(frag.split(' ')[0]) + 0.001:.3f}")
    assert frag not in drifted and uncovered(drifted, [frag])
    assert uncovered("callbacks cost 1.012 (5 repeats)", [frag]) and not uncovered("see `reports/x 1.2`", [])


def test_the_e2e_verdict_reads_each_arm_with_its_spread():
    """Met only when every pair is within the target, missed only when none is; otherwise the
    repeats did not resolve it, whichever side the median fell on."""

    def states(ranges):
        return {arm: against_target(*r, E2E_TARGET) for arm, r in ranges.items()}

    assert states({"a": [1.00, 1.04], "b": [0.99, 1.05]}) == {"a": "met", "b": "met"}
    assert states({"a": [1.06, 1.2], "b": [1.051, 1.1]}) == {"a": "missed", "b": "missed"}
    assert states({"a": [0.98, 1.11], "b": [1.0, 1.1]}) == {"a": "open", "b": "open"}
    text = e2e_verdict({"a": [1.06, 1.2], "b": [1.0, 1.1]}, 5)
    assert text.index("over") < text.index("b ") < text.index("5 pairs")
