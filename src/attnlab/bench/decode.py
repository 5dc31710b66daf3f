"""``python -m attnlab.bench.decode [RUN ...] [--tokens N] [--repeats R]``: ``attnlab sample``'s
generation timed with the KV cache and without (``--no-cache``), in one process, the two arms
alternated (which goes first flips every repeat), same seed; medians and the per-pair ratio range
-> reports/inference/sample_speed.json and .md.

Each RUN is a run dir or .ckpt file, optionally ``:TOKENS`` (default ``--tokens``). Both arms must
produce the same text (checked every repeat): the cache changes the cost, not the output.
``--stream CAPACITY:SINKS`` adds a third arm, rolling caches (``attnlab sample --stream``), in the
same alternation, for checkpoints whose positions can take them (rope, alibi, none); its text is
its own once the cache evicts.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from ..checkpointing import load_model
from ..cli import command_parser
from ..data.tokens import load_tokenizer
from ..errors import CheckpointError
from ..results import atomic_write_text, git_sha
from ..sample import resolve_checkpoint

OUT = Path("reports/inference")
SAMPLING = dict(temperature=0.8, top_k=40)  # attnlab sample's defaults


def time_generate(model, idx: torch.Tensor, tokens: int, seed: int, cache: bool,
                  stream: tuple[int, int] | None = None) -> tuple[float, list[int]]:
    """(seconds, generated ids) of one ``generate`` call with attnlab sample's sampling settings."""
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    out = model.generate(idx, tokens, generator=gen, cache=cache, stream=stream, **SAMPLING)
    return time.perf_counter() - t0, out[0].tolist()


def bench_run(ckpt: Path, tokens: int, repeats: int, prompt: str = "\n", seed: int = 0,
              stream: tuple[int, int] | None = None) -> dict:
    """Alternated cached / uncached (/ rolling, with ``stream``) generations of ``tokens`` tokens
    from one checkpoint."""
    try:
        module = load_model(ckpt)[0].eval()
    except CheckpointError as err:
        raise SystemExit(f"attnlab: error: {err}; expected a checkpoint written by attnlab train") from None
    model, cfg = module.model, module.model.cfg
    refusal = model.kv_cache_refusal()
    if refusal is not None:
        raise SystemExit(f"attnlab: error: {ckpt}: {refusal}")
    if stream is not None and (model.wpe is not None or stream[0] > cfg.block_size):
        stream = None  # learned positions or too long a capacity: this checkpoint takes no rolling cache
    idx = torch.tensor([load_tokenizer(ckpt, module.hparams.get("vocab")).encode(prompt)], dtype=torch.long)
    arms = {"cached": dict(cache=True), "uncached": dict(cache=False)}
    if stream is not None:
        arms["stream"] = dict(cache=True, stream=stream)
    for arm in arms.values():  # warm-up: first-call allocations and lazy initialisation
        time_generate(model, idx, min(tokens, 16), seed, **arm)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    identical = True
    for r in range(repeats):
        names = list(arms) if r % 2 == 0 else list(arms)[::-1]
        texts = {}
        for name in names:
            s, texts[name] = time_generate(model, idx, tokens, seed, **arms[name])
            seconds[name].append(s)
        identical &= texts["cached"] == texts["uncached"]
    ratios = [u / c for c, u in zip(seconds["cached"], seconds["uncached"])]
    median = {arm: statistics.median(v) for arm, v in seconds.items()}
    return {"stream": None if stream is None else {"capacity": stream[0], "sinks": stream[1]},
        "checkpoint": str(ckpt), "tokens": tokens, "prompt_tokens": idx.shape[1], "repeats": repeats, "seed": seed,
        "sampling": SAMPLING,
        "model": {"block_size": cfg.block_size, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_kv_head": cfg.n_kv_head,
                  "d_model": cfg.d_model, "pos_encoding": cfg.pos_encoding, "backend": cfg.attention.backend,
                  "escape": cfg.attention.escape},
        # steps whose window passes block_size refill the caches from the whole window (GPT.generate)
        "refilled_steps": max(0, idx.shape[1] + tokens - cfg.block_size),
        "seconds": seconds, "median_s": median,
        "tokens_per_s": {arm: tokens / s for arm, s in median.items()},
        "speedup": median["uncached"] / median["cached"], "speedup_range": [min(ratios), max(ratios)],
        **({"stream_speedup": median["uncached"] / median["stream"]} if stream is not None else {}),
        "identical_text": identical,
    }


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]}


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# attnlab sample: KV cache against --no-cache",
        "",
        f"`python -m attnlab.bench.decode` at git {report['git']}, {report['date']}. {m['cpus']}-core CPU "
        f"({m['processor']}), torch {m['torch']}, {m['torch_threads']} torch thread(s), load {m['load_avg_1m']:.1f} "
        "(a shared machine: other processes ran beside this one).",
        "Both arms in one process, alternated (the first arm flips every repeat), one prompt token (`\\n`), "
        f"temperature {SAMPLING['temperature']}, top-k {SAMPLING['top_k']}, the same seed: the two texts are "
        "compared every repeat.",
        "",
        "| checkpoint | block | layers x d_model | positions | tokens | refilled steps | cached s (tok/s) "
        "| no cache s (tok/s) | speed-up (pair range) | same text | rolling cache s (tok/s), speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["runs"]:
        cfg, med, tps = row["model"], row["median_s"], row["tokens_per_s"]
        lo, hi = row["speedup_range"]
        rolling = "-" if row["stream"] is None else (
            f"{row['stream']['capacity']}:{row['stream']['sinks']}: {med['stream']:.3f} ({tps['stream']:.0f}), "
            f"{row['stream_speedup']:.2f}x")
        lines.append(
            f"| `{row['checkpoint']}` | {cfg['block_size']} | {cfg['n_layer']} x {cfg['d_model']} | {cfg['pos_encoding']} "
            f"| {row['tokens']} | {row['refilled_steps']} | {med['cached']:.3f} ({tps['cached']:.0f}) | {med['uncached']:.3f} "
            f"({tps['uncached']:.0f}) | {row['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) | {'yes' if row['identical_text'] else 'NO'} "
            f"| {rolling} |")
    lines += [
        "",
        "Medians of the repeats; the range is of the per-repeat ratios (no cache / cached). A refilled step is "
        "one whose window would pass block_size: the caches are then refilled from the whole window, which "
        "costs what the uncached step costs (docs/inference.md), so a checkpoint with a short block gains "
        "little on a long sample. The rolling cache (capacity:sinks, the first sinks tokens and the most recent "
        "ones) never refills; its speed-up is against no cache, and its text is its own once it evicts.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("bench.decode", __doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="run dirs or .ckpt files, each optionally :TOKENS (default: the latest run)")
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--stream", metavar="CAPACITY:SINKS", help="also time rolling caches (rope, alibi, none)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    stream = None
    if args.stream is not None:
        capacity, _, sinks = args.stream.partition(":")
        if not (capacity.isdigit() and sinks.isdigit() and int(sinks) < int(capacity)):
            parser.error(f"--stream={args.stream!r}; expected CAPACITY:SINKS, integers with 0 <= SINKS < CAPACITY")
        stream = (int(capacity), int(sinks))
    if args.tokens < 1 or args.repeats < 1 or args.threads < 1:
        parser.error(f"--tokens, --repeats and --threads must be positive integers, got {args.tokens}, "
                     f"{args.repeats}, {args.threads}")
    torch.set_num_threads(args.threads)
    cases = []
    for spec in args.runs or [None]:
        run, _, tokens = (spec or "").partition(":")
        if tokens and not tokens.isdigit():
            parser.error(f"RUN={spec!r}: the part after ':' is a token count; expected a positive integer")
        cases.append((resolve_checkpoint(run or None), int(tokens) if tokens else args.tokens))
    rows = []
    for ckpt, tokens in cases:
        row = bench_run(ckpt, tokens, args.repeats, stream=stream)
        print(f"{ckpt}: {tokens} tokens, cached {row['median_s']['cached']:.3f} s, no cache "
              f"{row['median_s']['uncached']:.3f} s, speed-up {row['speedup']:.2f}x", file=sys.stderr)
        rows.append(row)
    report = {"git": git_sha(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "runs": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "sample_speed.json", json.dumps(report, indent=1) + "\n")
    atomic_write_text(args.out / "sample_speed.md", markdown(report))
    print(f"wrote {args.out / 'sample_speed.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
