"""Generated attention tasks: multi-query associative recall (MQAR) and induction (copy a repeat).

Both are synthetic probes of what attention can do, generated on the fly from a seed:
batch i of the training stream is a pure function of (seed, i), so a run's data is
reproducible and resuming at step s only has to skip s batches. Validation batches come from
a separate stream, and any training sequence equal to a validation sequence is redrawn, so the
two are disjoint by construction (not just with high probability).

Batches are (x, y) LongTensors of shape (B, T); y is -100 wherever the next token is not
scored, so the loss and ``val/acc`` cover the answer positions only.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.data.text import BOS, VAL_SEED, CharTokenizer, ResumableDataModule, shakespeare_text
from attnlab.util.errors import DataError

IGNORE = -100
QUERY_CLASSES = ("dormant", "active")  # bigram_backcopy's queries that need no attention, and those that do
TRAIN_STREAM, VAL_STREAM, PROBE_STREAM = 0, 1, 2


class TokenTokenizer(CharTokenizer):
    """A CharTokenizer whose tokens are whole words ("k3", "<bos>"), decoded with spaces between."""

    def decode(self, ids) -> str:
        return " ".join(self.chars[int(i)] for i in ids)


def rng_for(seed: int, stream: int, index: int) -> np.random.Generator:
    """An independent generator per (seed, stream, batch index)."""
    return np.random.default_rng(np.random.SeedSequence([seed, stream, index]))


def distinct_draws(rng: np.random.Generator, n: int, k: int, low: int, high: int) -> np.ndarray:
    """(n, k) integers from [low, high), distinct within each row."""
    return np.argsort(rng.random((n, high - low)), axis=1)[:, :k] + low


class GeneratedBatches(Dataset):
    """``n_batches`` batches of a task, batch i drawn from rng_for(seed, stream, i).

    Rows whose full token sequence is in ``exclude`` (a set of row bytes) are redrawn.
    """

    def __init__(self, task: TaskDataModule, n_batches: int, stream: int, exclude: set[bytes] | None = None):
        self.task, self.n_batches, self.stream, self.exclude = task, n_batches, stream, exclude or set()

    def __len__(self) -> int:
        return self.n_batches

    def sequences(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rng = rng_for(
            VAL_SEED if self.stream == VAL_STREAM else self.task.seed, self.stream, i
        )  # val: one set for every seed
        seq, scored = self.task.generate(rng, self.task.batch_size)
        for _ in range(100):
            clash = np.array([row.tobytes() in self.exclude for row in seq])
            if not clash.any():
                return seq, scored
            seq[clash], scored[clash] = self.task.generate(rng, int(clash.sum()))
        raise DataError("could not draw training sequences disjoint from validation; raise data.vocab_size")

    def __getitem__(self, i: int):
        seq, scored = self.sequences(i)
        return to_xy(seq, scored)


def to_xy(seq: np.ndarray, scored: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (B, T+1) and a mask (B, T) of scored next tokens -> inputs x and targets y."""
    seq = torch.from_numpy(seq.astype(np.int64))
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    y[~torch.from_numpy(scored)] = IGNORE
    return x, y


class TaskDataModule(ResumableDataModule):
    """Shared machinery: seeded streams, disjoint train/val, a tokenizer, the block-size check.

    Subclasses define ``tokens()`` (the vocabulary as strings), ``check()`` and
    ``generate(rng, n) -> (seq (n, T+1) int, scored (n, T) bool)``.
    """

    name = "task"

    def __init__(
        self,
        vocab_size: int,
        seq_len: int | None = None,
        block_size: int = 64,
        batch_size: int = 32,
        steps: int = 1000,
        val_batches: int = 8,
        seed: int = 1337,
        num_workers: int = 0,
        bos: bool = False,
    ):
        super().__init__()
        self.n_tokens, self.bos = vocab_size, bos
        self.seq_len = seq_len or block_size
        self.block_size, self.batch_size, self.steps = block_size, batch_size, steps
        self.val_batches, self.seed, self.num_workers = val_batches, seed, num_workers
        self.tokenizer: TokenTokenizer | None = None
        if self.seq_len > block_size:
            raise DataError(
                f"data.seq_len={self.seq_len} does not fit model.block_size={block_size}; "
                f"expected data.seq_len <= {block_size} (or null for the block size)"
            )
        self.check()

    # subclass hooks
    def tokens(self) -> list[str]:
        raise NotImplementedError

    def check(self) -> None:
        """Raise DataError naming the key if the task cannot be built."""

    def generate(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        self.tokenizer = TokenTokenizer(self.tokens())
        self.val_set = GeneratedBatches(self, self.val_batches, VAL_STREAM)
        val_rows = {row.tobytes() for i in range(self.val_batches) for row in self.val_set.sequences(i)[0]}
        self.train_set = GeneratedBatches(self, self.steps, TRAIN_STREAM, exclude=val_rows)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens())

    def vocab(self) -> list[str]:
        return self.tokenizer.chars

    def probe_batch(self, n: int, seed: int = 0) -> torch.Tensor:
        """Inputs (n, T) for head analysis on this task's own distribution (a separate stream)."""
        seq, scored = self.generate(rng_for(self.seed + seed, PROBE_STREAM, 0), n)
        return to_xy(seq, scored)[0]

    def train_dataloader(self):
        # data.batch_size is per process, as for text: under DDP rank r reads batches r, r + W, ...
        # of a stream W times as long, so the global batch holds W different batches
        self.train_set.n_batches = self.steps * (self.global_batch // self.batch_size)
        return self.train_loader(self.train_set, batched=True)

    def val_dataloader(self):
        return self.loader(self.val_set, batched=True)


class MQARDataModule(TaskDataModule):
    """Multi-query associative recall (Zoology, Arora et al. 2023).

    With ``bos``, a ``<bos>`` token (an extra id, V) comes first and the rest is one token shorter.
    A sequence of T+1 tokens: ``num_pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys distinct,
    values drawn with replacement), then ``num_queries`` queries ``k v`` of earlier keys placed in
    random 2-token slots of the rest (distinct pairs up to ``num_pairs`` queries; beyond that pairs are
    drawn with replacement, so answering with a value no earlier query took stops paying), filler token ``_`` (id 0) elsewhere. Ids: 0 filler,
    1..K keys, K+1..V-1 values, K = (V-1)//2. Scored: the value after each query key, so every
    answer is in the context and a lookup solves the task exactly.
    """

    name = "mqar"

    def __init__(self, vocab_size: int = 64, num_pairs: int = 8, num_queries: int | None = None, **kwargs):
        self.num_pairs = num_pairs
        self.num_queries = num_pairs if num_queries is None else num_queries
        super().__init__(vocab_size, **kwargs)

    @property
    def n_keys(self) -> int:
        return (self.n_tokens - 1) // 2

    def check(self) -> None:
        if self.n_tokens < 5:
            raise DataError(f"data.vocab_size={self.n_tokens} is too small for MQAR; expected at least 5")
        if not 1 <= self.num_pairs <= self.n_keys:
            raise DataError(
                f"data.num_pairs={self.num_pairs} is not possible with data.vocab_size={self.n_tokens}; "
                f"expected 1..{self.n_keys} (the number of key tokens)"
            )
        if self.num_queries < 1:
            raise DataError(f"data.num_queries={self.num_queries}; expected a positive number of queries")
        slots = (self.seq_len - self.bos + 1 - 2 * self.num_pairs) // 2
        if self.num_queries > slots:
            raise DataError(
                f"data.seq_len={self.seq_len} is too short for {self.num_pairs} pairs and {self.num_queries} "
                f"queries{' after <bos>' if self.bos else ''}; expected data.seq_len >= "
                f"{2 * (self.num_pairs + self.num_queries) - 1 + self.bos}"
            )

    def floors(self, n: int = 4096, seed: int = 0) -> dict[str, float]:
        """The answer accuracy of models that do not look keys up: guessing among the distinct values in
        the context (``in_context``) and, where queries are distinct, also leaving out the values of the
        pairs asked before (``elimination``); Monte Carlo over ``n`` sequences of this task."""
        seq, scored = self.generate(np.random.default_rng(seed), n)
        seq = seq[:, self.bos :]
        p = self.num_pairs
        values = seq[:, 1 : 2 * p : 2]
        out = {"in_context": float(np.mean([1 / len(set(row)) for row in values]))}
        if self.num_queries <= p:
            keys, hits = seq[:, 0 : 2 * p : 2], []
            for row_keys, row_values, row, mask in zip(keys, values, seq, scored[:, self.bos :]):
                left = dict(zip(row_keys.tolist(), row_values.tolist()))
                for pos in np.flatnonzero(mask):
                    hits.append(1 / len(set(left.values())))
                    left.pop(int(row[pos]))
            out["elimination"] = float(np.mean(hits))
        return out

    def tokens(self) -> list[str]:
        k = self.n_keys
        return ["_"] + [f"k{i}" for i in range(k)] + [f"v{i}" for i in range(self.n_tokens - 1 - k)] + [BOS] * self.bos

    def generate(self, rng, n):
        t, p, q, k = self.seq_len - self.bos, self.num_pairs, self.num_queries, self.n_keys
        rows = np.arange(n)[:, None]
        keys = distinct_draws(rng, n, p, 1, 1 + k)
        values = rng.integers(1 + k, self.n_tokens, size=(n, p))
        seq = np.zeros((n, t + 1), dtype=np.int64)
        seq[:, 0 : 2 * p : 2], seq[:, 1 : 2 * p : 2] = keys, values
        # which pairs are queried, in query order
        asked = distinct_draws(rng, n, q, 0, p) if q <= p else rng.integers(0, p, size=(n, q))
        n_slots = (t + 1 - 2 * p) // 2
        slots = np.sort(distinct_draws(rng, n, q, 0, n_slots), axis=1)
        key_pos = 2 * p + 2 * slots
        seq[rows, key_pos], seq[rows, key_pos + 1] = keys[rows, asked], values[rows, asked]
        scored = np.zeros((n, t), dtype=bool)
        scored[rows, key_pos] = True  # x[key_pos] is the query key; y[key_pos] is its value
        if self.bos:
            seq = np.concatenate([np.full((n, 1), self.n_tokens, dtype=np.int64), seq], axis=1)
            scored = np.concatenate([np.zeros((n, 1), dtype=bool), scored], axis=1)
        return seq, scored


class InductionDataModule(TaskDataModule):
    """A random token sequence followed by its exact repeat; scored on the repeat.

    A sequence of T+1 tokens: ``<bos>`` (id 0), a random prefix of a tokens, L random tokens r,
    r again, and a random suffix filling the rest (a drawn from [0, T - 2L]). L is drawn per
    sequence from [min_half, max_half]. Both vary, so neither the offset to the answer nor where
    the repeat starts or ends is fixed; only matching the previous occurrence of the current
    token (an induction head) solves it. (Measured: with the repeat always at the end, a 2-layer
    model reached 97% by reading positions, with no induction head; see the README.) With
    ``distinct`` (default) prefix, r and suffix hold no token twice, so the answer is unique.
    Scored: every token of the second r after its first (the first cannot be predicted).
    min_half = max_half = seq_len // 2 gives the classic fixed layout with no prefix.
    ``max_gap`` > 0 puts g random tokens between the two copies (g drawn from [0, min(max_gap,
    T - 2L)]), so the distance from a query to its answer, L - 1 + g, spreads over the window and a
    head that reads a band of distances (a RoPE model's shortcut, docs/mechanisms.md) no longer finds it.
    The task always starts with ``<bos>``: its ``data.bos`` is true (conf/data/induction.yaml).
    """

    name = "induction"

    def __init__(
        self,
        vocab_size: int = 64,
        min_half: int | None = None,
        max_half: int | None = None,
        distinct: bool = True,
        bos: bool = True,
        max_gap: int = 0,
        **kwargs,
    ):
        self.min_half_arg, self.max_half_arg, self.distinct, self.max_gap = min_half, max_half, distinct, max_gap
        super().__init__(vocab_size, bos=bos, **kwargs)

    @property
    def max_half(self) -> int:
        return self.max_half_arg or self.seq_len // 2

    @property
    def min_half(self) -> int:
        return self.min_half_arg or max(2, self.seq_len // 4)

    def check(self) -> None:
        if not self.bos:
            raise DataError(
                "data.bos=false is not supported by data=induction (its sequences start with <bos>); expected true"
            )
        if self.n_tokens < 3:
            raise DataError(f"data.vocab_size={self.n_tokens} is too small; expected at least 3")
        if not (isinstance(self.max_gap, int) and self.max_gap >= 0):
            raise DataError(f"data.max_gap={self.max_gap!r}; expected an integer >= 0 (0: the copies are adjacent)")
        if not 2 <= self.min_half <= self.max_half <= self.seq_len // 2:
            raise DataError(
                f"data.min_half={self.min_half}, data.max_half={self.max_half} with data.seq_len={self.seq_len}; "
                f"expected 2 <= min_half <= max_half <= {self.seq_len // 2}"
            )
        unique_needed = self.seq_len - self.min_half  # prefix + one copy, at the shortest half
        if self.distinct and self.n_tokens - 1 < unique_needed:
            raise DataError(
                f"data.vocab_size={self.n_tokens} is too small for distinct tokens in sequences of "
                f"{self.seq_len}; expected data.vocab_size >= {unique_needed + 1} (or data.distinct=false)"
            )

    def tokens(self) -> list[str]:
        return ["<bos>"] + [f"t{i}" for i in range(self.n_tokens - 1)]

    def generate(self, rng, n):
        t = self.seq_len
        halves = rng.integers(self.min_half, self.max_half + 1, size=n)
        width = t - self.min_half  # the most unique tokens any row needs
        if self.distinct:
            fresh = distinct_draws(rng, n, width, 1, self.n_tokens)
        else:
            fresh = rng.integers(1, self.n_tokens, size=(n, width))
        seq = np.zeros((n, t + 1), dtype=np.int64)
        scored = np.zeros((n, t), dtype=bool)
        gaps = rng.integers(0, np.minimum(self.max_gap, t - 2 * halves) + 1) if self.max_gap else np.zeros(n, int)
        prefixes = rng.integers(0, t - 2 * halves - gaps + 1)  # prefix length a, per row
        for row, (half, a, g) in enumerate(zip(halves, prefixes, gaps)):
            unique = fresh[row, : t - half]  # prefix, r, gap, suffix
            second = 1 + a + half + g  # where the second r starts in seq
            seq[row, 1:second] = unique[: a + half + g]
            seq[row, second : second + half] = unique[a : a + half]
            seq[row, second + half :] = unique[a + half + g :]
            # y[j] = seq[j+1]; the second r's first token is unpredictable, the rest are scored
            scored[row, second : second + half - 1] = True
        return seq, scored

    def probe_batch(self, n: int, seed: int = 0) -> torch.Tensor:
        """<bos> then random tokens with no repeat, so no head can score by copying a repeat."""
        rng = rng_for(self.seed + seed, PROBE_STREAM, 0)
        t = self.seq_len
        if self.n_tokens - 1 >= t - 1:
            body = distinct_draws(rng, n, t - 1, 1, self.n_tokens)
        else:
            body = rng.integers(1, self.n_tokens, size=(n, t - 1))
        return torch.from_numpy(np.concatenate([np.zeros((n, 1), dtype=np.int64), body], axis=1))


class BigramBackcopyDataModule(TaskDataModule):
    """Bigram-Backcopy (Guo et al. 2024, "Active-Dormant Attention Heads"): a testbed for sinks.

    A sequence of T+1 tokens: ``<bos>`` (an extra id, V), then a fixed bigram Markov chain over V
    tokens, except that each of the ``n_triggers`` most frequent tokens (under the chain's
    stationary distribution) is followed by a copy of the token before it. A trigger query needs
    the previous token (an *active* head); every other query is served by the bigram path and
    needs no attention at all (the head is *dormant* there), which is where a sink can form.

    The chain is part of the task, not of the run: drawn from ``chain_seed`` (``chain=random``:
    each token moves to ``chain_support`` successors with Dirichlet(1) weights) or estimated from
    the Shakespeare corpus's character bigrams (``chain=shakespeare``, V = its characters), so
    every training seed learns the same task. The first token after ``<bos>`` is never a
    trigger; a copy is never a trigger either, so triggers do not chain.

    Scored for training: every position after ``<bos>``. Named metric masks for evaluation
    (``metric_masks``): ``copy`` (the queries at a trigger) and ``bigram`` (the others).
    """

    name = "bigram_backcopy"

    def __init__(
        self,
        vocab_size: int = 32,
        n_triggers: int = 3,
        chain: str = "random",
        chain_support: int = 4,
        chain_seed: int = 0,
        bos: bool = True,
        **kwargs,
    ):
        self.n_triggers, self.chain, self.chain_support, self.chain_seed = n_triggers, chain, chain_support, chain_seed
        if chain == "shakespeare":
            self.chars, self.transition = corpus_bigrams(shakespeare_text())
            vocab_size = len(self.chars)
        super().__init__(vocab_size, bos=bos, **kwargs)
        if chain != "shakespeare":
            self.chars = [f"t{i}" for i in range(self.n_tokens)]
            self.transition = random_chain(self.n_tokens, chain_support, chain_seed)
        stationary = stationary_distribution(self.transition)
        self.triggers = np.sort(np.argsort(-stationary, kind="stable")[:n_triggers])
        self.is_trigger = np.zeros(self.n_tokens + 1, dtype=bool)  # indexed by id, <bos> included
        self.is_trigger[self.triggers] = True
        # the chain as generation uses it: nothing moves to a trigger from a trigger (never used) and
        # the first token is drawn from the stationary distribution over non-triggers
        start = np.where(self.is_trigger[:-1], 0.0, stationary)
        self.start = start / start.sum()

    def check(self) -> None:
        if self.chain not in ("random", "shakespeare"):
            raise DataError(f"data.chain={self.chain!r} is not accepted; expected random or shakespeare")
        if not self.bos:
            raise DataError(
                "data.bos=false is not supported by data=bigram_backcopy (its sequences start with <bos>); expected true"
            )
        if not 1 <= self.n_triggers < self.n_tokens:
            raise DataError(f"data.n_triggers={self.n_triggers}; expected 1..{self.n_tokens - 1} (data.vocab_size - 1)")
        if self.chain == "random" and not 1 <= self.chain_support <= self.n_tokens:
            raise DataError(f"data.chain_support={self.chain_support}; expected 1..{self.n_tokens} (data.vocab_size)")
        if self.seq_len < 3:
            raise DataError(f"data.seq_len={self.seq_len} is too short; expected at least 3")

    def tokens(self) -> list[str]:
        return [*self.chars, BOS]

    def generate(self, rng, n, length: int | None = None):
        t = length or self.seq_len
        seq = np.full((n, t + 1), self.n_tokens, dtype=np.int64)  # column 0 stays <bos>
        seq[:, 1] = rng.choice(self.n_tokens, size=n, p=self.start)
        cumulative = np.cumsum(self.transition, axis=1)
        for j in range(1, t):
            current = seq[:, j]
            drawn = (rng.random(n)[:, None] < cumulative[current]).argmax(axis=1)
            seq[:, j + 1] = np.where(self.is_trigger[current], seq[:, j - 1], drawn)
        scored = np.ones((n, t), dtype=bool)
        scored[:, 0] = False  # the token after <bos> has no context to predict it from
        return seq, scored

    def stream_ids(self, n: int, index: int = 0) -> np.ndarray:
        """Sequence ``index`` of n tokens, ``<bos>`` first, from the validation stream: a text longer than
        the block, for decoding past it (attnlab stream); the same for every training seed."""
        return self.generate(rng_for(VAL_SEED, VAL_STREAM, index), 1, length=n - 1)[0][0]

    def metric_masks(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Which positions of inputs ``x`` (B, T) are trigger queries (``copy``) and which are not."""
        trigger = torch.from_numpy(self.is_trigger).to(x.device)[x]
        trigger[:, 0] = False
        body = torch.ones_like(trigger)
        body[:, 0] = False
        return {"copy": trigger, "bigram": body & ~trigger}

    def query_classes(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The queries that need the head (``active``: at a trigger) and those that do not (``dormant``)."""
        masks = self.metric_masks(x)
        return dict(zip(QUERY_CLASSES, (masks["bigram"], masks["copy"])))


def random_chain(n: int, support: int, seed: int) -> np.ndarray:
    """(n, n) row-stochastic: each token moves to ``support`` distinct successors, Dirichlet(1) weights."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
    out = np.zeros((n, n))
    successors = distinct_draws(rng, n, support, 0, n)
    out[np.arange(n)[:, None], successors] = rng.dirichlet(np.ones(support), size=n)
    return out


def corpus_bigrams(text: str) -> tuple[list[str], np.ndarray]:
    """The characters of ``text`` and its (add-one smoothed) character bigram chain."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text])
    counts = np.ones((len(chars), len(chars)))
    np.add.at(counts, (ids[:-1], ids[1:]), 1)
    return chars, counts / counts.sum(axis=1, keepdims=True)


def stationary_distribution(transition: np.ndarray) -> np.ndarray:
    """The chain's long-run token frequencies (power iteration from uniform; a reducible chain gives
    the frequencies reached from the uniform start)."""
    p = np.full(len(transition), 1.0 / len(transition))
    for _ in range(500):
        p = p @ transition
    return p / p.sum()
