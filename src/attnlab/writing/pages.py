"""How the studies' pages are written: the formats of numbers, intervals and p-values, the words for metrics
and verdicts, and the one Jinja2 environment that renders every page from templates/ (a study's ablation.md,
index.html and stream.md, repro.md and its README section, the README's findings block).

Three number formats, each the habit of the pages that use it: ``plain`` and ``mean_ci`` (a study report: a
value to its seeds' precision), ``sig`` (the findings: significant digits, a true minus sign) and ``fmt``
(repro tables: four decimals, scientific for tiny or huge values). The statistics are attnlab.util.significance.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable
from pathlib import Path

import jinja2
import markupsafe

from attnlab.util import significance
from attnlab.writing.markdown import markdown_table

LABELS = {
    "val/loss": "val loss",
    "val/acc": "val acc",
    "perf/tokens_per_s": "tokens/s",
    "mem/peak_bytes": "peak MiB",
    "val/copy/acc": "copy acc",
    "val/bigram/loss": "bigram loss",
    "mem/kv_cache_bytes_per_token": "KV cache B/token",
    "heads/induction_max": "induction (best head)",
    "heads/repeat_acc": "repeat acc (probe)",
    "heads/in_context_score": "in-context score",
    "heads/induction_control_max": "induction control (best head)",
    "attn/L0/sink_mass_dormant": "first-token weight, dormant queries (L0)",
    "lr_sensitivity": "LR sensitivity",
    "lr_sensitivity_upper": "LR sensitivity above the best rate",
}
# a claim's verdicts, in the order a tally lists them (the repro's, and the findings' count of them)
AGREES, PARTLY, DEPENDS, DIFFERS, UNTESTED = "agrees", "partly", "depends", "differs", "untested"
VERDICTS = (AGREES, PARTLY, DEPENDS, DIFFERS, UNTESTED)
# a verdict as a sentence reads it; every other verdict is its own word
WORDS = {v: v for v in ("lower", "higher", "larger", "smaller", "raises", "lowers", "untested", "earlier", "later")}
WORDS |= {"fewer": "fewer runs learned", "more": "more runs learned"}
WORDS["none"] = "no difference beyond seed noise"


def short(key: str) -> str:
    """model.attention.scaling -> scaling: the last name of a key is what people call the axis."""
    return key.rsplit(".", 1)[-1]


def where(axes: dict) -> str:
    """A cell by its axes' short names ("d_k=16, scaling=none"); "all" without axes."""
    return ", ".join(f"{short(k)}={v}" for k, v in axes.items()) or "all"


def label(key: str) -> str:
    return LABELS.get(key, key)


# A study report prints an interval's half-width (or a std) to two significant digits and the mean rounded
# to the same decimal place, so a reader never sees digits that seed noise makes meaningless.
def plain(value: float | None, digits: int = 3) -> str:
    """A single value (no spread known): fixed digits, scientific-style for tiny ones, none for big ones."""
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) >= 1000 or (abs(value) >= 10 and float(value).is_integer()):  # a count or a size: no decimals
        return f"{value:.0f}"
    return f"{value:.{digits}g}" if abs(value) < 0.01 else f"{value:.{digits}f}"


def std_decimals(std: float) -> int:
    """Decimal places that show ``std`` to two significant digits (negative: round to tens, hundreds, ...)."""
    places = 1 - math.floor(math.log10(abs(std)))
    if abs(round(std, places)) >= 10 ** (2 - places):  # 0.0996 rounds to 0.10: one place fewer
        places -= 1
    return places


def _fixed(value: float, places: int, sign: str = "") -> str:
    return f"{round(value, places) + 0.0:{sign}.{max(places, 0)}f}"  # + 0.0 turns -0.0 into 0.0


def mean_ci(mean: float | None, interval: tuple[float, float] | None = None, scale: float = 1.0) -> str:
    """ "mean [lo, hi]" to the interval's precision; the mean alone without an interval, "-" without a value."""
    if mean is None or not math.isfinite(mean):
        return "-"
    if interval is None or not interval[1] > interval[0]:
        return plain(mean * scale)
    lo, hi = interval[0] * scale, interval[1] * scale
    places = std_decimals((hi - lo) / 2)
    return f"{_fixed(mean * scale, places)} [{_fixed(lo, places)}, {_fixed(hi, places)}]"


def signed_ci(diff: float, lo: float | None = None, hi: float | None = None) -> str:
    """A difference with its 95 % interval, "+0.115 [+0.103, +0.127]"; the difference alone without one."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return f"{diff:+.3g}"
    places = max(std_decimals((hi - lo) / 2), 0)
    return f"{_fixed(diff, places, '+')} [{_fixed(lo, places, '+')}, {_fixed(hi, places, '+')}]"


def sig(x: float | None, digits: int = 2, sign: bool = False) -> str:
    """x to ``digits`` significant digits in fixed notation (0.0023, 0.33, 599470), with a true minus sign."""
    if x is None or not math.isfinite(x):
        return "n/a"
    places = 0 if x == 0 else max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:{'+' if sign else ''}.{places}f}".replace("-", "−")


def p_text(p: float | None, fixed: bool = False) -> str:
    """A p-value to two significant digits, "< 0.001" below that; ``fixed`` keeps trailing zeros (0.50, 1.0)."""
    if p is None:
        return "-"
    return "< 0.001" if p < 0.001 else sig(p) if fixed else f"{p:.2g}"


def k_of_n_text(k: int, n: int, unit: str = "seeds") -> str:
    """'8 of 10 seeds (95 % Wilson interval 0.49-0.94)': a bimodal outcome as a count with its uncertainty."""
    lo, hi = significance.wilson(k, n)
    return f"{k} of {n} {unit} (95 % Wilson interval {lo:.2f}-{hi:.2f})"


def fmt(x, digits: int = 4) -> str:
    """A value for a repro table cell: fixed for ordinary sizes, scientific for tiny or huge ones."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return "-" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10_000 else str(x)
    if isinstance(x, (list, tuple)):
        return ", ".join(fmt(v, digits) for v in x)
    if isinstance(x, dict):
        return ", ".join(f"{k}: {fmt(v, digits)}" for k, v in x.items())
    if not math.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) < 10 ** -(digits - 1) or abs(x) >= 1e6):
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def span(values: Iterable[float | None], digits: int = 3) -> str:
    """A per-seed value as its range over the seeds ('0.981 to 0.998'), or the one value."""
    xs = [x for x in values if x is not None]
    if not xs:
        return "-"
    lo, hi = fmt(min(xs), digits), fmt(max(xs), digits)
    return lo if lo == hi else f"{lo} to {hi}"


def cell(x) -> str:
    """A value as a Markdown table cell: formatted, on one line, its pipes escaped."""
    return fmt(x).replace("\n", " ").replace("|", "\\|")


def md_table(t: dict) -> str:
    """A {"columns", "rows"} table as Markdown, each value formatted by ``fmt`` (text stays as it is)."""
    return markdown_table(t["columns"], [[fmt(x) for x in row] for row in t["rows"]])


def paragraph(text: str) -> str:
    """A paragraph wrapped in a template as one line: a line break between two lines of text becomes a space."""
    return re.sub(r"(?<=\S) *\n *(?=\S)", " ", text)


def md_inline(text: str) -> markupsafe.Markup:
    """A line of Markdown's inline code and links as HTML (escaped first): the one sentence a page shares
    with its Markdown twin."""
    html = str(markupsafe.escape(text))
    html = re.sub(r"`([^`]+)`", r"<code>\1</code>", html)
    return markupsafe.Markup(re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', html))


TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("attnlab.writing", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=jinja2.select_autoescape(["html.j2"], default_for_string=False),
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.globals["words"] = WORDS
TEMPLATES.filters.update(
    num=plain,
    sig=sig,
    p=p_text,
    cell=cell,
    signed=lambda t: signed_ci(t.diff, t.lo, t.hi),
    md_table=md_table,
    md_inline=md_inline,
    paragraph=paragraph,
    label=label,
    short=short,
    where=where,
    b64=lambda p: base64.b64encode(Path(p).read_bytes()).decode(),
)
