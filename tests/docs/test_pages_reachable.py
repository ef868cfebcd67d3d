"""Every page of docs/ is reachable: linked from the home page and listed in the site's
navigation."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def _pages() -> set[str]:
    return {p.name for p in DOCS.glob("*.md")}


def _nav_pages(nav: object) -> set[str]:
    """Every page a mkdocs ``nav`` names, however nested."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(value) for value in nav.values())) if nav else set()
    return set()


def test_the_home_page_links_every_page() -> None:
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]+)?\)", text))
    assert _pages() - {"index.md"} - linked == set()
    assert linked - _pages() == set()  # and nothing it links is missing


def test_the_navigation_lists_every_page() -> None:
    config = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"),
                       Loader=yaml.BaseLoader)
    listed = _nav_pages(config["nav"])
    assert _pages() - listed == set()
    assert listed - _pages() == set()
