"""TransformerLens as an independent check of attnlab's head scores: the same GPT-2 checkpoint
(a random one, and one attnlab trained on the induction task and exported),
loaded by attnlab (interop) and by TransformerLens's own weight conversion (TransformerBridge,
offline from a local dir), gives the same attention patterns, and TransformerLens's head detector
and attnlab's scores agree head by head once their definitions are put side by side.

Where the definitions differ: TransformerLens's "mul" score is the pattern's weight on the detection
pattern's entries over the pattern's whole weight, every query row counted (each row sums to 1, so
that is over T). attnlab's scores are means over the queries that have a target:
  previous_token: mean over queries i >= 1 of p[i, i-1]           -> TL = attnlab x (T - 1) / T
  induction: on r r (r of L distinct tokens), mean over the second r's queries of p[i, i - L + 1]
             (TL's detection pattern: the key after each earlier occurrence of the query's token,
             which on r r is exactly those entries)             -> TL = attnlab x L / 2L
The shared part, the patterns and the summed weight on the target entries, must agree exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from attnlab.analysis.heads import induction_score, previous_token_score
from attnlab.analysis.probe import probe
from attnlab.inference.export import char_tokenizer_json
from attnlab.interop.hf_load import model_from_hf
from attnlab.model.gpt import GPT, GPTConfig

transformers = pytest.importorskip("transformers")  # the hf extra, which CI installs
transformer_lens = pytest.importorskip("transformer_lens")
from transformer_lens.head_detector import detect_head  # noqa: E402

CHARS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [" ", "\n"]
R = "qwertyuiop"  # L = 10 distinct tokens
REPEATED = R + R
PLAIN = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(attnlab's GPT, TransformerLens's bridge) of one random GPT-2 checkpoint with a character tokenizer."""
    path = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=len(CHARS), n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None
    )
    hf = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # far from init: patterns with structure to score
        for p in hf.parameters():
            nn.init.normal_(p, std=0.4)
    hf.save_pretrained(path)
    (path / "tokenizer.json").write_text(json.dumps(char_tokenizer_json(CHARS)))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    fields, state = model_from_hf(path)
    ours = GPT(GPTConfig(**fields)).eval()
    ours.load_state_dict(state)
    return ours, bridge_of(path)


def bridge_of(path):
    """TransformerLens's own conversion of a local dir, offline, without a BOS (attnlab's probes have none)."""
    bridge = transformer_lens.TransformerBridge.boot_transformers(str(path), device="cpu")
    bridge.cfg.default_prepend_bos = False
    return bridge


def patterns(models, text: str, chars: list[str] = CHARS) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer (1, H, T, T): attnlab's weights (its probe) and TransformerLens's hook_pattern."""
    ours, bridge = models
    ids = torch.tensor([[chars.index(c) for c in text]])
    with torch.no_grad():
        mine = [r.layer.probabilities(r.q, r.k) for r in probe(ours, ids)]
        _, cache = bridge.run_with_cache(bridge.to_tokens(text, prepend_bos=False))
    theirs = [cache[f"blocks.{i}.attn.hook_pattern"].float() for i in range(len(mine))]
    return mine, theirs


@pytest.mark.parametrize("text", [PLAIN, REPEATED])
def test_the_attention_patterns_are_the_same(models, text):
    mine, theirs = patterns(models, text)
    for layer, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0, msg=f"layer {layer}")


def test_previous_token_scores_agree_head_by_head(models):
    mine, _ = patterns(models, PLAIN)
    t = len(PLAIN)
    theirs = detect_head(models[1], PLAIN, "previous_token_head")  # (layers, heads)
    ours = torch.stack([previous_token_score(p) for p in mine])
    torch.testing.assert_close(theirs.float(), ours * (t - 1) / t, atol=1e-5, rtol=0)
    assert ours.max() - ours.min() > 100 * 1e-5  # heads that differ beyond the tolerance: a mix-up would show


def test_induction_scores_agree_head_by_head(models):
    mine, _ = patterns(models, REPEATED)
    theirs = detect_head(models[1], REPEATED, "induction_head")
    ours = torch.stack([induction_score(p, len(R), 0) for p in mine])
    torch.testing.assert_close(theirs.float(), ours * len(R) / len(REPEATED), atol=1e-5, rtol=0)
    assert ours.max() - ours.min() > 100 * 1e-5


# ---------------------------------------------------------------- a model with learned heads

# the induction task's vocabulary as characters, <bos> as "^", so TransformerLens reads the same ids from text
TASK_CHARS = ["^", *CHARS[:26], "0", "1", "2", "3", "4"]
# measured with these seeds: the best head's induction score 0.11 after 50 steps, 0.31 after 250, 0.37
# after 400 (the runner-up 0.20); the previous-token scores stay at or below 0.21
TRAIN_STEPS = 400
TASK_PLAIN = "^thequickbrownfxjmpsvlazydg"  # no token twice: no head scores by copying
TASK_REPEATED = "^" + R + R  # <bos>, then r r at start 1


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(attnlab's GPT, TransformerLens's bridge) of a 2-layer GPT-2-block model trained on the
    induction task (r r at varying lengths and offsets, data=induction), exported with its tokenizer."""
    from attnlab.data.tasks import InductionDataModule, to_xy
    from attnlab.inference.export import write_hf

    torch.manual_seed(0)
    block = 32
    cfg = GPTConfig(vocab_size=len(TASK_CHARS), block_size=block, n_layer=2, n_head=4, d_model=64, init_std="fan_in")
    model = GPT(cfg)
    task = InductionDataModule(vocab_size=len(TASK_CHARS), block_size=block, min_half=4, max_half=12)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    rng = np.random.default_rng(0)
    for _ in range(TRAIN_STEPS):
        _, loss = model(*to_xy(*task.generate(rng, 32)))
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.eval()
    path = tmp_path_factory.mktemp("trained") / "hf"
    write_hf(model, path, char_tokenizer_json(TASK_CHARS))
    return model, bridge_of(path)


@pytest.mark.slow
def test_a_trained_models_head_scores_agree_and_name_the_same_heads(trained):
    """The definitions as above (TL = attnlab x (T - 1) / T; on <bos> r r, TL = attnlab x L / T with
    T = 2L + 1); the head each ranks first is the same, and its induction score is learned: above
    0.25, where the uniform weight over a second-copy query's keys is at most 1 / (L + 2) = 0.083."""
    t = len(TASK_PLAIN)
    mine, _ = patterns(trained, TASK_PLAIN, TASK_CHARS)
    ours_prev = torch.stack([previous_token_score(p) for p in mine])
    theirs_prev = detect_head(trained[1], TASK_PLAIN, "previous_token_head").float()
    torch.testing.assert_close(theirs_prev, ours_prev * (t - 1) / t, atol=1e-5, rtol=0)
    assert theirs_prev.argmax() == ours_prev.argmax()

    mine, _ = patterns(trained, TASK_REPEATED, TASK_CHARS)
    ours_ind = torch.stack([induction_score(p, len(R), 1) for p in mine])
    theirs_ind = detect_head(trained[1], TASK_REPEATED, "induction_head").float()
    torch.testing.assert_close(theirs_ind, ours_ind * len(R) / len(TASK_REPEATED), atol=1e-5, rtol=0)
    assert theirs_ind.argmax() == ours_ind.argmax() and ours_ind.max() > 0.25
