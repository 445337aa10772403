"""Scripted LBT-RM peers for judging a source's or a receiver's LBT-RM transport itself.

The store cases carry data on LBT-RM through :mod:`conformance.udp_transport` (the reference
session does the transport work there).  The LBT-RM suite (:mod:`conformance.suites
.transport_lbtrm`) judges the transport, so its peers do nothing by themselves: every packet is
built from :mod:`wire.lbtrm` when the case says so, and everything that arrives is recorded in
the case's evidence and kept with its arrival time.

* :class:`LbtrmTap` is a receiver of a source IUT's session: it joins the group the source's TIR
  names (on 127.0.0.1, as ``scripts/ensure-multicast`` sets loopback up), keeps the session's
  DATA, SM and NCF datagrams, and sends NAKs to the unicast port in the header.
* :class:`LbtrmScriptedSource` is a source in front of a receiver IUT: a unicast port of its own,
  a group and destination port of its own (:func:`conformance.udp_transport.fresh_group`); the
  harness resolver answers the IUT's query with its TIR; it sends DATA, SM and NCF as the case
  says and keeps the NAKs it receives.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable

from conformance.evidence import Addr, Recorder
from conformance.packets import LBMC
from conformance.udp_transport import fresh_group
from wire import lbmr, lbtrm
from wire.errors import WireError
from wire.lbmc import MessageType

Seen = tuple[float, lbtrm.LbtrmPacket]
"""(arrival time on the monotonic clock, the datagram decoded)."""


class _Peer:
    """A recorded UDP socket with a reader thread that keeps the LBT-RM datagrams ``accept``
    takes (with their arrival time)."""

    def __init__(self, sock: socket.socket, recorder: Recorder, name: str) -> None:
        self.sock = sock
        self.recorder = recorder
        self.name = name
        self.addr: Addr = sock.getsockname()[:2]
        self.heard_at: Addr = self.addr
        """The destination the evidence records for what arrives (a tap's group)."""
        self.seen: list[Seen] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, name=f"harness {name}", daemon=True)
        self._thread.start()

    def accept(self, packet: lbtrm.LbtrmPacket, addr: Addr) -> bool:
        raise NotImplementedError

    def _read(self) -> None:
        while True:
            try:
                data, addr = self.sock.recvfrom(65536)
            except OSError:
                return
            if addr is None:
                return
            now = time.monotonic()
            try:
                packet = lbtrm.parse_packet(data, decode_lbmc=False)
            except WireError as exc:
                self.recorder.udp(addr[:2], self.heard_at, data, from_iut=True,
                                  summary=f"undecodable LBT-RM ({len(data)} bytes): {exc}")
                continue
            self.recorder.udp(addr[:2], self.heard_at, data, from_iut=True,
                              summary=f"LBT-RM {packet.info()}")
            if self.accept(packet, addr[:2]):
                with self._cond:
                    self.seen.append((now, packet))
                    self._cond.notify_all()

    def of(self, kind: type[lbtrm.LbtrmPacket]) -> list[Seen]:
        """Every datagram of ``kind`` kept so far."""
        with self._cond:
            return [(t, p) for t, p in self.seen if isinstance(p, kind)]

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate`` holds (checked at each datagram) or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return predicate()
                self._cond.wait(left)
            return True

    def _send(self, packet: lbtrm.LbtrmPacket | bytes, to: Addr) -> float:
        data = packet if isinstance(packet, bytes) else packet.build()
        try:
            summary = f"LBT-RM {lbtrm.parse_packet(data, decode_lbmc=False).info()}"
        except WireError as exc:
            summary = f"undecodable LBT-RM ({len(data)} bytes): {exc}"
        self.recorder.udp(self.addr, to, data, from_iut=False, summary=summary)
        with contextlib.suppress(OSError):
            self.sock.sendto(data, to)
        return time.monotonic()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


class LbtrmTap(_Peer):
    """A scripted receiver of a source IUT's LBT-RM session (see the module docstring)."""

    def __init__(self, info: lbmr.Record, recorder: Recorder, name: str = "LBT-RM receiver",
                 *, interface: str = "127.0.0.1") -> None:
        self.source: Addr = (str(info.src_addr), int(info.src_ucast_port))
        self.group: Addr = (str(info.mcast_addr), int(info.udp_dest_port))
        self.session_id = int(info.session_id)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", self.group[1]))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                        socket.inet_aton(self.group[0]) + socket.inet_aton(interface))
        super().__init__(sock, recorder, name)
        self.addr = (interface, self.group[1])  # where its NAKs leave from
        self.heard_at = self.group

    def accept(self, packet: lbtrm.LbtrmPacket, addr: Addr) -> bool:
        return packet.session_id == self.session_id and packet.ucast_port == self.source[1]

    def data(self) -> list[tuple[float, lbtrm.LbtrmData]]:
        return [(t, p) for t, p in self.of(lbtrm.LbtrmData) if isinstance(p, lbtrm.LbtrmData)]

    def nak(self, *sqns: int) -> float:
        """A selective NAK for ``sqns`` to the source's unicast port; returns when it left."""
        return self._send(lbtrm.LbtrmNak(ucast_port=self.source[1], session_id=self.session_id,
                                         format=lbtrm.FORMAT_SELECTIVE, naks=list(sqns)),
                          self.source)


class LbtrmScriptedSource(_Peer):
    """A scripted LBT-RM source of ``topic`` in front of a receiver IUT (see the module
    docstring).  Serve it with the harness resolver (``h.resolver.serve(src)``)."""

    def __init__(self, topic: str, recorder: Recorder, name: str = "LBT-RM source", *,
                 ip: str = "127.0.0.1") -> None:
        rng = random.Random()
        self.topic = topic
        self.topic_idx = rng.randrange(1, 1 << 31)
        self.session_id = rng.randrange(1, 1 << 32)
        self.group = fresh_group(rng)
        self.advertise_on_query = True
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((ip, 0))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        super().__init__(sock, recorder, name)
        self._sm_sqn = 0
        self.request: Addr | None = None
        """A request port to name in the TIR's EXFUNC option (where a streaming receiver's
        off-transport recovery asks); None: the TIR names none."""

    def accept(self, packet: lbtrm.LbtrmPacket, addr: Addr) -> bool:
        return isinstance(packet, lbtrm.LbtrmNak) and packet.session_id == self.session_id

    def tir(self) -> lbmr.Tir:
        """A streaming source's TIR (no persistence options): the transport is the subject;
        with :attr:`request`, the EXFUNC option names that request port."""
        options: list[lbmr.Record] | None = None
        if self.request is not None:
            options = [lbmr.ToptExfunc(src_tcp_port=self.request[1],
                                       src_ip_addr=self.request[0], ume=0, lj=1)]
        return lbmr.Tir(name=self.topic, ttl=1, index=self.topic_idx,
                        info=lbmr.LbtrmInfo(src_addr=self.addr[0], mcast_addr=self.group[0],
                                            session_id=self.session_id,
                                            udp_dest_port=self.group[1],
                                            src_ucast_port=self.addr[1]),
                        options=options)

    def naks(self) -> list[tuple[float, list[int]]]:
        """(arrival time, the sequence numbers named) of every NAK so far."""
        return [(t, list(p.naks)) for t, p in self.of(lbtrm.LbtrmNak)
                if isinstance(p, lbtrm.LbtrmNak)]

    def naks_of(self, sqn: int) -> list[float]:
        """Arrival times of the NAKs naming ``sqn``."""
        return [t for t, sqns in self.naks() if sqn in sqns]

    def data(self, sqn: int, *, trail: int = 0, rx: bool = False, body: bytes = b"") -> float:
        """DATA ``sqn`` carrying one LBMC data message of the same topic sequence number."""
        payload = LBMC(ver_type=int(MessageType.MESSAGE), tidx=self.topic_idx, sqn=sqn) / (
            body or f"{self.topic} #{sqn}".encode())
        header = lbtrm.LbtrmData(ucast_port=self.addr[1], session_id=self.session_id, sqn=sqn,
                                 trail_sqn=trail, ucast_naks=1, rx=int(rx)).build()
        return self._send(header + bytes(payload), self.group)

    def sm(self, lead: int, trail: int = 0) -> float:
        """A session message with these edges."""
        self._sm_sqn += 1
        return self._send(lbtrm.LbtrmSm(ucast_port=self.addr[1], session_id=self.session_id,
                                        sm_sqn=self._sm_sqn, lead_sqn=lead, trail_sqn=trail,
                                        ucast_naks=1), self.group)

    def ncf(self, reason: lbtrm.NcfReason, *sqns: int, trail: int = 0) -> float:
        """An NCF for ``sqns`` with ``reason`` to the group."""
        return self._send(lbtrm.LbtrmNcf(ucast_port=self.addr[1], session_id=self.session_id,
                                         trail_sqn=trail, reason=int(reason),
                                         format=lbtrm.FORMAT_SELECTIVE, ncfs=list(sqns)),
                          self.group)
