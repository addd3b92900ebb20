"""README.md is the front door and docs/ the reference: every relative link resolves.

Links and headings are read with markdown-it-py (CommonMark), so a ``#`` line inside a
code block is no heading and a bracket inside code is no link. An ``#anchor`` must
match a heading of the target page by GitHub's slug rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 260
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def pages() -> list[Path]:
    """README.md and every page in docs/."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _tokens(text: str) -> Iterator[Token]:
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        yield token
        yield from token.children or ()


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings, duplicates numbered as GitHub numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text())
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type != "heading_open":
            continue
        text = "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    """Every link and image target of a page."""
    out = []
    for token in _tokens(path.read_text()):
        target = token.attrGet("href") if token.type == "link_open" else None
        if token.type == "image":
            target = token.attrGet("src")
        if isinstance(target, str):
            out.append(target)
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``path`` whose file, or whose heading anchor, does not exist."""
    bad = []
    for target in links(path):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            bad.append(f"{path.relative_to(root)}: {target} (no heading #{anchor} in {dest.name})")
    return bad


def test_every_relative_link_resolves() -> None:
    checked = pages()
    assert len(checked) >= 15
    bad = [b for page in checked for b in broken_links(page)]
    assert bad == [], "broken links:\n" + "\n".join(bad)


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference to docs/"
    targets = links(ROOT / "README.md")
    assert "docs/README.md" in targets
    assert any(t.startswith("docs/") and t.endswith(".png") for t in targets), "the README shows no picture"


def test_the_docs_index_lists_every_page() -> None:
    listed = {t.partition("#")[0] for t in links(DOCS / "README.md")}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and p.name not in listed]
    assert missing == [], f"docs/README.md does not link {missing}"


@pytest.mark.parametrize(("heading", "expected"), [
    ("3a. Terms over embeddings: pair terms", "3a-terms-over-embeddings-pair-terms"),
    ("Collapse statistics: run.log_embeddings", "collapse-statistics-runlog_embeddings"),
    ("Compare 2–N runs", "compare-2n-runs"),
    ("The lake: many machines", "the-lake-many-machines"),
])
def test_slugs_follow_githubs_rule(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Only `this` heading\n\n```\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#only-this-heading) [gone](c.md) [no anchor](b.md#not-a-heading) "
                    "[self](#nowhere) [web](https://example.com/x.md) `[code](d.md)`\n")
    assert broken_links(page, root=tmp_path) == [
        "a.md: c.md (no such file)",
        "a.md: b.md#not-a-heading (no heading #not-a-heading in b.md)",
        "a.md: #nowhere (no heading #nowhere in a.md)",
    ]
