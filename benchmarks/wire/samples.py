"""Deterministic sample headers and messages for the benchmark.

Values are read off the Construct definitions (like ``tests/wire/strategies.py`` does, but
without Hypothesis, so the benchmark needs only the runtime dependencies): integers get
mid-range values that fit their format with the ``ignore`` bit clear, IPv4 members a private
address, fixed byte strings a counting pattern, names a realistic topic or store name.  Every
sample is checked before it is timed: Construct and the fast path must decode its bytes to the
same values, so the benchmark never times a decoder that is failing.
"""

from __future__ import annotations

import struct as pystruct
from dataclasses import dataclass
from typing import Any

import construct as cs

from wire import lbmc
from wire.fields import Auto, fixed_format, members, unwrap, value_kind

PAYLOAD_64 = bytes(range(64))


@dataclass(frozen=True)
class HeaderSample:
    """One header kind ready to be timed.

    Attributes:
        kind: the header kind.
        header: the typed header object the sample was made from.
        raw: the header's bytes (``hdr_len`` of them), as they appear on the wire.
        values: member values in Construct's Python form with ``next_hdr``/``hdr_len`` filled
            in: the input of both ``struct.build`` and ``fast.pack``.
    """

    kind: lbmc.HeaderKind
    header: lbmc.Header
    raw: bytes
    values: dict[str, Any]

    @property
    def fixed(self) -> bool:
        return self.kind.fixed

    @property
    def construct(self) -> cs.Struct:
        assert self.kind.struct is not None
        return self.kind.struct


def _int_value(member: cs.Construct, index: int) -> int:
    fmt = unwrap(member).fmtstr
    bits = 8 * pystruct.calcsize(fmt)
    # Mid-range, distinct per member, top bit clear (the "ignore" bit of flag words).
    pattern = (0x1B2F3A4C5D6E7F81 * (index + 1)) & ((1 << (bits - 1)) - 1)
    return pattern if bits > 8 else (0x11 * (index + 1)) & 0x7F


def _member_value(kind: lbmc.HeaderKind, member: cs.Construct, index: int) -> Any:
    name = member.name
    if isinstance(member.subcon, cs.Array):
        # tsni: a few (tidx, sqn) records, the usual shape of a topic sequence info.
        return [{"tidx": 1 + i, "sqn": 1000 + 17 * i} for i in range(4)]
    kind_of = value_kind(member)
    if kind_of == "ipv4":
        return f"10.29.{index}.{10 + index}"
    if kind_of == "int":
        return _int_value(member, index)
    if kind_of == "text":
        return "store-primary-1" if kind.name == "ume_storename" else "ume.benchmark.topic"
    letter = fixed_format(member)
    if letter is not None:
        return bytes((7 * i + index) & 0xFF for i in range(int(letter[:-1])))
    if name == "trailing":
        return b""
    if name == "data":  # apphdr
        return bytes(range(12))
    return b"\xab" * 8


def header_values(kind: lbmc.HeaderKind) -> dict[str, Any]:
    """Keyword values for ``header_class(kind.code)(**values)``: every member not computed
    on build (``next_hdr`` and ``Auto`` lengths are left out)."""
    assert kind.struct is not None
    values: dict[str, Any] = {}
    for index, member in enumerate(members(kind.struct)):
        if member.name == "next_hdr" or isinstance(member.subcon, Auto):
            continue
        values[member.name] = _member_value(kind, member, index)
    return values


def _comparable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not k.startswith("_")}


def header_sample(kind: lbmc.HeaderKind) -> HeaderSample:
    """The checked sample of one header kind."""
    cls = lbmc.header_class(kind.code)
    assert cls is not None and kind.struct is not None
    if kind.name == "apphdr_chain":
        header = lbmc.build_apphdr_chain(
            [lbmc.ChainElement(lbmc.MSGPROP_ELEMENT, proplen=48), lbmc.ChainElement(0x02, b"ab")])
    else:
        header = cls(**header_values(kind))
    raw = header.encode(lbmc.NHDR_DATA)
    values = header.resolved()
    values["next_hdr"] = lbmc.NHDR_DATA
    parsed = _comparable(dict(kind.struct.parse(raw)))
    if bytes(kind.struct.build(values)) != raw:
        raise AssertionError(f"{kind.name}: Construct build differs from the header's bytes")
    if kind.fixed:
        fast = kind.fast
        assert fast is not None
        decoded = fast.decode(raw, 0)
        expected = {k: v for k, v in parsed.items() if k != "trailing"}
        if decoded != expected:
            raise AssertionError(f"{kind.name}: fast decode {decoded} != Construct {expected}")
        if fast.pack(values) != raw:
            raise AssertionError(f"{kind.name}: fast pack differs from Construct build")
        if fast.unpack_from(raw, 0) != tuple(fast.codec.unpack_from(raw, 0)):
            raise AssertionError(f"{kind.name}: unpack_from is inconsistent")
    return HeaderSample(kind=kind, header=header, raw=raw, values=values)


def header_samples(names: set[str] | None = None) -> list[HeaderSample]:
    """Samples for every header kind (optionally only those named), in code order."""
    kinds = lbmc.header_kinds()
    if names is not None:
        unknown = names - {k.name for k in kinds}
        if unknown:
            raise ValueError(f"unknown header kind(s): {', '.join(sorted(unknown))}")
        kinds = [k for k in kinds if k.name in names]
    return [header_sample(k) for k in kinds]


@dataclass(frozen=True)
class MessageSample:
    """A typical persistence message: its object form and its bytes."""

    name: str
    description: str
    message: lbmc.LbmcMessage
    raw: bytes


def _message_sample(name: str, description: str, message: lbmc.LbmcMessage) -> MessageSample:
    raw = message.build()
    parsed, used = lbmc.parse_message(raw)
    if used != len(raw) or parsed != message:
        raise AssertionError(f"{name}: parse_message does not round-trip the sample")
    return MessageSample(name=name, description=description, message=message, raw=raw)


def message_samples() -> list[MessageSample]:
    """CONTROL + ume_preg, a stability ume_ack, and a DATA message with a 64-byte payload."""
    preg = lbmc.UmePreg(
        s_flag=1, p_flag=1, w_flag=1, reg_id=0x0A0B0C0D, transport_idx=3, topic_idx=7,
        src_reg_id=0x12345678, resp_port=14567, resp_ip="10.29.3.13",
    )
    ack = lbmc.UmeAck(
        type=lbmc.AckType.STABLE, transport_idx=3, id_2=7, rcv_reg_id=0x0A0B0C0D,
        seqnum=1_234_567,
    )
    return [
        _message_sample("control_ume_preg", "CONTROL with ume_preg (source registration)",
                        lbmc.LbmcMessage(type=lbmc.MessageType.CONTROL, headers=[preg])),
        _message_sample("control_ume_ack_stable", "CONTROL with ume_ack type STABLE",
                        lbmc.LbmcMessage(type=lbmc.MessageType.CONTROL, headers=[ack])),
        _message_sample("data_64", "MESSAGE (DATA), no extended header, 64-byte payload",
                        lbmc.LbmcMessage(type=lbmc.MessageType.MESSAGE, tidx=7, sqn=1_234_567,
                                         payload=PAYLOAD_64)),
    ]
