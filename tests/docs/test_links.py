"""Every relative markdown link in README.md and docs/ points at a file (and heading) that exists.

Design pages link into their results and history files; a page split or a renamed heading
must not leave a reader at a dead link.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _unfenced_lines(path: Path):
    fence = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield number, line


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _unfenced_lines(path):
        match = _HEADING.match(line)
        if match:
            slug = _slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken_links(root: Path) -> list[str]:
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    anchors: dict[Path, set[str]] = {}
    broken = []
    for source in files:
        for number, line in _unfenced_lines(source):
            for match in _LINK.finditer(line):
                target = match.group(1)
                if re.match(r"^[a-z]+:", target) or target.startswith("//"):
                    continue
                path, _, anchor = target.partition("#")
                dest = (source.parent / path).resolve() if path else source
                where = f"{source.relative_to(root)}:{number}"
                if not dest.exists():
                    broken.append(f"{where}: no file {target}")
                elif anchor and dest.suffix == ".md":
                    if dest not in anchors:
                        anchors[dest] = _anchors(dest)
                    if anchor not in anchors[dest]:
                        broken.append(f"{where}: no heading #{anchor} in {path or source.name}")
    return broken


def test_relative_links_resolve():
    assert broken_links(ROOT) == []


def test_a_dead_link_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[a](docs/a.md#how-it-works) [b](docs/gone.md)\n")
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## How it works\n\n[back](../README.md#nope)\n")
    assert broken_links(tmp_path) == [
        "README.md:1: no file docs/gone.md",
        "docs/a.md:5: no heading #nope in ../README.md",
    ]
