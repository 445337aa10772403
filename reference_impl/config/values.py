"""Small text rules both configuration readers share: integers, lines, shown values, reading.

Each rule exists because the obvious Python spelling is wrong for hostile input:

* ``int(text)`` raises ``ValueError`` past 4,300 digits (CPython's guard against quadratic
  conversion) and ``str.isdigit()`` is true for a superscript two or an Arabic-Indic one,
  which ``int()`` then refuses or reads as a number.  :func:`decimal_in_range` takes ASCII
  digits only and never converts more digits than the upper bound has.
* ``str.splitlines()`` ends a line at ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028
  and U+2029 too, so such a character inside a ``#`` comment turns the rest of the comment into
  a live line.  :func:`config_lines` ends a line at ``\\n`` only (``\\r\\n`` too, its ``\\r``
  dropped), as the product's line reader does.
* ``str.split()`` separates fields at every Unicode space; :func:`stray_character` finds the
  first character of a live line that is neither printable text nor a space or tab.
* ``repr()`` of a 5,000-digit value makes a 5,000-character error line: :func:`shown` cuts it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "MAX_CONFIG_BYTES",
    "character_name",
    "config_lines",
    "decimal_in_range",
    "one_line",
    "read_config_bytes",
    "shown",
    "stray_character",
]

MAX_CONFIG_BYTES = 16 * 1024 * 1024
"""Largest configuration file read (16 MiB).  Real files are a few KiB; the cap keeps
``-c /dev/zero`` or a mistaken capture file from filling memory before any check runs."""

_ASCII_DIGITS = frozenset("0123456789")
_SHOWN_MAX = 60


def decimal_in_range(text: str, low: int, high: int) -> int | None:
    """``text`` (ASCII digits, with optional surrounding spaces or tabs) as an int in
    ``low..high``, else ``None``.

    Leading zeros are allowed (``strtoul`` reads them too), so ``"00014567"`` is 14567 whatever
    its length; only the significant digits are converted, and only when there are no more of
    them than ``high`` has.
    """
    value = text.strip(" \t")
    if not value or not _ASCII_DIGITS.issuperset(value):
        return None
    significant = value.lstrip("0") or "0"
    if len(significant) > len(str(high)):
        return None
    number = int(significant)
    return number if low <= number <= high else None


def config_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based number, text) of each line; only ``\\n`` ends a line, and one ``\\r`` right
    before it (or at the end of the text) is dropped."""
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line[:-1] if line.endswith("\r") else line


_ALLOWED_SPACE = frozenset(" \t")
_STRAY_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Zs"})


def stray_character(text: str) -> tuple[int, str] | None:
    """(0-based index, character) of the first control, format or separator character in
    ``text`` other than a space or a tab, else ``None``.

    Such characters are invisible or look like a line break in an editor, and Python's
    ``str.split()`` treats several of them as field separators: a line holding one does not
    say what it seems to say.
    """
    for index, char in enumerate(text):
        if char in _ALLOWED_SPACE:
            continue
        if unicodedata.category(char) in _STRAY_CATEGORIES:
            return index, char
    return None


def character_name(char: str) -> str:
    """``U+000C FORM FEED``-style description of one character (for error messages)."""
    name = unicodedata.name(char, "")
    if not name and unicodedata.category(char) == "Cc":
        name = "control character"
    return f"U+{ord(char):04X} {name}".rstrip()


def shown(value: str, limit: int = _SHOWN_MAX) -> str:
    """``repr(value)``, cut to about ``limit`` characters with the full length said, so an
    error message stays one readable line whatever the input holds (``repr`` escapes control
    characters and line breaks)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def one_line(text: str) -> str:
    """``text`` with every character that could end or hide a terminal line (controls, line
    and paragraph separators, format characters) written as a ``\\x``/``\\u`` escape: an
    error message built from file content stays one line whatever the file held."""
    return "".join(
        char
        if char == " " or unicodedata.category(char) not in _STRAY_CATEGORIES
        else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def read_config_bytes(path: str | Path) -> bytes:
    """The bytes of a configuration file, at most :data:`MAX_CONFIG_BYTES` of them.

    Raises ``OSError`` (unreadable, a directory, missing) or ``ValueError`` (larger than the
    cap), each with a message fit for a one-line error.
    """
    with open(path, "rb") as fh:
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; not read")
    return data
