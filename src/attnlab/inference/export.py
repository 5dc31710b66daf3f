"""``attnlab export RUN --format hf OUT``: a run's model as a directory transformers loads offline
with ``AutoModelForCausalLM.from_pretrained(OUT)``: GPT-2 for learned positions, Llama for RoPE,
DeepSeek-V3 (dense MLPs in every layer) for latent attention (families.py says what each expresses;
anything else is refused before OUT is touched).

OUT holds config.json and model.safetensors, written by transformers' own save_pretrained (so the
files are exactly what it reads), and the run's tokenizer where it has one transformers can load:
a BPE from ``attnlab prepare`` or a character vocabulary, as tokenizer.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from attnlab.inference.analyze import locate
from attnlab.interop.families import NAMES, InteropError, family_of, hf_config
from attnlab.interop.state_dicts import to_hf
from attnlab.training.checkpointing import load_model
from attnlab.util.cli import command_parser
from attnlab.util.errors import AttnlabError

FORMATS = ("hf",)


def char_tokenizer_json(chars: list[str]) -> dict:
    """A character vocabulary as a ``tokenizers`` tokenizer: each character one token, decoded without spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return json.loads(tok.to_str())


def tokenizer_json(run_dir: Path) -> dict | None:
    """The run's tokenizer as tokenizer.json's content, or None (plain ids, or a tiktoken encoding,
    whose Hugging Face counterpart is the hub's own tokenizer)."""
    saved = run_dir / "vocab.json"
    if not saved.is_file():
        return None
    spec = json.loads(saved.read_text())
    if spec.get("kind") == "bpe":
        return spec["tokenizer"]
    if "chars" in spec and spec.get("kind") in (None, "chars"):
        return char_tokenizer_json(spec["chars"])
    return None


def export(run: str, out: str, fmt: str = "hf") -> tuple[str, Path]:
    """Write ``run``'s model (a run dir or a .ckpt) into ``out``; returns (family, out). OUT is
    written whole into a temporary dir beside it and renamed: a refusal or a failure leaves nothing."""

    if fmt not in FORMATS:
        raise AttnlabError(f"--format={fmt}; expected one of {', '.join(FORMATS)}")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise AttnlabError(f"{out}: exists and is not empty; expected a new or empty dir")
    ckpt, run_dir = locate(run)
    module, _ = load_model(ckpt)
    return write_hf(module.model, target, tokenizer_json(run_dir)), target


def write_hf(model, target: Path, tokenizer: dict | None = None) -> str:
    """``model`` (a GPT) as a transformers dir at ``target`` (new or empty), with ``tokenizer``
    (tokenizer.json's content) if given; returns the family. Refused configurations write nothing."""
    model = model.float().eval()
    config = asdict(model.cfg)
    kwargs = hf_config(config)  # refuses what the family cannot express, before anything is written
    family = family_of(config)
    try:
        import transformers
    except ImportError:
        raise InteropError("export --format hf needs transformers: pip install -e '.[hf]'") from None
    hf_cls = {
        "gpt2": transformers.GPT2Config,
        "llama": transformers.LlamaConfig,
        "deepseek_v3": transformers.DeepseekV3Config,
    }[family]
    kwargs.pop("model_type")
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_cls(**kwargs))
    missing, unexpected = hf_model.load_state_dict(to_hf(family, model.state_dict(), model.cfg), strict=False)
    # a tied head is tied by transformers itself
    missing = [k for k in missing if not (k == "lm_head.weight" and model.cfg.tie_embeddings)]
    if missing or unexpected:
        raise InteropError(f"{NAMES[family]} export: missing {missing[:3]}, unexpected {unexpected[:3]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        hf_model.save_pretrained(staging)
        if tokenizer is not None:
            (staging / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
            (staging / "tokenizer_config.json").write_text(
                json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model.cfg.block_size})
            )
        if target.is_dir():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return family


def main(argv: list[str] | None = None) -> None:

    parser = command_parser("export", __doc__.splitlines()[0].strip("`: "))
    parser.add_argument("run", help="a run dir (with checkpoints/last.ckpt) or a .ckpt file")
    parser.add_argument("out", help="the directory to write (new or empty)")
    parser.add_argument("--format", default="hf", choices=FORMATS, help="hf: a transformers model dir")
    args = parser.parse_args(argv)
    try:
        family, target = export(args.run, args.out, args.format)
    except AttnlabError as err:
        print(f"attnlab: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"attnlab: {NAMES[family]} model in {target} (AutoModelForCausalLM.from_pretrained)")
