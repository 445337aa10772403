"""Parse and validate a umestored XML configuration file into frozen dataclasses.

The reference store is configured exactly like the product's ``umestored``: one XML file with a
``<daemon>`` section and a ``<stores>`` section of ``<store>`` elements, each with store-wide
``<ume-attributes>`` and a list of ``<topic>`` patterns carrying topic-level options
(docs/semantics.md §3; the guide's chapter "Configuration Reference for Umestored").  Reading the
product's format, rather than inventing one, lets a conformance run hand the same file to the
product and to the reference implementation.

What this module checks, and why each check is here:

* **XML safety.**  The file is parsed with :mod:`xml.parsers.expat` and any ``<!DOCTYPE`` (hence
  any ``<!ENTITY``) is refused: no entity expansion, no external entity, no "billion laughs".
  The product validates against its own built-in DTD, never one named by the file, so refusing
  a DOCTYPE loses nothing.  XInclude (``xi:include``), which the product supports, is refused too:
  resolving it would mean reading other files or URLs on the file's say-so.
* **Structure per DTD version** (``version`` 1.0 - 1.3): element content models (including
  element *order* where the DTD imposes one), required and declared attributes, enumerated
  attribute values.  The four DTDs are kept as data (:data:`_DTDS`) so :func:`dump_dtd` renders
  the very rules the validator applies.  Facts come from ``docs/semantics.md`` §3.1 and the guide's
  1.2 DTD; where a version's DTD is not published the choice is written next to it.  DTD 1.3 is
  the 6.17 form ``store (restore-last?, publishing-interval?, ume-attributes+, topics+)``;
  6.10-6.14 documentation printed a looser ``(publishing-interval | ume-attributes | topics)+``
  under the same version number, so a 1.3 file written for those releases that puts
  ``<topics>`` before ``<ume-attributes>`` is rejected here (the error says what order is needed).
* **Option placement** (§3.1): inside ``<store>``: types ``store`` and ``lbm-context``; inside
  ``<topic>``: ``store``, ``lbm-receiver``, ``lbm-source``; no ``type`` means ``store``.
* **Option names and values**: every ``store``-type option is known, typed and range checked
  (unknown names get the nearest known name in the error).  UM library options (``lbm-*`` types)
  are passed through as strings: their catalogue is the UM configuration guide, not this file.

Every problem is a :class:`~reference_impl.config.profiles.ConfigError` carrying file, line and
column.  Harmless oddities (deprecated elements, a mapped repository type, a duplicated option)
are collected as :class:`~reference_impl.config.profiles.ConfigWarning` on the result instead.

Decisions where neither the spec nor the guide says:

* ``repository-type`` ``reduced-fd`` (removed in 6.15) is a disk repository that economises on
  file descriptors; it maps to ``disk`` with a warning.  ``no-cache`` (state only, no messages;
  deprecated) is not implemented by the reference store and is an error - including when it is
  only the *default* (the guide-5.3 profile's default), so such topics must name a type.
* UMQ remnants of DTD 1.1/1.2 (``<queues>``, ``<application-sets>``, option type ``queue``) are
  accepted structurally, ignored, and reported as warnings: the reference store has no queues.
* Numbers are decimal (no ``0x``), ASCII digits only, leading zeros allowed (as ``strtoul``
  reads them) and of any length: 5,000 digits is an out-of-range error, not Python's
  ``int()`` digit-limit exception; flags are ``0`` or ``1``.
* The declared encoding must be one expat reads (UTF-8, UTF-16, ISO-8859-1, US-ASCII) or a
  single-byte codec Python knows; any other (unknown, multi-byte, not a text codec) is an
  error at line 1 naming it.  Error messages cut long values (``'999...'... (5000
  characters)``) so each stays one readable line.
* Deprecated but harmless settings are accepted with a warning: ``<daemon-monitor>``,
  ``<publishing-interval>``, topic type ``regexp``, and ``repository-disk-max-write-async-cbs``
  other than 1 under the current profile (replaced by 1, the only value current stores use).
  Unknown option names are errors: a misspelt option silently falling back to its default is
  the failure this parser exists to prevent.
* A repeated single-valued element (``<pidfile>`` twice) or a repeated option in one scope: the
  last one wins, with a warning.
* PCRE and POSIX ``regexp`` patterns are compiled with Python's :mod:`re` and searched
  (unanchored, as ``pcre_exec`` is; write ``^...$`` to anchor).  Constructs :mod:`re` lacks are
  reported as errors at load time.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar
from xml.parsers import expat

from reference_impl.config.profiles import (
    DEFAULT_PROFILE,
    ConfigError,
    ConfigWarning,
    Profile,
    get_profile,
)
from reference_impl.config.values import decimal_in_range, read_config_bytes, shown

__all__ = [
    "DTD_VERSIONS",
    "DaemonConfig",
    "DaemonMonitorConfig",
    "LogConfig",
    "RestoreLast",
    "StoreConfig",
    "StoreDaemonConfig",
    "TopicConfig",
    "TopicOptions",
    "WebMonitorAddress",
    "dump_dtd",
    "load_store_config",
    "parse_store_config",
    "store_option_names",
    "topic_option_names",
    "validate_structure",
]

DTD_VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2", "1.3")
"""Values accepted in ``<ume-store version="...">`` (newer stores accept older files)."""

_U32 = 0xFFFFFFFF
_V = TypeVar("_V")
_SIZE_MAX = (1 << 63) - 1


# =================================================================================================
# Content models: a tiny regular-expression algebra over child element names
# =================================================================================================
#
# A DTD content model is a regular expression over child element names.  Matching children one
# by one with Brzozowski derivatives gives, at the first child that does not fit, both the
# position and the set of names that *would* fit there - exactly what a good error message needs.


@dataclass(frozen=True)
class _Nothing:
    """Matches no sequence at all (a dead end)."""


@dataclass(frozen=True)
class _Eps:
    """Matches only the empty sequence."""


@dataclass(frozen=True)
class _Sym:
    name: str


@dataclass(frozen=True)
class _Seq:
    items: tuple[_Model, ...]


@dataclass(frozen=True)
class _Alt:
    items: tuple[_Model, ...]


@dataclass(frozen=True)
class _Star:
    item: _Model


_Model = _Nothing | _Eps | _Sym | _Seq | _Alt | _Star
_NOTHING = _Nothing()
_EPS = _Eps()


def _seq(items: tuple[_Model, ...]) -> _Model:
    kept: list[_Model] = []
    for item in items:
        if isinstance(item, _Nothing):
            return _NOTHING
        if isinstance(item, _Eps):
            continue
        if isinstance(item, _Seq):
            kept.extend(item.items)
        else:
            kept.append(item)
    if not kept:
        return _EPS
    return kept[0] if len(kept) == 1 else _Seq(tuple(kept))


def _alt(items: tuple[_Model, ...]) -> _Model:
    kept: list[_Model] = []
    for item in items:
        parts = item.items if isinstance(item, _Alt) else (item,)
        for part in parts:
            if not isinstance(part, _Nothing) and part not in kept:
                kept.append(part)
    if not kept:
        return _NOTHING
    return kept[0] if len(kept) == 1 else _Alt(tuple(kept))


def _nullable(model: _Model) -> bool:
    if isinstance(model, _Eps | _Star):
        return True
    if isinstance(model, _Seq):
        return all(_nullable(item) for item in model.items)
    if isinstance(model, _Alt):
        return any(_nullable(item) for item in model.items)
    return False


def _derive(model: _Model, name: str) -> _Model:
    """What is left to match after consuming one child called ``name``."""
    if isinstance(model, _Sym):
        return _EPS if model.name == name else _NOTHING
    if isinstance(model, _Seq):
        head, rest = model.items[0], _seq(model.items[1:])
        after_head = _seq((_derive(head, name), rest))
        return _alt((after_head, _derive(rest, name))) if _nullable(head) else after_head
    if isinstance(model, _Alt):
        return _alt(tuple(_derive(item, name) for item in model.items))
    if isinstance(model, _Star):
        return _seq((_derive(model.item, name), model))
    return _NOTHING


def _first(model: _Model) -> set[str]:
    """Names that may come next."""
    if isinstance(model, _Sym):
        return {model.name}
    if isinstance(model, _Seq):
        out: set[str] = set()
        for item in model.items:
            out |= _first(item)
            if not _nullable(item):
                break
        return out
    if isinstance(model, _Alt):
        return set().union(*(_first(item) for item in model.items))
    if isinstance(model, _Star):
        return _first(model.item)
    return set()


def _alphabet(model: _Model) -> set[str]:
    if isinstance(model, _Sym):
        return {model.name}
    if isinstance(model, _Seq | _Alt):
        return set().union(*(_alphabet(item) for item in model.items))
    if isinstance(model, _Star):
        return _alphabet(model.item)
    return set()


_TOKEN = re.compile(r"\s*([A-Za-z_][\w.:-]*|[(),|?*+])")


def _parse_model(text: str) -> _Model:
    """Compile DTD content-model text such as ``(daemon, stores?)`` into a :data:`_Model`."""
    tokens = _TOKEN.findall(text)
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise ValueError(f"bad content model {text!r}")
    pos = 0

    def particle() -> _Model:
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if token == "(":
            items = [particle()]
            separator = None
            while tokens[pos] in (",", "|"):
                if separator not in (None, tokens[pos]):
                    raise ValueError(f"mixed separators in {text!r}")
                separator = tokens[pos]
                pos += 1
                items.append(particle())
            if tokens[pos] != ")":
                raise ValueError(f"unbalanced {text!r}")
            pos += 1
            inner = _alt(tuple(items)) if separator == "|" else _seq(tuple(items))
        else:
            inner = _Sym(token)
        if pos < len(tokens) and tokens[pos] in "?*+":
            quantifier = tokens[pos]
            pos += 1
            if quantifier == "?":
                return _alt((inner, _EPS))
            if quantifier == "*":
                return _Star(inner)
            return _seq((inner, _Star(inner)))
        return inner

    model = particle()
    if pos != len(tokens):
        raise ValueError(f"trailing tokens in {text!r}")
    return model


# =================================================================================================
# The DTDs as data
# =================================================================================================


@dataclass(frozen=True)
class _AttrDecl:
    """One ``<!ATTLIST>`` entry.

    ``values`` is ``None`` for CDATA, else the enumeration.  ``default`` is the DTD default
    (``None`` for ``#IMPLIED`` / ``#REQUIRED``).
    """

    name: str
    values: tuple[str, ...] | None = None
    required: bool = False
    default: str | None = None

    def render(self) -> str:
        kind = "CDATA" if self.values is None else "(" + " | ".join(self.values) + ")"
        if self.required:
            tail = "#REQUIRED"
        elif self.default is None:
            tail = "#IMPLIED"
        else:
            tail = f'"{self.default}"'
        return f"{self.name} {kind} {tail}"


@dataclass(frozen=True)
class _ElementDecl:
    """One ``<!ELEMENT>`` with its attributes.  ``content`` is a model, EMPTY, ANY or PCDATA."""

    name: str
    content: str
    attrs: tuple[_AttrDecl, ...] = ()
    note: str = ""

    @property
    def kind(self) -> Literal["EMPTY", "ANY", "PCDATA", "MODEL"]:
        if self.content == "EMPTY":
            return "EMPTY"
        if self.content == "ANY":
            return "ANY"
        if self.content == "(#PCDATA)":
            return "PCDATA"
        return "MODEL"

    def attr(self, name: str) -> _AttrDecl | None:
        return next((a for a in self.attrs if a.name == name), None)


_XML_SPACE = _AttrDecl("xml:space", ("default", "preserve"), default="default")
_OPTION_TYPES = ("lbm-receiver", "lbm-context", "lbm-source", "store")


def _text_element(name: str, *attrs: _AttrDecl) -> _ElementDecl:
    return _ElementDecl(name, "(#PCDATA)", (*attrs, _XML_SPACE))


def _dtd_1_0() -> dict[str, _ElementDecl]:
    """DTD 1.0 (UME 1.0): stores only.  Not published; taken as 1.2 without the UMQ parts."""
    elements = [
        _ElementDecl("ume-store", "(daemon, stores?)", (_AttrDecl("version", required=True),)),
        _ElementDecl(
            "daemon", "(log | uid | pidfile | gid | lbm-config | lbm-license-file | web-monitor)*"
        ),
        _text_element("log", _AttrDecl("type")),
        _text_element("uid"),
        _text_element("pidfile"),
        _text_element("gid"),
        _text_element("lbm-config"),
        _text_element("lbm-license-file"),
        _text_element("web-monitor", _AttrDecl("permission")),
        _ElementDecl("stores", "(store*)"),
        _ElementDecl(
            "store",
            "(ume-attributes | topics)+",
            (
                _AttrDecl("name", required=True),
                _AttrDecl("interface"),
                _AttrDecl("port", required=True),
            ),
        ),
        _ElementDecl("topics", "(topic+)"),
        _ElementDecl(
            "topic",
            "(ume-attributes)*",
            (_AttrDecl("pattern", required=True), _AttrDecl("type", ("direct", "PCRE", "regexp"))),
        ),
        _ElementDecl("ume-attributes", "(option+)"),
        _ElementDecl(
            "option",
            "EMPTY",
            (
                _AttrDecl("type", _OPTION_TYPES),
                _AttrDecl("name", required=True),
                _AttrDecl("value", required=True),
            ),
        ),
    ]
    return {e.name: e for e in elements}


def _dtd_1_2() -> dict[str, _ElementDecl]:
    """DTD 1.1 and 1.2 (UMQ era): the guide's 1.2 DTD; 1.1 is not published and taken as equal.

    ``lbm-password-file`` (queue browser) is in the guide's daemon table though not in its DTD
    listing; it is accepted here.
    """
    elements = _dtd_1_0()
    elements["ume-store"] = _ElementDecl(
        "ume-store", "(daemon, stores?, queues?)", elements["ume-store"].attrs
    )
    elements["daemon"] = _ElementDecl(
        "daemon",
        "(log | uid | pidfile | gid | lbm-config | lbm-license-file | lbm-password-file"
        " | web-monitor)*",
    )
    elements["lbm-password-file"] = _text_element("lbm-password-file")
    elements["queues"] = _ElementDecl("queues", "ANY", note="UMQ queues: not modelled, ignored")
    elements["topic"] = _ElementDecl(
        "topic", "(ume-attributes | application-sets)*", elements["topic"].attrs
    )
    elements["application-sets"] = _ElementDecl(
        "application-sets", "ANY", note="UMQ/ULB application sets: not modelled, ignored"
    )
    option = elements["option"]
    elements["option"] = _ElementDecl(
        "option",
        "EMPTY",
        (_AttrDecl("type", (*_OPTION_TYPES, "queue")), *option.attrs[1:]),
    )
    return elements


def _dtd_1_3() -> dict[str, _ElementDecl]:
    """DTD 1.3 (UM 6.10+, as documented for 6.17): no UMQ, adds xml-config, daemon-monitor,
    publishing-interval and (6.15) restore-last.  ``restore-last``'s attribute declarations are
    not published; ``behavior`` is taken as required and ``value`` as defaulting to 0 (= off).
    """
    elements = _dtd_1_0()
    elements["daemon"] = _ElementDecl(
        "daemon",
        "(log | uid | pidfile | gid | lbm-config | xml-config | lbm-license-file | web-monitor"
        " | daemon-monitor)*",
    )
    elements["log"] = _text_element(
        "log",
        _AttrDecl("type", ("file", "console"), default="console"),
        _AttrDecl("frequency", ("disable", "daily", "hourly", "test"), default="disable"),
        _AttrDecl("size"),
    )
    elements["web-monitor"] = _text_element("web-monitor")
    elements["xml-config"] = _text_element("xml-config", _AttrDecl("application-name"))
    elements["daemon-monitor"] = _ElementDecl(
        "daemon-monitor",
        "(lbm-config | publishing-interval | remote-snapshot-request"
        " | remote-config-changes-request)*",
        (_AttrDecl("topic", default="umestore.monitor"),),
    )
    elements["publishing-interval"] = _ElementDecl("publishing-interval", "(group+)")
    elements["group"] = _ElementDecl(
        "group",
        "EMPTY",
        (
            _AttrDecl(
                "name",
                ("default", "store", "source", "receiver", "disk", "config", "memory"),
                required=True,
            ),
            _AttrDecl("ivl", required=True),
        ),
    )
    for name in ("remote-snapshot-request", "remote-config-changes-request"):
        elements[name] = _ElementDecl(name, "EMPTY", (_AttrDecl("allow", ("0", "1"), default="0"),))
    elements["store"] = _ElementDecl(
        "store",
        "(restore-last?, publishing-interval?, ume-attributes+, topics+)",
        elements["store"].attrs,
    )
    elements["topic"] = _ElementDecl(
        "topic", "(restore-last?, ume-attributes*)", elements["topic"].attrs
    )
    elements["restore-last"] = _ElementDecl(
        "restore-last",
        "EMPTY",
        (_AttrDecl("behavior", ("hours", "none"), required=True), _AttrDecl("value", default="0")),
    )
    return elements


_DTDS: dict[str, dict[str, _ElementDecl]] = {
    "1.0": _dtd_1_0(),
    "1.1": _dtd_1_2(),
    "1.2": _dtd_1_2(),
    "1.3": _dtd_1_3(),
}
_MODELS: dict[str, dict[str, _Model]] = {
    version: {e.name: _parse_model(e.content) for e in dtd.values() if e.kind == "MODEL"}
    for version, dtd in _DTDS.items()
}


def dump_dtd(version: str = "1.3") -> str:
    """The DTD this module validates ``version`` files against, as DTD text.

    The text is rendered from the same tables the validator uses (like ``umestored -d``, it is
    what *this* store enforces).  Elements whose content is not modelled (UMQ remnants) are
    declared ``ANY``.
    """
    try:
        dtd = _DTDS[version]
    except KeyError:
        raise ValueError(
            f"unknown umestored DTD version {version!r}; known: {', '.join(DTD_VERSIONS)}"
        ) from None
    lines = [
        f"<!-- umestored configuration, DTD version {version}, as enforced by"
        " reference_impl.config.store_xml -->"
    ]
    for element in dtd.values():
        if element.note:
            lines.append(f"<!-- {element.name}: {element.note} -->")
        lines.append(f"<!ELEMENT {element.name} {element.content}>")
        lines.extend(f"<!ATTLIST {element.name} {attr.render()}>" for attr in element.attrs)
    return "\n".join(lines) + "\n"


# =================================================================================================
# Safe XML reading: expat into a small node tree with positions
# =================================================================================================


@dataclass(eq=False)
class _Node:
    name: str
    attrs: dict[str, str]
    line: int
    column: int
    children: list[_Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    end_line: int = 0
    end_column: int = 0

    def raw_text(self) -> str:
        return "".join(self.text)


def _read_tree(data: bytes, filename: str) -> _Node:
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    stack: list[_Node] = []
    roots: list[_Node] = []

    def here() -> tuple[int, int]:
        return parser.CurrentLineNumber, parser.CurrentColumnNumber + 1

    def refuse_doctype(*_: object) -> None:
        line, column = here()
        raise ConfigError(
            filename,
            line,
            "DOCTYPE declarations are refused: the store validates against its built-in DTD "
            "(see dump_dtd) and never expands entities or loads external ones",
            column,
        )

    def refuse_entity(*_: object) -> None:
        line, column = here()
        raise ConfigError(filename, line, "entity declarations are refused", column)

    def start(name: str, attrs: dict[str, str]) -> None:
        line, column = here()
        if ":" in name:
            hint = (
                " (XInclude is not supported: the reference store reads exactly one file)"
                if name.split(":", 1)[1] == "include"
                else ""
            )
            raise ConfigError(
                filename, line, f"namespaced element <{name}> is not allowed{hint}", column
            )
        node = _Node(name, dict(attrs), line, column)
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def end(_name: str) -> None:
        node = stack.pop()
        node.end_line, node.end_column = here()

    def characters(text: str) -> None:
        if stack:
            stack[-1].text.append(text)

    parser.StartDoctypeDeclHandler = refuse_doctype
    parser.EntityDeclHandler = refuse_entity
    parser.UnparsedEntityDeclHandler = refuse_entity
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = characters
    try:
        parser.Parse(data, True)
    except expat.ExpatError as exc:
        raise ConfigError(
            filename,
            exc.lineno,
            f"malformed XML: {expat.ErrorString(exc.code)}",
            exc.offset + 1,
        ) from None
    except ConfigError:
        raise
    except (LookupError, ValueError) as exc:  # UnicodeError is a ValueError
        # expat hands an encoding it does not know itself to Python's codecs, which fail with
        # LookupError (no such codec, or not a text codec), ValueError (multi-byte codecs) or
        # UnicodeError (a codec that cannot decode); the XML declaration is where it was named
        raise ConfigError(
            filename,
            parser.CurrentLineNumber or 1,
            f"the XML declaration names encoding {_declared_encoding(data)}, which cannot be "
            f"read ({exc}); use UTF-8, UTF-16, ISO-8859-1 or US-ASCII",
        ) from None
    return roots[0]


_ENCODING_DECL = re.compile(
    rb"""\A(?:\xef\xbb\xbf)?\s*<\?xml\s[^>]*?encoding\s*=\s*["']([^"']{0,80})"""
)


def _declared_encoding(data: bytes) -> str:
    """The encoding name of an ASCII-compatible XML declaration, for an error message."""
    found = _ENCODING_DECL.match(data)
    return shown(found.group(1).decode("ascii", "replace")) if found else "(unreadable)"


# =================================================================================================
# Structural validation against a DTD version
# =================================================================================================


class _Validator:
    def __init__(self, filename: str, version: str, warnings: list[ConfigWarning]) -> None:
        self.filename = filename
        self.version = version
        self.dtd = _DTDS[version]
        self.models = _MODELS[version]
        self.warnings = warnings

    def error(self, node: _Node, message: str, *, at_end: bool = False) -> ConfigError:
        if at_end:
            return ConfigError(self.filename, node.end_line, message, node.end_column)
        return ConfigError(self.filename, node.line, message, node.column)

    def _versions_declaring(self, element: str, attr: str | None = None) -> list[str]:
        found = []
        for version, dtd in _DTDS.items():
            decl = dtd.get(element)
            if decl is not None and (attr is None or decl.attr(attr) is not None):
                found.append(version)
        return found

    def _declaration(self, node: _Node) -> _ElementDecl:
        decl = self.dtd.get(node.name)
        if decl is None:
            elsewhere = self._versions_declaring(node.name)
            hint = f" (it exists in DTD {', '.join(elsewhere)})" if elsewhere else ""
            raise self.error(
                node, f"element <{node.name}> is not part of DTD version {self.version}{hint}"
            )
        return decl

    def validate(self, node: _Node) -> None:
        decl = self._declaration(node)
        if decl.kind == "ANY":
            # content (and attributes) of the UMQ remnants are not modelled: skip the subtree
            self.warnings.append(
                ConfigWarning(
                    self.filename,
                    node.line,
                    f"<{node.name}> ignored: {decl.note}",
                    node.column,
                )
            )
            return
        self._check_attributes(node, decl)
        has_text = bool(node.raw_text().strip())
        if decl.kind == "EMPTY":
            if node.children or has_text:
                raise self.error(node, f"<{node.name}> must be empty")
            return
        if decl.kind == "PCDATA":
            if node.children:
                raise self.error(
                    node.children[0],
                    f"<{node.name}> holds text only; element <{node.children[0].name}> "
                    "is not allowed inside it",
                )
            return
        if has_text:
            raise self.error(node, f"<{node.name}> may not contain text, only elements")
        self._check_children(node, decl)
        for child in node.children:
            self.validate(child)

    def _check_attributes(self, node: _Node, decl: _ElementDecl) -> None:
        for name, value in node.attrs.items():
            attr = decl.attr(name)
            if attr is None:
                elsewhere = self._versions_declaring(node.name, name)
                hint = f" (declared in DTD {', '.join(elsewhere)})" if elsewhere else ""
                known = ", ".join(a.name for a in decl.attrs) or "none"
                raise self.error(
                    node,
                    f"attribute {name!r} is not declared for <{node.name}> in DTD version "
                    f"{self.version}{hint}; declared attributes: {known}",
                )
            if attr.values is not None and value not in attr.values:
                folded = {v.lower(): v for v in attr.values}
                if node.name == "topic" and name == "type" and value.lower() in folded:
                    # the product's own documentation writes type="pcre"
                    self.warnings.append(
                        ConfigWarning(
                            self.filename,
                            node.line,
                            f'<topic type="{value}"> taken as "{folded[value.lower()]}" '
                            "(the DTD spelling)",
                            node.column,
                        )
                    )
                    node.attrs[name] = folded[value.lower()]
                    continue
                raise self.error(
                    node,
                    f"attribute {name}={value!r} of <{node.name}> must be one of "
                    f"{', '.join(attr.values)}",
                )
        for attr in decl.attrs:
            if attr.required and attr.name not in node.attrs:
                raise self.error(
                    node, f"<{node.name}> is missing its required attribute {attr.name!r}"
                )

    def _check_children(self, node: _Node, decl: _ElementDecl) -> None:
        model = self.models[node.name]
        state = model
        for child in node.children:
            self._declaration(child)  # an element foreign to this version says so first
            following = _derive(state, child.name)
            if isinstance(following, _Nothing):
                expected = _first(state)
                wanted = (
                    "one of " + ", ".join(f"<{n}>" for n in sorted(expected))
                    if expected
                    else f"the end of <{node.name}>"
                )
                if child.name in _alphabet(model):
                    raise self.error(
                        child,
                        f"<{child.name}> is misplaced in <{node.name}> (wrong order or one too "
                        f"many): DTD {self.version} requires {decl.content}; expected {wanted} "
                        "here",
                    )
                raise self.error(
                    child,
                    f"element <{child.name}> is not allowed in <{node.name}> under DTD "
                    f"{self.version} (content {decl.content}); expected {wanted}",
                )
            state = following
        if not _nullable(state):
            missing = ", ".join(f"<{n}>" for n in sorted(_first(state)))
            raise self.error(
                node,
                f"<{node.name}> is incomplete: DTD {self.version} requires {decl.content}; "
                f"missing {missing}",
                at_end=True,
            )


# =================================================================================================
# Option catalogue: store-wide and topic-level ``type="store"`` options
# =================================================================================================


class _BadValue(Exception):
    """A value outside its option's domain; the message says what is expected."""


@dataclass
class _OptionContext:
    """What a value parser may need: the profile, and a way to warn at the option's line."""

    profile: Profile
    warn: Callable[[str], None]


_Parser = Callable[[str, _OptionContext], object]


def _uint(low: int, high: int, unit: str) -> _Parser:
    def parse(text: str, _ctx: _OptionContext) -> int:
        number = decimal_in_range(text, low, high)
        if number is None:
            raise _BadValue(f"a decimal integer {low}..{high} ({unit})")
        return number

    return parse


def _flag(text: str, _ctx: _OptionContext) -> bool:
    value = text.strip()
    if value not in ("0", "1"):
        raise _BadValue("0 or 1")
    return value == "1"


def _directory(text: str, _ctx: _OptionContext) -> str:
    if not 1 <= len(text) <= 230:
        raise _BadValue("a path of 1 to 230 characters")
    return text


_CONTEXT_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _context_name(text: str, _ctx: _OptionContext) -> str:
    if not _CONTEXT_NAME.fullmatch(text):
        raise _BadValue("1 to 128 characters, each a letter, digit, '-' or '_'")
    return text


def _repository_type(text: str, ctx: _OptionContext) -> str:
    value = text.strip()
    if value in ("memory", "disk"):
        return value
    if value == "reduced-fd":
        ctx.warn(
            "repository-type reduced-fd (removed in UM 6.15) is treated as disk: it is a disk "
            "repository that uses fewer file descriptors"
        )
        return "disk"
    if value == "no-cache":
        raise _BadValue(
            "memory or disk (no-cache, a deprecated state-only repository, is not implemented "
            "by the reference store)"
        )
    raise _BadValue("memory or disk (reduced-fd is accepted as disk)")


def _write_async_cbs(text: str, ctx: _OptionContext) -> int:
    number = _uint(1, _U32, "callbacks")(text, ctx)
    assert isinstance(number, int)
    if ctx.profile.write_async_cbs_must_be_one and number != 1:
        # deprecated and harmless: the current store only works with 1, so an old file's value
        # is replaced rather than refused
        ctx.warn(
            f"repository-disk-max-write-async-cbs {number} is deprecated; profile "
            f"{ctx.profile.name!r} uses 1"
        )
        return 1
    return number


_STORE_OPTIONS: dict[str, _Parser] = {
    "disk-cache-directory": _directory,
    "disk-state-directory": _directory,
    "allow-proxy-source": _flag,
    "proxy-source-repo-quorum-required": _flag,
    "context-name": _context_name,
    "retransmission-request-processing-rate": _uint(1, _U32, "requests per second"),
}

_TOPIC_OPTIONS: dict[str, _Parser] = {
    "repository-type": _repository_type,
    "repository-size-threshold": _uint(0, _SIZE_MAX, "bytes"),
    "repository-size-limit": _uint(0, _SIZE_MAX, "bytes"),
    "repository-age-threshold": _uint(0, _U32, "seconds"),
    "repository-disk-file-size-limit": _uint(196992, _SIZE_MAX, "bytes"),
    "repository-disk-file-preallocate": _flag,
    "repository-disk-async-buffer-length": _uint(65664, _SIZE_MAX, "bytes"),
    "repository-disk-max-async-cbs": _uint(1, _U32, "callbacks"),
    "repository-disk-max-read-async-cbs": _uint(1, _U32, "callbacks"),
    "repository-disk-max-write-async-cbs": _write_async_cbs,
    "repository-disk-message-checksum": _flag,
    "repository-disk-write-delay": _uint(0, _U32, "milliseconds"),
    "repository-allow-receiver-paced-persistence": _flag,
    "repository-allow-ack-on-reception": _flag,
    "source-flight-size-bytes-maximum": _uint(1, _SIZE_MAX, "bytes"),
    "retransmission-request-forwarding": _flag,
    "source-activity-timeout": _uint(0, _U32, "milliseconds"),
    "source-state-lifetime": _uint(0, _U32, "milliseconds"),
    "receiver-activity-timeout": _uint(0, _U32, "milliseconds"),
    "receiver-state-lifetime": _uint(0, _U32, "milliseconds"),
    "source-check-interval": _uint(1, _U32, "milliseconds"),
    "keepalive-interval": _uint(1, _U32, "milliseconds"),
    # the product text says "positive" yet gives 0 a meaning (start at the next new message),
    # and the guide's own RPP example sets 0: 0 is accepted in every profile
    "receiver-new-registration-rollback": _uint(0, 2147483647, "messages"),
    "proxy-election-interval": _uint(1, _U32, "milliseconds"),
    "stability-ack-interval": _uint(1, _U32, "milliseconds"),
    "stability-ack-minimum-number": _uint(1, _U32, "fragments"),
}


def store_option_names() -> tuple[str, ...]:
    """Names of the store-wide ``type="store"`` options (only valid inside ``<store>``)."""
    return tuple(_STORE_OPTIONS)


def topic_option_names() -> tuple[str, ...]:
    """Names of the topic-level ``type="store"`` options (valid in ``<topic>``, and in
    ``<store>`` where they become defaults for all of its topics)."""
    return tuple(_TOPIC_OPTIONS)


# =================================================================================================
# The result dataclasses
# =================================================================================================


@dataclass(frozen=True)
class LogConfig:
    """``<log>``.

    Attributes:
        path: the element's text, or ``None`` when empty.
        type: the ``type`` attribute as written (``None`` when absent).  The documented default
            is "console"; what the product does with a path and no type is not documented, so
            :attr:`destination` makes the reading explicit.
        frequency: time-based rolling (DTD 1.3): disable, daily, hourly, test.
        size_mb: size-based rolling threshold in MiB (DTD 1.3), 0 = off.
    """

    path: str | None
    type: str | None = None
    frequency: str = "disable"
    size_mb: int = 10

    @property
    def destination(self) -> Literal["file", "console"]:
        """Where log lines go: an explicit type wins; otherwise a path means a file."""
        if self.type in ("file", "console"):
            return "file" if self.type == "file" else "console"
        return "file" if self.path else "console"


@dataclass(frozen=True)
class WebMonitorAddress:
    """``<web-monitor>Address:Port</web-monitor>``; ``host`` ``None`` means ``*`` (all
    interfaces).  ``permission`` is the DTD <= 1.2 attribute (read-only / read-write)."""

    host: str | None
    port: int
    permission: str | None = None

    def __str__(self) -> str:
        return f"{self.host or '*'}:{self.port}"


@dataclass(frozen=True)
class DaemonMonitorConfig:
    """``<daemon-monitor>`` (DTD 1.3; deprecated binary daemon statistics)."""

    topic: str = "umestore.monitor"
    lbm_config: str | None = None
    publishing_interval: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    remote_snapshot_request: bool = False
    remote_config_changes_request: bool = False


@dataclass(frozen=True)
class DaemonConfig:
    """``<daemon>``: process-wide settings.  Every field is optional; the web monitor is off
    unless configured.  ``lbm_config_line`` and ``web_monitor_line`` are the lines of
    ``<lbm-config>`` and ``<web-monitor>``, so an error in reading the file the one names, or
    in listening where the other says, can point at them."""

    log: LogConfig | None = None
    pidfile: str | None = None
    uid: str | None = None
    gid: str | None = None
    lbm_config: str | None = None
    lbm_config_line: int | None = None
    xml_config: str | None = None
    xml_config_application_name: str = "umestored"
    lbm_license_files: tuple[str, ...] = ()
    lbm_password_file: str | None = None
    web_monitor: WebMonitorAddress | None = None
    web_monitor_line: int | None = None
    daemon_monitor: DaemonMonitorConfig | None = None


@dataclass(frozen=True)
class RestoreLast:
    """``<restore-last behavior="hours|none" value="0..336">`` (6.15+): on restart, restore
    only the last ``value`` hours of a disk repository; ``none`` or 0 restores everything."""

    behavior: Literal["hours", "none"]
    value: int

    @property
    def hours(self) -> int | None:
        """Hours to restore, or ``None`` when restoring is not limited."""
        return self.value if self.behavior == "hours" and self.value > 0 else None


@dataclass(frozen=True)
class TopicOptions:
    """Every topic-level store option, resolved (profile default < store-wide < topic).

    Units: every duration is an ``int`` in milliseconds except ``repository_age_threshold``
    (seconds); every size is an ``int`` in bytes; flags are ``bool``.  Field names are the
    option names with ``-`` replaced by ``_`` so the product documentation applies verbatim.
    ``lbm_source`` / ``lbm_receiver`` are the UM options (``type="lbm-source"`` /
    ``"lbm-receiver"``) the store applies to its own receiver / proxy source for this topic.
    """

    repository_type: Literal["memory", "disk"]
    repository_size_threshold: int
    repository_size_limit: int
    repository_age_threshold: int
    repository_disk_file_size_limit: int
    repository_disk_file_preallocate: bool
    repository_disk_async_buffer_length: int
    repository_disk_max_async_cbs: int
    repository_disk_max_read_async_cbs: int
    repository_disk_max_write_async_cbs: int
    repository_disk_message_checksum: bool
    repository_disk_write_delay: int
    repository_allow_receiver_paced_persistence: bool
    repository_allow_ack_on_reception: bool
    source_flight_size_bytes_maximum: int
    retransmission_request_forwarding: bool
    source_activity_timeout: int
    source_state_lifetime: int
    receiver_activity_timeout: int
    receiver_state_lifetime: int
    source_check_interval: int
    keepalive_interval: int
    receiver_new_registration_rollback: int
    proxy_election_interval: int
    stability_ack_interval: int
    stability_ack_minimum_number: int
    lbm_source: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    lbm_receiver: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    restore_last: RestoreLast | None = None

    @classmethod
    def from_values(
        cls,
        values: Mapping[str, object],
        *,
        lbm_source: Mapping[str, str] | None = None,
        lbm_receiver: Mapping[str, str] | None = None,
        restore_last: RestoreLast | None = None,
    ) -> TopicOptions:
        """Build from option-name keyed, already typed values (every option must be present)."""
        kwargs: dict[str, Any] = {name.replace("-", "_"): values[name] for name in _TOPIC_OPTIONS}
        return cls(
            **kwargs,
            lbm_source=MappingProxyType(dict(lbm_source or {})),
            lbm_receiver=MappingProxyType(dict(lbm_receiver or {})),
            restore_last=restore_last,
        )

    def value(self, option: str) -> object:
        """An option's value by its product name (``"keepalive-interval"``)."""
        if option not in _TOPIC_OPTIONS:
            raise KeyError(f"unknown topic option {option!r}")
        return getattr(self, option.replace("-", "_"))


@dataclass(frozen=True)
class TopicConfig:
    """One ``<topic>``: its pattern and its fully resolved options.

    ``explicit`` holds only the ``type="store"`` options written inside this ``<topic>``;
    ``options`` is the resolved set the store applies to matching topics.
    """

    pattern: str
    type: Literal["direct", "PCRE", "regexp"]
    options: TopicOptions
    explicit: Mapping[str, object]
    line: int
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, topic: str) -> bool:
        """Does ``topic`` fall under this pattern?  Direct patterns compare exactly; PCRE and
        regexp patterns are searched (unanchored), as the product's matcher does."""
        if self._regex is None:
            return topic == self.pattern
        return self._regex.search(topic) is not None


@dataclass(frozen=True)
class StoreConfig:
    """One ``<store>`` instance.

    Attributes:
        name: identifies the store in logs and the web monitor (not the context name).
        port: TCP port for registrations; 0 (6.8+) = pick one from the request port range.
        interface: the ``interface`` attribute as written (default ``0.0.0.0``).
        interface_network: the same as an IPv4 network (a single address is a /32).
        topic_defaults: topic-level options written in the store's ``<ume-attributes>``
            (typed), which apply to every topic of the store unless the topic overrides them.
        lbm_context: UM context options (``type="lbm-context"``) for this store's context.
        topics: the ``<topic>`` elements in document order.
    """

    name: str
    port: int
    interface: str
    interface_network: ipaddress.IPv4Network
    disk_cache_directory: str
    disk_state_directory: str
    allow_proxy_source: bool
    proxy_source_repo_quorum_required: bool
    context_name: str | None
    retransmission_request_processing_rate: int
    lbm_context: Mapping[str, str]
    topic_defaults: Mapping[str, object]
    topics: tuple[TopicConfig, ...]
    restore_last: RestoreLast | None = None
    publishing_interval: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    line: int = 0

    def topic_config(self, topic: str) -> TopicConfig | None:
        """The first ``<topic>`` (document order) whose pattern matches ``topic``."""
        return next((t for t in self.topics if t.matches(topic)), None)

    def topic_options(self, topic: str) -> TopicOptions | None:
        """Options for ``topic``, or ``None`` when no pattern matches (the store answers a
        registration for it with "no matching pattern")."""
        found = self.topic_config(topic)
        return None if found is None else found.options


@dataclass(frozen=True)
class StoreDaemonConfig:
    """A whole umestored XML file.

    Attributes:
        version: the DTD version the file declared and was validated against.
        profile: name of the default profile used to fill unset options.
        daemon: the ``<daemon>`` section.
        stores: the ``<store>`` elements in document order.
        source: the file name (or ``"<string>"``).
        warnings: everything accepted but noteworthy, in document order.
    """

    version: str
    profile: str
    daemon: DaemonConfig
    stores: tuple[StoreConfig, ...]
    source: str = "<string>"
    warnings: tuple[ConfigWarning, ...] = ()

    def store(self, name: str) -> StoreConfig:
        """The store called ``name``."""
        for store in self.stores:
            if store.name == name:
                return store
        known = ", ".join(s.name for s in self.stores) or "none"
        raise KeyError(f"no store named {name!r} (stores: {known})")

    def topic_options(self, store: str | StoreConfig, topic: str) -> TopicOptions | None:
        """The options store ``store`` applies to ``topic``, or ``None`` if it does not persist it.

        Precedence, from strongest: an option written in the *first* ``<topic>`` (document
        order) whose pattern matches; the same option written as ``type="store"`` in the
        ``<store>``'s ``<ume-attributes>``; the profile default.  The guide defines the ``store``
        option type as the one "used for all ume-attributes configured for the store element and
        its topic element", and the current configuration reference's example says options at
        the store level "apply to all topics" while others are "specific to the topic"; neither
        says which pattern wins when several match, so the first one does (document order, the
        order an operator reads the file in).
        """
        chosen = self.store(store) if isinstance(store, str) else store
        return chosen.topic_options(topic)


# =================================================================================================
# Building the dataclasses from a validated tree
# =================================================================================================


_TEXT_COLLAPSE = re.compile(r"\s+")
_PATTERN_TYPES: dict[str, Literal["direct", "PCRE", "regexp"]] = {
    "direct": "direct",
    "PCRE": "PCRE",
    "regexp": "regexp",
}


def _as_int(value: object) -> int:
    assert isinstance(value, int), value
    return value


class _Builder:
    def __init__(self, filename: str, version: str, profile: Profile) -> None:
        self.filename = filename
        self.version = version
        self.profile = profile
        self.warnings: list[ConfigWarning] = []

    # -- helpers -----------------------------------------------------------------------------

    def error(self, node: _Node, message: str) -> ConfigError:
        return ConfigError(self.filename, node.line, message, node.column)

    def warn(self, node: _Node, message: str) -> None:
        self.warnings.append(ConfigWarning(self.filename, node.line, message, node.column))

    def note_without_rpp(self, node: _Node, name: str) -> None:
        """Under a profile without RPP (``pre-5.3``) the RPP switch of a topic does nothing:
        say so instead of letting the operator believe RPP is on."""
        if name == "repository-allow-receiver-paced-persistence" \
                and not self.profile.rpp_supported:
            self.warn(node, f"{name} has no effect: profile {self.profile.name!r} knows no "
                            "receiver-paced persistence (every source and receiver is SPP)")

    @staticmethod
    def text(node: _Node) -> str:
        raw = node.raw_text()
        if node.attrs.get("xml:space") == "preserve":
            return raw
        return _TEXT_COLLAPSE.sub(" ", raw).strip()

    def number(self, node: _Node, what: str, text: str, low: int, high: int) -> int:
        number = decimal_in_range(text, low, high)
        if number is None:
            raise self.error(node, f"{what} {shown(text)} must be a decimal integer {low}..{high}")
        return number

    # -- daemon --------------------------------------------------------------------------------

    def daemon(self, node: _Node) -> DaemonConfig:
        singles: dict[str, Any] = {}
        seen: set[str] = set()
        licenses: list[str] = []
        for child in node.children:
            if child.name == "lbm-license-file":
                licenses.append(self.text(child))
                continue
            if child.name in seen:
                self.warn(child, f"<{child.name}> given more than once; the last one is used")
            seen.add(child.name)
            if child.name == "log":
                singles["log"] = self.log(child)
            elif child.name == "web-monitor":
                singles["web_monitor"] = self.web_monitor(child)
                singles["web_monitor_line"] = child.line
            elif child.name == "daemon-monitor":
                self.warn(child, "<daemon-monitor> (binary daemon statistics) is deprecated")
                singles["daemon_monitor"] = self.daemon_monitor(child)
            elif child.name == "xml-config":
                singles["xml_config"] = self.text(child)
                singles["xml_config_application_name"] = child.attrs.get(
                    "application-name", "umestored"
                )
            elif child.name == "lbm-password-file":
                singles["lbm_password_file"] = self.text(child)
            elif child.name == "lbm-config":
                singles["lbm_config"] = self.text(child)
                singles["lbm_config_line"] = child.line
            else:  # pidfile, uid, gid, lbm-config
                singles[child.name.replace("-", "_")] = self.text(child)
        return DaemonConfig(
            lbm_license_files=tuple(licenses),
            **singles,
        )

    def log(self, node: _Node) -> LogConfig:
        log_type = node.attrs.get("type")
        if log_type is not None and log_type not in ("file", "console"):
            raise self.error(node, f"<log type={shown(log_type)}> must be file or console")
        size = node.attrs.get("size")
        return LogConfig(
            path=self.text(node) or None,
            type=log_type,
            frequency=node.attrs.get("frequency", "disable"),
            size_mb=10 if size is None else self.number(node, "<log size>", size, 0, _U32),
        )

    def web_monitor(self, node: _Node) -> WebMonitorAddress:
        text = self.text(node)
        host, sep, port_text = text.rpartition(":")
        host, port_text = host.strip(), port_text.strip()
        if not sep or not host:
            raise self.error(
                node, f"<web-monitor> {shown(text)} must be Address:Port or *:Port (e.g. *:15304)"
            )
        port = self.number(node, "<web-monitor> port", port_text, 1, 65535)
        if host != "*":
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise self.error(
                    node, f"<web-monitor> address {shown(host)} must be an IPv4 address or *"
                ) from None
        permission = node.attrs.get("permission")
        if permission is not None and permission not in ("read-only", "read-write"):
            raise self.error(node, "<web-monitor permission> must be read-only or read-write")
        return WebMonitorAddress(None if host == "*" else host, port, permission)

    def publishing_interval(self, node: _Node) -> Mapping[str, int]:
        groups: dict[str, int] = {}
        for group in node.children:
            groups[group.attrs["name"]] = self.number(
                group, "<group ivl> (seconds)", group.attrs["ivl"], 0, _U32
            )
        return MappingProxyType(groups)

    def daemon_monitor(self, node: _Node) -> DaemonMonitorConfig:
        lbm_config: str | None = None
        intervals: Mapping[str, int] = MappingProxyType({})
        snapshot = changes = False
        for child in node.children:
            if child.name == "lbm-config":
                lbm_config = self.text(child)
            elif child.name == "publishing-interval":
                intervals = self.publishing_interval(child)
            elif child.name == "remote-snapshot-request":
                snapshot = child.attrs.get("allow", "0") == "1"
            else:
                changes = child.attrs.get("allow", "0") == "1"
        return DaemonMonitorConfig(
            topic=node.attrs.get("topic", "umestore.monitor"),
            lbm_config=lbm_config,
            publishing_interval=intervals,
            remote_snapshot_request=snapshot,
            remote_config_changes_request=changes,
        )

    def restore_last(self, node: _Node) -> RestoreLast:
        behavior = node.attrs["behavior"]
        value = self.number(
            node, "<restore-last value> (hours)", node.attrs.get("value", "0"), 0, 336
        )
        return RestoreLast("hours" if behavior == "hours" else "none", value)

    # -- options -------------------------------------------------------------------------------

    def options(
        self, container: _Node, level: Literal["store", "topic"]
    ) -> Iterator[tuple[_Node, str, str, str]]:
        """(node, type, name, value) for each ``<option>`` of a ``<ume-attributes>``, with the
        placement rules of docs/semantics.md §3.1 enforced."""
        allowed = (
            ("store", "lbm-context")
            if level == "store"
            else (
                "store",
                "lbm-receiver",
                "lbm-source",
            )
        )
        for option in container.children:
            option_type = option.attrs.get("type", "store")
            name, value = option.attrs["name"], option.attrs["value"]
            if option_type == "queue":
                self.warn(
                    option, f"queue option {shown(name)} ignored: the reference store has no queues"
                )
                continue
            if option_type not in allowed:
                raise self.error(
                    option,
                    f'option type "{option_type}" is not allowed inside <{level}> '
                    f"(allowed there: {', '.join(allowed)})",
                )
            yield option, option_type, name, value

    def typed_value(self, node: _Node, name: str, value: str, parser: _Parser) -> object:
        context = _OptionContext(self.profile, lambda message: self.warn(node, message))
        try:
            return parser(value, context)
        except _BadValue as exc:
            raise self.error(
                node, f"option {name!r} has invalid value {shown(value)}: expected {exc}"
            ) from None

    def unknown_option(self, node: _Node, name: str) -> ConfigError:
        known = [*_STORE_OPTIONS, *_TOPIC_OPTIONS]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "known options: " + ", ".join(known)
        return self.error(node, f"unknown store option {shown(name)}; {hint}")

    @staticmethod
    def put(target: dict[str, _V], key: str, value: _V, duplicate: Callable[[], None]) -> None:
        if key in target:
            duplicate()
        target[key] = value

    # -- stores and topics ---------------------------------------------------------------------

    def store(self, node: _Node) -> StoreConfig:
        name = node.attrs["name"]
        if not name:
            raise self.error(node, "<store name> must not be empty")
        low_port = 0 if self.profile.store_port_zero_allowed else 1
        port_note = (
            "" if low_port == 0 else f" (port 0 needs UM 6.8+, not profile {self.profile.name!r})"
        )
        port_text = node.attrs["port"]
        port = decimal_in_range(port_text, low_port, 65535)
        if port is None:
            raise self.error(
                node,
                f"<store port> {shown(port_text)} must be a decimal integer "
                f"{low_port}..65535{port_note}",
            )
        interface = node.attrs.get("interface", "0.0.0.0")
        try:
            network = ipaddress.IPv4Network(interface, strict=False)
        except ValueError:
            raise self.error(
                node, f"<store interface> {shown(interface)} must be an IPv4 address or CIDR range"
            ) from None

        store_values: dict[str, object] = {}
        topic_defaults: dict[str, object] = {}
        lbm_context: dict[str, str] = {}
        restore: RestoreLast | None = None
        publishing: Mapping[str, int] = MappingProxyType({})
        topic_nodes: list[_Node] = []
        for child in node.children:
            if child.name == "ume-attributes":
                for option, option_type, opt_name, value in self.options(child, "store"):

                    def duplicate(o: _Node = option, n: str = opt_name) -> None:
                        self.warn(o, f"option {n!r} set again in <store>; the last value is used")

                    if option_type == "lbm-context":
                        self.put(lbm_context, opt_name, value, duplicate)
                    elif opt_name in _STORE_OPTIONS:
                        typed = self.typed_value(option, opt_name, value, _STORE_OPTIONS[opt_name])
                        self.put(store_values, opt_name, typed, duplicate)
                    elif opt_name in _TOPIC_OPTIONS:
                        typed = self.typed_value(option, opt_name, value, _TOPIC_OPTIONS[opt_name])
                        self.note_without_rpp(option, opt_name)
                        self.put(topic_defaults, opt_name, typed, duplicate)
                    else:
                        raise self.unknown_option(option, opt_name)
            elif child.name == "topics":
                topic_nodes.extend(child.children)
            elif child.name == "restore-last":
                restore = self.restore_last(child)
            elif child.name == "publishing-interval":
                self.warn(child, "<publishing-interval> (binary daemon statistics) is deprecated")
                publishing = self.publishing_interval(child)

        resolved_store = dict(self.profile.store) | store_values
        topics = tuple(
            self.topic(topic_node, name, topic_defaults, restore) for topic_node in topic_nodes
        )
        return StoreConfig(
            name=name,
            port=port,
            interface=interface,
            interface_network=network,
            disk_cache_directory=str(resolved_store["disk-cache-directory"]),
            disk_state_directory=str(resolved_store["disk-state-directory"]),
            allow_proxy_source=bool(resolved_store["allow-proxy-source"]),
            proxy_source_repo_quorum_required=bool(
                resolved_store["proxy-source-repo-quorum-required"]
            ),
            context_name=(
                None
                if resolved_store["context-name"] is None
                else str(resolved_store["context-name"])
            ),
            retransmission_request_processing_rate=_as_int(
                resolved_store["retransmission-request-processing-rate"]
            ),
            lbm_context=MappingProxyType(lbm_context),
            topic_defaults=MappingProxyType(topic_defaults),
            topics=topics,
            restore_last=restore,
            publishing_interval=publishing,
            line=node.line,
        )

    def topic(
        self,
        node: _Node,
        store_name: str,
        store_defaults: Mapping[str, object],
        store_restore: RestoreLast | None,
    ) -> TopicConfig:
        pattern = node.attrs["pattern"]
        pattern_type = node.attrs.get("type", "direct")
        regex: re.Pattern[str] | None = None
        if pattern_type == "regexp":
            self.warn(node, "topic type regexp (POSIX) is deprecated; matched with Python re")
        if pattern_type in ("PCRE", "regexp"):
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise self.error(
                    node,
                    f"topic pattern {shown(pattern)} is not a regular expression Python's re "
                    f"accepts (the reference store's {pattern_type} matcher): {exc}",
                ) from None

        explicit: dict[str, object] = {}
        lbm_source: dict[str, str] = {}
        lbm_receiver: dict[str, str] = {}
        restore = store_restore
        for child in node.children:
            if child.name == "restore-last":
                restore = self.restore_last(child)
                continue
            if child.name != "ume-attributes":
                continue  # application-sets: already reported by the validator
            for option, option_type, name, value in self.options(child, "topic"):

                def duplicate(o: _Node = option, n: str = name) -> None:
                    self.warn(o, f"option {n!r} set again in <topic>; the last value is used")

                if option_type == "lbm-source":
                    self.put(lbm_source, name, value, duplicate)
                elif option_type == "lbm-receiver":
                    self.put(lbm_receiver, name, value, duplicate)
                elif name in _TOPIC_OPTIONS:
                    typed = self.typed_value(option, name, value, _TOPIC_OPTIONS[name])
                    self.note_without_rpp(option, name)
                    self.put(explicit, name, typed, duplicate)
                elif name in _STORE_OPTIONS:
                    raise self.error(
                        option,
                        f"{name!r} is a store-wide option: set it in the <store>'s "
                        "<ume-attributes>, not inside a <topic>",
                    )
                else:
                    raise self.unknown_option(option, name)

        values = dict(self.profile.topic) | dict(store_defaults) | explicit
        if values["repository-type"] == "no-cache":
            raise self.error(
                node,
                f"topic pattern {shown(pattern)} of store {shown(store_name)} sets no "
                f"repository-type and profile {self.profile.name!r} defaults it to no-cache, "
                "which the reference "
                "store does not implement; set repository-type to memory or disk",
            )
        self.sanity_checks(node, values)
        options = TopicOptions.from_values(
            values, lbm_source=lbm_source, lbm_receiver=lbm_receiver, restore_last=restore
        )
        return TopicConfig(
            pattern=pattern,
            type=_PATTERN_TYPES[pattern_type],
            options=options,
            explicit=MappingProxyType(explicit),
            line=node.line,
            _regex=regex,
        )

    def sanity_checks(self, node: _Node, values: Mapping[str, object]) -> None:
        """Warnings the product logs (or documents) for inconsistent topic options."""

        def number(name: str) -> int:
            value = values[name]
            assert isinstance(value, int)
            return value

        threshold, limit = number("repository-size-threshold"), number("repository-size-limit")
        disk_limit = number("repository-disk-file-size-limit")
        if threshold > limit:
            self.warn(
                node, f"repository-size-threshold {threshold} exceeds repository-size-limit {limit}"
            )
        if values["repository-type"] == "disk":
            if limit > disk_limit * 9 // 10:
                self.warn(
                    node,
                    f"repository-size-limit {limit} exceeds 90% of "
                    f"repository-disk-file-size-limit {disk_limit}",
                )
            buffer_length = number("repository-disk-async-buffer-length")
            if buffer_length > disk_limit:
                self.warn(
                    node,
                    f"repository-disk-async-buffer-length {buffer_length} exceeds "
                    f"repository-disk-file-size-limit {disk_limit}",
                )
        elif number("repository-disk-write-delay"):
            self.warn(node, "repository-disk-write-delay has no effect on a memory repository")
        activity, keepalive = number("source-activity-timeout"), number("keepalive-interval")
        if activity and activity < 2 * keepalive:
            self.warn(
                node,
                f"source-activity-timeout {activity} should be at least twice keepalive-interval "
                f"{keepalive}",
            )
        if (
            values["repository-allow-ack-on-reception"]
            and not values["repository-allow-receiver-paced-persistence"]
        ):
            self.warn(node, "repository-allow-ack-on-reception has no effect without RPP allowed")

    def stores(self, node: _Node) -> tuple[StoreConfig, ...]:
        stores = tuple(self.store(child) for child in node.children)
        by_name: dict[str, StoreConfig] = {}
        by_context: dict[str, StoreConfig] = {}
        by_port: dict[tuple[str, int], StoreConfig] = {}
        for child, store in zip(node.children, stores, strict=True):
            if store.name in by_name:
                raise self.error(
                    child,
                    f"store name {shown(store.name)} is already used by the store on line "
                    f"{by_name[store.name].line}",
                )
            by_name[store.name] = store
            if store.context_name is not None:
                if store.context_name in by_context:
                    raise self.error(
                        child,
                        f"context-name {shown(store.context_name)} is already used by store "
                        f"{shown(by_context[store.context_name].name)}; context names must be "
                        "unique",
                    )
                by_context[store.context_name] = store
            if store.port:
                key = (store.interface, store.port)
                if key in by_port:
                    raise self.error(
                        child,
                        f"store {shown(store.name)} listens on {store.interface}:{store.port} like "
                        f"store {shown(by_port[key].name)}",
                    )
                by_port[key] = store
        return stores


# =================================================================================================
# Entry points
# =================================================================================================


def _checked_root(raw: bytes, filename: str) -> tuple[_Node, str]:
    root = _read_tree(raw, filename)
    if root.name != "ume-store":
        raise ConfigError(
            filename,
            root.line,
            f"the root element must be <ume-store>, not <{root.name}>",
            root.column,
        )
    version = root.attrs.get("version")
    if version is None:
        raise ConfigError(
            filename,
            root.line,
            "<ume-store> is missing its required attribute 'version'",
            root.column,
        )
    if version not in _DTDS:
        raise ConfigError(
            filename,
            root.line,
            f"<ume-store version={shown(version)}> is not a known DTD version "
            f"(known: {', '.join(DTD_VERSIONS)})",
            root.column,
        )
    return root, version


def validate_structure(data: str | bytes, filename: str = "<string>") -> tuple[ConfigWarning, ...]:
    """Check only well-formedness and the DTD of the declared version (``umestored -v``).

    Option names and values are not looked at.  Returns the structural warnings (ignored UMQ
    elements, a non-DTD spelling of a topic type); raises :class:`ConfigError` at the first
    violation.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    root, version = _checked_root(raw, filename)
    warnings: list[ConfigWarning] = []
    _Validator(filename, version, warnings).validate(root)
    return tuple(warnings)


def parse_store_config(
    data: str | bytes,
    filename: str = "<string>",
    *,
    profile: str | Profile = DEFAULT_PROFILE,
) -> StoreDaemonConfig:
    """Parse umestored XML text; raise :class:`ConfigError` on any problem.

    ``profile`` chooses the defaults for options the file leaves unset (see
    :mod:`reference_impl.config.profiles`).
    """
    chosen = get_profile(profile)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    root, version = _checked_root(raw, filename)
    builder = _Builder(filename, version, chosen)
    _Validator(filename, version, builder.warnings).validate(root)

    daemon = DaemonConfig()
    stores: tuple[StoreConfig, ...] = ()
    for child in root.children:
        if child.name == "daemon":
            daemon = builder.daemon(child)
        elif child.name == "stores":
            stores = builder.stores(child)
    return StoreDaemonConfig(
        version=version,
        profile=chosen.name,
        daemon=daemon,
        stores=stores,
        source=filename,
        warnings=tuple(builder.warnings),
    )


def load_store_config(
    path: str | Path, *, profile: str | Profile = DEFAULT_PROFILE
) -> StoreDaemonConfig:
    """Read and parse a umestored XML file (see :func:`parse_store_config`)."""
    name = str(path)
    try:
        data = read_config_bytes(path)
    except OSError as exc:
        raise ConfigError(name, None, f"cannot read the file: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(name, None, str(exc)) from None
    return parse_store_config(data, name, profile=profile)
