"""No result typed by hand: a seed or run count, a k of n, a p-value, an effect or a measured time in
docs/*.md, the README outside its rendered blocks, or a config comment fails, with its line named. A
number of the method is allowed where this test ties it to the code that uses it (``TIED``), and an
estimate labelled as one where the page derives it from a formula (``ESTIMATES``); results live in the
reports, which code renders from their data."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnlab.repro.streaming_claims import MIN_SEEDS
from attnlab.sweeps.plan import PILOT_SEEDS
from attnlab.util import significance

ROOT = Path(__file__).resolve().parents[1]

# what a result looks like when typed into prose
RESULT = re.compile(
    r"""(?x)
      \b\d+(?:-\d+)?\ (?:seeds?|runs?)\b                      # a seed or run count
    | \b\d+\ of\ \d+\b                                        # k of n
    | \bp\ ?(?:<|=|≤|>)\ ?0?\.\d+ | \bHolm\ p\ \d              # a p-value
    | \b\d+(?:\.\d+)?\ ?(?:H100-hours|hours|minutes|min)\b    # a measured or priced time
    | (?<![\w.])[+−-]\d*\.\d+\ (?:nats|lower|higher)          # an effect
    | \b\d+(?:\.\d+)?x\ (?:faster|slower|multi-head|mha)\b    # a speed ratio
    """
)

# (page, the text matched) -> the code's value it must equal: a number of the method, not a result
TIED = {
    ("docs/inference.md", "p < 0.05"): (0.05, significance.ALPHA),
    ("docs/inference.md", "3 seeds"): (3, MIN_SEEDS),
    ("docs/studies.md", "2 seeds"): (2, PILOT_SEEDS),
}
# (page, the text matched): what the page derives from a formula it states, under an **Estimated** label
ESTIMATES = {
    ("docs/data.md", "1.5 H100-hours"),
    ("docs/data.md", "180 H100-hours"),
    ("docs/data.md", "6 H100-hours"),
    ("docs/data.md", "1.3 H100-hours"),
}


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of what a reader reads as prose: a Markdown page outside its rendered blocks
    (``<!-- name:start -->`` to ``<!-- name:end -->``), or the comments of a YAML file."""
    out, rendered = [], False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.search(r"<!-- [\w-]+:start -->", line):
            rendered = True
        elif re.search(r"<!-- [\w-]+:end -->", line):
            rendered = False
        elif path.suffix == ".yaml":
            if "#" in line:
                out.append((i, line[line.index("#") :]))
        elif not rendered:
            out.append((i, line))
    return out


def typed_results(path: Path, rel: str) -> list[str]:
    """``rel:line: text`` for every result-like number that is neither tied to the code nor a labelled estimate."""
    found = []
    for i, text in prose(path):
        for match in RESULT.finditer(text):
            key = (rel, match.group(0))
            if key not in TIED and key not in ESTIMATES:
                found.append(f"{rel}:{i}: {match.group(0)!r} in {text.strip()[:100]!r}")
    return found


def pages() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "conf").rglob("*.yaml"))]


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_result_is_typed_by_hand(path):
    found = typed_results(path, str(path.relative_to(ROOT)))
    assert not found, "a result belongs in a report rendered from its data; link it:\n" + "\n".join(found)


@pytest.mark.parametrize("key", sorted(TIED))
def test_a_number_of_the_method_equals_the_code(key):
    written, code = TIED[key]
    assert written == code, f"{key[0]} says {key[1]!r}; the code says {code}"
    assert key[1] in (ROOT / key[0]).read_text(encoding="utf-8"), f"{key[0]} no longer says {key[1]!r}: drop it here"


def test_estimates_are_labelled_and_still_there():
    for page, text in ESTIMATES:
        body = (ROOT / page).read_text(encoding="utf-8")
        assert text in body and "**Estimated**" in body, (page, text)


@pytest.mark.parametrize(
    "line",
    [
        "Five seeds a side would detect it; 3 seeds a side do.",
        "# question: 6 cells x 3 seeds",
        "qk-norm lowers it (Holm p 0.024), -0.233 lower at proxy_m",
        "mqa learned in 2 of 5 runs",
        "the sweep takes about 42 H100-hours",
    ],
)
def test_a_hand_typed_result_added_to_a_page_fails(tmp_path, line):
    page = tmp_path / ("config.yaml" if line.startswith("#") else "page.md")
    page.write_text(
        f"Some method text.\n{line}\n<!-- findings:start -->\n3 of 5 runs, rendered\n<!-- findings:end -->\n"
    )
    found = typed_results(page, page.name)
    assert len(found) >= 1 and all(f.startswith(f"{page.name}:2:") for f in found)
