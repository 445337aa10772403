"""Records backed by a Construct struct: the one base of every typed record in :mod:`wire`.

Every layout is written once, as a Construct struct (see :mod:`wire.fields`).  Three families
wrap such structs in Python objects: LBMC extended headers (:class:`wire.lbmc.Header`), LBMR
records (:class:`wire.lbmr.Record`) and the UDP transports' packets and options
(:class:`wire.transport.Record`).  Their core job is the same, so it lives here once:

* neutral defaults (:func:`default_for`) and the bit-view index (:func:`view_index`) are read
  off the struct once, when a class declares it;
* an instance holds its member values in one ``values`` dict, so the struct stays the single
  definition; members and named bit views are attributes and constructor keywords;
* computed members (:class:`~wire.fields.Auto`: lengths, counts, presence bits) stay ``None``
  in ``values`` until a caller sets them (to craft invalid packets) and read as building would
  write them (:meth:`StructRecord.resolved`);
* equality compares resolved values, so a built record equals the same record parsed back;
  records are mutable, so the hash is the identity;
* :meth:`StructRecord._export` lists values under their tshark display-filter names.

The families differ in small ways, expressed as overridable hooks rather than copies:
where the struct is declared (:meth:`~StructRecord._declared_struct`), a member default
(:meth:`~StructRecord._default`), the tshark prefix (:meth:`~StructRecord._field_prefix`),
extra context for formulas (:meth:`~StructRecord._context`), which members read as given even
when ``None`` (:attr:`~StructRecord._as_given`), what equality compares
(:meth:`~StructRecord._same_kind`, :meth:`~StructRecord._key`) and what ``repr`` shows
(:meth:`~StructRecord._shown`, :meth:`~StructRecord._repr_extras`).

Every name the base adds to its subclasses is private: LBMC headers have members such as
``code``, ``type`` and ``data``, and a public base attribute would shadow them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import construct as cs

from .fields import (
    Auto,
    Bit,
    bit_views,
    export_struct,
    fixed_format,
    members,
    resolve_computed,
    value_kind,
)

ViewIndex = dict[str, tuple[str, Bit]]
"""Bit-view name -> (name of the member holding the bits, :class:`~wire.fields.Bit`)."""


def default_for(member: cs.Construct) -> Any:
    """The neutral value of a struct member: what a record holds when the caller gives none.

    ``None`` for computed (``Auto``) members and for the chain link ``next_hdr``, because
    building fills them in (an LBMC message or a transport packet decides ``next_hdr`` from
    the header order); ``[]`` for arrays; 0, ``"0.0.0.0"`` and ``""`` for numbers, IPv4
    addresses and names; zero bytes for fixed-size byte strings (so the fast layout packs
    them); ``b""`` for variable ones.
    """
    inner = member.subcon
    if isinstance(inner, Auto) or member.name == "next_hdr":
        return None
    if isinstance(inner, cs.Array):
        return []
    kind = value_kind(member)
    if kind == "int":
        return 0
    if kind == "ipv4":
        return "0.0.0.0"
    if kind == "text":
        return ""
    letter = fixed_format(member)
    if letter is not None:
        return bytes(int(letter[:-1]))
    return b""


def view_index(struct_def: cs.Struct) -> ViewIndex:
    """Every named bit view of a struct's members; a name used twice keeps its first member."""
    index: ViewIndex = {}
    for member in members(struct_def):
        for view, bit in bit_views(member).items():
            index.setdefault(view, (member.name, bit))
    return index


def plain(value: Any) -> Any:
    """A Construct parse result as record values hold it: lists and dicts, without the
    ``_io``-style private keys Construct adds to its containers."""
    if isinstance(value, cs.ListContainer | list):
        return [plain(v) for v in value]
    if isinstance(value, cs.Container | dict):
        return {k: plain(v) for k, v in value.items() if not k.startswith("_")}
    return value


class StructRecord:
    """The values of one Construct struct as an object: members and bit views as attributes.

    A subclass declares its struct through :meth:`_declared_struct`; the class then gets
    ``_struct``, ``_defaults`` (from :meth:`_default`) and ``_views`` once, at creation.
    Classes that declare no struct (family bases) are abstract.

    Build one with keyword arguments naming members or bit views; members left out take
    their defaults, and bit views are applied over the member's value after all members are
    set (over 0 when that member is still ``None``), whatever the keyword order.
    """

    __slots__ = ("values",)
    values: dict[str, Any]

    _struct: ClassVar[cs.Struct]
    _defaults: ClassVar[dict[str, Any]]
    _views: ClassVar[ViewIndex]
    _slots: ClassVar[tuple[str, ...]] = ("values",)
    """Every ``__slots__`` name of the class and its bases: plain attributes, not members."""
    _as_given: ClassVar[frozenset[str]] = frozenset()
    """Members that read as stored even when ``None`` (instead of resolved): links whose value
    only an enclosing message can supply."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        struct_def = cls._declared_struct()
        if struct_def is not None:
            cls._struct = struct_def
            cls._defaults = {m.name: cls._default(m) for m in members(struct_def)}
            cls._views = view_index(struct_def)
        cls._slots = tuple(dict.fromkeys(
            name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())))

    # -- hooks ------------------------------------------------------------------------------

    @classmethod
    def _declared_struct(cls) -> cs.Struct | None:
        """The struct this very class declares (``None``: it inherits one or has none)."""
        return None

    @classmethod
    def _default(cls, member: cs.Construct) -> Any:
        """The default of one member of the declared struct (called once per class)."""
        return default_for(member)

    @classmethod
    def _field_prefix(cls) -> str:
        """The tshark prefix the struct's relative field names hang off."""
        raise NotImplementedError(cls.__name__)

    def _context(self) -> Mapping[str, Any] | None:
        """Extra names the computed members' formulas may read (children's sizes etc.)."""
        return None

    def _same_kind(self, other: StructRecord) -> bool:
        """Whether ``other`` is comparable at all (else ``==`` gets ``NotImplemented``)."""
        return type(other) is type(self)

    def _key(self) -> Any:
        """What equality compares: by default the resolved member values."""
        return self.resolved()

    def _shown(self, name: str, value: Any) -> bool:
        """Whether ``repr`` shows a member that is not ``None``."""
        return True

    def _repr_extras(self) -> list[str]:
        """``name=value`` parts ``repr`` appends after the members (children, payloads)."""
        return []

    # -- construction and attributes ----------------------------------------------------------

    def __init__(self, **kwargs: Any) -> None:
        values = dict(self._defaults)
        views: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in values:
                values[key] = value
            elif key in self._views:
                views[key] = value
            else:
                raise TypeError(f"{type(self).__name__} has no field {key!r}")
        for key, value in views.items():
            member, bit = self._views[key]
            base = values[member]
            values[member] = bit.put(0 if base is None else int(base), int(value))
        object.__setattr__(self, "values", values)

    @classmethod
    def _raw(cls, values: dict[str, Any]) -> Self:
        """An instance around decoded values, bypassing ``__init__`` (the parse hot path)."""
        obj = cls.__new__(cls)
        object.__setattr__(obj, "values", values)
        return obj

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: members, bit views, or nothing.
        try:
            values = object.__getattribute__(self, "values")
        except AttributeError:
            raise AttributeError(name) from None
        if name in values:
            value = values[name]
            # computed members (lengths, counts) read as building writes them
            if value is None and name not in self._as_given:
                return self.resolved()[name]
            return value
        if name.startswith("_"):
            raise AttributeError(name)
        view = self._views.get(name)
        if view is not None:
            member, bit = view
            raw = values[member]
            return bit.get(int(self.resolved()[member] if raw is None else raw))
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._slots:
            object.__setattr__(self, name, value)
            return
        values = self.values
        if name in values:
            values[name] = value
            return
        view = self._views.get(name)
        if view is None:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        member, bit = view
        raw = values[member]
        values[member] = bit.put(int(self.resolved()[member] if raw is None else raw),
                                 int(value))

    # -- values ------------------------------------------------------------------------------

    def resolved(self) -> dict[str, Any]:
        """Member values with every computed member left ``None`` filled in."""
        return resolve_computed(self._struct, self.values, self._context())

    def _linked(self, next_hdr: int | None) -> dict[str, Any]:
        """Resolved values of a chain element (LBMC header, transport option) with the link
        to its successor, ``next_hdr``, filled in unless one was set explicitly."""
        values = self.resolved()
        if values.get("next_hdr") is None:
            values["next_hdr"] = next_hdr
        return values

    def _export(self, values: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """``values`` as tshark shows them: (display-filter name, value) in wire order."""
        return export_struct(self._field_prefix(), self._struct, values)

    # -- comparison and display --------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StructRecord) or not self._same_kind(other):
            return NotImplemented
        return bool(self._key() == other._key())

    def __hash__(self) -> int:  # mutable records hash by identity
        return id(self)

    def __repr__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in self.values.items()
                 if v is not None and self._shown(k, v)]
        parts += self._repr_extras()
        return f"{type(self).__name__}({', '.join(parts)})"
