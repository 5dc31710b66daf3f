"""The training claims' judgements (8, 10, 12, 13): measurements -> (verdict, reason, detail), and each
claim's summary sentence (``finding_*``: a Finding whose choices record which way the measurements went).

Pure functions of plain numbers, kept apart from the runs that produce them, so a test can feed
each one the opposite measurements and see the verdict, its reason and the text turn. Every sentence
that states an outcome has both branches written; the one that holds is printed.
"""

from __future__ import annotations

from ..report.baseline import CLEARLY_BELOW
from .verdict import Finding, depends, either, grade

FAIL_RATIO = (
    0.5  # an unscaled run "fails" when it reaches less than half the scaled run's gain over the attention-free level
)
SINK_THRESHOLD = 0.3  # Gu et al. 2024: a head is a sink head when its mean first-token weight > 0.3
NEAR_ONE_HOT = 0.5  # mean max prob above which we call the softmax saturated
ALPHA = 0.05


def _pct(x: float) -> str:
    return f"{x:.0%}"


def gain_share(unscaled: float, scaled: float, level: float) -> float | None:
    """How much of the scaled run's gain over the attention-free level the unscaled run reaches (1 = as much,
    0 = none, < 0 = worse than the level); None when the scaled run is not clearly below the level."""
    return (level - unscaled) / (level - scaled) if level - scaled >= CLEARLY_BELOW else None


def _cell_verdict(c: dict) -> str:
    """'fails' | 'holds' | 'uninformative' for one unscaled/scaled comparison: fails when the unscaled run
    reaches under FAIL_RATIO of the scaled gain and the difference is beyond seed noise (Holm, when tested);
    under FAIL_RATIO within seed noise, or a scaled run not clearly below the level, says nothing."""
    if c["share"] is None:
        return "uninformative"
    if c["share"] >= FAIL_RATIO:
        return "holds"
    return "fails" if c.get("p_holm") is None or c["p_holm"] < ALPHA else "uninformative"


def _where(cells: list[dict]) -> str:
    """'init_std=fan_in: d_k 64 (38%), 128 (14%)': the cells grouped by init, each with its share of the scaled gain."""
    by_init: dict[str, list[str]] = {}
    for c in cells:
        by_init.setdefault(c["init_std"], []).append(f"{c['d_k']} ({_pct(c['share'])})")
    return "; ".join(f"init_std={i}: d_k {', '.join(d)}" for i, d in by_init.items())


def _windows_text(windows: list[float]) -> str:
    if not windows:
        return ""
    if len(windows) == 1:
        return f"; on the fixed val windows {windows[0]:.3f}"
    return f"; on the val window sets {min(windows):.3f}-{max(windows):.3f}"


def _own_pairs(runs: dict) -> list[dict]:
    """The repro's own unscaled/scaled pairs, each with its share of the scaled gain over the probe batches' level."""
    return [
        {"name": name, "share": gain_share(p["unscaled"], p["scaled"], runs["probe_level"]), **p}
        for name, p in runs["pairs"].items()
    ]


def _cells_8(m: dict) -> list[dict]:
    """The comparisons claim 8 is judged on, each with its share of the scaled gain: the dk_scaling study's cells
    against the val split's bigram level, or without the study the repro's own informative pairs."""
    if m.get("study") is None:
        return [{**c, "init_std": c["name"], "d_k": "-"} for c in _own_pairs(m["runs"]) if c["share"] is not None]
    b = m["level"]["bigram"]
    return [{**c, "share": gain_share(c["unscaled"]["mean"], c["scaled"]["mean"], b)} for c in m["study"]["cells"]]


def _vanishing(m: dict) -> bool:
    """The source's mechanism, measured: the Jacobian all but gone at the unscaled logit size and a smaller q/k gradient at init."""
    return m["jacobian"]["at_11"] < 0.1 * m["jacobian"]["peak"] and m["fanin"]["grad_ratio"] < 1


def finding_8(m: dict) -> Finding:
    """Claim 8's summary: where unscaled training fails and where it trains (share of the scaled run's gain over
    the attention-free level), then whether the stated mechanism is what was measured. ``choices``: fails_at and
    trains_at (the cells, 'init_std/d_k'), mechanism."""
    cells = _cells_8(m)
    judged = {k: [c for c in cells if _cell_verdict(c) == k] for k in ("fails", "holds")}
    fails, holds = judged["fails"], judged["holds"]
    label = lambda c: f"{c['init_std']}/{c['d_k']}"  # noqa: E731
    span = lambda cs: (
        f"{100 * min(c['share'] for c in cs):.0f}-{_pct(max(c['share'] for c in cs))}"  # noqa: E731
        if len(cs) > 1
        else _pct(cs[0]["share"])
    )
    mechanism = _vanishing(m)
    if not fails and not holds:
        text = (
            "No run here has a scaled model clearly below the attention-free level, so whether unscaled training fails "
            "is not tested."
        )
    elif not fails:
        text = (
            f"Without scaling, training does not fail: the unscaled runs reach {span(holds)} of the scaled runs' gain over "
            f"the attention-free level at all {len(holds)} settings tested."
        )
    else:
        text = (
            f"Without scaling, training fails (under {_pct(FAIL_RATIO)} of the scaled run's gain over the attention-free level) "
            f"only at {_where(fails)}; at {len(holds)} other settings it trains ({span(holds)})."
            if holds
            else f"Without scaling, training fails at every setting tested ({span(fails)} of the scaled run's gain "
            f"over the attention-free level)."
        )
        ratio, j = m["fanin"]["grad_ratio"], m["jacobian"]
        # of the mechanism's two measured signs, the one that is missing is the one the sentence names
        missing = (
            f"the q/k gradient at init is {ratio:.1f}x the scaled run's"
            if ratio >= 1
            else f"the softmax Jacobian at the unscaled logit size is still {_pct(j['at_11'] / j['peak'])} of its peak"
        )
        text += " " + either(
            mechanism,
            "The measurements show the vanishing gradient the source names (the q/k gradient at init "
            f"is {ratio:.2f}x the scaled run's).",
            f"The vanishing gradient the source names is not what was measured: {missing}.",
        )
    return Finding(
        text,
        {"fails_at": [label(c) for c in fails], "trains_at": [label(c) for c in holds], "mechanism": mechanism},
        {"shares": {label(c): c["share"] for c in fails + holds}, "grad_ratio": m["fanin"]["grad_ratio"]},
    )


def judge_8(m: dict) -> tuple[str, str, str]:
    """Claim 8 (without scaling, training fails through a saturated softmax and a vanishing gradient).

    ``m``: jacobian {n, at_1, peak, peak_std, at_11, at_max, max_std}; level {bigram, unigram, chance, vocab,
    windows: [bigram on val window sets]}; runs {steps, probe_level, pairs: {name: {unscaled, scaled}}} (the repro's
    own short runs, final loss on its probe batches); study None or {source, seeds, cells: [{init_std, d_k,
    unscaled {mean, std, n}, scaled {...}, p, p_holm}]} (the dk_scaling study); init_002 {logit_std, max_prob};
    fanin {logit_std, max_prob, grad_ratio}."""
    j, lv, runs, study = m["jacobian"], m["level"], m["runs"], m.get("study")
    b = lv["bigram"]
    text = [
        f"Attention-free level on the val split: bigram {b:.3f} nats (unigram {lv['unigram']:.3f}, chance ln {lv['vocab']} = "
        f"{lv['chance']:.3f})"
        + _windows_text(lv.get("windows") or [])
        + ". A model below it uses its context, i.e. its attention."
    ]
    own = _own_pairs(runs)
    informative_own = [c for c in own if c["share"] is not None]
    text.append(
        f"The repro's own runs ({runs['steps']} steps, one seed; bigram level on their probe batches {runs['probe_level']:.3f}): "
        + "; ".join(f"{c['name']} {c['unscaled']:.3f} vs {c['scaled']:.3f}" for c in own)
        + ": "
        + (
            "every scaled run is clearly below the attention-free level."
            if len(informative_own) == len(own)
            else f"{len(own) - len(informative_own)} of {len(own)} scaled runs are not {CLEARLY_BELOW} below the attention-free level, "
            "so those pairs compare models that do not yet use attention and do not enter the verdict."
        )
    )
    cells = _cells_8(m)
    if study is None:
        text.append("The dk_scaling study has no report here (`make sweep SWEEP=dk_scaling SEEDS=3` writes it).")
    else:
        text.append(
            f"The dk_scaling study ({study['source']}, {study['seeds']} seeds per cell, mean final val loss, Welch p Holm-corrected "
            f"over its {len(study['cells'])} pairs): "
            + "; ".join(
                f"init_std={c['init_std']}, d_k {c['d_k']}: unscaled {c['unscaled']['mean']:.3f} vs scaled {c['scaled']['mean']:.3f}"
                + (
                    f", {_pct(c['share'])} of the scaled gain"
                    if c["share"] is not None
                    else ", scaled not below the level"
                )
                + (f" (p {c['p']:.2g}, Holm {c['p_holm']:.2g})" if c.get("p_holm") is not None else "")
                for c in cells
            )
            + "."
        )
    judged = {k: [c for c in cells if _cell_verdict(c) == k] for k in ("fails", "holds", "uninformative")}
    vanished = j["at_11"] < 0.1 * j["peak"]
    text.append(
        f"Over n = {j['n']} keys ||diag(p) - pp^T||_F is {j['at_1']:.2f} at logit std 1 (scaled), peaks at {j['peak']:.2f} at std "
        f"{j['peak_std']:g}, and is {j['at_11']:.2f} at std 11.3 (unscaled, d_k = 128) and {j['at_max']:.3f} at std {j['max_std']:g}: "
        + (
            "at the unscaled logit size the Jacobian has all but vanished, as the article says."
            if vanished
            else f"it shrinks as p -> one-hot, but slowly: at the unscaled logit size it is still "
            f"{_pct(j['at_11'] / j['peak'])} of its peak, not near 0."
        )
    )
    i, f = m["init_002"], m["fanin"]
    text.append(
        f"With init std 0.02, unscaled logits at d_k = 128 start with std {i['logit_std']:.2f} (max p {i['max_prob']:.2f}): "
        + (
            "the softmax is far from one-hot at init."
            if i["max_prob"] < NEAR_ONE_HOT
            else "the softmax is already near one-hot at init."
        )
        + f" With fan-in init (unscaled logit std {f['logit_std']:.1f}, max p {f['max_prob']:.2f}) the q/k weight gradient at init is "
        + (
            f"{f['grad_ratio']:.1f}x the scaled run's: not vanishing, since the missing 1/sqrt(d) factor multiplies the gradient too."
            if f["grad_ratio"] >= 1
            else f"{f['grad_ratio']:.2f}x the scaled run's: smaller, as a vanishing gradient would make it."
        )
    )
    mechanism = {
        "the mechanism, a vanishing gradient (the Jacobian -> 0 at the unscaled logit size, a smaller q/k gradient at init)": _vanishing(
            m
        )
    }
    fails, holds = judged["fails"], judged["holds"]
    if not fails and not holds:
        v, reason = grade(
            {
                "training fails without scaling": "no run here has a scaled model clearly below the attention-free level; "
                "needs longer runs, e.g. `make sweep SWEEP=dk_scaling SEEDS=3`"
            }
        )
    elif fails and holds:
        v, reason = depends(
            f"Training fails without scaling (the unscaled run reaches under {_pct(FAIL_RATIO)} of the scaled run's "
            "gain over the attention-free level)",
            f"at {_where(fails)}",
            f"at {_where(holds)}",
        )
        if not all(mechanism.values()):
            reason += " The stated mechanism, a vanishing gradient, is not what the measurements show."
    else:
        v, reason = grade(
            {
                f"training fails without scaling (under {_pct(FAIL_RATIO)} of the scaled gain over the attention-free level)": bool(
                    fails
                )
                and not holds
            },
            mechanism,
        )
    return v, reason, " ".join(text)


def judge_10(m: dict) -> tuple[str, str, str]:
    """Claim 10 (with init variance sigma^2 the right scale is 1/(sigma^2 sqrt d)), judged on two readings of
    sigma^2: the source's (the init variance, of the weights) and the q/k component variance.

    ``m``: math_ok, component_ok, weight_ok, weight_off (measured logit std / the weight reading's prediction),
    d_model, init_std, after_min, after_max; training None (fast mode) or {sigma_init_logit_std,
    scaled_init_logit_std, sigma_final_loss, scaled_final_loss, sigma_final_logit_std, steps, seeds}."""
    source_reading = m["math_ok"] and m["weight_ok"]
    component_reading = m["math_ok"] and m["component_ok"]
    off = f"{min(m['weight_off']):.0f}-{max(m['weight_off']):.0f}"
    text = [
        ("Math holds" if m["math_ok"] else "Math does not hold")
        + f": dividing by sigma^2 sqrt(d) gives std {m['after_min']:.3f}-{m['after_max']:.3f} for q, k with N(0, sigma^2) components.",
        f"In the GPT at init (init_std {m['init_std']:g}, d_model {m['d_model']}) the rule {'holds' if m['component_ok'] else 'does not hold'} "
        f"with sigma = std of the q/k components and {'holds' if m['weight_ok'] else 'does not hold'} with sigma = the weights' init std "
        f"(the measured logit std is {off}x that reading's prediction).",
    ]
    if source_reading == component_reading:
        v, reason = grade(
            {
                "1/(sigma^2 sqrt d) gives unit logit std, sigma^2 the init variance (the source's words) or the q/k "
                "component variance": source_reading
            }
        )
    elif component_reading:
        v, reason = depends(
            "The rule holds",
            "when sigma^2 is the variance of the q/k components",
            "when it is the weights' init "
            f"variance, as the source words it (off by {off}x here, d_model = {m['d_model']})",
        )
    else:
        v, reason = depends(
            "The rule holds",
            "when sigma^2 is the weights' init variance",
            "when it is the variance of the q/k components",
        )
    t = m.get("training")
    if t is None:
        text.append("(Training check: full mode.)")
    else:
        a, b = t["sigma_final_loss"], t["scaled_final_loss"]
        unit = abs(t["sigma_init_logit_std"] - 1) < 0.25
        moved = abs(t["sigma_final_logit_std"] - 1) > 0.5
        text.append(
            f"Training ({t['steps']} steps, {t['seeds']} seed{'s' if t['seeds'] != 1 else ''}: an illustration, not a test of which rule trains "
            f"better): the sigma rule {'does' if unit else 'does not'} give unit logit std at init ({t['sigma_init_logit_std']:.2f} "
            f"vs {t['scaled_init_logit_std']:.3f} for 1/sqrt(d)) and ends at loss {a:.3f}, "
            + ("lower than" if a < b else "higher than" if a > b else "equal to")
            + f" 1/sqrt(d)'s {b:.3f}; "
            + (
                f"unit scale holds only at init, since the q/k scale moves in training (logit std {t['sigma_final_logit_std']:.1f} at the end)."
                if moved
                else f"the logit std stays near 1 in training ({t['sigma_final_logit_std']:.2f} at the end)."
            )
        )
    return v, reason, " ".join(text)


def finding_10(m: dict) -> Finding:
    """Claim 10's summary: under which reading of sigma^2 the rule gives unit logit spread. ``choices``: weights_reading
    (sigma^2 = the weights' init variance, the source's words) and component_reading (the q/k components' variance)."""
    weights, component = bool(m["math_ok"] and m["weight_ok"]), bool(m["math_ok"] and m["component_ok"])
    off = f"{min(m['weight_off']):.0f}-{max(m['weight_off']):.0f}x"
    rule = "Dividing q.k by sigma^2 sqrt(d) gives unit logit spread"
    if component and not weights:
        text = (
            f"{rule} when sigma^2 is the variance of the q/k components, not when it is the weights' init variance as the "
            f"source words it: read that way the rule is off by {off} at d_model = {m['d_model']}."
        )
    elif weights and not component:
        text = f"{rule} when sigma^2 is the weights' init variance, as the source words it, and not with the q/k components' variance."
    elif weights:
        text = f"{rule} under either reading of sigma^2, the weights' init variance or the q/k components' variance."
    else:
        text = f"{rule} under neither reading of sigma^2: " + either(
            m["math_ok"],
            f"the weights' init variance misses by {off} and the q/k components' variance misses too.",
            "the rule fails even for q, k with N(0, sigma^2) components.",
        )
    return Finding(
        text, {"weights_reading": weights, "component_reading": component}, {"weight_reading_off": m["weight_off"]}
    )


HEAD_PARTS = {
    "positional": "positional heads in the shallow layers",
    "induction": "induction heads in the later layers",
    "sink": "sink heads in every layer",
    "syntactic": "syntactic heads in the middle layers",
}
POSITIONAL_TYPES = (
    "previous_token",
    "positional",
)  # the article's "positional": attending by offset, whatever the content
KNOCKOUT_LARGE = 0.5  # cutting a layer's induction edges removes at least half of the right token's probability


def seeds_with(layer: dict[str, list[int]], kinds) -> list[bool]:
    """``layer``: {head type: heads of that type per seed} -> per seed, whether it has a head of one of ``kinds``."""
    seeds = max((len(v) for v in layer.values()), default=0)
    return [any(layer.get(k, [0] * seeds)[s] > 0 for k in kinds) for s in range(seeds)]


def most(flags: list[bool]) -> bool:
    """A mechanism counts as formed when it forms in more than half of the seeds (all of one)."""
    return 2 * sum(flags) > len(flags)


def _k_of_n(flags: list[bool]) -> str:
    """'k of n seeds (95 % interval)' for a mechanism that forms in some seeds: a bimodal outcome, not a mean."""
    from ..report.significance import k_of_n_text

    return k_of_n_text(sum(flags), len(flags)) if len(flags) > 1 else ("the seed" if all(flags) else "no seed")


def _types_text(types: list[dict]) -> str:
    from ..report import head_type_text

    return "; ".join(f"L{i} {head_type_text(t)}" for i, t in enumerate(types))


def _ms(stat: dict | None, n: int) -> str:
    from ..report.numbers import mean_pm_std

    return "-" if stat is None else mean_pm_std(stat["mean"], stat["std"], n)


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def _over(n: int) -> str:
    """What a per-layer list of study values is when it comes from several seeds."""
    return f" (means over {n} seeds)" if n > 1 else ""


SINK_NEEDS = (
    "a model in which sinks form: they are reported in LMs pre-trained on billions of tokens (Gu et al. 2024), "
    "e.g. the sinks study run far longer or wider"
)
SYNTAX_NEEDS = "a word-level model of real text: characters and random tokens have no syntax"


def _part(shown: bool, elsewhere: bool, needs: str) -> bool | str:
    """A head-type part: True where the claim puts it, False when it formed only elsewhere, untested (what would
    test it) when it formed nowhere."""
    return True if shown else False if elsewhere else f"it formed in no model here; needs {needs}"


def judge_12(m: dict) -> tuple[str, str, str]:
    """Claim 12 (head types in trained models), from three models: the character model repro trains
    (``text``: n_layer, steps, val_loss, seed, types = per layer {type: [count]}), the induction_heads
    study (``induction``: studies.induction_measurements, or None) and the sinks study (``sinks``:
    studies.sinks_measurements, or None). A type that formed in no model is untested, not wrong."""
    a = _assess_12(m)
    v, reason = grade(a["parts"], a["details"])
    return v, reason, " ".join(a["text"])


def _assess_12(m: dict) -> dict:
    """judge_12's parts (head type -> True / False / what would test it), details, text, and the facts the
    summary quotes: circuit (per seed of the induction study, did the two-layer circuit form; None without
    the study) and testbed_sink (a sink formed only in the one-layer testbed)."""
    t, ind, snk = m["text"], m.get("induction"), m.get("sinks")
    both = None
    shallow = range(max(1, t["n_layer"] // 2))
    found = {
        "positional": any(most(seeds_with(t["types"][i], POSITIONAL_TYPES)) for i in shallow),
        "induction": any(most(seeds_with(layer, ("induction",))) for layer in t["types"][1:]),
        "sink": all(most(seeds_with(layer, ("sink",))) for layer in t["types"]),
    }
    anywhere = {
        "positional": any(most(seeds_with(layer, POSITIONAL_TYPES)) for layer in t["types"]),
        "induction": any(most(seeds_with(layer, ("induction",))) for layer in t["types"]),
        "sink": any(most(seeds_with(layer, ("sink",))) for layer in t["types"]),
    }
    text = [
        f"The {t['n_layer']}-layer character model trained here ({t['steps']} steps, val loss {t['val_loss']:.2f}, seed {t['seed']}) "
        f"has the head types [{_types_text(t['types'])}]."
    ]
    if ind is None:
        text.append(
            "The induction_heads study has no report here (`make sweep SWEEP=induction_heads SEEDS=3` writes it), "
            "so induction heads are judged on the character model alone."
        )
    else:
        two, n = ind["two_layer"], ind["seeds"]
        types = two["types"] or [{}, {}]
        l0, l1 = seeds_with(types[0], POSITIONAL_TYPES), seeds_with(types[1], ("induction",))
        both = [a and b for a, b in zip(l0, l1)]
        knocked = two["knockout_L1"] is not None and two["knockout_L1"]["mean"] >= KNOCKOUT_LARGE
        found["positional"] |= most(l0)
        found["induction"] |= most(l1) and knocked
        anywhere["positional"] |= most(l0) or most(seeds_with(types[1], POSITIONAL_TYPES))
        anywhere["induction"] |= most(l1) or most(seeds_with(types[0], ("induction",)))
        anywhere["sink"] |= any(most(seeds_with(layer, ("sink",))) for layer in types)
        sinks_seen = [any(x) for x in zip(*(seeds_with(layer, ("sink",)) for layer in types))] if types else []
        text.append(
            f"In the induction_heads study ({_seeds(n)}, 2 attention-only layers, {ind['source']}) the head types are [{_types_text(types)}]; "
            f"layer 0's best previous-token score is {_ms(two['previous_token_L0'], n)}, layer 1's best induction score "
            f"{_ms(two['induction_L1'], n)} against a best control of {_ms(two['control'], n)}, and cutting layer 1's induction edges "
            f"lowers the right token's probability by {_ms(two['knockout_L1'], n)} (copying accuracy {_ms(two['repeat_acc'], n)}"
            + (
                "; means over seeds some of which form the circuit and some not, hence the spread"
                if 0 < sum(both) < len(both)
                else ""
            )
            + "): "
            + (
                f"the canonical circuit, a positional head in layer 0 and an induction head in layer 1, forms in {_k_of_n(both)}"
                if most(both)
                else f"an induction head in layer 1 in {_k_of_n(l1)}, a positional head in layer 0 in {_k_of_n(l0)}"
            )
            + (
                f", and the knockout confirms layer 1's role (at least {KNOCKOUT_LARGE})."
                if knocked
                else f"; the knockout is below the {KNOCKOUT_LARGE} that would confirm layer 1's role."
            )
            + (f" A sink head appears in {_k_of_n(sinks_seen)}." if any(sinks_seen) else "")
        )
        if "one_layer" in ind:
            one = ind["one_layer"]
            text.append(
                f"The 1-layer model's best induction score is {_ms(one['induction_L0'], n)} "
                f"(copying {_ms(one['repeat_acc'], n)})."
            )
    if snk is None:
        text.append("The sinks study has no report here (`make sweep SWEEP=sinks` writes it).")
    else:
        cell = snk["cells"].get("bos=true, sink=none")
        if cell is None:
            text.append(f"The sinks study ({snk['source']}) has no cell with BOS and no escape slot.")
        else:
            every = bool(cell["types"]) and all(most(seeds_with(layer, ("sink",))) for layer in cell["types"])
            found["sink"] |= every
            anywhere["sink"] |= bool(cell["types"]) and any(
                most(seeds_with(layer, ("sink",))) for layer in cell["types"]
            )
            text.append(
                f"In the sinks study ({_seeds(cell['seeds'])}, {len(cell['sink_max'])} layers, text with BOS, no escape slot, {snk['source']}) "
                f"the best sink head per layer scores {', '.join(f'{x:.3f}' for x in cell['sink_max'])}{_over(cell['seeds'])}: "
                + ("a sink head in every layer." if every else "not a sink head in every layer.")
            )
    bb = m.get("sinks_bb")
    from .studies import BB_BASE

    testbed_sink = bb is not None and BB_BASE in bb["arms"] and most(_bb_sinks(bb["arms"][BB_BASE]))
    if bb is not None and BB_BASE in bb["arms"]:
        text.append(
            f"In the sinks testbed ({bb['source']}: one layer, one head, built so that most queries need no attention) the "
            f"head parks those queries on the first token in {_k_of_n(_bb_sinks(bb['arms'][BB_BASE]))}; a one-layer model "
            "cannot say whether every layer of a deep model holds a sink head, so that part stays as the models above leave it."
        )
    needs = {
        "positional": "a model that attends by offset (any trained model of text)",
        "induction": "data with repeats to copy, as in the induction_heads study",
        "sink": SINK_NEEDS,
    }
    parts = {HEAD_PARTS[k]: _part(found[k], anywhere[k], needs[k]) for k in found}
    if testbed_sink and isinstance(parts[HEAD_PARTS["sink"]], str):
        parts[HEAD_PARTS["sink"]] = (
            "a sink head formed only in the one-layer sinks testbed here; needs a deep model in which "
            "sinks form, to see whether every layer holds one"
        )
    return {
        "parts": parts,
        "details": {HEAD_PARTS["syntactic"]: f"needs {SYNTAX_NEEDS}"},
        "text": text,
        "circuit": both,
        "testbed_sink": bool(testbed_sink and not found["sink"]),
    }


HEAD_NAMES = {part: name for name, part in HEAD_PARTS.items()}  # a graded part -> its head type


def finding_12(m: dict) -> Finding:
    """Claim 12's summary: which head types form where the source puts them, which form elsewhere, which no model
    here can show (and in short why). ``choices``: per head type, 'formed' | 'elsewhere' | 'untested'."""
    a = _assess_12(m)
    state = {
        HEAD_NAMES[k]: "formed" if v is True else "elsewhere" if v is False else "untested"
        for k, v in {**a["parts"], **a["details"]}.items()
    }
    named = lambda kinds: _and([HEAD_PARTS[k] for k in kinds])  # noqa: E731
    formed = [k for k, v in state.items() if v == "formed"]
    elsewhere = [k for k, v in state.items() if v == "elsewhere"]
    untested = [k for k, v in state.items() if v == "untested"]
    circuit = a["circuit"]
    why = {
        "sink": "a sink head formed only in a one-layer testbed"
        if a["testbed_sink"]
        else "no model here forms sink heads",
        "syntactic": "characters have no syntax",
        "positional": "no model here forms them",
        "induction": "no model here forms them",
    }
    sentences = []
    if formed:
        sentences.append(
            f"{named(formed)} form as the source says"
            + (f" (the two-layer induction circuit in {_count(circuit)})" if "induction" in formed and circuit else "")
        )
    if elsewhere:
        sentences.append(f"{named(elsewhere)}: the heads form, but in other layers")
    text = "; ".join(sentences)
    text = (text[:1].upper() + text[1:] + ". ") if text else ""
    if untested:
        text += (
            f"{named(untested)[:1].upper()}{named(untested)[1:]} cannot be tested here ("
            + "; ".join(why[k] for k in untested)
            + ")."
        )
    return Finding(
        text.strip(),
        state,
        {
            "circuit_seeds": sum(circuit) if circuit else None,
            "seeds": len(circuit) if circuit else None,
            "sink_only_in_testbed": a["testbed_sink"],
        },
    )


def _and(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


SINK_PARTS = {
    "forms": f"the first token absorbs weight (a head whose mean first-token weight > {SINK_THRESHOLD})",
    "cause": "the sink goes where rows need not sum to one (an escape slot, or sigmoid attention: the 'softmax must "
    "sum to 1' cause)",
}
ESCAPES = ("zero_logit", "learned")


def judge_13(m: dict) -> tuple[str, str, str]:
    """Claim 13 (an attention sink on the first token, because softmax must sum to 1). ``text``: the
    character model repro trains (init, final: mean sink mass per layer; top: largest head's mean
    first-token weight after training; n_sink_heads, uniform, steps); ``sinks``:
    studies.sinks_measurements (BOS x escape slot), or None. Neither part is judged false for want of a
    sink: with no sink both are untested, and say what would test them."""
    t, snk = m["text"], m.get("sinks")
    top, n = t["top"], t["n_sink_heads"]
    if top > SINK_THRESHOLD:
        lead = f"A sink forms in the character model: {n} head(s) put more than {SINK_THRESHOLD} of their weight on the first token (largest {top:.3f})"
    else:
        lead = f"No sink in the character model: no head puts more than {SINK_THRESHOLD} of its weight on the first token (largest head {top:.3f})"
    above = [i for i, x in enumerate(t["final"]) if x > t["uniform"]]
    if not above:
        where = f"below uniform attention's {t['uniform']:.3f} in every layer"
    elif len(above) == len(t["final"]):
        where = f"above uniform attention's {t['uniform']:.3f} in every layer"
    else:
        where = f"above uniform attention's {t['uniform']:.3f} in layer(s) {', '.join(map(str, above))}, below it in the others"
    text = [
        f"{lead}; sink mass per layer goes from {', '.join(f'{x:.3f}' for x in t['init'])} at init to "
        f"{', '.join(f'{x:.3f}' for x in t['final'])} after {t['steps']} steps, {where} (its windows start at a random character)."
    ]
    forms = top > SINK_THRESHOLD
    cause: bool | str = "needs the sinks study's BOS x escape-slot cells (`make sweep SWEEP=sinks`)"
    base = (snk or {}).get("cells", {}).get("bos=true, sink=none")
    if base is None:
        text.append(
            "The sinks study (BOS x escape slot) has no report here (`make sweep SWEEP=sinks` writes it), so the cause is "
            "not tested."
        )
    else:
        peak = max(base["sink_max"])
        forms |= peak > SINK_THRESHOLD
        text.append(
            f"In the sinks study ({_seeds(base['seeds'])}, text with a BOS token, {snk['source']}) the largest head's first-token "
            f"weight per layer is {', '.join(f'{x:.3f}' for x in base['sink_max'])}{_over(base['seeds'])} without an escape slot (uniform "
            f"attention: {snk['uniform']:.3f}): "
            + ("a sink forms on BOS." if peak > SINK_THRESHOLD else "no sink forms on BOS.")
        )
        slots = {k: snk["cells"].get(f"bos=true, sink={k}") for k in ESCAPES}
        slots = {k: c for k, c in slots.items() if c is not None}
        for k, c in slots.items():
            escape = [x for x in c["escape_mass"] if x is not None]
            text.append(
                f"With the {k} slot: largest first-token weight {max(c['sink_max']):.3f}, escape mass per layer "
                f"{', '.join(f'{x:.3f}' for x in escape) or '-'}."
            )
        if peak > SINK_THRESHOLD and slots:
            cause = all(max(c["sink_max"]) <= SINK_THRESHOLD for c in slots.values())
            text.append(
                "The escape slot removes the sink: the weight that went to BOS now goes nowhere, as 'softmax must sum to 1' "
                "predicts."
                if cause
                else "The sink stays with an escape slot: the slot does not take its place."
            )
        elif peak <= SINK_THRESHOLD:
            cause = "there is no sink for an escape slot to remove"
            text.append("So the cause cannot be tested here: there is no sink for the slot to remove.")
        else:
            cause = "the sinks study has no escape-slot cell"
    forms_bb, cause_bb, bb_text = _testbed(m.get("sinks_bb"))
    forms |= forms_bb
    text += bb_text
    details = testbed_details(m.get("sinks_bb"))  # the gate and window arms, where they exist
    if isinstance(cause_bb, tuple):  # one slot removes the sink, another does not
        v, reason = depends(f"{SINK_PARTS['cause'][0].upper()}{SINK_PARTS['cause'][1:]}", *cause_bb)
        held, failed = [k for k, x in details.items() if x], [k for k, x in details.items() if not x]
        reason += (f" Holds: {'; '.join(held)}." if held else "") + (
            f" Does not hold: {'; '.join(failed)}." if failed else ""
        )
        return v, reason, " ".join(text)
    if cause_bb is not None:  # the testbed is the direct test: a sink that forms, and the slot offered to it
        cause = cause_bb
    v, reason = grade(
        {
            SINK_PARTS["forms"]: forms if forms else f"no head formed one here; needs {SINK_NEEDS}",
            SINK_PARTS["cause"]: cause,
        },
        details,
    )
    return v, reason, " ".join(text)


def finding_13(m: dict) -> Finding:
    """Claim 13's summary: whether a first-token sink forms, and whether it goes when rows need not sum to one
    (the testbed's escape-slot and sigmoid arms, else the sinks study). ``choices``: forms; removed_by and kept_by
    (the arms that remove it and those it survives); cause (True, False, 'mixed' or 'untested')."""
    from .studies import BB_BASE, BB_SIGMOID, BB_SLOTS

    t, snk, bb = m["text"], m.get("sinks"), m.get("sinks_bb")
    base = (snk or {}).get("cells", {}).get("bos=true, sink=none")
    text_peak = max([t["top"]] + ([max(base["sink_max"])] if base else []))
    text_forms = text_peak > SINK_THRESHOLD
    arms = (bb or {}).get("arms", {})
    tb_base = arms.get(BB_BASE)
    tb_forms = tb_base is not None and most(_bb_sinks(tb_base))
    # every escape arm trains with AdamW; the summary names an arm by its attention alone
    short = lambda name: name.removeprefix("AdamW, ").split(" (")[0]  # noqa: E731
    ways = [name for name in (*BB_SLOTS, BB_SIGMOID) if name in arms] if tb_forms else []
    removed = [n for n in ways if not most(_bb_sinks(arms[n]))]
    kept = [n for n in ways if n not in removed]
    k = lambda name: _count(_bb_sinks(arms[name]))  # noqa: E731
    sentences = []
    if tb_forms:
        lead = f"In a one-layer testbed the first token becomes a sink in {k(BB_BASE)}"
        if removed and kept:
            cause = "mixed"
            sentences.append(
                f"{lead}; it goes with {_and([f'{short(n)} (a sink in {k(n)})' for n in removed])} but stays with "
                f"{_and([f'{short(n)} ({k(n)})' for n in kept])}, so 'softmax must sum to 1' does not explain it alone."
            )
        elif removed:
            cause = True
            sentences.append(
                f"{lead}, and it goes whenever rows need not sum to one ({_and([short(n) for n in removed])}), as "
                "'softmax must sum to 1' predicts."
            )
        elif kept:
            cause = False
            sentences.append(
                f"{lead}, and it stays when rows need not sum to one ({_and([short(n) for n in kept])}), which "
                "'softmax must sum to 1' does not explain."
            )
        else:
            cause = "untested"
            sentences.append(f"{lead}; no arm here lets rows sum to less than one, so the cause is not tested.")
    elif (
        base is not None and max(base["sink_max"]) > SINK_THRESHOLD
    ):  # no testbed sink: the sinks study's slots test the cause
        slots = {name: c for name in ESCAPES if (c := snk["cells"].get(f"bos=true, sink={name}")) is not None}
        removed = [f"the {name} slot" for name, c in slots.items() if max(c["sink_max"]) <= SINK_THRESHOLD]
        kept = [f"the {name} slot" for name, c in slots.items() if max(c["sink_max"]) > SINK_THRESHOLD]
        cause = "untested" if not slots else "mixed" if removed and kept else bool(removed)
        lead = f"A sink forms on BOS in the sinks study (largest head {max(base['sink_max']):.3f})"
        sentences.append(
            f"{lead}; "
            + (
                "no escape slot was tried, so the cause is not tested."
                if not slots
                else f"it goes with {_and(removed)} but stays with {_and(kept)}."
                if cause == "mixed"
                else either(
                    cause,
                    f"an escape slot removes it ({_and(removed)}), as 'softmax must sum to 1' predicts.",
                    f"it stays with an escape slot ({_and(kept)}), which 'softmax must sum to 1' does not explain.",
                )
            )
        )
    else:
        cause = "untested"
    extra = {}
    if tb_forms:
        sentences += _finding_13_arms(arms, extra)
    study_said = not tb_forms and text_forms and bool(sentences)  # the sinks study's sentence already reports the sink
    if text_forms and not study_said:
        sentences.append(
            f"The character models here form one{' too' if tb_forms else ''} (largest first-token weight {text_peak:.3f})"
            + ("." if tb_forms else "; no escape-slot run here tests its cause.")
        )
    elif tb_forms and not text_forms:
        sentences.append(f"The character models here form none (largest head's first-token weight {text_peak:.3f}).")
    elif not tb_forms and not text_forms:
        sentences.append(
            f"No model here forms a first-token sink (largest head's first-token weight {text_peak:.3f}), so neither "
            "the sink nor its cause is tested."
        )
    return Finding(
        " ".join(sentences),
        {"forms": bool(tb_forms or text_forms), "removed_by": removed, "kept_by": kept, "cause": cause, **extra},
        {"text_peak": text_peak, "testbed_base_sinks": sum(_bb_sinks(tb_base)) if tb_base else None},
    )


def _finding_13_arms(arms: dict, choices: dict) -> list[str]:
    """The summary's sentences on the testbed's gate and window arms, where they exist; ``choices`` gets ``gate``
    ('removes' or 'keeps') and ``window_visible_sink`` (a sink with the first token kept in the window's view)."""
    from .studies import BB_GATE, BB_WINDOW

    out = []
    if BB_GATE in arms:
        gate = _bb_sinks(arms[BB_GATE])
        choices["gate"] = "keeps" if most(gate) else "removes"
        out.append(
            either(
                most(gate),
                f"A per-head output gate keeps it (a sink in {_count(gate)}), unlike Qiu et al. 2025's finding.",
                f"A per-head output gate removes it while rows still sum to one (a sink in {_count(gate)}): the sink "
                "is the head's way to do nothing, as Qiu et al. 2025 report.",
            )
        )
    if BB_WINDOW[1] in arms:
        shown = _bb_sinks(arms[BB_WINDOW[1]])
        choices["window_visible_sink"] = most(shown)
        size = arms[BB_WINDOW[1]].get("window")
        window = f"a {size}-token window" if size else "a sliding window"
        out.append(
            either(
                most(shown),
                f"In {window} that keeps the first token visible it forms as with full attention ({_count(shown)}).",
                f"In {window} that keeps the first token visible it does not form ({_count(shown)}), unlike full "
                "attention.",
            )
        )
    return out


def _count(flags: list[bool]) -> str:
    """'5 of 5 seeds': how often a mechanism formed, without the interval the detail gives."""
    return f"{sum(flags)} of {_seeds(len(flags))}"


def _spread(values: list) -> str:
    """A per-seed value as its range over the seeds ('0.981-0.998'), or the one value."""
    xs = [x for x in values if x is not None]
    if not xs:
        return "-"
    return f"{min(xs):.3f}" if len(xs) == 1 or min(xs) == max(xs) else f"{min(xs):.3f}-{max(xs):.3f}"


COPY_SOLVED = 0.95  # copy accuracy at which the testbed's task counts as learned (AdamW reaches 0.99+)


def _bb_sinks(arm: dict) -> list[bool]:
    """Per seed of a testbed arm: do its dormant queries put more than the sink threshold on the first token?"""
    return [x is not None and x > SINK_THRESHOLD for x in arm["dormant"]]


def _testbed(bb: dict | None) -> tuple[bool, bool | str | None, list[str]]:
    """Claim 13 on the Bigram-Backcopy testbed (studies.sinks_bb_measurements): whether a sink forms in
    most seeds with softmax and AdamW, the cause's verdict (None when the testbed cannot give one: no
    report, or no sink to remove) and the sentences that say so."""
    from .studies import BB_BASE, BB_SGD, BB_SIGMOID, BB_SLOTS

    if bb is None:
        return False, None, ["The sinks testbed has no report here (`make sweep SWEEP=sinks_bb SEEDS=5` writes it)."]
    arms, sinks = bb["arms"], _bb_sinks
    base = arms.get(BB_BASE)
    if base is None:
        return False, None, [f"The sinks testbed ({bb['source']}) has no softmax + AdamW cell."]
    forms = most(sinks(base))
    text = [
        f"In the Bigram-Backcopy testbed ({bb['source']}: one layer, one head; trigger queries need the previous token, the "
        f"others nothing), with softmax and AdamW the first-token weight of the dormant queries ends at {_spread(base['dormant'])} "
        f"over {_seeds(len(base['seeds']))} (active queries {_spread(base['active'])}, uniform attention about "
        f"{bb['uniform']:.3f}; copy accuracy {_spread(base['copy_acc'])}): a sink forms in {_k_of_n(sinks(base))}."
    ]
    slots = {name: arms[name] for name in BB_SLOTS if name in arms}
    for name, arm in slots.items():
        text.append(
            f"With {name}: a sink in {_k_of_n(sinks(arm))}, dormant first-token weight {_spread(arm['dormant'])}, "
            f"escape mass {_spread(arm['escape'])}, copy accuracy {_spread(arm['copy_acc'])}."
        )
    if BB_SGD in arms:
        arm = arms[BB_SGD]
        solved = all(x is not None and x >= COPY_SOLVED for x in arm["copy_acc"])
        text.append(
            f"With SGD in place of AdamW: a sink in {_k_of_n(sinks(arm))}, dormant first-token weight "
            f"{_spread(arm['dormant'])}, copy accuracy {_spread(arm['copy_acc'])}"
            + (
                "."
                if solved
                else f", below the {COPY_SOLVED} that solves the copy task, so this arm does not separate the "
                "optimizer from how far training got."
            )
        )
    ways_out = dict(slots)  # the arms whose rows need not sum to one on the real keys: the cause's tests
    if BB_SIGMOID in arms:
        arm = ways_out[BB_SIGMOID] = arms[BB_SIGMOID]
        text.append(
            f"With {BB_SIGMOID}, Gu et al.'s test: a sink in {_k_of_n(sinks(arm))}, dormant first-token weight "
            f"{_spread(arm['dormant'])}, a row's total weight {_spread(arm.get('row_mass', []))}, copy accuracy "
            f"{_spread(arm['copy_acc'])}."
        )
    text += _gate_text(base, arms) + _window_text(base, arms, bb.get("window_loss"))
    if not forms:
        text.append("With no sink in most seeds, the testbed cannot test the cause either.")
        return False, None, text
    if not ways_out:
        return True, "the sinks testbed has no escape-slot or sigmoid arm (`make sweep SWEEP=sinks_bb`)", text
    slots = ways_out
    removed = [name for name, arm in slots.items() if not most(sinks(arm))]
    kept = [name for name in slots if name not in removed]
    if not kept:
        escape = [x for arm in slots.values() for x in arm["escape"] if x is not None]
        text.append(
            "The sink goes in most seeds of every arm whose rows need not sum to one"
            + (f" (an escape slot takes {_spread(escape)} of the weight)" if escape else "")
            + ", as 'softmax must sum to 1' predicts."
        )
        return True, True, text
    if not removed:
        text.append(
            "The sink stays in most seeds of every arm whose rows need not sum to one: offered a way to put weight "
            "nowhere, the dormant queries still put it on the first token, which 'softmax must sum to 1' alone does not explain."
        )
        return True, False, text
    text.append(f"The sink goes with {' and '.join(removed)} and stays with {' and '.join(kept)}.")
    return True, (f"with {' and '.join(removed)}", f"with {' and '.join(kept)}"), text


GATE_PART = (
    "with rows still summing to one the sink stays (a per-head output gate, which Qiu et al. 2025 find removes it)"
)
WINDOW_PART = "a sink forms on the first token wherever it is visible (a sliding window that keeps it in view)"


def testbed_details(bb: dict | None) -> dict[str, bool]:
    """Claim 13's detail parts from the testbed's gate and window arms, where they exist and softmax + AdamW forms a
    sink: the gate keeps it (True) or removes it (False), the window that keeps the first token visible forms it."""
    from .studies import BB_BASE, BB_GATE, BB_WINDOW

    arms = (bb or {}).get("arms", {})
    if BB_BASE not in arms or not most(_bb_sinks(arms[BB_BASE])):
        return {}
    parts = {}
    if BB_GATE in arms:
        parts[GATE_PART] = most(_bb_sinks(arms[BB_GATE]))
    if BB_WINDOW[1] in arms:
        parts[WINDOW_PART] = most(_bb_sinks(arms[BB_WINDOW[1]]))
    return parts


def _above(a: list, b: list) -> bool:
    """Every value of ``a`` above every value of ``b`` (two arms' seed ranges that do not overlap)."""
    a, b = [x for x in a if x is not None], [x for x in b if x is not None]
    return bool(a and b) and min(a) > max(b)


def _rows_text(arm: dict, other: dict, other_name: str) -> str:
    """Where a row's weight goes, as far as max_prob and entropy_norm (over all queries) say, against another arm."""
    if not any(x is not None for x in arm.get("max_prob", [])) or not any(
        x is not None for x in other.get("max_prob", [])
    ):
        return "Where the dormant queries' weight goes instead is not measured here."
    spread = (
        "spreads its rows more"
        if _above(arm["entropy_norm"], other["entropy_norm"])
        else "concentrates its rows more"
        if _above(other["entropy_norm"], arm["entropy_norm"])
        else "spreads its rows about as much"
    )
    concentrated = all(x is not None and x > NEAR_ONE_HOT for x in arm["max_prob"])
    return (
        f"Over all queries (max_prob and entropy_norm do not separate dormant from active ones) a row's largest weight "
        f"averages {_spread(arm['max_prob'])} and entropy_norm {_spread(arm['entropy_norm'])}, against "
        f"{_spread(other['max_prob'])} and {_spread(other['entropy_norm'])} {other_name}: the head {spread}"
        + (
            f", its rows still peaked on one key on average (max_prob above {NEAR_ONE_HOT} in every seed)"
            if concentrated
            else f", not peaked on one key on average (max_prob at or below {NEAR_ONE_HOT} in some seed)"
        )
        + "; which keys take the dormant queries' weight is not measured."
    )


def _gate_text(base: dict, arms: dict) -> list[str]:
    """The gate arm: a sink or not with rows that still sum to one, and what that says of the cause."""
    from .studies import BB_GATE

    if BB_GATE not in arms:
        return []
    arm = arms[BB_GATE]
    kept = most(_bb_sinks(arm))
    return [
        f"With {BB_GATE} ({arm.get('source', 'the testbed')}; Qiu et al. 2025: a sigmoid of the layer input scales the "
        f"head's output, and the softmax's rows still sum to one): a sink in {_k_of_n(_bb_sinks(arm))}, dormant first-token weight {_spread(arm['dormant'])}, "
        f"copy accuracy {_spread(arm['copy_acc'])}.",
        either(
            kept,
            "The sink stays with the gate: a head that can shut its output still parks its dormant queries on the first "
            "token, unlike Qiu et al.'s finding, so here the sum-to-one constraint makes the sink whatever else the head "
            "can do.",
            "The gate keeps the softmax's sum to one, yet the sink goes: a head that can shut its output needs no place "
            "to park weight, so the sink is the head's way to do nothing, as Qiu et al. report, and the sum-to-one "
            "constraint alone does not make it.",
        ),
        _rows_text(arm, base, "with softmax alone"),
    ]


def _window_text(base: dict, arms: dict, loss: dict | None) -> list[str]:
    """The window arms: the first token out of view (no sink can form where it is not visible; the level and ceiling
    of the statistic there) and kept visible (a sink as with full attention, or not), and their val loss."""
    from .studies import BB_WINDOW

    out, hidden, shown = [], arms.get(BB_WINDOW[0]), arms.get(BB_WINDOW[1])
    if shown is not None:
        formed = most(_bb_sinks(shown))
        out.append(
            f"With {BB_WINDOW[1]} ({shown.get('source', 'the testbed')}): a sink in {_k_of_n(_bb_sinks(shown))}, dormant "
            f"first-token weight {_spread(shown['dormant'])}"
            + (f" (uniform attention in that window: {shown['uniform']:.3f})" if "uniform" in shown else "")
            + either(
                formed,
                ", as with full attention: the sink forms on the first token whenever the head can see it.",
                ", unlike full attention: with the first token in view the window's head does not park its dormant "
                "queries there.",
            )
        )
    if hidden is not None:
        level = ""
        if "uniform" in hidden:
            above = all(x is not None and x > hidden["uniform"] for x in hidden["dormant"])
            level = (
                f"; the first token is visible to {hidden['queries_seeing']} of the {hidden['queries']} queries the "
                f"statistic counts, so it can read at most {hidden['ceiling']:.3f} there, and uniform attention in that "
                f"window reads {hidden['uniform']:.3f}"
                + either(
                    above,
                    " (every seed above it: the queries that see the first token lean on it more than uniform)",
                    " (not every seed above it)",
                )
            )
        out.append(
            f"With {BB_WINDOW[0]} ({hidden.get('source', 'the testbed')}): dormant first-token weight {_spread(hidden['dormant'])}, a sink in "
            f"{_k_of_n(_bb_sinks(hidden))}{level}. No first-token sink can form for the queries that do not see the "
            "first token."
        )
        other, name = (
            (shown, "with the first token kept visible") if shown is not None else (base, "with full attention")
        )
        out.append(_rows_text(hidden, other, name))
    if hidden is not None and shown is not None:
        same = loss is None or not loss.get("beyond_noise")
        out.append(
            f"Val loss is {_spread(hidden['val_loss'])} without the first token in view and {_spread(shown['val_loss'])} "
            "with it: "
            + (
                "not compared in the window report."
                if loss is None
                else either(
                    same,
                    f"no difference beyond seed noise (Holm p {loss['p_holm']:.2f}): the model does as well without a first-token sink.",
                    f"they differ beyond seed noise (by {loss['diff']:+.3g} nats with the first token, Holm p "
                    f"{loss['p_holm']:.2g}).",
                )
            )
        )
    return out
