"""Learning-rate sensitivity (Wortsman et al. 2023) of a study whose grid has ``optim.lr``.

Per model size and arm (the other axes), each seed's LR sensitivity over the grid, its mean with a 95 % t
interval, the critical learning rate, the largest attention logit per layer at each rate, the sentences that
say what these show, and the plot in the layout of the paper's Fig. 1 (one panel per size, one line per arm).
A run that failed (diverged, non-finite loss) counts as the initial loss, as in the paper.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ...data.tokens import load_tokenizer, padded  # noqa: E402
from .aggregate import Cell, RunResult, short  # noqa: E402
from .numbers import mean_ci, mean_interval, plain, signed_ci  # noqa: E402
from .significance import ALPHA, t_critical, welch  # noqa: E402

LR_AXIS = "optim.lr"
SIZE_AXES = ("model", "model.d_model", "model.n_layer")  # the axes that change the model's size
# The critical LR: the first grid rate above the best whose final loss is at least this fraction of the way
# from the best loss to the context-free (unigram) level, or to the initial loss where that level is not
# known (0.5: halfway, a loss that has clearly come apart). A model that comes apart on this corpus falls back
# to predicting token frequencies, the unigram level, not to the initial loss.
CRITICAL_FRACTION = 0.5
NEAR = 0.1  # nats: a final loss this close to the unigram level is a model that ignores its context


def initial_loss(run: RunResult) -> float:
    """Loss of a uniform prediction over the model's vocabulary, ln(V): what a freshly initialised model
    scores. V is the run's tokenizer's size, padded as the token data pads it for the model."""
    try:
        vocab = load_tokenizer(run.dir).vocab_size
    except Exception:  # no vocab.json: a run from elsewhere; the sensitivity then has no ceiling
        return math.nan
    data = run.results.get("config", {}).get("data") or {}
    return math.log(padded(vocab, data.get("vocab_multiple") or 1) if "vocab_multiple" in data else vocab)


@dataclass
class Arm:
    """One line of the Fig. 1 plot: a size and a combination of the other axes, over the LR grid."""

    size: str
    setting: dict[str, str]  # the other axes' values by short name (all but the LR and the size)
    initial: float
    lrs: list[float]
    params: int = 0  # 12 x layers x d_model^2: the parameters outside the embeddings, as Wortsman et al. count
    context_free: float | None = None  # the corpus's unigram level, where the report knows it
    losses: dict[float, dict] = field(default_factory=dict)  # lr -> {seed: min(final val loss, initial)}
    failed: dict[float, int] = field(default_factory=dict)  # lr -> runs that ended without a finite loss
    logits: dict[float, list[float | None]] = field(default_factory=dict)  # lr -> per layer, mean over seeds

    @property
    def arm(self) -> str:
        return label(self.setting)

    @property
    def qk_norm(self) -> bool | None:
        """The arm's qk-norm setting, None where qk-norm is not an axis (swept values arrive as strings)."""
        return {"true": True, "false": False}.get(str(self.setting.get("qk_norm")).lower())

    def rest(self, key: str) -> str:
        """The arm's label without one axis: what two arms that differ only in that axis share."""
        return label(self.setting, drop=key)

    @property
    def seeds(self) -> list:
        """The seeds with a run at every rate of the grid: the ones a sensitivity is computed for."""
        common = set.intersection(*(set(self.losses[lr]) for lr in self.lrs)) if self.lrs else set()
        return sorted(common, key=str)

    def per_seed(self, upper: bool = False) -> list[float]:
        """Each seed's sensitivity over the grid; ``upper``: over the rates from the arm's best one up only, the
        side where a loss comes apart, without the low rates that a short run leaves undertrained."""
        lrs = [lr for lr in self.lrs if lr >= self.best_lr] if upper else self.lrs
        return [
            statistics.fmean([self.losses[lr][s] for lr in lrs]) - min(self.losses[lr][s] for lr in self.lrs)
            for s in self.seeds
        ]

    def mean_loss(self, lr: float) -> float:
        return statistics.fmean(self.losses[lr].values())

    @property
    def best_lr(self) -> float:
        return min(self.lrs, key=self.mean_loss)

    @property
    def ceiling(self) -> float:
        """Where a loss that comes apart ends: the unigram level when known and above the best, else the initial."""
        best = self.mean_loss(self.best_lr)
        return self.context_free if self.context_free is not None and self.context_free > best else self.initial

    def critical_lr(self) -> float | None:
        """The first rate above the best whose mean final loss is at least CRITICAL_FRACTION of the way to the
        ceiling; None when no rate of the grid gets there."""
        best = self.mean_loss(self.best_lr)
        for lr in self.lrs:
            if lr > self.best_lr and self.mean_loss(lr) >= best + CRITICAL_FRACTION * (self.ceiling - best):
                return lr
        return None

    def summary(self) -> dict:
        values, upper = self.per_seed(), self.per_seed(upper=True)
        mean, ci = _mean_and_ci(values)
        upper_mean, upper_ci = _mean_and_ci(upper)
        return {
            "size": self.size,
            "arm": self.arm,
            "params_non_embedding": self.params,
            "seeds": len(values),
            "initial_loss": self.initial,
            "sensitivity": mean,
            "sensitivity_ci": ci,
            "sensitivity_per_seed": values,
            "upper_sensitivity": upper_mean,
            "upper_sensitivity_ci": upper_ci,
            "upper_sensitivity_per_seed": upper,
            "best_lr": self.best_lr,
            "best_loss": self.mean_loss(self.best_lr),
            "critical_lr": self.critical_lr(),
            "loss": {f"{lr:g}": self.mean_loss(lr) for lr in self.lrs},
            "failed_runs": {f"{lr:g}": k for lr, k in self.failed.items() if k},
            "max_logit": {f"{lr:g}": self.logits.get(lr) for lr in self.lrs},
        }


def label(setting: dict[str, str], drop: str | None = None) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items() if k != drop) or "all"


def _mean_and_ci(values: list[float]) -> tuple[float | None, list[float] | None]:
    """Mean over seeds and its 95 % t interval (None with fewer than two seeds)."""
    n = len(values)
    mean = statistics.fmean(values) if values else None
    std = statistics.stdev(values) if n > 1 else None
    return mean, list(mean_interval(mean, std, n) or []) or None


def _layers(run: RunResult) -> list[float | None]:
    n = run.results.get("config", {}).get("model", {}).get("n_layer", 0)
    return [run.metric(f"attn/L{i}/max_logit") for i in range(n)]


def _mean_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def arms(cells: list[Cell], axes: list[str], context_free: float | None = None) -> list[Arm]:
    """The study's cells as arms over the LR grid, ordered by size, then arm; ``context_free``: the corpus's
    unigram level (what a model that ignores its context scores), the ceiling of the critical rate."""
    size_axes = [a for a in axes if a in SIZE_AXES]
    rest = [a for a in axes if a != LR_AXIS and a not in size_axes]
    out: dict[tuple, Arm] = {}
    for cell in cells:
        size = ", ".join(f"{short(a) if a != 'model' else 'model'}={cell.axes[a]}" for a in size_axes)
        setting = {short(a): str(cell.axes[a]) for a in rest}
        lr = float(cell.axes[LR_AXIS])
        runs = cell.runs
        initial = next((v for r in runs if math.isfinite(v := initial_loss(r))), math.nan)
        model = next((r.results.get("config", {}).get("model") or {} for r in runs), {})
        params = 12 * model.get("n_layer", 0) * model.get("d_model", 0) ** 2
        entry = out.setdefault((size, label(setting)), Arm(size, setting, initial, [], params, context_free))
        if not math.isfinite(entry.initial):
            entry.initial = initial
        entry.lrs.append(lr)
        entry.losses[lr] = {}
        for run in runs:
            loss = run.metric("val/loss") if run.ok else None
            entry.losses[lr][run.seed] = min(loss, entry.initial) if loss is not None else entry.initial
        entry.failed[lr] = sum(1 for r in runs if not r.ok or r.metric("val/loss") is None)
        per_layer = list(zip(*(_layers(r) for r in cell.ok_runs))) if cell.ok_runs else []
        entry.logits[lr] = [_mean_or_none(list(layer)) for layer in per_layer]
    for entry in out.values():
        entry.lrs.sort()
    return sorted(out.values(), key=lambda a: a.params)  # stable: the cells' order within a size


# ---- what it shows ------------------------------------------------------------------------------------------


def qk_norm_findings(study: list[Arm], upper: bool = False) -> list[dict]:
    """Per size and setting of the other axes: the LR sensitivity without qk-norm minus with it, its Welch
    test over seeds, and whether the difference is beyond the seed-to-seed spread (p < 0.05)."""
    found = []
    with_qk_norm = {(b.size, b.rest("qk_norm")): b for b in study if b.qk_norm is True}
    for a in study:
        partner = with_qk_norm.get((a.size, a.rest("qk_norm"))) if a.qk_norm is False else None
        if partner is None:
            continue
        off, on = a.per_seed(upper), partner.per_seed(upper)
        test = welch(on, off)  # mean(off) - mean(on): what qk-norm takes off the sensitivity
        diff = statistics.fmean(off) - statistics.fmean(on) if off and on else math.nan
        half = t_critical(test.df) * abs(diff / test.t) if test and test.t else None
        found.append(
            {
                "size": a.size,
                "rest": a.rest("qk_norm"),
                "without": statistics.fmean(off) if off else None,
                "with": statistics.fmean(on) if on else None,
                "difference": diff,
                "ci": (diff - half, diff + half) if half else None,
                "p": test.p if test else None,
                "beyond_spread": bool(test and test.p < ALPHA),
            }
        )
    return found


def size_trend(study: list[Arm], upper: bool = False) -> list[dict]:
    """Per arm: the sensitivity at the smallest and the largest size, and whether they differ beyond the
    seed-to-seed spread (Welch, p < 0.05)."""
    sizes = list(dict.fromkeys(a.size for a in study))
    if len(sizes) < 2:
        return []
    out = []
    for name in dict.fromkeys(a.arm for a in study):
        first = next((a for a in study if a.arm == name and a.size == sizes[0]), None)
        last = next((a for a in study if a.arm == name and a.size == sizes[-1]), None)
        if first is None or last is None:
            continue
        small, large = first.per_seed(upper), last.per_seed(upper)
        test = welch(small, large)
        out.append(
            {
                "arm": name,
                "small": statistics.fmean(small) if small else None,
                "large": statistics.fmean(large) if large else None,
                "p": test.p if test else None,
                "beyond_spread": bool(test and test.p < ALPHA),
            }
        )
    return out


MEASURES = {False: "the LR sensitivity", True: "the sensitivity above the best rate"}


def qk_sentence(study: list[Arm], upper: bool = False) -> str | None:
    """Whether qk-norm changes a sensitivity beyond the seed-to-seed spread, and where."""
    qk, what = qk_norm_findings(study, upper), MEASURES[upper]
    if not qk:
        return None
    lower = [f for f in qk if f["beyond_spread"] and f["difference"] > 0]
    higher = [f for f in qk if f["beyond_spread"] and f["difference"] < 0]
    if all(f["p"] is None for f in qk):
        return f"qk-norm's difference to {what} is untested: no setting has the seeds to measure their spread."
    if not lower and not higher:
        return (
            f"qk-norm makes no difference to {what} beyond the seed-to-seed spread in any of the {len(qk)} size and "
            "scaling settings."
        )

    def where(fs):
        return "; ".join(f"{f['size'] or 'all'}, {f['rest']}: {f['without']:.3f} vs {f['with']:.3f}" for f in fs)

    parts = []
    if lower:
        parts.append(
            f"lowers {what} in {len(lower)} of {len(qk)} size and scaling settings (without vs with: {where(lower)})"
        )
    if higher:
        parts.append(f"raises it in {len(higher)} ({where(higher)})")
    rest = len(qk) - len(lower) - len(higher)
    tail = f"; in the other {rest} the difference is within the seed-to-seed spread" if rest else ""
    return f"Beyond the seed-to-seed spread, qk-norm {' and '.join(parts)}{tail}."


def trend_sentence(study: list[Arm], upper: bool = False) -> str | None:
    """Whether a sensitivity changes from the smallest size to the largest beyond the seed-to-seed spread."""
    trend, what = size_trend(study, upper), MEASURES[upper]
    if not trend:
        return None
    sizes = list(dict.fromkeys(a.size for a in study))
    span = f"from {sizes[0]} to {sizes[-1]}"
    moved = [t for t in trend if t["beyond_spread"]]
    if all(t["p"] is None for t in trend):
        return f"Whether {what} changes {span} is untested: no arm has the seeds to measure their spread."
    if not moved:
        return f"{what[0].upper() + what[1:]} does not change {span} beyond the seed-to-seed spread in any of the {len(trend)} arms."
    words = "; ".join(
        f"{'grows' if t['large'] > t['small'] else 'falls'} for {t['arm']} ({t['small']:.3f} to {t['large']:.3f})"
        for t in moved
    )
    rest = len(trend) - len(moved)
    tail = f"; it does not change beyond the spread for the other {rest}" if rest else ""
    return f"{span[0].upper() + span[1:]}, {what} {words}{tail}."


def _qk_group(a: Arm) -> str:
    return {False: "without qk-norm", True: "with qk-norm"}.get(a.qk_norm, "all")


def critical_sentences(study: list[Arm]) -> list[str]:
    """Where the loss comes apart (the critical rate, per qk-norm setting) and what it comes apart to."""
    if not study:
        return []
    out = []
    top = max(max(a.lrs) for a in study)
    known = study[0].context_free is not None
    towards = "the unigram level" if known else "the initial loss"
    groups: dict[str, list] = {}
    for a in study:
        groups.setdefault(_qk_group(a), []).append(a.critical_lr())
    parts = []
    for name, values in groups.items():
        hit = sorted(v for v in values if v is not None)
        if not hit:
            parts.append(f"none up to {top:g} in any of the {len(values)} arms {name}")
            continue
        span = f"{hit[0]:g}" if hit[0] == hit[-1] else f"{hit[0]:g} to {hit[-1]:g}"
        rest = (
            f" ({len(values) - len(hit)} of {len(values)} reach none up to {top:g})" if len(hit) < len(values) else ""
        )
        parts.append(f"{span} {name}{rest}")
    out.append(
        f"The critical learning rate (the first rate above the best whose loss is halfway to {towards}) is "
        + "; ".join(parts)
        + "."
    )
    if known:
        level = study[0].context_free
        collapsed = [a for a in study if abs(a.mean_loss(max(a.lrs)) - level) < NEAR]
        out.append(
            f"At lr {top:g}, {len(collapsed)} of {len(study)} arms end within {NEAR} nats of the unigram level "
            f"({level:.3f}), a model that predicts token frequencies and ignores its context."
        )
    return out


def sentences(study: list[Arm]) -> list[str]:
    """What the study shows, one quotable sentence per question, worded by the measured values."""
    out = [s for upper in (False, True) for s in (qk_sentence(study, upper), trend_sentence(study, upper)) if s]
    out += critical_sentences(study)
    peaks = [
        (a, lr, max(v for v in a.logits[lr] if v is not None))
        for a in study
        for lr in a.lrs
        if a.logits.get(lr) and any(v is not None for v in a.logits[lr])
    ]
    if peaks:
        off = [p for p in peaks if p[0].qk_norm is False]
        on = [p for p in peaks if p[0].qk_norm is True]
        if off and on:
            a_off, lr_off, v_off = max(off, key=lambda p: p[2])
            a_on, lr_on, v_on = max(on, key=lambda p: p[2])
            out.append(
                f"The largest attention logit of any layer reaches {plain(v_off)} without qk-norm "
                f"({a_off.size + ', ' if a_off.size else ''}{a_off.rest('qk_norm')}, lr {lr_off:g}) and "
                f"{plain(v_on)} with it ({a_on.size + ', ' if a_on.size else ''}{a_on.rest('qk_norm')}, lr {lr_on:g})."
            )
    return out


# ---- the report ----------------------------------------------------------------------------------------------


def table(study: list[Arm]) -> tuple[list[str], list[list[str]]]:
    header = [
        "size (non-embedding parameters)",
        "arm",
        "LR sensitivity [95 % CI]",
        "above the best rate [95 % CI]",
        "seeds",
        "best lr",
        "best loss",
        "critical lr",
        f"loss at lr {max(max(a.lrs) for a in study):g}",
        "failed runs",
    ]
    rows = []
    for a in study:
        s = a.summary()
        ci = tuple(s["sensitivity_ci"]) if s["sensitivity_ci"] else None
        rows.append(
            [
                f"{a.size or '-'} ({a.params / 1e6:.2g}M)" if a.params else a.size or "-",
                a.arm,
                mean_ci(s["sensitivity"], ci),
                mean_ci(
                    s["upper_sensitivity"], tuple(s["upper_sensitivity_ci"]) if s["upper_sensitivity_ci"] else None
                ),
                str(s["seeds"]),
                f"{s['best_lr']:g}",
                f"{s['best_loss']:.3f}",
                f"{s['critical_lr']:g}" if s["critical_lr"] is not None else f"> {max(a.lrs):g}",
                f"{a.mean_loss(max(a.lrs)):.3f}",
                str(sum(a.failed.values())),
            ]
        )
    return header, rows


def logit_tables(study: list[Arm]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per size: the largest attention logit of each layer (mean over seeds) at each rate, one column per arm."""
    out = []
    for size in dict.fromkeys(a.size for a in study):
        group = [a for a in study if a.size == size]
        lrs = sorted({lr for a in group for lr in a.lrs})
        header = ["lr", *(a.arm for a in group)]
        rows = [
            [
                f"{lr:g}",
                *(
                    " / ".join(plain(v, 1) if v is not None else "-" for v in a.logits.get(lr) or []) or "-"
                    for a in group
                ),
            ]
            for lr in lrs
        ]
        out.append((size or "all", header, rows))
    return out


def qk_table(study: list[Arm]) -> tuple[list[str], list[list[str]]]:
    header = ["size", "other axes", "without qk-norm", "with qk-norm", "difference [95 % CI]", "p (Welch)"]
    rows = [
        [
            f["size"] or "-",
            f["rest"],
            f"{f['without']:.3f}",
            f"{f['with']:.3f}",
            signed_ci(f["difference"], f["ci"]),
            "-" if f["p"] is None else f"{f['p']:.2g}",
        ]
        for f in qk_norm_findings(study)
    ]
    return header, rows


def blocks(study: list[Arm]) -> list[tuple]:
    """The report's section: what it shows, the table per size and arm, qk-norm's difference, the logits."""
    top = max(max(a.lrs) for a in study)
    out = [
        ("h2", "LR sensitivity (Wortsman et al. 2023)"),
        ("p", " ".join(sentences(study))),
        (
            "p",
            "LR sensitivity: per seed, the mean over the LR grid of min(final val loss, initial loss) minus the best "
            "of those losses (a failed run counts as the initial loss, ln of the vocabulary); mean over seeds [95 % t "
            f"interval]. Lower is more robust. Above the best rate: the same mean taken over the rates from the arm's "
            "best one up, the side where a loss comes apart (a short run leaves the lowest rates undertrained, which "
            f"the full mean counts too). Critical lr: the first rate above the best whose mean final loss is at "
            f"least halfway from the best loss to the unigram level, or to the initial loss where the corpus is not readable "
            f"(> {top:g}: none on the grid). Differences are "
            "called beyond the seed-to-seed spread where Welch's t-test over seeds gives p < 0.05.",
        ),
        ("table", *table(study)),
    ]
    if qk_norm_findings(study):
        out += [("h3", "qk-norm's difference"), ("table", *qk_table(study))]
    out.append(("h3", "Largest attention logit per layer (L0 / L1 / ..., mean over seeds, final step)"))
    for size, header, rows in logit_tables(study):
        out += [("p", f"**{size}**"), ("table", header, rows)]
    return out


def to_json(study: list[Arm]) -> dict:
    return {
        "arms": [a.summary() for a in study],
        "qk_norm": qk_norm_findings(study),
        "size_trend": size_trend(study),
        "qk_norm_upper": qk_norm_findings(study, upper=True),
        "size_trend_upper": size_trend(study, upper=True),
        "sentences": sentences(study),
        "critical_fraction": CRITICAL_FRACTION,
    }


def plot(study: list[Arm], path: Path) -> Path | None:
    """Final loss against the learning rate, one panel per size, one line per arm (the paper's Fig. 1):
    mean over seeds with the seeds' range as error bars, the initial loss dashed, the unigram level dotted."""
    sizes = list(dict.fromkeys(a.size for a in study))
    if not sizes:
        return None
    names = list(dict.fromkeys(a.arm for a in study))
    colour = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes) + 1.6, 3.2), sharey=True, squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for a in (x for x in study if x.size == size):
            ys = [a.mean_loss(lr) for lr in a.lrs]
            lo = [y - min(a.losses[lr].values()) for y, lr in zip(ys, a.lrs)]
            hi = [max(a.losses[lr].values()) - y for y, lr in zip(ys, a.lrs)]
            ax.errorbar(a.lrs, ys, yerr=[lo, hi], marker="o", ms=3, capsize=2, label=a.arm, color=colour[a.arm])
        initial = next(a.initial for a in study if a.size == size)
        if math.isfinite(initial):
            ax.axhline(initial, color="k", ls="--", lw=0.8, label="initial loss ln(V)")
        if study[0].context_free is not None:
            ax.axhline(study[0].context_free, color="grey", ls=":", lw=1.0, label="unigram level")
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
