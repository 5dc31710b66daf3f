"""A local Hugging Face model dir (GPT-2 or Llama family) read into attnlab's GPT: ``model.init_from``
for training, and the dir itself as a model for analyze, stream and sample.

Nothing is downloaded: the dir is what ``save_pretrained`` writes (config.json and model.safetensors,
sharded or not, or pytorch_model.bin). Every problem is one line naming the dir and what is wrong;
it is found before anything of the run is built on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .families import InteropError, model_fields
from .neutral import neutral_init, refusal
from .weights import from_hf

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# fields a run may set otherwise than the checkpoint: its context (rope: any; learned: at most the
# checkpoint's, the first rows of wpe are kept) and its vocabulary (the data's, compared separately)
FREE = ("vocab_size", "block_size")


@dataclass
class HFCheckpoint:
    path: Path
    family: str
    fields: dict  # GPTConfig's fields the checkpoint fixes (families.model_fields)
    weights: Path

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
        return cls(p, hf["model_type"], fields, weights)

    def check(self, model: dict) -> None:
        """A one-line error at the first field of ``model`` (GPTConfig's dict) the checkpoint fixes otherwise,
        or at an attention variant that cannot start at the checkpoint's function (neutral.py)."""
        first = ("pos_encoding", "norm", "mlp")  # the block's kind before its sizes: the more telling refusal
        for key in sorted(self.fields, key=lambda k: k not in first):
            theirs = self.fields[key]
            if key in FREE:
                continue
            ours = model.get(key)
            if ours is None and key in ("d_k", "n_kv_head", "mlp_hidden"):  # null: the derived value
                continue
            if ours != theirs:
                raise InteropError(
                    f"{self.where}: the checkpoint has model.{key}={theirs!r}, the run model.{key}={ours!r}; "
                    f"expected model.{key}={theirs}"
                )
        if self.family == "gpt2" and model.get("block_size", 0) > self.fields["block_size"]:
            raise InteropError(
                f"{self.where}: model.block_size={model['block_size']} exceeds the checkpoint's "
                f"{self.fields['block_size']} learned positions; expected at most {self.fields['block_size']}"
            )
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
        return from_hf(self.family, self._tensors(), self.fields, self.where)

    def load_into(self, model) -> None:
        """Copy the checkpoint into a GPT built from a config ``check`` accepts. Its vocabulary is the
        data's: a checkpoint of another vocabulary is refused. Parameters the checkpoint lacks (an
        attention variant switched on: a gate, an escape logit) start neutral (neutral.py)."""
        cfg = model.cfg
        if cfg.vocab_size != self.fields["vocab_size"]:
            raise InteropError(
                f"{self.where}: the checkpoint's vocabulary has {self.fields['vocab_size']} tokens, the data's "
                f"{cfg.vocab_size}; expected data tokenized with it (attnlab prepare --tokenizer DIR) and "
                "data.vocab_multiple=1"
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
