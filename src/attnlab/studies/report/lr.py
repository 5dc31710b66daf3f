"""Learning-rate sensitivity (Wortsman et al. 2023) of a study whose grid has ``optim.lr``.

Per model size and arm (the other axes), each seed's LR sensitivity over the grid: the mean over the
rates of min(final val loss, initial loss) minus the best of those losses, a failed run counting as the
initial loss ln(V), as in the paper. ``sensitivity_frame`` turns runs.csv into one row per arm and seed,
so the question's contrasts (qk-norm at each size, and across sizes) are tested like any other metric.
Also per arm: the critical rate and the largest attention logit per layer at each rate.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from attnlab.data.tokens import load_tokenizer, padded
from attnlab.studies.report.aggregate import RunResult
from attnlab.util import significance
from attnlab.writing.pages import p_text, short, signed_ci, where

plt.switch_backend("agg")  # files only: no display is assumed, whatever the environment chose

LR_AXIS = "optim.lr"
SIZE_AXES = ("model", "model.d_model", "model.n_layer")  # the axes that change the model's size
# The critical LR: the first rate above the best whose mean final loss is this fraction of the way from the
# best loss to the context-free (unigram) level, or to the initial loss where that level is not known: a
# model that comes apart on a corpus falls back to predicting token frequencies, the unigram level.
CRITICAL_FRACTION = 0.5
METRICS = ("lr_sensitivity", "lr_sensitivity_upper")


def run_columns(run: RunResult) -> dict:
    """What the sensitivity needs beyond a run's metrics: its initial loss, ln of the vocabulary the model
    predicts over, and its parameters outside the embeddings (12 x layers x d_model^2, as the paper counts)."""

    config = run.results.get("config", {})
    model, data = config.get("model") or {}, config.get("data") or {}
    try:
        vocab = load_tokenizer(run.dir).vocab_size
        initial = math.log(padded(vocab, data.get("vocab_multiple") or 1) if "vocab_multiple" in data else vocab)
    except Exception:  # noqa: BLE001 - no vocab.json: the sensitivity then has no ceiling
        initial = math.nan
    return {
        "initial_loss": initial,
        "params_non_embedding": 12 * model.get("n_layer", 0) * model.get("d_model", 0) ** 2,
    }


@dataclass
class Arm:
    """One line of the paper's Fig. 1: a size and a setting of the other axes, over the LR grid."""

    size: dict[str, str]
    setting: dict[str, str]
    initial: float
    params: int
    losses: dict[float, dict] = field(default_factory=dict)  # lr -> {seed: min(final val loss, initial)}
    failed: dict[float, int] = field(default_factory=dict)
    logits: dict[float, list[float | None]] = field(default_factory=dict)  # lr -> per layer, mean over seeds

    @property
    def lrs(self) -> list[float]:
        return sorted(self.losses)

    @property
    def size_label(self) -> str:
        return ", ".join(f"{short(k) if k != 'model' else 'model'}={v}" for k, v in self.size.items())

    @property
    def label(self) -> str:
        return where(self.setting)

    @property
    def seeds(self) -> list:
        return sorted(set.intersection(*(set(s) for s in self.losses.values())), key=str)

    def mean_loss(self, lr: float) -> float:
        return statistics.fmean(self.losses[lr].values())

    @property
    def best_lr(self) -> float:
        return min(self.lrs, key=self.mean_loss)

    def per_seed(self, upper: bool = False) -> list[float]:
        """Each seed's sensitivity; ``upper``: over the rates from the arm's best up only, the side where a
        loss comes apart, without the low rates a short run leaves undertrained."""
        lrs = [lr for lr in self.lrs if lr >= self.best_lr] if upper else self.lrs
        return [
            statistics.fmean([self.losses[lr][s] for lr in lrs]) - min(self.losses[lr][s] for lr in self.lrs)
            for s in self.seeds
        ]

    def critical_lr(self, context_free: float | None) -> float | None:
        best = self.mean_loss(self.best_lr)
        ceiling = context_free if context_free is not None and context_free > best else self.initial
        return next(
            (
                lr
                for lr in self.lrs
                if lr > self.best_lr and self.mean_loss(lr) >= best + CRITICAL_FRACTION * (ceiling - best)
            ),
            None,
        )


def arms(frame: pd.DataFrame, axes: list[str]) -> list[Arm]:
    size_axes = [a for a in axes if a in SIZE_AXES]
    rest = [a for a in axes if a != LR_AXIS and a not in size_axes]
    layers = sorted(
        {c for c in frame.columns if c.startswith("attn/L") and c.endswith("/max_logit")},
        key=lambda c: int(c.split("/")[1][1:]),
    )
    out: dict[tuple, Arm] = {}
    for _, run in frame.iterrows():
        key = tuple(run[a] for a in size_axes + rest)
        initial = float(run.get("initial_loss", math.nan))
        arm = out.setdefault(
            key,
            Arm(
                {a: run[a] for a in size_axes},
                {a: run[a] for a in rest},
                initial,
                int(run.get("params_non_embedding", 0) or 0),
            ),
        )
        lr = float(run[LR_AXIS])
        loss = run["val/loss"] if run["status"] == "ok" else math.nan
        arm.losses.setdefault(lr, {})[run["seed"]] = min(loss, arm.initial) if loss == loss else arm.initial
        arm.failed[lr] = arm.failed.get(lr, 0) + int(loss != loss)
    for arm in out.values():
        for lr in arm.lrs:
            rows = frame[(frame[LR_AXIS].astype(float) == lr) & (frame["status"] == "ok")]
            rows = rows[[all(r[a] == v for a, v in {**arm.size, **arm.setting}.items()) for _, r in rows.iterrows()]]
            arm.logits[lr] = [None if rows[c].isna().all() else float(rows[c].mean()) for c in layers]
    return sorted(out.values(), key=lambda a: a.params)


def sensitivity_frame(arms: list[Arm]) -> pd.DataFrame:
    """One row per arm and seed with its sensitivities, laid out as runs.csv so the analysis tests it."""
    rows = []
    for arm in arms:
        for seed, full, upper in zip(arm.seeds, arm.per_seed(), arm.per_seed(upper=True)):
            rows.append(
                {**arm.size, **arm.setting, "seed": seed, "budget": "default", "status": "ok", "error": "", "run": ""}
                | dict(zip(METRICS, (full, upper)))
            )
    return pd.DataFrame(rows)


def plot(arms: list[Arm], context_free: float | None, path: Path, attention_free: float | None = None) -> Path | None:
    """Final loss against the learning rate, one panel per size, one line per arm (the paper's Fig. 1): mean over
    seeds with the seeds' range as error bars, the initial loss dashed, the unigram level dotted, and the
    attention-free (bigram) level a reference arm's best must beat for its comparison to be tested."""
    sizes = list(dict.fromkeys(a.size_label for a in arms))
    if not sizes:
        return None
    names = list(dict.fromkeys(a.label for a in arms))
    colour = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes) + 1.6, 3.2), sharey=True, squeeze=False)
    for ax, size in zip(axes[0], sizes):
        group = [a for a in arms if a.size_label == size]
        for a in group:
            ys = [a.mean_loss(lr) for lr in a.lrs]
            lo = [y - min(a.losses[lr].values()) for y, lr in zip(ys, a.lrs)]
            hi = [max(a.losses[lr].values()) - y for y, lr in zip(ys, a.lrs)]
            ax.errorbar(a.lrs, ys, yerr=[lo, hi], marker="o", ms=3, capsize=2, label=a.label, color=colour[a.label])
        if math.isfinite(group[0].initial):
            ax.axhline(group[0].initial, color="k", ls="--", lw=0.8, label="initial loss ln(V)")
        if context_free is not None:
            ax.axhline(context_free, color="grey", ls=":", lw=1.0, label="unigram level")
        if attention_free is not None:
            ax.axhline(attention_free, color="tab:red", ls="-.", lw=0.8, label="attention-free (bigram) level")
        ax.set_xscale("log")
        ax.set_title(size or "all", fontsize=9)
        ax.set_xlabel("learning rate")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final val loss")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    fig.suptitle("mean over seeds; bars: the seeds' range", fontsize=8, y=1.03)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


# Wortsman et al. 2023, Fig. 1, stated in our words; each is checked on the arms of the qk-norm axis.
SOURCE = "Wortsman et al. 2023, Fig. 1"
LOGIT_GROWTH = 10.0  # "many times": the no-qk-norm arm's largest logit at the top rate over the qk-norm arm's


def against_source(
    arms: list[Arm], family: list, interactions: list, difference: float, axis: str = "model.attention.qk_norm"
):
    """The paper's five statements about qk-layernorm and scale, each with what these arms measure, a verdict
    (agrees | disagrees | untested) and why it is untested, read by the rules the report's Answer reads:
    the budget rule (a size whose reference arm is not below the attention-free level answers nothing), the
    deciding test (exact at a few seeds a side) and "not resolved" for a tie. ``family`` and ``interactions``:
    the report's own Holm-corrected tests of qk-norm per size and across sizes."""
    off = [a for a in arms if str(a.setting.get(axis)).lower() == "false"]
    on = [a for a in arms if str(a.setting.get(axis)).lower() == "true"]
    if len(off) < 2 or len(on) < 2 or len(off) != len(on):
        return []
    per_size = [c for c in family if c.metric == METRICS[0] and c.axis == axis]
    # a statement across sizes needs every size it reads to use its attention (the Answer's budget rule)
    blocked = next((f"{c.where}: {c.unanswerable_because}" for c in per_size if c.unanswerable_because), None)
    sizes = f"{off[0].size_label} to {off[-1].size_label}"
    rows = [_signed_row(f"without qk-layernorm, LR sensitivity grows with model size ({sizes})", off, +1, blocked)]
    shown = [c for c in per_size if c.verdict == "lower"]
    against = [c for c in per_size if c.verdict in ("none", "higher")]
    open_ = [c for c in per_size if c.verdict == "untested"]
    rows.append(
        {
            "statement": "qk-layernorm lowers LR sensitivity at every size",
            "measured": f"lower beyond seed noise at {len(shown)} of {len(per_size)} sizes (Holm over the sizes)",
            "verdict": "disagrees" if against else "agrees" if per_size and not open_ else "untested",
            "why": None if against or not open_ else "; ".join(f"{c.where}: {c.untested_because}" for c in open_),
        }
    )
    flat = significance.welch(on[0].per_seed(), on[-1].per_seed())
    inside = flat is not None and -difference <= flat.lo and flat.hi <= difference
    beyond = flat is not None and (flat.lo > difference or flat.hi < -difference)
    few = flat is not None and min(flat.n_ref, flat.n_level) <= significance.EXACT_UP_TO
    rows.append(
        {
            "statement": f"with qk-layernorm, LR sensitivity stays flat as the model grows (within the study's {difference})",
            "measured": "-" if flat is None else f"{signed_ci(flat.diff, flat.lo, flat.hi)} (Welch's interval)",
            **_verdict(
                blocked
                or ("under two seeds a side" if flat is None else None)
                or (
                    f"not resolved: {flat.n_ref} and {flat.n_level} seeds a side give no interval that decides"
                    if few
                    else None
                )
                or (None if inside or beyond else f"not resolved: the interval reaches past {difference}"),
                "agrees" if inside else "disagrees",
            ),
        }
    )
    x = next((i for i in interactions if i.metric == METRICS[0] and i.test), None)
    rows.append(
        {
            "statement": "qk-layernorm's benefit grows with model size (the size x qk-norm interaction)",
            "measured": "-"
            if x is None
            else f"{signed_ci(x.test.diff, x.test.lo, x.test.hi)}, Holm p {p_text(x.p_holm)}",
            **_verdict(
                "no interaction tested" if x is None else x.untested_because or _tie(x.verdict),
                "agrees" if x is not None and x.verdict == "smaller" else "disagrees",
            ),
        }
    )
    top = max(off[-1].lrs)
    peak = [max((v for v in a.logits.get(top) or [] if v is not None), default=math.nan) for a in (off[-1], on[-1])]
    ratio = peak[0] / peak[1] if peak[1] and math.isfinite(peak[1]) else math.nan
    rows.append(
        {
            "statement": f"without qk-layernorm the attention logits grow many times larger at high rates (over {LOGIT_GROWTH:g}x at lr {top:g}, {off[-1].size_label})",
            "measured": f"largest logit {peak[0]:.4g} without, {peak[1]:.4g} with: {ratio:.3g}x (mean over seeds)",
            **_verdict(
                None if ratio == ratio else "no logits logged", "agrees" if ratio > LOGIT_GROWTH else "disagrees"
            ),
        }
    )
    return rows


def _verdict(why: str | None, decided: str) -> dict:
    return {"verdict": "untested", "why": why} if why else {"verdict": decided, "why": None}


def _tie(verdict: str) -> str | None:
    return "not resolved: no difference beyond seed noise at these seeds" if verdict == "none" else None


def _signed_row(statement: str, group: list[Arm], sign: int, blocked: str | None) -> dict:
    """The smallest size's arm against the largest's, decided as every comparison of the report is: the
    exact test at EXACT_UP_TO seeds a side or fewer, Welch's t beyond."""
    ref, lvl = group[0].per_seed(), group[-1].per_seed()
    welch = significance.welch(ref, lvl)
    if welch is None:
        return {"statement": statement, "measured": "-", **_verdict("under two seeds a side", "")}
    exact = significance.permutation(ref, lvl) if significance.exact_decides(ref, lvl) else None
    p, name = (exact.p, "exact") if exact else (welch.p, "Welch")
    measured = f"{signed_ci(welch.diff, *((None, None) if exact else (welch.lo, welch.hi)))}, {name} p {p_text(p)}"
    why = blocked or (
        f"{exact.n_ref} and {exact.n_level} seeds cannot reach p < {significance.ALPHA} by an exact test"
        if exact and not exact.reachable()
        else None
    )
    why = why or (f"not resolved: {name} p {p_text(p)}" if p >= significance.ALPHA else None)
    return {
        "statement": statement,
        "measured": measured,
        **_verdict(why, "agrees" if welch.diff * sign > 0 else "disagrees"),
    }
