"""Attention statistics computed from q and k in query blocks (docs/metrics.md defines each).

Fused kernels return no probabilities, so every backend is measured the same way: the weights are
recomputed by the layer's own rule (``WeightRule``: scale, bias, the run's mask, normalisation,
key/value groups), ``block`` query rows at a time, in fp32. Peak extra memory is
O(B x H x block x T), never T x T. Every metric is one entry of METRICS (name, function, how it
is reduced, one doc line); docs/metrics.md's table is checked against it.

Queries that see a single key (row 0 under a causal mask) are left out of every per-query
statistic: their row is one-hot whatever the model does, so counting it would pin max_prob_max at
1 and bias the means (uniform attention at T = 16 would read sink_mass 0.211 instead of 0.159).
The head analysis (``attnlab.analysis.heads``) uses the same rows.

Per head (tensors of shape (H,)), over the queries i with k_i > 1 visible keys:
  entropy       mean of H_i = -sum_j p_ij log p_ij (nats)
  entropy_norm  mean of H_i / log k_i (1 uniform, 0 one-hot)
  max_prob      mean of max_j p_ij;  max_prob_max: its max over those queries (1 = collapse)
  max_logit     max over (i, j) of the scaled logit s_ij among visible keys (every query:
                a logit is a logit, whatever the row's softmax makes of it)
  sink_mass     mean of p_i0, the weight on the first token
  escape_mass   with an escape slot (``sink``): mean of the weight that goes nowhere, 1 - sum_j p_ij
                (not reported without one)
  row_mass      with sigmoid attention: mean of sum_j p_ij, what a row's weights add up to (no
                normalisation makes it 1)
  sink_heads    1 if the head's mean p_i0 over the queries that also see the first key exceeds 0.3,
                else 0; the layer's value (the mean) is Gu et al. 2024's share of sink heads
  sink_mass_<c> with ``query_classes`` {c: (B, T) bool}: sink_mass over the queries of class c only,
                e.g. ``dormant`` (queries that need no attention) and ``active`` (those that do)

Extreme tokens (Guo et al. 2024), from the probe's value vectors and residual stream:
  value_drain   per head, ||v_0|| / mean_{t>0} ||v_t||: below 1 when the first token's value shrinks
  residual_peak per layer, ||h_0|| / mean_{t>0} ||h_t|| of the block's output: above 1 when the
                first token's residual state grows
  residual_max_ratio, residual_kurtosis  per layer, max |h| / median |h| and the kurtosis over every
                entry of the block's output (Sun et al. 2024's massive activations)
  gate_mean     per head, with an output gate: the mean sigmoid gate score
  diff_abs_mass, diff_neg_mass  per head, with a differential map A1 - lambda A2: the mean over
                queries of its row's absolute mass and of its negative part's mass. Every row
                metric above is then reported for A1 under its name and for A2 as a2_<name>.
  attn_out_norm per head, mean over tokens of ||o_t||, the head's output before the output
                projection: how much a head writes (a dormant head writes little)

When rows do not sum to 1 (an escape slot: 1 - escape; sigmoid: anything), max_prob, max_prob_max
and sink_mass are the weights as they are (what the head puts on a key), while entropy and
entropy_norm describe each row renormalised to sum to 1 (how the head spreads the weight it does
place). With grouped-query attention every statistic is per query head (value_drain reads the
key/value head each query head shares). An ALiBi ``bias`` is added to the logits before all of this, and max_logit includes
it; with RoPE the captured q and k are already rotated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from attnlab.attention.masks import CAUSAL, Visibility
from attnlab.attention.normalizations import normalization
from attnlab.attention.weights import WeightRule, expand_kv


class Rows(NamedTuple):
    """One block of query rows, what a per-query metric reads."""

    p: torch.Tensor  # (B, H, r, T) weights on the real keys, as they are
    placed: torch.Tensor  # (B, H, r, T) each row renormalised to sum to 1
    mass: torch.Tensor  # (B, H, r) what each row sums to
    logits: torch.Tensor  # (B, H, r, T) scaled logits plus bias, -inf where a key is not visible
    n_visible: torch.Tensor  # (r,) how many keys each query sees
    sees_first: torch.Tensor  # (r,) bool: whether each query sees the first key


class Record(NamedTuple):
    """What a per-layer metric reads from the probe (analysis.probe.ProbeRecord has these fields)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor  # (B, H_kv, T, d)
    out: torch.Tensor  # (B, H, T, d) the heads' outputs before the output projection
    residual: torch.Tensor  # (B, T, d_model) the block's output
    gate: torch.Tensor | None  # (B, H, T, 1|d) the output gate's values, or None without a gate
    layer: object  # the Attention module (its weights(), differential_lambda())


def always(rule: WeightRule) -> bool:
    return True


@dataclass(frozen=True)
class Metric:
    """A per-layer statistic: ``rows`` gives a value per query (B, H, r), reduced over the counted
    queries by ``over_rows`` (mean or max); or ``record`` gives one per head (H,) or one for the
    layer (a 0-d tensor) from the probe record. ``layer``: how heads become the layer's value (mean,
    max or min). ``all_rows``: queries that see one key count too. ``classes``: also reported over
    each query class, as ``<name>_<class>``, reduced over heads by ``class_layer``. ``table`` and
    ``panel``: where reports show it."""

    name: str
    doc: str
    rows: Callable[[Rows], torch.Tensor] | None = None
    record: Callable[[Record], torch.Tensor] | None = None
    over_rows: str = "mean"
    layer: str = "mean"
    all_rows: bool = False
    applies: Callable[[WeightRule], bool] = always
    classes: bool = False
    class_layer: str = "max"
    table: bool = False  # a column of the study tables (per layer), when some run logged it
    panel: str | None = None  # a section of the W&B dashboard (make dashboard)
    queries: str = "choice"  # the queries counted: "choice" (k_i > 1 keys), or "first_key" (those that see key 0 too)
    per_head: Callable[[torch.Tensor], torch.Tensor] | None = (
        None  # applied to each head's value after the rows' reduction
    )
    per_layer: bool = False  # a record metric with one value for the layer, not one per head


def residual_metric(name: str, doc: str, statistic: Callable[[torch.Tensor], torch.Tensor], panel: str) -> Metric:
    """A statistic of the block's output over every entry, one value for the layer, in the tables and
    a dashboard panel: the massive-activation measurements are all of this shape."""
    return Metric(name, doc, record=lambda rec: statistic(rec.residual), per_layer=True, table=True, panel=panel)


def entropy(rows: Rows) -> torch.Tensor:
    return -torch.special.xlogy(rows.placed, rows.placed).sum(-1)


def first_token_norm_ratio(x: torch.Tensor) -> torch.Tensor:
    """||x_0|| / mean_{t>0} ||x_t|| over the batch, for x (B, H, T, d) -> (H,), or (B, T, d) -> scalar."""
    norms = x.float().norm(dim=-1)  # (B, H, T) or (B, T)
    first, rest = norms[..., 0].mean(0), norms[..., 1:].mean((0, -1))
    return first / rest.clamp_min(1e-30)


def max_over_median(x: torch.Tensor) -> torch.Tensor:
    """max |x| / median |x| over every entry (Sun et al. 2024's massive activations: a few entries
    thousands of times the median)."""
    a = x.float().abs().flatten()
    return a.max() / a.median().clamp_min(1e-30)


def kurtosis(x: torch.Tensor) -> torch.Tensor:
    """E[(x - mu)^4] / sigma^4 over every entry (3 for a Gaussian; heavy tails read higher)."""
    x = x.double().flatten()
    centred = x - x.mean()
    return ((centred**4).mean() / (centred**2).mean().clamp_min(1e-30) ** 2).float()


SECOND_MAP = "a2_"  # a differential layer's second softmax map: its statistics are logged as a2_<name>


@torch.no_grad()
def signed_map_mass(rec, part: str, block: int = 128) -> torch.Tensor | None:
    """Per head (H,), for a differential layer: the mean over queries with k_i > 1 keys of
    sum_j |A1 - lambda A2|_ij (``part="abs"``) or of the negative part's mass, sum_j
    max(0, lambda A2 - A1)_ij (``"neg"``); None for any other layer."""
    layer = rec.layer
    if not layer.cfg.differential:
        return None
    t = rec.q.shape[-2]
    total, n = 0.0, 0
    for rows in torch.arange(t, device=rec.q.device).split(block):
        w = layer.weights(rec.q[:, :, rows], rec.k, rows)
        counted = w.visible[0, 0].sum(-1) > 1  # (r,)
        per_query = (w.p.abs() if part == "abs" else (-w.p).clamp_min(0)).sum(-1)  # (B, H, r)
        total = total + torch.where(counted, per_query, 0.0).sum((0, 2)).double()
        n += w.p.shape[0] * int(counted.sum())
    return (total / n).float() if n else torch.full((rec.q.shape[1],), float("nan"))


SINK_EPSILON = 0.3  # Gu et al. 2024's threshold on a head's mean first-token weight


def is_sink(weight):
    """Gu et al. 2024's rule: a head is a sink where its mean first-token weight exceeds SINK_EPSILON (a float,
    or a tensor of them). The one comparison every reader of the threshold makes."""
    return weight > SINK_EPSILON


METRICS = (
    Metric("entropy", "mean over queries of H_i = -sum_j p_ij log p_ij (nats)", rows=entropy),
    Metric(
        "entropy_norm",
        "mean of H_i / log k_i over queries seeing k_i keys (1 uniform, 0 one-hot)",
        rows=lambda r: entropy(r) / r.n_visible.float().log(),
        table=True,
        panel="Entropy (normalised) per layer",
    ),
    Metric(
        "max_prob",
        "mean over queries of max_j p_ij",
        rows=lambda r: r.p.amax(-1),
        table=True,
        panel="Max probability per layer",
    ),
    Metric(
        "max_prob_max",
        "max over queries of max_j p_ij (1 = a collapsed row)",
        rows=lambda r: r.p.amax(-1),
        over_rows="max",
        layer="max",
    ),
    Metric(
        "max_logit",
        "max over every query and visible key of the scaled logit s_ij (Wortsman et al. 2023)",
        rows=lambda r: r.logits.amax(-1),
        over_rows="max",
        layer="max",
        all_rows=True,
        table=True,
        panel="Max logit per layer",
    ),
    Metric(
        "sink_mass",
        "mean over queries of p_i0, the weight on the first token (StreamingLLM); a task with query "
        "classes adds `sink_mass_<class>` over its classes' queries (dormant, active), the layer's value its strongest head (max)",
        rows=lambda r: r.p[..., 0],
        classes=True,
        table=True,
        panel="Sink mass per layer",
    ),
    Metric(
        "sink_heads",
        f"share of heads whose weight on the first token, averaged over the queries that see it, exceeds "
        f"{SINK_EPSILON} (Gu et al. 2024's Sink metric at epsilon {SINK_EPSILON}); per head: 1 or 0",
        rows=lambda r: r.p[..., 0],
        queries="first_key",
        per_head=lambda v: is_sink(v).float(),
        table=True,
        panel=f"Sink heads (first-token weight > {SINK_EPSILON}) per layer",
    ),
    Metric(
        "escape_mass",
        "with an escape slot: mean over queries of the weight it sends nowhere, 1 - sum_j p_ij",
        rows=lambda r: 1 - r.mass,
        applies=lambda rule: rule.escape is not None,
        table=True,
    ),
    Metric(
        "row_mass",
        "with a normalization whose rows need not sum to 1 (sigmoid): mean over queries of sum_j p_ij",
        rows=lambda r: r.mass,
        applies=lambda rule: not normalization(rule.normalize).rows_sum_to_one,
        table=True,
        panel="Row mass per layer",
    ),
    Metric(
        "diff_abs_mass",
        "with a differential map: mean over queries of sum_j |A1 - lambda A2|_ij, the signed map's absolute "
        "mass (1 - lambda when it has no negative entry)",
        record=lambda rec: signed_map_mass(rec, "abs"),
        table=True,
    ),
    Metric(
        "diff_neg_mass",
        "with a differential map: mean over queries of sum_j max(0, lambda A2 - A1)_ij, the mass the map "
        "subtracts (the noise it cancels)",
        record=lambda rec: signed_map_mass(rec, "neg"),
        table=True,
        panel="Differential map: negative mass per layer",
    ),
    Metric(
        "value_drain",
        "‖v_0‖ / mean_{t>0} ‖v_t‖ of the value vectors (below 1: the first token's value "
        "shrinks, Guo et al. 2024's value-state drain)",
        record=lambda rec: first_token_norm_ratio(expand_kv(rec.v, rec.q.shape[1])),
        layer="min",
        table=True,
    ),
    Metric(
        "residual_peak",
        "‖h_0‖ / mean_{t>0} ‖h_t‖ of the block's output, the residual stream after it (above 1: the first "
        "token's residual state grows)",
        record=lambda rec: first_token_norm_ratio(rec.residual),
        per_layer=True,
        table=True,
    ),
    residual_metric(
        "residual_max_ratio",
        "max |h| / median |h| over every entry of the block's output, the residual stream after it (massive "
        "activations, Sun et al. 2024)",
        max_over_median,
        "Massive activations (max / median) per layer",
    ),
    residual_metric(
        "residual_kurtosis",
        "kurtosis E[(h - mu)^4] / sigma^4 over every entry of the block's output (3 for a Gaussian)",
        kurtosis,
        "Residual kurtosis per layer",
    ),
    Metric(
        "gate_mean",
        "with an output gate: mean over tokens (and channels) of a head's sigmoid gate score (low: a sparse gate, "
        "Qiu et al. 2025)",
        record=lambda rec: None if rec.gate is None else rec.gate.float().mean((0, 2, 3)),
        table=True,
        panel="Gate score per layer",
    ),
    Metric(
        "attn_out_norm",
        "mean over tokens of ‖o_t‖, a head's output before the output projection (how much it writes)",
        record=lambda rec: rec.out.float().norm(dim=-1).mean((0, 2)),
        table=True,
        panel="Attention output norm per layer",
    ),
)
METRIC = {m.name: m for m in METRICS}
STATS = tuple(m.name for m in METRICS if m.rows is not None and m.applies(WeightRule()))  # what every run reports
REDUCE = {"mean": torch.Tensor.mean, "max": torch.Tensor.max, "min": torch.Tensor.min}


def table_stats(query_classes: tuple[str, ...]) -> list[str]:
    """The per-layer columns of a study table, in order: the row metrics, their class variants,
    then the record metrics (each shown when some run logged it)."""
    shown = [m for m in METRICS if m.table]
    return (
        [m.name for m in shown if m.rows is not None]
        + [f"{m.name}_{c}" for m in shown if m.classes for c in query_classes]
        + [m.name for m in shown if m.record is not None]
    )


def metrics_table() -> str:
    """docs/metrics.md's table of the per-layer attention metrics, from METRICS (a test keeps them equal)."""
    lines = ["| key | meaning | layer value over heads |", "|---|---|---|"]
    for m in METRICS:
        layer = "one per layer" if m.per_layer else m.layer
        lines.append(f"| `attn/L{{i}}/{m.name}` | {m.doc} | {layer} |")
    return "\n".join(lines)


def layer_reduction(name: str) -> str:
    """How the heads' values of metric ``name`` (or ``<name>_<class>``, or a second map's
    ``a2_<name>``) become the layer's."""
    name = name.removeprefix(SECOND_MAP)
    if name in METRIC:
        return METRIC[name].layer
    base = next((m for m in METRICS if m.classes and name.startswith(m.name + "_")), None)
    return base.class_layer if base is not None else "mean"


@torch.no_grad()
def attention_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    rule: WeightRule | float | torch.Tensor = 1.0,
    block: int = 128,
    query_classes: dict[str, torch.Tensor] | None = None,
    key_padding_mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    only: tuple[str, ...] | None = None,
) -> dict:
    """Per-head (H,) values of every row metric of METRICS that applies to ``rule`` (the layer's
    ``weight_rule()``; a number is a plain softmax with that scale), q (B, H, T, d), k (B, H_kv, T, d).
    ``query_classes``: named (B, T) masks of queries whose class metrics are also reported.
    ``positions``: the query positions to measure (default every one), e.g. evenly spaced ones at a
    long T: the means are then over those queries and the maxima over them. ``only``: these
    metrics alone (e.g. ``("max_logit",)``)."""
    rule = (rule if isinstance(rule, WeightRule) else WeightRule(scale=rule)).detached()
    q, k = q.float(), k.float()
    b, h, t, _ = q.shape
    metrics = [m for m in METRICS if m.rows is not None and m.applies(rule) and (only is None or m.name in only)]
    sums = {m.name: torch.zeros(h, dtype=torch.float64, device=q.device) for m in metrics if m.over_rows == "mean"}
    maxima = {m.name: torch.full((h,), float("-inf"), device=q.device) for m in metrics if m.over_rows == "max"}
    classes = {name: mask.to(q.device).bool() for name, mask in (query_classes or {}).items()}
    class_sums = {
        (m.name, c): torch.zeros(h, dtype=torch.float64, device=q.device) for m in metrics if m.classes for c in classes
    }
    class_rows = dict.fromkeys(classes, 0)
    n_rows = dict.fromkeys(("choice", "first_key"), 0)
    positions = torch.arange(t, device=q.device) if positions is None else positions.to(q.device)
    for rows in positions.split(block):
        w = rule(q[:, :, rows], k, rows=rows, key_padding_mask=key_padding_mask)
        mass = w.mass
        placed = w.p if rule.rows_sum_to_one else w.p / mass.clamp_min(1e-30).unsqueeze(-1)
        logits = w.logits if rule.mask_fill == "-inf" else w.logits.masked_fill(~w.visible, float("-inf"))
        n_visible = w.visible[0, 0].sum(-1)  # (r,)
        sees_first = w.visible[0, 0, :, 0]  # (r,)
        block_rows = Rows(w.p, placed, mass, logits, n_visible, sees_first)
        counted_by = {"choice": n_visible > 1}  # rows with a choice to make; masked, not indexed: no copy of the block
        counted_by["first_key"] = counted_by["choice"] & sees_first
        counted = counted_by["choice"]
        chosen_by_class = {c: mask[:, rows] & counted[None, :] for c, mask in classes.items()}  # (B, r) each
        for m in metrics:
            values = m.rows(block_rows)  # (B, H, r)
            counted = counted_by[m.queries]
            if m.over_rows == "max":
                chosen = values if m.all_rows else torch.where(counted, values, float("-inf"))
                maxima[m.name] = torch.maximum(maxima[m.name], chosen.amax((0, 2)))
            else:
                sums[m.name] += torch.where(counted, values, 0.0).sum((0, 2)).double()
            for c, chosen in chosen_by_class.items() if m.classes else ():
                class_sums[m.name, c] += torch.where(chosen[:, None], values, 0.0).sum((0, 2)).double()
        for c, chosen in chosen_by_class.items():
            class_rows[c] += int(chosen.sum())
        for kind, chosen in counted_by.items():
            n_rows[kind] += b * int(chosen.sum())
    # no query with a choice (T = 1): every per-query statistic is undefined
    nan = torch.full((h,), float("nan"), device=q.device)
    out = {}
    for m in metrics:
        n = n_rows[m.queries]
        if m.over_rows == "max":
            out[m.name] = maxima[m.name] if (n or m.all_rows) else nan.clone()
        else:
            out[m.name] = (sums[m.name] / n).float() if n else nan.clone()
        if m.per_head is not None:
            out[m.name] = torch.where(out[m.name].isnan(), out[m.name], m.per_head(out[m.name]))
    for (name, c), total in class_sums.items():
        out[f"{name}_{c}"] = (total / class_rows[c]).float() if class_rows[c] else nan.clone()
    return out


@torch.no_grad()
def head_max_logits(layer, q: torch.Tensor, k: torch.Tensor, block: int = 128) -> torch.Tensor:
    """``max_logit`` of METRICS per head (H,) of ``layer`` (an ``Attention``) for its q, k; a
    differential head's is the larger of its two maps'."""
    rule = layer.weight_rule(fp32=True)
    return torch.stack(
        [attention_stats(qm, km, rule, block, only=("max_logit",))["max_logit"] for qm, km in layer.maps(q, k)]
    ).amax(0)


def record_stats(record: Record) -> dict:
    """The per-layer metrics of METRICS read from the probe record: (H,) per head, or 0-d per layer
    (a metric that does not apply, e.g. gate_mean without a gate, is left out)."""
    values = {m.name: m.record(record) for m in METRICS if m.record is not None}
    return {name: v for name, v in values.items() if v is not None}


def uniform_sink_mass(t: int, visibility: Visibility = CAUSAL) -> float:
    """sink_mass of uniform causal attention over T positions: mean over i = 1..T-1 of 1/(i+1);
    under another ``visibility`` (masks.Visibility), over the queries with k_i > 1 keys of 1/k_i
    where the first token is among them, else 0 (the statistic's own rows)."""
    seen = visibility.mask(t, t)[0, 0].double()
    counted = seen.sum(-1) > 1
    if not counted.any():
        return float("nan")
    return float((seen[counted, 0] / seen[counted].sum(-1)).mean())


def layer_values(per_head: dict) -> dict:
    """One number per statistic for the layer: its heads reduced as METRICS says (mean, max or min)."""
    return {name: float(REDUCE[layer_reduction(name)](v)) for name, v in per_head.items()}
