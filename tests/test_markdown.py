"""One Markdown table writer for every report."""

from attnlab.writing.markdown import markdown_table


def test_cells_are_escaped_and_columns_aligned():
    table = markdown_table(["T", "peak | MiB"], [[1024, "a|b"], [8192, 3.5]], align="lr")
    assert table.splitlines() == ["| T | peak \\| MiB |", "|---|---:|", "| 1024 | a\\|b |", "| 8192 | 3.5 |"]


def test_default_alignment_is_left_and_rows_may_be_empty():
    assert markdown_table(["a", "b"], []) == "| a | b |\n|---|---|"
