"""bench.json, bench.md and the log-log plots, from the measurements ``__main__`` collects."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from attnlab.tools.bench.decode import decode_table
from attnlab.tools.bench.endtoend import TARGET_RATIO as E2E_TARGET
from attnlab.tools.bench.timing import against_target
from attnlab.util.files import atomic_write_text, json_safe
from attnlab.util.profiling import fit_exponent
from attnlab.writing.markdown import markdown_table

MIB = 2**20


def memory_summary(kernels: list[dict], min_fit_T: int = 1024) -> dict:
    """Per backend: exponent p of peak ~ T^p (fit over T >= min_fit_T where there are two such points) and peak(8192)/peak(1024)."""
    exponents, ratios, fit_ranges = {}, {}, {}
    for backend in dict.fromkeys(r["backend"] for r in kernels):
        pts = sorted((r["T"], r["peak_bytes"]) for r in kernels if r["backend"] == backend and r.get("peak_bytes"))
        large = [p for p in pts if p[0] >= min_fit_T]
        used = large if len(large) >= 2 else pts
        exponents[backend] = fit_exponent([t for t, _ in used], [b for _, b in used])
        fit_ranges[backend] = [used[0][0], used[-1][0]] if used else None
        by_t = dict(pts)
        ratios[backend] = by_t[8192] / by_t[1024] if 8192 in by_t and 1024 in by_t else None
    return {"memory_exponent": exponents, "memory_ratio_8192_1024": ratios, "memory_fit_T": fit_ranges}


def write_json(bench: dict, out: Path) -> Path:
    path = Path(out) / "bench.json"
    atomic_write_text(path, json.dumps(json_safe(bench, non_finite_as_null=True), indent=1) + "\n")
    return path


def _f(value, fmt: str = ".2f", none: str = "-") -> str:
    return none if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)


def _range(pair, fmt: str = ".2f") -> str:
    return "" if not pair else f" ({_f(pair[0], fmt)}-{_f(pair[1], fmt)})"


def kernels_table(bench: dict) -> list[str]:
    peak = bench["machine"].get("matmul_gflops")
    header = [
        "backend",
        "kernel",
        "T",
        "fwd ms (min-max)",
        "fwd+bwd ms (min-max)",
        "fwd GFLOP/s",
        "fwd+bwd GFLOP/s",
        "% of matmul",
        "peak MiB (fwd+bwd)",
        "peak MiB (fwd)",
    ]
    rows = []
    for r in bench["kernels"]:
        if r.get("error") and r.get("peak_bytes") is None:
            rows.append([r["backend"], r.get("kernel") or "-", r["T"], r["error"], *[""] * 6])
            continue
        frac = (
            r["peak_fraction"] * 100
            if r.get("peak_fraction")
            else (r["gflops"] / peak * 100 if r.get("gflops") and peak else None)
        )
        rows.append(
            [
                r["backend"],
                r.get("kernel") or "-",
                r["T"],
                f"{_f(r.get('fwd_ms'))}{_range(r.get('fwd_ms_range'))}",
                f"{_f(r.get('fwd_bwd_ms'))}{_range(r.get('fwd_bwd_ms_range'))}",
                _f(r.get("fwd_gflops"), ".1f"),
                _f(r.get("gflops"), ".1f"),
                _f(frac, ".0f"),
                _f(_mib(r.get("peak_bytes")), ".1f"),
                _f(_mib(r.get("fwd_peak_bytes")), ".1f"),
            ]
        )
    return markdown_table(header, rows, align="llrrrrrrrr").splitlines()


def _mib(value):
    return None if value is None else value / MIB


def memory_table(bench: dict) -> list[str]:
    rows = []
    for backend, p in bench["memory_exponent"].items():
        fit = bench.get("memory_fit_T", {}).get(backend)
        rows.append(
            [
                backend,
                _f(p),
                "-" if not fit else f"{fit[0]}-{fit[1]}",
                _f(bench["memory_ratio_8192_1024"].get(backend), ".1f"),
            ]
        )
    header = ["backend", "exponent p (peak ~ T^p)", "fit over T", "peak(8192) / peak(1024)"]
    return markdown_table(header, rows, align="lrlr").splitlines()


def train_table(bench: dict) -> list[str]:
    header = [
        "backend",
        "Lightning tok/s (min-max)",
        "plain tok/s (min-max)",
        "Lightning / plain (min-max)",
        "tok/s / scaled's (min-max)",
    ]
    rows = [
        [
            r["backend"],
            f"{_f(r['lightning_tokens_per_s'], '.0f')}{_range(r.get('lightning_range'), '.0f')}",
            f"{_f(r['plain_tokens_per_s'], '.0f')}{_range(r.get('plain_range'), '.0f')}",
            f"{_f(r['ratio'], '.3f')}{_range(r.get('ratio_range'), '.3f')}",
            f"{_f(r.get('ratio_to_scaled'), '.3f')}{_range(r.get('ratio_to_scaled_range'), '.3f')}",
        ]
        for r in bench["train"]
    ]
    return markdown_table(header, rows, align="lrrrr").splitlines()


def e2e_table(e2e: dict) -> list[str]:
    header = [
        "arm",
        "steps",
        "make train wall s (min-max)",
        "plain wall s (min-max)",
        "wall ratio (min-max)",
        "step ms: make train / plain",
        "step ratio (min-max)",
        "val/loss make train / plain",
        "outside the steps s: make train / plain",
        f"within {E2E_TARGET}",
    ]
    rows = []
    for r in e2e.get("rows", []):
        vl = r.get("val_loss") or {}
        rows.append(
            [
                f"{r['arm']} (`{' '.join(r['overrides']) or 'defaults'}`)",
                r["steps"],
                f"{_f(r['attnlab_wall_s'], '.1f')}{_range(r['attnlab_wall_range'], '.1f')}",
                f"{_f(r['plain_wall_s'], '.1f')}{_range(r['plain_wall_range'], '.1f')}",
                f"**{_f(r['wall_ratio'], '.3f')}**{_range(r['wall_ratio_range'], '.3f')}",
                f"{_f(r['attnlab_step_ms'], '.1f')} / {_f(r['plain_step_ms'], '.1f')}",
                f"{_f(r['step_ratio'], '.3f')}{_range(r['step_ratio_range'], '.3f')}",
                f"{_f((vl.get('attnlab') or [None])[0], '.4f')} / {_f((vl.get('plain') or [None])[0], '.4f')}",
                " / ".join(_f(outside_the_steps(r, side), ".1f") for side in ("attnlab", "plain")),
                _verdict(against_target(*r["wall_ratio_range"], E2E_TARGET)),
            ]
        )
    return markdown_table(header, rows, align="lrrrrrrrrl").splitlines()


def _samples(row: dict, side: str) -> list[dict]:
    """One side's runs of an e2e row ("attnlab" or "plain"), in run order."""
    return (row.get("samples") or {}).get(side) or []


def outside_the_steps(row: dict, side: str) -> float | None:
    """Median over repeats of wall time minus steps x median step: what a side spends outside its training steps
    (start-up, set-up, validation, measurements, the end). The machine's speed while stepping moves single pairs'
    ratios by several per cent; this part of the gap it moves far less."""
    values = [s["wall_s"] - s["steps"] * s["median_step_s"] for s in _samples(row, side) if s.get("steps")]
    return statistics.median(values) if values else None


def e2e_pairs(e2e: dict) -> list[str]:
    """Every pair of each arm, in run order: make train's and the plain script's wall seconds and their ratio."""
    lines = []
    for r in e2e.get("rows", []):
        pairs = ", ".join(
            f"{x['wall_s']:.1f} / {y['wall_s']:.1f} ({x['wall_s'] / y['wall_s']:.3f})"
            for x, y in zip(_samples(r, "attnlab"), _samples(r, "plain"))
        )
        if pairs:
            lines.append(f"- {r['arm']}: {pairs}")
    return lines


VERDICT_CELLS = {"met": "yes", "missed": "**no**", "open": "open"}  # timing.against_target's words in a table cell


def _verdict(verdict: str | None) -> str:
    return VERDICT_CELLS.get(verdict, "-")


def _mib_pair(pair: dict | None) -> str:
    pair = pair or {}
    return f"{_f(_mib(pair.get('default')), '.0f')} / {_f(_mib(pair.get('none')), '.0f')}"


def longctx_table(section: dict) -> list[str]:
    """One row per T: both arms' wall time, their ratio and the end-of-run share, each beside its target's verdict."""
    targets = section.get("targets") or {}
    ratio_target, share_target = targets.get("wall_ratio"), targets.get("end_share")
    header = [
        "T",
        "batch x steps",
        "default wall s (min-max)",
        "`callbacks=none` wall s (min-max)",
        "wall ratio (min-max)",
        f"<= {_f(ratio_target)}x",
        "end-of-run analysis s",
        "share of the run (min-max)",
        f"<= {_f(share_target * 100 if share_target is not None else None, '.0f')} %",
        "after the last step s: default / none",
        "peak RSS MiB: default / none",
    ]
    rows = []
    for r in section.get("rows", []):
        shape = f"{r.get('batch_size')} x {r.get('steps')}"
        if r.get("error"):
            rows.append([r["T"], shape, r["error"], *[""] * 8])
            continue
        tail = r.get("tail_s") or {}
        cuda = r.get("cuda_peak_bytes") or {}
        memory = _mib_pair(r.get("max_rss_bytes")) + (
            f" (CUDA {_mib_pair(cuda)})" if cuda.get("default") is not None else ""
        )
        rows.append(
            [
                r["T"],
                shape,
                f"{_f(r['default_wall_s'], '.1f')}{_range(r['default_wall_range'], '.1f')}",
                f"{_f(r['none_wall_s'], '.1f')}{_range(r['none_wall_range'], '.1f')}",
                f"**{_f(r['wall_ratio'], '.3f')}**{_range(r['wall_ratio_range'], '.3f')}",
                _verdict(r.get("ratio_verdict")),
                _f(r["end_s"], ".2f"),
                f"{_f(r['end_share'] * 100, '.1f')} %{_range([v * 100 for v in r['end_share_range']], '.1f')}",
                _verdict(r.get("end_verdict")),
                f"{_f(tail.get('default'), '.1f')} / {_f(tail.get('none'), '.1f')}",
                memory,
            ]
        )
    return markdown_table(header, rows, align="llrrrlrrlrr").splitlines()


LONGCTX_TARGETS = ("ratio_verdict", "end_verdict")


def longctx_outcome(section: dict) -> dict[str, dict[str, list[int]]]:
    """For each verdict (met, open, missed) and each target, the measured T that got it."""
    rows = [r for r in section.get("rows", []) if not r.get("error")]
    return {
        verdict: {key: [r["T"] for r in rows if r.get(key) == verdict] for key in LONGCTX_TARGETS}
        for verdict in ("met", "open", "missed")
    }


def longctx_verdict(section: dict) -> str:
    """The targets' outcome in words, from the rows' computed verdicts (nothing assumed)."""
    rows = [r for r in section.get("rows", []) if not r.get("error")]
    failed = [r for r in section.get("rows", []) if r.get("error")]
    if not rows:
        return "No T was measured" + (f" (T = {', '.join(str(r['T']) for r in failed)} failed)." if failed else ".")
    t = section["targets"]
    targets = {
        "ratio_verdict": f"the wall ratio <= {_f(t['wall_ratio'])}x",
        "end_verdict": f"the end-of-run analysis <= {_f(t['end_share'] * 100, '.0f')} % of the run",
    }
    outcome = longctx_outcome(section)

    def listed(verdict: str) -> str:
        """Each target with the T where its verdict is ``verdict``, joined; empty if there are none."""
        return "; ".join(
            f"{name} at T = {', '.join(map(str, outcome[verdict][key]))}"
            for key, name in targets.items()
            if outcome[verdict][key]
        )

    measured = ", ".join(str(r["T"]) for r in rows)
    sentences = [
        f"{lead}: {found}."
        for lead, found in (
            ("Missed in every pair", listed("missed")),
            ("Not resolved (pairs on both sides of the target)", listed("open")),
        )
        if found
    ]
    text = (
        " ".join(sentences) + f" Measured: T = {measured}."
        if sentences
        else f"Both targets are met in every pair at every measured T ({measured})."
    )
    if failed:
        text += f" T = {', '.join(str(r['T']) for r in failed)}: {failed[0]['error']}."
    if not section.get("complete", True):
        text += " The section did not finish: these are the rows measured before it stopped."
    few = min(r.get("repeats") or 0 for r in rows)
    if few < 3:
        text += f" {few} pair(s) per T: too few for a median to resist the machine's load; read the ranges."
    return text


def compile_table(rows: list[dict]) -> list[str]:
    header = [
        "backend",
        "eager tok/s",
        "compiled tok/s",
        "speed-up",
        "compile s",
        "eager tok/s incl. warm-up",
        "compiled tok/s incl. compile",
        "speed-up incl.",
        "max abs loss diff",
    ]
    body = []
    for r in rows:
        if r.get("error"):
            body.append([r["backend"], _f(r.get("eager_tokens_per_s"), ".0f"), r["error"], *[""] * 6])
            continue
        body.append(
            [
                r["backend"],
                _f(r["eager_tokens_per_s"], ".0f"),
                _f(r["compiled_tokens_per_s"], ".0f"),
                _f(r["speedup"], ".2f"),
                _f(r["compile_s"], ".1f"),
                _f(r["eager_tokens_per_s_incl"], ".0f"),
                _f(r["compiled_tokens_per_s_incl"], ".0f"),
                _f(r["speedup_incl"], ".3f"),
                _f(r["max_loss_diff"], ".1e"),
            ]
        )
    return markdown_table(header, body, align="lrrrrrrrr").splitlines()


def _kept_sections(merged: dict) -> list[str]:
    """The sections a --merge run kept from the earlier bench.json (older files: the three it could keep then)."""
    if "kept" in merged:
        return merged["kept"]
    return [k for k in ("kernels", "train", "callbacks") if k not in merged["rerun"]]


def _kept_provenance(merged: dict) -> str:
    """ "a, b are kept from the run of D1, c from the run of D2": each kept section beside the run that
    measured it (``merged.measured``; older files: ``kept_from`` for all)."""
    measured = merged.get("measured") or {}
    runs: dict = {}
    for section in _kept_sections(merged):
        runs.setdefault(measured.get(section) or merged["kept_from"], []).append(section)
    parts = [f"{', '.join(sections)} from the run of {run}" for run, sections in runs.items()]
    first, _, rest = parts[0].partition(" from ")
    return ", ".join([f"{first} are kept from {rest}", *parts[1:]])


def write_markdown(bench: dict, out: Path) -> Path:
    m = bench["machine"]
    # a --merge run that kept the kernels section keeps its "machine"; what this run's sections ran on is "now"
    now = (bench.get("merged") or {}).get("now")
    threads, matmul = (now["threads"], now) if now else (m["threads"], m)
    load = bench["merged"]["load"] if now else [m["load_before"], m.get("load_after") or [None]]
    lines = [
        "# attnlab benchmarks",
        "",
        f"Mode `{bench['mode']}` on {m['device']} ({m.get('cpu') or m.get('gpu') or '?'}), {threads} thread(s), "
        f"torch {m['torch']}; load average {_f(load[0][0])} before, {_f(load[1][0])} after "
        f"(the machine is shared: rerun when idle for clean numbers). Wall time {_f(bench.get('wall_s'), '.0f')} s.",
        "",
        *(
            [
                f"Sections {_kept_provenance(bench['merged'])} (`--merge`), load average "
                f"{_f(((bench['merged'].get('previous_load') or [None])[0] or [None])[0])} at its start"
                + (
                    f", {m['threads']} thread(s), matmul yardstick {_f(m['matmul_gflops'], '.1f')} GFLOP/s there."
                    if now
                    else "."
                ),
                "",
            ]
            if bench.get("merged") and _kept_sections(bench["merged"])
            else []
        ),
        f"Matmul yardstick{' (this run)' if now else ''}: {matmul['matmul_n']}x{matmul['matmul_n']} {matmul['matmul_dtype']} matmul, "
        f"median {_f(matmul['matmul_gflops'], '.1f')} GFLOP/s "
        f"(range {_f(matmul['matmul_gflops_range'][0], '.1f')}-{_f(matmul['matmul_gflops_range'][1], '.1f')}).",
        "",
    ]
    if bench.get("kernels"):  # a run of other sections only (``--sections e2e``) has no kernel rows or plots
        lines += [
            "## Kernels",
            "",
            f"One causal attention, batch {bench['kernel_setup']['batch']}, {bench['kernel_setup']['heads']} heads, "
            f"d_k {bench['kernel_setup']['head_dim']}, {bench['kernel_setup']['dtype']}; median of "
            f"{bench['kernel_setup']['repeats']} repeats after warm-up. GFLOP/s counts the useful causal work, "
            "4 B T^2 H d / 2 (backward 2.5x forward), the same for every backend; % of matmul = fwd+bwd GFLOP/s over the matmul "
            "yardstick measured again right before that row (same load). Backends alternate within each T. "
            "Peak = tensor memory allocated above the inputs (CPU: profiler allocation events; CUDA: max_memory_allocated).",
            "",
            *kernels_table(bench),
            "",
            "![time vs T](time_vs_T.png) ![memory vs T](memory_vs_T.png)",
            "",
            "## Memory scaling",
            "",
            *memory_table(bench),
            "",
        ]
    if bench.get("train"):
        s = bench["train"][0]["setup"]
        lines += [
            "## Training throughput (tiny preset)",
            "",
            f"Batch {s['batch_size']} x block {s['block_size']} = {s['tokens_per_step']} tokens/step, precision {s['precision']}, "
            f"{s['steps']} steps of which the first {s['warmup_steps']} are not counted, {s['repeats']} repeats; Lightning "
            "(`Trainer.fit`, the project's trainer config, validation off) and a plain PyTorch loop (same model, seed, "
            "batches, AdamW, schedule and clipping) alternate in one process. Ratios are taken within each repeat.",
            "",
            *train_table(bench),
            "",
        ]
    cb = bench.get("callbacks")
    if cb:
        lines += [
            "## Callback cost",
            "",
            f"`callbacks=default` ({', '.join(cb.get('callbacks', []))}; intervals {cb.get('intervals')}) against "
            f"`callbacks=none`, {cb.get('measured_steps')} measured steps after {cb.get('warmup_steps')}, {cb.get('repeats')} "
            f"repeats, backend {cb.get('backend')}: step time ratio **{_f(cb.get('overhead_ratio'), '.3f')}**"
            f"{_range(cb.get('overhead_ratio_range'), '.3f')} ({_f(cb.get('step_ms_with'))} ms vs {_f(cb.get('step_ms_without'))} ms)."
            + (
                f" Against the plain loop (same model and batches, no Lightning) in the same repeats: with the default "
                f"callbacks **{_f(cb.get('ratio_to_plain'), '.3f')}**{_range(cb.get('ratio_to_plain_range'), '.3f')}, "
                f"without {_f(cb.get('none_ratio_to_plain'), '.3f')}{_range(cb.get('none_ratio_to_plain_range'), '.3f')} "
                f"(plain {_f(cb.get('step_ms_plain'))} ms)."
                if cb.get("ratio_to_plain")
                else ""
            )
            + (
                " Time inside each callback's own hooks, ms per step: "
                + ", ".join(f"{k} {v:.2f}" for k, v in cb["hook_ms_per_step"].items())
                + "."
                if cb.get("hook_ms_per_step")
                else ""
            )
            + (
                ""
                if cb.get("representative")
                else " Not representative: the window is shorter than the callbacks' common period, so rare callbacks are over- or under-counted."
            ),
            "",
        ]
    e2e = bench.get("e2e")
    if e2e and e2e.get("rows"):
        load = e2e.get("load") or [[None]]
        lines += [
            "## End to end: the whole `make train` against a plain PyTorch script",
            "",
            "Each arm is a fresh process timed from outside: `python -m attnlab.training.train` with the defaults (W&B offline + CSV, "
            "default callbacks, progress bar, checkpoints) and the arm's overrides (in the arm column) against `attnlab.tools.bench.plain_train` (same model, corpus, seeded "
            "batches, AdamW, schedule, clipping and validation cadence; no Lightning, callbacks, loggers or checkpoints). "
            f"Arms alternate, the order flips every repeat; {e2e['repeats']} repeat(s); ratios within a repeat, median "
            "(min-max). Step ms: make train's median from results.json (tokens/s), the plain loop's median step. "
            f"Load average {_f(load[0][0])} at the start, {_f(load[-1][0])} at the end; OMP_NUM_THREADS="
            f"{e2e.get('omp_num_threads') or 'unset (torch picks)'} in every arm. Within {E2E_TARGET}: yes when every "
            "pair's ratio is, no when none is, open when the pairs fall on both sides. Outside the steps: wall time minus "
            "steps x the median step (start-up, set-up, validation, measurements, the end), median over repeats.",
            "",
            *e2e_table(e2e),
            "",
            "Pairs in run order, make train / plain wall s (ratio):",
            "",
            *e2e_pairs(e2e),
            "",
        ]
    lc = bench.get("longctx")
    if lc and lc.get("rows"):
        plan, load = lc["plan"], lc.get("load") or [[None]]
        lines += [
            "## Long context: the default callbacks against `callbacks=none`",
            "",
            f"Whole `attnlab train` runs of one token budget ({plan['budget']} training tokens: batch x T x steps the "
            f"same at every T, {plan['validations']} validations each), `{' '.join(lc['rows'][0]['overrides'])}` at the "
            f"shortest T, default callbacks against `callbacks=none`, alternated (the order flips every repeat), "
            f"{plan['repeats']} pair(s) per T; each process timed from outside. Wall ratio: default over none within "
            "each pair, median (min-max). End-of-run analysis: seconds inside the callbacks' end-of-training hooks "
            "(final head analysis with its knockout, final attention statistics and maps, final checkpoint); its share is over that run's "
            "wall time. After the last step: from the end of the last training step to the process's exit (the final "
            "validation, the end-of-run work, results.json, interpreter exit). Peak RSS: the largest over the repeats. "
            f"Targets: wall ratio <= {_f(lc['targets']['wall_ratio'])}x at every T, end-of-run analysis <= "
            f"{_f(lc['targets']['end_share'] * 100, '.0f')} % of the run; a verdict is yes when every pair is within its "
            "target, no when no pair is, open when the pairs fall on both sides (`timing.against_target`). "
            f"Load average {_f(load[0][0])} at the start, "
            f"{_f(load[-1][0])} at the end; OMP_NUM_THREADS={lc.get('omp_num_threads') or 'unset (torch picks)'}.",
            "",
            *longctx_table(lc),
            "",
            longctx_verdict(lc),
            "",
        ]
    if bench.get("compile"):
        c = bench["compile"][0]
        lines += [
            "## torch.compile",
            "",
            f"The training step (forward, backward, clipping, AdamW) of the tiny preset, eager then `torch.compile(model)` on "
            f"the same batches from the same weights, {c['steps']} steps; tok/s = median step after {c['warmup_steps']} "
            'steps; "incl." = all steps\' tokens over their total time (the compiling first steps included); compile s = the '
            "warm-up steps' time beyond the steady step.",
            "",
            *compile_table(bench["compile"]),
            "",
        ]
    if bench.get("decode") and bench["decode"].get("rows"):
        lines += ["## Decoding with the KV cache", "", *decode_table(bench["decode"]), ""]
    if bench.get("latent_train") and bench["latent_train"].get("rows"):
        lines += ["## Latent attention's training step", "", *latent_train_table(bench["latent_train"]), ""]
    path = Path(out) / "bench.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def latent_train_table(section: dict) -> list[str]:
    """bench.md's latent_train section: each arm's step time against multi-head attention's."""
    s = section["setup"]
    header = [
        "arm",
        "d_c + d_rope (d_cq)",
        "parameters",
        "ms/step",
        "step / mha's (min-max)",
        f"<= {s['target_ratio']}x",
    ]
    body = [
        [
            r["arm"],
            "-" if r["d_c"] is None else f"{r['d_c']} + {r['d_rope']} ({r['d_cq'] or '-'})",
            r["parameters"],
            _f(r["step_ms"], ".1f"),
            f"{_f(r['ratio_to_mha'])}{_range(r['ratio_range'])}",
            _verdict(r["verdict"]),
        ]
        for r in section["rows"]
    ]
    lines = [
        f"kv_frontier's model (conf/experiment/kv_frontier.yaml: {s['n_layer']} attention-only layers, d_model "
        f"{s['d_model']}, {s['n_head']} heads, block {s['block_size']}, batch {s['batch_size']}, vocabulary "
        f"{s['vocab_size']}, {s['pos_encoding']}, {s['backend']}), each latent arm its conf/variant file; a step = "
        f"forward, cross-entropy, backward, clipping, AdamW on random batches; {s['steps']} steps timed after "
        f"{s['warmup']} per arm and repeat, {s['repeats']} repeats, arms alternated (the order flips every repeat), "
        f"ratios within a repeat, medians. Target: at most {s['target_ratio']}x multi-head's step; yes when every "
        f"repeat's ratio is within it, no when none is, open otherwise. {s['threads']} torch thread(s), load average "
        f"{_f(s['load_avg_1m'][0], '.1f')} before and {_f(s['load_avg_1m'][1], '.1f')} after (a shared machine).",
        "",
        *markdown_table(header, body, align="llrrrl").splitlines(),
    ]
    if section.get("missing"):
        lines += ["", "Not measured (no conf/variant file): " + ", ".join(section["missing"]) + "."]
    return lines


def write_breakdown(result: dict, out: Path) -> Path:
    """breakdown.json (everything) and breakdown.md (the table, group totals, cProfile's top functions)."""
    atomic_write_text(
        Path(out) / "breakdown.json", json.dumps(json_safe(result, non_finite_as_null=True), indent=1) + "\n"
    )
    wall, steps = result["wall_s"], result["steps"]
    lines = [
        "# Where the time of one `make train` goes",
        "",
        f"`python -m attnlab.training.train {' '.join(result['overrides'])}` ({steps} steps), timed from outside: **{wall:.1f} s**. "
        f"Generated by `python -m attnlab.tools.bench --mode breakdown` at {result.get('created')} (git {result.get('git_sha')}) on "
        f"{result.get('cpu')} ({result.get('cpu_count')} cores, {result.get('threads')} torch threads), load average "
        f"{_f(result['load'][0][0])} before, {_f(result['load'][1][0])} after. Seconds are exclusive: a phase nested in "
        "another (a checkpoint written by a callback, a W&B call inside validation) counts only for the inner one, so "
        "the rows add up to the wall time.",
        "",
        markdown_table(
            ["group", "seconds", "share"],
            [[g, f"{sec:.2f}", f"{sec / wall * 100:.1f} %"] for g, sec in result["groups"].items()],
            align="lrr",
        ),
        "",
        markdown_table(
            ["group", "phase", "seconds", "share", "calls", "ms per call", "ms per step"],
            [
                [
                    r["group"],
                    r["phase"],
                    f"{r['seconds']:.3f}",
                    f"{r['share'] * 100:.1f} %",
                    r["calls"],
                    f"{r['ms_per_call']:.2f}",
                    f"{r['ms_per_step']:.3f}",
                ]
                for r in result["rows"]
            ],
            align="llrrrrr",
        ),
        "",
    ]
    if result.get("background_s"):
        lines += [
            "In a thread beside these rows, overlapping them (not in the sum): "
            + "; ".join(f"{name} {sec:.2f} s" for name, sec in result["background_s"].items())
            + ".",
            "",
        ]
    if result.get("cprofile_top"):
        run = result.get("cprofile_run") or {}
        lines += [
            f"Functions with the most self time in a second, cProfile'd run (`{' '.join(run.get('overrides', []))}`, "
            f"{run.get('steps')} steps, {_f(run.get('wall_s'), '.0f')} s; cProfile slows every Python call, so these "
            "seconds are not the table's):",
            "",
            markdown_table(
                ["function", "calls", "self s", "cumulative s"],
                [
                    [f"`{r['function']}`", r["calls"], f"{r['self_s']:.2f}", f"{r['cum_s']:.2f}"]
                    for r in result["cprofile_top"]
                ],
                align="lrrr",
            ),
            "",
        ]
    path = Path(out) / "breakdown.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def write_plots(bench: dict, out: Path) -> list[Path]:
    """Two small log-log PNGs: fwd+bwd time vs T and peak memory vs T, one line per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    specs = [
        ("time_vs_T.png", "fwd_bwd_ms", 1.0, "forward+backward time (ms)"),
        ("memory_vs_T.png", "peak_bytes", 1 / MIB, "peak memory, fwd+bwd (MiB)"),
    ]
    for name, key, factor, label in specs:
        fig, ax = plt.subplots(figsize=(5, 3.6), dpi=100)
        for backend in dict.fromkeys(r["backend"] for r in bench["kernels"]):
            pts = sorted((r["T"], r[key] * factor) for r in bench["kernels"] if r["backend"] == backend and r.get(key))
            if pts:
                style = "--" if backend in ("naive", "flash") else "-"  # naive/scaled and sdpa/flash may coincide
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=backend)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(out) / name
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
