"""LBMC: the message format every UM transport and every store connection carries.

Layouts follow Wireshark's LBMC dissector (``packet-lbmc.c``, tshark 4.0.x) as summarised in
``docs/wire-lbmc.md``.  Each extended header is one Construct struct below; it is the only
place its layout is written.  From each struct this module derives a :class:`HeaderKind` (code,
tshark prefix, fixed size, fast decoder) and a typed header class (``UmePreg``, ``UmeAck`` ...)
whose attributes are the struct members plus the named bit views of flag words.

A whole message is an :class:`LbmcMessage`: base header fields, an ordered list of headers and
the payload.  :func:`parse_message` / :meth:`LbmcMessage.build` convert it from/to bytes with
the chain rules of the dissector:

* a header's code is carried by its *predecessor* (the base header or the previous header's
  ``next_hdr``); the builder fills every ``next_hdr`` from the list order;
* the chain ends at 0x00 (payload follows) or 0xFF (no payload).  When not told otherwise the
  builder ends data messages (MESSAGE, PRORX, RETRANS) with 0x00 and CONTROL/EOT with 0xFF,
  because tshark labels a control message by its headers only when the chain ends in 0xFF;
* a header whose ``hdr_len`` exceeds its layout keeps the extra bytes in ``trailing`` (tshark
  skips them), so such messages round-trip byte for byte;
* codes tshark knows but we do not model field by field become :class:`OpaqueHeader`; codes
  tshark does not know are an error.
"""

from __future__ import annotations

import builtins
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from enum import IntEnum
from typing import Any, ClassVar

import construct as cs
from construct import this

from .errors import WireError
from .fastpath import FastLayout, derive
from .fields import (
    U8,
    U16,
    U32,
    U64,
    Auto,
    Bit,
    IPv4,
    bit_views,
    bytes_text,
    cstring,
    field,
    fixed_size,
    forget_computed,
    length_prefixed,
    members,
    text,
    text_size,
)
from .records import StructRecord, plain


class MessageType(IntEnum):
    """The type nibble of ``ver_type`` (``lbmc.type``)."""

    MESSAGE = 0x0
    EOT = 0x1
    PRORX = 0x2
    CONTROL = 0x8
    RETRANS = 0xA


DATA_TYPES = frozenset({MessageType.MESSAGE, MessageType.PRORX, MessageType.RETRANS})
NHDR_DATA = 0x00
NHDR_NONE = 0xFF

# --- base headers ------------------------------------------------------------------------------

VER_TYPE_BITS = {"version": Bit(0xF0, tshark="version"), "type": Bit(0x0F, tshark="type")}

DataHeader = cs.Struct(
    field("ver_type", U8, tshark=None, bits=VER_TYPE_BITS),
    field("next_hdr", U8),
    field("msglen", U16),
    field("tidx", U32),
    field("sqn", U32),
)
"""The 12-byte base header of MESSAGE, PRORX and RETRANS messages."""

ControlHeader = cs.Struct(
    field("ver_type", U8, tshark=None, bits=VER_TYPE_BITS),
    field("next_hdr", U8),
    field("msglen", U16),
)
"""The 4-byte base header of CONTROL and EOT messages (also the "minimal" framing prefix)."""

DATA_BASE = derive(DataHeader)
CONTROL_BASE = derive(ControlHeader)

BasicHeader = cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", U8),
    field("word", U16, tshark=None),
)
"""The 4 bytes every extended header starts with (docs/wire-lbmc.md §1.5): the chain walk reads
``next_hdr`` and ``hdr_len`` through it; ``word`` is each header's flags/code."""
BASIC = derive(BasicHeader, name="lbmc")


# --- extended headers ---------------------------------------------------------------------------

IGNORE16 = {"ignore": 0x8000}
IGNORE8 = {"ignore": 0x80}


def _flags16(**bits: int | Bit) -> cs.Renamed:
    return field("flags", U16, bits={**IGNORE16, **bits})


def _flags8(**bits: int | Bit) -> cs.Renamed:
    return field("flags", U8, bits={**IGNORE8, **bits})


def _fixed(*body: cs.Construct) -> cs.Struct:
    """next_hdr, hdr_len, the fixed body, then whatever a longer hdr_len adds (``trailing``)."""
    return length_prefixed("next_hdr", "hdr_len", *body)


def _named(member: str, *head: cs.Construct) -> cs.Struct:
    """next_hdr, hdr_len, a fixed head, then a string filling the rest of ``hdr_len``."""
    size = 2 + fixed_size(head)
    return cs.Struct(
        field("next_hdr", U8),
        field("hdr_len", Auto(U8, lambda ctx: size + text_size(ctx[member]))),
        *head,
        field(member, text(this.hdr_len - size)),
    )


@dataclass(frozen=True)
class HeaderKind:
    """Everything the codec knows about one extended-header code.

    Attributes:
        code: the ``next_hdr`` value that announces this header.
        name: our identifier, equal to the last part of tshark's prefix (``"ume_preg"``).
        title: tshark's ``next_hdr`` display text ("UME persistent registration").
        struct: the Construct definition (next_hdr and hdr_len included), or None for headers
            we carry opaquely.
        tshark: tshark's container field (``"lbmc.ume_preg"``).
        field_prefix: prefix of the member fields, when tshark uses another one than the
            container (the ctxinst family shares ``lbmc.ctxinst.*``).
        label: the Info-column label a control message with this header gets, if any.
        min_len: the smallest ``hdr_len`` that decodes without a tshark error.
        flags16_quirk: tshark shows the one-byte flags of this header as a 16-bit item that
            also covers the member named here (ume_store & co., docs/wire-lbmc.md §2.1).
    """

    code: int
    name: str
    title: str
    struct: cs.Struct | None
    tshark: str
    field_prefix: str
    label: str | None
    min_len: int
    flags16_quirk: str | None = None
    fast: FastLayout | None = None

    @property
    def fixed(self) -> bool:
        return self.fast is not None and self.fast.complete


_KINDS: dict[int, HeaderKind] = {}
_CLASSES: dict[int, type[Header]] = {}


class Header(StructRecord):
    """One typed LBMC extended header; attributes are its Construct members and bit views.

    Build one with keyword arguments (``UmePreg(reg_id=7, s_flag=1, w_flag=1)``); members left
    out take neutral defaults (0, ``0.0.0.0``, empty bytes) and ``next_hdr``/``hdr_len`` are
    computed when the message is built unless given explicitly (to craft invalid packets).

    The record machinery is :class:`~wire.records.StructRecord`'s; what is LBMC's own: the
    struct comes from the class's :class:`HeaderKind`, ``next_hdr`` reads ``None`` until set
    (it depends on the header's place in a message), equality ignores ``next_hdr`` for the
    same reason, and the export reproduces tshark's 16-bit flags quirk.
    """

    kind: ClassVar[HeaderKind]
    __slots__ = ()
    _as_given = frozenset({"next_hdr"})

    @classmethod
    def _declared_struct(cls) -> cs.Struct | None:
        kind: HeaderKind | None = cls.__dict__.get("kind")
        return None if kind is None else kind.struct

    @classmethod
    def _field_prefix(cls) -> str:
        return cls.kind.field_prefix

    @property
    def header_code(self) -> int:
        """The LBMC code announcing this header (``code`` may be a member, as in
        ume_preg_resp, so the header's own code has a name of its own)."""
        return self.kind.code

    def wire_values(self, next_hdr: int) -> dict[str, Any]:
        """Every member as it is on the wire when ``next_hdr`` follows this header."""
        return self._linked(next_hdr)

    def _same_kind(self, other: StructRecord) -> bool:
        return isinstance(other, Header) and other.kind is self.kind

    def _key(self) -> dict[str, Any]:
        values = self.resolved()
        values.pop("next_hdr")
        return values

    def _shown(self, name: str, value: Any) -> bool:
        return name != "trailing"

    def encode(self, next_hdr: int) -> bytes:
        """The header's bytes, chained to ``next_hdr`` unless one was set explicitly."""
        values = dict(self.values)
        if values.get("next_hdr") is None:
            values["next_hdr"] = next_hdr
        # An explicit hdr_len is written as given, after the layout is encoded with the real
        # length: that is how a conformance case crafts a too-short or too-long header.
        crafted = values.get("hdr_len")
        values["hdr_len"] = None
        kind = self.kind
        try:
            if kind.fixed and not values.get("trailing"):
                assert kind.fast is not None
                values["hdr_len"] = kind.fast.size
                raw = kind.fast.pack(values)
            else:
                assert kind.struct is not None
                raw = bytes(kind.struct.build(values))
            if crafted is not None:
                nxt, _, word = BASIC.unpack_from(raw)
                raw = BASIC.codec.pack(nxt, crafted, word) + raw[BASIC.size :]
        except (cs.ConstructError, struct.error, ValueError, TypeError, KeyError) as exc:
            raise WireError(kind.tshark, 0, f"cannot encode: {exc}") from None
        return raw

    def tshark_fields(self, next_hdr: int | None = None) -> list[tuple[str, Any]]:
        """This header as tshark ``-T fields`` would show it: (display-filter name, value).

        ``next_hdr`` fills the chain link when the header has none of its own yet.
        """
        return self._export(self._linked(next_hdr))

    def _export(self, values: Mapping[str, Any]) -> list[tuple[str, Any]]:
        out = super()._export(values)
        if self.kind.code == EXTOPT_CODE and values.get("subtype") == CFGOPT_SUBTYPE:
            out += cfgopt_fields(bytes(values.get("data") or b""))
        quirk = self.kind.flags16_quirk
        if quirk:
            # tshark shows the one-byte flags as a 16-bit item that also covers ``quirk``
            prefix = self.kind.field_prefix
            wide = (int(values["flags"] or 0) << 8) | int(values[quirk] or 0)
            out = [
                (n, wide if n == f"{prefix}.flags"
                 else (wide >> 15) & 1 if n == f"{prefix}.flags.ignore" else v)
                for n, v in out
            ]
        return out


class OpaqueHeader:
    """A header tshark knows but this project carries as bytes (``next_hdr``, ``hdr_len``, data).

    ``data`` is everything after the first two bytes, so any such header round-trips.
    """

    __slots__ = ("data", "hdr_len", "header_code", "next_hdr")

    def __init__(
        self, code: int, data: bytes | None = None, next_hdr: int | None = None,
        hdr_len: int | None = None,
    ) -> None:
        if code not in KNOWN_CODES or code == 0x03:
            raise ValueError(f"0x{code:02x} is not an LBMC header code tshark dissects")
        self.header_code = code
        self.data = bytes(OPAQUE_MIN_LEN[code] - 2) if data is None else bytes(data)
        self.next_hdr = next_hdr
        self.hdr_len = hdr_len

    @property
    def name(self) -> str:
        return KNOWN_CODES[self.header_code][0]

    def encode(self, next_hdr: int) -> bytes:
        nh = next_hdr if self.next_hdr is None else self.next_hdr
        length = len(self.data) + 2 if self.hdr_len is None else self.hdr_len
        if not (0 <= nh <= 255 and 0 <= length <= 255):
            raise WireError(f"lbmc.{self.name}", 0, f"cannot encode hdr_len {length}")
        return bytes((nh, length)) + self.data

    def tshark_fields(self, next_hdr: int | None = None) -> list[tuple[str, Any]]:
        """Opaque headers export only their length: their fields are not modelled."""
        prefix = KNOWN_CODES[self.header_code][1]
        if self.header_code == 0x60:
            opid = self.data[1] if len(self.data) > 1 else -1
            prefix = AUTH_PREFIXES.get(opid, "lbmc.auth_unknown")
        return [(f"{prefix}.hdr_len", self._len())]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OpaqueHeader):
            return NotImplemented
        return ((self.header_code, self.data, self._len())
                == (other.header_code, other.data, other._len()))

    def _len(self) -> int:
        return len(self.data) + 2 if self.hdr_len is None else self.hdr_len

    @property
    def length(self) -> int:
        """``hdr_len`` as sent: the explicit one, else 2 + ``len(data)``."""
        return self._len()

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"OpaqueHeader(code=0x{self.header_code:02x} {self.name}, data={self.data!r})"


AnyHeader = Header | OpaqueHeader


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _register(
    code: int, name: str, title: str, struct_def: cs.Struct, *, label: str | None = None,
    tshark: str | None = None, field_prefix: str | None = None, min_len: int | None = None,
    flags16_quirk: str | None = None,
) -> type[Header]:
    container = tshark or f"lbmc.{name}"
    names = {m.name for m in members(struct_def)}
    clash = names & {v for m in members(struct_def) for v in bit_views(m)}
    if clash:
        raise TypeError(f"{name}: bit views {sorted(clash)} shadow members of the same name")
    fast = derive(struct_def, name=container)
    kind = HeaderKind(
        code=code, name=name, title=title, struct=struct_def, tshark=container,
        field_prefix=field_prefix or container, label=label,
        min_len=min_len if min_len is not None else fast.size,
        flags16_quirk=flags16_quirk, fast=fast if fast.complete else None,
    )
    cls = type(_class_name(name), (Header,), {"__slots__": (), "kind": kind,
                                               "__doc__": f"LBMC 0x{code:02x}: {title}."})
    _KINDS[code] = kind
    _CLASSES[code] = cls
    return cls


# UME headers (docs/wire-lbmc.md §2.1) ---------------------------------------------------------

PREG_FLAGS = {"f_flag": 0x40, "p_flag": 0x20, "w_flag": 0x10, "d_flag": 0x08}
MARKER_BITS = {"s_flag": Bit(0x80, tshark="s_flag"), "marker": Bit(0x7F, tshark="marker")}


def _no_error(code: int) -> bool:
    return not code & 0x20


def _error(code: int) -> bool:
    return bool(code & 0x20)


UmePreg = _register(0x12, "ume_preg", "UME persistent registration", _fixed(
    _flags8(**PREG_FLAGS),
    field("marker_byte", U8, tshark=None, bits=MARKER_BITS),
    field("reg_id", U32),
    field("transport_idx", U32),
    field("topic_idx", U32),
    field("src_reg_id", U32),
    field("resp_port", U16),
    field("res2", U16),
    field("resp_ip", IPv4),
), label="PREG")


class PregError(IntEnum):
    """Error codes of ume_preg_resp (low nibble of ``code`` when the E bit is set)."""

    ENOERROR = 0
    ENOPATTERN = 1
    ESRCREGID = 2
    EREGID = 3
    ETOPICNAME = 4
    EACTIVE = 5
    ECONFIG = 6


UmePregResp = _register(0x13, "ume_preg_resp", "UME persistent registration response", _fixed(
    field("code", U8, bits={
        "ignore": 0x80, "o_flag": 0x40, "e_flag": 0x20,
        "n_flag": Bit(0x10, when=_no_error), "w_flag": Bit(0x02, when=_no_error),
        "d_flag": Bit(0x01, when=_no_error),
        "error_code": Bit(0x0F, tshark="code.code", when=_error),
    }),
    field("marker_byte", U8, tshark=None, bits=MARKER_BITS),
    field("reg_id", U32),
    field("transport_idx", U32),
    field("topic_idx", U32),
    field("low_seqnum", U32),
    field("high_seqnum", U32),
), label="PREG-RESP")


class AckType(IntEnum):
    """``ume_ack.type``: consumption/delivery confirmation or stability."""

    CDELV = 0
    STABLE = 1


ACK_NAK = 0x04
"""The stability NACK bit of ``ume_ack.flags`` (docs/wire-lbmc.md §2.1, docs/semantics.md §1.8:
"a stability ACK carrying the NAK flag").  tshark 4.0 names the bits 0x80 (Ignore), 0x40 (O),
0x20 (F), 0x10 (U) and 0x08 (E) and nothing below them; 0x04 is the highest free bit: tshark
shows it in ``lbmc.ume_ack.flags`` (e.g. 0x04) with no item of its own and no expert info.
A constant, not a bit view of ``UmeAck``: every bit view is a tshark field (the oracle checks
each view's mask against tshark's), and tshark has none for this bit."""

UmeAck = _register(0x14, "ume_ack", "UME acknowledgement", _fixed(
    _flags8(o_flag=0x40, f_flag=0x20, u_flag=0x10, e_flag=0x08),
    field("type", U8),
    field("transport_idx", U32),
    field("id_2", U32),
    field("rcv_reg_id", U32),
    field("seqnum", U32),
), label="ACK")

UmeRxreq = _register(0x15, "ume_rxreq", "UME retransmission request", _fixed(
    _flags16(t=0x4000, marker=Bit(0x00FF, tshark="marker")),
    field("request_idx", U32),
    field("transport_idx", U32),
    field("id_2", U32),
    field("seqnum", U32),
    field("rx_port", U16),
    field("res", U16),
    field("rx_ip", IPv4),
), label="RXREQ")


class KeepaliveType(IntEnum):
    """``ume_keepalive.type``: the role of the sender."""

    STORE = 0
    RECEIVER = 1
    SOURCE = 2


UmeKeepalive = _register(0x16, "ume_keepalive", "UME keepalive", _fixed(
    _flags8(r_flag=0x40, t_flag=0x20),
    field("type", U8),
    field("transport_idx", U32),
    field("topic_idx", U32),
    field("reg_id", U32),
), label="UME-KA")

UmeStoreid = _register(0x17, "ume_storeid", "UME store ID", _fixed(
    field("store_id_word", U16, tshark=None, bits={
        "ignore": Bit(0x8000, tshark="ignore"), "store_id": Bit(0x7FFF, tshark="store_id")}),
))

UmeRangedAck = _register(0x18, "ume_ranged_ack", "UME ranged ACK", _fixed(
    _flags16(),
    field("first_seqnum", U32),
    field("last_seqnum", U32),
))

UmeAckId = _register(0x19, "ume_ack_id", "UME ACK", _fixed(
    _flags16(),
    field("id", U32),
))

UmeCapability = _register(0x1A, "ume_capability", "UME capability", _fixed(
    _flags16(qc_flag=0x4000, client_lifetime_flag=0x2000),
), label="UME-CAP")

UmeProxySrc = _register(0x1B, "ume_proxy_src", "Proxy source", _fixed(
    _flags16(enable=0x4000, compatibility=0x2000),
))

UmeStoreGroup = _register(0x1C, "ume_store_group", "Store group", _fixed(
    _flags8(),
    field("grp_idx", U8),
    field("grp_sz", U16),
    field("res1", U16),
), flags16_quirk="grp_idx")

_STORE_BODY = (
    _flags8(),
    field("grp_idx", U8),
    field("store_tcp_port", U16),
    field("store_idx", U16),
    field("store_ip_addr", IPv4),
    field("src_reg_id", U32),
)

UmeStore = _register(0x1D, "ume_store", "Store info", _fixed(*_STORE_BODY),
                     flags16_quirk="grp_idx")

UmeStoreExt = _register(0x69, "ume_store_ext", "Store extended information", _fixed(
    *_STORE_BODY,
    field("domain_id", U32),
    field("version", U32),
), flags16_quirk="grp_idx")

UmeLjInfo = _register(0x1E, "ume_lj_info", "UME late-join info", _fixed(
    _flags16(),
    field("low_seqnum", U32),
    field("high_seqnum", U32),
    field("qidx", U32),
), label="LJINFO")

UmeStorename = _register(0x3D, "ume_storename", "Store name", _named(
    "store", _flags16(),
), min_len=5)

UmePser = _register(0x41, "ume_pser", "UME proxy source election", _fixed(
    # the flag views get a _flag suffix: the members they announce have the plain names
    _flags16(source_ctxinst_flag=Bit(0x4000, tshark="flags.source_ctxinst"),
             store_ctxinst_flag=Bit(0x2000, tshark="flags.store_ctxinst"), reelect=0x1000),
    field("source_ip", IPv4),
    field("store_ip", IPv4),
    field("transport_idx", U32),
    field("topic_idx", U32),
    field("source_port", U16),
    field("store_port", U16),
    field("source_ctxinst", cs.Bytes(8)),
    field("store_ctxinst", cs.Bytes(8)),
), label="PSER")

UmePsrcElectionToken = _register(0x6A, "ume_psrc_election_token", "Proxy source election token",
                                 _fixed(
    _flags8(),
    field("store_index", U8),
    field("token", U32),
), label="PSRC-ETOK", flags16_quirk="store_index")

UmeClientLifetime = _register(0x46, "ume_client_lifetime", "UME client lifetime", _fixed(
    _flags16(),
    field("activity_tmo", U32),
    field("lifetime", U32),
    field("ttl", U32),
))

UmeSid = _register(0x47, "ume_sid", "UME session ID", _fixed(
    _flags16(),
    field("sid", U64),
))

UmeReceiverKeepalive = _register(0x50, "ume_receiver_keepalive", "UME receiver keepalive", _fixed(
    _flags16(),
    field("rcv_regid", U32),
    field("session_id", U64),
    field("ctxinst", cs.Bytes(8)),
), label="UME-RCV-KA")

SriReq = _register(0x53, "sri_req", "Source registration information request", _fixed(
    _flags16(),
    field("transport_idx", U32),
    field("topic_idx", U32),
), label="SRI-REQ")

UmeStoreDomain = _register(0x54, "ume_store_domain", "Store domain", _fixed(
    _flags16(),
    field("domain", U32),
))

Sri = _register(0x55, "sri", "Source registration information", _fixed(
    _flags16(acktosrc=0x0001, initial_sqn_known=0x0002),
    field("version", U32),
    field("low_sqn", U32),
    field("high_sqn", U32),
), label="SRI")

# Non-UME headers a persistent exchange uses (docs/wire-lbmc.md §2.2) ---------------------------

Frag = _register(0x01, "frag", "Fragment", _fixed(
    _flags16(),
    field("first_sqn", U32),
    field("offset", U32),
    field("len", U32),
))

Batch = _register(0x02, "batch", "Batch", _fixed(
    _flags16(batch_start=0x0002, batch_end=0x0001),
))

TcpRequest = _register(0x04, "tcp_request", "Request", _fixed(
    field("flags", U8, bits={"ignore": Bit(0x80, tshark="lbmc.tcp_request_flags.ignore")}),
    field("transport", U8),
    field("qidx", U32),
    field("port", U16),
    field("reserved", U16),
    field("ipaddr", IPv4),
))

Topicname = _register(0x05, "topicname", "Topic name", _named("topic", _flags16()), min_len=5)

Apphdr = _register(0x06, "apphdr", "Application header", cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: 4 + len(ctx.data))),
    field("code_word", U16, tshark=None, bits={
        "ignore": Bit(0x8000, tshark="ignore"), "code": Bit(0x7FFF, tshark="code")}),
    field("data", cs.Bytes(this.hdr_len - 4), tshark=None),
), min_len=5)

AppHdrChain = _register(0x07, "apphdr_chain", "Application header chain", cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: 4 + len(ctx.elements))),
    field("res", U8),
    field("first_chain_hdr", U8),
    field("elements", cs.Bytes(this.hdr_len - 4), tshark=None),
), min_len=4)

Otid = _register(0x0B, "otid", "OTID", _fixed(_flags16(), field("otid", cs.Bytes(32))))


def _ctxinst_body() -> tuple[cs.Construct, ...]:
    return (
        field("flags", U16, bits={"ignore": Bit(0x8000, tshark="lbmc.ctxinst_flags.ignore")}),
        field("ctxinst", cs.Bytes(8)),
    )


Ctxinstd = _register(0x0C, "ctxinstd", "Context instance destination", _fixed(*_ctxinst_body()),
                     field_prefix="lbmc.ctxinst")
Ctxinstr = _register(0x0D, "ctxinstr", "Context instance return", _fixed(*_ctxinst_body()),
                     field_prefix="lbmc.ctxinst")
UmeCtxinsts = _register(0x3C, "ume_ctxinsts", "Store context instance", _fixed(*_ctxinst_body()),
                        tshark="lbmc.ctxinst")
Ctxinst = _register(0x42, "ctxinst", "Context instance", _fixed(*_ctxinst_body()))

Srcidx = _register(0x0E, "srcidx", "Source index", _fixed(_flags16(), field("srcidx", U64)))

TsniRecord = cs.Struct(field("tidx", U32), field("sqn", U32))

Tsni = _register(0x20, "tsni", "Topic sequence info", cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: 4 + 8 * len(ctx.records) + len(ctx.trailing or b""))),
    field("num_recs_word", U16, tshark=None, bits={
        "ignore": Bit(0x8000, tshark="ignore"), "num_recs": Bit(0x7FFF, tshark="num_recs")}),
    field("records", cs.Array((this.hdr_len - 4) // 8, TsniRecord), tshark="tsni_rec"),
    field("trailing", cs.Bytes((this.hdr_len - 4) % 8), tshark=None),
), label="TSNI", min_len=4)

TopicInterest = _register(0x39, "topic_interest", "Topic interest", _fixed(
    _flags16(cancel=0x4000, refresh=0x2000),
    field("domain_id", U32),
), label="TOPIC-INT")

Domain = _register(0x43, "domain", "Domain", _fixed(
    _flags16(active=0x4000), field("domain", U32)), label="DOMAIN")

Odomain = _register(0x4A, "odomain", "Originating Domain", _fixed(
    _flags16(), field("domain", U32)))

Stream = _register(0x4B, "stream", "Stream", _fixed(
    _flags16(),
    field("stream_id", U32),
    field("sqn", U32),
    field("ctxinst", cs.Bytes(8)),
))

LjiReq = _register(0x4E, "lji_req", "Late Join information request", _fixed(
    _flags16(l_flag=Bit(0x0001, tshark="flags.l_flag"), m_flag=Bit(0x0002, tshark="flags.m_flag"),
             o_flag=Bit(0x0004, tshark="flags.o_flag")),
    field("request_idx", U32),
    field("transport_idx", U32),
    field("topic_idx", U32),
    field("req_ip", IPv4),
    field("req_port", U16),
    field("res", U16),
    field("tx_low_sqn", U32),
    field("rx_req_max", U32),
    field("rx_req_outstanding_max", U32),
), label="LJI-REQ")

Destination = _register(0x64, "destination", "Destination", _fixed(
    _flags16(),
    field("domain_id", U32),
    field("ipaddr", IPv4),
    field("port", U16),
    field("hops_taken", U16),
    field("orig_domain_id", U32),
    field("orig_ipaddr", IPv4),
    field("orig_port", U16),
    field("reserved", U16),
))

TopicIdx = _register(0x65, "topic_idx", "Topic index", _fixed(
    _flags8(),
    field("res", U8, tshark=None),
    field("tidx", U32),
))

TopicSource = _register(0x67, "topic_source", "Topic source", _fixed(
    _flags16(eos=0x4000), field("domain_id", U32)), label="TOPIC-SRC")

EXFUNC_FLAGS = {"ulb": 0x8, "umq": 0x4, "ume": 0x2, "lj": 0x1}

TopicSourceExfunc = _register(0x68, "topic_source_exfunc", "Topic source extended functionality",
                              _fixed(
    _flags16(),
    field("src_ip", IPv4),
    field("src_port", U16),
    field("unused", U16),
    field("functionality_flags", U32, bits=EXFUNC_FLAGS),
))

TcpSid = _register(0x6B, "tcp_sid", "TCP session ID", _fixed(_flags16(), field("sid", U32)),
                   label="TCP-SID")


EXTOPT_HEAD_SIZE = 8
EXTOPT_CODE = 0xFE
Extopt = _register(EXTOPT_CODE, "extopt", "Extended option", cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: EXTOPT_HEAD_SIZE + len(ctx.data))),
    field("flags", U8, bits={"ignore": 0x80, "ignore_subtype": 0x40, "more_fragments": 0x20}),
    field("id", U8),
    field("subtype", U16),
    field("fragment_offset", U16),
    # tshark shows the data raw only for subtypes it does not know; a configuration option
    # (CFGOPT_SUBTYPE) it shows field by field instead, see CfgOpt
    field("data", cs.Bytes(this.hdr_len - EXTOPT_HEAD_SIZE), tshark=None),
), label="EXTOPT", min_len=EXTOPT_HEAD_SIZE)
"""An extended option: a typed blob (``subtype``) that may be split over several headers
(``more_fragments``, ``fragment_offset``).  Subtype :data:`CFGOPT_SUBTYPE` carries one
configuration option by name and value (:class:`CfgOpt`)."""


# Codes tshark knows that we carry opaquely: code -> (name, tshark prefix, title, label).
KNOWN_CODES: dict[int, tuple[str, str, str, str | None]] = {
    0x03: ("unhandled", "lbmc.unhandled", "Unknown", None),  # TGIDX: tshark flags it
    0x08: ("umq_msgid", "lbmc.umq_msgid", "UMQ message ID", None),
    0x09: ("umq_sqd_rcv", "lbmc.umq_sqd_rcv", "UMQ SQD rcv", None),
    0x0A: ("umq_resub", "lbmc.umq_resub", "UMQ resub", None),
    0x0F: ("umq_ulb_msg", "lbmc.umq_ulb_msg", "UMQ ULB Message", None),
    0x10: ("ssf_init", "lbmc.ssf_init", "Source-side filtering init", "SSF-INIT"),
    0x11: ("ssf_creq", "lbmc.ssf_creq", "Source-side filtering control request", "SSF-CREQ"),
    0x30: ("umq_reg", "lbmc.umq_reg", "UMQ registration", "UMQ-REG"),
    0x31: ("umq_reg_resp", "lbmc.umq_reg_resp", "UMQ registration response", "UMQ-REG-RSP"),
    0x32: ("umq_ack", "lbmc.umq_ack", "UMQ ACK", "UMQ-ACK"),
    0x33: ("umq_rcr", "lbmc.umq_rcr", "UMQ receiver control record", "UMQ-RCR"),
    0x34: ("umq_ka", "lbmc.umq_ka", "UMQ keepalive", "UMQ-KA"),
    0x35: ("umq_rxreq", "lbmc.umq_rxreq", "UME retransmission request", "UMQ-RXREQ"),
    0x36: ("umq_qmgmt", "lbmc.umq_qmgmt", "UMQ queue management", "UMQ-QMGMT"),
    0x37: ("umq_resub_req", "lbmc.umq_resub_req", "UMQ resubmission request", "UMQ-RESUB-REQ"),
    0x38: ("umq_resub_resp", "lbmc.umq_resub_resp", "UMQ resubmission response",
           "UMQ-RESUB-RESP"),
    0x3A: ("pattern_interest", "lbmc.pattern_interest", "Pattern interest", "PAT-INT"),
    0x3B: ("advertisement", "lbmc.advertisement", "Advertisement", "AD"),
    0x3E: ("umq_ulb_rcr", "lbmc.umq_ulb_rcr", "UMQ ULB RCR", "UMQ-ULB-RCR"),
    0x3F: ("umq_lf", "lbmc.umq_lf", "UMQ load factor", "UMQ-LF"),
    0x40: ("ctxinfo", "lbmc.ctxinfo", "Context information", "CTXINFO"),
    0x44: ("tnwg_capabilities", "lbmc.tnwg_capabilities", "TNWG Capabilities", "TNWG_CAP"),
    0x45: ("patidx", "lbmc.patidx", "Pattern index", "PATIDX"),
    0x48: ("umq_idx_cmd", "lbmc.umq_idx_cmd", "UMQ index command", "UMQ-IDX-CMD"),
    0x49: ("umq_idx_cmd_resp", "lbmc.umq_idx_cmd_resp", "UMQ index command response",
           "UMQ-IDX-CMD-RESP"),
    0x4C: ("topic_md_interest", "lbmc.topic_md_interest", "Topic multi-domain interest",
           "TOPIC-MD-INT"),
    0x4D: ("pattern_md_interest", "lbmc.pattern_md_interest", "Pattern multi-domain interest",
           "PAT-MD-INT"),
    0x4F: ("tnwg_ka", "lbmc.tnwg_ka", "Gateway peer keepalive", "TNWG-KA"),
    0x51: ("umq_cmd", "lbmc.umq_cmd", "UMQ command", "UMQ-CMD"),
    0x52: ("umq_cmd_resp", "lbmc.umq_cmd_resp", "UMQ command response", "UMQ-CMD-RESP"),
    0x56: ("route_info", "lbmc.route_info", "Route information", "RTE-INFO"),
    0x57: ("route_info_neighbor", "lbmc.route_info_neighbor", "Route information neighbor", None),
    0x58: ("gateway_name", "lbmc.gateway_name", "Gateway name", None),
    0x60: ("auth", "lbmc.auth", "Authentication", "AUTH"),
    0x62: ("hmac", "lbmc.hmac", "HMAC", "HMAC"),
    0x63: ("umq_sid", "lbmc.umq_sid", "UMQ session ID", None),
}

# The smallest hdr_len tshark dissects without a Malformed exception, per opaque code: the fixed
# size of its layout, or of the fixed part of variable layouts (docs/wire-lbmc.md §1.6).  Shorter
# headers are refused like any header shorter than its layout.
OPAQUE_MIN_LEN: dict[int, int] = {
    0x08: 20, 0x09: 20, 0x0A: 16, 0x0F: 20, 0x10: 20, 0x11: 16, 0x30: 20, 0x31: 20, 0x32: 4,
    0x33: 48, 0x34: 20, 0x35: 12, 0x36: 4, 0x37: 32, 0x38: 28, 0x3A: 16, 0x3B: 48, 0x3E: 40,
    0x3F: 8, 0x40: 24, 0x44: 20, 0x45: 12, 0x48: 20, 0x49: 20, 0x4C: 8, 0x4D: 16, 0x4F: 64,
    0x51: 20, 0x52: 20, 0x56: 32, 0x57: 20, 0x58: 5, 0x60: 5, 0x62: 24, 0x63: 16,
}

# Authentication (0x60) headers are shown under a prefix chosen by the operation at offset 3.
AUTH_PREFIXES = {1: "lbmc.auth_request", 2: "lbmc.auth_challenge", 3: "lbmc.auth_challenge_rsp",
                 4: "lbmc.auth_result"}

# tshark's label priority for control messages (docs/wire-lbmc.md §1.9).
LABEL_ORDER = (
    "SSF-INIT", "SSF-CREQ", "PREG", "PREG-RESP", "ACK", "RXREQ", "UME-KA", "UME-CAP", "TSNI",
    "UMQ-REG", "UMQ-REG-RSP", "UMQ-ACK", "UMQ-KA", "UMQ-RCR", "UMQ-RXREQ", "UMQ-QMGMT", "LJINFO",
    "UMQ-RESUB-REQ", "UMQ-RESUB-RESP", "TOPIC-INT", "PAT-INT", "AD", "UMQ-ULB-RCR", "UMQ-LF",
    "CTXINFO", "PSER", "DOMAIN", "TNWG_CAP", "PATIDX", "UMQ-IDX-CMD", "UMQ-IDX-CMD-RESP",
    "TOPIC-MD-INT", "PAT-MD-INT", "LJI-REQ", "TNWG-KA", "AUTH", "UME-RCV-KA", "UMQ-CMD",
    "UMQ-CMD-RESP", "EXTOPT", "HMAC", "SRI-REQ", "SRI", "PSRC-ETOK", "TOPIC-SRC", "RTE-INFO",
    "TCP-SID",
)


def kind_by_code(code: int) -> HeaderKind | None:
    return _KINDS.get(code)


def header_class(code: int) -> type[Header] | None:
    return _CLASSES.get(code)


def header_kinds() -> list[HeaderKind]:
    """Every header kind with a field-by-field definition, by code."""
    return [_KINDS[c] for c in sorted(_KINDS)]


def is_defined_code(code: int) -> bool:
    """A code tshark's LBMC dissector knows (the LBT-TCP entry test also allows 0x00)."""
    return code in _KINDS or code in KNOWN_CODES


def label_of(code: int) -> str | None:
    kind = _KINDS.get(code)
    if kind is not None:
        return kind.label
    known = KNOWN_CODES.get(code)
    return known[3] if known else None


def title_of(code: int) -> str:
    if code == NHDR_DATA:
        return "Data"
    if code == NHDR_NONE:
        return "None"
    kind = _KINDS.get(code)
    if kind is not None:
        return kind.title
    known = KNOWN_CODES.get(code)
    return known[2] if known else "Unknown"


# --- messages -----------------------------------------------------------------------------------


@dataclass(eq=False)
class LbmcMessage:
    """One LBMC message: base header, ordered extended headers, payload.

    Attributes:
        type: the type nibble (:class:`MessageType`; any 0-15 value may be crafted).
        headers: extended headers in wire order.
        payload: bytes after a chain ending in DATA (0x00), message properties included.
        tidx, sqn: topic index and topic sequence number (data types only).
        version: the version nibble (0 for every real message).
        terminator: the code that ends the chain: 0x00 (payload follows), 0xFF (none), or, when
            parsed from a message that ran out mid-chain, the dangling code.  ``None`` picks 0x00
            for data types and 0xFF for CONTROL/EOT when building.
        trailer: bytes inside ``msglen`` after a chain that did not end in DATA; tshark ignores
            them but they are kept so parse/build round-trips.
        msglen: explicit ``msglen`` to craft a wrong length; ``None`` computes it.
    """

    type: int = MessageType.CONTROL
    headers: list[AnyHeader] = dc_field(default_factory=list)
    payload: bytes = b""
    tidx: int = 0
    sqn: int = 0
    version: int = 0
    terminator: int | None = None
    trailer: bytes = b""
    msglen: int | None = None

    @property
    def is_data_type(self) -> bool:
        return self.type in DATA_TYPES

    @property
    def base_size(self) -> int:
        return DATA_BASE.size if self.is_data_type else CONTROL_BASE.size

    def chain_end(self) -> int:
        if self.terminator is not None:
            return self.terminator
        return NHDR_DATA if self.is_data_type else NHDR_NONE

    def build(self) -> bytes:
        """The message's bytes.  Raises :class:`WireError` for values that cannot be encoded."""
        end = self.chain_end()
        if self.payload and end != NHDR_DATA:
            raise WireError("lbmc", 0, "a payload needs a chain ending in DATA (0x00)")
        if self.trailer and end == NHDR_DATA:
            raise WireError("lbmc", 0, "a chain ending in DATA (0x00) has a payload, not a trailer")
        codes = [h.header_code for h in self.headers] + [end]
        body = bytearray()
        for i, header in enumerate(self.headers):
            try:
                body += header.encode(codes[i + 1])
            except WireError as exc:
                raise exc.shifted(self.base_size + len(body), "lbmc") from None
        body += self.payload if end == NHDR_DATA else self.trailer
        total = self.base_size + len(body) if self.msglen is None else self.msglen
        if not 0 <= total <= 0xFFFF:
            raise WireError("lbmc", 2, f"msglen {total} does not fit 16 bits (max 65535)")
        if not (0 <= self.version <= 15 and 0 <= self.type <= 15):
            raise WireError("lbmc", 0, "version and type must each fit 4 bits")
        ver_type = (self.version << 4) | self.type
        try:
            if self.is_data_type:
                base = DATA_BASE.codec.pack(ver_type, codes[0], total, self.tidx, self.sqn)
            else:
                base = CONTROL_BASE.codec.pack(ver_type, codes[0], total)
        except struct.error as exc:
            raise WireError("lbmc", 0, f"cannot encode base header: {exc}") from None
        return base + bytes(body)

    def header(self, cls: builtins.type[Header]) -> Header | None:
        """The first header of the given class, or None."""
        for h in self.headers:
            if isinstance(h, cls):
                return h
        return None

    def label(self, transport_channel: bool = True) -> str:
        """tshark's Info-column label.  Off a transport channel (store and request connections)
        a data message without SRCIDX is a retransmission to tshark: ``RX-DATA``."""
        if self.chain_end() == NHDR_DATA:
            rx = not transport_channel and not any(h.header_code == 0x0E for h in self.headers)
            req = "[REQ]" if any(h.header_code == 0x04 for h in self.headers) else ""
            return f"{'RX-' if rx else ''}DATA{req}"
        labels = {label_of(h.header_code) for h in self.headers}
        for label in LABEL_ORDER:
            if label in labels:
                return label
        return ""

    def tshark_fields(self) -> list[tuple[str, Any]]:
        """The message as tshark field (display-filter name, value) pairs, in wire order."""
        first = self.headers[0].header_code if self.headers else self.chain_end()
        out: list[tuple[str, Any]] = [
            ("lbmc.version", self.version), ("lbmc.type", self.type),
            ("lbmc.next_hdr", first), ("lbmc.msglen", self.resolved_msglen()),
        ]
        if self.is_data_type:
            out += [("lbmc.tidx", self.tidx), ("lbmc.sqn", self.sqn)]
        codes = [h.header_code for h in self.headers] + [self.chain_end()]
        for i, h in enumerate(self.headers):
            out += h.tshark_fields(codes[i + 1])
        return out

    def resolved_msglen(self) -> int:
        return self.msglen if self.msglen is not None else len(self.build())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LbmcMessage):
            return NotImplemented
        return (
            (self.type, self.version, self.chain_end(), self.payload, self.trailer,
             self.headers, self.resolved_msglen())
            == (other.type, other.version, other.chain_end(), other.payload, other.trailer,
                other.headers, other.resolved_msglen())
            and (not self.is_data_type or (self.tidx, self.sqn) == (other.tidx, other.sqn))
        )

    __hash__ = None  # type: ignore[assignment]


def _decode_header(code: int, msg: bytes | memoryview, pos: int, hdr_len: int) -> AnyHeader:
    kind = _KINDS.get(code)
    if kind is None:
        if code in KNOWN_CODES and code != 0x03:
            need = OPAQUE_MIN_LEN[code]
            if hdr_len < need:
                raise WireError(KNOWN_CODES[code][1], pos,
                                f"hdr_len {hdr_len} is shorter than the {need}-byte minimum")
            return OpaqueHeader(code, bytes(msg[pos + 2 : pos + hdr_len]))
        raise WireError("lbmc", pos, f"unknown header code 0x{code:02x}")
    if hdr_len < kind.min_len:
        raise WireError(kind.tshark, pos,
                        f"hdr_len {hdr_len} is shorter than the {kind.min_len}-byte minimum")
    fast = kind.fast
    if fast is not None:
        values = fast.decode(msg, pos)
        values["trailing"] = bytes(msg[pos + fast.size : pos + hdr_len])
        # a fixed layout's hdr_len is by construction its size plus the trailing bytes, which
        # is exactly what building computes: leave it to be recomputed (see forget_computed)
        values["hdr_len"] = None
        return _CLASSES[code]._raw(values)
    else:
        assert kind.struct is not None
        try:
            parsed = kind.struct.parse(bytes(msg[pos : pos + hdr_len]))
        except cs.ConstructError as exc:
            raise WireError(kind.tshark, pos, f"does not decode: {exc}") from None
        values = {m.name: plain(parsed[m.name]) for m in members(kind.struct)}
    assert kind.struct is not None
    return _CLASSES[code]._raw(forget_computed(kind.struct, values))


def parse_message(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[LbmcMessage, int]:
    """Decode one LBMC message at ``offset``; returns it and its length (``msglen``).

    Raises :class:`WireError` (offsets relative to ``offset``) for anything tshark would flag
    as malformed or as an error: short buffers, msglen 0 or too small, unknown types or codes,
    zero or overlong ``hdr_len``, headers shorter than their layout.
    """
    view = memoryview(buf)[offset:]
    avail = len(view)
    if avail < CONTROL_BASE.size:
        raise WireError("lbmc", 0, f"{avail} bytes left; a message needs at least 4")
    ver_type, first, msglen = CONTROL_BASE.codec.unpack_from(view, 0)
    mtype = ver_type & 0x0F
    if msglen == 0:
        raise WireError("lbmc", 2, "msglen is zero")
    if mtype not in MessageType._value2member_map_:
        raise WireError("lbmc", 0, f"invalid LBMC type 0x{mtype:02x}")
    base = DATA_BASE.size if mtype in DATA_TYPES else CONTROL_BASE.size
    if msglen < base:
        raise WireError("lbmc", 2, f"msglen {msglen} is shorter than the {base}-byte base header")
    if msglen > avail:
        raise WireError("lbmc", 2, f"msglen {msglen} but only {avail} bytes present (truncated)")
    msg = bytes(view[:msglen])
    message = LbmcMessage(type=MessageType(mtype), version=ver_type >> 4)
    if base == DATA_BASE.size:
        _, _, _, message.tidx, message.sqn = DATA_BASE.codec.unpack_from(msg, 0)
    cur, pos = first, base
    while pos + BASIC.size <= msglen and cur not in (NHDR_DATA, NHDR_NONE):
        following, hdr_len, _ = BASIC.unpack_from(msg, pos)
        if hdr_len == 0:
            raise WireError(_prefix(cur), pos, "hdr_len is zero")
        if pos + hdr_len > msglen:
            raise WireError(_prefix(cur), pos,
                            f"hdr_len {hdr_len} runs past the end of the message ({msglen})")
        header = _decode_header(cur, msg, pos, hdr_len)
        if isinstance(header, Header):
            # the chain link is the next header's code (or the terminator): computed on build,
            # so a parsed message can be edited (headers added, removed) and rebuilt
            header.values["next_hdr"] = None
        message.headers.append(header)
        cur = following
        pos += hdr_len
    message.terminator = cur
    if cur == NHDR_DATA:
        message.payload = msg[pos:]
    else:
        message.trailer = msg[pos:]
    return message, msglen


def _prefix(code: int) -> str:
    kind = _KINDS.get(code)
    if kind is not None:
        return kind.tshark
    known = KNOWN_CODES.get(code)
    return known[1] if known else "lbmc"


def parse_messages(buf: bytes | bytearray | memoryview) -> list[LbmcMessage]:
    """Decode back-to-back messages filling ``buf`` (a UDP transport payload).

    Like tshark, stops quietly when fewer than 4 bytes remain; raises :class:`WireError` with
    the offset inside ``buf`` on the first bad message.
    """
    out = []
    for _, message in iter_messages(buf):
        out.append(message)
    return out


def iter_messages(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, LbmcMessage]]:
    """(offset, message) for each back-to-back message in ``buf``."""
    pos = 0
    while len(buf) - pos >= CONTROL_BASE.size:
        try:
            message, used = parse_message(buf, pos)
        except WireError as exc:
            raise exc.shifted(pos) from None
        yield pos, message
        pos += used


def build_messages(messages: Sequence[LbmcMessage]) -> bytes:
    return b"".join(m.build() for m in messages)


# --- application header chain elements (docs/wire-lbmc.md §3.2) -----------------------------------

AppHdrElement = cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: 4 + len(ctx.data))),
    field("res", U16),
    field("data", cs.Bytes(this.hdr_len - 4)),
)
"""A generic element of an apphdr_chain (types other than 6)."""

AppHdrMsgPropLen = cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: 8)),
    field("res", U16),
    field("proplen", U32),
)
"""Element type 6: length of the message-properties block at the tail of the payload."""

MSGPROP_ELEMENT = 0x06
MSGPROP_FAST = derive(AppHdrMsgPropLen)
ELEMENT_HEAD = derive(AppHdrElement)  # next_hdr, hdr_len, res (data follows)


@dataclass
class ChainElement:
    """One element of an application header chain.

    ``data`` is the body of generic elements; a message-properties-length element (type 6)
    carries ``proplen`` instead.  ``tag`` is the element's byte 0 as sent (None: its own type).

    HINT decided here: the fact sheet calls byte 0 of an element ``next_hdr`` (the *next*
    element's type), but tshark 4.0 reads the first element's type from ``first_chain_hdr`` and
    every later element's type from that element's *own* byte 0.  tshark is our oracle, so the
    builder writes each element's own type into its byte 0 and the parser reads types the way
    tshark does; a chain built the other way would have its message-properties element missed
    by tshark and its properties block shown as payload.
    """

    type: int
    data: bytes = b""
    proplen: int = 0
    res: int = 0
    tag: int | None = None


def build_apphdr_chain(elements: Sequence[ChainElement], next_hdr: int | None = None) -> Header:
    """An AppHdrChain header holding ``elements`` (element types as tshark reads them)."""
    blob = bytearray()
    for i, el in enumerate(elements):
        tag = el.type if el.tag is None else el.tag
        try:
            if el.type == MSGPROP_ELEMENT:
                blob += AppHdrMsgPropLen.build({"next_hdr": tag, "res": el.res,
                                                "proplen": el.proplen})
            else:
                if not el.data:
                    raise ValueError("a generic element needs at least one data byte "
                                     "(tshark: Header length incorrect)")
                blob += AppHdrElement.build({"next_hdr": tag, "res": el.res, "data": el.data})
        except (cs.ConstructError, ValueError) as exc:
            raise WireError("lbmc.apphdr_chain.element", 4 + len(blob),
                            f"element {i} cannot be encoded: {exc}") from None
    if len(blob) + 4 > 0xFF:
        raise WireError("lbmc.apphdr_chain", 1, f"{len(blob) + 4} bytes exceed hdr_len's 255")
    first = elements[0].type if elements else 0xFF
    return AppHdrChain(first_chain_hdr=first, elements=bytes(blob), next_hdr=next_hdr)


def parse_apphdr_chain(header: Header) -> list[ChainElement]:
    """The elements of an AppHdrChain header, walked as tshark does (see :class:`ChainElement`)."""
    data: bytes = header.elements
    cur, pos, out = header.first_chain_hdr, 0, []
    while pos < len(data):
        if pos and len(data) - pos >= ELEMENT_HEAD.size:
            cur = ELEMENT_HEAD.unpack_from(data, pos)[0]
        if cur == MSGPROP_ELEMENT:
            if pos + 8 > len(data):
                raise WireError("lbmc.apphdr_chain.msgprop", 4 + pos, "element truncated")
            tag, _, res, proplen = MSGPROP_FAST.unpack_from(data, pos)
            out.append(ChainElement(MSGPROP_ELEMENT, proplen=proplen, res=res, tag=tag))
            size = 8
        else:
            if pos + ELEMENT_HEAD.size > len(data):
                raise WireError("lbmc.apphdr_chain.element", 4 + pos, "element truncated")
            tag, size, res = ELEMENT_HEAD.unpack_from(data, pos)
            if size <= ELEMENT_HEAD.size or pos + size > len(data):
                raise WireError("lbmc.apphdr_chain.element", 4 + pos,
                                f"element hdr_len {size} is invalid")
            out.append(ChainElement(cur, data=data[pos + ELEMENT_HEAD.size : pos + size],
                                    tag=tag, res=res))
        pos += size
    return out


def msgprop_length(message: LbmcMessage) -> int:
    """Sum of the message-properties lengths announced in the message's apphdr chains."""
    total = 0
    for h in message.headers:
        if isinstance(h, Header) and h.kind.code == AppHdrChain.kind.code:
            total += sum(e.proplen for e in parse_apphdr_chain(h) if e.type == MSGPROP_ELEMENT)
    return total


# --- configuration options in extended options (docs/wire-lbmc.md §2.3) -----------------------

CFGOPT_SUBTYPE = 0x0100
"""``Extopt.subtype`` of a configuration option (tshark: "Configuration option")."""


class CfgScope(IntEnum):
    """``lbmc.extopt.cfgopt.scope``: the object the option belongs to, as UM configuration
    files name them (``source ume_flight_size_bytes 1000000``)."""

    SOURCE = 1
    RECEIVER = 2
    CONTEXT = 3
    WILDCARD_RECEIVER = 4
    EVENT_QUEUE = 5


CfgOptBody = cs.Struct(
    field("scope", U8),
    field("parent", U8),
    field("name", cstring()),
    field("value", cstring()),
)
"""The data of a CFGOPT extended option.  tshark 4.0 shows ``cfgopt.parent`` with the value of
the *scope* byte (it reads the wrong offset), then name and value from offset 2; the parent
byte itself is not shown.  We write 0 there."""


@dataclass(frozen=True)
class CfgOpt:
    """One configuration option carried in an EXTOPT header (subtype :data:`CFGOPT_SUBTYPE`).

    Attributes:
        scope: a :class:`CfgScope` value.
        name: the option's UM name (``ume_flight_size_bytes``).
        value: its value as UM configuration text (``1000000``).
        parent: the byte after the scope (0 in everything we build).
    """

    scope: int
    name: str
    value: str
    parent: int = 0

    def header(self) -> Header:
        """The EXTOPT header carrying this option (one header: no fragments)."""
        data = CfgOptBody.build({"scope": self.scope, "parent": self.parent,
                                 "name": self.name, "value": self.value})
        if EXTOPT_HEAD_SIZE + len(data) > 0xFF:
            raise ValueError(f"configuration option {self.name!r} does not fit one header")
        return Extopt(subtype=CFGOPT_SUBTYPE, data=data)


def shown_cfgopts(data: bytes) -> tuple[list[CfgOpt], str | None]:
    """The configuration options tshark 4.0 shows for a CFGOPT extended option's ``data``,
    and why it then throws a Malformed exception (None when it does not).

    tshark walks records while more than two bytes are left: scope, one byte, a NUL-terminated
    name, a NUL-terminated value; a name or value without its NUL throws.  So several options
    may share one header, and one or two bytes left over are ignored silently.  (What *we*
    accept as an RPP registration's option is stricter: :func:`parse_cfgopt`.)"""
    out: list[CfgOpt] = []
    pos = 0
    while len(data) - pos > 2:
        name_end = data.find(b"\0", pos + 2)
        value_end = data.find(b"\0", name_end + 1) if name_end >= 0 else -1
        if value_end < 0:
            return out, (f"configuration option at data offset {pos}: name or value is not "
                         f"NUL-terminated")
        out.append(CfgOpt(data[pos], bytes_text(data[pos + 2 : name_end]),
                          bytes_text(data[name_end + 1 : value_end]), data[pos + 1]))
        pos = value_end + 1
    return out, None


def cfgopt_fields(data: bytes) -> list[tuple[str, Any]]:
    """tshark's fields for the options of a CFGOPT extended option (see
    :func:`shown_cfgopts`; ``parent`` shows the scope byte's value)."""
    out: list[tuple[str, Any]] = []
    for option in shown_cfgopts(data)[0]:
        out += [("lbmc.extopt.cfgopt.scope", option.scope),
                ("lbmc.extopt.cfgopt.parent", option.scope),
                ("lbmc.extopt.cfgopt.name", option.name),
                ("lbmc.extopt.cfgopt.value", option.value)]
    return out


def tshark_exception(message: LbmcMessage) -> str | None:
    """Why tshark throws a Malformed exception inside this (parsed) message, or None: the
    content checks :func:`parse_message` leaves to the headers' consumers (a configuration
    option without its NULs)."""
    for header in message.headers:
        if isinstance(header, Header) and header.kind.code == EXTOPT_CODE \
                and header.subtype == CFGOPT_SUBTYPE:
            problem = shown_cfgopts(bytes(header.data))[1]
            if problem is not None:
                return f"lbmc.extopt.cfgopt: {problem}"
    return None


def parse_cfgopt(header: Header) -> CfgOpt:
    """The option an EXTOPT header carries; :class:`WireError` when it is not a whole,
    well-formed configuration option: another subtype, a fragment, a name or value without
    its NUL, bytes after the value, or text that is not UTF-8."""
    where = "lbmc.extopt.cfgopt"
    if header.subtype != CFGOPT_SUBTYPE:
        raise WireError("lbmc.extopt.subtype", 6, f"subtype {header.subtype:#x} is not a "
                                                  f"configuration option")
    if header.more_fragments or header.fragment_offset:
        raise WireError("lbmc.extopt.fragment_offset", 6,
                        "a fragmented configuration option is not supported")
    data = bytes(header.data)
    if len(data) < 4:
        raise WireError(where, EXTOPT_HEAD_SIZE, f"{len(data)} bytes: too short")
    name_end = data.find(b"\0", 2)
    value_end = data.find(b"\0", name_end + 1) if name_end >= 0 else -1
    if value_end < 0:
        raise WireError(where, EXTOPT_HEAD_SIZE, "name or value is not NUL-terminated")
    if value_end != len(data) - 1:
        raise WireError(where, EXTOPT_HEAD_SIZE + value_end + 1,
                        f"{len(data) - value_end - 1} bytes after the value")
    try:
        name = data[2:name_end].decode("utf-8")
        value = data[name_end + 1 : value_end].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(where, EXTOPT_HEAD_SIZE, "name or value is not UTF-8 text") from None
    if not name:
        raise WireError(where, EXTOPT_HEAD_SIZE + 2, "empty option name")
    return CfgOpt(data[0], name, value, data[1])


def cfgopts(message: LbmcMessage) -> list[CfgOpt]:
    """Every configuration option in ``message``, in order (:class:`WireError` for a garbled
    one; other extended options are skipped)."""
    return [parse_cfgopt(h) for h in message.headers
            if isinstance(h, Header) and h.kind.code == Extopt.kind.code
            and h.subtype == CFGOPT_SUBTYPE]
