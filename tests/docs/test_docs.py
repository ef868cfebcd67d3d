"""The docs stay regenerable: the benchmark page's prose lives in bench/analysis.md."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_benchmark_page_prose_survives_regeneration() -> None:
    # report.py writes the tables, then appends bench/analysis.md as is: every hand-written
    # section of the page must therefore be in that file, or the next run erases it
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    prose = (REPO / "bench" / "analysis.md").read_text(encoding="utf-8").strip()
    assert page.rstrip().endswith(prose)
    tables_part = page[: page.index(prose)]
    assert "## Reading the results" not in tables_part
