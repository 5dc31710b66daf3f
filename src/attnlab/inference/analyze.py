"""Head analysis of a trained model: ``python -m attnlab.inference.analyze RUN_DIR_OR_CKPT [--out DIR]``.

Loads ``checkpoints/last.ckpt`` of a run dir (or the checkpoint given), rebuilds the run's data
from its results.json for the plain probe (random tokens if that is not possible), scores and
classifies every head (``attnlab.analysis.heads``) and writes heads.json, heads.md and heads.png
next to the run (or into --out). Prints the Markdown table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from attnlab.analysis.heads import analyze_heads, build_probes
from attnlab.analysis.outputs import HEADS_MD, write_outputs
from attnlab.interop.hf_load import is_hf_dir
from attnlab.training.checkpointing import load_model
from attnlab.util.cli import command_parser
from attnlab.util.errors import AttnlabError, CheckpointError, DataError


def locate(path: str) -> tuple[Path, Path]:
    """(checkpoint, run dir) from a run dir, a checkpoint file or a Hugging Face model dir (both the dir)."""

    p = Path(path).expanduser()
    if is_hf_dir(p):  # a Hugging Face model dir: load_model reads it as a checkpoint
        return p, p
    if p.is_dir():
        ckpt = p / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            raise AttnlabError(f"{path}: no checkpoints/last.ckpt in this run dir; expected a run dir or a .ckpt file")
        return ckpt, p
    if p.is_file():
        run_dir = p.parent.parent if p.parent.name == "checkpoints" else p.parent
        return p, run_dir
    raise AttnlabError(f"{path}: no such file or directory; expected a run dir or a .ckpt file")


def run_datamodule(run_dir: Path):
    """The run's data module, rebuilt from results.json; None (and a note on stderr) if it cannot be."""
    results = run_dir / "results.json"
    if not results.is_file():
        print(f"attnlab: note: no {results}; the plain probe uses random tokens", file=sys.stderr)
        return None
    from hydra.utils import instantiate

    cfg = json.loads(results.read_text())["config"]
    try:
        dm = instantiate(cfg["data"], block_size=cfg["model"]["block_size"], steps=1, seed=cfg.get("seed", 0))
        dm.setup("fit")
        return dm
    except (AttnlabError, DataError, OSError) as err:
        print(
            f"attnlab: note: cannot rebuild the run's data ({err}); the plain probe uses random tokens", file=sys.stderr
        )
        return None


def analyze(
    path: str, out: str | None = None, n_probe: int = 16, seed: int = 0, plot: bool = True
) -> tuple[list, dict, Path]:
    ckpt, run_dir = locate(path)
    try:
        module, checkpoint = load_model(ckpt)
    except CheckpointError as err:
        raise CheckpointError(err.path, f"{err.problem}; expected a checkpoint written by attnlab train") from None
    model = module.model.float().eval()
    probes = build_probes(model, module.hparams.get("vocab"), run_datamodule(run_dir), n_probe, seed)
    with torch.no_grad():
        heads, summary = analyze_heads(model, probes)
    step = checkpoint["global_step"]
    meta = {
        "checkpoint": str(ckpt),
        "step": step,
        "plain": probes.plain_source,
        "n": n_probe,
        "half": f"{int(probes.half.min())}..{int(probes.half.max())}",
    }
    out_dir = Path(out) if out else run_dir
    write_outputs(heads, summary, out_dir, meta=meta, title=f"Head types: {run_dir.name}", plot=plot)
    return heads, summary, out_dir


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("analyze", __doc__.splitlines()[0])
    parser.add_argument("path", help="a run dir (with checkpoints/last.ckpt) or a .ckpt file")
    parser.add_argument("--out", help="output dir (default: the run dir)")
    parser.add_argument("--n-probe", type=int, default=16, help="probe sequences (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="probe seed (default 0)")
    parser.add_argument("--no-plot", action="store_true", help="skip heads.png")
    args = parser.parse_args(argv)
    try:
        _, _, out_dir = analyze(args.path, args.out, args.n_probe, args.seed, plot=not args.no_plot)
    except AttnlabError as err:
        print(f"attnlab: error: {err}", file=sys.stderr)
        sys.exit(2)
    print((out_dir / HEADS_MD).read_text())
    print(f"attnlab: heads.json, heads.md, heads.png in {out_dir}")


if __name__ == "__main__":
    main()
