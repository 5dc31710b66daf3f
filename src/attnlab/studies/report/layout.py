"""A study's report as a paper prints it, from its runs (``make table``) or from its committed files alone
(``--restat``): one model of the table (``Study``), one list of blocks, rendered to ablation.md and index.html.

- Each cell: the mean over seeds with its 95 % t interval (mean ± t_{0.975, n-1} · s / √n) and the seed count.
- The comparisons the study is run for (``significance.contrasts``: scaled vs unscaled twins, else each level
  against its axis's reference level), each with Welch's 95 % interval, raw and Holm p, and its direction in words.
- An attention-free (bigram) baseline row for a study on the text corpus (``attnlab.studies.report.baseline``).
- Per-seed values when the runs (or summary.json) carry them; else one sentence saying they are not committed.
- Machine measurements (throughput, peak memory) in a section of their own, labelled machine-dependent.
- Per-layer statistics as per-layer tables with intervals.
- A headline computed from the tested differences (``headline``), its wording chosen by their values.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ...markdown import markdown_table
from ...results import atomic_write_text
from .aggregate import short
from .lr import blocks as lr_blocks
from .lr import to_json as lr_json
from .numbers import mean_ci, mean_interval, plain, signed_ci
from .significance import (
    ALPHA,
    SCALING_AXIS,
    TEST_NAME,
    Contrast,
    Effect,
    _p,
    contrasts,
    factor_effects,
    k_of_n_text,
    scaling_pairs,
)
from .tables import HEAD_LAYER_STATS, HEAD_METRICS, LABELS

# Throughput and peak memory measure the machine the runs shared (other jobs, threads), not the model.
MACHINE_METRICS = ("perf/tokens_per_s", "mem/peak_bytes")
MACHINE_SCALE = {"mem/peak_bytes": 1 / 2**20}
# Cost metrics that are a property of the model (the KV cache a server keeps per token): in the main
# table when they vary between cells, which is when the study is about that cost.
MODEL_COST_METRICS = ("mem/kv_cache_bytes_per_token",)
# Besides the loss, the quantity a mechanism study measures, tested like the loss where runs logged it:
# layer 0's first-token weight from dormant queries (the Bigram-Backcopy sink testbed).
FOCUS_METRICS = ("attn/L0/sink_mass_dormant",)
LOSS_METRICS = ("val/loss",)
EXTRA_LABELS = {
    "heads/induction_max": "induction (best head)",
    "attn/L0/sink_mass_dormant": "first-token weight, dormant queries (L0)",
}
DERIVED = re.compile(r"(_ci95_lo|_ci95_hi|_per_seed)$")
LAYER = re.compile(r"/L(\d+)/")
HEAD_TYPES_NOTE = (
    "Each head's type from the final head analysis (`attnlab.analysis.heads.head_type`, docs/metrics.md): the "
    "number of heads of each type per seed, with the seeds that have one when not all do."
)


def label(key: str) -> str:
    return LABELS.get(key) or HEAD_METRICS.get(key) or EXTRA_LABELS.get(key) or key


# ---------------------------------------------------------------- the table's model
@dataclass
class Metric:
    """One metric of one cell: mean, sample std and count over seeds, and the per-seed values when known."""

    mean: float | None
    std: float | None
    n: int
    values: list[float] | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        return mean_interval(self.mean, self.std, self.n)


@dataclass
class TableCell:
    axes: dict[str, str]
    n_ok: int
    n_failed: int = 0
    errors: str = ""
    metrics: dict[str, Metric] = field(default_factory=dict)
    seeds: list | None = None  # per finished seed, in the order of every Metric.values
    dirs: list[str] | None = None

    def values(self, key: str) -> list[float]:
        """Per-seed values; without them, n stand-ins with exactly the cell's mean and sample std (all that
        Welch's test and the t interval read: ``restat.standins``)."""
        m = self.metrics.get(key)
        if m is None or m.mean is None:
            return []
        if m.values is not None:
            return list(m.values)
        from .restat import standins

        return standins(m.mean, m.std or 0.0, m.n)

    def mean(self, key: str) -> float | None:
        m = self.metrics.get(key)
        return None if m is None else m.mean

    def std(self, key: str) -> float | None:
        m = self.metrics.get(key)
        return None if m is None else m.std

    def interval(self, key: str) -> tuple[float, float] | None:
        m = self.metrics.get(key)
        return None if m is None else m.interval

    @property
    def label(self) -> str:
        return ", ".join(f"{short(k)}={v}" for k, v in self.axes.items()) or "all"


@dataclass
class Study:
    name: str  # the report dir's name: the title
    axes: list[str]
    cells: list[TableCell]
    keys: list[str]  # every metric, in ablation.csv's order
    layers: int
    sources: list[str] = field(default_factory=list)
    runs: int = 0
    failed: int = 0
    per_seed_known: bool = False
    baseline: dict | None = None
    recording: list[str] = field(default_factory=list)
    head_types: list[dict] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lr_arms: list = field(default_factory=list)  # lr.Arm per size and arm, where the grid has optim.lr
    plots: list[Path] = field(default_factory=list)
    restated: bool = False  # re-laid from the committed files (no runs)

    @property
    def run_keys(self) -> list[str]:
        return [k for k in self.keys if not LAYER.search(k)]

    @property
    def layer_templates(self) -> list[str]:
        return list(dict.fromkeys(LAYER.sub("/L{i}/", k, count=1) for k in self.keys if LAYER.search(k)))

    def present(self, key: str) -> bool:
        return any(c.mean(key) is not None for c in self.cells)

    @property
    def main_keys(self) -> list[str]:
        """The main table's metrics: run-level, not the machine's, a model cost only when it varies."""
        out = []
        for k in self.run_keys:
            if k in MACHINE_METRICS or not self.present(k):
                continue
            if k in MODEL_COST_METRICS and len({c.mean(k) for c in self.cells} - {None}) < 2:
                continue
            out.append(k)
        return out

    @property
    def machine_keys(self) -> list[str]:
        return [k for k in MACHINE_METRICS if k in self.keys and self.present(k)]

    @property
    def tested_metrics(self) -> list[str]:
        return [k for k in (*LOSS_METRICS, *FOCUS_METRICS) if k in self.keys and self.present(k)]

    @property
    def seeds_text(self) -> str:
        counts = sorted({c.n_ok for c in self.cells}) or [0]
        return f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def study_from_runs(name: str, cells, axes: list[str], keys: list[str], layers: int) -> Study:
    """The table's model from aggregated runs (``aggregate.Cell``): every value per seed."""
    out = []
    for c in cells:
        ok = c.ok_runs
        seeds = [r.seed for r in ok]
        metrics = {}
        for k in keys:
            per_run = [r.metric(k) for r in ok]
            vals = [v for v in per_run if v is not None]
            if not vals:
                continue
            metrics[k] = Metric(
                statistics.fmean(vals),
                statistics.stdev(vals) if len(vals) > 1 else 0.0,
                len(vals),
                vals if len(vals) == len(ok) else None,
            )
        errors = " | ".join(sorted({r.results.get("error") or "?" for r in c.failed}))
        out.append(TableCell(dict(c.axes), len(ok), len(c.failed), errors, metrics, seeds, [r.dir.name for r in ok]))
    return Study(name, list(axes), out, list(keys), layers, per_seed_known=True)


def _axis_text(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_raw_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """ablation.csv without the columns this module derives (intervals, per-seed values), as strings."""
    header, *body = list(csv.reader(io.StringIO(Path(path).read_text())))
    keep = [i for i, h in enumerate(header) if not DERIVED.search(h) and h != "seeds"]
    return [header[i] for i in keep], [[row[i] if i < len(row) else "" for i in keep] for row in body]


def study_from_committed(report: Path) -> Study:
    """The table's model from a committed report alone: ablation.csv's mean, sample std and seed count per
    cell, and summary.json's per-seed values, head types, phase changes and baseline where it has them."""
    report = Path(report)
    header, body = read_raw_csv(report / "ablation.csv")
    n_at = header.index("n_ok")
    axes = header[:n_at]
    keys = [h[: -len("_mean")] for h in header if h.endswith("_mean")]
    data = json.loads((report / "summary.json").read_text()) if (report / "summary.json").is_file() else {}
    per_seed = {tuple(sorted(c["axes"].items())): c["runs"] for c in data.get("per_seed", []) if c.get("runs")}
    cells = []
    for row in body:
        r = dict(zip(header, row))
        cell_axes = {a: r[a] for a in axes}  # as swept (the CSV keeps the override's text)
        n = int(float(r["n_ok"] or 0))
        runs = per_seed.get(tuple(sorted(cell_axes.items())))
        metrics = {}
        for k in keys:
            mean, std = _float(r.get(f"{k}_mean")), _float(r.get(f"{k}_std"))
            if mean is None:
                continue
            vals = [run["metrics"].get(k) for run in runs] if runs and len(runs) == n else None
            vals = vals if vals and all(v is not None for v in vals) else None
            metrics[k] = Metric(mean, std if std is not None else 0.0, n, vals)
        cells.append(
            TableCell(
                cell_axes,
                n,
                int(float(r.get("n_failed") or 0)),
                r.get("errors") or "",
                metrics,
                [run["seed"] for run in runs] if runs else None,
                [run["dir"] for run in runs] if runs else None,
            )
        )
    layers = 1 + max((int(m.group(1)) for k in keys if (m := LAYER.search(k))), default=-1)
    md = (report / "ablation.md").read_text() if (report / "ablation.md").is_file() else ""
    plots = [
        report / m.group(1)
        for m in re.finditer(r"^!\[[^\]]*\]\(([^)]+\.png)\)", md, re.M)
        if (report / m.group(1)).is_file()
    ]
    recording = data.get("recording_differences")
    if recording is None:  # written before summary.json kept them: the old header's sentence
        found = re.search(r"grouped regardless: (.*?)\.(?:\s|$)", md)
        recording = [p.strip() for p in re.split(r";\s*", found.group(1))] if found else []
    sources = data.get("sweep_dirs") or ([data["sweep_dir"]] if data.get("sweep_dir") else [])
    study = Study(
        report.name,
        axes,
        cells,
        keys,
        layers,
        sources,
        int(data.get("runs") or sum(c.n_ok + c.n_failed for c in cells)),
        int(data.get("failed") or sum(c.n_failed for c in cells)),
        bool(cells) and all(c.seeds is not None or c.n_ok <= 1 for c in cells),  # one seed: its value is the mean
        None,
        recording,
        data.get("head_types", []),
        data.get("phase_change_steps", []),
        [],
        {},
        plots,
        True,
    )
    # null: the study's data has none; absent: a report written before the baseline was kept
    study.baseline = (
        data["attention_free_level"]
        if "attention_free_level" in data
        else committed_baseline(data.get("study") or report.name)
    )
    return study


# ---------------------------------------------------------------- the attention-free baseline
def text_corpus(data_cfg: dict | None) -> bool:
    """Whether a run's data config is the default text corpus, the one ``attnlab.studies.report.baseline`` fits the bigram on."""
    if not data_cfg:
        return False
    return (
        str(data_cfg.get("_target_", "")).endswith("TextDataModule")
        and data_cfg.get("source", "shakespeare") == "shakespeare"
        and not data_cfg.get("path")
    )


def token_corpus_level(data_cfg: dict | None) -> dict | None:
    """The attention-free levels of a ``data=tokens`` run's corpus, where its directory is readable from here
    (a relative ``data.dir`` is taken from the current directory, as the run took it)."""
    if not data_cfg or not str(data_cfg.get("_target_", "")).endswith("TokenDataModule"):
        return None
    from pathlib import Path

    from ...data.tokens import read_meta
    from .baseline import token_levels

    directory = Path(data_cfg.get("dir") or "")
    try:
        meta = read_meta(directory)
    except Exception:  # noqa: BLE001 - an unreadable corpus: a report without the level, not no report
        return None
    vocab = data_cfg.get("vocab_size") or meta.get("vocab_size")
    dtype = data_cfg.get("dtype") or meta.get("dtype") or "uint16"
    return token_levels(directory, int(vocab), dtype) if vocab else None


def attention_free_level() -> dict:
    """The bigram (and unigram) cross-entropy of the val split, fitted on the train split: the repro's implementation."""
    from .baseline import attention_free_levels

    level = attention_free_levels()
    return {
        "bigram": level["bigram"],
        "unigram": level["unigram"],
        "chance": level["chance"],
        "vocab": level["vocab"],
        "split": "val",
        "source": "attnlab.studies.report.baseline.attention_free_levels",
    }


def committed_baseline(study: str) -> dict | None:
    """The baseline of a committed report that predates it: the study's experiment config says its data."""
    from ...config import CONF_DIR

    if not (
        CONF_DIR / "experiment" / f"{study}.yaml"
    ).is_file():  # run under another study's config: its data unknown here
        return None
    try:
        from omegaconf import OmegaConf

        from ...config import compose_config

        data_cfg = OmegaConf.to_container(compose_config([f"experiment={study}"]).data, resolve=False)
    except Exception:  # noqa: BLE001 - a config that no longer composes: no baseline rather than no report
        return None
    return attention_free_level() if text_corpus(data_cfg) else None


# ---------------------------------------------------------------- prose helpers
def _value(v: str) -> str:
    return "default" if v in ("-", "") else v


def _p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.2g}"


def _holm_clause(ps: list[float]) -> str:
    worst = max(ps)
    if worst < 0.001:
        return "Holm p < 0.001"
    return f"Holm p = {worst:.2g}" if len(ps) == 1 else f"Holm p ≤ {worst:.2g}"


def _magnitude(diffs: list[float]) -> str:
    lo, hi = min(map(abs, diffs)), max(map(abs, diffs))
    a, b = f"{lo:#.2g}", f"{hi:#.2g}"
    return a if a == b else f"{a}-{b}"


def _where_text(rests: list[dict]) -> str:
    """{d_k: 32, init: fan_in}, {d_k: 64, init: fan_in} -> 'd_k = 32, 64 with init_std = fan_in' (grouped on the
    axes after the first)."""
    if not rests or not rests[0]:
        return ""
    keys = list(rests[0])
    groups: dict[tuple, list[str]] = {}
    for r in rests:
        groups.setdefault(tuple((k, r[k]) for k in keys[1:]), []).append(_value(r[keys[0]]))
    parts = []
    for rest, firsts in groups.items():
        text = f"{short(keys[0])} = {', '.join(dict.fromkeys(firsts))}"
        if rest:
            text += " with " + ", ".join(f"{short(k)} = {_value(v)}" for k, v in rest)
        parts.append(text)
    return "; ".join(parts)


def subject(axis: str, level: str, reference: str) -> str:
    if axis == SCALING_AXIS and reference == "none":
        return "The 1/√d_k scale" if level == "inv_sqrt_d" else f"scaling={level}"
    return f"{short(axis)}={_value(level)} (against {_value(reference)})"


def metric_words(metric: str) -> tuple[str, str]:
    """How the prose names a metric, and its unit."""
    return ("val loss", " nats") if metric in LOSS_METRICS else (label(metric), "")


@dataclass
class Finding:
    """One clause of the headline: a comparison, the direction it was found in, where, by how much."""

    subject: str
    metric: str
    direction: str  # higher | lower | none | untested
    rests: list[dict]
    diffs: list[float]
    p_holm: list[float]
    everywhere: bool  # in every cell the comparison was made in


def findings(family: list[Contrast], metric: str) -> list[Finding]:
    """The contrasts of one metric grouped by comparison, direction and the axes after the first (so that each
    clause's magnitude belongs to one setting of them): what the headline says."""
    groups: dict[tuple, list[Contrast]] = {}
    for c in family:
        groups.setdefault((c.axis, c.level, c.reference), []).append(c)
    out = []
    for (axis, level, ref), group in groups.items():
        for direction in ("higher", "lower", "none", "untested"):
            cs = [c for c in group if c.direction == direction]
            everywhere = len(cs) == len(group)
            settings: dict[tuple, list[Contrast]] = {}
            for c in cs:
                settings.setdefault(() if everywhere else tuple(list(c.rest.items())[1:]), []).append(c)
            for sub in settings.values():
                out.append(
                    Finding(
                        subject(axis, level, ref),
                        metric,
                        direction,
                        [c.rest for c in sub],
                        [c.diff for c in sub],
                        [c.p_holm for c in sub if c.p_holm is not None],
                        everywhere,
                    )
                )
    return out


def _where(f: Finding) -> str:
    return f"at {_where_text(f.rests)}" if f.rests and f.rests[0] and not (f.everywhere and len(f.diffs) > 1) else ""


def _clause(f: Finding, unit: str) -> str:
    """'at d_k = 32, 64 with init_std = fan_in (by 0.33-0.49 nats, Holm p ≤ 0.0091)', or 'in every cell (...; by ...)'."""
    numbers = f"by {_magnitude(f.diffs)}{unit}, {_holm_clause(f.p_holm)}"
    if f.everywhere and len(f.diffs) > 1:
        return f"in every cell ({_where_text(f.rests)}; {numbers})" if f.rests[0] else f"in every cell ({numbers})"
    return f"{_where(f)} ({numbers})".strip()


def _range(lo: float, hi: float, unit: str = "") -> str:
    a, b = f"{lo:+#.2g}", f"{hi:+#.2g}"
    return f"{a}{unit}" if a == b else f"{a} to {b}{unit}"


def _compact_sentence(found: list[Finding]) -> str:
    """One sentence for a metric whose comparisons are each made once (arms against one reference arm):
    what raises it, what lowers it, what makes no difference beyond seed noise."""
    what, unit = metric_words(found[0].metric)
    parts = []
    for d, verb in (("higher", "raises"), ("lower", "lowers")):
        fs = [f for f in found if f.direction == d]
        if fs:
            parts.append(
                " and ".join(
                    f"{f.subject} {verb if i == 0 else ''} {'it ' if i == 0 else ''}by {_magnitude(f.diffs)}{unit} "
                    f"({_holm_clause(f.p_holm)})".replace("  ", " ")
                    for i, f in enumerate(fs)
                )
            )
    none = [f for f in found if f.direction == "none"]
    if none:
        diffs = [f.diffs[0] for f in none]
        names = [f.subject for f in none]
        joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        parts.append(
            f"{joined} make{'s' if len(names) == 1 else ''} no difference beyond seed noise ({_range(min(diffs), max(diffs), unit)})"
        )
    return f"{what[0].upper() + what[1:]}: " + "; ".join(parts) + "." if parts else ""


def _finding_sentences(found: list[Finding]) -> list[str]:
    tested = [f for f in found if f.direction != "untested"]
    if (
        tested
        and len(tested) == len(found)
        and all(len(f.diffs) == 1 for f in found)
        and len({f.subject for f in found}) == len(found)
        and len(found) > 1
    ):
        return [_compact_sentence(found)]
    by_subject: dict[tuple, list[Finding]] = {}
    for f in found:
        by_subject.setdefault((f.subject, f.metric), []).append(f)
    sentences = []
    for (subj, metric), fs in by_subject.items():
        what, unit = metric_words(metric)
        by_direction: dict[str, list[Finding]] = {}
        for f in fs:
            by_direction.setdefault(f.direction, []).append(f)
        order = sorted(
            (d for d in by_direction if d in ("higher", "lower")),
            key=lambda d: -sum(len(f.diffs) for f in by_direction[d]),
        )
        parts, named = [], False
        for d in order:
            verb = "raises" if d == "higher" else "lowers"
            clauses = [_clause(f, unit) for f in by_direction[d]]
            parts.append(f"{verb} {'it' if named else what} " + " and ".join(clauses))
            named = True
        if "none" in by_direction:
            nf = by_direction["none"]
            diffs = [x for f in nf for x in f.diffs]
            where = (
                "in every cell"
                if len(nf) == 1 and nf[0].everywhere and len(diffs) > 1
                else ("at " + "; ".join(_where_text(f.rests) for f in nf) if nf[0].rests and nf[0].rests[0] else "")
            )
            spread = f"difference{'s' if len(diffs) > 1 else ''} {_range(min(diffs), max(diffs), unit)}"
            parts.append(f"makes no difference to {what} beyond seed noise {where} ({spread})".replace("  ", " "))
        if parts:
            sentences.append(
                f"{subj} " + (parts[0] if len(parts) == 1 else "; ".join(parts[:-1]) + "; and " + parts[-1]) + "."
            )
        if "untested" in by_direction:
            diffs = [d for f in by_direction["untested"] for d in f.diffs]
            lower = sum(d < 0 for d in diffs)
            trend = (
                "lower in every pair"
                if lower == len(diffs)
                else "higher in every pair"
                if lower == 0
                else f"lower in {lower} of {len(diffs)} pairs"
            )
            sentences.append(
                f"With one seed per cell there is no seed noise to test against: with {subj[0].lower() + subj[1:]} "
                f"{what} is {trend} ({_range(min(diffs), max(diffs), unit)}), untested."
            )
    return sentences


def pooled_sentence(effects: list[Effect], metric: str = "val/loss") -> str:
    what, unit = metric_words(metric)
    sig, within = [], []
    for e in effects:
        if e.test is None:
            continue
        name = f"{short(e.axis)}={_value(e.level)}"
        if e.significant:
            lo, hi = e.interval
            sig.append(
                f"{name} {'raises' if e.diff > 0 else 'lowers'} {what} by {abs(e.diff):.2g}{unit} against {_value(e.reference)} "
                f"(95 % CI {lo:+.3f} to {hi:+.3f}, {_holm_clause([e.p_holm])})"
            )
        else:
            within.append(f"{name} against {_value(e.reference)} ({e.diff:+.3f})")
    parts = list(sig)
    if within:
        parts.append(
            ("no other level" if sig else "no level")
            + " differs from its reference beyond seed noise: "
            + ", ".join(within)
        )
    return ("Pooled over the other axes, " + "; ".join(parts) + ".") if parts else ""


def baseline_sentence(study: Study) -> str:
    if not study.baseline or "val/loss" not in study.keys:
        return ""
    from .baseline import CLEARLY_BELOW

    b = study.baseline["bigram"]
    means = [(c, c.mean("val/loss")) for c in study.cells if c.mean("val/loss") is not None]
    if not means:
        return ""
    above = [c.label for c, m in means if m >= b]
    near = [c.label for c, m in means if b - CLEARLY_BELOW < m < b]
    level = f"the attention-free (bigram) level of {b:.3f} nats"
    if not above and not near:
        gaps = [b - m for _, m in means]
        return f"Every cell ends below {level}, by {_magnitude(gaps)} nats: every model uses its attention."
    parts = []
    if above:
        parts.append(
            f"{'Every cell' if len(above) == len(means) else f'{len(above)} of {len(means)} cells'} end"
            f"{'s' if len(above) == len(means) else ''} at or above {level}"
            + ("" if len(above) == len(means) else f" ({'; '.join(above)})")
        )
    if near:
        parts.append(
            f"{len(near)} of {len(means)} end{'s' if len(near) == 1 else ''} less than {CLEARLY_BELOW} nats below "
            f"{'it' if above else level} ({'; '.join(near)})"
        )
    return " and ".join(parts) + "."


def headline(study: Study, families: dict[str, list[Contrast]], effects: list[Effect]) -> str:
    """The report's opening sentences, computed from its tested differences (wording chosen by their values)."""
    sentences = []
    loss = families.get("val/loss", [])
    if effects and SCALING_AXIS not in study.axes and any(e.test for e in effects):
        sentences.append(pooled_sentence(effects))
    elif loss:
        sentences += _finding_sentences(findings(loss, "val/loss"))
    for metric, family in families.items():
        if metric != "val/loss":
            sentences += _finding_sentences(findings(family, metric))
    if not any(sentences) and "val/loss" in study.keys:
        ranked = sorted((c for c in study.cells if c.mean("val/loss") is not None), key=lambda c: c.mean("val/loss"))
        if len(ranked) == 1:  # one cell: its value, with its interval when it has one
            loss = ranked[0].metrics["val/loss"]
            interval = loss.interval
            sentences.append(
                f"One cell, {loss.n} seed{'s' if loss.n != 1 else ''}: val loss {loss.mean:.3f}"
                + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
                + "; nothing is compared here."
            )
        elif ranked:
            sentences.append(
                f"Val loss ranges from {ranked[0].mean('val/loss'):.3f} ({ranked[0].label}) to "
                f"{ranked[-1].mean('val/loss'):.3f} ({ranked[-1].label}); no comparison is tested here."
            )
    sentences.append(baseline_sentence(study))
    return " ".join(s for s in sentences if s)


# ---------------------------------------------------------------- blocks
def direction_words(c: Contrast) -> str:
    if c.test is None:
        return f"untested ({c.why_untested})"
    if not c.significant:
        return "no difference beyond seed noise"
    who = "scaled" if c.axis == SCALING_AXIS else f"{short(c.axis)}={_value(c.level)}"
    return f"{who} {'higher' if c.diff > 0 else 'lower'}"


def contrast_table(family: list[Contrast], metric: str) -> tuple[list[str], list[list[str]]]:
    what = label(metric)
    header = [
        "comparison",
        "where",
        "seeds",
        f"{what}: reference",
        f"{what}: level",
        "difference [95 % CI]",
        "p",
        "p (Holm)",
        "direction",
    ]
    body = []
    for c in family:
        ref_i = mean_interval(statistics.fmean(c.ref_values), _sd(c.ref_values), len(c.ref_values))
        lvl_i = mean_interval(statistics.fmean(c.values), _sd(c.values), len(c.values))
        body.append(
            [
                f"{short(c.axis)}: {_value(c.level)} vs {_value(c.reference)}",
                c.where,
                f"{len(c.ref_values)}, {len(c.values)}",
                mean_ci(statistics.fmean(c.ref_values), ref_i),
                mean_ci(statistics.fmean(c.values), lvl_i),
                signed_ci(c.diff, c.interval),
                _p(c.test.p) if c.test else "-",
                _p(c.p_holm) if c.test else "-",
                direction_words(c),
            ]
        )
    return header, body


def _sd(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def effects_rows(effects: list[Effect]) -> tuple[list[str], list[list[str]]]:
    header = ["axis", "level vs reference", "strata", "pooled difference [95 % CI]", "p", "p (Holm)", "direction"]
    body = [
        [
            short(e.axis),
            f"{_value(e.level)} vs {_value(e.reference)}",
            str(e.strata),
            signed_ci(e.diff, e.interval),
            _p(e.test.p) if e.test else "-",
            _p(e.p_holm) if e.test else "-",
            (
                "untested"
                if e.test is None
                else f"{_value(e.level)} {'higher' if e.diff > 0 else 'lower'}"
                if e.significant
                else "no difference beyond seed noise"
            ),
        ]
        for e in effects
    ]
    return header, body


def _seeds_cell(c: TableCell) -> str:
    return f"{c.n_ok}" + (f", FAILED {c.n_failed}" if c.n_failed else "")


def main_table(study: Study) -> tuple[list[str], list[list[str]]]:
    keys = study.main_keys
    header = [short(a) for a in study.axes] + ["seeds"] + [label(k) for k in keys]
    body = [
        [c.axes[a] for a in study.axes] + [_seeds_cell(c)] + [mean_ci(c.mean(k), c.interval(k)) for k in keys]
        for c in study.cells
    ]
    if study.baseline and "val/loss" in keys:
        row = ["attention-free (bigram)"] + [""] * (len(study.axes) - 1) + ["-"]
        row += [f"{study.baseline['bigram']:.3f}" if k == "val/loss" else "-" for k in keys]
        body.append(row)
    return header, body


def layer_tables(study: Study) -> list[tuple[str | None, list[str], list[list[str]]]]:
    """Per-layer statistics with intervals: one table per statistic (a column per layer), or with one layer a
    single table (a column per statistic)."""
    templates = [
        t
        for t in study.layer_templates
        if any(c.mean(t.format(i=i)) is not None for c in study.cells for i in range(study.layers))
    ]
    names = {v: k for k, v in HEAD_LAYER_STATS.items()}
    title = lambda t: names.get(t, t.rsplit("/", 1)[-1])  # noqa: E731
    axes = [short(a) for a in study.axes]
    if not templates:
        return []
    if study.layers == 1:
        header = axes + [title(t) for t in templates]
        return [
            (
                None,
                header,
                [
                    [c.axes[a] for a in study.axes]
                    + [mean_ci(c.mean(t.format(i=0)), c.interval(t.format(i=0))) for t in templates]
                    for c in study.cells
                ],
            )
        ]
    out = []
    for t in templates:
        header = axes + [f"L{i}" for i in range(study.layers)]
        out.append(
            (
                title(t),
                header,
                [
                    [c.axes[a] for a in study.axes]
                    + [mean_ci(c.mean(t.format(i=i)), c.interval(t.format(i=i))) for i in range(study.layers)]
                    for c in study.cells
                ],
            )
        )
    return out


def machine_table(study: Study) -> tuple[list[str], list[list[str]]]:
    keys = study.machine_keys
    header = [short(a) for a in study.axes] + ["seeds"] + [label(k) for k in keys]
    return header, [
        [c.axes[a] for a in study.axes]
        + [str(c.n_ok)]  # the failed runs are flagged once, in the main table
        + [mean_ci(c.mean(k), c.interval(k), MACHINE_SCALE.get(k, 1.0)) for k in keys]
        for c in study.cells
    ]


def per_seed_table(study: Study) -> tuple[list[str], list[list[str]]]:
    keys = [*study.main_keys, *(k for k in study.tested_metrics if k not in study.main_keys)]
    header = [short(a) for a in study.axes] + ["seed", "run dir"] + [label(k) for k in keys]
    body = []
    for c in study.cells:
        for j, seed in enumerate(c.seeds or []):
            vals = [c.metrics[k].values[j] if k in c.metrics and c.metrics[k].values else None for k in keys]
            body.append(
                [c.axes[a] for a in study.axes]
                + [str(seed), (c.dirs or ["-"] * (j + 1))[j]]
                + [plain(v, 4) for v in vals]
            )
    return header, body


def head_type_text(counts: dict[str, list[int]]) -> str:
    """{type: heads per seed} -> 'induction 1 (2/3 seeds), content 1' (mean heads per seed)."""
    parts = []
    for kind, per_seed in sorted(counts.items(), key=lambda kv: -sum(kv[1])):
        having = sum(n > 0 for n in per_seed)
        parts.append(
            f"{kind} {sum(per_seed) / len(per_seed):.3g}"
            + (f" ({having}/{len(per_seed)} seeds)" if having < len(per_seed) else "")
        )
    return ", ".join(parts) or "-"


def head_type_seeds(counts: dict[str, list[int]]) -> str:
    """The types that some seeds have and others not, as k of n seeds with a Wilson interval."""
    parts = [
        f"{kind}: {k_of_n_text(having, len(per_seed))}"
        for kind, per_seed in sorted(counts.items())
        if 0 < (having := sum(n > 0 for n in per_seed)) < len(per_seed)
    ]
    return "; ".join(parts)


def phase_text(steps: list[int | None]) -> list[str]:
    """[seeds that reach it, median step, range] for the phase-change table."""
    reached = sorted(s for s in steps if s is not None)
    if not reached:
        return [k_of_n_text(0, len(steps)), "-", "-"]
    return [k_of_n_text(len(reached), len(steps)), f"{statistics.median(reached):g}", f"{reached[0]}-{reached[-1]}"]


def _label(axes: dict) -> str:
    return ", ".join(f"{short(k)}={v}" for k, v in axes.items()) or "all"


@dataclass
class Analysis:
    families: dict[str, list[Contrast]]
    effects: list[Effect]
    pairs: list  # significance.Pair: the scaled/unscaled twins of summary.json's scaled_vs_unscaled
    headline: str


def analyse(study: Study) -> Analysis:
    families = {m: f for m in study.tested_metrics if (f := contrasts(study.cells, study.axes, m))}
    effects = factor_effects(study.cells, study.axes, "val/loss") if "val/loss" in study.keys else []
    pairs = scaling_pairs(study.cells, study.axes, "val/loss")
    return Analysis(families, effects, pairs, headline(study, families, effects))


def intro(study: Study) -> str:
    seeds = study.seeds_text
    text = (
        f"Sweep{'s' if len(study.sources) > 1 else ''}: {', '.join(f'`{d}`' for d in study.sources) or '-'} ({study.runs} runs, "
        f"{len(study.cells)} cells, {seeds} finished seed(s) per cell, {study.failed} failed). "
    )
    if seeds == "1":
        text += "One seed per cell: each value is a single run, with no estimate of seed noise. "
    else:
        text += (
            "Each value is the mean over a cell's finished seeds of the final metric with its 95 % t interval [lo, hi] "
            "(mean ± t_{0.975, n-1} · s / √n, s the sample std); the interval's half-width is shown to two significant "
            "digits. "
        )
    if study.restated:
        text += (
            "Re-laid by `python -m attnlab.studies.report --restat` from ablation.csv's per-cell mean, sample std and seed count"
            + (" and summary.json's per-seed values." if all(c.seeds for c in study.cells) else ".")
        )
        if not study.per_seed_known:
            text += " Per-seed values are not in the committed data, so the intervals and tests use each cell's mean, std and count."
    if study.recording:
        text += (
            " Runs differ in settings that change what they record, not what they train, and are grouped regardless: "
            f"{'; '.join(study.recording)}."
        )
    return text.strip()


def blocks(study: Study, analysis: Analysis) -> list[tuple]:
    """The report as ("h1"|"h2"|"h3"|"p", text), ("table", header, body), ("img", path) blocks."""
    title = f"{study.name} study: {' × '.join(short(a) for a in study.axes) or 'one cell'}"
    out: list[tuple] = [("h1", title), ("p", analysis.headline), ("p", intro(study)), ("table", *main_table(study))]
    if study.baseline and "val/loss" in study.main_keys:
        out.append(
            (
                "p",
                f"The attention-free (bigram) row: cross-entropy of p(next | current) fitted on the train split and scored "
                f"on the whole {study.baseline.get('split', 'val')} split (`{study.baseline.get('source')}`), the level of a "
                "model whose attention does nothing.",
            )
        )
    for metric, family in analysis.families.items():
        scaling = family[0].axis == SCALING_AXIS
        name = "Scaled vs unscaled" if scaling else "Each level against its reference"
        out.append(("h2", name + ("" if metric == "val/loss" else f": {label(metric)}")))
        tested = [c for c in family if c.test]
        if tested:
            text = (
                f"{TEST_NAME} on the final {label(metric)} of each pair of cells that differ on one axis only; the difference is "
                "level minus reference with Welch's 95 % interval (t_{0.975, df} with Welch-Satterthwaite df). A difference "
                f"counts as beyond seed noise when its Holm-corrected p over the {len(tested)} test{'s' if len(tested) != 1 else ''} "
                f"of this table is below {ALPHA}; a smaller one is reported as no difference."
                + (
                    " Untested: one seed on a side leaves no seed noise to compare against."
                    if len(tested) < len(family)
                    else ""
                )
            )
        else:
            text = (
                f"Each pair of cells that differ on one axis only, level minus reference in final {label(metric)}. With one seed "
                "per cell there is no seed noise to compare against: no difference is tested, and none is called significant."
            )
        out.append(("p", text))
        out.append(("table", *contrast_table(family, metric)))
    if analysis.effects:
        out += [
            ("h2", "Each axis pooled over the others"),
            (
                "p",
                "The difference of cell means averaged over every combination of the other axes, a stratified Welch test "
                f"with its 95 % interval, Holm-corrected over the {sum(e.test is not None for e in analysis.effects)} effects.",
            ),
            ("table", *effects_rows(analysis.effects)),
        ]
    tables = layer_tables(study)
    if tables:
        out += [
            ("h2", "Per layer"),
            (
                "p",
                "Each layer's final statistic, "
                + (
                    "a single run per cell."
                    if study.seeds_text == "1"
                    else "mean over seeds [95 % t interval], as in the main table."
                ),
            ),
        ]
        for name, header, body in tables:
            if name:
                out.append(("h3", name))
            out.append(("table", header, body))
    if study.lr_arms:
        out += lr_blocks(study.lr_arms)
    types = [c for c in study.head_types if any(c["layers"])]
    if types:
        layers = max(len(c["layers"]) for c in types)
        out += [
            ("h2", "Head types per layer"),
            ("p", HEAD_TYPES_NOTE),
            (
                "table",
                ["cell", *(f"L{i}" for i in range(layers)), "types in some seeds only"],
                [
                    [
                        _label(c["axes"]),
                        *map(head_type_text, c["layers"]),
                        "; ".join(f"L{i} {t}" for i, layer in enumerate(c["layers"]) if (t := head_type_seeds(layer)))
                        or "-",
                    ]
                    for c in types
                ],
            ),
        ]
    phases = [c for c in study.phases if c["steps"]]
    if any(s is not None for c in phases for s in c["steps"]):
        from ...analysis.phase import PHASE_LEVEL

        out += [
            ("h2", "Phase change"),
            (
                "p",
                f"The first measured step at which copying on the repeated probe reaches {PHASE_LEVEL} "
                "(`attnlab.analysis.phase.phase_change_step`), per seed that ran the head analysis over training.",
            ),
            (
                "table",
                ["cell", "seeds that reach it", "step: median", "step: range"],
                [[_label(c["axes"]), *phase_text(c["steps"])] for c in phases],
            ),
        ]
    if study.per_seed_known and any(c.seeds for c in study.cells):
        out += [
            ("h2", "Per seed"),
            ("p", "Every finished seed's final values (also in ablation.csv and summary.json)."),
            ("table", *per_seed_table(study)),
        ]
    if study.machine_keys:
        out += [
            ("h2", "Cost (machine-dependent)"),
            (
                "p",
                "Throughput and the peak tensor memory of a training step above its start level measure the machine the runs "
                "shared (other jobs, thread counts) as much as the model: they are not compared between cells here.",
            ),
            ("table", *machine_table(study)),
        ]
    if study.failures:
        out += [("h2", "Failed runs"), ("p", "\n".join(study.failures))]
    out += [("img", p) for p in study.plots]
    return out


def to_markdown(bl: list[tuple]) -> str:
    lines = []
    for b in bl:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            lines += [f"{'#' * int(kind[1])} {b[1]}", ""]
        elif kind == "p":
            lines += [b[1], ""]
        elif kind == "table":
            lines += [markdown_table(b[1], b[2]), ""]
        elif kind == "img":
            lines.append(f"![{b[1].stem}]({b[1].name})")
    return "\n".join(lines).rstrip("\n") + "\n"


def to_html(name: str, bl: list[tuple]) -> str:
    """The same blocks as one self-contained page (plots inlined as base64) for browsing offline."""
    from .tables import html_table

    parts = []
    for b in bl:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            parts.append(f"<{kind}>{html.escape(b[1])}</{kind}>")
        elif kind == "p":
            parts.append("".join(f"<p>{html.escape(line)}</p>" for line in b[1].split("\n")))
        elif kind == "table":
            parts.append(html_table(b[1], b[2]))
        elif kind == "img":
            parts.append(
                f'<figure><img src="data:image/png;base64,{base64.b64encode(b[1].read_bytes()).decode()}">'
                f"<figcaption>{html.escape(b[1].stem)}</figcaption></figure>"
            )
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px}tr.failed{background:#fdd}figure{display:inline-block;margin:1em}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>attnlab: {html.escape(name)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>"
    )


# ---------------------------------------------------------------- machine-readable outputs
def derived_csv(header: list[str], body: list[list], study: Study) -> str:
    """ablation.csv: the given columns, then each metric's 95 % interval and, when known, the per-seed values
    (';'-separated in the order of the ``seeds`` column)."""
    by_axes = {tuple(c.axes[a] for a in study.axes): c for c in study.cells}
    extra = [f"{k}_ci95_{x}" for k in study.keys for x in ("lo", "hi")]
    seeded = study.per_seed_known and any(c.seeds for c in study.cells)
    per_seed_keys = [*study.main_keys, *(k for k in study.tested_metrics if k not in study.main_keys)] if seeded else []
    extra += (["seeds"] + [f"{k}_per_seed" for k in per_seed_keys]) if seeded else []
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header + extra)
    for row in body:
        cell = by_axes.get(tuple(str(v) for v in row[: len(study.axes)]))
        values = []
        for k in study.keys:
            i = cell.interval(k) if cell else None
            values += [i[0], i[1]] if i else [None, None]
        if seeded:
            values.append(";".join(map(str, cell.seeds or [])) if cell else None)
            for k in per_seed_keys:
                m = cell.metrics.get(k) if cell else None
                values.append(";".join(repr(v) for v in m.values) if m and m.values else None)
        writer.writerow(["" if v is None else v for v in list(row) + values])
    return buf.getvalue()


def _contrast_json(c: Contrast) -> dict:
    return {
        "axis": c.axis,
        "level": c.level,
        "reference": c.reference,
        "where": c.where,
        "diff": c.diff,
        "ci95": list(c.interval) if c.interval else None,
        "n": [len(c.ref_values), len(c.values)],
        "welch_t": c.test.t if c.test else None,
        "df": c.test.df if c.test else None,
        "p": c.test.p if c.test else None,
        "p_holm": c.p_holm,
        "beyond_noise": c.significant,
        "direction": direction_words(c),
    }


def statistics_json(study: Study, analysis: Analysis) -> dict:
    """summary.json's statistics (its existing keys kept as they were, intervals and words added)."""
    loss = {(c.where, c.level): c for c in analysis.families.get("val/loss", []) if c.axis == SCALING_AXIS}
    out = {"scaled_vs_unscaled": [], "pooled_effects": []}
    for p in analysis.pairs:
        c = loss.get((p.where, p.variant))
        out["scaled_vs_unscaled"].append(
            {
                "where": p.where,
                "scaling": p.variant,
                "diff": p.diff,
                "n": [len(p.unscaled), len(p.scaled)],
                "welch_t": p.test.t if p.test else None,
                "df": p.test.df if p.test else None,
                "p": p.test.p if p.test else None,
                "p_holm": p.p_holm,
                "beyond_noise": p.significant,
                "ci95": list(c.interval) if c is not None and c.interval else None,
                "direction": direction_words(c) if c else None,
            }
        )
    for e in analysis.effects:
        out["pooled_effects"].append(
            {
                "axis": e.axis,
                "level": e.level,
                "reference": e.reference,
                "diff": e.diff,
                "strata": e.strata,
                "welch_t": e.test.t if e.test else None,
                "df": e.test.df if e.test else None,
                "p": e.test.p if e.test else None,
                "p_holm": e.p_holm,
                "beyond_noise": e.significant,
                "ci95": list(e.interval) if e.interval else None,
            }
        )
    out["contrasts"] = {m: [_contrast_json(c) for c in fam] for m, fam in analysis.families.items()}
    out["cells_ci95"] = [
        {
            "axes": c.axes,
            "n": c.n_ok,
            "metrics": {
                k: {"mean": c.mean(k), "std": c.std(k), "ci95": list(i) if (i := c.interval(k)) else None}
                for k in study.main_keys
                if c.mean(k) is not None
            },
        }
        for c in study.cells
    ]
    out["headline"] = analysis.headline
    if study.lr_arms:
        out["lr_sensitivity"] = lr_json(study.lr_arms)
    out["attention_free_level"] = study.baseline
    out["recording_differences"] = study.recording
    if not study.per_seed_known:
        out["per_seed_note"] = (
            "Per-seed values are not in the committed data: ablation.csv holds each cell's mean, sample std and seed count."
        )
    return out


def write(study: Study, out: Path, csv_header: list[str], csv_body: list[list], summary: dict) -> dict:
    """Write ablation.md, index.html, ablation.csv and summary.json (``summary`` updated with the statistics)."""
    analysis = analyse(study)
    bl = blocks(study, analysis)
    atomic_write_text(out / "ablation.md", to_markdown(bl))
    atomic_write_text(out / "index.html", to_html(study.name, bl))
    atomic_write_text(out / "ablation.csv", derived_csv(csv_header, csv_body, study))
    summary.update(statistics_json(study, analysis))
    if study.per_seed_known:
        summary.pop("per_seed_note", None)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    return summary
