"""Every relative link and image in README.md and docs/ (notes included) points at a file that exists, and
no document or docstring still sends the reader to the lab notebook's old single file."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "notes").glob("*.md"))]


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in documents():
        fence = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                fence = not fence
            if fence:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                path = (doc.parent / target.split("#", 1)[0]).resolve()
                if not path.exists():
                    broken.append(f"{doc.relative_to(ROOT)}:{number}: {target}")
    assert not broken, "\n".join(broken)


def test_the_notebook_is_docs_notes_and_its_index_lists_every_entry():
    assert not (ROOT / "docs" / "results.md").exists()
    index = (ROOT / "docs" / "notes" / "README.md").read_text()
    entries = sorted(p.name for p in (ROOT / "docs" / "notes").glob("2026-*.md"))
    assert entries and [e for e in entries if f"]({e})" not in index] == []
    stale = [str(p.relative_to(ROOT)) for p in [*(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").iterdir(),
                                                  *(ROOT / "experiments").glob("*.toml"), *documents()]
             if p.is_file() and re.search(r"(?<!former )docs/results\.md(?! \(now)", p.read_text(errors="replace"))]
    assert stale == []
