"""Everything the repository cites is inside it: no fact sheet outside the clone, no dead
``docs/`` path, no section number that the cited document does not have.

The protocol notes the code relies on live in ``docs/`` with stable section numbers,
and code cites them as ``docs/semantics.md §1.4``.  These tests keep those citations
honest: a clone must be able to follow every one of them.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SELF = Path(__file__).resolve()
ROOT = SELF.parent.parent
PROTOCOL_DOCS = ("semantics.md", "wire-lbmc.md", "wire-transports.md")

OUTSIDE_REFERENCES = ("../shared", "shared/spec", "guide-for-persistence.txt")

DOC_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w/]")
NUMBER = r"(?:\d+|[A-Z](?![A-Za-z]))(?:\.\d+)*"
"""A section number: 1, 1.4, 1.10, or an appendix letter (B, A.2)."""
SECTION = r"§\s*" + NUMBER
CITATION = re.compile(
    r"docs/(?P<doc>[\w-]+\.md)`{0,2}\s*(?P<refs>" + SECTION
    + r"(?:\s*(?:-|\u2013|,|/|and)\s*§?\s*" + NUMBER + r")*)"
)
LINKED_CITATION = re.compile(
    r"\]\((?P<doc>[\w-]+\.md)\)\s*(?P<refs>" + SECTION
    + r"(?:\s*(?:-|\u2013|,|/|and)\s*§?\s*" + NUMBER + r")*)"
)
"""Inside docs/: ``[wire-lbmc.md](wire-lbmc.md) §2.1`` cites another note by its link."""
OWN_SECTION = re.compile(SECTION)
"""Inside docs/: any other ``§N`` cites the note it is written in."""
SECTION_NUMBER = re.compile(NUMBER)
HEADING = re.compile(r"^#{1,6}\s+(" + NUMBER + r")\.?\s", re.MULTILINE)
HEADING_LINE = re.compile(r"^#.*$", re.MULTILINE)
UNMARKED_SECTION = re.compile(r"docs/[\w-]+\.md`{0,2}\s+(?:section\s+)?\d")
BARE_CITATION = re.compile(
    r"(?<![\w/.-])(?:" + "|".join(re.escape(d) for d in PROTOCOL_DOCS) + r")\b"
)


def tracked_text_files() -> list[Path]:
    """The files git tracks (every file of the tree when git is not there), text only."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".tox", "__pycache__", ".mypy_cache", ".ruff_cache"}
        paths = [p for p in ROOT.rglob("*")
                 if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)]
    texts = []
    for path in paths:
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        head = path.read_bytes()[:4096]
        if b"\0" in head:
            continue
        texts.append(path)
    return texts


def lines_of(paths: list[Path]) -> Iterator[tuple[str, int, str]]:
    """Every line of the files but this one (which spells out what it forbids)."""
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        if path == SELF:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            yield rel, number, line


def section_numbers(doc: Path) -> set[str]:
    """The numbers of the document's headings ("1", "1.4", "B"), its citable sections."""
    return set(HEADING.findall(doc.read_text(encoding="utf-8")))


def cited_sections(refs: str) -> list[str]:
    """Every section a citation names; a range ``§1.1-1.16`` names both ends."""
    return SECTION_NUMBER.findall(refs.replace("and", " "))


@pytest.fixture(scope="module")
def files() -> list[Path]:
    return tracked_text_files()


def test_nothing_cites_files_outside_the_repository(files: list[Path]) -> None:
    """A clone has no ``../shared`` tree and no copy of the product guide's text: the facts
    belong in ``docs/`` (the guide is cited by its section names)."""
    found = [f"{rel}:{n}: {line.strip()}" for rel, n, line in lines_of(files)
             if any(ref in line for ref in OUTSIDE_REFERENCES)]
    assert not found, "citations of files outside the repository:\n" + "\n".join(found)


def test_protocol_notes_are_cited_by_their_repository_path(files: list[Path]) -> None:
    """``semantics.md §1.4`` alone leaves the reader guessing which file; outside ``docs/`` the
    citation is ``docs/semantics.md §1.4``."""
    found = []
    for rel, n, line in lines_of(files):
        if rel.startswith("docs/"):
            continue
        for match in BARE_CITATION.finditer(line):
            if not line[:match.start()].endswith("docs/"):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "protocol notes cited without docs/:\n" + "\n".join(found)


def test_cited_sections_carry_the_section_sign(files: list[Path]) -> None:
    """``docs/wire-lbmc.md 6.3`` would escape the section check: write ``§6.3``."""
    found = [f"{rel}:{n}: {line.strip()}" for rel, n, line in lines_of(files)
             if UNMARKED_SECTION.search(line)]
    assert not found, "section numbers cited without §:\n" + "\n".join(found)


def test_every_cited_docs_path_exists(files: list[Path]) -> None:
    missing = [f"{rel}:{n}: {m.group(0)}" for rel, n, line in lines_of(files)
               for m in DOC_PATH.finditer(line) if not (ROOT / m.group(0)).exists()]
    assert not missing, "cited docs/ paths that do not exist:\n" + "\n".join(missing)


def test_every_cited_section_exists(files: list[Path]) -> None:
    """``docs/semantics.md §1.4`` needs a heading numbered 1.4 in that file."""
    headings = {path.name: section_numbers(path) for path in (ROOT / "docs").glob("*.md")}
    bad = []
    count = 0
    for rel, n, line in lines_of(files):
        for match in CITATION.finditer(line):
            doc = match.group("doc")
            for number in cited_sections(match.group("refs")):
                count += 1
                if number not in headings.get(doc, set()):
                    bad.append(f"{rel}:{n}: {doc} §{number}")
    assert not bad, "cited sections with no such heading:\n" + "\n".join(bad)
    assert count > 0, "no section citations found at all: is the pattern still right?"


def test_sections_cited_inside_the_notes_exist() -> None:
    """The notes cite each other (``[wire-lbmc.md](wire-lbmc.md) §4.2``, possibly across a
    line break) and themselves (``§1.9``); those sections must exist too."""
    notes = sorted((ROOT / "docs").glob("*.md"))
    headings = {path.name: section_numbers(path) for path in notes}
    bad = []
    for path in notes:
        text = HEADING_LINE.sub("", path.read_text(encoding="utf-8"))
        for match in LINKED_CITATION.finditer(text):
            bad += [f"{path.name}: {match.group(0)!r}: no §{number} in {match.group('doc')}"
                    for number in cited_sections(match.group("refs"))
                    if number not in headings.get(match.group("doc"), set())]
        for match in OWN_SECTION.finditer(LINKED_CITATION.sub("", text)):
            bad += [f"{path.name}: no §{number}" for number in cited_sections(match.group(0))
                    if number not in headings[path.name]]
    assert not bad, "sections the notes cite but do not have:\n" + "\n".join(bad)


def test_section_numbers_are_unique_and_present() -> None:
    """Stable numbering: each number names one section, and the chapters code cites exist."""
    for name in PROTOCOL_DOCS:
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        numbers = HEADING.findall(text)
        duplicates = sorted({x for x in numbers if numbers.count(x) > 1})
        assert not duplicates, f"{name}: section numbers used twice: {duplicates}"
    assert {"1.1", "1.16", "2.1", "3.4", "8"} <= section_numbers(
        ROOT / "docs" / "semantics.md")


def test_citation_pattern_reads_ranges_and_lists() -> None:
    refs = CITATION.search("see docs/semantics.md §1.1-1.16, §3.3 / §3.4 and §8.")
    assert refs is not None
    assert cited_sections(refs.group("refs")) == ["1.1", "1.16", "3.3", "3.4", "8"]
    quoted = CITATION.search("(``docs/semantics.md`` §1.16, §3.3)")
    assert quoted is not None and cited_sections(quoted.group("refs")) == ["1.16", "3.3"]
    assert UNMARKED_SECTION.search("docs/wire-lbmc.md 6.3 frame 4")
    assert not UNMARKED_SECTION.search("docs/wire-lbmc.md §6.3 frame 4")
    assert DOC_PATH.findall("(`docs/wire-lbmc.md`).") == ["docs/wire-lbmc.md"]
