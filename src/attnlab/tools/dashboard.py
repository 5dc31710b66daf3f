"""``make dashboard``: a saved W&B workspace for attnlab runs, or for one study's runs.

    attnlab dashboard                    every run, grouped by backend and scaling
    attnlab dashboard --study sinks      the study's W&B group, grouped by its own axes (bos, escape),
                                         with its headline comparison first
    attnlab dashboard --study sinks --offline   link the study's offline runs into one folder for
                                         `wandb leet` (no account needed) or `wandb sync`

Needs a W&B login (WANDB_API_KEY or ``wandb login``) and the optional ``wandb-workspaces`` package
(``pip install -e '.[dashboard]'``). Without a login it prints the workspace it would create and
exits 0, so it is safe to run offline.
"""

from __future__ import annotations

import json
import netrc
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.attention.stats import METRICS
from attnlab.config.study import load_study, study_names
from attnlab.sweeps.sweep import unknown_study
from attnlab.training.wandb_runs import axis_name
from attnlab.util.cli import command_parser

SECTIONS = {
    "Loss": ["train/loss", "val/loss", "val/ppl", "val/acc"],
    **{m.panel: [f"attn/L{{i}}/{m.name}"] for m in METRICS if m.panel},  # from the metric registry
    "Gradient reaching q/k": ["grad/L{i}/q_norm", "grad/L{i}/k_norm"],
    "Cost": ["perf/tokens_per_s", "mem/peak_bytes", "mem/attn_matrix_bytes", "mem/kv_cache_bytes_per_token"],
}
GROUP_BY = ["backend", "scaling", "d_k", "qk_norm", "init_std", "lr"]
# The figures each run logs: the attention maps at every probe step (a step slider) and the final head types.
MEDIA = {"Attention maps": ["attn/maps"], "Head types": ["heads/heatmap"]}
HEAD_CURVES = [
    "heads/n_sink",
    "heads/n_escape",
    "heads/n_induction",
    "heads/n_previous_token",
    "heads/n_positional",
    "heads/in_context_score",
]


@dataclass
class Panel:
    """One panel of the plan: ``line`` (y over steps), ``scatter`` (final y against a numeric
    config axis x), ``bar`` (final y per value of a categorical axis), ``media`` (images by step)."""

    kind: str
    y: list[str]
    x: str | None = None
    log_x: bool = False  # a numeric axis spanning a factor of 8 or more (lr 1e-4..1e-2, d_k 16..128)

    def text(self) -> str:
        if self.kind in ("scatter", "bar"):
            return f"{', '.join(self.y)} by {self.x}" + (" (log x)" if self.log_x else "")
        return ", ".join(self.y) + (" (images, by step)" if self.kind == "media" else "")


@dataclass
class Plan:
    name: str
    group_by: list[str]
    sections: dict[str, list[Panel]] = field(default_factory=dict)
    study: str | None = None  # the W&B group shown; None: every run

    def metrics(self) -> dict[str, list[str]]:
        return {title: [y for p in panels for y in p.y] for title, panels in self.sections.items()}


def logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def expand(metrics: list[str], n_layer: int) -> list[str]:
    return [m.format(i=i) for m in metrics for i in (range(n_layer) if "{i}" in m else [0])]


def plan(n_layer: int) -> dict[str, list[str]]:
    """Section name -> metric keys, per-layer templates expanded for ``n_layer`` layers."""
    return {name: expand(metrics, n_layer) for name, metrics in SECTIONS.items()}


def study_axes(study: str) -> dict[str, list]:
    """The study's swept axes by their top-level W&B names -> their grid values."""

    return {axis_name(key): values for key, values in load_study(study).grid.items()}


def build_plan(study: str | None, n_layer: int | None = None, name: str | None = None) -> Plan:
    """The workspace for one study (its group, its axes, its headline first) or, without one, for
    every run grouped by backend and scaling."""
    if study is None:
        layers = n_layer or 4
        sections = {title: [Panel("line", [m]) for m in metrics] for title, metrics in plan(layers).items()}
        sections |= {title: [Panel("media", keys)] for title, keys in MEDIA.items()}
        return Plan(name or "attnlab ablations", GROUP_BY[:2], sections)
    grid = study_axes(study)
    layers = n_layer or load_study(study).n_layer
    numeric = {
        axis: all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        for axis, values in grid.items()
    }
    headline = load_study(study).question.headline  # what the study compares its axes on
    axes = list(grid) or ["seed"]
    title = f"Headline: {', '.join(axes)} vs {', '.join(m.replace('{i}', '*') for m in headline)}"
    panels = []
    for metric in headline:
        for axis in axes:
            if numeric.get(axis, True):  # one scatter per layer: final value against the axis
                values = [v for v in grid.get(axis, []) if v > 0]
                log_x = bool(values) and max(values) >= 8 * min(values)
                panels += [Panel("scatter", [m], axis, log_x) for m in expand([metric], layers)]
            else:  # one bar chart: the layers side by side, per value of the axis
                panels.append(Panel("bar", expand([metric], layers), axis))
    sections = {title: panels}
    sections |= {title: [Panel("line", [m]) for m in metrics] for title, metrics in plan(layers).items()}
    sections["Head types"] = [Panel("media", MEDIA["Head types"]), *(Panel("line", [m]) for m in HEAD_CURVES)]
    sections["Attention maps"] = [Panel("media", MEDIA["Attention maps"])]
    sections["Cost"] = sections.pop("Cost")  # last, after the pictures
    return Plan(name or f"attnlab {study}", list(grid), sections, study)


def workspace(plan: Plan, entity: str | None, project: str):
    """The plan as a wandb_workspaces Workspace (built offline; ``.save()`` sends it)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def panel(p: Panel):
        if p.kind == "scatter":
            return wr.ScatterPlot(title=p.text(), x=wr.Config(p.x), y=wr.SummaryMetric(p.y[0]), log_x=p.log_x or None)
        if p.kind == "bar":
            return wr.BarPlot(
                title=p.text(),
                metrics=[wr.SummaryMetric(y) for y in p.y],
                groupby=wr.Config(p.x),
                groupby_aggfunc="mean",
                groupby_rangefunc="stderr",
            )
        if p.kind == "media":
            return wr.MediaBrowser(title=p.text(), media_keys=p.y, gallery_axis="step")
        return wr.LinePlot(x="Step", y=p.y)

    sections = [
        ws.Section(name=title, panels=[panel(p) for p in panels], is_open=i == 0 or plan.study is None)
        for i, (title, panels) in enumerate(plan.sections.items())
    ]
    filters = [ws.Metric("Group") == plan.study] if plan.study else ""
    return ws.Workspace(
        name=plan.name,
        entity=entity,
        project=project,
        sections=sections,
        runset_settings=ws.RunsetSettings(filters=filters, groupby=[ws.Config(k) for k in plan.group_by]),
    )


def create(entity: str | None, project: str, plan: Plan) -> str:
    return workspace(plan, entity, project).save().url


def offline_runs(study: str, logs: Path) -> list[Path]:
    """The offline W&B run dirs of a study under ``logs``: its training runs (results.json names the
    group, or the study for runs recorded without one) and the summary runs in their sweep dirs."""
    found: list[Path] = []
    sweep_dirs: set[Path] = set()
    for results in sorted(logs.glob("**/results.json")):
        try:
            data = json.loads(results.read_text())
        except (OSError, ValueError):
            continue
        group = (data.get("wandb") or {}).get("group") or (data.get("config") or {}).get("study")
        if group != study:
            continue
        found += sorted((results.parent / "wandb").glob("offline-run-*"))
        sweep_dirs.add(results.parent.parent)
    for sweep_dir in sorted(sweep_dirs):
        found += sorted((sweep_dir / "wandb").glob("offline-run-*"))  # the study's <study>-table runs
    return found


def link_offline_runs(study: str, logs: Path, out: Path) -> list[Path]:
    """One folder of links to the study's offline runs: ``wandb leet <out>`` browses them together."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("offline-run-*"):
        if old.is_symlink():
            old.unlink()
    links = []
    for run in offline_runs(study, logs):
        link = out / run.name
        if not link.exists():
            link.symlink_to(run.resolve(), target_is_directory=True)
        links.append(link)
    return links


def main(argv: list[str] | None = None) -> int:

    parser = command_parser("dashboard", __doc__.splitlines()[0])
    parser.add_argument(
        "--study", default=None, help="one study's runs (its W&B group): one of " + ", ".join(study_names())
    )
    parser.add_argument("--entity", default=os.environ.get("WANDB_ENTITY"))
    parser.add_argument("--project", default="attnlab")
    parser.add_argument("--name", default=None, help="the workspace's name (default: attnlab <study>)")
    parser.add_argument("--layers", type=int, default=None, help="layers to show (default: the study's, else 4)")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="link the study's offline runs under --logs into one "
        "folder for `wandb leet` and `wandb sync`; creates no workspace",
    )
    parser.add_argument("--logs", default="logs", help="where the runs are (--offline)")
    args = parser.parse_args(argv)
    if args.study is not None and (refusal := unknown_study(args.study, "--study")):
        print(refusal, file=sys.stderr)
        return 2
    if args.layers is not None and args.layers < 1:
        print(f"attnlab: error: --layers {args.layers}: expected a positive integer", file=sys.stderr)
        return 2
    if args.offline:
        if args.study is None:
            print(
                f"attnlab: error: --offline needs --study (STUDY=...); expected one of {', '.join(study_names())}",
                file=sys.stderr,
            )
            return 2
        out = Path(args.logs) / "wandb" / args.study
        links = link_offline_runs(args.study, Path(args.logs), out)
        print(f"{len(links)} offline W&B runs of study '{args.study}' linked in {out}:")
        print(f"  browse: .venv/bin/wandb leet {out}")
        print(
            f"  upload: .venv/bin/wandb sync --include-offline {out}/offline-run-*   (WANDB_BASE_URL=<server> for a self-hosted one)"
        )
        return 0
    p = build_plan(args.study, args.layers, args.name)
    where = f"the runs of study '{p.study}' (W&B group {p.study})" if p.study else "every run"
    print(
        f"W&B workspace '{p.name}' for project '{args.project}': {where}, grouped by {', '.join(p.group_by)}"
        + ("" if p.study else f" (also filterable by {', '.join(GROUP_BY[2:])})")
        + ":"
    )
    for title, panels in p.sections.items():
        print(f"  {title}: {'; '.join(panel.text() for panel in panels)}")
    if not logged_in():
        print(
            "Not logged in to W&B: nothing created. `wandb login`, `make sync` to upload offline runs, then rerun"
            + (f"; to browse offline: attnlab dashboard --study {p.study} --offline." if p.study else ".")
        )
        return 0
    try:
        url = create(args.entity, args.project, p)
    except ImportError:
        print(
            "attnlab: error: the dashboard needs wandb-workspaces: .venv/bin/pip install -e '.[dashboard]'",
            file=sys.stderr,
        )
        return 2
    print(f"created {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
