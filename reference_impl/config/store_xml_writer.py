"""Write umestored XML: the one place the demo, benchmarks and tests get a store file from.

The reader (:mod:`reference_impl.config.store_xml`) is the authority on what is valid; this
writer only produces the common shape (one ``<daemon>``, stores with store-level options, topic
patterns with topic-level options) and escapes every value, so a pattern such as ``demo\\..*``
or a path with ``&`` in it cannot break the file.  :func:`store_daemon_xml` output always parses
back with :func:`~reference_impl.config.store_xml.parse_store_config` (a test checks it): a
value holding a character XML 1.0 cannot carry at all (a C0 control other than tab and line
breaks, a lone surrogate, U+FFFE or U+FFFF) raises ``ValueError`` here instead of producing a
file every reader refuses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax import saxutils

Options = Mapping[str, str | int]


@dataclass(frozen=True)
class TopicXml:
    """One ``<topic>``: a pattern (PCRE unless ``type`` says ``direct``) and its options."""

    pattern: str
    options: Options = field(default_factory=dict)
    type: str = "PCRE"


@dataclass(frozen=True)
class StoreXml:
    """One ``<store>``: name, TCP port and interface, store-level options and topics."""

    name: str
    port: int
    interface: str = "127.0.0.1"
    options: Options = field(default_factory=dict)
    topics: Sequence[TopicXml] = ()


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""A character outside XML 1.0's ``Char`` production."""


def _carried(value: str) -> str:
    """``value`` unchanged, or ``ValueError`` when XML 1.0 cannot hold one of its characters."""
    bad = _NOT_XML.search(value)
    if bad is not None:
        raise ValueError(f"{value!r} holds U+{ord(bad.group()):04X}, which XML 1.0 cannot carry")
    return value


def _quoteattr(value: str) -> str:
    """An attribute value, quoted and escaped (line breaks and tabs as character references,
    so they read back unchanged)."""
    return saxutils.quoteattr(_carried(value))


def _options(options: Options, indent: str) -> list[str]:
    if not options:
        return []
    lines = [f"{indent}<ume-attributes>"]
    lines += [f'{indent}  <option type="store" name={_quoteattr(name)} '
              f"value={_quoteattr(str(value))}/>" for name, value in options.items()]
    lines.append(f"{indent}</ume-attributes>")
    return lines


def store_daemon_xml(stores: Sequence[StoreXml], *, web_monitor: str | None = None,
                     lbm_config: str | None = None, version: str = "1.3") -> str:
    """The text of a umestored configuration file holding ``stores``."""
    lines = ['<?xml version="1.0"?>', f"<ume-store version={_quoteattr(version)}>"]
    daemon = []
    if lbm_config is not None:
        daemon.append(f"    <lbm-config>{_text(lbm_config)}</lbm-config>")
    if web_monitor is not None:
        daemon.append(f"    <web-monitor>{_text(web_monitor)}</web-monitor>")
    lines += ["  <daemon>", *daemon, "  </daemon>"] if daemon else ["  <daemon/>"]
    lines.append("  <stores>")
    for store in stores:
        lines.append(f"    <store name={_quoteattr(store.name)} port={_quoteattr(str(store.port))} "
                     f"interface={_quoteattr(store.interface)}>")
        lines += _options(store.options, "      ")
        if store.topics:
            lines.append("      <topics>")
            for topic in store.topics:
                lines.append(f"        <topic pattern={_quoteattr(topic.pattern)} "
                             f"type={_quoteattr(topic.type)}>")
                lines += _options(topic.options, "          ")
                lines.append("        </topic>")
            lines.append("      </topics>")
        lines.append("    </store>")
    lines += ["  </stores>", "</ume-store>", ""]
    return "\n".join(lines)


def _text(value: str) -> str:
    return _carried(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def disk_store_xml(name: str, port: int, pattern: str, *, repository: str = "disk",
                   web_monitor: str | None = None, store_options: Options | None = None,
                   topic_options: Options | None = None) -> str:
    """One store with cache and state directories ``cache``/``state`` (relative to the file)
    whose topics matching ``pattern`` use ``repository`` with generous size limits."""
    options: dict[str, str | int] = {"context-name": name, "disk-cache-directory": "cache",
                                     "disk-state-directory": "state", **(store_options or {})}
    topic: dict[str, str | int] = {"repository-type": repository,
                                   "repository-size-threshold": 1 << 30,
                                   "repository-size-limit": 2 << 30,
                                   "repository-disk-file-size-limit": 4 << 30,
                                   **(topic_options or {})}
    return store_daemon_xml([StoreXml(name, port, options=options,
                                      topics=[TopicXml(pattern, topic)])],
                            web_monitor=web_monitor)
