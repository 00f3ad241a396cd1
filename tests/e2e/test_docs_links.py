"""The README's first screen and the guides in docs/: the README stays short, every guide is reachable from it, and
every relative link (and its #anchor, into our own pages) leads somewhere. Reads text only: fast, offline."""

import re
from pathlib import Path

import pytest
from support import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: Path) -> str:
    """The page without its code: fenced blocks and inline code spans hold commands, not links."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    found = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", prose(path), flags=re.MULTILINE):
        found.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return found


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:


def test_the_readme_is_one_short_page():
    assert len(README.read_text().splitlines()) < 200


def test_every_guide_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(README)}
    assert len(PAGES) > 5
    for page in PAGES[1:]:
        assert page.resolve() in linked, page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    targets = links(page)
    assert targets
    for target in targets:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: {target}"
        if anchor and file in {p.resolve() for p in PAGES}:
            assert anchor in anchors(file), f"{page.name}: {target}"


def test_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Pre-training objectives (Table 5)\n\n## The quick start, in detail\n\n```\n# no heading\n```")
    assert anchors(page) == {"pre-training-objectives-table-5", "the-quick-start-in-detail"}
