"""What a case exchanged with the IUT: a timeline, and a pcap that tshark reads.

The harness owns every socket that talks to the IUT, so it records exactly the bytes it sent
and received, per TCP connection and per UDP datagram, with the wall-clock time it saw them.
:meth:`Recorder.write_pcap` turns that into Ethernet/IPv4 frames with consistent TCP sequence
numbers (handshake, one segment per LBMC message, FIN exchange), so the evidence of a case
opens in Wireshark and passes ``ump dissect --check-tshark`` without root or tcpdump.  It is the
harness's view: retransmissions the kernel did and TCP segmentation are not in it, which is
what a reviewer of a protocol verdict wants anyway.

Harness notes ("registering a source with RegID 0", "expecting PREG_RESP within 2 s") are
kept in the same timeline, so a report shows what the harness did between packets.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wire import lbmc, lbmr
from wire.errors import WireError
from wire.pcap import PcapWriter, TcpConversation, udp_frame

Addr = tuple[str, int]


@dataclass(frozen=True)
class Entry:
    """One timeline entry.

    Attributes:
        at: wall-clock time (``time.time()``).
        kind: ``open`` (TCP connection), ``close``, ``tcp`` (one framed message or the
            unframeable rest of a stream), ``udp`` (a datagram), ``note`` (harness action or
            check).
        src, dst: endpoints (``None`` for notes).
        data: the bytes (empty for notes and opens/closes).
        conn: the TCP connection number within the case.
        from_iut: True when the IUT sent it.
        text: a one-line summary (decoded headers, or the note).
    """

    at: float
    kind: str
    src: Addr | None
    dst: Addr | None
    data: bytes
    conn: int | None
    from_iut: bool
    text: str


def summarize_message(data: bytes) -> str:
    """One line for an LBMC message: type, then each header with its non-zero fields."""
    try:
        message, _ = lbmc.parse_message(data)
    except WireError as exc:
        return f"undecodable LBMC ({len(data)} bytes): {exc}"
    parts = [message.label()]
    for header in message.headers:
        parts.append(_fields(header))
    if message.is_data_type:
        parts.append(f"sqn={message.sqn} payload={len(message.payload or b'')}B")
    return " ".join(parts)


_PLUMBING = {"code", "next_hdr", "hdr_len", "marker_byte", "flags"}


def _fields(header: Any) -> str:
    """``Name(field=value ...)`` with the non-zero members and bit views of a header.

    A member with bit views is shown through them, each with its value, and only the views
    tshark shows for that raw value (an error PREG_RESP has an error code, not N/W/D flags,
    in the same bits)."""
    values: dict[str, Any] = getattr(header, "values", {})
    views: dict[str, tuple[str, Any]] = getattr(header, "_views", {})
    viewed = {member for member, _bit in views.values()}
    shown = [f"{k}={_short(v)}" for k, v in values.items()
             if k not in _PLUMBING and k not in viewed and v not in (0, None, b"", "", [], ())]
    for view, (member, bit) in views.items():
        raw = values.get(member)
        if not isinstance(raw, int) or (bit.when is not None and not bit.when(raw)):
            continue
        value = bit.get(raw)
        if value:
            shown.append(f"{view}={value}")
    return f"{type(header).__name__}({', '.join(shown)})"


def _short(value: Any) -> str:
    if isinstance(value, bytes):
        return value[:16].hex() + ("…" if len(value) > 16 else "")
    if isinstance(value, list):
        return f"[{len(value)}]"
    return str(value)


def summarize_datagram(data: bytes) -> str:
    try:
        packet = lbmr.parse_packet(data)
    except WireError as exc:
        return f"undecodable LBMR ({len(data)} bytes): {exc}"
    parts = [f"TIR {t.name!r} idx={t.index}" for t in packet.tirs]
    parts += [f"TQR {q.name!r}" for q in packet.tqrs]
    return "LBMR " + (", ".join(parts) or type(packet).__name__)


class Recorder:
    """Thread-safe timeline of one case (every socket thread appends to it)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.entries: list[Entry] = []
        self._lock = threading.Lock()
        self._conns: dict[int, tuple[Addr, Addr]] = {}

    def _add(self, entry: Entry) -> None:
        # stamped again under the lock: two threads that read the clock, then queue for the
        # lock in the other order, would write a pcap whose timestamps step back
        with self._lock:
            at = time.time()
            if self.entries and at < self.entries[-1].at:
                at = self.entries[-1].at
            self.entries.append(dataclasses.replace(entry, at=at))

    def note(self, text: str) -> None:
        self._add(Entry(time.time(), "note", None, None, b"", None, False, text))

    def open(self, client: Addr, server: Addr, *, iut_is_client: bool) -> int:
        with self._lock:
            conn = len(self._conns) + 1
            self._conns[conn] = (client, server)
        self._add(Entry(time.time(), "open", client, server, b"", conn, iut_is_client,
                        f"TCP connection {conn}: {client[0]}:{client[1]} -> "
                        f"{server[0]}:{server[1]}"))
        return conn

    def close(self, conn: int, *, by_iut: bool) -> None:
        client, server = self._conns[conn]
        self._add(Entry(time.time(), "close", client, server, b"", conn, by_iut,
                        f"TCP connection {conn} closed by {'the IUT' if by_iut else 'harness'}"))

    def tcp(self, conn: int, src: Addr, dst: Addr, data: bytes, *, from_iut: bool) -> None:
        self._add(Entry(time.time(), "tcp", src, dst, bytes(data), conn, from_iut,
                        summarize_message(data)))

    def udp(self, src: Addr, dst: Addr, data: bytes, *, from_iut: bool,
            summary: str | None = None) -> None:
        """A datagram; ``summary`` says what it is when it is not LBMR (the transports' peers
        know their protocol, which the bytes alone do not tell)."""
        self._add(Entry(time.time(), "udp", src, dst, bytes(data), None, from_iut,
                        summary if summary is not None else summarize_datagram(data)))

    def snapshot(self) -> list[Entry]:
        with self._lock:
            return list(self.entries)

    # --- output -------------------------------------------------------------------------------

    def timeline(self) -> list[dict[str, Any]]:
        """JSON-ready entries, times relative to the case start."""
        out = []
        for e in self.snapshot():
            row: dict[str, Any] = {"t": round(e.at - self.started, 6), "kind": e.kind,
                                   "text": e.text}
            if e.src is not None and e.dst is not None:
                row["src"] = f"{e.src[0]}:{e.src[1]}"
                row["dst"] = f"{e.dst[0]}:{e.dst[1]}"
                row["from_iut"] = e.from_iut
            if e.conn is not None:
                row["conn"] = e.conn
            if e.data:
                row["bytes"] = len(e.data)
            out.append(row)
        return out

    def write_timeline(self, path: Path) -> None:
        path.write_text(json.dumps(self.timeline(), indent=1))

    def write_pcap(self, path: Path) -> int:
        """Frames of everything exchanged; returns how many were written."""
        conversations: dict[int, TcpConversation] = {}
        count = 0
        with PcapWriter(path) as writer:
            for e in self.snapshot():
                frames: list[bytes] = []
                if e.kind == "open" and e.conn is not None and e.src and e.dst:
                    conv = conversations[e.conn] = TcpConversation(
                        e.src, e.dst, isn=(1000 * e.conn, 500_000 + 1000 * e.conn))
                    frames = conv.handshake()
                elif e.kind == "tcp" and e.conn in conversations and e.src:
                    conv = conversations[e.conn]
                    frames = [conv.send(e.src == conv.client, e.data)]
                elif e.kind == "close" and e.conn in conversations:
                    frames = conversations.pop(e.conn).close()
                elif e.kind == "udp" and e.src and e.dst:
                    frames = [udp_frame(e.src[0], e.src[1], e.dst[0], e.dst[1], e.data)]
                for frame in frames:
                    writer.write(e.at, frame)
                    count += 1
        return count
