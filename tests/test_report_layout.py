"""The study report's layout: per-cell 95 % t intervals, the tested differences with Welch intervals and Holm p,
the headline's choice of words, the attention-free row, machine columns out of the main table, per-layer
tables, per-seed values, the plots, and the re-lay of a committed report from its files alone."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest
from scipy.stats import t as student_t

from attnlab.studies.report import build_report, layout
from attnlab.studies.report.layout import Metric, Study, TableCell, findings
from attnlab.studies.report.numbers import mean_interval
from attnlab.studies.report.significance import contrasts, holm, welch


# ---------------------------------------------------------------- reading a report back
def md_tables(md: str) -> list[tuple[list[str], list[dict]]]:
    """Every Markdown table of ``md`` as (header, rows as {column: cell})."""
    out, lines = [], md.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            split = lambda line: [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]  # noqa: E731
            header, rows = split(lines[i]), []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, split(lines[i]))))
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def table_with(md: str, column: str, after: str | None = None) -> tuple[list[str], list[dict]]:
    text = md.split(after, 1)[1] if after else md
    return next(t for t in md_tables(text) if column in t[0])


def ci(text: str) -> tuple[float, float, float]:
    """'1.891 [1.865, 1.918]' -> (1.891, 1.865, 1.918)."""
    m = re.fullmatch(r"([-+\d.e]+) \[([-+\d.e]+), ([-+\d.e]+)\]", text)
    assert m, text
    return tuple(map(float, m.groups()))


def fake_run(root, name, overrides, metrics, n_layer=2, history=None, data=None):
    run = root / name
    run.mkdir(parents=True)
    config = {"study": "fake", "model": {"n_layer": n_layer}, **({"data": data} if data else {})}
    (run / "results.json").write_text(
        json.dumps({"status": "ok", "error": None, "overrides": overrides, "config": config, "metrics": metrics})
    )
    (run / "vocab.json").write_text(json.dumps({"chars": list("abcdefghij")}))
    if history:
        (run / "attention_stats.jsonl").write_text("\n".join(map(json.dumps, history)) + "\n")


LOSSES = {
    ("16", "none"): [2.00, 2.02, 2.04],
    ("16", "inv_sqrt_d"): [1.80, 1.81, 1.83],
    ("32", "none"): [2.40, 2.42, 2.45],
    ("32", "inv_sqrt_d"): [1.85, 1.84, 1.86],
}


def synthetic_sweep(root, losses=LOSSES, data=None):
    for (dk, sc), values in losses.items():
        for seed, loss in enumerate(values):
            metrics = {
                "val/loss": loss,
                "val/acc": 0.5 - loss / 10,
                "perf/tokens_per_s": 1000.0 + 300 * seed,
                "mem/peak_bytes": 2.0**21,
                **{f"attn/L{i}/entropy_norm": 0.3 + 0.1 * i + 0.01 * seed for i in range(2)},
            }
            history = [
                {"step": s, "attn/L0/max_logit": s / 10 + seed, "attn/L1/max_logit": s / 20} for s in (0, 50, 100)
            ]
            fake_run(
                root,
                f"{dk}-{sc}-{seed}",
                [f"model.d_k={dk}", f"model.attention.scaling={sc}", f"seed={seed}"],
                metrics,
                history=history,
                data=data,
            )
    return root


# ---------------------------------------------------------------- the numbers
def test_mean_interval_is_the_t_interval_with_n_minus_1_df():
    values = [1.0, 2.0, 3.0]  # mean 2, s = 1
    lo, hi = mean_interval(statistics.fmean(values), statistics.stdev(values), 3)
    half = student_t.ppf(0.975, 2) / math.sqrt(3)
    assert (lo, hi) == pytest.approx((2 - half, 2 + half)) and half == pytest.approx(2.484, abs=1e-3)
    assert mean_interval(2.0, 0.5, 1) is None and mean_interval(None, None, 0) is None
    lo10, hi10 = mean_interval(2.0, 1.0, 10)
    assert hi10 - lo10 < hi - lo  # more seeds, narrower


def test_a_contrast_carries_welch_interval_and_holm_over_its_family():
    def cell(dk, sc, vals):
        return TableCell(
            {"model.d_k": dk, "model.attention.scaling": sc},
            len(vals),
            metrics={"val/loss": Metric(statistics.fmean(vals), statistics.stdev(vals), len(vals), vals)},
        )

    cells = [cell(dk, sc, v) for (dk, sc), v in LOSSES.items()]
    family = contrasts(cells, ["model.d_k", "model.attention.scaling"])
    assert [(c.rest["model.d_k"], c.level, c.reference) for c in family] == [
        ("16", "inv_sqrt_d", "none"),
        ("32", "inv_sqrt_d", "none"),
    ]
    a, b = LOSSES[("16", "none")], LOSSES[("16", "inv_sqrt_d")]
    w = welch(a, b)
    se = math.sqrt(statistics.variance(a) / 3 + statistics.variance(b) / 3)
    half = student_t.ppf(0.975, w.df) * se
    c = family[0]
    assert c.diff == pytest.approx(statistics.fmean(b) - statistics.fmean(a))
    assert c.interval == pytest.approx((c.diff - half, c.diff + half))
    assert [x.p_holm for x in family] == pytest.approx(holm([x.test.p for x in family]))
    assert all(x.direction == "lower" for x in family)


# ---------------------------------------------------------------- the headline's choice
def _study(losses, baseline=None) -> Study:
    cells = [
        TableCell(
            {"model.d_k": dk, "model.attention.scaling": sc},
            len(v),
            metrics={"val/loss": Metric(statistics.fmean(v), statistics.stdev(v), len(v), v)},
        )
        for (dk, sc), v in losses.items()
    ]
    return Study(
        "fake", ["model.d_k", "model.attention.scaling"], cells, ["val/loss"], 0, per_seed_known=True, baseline=baseline
    )


def test_the_headline_turns_with_the_measurements():
    """The same study measured both ways: the finding's direction, and the sentence, follow the numbers."""
    lowered = _study(LOSSES)
    raised = _study({(dk, "none" if sc == "inv_sqrt_d" else "inv_sqrt_d"): v for (dk, sc), v in LOSSES.items()})
    noisy = _study(
        {
            k: [v[0] - 0.3, v[1], v[2] + 0.3]
            for k, v in {("16", "none"): [2.0] * 3, ("16", "inv_sqrt_d"): [2.01] * 3}.items()
        }
    )
    a, b, c = (layout.analyse(s) for s in (lowered, raised, noisy))
    assert {f.direction for f in findings(a.families["val/loss"], "val/loss")} == {"lower"}
    assert {f.direction for f in findings(b.families["val/loss"], "val/loss")} == {"higher"}
    assert {f.direction for f in findings(c.families["val/loss"], "val/loss")} == {"none"}
    assert a.headline != b.headline and len({a.headline, b.headline, c.headline}) == 3
    # the magnitudes quoted are the measured differences (2 significant digits), in both directions
    diffs = sorted(abs(x.diff) for x in a.families["val/loss"])
    assert f"{diffs[0]:.2g}" in a.headline and f"{diffs[-1]:.2g}" in b.headline
    # mixed: one pair each way -> two findings, one per direction
    mixed = _study(
        {
            ("16", "none"): LOSSES[("16", "none")],
            ("16", "inv_sqrt_d"): LOSSES[("16", "inv_sqrt_d")],
            ("32", "none"): LOSSES[("32", "inv_sqrt_d")],
            ("32", "inv_sqrt_d"): LOSSES[("32", "none")],
        }
    )
    assert sorted(f.direction for f in findings(layout.analyse(mixed).families["val/loss"], "val/loss")) == [
        "higher",
        "lower",
    ]


def test_the_baseline_sentence_names_the_cells_that_do_not_beat_it():
    far = _study(LOSSES, baseline={"bigram": 3.0})
    near = _study(LOSSES, baseline={"bigram": 2.45})
    assert layout.baseline_sentence(far).count("=") == 0  # no cell named: all below
    named = layout.baseline_sentence(near)
    assert "d_k=32, scaling=none" in named and "d_k=16" not in named


# ---------------------------------------------------------------- the layout on a synthetic sweep
def test_layout_of_a_synthetic_sweep(tmp_path, monkeypatch):
    level = {"bigram": 2.5, "unigram": 3.0, "chance": 4.4, "vocab": 84, "split": "val", "source": "test"}
    monkeypatch.setattr(layout, "attention_free_level", lambda: level)
    monkeypatch.setattr("attnlab.studies.report.attention_free_level", lambda: level)
    text_data = {"_target_": "attnlab.data.TextDataModule", "source": "shakespeare", "path": None}
    summary = build_report(synthetic_sweep(tmp_path / "sweep", data=text_data), reports=tmp_path / "r")
    out = tmp_path / "r" / "fake"
    md = (out / "ablation.md").read_text()
    assert md.startswith("# fake") and md.split("\n")[2] == summary["headline"]
    header, rows = md_tables(md)[0]
    assert "tokens/s" not in header and "peak MiB" not in header and header[:3] == ["d_k", "scaling", "seeds"]
    cell = next(r for r in rows if r["d_k"] == "16" and r["scaling"] == "none")
    mean, lo, hi = ci(cell["val loss"])
    exp_lo, exp_hi = mean_interval(
        statistics.fmean(LOSSES[("16", "none")]), statistics.stdev(LOSSES[("16", "none")]), 3
    )
    assert (
        mean == pytest.approx(2.02, abs=1e-3)
        and lo == pytest.approx(exp_lo, abs=1e-3)
        and hi == pytest.approx(exp_hi, abs=1e-3)
    )
    baseline = [r for r in rows if r["seeds"] == "-"]
    assert len(baseline) == 1 and float(baseline[0]["val loss"]) == pytest.approx(2.5)
    # the machine's measurements: a section of their own
    cost_header, cost_rows = table_with(md, "tokens/s")
    assert "peak MiB" in cost_header and len(cost_rows) == 4 and md.index("tokens/s") > md.index("Per layer")
    # per layer: one table per statistic, a column per layer, intervals in every cell
    layer_header, layer_rows = table_with(md, "L1", after="entropy_norm")
    assert layer_header[-2:] == ["L0", "L1"] and all(ci(r["L1"]) for r in layer_rows)
    # the differences with their intervals, raw and Holm p, in words
    diff_header, diff_rows = table_with(md, "difference [95 % CI]")
    assert len(diff_rows) == 2 and all(r["direction"] == "scaled lower" for r in diff_rows)
    for row, pair in zip(diff_rows, summary["scaled_vs_unscaled"]):
        d, dlo, dhi = ci(row["difference [95 % CI]"])
        assert d == pytest.approx(pair["diff"], abs=1e-3) and (dlo, dhi) == pytest.approx(pair["ci95"], abs=1e-3)
    # per-seed values: in the CSV and summary.json
    header_csv, *lines = (out / "ablation.csv").read_text().splitlines()
    cols = header_csv.split(",")
    first = dict(zip(cols, lines[0].split(",")))
    assert [float(x) for x in first["val/loss_per_seed"].split(";")] == LOSSES[
        (first["model.d_k"], first["model.attention.scaling"])
    ]
    assert first["seeds"] == "0;1;2" and "perf/tokens_per_s_mean" in cols  # kept in the CSV
    assert float(first["val/loss_ci95_lo"]) < float(first["val/loss_mean"]) < float(first["val/loss_ci95_hi"])
    assert "per_seed_note" not in summary and len(summary["per_seed"][0]["runs"]) == 3
    # index.html: the same tables, the same rows
    page = (out / "index.html").read_text()
    assert page.count("<table>") == len(md_tables(md)) and page.count("<tr") == sum(
        1 + len(r) for _, r in md_tables(md)
    )


def test_machine_columns_leave_the_main_table_and_a_model_cost_stays_when_it_varies():
    def cell(n_kv, kv_bytes):
        m = {
            "val/loss": Metric(2.0, 0.1, 3),
            "perf/tokens_per_s": Metric(1e4, 2e3, 3),
            "mem/kv_cache_bytes_per_token": Metric(kv_bytes, 0.0, 3),
        }
        return TableCell({"model.n_kv_head": n_kv}, 3, metrics=m)

    keys = ["val/loss", "perf/tokens_per_s", "mem/kv_cache_bytes_per_token"]
    varying = Study("gqa", ["model.n_kv_head"], [cell("1", 1024.0), cell("4", 4096.0)], keys, 0)
    constant = Study("other", ["model.n_kv_head"], [cell("1", 1024.0), cell("4", 1024.0)], keys, 0)
    assert varying.main_keys == ["val/loss", "mem/kv_cache_bytes_per_token"] and varying.machine_keys == [
        "perf/tokens_per_s"
    ]
    assert constant.main_keys == ["val/loss"]
    assert len(layout.main_table(varying)[1]) == 2  # no attention-free row without a text corpus


def test_restat_relays_a_committed_report_from_its_files(tmp_path):
    """A report re-laid from ablation.csv and summary.json alone: the same tests, intervals and headline; without
    per-seed values it says so, and the per-seed section is left out."""
    from attnlab.studies.report.restat import restat

    build_report(synthetic_sweep(tmp_path / "sweep"), reports=tmp_path / "r")
    out = tmp_path / "r" / "fake"
    before = json.loads((out / "summary.json").read_text())
    after = restat(out)
    assert [p["p"] for p in after["pairs"]] == pytest.approx([p["p"] for p in before["scaled_vs_unscaled"]])
    assert [x for p in after["pairs"] for x in p["ci95"]] == pytest.approx(
        [x for p in before["scaled_vs_unscaled"] for x in p["ci95"]]
    )
    assert after["headline"] == before["headline"]
    # the same without per-seed values (a report written before they were kept): stand-ins give the same tests
    data = json.loads((out / "summary.json").read_text())
    data.pop("per_seed")
    (out / "summary.json").write_text(json.dumps(data))
    again = restat(out)
    assert [p["p"] for p in again["pairs"]] == pytest.approx([p["p"] for p in before["scaled_vs_unscaled"]], rel=1e-9)
    md = (out / "ablation.md").read_text()
    data = json.loads((out / "summary.json").read_text())
    assert "per_seed_note" in data and "per_seed" not in data and "## Per seed" not in md
    header = (out / "ablation.csv").read_text().splitlines()[0].split(",")
    assert "val/loss_per_seed" not in header and header.count("val/loss_ci95_lo") == 1  # derived columns not doubled
    assert md.count("## Scaled vs unscaled") == 1 and (out / "val_loss_vs_dk.png").stat().st_size > 0


def test_report_titles_name_their_own_study():
    from pathlib import Path

    reports = Path(__file__).resolve().parents[1] / "reports"
    titles = {p.parent.name: p.read_text().split("\n", 1)[0] for p in reports.glob("*/ablation.md")}
    assert len(set(titles.values())) == len(titles)
    assert all(t.startswith(f"# {name} ") for name, t in titles.items())


# ---------------------------------------------------------------- plots
def test_max_logit_plot_draws_every_seed_with_the_legend_outside(tmp_path, monkeypatch):
    from attnlab.studies.report import plots
    from attnlab.studies.report.aggregate import group_cells, load_runs, swept_axes

    runs = load_runs(synthetic_sweep(tmp_path / "sweep"))
    cells = group_cells(runs, swept_axes(runs))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    assert plots.max_logit_over_training(cells, tmp_path / "m.png") is not None
    (fig,) = figures
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2  # a panel per d_k, scaling as colour
    assert sum(len(ax.get_lines()) for ax in axes) == 12  # 4 cells x 3 seeds
    for ax in axes:
        colours = {
            tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
            for line in ax.get_lines()
        }
        assert len(colours) == 2  # one per scaling level
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert all(legend.x0 >= ax.get_window_extent().x1 for ax in axes)  # outside every panel
    assert plots.colours(16) == list(dict.fromkeys(plots.colours(16)))  # 16 distinct colours, no cycle


def test_metric_plot_draws_the_baseline_and_interval_bars(tmp_path, monkeypatch):
    from attnlab.studies.report import plots

    study = _study(LOSSES)
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    plots.metric_vs_axis(study.cells, "model.d_k", "val/loss", tmp_path / "v.png", baseline=2.5)
    (fig,) = figures
    ax = fig.axes[0]
    assert any(list(line.get_ydata()) == [2.5, 2.5] for line in ax.get_lines())  # the attention-free level
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("scaling=none" == lab for lab in labels) and all(len(lab) > 6 for lab in labels)  # labels whole
    bars = [c for c in ax.containers]
    lo, hi = mean_interval(statistics.fmean(LOSSES[("16", "none")]), statistics.stdev(LOSSES[("16", "none")]), 3)
    segs = [seg for b in bars for seg in b.lines[2][0].get_segments()]
    assert any(seg[0][1] == pytest.approx(lo) and seg[1][1] == pytest.approx(hi) for seg in segs)  # the 95 % t interval


def test_a_one_cell_headline_gives_its_value_interval_and_seeds():
    """A study with one cell compares nothing: its headline gives the cell's val loss with its 95 % interval and seed count."""
    losses = [0.6834, 0.6817, 0.6828, 0.6857, 0.6975]
    one = Study(
        "fake",
        [],
        [TableCell({}, 5, metrics={"val/loss": Metric(statistics.fmean(losses), statistics.stdev(losses), 5, losses)})],
        ["val/loss"],
        0,
        per_seed_known=True,
    )
    text = layout.analyse(one).headline
    lo, hi = mean_interval(statistics.fmean(losses), statistics.stdev(losses), 5)
    assert re.search(r"\b5 seeds\b", text) and f"{statistics.fmean(losses):.3f}" in text
    assert f"[{lo:.3f}, {hi:.3f}]" in text
    # one seed: no interval to give
    single = Study("fake", [], [TableCell({}, 1, metrics={"val/loss": Metric(0.7, 0.0, 1, [0.7])})], ["val/loss"], 0)
    assert "[" not in layout.analyse(single).headline and "0.700" in layout.analyse(single).headline
