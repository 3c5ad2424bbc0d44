"""The README stays a README, and every link in it, in docs/ and in the dated records of
benchmarks/results/records/ leads somewhere.

A relative link must name a file of the repository; a `#fragment` must name a heading of
its target (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, a
repeated heading numbered -1, -2, ...). Links inside code blocks and inline code are not
links; absolute URLs (http, mailto) are not checked (no network here).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks" / "results" / "records").glob("*.md")),
]

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return [
        target
        for line in _prose_lines(path.read_text(encoding="utf-8"))
        for target in _LINK.findall(_INLINE_CODE.sub("", line))
    ]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists() or not resolved.is_relative_to(root):
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return broken


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_checker_sees_a_broken_link_and_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading!\n\n## Twice\n## Twice\n")
    page.write_text(
        "[ok](other.md#a-code-heading) [ok](other.md#twice-1) [ok](#top-title)\n"
        "# Top title\n[gone](missing.md) [bad](other.md#nope) `[not](a-link.md)`\n"
        "```\n[in](code.md)\n```\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "missing.md: no such file", "other.md#nope: no heading #nope in other.md"
    ]  # fmt: skip
    assert anchors(tmp_path / "other.md") == {"other", "a-code-heading", "twice", "twice-1"}
    assert links(page) == [
        "other.md#a-code-heading", "other.md#twice-1", "#top-title", "missing.md", "other.md#nope"
    ]  # fmt: skip
    assert "top-title" in anchors(page)
