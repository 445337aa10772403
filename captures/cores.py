"""Captures played by the reference implementation's own sans-IO cores.

:class:`CoresBackend` turns a :class:`~captures.scenarios.Scenario` into a
:class:`~reference_impl.deployment.SimDeployment` (the resolver daemon, one store core per
store, one source core per topic, one receiver core per receiver and topic) and runs it on the
simulator's virtual clock.  Nothing about the protocol is scripted here: registrations, SRI,
data, stability and consumption ACKs, keepalives, recovery after restarts and refusals are
whatever the cores do, so the capture is the behavioural reference the wire backend only
models.  The driver only does what an application and an operator would: send messages at the
scenario's rate, kill and restart processes, start a misconfigured source.

Why a tap instead of :meth:`SimNetwork.write_pcap`: the simulator records every delivery in
``SimNetwork.trace`` for the whole run, which grows without bound.  :class:`CaptureTap` is
registered as a ``capture_hook`` and turns each delivery into frames in the
:class:`~captures.generator.FrameSink` as it happens (the sink writes a chunk at a time), and
the deployment's network is made with ``keep_trace=False`` so it keeps nothing.  Core events are
drained into counters (:class:`EventLedger`) as the run goes, so memory stays bounded by the
deployment's own state (repositories are capped by ``repository-size-threshold``), not by the
length of the run.

Expected counts: ``expected`` in the sidecar is tallied from the bytes the cores actually put
on the simulated wire, decoded with :mod:`wire` (each frame is read the way ``ump dissect``
reads it: LBT-TCP entry test, framing across segments, tshark labels), never from what the
driver asked for; ``events`` holds what the cores reported (stores' granted and refused
registrations, sources' and receivers' registration, stability, delivery and loss events), so
the two can be checked against each other.

What the cores do not play (:meth:`CoresBackend.unsupported`): they speak LBT-TCP only, so
LBT-RM and LBT-RU sources, transport loss and NAK/NCF repair (``receiver_loss``,
``store_loss``, ``unrecoverable``) have no counterpart; ``sm_interval`` and ``nak_backoff``
mean nothing on TCP.  ``lbttcp_fallback=True`` plays such scenarios anyway with every source
on LBT-TCP and no loss, and the sidecar lists the substitutions.

Frames: TCP conversations are written like ``sim.write_pcap`` writes them (three-way
handshake on connect, one PSH/ACK segment per delivered chunk with consistent sequence and
acknowledgement numbers, FIN/ACK and RST/ACK), except that a chunk longer than one IPv4
datagram can carry is cut at LBT-TCP message boundaries.  Timestamps are
:data:`~captures.generator.EPOCH_NS` plus the virtual time, in nanoseconds.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from reference_impl import events as ev
from reference_impl.context import ContextCore
from reference_impl.deployment import (
    LBMR_PORT,
    RECEIVER_REQUEST_PORT,
    SOURCE_REQUEST_PORT,
    TRANSPORT_PORT,
    SimDeployment,
)
from reference_impl.fastmsg import data_fields
from reference_impl.resolver import DEFAULT_PORT as RESOLVER_PORT
from reference_impl.sim import CapturedPacket
from reference_impl.source import SendError, SourceConfig, SourceCore, StoreSpec
from reference_impl.store import StoreCore, TopicPolicy, TopicRule
from wire import lbmr
from wire.dissect import classify_udp
from wire.errors import WireError
from wire.lbmc import DATA_BASE, DATA_TYPES, NHDR_DATA, MessageType, TcpSid, parse_message
from wire.lbttcp import LbttcpStream, entry_test
from wire.pcap import (
    ETH,
    IP4,
    TCP,
    TCP_ACK,
    TCP_FIN,
    TCP_PSH,
    TCP_RST,
    TCP_SYN,
    Segment,
    tcp_frame,
    udp_frame,
)
from wire.tshark import PortMap

from .generator import (
    EPOCH_NS,
    L4,
    NS,
    FrameSink,
    Key,
    RunPlan,
    Tally,
    _nest,
    member_offsets,
    message_tally,
    udp_tally,
)
from .scenarios import Restart, Scenario, ScenarioError, Transport

__all__ = ["CaptureTap", "CoresBackend", "EventLedger", "TcpFrames", "host_ip"]

MAX_SEGMENT = 0xFFFF - IP4.size - TCP.size
"""The most TCP payload one IPv4 datagram carries (its total length is 16 bits)."""
ISN_CLIENT, ISN_SERVER = 1000, 5000
"""Initial sequence numbers, as ``sim.write_pcap`` uses them: captures stay byte-identical."""
SETUP_LIMIT = 10.0
"""Virtual seconds the run waits for every source and receiver to register before data."""
RETRY = 0.005
"""Seconds before a topic retries a send its source refused (flight size, not registered)."""
SETTLE_LIMIT = 30.0
"""Virtual seconds the end of a run waits at most for receivers to finish recovering."""
STALL = 60.0
"""Virtual seconds without one successful send after which a ``--packets`` run gives up."""
DRAIN_EVERY = 512
"""Driver steps between two drains of the cores' event queues (bounds their memory)."""
REPOSITORY_THRESHOLD = 1 << 20
"""Bytes a store keeps per source before releasing the oldest: enough to recover a restart of
a few seconds at the preset rates, and a bound on the store's memory in long runs."""
RESOLVER_IP = "10.0.0.1"


def host_ip(role: int, serial: int) -> str:
    """``10.<role>.x.y`` for process ``serial`` of a role (1 sources, 2 receivers, 3 stores,
    4 the misconfigured source); the resolver daemon is 10.0.0.1."""
    if not 0 <= serial < 250 * 254:
        raise ScenarioError(f"too many processes of role {role} for the cores backend")
    return f"10.{role}.{serial // 254}.{serial % 254 + 1}"


SOURCE_INTERVAL_STEP_MS = 125
"""Workaround for a float comparison in the source core (``reference_impl/source.py``
``_check_complete``): it arms its registration-completion deadline at ``started + interval``
and, when that fires, tests ``now - started >= interval``.  When the rounded sum falls short
(for ``interval = 0.3`` that happens for every start time in half of the binades) the same
deadline is re-armed and the simulator spins at one instant.  With an interval that is a
multiple of 1/8 s (125 ms) and a start time on :data:`START_GRID`, ``started + interval`` is
exact and the test holds.  The sources' ``ume_registration_interval`` is rounded to this step
(the sidecar notes it); remove both once the core compares ``now >= started + interval``."""
START_GRID = 1 << 20
"""Source cores start at multiples of 2^-20 s (about 1 us): few enough fraction bits that
adding a registration interval is exact in a double."""


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _source_interval_ms(seconds: float) -> int:
    """A source's registration interval in ms, rounded to :data:`SOURCE_INTERVAL_STEP_MS`."""
    step = SOURCE_INTERVAL_STEP_MS
    return max(step, math.floor(seconds * 1000 / step + 0.5) * step)


# =============================================================================================
# The tap: deliveries -> frames and their expected counts
# =============================================================================================


@dataclass
class _Flow:
    """One direction of one TCP connection as the dissector follows it."""

    stream: LbttcpStream = field(default_factory=lambda: LbttcpStream(decode=False))
    accepted: bool = False


def _at(layout: Any, name: str, base: int) -> tuple[int, int]:
    offset, size = member_offsets(layout)[name]
    return base + offset, size


_IP_LENGTH = _at(IP4, "total_length", ETH.size)
_IP_CHECKSUM = _at(IP4, "checksum", ETH.size)
_TCP_SEQ = _at(TCP, "seq", L4)
_TCP_ACK = _at(TCP, "ack", L4)
_TCP_FLAGS = _at(TCP, "offset_flags", L4)
_TCP_CHECKSUM = _at(TCP, "checksum", L4)


def _folded(checksum: int) -> int:
    """The ones' complement sum (mod 0xFFFF) a stored checksum was made from."""
    return (0xFFFF - checksum) % 0xFFFF


def _checksum(total: int) -> int:
    rest = total % 0xFFFF
    return 0xFFFF - rest if rest else 0


class TcpFrames:
    """``wire.pcap.tcp_frame`` for one direction of one connection, without re-encoding it.

    ``tcp_frame`` packs every header field through Construct and sums the whole segment
    word by word, which is most of a cores run's time.  Here the frame is built once by
    ``tcp_frame`` with zero sequence numbers, flags and payload; each segment then patches the
    fields that vary (offsets read off the ``wire.pcap`` structs) and derives both checksums
    arithmetically, the payload's sum being one big-integer remainder (2^16 = 1 mod 0xFFFF).
    A test proves the bytes equal ``tcp_frame``'s.
    """

    __slots__ = ("head", "ip_sum", "tcp_sum")

    def __init__(self, src: tuple[str, int], dst: tuple[str, int]) -> None:
        head = tcp_frame(src[0], src[1], dst[0], dst[1], 0, 0, 0, b"")
        self.head = head
        at, size = _IP_CHECKSUM
        length_at, length_size = _IP_LENGTH
        length = int.from_bytes(head[length_at : length_at + length_size], "big")
        self.ip_sum = _folded(int.from_bytes(head[at : at + size], "big")) - length
        at, size = _TCP_CHECKSUM
        self.tcp_sum = _folded(int.from_bytes(head[at : at + size], "big"))

    def frame(self, seq: int, ack: int, flags: int, payload: bytes) -> bytes:
        out = bytearray(self.head)
        total_length = len(self.head) - ETH.size + len(payload)
        for (at, size), value in ((_IP_LENGTH, total_length), (_TCP_SEQ, seq), (_TCP_ACK, ack)):
            out[at : at + size] = value.to_bytes(size, "big")
        at, size = _TCP_FLAGS
        out[at : at + size] = (int.from_bytes(out[at : at + size], "big") | flags).to_bytes(
            size, "big")
        at, size = _IP_CHECKSUM
        out[at : at + size] = _checksum(self.ip_sum + total_length).to_bytes(size, "big")
        body = payload + b"\0" if len(payload) % 2 else payload
        total = self.tcp_sum + seq + ack + flags + len(payload) + int.from_bytes(body, "big")
        at, size = _TCP_CHECKSUM
        out[at : at + size] = _checksum(total).to_bytes(size, "big")
        return bytes(out) + payload


class _TcpSeq:
    """Sequence numbers of one connection, both directions, and its frame builders."""

    def __init__(self, client: tuple[str, int], server: tuple[str, int]) -> None:
        self.seq = {client: ISN_CLIENT, server: ISN_SERVER}
        self.builders: dict[tuple[str, int], TcpFrames] = {}

    def frame(self, src: tuple[str, int], dst: tuple[str, int], flags: int,
              payload: bytes = b"") -> bytes:
        seq = self.seq.setdefault(src, ISN_CLIENT)
        ack = self.seq.setdefault(dst, ISN_SERVER) if flags & TCP_ACK else 0
        advance = len(payload) + (1 if flags & (TCP_SYN | TCP_FIN) else 0)
        self.seq[src] = (seq + advance) & 0xFFFFFFFF
        builder = self.builders.get(src)
        if builder is None:
            builder = self.builders[src] = TcpFrames(src, dst)
        return builder.frame(seq, ack, flags, payload)


class CaptureTap:
    """A ``SimNetwork.capture_hook`` that writes each delivery to a :class:`FrameSink`.

    Each frame goes with its tally: what ``ump dissect`` will count in it (see the module
    docstring).  With a counting sink (calibration) no frame is built and nothing decoded.
    """

    def __init__(self, sink: FrameSink, ports: PortMap) -> None:
        self.sink = sink
        self.ports = ports
        self._conns: dict[frozenset[tuple[str, int]], _TcpSeq] = {}
        self._flows: dict[tuple[tuple[str, int], tuple[str, int]], _Flow] = {}
        self._tcp_sid: dict[tuple[tuple[str, int], tuple[str, int]], int] = {}
        self._none: Tally = ((("frames",), 1), (("frames_by_transport", "none"), 1))
        self._data_tallies: dict[tuple[int, bool, str | None], list[tuple[Key, int]]] = {}
        self.malformed = 0

    def __call__(self, packet: CapturedPacket) -> None:
        sink = self.sink
        if sink.full:
            return
        ts = EPOCH_NS + round(packet.time * NS)
        if packet.proto == "udp":
            self._udp(ts, packet)
        else:
            self._tcp(ts, packet)

    # -- UDP (topic resolution) ----------------------------------------------------------------

    def _udp(self, ts: int, p: CapturedPacket) -> None:
        if self.sink.count_only:
            self.sink.emit_frame(ts, b"", ())
            return
        (src, sport), (dst, dport) = p.src, p.dst
        frame = udp_frame(src, sport, dst, dport, p.data)
        seg = Segment("udp", src, dst, sport, dport, p.data)
        proto = classify_udp(seg, self.ports)
        tally: Tally = self._none
        if proto == "lbmr":
            try:
                tally = udp_tally("lbmr", lbmr.parse_packet(p.data))
            except WireError:
                self.malformed += 1
        elif proto is not None:  # the cores send nothing else; never count it silently
            self.malformed += 1
        self.sink.emit_frame(ts, frame, tally)

    # -- TCP -------------------------------------------------------------------------------------

    def _tcp(self, ts: int, p: CapturedPacket) -> None:
        pair = frozenset((p.src, p.dst))
        emit = self.sink.emit_frame
        if p.kind == "syn":
            conv = self._conns[pair] = _TcpSeq(p.src, p.dst)
            self._flows.pop((p.src, p.dst), None)
            self._flows.pop((p.dst, p.src), None)
            self._tcp_sid.pop((p.src, p.dst), None)
            self._tcp_sid.pop((p.dst, p.src), None)
            if self.sink.count_only:
                for _ in range(3):
                    emit(ts, b"", ())
                return
            emit(ts, conv.frame(p.src, p.dst, TCP_SYN), self._none)
            emit(ts, conv.frame(p.dst, p.src, TCP_SYN | TCP_ACK), self._none)
            emit(ts, conv.frame(p.src, p.dst, TCP_ACK), self._none)
            return
        conv = self._conns.get(pair) or self._conns.setdefault(pair, _TcpSeq(p.src, p.dst))
        if p.kind in ("fin", "rst"):
            flags = TCP_ACK | (TCP_FIN if p.kind == "fin" else TCP_RST)
            if p.kind == "rst":
                self._forget(pair, p.src, p.dst)
            emit(ts, b"" if self.sink.count_only else conv.frame(p.src, p.dst, flags),
                 self._none)
            return
        if self.sink.count_only:
            for _ in range(max(1, math.ceil(len(p.data) / MAX_SEGMENT))):
                emit(ts, b"", ())
            return
        for payload, tally in self._segments(p.src, p.dst, p.data):
            emit(ts, conv.frame(p.src, p.dst, TCP_PSH | TCP_ACK, payload), tally)

    def _forget(self, pair: frozenset[tuple[str, int]], a: tuple[str, int],
                b: tuple[str, int]) -> None:
        """A reset connection is over: its state goes (bounded memory over many restarts)."""
        self._conns.pop(pair, None)
        for key in ((a, b), (b, a)):
            self._flows.pop(key, None)
            self._tcp_sid.pop(key, None)

    def _is_transport(self, src: tuple[str, int], dst: tuple[str, int]) -> bool:
        low, high = self.ports.lbttcp_source
        return low <= src[1] <= high or low <= dst[1] <= high

    def _segments(self, src: tuple[str, int], dst: tuple[str, int], chunk: bytes
                  ) -> Iterable[tuple[bytes, Tally]]:
        """The chunk as TCP payloads no longer than :data:`MAX_SEGMENT` (cut at message
        boundaries where it can be), each with what the dissector counts in it."""
        flow = self._flows.get((src, dst))
        if flow is None:
            flow = self._flows[(src, dst)] = _Flow()
        if not flow.accepted and flow.stream.pending == 0:
            if entry_test(chunk) is not None:  # the dissector would not call it UM either
                for at in range(0, len(chunk), MAX_SEGMENT):
                    yield chunk[at : at + MAX_SEGMENT], self._none
                return
            flow.accepted = True
        start = flow.stream.offset
        try:
            items = flow.stream.feed(chunk)
        except WireError:
            self.malformed += 1
            self._flows[(src, dst)] = _Flow()
            for at in range(0, len(chunk), MAX_SEGMENT):
                yield chunk[at : at + MAX_SEGMENT], self._none
            return
        transport = self._is_transport(src, dst)
        ends = [(item.offset + len(item.raw) - start, item) for item in items]
        pos = 0
        index = 0
        while pos < len(chunk):
            limit = pos + MAX_SEGMENT
            cut = min(len(chunk), limit)
            if len(chunk) > limit:  # cut after the last message that ends in the window
                fitting = [end for end, _ in ends if pos < end <= limit]
                if fitting:
                    cut = fitting[-1]
            tally: list[tuple[Key, int]] = []
            while index < len(ends) and ends[index][0] <= cut:
                tally += self._message_tally(src, dst, ends[index][1].raw, transport)
                index += 1
            if tally:
                tally = [(("frames",), 1), (("frames_by_transport", "lbttcp"), 1), *tally]
                yield chunk[pos:cut], tuple(tally)
            else:
                yield chunk[pos:cut], self._none
            pos = cut

    def _message_tally(self, src: tuple[str, int], dst: tuple[str, int], raw: bytes,
                       transport: bool) -> list[tuple[Key, int]]:
        """What one framed message counts for.  Data messages without extended headers (the
        hot path: live data and retransmissions) count the same whatever their sequence number
        and payload, so their tally is computed once per kind and reused."""
        mtype, first, tidx, _ = data_fields(raw) if len(raw) >= DATA_BASE.size else (-1, -1, 0, 0)
        plain_data = first == NHDR_DATA and mtype in DATA_TYPES
        sid = self._tcp_sid.get((src, dst))
        data_key = None
        if sid is not None and mtype == MessageType.MESSAGE:
            data_key = f"lbttcp:{src[0]}:{src[1]}:{sid:08x}:{tidx}"
        key = (mtype, transport, data_key)
        if plain_data:
            cached = self._data_tallies.get(key)
            if cached is not None:
                return cached
        try:
            message, _ = parse_message(raw)
        except WireError:
            self.malformed += 1
            return []
        for header in message.headers:
            if isinstance(header, TcpSid):
                self._tcp_sid[(dst, src)] = header.sid
        tally = message_tally(message, transport, data_key)
        if plain_data:
            self._data_tallies[key] = tally
        return tally


# =============================================================================================
# What the cores reported
# =============================================================================================


@dataclass(frozen=True)
class _Process:
    """One simulated process: its node name, role and place in the scenario."""

    name: str
    role: str  # "store" | "source" | "receiver" | "rogue"
    index: int  # store index, topic index, or receiver context index
    topic: int = -1  # receivers: the topic index


class EventLedger:
    """Counts the cores' events as they are drained, and remembers the RegIDs granted.

    Keys (nested in the sidecar's ``events``): ``store.registered.<role>.{new,old}``,
    ``store.rejected.<role>.error-N``, ``store.state-deleted.<role>``;
    ``source.registration.{success,old,complete,error-N}``, ``source.stable``,
    ``source.unresponsive``, ``source.not-stable``, ``source.reclaimed``,
    ``source.forced-reclaim``, ``source.flight.{over,under}``, ``source.confirmations``;
    ``receiver.registration.{success,old,complete,error-N}``, ``receiver.delivered``,
    ``receiver.recovered`` (delivered from recovery), ``receiver.unrecoverable`` (sequence
    numbers); ``input-dropped``, ``log.<LEVEL>``.  The misconfigured source counts as a source.
    """

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, ...]] = Counter()
        self.source_regids: dict[tuple[int, int], int] = {}  # (topic, store) -> RegID
        self.receiver_regids: dict[tuple[int, int, int], int] = {}  # (rcv, topic, store)
        self.delivered: Counter[tuple[int, int]] = Counter()  # (rcv, topic) -> messages

    def take(self, process: _Process, events: Iterable[ev.Event]) -> None:
        c = self.counts
        for e in events:
            if isinstance(e, ev.LogRecord):
                c["log", e.level.value] += 1
            elif isinstance(e, ev.InputDropped):
                c["input-dropped",] += 1
            elif isinstance(e, ev.ClientRegistered):
                c["store", "registered", e.role, "old" if e.old else "new"] += 1
            elif isinstance(e, ev.ClientRejected):
                c["store", "rejected", e.role, f"error-{e.code}"] += 1
            elif isinstance(e, ev.ClientStateDeleted):
                c["store", "state-deleted", e.role] += 1
            elif isinstance(e, ev.SourceRegistrationSuccess):
                c["source", "registration", "success"] += 1
                if e.old:
                    c["source", "registration", "old"] += 1
                if process.role == "source":
                    self.source_regids[(process.index, e.store.index)] = e.reg_id
            elif isinstance(e, ev.SourceRegistrationError):
                c["source", "registration", f"error-{e.code}"] += 1
            elif isinstance(e, ev.SourceRegistrationComplete):
                c["source", "registration", "complete"] += 1
            elif isinstance(e, ev.MessageStable):
                c["source", "stable"] += 1
            elif isinstance(e, ev.StoreUnresponsive):
                c["source", "unresponsive"] += 1
            elif isinstance(e, ev.MessageNotStable):
                c["source", "not-stable"] += 1
            elif isinstance(e, ev.MessageReclaimed):
                c["source", "forced-reclaim" if e.forced else "reclaimed"] += 1
            elif isinstance(e, ev.FlightSizeNotification):
                c["source", "flight", e.state.value] += 1
            elif isinstance(e, ev.DeliveryConfirmation):
                c["source", "confirmations"] += 1
            elif isinstance(e, ev.ReceiverRegistrationSuccess):
                c["receiver", "registration", "success"] += 1
                if e.old:
                    c["receiver", "registration", "old"] += 1
                self.receiver_regids[(process.index, process.topic, e.store.index)] = e.reg_id
            elif isinstance(e, ev.ReceiverRegistrationError):
                c["receiver", "registration", f"error-{e.code}"] += 1
            elif isinstance(e, ev.ReceiverRegistrationComplete):
                c["receiver", "registration", "complete"] += 1
            elif isinstance(e, ev.MessageDelivered):
                c["receiver", "delivered"] += 1
                self.delivered[(process.index, process.topic)] += 1
                if e.retransmission:
                    c["receiver", "recovered"] += 1
            elif isinstance(e, ev.UnrecoverableLoss):
                c["receiver", "unrecoverable"] += e.last - e.first + 1
            elif isinstance(e, ev.RegistrationChange):
                c["receiver", "registration-change"] += 1


# =============================================================================================
# The backend
# =============================================================================================


@dataclass
class _Topic:
    index: int
    name: str
    source: int  # source context index
    tidx: int  # index within its source context
    process: str
    payload: bytes
    interval: float
    quota: int | None
    sent: int = 0
    next_at: float = 0.0


class CoresBackend:
    """Plays a scenario with the reference cores (see the module docstring).

    Args:
        lbttcp_fallback: play what the cores cannot (LBT-RM/LBT-RU sources, transport loss)
            as LBT-TCP without loss instead of refusing the scenario; the sidecar lists every
            substitution under ``substitutions``.
    """

    name = "cores"

    def __init__(self, *, lbttcp_fallback: bool = False) -> None:
        self.lbttcp_fallback = lbttcp_fallback

    @staticmethod
    def unsupported(scenario: Scenario) -> list[str]:
        """What of ``scenario`` the cores cannot play, one phrase per feature (empty: all)."""
        out = []
        other = sorted({str(scenario.transport_of(i)) for i in range(scenario.sources)}
                       - {str(Transport.LBTTCP)})
        if other:
            out.append(f"{'/'.join(other)} transports (the cores speak LBT-TCP only)")
        for name in ("receiver_loss", "store_loss"):
            if getattr(scenario, name):
                out.append(f"{name} (LBT-TCP never loses; no NAK/NCF repair in the cores)")
        if scenario.unrecoverable:
            out.append("unrecoverable (shed NAKs need LBT-RM/LBT-RU)")
        return out

    def run(self, plan: RunPlan, sink: FrameSink) -> dict[str, Any]:
        substitutions = self.unsupported(plan.scenario)
        if substitutions and not self.lbttcp_fallback:
            raise ScenarioError(
                f"scenario {plan.scenario.name!r}: the cores backend cannot play "
                f"{'; '.join(substitutions)}; use the wire backend, or the LBT-TCP fallback "
                "(--lbttcp-fallback) to play it over LBT-TCP without loss")
        scenario = plan.scenario
        if substitutions:
            scenario = dataclasses.replace(
                scenario, transports=(Transport.LBTTCP,), receiver_loss=0.0, store_loss=0.0,
                unrecoverable=0.0)
        described = _CoresRun(dataclasses.replace(plan, scenario=scenario), sink).run()
        described["substitutions"] = substitutions
        return described


class _CoresRun:
    """One run: the deployment, the tap, the ledger and the driver's own schedule."""

    def __init__(self, plan: RunPlan, sink: FrameSink) -> None:
        self.plan = plan
        self.sc = sc = plan.scenario
        self.sink = sink
        self.ports = PortMap(store_ports=[sc.store_port])
        # the tap streams every delivery: the network keeps none of them
        self.dep = SimDeployment(seed=plan.seed, keep_trace=False)
        if self.dep.resolver_addr != (RESOLVER_IP, RESOLVER_PORT):
            raise AssertionError("the deployment moved its resolver; update RESOLVER_IP")
        self.tap = CaptureTap(sink, self.ports)
        self.dep.net.capture_hooks.append(self.tap)
        self.ledger = EventLedger()
        self.processes: dict[str, _Process] = {}
        self.down: set[str] = set()
        self.incarnations: Counter[str] = Counter()
        self.rogue: SourceCore | None = None
        self.rogue_attempts = 0
        self._actions: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._steps = 0
        self.messages_sent = 0
        self.last_send = 0.0
        self.restarts_until = 0.0
        self.notes: list[str] = []
        self.topics: list[_Topic] = []
        self.data_start = 0.0
        self.data_span = 0.0

    # -- building the deployment ----------------------------------------------------------------

    def _place(self, name: str, ip: str, process: _Process) -> None:
        """Give the process its own node at ``ip`` before ``SimDeployment.add_*`` binds it
        (the deployment would number hosts 10.0.0.N, which caps a run at 253 processes)."""
        self.dep.net.add_node(name, ip)
        self.dep.ips[name] = ip
        self.processes[name] = process

    def _store_policy(self) -> TopicPolicy:
        sc = self.sc
        activity = _ms(sc.activity_timeout)
        return TopicPolicy(
            repository_size_threshold=REPOSITORY_THRESHOLD,
            source_activity_timeout=activity,
            source_check_interval=max(1, min(750, activity // 2)),
            keepalive_interval=_ms(sc.keepalive_interval))

    def _build(self) -> None:
        sc, dep = self.sc, self.dep
        policy = self._store_policy()
        self.store_names: list[str] = []
        self.store_groups: list[int] = []
        for group, size in enumerate(sc.store_groups):
            for _ in range(size):
                k = len(self.store_names)
                name = f"store-{k}"
                self._place(name, host_ip(3, k), _Process(name, "store", k))
                dep.add_store(name, port=sc.store_port,
                              topics=(TopicRule(".*", policy, kind="PCRE"),),
                              seed=plan_seed(self.plan.seed, "store", k))
                self.store_names.append(name)
                self.store_groups.append(group)
        self.specs = tuple(StoreSpec(dep.stores[n].addr[0], dep.stores[n].addr[1], group=g)
                           for n, g in zip(self.store_names, self.store_groups, strict=True))
        count = sc.topics
        per_topic_interval = 1.0 / sc.rate
        for i in range(sc.sources):
            for k in range(sc.topics_per_source):
                t = len(self.topics)
                name = f"ump.{sc.transport_of(i)}.src{i}.topic{k}"
                pattern = (name.encode() + b"|") * (sc.payload_size // (len(name) + 1) + 1)
                quota = None
                if self.plan.messages is not None:
                    quota = self.plan.messages // count + (
                        1 if t < self.plan.messages % count else 0)
                process = f"source-{i}.{k}"
                self.topics.append(_Topic(t, name, i, k, process, pattern[: sc.payload_size],
                                           per_topic_interval, quota))
                self._place(process, host_ip(1, t), _Process(process, "source", t))
                dep.add_source(process, name, **self._source_options(t))
        for j in range(sc.receivers):
            for topic in self.topics:
                name = f"receiver-{j}.{topic.index}"
                self._place(name, host_ip(2, j * count + topic.index),
                            _Process(name, "receiver", j, topic.index))
                dep.add_receiver(name, topic.name, **self._receiver_options(j, topic.index))

    def _source_options(self, topic: int) -> dict[str, Any]:
        sc = self.sc
        return dict(
            ume_store=self.specs,
            ume_store_group=tuple(enumerate(sc.store_groups)),
            ume_session_id=(0x5E55_0000 + topic + 1) if sc.session_ids else 0,
            ume_registration_interval=_source_interval_ms(sc.registration_interval),
            ume_sri_inter_sri_interval=_ms(sc.sri_interval),
            ume_sri_max_number_of_sri_per_update=sc.sri_count,
            ume_retention_intragroup_stability_behavior=sc.stability,
            ume_message_stability_timeout=_ms(sc.stability_timeout),
            ume_proactive_keepalive_interval=_ms(sc.keepalive_interval),
            resolver_advertisement_interval=_ms(sc.resolver_interval))

    def _receiver_options(self, receiver: int, topic: int) -> dict[str, Any]:
        sc = self.sc
        batch = sc.ack_batch_interval
        return dict(
            ume_session_id=(0x7EC0_0000 + receiver * sc.topics + topic + 1)
            if sc.session_ids else 0,
            ume_registration_interval=_ms(sc.registration_interval),
            ume_sri_request_interval=_ms(sc.registration_interval),
            ume_use_ack_batching=1 if batch > 0 else 0,
            ume_ack_batching_interval=_ms(batch) if batch > 0 else 100,
            ume_proactive_keepalive_interval=_ms(sc.keepalive_interval))

    # -- the driver ------------------------------------------------------------------------------

    def at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._actions, (t, next(self._order), action))

    def cores(self) -> Iterable[tuple[str, ContextCore]]:
        dep = self.dep
        for registry in (dep.stores, dep.sources, dep.receivers):
            yield from registry.items()

    def drain(self, name: str | None = None) -> None:
        """Move queued core events into the ledger (all cores, or one before it is replaced)."""
        if name is not None:
            core = self._core(name)
            if core is not None:
                self.ledger.take(self.processes[name], core.events())
            return
        for cname, core in self.cores():
            self.ledger.take(self.processes[cname], core.events())
        if self.rogue is not None:
            self.ledger.take(self.processes["rogue-source"], self.rogue.events())

    def _core(self, name: str) -> ContextCore | None:
        dep = self.dep
        if name == "rogue-source":
            return self.rogue
        return dep.stores.get(name) or dep.sources.get(name) or dep.receivers.get(name)

    def advance(self, t: float) -> None:
        self.dep.net.run_until(t)
        self._steps += 1
        if self._steps % DRAIN_EVERY == 0:
            self.drain()

    def _ready(self) -> bool:
        return all(s.complete for s in self.dep.sources.values()) and \
            all(r.complete for r in self.dep.receivers.values())

    def run(self) -> dict[str, Any]:
        sc = self.sc
        interval = _source_interval_ms(sc.registration_interval)
        if interval != _ms(sc.registration_interval):
            self.notes.append(f"sources register every {interval} ms, not "
                              f"{_ms(sc.registration_interval)} ms (a multiple of "
                              f"{SOURCE_INTERVAL_STEP_MS} ms works around a source core bug)")
        self._build()
        end_setup = SETUP_LIMIT
        while not self._ready() and self.dep.now < end_setup and not self.sink.full:
            self.advance(self.dep.now + 0.01)
        if not self._ready():
            self.notes.append(f"not every source and receiver registered within "
                              f"{SETUP_LIMIT:g} s; data started anyway")
        self.data_start = self.dep.now
        per_topic = math.ceil(self.plan.planned_messages / max(1, len(self.topics)))
        self.data_span = max(per_topic / sc.rate, 1e-3)
        self.last_send = self.data_start
        for topic in self.topics:
            topic.next_at = self.data_start + topic.interval * topic.index / len(self.topics)
            self.at(topic.next_at, functools.partial(self._send, topic))
        for restarts, role in ((sc.receiver_restarts, "receiver"), (sc.source_restarts, "source"),
                               (sc.store_restarts, "store")):
            for restart in restarts:
                self._plan_restart(restart, role)
        if sc.regid_collision:
            self.at(self._source_start_time(self.data_start + self.data_span / 3),
                    self._rogue_attempt)
        deadline = self.data_start + 4 * self.data_span + 60.0
        while self._actions and not self.sink.full:
            t, _, action = heapq.heappop(self._actions)
            if self.plan.messages is not None and t > deadline:
                self.notes.append("deadline reached before every message was sent")
                break
            if self.plan.messages is None and t - self.last_send > STALL:
                self.notes.append(f"no message could be sent for {STALL:g} s; run stopped")
                break
            self.advance(t)
            action()
        if not self.sink.full:
            self._finish()
        self.drain()
        return self.describe()

    def _send(self, topic: _Topic) -> None:
        now = self.dep.now
        source = self.dep.sources[topic.process]
        if topic.process not in self.down and source.can_send():
            try:
                source.send(topic.payload)
            except SendError:
                self.at(now + RETRY, lambda: self._send(topic))
                return
            topic.sent += 1
            self.messages_sent += 1
            self.last_send = now
            if topic.quota is not None and topic.sent >= topic.quota:
                return
            topic.next_at = max(topic.next_at + topic.interval, now)
            self.at(topic.next_at, lambda: self._send(topic))
        else:
            self.at(now + RETRY, lambda: self._send(topic))

    def _finish(self) -> None:
        """Let the deployment settle (acks, recovery, restarts) and close it in order:
        receivers, then sources, then stores, so the capture ends with FINs, not silence."""
        sc = self.sc
        settle = max(0.5, 3 * sc.ack_batch_interval, 2 * sc.stability_timeout,
                     2 * sc.keepalive_interval)
        until = max(self.dep.now + settle, self.restarts_until)
        give_up = until + SETTLE_LIMIT
        while not self.sink.full and (self.dep.now < until or not self._caught_up()):
            if self.dep.now >= give_up:
                self.notes.append(f"receivers still recovering {SETTLE_LIMIT:g} s after the "
                                  "data phase; closed anyway")
                break
            self.advance(self.dep.now + 0.05)
        self.drain()
        for registry in (self.dep.receivers, self.dep.sources, self.dep.stores):
            for name, core in registry.items():
                if name not in self.down:
                    core.close()
            self.advance(self.dep.now + 0.01)
        self.advance(self.dep.now + 0.05)

    def _caught_up(self) -> bool:
        """Every running receiver has delivered (or given up on) all its source sent."""
        dep = self.dep
        for name, receiver in dep.receivers.items():
            process = self.processes[name]
            source = dep.sources[self.topics[process.topic].process]
            if name in self.down or source.next_sqn == 0:
                continue
            if not receiver.complete or receiver.next_sqn is None \
                    or receiver.next_sqn < source.next_sqn:
                return False
        return True

    # -- restarts and the misconfigured source ---------------------------------------------------

    def _processes_of(self, role: str, index: int) -> list[str]:
        """Restart targets: a receiver context or a source context is one process per topic."""
        return [p.name for p in self.processes.values() if p.role == role and (
            (role == "receiver" and p.index == index)
            or (role == "source" and self.topics[p.index].source == index)
            or (role == "store" and p.index == index))]

    def _source_start_time(self, t: float) -> float:
        """``t`` rounded up to the :data:`START_GRID`: a time at which a new source core can
        start without livelocking (see :data:`SOURCE_INTERVAL_STEP_MS`)."""
        return math.ceil(t * START_GRID) / START_GRID

    def _plan_restart(self, restart: Restart, role: str) -> None:
        t = self.data_start + restart.at * self.data_span
        names = self._processes_of(role, restart.index)
        self.at(t, lambda: self._kill(names))
        up = t + restart.downtime
        if role == "source":
            up = self._source_start_time(up)
        self.at(up, lambda: self._restart(names))
        self.restarts_until = max(self.restarts_until, t + restart.downtime + 1.0)

    def _kill(self, names: list[str]) -> None:
        for name in names:
            self.drain(name)
            self.dep.kill(name)
            self.down.add(name)

    def _restart(self, names: list[str]) -> None:
        for name in names:
            self.drain(name)
            changes: dict[str, Any] = {}
            process = self.processes[name]
            if not self.sc.session_ids and process.role == "source":
                changes["ume_store"] = tuple(
                    dataclasses.replace(spec, reg_id=self.ledger.source_regids.get(
                        (process.index, k), 0)) for k, spec in enumerate(self.specs))
            elif not self.sc.session_ids and process.role == "receiver":
                granted = {self.ledger.receiver_regids.get((process.index, process.topic, k))
                           for k in range(len(self.specs))}
                if len(granted) == 1 and None not in granted:
                    changes["reg_id"] = granted.pop()
            if process.role == "store":
                self._restart_store(name)
            else:
                self.dep.restart(name, **changes)
            self.down.discard(name)

    def _restart_store(self, name: str) -> None:
        """Bring a store back with fresh memory and a fresh RegID draw.

        ``SimDeployment.restart`` would rebuild it with the same seed, so the new store would
        hand out the very RegIDs its first life gave to clients that still hold them (a
        source refused with "RegID in use by a receiver"); a real store draws anew."""
        dep, net = self.dep, self.dep.net
        old = dep.stores[name]
        net.kill(name)
        old.close()
        self.incarnations[name] += 1
        settings = dataclasses.replace(old.settings, seed=plan_seed(
            self.plan.seed, f"store-restart-{self.incarnations[name]}",
            self.processes[name].index))
        core = StoreCore(settings, now=net.now)
        net.restart(name, {settings.port: core, LBMR_PORT: core})
        dep.stores[name] = core

    def _collision_target(self) -> tuple[_Topic, int]:
        """The topic and store whose RegID the misconfigured source copies: the first topic of
        a source context that never restarts, at the first store that never restarts.

        A store marks a source inactive as soon as its connection drops, and an inactive RegID
        may be taken over (it is granted as OLD); a collision with a restarting victim would
        be a takeover, not the refusal the scenario asks for."""
        sc = self.sc
        restarting = {r.index for r in sc.source_restarts}
        victim = next((t for t in self.topics if t.source not in restarting), self.topics[0])
        stores = {r.index for r in sc.store_restarts}
        store = next((k for k in range(len(self.specs)) if k not in stores), 0)
        return victim, store

    def _rogue_attempt(self) -> None:
        """One registration of the misconfigured source: the victim topic (see
        :meth:`_collision_target`) with the RegID it holds at that store.  It has no resolver,
        so no receiver ever resolves it."""
        sc = self.sc
        victim, store = self._collision_target()
        reg_id = self.ledger.source_regids.get((victim.index, store))
        if reg_id is None:
            self.drain()
            reg_id = self.ledger.source_regids.get((victim.index, store))
        if reg_id is None:
            self.notes.append(f"RegID collision skipped: {victim.process} had no RegID at "
                              f"store-{store}")
            return
        name = "rogue-source"
        net = self.dep.net
        ip = host_ip(4, 0)
        if self.rogue is None:
            net.add_node(name, ip)
            self.dep.ips[name] = ip
            self.processes[name] = _Process(name, "rogue", 0)
        else:
            self.ledger.take(self.processes[name], self.rogue.events())
        config = SourceConfig(ume_store=(dataclasses.replace(self.specs[store], reg_id=reg_id),),
                              ume_registration_interval=_source_interval_ms(
                                  sc.registration_interval))
        core = SourceCore(victim.name, config, ip=ip, transport_port=TRANSPORT_PORT,
                          request_port=SOURCE_REQUEST_PORT, lbmr_port=LBMR_PORT, resolver=None,
                          now=net.now)
        ports = (LBMR_PORT, TRANSPORT_PORT, SOURCE_REQUEST_PORT)
        if self.rogue is None:
            for port in ports:
                net.bind(name, port, core)
        else:
            self.rogue.close()
            net.kill(name)
            net.restart(name, dict.fromkeys(ports, core))
        self.rogue = core
        self.rogue_attempts += 1
        if self.rogue_attempts < sc.collision_attempts:
            self.at(self._source_start_time(net.now + sc.registration_interval),
                    self._rogue_attempt)
        else:
            self.at(net.now + sc.registration_interval, self._rogue_leaves)

    def _rogue_leaves(self) -> None:
        if self.rogue is not None:
            self.ledger.take(self.processes["rogue-source"], self.rogue.events())
            self.rogue.close()

    # -- the sidecar -----------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        sc, dep = self.sc, self.dep
        hosts = {RESOLVER_IP: "lbmrd", **{ip: name for name, ip in dep.ips.items()}}
        stores = self.store_names
        topics = [{
            "name": t.name, "source": f"source-{t.source}", "process": t.process,
            "transport": str(Transport.LBTTCP), "tidx": dep.sources[t.process].topic_idx,
            "messages": t.sent,
            "transport_addr": ":".join(map(str, dep.sources[t.process].transport_addr)),
            "regids": {stores[k]: self.ledger.source_regids.get((t.index, k))
                       for k in range(len(stores))}} for t in self.topics]
        receivers = [{
            "name": f"receiver-{j}",
            "delivered": {t.name: self.ledger.delivered[(j, t.index)] for t in self.topics},
            "regids": {t.name: {stores[k]: self.ledger.receiver_regids.get((j, t.index, k))
                                for k in range(len(stores))} for t in self.topics}}
            for j in range(sc.receivers)]
        events = _nest(self.ledger.counts)
        events["messages_sent"] = self.messages_sent
        events["malformed_frames"] = self.tap.malformed
        return {
            "hosts": hosts, "topics": topics, "receivers": receivers,
            "messages_sent": self.messages_sent, "sessions": [], "events": events,
            "notes": self.notes, "virtual_seconds": round(dep.now, 6),
            "network": dict(dep.net.stats),
            "ports": {
                "store": sc.store_port, "resolver": f"{RESOLVER_IP}:{RESOLVER_PORT}",
                "resolver_clients": [LBMR_PORT],
                "request": [SOURCE_REQUEST_PORT, RECEIVER_REQUEST_PORT],
                "lbttcp": {"source": TRANSPORT_PORT}},
        }


def plan_seed(seed: int, purpose: str, index: int) -> int:
    """A per-process seed (store RegID draws) that only depends on the run seed."""
    return (seed * 1_000_003 + sum(purpose.encode()) * 1009 + index) & 0x7FFFFFFF

