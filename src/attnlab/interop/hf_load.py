"""A local Hugging Face model dir (GPT-2, Llama or dense DeepSeek-V3) read into attnlab's GPT:
``model.init_from`` for training, and the dir itself as a model for analyze, stream and sample.

With ``model.init_from`` the run's architecture is the checkpoint's: every field config.json fixes
that the run did not set itself is taken from it (``architecture_from``), and a field the run set
otherwise is refused in one line naming both values.

Nothing is downloaded: the dir is what ``save_pretrained`` writes (config.json and model.safetensors,
sharded or not, or pytorch_model.bin). Every problem is one line naming the dir and what is wrong;
it is found before anything of the run is built on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.interop.families import InteropError, attention_defaults, flat, lookup, model_fields, source
from attnlab.interop.neutral import neutral_init, refusal
from attnlab.interop.state_dicts import from_hf

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# fields whose null means the derived value (GPTConfig.__post_init__): null agrees with any checkpoint
DERIVED = ("d_k", "n_kv_head", "mlp_hidden")
# a model dict without a key holds its default: the attention's nested ones (latent) are compared too
DEFAULTS = {f"attention.{key}": default for key, default in attention_defaults()}
# the block's kind before its sizes: the more telling refusal when several fields disagree
FIRST = ("pos_encoding", "norm", "mlp")


@dataclass
class HFCheckpoint:
    path: Path
    family: str
    fields: dict  # GPTConfig's fields the checkpoint fixes (families.model_fields)
    weights: Path
    config: dict  # config.json

    @property
    def where(self) -> str:
        return f"model.init_from={self.path}"

    @classmethod
    def open(cls, path) -> HFCheckpoint:
        """The dir's config and weight file, checked; the tensors are read by ``state_dict``."""
        p = Path(path).expanduser()
        where = f"model.init_from={path}"
        if not p.is_dir():
            raise InteropError(f"{where}: no such directory; expected a local Hugging Face model dir (save_pretrained)")
        config = p / "config.json"
        if not config.is_file():
            raise InteropError(f"{where}: no config.json; expected a dir written by save_pretrained")
        try:
            hf = json.loads(config.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InteropError(f"{where}: config.json is not JSON ({err})") from None
        fields = model_fields(hf, where)
        weights = next((p / name for name in WEIGHT_FILES if (p / name).is_file()), None)
        if weights is None:
            raise InteropError(f"{where}: no weights; expected one of {', '.join(WEIGHT_FILES)}")
        return cls(p, hf["model_type"], fields, weights, hf)

    def contradiction(self, key: str, value) -> str | None:
        """One line if the run's ``value`` of model field ``key`` (dotted) is not the checkpoint's, else None.
        The vocabulary is the data's (compared in ``load_into``); the context may be shorter (RoPE: any
        length; learned positions: the first rows of wpe are kept)."""
        theirs = flat(self.fields)[key]
        if key == "vocab_size" or (value is None and key in DERIVED):
            return None
        if key == "block_size":
            if self.family == "gpt2" and value > theirs:
                return (
                    f"model.block_size={value} exceeds {self.path}'s config.json ({source(self.config, key, theirs)} "
                    f"learned positions); expected at most {theirs}"
                )
            return None
        if value != theirs:
            return (
                f"model.{key}={value} contradicts {self.path}'s config.json ({source(self.config, key, theirs)}); "
                f"expected {theirs}, or model.{key} left unset to take it"
            )
        return None

    def check(self, model: dict) -> None:
        """A one-line error at the first field of ``model`` (GPTConfig's dict) the checkpoint fixes otherwise,
        or at an attention variant that cannot start at the checkpoint's function (neutral.py)."""
        for key in sorted(flat(self.fields), key=lambda k: k not in FIRST):
            if problem := self.contradiction(key, lookup(model, key, DEFAULTS.get(key))):
                raise InteropError(problem)
        if problem := refusal(model.get("attention") or {}):
            raise InteropError(f"{self.where}: {problem}")

    def _tensors(self) -> dict[str, torch.Tensor]:
        try:
            if self.weights.suffix == ".bin":
                return torch.load(self.weights, map_location="cpu", weights_only=True)
            from safetensors.torch import load_file

            if self.weights.name.endswith(".index.json"):
                shards = sorted(set(json.loads(self.weights.read_text())["weight_map"].values()))
                return {k: v for shard in shards for k, v in load_file(self.path / shard).items()}
            return load_file(self.weights)
        except Exception as err:  # noqa: BLE001 - safetensors and torch raise their own types for a bad file
            reason = " ".join(str(err).split())[:160] or type(err).__name__
            raise InteropError(f"{self.where}: {self.weights.name} cannot be read ({reason})") from None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """attnlab's tensors by name, as the checkpoint holds them."""
        interleaved = self.family == "deepseek_v3" and self.config.get("rope_interleave", True)  # its default
        return from_hf(self.family, self._tensors(), self.fields, self.where, rope_interleave=interleaved)

    def load_into(self, model) -> None:
        """Copy the checkpoint into a GPT built from a config ``check`` accepts. Its vocabulary is the
        data's: a checkpoint of another vocabulary is refused. Parameters the checkpoint lacks (an
        attention variant switched on: a gate, an escape logit) start neutral (neutral.py)."""
        cfg = model.cfg
        if cfg.vocab_size != self.fields["vocab_size"]:
            raise InteropError(
                f"{self.where}: the checkpoint's vocabulary has {self.fields['vocab_size']} tokens, the data's "
                f"{cfg.vocab_size}; expected data tokenized with it (attnlab prepare --tokenizer DIR) and "
                "data.vocab_multiple unset or 1"
            )
        state = self.state_dict()
        if "wpe.weight" in state:
            state["wpe.weight"] = state["wpe.weight"][: cfg.block_size]
        own = model.state_dict()
        for name, tensor in state.items():
            if name not in own or own[name].shape != tensor.shape:
                got = "absent" if name not in own else tuple(own[name].shape)
                raise InteropError(
                    f"{self.where}: {name} is {tuple(tensor.shape)} in the checkpoint, {got} in the model; "
                    "expected the shapes of config.json"
                )
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor)
        neutral_init(model)


def is_hf_dir(path) -> bool:
    """A save_pretrained dir rather than an attnlab run dir (analyze, stream and sample take either)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file() and not (p / "checkpoints").is_dir()


def model_from_hf(path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(GPTConfig's dict, attnlab's state dict) of a Hugging Face dir: the model it holds, at its
    own context length, with attnlab's default attention (the scaled kernel)."""
    ckpt = HFCheckpoint.open(path)
    return dict(ckpt.fields), ckpt.state_dict()


def architecture_from(ckpt: HFCheckpoint, given: set[str], model: dict) -> dict:
    """The model fields (dotted keys under ``model``) a run starting from ``ckpt`` takes from its
    config.json: every field it fixes that is not in ``given`` (the keys the run set itself, a key
    covering the fields under it), at the checkpoint's value; the context at the checkpoint's
    positions. A given field whose value in ``model`` (the composed model config) contradicts the
    checkpoint is refused in one line naming both values."""

    def is_given(key: str) -> bool:
        return any(key == g or key.startswith(g + ".") for g in given)

    taken = {}
    for key in sorted(flat(ckpt.fields), key=lambda k: k not in FIRST):
        if key == "vocab_size":  # the data's: its own check in load_into
            continue
        if is_given(key):
            if problem := ckpt.contradiction(key, lookup(model, key, DEFAULTS.get(key))):
                raise InteropError(problem)
        else:
            taken[key] = flat(ckpt.fields)[key]
    return taken


def vocabulary_from(given: set[str], data: dict) -> dict:
    """The data keys a run starting from a checkpoint takes: ``vocab_multiple=1`` where the data pads
    its vocabulary (data=tokens) and the run did not set the padding itself (``given``: the data
    keys it set), so that the model's vocabulary is the data's, which
    ``attnlab prepare --tokenizer DIR`` made the checkpoint's; a padding the run set is kept (and
    refused in load_into where it changes the size)."""
    if "vocab_multiple" not in data or "vocab_multiple" in given:
        return {}
    return {"vocab_multiple": 1}
