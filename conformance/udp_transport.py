"""The data transports a harness source can use in front of a store IUT: LBT-TCP, LBT-RU, LBT-RM.

A store is judged on every transport its sources may use (``ump conform --transport``, the
profile's ``transport``): the case IDs stay, the harness source advertises its topic on the
chosen transport and sends its data there.  LBT-TCP is :class:`conformance.net.Listener`
(the store connects); this module holds the two UDP transports:

* **LBT-RU** (``docs/wire-transports.md`` §1): the source owns a UDP port; the store connects
  (CREQ), gets the SYN session message, and receives DATA on its own receiver port.  The TIR is
  the 10-byte form with the session ID.  The port is an ephemeral one, not tshark's source
  range 14380-14389 (the evidence then decodes with ``-d udp.port==PORT,lbtru``): a store
  serves a run's cases one after another, and a source port of the previous case taken again
  at once, with a new session ID, is a new session on an address the store still holds an old
  one for; judging how a store takes that is no store case's business (the reference store
  keeps CREQing the old session's ID and never hears the new source; on LBT-RM it does not
  join the new group of a unicast port it still receives another group from).
* **LBT-RM** (``docs/wire-transports.md`` §2): the source owns a unicast NAK port (ephemeral,
  as LBT-RU's and for the same reason; tshark's range is 14390-14399) and sends DATA, session
  messages, retransmissions and NCFs to a multicast group from there, multicast interface
  127.0.0.1 with loop on (the machine set up by ``scripts/ensure-multicast``).  Each source
  takes a group and destination port of its own (:func:`fresh_group`), so two runs on one
  machine never hear each other's data; the price is that tshark needs
  ``-d udp.port==PORT,lbtrm`` for the evidence (its default LBT-RM destination port is 14400
  only).

The transport machinery (handshake, session messages, NAK answers, retention) is the
reference's sans-IO sessions (:mod:`reference_impl.lbtru_session`,
:mod:`reference_impl.lbtrm_session`) run on a recorded UDP socket by :class:`UdpTransport`:
the store cases judge the store's persistence, the transport only carries it, and a second
copy of those rules in the harness would be one definition too many.  The LBT-RM suite
(:mod:`conformance.suites.transport_lbtrm`), which judges a source's or receiver's transport
itself, scripts its packets instead.

Waiting for the store: the data a case sends must reach the store, as on LBT-TCP where the
harness waits for the store's connection.  On LBT-RU that is the store's CREQ (a client of the
session); on LBT-RM nothing is sent to the source, so the harness waits until the group is
joined on this host (``/proc/net/igmp``: the group is the source's own, so a membership means
the store), and, where that file cannot be read, a fixed moment (our choice, the only
observable left).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Protocol

from scapy.packet import Packet

from conformance.evidence import Addr, Entry, Recorder
from conformance.net import _bind_first, _wake_and_close, to_bytes
from reference_impl.lbtrm_session import LbtrmSourceSession, LbtrmSourceSettings
from reference_impl.lbtru_session import LbtruSourceSession, LbtruSourceSettings
from wire import lbmc, lbmr, lbtrm, lbtru
from wire.errors import WireError

TCP, LBT_RU, LBT_RM = "tcp", "lbt-ru", "lbt-rm"
TRANSPORTS = (TCP, LBT_RU, LBT_RM)
"""The transports a store is judged on (``ump conform --transport``)."""

LABELS = {TCP: "LBT-TCP", LBT_RU: "LBT-RU", LBT_RM: "LBT-RM"}
"""How the reports name them."""


IGMP = Path("/proc/net/igmp")
JOIN_GRACE = 0.5
"""Seconds the harness waits for an LBT-RM join it cannot see (no ``/proc/net/igmp``)."""


class DataLink(Protocol):
    """Where a harness source's data messages go: a TCP connection of the store on LBT-TCP,
    the transport session on LBT-RU and LBT-RM (one message per datagram)."""

    def send(self, *items: Packet | lbmc.LbmcMessage | bytes) -> None: ...


def fresh_group(rng: random.Random) -> Addr:
    """A multicast group and destination port of a source's own: an administratively scoped
    group (239.192.0.0/14, RFC 2365) and a UDP port free on this host, both random."""
    group = f"239.{rng.randrange(192, 196)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    for _ in range(50):
        port = rng.randrange(20000, 60000)
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            continue
        finally:
            probe.close()
        return group, port
    raise OSError("no free UDP port for an LBT-RM group")


def group_members(group: str) -> int | None:
    """How many memberships of ``group`` this host has on any interface (``/proc/net/igmp``
    lists each joined group per device, the address as little-endian hex; a store that joins
    on another interface than loopback counts too), or None when the file cannot be read."""
    try:
        text = IGMP.read_text()
    except OSError:
        return None
    wanted = f"{struct.unpack('<I', socket.inet_aton(group))[0]:08X}"
    count = 0
    for line in text.splitlines()[1:]:
        parts = line.split()
        if line.startswith(("\t", " ")) and parts and parts[0].upper() == wanted:
            count += int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 1
    return count


def transport_ports(entries: list[Entry]) -> dict[str, list[int]]:
    """The UDP ports that carried LBT-RU and LBT-RM in a case's timeline (both ends of each
    datagram the harness named so, :meth:`Recorder.udp`'s ``summary``): what ``ump dissect
    --lbtru-port/--lbtrm-port`` (tshark ``-d udp.port==PORT,lbtru``) needs for its evidence,
    since the harness's sessions use ports outside tshark's defaults (module docstring)."""
    found: dict[str, set[int]] = {LBT_RU: set(), LBT_RM: set()}
    for e in entries:
        if e.kind != "udp" or e.src is None or e.dst is None:
            continue
        for kind in (LBT_RU, LBT_RM):
            if e.text.startswith(LABELS[kind] + " "):
                found[kind] |= {e.src[1], e.dst[1]}
    return {k: sorted(v) for k, v in found.items() if v}


class UdpTransport:
    """One LBT-RU or LBT-RM source session of a harness source on a recorded UDP socket.

    A thread reads the socket (CREQs, NAKs, ACKs from the store), runs the session's timers
    (session messages) and sends what the session says, recording every datagram in the
    case's evidence."""

    def __init__(self, kind: str, recorder: Recorder, name: str, *,
                 rng: random.Random | None = None, ip: str = "127.0.0.1") -> None:
        """``rng`` draws the session ID and the LBT-RM group (default: unseeded, so two runs
        with the same ``--seed`` still take different groups)."""
        rng = rng or random.Random()
        if kind not in (LBT_RU, LBT_RM):
            raise ValueError(f"not a UDP transport: {kind!r}")
        self.kind = kind
        self.recorder = recorder
        self.name = name
        self.session_id = rng.randrange(1, 1 << 32)
        self.sock = _bind_first(socket.SOCK_DGRAM, ip, [])
        self.addr: Addr = self.sock.getsockname()[:2]
        self.group: Addr | None = None
        self._lock = threading.RLock()
        self._closed = False
        self._members_before = 0
        self.session: LbtruSourceSession | LbtrmSourceSession
        now = time.monotonic()
        if kind == LBT_RU:
            self.session = LbtruSourceSession(LbtruSourceSettings(session_id=self.session_id),
                                              now=now)
        else:
            self.group = fresh_group(rng)
            self._members_before = group_members(self.group[0]) or 0
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                                 socket.inet_aton(ip))
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            self.session = LbtrmSourceSession(
                self.group, self.addr[1], LbtrmSourceSettings(session_id=self.session_id),
                now=now)
        self._created = now
        self._thread = threading.Thread(target=self._run, name=f"harness {name}", daemon=True)
        self._thread.start()

    # --- what the harness source uses ---------------------------------------------------------

    def info(self) -> lbmr.Record:
        """The TIR's transport information for this session (tshark's binding form)."""
        if self.kind == LBT_RU:
            return lbmr.LbtruSidInfo(ip=self.addr[0], session_id=self.session_id,
                                     port=self.addr[1])
        assert self.group is not None
        return lbmr.LbtrmInfo(src_addr=self.addr[0], mcast_addr=self.group[0],
                              session_id=self.session_id, udp_dest_port=self.group[1],
                              src_ucast_port=self.addr[1])

    def describe(self) -> str:
        """One line for the evidence: the session's addresses."""
        if self.group is None:
            return f"{LABELS[self.kind]} source {self.addr[0]}:{self.addr[1]} session " \
                   f"{self.session_id:#010x}"
        return f"{LABELS[self.kind]} source {self.addr[0]}:{self.addr[1]} session " \
               f"{self.session_id:#010x} to {self.group[0]}:{self.group[1]}"

    def receivers(self) -> int:
        """LBT-RU: the clients connected; LBT-RM: the memberships of the group on this host
        beyond those before the session began (-1 when they cannot be seen)."""
        if isinstance(self.session, LbtruSourceSession):
            with self._lock:
                return len(self.session.clients)
        assert self.group is not None
        members = group_members(self.group[0])
        return -1 if members is None else members - self._members_before

    def wait_receiver(self, timeout: float) -> bool:
        """Wait until a receiver (the store) listens to the session (see the module
        docstring); True if one does (or, on LBT-RM without ``/proc/net/igmp``, after
        :data:`JOIN_GRACE`)."""
        deadline = time.monotonic() + timeout
        while True:
            count = self.receivers()
            if count > 0:
                return True
            if count < 0:
                time.sleep(max(0.0, min(JOIN_GRACE - (time.monotonic() - self._created),
                                        deadline - time.monotonic())))
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def send(self, *items: Packet | lbmc.LbmcMessage | bytes) -> None:
        """Each item as the payload of one DATA datagram of the session."""
        with self._lock:
            for item in items:
                self.session.send(to_bytes(item), time.monotonic())
            self._flush()

    def send_lost(self, *items: Packet | lbmc.LbmcMessage | bytes) -> None:
        """Each item as a DATA datagram of the session that the network loses (never sent,
        noted in the evidence), after which the session holds nothing sent so far: the
        store's NAK for them gets "do not retry" and its transport gives them up, as when a
        source's window moved past a loss (on LBT-RM the next datagram's trailing edge also
        says so)."""
        with self._lock:
            self._flush()
            now = time.monotonic()
            sqns = [self.session.send(to_bytes(item), now) for item in items]
            self.session.datagrams_to_send(now)  # lost on the way
            self.session.forget()
            self.recorder.note(f"{self.name}: {LABELS[self.kind]} datagrams {sqns} lost on the "
                               f"way and no longer retransmittable")

    def close(self) -> None:
        with self._lock:
            self._closed = True
        _wake_and_close(self.sock)
        self._thread.join(timeout=2.0)

    # --- the driver ---------------------------------------------------------------------------

    def _summary(self, data: bytes) -> str:
        """The datagram as tshark's Info column would name it (the timeline's text)."""
        try:
            packet = (lbtru.parse_packet(data, decode_lbmc=False) if self.kind == LBT_RU
                      else lbtrm.parse_packet(data, decode_lbmc=False))
        except WireError as exc:
            return f"undecodable {LABELS[self.kind]} ({len(data)} bytes): {exc}"
        return f"{LABELS[self.kind]} {packet.info()}"

    def _flush(self) -> None:
        for data, addr in self.session.datagrams_to_send(time.monotonic()):
            self.recorder.udp(self.addr, addr, data, from_iut=False, summary=self._summary(data))
            with contextlib.suppress(OSError):
                self.sock.sendto(data, addr)
        while self.session.next_event() is not None:
            pass  # client connections and time-outs: nothing the harness acts on

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                self.session.handle_timer(now)
                self._flush()
                due = self.session.get_timer()
            wait = 0.05 if due is None else min(0.05, max(0.001, due - time.monotonic()))
            try:
                self.sock.settimeout(wait)
                data, addr = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data and addr is None:
                return
            self.recorder.udp(addr[:2], self.addr, data, from_iut=True,
                              summary=self._summary(data))
            with self._lock:
                self.session.receive(data, addr[:2], time.monotonic())
                self._flush()
