"""The training claims' judgements (8, 10, 12, 13): measurements -> (verdict, detail).

Pure functions of plain numbers, kept apart from the runs that produce them, so a test can feed
each one the opposite measurements and see both the verdict and the text turn. Every sentence that
states an outcome has both branches written; the one that holds is printed.
"""
from __future__ import annotations

from .verdict import combine, verdict

FAIL_RATIO = 0.5  # an unscaled run "fails" when it reaches less than half the scaled run's loss drop
SINK_THRESHOLD = 0.3  # Gu et al. 2024: a head is a sink head when its mean first-token weight > 0.3
NEAR_ONE_HOT = 0.5  # mean max prob above which we call the softmax saturated


def _pct(x: float) -> str:
    return f"{x:.0%}"


def judge_8(m: dict) -> tuple[str, str]:
    """Claim 8 (without scaling, training fails through a saturated softmax and a vanishing gradient).

    ``m``: jacobian {n, at_1, peak, peak_std, at_11, at_max, max_std}; pairs {name: {ratio, gap}};
    steps; init_002 {logit_std, max_prob} (unscaled, d_k 128, init std 0.02);
    fanin {logit_std, max_prob, grad_ratio, gap} (unscaled vs scaled, d_k 128, fan-in init)."""
    j, pairs, f, i = m["jacobian"], m["pairs"], m["fanin"], m["init_002"]
    fails = {name: p["ratio"] < FAIL_RATIO for name, p in pairs.items()}
    v, why = combine({f"training fails without scaling (unscaled run reaches < {FAIL_RATIO:.0%} of the scaled run's loss drop)": all(fails.values())})
    vanished = j["at_11"] < 0.1 * j["peak"]
    text = [
        f"Over n = {j['n']} keys ||diag(p) - pp^T||_F is {j['at_1']:.2f} at logit std 1 (scaled), peaks at {j['peak']:.2f} at std "
        f"{j['peak_std']:g}, and is {j['at_11']:.2f} at std 11.3 (unscaled, d_k = 128) and {j['at_max']:.3f} at std {j['max_std']:g}: "
        + ("at the unscaled logit size the Jacobian has all but vanished, as the article says."
           if vanished else f"it shrinks as p -> one-hot, but slowly: at the unscaled logit size it is still "
           f"{_pct(j['at_11'] / j['peak'])} of its peak, not near 0."),
    ]
    if all(fails.values()):
        lead = "Training does fail without scaling: "
    elif not any(fails.values()):
        lead = "Training does not fail without scaling: "
    else:
        lead = "Training fails without scaling in some pairs only: "
    text.append(lead + "; ".join(f"{k}: {_pct(p['ratio'])} of the scaled run's loss drop, final loss gap {p['gap']:+.3f}"
                                 for k, p in pairs.items()) + f" ({m['steps']} steps; failing = under {_pct(FAIL_RATIO)}).")
    text.append(f"With init std 0.02, unscaled logits at d_k = 128 start with std {i['logit_std']:.2f} (max p {i['max_prob']:.2f}): "
                + ("the softmax is far from one-hot at init." if i["max_prob"] < NEAR_ONE_HOT else "the softmax is already near one-hot at init."))
    text.append(
        f"With fan-in init (unit-variance q, k: unscaled logit std {f['logit_std']:.1f}, max p {f['max_prob']:.2f}) the unscaled run ends "
        + (f"worse by {f['gap']:.3f}" if f["gap"] > 0 else f"no worse ({f['gap']:+.3f})")
        + ", and its q/k weight gradient at init is "
        + (f"{f['grad_ratio']:.1f}x the scaled run's: not vanishing, since the missing 1/sqrt(d) factor multiplies the gradient too."
           if f["grad_ratio"] >= 1 else f"{f['grad_ratio']:.2f}x the scaled run's: smaller, as a vanishing gradient would make it."))
    if v != verdict(True):
        text.append("Slower in places, not failed." if any(p["gap"] > 0 for p in pairs.values()) else "Not slower either.")
    return v, " ".join(text) + f" {why}."


def judge_10(m: dict) -> tuple[str, str]:
    """Claim 10 (with init variance sigma^2 the right scale is 1/(sigma^2 sqrt d)).

    ``m``: math_ok, component_ok, weight_ok, after_min, after_max; training None (fast mode) or
    {sigma_init_logit_std, scaled_init_logit_std, sigma_final_loss, scaled_final_loss, sigma_final_logit_std}."""
    ok = m["math_ok"] and m["component_ok"]
    text = [
        ("Math holds" if m["math_ok"] else "Math does not hold")
        + f": dividing by sigma^2 sqrt(d) gives std {m['after_min']:.3f}-{m['after_max']:.3f}.",
        f"In the model the rule {'holds' if m['component_ok'] else 'does not hold'} with sigma = std of q/k components "
        f"({'matches' if m['component_ok'] else 'does not match'} the measured logit std) and "
        f"{'also holds' if m['weight_ok'] else 'not'} with sigma = weight init std (off by d_model = 128).",
    ]
    t = m.get("training")
    if t is None:
        text.append("(Training check: full mode.)")
    else:
        a, b = t["sigma_final_loss"], t["scaled_final_loss"]
        unit = abs(t["sigma_init_logit_std"] - 1) < 0.25
        moved = abs(t["sigma_final_logit_std"] - 1) > 0.5
        text.append(
            f"Training: the sigma rule {'does' if unit else 'does not'} give unit logit std at init ({t['sigma_init_logit_std']:.2f} "
            f"vs {t['scaled_init_logit_std']:.3f} for 1/sqrt(d)) and ends at loss {a:.3f}, "
            + ("lower than" if a < b else "higher than" if a > b else "equal to") + f" 1/sqrt(d)'s {b:.3f}; "
            + (f"unit scale holds only at init, since the q/k scale moves in training (logit std {t['sigma_final_logit_std']:.1f} at the end)."
               if moved else f"the logit std stays near 1 in training ({t['sigma_final_logit_std']:.2f} at the end)."))
    return verdict(ok), " ".join(text)


HEAD_PARTS = {"positional": "positional heads in the shallow layers", "induction": "induction heads in the later layers",
              "sink": "sink heads in every layer"}
POSITIONAL_TYPES = ("previous_token", "positional")  # the article's "positional": attending by offset, whatever the content
KNOCKOUT_LARGE = 0.5  # cutting a layer's induction edges removes at least half of the right token's probability


def seeds_with(layer: dict[str, list[int]], kinds) -> list[bool]:
    """``layer``: {head type: heads of that type per seed} -> per seed, whether it has a head of one of ``kinds``."""
    seeds = max((len(v) for v in layer.values()), default=0)
    return [any(layer.get(k, [0] * seeds)[s] > 0 for k in kinds) for s in range(seeds)]


def most(flags: list[bool]) -> bool:
    """A mechanism counts as formed when it forms in more than half of the seeds (all of one)."""
    return 2 * sum(flags) > len(flags)


def _k_of_n(flags: list[bool]) -> str:
    return f"{sum(flags)} of {len(flags)} seeds" if len(flags) > 1 else ("the seed" if all(flags) else "no seed")


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


def judge_12(m: dict) -> tuple[str, str]:
    """Claim 12 (head types in trained models), from three models: the character model repro trains
    (``text``: n_layer, steps, val_loss, seed, types = per layer {type: [count]}), the induction_heads
    study (``induction``: studies.induction_measurements, or None) and the sinks study (``sinks``:
    studies.sinks_measurements, or None)."""
    t, ind, snk = m["text"], m.get("induction"), m.get("sinks")
    shallow = range(max(1, t["n_layer"] // 2))
    found = {
        "positional": any(most(seeds_with(t["types"][i], POSITIONAL_TYPES)) for i in shallow),
        "induction": any(most(seeds_with(layer, ("induction",))) for layer in t["types"][1:]),
        "sink": all(most(seeds_with(layer, ("sink",))) for layer in t["types"]),
    }
    text = [f"The {t['n_layer']}-layer character model trained here ({t['steps']} steps, val loss {t['val_loss']:.2f}, seed {t['seed']}) "
            f"has the head types [{_types_text(t['types'])}]."]
    if ind is None:
        text.append("The induction_heads study has no report here (`make sweep SWEEP=induction_heads SEEDS=3` writes it), "
                    "so induction heads are judged on the character model alone.")
    else:
        two, n = ind["two_layer"], ind["seeds"]
        types = two["types"] or [{}, {}]
        l0, l1 = seeds_with(types[0], POSITIONAL_TYPES), seeds_with(types[1], ("induction",))
        both = [a and b for a, b in zip(l0, l1)]
        knocked = two["knockout_L1"] is not None and two["knockout_L1"]["mean"] >= KNOCKOUT_LARGE
        found["positional"] |= most(l0)
        found["induction"] |= most(l1) and knocked
        text.append(
            f"In the induction_heads study ({_seeds(n)}, 2 attention-only layers, {ind['source']}) the head types are [{_types_text(types)}]; "
            f"layer 0's best previous-token score is {_ms(two['previous_token_L0'], n)}, layer 1's best induction score "
            f"{_ms(two['induction_L1'], n)} against a best control of {_ms(two['control'], n)}, and cutting layer 1's induction edges "
            f"lowers the right token's probability by {_ms(two['knockout_L1'], n)} (copying accuracy {_ms(two['repeat_acc'], n)}): "
            + (f"the canonical circuit, a positional head in layer 0 and an induction head in layer 1, forms in {_k_of_n(both)}"
               if most(both) else f"an induction head in layer 1 in {_k_of_n(l1)}, a positional head in layer 0 in {_k_of_n(l0)}")
            + (f", and the knockout confirms layer 1's role (at least {KNOCKOUT_LARGE})." if knocked else
               f"; the knockout is below the {KNOCKOUT_LARGE} that would confirm layer 1's role."))
        if "one_layer" in ind:
            one = ind["one_layer"]
            text.append(f"The 1-layer model's best induction score is {_ms(one['induction_L0'], n)} "
                        f"(copying {_ms(one['repeat_acc'], n)}).")
    if snk is None:
        text.append("The sinks study has no report here (`make sweep SWEEP=sinks` writes it).")
    else:
        cell = snk["cells"].get("bos=true, sink=none")
        if cell is None:
            text.append(f"The sinks study ({snk['source']}) has no cell with BOS and no escape slot.")
        else:
            every = bool(cell["types"]) and all(most(seeds_with(layer, ("sink",))) for layer in cell["types"])
            found["sink"] |= every
            text.append(f"In the sinks study ({_seeds(cell['seeds'])}, {len(cell['sink_max'])} layers, text with BOS, no escape slot, {snk['source']}) "
                        f"the best sink head per layer scores {', '.join(f'{x:.3f}' for x in cell['sink_max'])}{_over(cell['seeds'])}: "
                        + ("a sink head in every layer." if every else "not a sink head in every layer."))
    v, why = combine({HEAD_PARTS[k]: ok for k, ok in found.items()})
    shown = [HEAD_PARTS[k] for k, ok in found.items() if ok]
    text.append(f"{why}." + (f" Shown here: {', '.join(shown)}." if shown and v != verdict(True) else ""))
    if v != verdict(True):
        text.append("The models here have 1-4 layers and see at most a few million tokens, the article describes large pretrained "
                    "LMs: what is missing is missing at this scale.")
    text.append("Syntactic heads are not tested (characters and random tokens have no syntax).")
    return v, " ".join(text)


SINK_PARTS = {"forms": f"the first token absorbs weight (a head whose mean first-token weight > {SINK_THRESHOLD})",
              "cause": "an escape slot takes the sink's weight (the 'softmax must sum to 1' cause)"}
ESCAPES = ("zero_logit", "learned")


def judge_13(m: dict) -> tuple[str, str]:
    """Claim 13 (an attention sink on the first token, because softmax must sum to 1). ``text``: the
    character model repro trains (init, final: mean sink mass per layer; top: largest head's mean
    first-token weight after training; n_sink_heads, uniform, steps); ``sinks``:
    studies.sinks_measurements (BOS x escape slot), or None."""
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
    text = [f"{lead}; sink mass per layer goes from {', '.join(f'{x:.3f}' for x in t['init'])} at init to "
            f"{', '.join(f'{x:.3f}' for x in t['final'])} after {t['steps']} steps, {where} (its windows start at a random character)."]
    forms, cause = top > SINK_THRESHOLD, False
    base = (snk or {}).get("cells", {}).get("bos=true, sink=none")
    if base is None:
        text.append("The sinks study (BOS x escape slot) has no report here (`make sweep SWEEP=sinks` writes it), so the cause is "
                    "not tested.")
    else:
        peak = max(base["sink_max"])
        forms |= peak > SINK_THRESHOLD
        text.append(f"In the sinks study ({_seeds(base['seeds'])}, text with a BOS token, {snk['source']}) the largest head's first-token "
                    f"weight per layer is {', '.join(f'{x:.3f}' for x in base['sink_max'])}{_over(base['seeds'])} without an escape slot (uniform "
                    f"attention: {snk['uniform']:.3f}): " + ("a sink forms on BOS." if peak > SINK_THRESHOLD else "no sink forms on BOS."))
        slots = {k: snk["cells"].get(f"bos=true, sink={k}") for k in ESCAPES}
        slots = {k: c for k, c in slots.items() if c is not None}
        for k, c in slots.items():
            escape = [x for x in c["escape_mass"] if x is not None]
            text.append(f"With the {k} slot: largest first-token weight {max(c['sink_max']):.3f}, escape mass per layer "
                        f"{', '.join(f'{x:.3f}' for x in escape) or '-'}.")
        if peak > SINK_THRESHOLD and slots:
            cause = all(max(c["sink_max"]) <= SINK_THRESHOLD for c in slots.values())
            text.append("The escape slot removes the sink: the weight that went to BOS now goes nowhere, as 'softmax must sum to 1' "
                        "predicts." if cause else "The sink stays with an escape slot: the slot does not take its place.")
        elif peak <= SINK_THRESHOLD:
            text.append("So the cause cannot be tested here: there is no sink for the slot to remove. Sinks are reported in models "
                        "pre-trained on billions of tokens (Gu et al. 2024); these runs see a few million.")
    v, why = combine({SINK_PARTS["forms"]: forms, SINK_PARTS["cause"]: cause})
    text.append(f"{why}.")
    return v, " ".join(text)
