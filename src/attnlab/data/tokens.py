"""Language modelling on a tokenized corpus: ``data=tokens data.dir=DIR``.

DIR holds nanoGPT's format: ``train.bin`` and ``val.bin``, flat little-endian uint16 (or uint32) token
ids, and a small file saying what the ids mean: ``meta.json`` as ``attnlab prepare`` writes it, or
nanoGPT's ``meta.pkl`` (read only when it holds plain values: dicts, lists, strings, numbers). A
directory with neither (nanoGPT's OpenWebText) takes ``data.vocab_size`` and ``data.dtype`` from the
config. The files are read window by window, never whole, so memory does not grow with their size;
the windows are text.py's ``RandomWindows``: the same seeding, the same resume and DDP split.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import torch

from attnlab.data.text import VAL_SEED, CharTokenizer, RandomWindows, TextDataModule
from attnlab.util.errors import DataError

DTYPES = ("uint16", "uint32")
META, NANOGPT_META, TOKENIZER = "meta.json", "meta.pkl", "tokenizer.json"
SPLITS = ("train", "val")
SCAN_CHUNK = 1 << 22  # ids read at a time by the vocabulary check: 8 MB of uint16, whatever the file's size


def padded(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple`` (nanoGPT pads GPT-2's 50257 to 50304:
    matmuls of a round size are faster, and the extra logits are never targets)."""
    return -(-vocab_size // multiple) * multiple


class TokenFile:
    """A flat file of token ids of one dtype, sliced like a tensor: ``f[a:b]`` is a LongTensor.

    Each slice maps the file afresh with np.memmap and copies the window out, so no page of the
    file stays mapped (a long-lived map keeps every page a run has read in the process's RSS).
    ``vocab_size``: every slice is checked against it, so an id out of range is a one-line error
    at the window that holds it, not an index error inside the embedding (a device assert on CUDA).
    """

    def __init__(self, path: Path, dtype: str, vocab_size: int | None = None):
        self.path, self.dtype, self.vocab_size = Path(path), np.dtype(dtype), vocab_size
        size = self.path.stat().st_size
        if size % self.dtype.itemsize:
            raise DataError(
                f"data.dtype={dtype}: {self.path} has {size} bytes, not a whole number of {dtype} ids; "
                f"expected one of {', '.join(DTYPES)} (the dtype the file was written with)"
            )
        self.length = size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> torch.Tensor:
        start, stop, step = index.indices(self.length)
        if step != 1:
            raise IndexError("TokenFile takes contiguous slices only")
        if stop <= start:
            return torch.zeros(0, dtype=torch.long)
        window = np.memmap(
            self.path, dtype=self.dtype, mode="r", offset=start * self.dtype.itemsize, shape=(stop - start,)
        )
        ids = torch.from_numpy(window.astype(np.int64))
        del window
        if self.vocab_size is not None and int(ids.max()) >= self.vocab_size:
            raise DataError(out_of_vocabulary(self.path, int(ids.max()), self.vocab_size, self.dtype.name))
        return ids

    def max_id(self) -> int:
        """The largest id in the file, read SCAN_CHUNK ids at a time (plain reads: nothing stays mapped)."""
        top = 0
        with open(self.path, "rb") as f:
            while True:
                chunk = np.fromfile(f, dtype=self.dtype, count=SCAN_CHUNK)
                if not len(chunk):
                    return top
                top = max(top, int(chunk.max()))

    def looks_wider(self) -> bool:
        """uint32 ids read as uint16: every second id (the high halves) is 0 and the others are not."""
        if self.dtype != np.uint16 or self.length < 64 or self.length % 2:
            return False
        head = np.fromfile(self.path, dtype=np.uint16, count=min(self.length, 1 << 20))
        return not head[1::2].any() and bool(head[0::2].any())


def out_of_vocabulary(path: Path, top: int, vocab_size: int, dtype: str) -> str:
    hint = ""
    if dtype == "uint32" and top >= 1 << 16:
        hint = " (ids above 65535: a uint16 file read as data.dtype=uint32?)"
    return (
        f"data.vocab_size={vocab_size}: {path} holds id {top}, beyond the vocabulary{hint}; expected ids below "
        f"data.vocab_size (set data.vocab_size to at least {top + 1}, or the data.dtype the file was written with)"
    )


class PlainUnpickler(pickle.Unpickler):
    """Reads only plain values: a pickle that names any class or function (code it would run) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name}")


def read_meta(directory: Path) -> dict:
    """What the directory says about its ids: meta.json (attnlab prepare), else nanoGPT's meta.pkl
    (vocab_size, and itos for decoding), else nothing."""
    path = directory / META
    if path.is_file():
        try:
            meta = json.loads(path.read_text())
        except ValueError as err:
            raise DataError(
                f"data.dir={str(directory)!r}: {META} is not valid JSON ({err}); expected the file "
                "attnlab prepare writes"
            ) from None
        if not isinstance(meta, dict):
            raise DataError(
                f"data.dir={str(directory)!r}: {META} is not a JSON object; expected the file attnlab prepare writes"
            )
        return meta
    path = directory / NANOGPT_META
    if path.is_file():
        try:
            with open(path, "rb") as f:
                meta = PlainUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as err:
            raise DataError(
                f"data.dir={str(directory)!r}: {NANOGPT_META} is not a pickle of plain values ({err}); "
                "expected nanoGPT's {vocab_size, itos, stoi}, or set data.vocab_size and remove it"
            ) from None
        if not isinstance(meta, dict):
            raise DataError(
                f"data.dir={str(directory)!r}: {NANOGPT_META} holds no dict; expected nanoGPT's {{vocab_size, itos, stoi}}"
            )
        itos = meta.get("itos")
        out = {"vocab_size": meta.get("vocab_size")}
        if isinstance(itos, dict) and all(isinstance(v, str) for v in itos.values()):
            out["tokenizer"] = {"kind": "chars", "chars": [itos.get(i, "") for i in range(max(itos) + 1)]}
        return out
    return {}


# ---- tokenizers: what a run saves as vocab.json, and what sampling decodes with ----------------------


class IdTokenizer:
    """No tokenizer known (a nanoGPT directory without meta): ids are written and read as numbers."""

    kind = "ids"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)

    def unknown(self, text: str) -> list[str]:
        return sorted({t for t in text.split() if not t.isdigit() or int(t) >= self.vocab_size})

    def to_json(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size}

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))


class BPETokenizer(IdTokenizer):
    """A Hugging Face ``tokenizers`` tokenizer (byte-level BPE from attnlab prepare): any text encodes."""

    kind = "bpe"

    def __init__(self, spec: dict):
        self.spec = spec
        self.tok = hf_tokenizer(spec)
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def unknown(self, text: str) -> list[str]:
        return []

    def to_json(self) -> dict:
        return {"kind": self.kind, "tokenizer": self.spec}


class TiktokenTokenizer(IdTokenizer):
    """A tiktoken encoding by name (``gpt2``); its files must be in tiktoken's cache (nothing is downloaded)."""

    kind = "tiktoken"

    def __init__(self, encoding: str):
        self.encoding = encoding
        self.enc = tiktoken_encoding(encoding)
        self.vocab_size = self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids) -> str:
        return self.enc.decode([int(i) for i in ids])

    def unknown(self, text: str) -> list[str]:
        return []

    def to_json(self) -> dict:
        return {"kind": self.kind, "encoding": self.encoding}


class PaddedChars(CharTokenizer):
    """nanoGPT's character vocabulary (meta.pkl's itos) under a padded model vocabulary: the padding
    ids (never targets, but a barely trained model may sample them) decode to nothing, as BPE's do."""

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids if int(i) < len(self.chars))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"kind": "chars", "chars": self.chars}, ensure_ascii=False))


def hf_tokenizer(spec: dict):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError(
            "the run's tokenizer is a BPE tokenizer: it needs the 'tokenizers' package "
            "(pip install tokenizers, or make install)"
        ) from None
    return Tokenizer.from_str(json.dumps(spec))


def tiktoken_missing(encoding: str) -> str | None:
    """Why tiktoken cannot give ``encoding`` here without the network, or None when it can."""
    import importlib.util

    if importlib.util.find_spec("tiktoken") is None:
        return "tiktoken is not installed (pip install tiktoken)"
    if encoding != "gpt2":
        return None  # other encodings: tiktoken's own error says what it lacks
    import hashlib
    import os
    import tempfile

    cache = (
        os.environ.get("TIKTOKEN_CACHE_DIR")
        or os.environ.get("DATA_GYM_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    )
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    missing = [
        name
        for name in ("vocab.bpe", "encoder.json")
        if not os.path.isfile(os.path.join(cache, hashlib.sha1((base + name).encode()).hexdigest()))
    ]
    if missing:
        return (
            f"tiktoken's GPT-2 files ({', '.join(missing)}) are not in its cache {cache}; fetch them once where "
            "there is network (python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\") and copy that "
            "directory here, or set TIKTOKEN_CACHE_DIR to a copy"
        )
    return None


def tiktoken_encoding(encoding: str):
    reason = tiktoken_missing(encoding)
    if reason:
        raise DataError(f"--encoding {encoding}: {reason}")
    import tiktoken

    return tiktoken.get_encoding(encoding)


def tokenizer_from(spec: dict | None, directory: Path | None, vocab_size: int):
    """The tokenizer a meta.json (or vocab.json) ``tokenizer`` entry names."""
    spec = spec or {}
    kind = spec.get("kind")
    if kind == "bpe":
        inline = spec.get("tokenizer")
        if inline is None:
            path = (directory or Path(".")) / spec.get("file", TOKENIZER)
            if not path.is_file():
                raise DataError(
                    f"data.dir={str(directory)!r}: {META} names {path.name}, which is missing; expected the "
                    "tokenizer file attnlab prepare writes beside the .bin files"
                )
            inline = json.loads(path.read_text())
        return BPETokenizer(inline)
    if kind == "tiktoken":
        return TiktokenTokenizer(spec.get("encoding", "gpt2"))
    if kind == "chars":
        return PaddedChars(spec["chars"])
    return IdTokenizer(vocab_size)


def load_tokenizer(run: str | Path, vocab: list[str] | None = None):
    """The tokenizer of a run (its dir or a checkpoint inside it), from the run's vocab.json: a
    character vocabulary, a BPE tokenizer, a tiktoken encoding or plain ids. Without a vocab.json
    (a checkpoint copied out of its run), the checkpoint's own ``vocab`` list. Each has
    ``encode``, ``decode`` and ``unknown(text)`` (what it cannot encode)."""
    path = Path(run)
    run_dir = (
        path.parent.parent
        if path.suffix == ".ckpt" and path.parent.name == "checkpoints"
        else (path.parent if path.suffix == ".ckpt" else path)
    )
    saved = run_dir / "vocab.json"
    if saved.is_file():
        spec = json.loads(saved.read_text())
        if "chars" in spec and "kind" not in spec:
            return CharTokenizer(spec["chars"])
        return tokenizer_from(spec, run_dir, int(spec.get("vocab_size") or 0))
    if (run_dir / "tokenizer.json").is_file():  # a Hugging Face model dir (save_pretrained) ships its tokenizer
        return BPETokenizer(json.loads((run_dir / "tokenizer.json").read_text()))
    if vocab:
        return CharTokenizer(vocab)
    raise DataError(
        f"{run_dir}: no vocab.json and no vocabulary in the checkpoint; expected a run dir written by attnlab train"
    )


# ---- the data module -----------------------------------------------------------------------------


class TokenDataModule(TextDataModule):
    """``steps`` x the global batch of training windows of ``dir``/train.bin drawn from ``seed``, and
    ``val_batches`` fixed batches of val.bin drawn from VAL_SEED whatever the seed, as for text.

    The model's vocabulary: ``vocab_size`` (null: the directory's meta.json or meta.pkl) rounded up
    to a multiple of ``vocab_multiple``. ``dtype`` (null: meta.json's, else uint16 as nanoGPT writes).
    """

    def __init__(
        self,
        dir: str | None = None,
        dtype: str | None = None,
        vocab_size: int | None = None,
        vocab_multiple: int = 64,
        block_size: int = 64,
        batch_size: int = 12,
        steps: int = 2000,
        val_batches: int = 20,
        seed: int = 1337,
        num_workers: int = 0,
    ):
        super().__init__(
            source="tokens",
            path=dir,
            block_size=block_size,
            batch_size=batch_size,
            steps=steps,
            val_batches=val_batches,
            seed=seed,
            num_workers=num_workers,
        )
        self.dir, self.dtype, self.data_vocab, self.vocab_multiple = dir, dtype, vocab_size, vocab_multiple
        self.model_vocab: int | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        if not self.dir:
            raise DataError(
                "data.dir is not set; expected a directory holding train.bin and val.bin "
                "(attnlab prepare --out DIR writes one)"
            )
        directory = Path(self.dir).expanduser()
        if not directory.is_dir():
            raise DataError(
                f"data.dir={self.dir!r}: no such directory; expected a directory holding train.bin and val.bin "
                "(attnlab prepare --out DIR writes one)"
            )
        for split in SPLITS:
            if not (directory / f"{split}.bin").is_file():
                raise DataError(
                    f"data.dir={self.dir!r}: {split}.bin is missing; expected train.bin and val.bin "
                    "(attnlab prepare --out DIR writes them)"
                )
        meta = read_meta(directory)
        dtype = self.resolve_dtype(meta)
        vocab = self.resolve_vocab(meta, directory)
        self.model_vocab = padded(vocab, self.vocab_multiple or 1)
        files = {split: TokenFile(directory / f"{split}.bin", dtype) for split in SPLITS}
        recorded = meta.get("splits") or {}
        for split, f in files.items():
            self.check_file(f, split, vocab, recorded.get(split) or {})
            f.vocab_size = vocab
        self.tokenizer = tokenizer_from(meta.get("tokenizer"), directory, vocab)
        self.train_ids, self.val_ids = files["train"], files["val"]
        self.val_set = RandomWindows(self.val_ids, self.block_size, self.val_batches * self.batch_size, VAL_SEED)

    def resolve_dtype(self, meta: dict) -> str:
        written = meta.get("dtype")
        dtype = self.dtype or written or "uint16"
        if dtype not in DTYPES:
            raise DataError(f"data.dtype={dtype} is not accepted; expected one of {', '.join(DTYPES)}")
        if written and self.dtype and written != self.dtype:
            raise DataError(
                f"data.dtype={self.dtype}: {META} says the ids are {written}; expected data.dtype={written} "
                "or null (the dtype meta.json gives)"
            )
        return dtype

    def resolve_vocab(self, meta: dict, directory: Path) -> int:
        known = meta.get("vocab_size")
        if self.data_vocab is not None and (
            not isinstance(self.data_vocab, int) or isinstance(self.data_vocab, bool) or self.data_vocab < 1
        ):
            raise DataError(f"data.vocab_size={self.data_vocab} is not accepted; expected a positive integer or null")
        if self.data_vocab is None and known is None:
            raise DataError(
                f"data.vocab_size is not set and data.dir={self.dir!r} has no {META} or {NANOGPT_META}; "
                "expected data.vocab_size=N (50304 for nanoGPT's GPT-2 OpenWebText files)"
            )
        if self.data_vocab is not None and known is not None and self.data_vocab < known:
            raise DataError(
                f"data.vocab_size={self.data_vocab} is below the {known} ids the directory's meta gives; "
                f"expected at least {known}, or null"
            )
        return int(self.data_vocab if self.data_vocab is not None else known)

    def check_file(self, f: TokenFile, split: str, vocab: int, recorded: dict) -> None:
        """Too short for one window, the wrong dtype, or ids beyond the vocabulary: one line each, at setup.
        The largest id is read from the file in chunks, unless meta.json recorded it for a file of this length."""
        if len(f) <= self.block_size + 1:
            raise DataError(
                f"model.block_size={self.block_size}: {f.path} holds {len(f)} tokens, fewer than one window "
                f"of {self.block_size + 1}; expected a block size below {max(len(f) - 1, 1)} or a longer file"
            )
        if f.looks_wider():
            raise DataError(
                f"data.dtype=uint16: every second id of {f.path} is 0, as in a uint32 file read as uint16; "
                "expected data.dtype=uint32 for this file"
            )
        top = recorded.get("max_id") if recorded.get("tokens") == len(f) else None
        top = f.max_id() if top is None else int(top)
        if top >= vocab:
            raise DataError(out_of_vocabulary(f.path, top, vocab, f.dtype.name))

    @property
    def bos_id(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int:
        return self.model_vocab

    def vocab(self) -> list[str] | None:
        """No character list in the checkpoint: the run's vocab.json holds the tokenizer (load_tokenizer)."""
        return None
