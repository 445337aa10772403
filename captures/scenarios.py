"""Declarative descriptions of the persistent deployments the capture generator plays out.

A :class:`Scenario` says *what* happens (who publishes which topics over which transport, which
stores form which quorum/consensus groups, how lossy the network is, who restarts when); the
generator (:mod:`captures.generator`) decides *how* it looks on the wire.  Scenarios are plain
frozen dataclasses so a test can derive a variant with :func:`dataclasses.replace` and the
sidecar can record every parameter as JSON.

Times are seconds of capture time, rates are per second.  Defaults follow the UM defaults of
``docs/semantics.md`` where a capture can show them at all, shortened where the real
default (a 3 s keepalive, a 30 s activity timeout) would make small captures mostly idle: the
generated captures are about protocol shape, and the sidecar records the values used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Transport(StrEnum):
    """The UM transport a source context sends its topics over."""

    LBTRM = "lbtrm"  # reliable multicast (UDP), NAKs unicast to the source, NCF/RX multicast
    LBTRU = "lbtru"  # reliable unicast (UDP), one datagram per receiver
    LBTTCP = "lbttcp"  # TCP, one connection per receiver


class ScenarioError(ValueError):
    """A scenario whose parameters contradict each other or cannot be played out."""


@dataclass(frozen=True)
class Restart:
    """One process restart.

    Attributes:
        index: which receiver/source/store (0-based, in creation order).
        at: when it goes down, as a fraction (0-1) of the data phase.
        downtime: seconds until it is back.
    """

    index: int = 0
    at: float = 0.5
    downtime: float = 0.3


@dataclass(frozen=True)
class Scenario:
    r"""One persistent deployment and what happens to it.

    Topology:
        sources: source contexts (applications), each with its own transport session.
        topics_per_source: topics each source context publishes (one UM source per topic).
        receivers: receiver contexts; every receiver subscribes to every topic, so this is
            also the number of receivers per topic.
        store_groups: sizes of the quorum/consensus groups, e.g. ``(3,)`` for one QC group of
            three stores; ``(1,)`` is a single store.  Every store holds every topic.
        transports: the transport of each source context, cycled (``(LBTRM, LBTRU)`` makes
            sources 0, 2, ... multicast and 1, 3, ... unicast).

    Traffic:
        messages: total new application messages over all topics (round robin over topics).
        rate: messages per second per topic.
        payload_size: application payload bytes per message.
        ack_batch_interval: receiver consumption-ACK batching interval (0: one ACK per
            delivered message, as ``ume_use_ack_batching 0``).
        stability: intragroup stability and registration-completion rule, ``"quorum"``
            (a majority of the group) or ``"all"`` (every store of the group).

    Loss (per datagram and destination, independently; TCP transports never lose):
        receiver_loss / store_loss: probability that a transport datagram (data or SRI) is
            lost on the way to a receiver / to a store.  The capture is taken at the source
            side switch port, so lost datagrams are in the capture and the loss shows through
            the NAKs that follow.
        unrecoverable: fraction of NAKed sequence numbers the source sheds (NCF "NAK Shed")
            instead of retransmitting; receivers then recover them from a store (RXREQ /
            RETRANS) and stores get them by proactive retransmission if not yet stable.

    Life cycle:
        receiver_restarts / source_restarts / store_restarts: :class:`Restart` events.
        regid_collision: a misconfigured second source tries to register with the RegID of
            source 0's first topic and is refused (PREG-RESP error 5) ``collision_attempts``
            times.

    Protocol timing (seconds):
        keepalive_interval, resolver_interval (TIR re-advertisement and unicast resolver
        keepalives), sri_interval / sri_count (unsolicited SRI burst), registration_interval
        (source retry after a refused registration), activity_timeout (store's source
        activity timeout: a restarted source that re-registers sooner is refused with error
        5), stability_timeout (proactive retransmission of unstable messages), sm_interval
        (idle session messages), nak_backoff (max random NAK delay after a gap is seen).

    Traits of real deployments (all off by default; the ``real-traits`` preset turns them on):
        lbtrm_ephemeral_port: LBT-RM sources send DATA, SM and NCF from an ephemeral UDP port
            (one per session) and take NAKs on the unicast NAK port their headers name
            (14390), as real sources do; off, both are 14390.
        resolver_multicast: topic resolution on the resolver multicast group (224.9.10.11:12965,
            tshark's default) instead of through lbmrd, as LBMR version 1 packets with packet
            options (version, local domain, option length); no lbmrd keepalives.
        wildcard_queries: receivers also ask for the topics of source 0 with a wildcard TQR
            (PCRE ``^ump\.<transport>\.src0\.topic[0-9]+$``), which sources answer with the
            TIRs of every topic it matches.
        naks_to_dead_source: when an LBT-RM source stops (a source restart), each receiver
            NAKs what it still misses (or the source's last datagram) once more to the closed
            NAK port, and the source's host answers ICMP port unreachable quoting the NAK.
        llc_frames: the capture also holds the switch's 802.3/LLC frames (spanning-tree
            BPDUs every 2 s), which are not UM.
        ip_mtu: the link MTU (68 or more; 0: no limit).  A UDP datagram larger than it is
            written as IPv4 fragments, as the sender's IP layer cuts it (UM sources send
            datagrams of up to 8 KiB), each host numbering its fragmented datagrams.  The
            run (and ``--packets``) counts datagrams: the capture holds more frames.

    Other:
        store_port: the stores' TCP port (tshark needs it: ``--store-port``).
        session_ids: sources and receivers send a UME session ID with their registrations.
        big_endian / nanosecond / pcapng: defaults of the output format for this scenario.
    """

    name: str = "custom"
    description: str = ""
    sources: int = 1
    topics_per_source: int = 1
    receivers: int = 1
    store_groups: tuple[int, ...] = (1,)
    transports: tuple[Transport, ...] = (Transport.LBTRU,)
    messages: int = 100
    rate: float = 1000.0
    payload_size: int = 64
    ack_batch_interval: float = 0.0
    stability: str = "quorum"
    receiver_loss: float = 0.0
    store_loss: float = 0.0
    unrecoverable: float = 0.0
    receiver_restarts: tuple[Restart, ...] = ()
    source_restarts: tuple[Restart, ...] = ()
    store_restarts: tuple[Restart, ...] = ()
    regid_collision: bool = False
    collision_attempts: int = 2
    keepalive_interval: float = 0.1
    resolver_interval: float = 2.0
    sri_interval: float = 0.05
    sri_count: int = 3
    registration_interval: float = 0.3
    activity_timeout: float = 0.5
    stability_timeout: float = 0.25
    sm_interval: float = 0.2
    nak_backoff: float = 0.02
    lbtrm_ephemeral_port: bool = False
    resolver_multicast: bool = False
    wildcard_queries: bool = False
    naks_to_dead_source: bool = False
    llc_frames: bool = False
    ip_mtu: int = 0
    store_port: int = 14567
    session_ids: bool = True
    big_endian: bool = False
    nanosecond: bool = False
    pcapng: bool = False
    tags: tuple[str, ...] = field(default=())

    @property
    def topics(self) -> int:
        return self.sources * self.topics_per_source

    @property
    def stores(self) -> int:
        return sum(self.store_groups)

    def transport_of(self, source: int) -> Transport:
        return self.transports[source % len(self.transports)]

    def validate(self) -> Scenario:
        """Raise :class:`ScenarioError` naming the first impossible parameter; return self."""
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ScenarioError(f"scenario {self.name!r}: {what}")

        need(1 <= self.sources <= 250, "sources must be 1-250")
        need(1 <= self.topics_per_source <= 1000, "topics_per_source must be 1-1000")
        need(0 <= self.receivers <= 250, "receivers must be 0-250")
        need(bool(self.store_groups) and all(1 <= g <= 15 for g in self.store_groups),
             "store_groups needs at least one group of 1-15 stores")
        need(self.stores <= 60, "at most 60 stores (one SRI must fit one LBMC message)")
        need(bool(self.transports), "transports must name at least one transport")
        need(self.messages >= 0, "messages must be >= 0")
        need(self.rate > 0, "rate must be > 0")
        need(0 <= self.payload_size <= 8000, "payload_size must be 0-8000 bytes")
        for name in ("receiver_loss", "store_loss", "unrecoverable"):
            value = getattr(self, name)
            need(0.0 <= value < 1.0, f"{name} must be in [0, 1)")
        need(self.ack_batch_interval >= 0, "ack_batch_interval must be >= 0")
        need(self.stability in ("quorum", "all"), "stability must be 'quorum' or 'all'")
        for kind, count in (("receiver", self.receivers), ("source", self.sources),
                            ("store", self.stores)):
            for restart in getattr(self, f"{kind}_restarts"):
                need(0 <= restart.index < count, f"{kind} restart index {restart.index} "
                     f"out of range (0-{count - 1})")
                need(0.0 <= restart.at <= 1.0, f"{kind} restart 'at' must be in [0, 1]")
                need(restart.downtime > 0, f"{kind} restart downtime must be > 0")
        for name in ("keepalive_interval", "resolver_interval", "sri_interval",
                     "registration_interval", "activity_timeout", "stability_timeout",
                     "sm_interval", "nak_backoff"):
            need(getattr(self, name) > 0, f"{name} must be > 0")
        need(self.sri_count >= 1, "sri_count must be >= 1")
        need(self.ip_mtu == 0 or 68 <= self.ip_mtu <= 65535, "ip_mtu must be 0 or 68-65535")
        need(self.collision_attempts >= 1, "collision_attempts must be >= 1")
        need(1024 <= self.store_port <= 65535 and not 14360 <= self.store_port <= 14406
             and self.store_port not in (12965, 15380),
             "store_port must be 1024-65535 and outside the UM default port ranges")
        return self

    def to_json(self) -> dict[str, Any]:
        """Every parameter, JSON-ready (the sidecar's ``scenario`` object)."""
        out = dataclasses.asdict(self)
        out["transports"] = [str(t) for t in self.transports]
        for key in ("receiver_restarts", "source_restarts", "store_restarts"):
            out[key] = [dataclasses.asdict(r) for r in getattr(self, key)]
        out["store_groups"] = list(self.store_groups)
        out["tags"] = list(self.tags)
        return out

    def with_messages(self, messages: int) -> Scenario:
        return dataclasses.replace(self, messages=messages)


PRESETS: dict[str, Scenario] = {
    s.name: s.validate() for s in (
        Scenario(
            name="basic",
            description="One LBT-RU source, one store, one receiver; every message "
                        "acknowledged (stability and consumption) one by one.",
            messages=200, rate=1000.0),
        Scenario(
            name="qc3",
            description="Two sources (LBT-RM and LBT-TCP) with two topics each, three "
                        "receivers, one quorum/consensus group of three stores; batched "
                        "consumption ACKs.",
            sources=2, topics_per_source=2, receivers=3, store_groups=(3,),
            transports=(Transport.LBTRM, Transport.LBTTCP), messages=400, rate=500.0,
            ack_batch_interval=0.1),
        Scenario(
            name="lossy-lbtrm",
            description="LBT-RM with 3 % loss to receivers and 2 % to stores: NAKs, NCFs, "
                        "multicast retransmissions, shed NAKs recovered from the stores "
                        "(RXREQ/RETRANS) and proactive retransmissions to the stores (stability "
                        "needs every store).",
            sources=1, topics_per_source=2, receivers=3, store_groups=(3,),
            transports=(Transport.LBTRM,), messages=1200, rate=2000.0,
            receiver_loss=0.03, store_loss=0.02, unrecoverable=0.25,
            ack_batch_interval=0.05, stability="all"),
        Scenario(
            name="restarts",
            description="Receiver, source and store restarts: re-registration with the same "
                        "RegIDs, a source refused while its old registration is still active "
                        "(error 5), receiver recovery from the stores, SRI version bumps, and "
                        "a RegID collision from a misconfigured source.",
            sources=2, topics_per_source=1, receivers=2, store_groups=(3,),
            transports=(Transport.LBTRU, Transport.LBTRM), messages=1600, rate=1000.0,
            receiver_loss=0.01, ack_batch_interval=0.05,
            receiver_restarts=(Restart(index=0, at=0.25, downtime=0.2),),
            source_restarts=(Restart(index=0, at=0.5, downtime=0.2),),
            store_restarts=(Restart(index=1, at=0.7, downtime=0.15),),
            regid_collision=True),
        Scenario(
            name="big",
            description="Benchmark-size traffic: four sources (LBT-RM, LBT-RU, LBT-TCP, "
                        "LBT-RM) with eight topics each, four receivers, a QC group of three "
                        "stores, light loss, batched consumption ACKs.  Use --packets.",
            sources=4, topics_per_source=8, receivers=4, store_groups=(3,),
            transports=(Transport.LBTRM, Transport.LBTRU, Transport.LBTTCP, Transport.LBTRM),
            messages=100_000, rate=2000.0, payload_size=128, receiver_loss=0.001,
            store_loss=0.0005, unrecoverable=0.1, ack_batch_interval=0.1,
            tags=("benchmark",)),
        Scenario(
            name="real-traits",
            description="What real deployments do that the other presets do not: LBT-RM data "
                        "from an ephemeral port with NAKs to the NAK port of the header, topic "
                        "resolution as LBMR version 1 with options on the resolver multicast "
                        "group, three topics per session, wildcard topic queries, a source "
                        "restart whose last NAKs bounce as ICMP port unreachable, and 802.3/LLC "
                        "frames; loss, NCFs and retransmissions as in lossy-lbtrm.",
            sources=2, topics_per_source=3, receivers=2, store_groups=(1,),
            transports=(Transport.LBTRM, Transport.LBTRU), messages=600, rate=1000.0,
            receiver_loss=0.03, store_loss=0.01, unrecoverable=0.2, ack_batch_interval=0.05,
            source_restarts=(Restart(index=0, at=0.5, downtime=0.2),),
            lbtrm_ephemeral_port=True, resolver_multicast=True, wildcard_queries=True,
            naks_to_dead_source=True, llc_frames=True),
        Scenario(
            name="fragments",
            description="LBT-RM and LBT-RU sources sending 3,000-byte messages over a link "
                        "of 1,500-byte MTU: every data datagram and retransmission travels as "
                        "IPv4 fragments, as on real networks (UM datagrams reach 8 KiB); LBT-RM "
                        "data from an ephemeral port; loss, NAKs, NCFs and store recovery.",
            sources=2, topics_per_source=2, receivers=2, store_groups=(1,),
            transports=(Transport.LBTRM, Transport.LBTRU), messages=120, rate=1000.0,
            payload_size=3000, receiver_loss=0.03, store_loss=0.01, unrecoverable=0.2,
            ack_batch_interval=0.05, lbtrm_ephemeral_port=True, ip_mtu=1500),
        Scenario(
            name="tcp-basic",
            description="One LBT-TCP source, one store, one receiver, played by the reference "
                        "cores (the default backend for LBT-TCP scenarios without loss).",
            transports=(Transport.LBTTCP,), messages=200, rate=1000.0,
            registration_interval=0.25),
        Scenario(
            name="tcp-qc",
            description="Two LBT-TCP sources with two topics each, two receivers, one "
                        "quorum/consensus group of three stores, batched consumption ACKs; "
                        "played by the reference cores.",
            sources=2, topics_per_source=2, receivers=2, store_groups=(3,),
            transports=(Transport.LBTTCP,), messages=400, rate=500.0,
            ack_batch_interval=0.1, registration_interval=0.25),
        Scenario(
            name="tcp-restarts",
            description="Receiver, source and store restarts and a RegID collision over "
                        "LBT-TCP, played by the reference cores: re-registrations (OLD), "
                        "receiver recovery from the stores (RXREQ / RX-DATA), a misconfigured "
                        "source refused (error 5).",
            sources=2, topics_per_source=1, receivers=2, store_groups=(3,),
            transports=(Transport.LBTTCP,), messages=1600, rate=1000.0,
            ack_batch_interval=0.05, registration_interval=0.25,
            receiver_restarts=(Restart(index=0, at=0.25, downtime=0.2),),
            source_restarts=(Restart(index=0, at=0.5, downtime=0.2),),
            store_restarts=(Restart(index=1, at=0.7, downtime=0.15),),
            regid_collision=True),
    )
}
"""The named scenarios ``ump captures generate --scenario NAME`` knows."""


def preset(name: str) -> Scenario:
    """The named preset; :class:`ScenarioError` lists the known names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(PRESETS)}") from None
