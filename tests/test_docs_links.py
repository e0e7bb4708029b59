"""Every link between the docs (README.md, docs/**/*.md) leads somewhere: the file exists and,
for a Markdown page, the #anchor is one of its headings (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # not in code
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.*)$", text, re.M)}


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", link):
                continue  # https:, mailto:
            path, _, frag = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(REPO)}: {link}: no such file")
            elif frag and target.suffix == ".md" and frag not in anchors(target):
                broken.append(f"{page.relative_to(REPO)}: {link}: no such heading")
    assert not broken, "\n".join(broken)
