"""Hugging Face checkpoints in and out: attnlab's GPT and transformers' GPT2LMHeadModel /
LlamaForCausalLM / DeepseekV3ForCausalLM compute the same logits on the same weights (float32
rounding), both ways; greedy decoding gives the same tokens; what the target cannot express, and a
bad checkpoint, is one line; ``model.init_from`` takes the checkpoint's architecture."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attnlab.attention.config import AttentionConfig
from attnlab.config.compose import CONF_DIR
from attnlab.inference.export import char_tokenizer_json, write_hf
from attnlab.interop import families
from attnlab.interop.families import MAPPED, attention_defaults, hf_config, refusal
from attnlab.interop.hf_load import HFCheckpoint, architecture_from, model_from_hf
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.util.errors import AttnlabError

transformers = pytest.importorskip("transformers")  # the hf extra, which CI installs

VOCAB, BLOCK = 29, 16
LLAMA = {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "tie_embeddings": False}
MLA = {**LLAMA, "attention": {"latent": {"d_c": 8, "d_rope": 4}}}
EXPORTABLE = {
    "gpt2": {},
    "gpt2_tanh_biases_untied": {"mlp": "gelu_tanh", "bias": True, "tie_embeddings": False},
    "gpt2_wide_mlp": {"mlp_hidden": 40, "norm_eps": 1e-6},
    "llama_gqa": {**LLAMA, "n_kv_head": 2},
    "llama_mqa_tied_biases": {**LLAMA, "n_kv_head": 1, "tie_embeddings": True, "bias": True},
    "llama_head_dim_rope_base": {**LLAMA, "d_k": 6, "rope_base": 500.0, "mlp_hidden": 24},
    "deepseek_mla": MLA,
    "deepseek_query_latent_tied_head_dim": {
        **LLAMA,
        "tie_embeddings": True,
        "d_k": 6,
        "rope_base": 500.0,
        "attention": {"latent": {"d_c": 8, "d_rope": 6, "d_cq": 12}, "backend": "sdpa"},
    },
}


def family_of_case(name: str) -> str:
    return {"gpt2": "gpt2", "llama": "llama", "deepseek": "deepseek_v3"}[name.split("_")[0]]


# every attention variant and block the target architecture lacks, and the field the refusal names
REFUSED = {
    "escape": ({"attention": {"escape": "zero_logit"}}, "model.attention.escape=zero_logit"),
    "learned_escape": ({**LLAMA, "attention": {"escape": "learned"}}, "model.attention.escape=learned"),
    "gate": ({"attention": {"gate": "headwise"}}, "model.attention.gate=headwise"),
    "sigmoid": ({"attention": {"normalize": "sigmoid"}}, "model.attention.normalize=sigmoid"),
    "differential": ({**LLAMA, "attention": {"differential": True}}, "model.attention.differential=True"),
    "window": ({**LLAMA, "attention": {"window": 4}}, "model.attention.window=4"),
    "qk_norm": ({"attention": {"qk_norm": True}}, "model.attention.qk_norm=True"),
    "unscaled": ({"attention": {"scaling": "none"}}, "model.attention.scaling=none"),
    "learned_scale": ({**LLAMA, "attention": {"scaling": "learned"}}, "model.attention.scaling=learned"),
    "alibi": ({"pos_encoding": "alibi"}, "model.pos_encoding=alibi"),
    "nope": ({"pos_encoding": "none"}, "model.pos_encoding=none"),
    "rope_layernorm": ({**LLAMA, "norm": "layernorm"}, "model.norm=layernorm"),
    "learned_swiglu": ({"mlp": "swiglu"}, "model.mlp=swiglu"),
    "gpt2_gqa": ({"n_kv_head": 2}, "model.n_kv_head=2"),
    "gpt2_head_dim": ({"d_k": 8}, "model.d_k=8"),
    "attn_only": ({"attn_only": True}, "model.attn_only=True"),
    "window_sinks": ({**LLAMA, "attention": {"window": 8, "window_sinks": 2}}, "model.attention.window=8"),
    "latent_learned_positions": ({"attention": {"latent": {"d_c": 8}}}, "model.pos_encoding=learned"),
    "latent_biases": ({**MLA, "bias": True}, "model.bias=True"),
    "latent_layernorm": ({**MLA, "norm": "layernorm"}, "model.norm=layernorm"),
    "latent_gate": ({**MLA, "attention": {**MLA["attention"], "gate": "headwise"}}, "model.attention.gate=headwise"),
}


def attnlab_model(spec: dict, seed: int = 0) -> GPT:
    """A 2-layer GPT with every parameter at std 0.3 (biases and norm gains too): far from init."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, d_model=16, **spec)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.3)
    return model


def hf_model(kind: str, seed: int = 0, **overrides):
    """A tiny random transformers model, every parameter at std 0.3 (biases and norm gains too)."""
    torch.manual_seed(seed)
    if kind == "gpt2":
        base = dict(vocab_size=VOCAB, n_positions=BLOCK, n_embd=16, n_layer=2, n_head=4)
        cfg = transformers.GPT2Config(**(base | overrides))
    elif kind == "llama":
        base = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4)
        base |= dict(num_key_value_heads=2, max_position_embeddings=BLOCK, rms_norm_eps=1e-5)
        cfg = transformers.LlamaConfig(**(base | overrides))
    else:  # dense in every layer; rope_interleave is DeepSeek's default (true)
        base = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4)
        base |= dict(num_key_value_heads=4, max_position_embeddings=BLOCK, first_k_dense_replace=2)
        base |= dict(kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=6)
        cfg = transformers.DeepseekV3Config(**(base | overrides))
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.3)
    return model


def ids(t: int = BLOCK, b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def hf_greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)


# ------------------------------------------------------------------------------------ export


@pytest.mark.parametrize("name", EXPORTABLE)
def test_export_loads_in_transformers_with_equal_logits_and_greedy_text(name, tmp_path):
    model = attnlab_model(EXPORTABLE[name])
    family = write_hf(model, tmp_path / "out")
    assert family == family_of_case(name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert loaded.config.model_type == family
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x)[0], atol=2e-5, rtol=1e-5)
    prompt = ids(t=3)
    ours = model.generate(prompt, BLOCK - 3, top_k=1)
    assert torch.equal(hf_greedy(loaded, prompt, BLOCK - 3), ours)


@pytest.mark.parametrize("name", REFUSED)
def test_a_configuration_the_target_lacks_is_refused_naming_the_field(name, tmp_path):
    spec, field = REFUSED[name]
    model = attnlab_model(spec)
    with pytest.raises(AttnlabError) as err:
        write_hf(model, tmp_path / "out")
    assert str(err.value).startswith(field) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    assert refusal(asdict(model.cfg)) == str(err.value)


def test_every_exportable_configuration_has_no_refusal():
    for spec in EXPORTABLE.values():
        cfg = asdict(attnlab_model(spec).cfg)
        assert refusal(cfg) is None and hf_config(cfg)["vocab_size"] == VOCAB


def test_an_attention_field_without_a_mapping_is_refused_naming_it(monkeypatch):
    """What an export accepts is derived from AttentionConfig's fields: a field added there is refused
    at any value but its default until it has a mapping, in every family."""

    @dataclasses.dataclass
    class WithTemperature(AttentionConfig):
        temperature: float = 1.0

    monkeypatch.setattr(families, "AttentionConfig", WithTemperature)
    for name in ("gpt2", "llama_gqa", "deepseek_mla"):
        cfg = asdict(attnlab_model(EXPORTABLE[name]).cfg)
        assert refusal(cfg) is None  # at its default the new field changes nothing
        cfg["attention"]["temperature"] = 2.0
        problem = refusal(cfg)
        assert problem.startswith("model.attention.temperature=2.0:") and "\n" not in problem
        with pytest.raises(AttnlabError):
            hf_config(cfg)


def test_every_mapped_attention_field_is_one_of_attention_configs():
    """A field renamed in AttentionConfig leaves no stale mapping behind (export, neutral start)."""
    from attnlab.interop import neutral

    fields = {key for key, _ in attention_defaults()}
    assert set(MAPPED) <= fields and neutral.NEUTRAL | set(neutral.NOT_NEUTRAL) <= fields


def test_an_attention_field_without_a_neutral_start_is_refused_for_init_from(monkeypatch, tmp_path):
    """model.init_from refuses a new attention field at a non-default value until neutral.py says
    how it starts at the checkpoint's function."""

    @dataclasses.dataclass
    class WithTemperature(AttentionConfig):
        temperature: float = 1.0

    hf_model("llama").save_pretrained(tmp_path / "hf")
    ckpt = HFCheckpoint.open(tmp_path / "hf")
    monkeypatch.setattr(families, "AttentionConfig", WithTemperature)
    ckpt.check(dict(ckpt.fields) | {"attention": ckpt.fields["attention"] | {"temperature": 1.0}})
    with pytest.raises(AttnlabError) as err:
        ckpt.check(dict(ckpt.fields) | {"attention": ckpt.fields["attention"] | {"temperature": 2.0}})
    assert str(err.value).startswith(f"model.init_from={tmp_path / 'hf'}: model.attention.temperature=2.0")
    assert "\n" not in str(err.value)


def test_char_tokenizer_round_trips_through_transformers(tmp_path):
    chars = ["\n", " ", "!", "A", "a", "b", "é"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(char_tokenizer_json(chars)))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Ab a!\né b"
    assert tok(text)["input_ids"] == [chars.index(c) for c in text]
    assert tok.decode(tok(text)["input_ids"]) == text


# ------------------------------------------------------------------------------------ import


IMPORTS = {
    "gpt2_gelu_new": ("gpt2", {}),
    "gpt2_exact_gelu_untied": ("gpt2", {"activation_function": "gelu", "tie_word_embeddings": False}),
    "llama_gqa": ("llama", {}),
    "llama_mqa_tied_biases_theta": (
        "llama",
        {
            "num_key_value_heads": 1,
            "tie_word_embeddings": True,
            "attention_bias": True,
            "mlp_bias": True,
            "rope_theta": 500.0,
        },
    ),
    "llama_head_dim": ("llama", {"head_dim": 8, "rms_norm_eps": 1e-6}),
    "deepseek_interleaved_rope": ("deepseek", {}),
    "deepseek_query_latent_halves_tied": (
        "deepseek",
        {"q_lora_rank": 12, "rope_interleave": False, "tie_word_embeddings": True, "rope_theta": 500.0},
    ),
}


def load_attnlab(path) -> GPT:
    fields, state = model_from_hf(path)
    model = GPT(GPTConfig(**fields)).eval()
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("name", IMPORTS)
def test_a_saved_transformers_model_loads_with_equal_logits_and_greedy_text(name, tmp_path):
    kind, overrides = IMPORTS[name]
    theirs = hf_model(kind, **overrides)
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_attnlab(tmp_path / "hf")
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x).logits, atol=2e-5, rtol=1e-5)
    prompt = ids(t=3)
    assert torch.equal(ours.generate(prompt, BLOCK - 3, top_k=1), hf_greedy(theirs, prompt, BLOCK - 3))


def test_hub_gpt2_names_without_the_transformer_prefix_load(tmp_path):
    """openai's gpt2 on the hub names its tensors h.0.attn.c_attn.weight, wte.weight, ... (and holds
    the causal-mask buffers attn.bias): the same model either way."""
    from safetensors.torch import load_file, save_file

    theirs = hf_model("gpt2")
    theirs.save_pretrained(tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    hub = {k.removeprefix("transformer."): v for k, v in state.items()}
    hub |= {f"h.{i}.attn.bias": torch.ones(1, 1, BLOCK, BLOCK) for i in range(2)}
    save_file(hub, tmp_path / "hf" / "model.safetensors")
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(load_attnlab(tmp_path / "hf")(x)[0], theirs(x).logits, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama_gqa", "deepseek_query_latent_tied_head_dim"])
def test_export_then_import_is_the_same_model(name, tmp_path):
    model = attnlab_model(EXPORTABLE[name])
    write_hf(model, tmp_path / "out")
    again = load_attnlab(tmp_path / "out")
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def write_config(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "case,match",
    [
        ("missing_dir", "directory"),
        ("no_config", "config.json"),
        ("other_family", "model_type='bert'"),
        ("no_weights", "model.safetensors"),
        ("truncated_weights", "model.safetensors"),
        ("missing_tensor", "model.layers.1.mlp.down_proj.weight"),
        ("rope_scaling", "rope_type='llama3'"),
        ("activation", "activation_function='relu'"),
        ("mixture_of_experts", "first_k_dense_replace=1"),
        ("value_head_dim", "v_head_dim=4"),
    ],
)
def test_a_bad_checkpoint_is_one_line(case, match, tmp_path):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "hf"
    if case == "no_config":
        path.mkdir()
    elif case == "other_family":
        write_config(path, {"model_type": "bert", "hidden_size": 16})
    elif case in ("no_weights", "rope_scaling", "activation"):
        kind = "gpt2" if case == "activation" else "llama"
        hf_model(kind).save_pretrained(path)
        config = json.loads((path / "config.json").read_text())
        if case == "rope_scaling":
            config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
        if case == "activation":
            config["activation_function"] = "relu"
        write_config(path, config)
        if case == "no_weights":
            (path / "model.safetensors").unlink()
    elif case in ("mixture_of_experts", "value_head_dim"):
        hf_model("deepseek").save_pretrained(path)
        config = json.loads((path / "config.json").read_text())
        config |= {"first_k_dense_replace": 1} if case == "mixture_of_experts" else {"v_head_dim": 4}
        write_config(path, config)
    elif case in ("truncated_weights", "missing_tensor"):
        hf_model("llama").save_pretrained(path)
        weights = path / "model.safetensors"
        if case == "truncated_weights":
            weights.write_bytes(weights.read_bytes()[:300])
        else:
            state = load_file(weights)
            del state["model.layers.1.mlp.down_proj.weight"]
            save_file(state, weights)
    with pytest.raises(AttnlabError, match=match) as err:
        model_from_hf(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"model.init_from={path}")


def test_a_run_of_another_shape_or_vocabulary_is_refused_naming_the_key(tmp_path):
    hf_model("llama").save_pretrained(tmp_path / "hf")
    ckpt = HFCheckpoint.open(tmp_path / "hf")
    run = asdict(GPTConfig(vocab_size=VOCAB, block_size=8, n_layer=3, n_head=4, d_model=16, n_kv_head=2, **LLAMA))
    run["mlp_hidden"] = 24
    with pytest.raises(AttnlabError, match=r"model.n_layer=3 .*num_hidden_layers=2") as err:
        ckpt.check(run)
    assert "\n" not in str(err.value)
    run["n_layer"] = 2
    ckpt.check(run)  # a shorter context than the checkpoint's is fine with RoPE
    model = GPT(GPTConfig(**(run | {"vocab_size": VOCAB + 1})))
    with pytest.raises(AttnlabError, match=f"{VOCAB}.*{VOCAB + 1}"):
        ckpt.load_into(model)


def tiny_preset() -> dict:
    """The composed tiny preset's model section, as train() hands it to architecture_from."""
    return asdict(GPTConfig()) | {"d_k": None, "n_kv_head": None, "mlp_hidden": None}


@pytest.mark.parametrize("kind", ["gpt2", "llama", "deepseek"])
def test_the_architecture_is_taken_from_config_json_where_the_run_sets_none(kind, tmp_path):
    """Nothing given: every field config.json fixes is taken, the context at its positions, and the
    tiny preset becomes a model that loads the checkpoint and computes its logits."""
    theirs = hf_model(kind)
    theirs.save_pretrained(tmp_path / "hf")
    ckpt = HFCheckpoint.open(tmp_path / "hf")
    model = tiny_preset()
    taken = architecture_from(ckpt, set(), model)
    assert taken["n_layer"] == 2 and taken["d_model"] == 16 and taken["block_size"] == BLOCK
    assert "vocab_size" not in taken  # the data's
    for key, value in taken.items():  # as train() writes them into cfg.model
        *parents, last = key.split(".")
        node = model
        for part in parents:
            node = node[part]
        node[last] = value
    ckpt.check(model)
    ours = GPT(GPTConfig(**(model | {"vocab_size": VOCAB}))).eval()
    ckpt.load_into(ours)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x).logits, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "given,changes,refused",
    [
        ({"n_layer"}, {"n_layer": 2}, None),  # given and equal: kept, not taken
        ({"n_layer"}, {"n_layer": 4}, ("model.n_layer=4", "num_hidden_layers=2")),
        ({"block_size"}, {"block_size": 8}, None),  # a shorter context
        ({"mlp_hidden"}, {"mlp_hidden": None}, None),  # null: the derived width, the checkpoint's
        ({"pos_encoding"}, {"pos_encoding": "learned"}, ("model.pos_encoding=learned", "'llama'")),
        ({"attention.latent"}, {"attention": {"latent": {"d_c": 8, "d_rope": 4}}}, ("latent.d_c=8", "'llama'")),
    ],
)
def test_a_given_field_is_kept_or_refused_in_one_line_naming_both_values(given, changes, refused, tmp_path):
    hf_model("llama").save_pretrained(tmp_path / "hf")
    ckpt = HFCheckpoint.open(tmp_path / "hf")
    model = tiny_preset()
    model |= {k: v if k != "attention" else model["attention"] | v for k, v in changes.items()}
    if refused is None:
        taken = architecture_from(ckpt, given, model)
        assert not given & set(taken) and taken["n_head"] == 4
        return
    with pytest.raises(AttnlabError) as err:
        architecture_from(ckpt, given, model)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"model.{sorted(given)[0]}")
    assert all(part in line for part in refused) and str(tmp_path / "hf") in line


def test_a_learned_position_table_bounds_a_given_context(tmp_path):
    hf_model("gpt2").save_pretrained(tmp_path / "hf")
    ckpt = HFCheckpoint.open(tmp_path / "hf")
    assert "block_size" not in architecture_from(ckpt, {"block_size"}, tiny_preset() | {"block_size": BLOCK})
    with pytest.raises(AttnlabError, match=f"model.block_size={2 * BLOCK} exceeds"):
        architecture_from(ckpt, {"block_size"}, tiny_preset() | {"block_size": 2 * BLOCK})


@contextlib.contextmanager
def hydra_job(*overrides: str):
    """Inside a Hydra job composed from ``overrides``, as ``attnlab train`` runs one: HydraConfig holds its record."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = cfg.hydra.run.dir
        HydraConfig.instance().set_config(cfg)
        job = cfg.copy()
        with open_dict(job):
            del job["hydra"]  # the job's config, as the task function receives it
        try:
            yield job
        finally:
            HydraConfig.instance().cfg = None


def given(section: str, *overrides: str) -> set[str]:
    from attnlab.training.init_from import below, given_keys

    with hydra_job(*overrides):
        return below(given_keys(), section)


def test_the_fields_a_run_sets_are_its_overrides_and_the_experiment_and_variant_files_hydra_composed(tmp_path):
    overrides = ["model=gpt2", "model.n_layer=2", "++model.attention.gate=headwise", "trainer.max_steps=3"]
    assert given("model", *overrides) == {"n_layer", "attention.gate"}
    mla = given("model", "variant=mla_dc32")
    assert mla == {"pos_encoding", "attention.latent.d_c", "attention.latent.d_rope", "attention.latent.d_cq"}
    # kv_frontier's own keys and those of mqar, which its defaults list names
    kv_frontier = given("model", "experiment=kv_frontier")
    assert kv_frontier == {"n_head", "pos_encoding", "n_layer", "d_model", "init_std", "attn_only"}
    # the data keys a run sets, read the same way (model.init_from takes the padding where none is set)
    assert given("data", *overrides, "data=tokens", "data.vocab_multiple=8") == {"vocab_multiple"}
    assert given("data", *overrides, "data=tokens") == set()
    # an experiment file from the run's own search path (a user's --config-dir) counts as well
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "wide_heads.yaml").write_text("# @package _global_\nmodel:\n  d_k: 96\n")
    assert given("model", f"hydra.searchpath=[file://{tmp_path}]", "experiment=wide_heads") == {"d_k"}


def test_init_from_is_one_step_whose_taken_fields_follow_hydras_record(tmp_path):
    """take_architecture: outside a Hydra job every field is the checkpoint's; in one, a field its
    overrides or its variant file set is kept, and one the checkpoint contradicts is refused before
    the gate; without model.init_from the config is left as it is."""
    from types import SimpleNamespace

    from attnlab.config.compose import compose_config
    from attnlab.training.init_from import take_architecture

    small_gpt2(tmp_path / "hf")
    init_from = f"model.init_from={tmp_path / 'hf'}"
    record = SimpleNamespace(data={})
    cfg = compose_config([init_from, "model.block_size=16"], tmp_path / "run")
    ckpt = take_architecture(cfg, record)  # from Python: no Hydra job, nothing given
    assert isinstance(ckpt, HFCheckpoint) and ckpt.family == record.data["init_from"]["model_type"] == "gpt2"
    assert cfg.model.block_size == 32 and "block_size" in record.data["init_from"]["taken"]
    assert record.data["config"]["model"]["n_layer"] == cfg.model.n_layer == 2
    with hydra_job(init_from, "model.block_size=16") as cfg:
        take_architecture(cfg, record)
        assert (cfg.model.block_size, cfg.model.n_layer, cfg.model.d_model) == (16, 2, 32)
        assert "block_size" not in record.data["init_from"]["taken"]
    with hydra_job(init_from, "variant=mla_dc32") as cfg, pytest.raises(AttnlabError, match="model.pos_encoding=rope"):
        take_architecture(cfg, record)
    untouched = compose_config(["model.block_size=16"])
    assert take_architecture(untouched, record) is None and untouched == compose_config(["model.block_size=16"])


# ------------------------------------------------------------------- fine-tuning a variant

# variants a checkpoint lacks, each with a neutral init (interop/neutral.py); the window is wider
# than the test's context, where it has no effect
NEUTRAL = {
    "gate_headwise": {"gate": "headwise"},
    "gate_elementwise": {"gate": "elementwise"},
    "learned_escape": {"escape": "learned"},
    "learned_escape_sdpa": {"escape": "learned", "backend": "sdpa"},
    "unscaled": {"scaling": "none"},
    "inv_d": {"scaling": "inv_d"},
    "learned_scale": {"scaling": "learned"},
    "window_sinks": {"window": BLOCK, "window_sinks": 2},
    "gate_escape_unscaled": {"gate": "headwise", "escape": "learned", "scaling": "none"},
}
NOT_NEUTRAL = {
    "qk_norm": ({"qk_norm": True}, "model.attention.qk_norm=True"),
    "sigmoid": ({"normalize": "sigmoid"}, "model.attention.normalize=sigmoid"),
    "zero_logit": ({"escape": "zero_logit"}, "model.attention.escape=zero_logit"),
    "differential": ({"differential": True}, "model.attention.differential=True"),
}


def init_from_with(path, attention: dict) -> GPT:
    """A GPT of the checkpoint's shape with ``attention`` switched on, loaded as model.init_from loads it."""
    ckpt = HFCheckpoint.open(path)
    run = dict(ckpt.fields) | {"attention": ckpt.fields["attention"] | attention}
    ckpt.check(run)
    model = GPT(GPTConfig(**run)).eval()
    ckpt.load_into(model)
    return model


BIASED = {"gpt2": {"bias": True}, "llama": {"attention_bias": True, "mlp_bias": True}, "deepseek": {"q_lora_rank": 12}}


@pytest.mark.parametrize("kind", ["gpt2", "llama", "deepseek"])
@pytest.mark.parametrize("name", NEUTRAL)
def test_a_variant_switched_on_starts_at_the_checkpoints_logits(name, kind, tmp_path):
    """float32, the tolerance of the plain import: the gate is exact up to the kernels' rounding, the
    escape's mass sigmoid(-20 - lse) is far below it, the folded scale moves q by one rounding (with
    DeepSeek's query latent, after its RMSNorm)."""
    theirs = hf_model(kind, **BIASED[kind])
    theirs.save_pretrained(tmp_path / "hf")
    ours = init_from_with(tmp_path / "hf", NEUTRAL[name])
    plain = GPT(GPTConfig(**HFCheckpoint.open(tmp_path / "hf").fields))
    assert sum(p.numel() for p in ours.parameters()) >= sum(p.numel() for p in plain.parameters())
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x).logits, atol=2e-5, rtol=1e-5)


def test_the_neutral_parameters_still_train(tmp_path):
    """A zero gate and an escape logit at -20 have non-zero gradients: fine-tuning can move them."""
    hf_model("llama").save_pretrained(tmp_path / "hf")
    model = init_from_with(tmp_path / "hf", {"gate": "elementwise", "escape": "learned"})
    x = ids()
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    for block in model.blocks:
        assert block.attn.gate_proj.weight.grad.abs().max() > 1e-6
        assert block.attn.attention.escape.logit.grad.abs().min() > 0


@pytest.mark.parametrize("name", NOT_NEUTRAL)
def test_a_variant_with_no_neutral_init_is_refused_naming_the_field(name, tmp_path):
    hf_model("llama").save_pretrained(tmp_path / "hf")
    attention, field = NOT_NEUTRAL[name]
    ckpt = HFCheckpoint.open(tmp_path / "hf")
    with pytest.raises(AttnlabError) as err:
        ckpt.check(dict(ckpt.fields) | {"attention": ckpt.fields["attention"] | attention})
    assert str(err.value).startswith(f"model.init_from={tmp_path / 'hf'}: {field}") and "\n" not in str(err.value)


# ------------------------------------------------------------------------- runs, end to end


RUN_FAMILIES = {
    "gpt2": ["model=tiny"],
    "llama": ["model=llama_tiny"],
    "deepseek_v3": ["model=llama_tiny", "model.n_kv_head=null", "variant=mla_dc32"],
}


@pytest.mark.parametrize("family", RUN_FAMILIES)
def test_attnlab_export_of_a_run_matches_its_checkpoint_and_its_sample(family, make_cfg, tmp_path, capsys):
    """`attnlab export RUN --format hf OUT`: the logits of the run's last.ckpt, and `attnlab sample
    --top-k 1`'s text from transformers' greedy generate() through the exported tokenizer."""
    from attnlab.cli import main
    from attnlab.inference.sample import sample
    from attnlab.training.checkpointing import load_model
    from attnlab.training.train import train

    cfg = make_cfg(*RUN_FAMILIES[family], "trainer.max_steps=3")
    train(cfg)
    run = Path(cfg.paths.output_dir)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", str(out)]) == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert loaded.config.model_type == family
    model = load_model(run / "checkpoints" / "last.ckpt")[0].model.eval()
    x = torch.randint(0, model.cfg.vocab_size, (2, model.cfg.block_size), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x)[0], atol=2e-5, rtol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ours = sample(run / "checkpoints" / "last.ckpt", "ROMEO:", tokens=40, top_k=1)
    prompt = torch.tensor([tok("ROMEO:")["input_ids"]])
    assert tok.decode(hf_greedy(loaded, prompt, 40)[0]) == ours


def test_export_of_a_gated_run_is_refused_and_writes_nothing(make_cfg, tmp_path, capsys):
    from attnlab.cli import main
    from attnlab.training.train import train

    cfg = make_cfg("trainer.max_steps=2", "model.attention.gate=headwise")
    train(cfg)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["export", cfg.paths.output_dir, "--format", "hf", str(tmp_path / "hf")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.attention.gate=headwise" in err[0]
    assert not (tmp_path / "hf").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def small_gpt2(path: Path) -> torch.nn.Module:
    """A 2-layer GPT-2 over Shakespeare's 84 characters, of other sizes than the tiny preset's in every
    field (2 heads of 16, d_model 32, 32 positions, GELU-tanh, biases)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=84, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.1)
    model.save_pretrained(path)
    return model


SMOKE_RUN = ["debug=smoke", "logger=none", "callbacks=none"]


@pytest.mark.parametrize("kind, model_type", [("llama", "llama"), ("deepseek", "deepseek_v3")])
def test_a_llama_or_deepseek_checkpoint_trains_from_init_from_alone(kind, model_type, tmp_path, monkeypatch):
    """A transformers-saved Llama (grouped key/value heads, RMSNorm, SwiGLU, RoPE) or DeepSeek-V3 (latent
    attention, dense MLPs) trains with `model.init_from=DIR` and nothing else about its shape; one step at a
    rate of 1e-12 leaves transformers' logits."""
    from attnlab.training.checkpointing import load_model
    from attnlab.training.train import main

    theirs = hf_model(kind, vocab_size=84)
    theirs.save_pretrained(tmp_path / "hf")
    run = tmp_path / "run"
    given = [f"model.init_from={tmp_path / 'hf'}", "optim.lr=1e-12", "optim.min_lr=0"]
    smoke = ["debug=smoke", "logger=none", "trainer.max_steps=1", f"hydra.run.dir={run}"]
    monkeypatch.setattr("sys.argv", ["attnlab-train", *smoke, *given])
    main()
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "ok" and results["init_from"]["model_type"] == model_type
    assert results["config"]["model"]["n_layer"] == 2 and results["config"]["model"]["d_model"] == 16
    ours = load_model(run / "checkpoints" / "last.ckpt")[0].model.eval()
    x = torch.randint(0, 84, (2, BLOCK), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x).logits, atol=1e-4, rtol=1e-4)


def test_a_run_from_init_from_alone_takes_the_checkpoints_architecture(tmp_path, monkeypatch, capsys):
    """`attnlab train model.init_from=DIR model.block_size=16`: the composed tiny preset becomes the
    checkpoint's GPT-2, the shorter context kept; one step at a learning rate of 1e-12 leaves
    transformers' logits; results.json says where the weights came from."""
    from attnlab.training.checkpointing import load_model
    from attnlab.training.train import main

    theirs = small_gpt2(tmp_path / "hf")
    run = tmp_path / "run"
    given = [f"model.init_from={tmp_path / 'hf'}", "model.block_size=16", "optim.lr=1e-12", "optim.min_lr=0"]
    smoke = ["debug=smoke", "logger=none", "trainer.max_steps=1", f"hydra.run.dir={run}"]  # last.ckpt written
    monkeypatch.setattr("sys.argv", ["attnlab-train", *smoke, *given])
    main()  # the console entry point in-process: Hydra's overrides are what the run was given
    results = json.loads((run / "results.json").read_text())
    model = results["config"]["model"]
    assert (model["n_layer"], model["n_head"], model["d_model"], model["block_size"]) == (2, 2, 32, 16)
    assert (model["mlp"], model["bias"], model["tie_embeddings"]) == ("gelu_tanh", True, True)
    assert results["init_from"]["path"] == str((tmp_path / "hf").resolve())
    assert results["init_from"]["model_type"] == "gpt2"
    assert "n_layer" in results["init_from"]["taken"] and "block_size" not in results["init_from"]["taken"]
    ours = load_model(run / "checkpoints" / "last.ckpt")[0].model.eval()
    x = torch.randint(0, 84, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "overrides,key,theirs",
    [
        (["model.n_layer=4"], "model.n_layer=4", "n_layer=2"),
        (["model.pos_encoding=rope"], "model.pos_encoding=rope", "model_type='gpt2'"),
        (["model.block_size=64"], "model.block_size=64", "32"),
        (["variant=mla_dc32"], "model.pos_encoding=rope", "model_type='gpt2'"),  # the variant file's key
    ],
)
def test_a_given_field_the_checkpoint_contradicts_is_one_line_and_trains_nothing(
    overrides, key, theirs, tmp_path, monkeypatch, capsys
):
    from test_cli import run_main

    small_gpt2(tmp_path / "hf")
    run = tmp_path / "run"
    code, _, err = run_main(
        monkeypatch, capsys, *SMOKE_RUN, *overrides, f"model.init_from={tmp_path / 'hf'}", f"hydra.run.dir={run}"
    )
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert code != 0 and "Traceback" not in err and len(errors) == 1, err
    assert key in errors[0] and theirs in errors[0]
    assert not (run / "checkpoints").exists()
    assert json.loads((run / "results.json").read_text())["status"] == "failed"


def test_analyze_stream_and_sample_read_a_hugging_face_dir(tmp_path, capsys):
    from attnlab.inference.analyze import analyze
    from attnlab.inference.sample import sample
    from attnlab.inference.stream import main as stream

    chars = sorted(set("the quick brown fox jumps over the lazy dog\n"))
    model = hf_model("llama", vocab_size=len(chars))
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(char_tokenizer_json(chars)))
    heads, _, out = analyze(str(tmp_path / "hf"), out=str(tmp_path / "heads"), n_probe=4, plot=False)
    assert len(heads) == 2 * 4 and (out / "heads.json").is_file()
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 3)
    stream([str(tmp_path / "hf"), "--cache", "8", "--sinks", "0,2", "--text", str(text), "--tokens", "60", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["n_kv_head"] == 2 and report["source"] == str(text)
    greedy = sample(tmp_path / "hf", "the ", tokens=8, top_k=1)
    prompt = torch.tensor([[chars.index(c) for c in "the "]])
    assert greedy == "".join(chars[i] for i in hf_greedy(model, prompt, 8)[0])


# ------------------------------------------------------------------- the fine-tuning example


def test_fine_tuning_a_llama_checkpoint_with_a_gate_on_its_own_tokenizer(tmp_path, monkeypatch, capsys):
    """docs/interop.md's example end to end, offline: a Llama checkpoint and its BPE tokenizer in one
    dir, the corpus tokenized with it (attnlab prepare --tokenizer), a headwise gate switched on, a
    short fine-tune, the head scores (sink included) at its start and its end in heads.json. The
    checkpoint's architecture is taken: the command names only the context and the variant."""
    from test_prepare_tokenizer import TEXT, save_tokenizer

    from attnlab.cli import main as cli
    from attnlab.training.checkpointing import load_model
    from attnlab.training.train import main as train_main

    ckpt, data, run = tmp_path / "llama", tmp_path / "tokens", tmp_path / "run"
    tok = save_tokenizer(ckpt)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    theirs = transformers.AutoModelForCausalLM.from_config(config).eval()
    theirs.save_pretrained(ckpt)
    (tmp_path / "corpus.txt").write_text(TEXT)
    assert cli(["prepare", "--input", str(tmp_path / "corpus.txt"), "--out", str(data), "--tokenizer", str(ckpt)]) == 0
    command = [
        f"model.init_from={ckpt}",
        "model.block_size=32",
        "model.attention.gate=headwise",
        "data=tokens",
        f"data.dir={data}",
        "data.vocab_multiple=1",
        "trainer.max_steps=30",
        "optim.lr=3e-3",
        "callbacks.heads.every_n_steps=30",
    ]
    smoke = ["debug=smoke", "logger=none", "data.batch_size=8", f"hydra.run.dir={run}"]
    monkeypatch.setattr("sys.argv", ["attnlab-train", *smoke, *command])
    train_main()
    results = json.loads((run / "results.json").read_text())
    model = results["config"]["model"]
    assert results["status"] == "ok" and results["init_from"]["model_type"] == "llama"
    assert (model["n_layer"], model["d_model"], model["n_kv_head"], model["mlp"]) == (2, 32, 2, "swiglu")
    history = json.loads((run / "heads.json").read_text())["history"]
    assert [entry["step"] for entry in history] == [0, 30]
    before, after = history
    assert 0 <= before["sink_max"] <= 1 and 0 <= after["sink_max"] <= 1
    scores = [key for key in before if key.endswith("_max")]  # sink_max, previous_token_max, ...
    assert "sink_max" in scores and [before[k] for k in scores] != [after[k] for k in scores]  # the attention moved
    # the fine-tuned model predicts the held-out text better than the checkpoint it started from
    ours = load_model(run / "checkpoints" / "last.ckpt")[0].model.eval()
    val = np.fromfile(data / "val.bin", dtype=json.loads((data / "meta.json").read_text())["dtype"])
    x = torch.from_numpy(val[: 4 * 33].astype(np.int64)).view(4, 33)
    with torch.no_grad():
        start = nn.functional.cross_entropy(theirs(x[:, :-1]).logits.flatten(0, 1), x[:, 1:].flatten())
        _, end = ours(x[:, :-1], x[:, 1:])
    assert end < 0.8 * start
    assert all(block.attn.gate_proj.weight.abs().max() > 0 for block in ours.blocks)  # the gate left its zero start
