"""Fuzz checks shared by the LBT-RU and LBT-RM suites: bad bytes parse or raise WireError.

Each transport's test module keeps its own Hypothesis strategy and example budget and calls
these with its ``parse_packet``; the properties themselves are written once here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from wire.errors import WireError

Parse = Callable[..., Any]


def check_parse_or_raise(parse: Parse, raw: bytes) -> None:
    """``raw`` parses (and the transport layer re-encodes it byte for byte) or raises only
    WireError, with and without decoding the LBMC payload."""
    try:
        lazy = parse(raw, decode_lbmc=False)
    except WireError:
        pass
    else:
        assert lazy.build() == raw  # the transport layer is lossless
    with contextlib.suppress(WireError):
        parse(raw)


def check_mutations(parse: Parse, raw: bytes, edits: list[tuple[int, int]], cut: int) -> None:
    """A valid datagram with bytes overwritten, then also truncated, passes
    :func:`check_parse_or_raise`."""
    mutated = bytearray(raw)
    for pos, value in edits:
        mutated[pos % len(mutated)] = value
    for candidate in (bytes(mutated), bytes(mutated[: cut % (len(mutated) + 1)])):
        check_parse_or_raise(parse, candidate)
