"""Perplexity of a trained run decoded with rolling KV caches on a text longer than its block:
``attnlab stream RUN_DIR --cache C --sinks 0,1,2,4 [--text FILE] [--tokens N] [--json]``.

Every token of the text is fed one at a time through ``GPT.next_logits`` with a
``RollingKVCache`` per layer (StreamingLLM, Xiao et al. 2023: the first k tokens kept as attention
sinks, then the most recent ones, C entries in all), and the next token's negative log-likelihood
is read from each step's logits, for each kept-sink count k. Two references on the same tokens:

- the oracle, StreamingLLM's "sliding window with re-computation": each position's logits from a
  full forward over its last C tokens (no sinks kept), at positions 0..C-1 of that window. Every
  layer then sees exactly the window, which a rolling cache cannot give (its deeper layers' entries
  keep the context they were computed in). It costs a C-token forward per position, so it is
  evaluated at every s-th position only, at most ``--oracle-positions`` of them (stated in the output);
- dense attention within the block: the text cut into consecutive block_size windows, each a full
  forward, so a token sees the tokens since its window's start (what validation loss computes).

The text: the first N tokens of the run's validation split (rebuilt from its results.json; a task
such as the sinks testbed draws one N-token sequence from its validation stream), or ``--text FILE``
encoded with the run's own tokenizer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.cli import command_parser
from attnlab.data.text import read_text_file
from attnlab.data.tokens import load_tokenizer
from attnlab.inference.analyze import locate
from attnlab.training.checkpointing import load_model
from attnlab.util.errors import AttnlabError, CheckpointError, DataError

DEFAULT_SINKS = "0,1,2,4"


def rolling_nll(model, ids: torch.Tensor, capacity: int, sinks: int) -> torch.Tensor:
    """(N-1,) NLL of ids[t+1] after feeding ids[0..t] one token at a time into rolling caches."""
    return rolling_decode(model, ids, capacity, sinks)[0]


@torch.no_grad()
def rolling_decode(model, ids: torch.Tensor, capacity: int, sinks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rolling_nll`` with what each layer's attention wrote at each step: (N-1,) NLL and (N-1, layers)
    norms of the attention block's output (after out_proj) at the fed position, the vector it adds to
    the residual stream. What a head writes once its sink is evicted is how eviction reaches the logits."""
    blocks = [block.attn for block in model.blocks]
    writes = torch.zeros(len(ids) - 1, len(blocks), dtype=torch.float64)
    step = [0]

    def hook(layer):
        return lambda _module, _inputs, y: writes.__setitem__((step[0], layer), float(y[0, -1].norm()))

    handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)]
    try:
        caches = model.rolling_kv_caches(capacity, sinks)
        nll = ids.new_empty(len(ids) - 1, dtype=torch.float64)
        for t in range(len(ids) - 1):
            step[0] = t
            logits = model.next_logits(ids[t : t + 1].unsqueeze(0), caches)[0]
            nll[t] = -torch.log_softmax(logits.double(), -1)[ids[t + 1]]
    finally:
        for h in handles:
            h.remove()
    return nll, writes


def by_class(nll: torch.Tensor, writes: torch.Tensor, classes: dict[str, torch.Tensor], start: int) -> dict:
    """Per query class (positions >= ``start``, where the cache has evicted): perplexity and each layer's
    mean attention write norm."""
    out = {}
    for name, mask in classes.items():
        mask = mask[: len(nll)].clone()
        mask[:start] = False
        if mask.any():
            out[name] = {
                "positions": int(mask.sum()),
                "ppl": perplexity(nll[mask]),
                "write_norm": [float(w) for w in writes[mask].mean(0)],
            }
    return out


@torch.no_grad()
def window_nll(model, ids: torch.Tensor, capacity: int, positions: list[int], batch: int = 32) -> torch.Tensor:
    """NLL of ids[t+1] at each of ``positions``, each from a full forward over ids[t-C+1..t]
    (fewer at the start of the text), batched: full windows are stacked, the first C positions
    share one forward over the first C tokens (causal, so position t of it sees ids[0..t])."""
    out = torch.empty(len(positions), dtype=torch.float64)
    early = [i for i, t in enumerate(positions) if t < capacity - 1]
    if early:
        logits = model(ids[:capacity].unsqueeze(0))[0][0].double()
        for i in early:
            t = positions[i]
            out[i] = -torch.log_softmax(logits[t], -1)[ids[t + 1]]
    full = [i for i, t in enumerate(positions) if t >= capacity - 1]
    for j in range(0, len(full), batch):
        chunk = full[j : j + batch]
        windows = torch.stack([ids[positions[i] + 1 - capacity : positions[i] + 1] for i in chunk])
        logp = torch.log_softmax(model(windows)[0][:, -1].double(), -1)
        targets = torch.stack([ids[positions[i] + 1] for i in chunk])
        out[chunk] = -logp.gather(1, targets[:, None])[:, 0]
    return out


@torch.no_grad()
def dense_nll(model, ids: torch.Tensor) -> torch.Tensor:
    """(N-1,) NLL of ids[t+1] with the text cut into consecutive block_size windows, each a full forward."""
    block = model.cfg.block_size
    parts = []
    for start in range(0, len(ids) - 1, block):
        x = ids[start : start + block]
        y = ids[start + 1 : start + block + 1]
        logits = model(x[: len(y)].unsqueeze(0))[0][0].double()
        parts.append(F.cross_entropy(logits, y, reduction="none"))
    return torch.cat(parts)


def oracle_positions(n: int, limit: int) -> list[int]:
    """Every s-th of the n-1 predicted positions, s the smallest stride leaving at most ``limit``;
    the last position always in (the longest stretch past the first eviction)."""
    stride = max(1, math.ceil((n - 1) / limit))
    return list(range(n - 2, -1, -stride))[::-1]


def perplexity(nll: torch.Tensor) -> float:
    return float(torch.exp(nll.mean()))


def stream_report(
    model, ids: torch.Tensor, capacity: int, sinks: list[int], oracle_limit: int = 512, classes: dict | None = None
) -> dict:
    """Perplexities of the rolling caches (one per kept-sink count) and of both references on ``ids``;
    with ``classes`` (query class -> (N,) mask of positions, a task's), each cache's perplexity and
    attention write norms per class over the positions past the first eviction."""
    positions = oracle_positions(len(ids), oracle_limit)
    at = torch.tensor(positions)
    oracle = window_nll(model, ids, capacity, positions)
    dense = dense_nll(model, ids)
    rows = []
    for k in sinks:
        nll, writes = rolling_decode(model, ids, capacity, k)
        rows.append({"sinks": k, "ppl": perplexity(nll), "ppl_oracle_positions": perplexity(nll[at])})
        if classes:
            rows[-1]["classes"] = by_class(nll, writes, classes, start=capacity)
    return {
        "tokens": len(ids),
        "positions": len(ids) - 1,
        "capacity": capacity,
        "block_size": model.cfg.block_size,
        "evicting_positions": max(0, len(ids) - 1 - capacity),
        "rolling": rows,
        "oracle": {
            "kind": "sliding window recomputed: a full forward over the last C tokens (no sinks)",
            "positions": len(positions),
            "stride": positions[1] - positions[0] if len(positions) > 1 else 1,
            "ppl": perplexity(oracle),
        },
        "dense": {
            "kind": "consecutive block_size windows, each a full forward",
            "ppl": perplexity(dense),
            "ppl_oracle_positions": perplexity(dense[at]),
        },
    }


# ---- the command -------------------------------------------------------------------------------


def run_tokens(run_dir: Path, module, ckpt: Path, text: Path | None, limit: int) -> tuple[torch.Tensor, str]:
    """The first ``limit`` token ids of --text FILE (the run's tokenizer) or of the run's validation split."""
    if text is not None:
        try:
            raw = read_text_file(str(text))
            tokenizer = load_tokenizer(ckpt, module.hparams.get("vocab"))
        except DataError as err:  # read_text_file names its config key; here the file came from the flag
            raise SystemExit(f"attnlab: error: {str(err).replace('data.path=', '--text=')}") from None
        unknown = tokenizer.unknown(raw)
        if unknown:
            raise SystemExit(
                f"attnlab: error: --text={str(text)!r} has characters outside the run's vocabulary: {unknown[:10]!r}"
            )
        return torch.tensor(tokenizer.encode(raw)[:limit], dtype=torch.long), f"{text}"
    results = run_dir / "results.json"
    if not results.is_file():
        raise SystemExit(
            f"attnlab: error: {run_dir}: no results.json to rebuild the validation split from; "
            "expected a run dir written by attnlab train, or --text FILE"
        )
    from hydra.utils import instantiate

    cfg = json.loads(results.read_text())["config"]
    try:
        dm = instantiate(cfg["data"], block_size=cfg["model"]["block_size"], steps=1, seed=cfg.get("seed", 0))
        dm.setup("fit")
        # a task's validation rows are block-long: it draws one longer sequence instead (the sinks testbed)
        ids = dm.stream_ids(limit) if hasattr(dm, "stream_ids") else dm.val_ids[:limit]
    except (AttnlabError, DataError, OSError, AttributeError) as err:
        raise SystemExit(
            f"attnlab: error: {run_dir}: cannot rebuild the run's validation split ({err}); "
            "expected a text or token corpus run, or --text FILE"
        ) from None
    if hasattr(dm, "stream_ids"):
        return torch.as_tensor(ids, dtype=torch.long), f"one validation sequence of data={dm.name}"
    return torch.as_tensor(ids, dtype=torch.long), f"the validation split of data={cfg['data'].get('source', 'tokens')}"


def markdown(report: dict) -> str:
    c = report["capacity"]
    lines = [
        f"{report['source']}: {report['tokens']} tokens ({report['evicting_positions']} of {report['positions']} "
        f"predicted positions past the first eviction), cache {c}, block {report['block_size']}; the oracle at "
        f"{report['oracle']['positions']} positions, a stride of {report['oracle']['stride']}",
        "",
        "| decoding | a position's context | perplexity | on the oracle's positions |",
        "|---|---|---:|---:|",
    ]
    for row in report["rolling"]:
        lines.append(
            f"| rolling cache, {row['sinks']} sink{'s' * (row['sinks'] != 1)} | the first {row['sinks']} "
            f"and the last {c - row['sinks']} tokens | {row['ppl']:.3f} | {row['ppl_oracle_positions']:.3f} |"
        )
    lines.append(
        f"| sliding window, recomputed (oracle) | the last {c} tokens, a full forward each | - "
        f"| {report['oracle']['ppl']:.3f} |"
    )
    lines.append(
        f"| dense within the block | the tokens since its block's start | {report['dense']['ppl']:.3f} "
        f"| {report['dense']['ppl_oracle_positions']:.3f} |"
    )
    return "\n".join(lines)


def parse_sinks(parser, value: str, capacity: int) -> list[int]:
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() for p in parts):
        parser.error(f"--sinks={value!r}; expected comma-separated non-negative integers, e.g. {DEFAULT_SINKS}")
    sinks = [int(p) for p in parts]
    bad = [k for k in sinks if k >= capacity]
    if bad:
        parser.error(f"--sinks={value!r}: {bad[0]} is not below --cache={capacity}; expected 0 <= k < C for every k")
    return sinks


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("stream", __doc__.splitlines()[0])
    parser.add_argument("run", help="run dir or .ckpt file")
    parser.add_argument("--cache", type=int, required=True, metavar="C", help="rolling cache entries (1..block_size)")
    parser.add_argument(
        "--sinks", default=DEFAULT_SINKS, metavar="K,K,...", help=f"kept-sink counts (default {DEFAULT_SINKS})"
    )
    parser.add_argument(
        "--text", type=Path, metavar="FILE", help="a UTF-8 text file (default: the run's validation split)"
    )
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the text to read (default 2048)")
    parser.add_argument(
        "--oracle-positions", type=int, default=512, help="at most this many oracle positions (default 512)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.cache < 1:
        parser.error(f"--cache={args.cache}; expected a positive integer at most the run's block_size")
    sinks = parse_sinks(parser, args.sinks, args.cache)
    for flag, value in (("--tokens", args.tokens), ("--oracle-positions", args.oracle_positions)):
        if value < 1:
            parser.error(f"{flag}={value}; expected a positive integer")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads={args.threads}; expected a positive integer")
        torch.set_num_threads(args.threads)

    try:
        ckpt, run_dir = locate(args.run)
        module = load_model(ckpt)[0].eval()
    except CheckpointError as err:
        raise SystemExit(f"attnlab: error: {err}; expected a checkpoint written by attnlab train") from None
    except AttnlabError as err:
        raise SystemExit(f"attnlab: error: RUN_DIR={err}") from None
    model = module.model
    for k in sinks:  # the model's own refusals (learned positions, sigmoid, C above block_size), before any work
        try:
            model.rolling_kv_caches(args.cache, k)
        except ValueError as err:
            raise SystemExit(f"attnlab: error: --cache={args.cache} --sinks={k}: {err}") from None
    ids, source = run_tokens(run_dir, module, ckpt, args.text, args.tokens)
    if len(ids) < args.cache + 2:
        raise SystemExit(
            f"attnlab: error: {source} gives {len(ids)} tokens; expected at least --cache + 2 = "
            f"{args.cache + 2} (one position past the first eviction)"
        )
    report = {
        "run": str(run_dir),
        "checkpoint": str(ckpt),
        "source": source,
        "model": {
            "pos_encoding": model.cfg.pos_encoding,
            "n_layer": model.cfg.n_layer,
            "n_head": model.cfg.n_head,
            "n_kv_head": model.cfg.n_kv_head,
            "escape": model.cfg.attention.escape,
        },
        **stream_report(model, ids, args.cache, sinks, args.oracle_positions),
    }
    print(json.dumps(report, indent=1) if args.json else markdown(report))


if __name__ == "__main__":
    main()
