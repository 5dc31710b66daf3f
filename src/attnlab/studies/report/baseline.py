"""The attention-free level of a corpus: unigram and bigram cross-entropy on the val split.

A model whose attention does nothing sees only the current character, so the best it can do is a
bigram model: p(next | current). Its cross-entropy on the validation split is the level below which a
run must be to show that its attention is used; judging "training fails without scaling" on runs
above it compares two models that both ignore attention. Both levels are fitted on the train split
(add-one smoothing for characters, so an unseen pair costs a finite loss; add-k chosen on held-out train
text for a token corpus) and scored on the val split, whole and on given window sets (those a study's runs
validated on). A generated task's levels are taken over the positions it scores, fitted on its train
stream and scored on the val batches its runs validate on.

A study has one level: its report computes it once (summary.json's ``attention_free_level``) and its plan
reads it from there (``study_level``); a generated task's train stream is drawn with ``LEVEL_SEED``, not the
seed of whichever run the level is computed beside, so two computations of one study's level agree.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from attnlab.config.compose import compose_config
from attnlab.config.study import study_names
from attnlab.data import TextDataModule
from attnlab.data.tasks import IGNORE
from attnlab.data.text import RandomWindows
from attnlab.data.tokens import read_meta

# nats: a run uses its attention when it ends at least this far below the attention-free (bigram) level
CLEARLY_BELOW = 0.1
# the seed of the train stream a generated task's levels are fitted on: the same for every run of a study
LEVEL_SEED = 0


def _counts(ids: torch.Tensor, vocab: int, pairs: bool) -> torch.Tensor:
    if not pairs:
        return torch.bincount(ids, minlength=vocab).double()
    return _pair_counts(ids[:-1], ids[1:], vocab)


def _pair_counts(x: torch.Tensor, y: torch.Tensor, vocab: int) -> torch.Tensor:
    """(vocab, vocab) counts of each (x[i], y[i]) pair."""
    return torch.bincount(x * vocab + y, minlength=vocab * vocab).double().view(vocab, vocab)


def ngram_tables(train_ids: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(c) (vocab,) and log p(next | current) (vocab, vocab) from the train split, add-one smoothed."""
    uni, pairs = _counts(train_ids, vocab, pairs=False) + 1, _counts(train_ids, vocab, pairs=True) + 1
    return (uni / uni.sum()).log(), (pairs / pairs.sum(1, keepdim=True)).log()


def pair_loss(log_bigram: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean -log p(y | x) over every (input, target) position."""
    return float(-log_bigram[x.reshape(-1), y.reshape(-1)].mean())


def attention_free_levels(
    block_size: int = 64, batch_size: int = 12, val_batches: int = 20, window_seeds=(), batches=None
) -> dict:
    """{vocab, chance (ln vocab), unigram, bigram (whole val split), windows: {seed: bigram on those val windows},
    probe: bigram on ``batches`` (x, y), when given}."""
    dm = TextDataModule(block_size=block_size, batch_size=batch_size, steps=1, val_batches=val_batches)
    dm.setup("fit")
    vocab = dm.vocab_size
    log_uni, log_bi = ngram_tables(dm.train_ids, vocab)
    val = dm.val_ids
    out = {
        "vocab": vocab,
        "chance": math.log(vocab),
        "unigram": float(-log_uni[val[1:]].mean()),
        "bigram": pair_loss(log_bi, val[:-1], val[1:]),
        "val_chars": len(val),
        "train_chars": len(dm.train_ids),
        "windows": {},
    }
    for seed in window_seeds:
        windows = RandomWindows(val, block_size, val_batches * batch_size, seed)
        xs, ys = zip(*(windows[i] for i in range(len(windows))))
        out["windows"][int(seed)] = pair_loss(log_bi, torch.stack(xs), torch.stack(ys))
    if batches:
        out["probe"] = sum(pair_loss(log_bi, x, y) for x, y in batches) / len(batches)
    return out


# add-k smoothings tried for a token corpus's bigram; add-one suits 65 characters but flattens 4096
# word pieces' rows, whose pairs are mostly unseen, so k is chosen on a held-out tail of the train split
SMOOTHING = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)
MAX_BIGRAM_VOCAB = 8192  # the pair table is vocab^2 float64: 0.5 GiB at this size; above it, unigram only


def _smoothed_loss(counts: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: float) -> float:
    """Mean -log p(y) under add-k smoothed ``counts``: a unigram (V,) ignores ``x``, a bigram (V, V) reads p(y | x)."""
    if counts.dim() == 1:
        return float(-((counts[y] + k) / (counts.sum() + k * len(counts))).log().mean())
    rows = counts.sum(1) + k * counts.shape[1]
    return float(-((counts[x, y] + k) / rows[x]).log().mean())


def fitted_levels(train: tuple, val: tuple, vocab: int, held_out: float) -> dict:
    """Unigram and bigram cross-entropy of the (current, next) pairs ``val``, fitted on the pairs ``train`` with
    the add-k smoothing that scores best on their last ``held_out`` share (the bigram only up to
    MAX_BIGRAM_VOCAB)."""
    (tx, ty), cut = train, int(len(train[0]) * (1 - held_out))
    out = {}
    for name, pairs in (("unigram", False), ("bigram", True)):
        if pairs and vocab > MAX_BIGRAM_VOCAB:
            continue
        count = (
            (lambda x, y: _pair_counts(x, y, vocab))
            if pairs
            else (lambda x, y: torch.bincount(y, minlength=vocab).double())
        )
        head = count(tx[:cut], ty[:cut])
        k = min(SMOOTHING, key=lambda k: _smoothed_loss(head, tx[cut:], ty[cut:], k))
        out[name] = _smoothed_loss(count(tx, ty), *val, k)
        out[f"{name}_add_k"] = k
    return out


def token_levels(directory, vocab: int, dtype: str = "uint16") -> dict | None:
    """The attention-free levels of a token corpus (``data=tokens``'s train.bin / val.bin): unigram (a prediction
    that ignores the context) and bigram (one that sees the current token only) cross-entropy of the val split,
    fitted on the train split with the add-k smoothing that scores best on its last tenth.
    None when the files are not there."""
    directory = Path(directory)
    files = [directory / "train.bin", directory / "val.bin"]
    if not all(f.is_file() for f in files):
        return None
    train, val = (torch.from_numpy(np.fromfile(f, dtype=dtype).astype(np.int64)) for f in files)
    out = {
        "vocab": vocab,
        "chance": math.log(vocab),
        "split": "val",
        "source": "attnlab.studies.report.baseline.token_levels",
    }
    return out | fitted_levels((train[:-1], train[1:]), (val[:-1], val[1:]), vocab, held_out=0.1)


def _scored_pairs(batches) -> tuple[torch.Tensor, torch.Tensor]:
    """(current token, next token) at every position a task scores (its target is not ignored)."""

    x, y = (torch.cat([b[i].reshape(-1) for b in batches]) for i in (0, 1))
    keep = y != IGNORE
    return x[keep], y[keep]


def task_levels(data_cfg: dict, block_size: int, seed: int = LEVEL_SEED, train_batches: int = 256) -> dict:
    """The attention-free levels of a generated task (data=mqar, induction, bigram_backcopy): unigram and
    bigram cross-entropy over the positions the task scores, fitted on ``train_batches`` of the run's own
    train stream (add-k chosen on a held-out eighth of them) and scored on the val batches its runs
    validate on. A model whose attention does nothing sees the current token, so the bigram is its best."""
    from hydra.utils import instantiate

    dm = instantiate(data_cfg, block_size=block_size, steps=train_batches, seed=seed)
    dm.setup("fit")
    vocab = dm.vocab_size
    (tx, ty), (vx, vy) = (_scored_pairs([d[i] for i in range(len(d))]) for d in (dm.train_set, dm.val_set))
    out = {
        "vocab": vocab,
        "chance": math.log(vocab),
        "split": "val",
        "positions": "scored",
        "source": "attnlab.studies.report.baseline.task_levels",
    }
    return out | fitted_levels((tx, ty), (vx, vy), vocab, held_out=1 / 8)


def task_data(data_cfg: dict | None) -> bool:
    """Whether a run's data is a generated task (``attnlab.data.tasks``), whose levels ``task_levels`` computes."""
    return bool(data_cfg) and str(data_cfg.get("_target_", "")).startswith("attnlab.data.tasks.")


def text_corpus(data_cfg: dict | None) -> bool:
    """Whether a run's data config is the default text corpus, the one ``attention_free_levels`` fits the bigram on."""
    return bool(data_cfg) and (
        str(data_cfg.get("_target_", "")).endswith("TextDataModule")
        and data_cfg.get("source", "shakespeare") == "shakespeare"
        and not data_cfg.get("path")
    )


def token_corpus_level(data_cfg: dict | None) -> dict | None:
    """The attention-free levels of a ``data=tokens`` run's corpus, where its directory is readable from here
    (a relative ``data.dir`` is taken from the current directory, as the run took it)."""
    if not data_cfg or not str(data_cfg.get("_target_", "")).endswith("TokenDataModule"):
        return None

    directory = Path(data_cfg.get("dir") or "")
    try:
        meta = read_meta(directory)
    except Exception:  # noqa: BLE001 - an unreadable corpus: a report without the level, not no report
        return None
    vocab = data_cfg.get("vocab_size") or meta.get("vocab_size")
    dtype = data_cfg.get("dtype") or meta.get("dtype") or "uint16"
    return token_levels(directory, int(vocab), dtype) if vocab else None


def baseline_of(runs) -> dict | None:
    """The attention-free level of the runs' data (character text, a readable token corpus or a generated task)."""
    return baseline_of_config(next((c for r in runs if (c := r.results.get("config", {})).get("data")), {}))


def experiment_baseline(study: str) -> dict | None:
    """The attention-free level of the data ``experiment=<study>`` trains on: for a committed report whose
    runs are no longer on disk."""

    if study not in study_names():
        return None
    cfg = compose_config([f"experiment={study}"])
    parts = {"data": cfg.data, "model": {"block_size": cfg.model.block_size}}
    return baseline_of_config(OmegaConf.to_container(OmegaConf.create(parts), resolve=True))


def study_level(study: str, reports: Path = Path("reports")) -> dict | None:
    """The attention-free level ``reports/<study>/summary.json`` holds (the one its report computed and
    prints), or None when the study has no report yet or its report has no level."""
    summary = Path(reports) / study / "summary.json"
    if not summary.is_file():
        return None
    return json.loads(summary.read_text(encoding="utf-8")).get("attention_free_level") or None


def baseline_of_config(config: dict) -> dict | None:
    """The attention-free level of a run's data; a generated task's is fitted on the ``LEVEL_SEED`` stream,
    whatever seed the run trained with."""
    data = config.get("data")
    if task_data(data):
        return task_levels(data, config["model"]["block_size"])
    if not text_corpus(data):
        return token_corpus_level(data)
    level = attention_free_levels()
    keep = ("bigram", "unigram", "chance", "vocab")
    return {**{k: level[k] for k in keep}, "split": "val", "source": "attnlab.studies.report.baseline"}
