"""The induction phase change of one run on one plot (Olsson et al. 2022, figure 1 style).

Reads what a run already recorded: the head analysis' history in heads.json (every
``callbacks.heads.every_n_steps``: in_context_score, the best layer-L induction score, the
knockout of layer L's induction edges and the best previous-token score of layer L - 1) and train/loss from the CSV logger. Left axis: scores in
[0, 1]; right axis: nats (training loss and the in-context score, late minus early loss).

    python -m attnlab.analysis.phase RUN_DIR [--layer 1] [--out phase_change.png]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from attnlab.analysis.outputs import HEADS_JSON

PHASE_PNG = "phase_change.png"
PHASE_LEVEL = 0.5  # copying accuracy on the probe that marks the phase change (chance is about 1/vocab)


def phase_change_step(history: list[dict], level: float = PHASE_LEVEL) -> int | None:
    """The first measured step at which copying on the repeated probe reaches ``level``; None if
    it never does (no phase change within the run, or a model that copies from the start)."""
    return next((h["step"] for h in history if h.get("repeat_acc") is not None and h["repeat_acc"] >= level), None)


def head_history(run_dir: Path) -> list[dict]:
    """The head analysis' history a run recorded in heads.json ([] when it has none)."""
    path = Path(run_dir) / HEADS_JSON
    return json.loads(path.read_text()).get("history") or [] if path.is_file() else []


def train_loss(run_dir: Path) -> list[tuple[int, float]]:
    """(step, train/loss) from the run's CSV logger, [] when it has none."""
    points = []
    for path in sorted(Path(run_dir).glob("csv/*/metrics.csv")):
        with open(path) as f:
            points += [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(f) if r.get("train/loss")]
    return sorted(points)


def plot_phase_change(run_dir: Path, out: Path | None = None, layer: int = 1) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    history = head_history(run_dir)
    steps = [h["step"] for h in history]
    fig, left = plt.subplots(figsize=(7, 4))
    series = [
        (f"L{layer}/induction_max", f"best L{layer} induction score", "C0"),
        (f"L{layer}/induction_knockout_all_heads", f"L{layer} knockout: drop in p(right token)", "C1"),
        ("repeat_acc", "copying accuracy on the probe", "C2"),
        (f"L{layer - 1}/previous_token_max", f"best L{layer - 1} previous-token score", "C3"),
    ]
    for key, label, colour in series:
        if any(key in h for h in history):
            left.plot(steps, [h.get(key) for h in history], color=colour, label=label)
    left.set_xlabel("step")
    left.set_ylabel("score / probability")
    left.set_ylim(-0.05, 1.05)
    right = left.twinx()
    loss = train_loss(run_dir)
    if loss:
        right.plot(*zip(*loss), color="0.6", lw=0.6, label="train loss (nats)")
    right.plot(steps, [h.get("in_context_score") for h in history], "k--", label="in-context score (nats)")
    right.set_ylabel("nats")
    lines = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = left.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    left.legend(lines, labels, fontsize=7, loc="center right")
    left.grid(alpha=0.3)
    fig.suptitle(f"Induction phase change: {run_dir.name}", fontsize=10)
    fig.tight_layout()
    out = Path(out) if out else run_dir / PHASE_PNG
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnlab.analysis.phase", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--layer", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not (args.run_dir / HEADS_JSON).is_file():
        parser.error(f"{args.run_dir}: no {HEADS_JSON}; expected a run dir of a run with the head analysis callback")
    print(plot_phase_change(args.run_dir, args.out, args.layer))


if __name__ == "__main__":
    main()
