"""Head types: per layer x head scores from attention probabilities, and a type from thresholds.

Scores (per head, from probabilities p of shape (B, H, T, T), causal; query row 0 is left out of
every score because it can only see itself):
  previous_token  mean over queries i >= 1 of p[i, i-1]
  sink            mean over queries i >= 1 of p[i, 0] (StreamingLLM's first-token weight)
  positional      how much of the pattern an offset-only pattern explains: m[d] is the head's
                  mean weight at offset d = i - j (over the probe batch and all queries), q_i is m
                  over the keys query i sees, renormalised, and the score is the mean overlap
                  sum_j min(p_ij, q_ij) = 1 - total variation distance. 1: the head attends by
                  offset alone, whatever the content.
  entropy_norm    mean over queries i seeing k_i >= 2 keys of H(p_i) / log k_i (k_i = i + 1 under
                  plain causality); 1 = uniform over visible keys
                  (with an escape slot: of the real-key weights renormalised, i.e. how the head
                  spreads the weight it does place)
  escape          only for models with an escape slot (model.attention.escape): mean over queries
                  i >= 1 of the weight that goes nowhere, 1 - sum_j p_ij. Every other score reads
                  the real-key weights as they are, so they no longer sum to 1.
  induction       on random sequences r r (r of L tokens): mean over second-half queries i of
                  p[i, i - L + 1], the weight on the token after the query's first occurrence
                  (Olsson et al. 2022). L varies over the probe rows (random filler before the
                  first r), so a head attending at one fixed offset cannot score high.
previous_token, sink, positional and entropy_norm are measured on a "plain" probe (real text, or
the task's own sequences without repeats); induction on the repeated probe. They must differ:
on a repeat an induction head attends at a fixed offset and would look positional.

  induction_control  the same weights on control rows whose second r is fresh tokens: what a
                  head gets there it gets by position alone (short probes let a local head
                  reach the target often)
  induction_knockout  causal, not a weight: how much the model's probability of the right next
                  token on the repeat falls when this head's edges from each second-half query
                  to its induction target are cut (weights renormalised over the other keys).
                  Measured because a model can read the target through broad, low-weight
                  attention that no weight score names (README, "Tasks").

Type, the first rule that holds (thresholds in THRESHOLDS, chosen before any run):
  induction       induction - induction_control >= 0.3  (uniform attention: about 1/(1.5 L) each)
  previous_token  previous_token >= 0.5  (most of the weight on the token before)
  sink            sink > 0.3             (Gu et al. 2024's rule for a sink head: attention.stats.is_sink)
  escape          escape > 0.3           (the same rule: the weight parked in the escape slot)
  uniform         entropy_norm >= 0.9    (near-uniform averaging over the context)
  positional      positional >= 0.7      (another content-independent pattern, e.g. offset 2)
  content         otherwise: where the head looks depends on what the tokens are (the article's
                  "syntactic" heads would be here; a character model has no syntax to name)
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnlab.analysis.probe import ProbeRecord, eval_mode, probe_plan, probe_with_logits
from attnlab.attention import Knockout, allowed_mask
from attnlab.attention.stats import SINK_EPSILON
from attnlab.data.text import BOS  # the token the data modules put first with data.bos

SCORES = (
    "previous_token",
    "induction",
    "induction_control",
    "induction_knockout",
    "sink",
    "escape",
    "positional",
    "entropy_norm",
)
THRESHOLDS = {
    "induction": 0.3,
    "previous_token": 0.5,
    "sink": SINK_EPSILON,
    "escape": SINK_EPSILON,
    "uniform": 0.9,
    "positional": 0.7,
}
TYPES = ("induction", "previous_token", "sink", "escape", "uniform", "positional", "content")


def _rows(p: torch.Tensor) -> torch.Tensor:
    """Query rows 1..T-1 (row 0 sees only itself)."""
    return p[..., 1:, :]


def previous_token_score(p: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) -> (H,): mean weight on the previous token."""
    return torch.diagonal(p, offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))


def sink_score(p: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) -> (H,): mean weight on the first token."""
    return _rows(p)[..., 0].mean(dim=(0, 2))


def escape_score(p: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) real-key weights -> (H,): mean weight that goes to no key (an escape slot's)."""
    return (1 - _rows(p).sum(-1)).mean(dim=(0, 2))


def causal_visible(t: int, device=None) -> torch.Tensor:
    """(T, T) bool: the keys each query sees under a plain causal mask (masks.allowed_mask)."""
    return allowed_mask(t, t, True, None, device)[0, 0]


def entropy_norm_score(p: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """(B, H, T, T) -> (H,): mean entropy over log(number of visible keys), of each row
    renormalised to sum to 1 (a no-op without an escape slot), over the rows seeing two keys or
    more; ``visible`` (T, T) the layer's visibility (default: causal)."""
    visible = causal_visible(p.shape[-1], p.device) if visible is None else visible.to(p.device)
    n = visible.sum(-1)
    counted = n > 1
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    ent = -torch.special.xlogy(p, p).sum(-1)[..., counted]  # (B, H, counted rows)
    return (ent / n[counted].to(p.dtype).log()).mean(dim=(0, 2))


def offset_pattern(p: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """(B, H, T, T) -> (H, T, T): each head's mean weight by offset i - j, renormalised per row;
    ``visible`` (T, T) the layer's visibility (default: causal)."""
    b, h, t, _ = p.shape
    visible = causal_visible(t, p.device) if visible is None else visible.to(p.device)
    i, j = torch.arange(t, device=p.device).view(-1, 1), torch.arange(t, device=p.device).view(1, -1)
    offsets = (i - j).clamp(min=0)  # (T, T)
    counted = visible & (visible.sum(-1, keepdim=True) > 1)  # every visible entry of a row seeing two keys or more
    at = offsets[counted]  # the offset of each counted entry
    per_offset = torch.bincount(at, minlength=t).to(p.dtype) * b  # entries averaged at each offset
    m = torch.zeros(h, t, dtype=p.dtype, device=p.device).index_add_(1, at, p.sum(0)[:, counted])
    m = m / per_offset  # (H, T): m[h, d], one scatter instead of a loop over the T diagonals
    q = m[:, offsets] * visible  # (H, T, T)
    return q / q.sum(-1, keepdim=True).clamp_min(1e-12)


def positional_score(p: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """(B, H, T, T) -> (H,): overlap of each row with the offset-only pattern (1 - TV distance)."""
    q = offset_pattern(p, visible)
    return _rows(torch.minimum(p, q.unsqueeze(0))).sum(-1).mean(dim=(0, 2))


def induction_score(p: torch.Tensor, half, start) -> torch.Tensor:
    """(B, H, T, T) -> (H,): mean weight from each second-half query to the token after its first
    occurrence, on rows holding r r with r of ``half`` tokens starting at ``start`` (ints, or one
    per row); each row's mean counts alike."""
    b, t = p.shape[0], p.shape[-1]
    half, start = torch.as_tensor(half).expand(b), torch.as_tensor(start).expand(b)
    i = torch.arange(t).view(1, -1)  # query positions
    queries = (i >= (start + half).view(-1, 1)) & (i < (start + 2 * half).view(-1, 1))  # (B, T)
    rows, cols = (x.to(p.device) for x in queries.nonzero(as_tuple=True))
    lengths = half.to(p.device)
    weights = p[rows, :, cols, cols - lengths[rows] + 1]  # (queries, H): one gather, no loop over rows
    per_row = torch.zeros(b, p.shape[1], dtype=p.dtype, device=p.device).index_add_(0, rows, weights)
    return (per_row / lengths.view(-1, 1).to(p.dtype)).mean(0)


def copying_queries(half: torch.Tensor, start: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
    """Per row (row, L, queries): the second-half positions whose next token is part of the repeat,
    i.e. where a model copying in context predicts the token after the first occurrence."""
    return [
        (row, h, torch.arange(s + h, s + 2 * h - 1)) for row, (h, s) in enumerate(zip(half.tolist(), start.tolist()))
    ]


def induction_edges(half: torch.Tensor, start: torch.Tensor, t: int) -> torch.Tensor:
    """(B, T, T) bool: query i -> key i - L + 1 for every copying query."""
    edges = torch.zeros(len(half), t, t, dtype=torch.bool)
    for row, h, queries in copying_queries(half, start):
        edges[row, queries, queries - h + 1] = True
    return edges


@contextmanager
def cut_edges(model, layer: int, head: int | None, edges: torch.Tensor):
    """Within the block, ``layer``'s ``head`` (None: every head) attends as before minus the given
    (B, T, T) edges, cut on the layer's own weight path (``Attention.knockout``: a softmax row
    renormalised over the keys left, a sigmoid row keeping its other weights); other heads' outputs
    are left untouched."""
    module = model.attention_layers()[layer]
    module.knockout = Knockout(edges, head)
    try:
        yield
    finally:
        module.knockout = None


def answer_probability(logits: torch.Tensor, idx: torch.Tensor, half: torch.Tensor, start: torch.Tensor) -> float:
    """Mean probability of the right next token over the copying queries."""
    probs = logits.float().softmax(-1)
    total, count = 0.0, 0
    for row, _, queries in copying_queries(half, start):
        queries = queries.to(idx.device)
        total += float(probs[row, queries, idx[row, queries + 1]].sum())
        count += len(queries)
    return total / max(count, 1)


def induction_knockout(
    model,
    idx: torch.Tensor,
    half: torch.Tensor,
    start: torch.Tensor,
    n_head: int,
    records: list[ProbeRecord] | None = None,
    logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """(n_layer, n_head + 1): drop in the right token's probability on the repeated rows ``idx``
    when one head's induction edges are cut; the last column cuts them in every head of the layer
    at once (heads that share the work each look dispensable alone). ``records`` and ``logits``: the
    uncut model's probe of ``idx``, if the caller has it; each cut then runs only the blocks from
    its layer on, from the residual stream the uncut forward had there (the same numbers)."""
    if records is None or logits is None:
        records, logits = probe_with_logits(model, idx)
    edges = induction_edges(half, start, idx.shape[1])
    base = answer_probability(logits, idx, half, start)
    entering = [model.embed(idx), *(rec.residual for rec in records[:-1])]  # the stream entering each block
    drop = torch.zeros(len(entering), n_head + 1)
    for layer, x in enumerate(entering):
        for column, head in enumerate([*range(n_head), None]):
            with cut_edges(model, layer, head, edges):
                drop[layer, column] = base - answer_probability(model.logits_from(x, layer), idx, half, start)
    return drop


def head_type(scores: dict[str, float], thresholds: dict[str, float] = THRESHOLDS) -> str:
    """The first type whose rule holds (order and thresholds documented in the module docstring)."""
    if scores["induction"] - scores.get("induction_control", 0.0) >= thresholds["induction"]:
        return "induction"
    if scores["previous_token"] >= thresholds["previous_token"]:
        return "previous_token"
    # strict, as attention.stats.is_sink: at THRESHOLDS these are that rule
    if scores["sink"] > thresholds["sink"]:
        return "sink"
    if scores.get("escape", 0.0) > thresholds["escape"]:
        return "escape"
    if scores["entropy_norm"] >= thresholds["uniform"]:
        return "uniform"
    if scores["positional"] >= thresholds["positional"]:
        return "positional"
    return "content"


def head_scores(
    plain: torch.Tensor,
    repeat: torch.Tensor,
    half,
    start,
    control: torch.Tensor | None = None,
    escape: bool = False,
    visible: torch.Tensor | None = None,
) -> dict:
    """All scores of one layer's heads, from its probabilities on the plain, the repeated and the
    control probe (``half``, ``start``: the repeat's length and first position, ints or per row).
    ``escape``: the model has an escape slot, so score the weight that goes nowhere too.
    ``visible``: (T, T) the keys each plain-probe query sees (``Attention.visible``; default causal)."""
    plain, repeat = plain.float(), repeat.float()
    ctrl = induction_score(control.float(), half, start) if control is not None else torch.zeros(repeat.shape[1])
    extra = {"escape": escape_score(plain)} if escape else {}
    return {
        **extra,
        "previous_token": previous_token_score(plain),
        "induction": induction_score(repeat, half, start),
        "induction_control": ctrl.to(repeat.device),
        "sink": sink_score(plain),
        "positional": positional_score(plain, visible),
        "entropy_norm": entropy_norm_score(plain, visible),
    }


@dataclass
class Probes:
    """Inputs for the analysis: plain (B, T) ids, and repeated (B, T') ids whose row b holds
    r r with r of half[b] tokens from position start[b]."""

    plain: torch.Tensor
    repeat: torch.Tensor
    half: torch.Tensor
    start: torch.Tensor
    control: torch.Tensor
    plain_source: str = "random"


def repeated_probe(vocab: list[str] | int, length: int, n: int = 16, seed: int = 0):
    """Rows [<bos>?] f r r g: r random tokens, f and g random filler (their split drawn per row), no
    token twice where the vocabulary allows.

    The length L of r varies over the rows (from about length/4 to length/2), so that a head
    attending at a fixed offset matches the induction target in few rows and scores low (and
    where the repeat sits varies too, as in the induction task's data); only
    a head that finds the previous occurrence of the current token scores high on all of them.
    A vocabulary with a "<bos>" token (the induction task's) gets it in front, as in training.
    The control rows are the same but for the second r, which is replaced by fresh tokens: a
    head that hits the induction target there too does so by position, not by matching.
    Returns (ids (n, length'), half (n,), start (n,), control ids (n, length')).
    """
    tokens = list(vocab) if not isinstance(vocab, int) else [str(i) for i in range(vocab)]
    prefix = [tokens.index(BOS)] if BOS in tokens else []
    candidates = torch.tensor([i for i in range(len(tokens)) if i not in prefix])
    body = length - len(prefix)
    longest, shortest = body // 2, max(2, body // 4)
    if longest < 2:
        raise ValueError(f"a repeated probe needs length >= {len(prefix) + 4}, got {length}")
    gen = torch.Generator().manual_seed(seed)
    halves = torch.linspace(shortest, longest, n).round().long()  # spread evenly over the rows
    width = body - int(halves.min()) + int(halves.max())  # filler + r + the control's fresh r
    rows, starts, controls = [], [], []
    for half in halves.tolist():
        if len(candidates) >= width:
            fresh = candidates[torch.randperm(len(candidates), generator=gen)[:width]]
        else:
            fresh = candidates[torch.randint(len(candidates), (width,), generator=gen)]
        filler = body - 2 * half
        before = int(torch.randint(filler + 1, (1,), generator=gen))
        pre, r, post = fresh[:before], fresh[before : before + half], fresh[before + half : filler + half]
        other = fresh[filler + half : filler + 2 * half]
        head = torch.tensor(prefix, dtype=torch.long)
        rows.append(torch.cat([head, pre, r, r, post]))
        controls.append(torch.cat([head, pre, r, other, post]))
        starts.append(len(prefix) + before)
    return torch.stack(rows), halves, torch.tensor(starts), torch.stack(controls)


def random_probe(vocab_size: int, length: int, n: int = 16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(vocab_size, (n, length), generator=gen)


def build_probes(
    model,
    vocab: list[str] | None,
    datamodule=None,
    n: int = 16,
    seed: int = 0,
    max_len: int | None = None,
    max_tokens: int | None = None,
) -> Probes:
    """The plain probe from the data (a task's ``probe_batch``, else its first validation batch,
    else random tokens) and the repeated probe over the model's vocabulary and block size.

    ``max_len`` caps the probe length and ``max_tokens`` the tokens of each probe (``probe_rows``:
    evenly spaced rows of the ``n``), so the analysis (three forwards with T x T weights per layer,
    and the knockout's n_layer x (n_head + 1) partial ones) costs about the same at any block size,
    at the price of scoring heads on the first ``max_len`` positions of fewer, longer rows. Where
    both bounds hold (n x T <= max_tokens, T <= max_len) nothing changes."""
    block = model.cfg.block_size if max_len is None else min(model.cfg.block_size, max_len)
    vocab = vocab or model.cfg.vocab_size
    repeat, half, start, control = repeated_probe(vocab, block, n, seed)
    plain, source = None, "random"
    if datamodule is not None:
        if hasattr(datamodule, "probe_batch"):
            plain, source = datamodule.probe_batch(n, seed), "data"
        else:
            plain, source = next(iter(datamodule.val_dataloader()))[0], "validation"
        plain = plain[:n, :block]
    if plain is None:
        plain = random_probe(model.cfg.vocab_size, block, n, seed)
    keep, keep_plain = probe_rows(len(repeat), block, max_tokens), probe_rows(len(plain), block, max_tokens)
    if keep is not None:
        repeat, half, start, control = repeat[keep], half[keep], start[keep], control[keep]
    return Probes((plain if keep_plain is None else plain[keep_plain]).long(), repeat, half, start, control, source)


def record_probs(records: list[ProbeRecord]) -> list[torch.Tensor]:
    """Each probed layer's attention weights (B, H, T, T), in fp32."""
    return [rec.layer.probabilities(rec.q, rec.k) for rec in records]


def layer_probs(model, idx: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Attention weights (B, H, T, T) of every layer for inputs idx, in fp32, and the logits."""
    records, logits = probe_with_logits(model, idx)
    return record_probs(records), logits


def repeat_accuracy(logits: torch.Tensor, idx: torch.Tensor, half: torch.Tensor, start: torch.Tensor) -> float:
    """Next-token accuracy over the copying queries (the model copying in context)."""
    hits, total = 0, 0
    for row, _, queries in copying_queries(half, start):
        queries = queries.to(idx.device)
        hits += int((logits[row, queries].argmax(-1) == idx[row, queries + 1]).sum())
        total += len(queries)
    return hits / max(total, 1)


def in_context_score(logits: torch.Tensor, idx: torch.Tensor, half: torch.Tensor, start: torch.Tensor) -> float:
    """Olsson et al.'s in-context learning score on the repeated probe: the mean loss (nats) of
    predicting each token of the second r (late in the context) minus the loss of predicting the same
    token in the first r (early, where it cannot be known). Near 0 before in-context copying forms,
    strongly negative after; the same tokens on both sides, so token frequency cancels."""
    logp = logits.float().log_softmax(-1)
    late, early = [], []
    for row, h, queries in copying_queries(half, start):
        queries = queries.to(idx.device)
        late.append(-logp[row, queries, idx[row, queries + 1]])
        early.append(-logp[row, queries - h, idx[row, queries - h + 1]])
    return float(torch.cat(late).mean() - torch.cat(early).mean())


def probe_rows(n: int, length: int, max_tokens: int | None) -> torch.Tensor | None:
    """Which of ``n`` probe rows of ``length`` tokens the analysis keeps: evenly spaced rows (the
    repeated probe's repeat lengths still span its range) holding at most ``max_tokens`` tokens,
    never fewer than one; None when all fit. The rows are longer as they are fewer, so the number
    of queries each score (and the knockout's drop) averages over stays about the same."""
    keep = probe_plan(n, length, max_tokens, None)[0]
    return None if keep >= n else torch.linspace(0, n - 1, keep).round().long()


@torch.no_grad()
def analyze_heads(
    model, probes: Probes, thresholds: dict[str, float] = THRESHOLDS, knockout: bool = True
) -> tuple[list[dict], dict]:
    """Per-head records [{"layer", "head", "type", "scores"}] and a summary (maxima, type counts).
    ``knockout=False`` skips induction_knockout (n_layer x (n_head + 1) extra passes over the
    blocks)."""
    device = next(model.parameters()).device
    repeat_ids = probes.repeat.to(device)
    plain_probs, _ = layer_probs(model, probes.plain.to(device))
    records, logits = probe_with_logits(model, repeat_ids)  # kept: the knockout starts from them
    repeat_probs = record_probs(records)
    control_probs, _ = layer_probs(model, probes.control.to(device))
    has_escape = any(layer.escape_logit() is not None for layer in model.attention_layers())
    drops = None
    if knockout:
        with eval_mode(model):
            drops = induction_knockout(
                model, repeat_ids, probes.half, probes.start, plain_probs[0].shape[1], records, logits
            )
    heads = []
    for layer, (plain, repeat, control) in enumerate(zip(plain_probs, repeat_probs, control_probs)):
        visible = model.attention_layers()[layer].visible(plain.shape[-1])
        scores = head_scores(plain, repeat, probes.half, probes.start, control, escape=has_escape, visible=visible)
        if drops is not None:
            scores["induction_knockout"] = drops[layer, :-1]
        for h in range(plain.shape[1]):
            values = {name: round(float(v[h]), 4) for name, v in scores.items()}
            heads.append({"layer": layer, "head": h, "type": head_type(values, thresholds), "scores": values})
    summary = heads_summary(heads)
    for layer, drop in enumerate(drops[:, -1].tolist() if drops is not None else []):
        summary[f"L{layer}/induction_knockout_all_heads"] = round(drop, 4)
    summary["repeat_acc"] = repeat_accuracy(logits, repeat_ids, probes.half, probes.start)
    summary["in_context_score"] = round(in_context_score(logits, repeat_ids, probes.half, probes.start), 4)
    return heads, summary


def heads_summary(heads: list[dict]) -> dict:
    """Maxima of each score (overall and per layer) and how many heads of each type."""
    out = {}
    layers = sorted({h["layer"] for h in heads})
    for name in (n for n in SCORES if n in heads[0]["scores"]):
        out[f"{name}_max"] = max(h["scores"][name] for h in heads)
        for layer in layers:
            out[f"L{layer}/{name}_max"] = max(h["scores"][name] for h in heads if h["layer"] == layer)
    for kind in TYPES:
        out[f"n_{kind}"] = sum(h["type"] == kind for h in heads)
    return out


def types_by_layer(heads_per_seed: list[list[dict]], layers: int) -> list[dict[str, list[int]]]:
    """Per layer, {type: number of heads of that type in each seed's analysis}, for the head records
    of several seeds of one setting; types no seed has are left out."""
    out = []
    for layer in range(layers):
        counts = [Counter(h["type"] for h in heads if h["layer"] == layer) for heads in heads_per_seed]
        out.append({kind: [c[kind] for c in counts] for kind in sorted({k for c in counts for k in c})})
    return out
