"""The reference persistent source: a sans-IO state machine for one topic.

Flow (guide "Operational View", docs/semantics.md §1.1-1.12):

1. Advertise the topic through the resolver (a TIR with the UME, store, store-group and
   extended-functionality options) and answer queries (TQR) for it.
2. Register with every configured store in parallel (PREG with a ``topicname``, Session ID,
   capability and client-lifetime headers), retrying every ``ume_registration_interval``;
   each answer gives :class:`~reference_impl.events.SourceRegistrationSuccess` or
   :class:`~reference_impl.events.SourceRegistrationError`.  A store named by its
   ``context-name`` (``ume_store_name``, :meth:`StoreSpec.named`) is first resolved: the source
   queries for the name (an LBMR context-information record with the query and name flags)
   every :data:`NAME_QUERY_INTERVAL` until the store's advertisement (name and IP flags, its
   address and store port) arrives, registers there, and follows the name to a new address
   when the store advertises one (an INFO log line, then registration at the new address).
3. Registration Complete when the intragroup and intergroup rules hold and either every store
   answered or one full registration interval passed; the source then resumes after the
   consensus sequence number (``ume_consensus_sequence_number_behavior``) and sends SRI
   ``ume_sri_max_number_of_sri_per_update`` times, ``ume_sri_inter_sri_interval`` apart, and
   whenever a receiver or store asks (SRI request).
4. :meth:`SourceCore.send` puts each message on the transport (LBT-TCP: every receiver and
   store connected to the transport port gets it; LBT-RU, ``transport lbt-ru``: see below) and
   keeps it until it is stable per the group rules
   and has ``ume_retention_unique_confirmations`` delivery confirmations.  The flight size
   (``ume_flight_size`` / ``_bytes``) blocks (:class:`SendError` ``would_block``) or notifies.
   A message longer than the transport's maximum datagram (``transport_tcp_datagram_max_
   size`` / ``transport_lbtru_datagram_max_size``) goes out as LBMC fragments, one sequence
   number each (:mod:`reference_impl.fragments`): it counts once against the flight size
   (:class:`FragmentedRetained`), is stable when every fragment is, and proactive
   retransmission resends only the fragments a store lacks.
5. Every ``ume_store_check_interval`` it checks store liveness (``ume_store_activity_timeout``;
   "(quorum lost)" when the rules fail, and sends fail with ``not_registered`` until the
   stores return), retransmits proactively what has not been stable for
   ``ume_message_stability_timeout`` and gives up after ``ume_message_stability_lifetime``;
   a stability NACK (the ACK's NAK bit) from a store that declared a message lost ends its
   retransmissions to that store (:meth:`SourceCore._on_nack`).  :meth:`SourceCore.try_send`
   is the non-blocking send: "would block" comes back as a value.
   A closed connection to a registered store makes it unresponsive at once (the guide's
   Store Unresponsive event comes "due to failure or network disconnect") and the source
   registers again at once, then every ``ume_registration_interval``; when the stores are
   back, what is still in flight goes to them at once (docs/semantics.md §1.12).  A "RegID in
   use" refusal is retried (it clears when the holder's activity timeout at the store runs
   out); every other refusal is final.

Quorum/consensus (guide "Sources Using Quorum/Consensus Store Configuration"; docs/semantics.md
§1.2, §1.12): the rules are :mod:`reference_impl.quorum`.  Registration Complete needs the
registered stores to meet the intragroup rule (``quorum`` / ``all-active``: a majority of the
group's configured size; ``all``: every store) and the intergroup rule (``any``, ``majority``,
``all``, ``all-active``: every group with a quorum registered, at least one) - :meth:`SourceCore.
_groups_ok`; a message is stable by the same options applied to the stores that acknowledged it
(``all-active`` within a group: a quorum and every registered store) - :meth:`SourceCore.
_stable_groups`; each Message Stable event carries IA (the acknowledging store's group has it)
and IR (the intergroup rule holds).  The consensus sequence number of the stores that answered
OLD is formed per group (:func:`_consensus`).  Under an ``all-active`` behaviour a store that
became unresponsive is dropped from the rule at once (:meth:`SourceCore._restabilize`).  Bad QC
settings (unknown behaviour names, a group declared twice or empty, a store naming a group no
``ume_store_group`` declares) are one-line errors of :class:`SourceConfig`.

Receiver-paced persistence (guide "RPP Registration", "Implementing RPP"; docs/semantics.md
§1.13, §2): an RPP source (``ume_receiver_paced_persistence`` 1) sets the PREG's RPP flag and
follows every registration PREG, first or repeated, with its non-zero overrides as EXTOPT
configuration options (:func:`reference_impl.rpp.source_options`, docs/wire-lbmc.md §2.3).  A
code 6 refusal of an RPP registration is "RPP Source Registration Failure"
(:class:`~reference_impl.events.SourceRegistrationError` with ``rpp``; final, like every
refusal but "RegID in use").  A grant whose RPP flag is clear is the compatibility matrix's
"Granted - Source Error" (:class:`~reference_impl.events.RppNotAcknowledged` and an ERROR
line; the registration is kept and counted).  Under a profile without RPP (``pre-5.3``,
``SourceConfig.rpp_supported`` False) the source never sets the flag, never sends the options
and never reads the flag in an answer.

Choices where the fact sheets are silent: the context-information port of a store's
advertisement is its store port (where registrations go); a name not resolved within
``ume_store_activity_timeout`` makes the store unresponsive ("store 0 [NAME] unresponsive -
store name not resolved"); a store counts towards Registration Complete once it
has also said on the transport that it receives it (a store keepalive naming our RegID; see
:mod:`reference_impl.store`), or :data:`JOIN_WAIT` after its answer; SRI travels on the
transport as a CONTROL message naming the topic with a ``topic_idx`` header, followed by one
``ume_store_group`` per group and one ``ume_store_ext`` per registered store (carrying the
per-store version); a restarted source with stores that answer OLD but hold no message resumes
at 0.

LBT-RU (``SourceConfig.transport = "lbt-ru"``, UM option ``source transport lbt-ru``): the
source runs one :class:`~reference_impl.lbtru_session.LbtruSourceSession` on its LBT-RU UDP
port and advertises it in the 10-byte TIR form (address, session ID, port; the TIR leaves from
the same IP).  Choices: the session ID is ``transport_lbtru_session_id``, or when 0 a CRC-32 of
the LBT-RU address and transport index (:func:`lbtru_session_id`: stable across restarts, so
receivers get the restarted source's RST and reconnect at once); every data message and every
SRI is one datagram (one LBMC message per datagram: no batching, so a NAKed datagram costs one
message); proactive retransmissions stay on the store's own connection, as with LBT-TCP (they
are meant for one store that has not acknowledged, not for every receiver); a store says it
receives the transport (the store keepalive) on the source's request port, since LBT-RU carries
nothing from receivers to the source but its own control packets.

LBT-RM (``transport lbt-rm``, docs/wire-transports.md §2.6): the source runs one
:class:`~reference_impl.lbtrm_session.LbtrmSourceSession` on its unicast UDP port (``lbtrm_port``:
``transport_lbtrm_source_port``, or the first free one of the context's
``transport_lbtrm_source_port_low..high``) and sends to its group (``transport_lbtrm_multicast_
address``, or one of ``transport_lbtrm_multicast_address_low..high``, :func:`lbtrm_group`) on
``transport_lbtrm_destination_port``; everything leaves from the unicast port, the one in every
header, where NAKs come back.  The TIR carries the 16-byte LBT-RM form (source address, group,
session ID, destination port, unicast port).  Choices: the session ID is a CRC-32 of the
unicast address, transport index and start time (:func:`lbtrm_session_id`: a restarted source
is a new session, since LBT-RM has no reset that would tell receivers a reused ID starts over,
and a simulated run stays a function of its seed); as with LBT-RU each message is one datagram
and a store says it receives the transport on the source's request port.

Hot paths (the store benchmark asks for 100,000 messages/s, which leaves a few microseconds per
message): :meth:`SourceCore.send_many` puts a batch out as one stream write, through a loop that
looks up once what every take needs; an ACK of the one shape stores and receivers send is read
through the layout derived from ``UmeAck`` (:class:`~reference_impl.fastmsg.ControlTemplate`),
a store's run of them straight out of the received chunk (:meth:`SourceCore.on_message_run`),
any other message through the full decoder; the group stability rules are evaluated once per
set of acknowledging stores (a bitmask, the memo key); the retention pass returns at once while
nothing has landed, and a message that lands as the oldest is reclaimed without it.
``tests/reference_impl/test_source_fastpath.py`` runs random programs against a source without
these shortcuts and requires identical events, bytes and state.
"""

from __future__ import annotations

import ipaddress
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from reference_impl import fragments, quorum, rpp
from reference_impl.context import Connection, ContextCore, LbtruBinding, control
from reference_impl.events import (
    Addr,
    DeliveryConfirmation,
    FlightSizeNotification,
    FlightState,
    Level,
    MessageNacked,
    MessageNotStable,
    MessageReclaimed,
    MessageStable,
    RppNotAcknowledged,
    SourceDeregistered,
    SourceRegistrationComplete,
    SourceRegistrationError,
    SourceRegistrationSuccess,
    StableFlags,
    StoreInfo,
    StoreUnresponsive,
)
from reference_impl.fastmsg import ControlTemplate, data_message
from reference_impl.lbtrm_session import (
    DESTINATION_PORT,
    MULTICAST_RANGE,
    LbtrmSourceSession,
    LbtrmSourceSettings,
)
from reference_impl.lbtru_session import (
    ClientConnected,
    ClientTimedOut,
    LbtruSourceSession,
    LbtruSourceSettings,
)
from reference_impl.lbtru_session import Event as LbtruEvent
from wire import lbmr
from wire.lbmc import (
    ACK_NAK,
    DATA_BASE,
    NHDR_DATA,
    AckType,
    Header,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    PregError,
    Sri,
    SriReq,
    TopicIdx,
    Topicname,
    UmeAck,
    UmeCapability,
    UmeClientLifetime,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeProxySrc,
    UmeRxreq,
    UmeSid,
    UmeStoreExt,
    UmeStoreGroup,
)


@dataclass(frozen=True)
class StoreSpec:
    """One ``ume_store`` entry, ``DomainID:IP:port:RegID:GroupIDX``, or (``name`` set) one
    ``ume_store_name`` entry, ``name:RegID:GroupIDX``, whose address the source learns from the
    store's context-name advertisement (see :meth:`named`)."""

    ip: str
    port: int
    reg_id: int = 0
    group: int = 0
    domain_id: int = 0
    name: str | None = None

    @classmethod
    def named(cls, name: str, reg_id: int = 0, group: int = 0) -> StoreSpec:
        """A store known by its ``context-name``; its address is unknown until resolved."""
        return cls(UNRESOLVED[0], UNRESOLVED[1], reg_id, group, name=name)


@dataclass(frozen=True)
class SourceConfig:
    """The source options the core uses; names are the UM option names, times in ms.

    Defaults are the current product's (docs/semantics.md §1.16); ``profile="guide-5.3"`` values
    come from :mod:`reference_impl.config` when a configuration file is read.

    Receiver-paced persistence (guide "RPP Registration", "Implementing RPP"):
    ``ume_receiver_paced_persistence`` 1 asks the stores for an RPP repository, and the RPP
    overrides ``ume_flight_size_bytes``, ``ume_write_delay`` (ms),
    ``ume_repository_ack_on_reception`` (0/1), ``ume_repository_size_threshold``,
    ``ume_repository_size_limit`` and ``ume_repository_disk_file_size_limit`` (bytes) lower
    the store's values for this source; 0 means "the store's value" and is not sent
    (:func:`reference_impl.rpp.source_options`, docs/semantics.md §2.2).  An SPP source sends
    none of them (``ume_flight_size_bytes`` still bounds its own flight).  ``rpp_supported``
    is the profile's :attr:`~reference_impl.config.profiles.Profile.rpp_supported`: False
    (profile ``pre-5.3``) makes a source that never sets, sends or reads anything of RPP, and
    refuses ``ume_receiver_paced_persistence`` 1.
    """

    ume_store: tuple[StoreSpec, ...] = ()
    ume_store_group: tuple[tuple[int, int], ...] = ()  # (group index, size)
    ume_session_id: int = 0
    ume_registration_interval: int = 3000
    ume_store_activity_timeout: int = 10_000
    ume_store_check_interval: int = 500
    ume_sri_inter_sri_interval: int = 500
    ume_sri_max_number_of_sri_per_update: int = 20
    ume_consensus_sequence_number_behavior: str = "highest"
    ume_retention_intragroup_stability_behavior: str = "quorum"
    ume_retention_intergroup_stability_behavior: str = "any"
    ume_flight_size: int = 1000
    ume_flight_size_bytes: int = 0
    ume_flight_size_behavior: str = "block"
    ume_message_stability_timeout: int = 5000
    ume_message_stability_lifetime: int = 1_200_000
    ume_retention_unique_confirmations: int = 0
    ume_confirmed_delivery_notification: int = 0
    ume_activity_timeout: int = 0
    ume_state_lifetime: int = 0
    ume_receiver_paced_persistence: int = 0
    ume_write_delay: int = 0
    ume_repository_ack_on_reception: int = 0
    ume_repository_size_threshold: int = 0
    ume_repository_size_limit: int = 0
    ume_repository_disk_file_size_limit: int = 0
    rpp_supported: bool = True
    ume_proxy_source: int = 0  # 1: ask the stores for a proxy source (see _check_proxy_source)
    ume_proactive_keepalive_interval: int = 3000
    retransmit_retention_size_limit: int = 25_165_824
    retransmit_retention_size_threshold: int = 0
    late_join: int = 0  # a streaming source keeps a retention buffer (see _keep_streaming)
    resolver_advertisement_interval: int = 1000
    transport: str = "tcp"  # "tcp", "lbt-ru" or "lbt-rm" ("lbtru", "lbtrm" too)
    transport_lbtru_session_id: int = 0  # 0: derived (see :func:`lbtru_session_id`)
    transport_lbtru_transmission_window_size: int = 25_165_824
    # the largest datagram of each transport; longer messages go out as fragments
    transport_tcp_datagram_max_size: int = fragments.DATAGRAM_DEFAULTS["tcp"]
    transport_lbtru_datagram_max_size: int = fragments.DATAGRAM_DEFAULTS["lbt-ru"]
    # LBT-RM (reference_impl/lbtrm_session.py has the defaults and what each does; ms here)
    transport_lbtrm_datagram_max_size: int = fragments.DATAGRAM_DEFAULTS["lbt-rm"]
    transport_lbtrm_multicast_address: str = ""  # "": one of the range (see lbtrm_group)
    transport_lbtrm_multicast_address_low: str = MULTICAST_RANGE[0]
    transport_lbtrm_multicast_address_high: str = MULTICAST_RANGE[1]
    transport_lbtrm_destination_port: int = DESTINATION_PORT
    transport_lbtrm_transmission_window_size: int = 25_165_824
    transport_lbtrm_sm_minimum_interval: int = 200
    transport_lbtrm_sm_maximum_interval: int = 10_000
    transport_lbtrm_ignore_interval: int = 500
    transport_lbtrm_data_rate_limit: int = 10_000_000
    transport_lbtrm_retransmit_rate_limit: int = 5_000_000
    transport_lbtrm_rate_interval: int = 100

    def __post_init__(self) -> None:
        if self.transport.lower() not in TRANSPORTS:
            raise ValueError(f"source transport {self.transport!r}: the reference source "
                             f"speaks tcp, lbt-ru or lbt-rm")
        rpp.check_mode("source", self.ume_receiver_paced_persistence, self.rpp_supported)
        fragments.piece_size(self.transport_kind, self.datagram_max)  # refuses a bad maximum
        if self.lbtrm:  # values the session cannot run with are refused here, in one line
            self.lbtrm_settings(1)
            lbtrm_group(self, 0)
        # the flight size is what a send is judged by: a value that makes no sense is refused
        # here, in one line, as the configuration file reader refuses it
        if self.ume_flight_size < 1:
            raise ValueError(f"source ume_flight_size {self.ume_flight_size}: at least 1 "
                             f"message")
        if self.ume_flight_size_bytes < 0:
            raise ValueError(f"source ume_flight_size_bytes {self.ume_flight_size_bytes}: "
                             f"0 (off) or more bytes")
        if self.ume_flight_size_behavior.lower() not in FLIGHT_SIZE_BEHAVIORS:
            raise ValueError(f"source ume_flight_size_behavior "
                             f"{self.ume_flight_size_behavior!r}: block or notify")
        self._check_quorum_consensus()
        self._check_proxy_source()

    def _check_proxy_source(self) -> None:
        """``ume_proxy_source`` 1 needs an explicit RegID for every store or a Session ID
        (guide "Enabling the Proxy Source Option", docs/semantics.md §1.11): the stores name
        the source by them when its proxy registers, and refuse the request otherwise; the
        reference refuses such a source here, in one line, rather than register it with a
        flag no store can honour."""
        if self.ume_proxy_source not in (0, 1):
            raise ValueError(f"source ume_proxy_source {self.ume_proxy_source}: 0 or 1")
        if self.ume_proxy_source and not self.ume_session_id \
                and any(spec.reg_id == 0 for spec in self.ume_store):
            raise ValueError("source ume_proxy_source 1 needs an explicit RegID for every "
                             "store (ume_store ...:RegID) or a ume_session_id")

    def _check_quorum_consensus(self) -> None:
        """Refuse, in one line, QC settings the source could not run with (the configuration
        file reader refuses them too, with the line): an unknown behaviour name, a group
        declared twice or with no store room (size 0), and - when ``ume_store_group`` declares
        groups - a store naming a group no ``ume_store_group`` declares (the guide's
        "GroupIDX" must name a configured group).  The names are kept canonical (aliases such
        as ``all-stores`` become ``all``, :mod:`reference_impl.quorum`).  Without
        ``ume_store_group`` each group index the stores name is a group of the stores naming
        it (the sizes are implicit)."""
        for option, canonical in (
                ("ume_retention_intragroup_stability_behavior", quorum.intragroup),
                ("ume_retention_intergroup_stability_behavior", quorum.intergroup),
                ("ume_consensus_sequence_number_behavior", quorum.consensus_behaviour)):
            try:
                object.__setattr__(self, option, canonical(getattr(self, option)))
            except ValueError as exc:
                raise ValueError(f"source {exc}") from None
        declared: dict[int, int] = {}
        for index, size in self.ume_store_group:
            if index in declared:
                raise ValueError(f"source ume_store_group {index}:{size}: group {index} is "
                                 f"declared twice")
            if size < 1:
                raise ValueError(f"source ume_store_group {index}:{size}: a group has at "
                                 f"least 1 store")
            declared[index] = size
        if declared:
            for number, spec in enumerate(self.ume_store):
                if spec.group not in declared:
                    where = spec.name or f"{spec.ip}:{spec.port}"
                    raise ValueError(
                        f"source ume_store {number} ({where}) names group {spec.group}, which "
                        f"no ume_store_group declares (groups: "
                        f"{', '.join(map(str, sorted(declared)))})")

    @property
    def rpp(self) -> bool:
        """The source asks for receiver-paced persistence (and its profile knows RPP)."""
        return self.rpp_supported and bool(self.ume_receiver_paced_persistence)

    @property
    def lbtru(self) -> bool:
        """The data transport is LBT-RU."""
        return TRANSPORTS[self.transport.lower()] == "lbt-ru"

    @property
    def lbtrm(self) -> bool:
        """The data transport is LBT-RM."""
        return TRANSPORTS[self.transport.lower()] == "lbt-rm"

    @property
    def transport_kind(self) -> str:
        """The data transport: "tcp", "lbt-ru" or "lbt-rm"."""
        return TRANSPORTS[self.transport.lower()]

    def lbtrm_settings(self, session_id: int) -> LbtrmSourceSettings:
        """The LBT-RM session options (seconds where the configuration says milliseconds)."""
        return LbtrmSourceSettings(
            session_id=session_id,
            transmission_window_size=self.transport_lbtrm_transmission_window_size,
            sm_minimum_interval=self.transport_lbtrm_sm_minimum_interval / 1000,
            sm_maximum_interval=self.transport_lbtrm_sm_maximum_interval / 1000,
            ignore_interval=self.transport_lbtrm_ignore_interval / 1000,
            data_rate_limit=self.transport_lbtrm_data_rate_limit,
            retransmit_rate_limit=self.transport_lbtrm_retransmit_rate_limit,
            rate_interval=self.transport_lbtrm_rate_interval / 1000)

    @property
    def datagram_max(self) -> int:
        """The largest datagram of the source's transport (its ``transport_*_datagram_max_
        size``): a message that does not fit goes out as fragments (:mod:`reference_impl.
        fragments`)."""
        if self.lbtru:
            return self.transport_lbtru_datagram_max_size
        if self.lbtrm:
            return self.transport_lbtrm_datagram_max_size
        return self.transport_tcp_datagram_max_size


TRANSPORTS = {"tcp": "tcp", "lbt-ru": "lbt-ru", "lbtru": "lbt-ru", "lbt-rm": "lbt-rm",
              "lbtrm": "lbt-rm"}
"""The ``transport`` values the source accepts, and what each means."""

FLIGHT_SIZE_BEHAVIORS = ("block", "notify")
"""``ume_flight_size_behavior`` values (docs/semantics.md §1.7), compared lower-case."""


def lbtru_session_id(ip: str, port: int, transport_idx: int) -> int:
    """The LBT-RU session ID of a source that configures none: a CRC-32 of its LBT-RU
    address and transport index, never 0 (0 would mean "no SID" on the wire).

    Why derived and not random: a restarted source on the same address gets the same ID, so
    its receivers' sessions (keyed by source address and SID) get its RST and reconnect at
    once instead of waiting for their activity timeout; two sources of one host differ by
    port."""
    return zlib.crc32(f"{ip}:{port}/{transport_idx}".encode()) or 1


def lbtrm_session_id(ip: str, port: int, transport_idx: int, now: float) -> int:
    """The LBT-RM session ID of a source: a CRC-32 of its unicast address, transport index
    and start time, never 0.

    Why the start time: LBT-RM has no reset, so a restarted source that reused its ID would
    look to receivers like the old session's continuation (lbtrm_session's module docstring);
    the time differs with each start, and in the simulator it is virtual, so a run stays a
    function of its seed."""
    return zlib.crc32(f"{ip}:{port}/{transport_idx}/{now!r}".encode()) or 1


def lbtrm_group(config: SourceConfig, port: int) -> str:
    """The multicast group of an LBT-RM source: ``transport_lbtrm_multicast_address`` when
    set, else one address of ``transport_lbtrm_multicast_address_low..high`` chosen by the
    source's unicast port (our choice: the product hands groups out from that range; sources
    of one host, which differ by port, spread over it)."""
    if config.transport_lbtrm_multicast_address:
        return config.transport_lbtrm_multicast_address
    low = int(ipaddress.IPv4Address(config.transport_lbtrm_multicast_address_low))
    high = int(ipaddress.IPv4Address(config.transport_lbtrm_multicast_address_high))
    if high < low:
        raise ValueError(f"source transport_lbtrm_multicast_address_low "
                         f"{config.transport_lbtrm_multicast_address_low} is above _high "
                         f"{config.transport_lbtrm_multicast_address_high}")
    return str(ipaddress.IPv4Address(low + port % (high - low + 1)))


UNRESOLVED: Addr = ("0.0.0.0", 0)
"""The address of a named store whose context name is not resolved yet."""

NAME_QUERY_INTERVAL = 1.0
"""Seconds between context-name queries while a named store is unresolved (the options list
has no such interval; one second is the pace of the source's own advertisements)."""

MAX_CONFIRMATION_EVENTS = 65536
"""At most this many confirmation events for one cumulative ACK (a receiver's first ACK
after a long recovery would otherwise name every message since 0)."""


JOIN_WAIT = 2.0
"""Seconds a source waits for a registered store to say it receives the transport."""

_ACK = ControlTemplate(UmeAck)
"""Stability ACKs and delivery confirmations arrive one per message: they are read through the
layout derived from ``UmeAck`` when they have the one shape stores and receivers send (see
:meth:`ControlTemplate.unpack`), and fully decoded otherwise."""
_ACK_TYPE = _ACK.index("type")
_ACK_SEQNUM = _ACK.index("seqnum")
_ACK_ID_2 = _ACK.index("id_2")
_ACK_RCV_REG_ID = _ACK.index("rcv_reg_id")
_ACK_EXPLICIT = _ACK.view("e_flag")
_ACK_HEAD = len(_ACK.head)
_ACK_RUN_TYPE, _ACK_RUN_SEQNUM = _ACK.full_index("type"), _ACK.full_index("seqnum")
_ACK_FLAGS, _ACK_RUN_FLAGS = _ACK.index("flags"), _ACK.full_index("flags")
_STABLE, _CDELV = int(AckType.STABLE), int(AckType.CDELV)
_DATA_PACK, _DATA_SIZE = DATA_BASE.codec.pack, DATA_BASE.size
_MESSAGE = int(MessageType.MESSAGE)
"""The data message base header, packed by :meth:`SourceCore._take_batch` in front of each
payload (what :func:`~reference_impl.fastmsg.data_message` makes of one message)."""

_STABLE_FLAGS = {(intragroup, intergroup, stable): StableFlags(
    StableFlags.STORE | (StableFlags.INTRAGROUP if intragroup else 0)
    | (StableFlags.INTERGROUP if intergroup else 0) | (StableFlags.STABLE if stable else 0))
    for intragroup in (False, True) for intergroup in (False, True) for stable in (False, True)}
"""Every flag combination of a :class:`MessageStable`, built once: combining ``IntFlag``
members on every ACK cost about as much as the rest of the stability bookkeeping."""


class SendErrorCode(StrEnum):
    NOT_REGISTERED = "not_registered"  # LBM_EUMENOREG
    WOULD_BLOCK = "would_block"  # LBM_EWOULDBLOCK because of the flight size
    TOO_BIG = "too_big"  # payload exceeds ume_flight_size_bytes
    DEREGISTERED = "deregistered"


class SendError(Exception):
    """A send the source refused; ``code`` says why (see :class:`SendErrorCode`)."""

    def __init__(self, code: SendErrorCode, text: str) -> None:
        super().__init__(text)
        self.code = code


@dataclass(eq=False)
class StoreLink:
    """The source's view of one configured store."""

    info: StoreInfo
    spec: StoreSpec
    reg_id: int
    registered: bool = False
    old: bool = False
    high_seqnum: int = 0
    rpp: bool = False
    last_heard: float = 0.0
    first_attempt: float | None = None
    unresponsive: bool = False
    version: int = 0
    failed: bool = False  # refused with an error: not retried
    next_attempt: float = 0.0
    joined: bool = False  # the store said on our transport that it receives us

    @property
    def resolved(self) -> bool:
        """The store's address is known (always, unless it is named and not resolved yet)."""
        return self.spec.name is None or self.info.addr != UNRESOLVED

    @property
    def label(self) -> str:
        """How log lines and events name the store: its address, or its name until resolved."""
        if not self.resolved:
            return str(self.spec.name)
        return f"{self.info.addr[0]}:{self.info.addr[1]}"


class Retained:
    """One message the source keeps for retransmission until its retention rules release it.

    Made once per message sent, so it is a plain slotted class: the stores that acknowledged
    it are a bitmask of store indexes (:attr:`stable_mask`; the group-rule memo is keyed by
    it) and the set of confirming receivers is only made by the first confirmation.
    """

    __slots__ = ("_confirmed", "first_sent", "inflight", "nack_mask", "payload", "sent_at",
                 "stable", "stable_mask")

    def __init__(self, payload: bytes, now: float) -> None:
        self.payload = payload
        self.first_sent = self.sent_at = now
        self.stable_mask = 0  # bit i: store index i acknowledged it
        self.nack_mask = 0  # bit i: store index i NACKed it (declared it lost)
        self.stable = False
        self.inflight = True
        self._confirmed: set[int] | None = None

    @property
    def stable_at(self) -> frozenset[int]:
        """Indexes of the stores that acknowledged the message."""
        return _indexes(self.stable_mask)

    @property
    def confirmed_by(self) -> frozenset[int]:
        """RegIDs of the receivers that confirmed delivery of the message."""
        return frozenset(self._confirmed or ())

    def confirm(self, receiver: int) -> int:
        """Count ``receiver``'s confirmation; returns how many distinct receivers confirmed."""
        confirmed = self._confirmed
        if confirmed is None:
            confirmed = self._confirmed = set()
        confirmed.add(receiver)
        return len(confirmed)

    @property
    def confirmations(self) -> int:
        return len(self._confirmed) if self._confirmed is not None else 0


class FragmentedRetained(Retained):
    """A message sent as fragments (:mod:`reference_impl.fragments`), kept under its first
    fragment's sequence number: it counts once against the flight size (guide "UMP Flight
    Size": "per message basis, not a per fragment basis"; the byte limit counts its payload
    once) and is stable when every fragment is stable under the group rules.  ``masks[i]``
    says which stores acknowledged fragment ``i``; :attr:`stable_mask` is what every fragment
    has (a store missing any fragment gets the missing ones proactively)."""

    __slots__ = ("count", "first", "fragment_stable", "masks", "piece", "stable_count")

    def __init__(self, payload: bytes, now: float, first: int, piece: int) -> None:
        super().__init__(payload, now)
        self.first, self.piece = first, piece
        self.count = fragments.fragment_count(len(payload), piece)
        self.masks = [0] * self.count
        self.fragment_stable = [False] * self.count
        self.stable_count = 0

    @property
    def last(self) -> int:
        """The last fragment's sequence number."""
        return (self.first + self.count - 1) & 0xFFFFFFFF

    def sqns(self) -> list[int]:
        """Every fragment's sequence number, in order."""
        return [(self.first + i) & 0xFFFFFFFF for i in range(self.count)]


def _indexes(mask: int) -> frozenset[int]:
    """The bit positions set in ``mask``: store indexes from a :attr:`Retained.stable_mask`."""
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


class SourceCore(ContextCore):
    """A persistent source for one topic (see the module docstring).

    Args:
        topic: the topic name.
        config: its options.
        ip: the address it binds.
        transport_port: its LBT-TCP transport listener (receivers and stores connect here).
        lbtru_port: its LBT-RU UDP port, used when ``config.transport`` is LBT-RU.
        lbtrm_port: its LBT-RM unicast UDP port, used when ``config.transport`` is LBT-RM (the
            group is :func:`lbtrm_group`'s).
        request_port: its request listener (SRI requests and delivery confirmations).
        lbmr_port, resolver: topic resolution.
        topic_idx, transport_idx: the indexes it advertises.
        now: the time it starts.
    """

    component = "source"

    def __init__(self, topic: str, config: SourceConfig, *, ip: str, transport_port: int,
                 request_port: int, lbmr_port: int = 0, resolver: Addr | None = None,
                 topic_idx: int = 1, transport_idx: int = 1, now: float = 0.0,
                 lbtru_port: int = 0, lbtrm_port: int = 0) -> None:
        super().__init__(topic, ip, lbmr_port=lbmr_port, resolver=resolver)
        self.topic = topic
        self.config = config
        self.now = now
        self.transport_addr: Addr = (ip, transport_port)
        self.lbtru_session: LbtruSourceSession | None = None
        if config.lbtru:
            if not lbtru_port:
                raise ValueError("an LBT-RU source needs a UDP port (lbtru_port)")
            sid = config.transport_lbtru_session_id or \
                lbtru_session_id(ip, lbtru_port, transport_idx)
            self.transport_addr = (ip, lbtru_port)
            settings = LbtruSourceSettings(
                session_id=sid,
                transmission_window_size=config.transport_lbtru_transmission_window_size)
            session = self.open_lbtru_source(lbtru_port, settings).session
            assert isinstance(session, LbtruSourceSession)
            self.lbtru_session = session
        self.lbtrm_session: LbtrmSourceSession | None = None
        if config.lbtrm:
            if not lbtrm_port:
                raise ValueError("an LBT-RM source needs a UDP port (lbtrm_port)")
            self.transport_addr = (ip, lbtrm_port)
            group = (lbtrm_group(config, lbtrm_port), config.transport_lbtrm_destination_port)
            rm = self.open_lbtrm_source(lbtrm_port, group, config.lbtrm_settings(
                lbtrm_session_id(ip, lbtrm_port, transport_idx, now))).session
            assert isinstance(rm, LbtrmSourceSession)
            self.lbtrm_session = rm
        # the datagram transport's session, if the transport is one (LBT-RU or LBT-RM)
        self._udp_session: LbtruSourceSession | LbtrmSourceSession | None = \
            self.lbtru_session or self.lbtrm_session
        self.request_addr: Addr = (ip, request_port)
        self.topic_idx, self.transport_idx = topic_idx, transport_idx
        self.now = now
        self.started = now
        self.links = [StoreLink(StoreInfo(i, s.group, (s.ip, s.port)), s, s.reg_id)
                      for i, s in enumerate(config.ume_store)]
        self._persistent = bool(self.links)  # the configured stores never change
        groups = dict(config.ume_store_group)
        for link in self.links:
            groups.setdefault(link.info.group,
                              sum(1 for x in self.links if x.info.group == link.info.group))
        self.group_sizes: dict[int, int] = groups
        self.complete = False
        self.next_sqn = 0
        self.sri_version = 0
        self._sri_left = 0
        self.retained: OrderedDict[int, Retained] = OrderedDict()
        self.retained_bytes = 0
        self.streaming_retained: OrderedDict[int, bytes] = OrderedDict()  # see _keep_streaming
        self._streaming_bytes = 0
        self.inflight = 0
        self.inflight_bytes = 0
        self._over = False
        self._transport_conns: list[Connection] = []
        self._confirmed: dict[int, int] = {}  # receiver RegID -> highest confirmed
        self.deregistering = False
        self.deregistered = False
        self._leaving: set[int] = set()  # stores (index) we owe a deregistration until it is done
        self._joined_ids: set[int] = set()
        # (bitmask of the stores that acknowledged, the acknowledging store's group) -> what
        # :meth:`_stability` says: the rules are evaluated once per combination of stores
        # instead of once per ACK; only when they do not depend on which stores are registered
        # now (the all-active behaviours do)
        behaviours = (config.ume_retention_intragroup_stability_behavior.lower(),
                      config.ume_retention_intergroup_stability_behavior.lower())
        self._stability_memo: dict[tuple[int, int], tuple[bool, StableFlags, StableFlags]] \
            | None = None if "all-active" in behaviours else {}
        self.stats.update(sent=0, proactive_retransmissions=0, stable=0, fragments=0)
        # fragmentation: a payload longer than _whole goes out in _piece-byte fragments, and
        # each fragment's sequence number names its message here while it is retained
        kind = config.transport_kind
        self._piece = fragments.piece_size(kind, config.datagram_max)
        self._whole = fragments.whole_size(kind, config.datagram_max)
        self._fragment_of: dict[int, FragmentedRetained] = {}
        # the RPP overrides every registration carries (fixed: a re-registration must
        # present the same values, docs/semantics.md §2.1)
        self._rpp_options = rpp.source_options(config) if config.rpp else []
        for link in self.links:
            if link.resolved:
                self._register(link)
            else:
                link.first_attempt = now
        if not all(link.resolved for link in self.links):
            self.set_timer("names", now)  # "Source queries for and resolves store name"
        self.set_timer("check", now + config.ume_store_check_interval / 1000)
        self.set_timer("advertise", now)

    # --- application API ---------------------------------------------------------------------

    @property
    def persistent(self) -> bool:
        return self._persistent

    def _at(self, now: float | None) -> None:
        """Move the core's clock to ``now`` when the application tells it the time of a send.

        Why: the core otherwise knows only the time of its last event, and a send between
        events would date the message (its stability timeout and lifetime) and arm the
        transport's session-message timer from that stale time."""
        if now is not None and now > self.now:
            self.now = now

    def send(self, payload: bytes, now: float | None = None) -> int:
        """Send one message now; returns its sequence number or raises :class:`SendError`.

        ``now``: the current time, when the caller knows it (see :meth:`_at`)."""
        self._at(now)
        sqn, raw = self._take(payload)
        if self._udp_session is not None:
            self._lbtru_send(raw)
            return sqn
        for conn in self._transport_conns:
            self.write(conn, raw)
        return sqn

    def try_send(self, payload: bytes, now: float | None = None) -> int | SendError:
        """:meth:`send` for a non-blocking application (the product's non-blocking send,
        docs/semantics.md §1.7): the message's sequence number, or the refusal as a value,
        never raised.  With ``ume_flight_size_behavior`` block and a full flight that is
        :attr:`SendErrorCode.WOULD_BLOCK` ("would block"): the message is not sent, numbered,
        retained or counted, and the same call succeeds once stability ACKs (or NACKs) bring
        the flight back under its size; with notify the send succeeds and the source raises
        :class:`~reference_impl.events.FlightSizeNotification`.

        Why a value: the core has no blocking send of its own (a blocking application waits
        for :meth:`can_send`, as :func:`reference_impl.runtime.send_messages` does), and a
        non-blocking one tests every send's result anyway."""
        try:
            return self.send(payload, now)
        except SendError as refusal:
            return refusal

    def send_many(self, payloads: Iterable[bytes], now: float | None = None) -> int:
        """Send payloads in order, as :meth:`send` would one by one, until one is refused;
        returns how many messages were sent (their sequence numbers consecutive from
        :attr:`next_sqn` at the call; a fragmented message takes one per fragment).  The
        refusal is raised only when the first payload is refused, as ``socket.send`` reports
        a partial send.

        Why: the messages go out as one stream write, where :meth:`send` costs a write command
        (and on real sockets, unless the host merges them, a system call) per message.  Taking
        a message queues no stream command, so the bytes on the wire are the same.
        ``now`` as for :meth:`send`.
        """
        self._at(now)
        first = self.next_sqn
        taken = self.stats["sent"]  # messages, not sequence numbers: a long one takes several
        parts: list[bytes] = []
        session = self._udp_session
        if session is not None:  # one datagram per message: nothing to batch
            try:
                for payload in payloads:
                    self._lbtru_send(self._take(payload)[1])
            except SendError:
                if self.next_sqn == first:
                    raise
            return self.stats["sent"] - taken
        try:
            if self._batch_ready():
                self._take_batch(payloads, parts)
            else:
                for payload in payloads:
                    parts.append(self._take(payload)[1])
        except SendError:
            if not parts:
                raise
        finally:
            if parts:
                data = b"".join(parts)
                for conn in self._transport_conns:
                    self.write(conn, data)
        return self.stats["sent"] - taken

    def _batch_ready(self) -> bool:
        """The state in which :meth:`_take_batch` may stand in for :meth:`_take`: a registered
        persistent source, no byte flight size (the common configuration)."""
        return self._persistent and self.complete and not self.deregistered \
            and not self.deregistering and not self.config.ume_flight_size_bytes

    def _take_batch(self, payloads: Iterable[bytes], parts: list[bytes]) -> None:
        """:meth:`_take` for each payload, appending header and payload to ``parts``, in the
        state :meth:`_batch_ready` describes, which a take cannot leave (the events it emits
        reach the application only after the call).

        The same checks, state changes and events in the same order, with what :meth:`_take`
        looks up per message looked up once: this is the loop behind every message of the
        store benchmark.  ``tests/reference_impl/test_source_fastpath.py`` compares both.
        """
        cfg = self.config
        block = cfg.ume_flight_size_behavior.lower() == "block"
        flight = cfg.ume_flight_size
        limit = cfg.retransmit_retention_size_limit
        retained = self.retained
        stats = self.stats
        now = self.now
        pack, base, tidx = _DATA_PACK, _DATA_SIZE, self.topic_idx
        add = parts.append
        whole = self._whole
        for payload in payloads:
            size = len(payload)
            if block and self.inflight >= flight:  # one more message would exceed it
                raise SendError(SendErrorCode.WOULD_BLOCK,
                                "send would block because of flight size")
            if size > whole:  # fragments: the rare long message, checked as send does
                add(self._take_fragmented(payload)[1])
                continue
            sqn = self.next_sqn
            self.next_sqn = (sqn + 1) & 0xFFFFFFFF
            add(pack(_MESSAGE, NHDR_DATA, base + size, tidx, sqn))
            add(payload)
            stats["sent"] += 1
            retained[sqn] = Retained(payload, now)
            self.retained_bytes += size
            inflight = self.inflight = self.inflight + 1
            self.inflight_bytes += size
            if inflight > flight and not self._over:
                self._over = True
                self._events.append(FlightSizeNotification(FlightState.OVER, inflight))
            if inflight != len(retained) or self.retained_bytes > limit:
                self._apply_retention()  # something landed, or over the limit

    def _take(self, payload: bytes) -> tuple[int, bytes]:
        """Check, number and retain one message; returns its sequence number and bytes, which
        the caller writes to every transport connection."""
        # the hot path of every application: checks in the documented order, nothing twice
        cfg = self.config
        if self.deregistered or self.deregistering:
            raise SendError(SendErrorCode.DEREGISTERED,
                            "the source deregistered from its stores and cannot send any more "
                            "(guide \"RPP Deregistration\"); create it again to register anew")
        persistent = self._persistent
        if persistent and not self.complete:
            raise SendError(SendErrorCode.NOT_REGISTERED,
                            "Not currently registered with enough UME stores")
        size = len(payload)
        if cfg.ume_flight_size_bytes and size > cfg.ume_flight_size_bytes:
            raise SendError(SendErrorCode.TOO_BIG, "Payload exceeds flight size bytes maximum")
        if persistent and self._flight_would_exceed(size) \
                and cfg.ume_flight_size_behavior.lower() == "block":
            raise SendError(SendErrorCode.WOULD_BLOCK, "send would block because of flight size")
        if size > self._whole:
            return self._take_fragmented(payload)
        sqn = self.next_sqn
        self.next_sqn = (sqn + 1) & 0xFFFFFFFF
        raw = data_message(self.topic_idx, sqn, payload)
        self.stats["sent"] += 1
        if persistent:
            now = self.now
            self.retained[sqn] = Retained(payload, now)
            self.retained_bytes += size
            self.inflight += 1
            self.inflight_bytes += size
            if not self._over and self._flight_exceeded():
                self._over = True
                self.emit(FlightSizeNotification(FlightState.OVER, self.inflight))
            self._apply_retention()
        elif cfg.late_join:
            self._keep_streaming(sqn, payload)
        return sqn, raw

    def _keep_streaming(self, sqn: int, payload: bytes) -> None:
        """A streaming source with ``late_join`` keeps its newest messages, up to
        ``retransmit_retention_size_limit`` payload bytes (at least the newest), for the
        receivers' off-transport recovery requests (docs/semantics.md §1.9: "streaming: the
        source's retention"; :meth:`_on_otr_request`).  *Choice*: the threshold and age
        options are not applied; fragmented messages are not kept."""
        kept = self.streaming_retained
        kept[sqn] = payload
        self._streaming_bytes += len(payload)
        limit = self.config.retransmit_retention_size_limit
        while self._streaming_bytes > limit and len(kept) > 1:
            _, old = kept.popitem(last=False)
            self._streaming_bytes -= len(old)

    def _on_otr_request(self, conn: Connection, rx: Header, size: int) -> None:
        """A receiver's retransmission request on the request port (its off-transport
        recovery of a streaming source): the message from the retention buffer, as a
        retransmission on the same connection; a number not kept (never sent, aged out or
        released) is logged and dropped.  The request's transport index is not checked: a
        streaming TIR does not give it (its receivers send 0), and a source core's request
        port serves one topic.  A persistent source (late join forced on: docs/semantics.md
        §1.0) answers from its persistence retention: a store with ``use_otr`` 1 asks it so
        (§1.9); *choice*: a fragment of a fragmented message is not answered this way."""
        payload = self.streaming_retained.get(rx.seqnum)
        kept = self.retained.get(rx.seqnum) if payload is None else None
        if type(kept) is Retained:
            payload = kept.payload
        if payload is None:
            self.drop(conn.remote, f"retransmission request for sqn {rx.seqnum}: not in the "
                                   f"retention buffer", size)
            return
        self.stats["otr_retransmissions"] = self.stats.get("otr_retransmissions", 0) + 1
        self.write(conn, data_message(self.topic_idx, rx.seqnum, payload,
                                      int(MessageType.RETRANS)))

    def _flight_exceeded(self) -> bool:
        """Whether what is in flight now is over either limit (guide "UMP Flight Size":
        either limit exceeded triggers the behaviour; the byte limit counts payload only)."""
        cfg = self.config
        return self.inflight > cfg.ume_flight_size or (
            bool(cfg.ume_flight_size_bytes)
            and self.inflight_bytes > cfg.ume_flight_size_bytes)

    def _flight_would_exceed(self, size: int) -> bool:
        """Whether one more message of ``size`` payload bytes would exceed either limit.

        The message counts once whatever its length: an empty payload is a message too (it
        was not counted, so a flight size of N let N + 1 empty messages fly)."""
        cfg = self.config
        return self.inflight >= cfg.ume_flight_size or (
            bool(cfg.ume_flight_size_bytes)
            and self.inflight_bytes + size > cfg.ume_flight_size_bytes)

    def can_send(self) -> bool:
        """True when :meth:`send` of a small message would succeed now."""
        if self.deregistered or self.deregistering:
            return False
        if not self.persistent:
            return True
        return self.complete and not self._flight_would_exceed(1)

    def deregister(self) -> None:
        """Deregister from every store (``lbm_src_ume_deregister``).

        The guide ("RPP Deregistration"): the source is blocked after deregistering and must
        be re-created to register again.  So from here on nothing re-registers: sends fail
        with ``deregistered`` and the store checks only repeat the deregistration to a store
        that has not confirmed it yet (every ``ume_registration_interval``).  With no store
        registered there is nothing to wait for: deregistered at once."""
        if self.deregistered:
            return
        self.deregistering = True
        for link in self.links:
            self._leaving.add(link.info.index)  # (one not registered yet: if it answers)
            if link.registered:
                self._send_deregistration(link)
        if not any(link.registered for link in self.links):
            self.deregistering, self.deregistered = False, True
            self.emit(SourceDeregistered(None))

    def _send_deregistration(self, link: StoreLink) -> None:
        link.next_attempt = self.now + self.config.ume_registration_interval / 1000
        self.send_to(link.info.addr, control(self._preg(link, deregister=True)))

    # --- registration -------------------------------------------------------------------------

    def _preg(self, link: StoreLink, deregister: bool = False) -> Header:
        """The PREG for ``link``; an RPP source sets the RPP flag in every one (its
        deregistrations too: the flag says what the source is, and a pre-5.3 source never
        sets it)."""
        return UmePreg(s_flag=1, marker=0, d_flag=int(deregister),
                       w_flag=int(self.config.rpp),
                       reg_id=link.reg_id, transport_idx=self.transport_idx,
                       topic_idx=self.topic_idx, resp_port=self.request_addr[1],
                       resp_ip=self.request_addr[0])

    def _register(self, link: StoreLink) -> None:
        cfg = self.config
        headers: list[object] = [self._preg(link), Topicname(topic=self.topic),
                                 UmeCapability(qc_flag=1, client_lifetime_flag=1)]
        if cfg.ume_session_id:
            headers.append(UmeSid(sid=cfg.ume_session_id))
        if cfg.ume_proxy_source:  # "proxy source" companion header (docs/wire-lbmc.md §2.1)
            headers.append(UmeProxySrc(enable=1))
        if cfg.ume_activity_timeout or cfg.ume_state_lifetime:
            headers.append(UmeClientLifetime(activity_tmo=cfg.ume_activity_timeout,
                                             lifetime=cfg.ume_state_lifetime))
        if cfg.rpp:  # its overrides, in every registration and re-registration alike
            headers.extend(option.header() for option in self._rpp_options)
        if link.first_attempt is None:
            link.first_attempt = self.now
        link.next_attempt = self.now + cfg.ume_registration_interval / 1000
        self.send_to(link.info.addr, control(*headers), tag=link)

    def _link_for(self, conn: Connection) -> StoreLink | None:
        tag = conn.tag
        return tag if isinstance(tag, StoreLink) else None

    def on_message_run(self, conn: Connection, data: bytes) -> int:
        # the hottest path: a store's stability ACKs, one per message, back to back in a
        # chunk; read in place, as on_raw_message reads each (its first branch)
        link = conn.tag
        if not (conn.outgoing and isinstance(link, StoreLink)):
            return 0
        unpack_from, size, head = _ACK.unpack_from, _ACK.size, _ACK.head
        on_stable = self._on_stable
        pos, end = 0, len(data)
        while end - pos >= size:
            values = unpack_from(data, pos)
            if values[:_ACK_HEAD] != head:
                break
            pos += size
            if values[_ACK_RUN_TYPE] == _STABLE:
                if values[_ACK_RUN_FLAGS] & ACK_NAK:
                    self._on_nack(link, values[_ACK_RUN_SEQNUM], size)
                else:
                    on_stable(link, values[_ACK_RUN_SEQNUM])
        if pos:
            link.last_heard = self.now
        return pos

    def on_raw_message(self, conn: Connection, raw: bytes) -> None:
        # the hot path: one ACK per message from every store (and receiver, with delivery
        # confirmation); exactly what on_message does with the decoded header
        values = _ACK.unpack(raw)
        if values is not None:
            link = conn.tag if conn.outgoing else None
            if isinstance(link, StoreLink):
                link.last_heard = self.now
                if values[_ACK_TYPE] == _STABLE:
                    if values[_ACK_FLAGS] & ACK_NAK:
                        self._on_nack(link, values[_ACK_SEQNUM], len(raw))
                    else:
                        self._on_stable(link, values[_ACK_SEQNUM])
                return
            if values[_ACK_TYPE] == _CDELV:
                position, bit = _ACK_EXPLICIT
                self._on_confirmation(values[_ACK_RCV_REG_ID] or values[_ACK_ID_2],
                                      values[_ACK_SEQNUM], bool(bit.get(values[position])))
                return
        super().on_raw_message(conn, raw)

    def on_message(self, conn: Connection, message: LbmcMessage, raw: bytes) -> None:
        link = self._link_for(conn) if conn.outgoing else None
        if link is not None:
            link.last_heard = self.now
            for header in message.headers:
                if isinstance(header, UmePregResp):
                    self._on_preg_resp(link, header)
                elif isinstance(header, UmeAck) and header.type == AckType.STABLE:
                    if header.flags & ACK_NAK:
                        self._on_nack(link, header.seqnum, len(raw))
                    else:
                        self._on_stable(link, header.seqnum)
                elif isinstance(header, UmeKeepalive) and header.r_flag:
                    self._keepalive(link)
            return
        handled = False
        for header in message.headers:
            if isinstance(header, UmeKeepalive) and header.type == KeepaliveType.STORE:
                handled = True
                self._store_joined(header.reg_id)
            elif isinstance(header, SriReq):
                handled = True
                if header.topic_idx == self.topic_idx and self.complete:
                    self._send_sri()
            elif isinstance(header, UmeAck) and header.type == AckType.CDELV:
                handled = True
                self._on_confirmation(header.rcv_reg_id or header.id_2, header.seqnum,
                                      bool(header.e_flag))
            elif isinstance(header, UmeRxreq):
                handled = True
                self._on_otr_request(conn, header, len(raw))
        if not handled:
            self.drop(conn.remote, f"unexpected message on the source ({message.label()})",
                      len(raw))

    def _store_joined(self, reg_id: int) -> None:
        self._joined_ids.add(reg_id)
        for link in self.links:
            if link.registered and link.reg_id == reg_id and not link.joined:
                link.joined = True
                self._check_complete()

    def _keepalive(self, link: StoreLink) -> None:
        self.send_to(link.info.addr, control(UmeKeepalive(
            type=KeepaliveType.SOURCE, transport_idx=self.transport_idx,
            topic_idx=self.topic_idx, reg_id=link.reg_id)))

    def _on_preg_resp(self, link: StoreLink, resp: Header) -> None:
        if resp.d_flag and not resp.e_flag:
            link.registered = False
            self.emit(SourceDeregistered(link.info))
            if not any(x.registered for x in self.links):
                self.deregistered = True
                self.deregistering = False
                self.emit(SourceDeregistered(None))
            return
        if resp.e_flag:
            code = resp.error_code
            # "RegID in use" passes once the holder's activity timeout at the store ran out
            # (strong RegIDs: a restarted source that cannot prove it is the holder must
            # wait for that), so that one is retried every ume_registration_interval; every
            # other refusal is final
            link.failed = code != PregError.EACTIVE
            text = _PREG_ERRORS.get(code, f"error code {code}")
            about_rpp = self.config.rpp and code == PregError.ECONFIG
            if about_rpp:
                text = f"RPP Source Registration Failure: {text} ({RPP_REFUSAL})"
            self.emit(SourceRegistrationError(link.info, code, text, rpp=about_rpp))
            self.log(Level.ERROR, f"store {link.info.index} refused registration: {text}")
            return
        if link.registered and link.reg_id == resp.reg_id:
            return  # a duplicate answer to a retried PREG
        link.registered, link.unresponsive = True, False
        link.reg_id, link.old = resp.reg_id, bool(resp.o_flag)
        link.high_seqnum = resp.high_seqnum
        # a pre-5.3 source does not know the flag: whatever the bit says, it is not read
        link.rpp = self.config.rpp_supported and bool(resp.w_flag)
        if self.config.rpp and not link.rpp:
            self._rpp_not_acknowledged(link)
        link.version += 1
        link.joined = resp.reg_id in self._joined_ids
        if not link.joined:
            self.set_timer(f"join {link.info.index}", self.now + JOIN_WAIT)
        self.emit(SourceRegistrationSuccess(link.info, resp.reg_id, link.old,
                                            resp.high_seqnum if link.old else 0, link.rpp))
        if self.complete:
            # a store came back: bump the SRI versions and tell receivers (semantics §1.3)
            self._advertise()
            self._start_sri()
            self._resend_unstable(link)
            return
        self._check_complete()

    def _rpp_not_acknowledged(self, link: StoreLink) -> None:
        """The matrix's "Granted - Source Error" (docs/semantics.md §2.1): the store granted
        without acknowledging RPP.  *Choice*: the registration is kept and counted (the store
        granted it and holds state for us; the guide calls the cell "Granted"), and the
        application is told, once per registration, with an event and an ERROR line."""
        text = (f"Granted - Source Error: store {link.info.index} [{link.label}] granted the "
                f"RPP registration without acknowledging RPP (its repository is not "
                f"receiver-paced; a store before 5.3?)")
        self.emit(RppNotAcknowledged("source", link.info, text))
        self.log(Level.ERROR, text)

    # --- the group rules (reference_impl/quorum.py; docs/semantics.md §1.2) --------------------

    def _counts(self, members: Iterable[int]) -> dict[int, int]:
        """How many of the stores ``members`` (indexes) each group has."""
        counts: dict[int, int] = {}
        links = self.links
        for index in members:
            group = links[index].info.group
            counts[group] = counts.get(group, 0) + 1
        return counts

    def _active_groups(self) -> set[int]:
        """The groups with a quorum of their stores registered now (the intergroup rule
        ``all-active``'s *active* groups)."""
        counts = self._counts(self._registered_set())
        return {g for g, size in self.group_sizes.items()
                if counts.get(g, 0) >= quorum.quorum(size)}

    def _groups_ok(self, members: set[int]) -> tuple[bool, set[int]]:
        """The registration rule: whether the stores ``members`` (registered) complete the
        source's registration by the intragroup and intergroup behaviours, and which groups
        count as registered.  A group is *active* for ``all-active`` when a quorum of it is
        among ``members``."""
        cfg = self.config
        intra = cfg.ume_retention_intragroup_stability_behavior
        counts = self._counts(members)
        ok = {g for g, size in self.group_sizes.items()
              if quorum.group_registered(intra, size, counts.get(g, 0))}
        active = {g for g, size in self.group_sizes.items()
                  if counts.get(g, 0) >= quorum.quorum(size)}
        return quorum.groups_meet(cfg.ume_retention_intergroup_stability_behavior,
                                  len(self.group_sizes), ok, active), ok

    def _stable_groups(self, acked: set[int]) -> tuple[bool, set[int]]:
        """The stability rule: whether a message the stores ``acked`` (indexes) hold is
        stable by the intragroup and intergroup behaviours, and the groups it is stable in.
        ``all-active`` (either) looks at which stores are registered now."""
        cfg = self.config
        intra = cfg.ume_retention_intragroup_stability_behavior
        inter = cfg.ume_retention_intergroup_stability_behavior
        counts = self._counts(acked)
        waiting: dict[int, int] = {}
        if intra == "all-active":
            waiting = self._counts(i for i in self._registered_set() if i not in acked)
        ok = {g for g, size in self.group_sizes.items()
              if quorum.group_stable(intra, size, counts.get(g, 0), waiting.get(g, 0))}
        active = self._active_groups() if inter == "all-active" else set()
        return quorum.groups_meet(inter, len(self.group_sizes), ok, active), ok

    def _registered_set(self) -> set[int]:
        return {x.info.index for x in self.links if x.registered}

    def _check_complete(self) -> None:
        if self.complete or not self.links:
            return
        registered = {x.info.index for x in self.links if x.registered and x.joined}
        ok, _ = self._groups_ok(registered)
        if not ok:
            return
        everyone = len(registered) == len([x for x in self.links if not x.failed])
        # compared with the very deadline the timer is armed at: ``now - started >= interval``
        # can be false at that deadline by float rounding (started 1.1, interval 3 s), which
        # re-armed the same past deadline for ever
        deadline = self.started + self.config.ume_registration_interval / 1000
        if not everyone and self.now < deadline:
            self.set_timer("complete", deadline)
            return
        old: dict[int, list[int]] = {}  # group -> the high sequence numbers of its OLD stores
        for x in self.links:
            if x.registered and x.old:
                old.setdefault(x.info.group, []).append(x.high_seqnum)
        if old and not self.stats["sent"]:
            self.next_sqn = (_consensus(old, self.config.ume_consensus_sequence_number_behavior)
                             + 1) & 0xFFFFFFFF
        self.complete = True
        self.sri_version += 1
        self.emit(SourceRegistrationComplete(self.next_sqn, quorum=True))
        self.log(Level.INFO, f"registration complete, next sequence number {self.next_sqn}")
        self._advertise()
        self._start_sri()
        # quorum regained: what is still in flight goes to the stores that came back now
        # (docs/semantics.md §1.12), not after ume_message_stability_timeout
        if self.retained:
            for link in self.links:
                if link.registered:
                    self._resend_unstable(link)

    # --- SRI ----------------------------------------------------------------------------------

    def _start_sri(self) -> None:
        self.sri_version += 1
        self._sri_left = self.config.ume_sri_max_number_of_sri_per_update
        self._send_sri()
        self._sri_left -= 1
        if self._sri_left > 0:
            self.set_timer("sri", self.now + self.config.ume_sri_inter_sri_interval / 1000)

    def _sri_bytes(self) -> bytes:
        cfg = self.config
        low = next(iter(self.retained)) if self.retained else self.next_sqn
        high = (self.next_sqn - 1) & 0xFFFFFFFF if self.stats["sent"] else 0
        headers: list[object] = [
            Sri(version=self.sri_version, low_sqn=low, high_sqn=high,
                initial_sqn_known=1,
                acktosrc=int(bool(cfg.ume_confirmed_delivery_notification
                                  or cfg.ume_retention_unique_confirmations))),
            TopicIdx(tidx=self.topic_idx)]
        for group, size in sorted(self.group_sizes.items()):
            headers.append(UmeStoreGroup(grp_idx=group, grp_sz=size))
        for link in self.links:
            if link.registered:
                headers.append(UmeStoreExt(
                    grp_idx=link.info.group, store_tcp_port=link.info.addr[1],
                    store_idx=link.info.index, store_ip_addr=link.info.addr[0],
                    src_reg_id=link.reg_id, domain_id=link.spec.domain_id,
                    version=link.version))
        return control(*headers)

    def _send_sri(self) -> None:
        raw = self._sri_bytes()
        if self._udp_session is not None:
            self._udp_session.send(raw, self.now)
            return
        for conn in self._transport_conns:
            self.write(conn, raw)

    # --- topic resolution ---------------------------------------------------------------------

    def _tir(self) -> lbmr.Tir:
        first = next((x for x in self.links if x.registered), self.links[0] if self.links else None)
        options: list[lbmr.Record] = []
        if first is not None:
            options.append(lbmr.ToptUme(
                store=1, latejoin=1, qccap=1,
                acktosrc=int(bool(self.config.ume_confirmed_delivery_notification)),
                store_tcp_port=first.info.addr[1], store_tcp_addr=first.info.addr[0],
                src_tcp_port=self.request_addr[1], src_tcp_addr=self.request_addr[0],
                src_reg_id=first.reg_id, transport_idx=self.transport_idx,
                high_seqnum=max(self.next_sqn - 1, 0), low_seqnum=0))
            for link in self.links:
                if not link.resolved:
                    continue  # no address to give yet
                options.append(lbmr.ToptUmeStore(
                    grp_idx=link.info.group, store_tcp_port=link.info.addr[1],
                    store_idx=link.info.index, store_ip_addr=link.info.addr[0],
                    src_reg_id=link.reg_id))
            for group, size in sorted(self.group_sizes.items()):
                options.append(lbmr.ToptUmeStoreGroup(grp_idx=group, grp_sz=size))
        options.append(lbmr.ToptExfunc(src_tcp_port=self.request_addr[1],
                                       src_ip_addr=self.request_addr[0],
                                       ume=int(first is not None), lj=1))
        info: lbmr.Record = lbmr.TcpInfo(ip=self.transport_addr[0],
                                         port=self.transport_addr[1])
        if self.lbtru_session is not None:  # the 10-byte form: receivers need the SID
            info = lbmr.LbtruSidInfo(ip=self.transport_addr[0],
                                     session_id=self.lbtru_session.session_id,
                                     port=self.transport_addr[1])
        rm = self.lbtrm_session
        if rm is not None:  # 16 bytes: group and port, session ID, the unicast (NAK) port
            info = lbmr.LbtrmInfo(src_addr=self.transport_addr[0], mcast_addr=rm.group[0],
                                  session_id=rm.session_id, udp_dest_port=rm.group[1],
                                  src_ucast_port=rm.ucast_port)
        return lbmr.Tir(name=self.topic, ttl=1, index=self.topic_idx, info=info,
                        options=options)

    def _advertise(self) -> None:
        self.send_lbmr(lbmr.LbmrPacket(tirs=[self._tir()]))

    def on_lbmr(self, packet: lbmr.LbmrPacket, addr: Addr) -> None:
        if any(getattr(q, "name", None) == self.topic for q in packet.tqrs):
            self._advertise()
        ext = packet.ext
        if isinstance(ext, lbmr.CtxInfo) and not ext.query and ext.name_flag and ext.ip_flag:
            for link in self.links:
                if link.spec.name is not None and link.spec.name == ext.name:
                    self._name_resolved(link, (ext.ip, ext.port))

    # --- named stores (ume_store_name) ---------------------------------------------------------

    def _query_names(self) -> None:
        """Ask for the context-name advertisement of every named store not resolved yet."""
        for link in self.links:
            if not link.resolved:
                self.send_lbmr(lbmr.LbmrPacket(type=lbmr.PacketType.EXT, ext=lbmr.CtxInfo(
                    hop_count=0, query=1, name_flag=1, port=0, ip=UNRESOLVED[0],
                    instance=bytes(8), name=link.spec.name)))

    def _name_resolved(self, link: StoreLink, addr: Addr) -> None:
        """A store advertised the context name of ``link``: register with it there, and when it
        moved (a new advertisement with another address), tell the application and register at
        the new address (guide: "Sources using named stores issue an information message to
        the application every time a resolved context name changes")."""
        if addr == link.info.addr:
            return
        was = link.label if link.resolved else None
        if link.registered or link.resolved:
            conn = self.connection_to(link.info.addr)
            if conn is not None:
                self.close_connection(conn)
        link.info = StoreInfo(link.info.index, link.info.group, addr)
        link.registered = link.joined = link.unresponsive = False
        link.failed = False
        self.log(Level.INFO, f"store {link.info.index} name {link.spec.name} resolved to "
                             f"{link.spec.domain_id}:{addr[0]}:{addr[1]}"
                             + (f" (was {was})" if was else ""))
        if self.complete and not self._groups_ok(self._registered_set())[0]:
            self.complete = False
        link.first_attempt = None
        self._register(link)

    # --- connections ---------------------------------------------------------------------------

    def on_accepted(self, conn: Connection) -> None:
        if conn.local[1] == self.transport_addr[1]:
            conn.tag = "transport"
            self._transport_conns.append(conn)
        else:
            conn.tag = "request"

    def on_connection_lost(self, conn: Connection, *, refused: bool) -> None:
        if conn in self._transport_conns:
            self._transport_conns.remove(conn)
            return
        if not conn.outgoing:
            return
        if self.deregistering or self.deregistered:
            return  # leaving anyway
        for link in self.links:
            if link.registered and link.resolved and link.info.addr == conn.remote:
                self._store_disconnected(link)

    def _store_disconnected(self, link: StoreLink) -> None:
        """The connection to a store we are registered with went away (the store process
        died or restarted, or the network cut it): the store is unresponsive now, not after
        ``ume_store_activity_timeout`` (the guide's Store Unresponsive event is "delivered
        once a store is seen to be unresponsive due to failure or network disconnect"), and
        the source registers again at once, on a new connection.  A store that is back
        already answers; one that is not refuses the connection, and the source tries again
        every ``ume_registration_interval`` as for any unanswered registration."""
        self._unresponsive(link, "")
        self._register(link)

    def on_lbtru_event(self, binding: LbtruBinding, event: LbtruEvent) -> None:
        if isinstance(event, ClientConnected):
            self.log(Level.INFO, f"LBT-RU receiver {event.addr[0]}:{event.addr[1]} connected "
                                 f"(client ID {event.client_id})")
        elif isinstance(event, ClientTimedOut):
            self.log(Level.INFO, f"LBT-RU receiver {event.addr[0]}:{event.addr[1]} timed out")

    # --- stability, confirmation, retention ------------------------------------------------

    def _on_stable(self, link: StoreLink, sqn: int) -> None:
        if self._fragment_of:
            whole = self._fragment_of.get(sqn)
            if whole is not None:
                self._on_fragment_stable(link, sqn, whole)
                return
        msg = self.retained.get(sqn)
        if msg is None:
            return
        info = link.info
        bit = 1 << info.index
        mask = msg.stable_mask
        if mask & bit:
            return
        mask |= bit
        msg.stable_mask = mask
        memo = self._stability_memo
        hit = memo.get((mask, info.group)) if memo is not None else None
        ok, stable_flags, flags = hit if hit is not None else self._stability(mask, info.group)
        if ok and not msg.stable:  # this ACK makes the message stable
            msg.stable = True
            self.stats["stable"] += 1
            self._maybe_land(sqn, msg)
            flags = stable_flags
        self._events.append(MessageStable(sqn, info, flags))

    def _stability(self, mask: int, group: int) -> tuple[bool, StableFlags, StableFlags]:
        """When the stores of ``mask`` hold the message: whether it is stable per the group
        rules, and the flags of the :class:`MessageStable` for an ACK from ``group`` that makes
        it stable and for one that does not; remembered in the memo, if there is one (see
        ``__init__``)."""
        ok, groups = self._stable_groups(set(_indexes(mask)))
        intragroup = group in groups
        result = (ok, _STABLE_FLAGS[intragroup, ok, True], _STABLE_FLAGS[intragroup, ok, False])
        if self._stability_memo is not None:
            self._stability_memo[(mask, group)] = result
        return result

    def _on_confirmation(self, rcv: int, seqnum: int, explicit: bool) -> None:
        """A receiver (RegID ``rcv``) consumed everything up to ``seqnum`` (cumulative)."""
        start = self._confirmed.get(rcv, -1) + 1
        if seqnum < start:
            return
        self._confirmed[rcv] = seqnum
        need = self.config.ume_retention_unique_confirmations
        if start == 0 and self.retained:
            start = next(iter(self.retained))  # a receiver's first ACK: from what we hold
        for sqn in range(max(start, seqnum - MAX_CONFIRMATION_EVENTS + 1), seqnum + 1):
            msg = self.retained.get(sqn)
            if self._fragment_of and sqn in self._fragment_of:
                msg = self._confirmable(sqn)
            count = 1
            if msg is not None:
                count = msg.confirm(rcv)
            self.emit(DeliveryConfirmation(sqn, rcv, count, count >= need, explicit))
            if msg is not None:
                self._maybe_land(sqn, msg)

    def _maybe_land(self, sqn: int, msg: Retained) -> None:
        """Take the message out of flight once it is stable and confirmed enough."""
        if not msg.inflight or not msg.stable:
            return
        need = self.config.ume_retention_unique_confirmations
        if need and msg.confirmations < need:
            return
        msg.inflight = False
        size = len(msg.payload)
        self.inflight -= 1
        self.inflight_bytes -= size
        if self._over and not self._flight_exceeded():
            self._over = False
            self.emit(FlightSizeNotification(FlightState.UNDER, self.inflight))
        # the first step of _apply_retention in the common case, where the message that just
        # landed is the oldest retained, nothing is over the limit and the threshold does not
        # keep it: reclaimed here, then the loop goes on only if anything else could be
        cfg = self.config
        retained = self.retained
        limit = cfg.retransmit_retention_size_limit
        if cfg.retransmit_retention_size_threshold < self.retained_bytes <= limit \
                and next(iter(retained)) == sqn:
            del retained[sqn]
            self.retained_bytes -= size
            if msg.__class__ is Retained:
                self._events.append(MessageReclaimed(sqn, False))
            else:
                self._fragments_reclaimed(msg, False)
            if self.inflight == len(retained) and self.retained_bytes <= limit:
                return
        self._apply_retention()

    def _apply_retention(self) -> None:
        """Reclaim from the oldest message on: forced while over the size limit, else landed
        messages while over the threshold, stopping at the first message still in flight."""
        cfg = self.config
        retained = self.retained
        limit = cfg.retransmit_retention_size_limit
        threshold = cfg.retransmit_retention_size_threshold
        # Every retained message is in flight or landed, so when the counts match nothing has
        # landed and only the limit can reclaim: the common case of every send, and of an ACK
        # once the message it landed is reclaimed (the oldest is then in flight: the loop
        # below would stop there too).
        while not (self.inflight == len(retained) and self.retained_bytes <= limit):
            if not retained:
                return
            sqn = next(iter(retained))
            msg = retained[sqn]
            if self.retained_bytes > limit and len(retained) > 1:
                self._reclaim(sqn, msg, forced=True)
                continue
            if msg.inflight or self.retained_bytes <= threshold:
                return
            self._reclaim(sqn, msg, forced=False)

    def _reclaim(self, sqn: int, msg: Retained, *, forced: bool) -> None:
        del self.retained[sqn]
        self.retained_bytes -= len(msg.payload)
        if msg.inflight:
            msg.inflight = False
            self.inflight -= 1
            self.inflight_bytes -= len(msg.payload)
            if self._over and not self._flight_exceeded():
                self._over = False
                self.emit(FlightSizeNotification(FlightState.UNDER, self.inflight))
        if msg.__class__ is Retained:
            self._events.append(MessageReclaimed(sqn, forced))
        else:
            self._fragments_reclaimed(msg, forced)

    def _resend_unstable(self, link: StoreLink) -> None:
        for sqn, msg in self.retained.items():
            if not msg.stable and not (msg.stable_mask | msg.nack_mask) >> link.info.index & 1:
                self._proactive(link, sqn, msg)

    def _on_nack(self, link: StoreLink, sqn: int, size: int) -> None:
        """A stability NACK (the ACK's NAK bit, docs/wire-lbmc.md §2.1): the store declared
        message ``sqn`` unrecoverably lost and will never hold it (docs/semantics.md §1.8).

        The source stops retransmitting it to that store and says so (:class:`MessageNacked`,
        a WARNING line).  *Choice* (the guide is silent on several stores): when the stores
        that did not NACK it can no longer make it stable under the group rules - at once with
        one store - the message is abandoned as at the end of its stability lifetime: out of
        flight (a blocked send may go on) and reclaimed, forced; otherwise it stays in flight
        for them.  A NACK for a message the source does not hold (never sent, already
        reclaimed), or from a store that acknowledged it, is bad input: logged and dropped,
        nothing changes; a repeated NACK changes nothing either.  A NACK for any fragment of
        a fragmented message is one for the whole message (it cannot be stable at that store
        without every fragment), named by its first fragment's sequence number."""
        if self._fragment_of:
            whole = self._fragment_of.get(sqn)
            if whole is not None:
                sqn = whole.first
        msg = self.retained.get(sqn)
        bit = 1 << link.info.index
        if msg is None or msg.stable_mask & bit:
            why = "does not hold (never sent or already reclaimed)" if msg is None else \
                "had acknowledged before"
            self.drop(link.info.addr, f"stability NACK from store {link.info.index} for "
                                      f"message {sqn}, which it {why}", size)
            return
        if msg.nack_mask & bit:
            return  # said before
        msg.nack_mask |= bit
        everyone = (1 << len(self.links)) - 1
        abandoned = not msg.stable and \
            not self._stable_groups(set(_indexes(everyone & ~msg.nack_mask)))[0]
        self.emit(MessageNacked(sqn, link.info, abandoned))
        self.log(Level.WARNING,
                 f"store {link.info.index} [{link.label}] NACKed message {sqn} (it declared "
                 f"it lost): "
                 + ("no other store can make it stable; no longer retransmitted, reclaimed"
                    if abandoned else "no longer retransmitted to this store"))
        if abandoned:
            self._reclaim(sqn, msg, forced=True)

    def _proactive(self, link: StoreLink, sqn: int, msg: Retained) -> None:
        if isinstance(msg, FragmentedRetained):
            self._proactive_fragments(link, msg)
            return
        self.send_to(link.info.addr, data_message(self.topic_idx, sqn, msg.payload,
                                                  MessageType.PRORX))
        self.stats["proactive_retransmissions"] += 1

    # --- fragments (issue 17; reference_impl/fragments.py) --------------------------------------

    def _take_fragmented(self, payload: bytes) -> tuple[int, bytes]:
        """:meth:`_take` of a message longer than one datagram, after its checks: numbered as
        consecutive fragments (returns the first's sequence number and every fragment's bytes
        back to back), retained and counted once against the flight size."""
        first, piece = self.next_sqn, self._piece
        count = fragments.fragment_count(len(payload), piece)
        self.next_sqn = (first + count) & 0xFFFFFFFF
        raw = b"".join(fragments.fragment(self.topic_idx, first, payload, piece, i)
                       for i in range(count))
        self.stats["sent"] += 1
        self.stats["fragments"] += count
        if self._persistent:
            msg = FragmentedRetained(payload, self.now, first, piece)
            self.retained[first] = msg
            for sqn in msg.sqns():
                self._fragment_of[sqn] = msg
            self.retained_bytes += len(payload)
            self.inflight += 1
            self.inflight_bytes += len(payload)
            if not self._over and self._flight_exceeded():
                self._over = True
                self.emit(FlightSizeNotification(FlightState.OVER, self.inflight))
            self._apply_retention()
        return first, raw

    def _lbtru_send(self, raw: bytes) -> None:
        """Put one message, or the fragments of one back to back, on the LBT-RU or LBT-RM
        session: one datagram per LBMC message (each fits :attr:`SourceConfig.datagram_max`)."""
        session = self._udp_session
        assert session is not None
        end = len(raw)
        if end >= 4 and int.from_bytes(raw[2:4], "big") == end:
            session.send(raw, self.now)  # the common case: one message
            return
        pos = 0
        while pos < end:
            size = int.from_bytes(raw[pos + 2:pos + 4], "big")
            session.send(raw[pos:pos + size], self.now)
            pos += size

    def _on_fragment_stable(self, link: StoreLink, sqn: int, msg: FragmentedRetained) -> None:
        """A stability ACK for one fragment: the fragment is stable under the group rules as
        any message is; the message is stable (and may land) once every fragment is.  Each
        ACK gives a :class:`MessageStable` naming the fragment's sequence number, as the
        product reports stability per sequence number."""
        index = (sqn - msg.first) & 0xFFFFFFFF
        info = link.info
        bit = 1 << info.index
        mask = msg.masks[index]
        if mask & bit:
            return
        mask |= bit
        msg.masks[index] = mask
        common = mask
        for other in msg.masks:
            common &= other
        msg.stable_mask = common
        ok, stable_flags, flags = self._stability(mask, info.group)
        if ok and not msg.fragment_stable[index]:
            msg.fragment_stable[index] = True
            msg.stable_count += 1
            flags = stable_flags
        self._events.append(MessageStable(sqn, info, flags))
        if msg.stable_count == msg.count and not msg.stable:
            msg.stable = True
            self.stats["stable"] += 1
            self._maybe_land(msg.first, msg)

    def _confirmable(self, sqn: int) -> FragmentedRetained | None:
        """What a receiver's consumption of fragment ``sqn`` confirms: its message when
        ``sqn`` is the message's last fragment (the receiver consumed all of it), else
        nothing yet."""
        msg = self._fragment_of.get(sqn)
        return msg if msg is not None and sqn == msg.last else None

    def _fragments_reclaimed(self, msg: Retained, forced: bool) -> None:
        """A fragmented message left retention: one :class:`MessageReclaimed` per fragment
        (the guide's "Mapping Your Message Numbers to UMS/UMP Sequence Numbers": a fragmented
        message gives one release event per sequence number)."""
        assert isinstance(msg, FragmentedRetained)
        for sqn in msg.sqns():
            if self._fragment_of.get(sqn) is msg:
                del self._fragment_of[sqn]
            self._events.append(MessageReclaimed(sqn, forced))

    def _proactive_fragments(self, link: StoreLink, msg: FragmentedRetained) -> None:
        """Proactive retransmission of a fragmented message: only the fragments ``link``'s
        store has not acknowledged."""
        bit = 1 << link.info.index
        for index, mask in enumerate(msg.masks):
            if not mask & bit:
                self.send_to(link.info.addr, fragments.fragment(
                    self.topic_idx, msg.first, msg.payload, msg.piece, index,
                    MessageType.PRORX))
                self.stats["proactive_retransmissions"] += 1

    # --- timers -------------------------------------------------------------------------------

    def on_timer(self, name: str) -> None:
        cfg = self.config
        if name == "check":
            self._check_stores()
            self._check_stability()
            self.set_timer("check", self.now + cfg.ume_store_check_interval / 1000)
        elif name == "complete":
            self._check_complete()
        elif name.startswith("join "):
            link = self.links[int(name.split()[1])]
            if link.registered and not link.joined:  # no word from the store: go on anyway
                link.joined = True
                self._check_complete()
        elif name == "sri":
            self._send_sri()
            self._sri_left -= 1
            if self._sri_left > 0:
                self.set_timer("sri", self.now + cfg.ume_sri_inter_sri_interval / 1000)
        elif name == "advertise":
            self._advertise()
            self.set_timer("advertise", self.now + cfg.resolver_advertisement_interval / 1000)
        elif name == "names":
            self._query_names()
            if not all(link.resolved for link in self.links):
                self.set_timer("names", self.now + NAME_QUERY_INTERVAL)

    def _check_stores(self) -> None:
        cfg = self.config
        if self.deregistering or self.deregistered:
            # a deregistered source never registers again (see :meth:`deregister`), and a
            # store it left is not "unresponsive": only unconfirmed deregistrations repeat,
            # and a registration answered after the deregistration began is undone
            for link in self.links:
                if link.registered and link.info.index in self._leaving and \
                        self.now >= link.next_attempt:
                    self.deregistering = True
                    self._send_deregistration(link)
            return
        timeout = cfg.ume_store_activity_timeout / 1000
        for link in self.links:
            if link.failed:
                continue
            if link.registered:
                if self.now - link.last_heard > timeout:
                    self._unresponsive(link, "")
                elif self.now - link.last_heard > cfg.ume_proactive_keepalive_interval / 1000:
                    self._keepalive(link)
                continue
            first = link.first_attempt if link.first_attempt is not None else self.now
            if not link.unresponsive and self.now - first > timeout:
                self._unresponsive(link, " - no registration response" if link.resolved
                                   else " - store name not resolved")
            if self.now >= link.next_attempt and link.resolved:
                self._register(link)

    def _unresponsive(self, link: StoreLink, suffix: str) -> None:
        link.registered = False
        link.unresponsive = True
        conn = self.connection_to(link.info.addr)
        if conn is not None:
            self.close_connection(conn)
        quorum_lost = False
        if self.complete and not self._groups_ok(self._registered_set())[0]:
            self.complete = False
            quorum_lost = True
        text = f"store {link.info.index} [{link.label}] " \
               f"unresponsive{suffix}{' (quorum lost)' if quorum_lost else ''}"
        self.emit(StoreUnresponsive(link.info, text, quorum_lost))
        self.log(Level.WARNING, text)
        link.first_attempt = self.now
        self._restabilize()

    def _restabilize(self) -> None:
        """After a store left the registered set: under an ``all-active`` behaviour a message
        waits only for the stores registered now (guide "Sources Using Quorum/Consensus Store
        Configuration": stable "in all the active groups"; docs/semantics.md §1.2), so what
        the remaining stores hold may be stable now, at once and not at the next ACK.
        *Choice* (the guide is silent): no Message Stable event for it (no store acknowledged
        anything); the message leaves the flight and is reclaimed as usual (Message
        Reclaimed).  Under the other behaviours registration does not enter the rule and
        nothing changes."""
        cfg = self.config
        if "all-active" not in (cfg.ume_retention_intragroup_stability_behavior,
                                cfg.ume_retention_intergroup_stability_behavior):
            return
        for sqn, msg in list(self.retained.items()):
            if msg.stable or self.retained.get(sqn) is not msg:
                continue
            if isinstance(msg, FragmentedRetained):
                for index, mask in enumerate(msg.masks):
                    if not msg.fragment_stable[index] and \
                            self._stable_groups(set(_indexes(mask)))[0]:
                        msg.fragment_stable[index] = True
                        msg.stable_count += 1
                if msg.stable_count < msg.count:
                    continue
            elif not self._stable_groups(set(_indexes(msg.stable_mask)))[0]:
                continue
            msg.stable = True
            self.stats["stable"] += 1
            self._maybe_land(sqn, msg)

    def _check_stability(self) -> None:
        cfg = self.config
        timeout = cfg.ume_message_stability_timeout / 1000
        lifetime = cfg.ume_message_stability_lifetime / 1000
        if not timeout:
            return
        for sqn, msg in list(self.retained.items()):
            if msg.stable:
                continue
            if lifetime and self.now - msg.first_sent >= lifetime:
                self.emit(MessageNotStable(sqn))
                self._reclaim(sqn, msg, forced=True)
                continue
            if self.now - msg.sent_at >= timeout:
                msg.sent_at = self.now
                done = msg.stable_mask | msg.nack_mask
                for link in self.links:
                    if link.registered and not done >> link.info.index & 1:
                        self._proactive(link, sqn, msg)


def _consensus(values: Mapping[int, Sequence[int]] | Sequence[int], behaviour: str) -> int:
    """The consensus sequence number of the stores' answers, by group (docs/semantics.md
    §1.2): :func:`reference_impl.quorum.consensus`, the one definition (``majority`` per
    group, then the latest of the group majorities), reached through this name so a test can
    replace it.  ``values``: group index -> the high sequence numbers its OLD stores
    answered (a flat sequence is one group)."""
    return quorum.consensus(values, behaviour)


RPP_REFUSAL = ("the store refused the RPP registration: RPP not allowed for the topic, an "
               "override above its maximum or for the wrong repository type, inconsistent "
               "RPP values, or values or mode that differ from the repository's first "
               "registration; the store's log names the option")
"""What a code 6 refusal of an RPP registration means (docs/semantics.md §2.1, §2.2),
appended to the error's text: the PREG_RESP carries only the code."""

_PREG_ERRORS = {
    PregError.ENOPATTERN: "store has no matching topic pattern",
    PregError.ESRCREGID: "source RegID not found",
    PregError.EREGID: "RegID is in use by a receiver",
    PregError.ETOPICNAME: "topic name does not match the previous registration",
    PregError.EACTIVE: "RegID is in use by a different source",
    PregError.ECONFIG: "source and store configuration values are incompatible",
}
