"""``make dashboard``: a saved W&B workspace for attnlab runs, grouped by the ablation axes.

Needs a W&B login (WANDB_API_KEY or ``wandb login``) and the optional ``wandb-workspaces`` package
(``pip install -e '.[dashboard]'``). Without a login it prints the workspace it would create and
exits 0, so it is safe to run offline.
"""
from __future__ import annotations

import netrc
import os
import sys

from .attention.stats import METRICS
from .cli import command_parser

SECTIONS = {
    "Loss": ["train/loss", "val/loss", "val/ppl", "val/acc"],
    **{m.panel: [f"attn/L{{i}}/{m.name}"] for m in METRICS if m.panel},  # from the metric registry
    "Gradient reaching q/k": ["grad/L{i}/q_norm", "grad/L{i}/k_norm"],
    "Cost": ["perf/tokens_per_s", "mem/peak_bytes", "mem/attn_matrix_bytes"],
}
GROUP_BY = ["backend", "scaling", "d_k", "qk_norm", "init_std", "lr"]


def logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def plan(n_layer: int) -> dict[str, list[str]]:
    """Section name -> metric keys, per-layer templates expanded for ``n_layer`` layers."""
    return {
        name: [m.format(i=i) for m in metrics for i in (range(n_layer) if "{i}" in m else [0])]
        for name, metrics in SECTIONS.items()
    }


def create(entity: str | None, project: str, name: str, n_layer: int) -> str:
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = [
        ws.Section(name=title, panels=[wr.LinePlot(x="Step", y=[m]) for m in metrics], is_open=True)
        for title, metrics in plan(n_layer).items()
    ]
    workspace = ws.Workspace(
        name=name, entity=entity, project=project, sections=sections,
        runset_settings=ws.RunsetSettings(groupby=[ws.Config(k) for k in GROUP_BY[:2]]),
    )
    workspace.save()
    return workspace.url


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("dashboard", __doc__.splitlines()[0])
    parser.add_argument("--entity", default=os.environ.get("WANDB_ENTITY"))
    parser.add_argument("--project", default="attnlab")
    parser.add_argument("--name", default="attnlab ablations")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    sections = plan(args.layers)
    print(f"W&B workspace '{args.name}' for project '{args.project}', runs grouped by {', '.join(GROUP_BY[:2])}"
          f" (also filterable by {', '.join(GROUP_BY[2:])}):")
    for title, metrics in sections.items():
        print(f"  {title}: {', '.join(metrics)}")
    if not logged_in():
        print("Not logged in to W&B: nothing created. `wandb login`, `make sync` to upload offline runs, then rerun.")
        return 0
    try:
        url = create(args.entity, args.project, args.name, args.layers)
    except ImportError:
        print("attnlab: error: the dashboard needs wandb-workspaces: .venv/bin/pip install -e '.[dashboard]'", file=sys.stderr)
        return 2
    print(f"created {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
