"""Run tshark, the independent oracle, and compare its view of a capture with ours.

tshark (Wireshark 4.0.x, Debian package ``tshark``) decides whether our bytes are right.  This
module knows how to ask it: which preferences and decode-as rules put UM traffic on non-default
ports through the LBM dissectors (:class:`PortMap`), how to read its JSON into per-message
(field, value) lists, how to collect its malformed/expert errors (including the LBMC experts
that have no tree item and show only in ``-z expert``), and how to compare values whose text
forms differ (``0x50`` vs 80, ``68:65`` vs ``b"he"``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fields import text_bytes

UM_PROTOCOLS = ("lbmc", "lbttcp", "lbtru", "lbtrm", "lbmr")


class TsharkMissing(RuntimeError):
    """tshark is not installed (``apt-get install -y tshark``)."""


def tshark_path() -> str:
    path = shutil.which("tshark")
    if path is None:
        raise TsharkMissing("tshark not found on PATH; install it with: apt-get install -y tshark")
    return path


#: tshark's ``gui.max_tree_depth`` for our runs.  tshark 4.0 counts every LBMC message of a frame
#: as a protocol layer and calls a frame with more than 500 (its default) a dissector bug
#: ("failed assertion saved_layers_len < prefs.gui_max_tree_depth", shown as malformed).  A
#: 64 KiB loopback TCP segment of small data messages holds thousands of them (5,456 of the
#: smallest, 12 bytes each), which UM and the reference source send when a send burst is
#: coalesced; the bytes are fine, so the oracle runs with room for the largest segment rather
#: than flag it.
MAX_LAYERS = 8000


@dataclass
class PortMap:
    """Where UM traffic lives, like tshark's preferences.  Defaults are tshark's defaults.

    Attributes:
        store_ports: TCP ports of persistent stores (tshark has no default: 0-0).
        lbttcp_ports: further TCP ports to decode as LBT-TCP (decode-as).
        lbtru_ports / lbtrm_ports / lbmr_ports: further UDP ports to decode as those protocols.
        lbttcp_source / lbttcp_request: LBT-TCP transport source and request port ranges.
        lbtru_source / lbtru_receiver: LBT-RU heuristic port ranges.
        lbmr_uc_ports / lbmr_uc_dest_port: unicast resolver client ports and lbmrd port.
        lbtrm_mim: LBT-RM multicast immediate messaging group and port.
        reassemble_fragments: lbmc.reassemble_fragments (two-pass is used when set).
    """

    store_ports: list[int] = field(default_factory=list)
    lbttcp_ports: list[int] = field(default_factory=list)
    lbtru_ports: list[int] = field(default_factory=list)
    lbtrm_ports: list[int] = field(default_factory=list)
    lbmr_ports: list[int] = field(default_factory=list)
    lbttcp_source: tuple[int, int] = (14371, 14390)
    lbttcp_request: tuple[int, int] = (14391, 14395)
    lbtru_source: tuple[int, int] = (14380, 14389)
    lbtru_receiver: tuple[int, int] = (14360, 14379)
    lbtrm_mc_range: tuple[str, str] = ("224.10.10.10", "224.10.10.14")
    lbtrm_dport: tuple[int, int] = (14400, 14400)
    lbtrm_sport: tuple[int, int] = (14390, 14399)
    lbtrm_mim: tuple[str, int] = ("224.10.10.21", 14401)
    lbmr_uc_ports: tuple[int, int] = (14402, 14406)
    lbmr_uc_dest_port: int = 15380
    lbmr_mc: tuple[str, int] = ("224.9.10.11", 12965)
    reassemble_fragments: bool = False

    def tshark_args(self) -> list[str]:
        """The ``-o``/``-d`` arguments that make tshark see this map."""
        args = ["-o", "lbmc.use_heuristic_subdissectors:FALSE",
                "-o", f"gui.max_tree_depth:{MAX_LAYERS}"]
        prefs = {
            "lbttcp.source_port_low": self.lbttcp_source[0],
            "lbttcp.source_port_high": self.lbttcp_source[1],
            "lbttcp.request_port_low": self.lbttcp_request[0],
            "lbttcp.request_port_high": self.lbttcp_request[1],
            "lbtru.source_port_low": self.lbtru_source[0],
            "lbtru.source_port_high": self.lbtru_source[1],
            "lbtru.receiver_port_low": self.lbtru_receiver[0],
            "lbtru.receiver_port_high": self.lbtru_receiver[1],
            "lbtrm.mc_address_low": self.lbtrm_mc_range[0],
            "lbtrm.mc_address_high": self.lbtrm_mc_range[1],
            "lbtrm.dport_low": self.lbtrm_dport[0],
            "lbtrm.dport_high": self.lbtrm_dport[1],
            "lbtrm.sport_low": self.lbtrm_sport[0],
            "lbtrm.sport_high": self.lbtrm_sport[1],
            "lbtrm.mim_incoming_address": self.lbtrm_mim[0],
            "lbtrm.mim_outgoing_address": self.lbtrm_mim[0],
            "lbtrm.mim_incoming_dport": self.lbtrm_mim[1],
            "lbtrm.mim_outgoing_dport": self.lbtrm_mim[1],
            "lbmr.uc_port_low": self.lbmr_uc_ports[0],
            "lbmr.uc_port_high": self.lbmr_uc_ports[1],
            "lbmr.uc_dest_port": self.lbmr_uc_dest_port,
            "lbmr.mc_incoming_address": self.lbmr_mc[0],
            "lbmr.mc_outgoing_address": self.lbmr_mc[0],
            "lbmr.mc_incoming_port": self.lbmr_mc[1],
            "lbmr.mc_outgoing_port": self.lbmr_mc[1],
            "lbmc.reassemble_fragments": "TRUE" if self.reassemble_fragments else "FALSE",
        }
        for key, value in prefs.items():
            args += ["-o", f"{key}:{value}"]
        for port in self.store_ports:
            args += ["-d", f"tcp.port=={port},lbttcp"]
        for port in self.lbttcp_ports:
            args += ["-d", f"tcp.port=={port},lbttcp"]
        for port in self.lbtru_ports:
            args += ["-d", f"udp.port=={port},lbtru"]
        for port in self.lbtrm_ports:
            args += ["-d", f"udp.port=={port},lbtrm"]
        for port in self.lbmr_ports:
            args += ["-d", f"udp.port=={port},lbmr"]
        if self.reassemble_fragments:
            args.insert(0, "-2")
        return args


class TsharkRefused(RuntimeError):
    """tshark exited with an error status, typically because it cannot read the capture
    (cut short, a record larger than it accepts, a damaged pcapng block or option).

    ``str()`` keeps the whole command and stderr for logs; :attr:`first_error` is tshark's own
    first error line, fit for a one-line message to a user.
    """

    def __init__(self, args: Sequence[str], stderr: str, status: int) -> None:
        super().__init__(f"tshark {' '.join(args)} failed (status {status}): {stderr.strip()}")
        self.stderr, self.status = stderr, status

    @property
    def first_error(self) -> str:
        """tshark's first error line, with the detail line it puts in parentheses under it.

        tshark (as root) first warns ``Running as user "root" ...``; that is not an error and
        is skipped.  A file problem reads ``tshark: The file "x" appears to be damaged or
        corrupt.`` followed by ``(pcap: File has 3000000000-byte packet, ...)``: both are kept,
        on one line, without the ``tshark:`` prefix.
        """
        lines = [line.strip() for line in self.stderr.splitlines()
                 if line.strip() and not line.startswith("Running as user")]
        if not lines:
            return f"tshark exited with status {self.status} and no message"
        first = lines[0].removeprefix("tshark: ")
        if len(lines) > 1 and lines[1].startswith("("):
            first = f"{first} {lines[1]}"
        return first


def run(args: Sequence[str], timeout: float = 600) -> str:
    """Run tshark with ``args``; returns stdout.  Raises :class:`TsharkRefused` on failure."""
    proc = subprocess.run([tshark_path(), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise TsharkRefused(args, proc.stderr, proc.returncode)
    return proc.stdout


@dataclass
class TsharkFrame:
    """tshark's view of one frame.

    Attributes:
        number: frame number (1-based).
        protocols: per UM protocol, the list of its flattened occurrences; each occurrence is a
            list of (field name, value string) pairs in tree order.  For ``lbmc`` an occurrence
            is one LBMC message.
        malformed: text of every malformed/exception item.
        experts: (severity, message) pairs from the tree's expert items.
    """

    number: int
    protocols: dict[str, list[list[tuple[str, str]]]]
    malformed: list[str] = field(default_factory=list)
    experts: list[tuple[str, str]] = field(default_factory=list)

    def occurrences(self, protocol: str) -> list[list[tuple[str, str]]]:
        return self.protocols.get(protocol, [])


Pairs = list[tuple[str, Any]]


def _flatten(node: Any, out: list[tuple[str, str]], experts: list[tuple[str, str]],
             malformed: list[str]) -> None:
    """Walk tshark's JSON tree (objects kept as ordered key/value pair lists) depth first."""
    if isinstance(node, list) and all(isinstance(p, tuple) and len(p) == 2 for p in node):
        for key, value in node:
            if key == "_ws.expert":
                item = dict(value) if isinstance(value, list) else {}
                experts.append((str(item.get("_ws.expert.severity", "")),
                                str(item.get("_ws.expert.message", ""))))
                continue
            if key.startswith("_ws.malformed"):
                malformed.append(str(value if not isinstance(value, list) else key))
                continue
            if isinstance(value, list):
                if value and all(not isinstance(v, list | tuple) for v in value):
                    out.extend((key, str(v)) for v in value)  # a multi-valued leaf
                else:
                    _flatten(value, out, experts, malformed)
            else:
                out.append((key, str(value)))
    elif isinstance(node, list):
        for item in node:
            _flatten(item, out, experts, malformed)


def read_frames(pcap: str | Path, ports: PortMap | None = None,
                protocols: Iterable[str] = UM_PROTOCOLS) -> list[TsharkFrame]:
    """tshark's JSON of every frame, flattened per UM protocol occurrence.

    Duplicate keys are kept (no ``--no-duplicate-keys``) and objects are read as ordered pair
    lists, so fields keep their tree order even when one LBMC message holds several headers
    whose fields share names (the ctxinst family); each repeated protocol key (``lbmc``
    twice for two messages in one frame) is one occurrence.
    """
    ports = ports or PortMap()
    protos = list(protocols)
    out = run(["-r", str(pcap), *ports.tshark_args(), "-T", "json",
               "-J", " ".join([*protos, "_ws"])])
    packets = json.loads(out or "[]", object_pairs_hook=lambda pairs: pairs)
    frames = []
    for index, packet in enumerate(packets, 1):
        source = dict(dict(packet)["_source"])
        layers: Pairs = source["layers"]
        frame_fields = dict(dict(layers).get("frame", []))
        number = int(frame_fields.get("frame.number", index))
        frame = TsharkFrame(number, {})
        for key, value in layers:
            if key in protos:
                flat: list[tuple[str, str]] = []
                if isinstance(value, list):
                    _flatten(value, flat, frame.experts, frame.malformed)
                frame.protocols.setdefault(key, []).append(flat)
            elif key.startswith("_ws"):
                _flatten([(key, value)], [], frame.experts, frame.malformed)
        frames.append(frame)
    return frames


def expert_summary(pcap: str | Path, ports: PortMap | None = None) -> dict[str, list[str]]:
    """``tshark -q -z expert``: severity -> messages.  Catches the LBMC experts that have no
    tree item ("LBMC header length is zero", "Invalid fragment ...")."""
    ports = ports or PortMap()
    text = run(["-r", str(pcap), *ports.tshark_args(), "-q", "-z", "expert"])
    out: dict[str, list[str]] = defaultdict(list)
    severity = ""
    for line in text.splitlines():
        heading = re.match(r"^(Errors|Warns|Notes|Chats|Comments) \(\d+\)", line)
        if heading:
            severity = heading.group(1)
            continue
        row = re.match(r"^\s+\d+\s+\S+\s+\S+\s+(.*)$", line)
        if severity and row and not line.strip().startswith("="):
            out[severity].append(row.group(1).strip())
    return dict(out)


def field_list(protocols: Iterable[str] = UM_PROTOCOLS) -> dict[str, tuple[str, int]]:
    """Every registered field of the UM dissectors: name -> (type, bitmask)."""
    wanted = set(protocols)
    out = {}
    for line in run(["-G", "fields"]).splitlines():
        parts = line.split("\t")
        if len(parts) >= 7 and parts[0] == "F" and parts[4] in wanted:
            out[parts[2]] = (parts[3], int(parts[6], 16) if parts[6].startswith("0x") else 0)
    return out


# --- comparison ----------------------------------------------------------------------------------


def normalize(value: Any) -> str:
    """One text form for a value from either side (ints in decimal, bytes as bare hex)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    text = str(value)
    if text in ("True", "False"):
        return "1" if text == "True" else "0"
    if re.fullmatch(r"-?0x[0-9a-fA-F]+", text):
        return str(int(text, 16))
    if re.fullmatch(r"-?\d+", text):
        return str(int(text))
    if re.fullmatch(r"([0-9a-fA-F]{2}:)+[0-9a-fA-F]{2}", text):
        return text.replace(":", "").lower()
    return text


@dataclass(frozen=True)
class Disagreement:
    """One field where our decoder and tshark differ (``None`` = the side lacks the field)."""

    frame: int
    field: str
    ours: str | None
    theirs: str | None

    def __str__(self) -> str:
        return f"frame {self.frame}: {self.field}: ours={self.ours!r} tshark={self.theirs!r}"


def tshark_text(value: str | bytes) -> str:
    """A name as tshark 4.0 shows it: every byte of 0x80 and above becomes U+FFFD.

    The LBM dissectors add topic, store and queue names as ASCII strings (``ENC_ASCII``), and
    Wireshark turns each byte outside ASCII into the replacement character: the UTF-8 topic
    ``prix/€/日本`` (3 + 3 + 3 bytes outside ASCII) is ``prix/���/������`` in tshark's JSON and
    in ``-T fields``.  Measured with tshark 4.0.17 on ``lbmr.tir.name``, ``lbmr.tqr.name`` and
    ``lbmc.topicname.topic``; bytes below 0x80, control characters included, are kept.
    """
    raw = text_bytes(value)
    if raw.isascii():
        return raw.decode("ascii")
    return "".join(chr(b) if b < 0x80 else "\ufffd" for b in raw)


def _their_text(theirs: str, ours: Any) -> str:
    """tshark's text read the way our value's type says (FT_BYTES of one byte prints ``05``)."""
    if isinstance(ours, bytes | bytearray | memoryview):
        return theirs.replace(":", "").lower()
    return normalize(theirs)


def compare(frame: int, ours: Sequence[tuple[str, Any]], theirs: Sequence[tuple[str, str]],
            ) -> list[Disagreement]:
    """Compare two flattened occurrences field by field (each name's values in order).

    Every field we emit must be present in tshark's view with the same values in the same order.
    Text values are compared up to their first NUL (tshark displays strings that way), in
    tshark's ASCII view of them (:func:`tshark_text`).
    """
    mine: dict[str, list[Any]] = defaultdict(list)
    for name, value in ours:
        if isinstance(value, str):
            value = tshark_text(value.split("\0", 1)[0])
        mine[name].append(value)
    seen: dict[str, list[str]] = defaultdict(list)
    for name, value in theirs:
        seen[name].append(value)
    problems = []
    for name, values in mine.items():
        other = seen.get(name, [])
        for i in range(max(len(values), len(other))):
            a = normalize(values[i]) if i < len(values) else None
            b = (_their_text(other[i], values[i] if i < len(values) else None)
                 if i < len(other) else None)
            if a != b:
                problems.append(Disagreement(frame, name, a, b))
    return problems
