"""Hypothesis strategies read off the Construct definitions (no layout restated here).

``values_for(struct)`` draws a dict of member values for any struct built with
:func:`wire.fields.field`: integers over the full range of their format, IPv4 strings, byte
strings of the right size, arrays of sub-structs.  Members computed on build (``Auto``: lengths,
counts) are left out so the build fills them in; ``next_hdr`` is left to the message builder.
"""

from __future__ import annotations

import struct as pystruct
from typing import Any

import construct as cs
from hypothesis import strategies as st

from wire import lbmc
from wire.fields import Auto, fixed_format, members, unwrap, value_kind

ipv4s = st.integers(0, 0xFFFFFFFF).map(
    lambda v: ".".join(str(b) for b in v.to_bytes(4, "big")))


def member_strategy(member: cs.Construct, *, max_var: int = 40) -> st.SearchStrategy[Any]:
    inner = member.subcon
    if isinstance(inner, cs.Array):
        element = inner.subcon
        return st.lists(values_for(element), max_size=max_var // 8)
    kind = value_kind(member)
    letter = fixed_format(member)
    if kind == "ipv4":
        return ipv4s
    if kind == "int":
        assert letter is not None
        fmt = unwrap(member).fmtstr
        bits = 8 * pystruct.calcsize(fmt)
        if letter.islower():
            return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        return st.integers(0, (1 << bits) - 1)
    if kind == "text":
        return st.text(st.characters(min_codepoint=1, max_codepoint=255), max_size=max_var)
    if letter is not None:
        n = int(letter[:-1])
        return st.binary(min_size=n, max_size=n)
    return st.binary(max_size=max_var)


def values_for(struct_def: cs.Struct, *, skip: tuple[str, ...] = ("next_hdr",),
               overrides: dict[str, st.SearchStrategy[Any]] | None = None,
               ) -> st.SearchStrategy[dict[str, Any]]:
    """A dict strategy covering every member that is not computed on build."""
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for member in members(struct_def):
        if member.name in skip or isinstance(member.subcon, Auto):
            continue
        parts[member.name] = member_strategy(member)
    parts.update(overrides or {})
    return st.fixed_dictionaries(parts)


def _header_overrides(kind: lbmc.HeaderKind) -> dict[str, st.SearchStrategy[Any]]:
    """Keep variable headers inside what tshark and hdr_len (one byte) can carry."""
    over: dict[str, st.SearchStrategy[Any]] = {"trailing": st.binary(max_size=8)}
    if kind.name in ("topicname", "ume_storename"):
        name = "topic" if kind.name == "topicname" else "store"
        over[name] = st.text(st.characters(min_codepoint=1, max_codepoint=126),
                             min_size=1, max_size=60)
        over.pop("trailing")
    if kind.name == "apphdr":
        over = {"data": st.binary(min_size=1, max_size=60)}
    if kind.name == "apphdr_chain":
        over = {"elements": st.just(b"")}
    if kind.name == "tsni":
        over["trailing"] = st.binary(max_size=7)
    if kind.name == "extopt":
        # whole (unfragmented) options of a subtype tshark shows raw; configuration options
        # (subtype 0x100) have a body of their own: tests/wire/test_cfgopt.py
        over = {"data": st.binary(max_size=60), "flags": st.sampled_from([0, 0x40, 0x80, 0xC0]),
                "fragment_offset": st.just(0), "subtype": st.sampled_from([0x0001, 0x1234])}
    return over


def header_of(kind: lbmc.HeaderKind) -> st.SearchStrategy[lbmc.Header]:
    assert kind.struct is not None
    cls = lbmc.header_class(kind.code)
    assert cls is not None
    return values_for(kind.struct, overrides=_header_overrides(kind)).map(lambda v: cls(**v))


any_header = st.sampled_from(lbmc.header_kinds()).flatmap(header_of)

message_types = st.sampled_from(list(lbmc.MessageType))


@st.composite
def messages(draw: st.DrawFn, max_headers: int = 4) -> lbmc.LbmcMessage:
    """Random well-formed LBMC messages (any type, any header mix, payload when DATA-ended)."""
    mtype = draw(message_types)
    headers = draw(st.lists(any_header, max_size=max_headers))
    ends_in_data = draw(st.booleans()) if headers or mtype in lbmc.DATA_TYPES else False
    terminator = lbmc.NHDR_DATA if ends_in_data else lbmc.NHDR_NONE
    message = lbmc.LbmcMessage(
        type=mtype, headers=headers, terminator=terminator,
        payload=draw(st.binary(max_size=64)) if ends_in_data else b"",
        tidx=draw(st.integers(0, 0xFFFFFFFF)), sqn=draw(st.integers(0, 0xFFFFFFFF)),
    )
    return message


def transport_packets(cls: type[Any], option_lists: st.SearchStrategy[list[Any]], *,
                      versions: st.SearchStrategy[int], max_messages: int = 3,
                      payload_messages: st.SearchStrategy[lbmc.LbmcMessage] | None = None,
                      ) -> st.SearchStrategy[Any]:
    """Random LBT-RU/LBT-RM packets of one type: every member (read off ``cls.struct``), the
    given option lists, LBMC messages for DATA, and ignored trailing bytes."""
    if cls.carries_lbmc:
        payloads = st.lists(messages() if payload_messages is None else payload_messages,
                            max_size=max_messages)
        trailers = st.binary(max_size=3)
    else:
        payloads, trailers = st.just([]), st.binary(max_size=8)

    def make(values: dict[str, Any], version: int, options: list[Any], payload: list[Any],
             trailer: bytes) -> Any:
        packet = cls(options=options, payload=payload, trailer=trailer, **values)
        packet.version = version
        return packet

    return st.builds(make, values_for(cls.struct, skip=("next_hdr", "ver_type")), versions,
                     option_lists, payloads, trailers)
