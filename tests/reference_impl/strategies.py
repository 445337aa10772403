"""Hypothesis strategies for bad input to the reference cores (issue 3, "Bad input").

A core meets three kinds of bad bytes, and each needs its own generator because each reaches a
different depth of the code:

* **noise**: random bytes; mostly stopped by the LBT-TCP framer or the first base-header check;
* **framed but undecodable** messages (:func:`undecodable_frames`): a correct ``msglen`` around
  something :func:`wire.lbmc.parse_message` rejects (an undefined header code, a zero, short or
  overlong ``hdr_len``, an undefined type nibble), so the framer hands them to the core one by
  one and the stream stays usable; this is what a core must log and drop without losing the
  connection;
* **mutations** of valid requests (:func:`mutated`, :func:`lying`): bit flips, overwritten,
  inserted and deleted bytes, truncations, and well-formed messages whose ``msglen`` or one
  header's ``hdr_len`` lies.  These get past the framer and the header walk and reach the
  registration, acknowledgement and retransmission handlers with odd values.

Every length, code and offset is read from :mod:`wire.lbmc` (its ``LbmcMessage`` builder and the
derived ``CONTROL_BASE`` layout, the framing prefix shared by every message type); nothing here
restates a byte layout.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from tests.wire.strategies import messages
from wire.errors import WireError
from wire.lbmc import CONTROL_BASE, LbmcMessage, MessageType, is_defined_code, parse_message

MAX_NOISE = 80

noise = st.binary(max_size=MAX_NOISE)
"""Random bytes, framed or not."""

undefined_codes = st.sampled_from([c for c in range(1, 0xFF) if not is_defined_code(c)])
"""Header codes no LBMC dissector knows (0x00 and 0xFF end a chain, so they are not here)."""

undefined_types = st.sampled_from([t for t in range(0x10)
                                   if t not in MessageType._value2member_map_])


def built(message: LbmcMessage) -> bytes:
    return message.build()


valid_messages = messages().map(built)
"""Well-formed LBMC messages of any type with any header mix and random values."""


def with_prefix(raw: bytes, **changes: int) -> bytes:
    """``raw`` with members of its 4-byte framing prefix (``ver_type``, ``next_hdr``,
    ``msglen``) replaced; the prefix is common to every message type."""
    values = CONTROL_BASE.decode(raw, 0)
    values.update(changes)
    return CONTROL_BASE.pack(values) + raw[CONTROL_BASE.size:]


def is_undecodable_frame(raw: bytes) -> bool:
    """Exactly one LBT-TCP frame (``msglen`` is the whole of ``raw``) that does not decode."""
    if len(raw) < CONTROL_BASE.size or CONTROL_BASE.decode(raw, 0)["msglen"] != len(raw):
        return False
    try:
        parse_message(raw)
    except WireError:
        return True
    return False


@st.composite
def _framed_noise(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=MAX_NOISE))
    head = CONTROL_BASE.pack({"ver_type": draw(st.integers(0, 0xFF)),
                              "next_hdr": draw(st.integers(0, 0xFF)),
                              "msglen": CONTROL_BASE.size + len(body)})
    return head + body


@st.composite
def _undefined_first_code(draw: st.DrawFn) -> bytes:
    return with_prefix(draw(valid_messages), next_hdr=draw(undefined_codes))


@st.composite
def _undefined_type(draw: st.DrawFn) -> bytes:
    raw = draw(valid_messages)
    version_bits = CONTROL_BASE.decode(raw, 0)["ver_type"] & 0xF0
    return with_prefix(raw, ver_type=version_bits | draw(undefined_types))


@st.composite
def _bad_header_length(draw: st.DrawFn) -> bytes:
    message = draw(messages().filter(lambda m: bool(m.headers)))
    return draw(lying(message, header_only=True))


def undecodable_frames() -> st.SearchStrategy[bytes]:
    """Single LBT-TCP frames that :func:`wire.lbmc.parse_message` rejects."""
    return st.one_of(_framed_noise(), _undefined_first_code(), _undefined_type(),
                     _bad_header_length()).filter(is_undecodable_frame)


@st.composite
def mutated(draw: st.DrawFn, raw: bytes, max_edits: int = 4) -> bytes:
    """``raw`` after up to ``max_edits`` bit flips, overwritten, inserted or deleted bytes,
    or a truncation, in any order."""
    out = bytearray(raw)
    for _ in range(draw(st.integers(1, max_edits))):
        if not out:
            break
        pos = draw(st.integers(0, len(out) - 1))
        edit = draw(st.sampled_from(("flip", "set", "insert", "delete", "truncate")))
        if edit == "flip":
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif edit == "set":
            out[pos] = draw(st.integers(0, 0xFF))
        elif edit == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif edit == "delete":
            del out[pos:pos + draw(st.integers(1, 4))]
        else:
            del out[pos:]
    return bytes(out)


@st.composite
def lying(draw: st.DrawFn, message: LbmcMessage, *, header_only: bool = False) -> bytes:
    """``message`` built with a wrong ``msglen`` or a wrong ``hdr_len`` in one header."""
    raw = message.build()
    if message.headers and (header_only or draw(st.booleans())):
        copy, _ = parse_message(raw)  # fresh header objects: the drawn message stays intact
        header = copy.headers[draw(st.integers(0, len(copy.headers) - 1))]
        header.hdr_len = draw(st.sampled_from([0, 1, 2, 3]) | st.integers(0, 0xFF))
        return copy.build()
    lie = draw(st.integers(0, 0xFFFF).filter(lambda n: n != len(raw)))
    return with_prefix(raw, msglen=lie)


def garbage_from(templates: list[LbmcMessage]) -> st.SearchStrategy[bytes]:
    """One piece of bad input: noise, an undecodable frame, a random well-formed message, or a
    mutation of one of ``templates`` (valid requests the core under test understands)."""
    template_raws = [t.build() for t in templates]
    pieces: list[st.SearchStrategy[bytes]] = [noise, undecodable_frames(), valid_messages]
    if templates:
        pieces.append(st.sampled_from(template_raws).flatmap(mutated))
        pieces.append(st.sampled_from(templates).flatmap(lying))
    return st.one_of(pieces)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at arbitrary points (what a TCP receiver may see)."""
    if not data:
        return []
    cuts = sorted(set(draw(st.lists(st.integers(1, len(data)), max_size=8))))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]
