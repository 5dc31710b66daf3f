"""Prose that agrees with the code and the data: every command, make target, config key, preset and
repository path that README.md, docs/ and the config files' comments name exists; each study has one
attention-free level, read alike by its plan and its report; a plan quotes its reference cell; each study
page carries its plan's verdict and names the axes that vary; the README stays a door (its length and its
findings' length)."""

from __future__ import annotations

import html
import json
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from attnlab.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGS = sorted(p for p in CONF.rglob("*.yaml"))
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")


def comments(path: Path) -> str:
    """A YAML file's comments without the '#', one a line (the text a reader of the config reads)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if "#" in line and not line.lstrip().startswith("# @package"):
            out.append(line.split("#", 1)[1].strip())
    return "\n".join(out)


def comments_of(text: str) -> str:
    """``comments`` of a string, for the matchers' own tests."""
    return "\n".join(line.split("#", 1)[-1].strip() for line in text.splitlines())


def code(text: str) -> list[str]:
    """A page's code: each line of its fenced blocks and each `span`, a string apiece (so a string's start is
    where a command starts)."""
    lines = [line.strip() for m in FENCE.finditer(text) for line in m.group(0).splitlines()[1:-1]]
    return lines + SPAN.findall(FENCE.sub("", text))


def texts() -> list[tuple[str, list[str]]]:
    """(name, the strings to search): a page's code, or a config file's comments as running prose (a comment
    line's start is not a command's start)."""
    pages = [(str(p.relative_to(ROOT)), code(p.read_text(encoding="utf-8"))) for p in PAGES]
    return pages + [(str(p.relative_to(ROOT)), [" " + comments(p)]) for p in CONFIGS]


TEXTS = texts()
IDS = [name for name, _ in TEXTS]


# ---------------------------------------------------------------- commands and make targets
# `attnlab X` at the start of a code span or a command line, or after a word that introduces a command in a
# comment ("then attnlab X", "(attnlab X"): never "attnlab is ..." in running prose
COMMAND = re.compile(r"(?:^|[`(]|\$ |then |bin/)attnlab ([a-z][a-z0-9-]*)")
# a make command may start a comment's line; an attnlab one may not ("attnlab training config")
MAKE = re.compile(r"(?:^|[`(]|\$ |then |, )make ([a-z][a-z0-9-]*)((?: [A-Z]+=\S+)*)", re.MULTILINE)
MAKE_VAR = re.compile(r"^([A-Z][A-Z_]*)\s*[?:]?=", re.MULTILINE)


def makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.MULTILINE)), set(MAKE_VAR.findall(text))


def test_the_matchers_read_commands_and_skip_prose():
    comment = " " + comments_of("attnlab is an instrument: `attnlab stream-study DIR`, then attnlab plan x")
    assert COMMAND.findall(comment) == ["stream-study", "plan"]
    assert [c for s in code("```bash\nattnlab sweep --study x\n```\n") for c in COMMAND.findall(s)] == ["sweep"]
    assert [m[0] for m in MAKE.findall("`make sweep SWEEP=x SEEDS=3`, then make report; to make sure")] == [
        "sweep",
        "report",
    ]
    assert MAKE.findall(" " + comments_of("# A study.\n# make sweep SWEEP=x SEEDS=3"))[0] == (
        "sweep",
        " SWEEP=x SEEDS=3",
    )


@pytest.mark.parametrize("name, strings", TEXTS, ids=IDS)
def test_every_attnlab_command_named_exists(name, strings):
    named = {c for s in strings for c in COMMAND.findall(s)}
    assert not named - set(COMMANDS), f"{name} names attnlab commands the CLI lacks: {sorted(named - set(COMMANDS))}"


@pytest.mark.parametrize("name, strings", TEXTS, ids=IDS)
def test_every_make_target_and_variable_named_exists(name, strings):
    targets, variables = makefile()
    found = [m for s in strings for m in MAKE.findall(s)]
    missing = {t for t, _ in found} - targets
    assert not missing, f"{name} names make targets the Makefile lacks: {sorted(missing)}"
    unknown = {v.split("=")[0] for _, vs in found for v in vs.split()} - variables
    assert not unknown, f"{name} sets make variables the Makefile does not read: {sorted(unknown)}"


# ---------------------------------------------------------------- config keys and presets
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")
# a dotted key of a config section: model.attention.scaling, data.bos, question.learned; not a file name
# (model.py) nor part of a path or a module (attnlab.model.gpt, conf/model.x)
KEY = re.compile(
    r"(?<![\w./-])((?:model|optim|trainer|data|callbacks|checkpoint|question|logger)(?:\.[a-z_]\w*)+)"
    r"(?!\.?\w*\()(?![\w/-])"
)
FILE_SUFFIX = re.compile(r"\.(?:py|yaml|md|json|csv|png|txt|bin|pkl|j2|html)$")
# a preset chosen on the command line: attention=sdpa, experiment=kv_frontier, model=proxy_s
PRESET = re.compile(rf"(?<![\w./+~-])({'|'.join(GROUPS)})=([a-z_][\w]*)\b(?![.\w])")
STUDY_VAR = re.compile(r"\b(?:SWEEP|STUDY)=([a-z_]\w*)")


def _flat(node, prefix: str = ""):
    for key, value in (node or {}).items():
        yield prefix + str(key)
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")


@cache
def known_keys() -> frozenset[str]:
    """The schema's keys, the default composed config's, and every key a config file sets, under the package
    it sets it in (a preset of conf/data/ sets data.*, an experiment's keys are global)."""
    from omegaconf import OmegaConf

    from attnlab.config.compose import compose_config
    from attnlab.config.schema import walk

    keys = {key for key, _, _ in walk()}
    keys |= set(_flat(OmegaConf.to_container(compose_config([]), resolve=False)))
    for path in CONFIGS:
        if path.parent.parent.name == "hydra" or path.parent.name == "hydra":
            continue
        text = path.read_text(encoding="utf-8")
        glob = "@package _global_" in text or path.parent == CONF
        prefix = "" if glob else ".".join(path.relative_to(CONF).parts[:-1]) + "."
        keys |= {prefix + k for k in _flat(yaml.safe_load(text))}
    return frozenset(keys)


def test_the_key_matcher_reads_keys_and_skips_files_and_modules():
    found = KEY.findall("model.attention.scaling and `data.bos=true`, model.py, attnlab.model.gpt, conf/data.x")
    assert [k for k in found if not FILE_SUFFIX.search(k)] == ["model.attention.scaling", "data.bos"]
    assert PRESET.findall("`attention=sdpa` experiment=kv_frontier hydra/launcher=slurm ~callbacks.x") == [
        ("attention", "sdpa"),
        ("experiment", "kv_frontier"),
    ]


@pytest.mark.parametrize("name, strings", TEXTS, ids=IDS)
def test_every_config_key_named_exists(name, strings):
    named = {k for s in strings for k in KEY.findall(s) if not FILE_SUFFIX.search(k)}
    unknown = sorted(named - known_keys())
    assert not unknown, f"{name} names config keys that no config or schema holds: {unknown}"


@pytest.mark.parametrize("name, strings", TEXTS, ids=IDS)
def test_every_preset_and_study_named_exists(name, strings):
    presets = {(g, v) for s in strings for g, v in PRESET.findall(s)}
    presets |= {("experiment", v) for s in strings for v in STUDY_VAR.findall(s)}
    page = (ROOT / name).read_text(encoding="utf-8")  # a preset the page writes itself (my_conf/experiment/x.yaml)
    missing = sorted(
        f"{g}={v}" for g, v in presets if not (CONF / g / f"{v}.yaml").is_file() and f"{g}/{v}.yaml" not in page
    )
    assert not missing, f"{name} names presets conf/ lacks: {missing}"


# ---------------------------------------------------------------- repository paths
TOP = ("reports", "src", "conf", "docs", "tests", "sweeps")
PACKAGES = sorted(p.name for p in (ROOT / "src" / "attnlab").iterdir() if p.is_dir() and p.name != "__pycache__")
# a path from the repository root (reports/kv_frontier/plan.md), or a module's path inside the package
# (studies/report/render.py, attnlab/util/significance.py); a placeholder (<study>, *, ...) names no one file
# (a path a command is told to write, --out PATH, need not exist)
REPO_PATH = re.compile(rf"(?<![\w./<-])(?<!--out )(?<!--reports )((?:{'|'.join(TOP)})/[\w./-]*[\w/])")
PACKAGE_PATH = re.compile(rf"(?<![\w./<-])((?:attnlab/)?(?:{'|'.join(PACKAGES)})/[\w/.-]*\.(?:py|j2))\b")
# where a command writes on demand; never committed (logs/ and the CUDA check's and fast modes' output)
WRITTEN = ("reports/gpu", "reports/compare", "reports/bench/fast", "reports/repro/fast")
# the files a worked example of docs/development.md creates (tests/test_worked_examples.py follows them)
EXAMPLES = tuple(
    m.group(1)
    for m in re.finditer(r"<!-- worked-example \w+: create (\S+) -->", (ROOT / "docs" / "development.md").read_text())
)


def prose(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.suffix == ".md" else comments(path)


def test_the_path_matchers_read_paths_and_skip_placeholders():
    text = "reports/kv_frontier/plan.md, reports/<study>/x, studies/report/render.py, see docs/gpu.md."
    assert REPO_PATH.findall(text) == ["reports/kv_frontier/plan.md", "docs/gpu.md"]
    assert PACKAGE_PATH.findall(text) == ["studies/report/render.py"]


@pytest.mark.parametrize("path", [*PAGES, *CONFIGS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(path):
    text = prose(path)
    missing = [
        p
        for p in REPO_PATH.findall(text)
        if not (ROOT / p).exists() and not any(p == w or p.startswith(w + "/") for w in WRITTEN) and p not in EXAMPLES
    ]
    missing += [
        p
        for p in PACKAGE_PATH.findall(text)
        if not (ROOT / "src" / p).exists() and not (ROOT / "src" / "attnlab" / p).exists()
    ]
    assert not missing, f"{path.relative_to(ROOT)} names paths the repository lacks: {missing}"


# ---------------------------------------------------------------- the studies' data
PLANNED = sorted(p.parent.name for p in (ROOT / "reports").glob("*/plan.json"))


def _json(study: str, name: str) -> dict:
    return json.loads((ROOT / "reports" / study / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("study", PLANNED)
def test_a_study_has_one_attention_free_level(study):
    """The plan reads the level its report computed: the same number, not a second fit with another seed."""
    plan, summary = _json(study, "plan.json"), _json(study, "summary.json")
    report = (summary.get("attention_free_level") or {}).get("bigram")
    assert plan["attention_free_level"] == report, (study, plan["attention_free_level"], report)


def _reference_cells(plan: dict, summary: dict) -> list[dict]:
    """The cells of summary.json that are the reference side of a comparison: at the reference level, with a
    cell that differs from them on the compared axis alone."""
    axis, levels = plan["comparisons"][0]["comparison"].split(": ", 1)
    reference = levels.split(" vs ")[1]
    cells = summary["cells_ci95"]

    def rest(c):
        return {k: v for k, v in c["axes"].items() if k != axis}

    return [
        c
        for c in cells
        if c["axes"].get(axis) == reference
        and any(d["axes"].get(axis) != reference and rest(d) == rest(c) for d in cells)
    ]


@pytest.mark.parametrize("study", [s for s in PLANNED if _json(s, "plan.json")["comparisons"]])
def test_a_plan_quotes_its_reference_cell(study):
    """The reference arm's val loss and answer accuracy in plan.json are a reference cell's, not another
    cell's at the reference level that no other level is compared with (sinks_bb's sigmoid cell)."""
    plan, summary = _json(study, "plan.json"), _json(study, "summary.json")
    refs = _reference_cells(plan, summary)
    assert refs, study
    for key, metric in (("reference_val_loss", "val/loss"), ("reference_val_acc", "val/acc")):
        if plan[key] is None:
            continue
        means = [m["mean"] for c in refs if (m := c["metrics"].get(metric))]
        assert any(plan[key] == pytest.approx(m, rel=1e-9) for m in means), (study, key, plan[key], means)


@pytest.mark.parametrize("study", PLANNED)
def test_each_study_page_carries_its_plan_verdict(study):
    verdict = _json(study, "plan.json")["verdict"]
    for page in ("index.html", "ablation.md"):
        text = (ROOT / "reports" / study / page).read_text(encoding="utf-8")
        assert verdict in html.unescape(text), (study, page)


STUDY_PAGES = sorted(p.parent.name for p in (ROOT / "reports").glob("*/index.html"))


@pytest.mark.parametrize("study", [s for s in STUDY_PAGES if (ROOT / "reports" / s / "runs.csv").is_file()])
def test_a_study_page_title_names_the_axes_that_vary(study):
    """Every axis in the title takes two or more values in the study's runs; every such axis is there."""
    from attnlab.studies.report.data import axes_of, read_runs
    from attnlab.writing.pages import short

    frame = read_runs(ROOT / "reports" / study / "runs.csv")
    frame = frame[frame["budget"] == frame["budget"].iloc[0]]
    varying = {short(a) for a in axes_of(frame) if frame[a].nunique() > 1}
    title = re.search(r"<h1>(.*?)</h1>", (ROOT / "reports" / study / "index.html").read_text()).group(1)
    named = set(html.unescape(title).split(": ", 1)[1].split(" × ")) - {"one cell"}
    assert named == varying, (study, named, varying)


@pytest.mark.parametrize("study", [s for s in STUDY_PAGES if (ROOT / "reports" / s / "runs.csv").is_file()])
def test_a_study_page_leads_with_its_questions_figure(study):
    """The first figure is the study's own where it has one (render.FIGURES, in order), and never a plot
    against an axis whose cells take one value (every arm at one x)."""
    from attnlab.studies.report.data import axes_of, read_runs
    from attnlab.studies.report.render import FIGURES
    from attnlab.writing.pages import short

    out = ROOT / "reports" / study
    first = re.search(r"<figcaption>(.*?)</figcaption>", (out / "index.html").read_text())
    if first is None:
        return  # a page without figures
    own = [name for name in FIGURES if (out / name).is_file()]
    if own:
        assert first.group(1) == own[0][: -len(".png")], (study, first.group(1), own[0])
    frame = read_runs(out / "runs.csv")
    single = {short(a) for a in axes_of(frame) if frame[a].nunique() == 1}
    assert not ("_vs_" in first.group(1) and first.group(1).split("_vs_")[1] in single), (study, first.group(1))


# ---------------------------------------------------------------- the README as a door
README_WORDS = 1200
FINDING_WORDS = 60


def findings() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Findings")
    block = text[start : text.index("\n## ", start + 1)]
    return re.findall(r"^- .*?(?=^- |^\s*$|\Z)", block, re.MULTILINE | re.DOTALL)


def words(text: str) -> int:
    """Words as a reader counts them: a link's target and markup are not words."""
    return len(re.sub(r"\]\([^)]*\)", "]", text).split())


def test_the_readme_is_read_in_five_minutes():
    assert words((ROOT / "README.md").read_text(encoding="utf-8")) <= README_WORDS


def test_each_finding_is_one_or_two_sentences_with_its_report():
    found = findings()
    assert found
    for finding in found:
        assert words(finding) <= FINDING_WORDS, (words(finding), finding[:80])
        assert "](reports/" in finding, finding[:80]
