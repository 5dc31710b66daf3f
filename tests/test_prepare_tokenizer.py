"""``attnlab prepare --tokenizer DIR``: a corpus tokenized with a Hugging Face checkpoint's own
tokenizer (built and saved offline here), so that ``model.init_from=DIR`` trains on ids that index
its embedding; a vocabulary the model does not share is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cli import assert_one_line_error

from attnlab.data.prepare import main as prepare_main
from attnlab.data.prepare import prepare
from attnlab.util.errors import AttnlabError

transformers = pytest.importorskip("transformers")  # the hf extra, which CI installs

TEXT = "".join(f"First Citizen: we are accounted poor citizens, the patricians good {i}.\n" for i in range(400))
TOKENS, MODEL_VOCAB = 290, 300  # the tokenizer's ids, and the model's embedding rows (more, as many models have)


def save_tokenizer(path: Path, vocab_size: int = TOKENS) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few lines, saved as transformers saves a model's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT.splitlines(keepends=True), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.save_pretrained(path)
    return fast


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, torch.nn.Module, transformers.PreTrainedTokenizerFast]:
    """A GPT-2 at the tiny preset's shape (4 layers, 4 heads, d_model 128) and its tokenizer in one dir."""
    path = tmp_path_factory.mktemp("ckpt")
    tok = save_tokenizer(path)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=MODEL_VOCAB, n_positions=128, n_embd=128, n_layer=4, n_head=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.1)
    model.save_pretrained(path)
    return path, model, tok


@pytest.fixture(scope="module")
def corpus(checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "tokens"
    prepare(out, TEXT, "lines", tokenizer=str(checkpoint[0]))
    return out


def test_the_ids_are_the_checkpoints_tokenizers_and_the_vocabulary_its_models(checkpoint, corpus):
    _, _, tok = checkpoint
    meta = json.loads((corpus / "meta.json").read_text())
    assert len(tok) == TOKENS and meta["vocab_size"] == MODEL_VOCAB  # config.json's, not the tokenizer's
    train = np.fromfile(corpus / "train.bin", dtype=meta["dtype"])
    val = np.fromfile(corpus / "val.bin", dtype=meta["dtype"])
    split = meta["characters"]["train"]
    assert train.tolist() == tok(TEXT[:split], add_special_tokens=False)["input_ids"]
    assert val.tolist() == tok(TEXT[split:], add_special_tokens=False)["input_ids"]
    assert tok.decode(np.concatenate([train, val]).tolist()) == TEXT


def test_training_from_the_checkpoint_on_its_tokenized_data(checkpoint, corpus, make_cfg):
    """One step at a learning rate of 1e-12 keeps the checkpoint's function: the run's ids index the
    rows transformers' model reads for them."""
    from attnlab.training.checkpointing import load_model
    from attnlab.training.train import train

    path, theirs, _ = checkpoint
    data = ["data=tokens", f"data.dir={corpus}", f"model.init_from={path}"]  # the padding left to the checkpoint
    cfg = make_cfg(
        *data, "model.bias=true", "model.mlp=gelu_tanh", "trainer.max_steps=1", "optim.lr=1e-12", "optim.min_lr=0"
    )
    train(cfg)
    ours = load_model(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")[0].model.eval()
    assert ours.cfg.vocab_size == MODEL_VOCAB
    x = torch.from_numpy(np.fromfile(corpus / "val.bin", dtype=np.uint16)[:64].astype(np.int64))[None]
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x).logits, atol=1e-4, rtol=1e-4)


def test_a_data_vocabulary_other_than_the_models_is_one_line_naming_both(checkpoint, make_cfg, tmp_path):
    """Data of another tokenizer (280 ids against the model's 300 rows)."""
    from attnlab.training.train import train

    other = tmp_path / "other"
    save_tokenizer(other, vocab_size=280)
    corpus = tmp_path / "other_tokens"
    prepare(corpus, TEXT, "lines", tokenizer=str(other))
    data = ["data=tokens", f"data.dir={corpus}", f"model.init_from={checkpoint[0]}"]
    cfg = make_cfg(*data, "model.bias=true", "model.mlp=gelu_tanh", "callbacks=none")
    with pytest.raises(AttnlabError, match=f"has {MODEL_VOCAB} tokens, the data's 280") as err:
        train(cfg)
    assert "\n" not in str(err.value)
    assert not (Path(cfg.paths.output_dir) / "checkpoints").exists()


SMOKE_RUN = ["debug=smoke", "logger=none", "callbacks=none", "model.bias=true", "model.mlp=gelu_tanh"]


def test_the_vocabulary_follows_the_checkpoint_where_the_run_sets_no_padding(checkpoint, corpus, tmp_path, monkeypatch):
    """`attnlab train model.init_from=DIR data=tokens data.dir=...`: data=tokens pads to a multiple of
    64 by default (300 -> 320), but the run starts from the checkpoint's 300 rows; results.json
    says the padding was taken."""
    from attnlab.training.checkpointing import load_model
    from attnlab.training.train import main

    run = tmp_path / "run"
    given = ["data=tokens", f"data.dir={corpus}", f"model.init_from={checkpoint[0]}", "trainer.max_steps=1"]
    smoke = [arg for arg in SMOKE_RUN if arg != "callbacks=none"]  # the checkpoint callback writes last.ckpt
    monkeypatch.setattr("sys.argv", ["attnlab-train", *smoke, *given, f"hydra.run.dir={run}"])
    main()
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "ok" and results["config"]["data"]["vocab_multiple"] == 1
    assert results["init_from"]["data_taken"] == ["vocab_multiple"]
    assert load_model(run / "checkpoints" / "last.ckpt")[0].model.cfg.vocab_size == MODEL_VOCAB


def test_a_padding_the_run_sets_is_kept_and_refused_in_one_line_naming_both(
    checkpoint, corpus, tmp_path, monkeypatch, capsys
):
    """`data.vocab_multiple=64` given: the data's 300 ids padded to 320, which the checkpoint's 300
    rows do not take."""
    from test_cli import run_main

    run = tmp_path / "run"
    given = ["data=tokens", f"data.dir={corpus}", "data.vocab_multiple=64", f"model.init_from={checkpoint[0]}"]
    code, _, err = run_main(monkeypatch, capsys, *SMOKE_RUN, *given, f"hydra.run.dir={run}")
    assert_one_line_error(code, err, f"has {MODEL_VOCAB} tokens, the data's 320")
    assert not (run / "checkpoints").exists()


def test_a_bad_tokenizer_dir_is_one_line_and_writes_nothing(checkpoint, tmp_path, capsys):
    import logging
    import sys

    # transformers' own handler holds whatever stderr it first saw; route its records to this test's
    # stderr, as a terminal would show them, so a warning it logs while loading breaks the one line
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("transformers").addHandler(handler)
    transformers.utils.logging.warning_once.cache_clear()  # a warning seen earlier in this process is logged again
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    (tmp_path / "empty").mkdir()
    small = tmp_path / "small"  # a model of 200 rows under the tokenizer's 290 ids
    save_tokenizer(small)
    (small / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 200}))
    cases = [
        (tmp_path / "missing", "no such directory"),
        (tmp_path / "empty", "no tokenizer"),
        (small, "vocab_size=200"),
    ]
    try:
        for directory, why in cases:
            out = tmp_path / "out"
            assert prepare_main(["--input", str(text), "--out", str(out), "--tokenizer", str(directory)]) == 2
            err = capsys.readouterr().err
            assert_one_line_error(2, err, f"--tokenizer={directory}")
            assert len(err.splitlines()) == 1, err  # nor a warning transformers logs while loading
            assert why in err and not out.exists()
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    args = [
        "--input",
        str(text),
        "--out",
        str(tmp_path / "out"),
        "--encoding",
        "gpt2",
        "--tokenizer",
        str(checkpoint[0]),
    ]
    assert prepare_main(args) == 2
    assert_one_line_error(2, capsys.readouterr().err, "--tokenizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "small", "text.txt"]
