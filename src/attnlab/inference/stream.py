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
encoded with the run's own tokenizer. ``--sequences S`` reads S such sequences (consecutive stretches,
or S draws of a task) and pools their positions into every perplexity.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.data.text import read_text_file
from attnlab.data.tokens import load_tokenizer
from attnlab.inference.analyze import locate
from attnlab.training.checkpointing import load_model
from attnlab.util.cli import command_parser
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


def by_class(nll: torch.Tensor, writes: torch.Tensor, classes: dict[str, torch.Tensor]) -> dict:
    """Per query class (a mask over the positions of ``nll``): perplexity and each layer's mean attention
    write norm."""
    out = {}
    for name, mask in classes.items():
        if mask.any():
            out[name] = {
                "positions": int(mask.sum()),
                "ppl": perplexity(nll[mask]),
                "write_norm": [float(w) for w in writes[mask].mean(0)],
            }
    return out


def past_eviction(mask: torch.Tensor, positions: int, start: int) -> torch.Tensor:
    """A (S, N) query-class mask cut to each sequence's ``positions`` predicted positions, those before
    ``start`` (where the cache has not yet evicted) dropped, laid end to end as the pooled NLLs are."""
    mask = mask[:, :positions].clone()
    mask[:, :start] = False
    return mask.reshape(-1)


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
    """Perplexities of the rolling caches (one per kept-sink count) and of both references on ``ids``, one
    sequence (N,) or several of one length (S, N) whose positions pool into each perplexity (the mean NLL
    over all of them), so that one sequence's quirks weigh 1/S; with ``classes`` (query class -> (N,) or
    (S, N) mask of positions, a task's), each cache's perplexity and attention write norms per class over
    the positions past the first eviction."""
    seqs = ids if ids.dim() == 2 else ids[None]
    n = seqs.shape[1]
    positions = oracle_positions(n, oracle_limit)
    at = torch.tensor(positions)
    oracle = torch.cat([window_nll(model, s, capacity, positions) for s in seqs])
    dense = [dense_nll(model, s) for s in seqs]
    masks = {c: past_eviction(m if m.dim() == 2 else m[None], n - 1, capacity) for c, m in (classes or {}).items()}
    rows = []
    for k in sinks:
        decoded = [rolling_decode(model, s, capacity, k) for s in seqs]
        nll = torch.cat([d[0] for d in decoded])
        at_oracle = torch.cat([d[0][at] for d in decoded])
        rows.append({"sinks": k, "ppl": perplexity(nll), "ppl_oracle_positions": perplexity(at_oracle)})
        if masks:
            rows[-1]["classes"] = by_class(nll, torch.cat([d[1] for d in decoded]), masks)
    return {
        "tokens": n,
        "sequences": len(seqs),
        "positions": len(seqs) * (n - 1),
        "capacity": capacity,
        "block_size": model.cfg.block_size,
        "evicting_positions": len(seqs) * max(0, n - 1 - capacity),
        "rolling": rows,
        "oracle": {
            "kind": "sliding window recomputed: a full forward over the last C tokens (no sinks)",
            "positions": len(seqs) * len(positions),
            "stride": positions[1] - positions[0] if len(positions) > 1 else 1,
            "ppl": perplexity(oracle),
        },
        "dense": {
            "kind": "consecutive block_size windows, each a full forward",
            "ppl": perplexity(torch.cat(dense)),
            "ppl_oracle_positions": perplexity(torch.cat([d[at] for d in dense])),
        },
    }


# ---- the command -------------------------------------------------------------------------------


def run_tokens(
    run_dir: Path, module, ckpt: Path, text: Path | None, limit: int, sequences: int = 1
) -> tuple[torch.Tensor, str]:
    """(S, limit) token ids: S = ``sequences`` consecutive stretches of --text FILE (the run's tokenizer) or
    of the run's validation split, or, for a task, S sequences drawn from its validation stream."""
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
        return stretches(tokenizer.encode(raw), limit, sequences, f"{text}"), described(f"{text}", sequences)
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
        # a task's validation rows are block-long: it draws longer sequences instead (the sinks testbed)
        if hasattr(dm, "stream_ids"):
            ids = torch.stack([torch.as_tensor(dm.stream_ids(limit, i), dtype=torch.long) for i in range(sequences)])
            drawn = "one validation sequence" if sequences == 1 else f"{sequences} validation sequences"
            return ids, f"{drawn} of data={dm.name}"
        val_ids, source = dm.val_ids, f"the validation split of data={cfg['data'].get('source', 'tokens')}"
    except (AttnlabError, DataError, OSError, AttributeError) as err:
        raise SystemExit(
            f"attnlab: error: {run_dir}: cannot rebuild the run's validation split ({err}); "
            "expected a text or token corpus run, or --text FILE"
        ) from None
    return stretches(val_ids, limit, sequences, source), described(source, sequences)


def stretches(ids, limit: int, sequences: int, source: str) -> torch.Tensor:
    """(S, limit) consecutive stretches of a token sequence (one stretch: its first ``limit`` tokens, or all
    of it when shorter); more stretches than it holds is an error naming --sequences."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    if sequences == 1:
        return ids[:limit][None]
    if len(ids) < sequences * limit:
        raise SystemExit(
            f"attnlab: error: --sequences={sequences}: {source} holds {len(ids)} tokens, fewer than "
            f"{sequences} x --tokens={limit}; expected at most {len(ids) // limit} sequences"
        )
    return ids[: sequences * limit].view(sequences, limit)


def described(source: str, sequences: int) -> str:
    return source if sequences == 1 else f"{sequences} consecutive stretches of {source}"


def markdown(report: dict) -> str:
    c = report["capacity"]
    lines = [
        f"{report['source']}: {report['tokens']} tokens{' each' if report.get('sequences', 1) > 1 else ''} "
        f"({report['evicting_positions']} of {report['positions']} "
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
    parser.add_argument(
        "--sequences", type=int, default=1, help="sequences of --tokens each, pooled into every perplexity (default 1)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.cache < 1:
        parser.error(f"--cache={args.cache}; expected a positive integer at most the run's block_size")
    sinks = parse_sinks(parser, args.sinks, args.cache)
    for flag, value in (
        ("--tokens", args.tokens),
        ("--oracle-positions", args.oracle_positions),
        ("--sequences", args.sequences),
    ):
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
    ids, source = run_tokens(run_dir, module, ckpt, args.text, args.tokens, args.sequences)
    if ids.shape[1] < args.cache + 2:
        raise SystemExit(
            f"attnlab: error: {source} gives {ids.shape[1]} tokens; expected at least --cache + 2 = "
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
