"""Scapy layers for LBMC, LBT-TCP, LBT-RU, LBT-RM and LBMR, derived from the Construct structs.

Nothing in this module writes a layout.  :func:`scapy_fields` reads a Construct struct built
with :func:`wire.fields.field` and turns each member into the matching Scapy field:

==========================================  ===================================================
Construct member                             Scapy field
==========================================  ===================================================
u8/u16/u32/u64 (``FormatField``)            ``ByteField`` ... ``LongField`` (``X*`` when the
                                             member has bit views; ``show()`` lists the views)
``IPv4``                                     ``IPField`` (also accepts an int, like Construct)
``Bytes(n)``                                 ``XStrFixedLenField`` (``StrFixedLenField`` for text)
``Bytes(expr)`` / ``text(expr)``             ``XStrLenField`` / ``StrLenField`` whose
                                             ``length_from`` *evaluates the Construct
                                             expression* on the packet's field values
``NullTerminated`` names (LBMR)              ``StrNullField``
``GreedyBytes``                              ``XStrField`` (the rest of the layer)
``Array(count, Struct)``                     ``PacketListField`` of a derived sub-layer,
                                             ``count_from`` = the Construct count expression
``Array(count, u32)``                        ``FieldListField``
``Auto(...)`` (lengths, counts)              default ``None``; ``post_build`` calls the
                                             member's own ``compute`` function
==========================================  ===================================================

What *is* written here is how layers follow each other, mirroring the codecs:

* **LBMC** (:class:`LBMC` plus one layer per extended header, ``LBMC_UmePreg`` ...): a header's
  code is carried by its predecessor (the base header's or previous header's ``next_hdr``;
  :meth:`LbmcHeaderLayer.guess_payload_class` dispatches on it), 0x00 ends the chain with a
  payload (``Raw``), 0xFF ends it without one (bytes left inside ``msglen`` become
  :class:`LBMC_Trailer`).  Codes tshark knows but :mod:`wire.lbmc` carries opaquely get opaque
  layers (``LBMC_UmqReg`` ...).  Left ``None``, ``next_hdr`` is filled from the next layer and
  ``msglen`` from the message size; set them to craft invalid packets.  ``tidx``/``sqn`` exist
  only for data types.  Bytes beyond ``msglen`` are split off as padding, which is how
  :class:`LBTTCP` and :class:`LBMCMessages` find back-to-back messages.
* **LBT-RU / LBT-RM** (``LBTRU``, ``LBTRM``): one layer per packet type, read off the codec's
  record classes (:func:`transports`); bytes given to the base layer dispatch on the type
  nibble.  Options chain by ``next_hdr`` like LBMC; after them a DATA carries
  :class:`LBMCMessages`, anything else a ``Raw`` trailer.
* **LBMR** (``LBMR``, :func:`lbmr_layers`): one layer per packet type and per record of
  :mod:`wire.lbmr`; records that own children (TIR, QIR, TMB, PSER) get them as extra fields
  (options block, transport info, group/queue blocks, TMRs).  Packet options follow as
  :class:`LBMR_Options`.

Bit views of flag words are readable and writable as attributes (``pkt.w_flag``,
``LBMC_UmePreg(s_flag=1)``), as on the :mod:`wire` record classes.  :func:`to_scapy` turns a
:mod:`wire` object (LBMC message, transport datagram, LBMR packet) into layers field by field,
:func:`to_message` a dissected :class:`LBMC` back into an :class:`~wire.lbmc.LbmcMessage`.

Importing the module binds the layers to tshark's default ports (:class:`wire.tshark.PortMap`):
LBT-TCP on TCP source 14371-14390 and request 14391-14395 (:func:`bind_store_port` adds store
ports, which have no default); LBT-RU between 14380-14389 and 14360-14379 (either direction);
LBT-RM to 14400 and to 14390-14399 (unicast NAKs); LBMR to 12965 and between 14402-14406 and
15380.  Ports only: tshark's further heuristics (addresses, header checks) are not applied by
these bindings; :func:`bind_detector` makes Scapy ask :mod:`wire.detect` instead, the one UM
detector ``ump dissect`` and ``ump analyze`` use (port rules with addresses, content rules).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import construct as cs
from construct import this
from scapy.fields import (
    ByteField,
    ConditionalField,
    Field,
    FieldListField,
    IntField,
    IPField,
    LEIntField,
    LELongField,
    LEShortField,
    LESignedIntField,
    LESignedLongField,
    LESignedShortField,
    LongField,
    PacketField,
    PacketLenField,
    PacketListField,
    ShortField,
    SignedByteField,
    SignedIntField,
    SignedLongField,
    SignedShortField,
    StrField,
    StrFixedLenField,
    StrLenField,
    StrNullField,
    XByteField,
    XIntField,
    XLEIntField,
    XLELongField,
    XLEShortField,
    XLongField,
    XShortField,
    XStrField,
    XStrFixedLenField,
    XStrLenField,
)
from scapy.layers.inet import IP, TCP, UDP
from scapy.packet import NoPayload, Packet, Padding, Raw, RawVal, bind_bottom_up, raw

from . import lbmc
from .detect import Detector
from .fastpath import derive
from .fields import (
    U8,
    Auto,
    Bit,
    bit_views,
    bytes_text,
    field,
    members,
    text_bytes,
    unwrap,
    value_kind,
)
from .pcap import Segment
from .tshark import PortMap

__all__ = [
    "LBMC",
    "LBTTCP",
    "ConstructLayer",
    "LBMCMessages",
    "LBMC_Trailer",
    "LBMR_Options",
    "LbmcHeaderLayer",
    "LbmrLayers",
    "PortSet",
    "Transport",
    "TransportLayer",
    "bind_detector",
    "bind_store_port",
    "construct_values",
    "derive_layer",
    "from_values",
    "layer_for_code",
    "lbmc_layers",
    "lbmr_layers",
    "scapy_fields",
    "to_message",
    "to_scapy",
    "transports",
    "unbind_detector",
]

# --- generic Construct -> Scapy ---------------------------------------------------------------

# (byte order, struct letter) -> (plain field, hex field)
_INT_FIELDS: dict[tuple[str, str], tuple[type[Field[Any, Any]], type[Field[Any, Any]]]] = {
    (">", "B"): (ByteField, XByteField),
    (">", "H"): (ShortField, XShortField),
    (">", "I"): (IntField, XIntField),
    (">", "L"): (IntField, XIntField),
    (">", "Q"): (LongField, XLongField),
    (">", "b"): (SignedByteField, SignedByteField),
    (">", "h"): (SignedShortField, SignedShortField),
    (">", "i"): (SignedIntField, SignedIntField),
    (">", "l"): (SignedIntField, SignedIntField),
    (">", "q"): (SignedLongField, SignedLongField),
    ("<", "B"): (ByteField, XByteField),
    ("<", "H"): (LEShortField, XLEShortField),
    ("<", "I"): (LEIntField, XLEIntField),
    ("<", "L"): (LEIntField, XLEIntField),
    ("<", "Q"): (LELongField, XLELongField),
    ("<", "b"): (SignedByteField, SignedByteField),
    ("<", "h"): (LESignedShortField, LESignedShortField),
    ("<", "i"): (LESignedIntField, LESignedIntField),
    ("<", "l"): (LESignedIntField, LESignedIntField),
    ("<", "q"): (LESignedLongField, LESignedLongField),
}

_REPR_CLASSES: dict[type, type] = {}


class _ReprMixin:
    """Mixin for integer fields: ``show()`` appends a label of the value if one is defined,
    else the non-zero bit views (``flags = 0x50 (f_flag=1 w_flag=1)``)."""

    ump_views: Mapping[str, Bit] = {}
    ump_label: Callable[[int], str | None] | None = None

    def i2repr(self, pkt: Packet | None, x: Any) -> str:
        text = str(super().i2repr(pkt, x))  # type: ignore[misc]
        if x is None or isinstance(x, RawVal):
            return text
        raw = int(x)
        label = self.ump_label(raw) if self.ump_label is not None else None
        if label:
            return f"{text} ({label})"
        shown = [
            f"{name}={bit.get(raw)}" for name, bit in self.ump_views.items()
            if bit.get(raw) and (bit.when is None or bit.when(raw))
        ]
        return f"{text} ({' '.join(shown)})" if shown else text


def _annotated(cls: type[Field[Any, Any]], name: str, default: Any, views: Mapping[str, Bit],
               label: Callable[[int], str | None] | None) -> Field[Any, Any]:
    sub = _REPR_CLASSES.get(cls)
    if sub is None:
        sub = type(f"Annotated{cls.__name__}", (_ReprMixin, cls), {})
        _REPR_CLASSES[cls] = sub
    fld: Field[Any, Any] = sub(name, default)
    fld.ump_views = dict(views)  # type: ignore[attr-defined]
    fld.ump_label = label  # type: ignore[attr-defined]
    return fld


class _IPv4Field(IPField):
    """``IPField`` that, like :class:`wire.fields.IPv4Adapter`, also takes an int."""

    def h2i(self, pkt: Packet | None, x: Any) -> Any:
        if isinstance(x, int):
            return str(ipaddress.IPv4Address(x))
        if isinstance(x, ipaddress.IPv4Address):
            return str(x)
        return super().h2i(pkt, x)


class _TextMixin:
    """Text members (:func:`wire.fields.text`): a ``str`` is held as its wire bytes, mapped as
    :func:`wire.fields.text_bytes` says (the one definition of that mapping)."""

    def h2i(self, pkt: Packet | None, x: Any) -> Any:
        return text_bytes(x) if isinstance(x, str) else x

    def any2i(self, pkt: Packet | None, x: Any) -> Any:
        return text_bytes(x) if isinstance(x, str) else x


class _TextLenField(_TextMixin, StrLenField):
    pass


class _TextFixedLenField(_TextMixin, StrFixedLenField):
    pass


class _TextField(_TextMixin, StrField):
    pass


class _TextNullField(_TextMixin, StrNullField):
    pass


def _null_terminated(member: cs.Construct) -> bool:
    node = member
    while isinstance(node, cs.Subconstruct):
        if isinstance(node, cs.NullTerminated):
            return True
        node = node.subcon
    return False


class _StructListField(PacketListField):
    """A Construct array of structs; also takes member dicts (``naks=[{"nak": 1}]``)."""

    def any2i(self, pkt: Packet | None, x: Any) -> Any:
        items = x if isinstance(x, list) else [x]
        if any(isinstance(v, Mapping) for v in items):
            element: Any = self.cls  # (not set yet while Field.__init__ converts the default)
            items = [from_values(element, v) if isinstance(v, Mapping) else v for v in items]
        return super().any2i(pkt, items)


def _evaluate(expr: Any, pkt: Packet) -> int:
    """A Construct length/count (an int or a ``this`` expression) on a packet's values."""
    if not callable(expr):
        return int(expr)
    try:
        value = int(expr(_context(pkt)))
    except (KeyError, TypeError, AttributeError):
        return 0
    return max(0, value)


def _length_from(expr: Any) -> Callable[[Packet], int]:
    return lambda pkt: _evaluate(expr, pkt)


def _pick(default: Any, neutral: Any) -> Any:
    return neutral if default is _UNSET else default


def _member_field(member: cs.Renamed, owner: str, default: Any,
                  labels: Mapping[str, Callable[[int], str | None]],
                  ) -> tuple[Field[Any, Any], str]:
    """The Scapy field for one struct member, and its value kind (see :func:`construct_values`)."""
    name: str = member.name
    inner = unwrap(member)
    auto = isinstance(member.subcon, Auto)
    if isinstance(inner, cs.Array):
        element = inner.subcon
        count = _length_from(inner.count)
        if isinstance(element, cs.Struct):
            sub = derive_layer(element, f"{owner}_{name}", base=ConstructElement)
            return _StructListField(name, _pick(default, []), sub, count_from=count), "structs"
        item, _ = _member_field(cs.Renamed(element, newname=name), owner, _UNSET, labels)
        return FieldListField(name, _pick(default, []), item, count_from=count), "list"
    kind = value_kind(member)
    if isinstance(inner, cs.FormatField):
        order, letter = inner.fmtstr[0], inner.fmtstr[1:]
        if kind == "ipv4":
            return _IPv4Field(name, _pick(default, "0.0.0.0")), "ipv4"
        plain, hexa = _INT_FIELDS[(order if order in "<>" else ">", letter)]
        value = _pick(default, None if auto else 0)
        views = bit_views(member)
        label = labels.get(name)
        if views or label is not None:
            return _annotated(hexa, name, value, views, label), "int"
        return plain(name, value), "int"
    text = kind == "text"
    if _null_terminated(member):  # a NUL-terminated name: the NUL is not part of the value
        return _TextNullField(name, _pick(default, b"")), "text"
    if isinstance(inner, cs.Bytes):
        if isinstance(inner.length, int):
            fixed = _TextFixedLenField if text else XStrFixedLenField
            return fixed(name, _pick(default, bytes(inner.length)), length=inner.length), kind
        sized = _TextLenField if text else XStrLenField
        return sized(name, _pick(default, b""), length_from=_length_from(inner.length)), kind
    if isinstance(inner, type(cs.GreedyBytes)):
        return (_TextField if text else XStrField)(name, _pick(default, b"")), kind
    raise TypeError(f"{owner}.{name}: no Scapy mapping for {type(inner).__name__}")


_UNSET: Any = object()


def scapy_fields(
    struct_def: cs.Struct, owner: str = "layer", *,
    defaults: Mapping[str, Any] | None = None,
    conditions: Mapping[str, Callable[[Packet], bool]] | None = None,
    labels: Mapping[str, Callable[[int], str | None]] | None = None,
) -> tuple[list[Any], dict[str, str]]:
    """A Scapy ``fields_desc`` read off a Construct struct, plus each member's value kind.

    ``defaults`` overrides the neutral default of named members (``None`` makes a member
    computed at build time); ``conditions`` wraps named members in ``ConditionalField``;
    ``labels`` names integer values in ``show()`` (``next_hdr = 0x12 (UME persistent ...)``).
    Array elements become sub-layers named ``<owner>_<member>``.
    """
    fields_desc: list[Any] = []
    kinds: dict[str, str] = {}
    for sc in struct_def.subcons:
        if not getattr(sc, "name", None):
            raise TypeError(f"{owner}: unnamed struct member {sc!r} (use wire.fields.field)")
    for member in members(struct_def):
        default = (defaults or {}).get(member.name, _UNSET)
        fld, kind = _member_field(member, owner, default, labels or {})
        cond = (conditions or {}).get(member.name)
        fields_desc.append(ConditionalField(fld, cond) if cond is not None else fld)
        kinds[member.name] = kind
    return fields_desc, kinds


def _plain_field(fld: Any) -> Any:
    return fld.fld if isinstance(fld, ConditionalField) else fld


def construct_values(layer: Packet) -> dict[str, Any]:
    """One layer's member values in the form :mod:`wire` uses (text as ``str``, IPv4 as a dotted
    string, arrays of structs as lists of dicts).  Members a ``ConditionalField`` hides are left
    out; unset computed members are ``None``."""
    out: dict[str, Any] = {}
    kinds: Mapping[str, str] = getattr(layer, "ump_kinds", {})
    for fld in layer.fields_desc:
        if isinstance(fld, ConditionalField) and not fld._evalcond(layer):
            continue
        name = fld.name
        value = layer.fields[name] if name in layer.fields else layer.default_fields.get(name)
        if isinstance(value, RawVal):
            value = bytes(value)
        kind = kinds.get(name)
        if value is None:
            pass
        elif kind == "text" and isinstance(value, bytes):
            value = bytes_text(value)
        elif kind == "ipv4":
            value = str(value)
        elif kind == "structs":
            value = [construct_values(p) if isinstance(p, Packet) else p for p in value]
        elif kind == "list":
            value = list(value)
        out[name] = value
    return out


def _context(pkt: Packet) -> cs.Container:
    """The Construct context of a layer: its values, with ``_`` the enclosing layer's."""
    ctx = cs.Container(construct_values(pkt))
    parent = getattr(pkt, "parent", None)
    if isinstance(parent, ConstructLayer):
        ctx["_"] = _context(parent)
    return ctx


class ConstructLayer(Packet):
    """A Scapy layer whose fields were derived from a Construct struct.

    Class attributes set by :func:`derive_layer`: ``ump_struct`` (the definition),
    ``ump_kinds`` (value kind per member) and ``ump_views`` (bit view name -> member, Bit).
    """

    ump_struct: ClassVar[cs.Struct | None] = None
    ump_kinds: ClassVar[dict[str, str]] = {}
    ump_views: ClassVar[dict[str, tuple[str, Bit]]] = {}

    def __init__(self, _pkt: bytes = b"", *args: Any, **kwargs: Any) -> None:
        views = {k: kwargs.pop(k) for k in list(kwargs) if k in type(self).ump_views}
        super().__init__(_pkt, *args, **kwargs)
        for key, value in views.items():
            self.setfieldval(key, value)

    # bit views as attributes ------------------------------------------------------------------

    def __getattr__(self, attr: str) -> Any:
        view = type(self).ump_views.get(attr)
        if view is not None:
            raw = self.getfieldval(view[0])
            return None if raw is None else view[1].get(int(raw))
        return super().__getattr__(attr)

    def getfieldval(self, attr: str) -> Any:
        view = type(self).ump_views.get(attr)
        if view is not None:
            raw = super().getfieldval(view[0])
            return None if raw is None else view[1].get(int(raw))
        return super().getfieldval(attr)

    def setfieldval(self, attr: str, val: Any) -> None:
        view = type(self).ump_views.get(attr)
        if view is not None:
            member, bit = view
            raw = super().getfieldval(member)
            super().setfieldval(member, bit.put(int(raw or 0), int(val)))
            return
        super().setfieldval(attr, val)

    # computed members ---------------------------------------------------------------------------

    def ump_fills(self, own: bytes, pay: bytes) -> dict[str, Any]:
        """Values for members left ``None`` that the struct itself cannot compute (subclasses:
        ``next_hdr`` and ``msglen`` of LBMC).  ``own`` is this layer's bytes as built."""
        return {}

    def ump_extra_context(self) -> dict[str, Any]:
        """Names the ``compute`` functions of ``Auto`` members use beyond the struct's own
        members (sizes of children the struct does not hold, as in :mod:`wire.lbmr`)."""
        return {}

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        """Fill ``Auto`` members left ``None`` with their Construct ``compute`` function."""
        fills: dict[str, Any] = {}
        struct_def = type(self).ump_struct
        if struct_def is not None:
            ctx = _context(self)
            ctx.update(self.ump_extra_context())
            for member in members(struct_def):
                if isinstance(member.subcon, Auto) and ctx.get(member.name) is None:
                    ctx[member.name] = fills[member.name] = member.subcon.compute(ctx)
        own_names = {fld.name for fld in self.fields_desc}
        for name, value in self.ump_fills(p, pay).items():
            if name in own_names and self.getfieldval(name) is None:
                fills[name] = value
        if not fills:
            return p + pay
        own = b""
        for fld in self.fields_desc:
            value = fills[fld.name] if fld.name in fills else self.getfieldval(fld.name)
            own = own + bytes(value) if isinstance(value, RawVal) else fld.addfield(self, own,
                                                                                    value)
        return own + pay


class ConstructElement(ConstructLayer):
    """An array element (a struct inside a ``PacketListField``): owns no payload."""

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


def _view_index(struct_def: cs.Struct) -> dict[str, tuple[str, Bit]]:
    names = {m.name for m in members(struct_def)}
    index: dict[str, tuple[str, Bit]] = {}
    for member in members(struct_def):
        for view, bit in bit_views(member).items():
            if view not in names:
                index.setdefault(view, (member.name, bit))
    return index


def derive_layer(
    struct_def: cs.Struct, class_name: str, *, base: type[ConstructLayer] = ConstructLayer,
    display: str | None = None, defaults: Mapping[str, Any] | None = None,
    conditions: Mapping[str, Callable[[Packet], bool]] | None = None,
    labels: Mapping[str, Callable[[int], str | None]] | None = None,
    attrs: Mapping[str, Any] | None = None,
    children: Sequence[tuple[Any, str]] = (),
) -> type[Any]:
    """A new Scapy layer class whose ``fields_desc`` is read off ``struct_def``.

    ``children`` (Scapy field, value kind) are appended for records whose children the struct
    does not hold (a TIR's options block and transport info in :mod:`wire.lbmr`).
    """
    fields_desc, kinds = scapy_fields(struct_def, class_name, defaults=defaults,
                                      conditions=conditions, labels=labels)
    for fld, kind in children:
        fields_desc.append(fld)
        kinds[_plain_field(fld).name] = kind
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": f"Scapy layer derived from the Construct struct of {display or class_name}.",
        "name": display or class_name,
        "fields_desc": fields_desc,
        "ump_struct": struct_def,
        "ump_kinds": kinds,
        "ump_views": _view_index(struct_def),
        **(attrs or {}),
    }
    metaclass: Any = type(Packet)
    cls: type[Any] = metaclass(class_name, (base,), namespace)
    if class_name in _DERIVED:
        raise ValueError(f"layer name {class_name} derived twice")
    _DERIVED[class_name] = cls
    return cls


_DERIVED: dict[str, type[Any]] = {}


# --- LBMC ------------------------------------------------------------------------------------

OPAQUE_STRUCT = cs.Struct(
    field("next_hdr", U8),
    field("hdr_len", Auto(U8, lambda ctx: 2 + len(ctx.data))),
    field("data", cs.Bytes(this.hdr_len - 2), tshark=None),
)
"""How :class:`wire.lbmc.OpaqueHeader` frames a header it does not model (``data`` = everything
after ``next_hdr``/``hdr_len``).  :mod:`wire.lbmc` writes that framing in code, not as a struct,
so this is the one definition kept here."""

_TYPE_VIEW = lbmc.VER_TYPE_BITS["type"]


def _is_data_type(pkt: Packet) -> bool:
    raw = pkt.getfieldval("ver_type")
    return raw is not None and _TYPE_VIEW.get(int(raw)) in lbmc.DATA_TYPES


def _type_label(raw: int) -> str | None:
    mtype = _TYPE_VIEW.get(raw)
    known = lbmc.MessageType._value2member_map_.get(mtype)
    name = known.name if known is not None else f"type={mtype:#x}"
    version = lbmc.VER_TYPE_BITS["version"].get(raw)
    return f"{name} version={version}" if version else name


_LBMC_LABELS: dict[str, Callable[[int], str | None]] = {"next_hdr": lbmc.title_of}


class LBMC_Trailer(Raw):
    """Bytes inside ``msglen`` after a chain that did not end in DATA (tshark ignores them)."""

    name = "LBMC trailer"


def _message_of(layer: Packet) -> Packet | None:
    node: Packet | None = layer
    while node is not None and not isinstance(node, LBMC):
        node = node.underlayer
    return node


def _chain_end(layer: Packet) -> int:
    """The code a chain ends with when its last ``next_hdr`` is left to the builder."""
    message = _message_of(layer)
    if message is not None and _is_data_type(message):
        return lbmc.NHDR_DATA
    return lbmc.NHDR_NONE


def _next_code(layer: Packet) -> int:
    nxt = layer.payload
    if isinstance(nxt, LbmcHeaderLayer) and nxt.ump_code is not None:
        return nxt.ump_code
    if isinstance(nxt, NoPayload | LBMC_Trailer | Padding):
        return _chain_end(layer)
    return lbmc.NHDR_DATA


def _chain_class(code: int | None, payload: bytes) -> type[Packet]:
    """The layer for the bytes after a header whose successor code is ``code``."""
    if code == lbmc.NHDR_DATA:
        return Raw
    if code is None or code == lbmc.NHDR_NONE or len(payload) < lbmc.CONTROL_BASE.size:
        return LBMC_Trailer
    return layer_for_code(code)


class LbmcHeaderLayer(ConstructLayer):
    """An LBMC extended header.  ``ump_code`` is the code its predecessor carries."""

    ump_code: ClassVar[int | None] = None

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _chain_class(self.getfieldval("next_hdr"), payload)

    def ump_fills(self, own: bytes, pay: bytes) -> dict[str, Any]:
        return {"next_hdr": _next_code(self)}

    def mysummary(self) -> str:
        return f"{self.name} hdr_len={self.getfieldval('hdr_len')}"


_DATA_ONLY = {
    m.name: _is_data_type for m in members(lbmc.DataHeader)
    if m.name not in {c.name for c in members(lbmc.ControlHeader)}
}


class LBMC(ConstructLayer):
    """The LBMC base header (fields read off :data:`wire.lbmc.DataHeader`).

    Members of the data header that the control header lacks (``tidx``, ``sqn``) exist only
    when the type nibble of ``ver_type`` is a data type.
    """

    name = "LBMC"
    fields_desc, ump_kinds = scapy_fields(
        lbmc.DataHeader, "LBMC",
        defaults={"next_hdr": None, "msglen": None, "ver_type": int(lbmc.MessageType.CONTROL)},
        conditions=_DATA_ONLY, labels={**_LBMC_LABELS, "ver_type": _type_label},
    )
    ump_struct = lbmc.DataHeader
    ump_views = _view_index(lbmc.DataHeader)

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _chain_class(self.getfieldval("next_hdr"), payload)

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        """Split at ``msglen``: what follows is the next message (LBT-TCP/UDP framing)."""
        msglen = self.getfieldval("msglen")
        if msglen is None or self.raw_packet_cache is None:
            return s, None
        body = max(0, int(msglen) - len(self.raw_packet_cache))
        return s[:body], s[body:]

    def ump_fills(self, own: bytes, pay: bytes) -> dict[str, Any]:
        return {"next_hdr": _next_code(self), "msglen": len(own) + len(pay)}

    def mysummary(self) -> str:
        raw = self.getfieldval("ver_type")
        mtype = _type_label(int(raw)) if raw is not None else None
        return f"LBMC {mtype} msglen={self.getfieldval('msglen')}"


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


_LBMC_LAYERS: dict[int, type[LbmcHeaderLayer]] = {}

for _kind in lbmc.header_kinds():
    assert _kind.struct is not None
    _cls = lbmc.header_class(_kind.code)
    assert _cls is not None
    _LBMC_LAYERS[_kind.code] = derive_layer(
        _kind.struct, f"LBMC_{_cls.__name__}", base=LbmcHeaderLayer,
        display=f"LBMC {_kind.title}", defaults={"next_hdr": None}, labels=_LBMC_LABELS,
        attrs={"ump_code": _kind.code, "ump_kind": _kind},
    )
for _code, (_name, _prefix, _title, _label) in lbmc.KNOWN_CODES.items():
    # like lbmc.OpaqueHeader(code): by default data fills the code's minimum hdr_len
    _opaque_data = bytes(max(0, lbmc.OPAQUE_MIN_LEN.get(_code, 2) - 2))
    _LBMC_LAYERS[_code] = derive_layer(
        OPAQUE_STRUCT, f"LBMC_{_class_name(_name)}", base=LbmcHeaderLayer,
        display=f"LBMC {_title} (opaque)", defaults={"next_hdr": None, "data": _opaque_data},
        labels=_LBMC_LABELS, attrs={"ump_code": _code, "ump_kind": None},
    )

LBMC_Unknown = derive_layer(
    OPAQUE_STRUCT, "LBMC_Unknown", base=LbmcHeaderLayer,
    display="LBMC unknown header (not a code tshark knows)", defaults={"next_hdr": None},
    labels=_LBMC_LABELS,
    attrs={"ump_code": None, "ump_kind": None},
)


def layer_for_code(code: int) -> type[Packet]:
    """The Scapy layer of an LBMC extended-header code (``LBMC_Unknown`` if tshark has none)."""
    return _LBMC_LAYERS.get(code, LBMC_Unknown)


def lbmc_layers() -> dict[int, type[LbmcHeaderLayer]]:
    """Every LBMC header layer by code: field-by-field kinds and opaque known codes."""
    return dict(_LBMC_LAYERS)


# --- conversions between wire objects and Scapy layers ------------------------------------------


def from_values(cls: type[Packet], values: Mapping[str, Any]) -> Packet:
    """A layer of ``cls`` from member values in :mod:`wire` form (as :func:`construct_values`
    returns them); ``None`` values keep the layer default (computed members stay computed)."""
    kwargs: dict[str, Any] = {}
    kinds: Mapping[str, str] = getattr(cls, "ump_kinds", {})
    for fld in cls.fields_desc:
        value = values.get(fld.name)
        if value is None:
            continue
        if kinds.get(fld.name) == "structs":
            element = _plain_field(fld).cls
            value = [from_values(element, v) if isinstance(v, Mapping) else v for v in value]
        kwargs[fld.name] = value
    return cls(**kwargs)


def to_scapy(message: Any) -> Packet:
    """The Scapy layers of an :class:`~wire.lbmc.LbmcMessage`, a transport datagram
    (:class:`wire.lbtru.TransportPacket`) or an :class:`wire.lbmr.LbmrPacket`, field by field
    (not via bytes).

    Explicit values (a crafted ``msglen``, ``hdr_len``, count or ``next_hdr``) are kept;
    everything else is left for the Scapy build to compute.
    """
    if _lbmr is not None and isinstance(message, _lbmr.LbmrPacket):
        return _lbmr_to_scapy(message)
    if not isinstance(message, lbmc.LbmcMessage):
        return _transport_to_scapy(message)
    ver_type = lbmc.VER_TYPE_BITS["version"].put(0, message.version)
    ver_type = _TYPE_VIEW.put(ver_type, message.type)
    base: Packet = LBMC(ver_type=ver_type, msglen=message.msglen)
    if message.is_data_type:
        base.tidx, base.sqn = message.tidx, message.sqn
    chain: list[Packet] = [base]
    for header in message.headers:
        cls = layer_for_code(header.header_code)
        if isinstance(header, lbmc.OpaqueHeader):
            chain.append(cls(next_hdr=header.next_hdr, hdr_len=header.hdr_len, data=header.data))
        else:
            chain.append(from_values(cls, header.values))
    end = message.chain_end()
    tail: Packet | None = None
    if end == lbmc.NHDR_DATA and message.payload:
        tail = Raw(message.payload)
    elif end != lbmc.NHDR_DATA and message.trailer:
        tail = LBMC_Trailer(message.trailer)
    automatic = lbmc.NHDR_DATA if message.payload or message.is_data_type else lbmc.NHDR_NONE
    last = chain[-1]
    if end != automatic and last.getfieldval("next_hdr") is None:
        last.next_hdr = end
    packet = chain[0]
    for layer in [*chain[1:], tail]:
        if layer is not None:
            packet = packet / layer
    return packet


def to_message(packet: Packet) -> lbmc.LbmcMessage:
    """The :class:`~wire.lbmc.LbmcMessage` a dissected (or crafted) :class:`LBMC` layer holds.

    A plain conversion without validation: feed ``raw(packet)`` to
    :func:`wire.lbmc.parse_message` to check a packet as tshark would.
    """
    base = packet if isinstance(packet, LBMC) else packet[LBMC]
    raw_vt = int(base.getfieldval("ver_type") or 0)
    message = lbmc.LbmcMessage(
        type=_TYPE_VIEW.get(raw_vt), version=lbmc.VER_TYPE_BITS["version"].get(raw_vt),
        msglen=base.getfieldval("msglen"),
    )
    if message.is_data_type:
        message.tidx, message.sqn = base.getfieldval("tidx"), base.getfieldval("sqn")
    code = base.getfieldval("next_hdr")
    layer = base.payload
    while isinstance(layer, LbmcHeaderLayer):
        values = construct_values(layer)
        kind = layer.ump_kind
        if kind is not None:
            header_cls = lbmc.header_class(kind.code)
            assert header_cls is not None
            message.headers.append(header_cls(**values))
        elif layer.ump_code is not None:
            message.headers.append(lbmc.OpaqueHeader(layer.ump_code, values["data"],
                                                     values["next_hdr"], values["hdr_len"]))
        else:
            raise ValueError(f"header code 0x{code:02x} has no LBMC definition")
        code = values["next_hdr"]
        layer = layer.payload
    message.terminator = code
    if type(layer) is Raw:
        message.payload = bytes(layer.load)
    elif isinstance(layer, LBMC_Trailer):
        message.trailer = bytes(layer.load)
    return message


# --- ports -----------------------------------------------------------------------------------


class PortSet:
    """A set of ports usable as a ``bind_bottom_up`` value.

    Scapy picks a payload class when ``bound_value == packet_field_value``; this object answers
    that comparison with set membership, so one binding covers a port range (and can grow, see
    :func:`bind_store_port`).
    """

    def __init__(self, *ranges: Iterable[int]) -> None:
        self.ports: set[int] = set()
        for r in ranges:
            self.ports.update(r)

    def add(self, port: int) -> None:
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"port {port} out of range")
        self.ports.add(port)

    def __contains__(self, port: object) -> bool:
        return port in self.ports

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and other in self.ports

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        if not self.ports:
            return "PortSet()"
        return f"PortSet({min(self.ports)}..{max(self.ports)}, {len(self.ports)} ports)"


def _port_range(bounds: tuple[int, int]) -> range:
    return range(bounds[0], bounds[1] + 1)


# --- back-to-back LBMC messages: LBT-TCP and transport DATA payloads --------------------------


def _next_message(pkt: Packet, done: list[Any], cur: Packet | None,
                  remain: bytes) -> type[Packet] | None:
    """LBMC messages follow each other while a base header's worth of bytes remains."""
    return LBMC if len(remain) >= lbmc.CONTROL_BASE.size else None


class LBMCMessages(Packet):
    """LBMC messages back to back, each sized by its ``msglen`` (an LBT-RU/LBT-RM DATA payload).

    Fewer than 4 bytes left over (tshark stops there quietly) become the payload (``Raw``).
    """

    name = "LBMC messages"
    fields_desc = [PacketListField("messages", [], LBMC, next_cls_cb=_next_message)]

    def mysummary(self) -> str:
        return f"{self.name} {len(self.messages)} message(s)"


class LBTTCP(LBMCMessages):
    """LBT-TCP: LBMC messages back to back in a TCP segment (no header of its own,
    docs/wire-transports.md §3.3).  A message continued in the next segment is cut short."""

    name = "LBT-TCP"


_PORTS = PortMap()  # tshark's default preferences

LBTTCP_SOURCE_PORTS = PortSet(_port_range(_PORTS.lbttcp_source))
LBTTCP_REQUEST_PORTS = PortSet(_port_range(_PORTS.lbttcp_request))
LBTTCP_STORE_PORTS = PortSet(_PORTS.store_ports)

for _ports in (LBTTCP_SOURCE_PORTS, LBTTCP_REQUEST_PORTS, LBTTCP_STORE_PORTS):
    bind_bottom_up(TCP, LBTTCP, sport=_ports)
    bind_bottom_up(TCP, LBTTCP, dport=_ports)


def bind_store_port(port: int) -> None:
    """Dissect TCP traffic to or from ``port`` as LBT-TCP (a store's listening port).

    tshark's ``lbttcp.store_port_low/high`` default to 0-0, i.e. no store ports; this is the
    Scapy equivalent of setting them.
    """
    LBTTCP_STORE_PORTS.add(port)


# --- UDP transports (LBT-RU, LBT-RM): packet types, option chains -------------------------------


@dataclass
class Transport:
    """The Scapy layers derived from one :class:`wire.lbtru.TransportCodec`.

    Attributes:
        base: the layer of the common header; dissecting bytes with it dispatches on the type
            nibble to the packet-type layer (undefined types stay ``base``).
        types: type nibble -> packet-type layer (header plus that type's body).
        options: option code -> option layer; ``unknown_option`` takes every other code.
        by_record: :mod:`wire` record class -> layer, for :func:`to_scapy`.
    """

    name: str
    codec: Any
    base: type[Any]
    types: dict[int, type[Any]]
    options: dict[int, type[Any]]
    unknown_option: type[Any] | None
    by_record: dict[type, type[Any]]

    def __repr__(self) -> str:
        return f"Transport({self.name!r}, base={self.base.__name__})"

    def after(self, layer: Packet, code: int | None, payload: bytes) -> type[Packet]:
        """The layer of the bytes after ``layer`` whose ``next_hdr`` is ``code``."""
        if code == 0:
            packet = _transport_packet(layer)
            return LBMCMessages if packet is not None and packet.ump_carries_lbmc else Raw
        if code is None:
            return Raw
        return self.options.get(code) or self.unknown_option or Raw


class TransportLayer(ConstructLayer):
    """A packet-type or option layer of LBT-RU/LBT-RM, chained by ``next_hdr`` like LBMC.

    ``next_hdr`` left ``None`` is filled from the next layer: an option layer's code, else 0
    (end of options).  An option of a code without a definition (``*_UnknownOption``) has no
    code of its own: set its predecessor's ``next_hdr``.
    """

    ump_transport: ClassVar[Transport]
    ump_code: ClassVar[int | None] = None
    ump_carries_lbmc: ClassVar[bool] = False
    ump_is_packet: ClassVar[bool] = False
    ump_record: ClassVar[type | None] = None

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return type(self).ump_transport.after(self, self.getfieldval("next_hdr"), payload)

    def ump_fills(self, own: bytes, pay: bytes) -> dict[str, Any]:
        nxt = self.payload
        if isinstance(nxt, TransportLayer) and not nxt.ump_is_packet:
            if nxt.ump_code is None:
                if self.getfieldval("next_hdr") is None:
                    raise ValueError(f"{self.name}: the next option ({nxt.name}) has no code "
                                     "of its own; set next_hdr explicitly")
                return {}
            return {"next_hdr": nxt.ump_code}
        return {"next_hdr": 0}


def _transport_packet(layer: Packet | None) -> Any:
    while layer is not None and not (isinstance(layer, TransportLayer) and layer.ump_is_packet):
        layer = layer.underlayer
    return layer


def _stem(name: str, protocol: str) -> str:
    return name[len(protocol):] if name.lower().startswith(protocol) else name


def _transport_layers(codec: Any, unknown_type: Any, display: str) -> Transport:
    """Derive every layer of a transport from its codec's record classes (their structs)."""
    protocol: str = codec.protocol
    prefix = protocol.upper()
    common = unknown_type.struct
    type_view = next(bit for m in members(common) for name, bit in bit_views(m).items()
                     if name == "type")
    type_member = next(m.name for m in members(common) if "type" in bit_views(m))
    header = derive(common)
    type_names = {code: _stem(cls.__name__, protocol).upper()
                  for code, cls in codec.packets.items()}

    def type_label(raw: int) -> str | None:
        code = type_view.get(raw)
        return type_names.get(code, f"type={code:#x}")

    def dispatch(cls: type[Any], _pkt: bytes | None = None, *args: Any,
                 **kwargs: Any) -> type[Any]:
        if _pkt and len(_pkt) >= header.size:
            code = type_view.get(int(header.decode(_pkt)[type_member]))
            return transport.types.get(code, cls)
        return cls

    def option_label(code: int) -> str | None:
        if code == 0:
            return "end of options"
        record = codec.options.get(code, codec.unknown_option)
        return _stem(record.__name__, protocol) if record is not None else "unknown option"

    labels = {type_member: type_label, "next_hdr": option_label}
    base = derive_layer(
        common, prefix, base=TransportLayer, display=display,
        defaults={"next_hdr": None, type_member: unknown_type.type_code}, labels=labels,
        attrs={"dispatch_hook": classmethod(dispatch), "match_subclass": True,
               "ump_is_packet": True, "ump_record": unknown_type},
    )
    transport = Transport(protocol, codec, base, {}, {}, None, {unknown_type: base})
    base.ump_transport = transport
    for code, record in codec.packets.items():
        layer = derive_layer(
            record.struct, f"{prefix}_{_stem(record.__name__, protocol)}", base=base,
            display=f"{display} {type_names[code]}",
            defaults={"next_hdr": None, type_member: record.type_code}, labels=labels,
            attrs={"ump_carries_lbmc": record.carries_lbmc, "ump_record": record},
        )
        transport.types[code] = transport.by_record[record] = layer
    option_records = [*codec.options.items(), (None, codec.unknown_option)]
    for code, record in option_records:
        if record is None:
            continue
        layer = derive_layer(
            record.struct, f"{prefix}_{_stem(record.__name__, protocol)}", base=TransportLayer,
            display=f"{display} {_stem(record.__name__, protocol)}", defaults={"next_hdr": None},
            labels={"next_hdr": option_label},
            attrs={"ump_code": code, "ump_transport": transport, "ump_record": record},
        )
        transport.by_record[record] = layer
        if code is None:
            transport.unknown_option = layer
        else:
            transport.options[code] = layer
    return transport


def _transport_to_scapy(packet: Any) -> Packet:
    transport = _TRANSPORTS[packet.protocol]
    record = type(packet)
    chain: list[Packet] = [from_values(transport.by_record[record],
                                       record.struct_values(packet.values))]
    for option in packet.options:
        layer = from_values(transport.by_record[type(option)],
                            option.struct_values(option.values))
        if layer.ump_code is None and chain[-1].getfieldval("next_hdr") is None:
            chain[-1].next_hdr = option.code
        chain.append(layer)
    if isinstance(packet.payload, bytes):
        chain.append(Raw(packet.payload))
    elif packet.payload:
        chain.append(LBMCMessages(messages=[to_scapy(m) for m in packet.payload]))
    if packet.trailer:
        chain.append(Raw(packet.trailer))
    out = chain[0]
    for layer in chain[1:]:
        out = out / layer
    return out


_TRANSPORTS: dict[str, Transport] = {}


def transports() -> dict[str, Transport]:
    """The derived UDP transports by protocol name (``lbtru``, ``lbtrm``, ``lbmr``)."""
    return dict(_TRANSPORTS)


def _bind_udp(layer: type[Packet], *bindings: dict[str, Any]) -> None:
    for fval in bindings:
        bind_bottom_up(UDP, layer, **fval)


try:
    from . import lbtru as _lbtru
except ImportError:  # pragma: no cover - wire.lbtru is being written in parallel
    _lbtru = None  # type: ignore[assignment]

if _lbtru is not None:
    _TRANSPORTS["lbtru"] = _transport_layers(_lbtru.CODEC, _lbtru.LbtruUnknown, "LBT-RU")
    LBTRU = _TRANSPORTS["lbtru"].base
    LBTRU_SOURCE_PORTS = PortSet(_port_range(_PORTS.lbtru_source))
    LBTRU_RECEIVER_PORTS = PortSet(_port_range(_PORTS.lbtru_receiver))
    _bind_udp(LBTRU, {"sport": LBTRU_SOURCE_PORTS, "dport": LBTRU_RECEIVER_PORTS},
              {"sport": LBTRU_RECEIVER_PORTS, "dport": LBTRU_SOURCE_PORTS})

try:
    from . import lbtrm as _lbtrm
except ImportError:  # pragma: no cover - wire.lbtrm is being written in parallel
    _lbtrm = None  # type: ignore[assignment]

if _lbtrm is not None:
    _TRANSPORTS["lbtrm"] = _transport_layers(_lbtrm.CODEC, _lbtrm.LbtrmUnknown, "LBT-RM")
    LBTRM = _TRANSPORTS["lbtrm"].base
    LBTRM_DATA_PORTS = PortSet(_port_range(_PORTS.lbtrm_dport))
    LBTRM_NAK_PORTS = PortSet(_port_range(_PORTS.lbtrm_sport))
    _bind_udp(LBTRM, {"dport": LBTRM_DATA_PORTS}, {"dport": LBTRM_NAK_PORTS})


# --- LBMR (topic resolution) --------------------------------------------------------------------


def _peeker(struct_def: cs.Struct, member: str) -> Callable[[bytes], Any]:
    """Reads one member at the start of ``buf`` through the struct's derived layout (the
    members up to ``member``), or ``None`` when ``buf`` is too short."""
    head: list[cs.Renamed] = []
    for m in members(struct_def):
        head.append(m)
        if m.name == member:
            break
    layout = derive(cs.Struct(*head))

    def peek(buf: bytes) -> Any:
        return layout.decode(buf)[member] if len(buf) >= layout.size else None

    return peek


def _fixed_size(layer: Packet) -> int:
    """A layer's size without building it when every member of its struct is fixed-size (so
    an option-length option can size its siblings, itself included, without recursing)."""
    struct_def = getattr(layer, "ump_struct", None)
    if struct_def is not None:
        layout = _FIXED.get(id(struct_def))
        if layout is None:
            layout = _FIXED[id(struct_def)] = derive(struct_def)
        if len(layout.names) == len(list(members(struct_def))):
            return layout.size
    return len(raw(layer))


_FIXED: dict[int, Any] = {}


class LbmrRecord(ConstructElement):
    """An LBMR record held in a field of its parent (a TQR, a TIR, an option...).

    ``ump_record`` is the :mod:`wire.lbmr` record class whose struct the layer was read off,
    ``ump_code`` the type/code value that selects it.
    """

    ump_record: ClassVar[type | None] = None
    ump_code: ClassVar[int | None] = None


def _lbmr_packet(layer: Packet | None) -> Any:
    while layer is not None and not isinstance(layer, LbmrPacketLayer):
        layer = layer.underlayer
    return layer


def _options_or_trailer(layer: Packet) -> type[Packet]:
    packet = _lbmr_packet(layer)
    if packet is not None and _lbmr_opts(packet):
        return LBMR_Options
    return Raw


class LbmrExtRecord(ConstructLayer):
    """The record of an extended (type 7) LBMR packet; packet options or a trailer follow."""

    ump_record: ClassVar[type | None] = None
    ump_code: ClassVar[int | None] = None

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _options_or_trailer(self)


class LbmrPacketLayer(ConstructLayer):
    """An LBMR datagram's header (and, per type, its body).  Left ``None``, ``ver_type`` gets
    the layer's type and the options bit (set when an :class:`LBMR_Options` layer follows),
    the counts get the list lengths and ``ext_type`` the code of the next record."""

    ump_type_code: ClassVar[int] = 0
    ump_lists: ClassVar[dict[str, str]] = {}

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _options_or_trailer(self)

    def do_dissect_payload(self, s: bytes) -> None:
        """tshark's body view: a body running to the end of the datagram (an opaque queue
        management record) stops where a final option-length option says options begin."""
        cls = self.guess_payload_class(s) if s else None
        limit = _lbmr_body_limit(self, s)
        if cls is None or not getattr(cls, "ump_greedy", False) or limit is None:
            super().do_dissect_payload(s)
            return
        self.add_payload(cls(s[:limit], _internal=1, _underlayer=self))  # even when empty
        if limit < len(s):
            self.add_payload(LBMR_Options(s[limit:], _internal=1, _underlayer=self))

    def ump_fills(self, own: bytes, pay: bytes) -> dict[str, Any]:
        opts = isinstance(self.payload, LBMR_Options) or LBMR_Options in self.payload
        ver_type = _LBMR_VIEWS["type"].put(0, self.ump_type_code)
        fills = {"ver_type": _LBMR_VIEWS["opts"].put(ver_type, int(opts))}
        for count, items in self.ump_lists.items():
            fills[count] = len(self.getfieldval(items) or [])
        nxt = self.payload
        if isinstance(nxt, LbmrExtRecord) and nxt.ump_code is not None:
            fills["ext_type"] = nxt.ump_code
        return fills


class LBMR_Options(Packet):
    """The LBMR packet options that run to the end of the datagram (header bit 0x08)."""

    name = "LBMR options"
    fields_desc = [PacketListField("options", [], lambda m, **kw: _lbmr_option(m, **kw))]


def _lbmr_body_limit(packet: Packet, s: bytes) -> int | None:
    """How many bytes of ``s`` (the datagram after ``packet``'s own fields) the body may use,
    when the datagram ends in an option-length option as :func:`wire.lbmr.parse_packet`
    checks it; else ``None``."""
    assert _LBMR is not None
    optlen = _LBMR.packet_options[_LBMR.module.OptLen.kind.code]
    layout = derive(optlen.ump_struct)
    if not _lbmr_opts(packet) or len(s) < layout.size:
        return None
    tail = layout.decode(s[-layout.size:])
    if tail["type"] != optlen.ump_code or tail["len"] != layout.size:
        return None
    total = int(tail["total_len"])
    own = len(packet.raw_packet_cache or b"")
    if own + len(s) <= total:
        return None
    return max(0, len(s) - total)


class _AlwaysPacketLenField(PacketLenField):
    """``PacketLenField`` that makes a (default) layer of zero bytes too: a TIR's transport
    info of ``tlen`` 0 is an empty opaque block, as :mod:`wire.lbmr` reads it."""

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, Any]:
        length = self.length_from(pkt)
        if length:
            return super().getfield(pkt, s)
        return s, self.m2i(pkt, b"")


def _count_of(member: str) -> Callable[[Packet], int]:
    return lambda pkt: int(pkt.getfieldval(member) or 0)


def _present(view: str, child: str) -> Callable[[Packet], bool]:
    """ConditionalField test: a child exists when its presence bit is set; before the bit is
    computed (``None``), when the child was given."""
    def cond(pkt: Packet) -> bool:
        value = pkt.getfieldval(view)
        return pkt.fields.get(child) is not None if value is None else bool(value)
    return cond


@dataclass
class LbmrLayers:
    """The LBMR layers derived from :mod:`wire.lbmr` (see :func:`lbmr_layers`)."""

    module: Any
    base: type[Any]
    types: dict[int, type[Any]]
    by_record: dict[type, type[Any]]
    topic_options: dict[int, type[Any]]
    transports: dict[tuple[int, int], type[Any]]
    packet_options: dict[int, type[Any]]
    ext_records: dict[int, type[Any]]
    topt_block: type[Any]
    pser_block: type[Any]

    def __repr__(self) -> str:
        return f"LbmrLayers(base={self.base.__name__}, {len(self.by_record)} record layers)"


_LBMR: LbmrLayers | None = None
_LBMR_VIEWS: dict[str, Bit] = {}


def _lbmr_opts(packet: Packet) -> bool:
    """The options-present bit of an LBMR packet layer's ``ver_type``."""
    raw_vt = packet.getfieldval("ver_type")
    return raw_vt is not None and bool(_LBMR_VIEWS["opts"].get(int(raw_vt)))


def _flag_views(struct_def: cs.Struct, flag: int) -> tuple[str, str | None]:
    """The bit view of ``struct_def`` whose mask is ``flag`` (a presence bit) and the other view
    of the same member (what the rest of the word counts or names), found by mask rather than
    by name."""
    for member in members(struct_def):
        views = bit_views(member)
        for name, bit in views.items():
            if bit.mask == flag:
                others = [v for v in views if v != name]
                return name, (others[0] if others else None)
    raise LookupError(f"no bit view with mask {flag:#x}")


def _lbmr_option(m: bytes, _parent: Packet | None = None, **kwargs: Any) -> Packet:
    assert _LBMR is not None
    code = _LBMR_PEEK["option"](m)
    cls = _LBMR.packet_options.get(code) or _LBMR.by_record[_LBMR.module.OptUnknown]
    return cast(Packet, cls(m, _parent=_parent))


_LBMR_PEEK: dict[str, Callable[[bytes], Any]] = {}


def _derive_lbmr(m: Any) -> LbmrLayers:
    """Derive every LBMR layer from the record structs of :mod:`wire.lbmr`.

    The layouts come from the structs; what is written here is how records nest, as
    :mod:`wire.lbmr`'s walkers do it: which list a header count sizes, which presence bit
    guards an options block, which byte selects a topic option, transport info or packet
    option.
    """
    opts_view, _ = _flag_views(m.ExtHeader, m.OPTS_FLAG)
    _LBMR_VIEWS.update(opts=m.VER_TYPE_BITS[opts_view], type=m.VER_TYPE_BITS["type"])
    tir_opts, tir_type = _flag_views(m.Tir.kind.struct, m.TIR_OPTIONS_FLAG)
    qir_opts, qir_groups = _flag_views(m.Qir.kind.struct, m.QIR_OPTIONS_FLAG)
    pser_opts, _ = _flag_views(m.Pser.kind.struct, m.PSER_OPTIONS_FLAG)
    assert tir_type is not None and qir_groups is not None
    by_record: dict[type, type[Any]] = {}

    def record(rec: Any, *, base: type[ConstructLayer] = LbmrRecord,
               children: Sequence[tuple[Any, str]] = (),
               extra: Callable[[Any], dict[str, Any]] | None = None,
               defaults: Mapping[str, Any] | None = None) -> type[Any]:
        kind = rec.kind
        dflt = {k: v for k, v in kind.defaults.items() if k == "type" and v is not None}
        dflt.update(defaults or {})
        attrs: dict[str, Any] = {"ump_record": rec, "ump_code": kind.code}
        if extra is not None:
            attrs["ump_extra_context"] = extra
        layer = derive_layer(kind.struct, f"LBMR_{rec.__name__}", base=base,
                             display=f"LBMR {rec.__name__}", defaults=dflt, attrs=attrs,
                             children=children)
        by_record[rec] = layer
        return layer

    def sizes(items: Iterable[Packet] | None) -> int:
        return sum(_fixed_size(o) for o in items or ())

    # topic options and their block (TIR/QIR)
    topic_options = {code: record(rec) for code, rec in m.TOPIC_OPTIONS.items()}
    topt_unknown = record(m.ToptUnknown)
    peek_topt = _peeker(m.ToptUnknown.kind.struct, "type")

    def topt_class(data: bytes, _parent: Packet | None = None, **kw: Any) -> Packet:
        cls = topic_options.get(peek_topt(data)) or topt_unknown
        return cast(Packet, cls(data, _parent=_parent))

    topt_head = derive(m.ToptLenStruct)
    topt_block = derive_layer(
        m.ToptLenStruct, "LBMR_ToptLen", base=LbmrRecord, display="LBMR topic options",
        defaults={"len": topt_head.size},
        attrs={"ump_extra_context": lambda self: {"options_size": sizes(self.options)}},
        children=[(PacketListField("options", [], topt_class, length_from=lambda pkt: max(
            0, int(pkt.total_len or 0) - topt_head.size)), "packets")],
    )

    # transport info of a TIR: selected by (transport type, tlen)
    transports = {key: record(rec) for key, rec in m.TRANSPORTS.items()}
    opaque = record(m.OpaqueTransport)

    def info_class(data: bytes, _parent: Packet | None = None, **kw: Any) -> Packet:
        code = _parent.getfieldval(tir_type) if _parent is not None else None
        cls = transports.get((code, len(data))) or opaque
        return cast(Packet, cls(data, _parent=_parent))

    def tir_context(self: Packet) -> dict[str, Any]:
        info = self.getfieldval("info")
        code = getattr(info, "ump_code", None)
        return {"transport_code": code or 0, "has_options": self.fields.get("options") is not None,
                "info_size": len(raw(info)) if info is not None else 0}

    topic_queries = {rec: record(rec) for rec in (m.Tqr, m.WcTqr, m.Qqr)}
    tir = record(m.Tir, extra=tir_context, children=[
        (ConditionalField(PacketField("options", None, topt_block),
                          _present(tir_opts, "options")), "packet"),
        (_AlwaysPacketLenField("info", cast(Packet, None), info_class,
                               length_from=lambda pkt: int(pkt.tlen or 0)), "packet"),
    ])
    groups, queues = record(m.QirGroup), record(m.QirQueue)
    qir = record(m.Qir, extra=lambda self: {"has_options": self.fields.get("options") is not None},
                 children=[
        (ConditionalField(PacketField("options", None, topt_block),
                          _present(qir_opts, "options")), "packet"),
        (PacketListField("groups", [], groups, count_from=_count_of(qir_groups)), "packets"),
        (PacketListField("queues", [], queues, count_from=lambda pkt: int(pkt.queue_blks or 0)),
         "packets"),
    ])

    # topic management block (type 4)
    tmr = record(m.Tmr)
    tmb = record(m.Tmb, extra=lambda self: {"tmr_values": [
        {"len": len(raw(r))} for r in self.getfieldval("records") or ()]}, children=[
        (PacketListField("records", [], tmr, count_from=lambda pkt: int(pkt.tmrs or 0)),
         "packets"),
    ])

    # packet options (to the end of the datagram)
    packet_options = {code: record(rec) for code, rec in m.PACKET_OPTIONS.items()}
    record(m.OptUnknown)
    _LBMR_PEEK["option"] = _peeker(m.OptUnknown.kind.struct, "type")

    def optlen_context(self: Packet) -> dict[str, Any]:
        parent = self.parent
        siblings = parent.getfieldval("options") if isinstance(parent, LBMR_Options) else [self]
        return {"options_size": sizes(siblings)}

    packet_options[m.OptLen.kind.code].ump_extra_context = optlen_context

    # extended records (type 7); PSER with its options
    ctxinst, pser_unknown = record(m.PserCtxinst), record(m.PserOptUnknown)
    peek_pser = _peeker(m.PserCtxinst.kind.struct, "type")

    def pser_option_class(data: bytes, _parent: Packet | None = None, **kw: Any) -> Packet:
        known = peek_pser(data) in m.PserOptType._value2member_map_
        return cast(Packet, (ctxinst if known else pser_unknown)(data, _parent=_parent))

    pser_head = derive(m.PserOptLen.kind.struct)
    pser_block = record(m.PserOptLen, extra=lambda self: {"options_size": sizes(self.options)},
                        children=[
        (PacketListField("options", [], pser_option_class, length_from=lambda pkt: max(
            0, int(pkt.optlen or 0) - pser_head.size)), "packets"),
    ])
    ext_records: dict[int, type[Any]] = {}
    for code, rec in m.EXT_RECORDS.items():
        if rec is m.Pser:
            ext_records[code] = record(rec, base=LbmrExtRecord, extra=lambda self: {
                "has_options": self.fields.get("options") is not None}, children=[
                (ConditionalField(PacketField("options", None, pser_block),
                                  _present(pser_opts, "options")), "packet"),
            ])
        else:
            ext_records[code] = record(rec, base=LbmrExtRecord)
        last = list(members(rec.kind.struct))[-1]
        ext_records[code].ump_greedy = isinstance(unwrap(last), type(cs.GreedyBytes))

    # packets: dispatched on the type bits of ver_type
    type_view = m.VER_TYPE_BITS["type"]
    peek_type = _peeker(m.ExtHeader, "ver_type")
    types: dict[int, type[Any]] = {}

    def dispatch(cls: type[Any], _pkt: bytes | None = None, *args: Any,
                 **kwargs: Any) -> type[Any]:
        raw_vt = peek_type(_pkt) if _pkt else None
        return types.get(type_view.get(raw_vt), cls) if raw_vt is not None else cls

    def type_label(value: int) -> str | None:
        code = type_view.get(value)
        known = m.PacketType._value2member_map_.get(code)
        text = known.name if known is not None else f"type={code}"
        return f"{text} opts" if _LBMR_VIEWS["opts"].get(value) else text

    def packet(struct_def: cs.Struct, name: str, code: int, base: type[Any],
               lists: Mapping[str, tuple[str, type[Any]]] | None = None,
               children: Sequence[tuple[Any, str]] = (),
               computed: Sequence[str] = (), **attrs: Any) -> type[Any]:
        kids = list(children)
        for count, (items, cls) in (lists or {}).items():
            kids.append((PacketListField(items, [], cls, count_from=_count_of(count)), "packets"))
        defaults: dict[str, Any] = {"ver_type": None}
        defaults.update({name: None for name in [*(lists or {}), *computed]})
        return derive_layer(
            struct_def, name, base=base, display=f"LBMR {name[5:] or 'packet'}",
            defaults=defaults, labels={"ver_type": type_label, "ext_type": m.EXT_TITLES.get},
            children=kids,
            attrs={"ump_type_code": code, "match_subclass": True,
                   "ump_lists": {c: items for c, (items, _) in (lists or {}).items()},
                   **attrs},
        )

    pt = m.PacketType
    base = packet(m.LbmrHeader, "LBMR", pt.RCV_ALIVE, LbmrPacketLayer,
                  dispatch_hook=classmethod(dispatch))
    types[pt.NORMAL] = packet(m.LbmrHeader, "LBMR_Normal", pt.NORMAL, base, {
        "tqrs": ("tqr_list", topic_queries[m.Tqr]), "tirs": ("tir_list", tir)})
    types[pt.WC_TQR] = packet(m.LbmrHeader, "LBMR_WcTqrs", pt.WC_TQR, base, {
        "tqrs": ("tqr_list", topic_queries[m.WcTqr]), "tirs": ("tir_list", tir)})
    types[pt.UMQ] = packet(m.LbmrHeader, "LBMR_Umq", pt.UMQ, base, {
        "tqrs": ("tqr_list", topic_queries[m.Qqr]), "tirs": ("tir_list", qir)})
    types[pt.TOPIC_MGMT] = packet(m.LbmrHeader, "LBMR_TopicMgmt", pt.TOPIC_MGMT, base, children=[
        (PacketField("tmb", None, tmb), "packet")])
    types[pt.EXT] = packet(m.ExtHeader, "LBMR_Ext", pt.EXT, base, computed=["ext_type"])
    types[pt.EXT].guess_payload_class = _ext_payload_class
    for cls in types.values():
        by_record.setdefault(cls, cls)
    return LbmrLayers(m, base, types, by_record, topic_options, transports, packet_options,
                      ext_records, topt_block, pser_block)


def _ext_payload_class(self: Packet, payload: bytes) -> type[Packet]:
    assert _LBMR is not None
    cls = _LBMR.ext_records.get(self.getfieldval("ext_type"))
    return cast(type[Packet], cls) if cls is not None else _options_or_trailer(self)


def _lbmr_record_to_scapy(rec: Any) -> Packet:
    """One :mod:`wire.lbmr` record (children included) as its Scapy layer."""
    assert _LBMR is not None
    m = _LBMR.module
    layer = from_values(_LBMR.by_record[type(rec)], rec.values)
    if isinstance(rec, m.Tir | m.Qir):
        if rec.options is not None:
            layer.options = _LBMR.topt_block(
                total_len=rec.opt_total_len,
                options=[_lbmr_record_to_scapy(o) for o in rec.options])
        if isinstance(rec, m.Tir):
            layer.info = _lbmr_record_to_scapy(rec.info)
            if isinstance(rec.info, m.OpaqueTransport) and rec.values["transport"] is None:
                layer.transport = rec.resolved()["transport"]  # the code is not in the info
        else:
            layer.groups = [_lbmr_record_to_scapy(g) for g in rec.groups]
            layer.queues = [_lbmr_record_to_scapy(q) for q in rec.queues]
    elif isinstance(rec, m.Tmb):
        layer.records = [_lbmr_record_to_scapy(r) for r in rec.records]
    elif isinstance(rec, m.Pser) and rec.options is not None:
        layer.options = _LBMR.pser_block(type=rec.optlen_type, optlen=rec.optlen, options=[
            _lbmr_record_to_scapy(o) for o in rec.options])
    return layer


def _lbmr_to_scapy(packet: Any) -> Packet:
    assert _LBMR is not None
    m = _LBMR.module
    cls = _LBMR.types.get(packet.type, _LBMR.base)
    layer = cls(ver_type=packet.ver_type())
    chain: list[Packet] = [layer]
    if packet.type == m.PacketType.EXT:
        assert packet.ext is not None
        layer.ext_type = packet.ext.code
        if not isinstance(packet.ext, m.ExtUnknown):
            chain.append(_lbmr_record_to_scapy(packet.ext))
    elif packet.type == m.PacketType.TOPIC_MGMT:
        layer.tqrs, layer.tirs = packet.counts()
        layer.tmb = _lbmr_record_to_scapy(packet.tmb)
    elif cls.ump_lists:
        layer.tqr_list = [_lbmr_record_to_scapy(r) for r in packet.tqrs]
        layer.tir_list = [_lbmr_record_to_scapy(r) for r in packet.tirs]
        layer.tqrs, layer.tirs = packet.tqr_count, packet.tir_count
    else:
        layer.tqrs, layer.tirs = packet.counts()
    if packet.options_bit():
        chain.append(LBMR_Options(options=[_lbmr_record_to_scapy(o) for o in packet.options]))
    if packet.trailer:
        chain.append(Raw(packet.trailer))
    out = chain[0]
    for nxt in chain[1:]:
        out = out / nxt
    return out


def lbmr_layers() -> LbmrLayers | None:
    """The derived LBMR layers (``None`` if :mod:`wire.lbmr` did not import)."""
    return _LBMR


try:
    from . import lbmr as _lbmr
except ImportError:  # pragma: no cover - wire.lbmr is being written in parallel
    _lbmr = None  # type: ignore[assignment]

if _lbmr is not None:
    _LBMR = _derive_lbmr(_lbmr)
    LBMR = _LBMR.base
    LBMR_MC_PORTS = PortSet([_PORTS.lbmr_mc[1]])
    LBMR_DAEMON_PORTS = PortSet([_PORTS.lbmr_uc_dest_port])
    LBMR_CLIENT_PORTS = PortSet(_port_range(_PORTS.lbmr_uc_ports))
    _bind_udp(LBMR, {"dport": LBMR_MC_PORTS},
              {"sport": LBMR_CLIENT_PORTS, "dport": LBMR_DAEMON_PORTS},
              {"sport": LBMR_DAEMON_PORTS, "dport": LBMR_CLIENT_PORTS})


# --- the UM detector as Scapy's UDP payload guess ------------------------------------------------

_DETECTOR: list[Detector] = []  # the bound detector, if any (a list: no global statement)
_PORT_GUESS = UDP.guess_payload_class


def _detector_guess(self: Packet, payload: bytes) -> type[Packet]:
    """UDP's payload guess while a detector is bound: :mod:`wire.detect`'s verdict for IPv4
    datagrams; Scapy's own port bindings for anything else, minus the UM layers."""
    guess = _PORT_GUESS(self, payload)
    ip = self.underlayer
    if not _DETECTOR or not isinstance(ip, IP):
        return guess
    found = _DETECTOR[0].udp(Segment("udp", ip.src, ip.dst, self.sport, self.dport,
                                     bytes(payload)))
    if found is not None:
        return _UDP_LAYERS[found.protocol]
    return Raw if guess in _UDP_LAYERS.values() else guess


def bind_detector(ports: PortMap | None = None, content: bool = True) -> Detector:
    """Let :mod:`wire.detect` decide which UDP datagrams are LBT-RU, LBT-RM or LBMR, exactly
    as ``ump dissect`` and ``ump analyze`` decide: tshark's port rules with ``ports`` (address
    ranges and content tests included, which port bindings cannot express) and, unless
    ``content`` is false, the content rules that find UM on any port.  The store ports of
    ``ports`` are bound for LBT-TCP (:func:`bind_store_port`).  Returns the detector;
    :func:`unbind_detector` goes back to the port bindings."""
    detector = Detector(ports, content)
    _DETECTOR[:] = [detector]
    for port in detector.ports.store_ports:
        bind_store_port(port)
    UDP.guess_payload_class = _detector_guess  # type: ignore[method-assign]
    return detector


def unbind_detector() -> None:
    """Back to the default port bindings for UDP (store ports stay bound)."""
    _DETECTOR.clear()
    UDP.guess_payload_class = _PORT_GUESS  # type: ignore[method-assign]


_UDP_LAYERS: dict[str, type[Packet]] = {
    name: layer for name, layer in (("lbtru", globals().get("LBTRU")),
                                    ("lbtrm", globals().get("LBTRM")),
                                    ("lbmr", globals().get("LBMR"))) if layer is not None}


def _export_derived() -> None:
    """Every derived layer (sub-layers included) is a module attribute: ``LBMC_UmePreg``."""
    for name, cls in _DERIVED.items():
        globals()[name] = cls
        if name not in __all__:
            __all__.append(name)


_export_derived()
