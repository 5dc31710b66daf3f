"""``attnlab prepare``: tokenize a text corpus into the files ``data=tokens`` reads.

Writes ``train.bin`` and ``val.bin`` (flat uint16 ids, uint32 past 65536 ids: nanoGPT's format),
``meta.json`` (vocabulary size, dtype, tokenizer, each split's length and largest id) and, for the
default BPE or ``--tokenizer``, ``tokenizer.json``. The first (1 - val_fraction) of the text is the
training split and the rest validation, as for character-level text. The BPE (Hugging Face
``tokenizers``, byte-level, GPT-2's pre-tokenizer) is trained on the training split only, so
validation text is unseen by the tokenizer too. Nothing is downloaded: ``--encoding gpt2`` uses
tiktoken's GPT-2 encoding where tiktoken and its files are already on the machine, and
``--tokenizer DIR`` the tokenizer a local Hugging Face model dir ships (transformers' AutoTokenizer,
offline), so the ids index that model's embedding (``model.init_from``). Everything is written into
a temporary directory beside ``--out`` and renamed into place at the end: a failed or interrupted
prepare leaves no partial directory.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnlab.data.text import read_text_file, shakespeare_text
from attnlab.data.tokens import META, TOKENIZER, TiktokenTokenizer, tiktoken_missing
from attnlab.util.cli import ERROR_PREFIX, command_parser
from attnlab.util.errors import DataError

ENCODINGS = ("bpe", "gpt2")
DEFAULT_OUT = "data/shakespeare_bpe"
END_OF_TEXT = "<|endoftext|>"  # GPT-2's document separator, kept as the BPE's one special token
PIECE_CHARS = 1 << 20  # text encoded per call: pieces cut at line ends, so memory stays bounded


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each ending at a line end (the last may not)."""
    start = 0
    while start < len(text):
        end = text.find("\n", min(start + size, len(text)))
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def train_bpe(text: str, vocab_size: int):
    """A byte-level BPE of ``vocab_size`` ids (256 bytes, <|endoftext|>, the merges) trained on ``text``."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise DataError(
            "--encoding bpe needs the 'tokenizers' package (make install, or pip install tokenizers)"
        ) from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(pieces(text), trainer=trainer, length=None)
    return tok


def checkpoint_tokenizer(directory: str):
    """(the ``tokenizers`` tokenizer, the vocabulary size) of a local Hugging Face dir. The size is
    config.json's vocab_size where the dir holds a model (its embedding rows, which may outnumber the
    tokenizer's ids), else the tokenizer's own, so the data's vocabulary is the model's."""
    where = f"--tokenizer={directory}"
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise DataError(f"{where}: no such directory; expected a local Hugging Face dir (save_pretrained)")
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise DataError(f"{where} needs the 'transformers' package (the hf extra: pip install -e '.[hf]')") from None
    # loading validates config.json and logs what it finds odd (a special id past vocab_size, ...); the
    # checks below decide what matters for the corpus, so its warnings would only bury the one-line error
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - transformers raises OSError, ValueError, ... for a dir it cannot read
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise DataError(
            f"{where}: no tokenizer transformers loads ({reason}); expected a dir with tokenizer.json"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if not tok.is_fast:
        raise DataError(f"{where}: {type(tok).__name__} is not a fast tokenizer; expected a dir with tokenizer.json")
    n_vocab = len(tok)  # the ids it can emit, added tokens included
    config = path / "config.json"
    model_vocab = json.loads(config.read_text()).get("vocab_size") if config.is_file() else None
    if model_vocab is not None and n_vocab > model_vocab:
        raise DataError(
            f"{where}: the tokenizer has {n_vocab} ids, the model's config.json vocab_size={model_vocab}; "
            "expected a tokenizer whose ids the model embeds"
        )
    return tok.backend_tokenizer, model_vocab or n_vocab


def write_ids(path: Path, chunks: Iterator[list[int]], dtype: np.dtype) -> dict:
    """Append each chunk of ids to ``path``; return the split's length and largest id."""
    tokens, top = 0, 0
    with open(path, "wb") as f:
        for ids in chunks:
            if ids:
                arr = np.asarray(ids, dtype=np.int64)
                top = max(top, int(arr.max()))
                arr.astype(dtype).tofile(f)
                tokens += len(arr)
    return {"tokens": tokens, "max_id": top}


def prepare(
    out: Path,
    text: str,
    source: str,
    encoding: str = "bpe",
    vocab_size: int = 4096,
    val_fraction: float = 0.1,
    force: bool = False,
    tokenizer: str | None = None,
) -> dict:
    """Tokenize ``text`` into ``out`` (with ``tokenizer``, a Hugging Face dir's, in place of ``encoding``);
    return the meta.json written."""
    out = Path(out)
    if tokenizer is not None and encoding != "bpe":
        raise DataError(f"--encoding={encoding} with --tokenizer={tokenizer}; expected one of the two")
    if encoding not in ENCODINGS:
        raise DataError(f"--encoding={encoding} is not accepted; expected one of {', '.join(ENCODINGS)}")
    if not 0 < val_fraction < 1:
        raise DataError(f"--val-fraction={val_fraction} is not accepted; expected a number in (0, 1)")
    if encoding == "bpe" and tokenizer is None and not 257 <= vocab_size <= 1 << 32:
        raise DataError(
            f"--vocab-size={vocab_size} is not accepted; expected an integer from 257 (the 256 bytes and "
            f"{END_OF_TEXT}) up"
        )
    if out.exists() and not out.is_dir():
        raise DataError(f"--out={out} is a file; expected a directory to create")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DataError(f"--out={out} exists and is not empty; expected a new directory (or --force to replace it)")
    if encoding == "gpt2":
        reason = tiktoken_missing("gpt2")
        if reason:
            raise DataError(f"--encoding gpt2: {reason}; --encoding bpe (the default) trains a tokenizer offline")
    if tokenizer is not None:
        tok, n_vocab = checkpoint_tokenizer(tokenizer)
    split = int(len(text) * (1 - val_fraction))
    split = text.find("\n", split) + 1 or split  # at a line end, where there is one
    train_text, val_text = text[:split], text[split:]
    if not train_text.strip() or not val_text.strip():
        raise DataError(
            f"--val-fraction={val_fraction} leaves an empty split of {len(text)} characters; expected a "
            "longer text or another fraction"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the corpus private to its writer
    try:
        t0 = time.perf_counter()
        if encoding == "bpe":  # a BPE trained here, or a checkpoint's tokenizer: read back by data.tokens.BPETokenizer
            if tokenizer is None:
                tok = train_bpe(train_text, vocab_size)
                n_vocab = tok.get_vocab_size()
            tok.save(str(tmp / TOKENIZER))
            spec = {"kind": "bpe", "file": TOKENIZER} | ({"from": str(tokenizer)} if tokenizer else {})

            def encode(s: str) -> Iterator[list[int]]:
                batch = list(pieces(s))
                for i in range(0, len(batch), 16):
                    for enc in tok.encode_batch(batch[i : i + 16], add_special_tokens=False):
                        yield enc.ids
        else:
            enc = TiktokenTokenizer("gpt2")
            n_vocab = enc.vocab_size
            spec = {"kind": "tiktoken", "encoding": "gpt2"}

            def encode(s: str) -> Iterator[list[int]]:
                for piece in pieces(s):
                    yield enc.encode(piece)

        dtype = np.dtype(np.uint16 if n_vocab <= 1 << 16 else np.uint32)
        splits = {
            name: write_ids(tmp / f"{name}.bin", encode(s), dtype)
            for name, s in (("train", train_text), ("val", val_text))
        }
        meta = {
            "vocab_size": n_vocab,
            "dtype": dtype.name,
            "tokenizer": spec,
            "source": source,
            "val_fraction": val_fraction,
            "characters": {"train": len(train_text), "val": len(val_text)},
            "splits": splits,
            "seconds": round(time.perf_counter() - t0, 2),
        }
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return meta
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("prepare", "tokenize a text corpus into train.bin / val.bin / meta.json for data=tokens")
    parser.add_argument("--input", help="a UTF-8 text file (default: the Shakespeare corpus of data=shakespeare)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the directory to create (default: {DEFAULT_OUT})")
    parser.add_argument(
        "--encoding",
        default="bpe",
        help="bpe: a byte-level BPE trained on the corpus (default); "
        "gpt2: GPT-2's encoding through tiktoken (its files must be in tiktoken's cache)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the tokenizer of a local Hugging Face model dir, in place of --encoding: data for model.init_from=DIR",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="--encoding bpe: ids in all, bytes and merges (default 4096)"
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.1, help="the last part of the text held out (default 0.1)"
    )
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    try:
        text = read_text_file(args.input) if args.input else shakespeare_text()
        meta = prepare(
            Path(args.out),
            text,
            args.input or "shakespeare",
            args.encoding,
            args.vocab_size,
            args.val_fraction,
            args.force,
            args.tokenizer,
        )
    except DataError as err:
        message = (
            str(err).replace("data.path=", "--input=", 1) if args.input else str(err)
        )  # read_text_file names the config key
        print(f"{ERROR_PREFIX}{message}", file=sys.stderr)
        return 2
    s = meta["splits"]
    print(
        f"attnlab: {args.out}: train.bin {s['train']['tokens']} and val.bin {s['val']['tokens']} {meta['dtype']} ids "
        f"(vocabulary {meta['vocab_size']}, {meta['seconds']} s); train with data=tokens data.dir={args.out}"
        + (f" model.init_from={args.tokenizer}" if args.tokenizer else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
