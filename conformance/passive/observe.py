"""The observed model of a capture: what the persistence exchange in it says, per entity.

:func:`observe` decodes a capture with the project's own dissector (:func:`wire.dissect.
dissect_file`, which asks :mod:`wire.detect` which frames are UM, with the port map of ``ump
dissect``) and folds the UM messages into :class:`Observed`:

* **stores**: the TCP addresses that PREGs are sent to;
* **registrations** (:class:`Registration`): every PREG with the PREG-RESP that answered it
  (matched on the same TCP connection, reversed, by registration kind and indexes; a response
  the capture lacks leaves ``response`` empty);
* **sources and receivers** (:class:`Client`): the registrations of one client, which is one
  topic plus its Session ID when it sends one; else, for a source (one RegID per store), the
  request address its PREGs ask the answers to go to, and for a receiver the RegID it asked
  for or was granted and its host (a client restarted with its Session ID, or its RegID on its
  host, is the same client: "How Stores Associate Session IDs and RegIDs", docs/semantics.md
  §1.1 step 4);
* **data** (:class:`Data`): every data message with its transport address, topic index,
  sequence number and kind (data, proactive retransmission, retransmission; docs/wire-lbmc.md §1.2);
* **transports of sources**: which transport address carries the source that holds RegID R at
  store S, learnt from the SRIs the source sends on its transport (each names a store's
  address and the source's RegID there, docs/semantics.md §1.3);
* **ACKs** (:class:`Ack`): stability ACKs (store to source, type 1) and consumption ACKs
  (receiver to store, type 0), with the NAK bit (docs/wire-lbmc.md §2.1);
* **retransmission requests** (:class:`Rxreq`) and the store's retransmissions;
* **SRIs** (:class:`Sri`): each with its overall version and its store entries (address,
  the source's RegID there, the store's own version), docs/semantics.md §1.3;
* **keepalives** (:class:`Keepalive`) and, per direction of every connection carrying LBMC,
  the frames sent on it (:attr:`Observed.heard`: what tells a peer the other side is alive,
  docs/semantics.md §1.11, §1.12).

Every item keeps its frame number and time, which the judges cite as evidence.  What the
capture could not show is recorded too (:attr:`Observed.problems`: a damaged end, frames
marked malformed), so a judge can answer ``unsupported`` instead of guessing.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wire.dissect import FrameReport, dissect_file
from wire.errors import WireError
from wire.lbmc import ACK_NAK, DATA_BASE
from wire.tshark import PortMap

if TYPE_CHECKING:
    from reference_impl.config.client import ReceiverOptions, SourceOptions
    from reference_impl.config.store_xml import StoreConfig, StoreDaemonConfig

Addr = tuple[str, int]

DATA_KINDS = {0: "data", 2: "prorx", 10: "retrans"}
"""LBMC data types that carry a message and a sequence number (docs/wire-lbmc.md §1.2)."""


def show(addr: Addr | None) -> str:
    return "?" if addr is None else f"{addr[0]}:{addr[1]}"


@dataclass
class PregResp:
    """A store's answer to a registration (docs/semantics.md §1.1 step 4).

    Attributes:
        frame / time: where it was captured.
        reg_id: the RegID granted (or echoed in a refusal).
        old: the O flag: the store already had state for this client.
        error: the E flag: a refusal; ``code`` is then its error code (docs/wire-lbmc.md §2.1).
        low_sqn / high_sqn: the receiver's start / the highest sequence number held.
        deregister: the D flag (an answer to a deregistration).
    """

    frame: int
    time: float
    reg_id: int
    old: bool
    error: bool
    code: int
    low_sqn: int
    high_sqn: int
    deregister: bool


@dataclass
class Registration:
    """One PREG and the PREG-RESP that answered it, if the capture holds it.

    Attributes:
        frame / time: the PREG's.
        conn: (client address, store address) of the TCP connection it came on.
        store: the store's address (the connection's server side).
        source: the PREG's S bit (a source registration; else a receiver's).
        reg_id: the RegID asked for (0: let the store choose).
        src_reg_id: a receiver's: the source's RegID at this store.
        transport_idx / topic_idx: the source's indexes.
        topic: the topic name, when the PREG carries it.
        session_id: the Session ID, when the PREG carries one (0: none).
        resp_addr: where the PREG asks the answer to go (the client's request port).
        deregister: the D flag.
        response: the answer, or None.
        activity_timeout: the client's own activity timeout in ms (its ``ume_client_lifetime``
            header; 0 without one): it replaces the store's (docs/semantics.md §1.11).
        rpp: the PREG's RPP flag (``w_flag``): an RPP source, or an RPP receiver
            (docs/semantics.md §2.1).
        extopt: the PREG message carries extended options (EXTOPT): an RPP source's
            overrides travel there (docs/wire-lbmc.md §2.3); without any it asked for none.
    """

    frame: int
    time: float
    conn: tuple[Addr, Addr]
    store: Addr
    source: bool
    reg_id: int
    src_reg_id: int
    transport_idx: int
    topic_idx: int
    topic: str | None
    session_id: int
    resp_addr: Addr
    deregister: bool
    response: PregResp | None = None
    activity_timeout: int = 0
    rpp: bool = False
    extopt: bool = False

    @property
    def granted(self) -> bool:
        return self.response is not None and not self.response.error

    @property
    def frames(self) -> list[int]:
        return [self.frame] + ([self.response.frame] if self.response else [])


@dataclass
class Data:
    """A data message on a transport (or a store's retransmission over TCP).

    Attributes:
        frame / time: where it was captured.
        src / dst: the frame's addresses (``src`` is the transport address for live data).
        tidx: the LBMC topic index.
        sqn: the sequence number.
        kind: ``data``, ``prorx`` (proactive retransmission) or ``retrans``.
        via: the transport that carried it (``lbttcp``, ``lbtru``, ``lbtrm``; "" unknown).
        size: its payload bytes (after the headers: what RPP sizes count).
    """

    frame: int
    time: float
    src: Addr
    dst: Addr
    tidx: int
    sqn: int
    kind: str
    via: str = ""
    size: int = 0


@dataclass
class Ack:
    """A UME ACK: ``stability`` (a store to a source) or ``consumption`` (a receiver to a store).

    Attributes:
        frame / time: where it was captured.
        src / dst: the frame's addresses.
        sqn: the sequence number acknowledged.
        rcv_reg_id: the receiver's RegID (consumption ACKs).
        id_2: a topic index from a store, a RegID from a receiver (docs/wire-lbmc.md §2.1).
        nak: the NAK bit on a stability ACK (docs/semantics.md §1.8).
    """

    frame: int
    time: float
    src: Addr
    dst: Addr
    kind: str
    sqn: int
    rcv_reg_id: int
    id_2: int
    nak: bool


@dataclass
class Rxreq:
    """A retransmission request from a receiver to a store (docs/semantics.md §1.9 step 4).

    Attributes:
        frame / time: where it was captured.
        src / dst: the receiver's and the store's addresses.
        reg_id: the RegID it names (``id_2``).
        sqn: the sequence number asked for.
    """

    frame: int
    time: float
    src: Addr
    dst: Addr
    reg_id: int
    sqn: int


@dataclass
class StoreEntry:
    """One store an SRI names (a ``ume_store_ext`` header, docs/wire-lbmc.md §2.1)."""

    store: Addr
    reg_id: int
    version: int
    store_idx: int
    grp_idx: int


@dataclass
class Sri:
    """A Source Registration Information message on a source's transport (docs/semantics.md
    §1.3).

    Attributes:
        frame / time: where it was captured.
        src: the transport address that sent it.
        tidx: the topic index it is for (its ``topic_idx`` header; 0 without one).
        version: the overall version.
        stores: the stores it names, in order.
    """

    frame: int
    time: float
    src: Addr
    tidx: int
    version: int
    stores: list[StoreEntry]


@dataclass
class Keepalive:
    """A UME keepalive (docs/wire-lbmc.md §2.1): ``kind`` store, receiver or source (who sent
    it); ``respond``: the R flag (response requested)."""

    frame: int
    time: float
    src: Addr
    dst: Addr
    kind: str
    respond: bool
    reg_id: int


KEEPALIVE_KINDS = {0: "store", 1: "receiver", 2: "source"}
TRANSPORT_KINDS = {0: "data", 2: "sm", 3: "nak", 4: "ncf"}
"""LBT-RM / LBT-RU packet types that take part in NAK-based reliability, by header type."""
"""The keepalive's type field: who sent it (docs/wire-lbmc.md §2.1)."""


@dataclass
class Tpkt:
    """An LBT-RU or LBT-RM packet that takes part in NAK-based reliability
    (docs/wire-transports.md §1.3-1.5, §2.3-2.4).

    Attributes:
        frame / time: where it was captured.
        session: the transport session: LBT-RM (``"lbtrm"``, source address, the header's
            unicast port, session ID); LBT-RU (``"lbtru"``, source address:port, receiver
            address:port, session ID), since an LBT-RU session is one source-receiver pair.
        kind: ``data``, ``rx`` (retransmission), ``sm``, ``nak`` or ``ncf``.
        sqns: the sequence number (data, rx), the NAK or NCF list.
        lead: the leading edge an SM announces (else the data's sequence number).
        sender: the address that sent it (a NAK's receiver).
    """

    frame: int
    time: float
    session: tuple[object, ...]
    kind: str
    sqns: list[int]
    lead: int
    sender: Addr


@dataclass
class Client:
    """A source or receiver of one topic, across its restarts (see the module docstring).

    Attributes:
        role: ``source`` or ``receiver``.
        topic: the topic name ("?" when no PREG named it).
        key: what identifies it: ``sid 0x...`` or ``regid N``.
        registrations: its PREGs in capture order, at every store.
    """

    role: str
    topic: str
    key: str
    registrations: list[Registration] = field(default_factory=list)

    @property
    def name(self) -> str:
        first = self.registrations[0]
        return f"{self.role} {show(first.resp_addr)} ({self.key}, topic {self.topic})"


@dataclass
class Observed:
    """Everything :func:`observe` found in one or more captures (module docstring).

    Attributes:
        paths: the capture files, in the order given.
        frames / um_frames: how many frames, and how many of them UM.
        problems: what limits the judgement (a damaged end, malformed frames).
        notes: what the observation inferred (store ports found in the capture).
        store_ports: the TCP ports decoded as store ports (given and found).
        registrations / data / acks / rxreqs: in capture order.
        transport: LBT-RU / LBT-RM data, session messages, NAKs and NCFs, in capture order.
        sri: (transport address, store address, RegID) -> frames of SRIs naming them.
        tirs: (topic, the source's request address when its UME option names it) -> the
            transport addresses its advertisements (TIRs) name (docs/wire-transports.md §4.4).
        sris: every SRI, in capture order.
        keepalives: every UME keepalive, in capture order.
        heard: (sender, receiver) -> the (frame, time) of every frame carrying LBMC from one
            to the other: what a store or client hears of its peer on a connection.
        source_options / receiver_options: the deployment's UM configuration of its
            sources / receivers when given (``--source-config``): configured limits are then
            judged exactly; without it they are reported as informational.
        store_config: the stores' umestored XML when given (``--store-config``).
        end_time: the time of the last frame of the capture(s).
    """

    paths: list[Path]
    frames: int = 0
    um_frames: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    store_ports: list[int] = field(default_factory=list)
    registrations: list[Registration] = field(default_factory=list)
    data: list[Data] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    rxreqs: list[Rxreq] = field(default_factory=list)
    transport: list[Tpkt] = field(default_factory=list)
    sri: dict[tuple[Addr, Addr, int], list[int]] = field(default_factory=dict)
    tirs: dict[tuple[str, Addr | None], set[Addr]] = field(default_factory=dict)
    sris: list[Sri] = field(default_factory=list)
    keepalives: list[Keepalive] = field(default_factory=list)
    heard: dict[tuple[Addr, Addr], list[tuple[int, float]]] = field(default_factory=dict)
    source_options: SourceOptions | None = None
    receiver_options: ReceiverOptions | None = None
    store_config: StoreDaemonConfig | None = None
    end_time: float = 0.0
    _indexes: dict[str, tuple[Any, dict[Any, Any]]] = field(
        default_factory=dict, repr=False, compare=False)
    """Positions in :attr:`data` / :attr:`acks` by sender (and receiver): see :meth:`_index`."""

    def _index(self, name: str, key: Callable[[Any], Any],
               cache_as: str | None = None) -> dict[Any, list[int]]:
        """Positions of the items of list ``name`` by ``key``, in capture order.

        Why: the checks ask for one connection's or one sender's messages per registration;
        scanning every message each time made judging a 1 M-frame capture quadratic.  Built
        on first use and again whenever the list has grown (the builder appends)."""
        items = getattr(self, name)
        cached = self._indexes.get(cache_as or name)
        if cached is None or cached[0] != len(items):
            index: dict[Any, list[int]] = {}
            for pos, item in enumerate(items):
                index.setdefault(key(item), []).append(pos)
            cached = (len(items), index)
            self._indexes[cache_as or name] = cached
        return cached[1]

    def data_from(self, *senders: Addr) -> list[Data]:
        """The data messages (every kind) sent from any of ``senders``, in capture order.

        Remembered per set of senders (a source's registrations ask for the same transports
        again and again); the list is shared: do not change it."""
        index = self._index("data", lambda d: d.src)
        key = frozenset(senders)
        memo = self._indexes.setdefault("data_from", (0, {}))
        if memo[0] != len(self.data):
            memo = (len(self.data), {})
            self._indexes["data_from"] = memo
        found = memo[1].get(key)
        if found is None:
            lists = [index[s] for s in key if s in index]
            positions = lists[0] if len(lists) == 1 else sorted(p for ps in lists for p in ps)
            found = [self.data[p] for p in positions]
            memo[1][key] = found
        return found

    def after(self, items: list[Any], frame: int, before: int | None = None) -> list[Any]:
        """The items of ``items`` (capture order, each with a ``frame``) that come after frame
        ``frame`` (and before ``before``), found by bisection when the observation is one
        capture (frame numbers then grow with capture order), else by a scan."""
        if len(self.paths) > 1:
            return [i for i in items if i.frame > frame and (before is None
                                                             or i.frame < before)]
        lo = bisect.bisect_right(items, frame, key=lambda i: i.frame)
        hi = len(items) if before is None else bisect.bisect_left(items, before,
                                                                  key=lambda i: i.frame)
        return items[lo:hi]

    def memo(self, name: str, build: Callable[[Observed], Any]) -> Any:
        """``build(self)``, computed once while the observation's lists keep their lengths
        (several judges share the same derived view, e.g. a source's incarnations)."""
        size = (len(self.registrations), len(self.data), len(self.acks), len(self.sris))
        cached = self._indexes.get(f"memo:{name}")
        if cached is None or cached[0] != size:
            cached = (size, {"value": build(self)})
            self._indexes[f"memo:{name}"] = cached
        return cached[1]["value"]

    def acks_between(self, src: Addr, dst: Addr) -> list[Ack]:
        """The ACKs (every kind) ``src`` sent to ``dst``, in capture order."""
        index = self._index("acks", lambda a: (a.src, a.dst))
        return [self.acks[p] for p in index.get((src, dst), ())]

    def acks_to(self, dst: Addr) -> list[Ack]:
        """The ACKs (every kind) sent to ``dst``, in capture order."""
        index = self._index("acks", lambda a: (a.src, a.dst))
        return [self.acks[p] for p in sorted(p for (_, d), ps in index.items() if d == dst
                                             for p in ps)]

    @property
    def stores(self) -> list[Addr]:
        return sorted({r.store for r in self.registrations})

    def clients(self, role: str) -> list[Client]:
        """The sources (``role="source"``) or receivers, each with its registrations."""
        out: dict[tuple[str, str], Client] = {}
        for reg in self.registrations:
            if reg.source != (role == "source") or reg.deregister:
                continue
            topic = reg.topic or "?"
            host = reg.resp_addr[0]
            if reg.session_id:
                key = f"sid {reg.session_id:#x}"
            elif reg.source:
                # a source has one RegID per store: its request address is what they share
                key = f"request port {show(reg.resp_addr)}"
            elif reg.reg_id:
                key = f"regid {reg.reg_id} on {host}"
            elif reg.granted and reg.response is not None:
                key = f"regid {reg.response.reg_id} on {host}"
            else:
                key = f"from {show(reg.resp_addr)}"
            out.setdefault((topic, key), Client(role, topic, key)).registrations.append(reg)
        return list(out.values())

    def transports(self, store: Addr, reg_id: int) -> set[Addr]:
        """The transport addresses whose SRI names ``reg_id`` at ``store``: the source's."""
        return {t for (t, s, r) in self.sri if s == store and r == reg_id}

    def source_transports(self, reg: Registration) -> set[Addr]:
        """A source registration's transport addresses: those whose SRI names its RegID at
        the store, and those its topic's advertisements name (a TIR with a UME option must
        name the PREG's answer address too)."""
        out = set()
        if reg.granted and reg.response is not None:
            out |= self.transports(reg.store, reg.response.reg_id)
        if reg.topic is not None:
            out |= self.tirs.get((reg.topic, reg.resp_addr), set())
            out |= self.tirs.get((reg.topic, None), set())
        return out

    def store_config_of(self, store: Addr) -> StoreConfig | None:
        """The ``<store>`` of ``--store-config`` serving ``store``: the one on its TCP port
        (of several, the one whose interface holds its address: the XML may have been written
        for another host's addresses); None without the XML or with no store on that port."""
        if self.store_config is None:
            return None
        import ipaddress

        on_port = [sc for sc in self.store_config.stores if sc.port == store[1]]
        for sc in on_port:
            try:
                if ipaddress.IPv4Address(store[0]) in sc.interface_network:
                    return sc
            except ValueError:
                break
        return on_port[0] if on_port else None

    def stability_acks(self, reg: Registration) -> list[Ack]:
        """The stability ACKs the store sent on ``reg``'s connection (to the source), for its
        topic (a store's ACK names the topic index in ``id_2``: one connection can carry
        several topics' registrations)."""
        client, store = reg.conn
        index = self._index("acks", lambda a: (a.src, a.dst, a.kind, a.id_2), "acks by kind")
        return [self.acks[p] for p in index.get((store, client, "stability", reg.topic_idx),
                                                ())]

    def heard_after(self, sender: Addr, receiver: Addr, frame: int) -> list[tuple[int, float]]:
        """What :attr:`heard` holds from ``sender`` to ``receiver`` after frame ``frame``
        (bisected in one capture, as :meth:`after`)."""
        items = self.heard.get((sender, receiver), [])
        if len(self.paths) > 1:
            return [x for x in items if x[0] > frame]
        return items[bisect.bisect_right(items, frame, key=lambda x: x[0]):]


def _get(fields: list[tuple[str, Any]], name: str, default: Any = 0) -> Any:
    for key, value in fields:
        if key == name:
            return value
    return default


def payload_size(f: list[tuple[str, Any]]) -> int:
    """A data message's payload bytes from its dissected fields: its length less the data
    base header and every extended header (``hdr_len``, docs/wire-lbmc.md §1)."""
    headers = sum(v for k, v in f if k.endswith(".hdr_len") and isinstance(v, int))
    return max(0, int(_get(f, "lbmc.msglen")) - DATA_BASE.size - headers)


def _answer_ip(ip: str, src: Addr) -> str:
    """A PREG's answer address: 0.0.0.0 there means the address it came from."""
    return src[0] if ip in ("0.0.0.0", "") else ip


def _all(fields: list[tuple[str, Any]], name: str) -> list[Any]:
    return [value for key, value in fields if key == name]


class _Builder:
    """Folds frame reports into an :class:`Observed`, message by message."""

    def __init__(self, observed: Observed) -> None:
        self.obs = observed
        self.pending: dict[tuple[Addr, Addr], list[Registration]] = {}
        self.sessions: dict[tuple[object, ...], tuple[object, ...]] = {}
        """Transport session keys already made (:meth:`transport`), one per packet key."""

    def frame(self, report: FrameReport) -> None:
        """One frame of the frame-by-frame dissection (:func:`wire.dissect.dissect_file`)."""
        self.count(report.number, report.time)
        if report.status == "malformed":
            self.malformed(report.number, report.reason or "")
        if report.status != "um" or report.src is None or report.dst is None:
            return
        src: Addr = (report.src, report.sport or 0)
        dst: Addr = (report.dst, report.dport or 0)
        where = (report.number, report.time)
        self.um(where, src, dst, any(occ.protocol == "lbmc" for occ in report.occurrences))
        for occ in report.occurrences:
            if occ.protocol == "lbmc":
                self.message(where, report.transport or "", occ.fields, src, dst)
            elif occ.protocol in ("lbtru", "lbtrm"):
                self.transport_fields(where, occ.protocol, occ.fields, src, dst)
            elif occ.protocol == "lbmr":
                self.tir_fields(occ.fields)

    def count(self, number: int, time: float) -> None:
        """A captured frame, UM or not."""
        self.obs.frames += 1
        self.obs.end_time = max(self.obs.end_time, time)

    def malformed(self, number: int, reason: str) -> None:
        self.obs.problems.append(f"frame {number} is malformed: {reason}")

    def um(self, where: tuple[int, float], src: Addr, dst: Addr, lbmc: bool) -> None:
        """A UM frame from ``src`` to ``dst``; ``lbmc``: it carries (completes) an LBMC message,
        which tells the receiver the sender is alive."""
        self.obs.um_frames += 1
        if lbmc:
            self.obs.heard.setdefault((src, dst), []).append(where)

    def tir_fields(self, f: list[tuple[str, Any]]) -> None:
        """The transport a topic advertisement names, per topic (one TIR per topic here; a
        packet with several TIRs repeats the fields, which are then paired in order)."""
        names = _all(f, "lbmr.tir.name")
        if len(names) != 1:
            return  # several TIRs in one packet: their options cannot be paired safely
        where: Addr | None = None
        for ip_name, port_name in (("lbmr.tir.tcp.ip", "lbmr.tir.tcp.port"),
                                   ("lbmr.tir.lbtru.ip", "lbmr.tir.lbtru.port"),
                                   ("lbmr.tir.lbtrm.srcip", "lbmr.tir.lbtrm.sport")):
            ip, port = _get(f, ip_name, None), _get(f, port_name, None)
            if isinstance(ip, str) and isinstance(port, int):
                where = (ip, port)
        ip, port = _get(f, "lbmr.topt.ume.src_tcp_addr", None), _get(
            f, "lbmr.topt.ume.src_tcp_port", None)
        request: Addr | None = (ip, port) if isinstance(ip, str) and isinstance(port, int) \
            else None
        self.tir(names[0], where, request)

    def tir(self, topic: str, where: Addr | None, request: Addr | None) -> None:
        """A TIR of ``topic`` naming transport address ``where`` (None: none this observation
        uses) and, in its UME option, the source's request address."""
        if where is not None:
            self.obs.tirs.setdefault((topic, request), set()).add(where)

    def transport_fields(self, where: tuple[int, float], p: str, f: list[tuple[str, Any]],
                         src: Addr, dst: Addr) -> None:
        """An LBT-RM / LBT-RU packet from its dissected fields (:meth:`transport`)."""
        kind = TRANSPORT_KINDS.get(_get(f, f"{p}.hdr.type", -1))
        if kind is None:
            return
        if p == "lbtrm":
            ucast, sid = _get(f, "lbtrm.hdr.ucast_port"), _get(f, "lbtrm.hdr.session_id")
            rx, lead = _get(f, "lbtrm.data.flags_fec_type.rx"), _get(f, "lbtrm.sm.lead_sqn")
        else:
            ucast, sid = 0, _get(f, "lbtru.opt_sid.session_id")
            rx, lead = _get(f, "lbtru.hdr.flags.rx"), _get(f, "lbtru.sm.lead")
        listed = [v for v in _all(f, f"{p}.{kind}.list.{kind}") if isinstance(v, int)]
        self.transport(where, p, kind, src, dst, ucast_port=ucast, session_id=sid,
                       rx=bool(rx), sqn=_get(f, f"{p}.data.sqn"), lead=lead, listed=listed)

    def transport(self, where: tuple[int, float], p: str, kind: str, src: Addr, dst: Addr, *,
                  ucast_port: int, session_id: int, rx: bool, sqn: int, lead: int,
                  listed: list[int]) -> None:
        """A ``kind`` (``TRANSPORT_KINDS``) packet of protocol ``p`` (``lbtrm``/``lbtru``):
        its session and what it names (:class:`Tpkt`)."""
        from_source = kind != "nak"
        key = (p, from_source, src, dst, ucast_port, session_id)
        session = self.sessions.get(key)
        if session is None:
            if p == "lbtrm":
                source_ip = src[0] if from_source else dst[0]
                session = (p, source_ip, ucast_port, session_id)
            else:
                pair = (src, dst) if from_source else (dst, src)
                session = (p, show(pair[0]), show(pair[1]), session_id)
            self.sessions[key] = session
        if kind == "data":
            sqns = [sqn]
            kind = "rx" if rx else "data"
        elif kind == "sm":
            sqns = []
        else:
            sqns = listed
        self.obs.transport.append(Tpkt(*where, session, kind, sqns,
                                       lead if kind == "sm" else max(sqns, default=0), src))

    def message(self, where: tuple[int, float], via: str, f: list[tuple[str, Any]], src: Addr,
                dst: Addr, size: int | None = None) -> None:
        """One LBMC message, from its fields (tshark's names, as :mod:`wire.dissect` gives
        them), carried by ``via`` (``lbttcp``, ``lbtru``, ``lbtrm``); ``size``: its payload
        bytes when the decoder knows them (else :func:`payload_size` of the fields)."""
        names = {name for name, _ in f}
        if "lbmc.ume_keepalive.type" in names:
            self.obs.keepalives.append(Keepalive(
                *where, src=src, dst=dst,
                kind=KEEPALIVE_KINDS.get(_get(f, "lbmc.ume_keepalive.type"), "?"),
                respond=bool(_get(f, "lbmc.ume_keepalive.flags.r_flag")),
                reg_id=_get(f, "lbmc.ume_keepalive.reg_id")))
        if "lbmc.ume_preg.reg_id" in names:
            topic = _get(f, "lbmc.topicname.topic", None)
            reg = Registration(
                *where, conn=(src, dst), store=dst, source=bool(_get(f, "lbmc.ume_preg.s_flag")),
                reg_id=_get(f, "lbmc.ume_preg.reg_id"),
                src_reg_id=_get(f, "lbmc.ume_preg.src_reg_id"),
                transport_idx=_get(f, "lbmc.ume_preg.transport_idx"),
                topic_idx=_get(f, "lbmc.ume_preg.topic_idx"), topic=topic,
                session_id=int(_get(f, "lbmc.ume_sid.sid")),
                resp_addr=(_answer_ip(_get(f, "lbmc.ume_preg.resp_ip", src[0]), src),
                           _get(f, "lbmc.ume_preg.resp_port", src[1])),
                deregister=bool(_get(f, "lbmc.ume_preg.flags.d_flag")),
                activity_timeout=_get(f, "lbmc.ume_client_lifetime.activity_tmo"),
                rpp=bool(_get(f, "lbmc.ume_preg.flags.w_flag")),
                extopt=any(name.startswith("lbmc.extopt") for name in names))
            self.obs.registrations.append(reg)
            self.pending.setdefault((src, dst), []).append(reg)
        elif "lbmc.ume_preg_resp.reg_id" in names:
            error = bool(_get(f, "lbmc.ume_preg_resp.code.e_flag"))
            resp = PregResp(
                *where, reg_id=_get(f, "lbmc.ume_preg_resp.reg_id"),
                old=bool(_get(f, "lbmc.ume_preg_resp.code.o_flag")), error=error,
                code=_get(f, "lbmc.ume_preg_resp.code") & 0x0F if error else 0,
                low_sqn=_get(f, "lbmc.ume_preg_resp.low_seqnum"),
                high_sqn=_get(f, "lbmc.ume_preg_resp.high_seqnum"),
                deregister=bool(_get(f, "lbmc.ume_preg_resp.code.d_flag")) and not error)
            self._answer(dst, src, resp, bool(_get(f, "lbmc.ume_preg_resp.s_flag")),
                         _get(f, "lbmc.ume_preg_resp.transport_idx"),
                         _get(f, "lbmc.ume_preg_resp.topic_idx"))
        elif "lbmc.ume_ack.seqnum" in names:
            self.ack(where, src, dst, _get(f, "lbmc.ume_ack.type"), _get(f, "lbmc.ume_ack.seqnum"),
                     _get(f, "lbmc.ume_ack.rcv_reg_id"), _get(f, "lbmc.ume_ack.id_2"),
                     _get(f, "lbmc.ume_ack.flags"))
        elif "lbmc.ume_rxreq.seqnum" in names:
            self.obs.rxreqs.append(Rxreq(*where, src=src, dst=dst,
                                         reg_id=_get(f, "lbmc.ume_rxreq.id_2"),
                                         sqn=_get(f, "lbmc.ume_rxreq.seqnum")))
        elif "lbmc.sri.version" in names:
            entries = [StoreEntry((ip, port), reg_id, version, idx, grp) for
                       ip, port, reg_id, version, idx, grp in zip(
                           _all(f, "lbmc.ume_store_ext.store_ip_addr"),
                           _all(f, "lbmc.ume_store_ext.store_tcp_port"),
                           _all(f, "lbmc.ume_store_ext.src_reg_id"),
                           _all(f, "lbmc.ume_store_ext.version"),
                           _all(f, "lbmc.ume_store_ext.store_idx"),
                           _all(f, "lbmc.ume_store_ext.grp_idx"), strict=False)]
            for e in entries:
                self.obs.sri.setdefault((src, e.store, e.reg_id), []).append(where[0])
            self.obs.sris.append(Sri(*where, src=src, tidx=_get(f, "lbmc.topic_idx.tidx"),
                                     version=_get(f, "lbmc.sri.version"), stores=entries))
        elif "lbmc.sqn" in names and _get(f, "lbmc.type", -1) in DATA_KINDS:
            self.data(where, src, dst, _get(f, "lbmc.type"), _get(f, "lbmc.tidx"),
                      _get(f, "lbmc.sqn"), via, payload_size(f) if size is None else size)

    def ack(self, where: tuple[int, float], src: Addr, dst: Addr, ack_type: int, sqn: int,
            rcv_reg_id: int, id_2: int, flags: int) -> None:
        """A UME ACK (a message whose chain holds ``ume_ack``): type 1 from a store is a
        stability ACK, else a receiver's consumption ACK; the NAK bit (docs/wire-lbmc.md §2.1).
        Called for the bulk of a capture's messages, hence positional."""
        self.obs.acks.append(Ack(where[0], where[1], src, dst,
                                 "stability" if ack_type == 1 else "consumption", sqn,
                                 rcv_reg_id, id_2, bool(flags & ACK_NAK)))

    def data(self, where: tuple[int, float], src: Addr, dst: Addr, lbmc_type: int, tidx: int,
             sqn: int, via: str, size: int) -> None:
        """A message of a data type (``DATA_KINDS``) with its topic index and sequence
        number, carried by ``via``, of ``size`` payload bytes."""
        self.obs.data.append(Data(where[0], where[1], src, dst, tidx, sqn,
                                  DATA_KINDS[lbmc_type], via, size))

    def _answer(self, client: Addr, store: Addr, resp: PregResp, source: bool,
                transport_idx: int, topic_idx: int) -> None:
        """Attach ``resp`` to the oldest unanswered PREG of that kind on its connection."""
        waiting = self.pending.get((client, store), [])
        for i, reg in enumerate(waiting):
            if reg.source == source and (reg.transport_idx, reg.topic_idx) == (
                    transport_idx, topic_idx):
                reg.response = resp
                del waiting[i]
                return
        # an answer to a PREG the capture does not hold (it started later): nothing to judge


STORE_PORT_FIELDS = ("lbmr.topt.ume.store_tcp_port", "lbmr.topt.ume_store.store_tcp_port",
                     "lbmc.ume_store_ext.store_tcp_port")
"""Fields that name a store's TCP port: a source's TIR options and its SRI."""


def _store_ports_in(report: FrameReport, found: set[int]) -> None:
    """Add to ``found`` every store TCP port ``report``'s TIRs and SRIs name."""
    for occ in report.occurrences:
        for name, value in occ.fields:
            if name in STORE_PORT_FIELDS and isinstance(value, int) and value:
                found.add(value)


def observe(paths: Iterable[str | Path], ports: PortMap | None = None,
            content: bool = True) -> Observed:
    """The observed model of ``paths`` (several captures are read one after the other, as
    one capture: their frame numbers are then those of each file, so name one file per run
    for evidence that points at a single file).

    The stores' TCP traffic is UM only on their ports (tshark has no default); the capture's
    own topic resolution and SRIs name them.  When they name a port ``ports`` lacks, the
    captures are read a second time with it (once is enough when the store ports are given,
    the common case for a big capture).

    Raises :class:`~wire.errors.WireError` when the first file is not a capture at all (no
    frame could be read); a capture damaged later is kept up to the damage and noted in
    :attr:`Observed.problems`."""
    files = [Path(p) for p in paths]
    ports = ports or PortMap()
    observed, named = _observe(files, ports, content)
    if named - set(ports.store_ports):
        ports = replace(ports, store_ports=sorted({*ports.store_ports, *named}))
        observed, _ = _observe(files, ports, content)
        observed.notes.insert(0, "store ports taken from the capture's TIRs and SRIs: "
                              + ", ".join(str(p) for p in sorted(named)))
    return observed


def _observe(files: list[Path], ports: PortMap, content: bool) -> tuple[Observed, set[int]]:
    """One pass of :func:`observe` with ``ports``; also returns the store ports named."""
    observed = Observed(files)
    observed.store_ports = list(ports.store_ports)
    named: set[int] = set()
    builder = _Builder(observed)
    for path in observed.paths:
        read = 0
        try:
            for report in dissect_file(path, ports, content):
                _store_ports_in(report, named)
                builder.frame(report)
                read += 1
        except WireError as exc:
            if read == 0:
                raise WireError(exc.header, exc.offset,
                                f"{path}: not a readable capture: {exc.reason}") from None
            observed.problems.append(f"{path} is damaged after frame {read}: {exc.reason}")
    return observed, named
