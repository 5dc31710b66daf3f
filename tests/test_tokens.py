"""data=tokens and attnlab prepare: tokenized corpora on disk, read window by window."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cli import assert_one_line_error, run_main

from attnlab.config.compose import compose_config
from attnlab.data.prepare import main as prepare_main
from attnlab.data.prepare import pieces, prepare
from attnlab.data.text import OFFSET_CHUNK, RandomWindows, Shifted, TextDataModule, shakespeare_text
from attnlab.data.tokens import TokenDataModule, TokenFile, load_tokenizer, padded
from attnlab.training.train import train
from attnlab.util.errors import DataError

SMALL = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.block_size=32",
    "data.batch_size=4",
    "data.val_batches=2",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A BPE-tokenized slice of the default corpus (300 ids: trained in well under a second)."""
    out = tmp_path_factory.mktemp("tokens") / "shakespeare_bpe"
    prepare(out, shakespeare_text()[:200_000], "shakespeare[:200000]", vocab_size=300)
    return out


def nanogpt_dir(path: Path, ids: np.ndarray, dtype=np.uint16) -> Path:
    """train.bin / val.bin as nanoGPT writes them, no meta."""
    path.mkdir(parents=True, exist_ok=True)
    ids.astype(dtype).tofile(path / "train.bin")
    ids[: len(ids) // 5].astype(dtype).tofile(path / "val.bin")
    return path


def dm(directory: Path, **kw) -> TokenDataModule:
    module = TokenDataModule(
        dir=str(directory), **{"block_size": 32, "batch_size": 4, "steps": 3, "val_batches": 2, **kw}
    )
    module.setup("fit")
    return module


# ---- prepare ---------------------------------------------------------------------------------------


def test_prepare_writes_ids_that_decode_back_to_the_text(corpus):
    meta = json.loads((corpus / "meta.json").read_text())
    assert meta["vocab_size"] == 300 and meta["dtype"] == "uint16"
    assert sorted(p.name for p in corpus.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    text = shakespeare_text()[:200_000]
    tok = load_tokenizer_from_dir(corpus)
    train = np.fromfile(corpus / "train.bin", dtype=np.uint16)
    val = np.fromfile(corpus / "val.bin", dtype=np.uint16)
    assert len(train) == meta["splits"]["train"]["tokens"] and int(train.max()) == meta["splits"]["train"]["max_id"]
    # byte-level BPE loses nothing: the two splits decode to the text, split at a line end near 90 %
    decoded_train, decoded_val = tok.decode(train), tok.decode(val)
    assert decoded_train + decoded_val == text
    assert decoded_train.endswith("\n") and abs(len(decoded_train) / len(text) - 0.9) < 0.01
    assert len(train) < 0.8 * len(decoded_train)  # 43 merges already: fewer ids than characters


def load_tokenizer_from_dir(directory: Path):
    from attnlab.data.tokens import tokenizer_from

    meta = json.loads((directory / "meta.json").read_text())
    return tokenizer_from(meta["tokenizer"], directory, meta["vocab_size"])


def test_prepare_pieces_cover_the_text_at_line_ends():
    text = "".join(f"line {i}\n" for i in range(1000)) + "tail"
    parts = list(pieces(text, size=100))
    assert "".join(parts) == text and all(p.endswith("\n") for p in parts[:-1]) and len(parts) > 10


def test_prepare_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys, corpus):
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    cases = [
        (["--out", str(corpus)], "--out"),
        (["--encoding", "utf8", "--out", str(tmp_path / "a")], "--encoding"),
        (["--vocab-size", "10", "--out", str(tmp_path / "b")], "--vocab-size"),
        (["--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "c")], "--input"),
        (["--val-fraction", "1.5", "--out", str(tmp_path / "d")], "--val-fraction"),
    ]
    for args, key in cases:
        assert prepare_main(args) == 2
        err = capsys.readouterr().err
        assert_one_line_error(2, err, key)
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no partial directory, no temporary one left


def test_prepare_gpt2_without_tiktoken_files_is_one_line(tmp_path, capsys, monkeypatch):
    from attnlab.data import tokens

    monkeypatch.setattr(tokens, "tiktoken_missing", lambda encoding: "tiktoken is not installed (pip install tiktoken)")
    monkeypatch.setattr("attnlab.data.prepare.tiktoken_missing", tokens.tiktoken_missing)
    assert prepare_main(["--encoding", "gpt2", "--input", __file__, "--out", str(tmp_path / "g")]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "--encoding gpt2")
    assert not (tmp_path / "g").exists()


def test_prepare_force_replaces_a_directory_whole(tmp_path):
    out = tmp_path / "c"
    text = "".join(f"to be or not to be {i}\n" for i in range(3000))
    prepare(out, text, "a", vocab_size=280)
    (out / "stale.txt").write_text("x")
    prepare(out, text, "b", vocab_size=290, force=True)
    assert not (out / "stale.txt").exists() and json.loads((out / "meta.json").read_text())["source"] == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


# ---- the data module -------------------------------------------------------------------------------


def test_windows_are_the_files_ids_shifted_by_one(corpus):
    module = dm(corpus)
    ids = torch.from_numpy(np.fromfile(corpus / "val.bin", dtype=np.uint16).astype(np.int64))
    offsets = module.val_set.offsets
    for i in range(len(module.val_set)):
        x, y = module.val_set[i]
        o = int(offsets[i])
        assert x.dtype == torch.long and torch.equal(x, ids[o : o + 32]) and torch.equal(y, ids[o + 1 : o + 33])
    assert module.vocab_size == 320 and module.vocab() is None  # 300 rounded up to a multiple of 64
    assert dm(corpus, vocab_multiple=1).vocab_size == 300


def test_windows_depend_on_seed_and_index_only(corpus):
    a, b, c = (dm(corpus, seed=s) for s in (1, 1, 2))
    for m in (a, b, c):
        m.trainer = None
        m.train_set = RandomWindows(m.train_ids, 32, 50, m.seed)
    assert all(torch.equal(a.train_set[i][0], b.train_set[i][0]) for i in (0, 17, 49))
    assert not torch.equal(a.train_set[17][0], c.train_set[17][0])
    assert torch.equal(a.val_set.offsets, c.val_set.offsets)  # validation: the same windows for every seed


def test_lazily_drawn_offsets_are_the_one_draw_of_all(corpus):
    """Chunked draws give what one torch.randint of all n gives: the character-level data order is unchanged."""
    ids = torch.arange(10_000)
    n = 2 * OFFSET_CHUNK + 123
    windows = RandomWindows(ids, 16, n, seed=5)
    expected = torch.randint(10_000 - 17, (n,), generator=torch.Generator().manual_seed(5))
    picked = [0, 1, OFFSET_CHUNK - 1, OFFSET_CHUNK, n - 1, 7, OFFSET_CHUNK + 3]  # forwards, then back again
    assert [int(windows[i][0][0]) for i in picked] == expected[picked].tolist()
    assert torch.equal(windows.offsets, expected)
    text = TextDataModule(block_size=16, batch_size=4, steps=2, val_batches=2)
    text.setup()
    assert [int(text.val_set[i][0][0] == text.val_ids[int(text.val_set.offsets[i])]) for i in range(8)] == [1] * 8


def test_a_batch_read_at_once_is_its_windows_read_one_by_one():
    """The DataLoader reads a batch with one call (__getitems__): the same windows as indexing each
    alone, across offset chunks and back, with BOS, through a resume's shift, and in the loader."""
    ids = torch.arange(10_000)
    n = 2 * OFFSET_CHUNK + 123
    picked = [0, 1, OFFSET_CHUNK - 1, OFFSET_CHUNK, n - 1, 7, -1, OFFSET_CHUNK + 3, 2 * OFFSET_CHUNK]
    for bos in (None, 9_999):
        batch = RandomWindows(ids, 16, n, seed=5, bos_id=bos).__getitems__(picked)
        alone = RandomWindows(ids, 16, n, seed=5, bos_id=bos)
        assert all(torch.equal(x, alone[i][0]) and torch.equal(y, alone[i][1]) for (x, y), i in zip(batch, picked))
        shifted = Shifted(RandomWindows(ids, 16, n, seed=5, bos_id=bos), 3).__getitems__([0, n - 3, n - 1])
        assert [int(x[-1]) for x, _ in shifted] == [int(alone[i][0][-1]) for i in (3, 0, 2)]
    with pytest.raises(IndexError, match=f"window {n} of {n}"):
        RandomWindows(ids, 16, n, seed=5).__getitems__([0, n])
    text = TextDataModule(block_size=16, batch_size=4, steps=3, val_batches=2)
    text.setup()
    text.trainer = None
    for k, (x, y) in enumerate(text.train_dataloader()):
        one_by_one = [text.train_set[i] for i in range(4 * k, 4 * k + 4)]
        assert torch.equal(x, torch.stack([a for a, _ in one_by_one]))
        assert torch.equal(y, torch.stack([b for _, b in one_by_one]))


def test_nanogpt_dir_needs_vocab_size_and_reads_meta_pkl(tmp_path):
    ids = np.random.default_rng(0).integers(0, 65, 5000)
    plain = nanogpt_dir(tmp_path / "plain", ids)
    with pytest.raises(DataError, match="data.vocab_size"):
        dm(plain)
    assert dm(plain, vocab_size=65, vocab_multiple=1).vocab_size == 65
    chars = nanogpt_dir(tmp_path / "chars", ids)
    itos = {i: chr(ord("A") + i) for i in range(65)}
    (chars / "meta.pkl").write_bytes(
        pickle.dumps({"vocab_size": 65, "itos": itos, "stoi": {v: k for k, v in itos.items()}})
    )
    module = dm(chars, vocab_multiple=1)
    assert module.vocab_size == 65 and module.tokenizer.decode([0, 1, 64]) == "AB" + chr(ord("A") + 64)
    padded_run = dm(chars)
    assert (
        padded_run.vocab_size == 128 and padded_run.tokenizer.decode([0, 100, 1]) == "AB"
    )  # padding ids decode to nothing
    padded_run.tokenizer.save(tmp_path / "vocab.json")
    assert load_tokenizer(tmp_path).decode([1, 2, 127]) == "BC" and load_tokenizer(tmp_path).encode("CAB") == [2, 0, 1]
    (chars / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65, "f": Path("x")}))  # names a class: refused unread
    with pytest.raises(DataError, match="meta.pkl"):
        dm(chars)


def test_bad_token_files_are_refused_at_setup(tmp_path, corpus):
    ids = np.random.default_rng(0).integers(0, 300, 4000)
    with pytest.raises(DataError, match="train.bin is missing"):
        dm(tmp_path)
    wide = nanogpt_dir(tmp_path / "wide", ids, np.uint32)  # uint32 ids read as uint16
    with pytest.raises(DataError, match="data.dtype=uint32"):
        dm(wide, vocab_size=300)
    beyond = nanogpt_dir(tmp_path / "beyond", np.concatenate([ids, [999]]))
    with pytest.raises(DataError, match="id 999"):
        dm(beyond, vocab_size=300)
    short = nanogpt_dir(tmp_path / "short", ids[:100])
    with pytest.raises(DataError, match="model.block_size=32"):
        dm(short, vocab_size=300)
    odd = nanogpt_dir(tmp_path / "odd", ids)
    with open(odd / "val.bin", "ab") as f:
        f.write(b"\x01")
    with pytest.raises(DataError, match="data.dtype=uint16"):
        dm(odd, vocab_size=300)
    as32 = nanogpt_dir(tmp_path / "as32", ids)  # uint16 ids read as uint32: pairs fuse into ids past 65535
    with pytest.raises(DataError, match="65535"):
        dm(as32, vocab_size=300, dtype="uint32")


def test_an_id_beyond_the_vocabulary_inside_a_window_is_a_data_error(tmp_path):
    f = TokenFile(nanogpt_dir(tmp_path / "d", np.array([1, 2, 3, 700, 5] * 10)) / "train.bin", "uint16", vocab_size=300)
    assert f[0:3].tolist() == [1, 2, 3]
    with pytest.raises(DataError, match="id 700"):
        f[2:5]


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs to reset the peak RSS"
)
def test_memory_stays_flat_in_the_file_size(tmp_path):
    """A 400 MB uint16 file (1.6 GB as int64): setup (the vocabulary scan) and reading windows all
    over it raise the peak RSS by about the scan's 8 MB chunk (16 MiB measured), not by the file."""
    big = tmp_path / "big"
    big.mkdir()
    n = 200_000_000
    with open(big / "train.bin", "wb") as f:
        f.truncate(2 * n)  # sparse: zeros on disk at no cost
        for pos in np.linspace(0, n - 1000, 64).astype(int):  # and some ids all over it
            f.seek(2 * int(pos))
            np.arange(1, 1000, dtype=np.uint16).tofile(f)
    np.arange(50_000, dtype=np.uint16).__mod__(1000).tofile(big / "val.bin")
    (big / "meta.json").write_text(json.dumps({"vocab_size": 1000, "dtype": "uint16"}))
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from here
    base = vm("VmRSS")
    module = TokenDataModule(dir=str(big), block_size=1024, batch_size=8, steps=100, val_batches=2)
    module.setup("fit")
    module.trainer = None
    windows = RandomWindows(module.train_ids, 1024, 800, seed=0)
    seen = max(int(windows[i][0].max()) for i in range(800))
    growth = vm("VmHWM") - base
    assert len(module.train_ids) == n and 0 < seen < 1000
    assert growth < 64 * 2**20, f"peak RSS grew by {growth / 2**20:.0f} MB for a {2 * n / 2**20:.0f} MB file"


# ---- training --------------------------------------------------------------------------------------


def test_trains_and_samples_with_the_bpe_it_was_prepared_with(corpus, make_cfg):
    cfg = make_cfg("data=tokens", f"data.dir={corpus}", *SMALL, "callbacks=default")
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    assert metrics["step"] == 6 and np.isfinite(metrics["val/loss"])
    assert json.loads((run / "results.json").read_text())["status"] == "ok"
    tok = load_tokenizer(run / "checkpoints" / "last.ckpt")
    assert tok.decode(tok.encode("Wherefore art thou, Romeo?")) == "Wherefore art thou, Romeo?"
    from attnlab.training.checkpointing import load_model

    module = load_model(run / "checkpoints" / "last.ckpt")[0]
    assert module.model.cfg.vocab_size == 320


def test_trains_from_a_nanogpt_dir(tmp_path, make_cfg, corpus):
    ids = np.fromfile(corpus / "train.bin", dtype=np.uint16)
    directory = nanogpt_dir(tmp_path / "owt_like", ids)
    cfg = make_cfg("data=tokens", f"data.dir={directory}", "data.vocab_size=300", *SMALL)
    assert train(cfg)["step"] == 6
    assert load_tokenizer(Path(cfg.paths.output_dir)).decode([3, 299]) == "3 299"


def test_resume_with_accumulation_is_bitwise(corpus, make_cfg):
    """6 steps of 2 accumulated micro-batches, checkpointed at step 2; resuming there gives the same
    losses bit for bit (the resumed run skips the 2 x 2 x batch windows already consumed)."""
    run = [
        "data=tokens",
        f"data.dir={corpus}",
        *SMALL,
        "model.dropout=0.1",
        "trainer.accumulate_grad_batches=2",
        "trainer.max_steps=6",
        "checkpoint.every_n_steps=2",
        "checkpoint.keep=-1",
        "callbacks=default",
        "callbacks.attention_stats.every_n_steps=3",
    ]
    whole = make_cfg(*run)
    expected = train(whole)
    resumed = train(make_cfg(*run, f"ckpt_path={Path(whole.paths.output_dir) / 'checkpoints' / 'step2.ckpt'}"))
    assert resumed["step"] == expected["step"] == 6
    assert resumed["val/loss"] == expected["val/loss"] and resumed["train/loss"] == expected["train/loss"]
    once = train(make_cfg(*run, "trainer.accumulate_grad_batches=1"))
    assert once["train/loss"] != expected["train/loss"]  # the accumulation changed the run


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.dir=/nonexistent/dir", "data.dir"),
        ("data.dtype=int8", "data.dtype"),
        ("data.vocab_size=7", "data.vocab_size"),
        ("model.block_size=100000", "model.block_size"),
        ("data.vocab_multiple=0", "data.vocab_multiple"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
    ],
)
def test_bad_tokens_config_is_one_line(override, key, corpus, tmp_path, monkeypatch, capsys):
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "debug=smoke",
        "logger=none",
        "data=tokens",
        f"data.dir={corpus}",
        override,
        f"hydra.run.dir={tmp_path}/run",
    )
    assert code == 2
    assert_one_line_error(code, err, key)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "failed"


# ---- presets ---------------------------------------------------------------------------------------


def test_gpt2_presets_and_optimizer(tmp_path):
    sizes = {}
    for preset in ("gpt2_half", "gpt2", "gpt2_medium"):
        m = compose_config([f"model={preset}"], tmp_path).model
        sizes[preset] = (m.n_layer, m.n_head, m.d_model, m.block_size, m.dropout)
    assert sizes == {
        "gpt2_half": (6, 12, 768, 1024, 0.0),
        "gpt2": (12, 12, 768, 1024, 0.0),
        "gpt2_medium": (24, 16, 1024, 1024, 0.0),
    }
    cfg = compose_config(["model=gpt2", "+optim=gpt2", "trainer.accumulate_grad_batches=40"], tmp_path)
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, list(cfg.optim.betas), cfg.optim.weight_decay) == (
        6e-4,
        6e-5,
        2000,
        [0.9, 0.95],
        0.1,
    )
    assert cfg.trainer.gradient_clip_val == 1.0
    # nanoGPT's batch: 12 sequences x 1024 tokens x 40 micro-batches, about 0.5M tokens per step
    assert cfg.data.batch_size * cfg.model.block_size * cfg.trainer.accumulate_grad_batches == 491_520
    assert padded(50257, 64) == 50304


def test_gpt2_parameter_count(tmp_path):
    from omegaconf import OmegaConf

    from attnlab.model import GPT, GPTConfig

    counts = {}
    for preset in ("gpt2_half", "gpt2", "gpt2_medium"):
        cfg = compose_config([f"model={preset}"], tmp_path)
        with torch.device("meta"):
            model = GPT(GPTConfig(**OmegaConf.to_container(cfg.model, resolve=True), vocab_size=50304))
        counts[preset] = sum(p.numel() for p in model.parameters()) / 1e6
    assert 115 < counts["gpt2"] < 135 and 75 < counts["gpt2_half"] < 90 and 330 < counts["gpt2_medium"] < 370, counts


@pytest.mark.slow
def test_attnlab_prepare_tokenizes_the_default_corpus_offline(tmp_path):
    """The command as a user runs it, on the whole default corpus (about 30 s on 2 cores), with no network."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "shakespeare_bpe"
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab.cli", "prepare", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["vocab_size"] == 4096 and meta["source"] == "shakespeare"
    for split in ("train", "val"):
        ids = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
        assert len(ids) == meta["splits"][split]["tokens"] and int(ids.max()) == meta["splits"][split]["max_id"] < 4096
    # about a third of an id per character: the merges are word pieces
    assert 0.2 < meta["splits"]["train"]["tokens"] / meta["characters"]["train"] < 0.5
    module = dm(out, block_size=1024)
    assert module.vocab_size == 4096 and len(module.train_ids) == meta["splits"]["train"]["tokens"]


def test_ddp_ranks_read_alternate_windows_of_one_list(corpus):
    """Under DDP each process reads every second window of the list one process would read whole (text.py's split)."""
    from types import SimpleNamespace

    def windows(world: int, rank: int) -> list[torch.Tensor]:
        module = dm(corpus, steps=3, batch_size=2)
        module.trainer = SimpleNamespace(world_size=world, global_rank=rank, accumulate_grad_batches=1, global_step=0)
        return [row for x, _ in module.train_dataloader() for row in x]

    whole = windows(1, 0)  # 3 steps x 2 windows: the list of a 1-process run of batch 2
    ranks = [windows(2, r) for r in (0, 1)]  # batch 2 per process: 3 steps x 4 windows in all
    both = [w for pair in zip(*ranks) for w in pair]
    assert len(both) == 12 and all(torch.equal(a, b) for a, b in zip(whole, both[:6]))


@pytest.mark.parametrize("preset", ["gpt2_half", "gpt2", "gpt2_medium"])
def test_gpt2_presets_on_a_small_machine_are_refused_before_training(preset, tmp_path, monkeypatch):
    """At their batch of 12 x 1024 the GPT-2 presets need a GPU node's memory: a 4 GiB machine refuses
    them by the estimate, naming what to lower, while batch 1 of gpt2 (the CPU measurement) passes on 8 GiB."""
    from omegaconf import OmegaConf

    from attnlab.config.schema import Schema
    from attnlab.model import GPT, GPTConfig
    from attnlab.training.resources import check_fits
    from attnlab.util.errors import OutOfMemory

    cfg = compose_config([f"model={preset}", "attention=sdpa"], tmp_path)
    with torch.device("meta"):
        n = sum(
            p.numel()
            for p in GPT(GPTConfig(**OmegaConf.to_container(cfg.model, resolve=True), vocab_size=50304)).parameters()
        )
    monkeypatch.setattr("attnlab.training.resources.available_bytes", lambda device: 4 * 2**30)
    with pytest.raises(OutOfMemory, match="data.batch_size"):
        check_fits(Schema.from_cfg(cfg), n, 50304, torch.device("cpu"))
    if preset == "gpt2":
        monkeypatch.setattr("attnlab.training.resources.available_bytes", lambda device: 8 * 2**30)
        small = compose_config([f"model={preset}", "data.batch_size=1"], tmp_path)
        assert check_fits(Schema.from_cfg(small), n, 50304, torch.device("cpu")).total < 4 * 2**30
