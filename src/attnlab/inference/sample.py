"""Generate text from a trained run: ``python -m attnlab.inference.sample [RUN_DIR] [--tokens N] [--prompt TEXT]``.

Without RUN_DIR it takes the most recent run under logs/ that has ``checkpoints/last.ckpt``.
Decoding uses the model's KV cache (docs/inference.md); ``--no-cache`` reruns the whole window per
token, with the same output. A model that takes no cache (sigmoid attention) is sampled without
one, with a one-line note. ``--stream CAPACITY:SINKS`` decodes with rolling caches instead (the
first SINKS tokens and the most recent ones, CAPACITY in all): past CAPACITY the text differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from attnlab.data.tokens import load_tokenizer
from attnlab.interop.hf_load import is_hf_dir
from attnlab.training.checkpointing import load_model
from attnlab.util.cli import command_parser
from attnlab.util.errors import CheckpointError, DataError


def latest_checkpoint(root: Path = Path("logs")) -> Path | None:
    ckpts = sorted(root.glob("**/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return ckpts[-1] if ckpts else None


def resolve_checkpoint(run: str | None) -> Path:
    if run is None:
        ckpt = latest_checkpoint()
        if ckpt is None:
            raise SystemExit("attnlab: error: no checkpoints/last.ckpt under logs/; run `make train` first")
        return ckpt

    path = Path(run)
    if is_hf_dir(path):  # a Hugging Face model dir, read by load_model
        return path
    ckpt = path if path.suffix == ".ckpt" else path / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise SystemExit(f"attnlab: error: RUN={run!r} has no checkpoint at {ckpt}; expected a run dir or a .ckpt file")
    return ckpt


def sample(
    ckpt: Path,
    prompt: str = "\n",
    tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = 40,
    seed: int = 0,
    cache: bool = True,
    stream: tuple[int, int] | None = None,
) -> str:
    try:
        module = load_model(ckpt)[0].eval()
    except CheckpointError as err:
        raise SystemExit(f"attnlab: error: {err}; expected a checkpoint written by attnlab train") from None
    try:  # the run's own tokenizer: characters, a BPE, a tiktoken encoding or plain ids (data=tokens)
        tokenizer = load_tokenizer(ckpt, module.hparams.get("vocab"))
    except DataError as err:
        raise SystemExit(f"attnlab: error: {err}") from None
    unknown = tokenizer.unknown(prompt)
    if unknown:
        raise SystemExit(f"attnlab: error: --prompt has characters outside the run's vocabulary: {unknown!r}")
    ids = tokenizer.encode(prompt)
    if not ids:
        raise SystemExit(
            f"attnlab: error: --prompt={prompt!r} encodes to no tokens; expected text the run's tokenizer reads"
        )
    idx = torch.tensor([ids], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    try:
        out = module.model.generate(
            idx,
            tokens,
            temperature=temperature,
            top_k=top_k,
            generator=gen,
            cache=cache,
            stream=stream,
        )
    except ValueError as err:  # a rolling cache this model or these sizes cannot take
        raise SystemExit(f"attnlab: error: --stream: {err}") from None
    return tokenizer.decode(out[0].tolist())


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("sample", __doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="run dir or .ckpt file (default: the latest under logs/)")
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--prompt", default="\n")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cache", action="store_true", help="rerun the whole window per token (no KV cache)")
    parser.add_argument(
        "--stream",
        metavar="CAPACITY:SINKS",
        help="rolling KV caches: the first SINKS tokens and the "
        "most recent ones, CAPACITY in all (rope, alibi or none)",
    )
    args = parser.parse_args(argv)
    stream = None
    if args.stream is not None:
        capacity, _, sinks = args.stream.partition(":")
        if not (capacity.isdigit() and sinks.isdigit()):
            parser.error(f"--stream={args.stream!r}; expected CAPACITY:SINKS, two non-negative integers (e.g. 64:4)")
        stream = (int(capacity), int(sinks))
        if args.no_cache:
            parser.error("--stream and --no-cache exclude each other; expected one of them")
    ckpt = resolve_checkpoint(args.run)
    print(f"# sampled from {ckpt}", file=sys.stderr)
    print(
        sample(
            ckpt,
            args.prompt,
            args.tokens,
            args.temperature,
            args.top_k,
            args.seed,
            cache=not args.no_cache,
            stream=stream,
        )
    )


if __name__ == "__main__":
    main()
