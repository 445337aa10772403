"""The reference store: a sans-IO state machine for one ``<store>`` of a umestored daemon.

What it does follows the guide's "Operational View" and docs/semantics.md §1:

* **Registration** (PREG → PREG_RESP on the client's TCP connection to the store port).
  Sources and receivers get the RegID they ask for, or a random one when they ask for 0; with a
  Session ID the store looks up topic + Session ID first ("How Stores Associate Session IDs and
  RegIDs").  A RegID that another client holds is refused (code 5 for sources, 3 when a
  receiver holds it; "strong RegIDs", see "RegID ownership" below); a source that
  re-registers gets the OLD flag and the highest sequence number the store holds, a receiver
  gets OLD and its low sequence number
  (last acknowledged + 1) or, if new, where ``receiver-new-registration-rollback`` puts it.
  RPP follows docs/semantics.md §2.1 (see "Receiver-paced persistence" below).
* **Persistence**: the store resolves the source's topic (TIR through the resolver), joins the
  source's LBT-TCP transport as an ordinary receiver, keeps each message in the source's
  :class:`~reference_impl.repository.Repository` and sends a stability ACK to the source
  (batched by ``stability-ack-minimum-number``/``-interval``; RPP below).  Duplicates are
  acknowledged again; proactive retransmissions from the source are stored like live data.
* **Stability NACK** (docs/semantics.md §1.8, docs/wire-lbmc.md §2.1): messages the store
  declared unrecoverably lost are answered with a stability ACK carrying the NAK bit
  (``wire.lbmc.ACK_NAK``) and not stored.  The store declares a loss when its LBT-RU session
  gives up datagrams (``Lost``; without its own OTR the store does not recover from the
  source): the topic sequence numbers between the last message it got and the next live one
  are then lost, one gap for each loss reported (LBT-RU delivers in order; the lost
  datagrams may also have been SRIs, then nothing is);
  :meth:`StoreCore.declare_lost` does the same for any source.  *Choice* (the guide is
  silent): a late copy (the source's proactive retransmission, or a retransmission) of a
  message declared lost is NACKed, not stored - the loss was logged, counted and told to
  receivers that asked (they got nothing for it), and the store keeps one answer per
  sequence number; the source then stops sending it (another store of its group may hold
  it).  Declarations live in memory only: a restarted store stores such a copy again.
  The hot path decodes only the data base header; the ACKs a received chunk earns leave in
  one write, after the chunk's messages went to the repository file (disk) in one write.
* **Consumption ACKs** from receivers are cumulative (acknowledging N acknowledges everything up
  to N); in RPP they release messages once every blocking receiver consumed them.
* **Retransmission requests** go to a worker paced at ``retransmission-request-processing-rate``
  with a queue of four times that rate; the excess is dropped and counted (web monitor "Drop").
  A receiver's run of requests and consumption ACKs is read straight out of the received chunk
  (:meth:`StoreCore.on_message_run`), each as the message-by-message path reads it.  A request
  naming a RegID that is no receiver's here (never registered, a source's, or a receiver whose
  state was deleted) gets nothing: the guide's "Registration Identifier" makes the RegID what
  identifies a receiver to the store, so there is nobody to serve.  It is logged as one
  WARNING line naming the RegID, the sequence number and the requester's address (the TCP
  peer it came from) and counted as a dropped input; *choice*: it does not count as any
  client's activity, and the requester's connection is kept (a receiver that lost its state
  re-registers on it).
* **Context name**: a store with a ``context-name`` advertises it with its address and store
  port (an LBMR context-information record) at startup and whenever a source queries for that
  name, so sources with ``ume_store_name`` find it; an advertisement of the same name from
  anyone else is logged as a warning.
* **Liveness**: keepalives to idle clients every ``keepalive-interval``; every
  ``source-check-interval`` clients silent for longer than their activity timeout become
  inactive (their RegID may be reused) and their state is deleted when their state lifetime
  (the shorter of client and store value) runs out - at once when no lifetime is set.
  Receivers follow the same rules as sources with the topic's ``receiver-activity-timeout``
  and ``receiver-state-lifetime`` (guide "Activity Timeout and State Lifetime Options";
  docs/semantics.md §1.11): the client's ``ume_activity_timeout`` (the PREG's client-lifetime
  header) replaces the store's activity timeout, the shorter of the client's
  ``ume_state_lifetime`` and the store's lifetime applies (either 0: the other), both are
  fixed at the first registration, and the lifetime counts from the last thing heard, looked
  at only once the activity timeout ran out (a lifetime shorter than the activity timeout
  ends with it).  A receiver whose state was deleted is new when it registers again (no OLD
  flag; its low sequence number as for any new receiver).
* **Disk state**: with ``repository-type`` disk the messages go to cache files and
  registrations and acknowledgements to a state journal (one JSON record per line), so a
  restarted store knows its sources, receivers and messages.  A restarted store asks for the
  advertisements of the sources it restored and joins their transports at once, so their live
  data is kept while they re-register ("Source Recovery": the store then answers with the
  highest sequence number it holds, including what arrived meanwhile).
* **Damaged disk state** (issue 22 item 3) never crashes the store and is never restored
  around silently.  A torn tail from a crash mid-write (the journal's last line without its
  newline, a cache file's last message cut short, NUL bytes after it) is cut off with a
  warning naming the file.  Any other damage - a journal line in the middle that is not UTF-8
  JSON of a record's shape, a cache frame that is not a stored data message, a symbolic link,
  directory or FIFO in a file's place - raises
  :class:`~reference_impl.repository.StoreFileError` (``FILE:LINE: what``): the store does not
  start and the file is left as it was for the operator, since restoring around the damage
  would drop what it held (the guide's "Persistent Store Fault Tolerance": redundant stores
  carry the sources meanwhile).  Every field a record restores is checked (types, ranges, an
  IPv4 request address, the topic options the store knows: :mod:`reference_impl.journal`).
  The journal is compacted at start-up into a new file renamed over the old one, so a crash
  then leaves the old journal whole.  A new registration whose cache file cannot be opened
  is refused (code 6, ECONFIG) with the reason logged, and the store keeps serving the
  others.  A store locks its state (:func:`~reference_impl.repository.lock_state`): a second
  process starting a store of the same name on the same state directory is refused, since
  each would compact the journal and then append to its own copy.

**Receiver-paced persistence** (the guide's "Receiver-paced Persistence Operations";
docs/semantics.md §1.13, §1.14, §2.1, §2.2).  The rules themselves are
:mod:`reference_impl.rpp`'s; this store applies them:

* "RPP Registration": a source's PREG with the RPP flag carries its overrides as
  configuration options after the PREG (docs/wire-lbmc.md §2.3).  The store takes the
  effective values from :func:`~reference_impl.rpp.effective_values` (each override at most
  the topic's value, the consistency rules) and keeps them on the source
  (:attr:`SourceState.rpp_values`) and in the state journal, so a restarted store compares
  re-registrations with them too.  A topic without ``repository-allow-receiver-paced-
  persistence``, an override above its maximum, ack on reception the topic does not allow, a
  disk-only override on a memory repository, inconsistent values, garbled options and
  options without the RPP flag (contradictory) are refused with code 6 (ECONFIG) and a
  WARNING naming the option and both values; nothing changes for anyone.  A granted RPP
  registration is answered with the RPP flag.
* Re-registration (docs/semantics.md §2.1 last paragraph): a source or receiver switching
  between SPP and RPP, a receiver switching between blocking and non-blocking, an RPP source
  presenting other values: each refused (ECONFIG) with its own log line
  (:func:`~reference_impl.rpp.reregistration_refusal`).
* Receivers: the mode is :func:`~reference_impl.rpp.receiver_mode` (the flag, and ``ume_
  receiver_paced_persistence 2`` for a non-blocking one); SPP receivers only on SPP
  repositories, RPP receivers (either mode) only on RPP ones; RPP receivers are answered with
  the RPP flag.
* "RPP Normal Operations": the repository runs with the effective values (size threshold,
  size limit, disk file limit; sizes count the payload only).  A stability ACK is withheld
  while less than one *effective* flight size in bytes (``ume_flight_size_bytes``, not the
  topic's maximum) of room is left below the size limit, and sent when releases make room.  A
  memory repository acknowledges on reception.  A disk repository acknowledges after the
  message is written - after its write delay (the effective ``ume_write_delay``, during
  which the message is held in memory) - unless ack on reception is in effect (the topic
  allows it and the source asked): then at once, and "durable before acknowledged" (see the
  repository module) deliberately does not hold for that source.  *Choice*: the guide's
  "Acknowledge on Reception" adds "if the disk write has not already been initiated, UMP does
  not write the message to disk", the sentence of "Receiver Acknowledgement"; read literally
  it would keep an acknowledged message out of the disk repository for good, so this store
  still writes it when its write delay ends, unless every blocking receiver consumed it
  first.  The guide's flight size is "in both messages and bytes"; a registration carries no
  message count (``ume_flight_size``), so this store withholds by bytes only.
  "Receiver Acknowledgement": a message every blocking receiver consumed before its write
  delay ended is never written (counted, web monitor "Disk Writes Skipped") and its
  stability ACK goes at once.  Every other stability ACK still waits for its message's write.
* Release: a message is released when every *blocking* receiver consumed it (cumulative
  ACKs; a new receiver counts as having consumed everything before its first low sequence
  number).  Non-blocking receivers never hold messages back: a slow one is overrun, and its
  retransmission requests for released messages get nothing.  *Choice*: an RPP repository
  with no blocking receiver (none registered, or only non-blocking ones) releases its oldest
  messages above the size threshold, as SPP does, so its source is never stopped for want of
  room; a message waiting for its write delay is written before it is released so.
* "Late Registering Receiver" (docs/semantics.md §1.14): a receiver whose first
  registration comes after the repository's first message starts at the next message
  (current product); with :attr:`StoreSettings.rpp_late_join_unconsumed` (profile
  ``guide-5.3``) at the oldest message still held, i.e. not yet consumed by all blocking
  receivers.  A receiver that registers again gets everything since its last ACK (since its
  first registration when it acknowledged nothing yet).
* "Early Exiting Receiver": a receiver whose activity timeout expired keeps holding every
  message since its last ACK until its state lifetime expires; then its state is deleted and
  what was held only for it is released.  Re-registering before then, it recovers them.
  Without a state lifetime its state goes at its activity timeout.
* "RPP Deregistration": a receiver's PREG with the deregister flag deletes its state and
  re-runs the release at once (fewer ACKs needed); a source's deletes its retained messages
  (repository cleared, cache file removed) and its state.  Both are answered with the
  deregister flag.
* A store without RPP (:attr:`StoreSettings.rpp_supported` false, profile ``pre-5.3``; the
  column "Pre-ver. 5.3 Store" of the guide's "UMP Version RPP Compatibility Matrix") never
  reads the RPP flag or options and never sets the flag in an answer: every source and
  receiver is SPP and granted.

**RegID ownership**, sources and receivers alike (the guide's "Registration Identifier": no
two active sources or receivers may use one RegID at the same time; "Activity Timeout and
State Lifetime Options": the activity timeout "prevents a second source or receiver from
stealing a RegID from an existing source"; docs/semantics.md §1.10-1.11, "strong RegIDs"):

* A client's RegID stays its own until its activity timeout (the client's
  ``ume_activity_timeout``, or the topic's ``source-activity-timeout`` /
  ``receiver-activity-timeout``) has run out since the last thing the store heard from it: a
  registration, a keepalive, data on a source's transport, a receiver's consumption ACK or
  retransmission request.  A closed registration connection does not end the ownership (a
  SIGKILLed client's socket closes at once), and neither does a restart of the store:
  restored state counts as heard at the moment the store started.  Until then a
  registration for that RegID is refused unless it provably comes from the owner: with code
  5 (EACTIVE, "RegID is in use by a different source") when a source holds it, code 3
  (EREGID, "RegID is in use by a receiver") when a receiver does.  Both clients retry such a
  refusal every ``ume_registration_interval`` (it clears when the holder's time runs out);
  other refusals are final.  With an activity timeout of 0 ("weak RegIDs") the RegID is held
  only while the owner's registration connection is open.
* **Who is the owner** (:meth:`StoreCore._same_client`): a registration on the owner's own
  connection (a retried PREG whose answer was lost), or one that arrives on a TCP connection
  from the owner's IP, names that IP as its request address (``resp_ip``) and either
  - carries the owner's Session ID, when the owner registered with one (the guide's
    "Managing RegIDs with Session IDs": the Session ID is how a restarted application finds
    its RegID again, so a restart on other ports is still the owner), or
  - when neither has a Session ID, names the owner's request port, which must not be 0 (a
    port nobody listens on tells no process from another), and for a source also its
    transport and topic indexes (a client restarted on the same ports, or one
    re-registering after a store restart).  A receiver's indexes are its source's, which
    may change under it, so they prove nothing about the receiver.
  Anything else - another host, another request port without a Session ID, another Session
  ID - waits until the old incarnation's activity timeout ran out, as the guide asks.
* A receiver RegID belongs to one source at a store ("Registration Identifier"): asked for
  with another source RegID, it is refused (code 3) until the first registration's
  activity timeout ran out, even to its owner (one receiver with a configured RegID and two
  sources on the topic must not have its sessions take each other's RegID); then the old
  registration is deleted and the RegID registered afresh for the new source.
* **Limits**: the proof is only as strong as the network's addresses and the secrecy of the
  Session ID.  The store cannot see the port a PREG names (registrations come from
  ephemeral ports), so a process on the owner's host (same IP) that names the owner's
  request port and indexes - all in its topic advertisement, which every context sees - is
  taken for a source without Session ID; for a source with one it must also know the
  Session ID (in the PREG, which only the store sees, and in the application's
  configuration).  Anyone who can spoof TCP from the owner's address passes too.  What the
  rule stops is an impostor on another host, and one on the same host that does not forge
  the owner's identity (the common mistake: a second instance started with the same static
  RegID).  The same holds for receivers, whose request port and Session ID are in their
  PREGs only.

Choices where the fact sheets are silent (each tested in tests/reference_impl/test_store.py):

* A PREG carries a ``topicname`` header naming its topic, so a store can match its topic
  patterns before it has seen the source's TIR; without it the store waits for the TIR that
  names the PREG's request address and indexes, and refuses (code 1) after one activity timeout.
* "All RPP receivers" that must consume a message before its write delay ends, for it to
  skip the disk, are the registered *blocking* receivers (non-blocking ones never hold
  anything back); with none, the write delay simply delays the write.
* Stability ACKs name the source's transport and topic index (``id_2``); ``rcv_reg_id`` is 0.
* An LBT-RU source (TIR with an LBT-RU transport) is joined with an
  :class:`~reference_impl.lbtru_session.LbtruReceiverSession` from the store's ``lbtru_port``;
  "joined" is the session's Connected, and the store keepalive that says so goes to the
  source's request port (LBT-RU has no way back for LBMC).  What the transport loses the store
  does not recover from the source: it holds what it received (a warning names the loss), and
  a session that times out counts as a transport connection lost.  Unless it has OTR of its
  own (``use_otr`` 1 in its ``<lbm-config>``, :attr:`StoreSettings.otr`): then the numbers
  the transport gave up on are asked of the source's request port with the receiver's pacing
  core (:mod:`reference_impl.otr`) and persisted when they come (docs/semantics.md §1.9,
  "The store as an OTR requester").
* An LBT-RM source (TIR with the 16-byte LBT-RM form) is joined the same way with an
  :class:`~reference_impl.lbtrm_session.LbtrmReceiverSession` on the group's destination port
  (:meth:`~reference_impl.context.ContextCore.open_lbtrm_receiver`; the driver binds and joins
  the group).  "Joined" is the session's opening, since the group is joined then and LBT-RM
  has no handshake: the session starts at the first DATA or session message after it, which
  the source sends only once the store's keepalive completed its registration.  A TIR of a
  topic the store keeps from a known LBT-RM transport, with another session ID, is the source
  restarted (LBT-RM has no reset): its new session takes over, from its first datagram when
  that came before the TIR (:meth:`~reference_impl.context.ContextCore.promote_lbtrm`), and
  the routes stay.
* The store answers a source's registration once it has joined the source's transport (or
  after :data:`JOIN_WAIT` without a TIR), so nothing sent after Registration Complete can miss
  it; the current guide says the same thing the other way round ("the Stores must receive
  this SRI", docs/semantics.md §1.1 step 6).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import stat
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TextIO

from reference_impl import journal
from reference_impl.context import Connection, ContextCore, FixedControl, LbtruBinding, control
from reference_impl.events import (
    Addr,
    ClientRegistered,
    ClientRejected,
    ClientStateDeleted,
    Level,
    ProxySourceCreated,
    ProxySourceDeleted,
)
from reference_impl.lbtru_session import (
    Connected,
    ConnectFailed,
    LbtruReceiverSession,
    Lost,
    SessionReset,
    SourceTimedOut,
)
from reference_impl.lbtru_session import Event as LbtruEvent
from reference_impl.otr import OtrCore, OtrLost, OtrSettings
from reference_impl.proxy import (
    Action,
    CreateProxy,
    DeleteProxy,
    Dropped,
    ProxyElection,
    ProxyPeer,
    SendClaim,
    SourceKey,
    decode_claim,
)
from reference_impl.repository import (
    Repository,
    RetentionLimits,
    StoreFileError,
    as_retransmission,
    cache_file,
    lock_file,
    lock_state,
    open_store_file,
    state_file,
)
from reference_impl.rpp import (
    BLOCKING,
    RPP_OPTION,
    SPP,
    RppRefused,
    RppValues,
    effective_values,
    parse_options,
    receiver_mode,
    requested_overrides,
    reregistration_refusal,
    store_values,
)
from wire import lbmr
from wire.lbmc import (
    ACK_NAK,
    DATA_BASE,
    NHDR_DATA,
    VER_TYPE_BITS,
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
    UmeClientLifetime,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeProxySrc,
    UmePsrcElectionToken,
    UmeRxreq,
    UmeSid,
    UmeStoreExt,
    UmeStoreGroup,
    UmeStoreid,
    parse_message,
)

MAX_REGID = 0xFFFFFFFF
MAX_LOST = 65536
"""Most sequence numbers one source's loss declarations keep (the newest are kept): a lost
range larger than the source's flight size cannot be proactively retransmitted anyway."""
JOIN_WAIT = 2.0
"""Seconds a store holds a source's PREG_RESP while it joins the source's transport."""
_TQRS_PER_QUERY = 8  # topic queries per LBMR packet the store sends
DATA_TYPES = (MessageType.MESSAGE, MessageType.PRORX, MessageType.RETRANS)
# hot-path layouts, all derived from wire.lbmc: the data base header and its type nibble, and
# whole single-header control messages (receivers' requests in, stability ACKs out)
_DATA_SIZE = DATA_BASE.size
_DATA_UNPACK = DATA_BASE.codec.unpack_from
_TYPE_MASK = VER_TYPE_BITS["type"].mask
_DATA_TYPE_CODES = frozenset(int(t) for t in DATA_TYPES)
assert VER_TYPE_BITS["type"].shift == 0
_RXREQ_IN = FixedControl(UmeRxreq)
_ACK_IN = FixedControl(UmeAck)
_ACK_SEQNUM = _ACK_IN.at["seqnum"]
_RXREQ_ID, _RXREQ_SQN = _RXREQ_IN.at["id_2"], _RXREQ_IN.at["seqnum"]
_ACK_FIELDS = tuple(_ACK_IN.at[n] for n in ("type", "rcv_reg_id", "id_2", "seqnum"))
# on_message_run reads both shapes with one head length, and tells them apart by size as
# on_raw_message does
assert len(_RXREQ_IN.head) == len(_ACK_IN.head) and _RXREQ_IN.size != _ACK_IN.size


def _runs(sqns: tuple[int, ...]) -> list[tuple[int, int]]:
    """Ascending ``sqns`` as (first, last) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for sqn in sqns:
        if runs and runs[-1][1] == sqn - 1:
            runs[-1] = (runs[-1][0], sqn)
        else:
            runs.append((sqn, sqn))
    return runs


@dataclass(frozen=True)
class TopicPolicy:
    """The topic-level ``type="store"`` options the store core uses (docs/semantics.md §3.4).

    Names are the XML option names with ``-`` as ``_``; times in milliseconds unless noted.
    Defaults are the current product's.
    """

    repository_type: str = "memory"
    repository_size_threshold: int = 1024
    repository_size_limit: int = 50_331_648
    repository_age_threshold: int = 0  # seconds
    repository_disk_file_size_limit: int = 104_857_600
    source_activity_timeout: int = 30_000
    source_state_lifetime: int = 0
    receiver_activity_timeout: int = 30_000
    receiver_state_lifetime: int = 0
    source_check_interval: int = 750
    keepalive_interval: int = 3000
    receiver_new_registration_rollback: int = 2_147_483_647
    stability_ack_interval: int = 200
    stability_ack_minimum_number: int = 1
    repository_allow_receiver_paced_persistence: int = 0
    repository_allow_ack_on_reception: int = 0
    repository_disk_write_delay: int = 0
    source_flight_size_bytes_maximum: int = 4_194_304
    retransmission_request_forwarding: int = 0
    proxy_election_interval: int = 60_000  # the proxy election's wait: [0.5, 1.5] x this


@dataclass(frozen=True)
class TopicRule:
    """One ``<topic>``: a pattern (direct = exact, else a regular expression) and its options."""

    pattern: str
    policy: TopicPolicy = TopicPolicy()
    kind: str = "direct"
    matcher: Callable[[str], bool] | None = None  # e.g. the XML reader's own pattern test

    def matches(self, topic: str) -> bool:
        if self.matcher is not None:
            return self.matcher(topic)
        if self.kind == "direct":
            return topic == self.pattern
        return re.fullmatch(self.pattern, topic) is not None


@dataclass(frozen=True)
class StoreSettings:
    """One ``<store>`` element, with what the daemon adds (address and resolver).

    Attributes:
        name: the store's name (logs, web monitor).
        ip: the interface it listens on.
        port: its TCP port for registrations (the "store port").
        topics: topic rules in document order; the first match applies.
        context_name: the name sources use in ``ume_store_name``.
        disk_cache_directory, disk_state_directory: where disk repositories and state live.
        retransmission_request_processing_rate: requests per second the worker serves.
        lbmr_port: the UDP port for topic resolution.
        resolver: the resolver daemon's address.
        seed: seeds RegID assignment (deterministic tests and captures).
        lbtru_port: the UDP port it receives LBT-RU transports on (0: LBT-TCP sources only;
            advertisements of LBT-RU ones are ignored).
        rpp_supported: the store knows receiver-paced persistence (profile ``pre-5.3``
            clears it: the store then never reads the RPP flag or options of a registration
            and never sets the flag in an answer; every client is SPP and granted).
        rpp_late_join_unconsumed: a receiver whose first registration with an RPP
            repository comes after its first message starts at the oldest message the
            repository still holds (the guide's "Late Registering Receiver", profile
            ``guide-5.3``) instead of the next one (the current product).
        allow_proxy_source: ``allow-proxy-source``: the store takes part in proxy-source
            elections for sources that ask for a proxy (see "Proxy sources" in
            :meth:`StoreCore._proxy_start`).
        proxy_stores: the Quorum/Consensus group's stores, this one included; a store's
            index in the election is its position here (empty: the store elects alone).
        proxy_port: the TCP port (bound by the driver) the store's proxy sources advertise
            as their transport and request port (0: the store port itself).
        proxy_source_repo_quorum_required: ``proxy-source-repo-quorum-required``: a proxy
            is created only once a quorum of the group's stores that hold the source's state
            follow its claim (reference_impl/proxy.py, module docstring 7).
        otr: the store's own off-transport recovery (``use_otr`` 1 in its ``<lbm-config>``;
            :meth:`StoreCore._otr_gap`): a gap its LBT-RU/LBT-RM transport gave up on is
            asked of the source's request port, paced by these timers (None: it is declared
            lost at once).
    """

    name: str
    ip: str
    port: int
    topics: tuple[TopicRule, ...] = (TopicRule(".*", kind="PCRE"),)
    context_name: str | None = None
    disk_cache_directory: Path | None = None
    disk_state_directory: Path | None = None
    retransmission_request_processing_rate: int = 262_144
    lbmr_port: int = 0
    resolver: Addr | None = None
    seed: int | None = None
    lbtru_port: int = 0
    rpp_supported: bool = True
    rpp_late_join_unconsumed: bool = False
    allow_proxy_source: bool = False
    proxy_stores: tuple[Addr, ...] = ()
    proxy_port: int = 0
    proxy_source_repo_quorum_required: bool = False
    otr: OtrSettings | None = None

    def policy_for(self, topic: str) -> TopicPolicy | None:
        for rule in self.topics:
            if rule.matches(topic):
                return rule.policy
        return None


@dataclass(eq=False)
class Client:
    """What a store knows of a registered source or receiver."""

    role: str  # "source" | "receiver"
    reg_id: int
    topic: str
    session_id: int
    transport_idx: int
    topic_idx: int
    request_addr: Addr  # where the client's requests come from (its resp_ip/resp_port)
    activity_timeout: float  # seconds (client override or store value)
    state_lifetime: float  # seconds, 0 = none
    last_activity: float = 0.0
    last_sent: float = 0.0
    active: bool = True
    conn: Connection | None = None
    rpp: int = 0  # 0 SPP; sources 1 = RPP; receivers 1 blocking, 2 non-blocking

    def expired(self, now: float) -> bool:
        return self.activity_timeout > 0 and now - self.last_activity > self.activity_timeout

    def holds_regid(self, now: float) -> bool:
        """The RegID is still this client's (see "RegID ownership" in the module
        docstring): its activity timeout has not run out since it was last heard, whether
        or not its connection is open; with weak RegIDs (timeout 0), while it is connected."""
        if self.activity_timeout > 0:
            return now - self.last_activity <= self.activity_timeout
        return self.active and self.conn is not None and self.conn.open

    def lifetime_over(self, now: float) -> bool:
        end = max(self.activity_timeout, self.state_lifetime)
        return now - self.last_activity > end


@dataclass(eq=False)
class SourceState(Client):
    """A source's registration, repository and receivers."""

    repo: Repository | None = None
    policy: TopicPolicy = TopicPolicy()
    transport: Addr | None = None  # its LBT-TCP transport, learnt from its TIR
    lbtru_sid: int | None = None  # the LBT-RU session ID when it was joined over LBT-RU
    tir_seen: bool = False
    receivers: dict[int, ReceiverState] = field(default_factory=dict)
    unacked: list[int] = field(default_factory=list)  # stability ACKs batched or withheld
    high_received: int | None = None
    pending_response: Callable[[], None] | None = None  # PREG_RESP waiting for the join
    ack_due: list[int] = field(default_factory=list)  # stability ACKs owed at chunk end
    touched: bool = False  # got data in the chunk being processed
    warned: set[int] = field(default_factory=set)  # receivers warned about early release
    rpp_values: RppValues | None = None  # RPP: the effective values of its first registration
    # RPP disk without ack on reception: messages whose stability ACK waits for their write
    # (their write delay), in arrival order
    awaiting_write: dict[int, None] = field(default_factory=dict)
    # stability NACK (docs/semantics.md §1.8): sequence numbers declared unrecoverably lost,
    # and whether the transport just lost datagrams (the next live message shows which)
    lost: set[int] = field(default_factory=set)
    loss_pending: int = 0  # transport losses (runs) whose numbers no live message showed yet
    otr: OtrCore | None = None  # the store's own OTR of this source (StoreSettings.otr)


@dataclass(eq=False)
class ReceiverState(Client):
    """A receiver's registration with one source's repository."""

    source_reg_id: int = 0
    last_ack: int | None = None
    rx_addr: Addr | None = None
    floor: int | None = None  # RPP: the sequence number before its first low one

    def consumed(self) -> int | None:
        """Up to where this receiver needs nothing more held (RPP release): its newest
        consumption ACK, else everything before its first low sequence number."""
        if self.last_ack is None or self.floor is None:
            return self.last_ack if self.last_ack is not None else self.floor
        return max(self.last_ack, self.floor)


@dataclass
class RetransmissionStats:
    """Counters of the retransmission worker (web monitor store page)."""

    received: int = 0
    serviced: int = 0
    dropped: int = 0
    total_dropped: int = 0
    since: float = 0.0


class StoreCore(ContextCore):
    """One store instance; see the module docstring."""

    component = "store"

    def __init__(self, settings: StoreSettings, *, now: float = 0.0) -> None:
        super().__init__(settings.name, settings.ip, lbmr_port=settings.lbmr_port,
                         resolver=settings.resolver)
        self.settings = settings
        self.addr: Addr = (settings.ip, settings.port)
        self.now = now
        self._rng = random.Random(settings.seed)
        self.sources: dict[int, SourceState] = {}
        self.receivers: dict[int, ReceiverState] = {}
        self._sessions: dict[tuple[str, str, int, int], int] = {}
        # (request address, transport index, topic index) -> topic name -> transport, the
        # newest advertisement last
        self._tirs: dict[tuple[Addr, int, int], dict[str, Addr]] = {}
        self._routes: dict[tuple[Addr, int], SourceState] = {}
        self._lbtru_sids: dict[Addr, int] = {}  # LBT-RU/-RM transport address -> session ID
        self._lbtrm_groups: dict[Addr, Addr] = {}  # LBT-RM transport -> (group, port)
        if settings.lbtru_port:
            self.lbtru_ports.add(settings.lbtru_port)
        self._resolve_turn = 0  # where the next "resolve" timer's topic queries start
        self._rxq: deque[tuple[ReceiverState, int]] = deque()
        self.rx = RetransmissionStats(since=now)
        self._rate = max(1, settings.retransmission_request_processing_rate)
        self._rx_budget = float(self._rate) / 10
        self._rx_budget_at = now
        self._journal_path: Path | None = None
        self._journal_fh: TextIO | None = None
        self._journal_due: dict[int, int] = {}  # receiver RegID -> newest ACK to journal
        self._touched: list[SourceState] = []  # sources that got data in the current chunk
        # (transport index, topic index) -> the values of a stability ACK (seqnum varies)
        self._ack_templates: dict[tuple[int, int], list[int]] = {}
        self._lock_fd: int | None = None  # held while the store runs on its state directory
        self._proxy: ProxyElection | None = None  # proxy-source elections (allow-proxy-source)
        self._proxy_keys: dict[int, SourceKey] = {}  # watched source RegID -> election key
        # proxied source RegID -> the receivers' connections to its proxy (closed with it)
        self._proxy_conns: dict[int, list[Connection]] = {}
        self._proxy_start()
        if settings.disk_state_directory is not None:
            directory = Path(settings.disk_state_directory)
            self._journal_path = state_file(directory, settings.name)
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreFileError(directory, f"the state directory cannot be created: "
                                                f"{exc.strerror or exc}") from None
            self._lock_fd = lock_state(lock_file(directory, settings.name))
            try:
                self._restore()
                # opened now and kept open: whatever later happens to the path (the directory
                # removed, a directory put in its place) cannot fail a registration mid-run
                self._open_journal()
            except BaseException:
                self._unlock()
                raise
        self.set_timer("check", now + self._check_interval())
        self.set_timer("resolve", now)
        self._advertise_name()  # "Store sends ads at startup and in response to queries"

    def use_lbtru_port(self, port: int) -> None:
        """Receive LBT-RU transports on ``port`` instead (before anything was joined: the
        driver found the chosen port taken when it came to bind it)."""
        self.lbtru_ports.discard(self.settings.lbtru_port)
        self.settings = replace(self.settings, lbtru_port=port)
        self.lbtru_ports.add(port)

    # --- small helpers ------------------------------------------------------------------------

    def _check_interval(self) -> float:
        intervals = [s.policy.source_check_interval for s in self.sources.values()]
        return (min(intervals) if intervals else TopicPolicy().source_check_interval) / 1000

    def _new_reg_id(self) -> int:
        while True:
            reg_id = self._rng.randint(1, MAX_REGID)
            if reg_id not in self.sources and reg_id not in self.receivers:
                return reg_id

    def _send_client(self, client: Client, data: bytes) -> None:
        if client.conn is not None and client.conn.open:
            self.write(client.conn, data)
            client.last_sent = self.now

    def _respond(self, conn: Connection, preg: Header, *, reg_id: int, error: int = 0,
                 old: bool = False, low: int = 0, high: int = 0, rpp: bool = False) -> None:
        if error:
            resp = UmePregResp(e_flag=1, error_code=error, s_flag=preg.s_flag,
                               marker=preg.marker, reg_id=reg_id,
                               transport_idx=preg.transport_idx, topic_idx=preg.topic_idx)
        else:
            resp = UmePregResp(o_flag=int(old), w_flag=int(rpp), d_flag=preg.d_flag,
                               s_flag=preg.s_flag, marker=preg.marker, reg_id=reg_id,
                               transport_idx=preg.transport_idx, topic_idx=preg.topic_idx,
                               low_seqnum=low & MAX_REGID, high_seqnum=high & MAX_REGID)
        store_id = self.settings.port & 0x7FFF
        self.write(conn, control(resp, UmeStoreid(store_id=store_id)))

    def _reject(self, conn: Connection, preg: Header, code: PregError, text: str) -> None:
        role = "source" if preg.s_flag else "receiver"
        self._respond(conn, preg, reg_id=preg.reg_id, error=code)
        self.emit(ClientRejected(role, preg.reg_id, int(code), text))
        self.log(Level.WARNING, f"{role} registration (RegID {preg.reg_id}) refused: {text}")

    # --- topic resolution ---------------------------------------------------------------------

    def _advertise_name(self) -> None:
        """Advertise the store's context name with its address (the answer sources with
        ``ume_store_name`` wait for): an LBMR context-information record, name and IP flags
        set, the port being the store port registrations go to."""
        name = self.settings.context_name
        if name is not None:
            self.send_lbmr(lbmr.LbmrPacket(type=lbmr.PacketType.EXT, ext=lbmr.CtxInfo(
                hop_count=0, ip_flag=1, name_flag=1, port=self.addr[1], ip=self.addr[0],
                instance=bytes(8), name=name)))

    def _on_context_info(self, info: lbmr.Record, addr: Addr) -> None:
        """A context-name query for our name gets our advertisement; someone else advertising
        our name gets a warning in the log (the guide: context names are unique network-wide,
        and umestored warns about an advertisement of its own name)."""
        name = self.settings.context_name
        if name is None or not info.name_flag or info.name != name:
            return
        if info.query:
            self._advertise_name()
        elif not info.ip_flag or (info.ip, info.port) != self.addr:
            where = f"{info.ip}:{info.port}" if info.ip_flag else f"{addr[0]}:{addr[1]}"
            self.log(Level.WARNING, f"another context advertises this store's context-name "
                                    f"{name!r} ({where})")

    def on_lbmr(self, packet: lbmr.LbmrPacket, addr: Addr) -> None:
        if packet.tqrs and self._proxy is not None:  # a proxy source answers for its topic
            self._proxy_advertise({getattr(q, "name", None) for q in packet.tqrs})
        if isinstance(packet.ext, lbmr.CtxInfo):
            self._on_context_info(packet.ext, addr)
        for tir in packet.tirs:
            if not isinstance(tir, lbmr.Tir):
                continue  # queue records (QIR, type 6 packets) say nothing about sources
            ume = next((o for o in (tir.options or []) if isinstance(o, lbmr.ToptUme)), None)
            info = tir.info
            if ume is None:
                continue
            if isinstance(info, lbmr.LbtrmInfo):
                transport = (info.src_addr, info.src_ucast_port)
                group = (info.mcast_addr, info.udp_dest_port)
                if not self.lbtrm_tir_ok(info, addr) or \
                        not self._lbtrm_advertised(transport, group, info.session_id, tir.name):
                    continue
            elif isinstance(info, lbmr.LbtruInfo | lbmr.LbtruSidInfo) \
                    and self.settings.lbtru_port:
                transport = (info.ip, info.port)
                if not self._lbtru_advertised(transport, getattr(info, "session_id", 0),
                                              tir.name):
                    continue
            elif isinstance(info, lbmr.TcpInfo | lbmr.TcpSidInfo):
                transport = (info.ip, info.port)
            else:
                continue
            key = ((ume.src_tcp_addr, ume.src_tcp_port), ume.transport_idx, tir.index)
            names = self._tirs.setdefault(key, {})
            names.pop(tir.name, None)  # the newest advertisement of a name goes last
            names[tir.name] = transport
            for src in self.sources.values():
                if src.topic == tir.name and \
                        (src.request_addr, src.transport_idx, src.topic_idx) == key:
                    self._join_transport(src, transport)

    def _lbtrm_advertised(self, transport: Addr, group: Addr, sid: int, topic: str) -> bool:
        """Note an LBT-RM transport's group and session ID; when a topic we store from that
        transport is advertised under another ID, that is the source's new run: it takes over
        (see the module docstring) from the provisional session that started at its first
        datagram, else from now, keeping every route.  False for an advertisement of a run
        already replaced (a stale TIR): ignored."""
        if sid in self.lbtrm_retired.get(transport, ()):
            return False
        self._lbtrm_groups[transport] = group
        self._lbtru_sids[transport] = sid
        old = self.lbtru_receiving(transport)
        if old is not None and old.group is not None \
                and getattr(old.session, "session_id", sid) != sid \
                and any(s.topic == topic and s.transport == transport
                        for s in self.sources.values()) \
                and self.promote_lbtrm(transport, sid) is None:
            # on_lbtru_event hears SessionReset; the new run may send to another group
            self.swap_lbtrm_session(old, sid, group)
        return True

    def _lbtru_advertised(self, transport: Addr, sid: int, topic: str) -> bool:
        """:meth:`_lbtrm_advertised` for LBT-RU: a TIR of a topic we store from
        ``transport`` under another session ID is the source's new run on its old port, and
        our session moves to it (else it would go on asking the new run to connect under the
        old ID); False for a stale TIR of a run already replaced."""
        if sid in self.lbtrm_retired.get(transport, ()):
            return False
        self._lbtru_sids[transport] = sid
        old = self.lbtru_receiving(transport)
        if old is not None and old.group is None \
                and isinstance(old.session, LbtruReceiverSession) \
                and old.session.session_id != sid \
                and any(s.topic == topic and s.transport == transport
                        for s in self.sources.values()):
            self._transport_new_session(self.swap_lbtru_session(old, sid))
        return True

    def _transport_new_session(self, binding: LbtruBinding) -> None:
        """Our LBT-RU or LBT-RM session of a source was replaced by its new run's (see
        :meth:`~reference_impl.context.ContextCore.swap_lbtrm_session`)."""
        session, conn = binding.session, binding.conn
        assert isinstance(session, LbtruReceiverSession) and conn is not None
        transport = conn.remote
        self._lbtru_sids[transport] = session.session_id
        for src in self.sources.values():
            if src.transport == transport:
                src.lbtru_sid = session.session_id
        kind = "LBT-RU" if binding.group is None else "LBT-RM"
        self.log(Level.INFO, f"{kind} transport {transport[0]}:{transport[1]}: new session "
                             f"{session.session_id:#x} (the source restarted)")

    def _join_transport(self, src: SourceState, transport: Addr) -> None:
        """Receive ``src`` on ``transport`` as well.

        A route already working stays until its connection goes: a second advertisement with
        the source's request address, indexes and topic but another transport (a stale TIR, a
        stranger's forgery) must not cut the store off the transport the source really sends
        on, so data is accepted from every transport the source was advertised on."""
        if src.tir_seen and self._routes.get((transport, src.topic_idx)) is src:
            return
        if not self._receiving(src):
            # the route that names the source (web monitor, SRI answers) moves only when the
            # one it names does not work; a further route is added either way
            src.transport, src.lbtru_sid = transport, self._lbtru_sids.get(transport)
        src.tir_seen = True
        self._routes[(transport, src.topic_idx)] = src
        sid = self._lbtru_sids.get(transport)
        conn = self._transport_conn(transport)
        group = self._lbtrm_groups.get(transport)
        if conn is None and sid is not None and group is not None:
            # joined as soon as opened (see the module docstring): answer now
            binding = self.open_lbtrm_receiver(group, transport, sid, tag="transport")
            assert binding.conn is not None
            self.on_connected(binding.conn)
        elif conn is None and sid is not None:
            if self.lbtru_receiving(transport) is None:  # answered once connected
                self.open_lbtru_receiver(self.settings.lbtru_port, transport, sid,
                                         tag="transport")
        elif conn is None:
            self.send_to(transport, b"", tag="transport")  # answered once connected
        elif conn.open and src.pending_response is not None:
            # already receiving that transport (another topic of the same source context):
            # nothing will connect, so answer the registration now
            self._hello(src, conn)
            self._answer(src)
        # Ask for SRI so this store sees the source complete its registration (semantics §1.1.6)
        if src.active:
            self.send_to(src.request_addr, control(SriReq(transport_idx=src.transport_idx,
                                                          topic_idx=src.topic_idx)))

    def _receiving(self, src: SourceState) -> bool:
        """Whether ``src`` is already being received on the transport it names."""
        if src.transport is None or not src.tir_seen \
                or self._routes.get((src.transport, src.topic_idx)) is not src:
            return False
        if src.lbtru_sid is not None:
            return self.lbtru_receiving(src.transport) is not None
        conn = self._transport_conn(src.transport)
        return conn is not None and conn.open

    def _drop_routes(self, src: SourceState) -> None:
        for key in [k for k, routed in self._routes.items() if routed is src]:
            del self._routes[key]

    def _find_tir(self, src: SourceState) -> None:
        names = self._tirs.get((src.request_addr, src.transport_idx, src.topic_idx))
        transport = names.get(src.topic) if names else None
        if transport is not None:
            self._join_transport(src, transport)

    # --- messages -----------------------------------------------------------------------------

    def on_message_run(self, conn: Connection, data: bytes) -> int:
        # the recovery hot path: a receiver's retransmission requests (one per message) and
        # consumption ACKs back to back in a chunk, read in place; exactly what
        # on_raw_message does with each (neither shape is a data message); anything else ends
        # the run
        if conn.outgoing:
            return 0
        rx_size, ack_size = _RXREQ_IN.size, _ACK_IN.size
        rx_unpack, ack_unpack = _RXREQ_IN.codec.unpack_from, _ACK_IN.codec.unpack_from
        rx_head, ack_head = _RXREQ_IN.head, _ACK_IN.head
        heads = len(rx_head)
        on_rxreq, on_ack = self._on_rxreq, self._on_ack
        pos, end = 0, len(data)
        while True:
            left = end - pos
            if left >= rx_size:
                values = rx_unpack(data, pos)
                if values[:heads] == rx_head:
                    pos += rx_size
                    on_rxreq(conn, values[_RXREQ_ID], values[_RXREQ_SQN], rx_size)
                    continue
            if left >= ack_size:
                values = ack_unpack(data, pos)
                if values[:heads] == ack_head:
                    pos += ack_size
                    ack_type, rcv_reg_id, id_2, seqnum = (values[i] for i in _ACK_FIELDS)
                    on_ack(conn, ack_type, rcv_reg_id, id_2, seqnum, ack_size)
                    continue
            return pos

    def on_raw_message(self, conn: Connection, raw: bytes) -> None:
        # the hot path: data messages from a transport are stored without a full decode
        size = len(raw)
        if size >= _DATA_SIZE:
            ver_type, next_hdr, _, tidx, sqn = _DATA_UNPACK(raw, 0)
            mtype = ver_type & _TYPE_MASK
            if next_hdr == NHDR_DATA and mtype in _DATA_TYPE_CODES:
                src = self._routes.get((conn.key[1], tidx)) if conn.outgoing else None
                if src is None and mtype == MessageType.PRORX:
                    src = self._source_on(conn, tidx)
                if src is None and mtype == MessageType.RETRANS and conn.outgoing:
                    src = self._otr_answer(conn, tidx, sqn)
                if src is not None:
                    self._persist(src, sqn, raw)
                    return
        if not (conn.outgoing and conn.tag == "transport"):
            # receivers' retransmission requests and consumption ACKs, without a full decode
            if size == _RXREQ_IN.size:
                values = _RXREQ_IN.unpack(raw)
                if values is not None:
                    self._on_rxreq(conn, values[_RXREQ_ID], values[_RXREQ_SQN], size)
                    return
            elif size == _ACK_IN.size:
                values = _ACK_IN.unpack(raw)
                if values is not None:
                    ack_type, rcv_reg_id, id_2, seqnum = (values[i] for i in _ACK_FIELDS)
                    self._on_ack(conn, ack_type, rcv_reg_id, id_2, seqnum, size)
                    return
        super().on_raw_message(conn, raw)

    def on_chunk_done(self, conn: Connection) -> None:
        """Write what the chunk's messages owe: their repository files first (the store never
        calls a message stable before it is in the OS), then one write of stability ACKs per
        source, then the acknowledgement journal."""
        touched = self._touched
        if touched:
            self._touched = []
            for src in touched:
                src.touched = False
                if src.repo is not None:
                    src.repo.sync()
                if src.ack_due:
                    sqns, src.ack_due = src.ack_due, []
                    self._send_client(src, self._stable_acks(src, sqns))
        if self._journal_due:
            due, self._journal_due = self._journal_due, {}
            self._journal_lines([{"ack": reg_id, "sqn": sqn} for reg_id, sqn in due.items()])

    def _source_on(self, conn: Connection, tidx: int) -> SourceState | None:
        tag = conn.tag
        if isinstance(tag, SourceState) and tag.topic_idx == tidx:
            return tag
        return None

    def on_message(self, conn: Connection, message: LbmcMessage, raw: bytes) -> None:
        peer = conn.remote
        if message.is_data_type:
            src = self._routes.get((peer, message.tidx)) if conn.outgoing else \
                self._source_on(conn, message.tidx)
            if src is None and conn.outgoing and message.type == MessageType.RETRANS:
                src = self._otr_answer(conn, message.tidx, message.sqn)
            if src is None:
                if not conn.outgoing:
                    self.drop(peer, f"data for unknown topic index {message.tidx}", len(raw))
                return  # other topics of a shared transport session are not ours
            self._persist(src, message.sqn, raw)
            return
        if conn.outgoing and conn.tag == "transport":
            return  # SRI and other control traffic on the source's transport
        if message.header(UmePsrcElectionToken) is not None:
            self._on_proxy_claim(conn, raw)  # another store's proxy registration
            return
        sri_req = message.header(SriReq)
        if sri_req is not None and self._proxy_sri(conn, sri_req):
            return  # a late receiver asking our proxy source
        handled = False
        for header in message.headers:
            if isinstance(header, UmePreg):
                self._on_preg(conn, message, header)
                handled = True
                break
            if isinstance(header, UmeAck):
                self._on_ack(conn, header.type, header.rcv_reg_id, header.id_2, header.seqnum,
                             len(raw))
                handled = True
            elif isinstance(header, UmeRxreq):
                self._on_rxreq(conn, header.id_2, header.seqnum, len(raw))
                handled = True
            elif isinstance(header, UmeKeepalive):
                self._on_keepalive(conn, header, len(raw))
                handled = True
        if not handled and not conn.outgoing:
            self.drop(peer, f"no store request in message ({message.label()})", len(raw))

    def on_connection_lost(self, conn: Connection, *, refused: bool) -> None:
        if isinstance(conn.tag, ProxyPeer):
            self._proxy_peer_lost(conn.tag)
            return
        if conn.tag == "transport":
            lost = [(key, src) for key, src in self._routes.items() if key[0] == conn.remote]
            for key, _ in lost:
                del self._routes[key]
            orphans = []
            for _, src in lost:
                # fall back on another transport the source was advertised on, if any
                other = next((t for (t, _), s in self._routes.items() if s is src), None)
                if other is not None:
                    src.transport, src.lbtru_sid = other, self._lbtru_sids.get(other)
                else:
                    src.tir_seen = False
                    if src.active and not refused:
                        orphans.append(src.topic)
            # a transport that worked went away: ask for its sources' advertisements at once,
            # as one that restarted on the same address answers (a refused connection waits for
            # the "resolve" timer instead, so a stale advertisement cannot make this loop)
            for i in range(0, len(orphans), _TQRS_PER_QUERY):
                self.send_lbmr(lbmr.LbmrPacket(tqrs=[
                    lbmr.Tqr(name=t) for t in orphans[i:i + _TQRS_PER_QUERY]]))
        elif isinstance(conn.tag, Client) and conn.tag.conn is conn:
            conn.tag.conn = None

    # --- registration -------------------------------------------------------------------------

    def _on_preg(self, conn: Connection, message: LbmcMessage, preg: Header) -> None:
        topic_hdr = message.header(Topicname)
        sid_hdr = message.header(UmeSid)
        life_hdr = message.header(UmeClientLifetime)
        session_id = sid_hdr.sid if sid_hdr is not None else 0
        request_addr = (preg.resp_ip, preg.resp_port)
        topic = topic_hdr.topic if topic_hdr is not None else None
        if preg.s_flag:
            if topic is None:
                names = self._tirs.get((request_addr, preg.transport_idx, preg.topic_idx))
                topic = next(reversed(names)) if names else None  # the newest advertised
            if topic is None:
                self._reject(conn, preg, PregError.ENOPATTERN,
                             "topic unknown: no topic name in the registration and no TIR seen")
                return
            if "\0" in topic:
                # a NUL ends a name in topic resolution: such a topic can be neither queried
                # nor advertised, so the store could never join the source's transport
                self._reject(conn, preg, PregError.ETOPICNAME,
                             f"topic name {topic!r} contains a NUL byte")
                return
            self._register_source(conn, message, preg, topic, session_id, request_addr,
                                  life_hdr)
        else:
            self._register_receiver(conn, message, preg, topic, session_id, request_addr,
                                    life_hdr)

    def _lifetimes(self, life: Header | None, timeout_ms: int,
                   lifetime_ms: int) -> tuple[float, float]:
        """(activity timeout, state lifetime) in seconds for a new source or receiver, from
        its client-lifetime header and the topic's values (docs/semantics.md §1.11): the
        client's activity timeout replaces the store's; of the two state lifetimes the
        shorter wins, 0 meaning none on either side."""
        activity = timeout_ms
        lifetime = lifetime_ms
        if life is not None:
            if life.activity_tmo:
                activity = life.activity_tmo
            if life.lifetime:
                lifetime = min(lifetime, life.lifetime) if lifetime else life.lifetime
        return activity / 1000, lifetime / 1000

    def _source_rpp(self, message: LbmcMessage, preg: Header,
                    policy: TopicPolicy) -> RppValues | None:
        """The effective RPP values a source registration asks for (``None``: SPP), by the
        rules of :mod:`reference_impl.rpp`; :class:`RppRefused` for a registration they
        refuse.  A store without RPP (profile ``pre-5.3``) reads neither flag nor options."""
        if not self.settings.rpp_supported:
            return None
        options = parse_options(message)
        if not preg.w_flag:
            if options:
                first = options[0]
                raise RppRefused(f"contradictory RPP registration: option {first.name} "
                                 f"{first.value} without the RPP flag", first.name)
            return None
        return effective_values(policy, requested_overrides(options),
                                disk=policy.repository_type == "disk")

    def _register_source(self, conn: Connection, message: LbmcMessage, preg: Header,
                         topic: str, session_id: int, request_addr: Addr,
                         life: Header | None) -> None:
        policy = self.settings.policy_for(topic)
        if policy is None:
            self._reject(conn, preg, PregError.ENOPATTERN,
                         f"no topic pattern of this store matches {topic!r}")
            return
        rpp = bool(preg.w_flag) and self.settings.rpp_supported
        reg_id = preg.reg_id
        if preg.d_flag:
            self._deregister(conn, preg, self.sources.get(reg_id))
            return
        if session_id and not reg_id:
            reg_id = self._sessions.get(("source", topic, session_id, 0), 0)
        existing = self.sources.get(reg_id) if reg_id else None
        if reg_id and existing is None and reg_id in self.receivers:
            self._reject(conn, preg, PregError.EREGID, f"RegID {reg_id} is in use by a receiver")
            return
        if existing is not None:
            if existing.holds_regid(self.now) and \
                    not self._same_client(existing, conn, preg, request_addr, session_id):
                left = existing.activity_timeout - (self.now - existing.last_activity)
                owner, claim = existing.request_addr, request_addr
                self._reject(conn, preg, PregError.EACTIVE,
                             f"RegID {reg_id} is in use by a different source (held by "
                             f"{owner[0]}:{owner[1]} indexes {existing.transport_idx}/"
                             f"{existing.topic_idx}; asked by {claim[0]}:{claim[1]} from "
                             f"{conn.remote[0]} indexes {preg.transport_idx}/{preg.topic_idx}"
                             + (f"; free in {left:.1f} s unless it is heard from)"
                                if existing.activity_timeout > 0 else ")"))
                return
            if existing.topic != topic:
                self._reject(conn, preg, PregError.ETOPICNAME,
                             f"topic {topic!r} does not match the registration's "
                             f"{existing.topic!r}")
                return
            if existing.session_id and session_id and existing.session_id != session_id:
                self._reject(conn, preg, PregError.ECONFIG,
                             "Session ID differs from the repository's")
                return
            try:
                values = self._source_rpp(message, preg, existing.policy)
            except RppRefused as exc:
                self._reject(conn, preg, PregError.ECONFIG, str(exc))
                return
            refusal = reregistration_refusal(
                role="source", old_mode=existing.rpp, new_mode=int(rpp),
                old_values=existing.rpp_values, new_values=values)
            if refusal is not None:
                self._reject(conn, preg, PregError.ECONFIG, refusal)
                return
            src = existing
            old = True
            if (src.transport_idx, src.topic_idx) != (preg.transport_idx, preg.topic_idx):
                self._drop_routes(src)  # data under the old topic index is not this source's
                src.tir_seen = False
            src.transport_idx, src.topic_idx = preg.transport_idx, preg.topic_idx
            if src.request_addr != request_addr or src.transport is None:
                src.tir_seen = False
            src.request_addr = request_addr
        else:
            if rpp and not policy.repository_allow_receiver_paced_persistence:
                self._reject(conn, preg, PregError.ECONFIG,
                             "registering as an RPP source but RPP is not allowed "
                             "(repository-allow-receiver-paced-persistence 0)")
                return
            try:
                values = self._source_rpp(message, preg, policy)
            except RppRefused as exc:
                self._reject(conn, preg, PregError.ECONFIG, str(exc))
                return
            if not reg_id:
                reg_id = self._new_reg_id()
            activity, lifetime = self._lifetimes(life, policy.source_activity_timeout,
                                                 policy.source_state_lifetime)
            src = SourceState("source", reg_id, topic, session_id, preg.transport_idx,
                              preg.topic_idx, request_addr, activity, lifetime,
                              policy=policy, rpp=int(rpp), rpp_values=values)
            try:
                src.repo = self._new_repository(src, new=True)
            except StoreFileError as exc:  # the store keeps serving everyone else
                self.log(Level.ERROR, f"source RegID {reg_id} topic {topic!r}: its cache file "
                                      f"cannot be used: {exc}")
                self._reject(conn, preg, PregError.ECONFIG,
                             f"the store cannot keep this source's messages: {exc}")
                return
            self.sources[reg_id] = src
            if session_id:
                self._sessions[("source", topic, session_id, 0)] = reg_id
            old = False
        src.conn, conn.tag = conn, src
        src.active, src.last_activity = True, self.now
        lead = src.repo.lead_sqn if src.repo is not None else None
        trail = src.repo.trail_sqn if src.repo is not None else None

        def respond() -> None:
            self._respond(conn, preg, reg_id=reg_id, old=old, low=trail or 0,
                          high=lead or 0, rpp=rpp)
            src.last_sent = self.now
        src.pending_response = respond
        self._journal_client(src)
        self.emit(ClientRegistered("source", reg_id, topic, session_id, old))
        self.log(Level.INFO, f"source RegID {reg_id} topic {topic!r} "
                             f"{'re-registered' if old else 'registered'}")
        self._proxy_registered(src, message, preg)
        self._find_tir(src)
        if not src.tir_seen:
            self.send_lbmr(lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=topic)]))
        transport = self._transport_conn(src.transport) if src.transport is not None else None
        if transport is not None and transport.open:
            self._hello(src, transport)
            self._answer(src)
        else:  # answer once on the source's transport (or after JOIN_WAIT, see module doc)
            self.set_timer(f"answer {reg_id}", self.now + JOIN_WAIT)
        self.set_timer_if_later("check", self.now + self._check_interval())

    def _same_client(self, owner: Client, conn: Connection, preg: Header,
                     request_addr: Addr, session_id: int) -> bool:
        """Whether a registration for ``owner``'s RegID provably comes from ``owner``, a
        source or a receiver (the rule and its limits are in the module docstring, "RegID
        ownership")."""
        if owner.conn is conn:
            return True  # a retried PREG on the owner's own connection
        if conn.remote[0] != owner.request_addr[0] or request_addr[0] != owner.request_addr[0]:
            return False  # from another host
        if owner.session_id or session_id:
            return owner.session_id == session_id  # the application's own name for itself
        if request_addr[1] == 0 or owner.request_addr != request_addr:
            return False  # another request port, or none to tell processes apart
        return owner.role == "receiver" or \
            (owner.transport_idx, owner.topic_idx) == (preg.transport_idx, preg.topic_idx)

    def _answer(self, src: SourceState) -> None:
        respond, src.pending_response = src.pending_response, None
        self.cancel_timer(f"answer {src.reg_id}")
        if respond is not None:
            respond()

    def on_connected(self, conn: Connection) -> None:
        if conn.tag == "transport":
            for src in list(self.sources.values()):
                if src.transport == conn.remote and src.pending_response is not None:
                    self._hello(src, conn)
                    self._answer(src)

    def _hello(self, src: SourceState, conn: Connection) -> None:
        """Tell the source on its own transport that this store now receives it (a store
        keepalive naming the source's RegID); the source completes registration only after
        this, so its first message cannot race the store's join.  LBT-RU carries nothing
        back to the source, so there it goes to the source's request port instead (which
        takes the same keepalive), once the session is connected."""
        hello = control(UmeKeepalive(
            type=KeepaliveType.STORE, transport_idx=src.transport_idx,
            topic_idx=src.topic_idx, reg_id=src.reg_id))
        if conn.datagrams:
            self.send_to(src.request_addr, hello)
        else:
            self.write(conn, hello)

    def _transport_conn(self, transport: Addr) -> Connection | None:
        """What receives the source's ``transport``: our LBT-TCP connection to it, or the
        stand-in connection of our LBT-RU session once that is connected; None before."""
        binding = self.lbtru_receiving(transport)
        if binding is not None:
            connected = binding.group is not None or getattr(binding.session, "connected", False)
            return binding.conn if connected else None
        return self.connection_to(transport)

    def on_lbtru_event(self, binding: LbtruBinding, event: LbtruEvent) -> None:
        conn = binding.conn
        if conn is None:
            return
        if isinstance(event, Connected):
            self.on_connected(conn)  # joined: answer the registrations that waited for it
        elif isinstance(event, SessionReset) and binding.group is not None:
            self._transport_new_session(binding)
        elif isinstance(event, Lost):
            # the store does not recover from the source: what it missed it never holds, and
            # receivers that ask for it get nothing from this store (another may have it)
            self.stats["lbtru_lost"] = self.stats.get("lbtru_lost", 0) + \
                event.last - event.first + 1
            for (transport, _), src in self._routes.items():
                if transport == conn.remote:
                    # the next live messages show which (NACK); several losses may come
                    # before the first of them, so they are counted, not flagged
                    src.loss_pending += 1
            kind = "LBT-RU" if binding.group is None else "LBT-RM"
            self.log(Level.WARNING, f"{kind} transport {conn.remote[0]}:{conn.remote[1]} lost "
                                    f"sqn {event.first}..{event.last} ({event.reason})")
        elif isinstance(event, SourceTimedOut | ConnectFailed):
            self.close_lbtru(binding)  # like a transport connection that went away
            self.on_connection_lost(conn, refused=isinstance(event, ConnectFailed))

    def _new_repository(self, src: SourceState, *, new: bool) -> Repository:
        """The repository of a new registration (``new``: an orphan cache file is discarded)
        or of a restored one; what opening its cache file cut or discarded is logged.  Raises
        :class:`StoreFileError` when the cache file cannot be used."""
        p = src.policy
        values = src.rpp_values
        if src.rpp and values is not None:  # RPP: the source's effective values
            limits = RetentionLimits(
                values.size_threshold, values.size_limit, float(p.repository_age_threshold),
                values.disk_file_size_limit, rpp=True,
                write_delay=values.write_delay / 1000 if p.repository_type == "disk" else 0.0)
        else:
            limits = RetentionLimits(p.repository_size_threshold, p.repository_size_limit,
                                     float(p.repository_age_threshold),
                                     p.repository_disk_file_size_limit, rpp=bool(src.rpp))
        cache = None
        if p.repository_type == "disk":
            base = self.settings.disk_cache_directory or Path("umestored-cache")
            cache = cache_file(Path(base), self.settings.name, src.reg_id)
        repo = Repository(limits, cache_file=cache, write_behind=True, new=new)
        for note in repo.notes:
            self.log(Level.WARNING, f"source RegID {src.reg_id}: {note}")
        return repo

    def _register_receiver(self, conn: Connection, message: LbmcMessage, preg: Header,
                           topic: str | None, session_id: int, request_addr: Addr,
                           life: Header | None) -> None:
        src = self.sources.get(preg.src_reg_id)
        if src is None:
            self._reject(conn, preg, PregError.ESRCREGID,
                         f"source RegID {preg.src_reg_id} not found")
            return
        if preg.d_flag:
            self._deregister(conn, preg, self.receivers.get(preg.reg_id))
            return
        mode = SPP
        if self.settings.rpp_supported:  # a pre-5.3 store reads neither flag nor options
            try:
                mode = receiver_mode(preg.w_flag, parse_options(message))
            except RppRefused as exc:
                self._reject(conn, preg, PregError.ECONFIG, str(exc))
                return
        reg_id = preg.reg_id
        if session_id:
            reg_id = self._sessions.get(("receiver", src.topic, session_id, src.reg_id), reg_id)
        existing = self.receivers.get(reg_id) if reg_id else None
        if reg_id and existing is None and reg_id in self.sources:
            self._reject(conn, preg, PregError.EREGID, f"RegID {reg_id} is in use by a source")
            return
        policy = src.policy
        if existing is not None and existing.source_reg_id != src.reg_id:
            # one source's RegID at this store, even to its owner (see the module docstring)
            if existing.holds_regid(self.now):
                self._refuse_held(conn, preg, existing, request_addr,
                                  f"RegID {reg_id} is in use by a receiver of source RegID "
                                  f"{existing.source_reg_id}")
                return
            self._delete_client(existing, "re-registered for another source")
            existing = None
        if existing is not None:
            if existing.holds_regid(self.now) and \
                    not self._same_client(existing, conn, preg, request_addr, session_id):
                self._refuse_held(conn, preg, existing, request_addr,
                                  f"RegID {reg_id} is in use by another receiver")
                return
            refusal = reregistration_refusal(role="receiver", old_mode=existing.rpp,
                                             new_mode=mode)
            if refusal is not None:
                self._reject(conn, preg, PregError.ECONFIG, refusal)
                return
        if src.rpp and not mode:
            self._reject(conn, preg, PregError.ECONFIG,
                         "non-RPP receiver attempting to register to an RPP topic")
            return
        if mode and not src.rpp:
            kind = "blocking" if mode == BLOCKING else "non-blocking"
            self._reject(conn, preg, PregError.ECONFIG,
                         f"{kind} RPP receiver ({RPP_OPTION} {mode}) on an SPP repository")
            return
        if existing is not None:
            rcv = existing
            old = True
            rcv.request_addr = request_addr
        else:
            if not reg_id:
                reg_id = self._new_reg_id()
            activity, lifetime = self._lifetimes(life, policy.receiver_activity_timeout,
                                                 policy.receiver_state_lifetime)
            rcv = ReceiverState("receiver", reg_id, src.topic, session_id, preg.transport_idx,
                                preg.topic_idx, request_addr, activity, lifetime, rpp=mode,
                                source_reg_id=src.reg_id)
            self.receivers[reg_id] = rcv
            src.receivers[reg_id] = rcv
            if session_id:
                self._sessions[("receiver", src.topic, session_id, src.reg_id)] = reg_id
            old = False
        rcv.conn, conn.tag = conn, rcv
        rcv.active, rcv.last_activity = True, self.now
        src.warned.discard(reg_id)
        repo = src.repo
        lead = repo.lead_sqn if repo is not None and repo.lead_sqn is not None else None
        trail = repo.trail_sqn if repo is not None else None
        if old and rcv.last_ack is not None:
            low = rcv.last_ack + 1
        elif old and rcv.floor is not None:
            low = rcv.floor + 1  # RPP: everything since its first registration
        elif lead is None:
            low = 0
        elif src.rpp:
            # "Late Registering Receiver": nothing sent before its first registration, or
            # (guide profile) what the repository still holds, not yet consumed by all
            low = trail if self.settings.rpp_late_join_unconsumed and trail is not None \
                else lead + 1
        else:
            rollback = policy.receiver_new_registration_rollback
            low = max(trail if trail is not None else 0, lead + 1 - rollback)
        if mode and rcv.floor is None:
            rcv.floor = low - 1
        self._respond(conn, preg, reg_id=reg_id, old=old, low=low, high=lead or 0,
                      rpp=bool(mode))
        rcv.last_sent = self.now
        self._journal_client(rcv)
        self.emit(ClientRegistered("receiver", reg_id, src.topic, session_id, old))
        self.log(Level.INFO, f"receiver RegID {reg_id} for source RegID {src.reg_id} "
                             f"{'re-registered' if old else 'registered'}, low sqn {low}")

    def _refuse_held(self, conn: Connection, preg: Header, holder: Client, claim: Addr,
                     what: str) -> None:
        """Refuse a receiver registration for a RegID ``holder`` still owns (code 3, which
        the receiver retries), saying who holds it, who asked and when it frees."""
        left = holder.activity_timeout - (self.now - holder.last_activity)
        owner = holder.request_addr
        self._reject(conn, preg, PregError.EREGID,
                     f"{what} (held by {owner[0]}:{owner[1]}; asked by {claim[0]}:{claim[1]} "
                     f"from {conn.remote[0]}"
                     + (f"; free in {left:.1f} s unless it is heard from)"
                        if holder.activity_timeout > 0 else ")"))

    def _deregister(self, conn: Connection, preg: Header, client: Client | None) -> None:
        if client is None:
            self._reject(conn, preg, PregError.ESRCREGID if preg.s_flag else PregError.EREGID,
                         f"deregistration of unknown RegID {preg.reg_id}")
            return
        self._respond(conn, preg, reg_id=client.reg_id)
        self._delete_client(client, "deregistered")

    # --- data and acknowledgements -----------------------------------------------------------

    def _persist(self, src: SourceState, sqn: int, raw: bytes) -> None:
        """Keep a data message; its stability ACK waits for the end of the chunk (see
        :meth:`on_chunk_done`)."""
        repo = src.repo
        if repo is None:
            return
        now = self.now
        src.last_activity = now
        if src.lost and sqn in src.lost:
            self._nack(src, sqn)
            return
        if src.loss_pending:
            self._loss_gap(src, sqn, raw)
        if src.otr is not None and src.otr.received(sqn):
            self.stats["otr_recovered"] = self.stats.get("otr_recovered", 0) + 1
        result = repo.add(sqn, raw, now)
        if not src.touched:
            src.touched = True
            self._touched.append(src)
        if result.released:
            self._warn_unconsumed(src, result.released)
        if result.dropped:
            self.log(Level.WARNING, f"source RegID {src.reg_id}: repository size limit "
                                    f"reached, message {sqn} dropped")
            return
        high = src.high_received
        if high is None or sqn > high:
            src.high_received = sqn
        if src.rpp:
            self._rpp_received(src, repo, sqn, result.duplicate)
        elif src.policy.stability_ack_minimum_number > 1:
            self._stable(src, sqn)
        else:
            src.ack_due.append(sqn)  # the common case: one ACK per message, sent per chunk

    def _loss_gap(self, src: SourceState, sqn: int, raw: bytes) -> None:
        """The transport lost datagrams before this message: when it is live data, the
        sequence numbers between the last message received and it are lost (asked of the
        source by the store's OTR when it has one, else declared lost).  Each gap accounts
        for one loss (a run of lost datagrams); the rest stay pending for the next live
        messages (a second loss may be reported before the first gap shows)."""
        if raw[0] & _TYPE_MASK != MessageType.MESSAGE:
            return  # a proactive retransmission or retransmission says nothing of the gap
        high = src.high_received
        if high is None:
            src.loss_pending = 0
            return
        if sqn <= high + 1:
            return
        src.loss_pending -= 1
        if self.settings.otr is not None:
            self._otr_gap(src, high + 1, sqn)
        else:
            self.declare_lost(src, high + 1, sqn - 1)

    # --- the store's own off-transport recovery (reference_impl.otr) ------------------------

    def _otr_gap(self, src: SourceState, first: int, end: int) -> None:
        """The transport gave up on ``[first, end)`` and the store has ``use_otr`` 1
        (:attr:`StoreSettings.otr`): those it does not hold are asked of the source's request
        port, paced as a receiver's OTR (docs/semantics.md §1.9, "The store as an OTR
        requester"); more than :data:`MAX_LOST` back are declared lost at once."""
        settings = self.settings.otr
        assert settings is not None
        if end - first > MAX_LOST:
            self.declare_lost(src, first, end - MAX_LOST - 1)
            first = end - MAX_LOST
        if src.otr is None:
            src.otr = OtrCore(settings)
        otr, repo = src.otr, src.repo
        otr.gap(first, end, self.now)
        for sqn in range(first, end):
            if (repo is not None and sqn in repo) or sqn in src.lost:
                otr.received(sqn)
        self._arm_otr(src)

    def _arm_otr(self, src: SourceState) -> None:
        due = src.otr.deadline() if src.otr is not None else None
        if due is None:
            self.cancel_timer(f"otr {src.reg_id}")
        else:
            self.set_timer(f"otr {src.reg_id}", due)

    def _otr_due(self, src: SourceState) -> None:
        """Send the OTR requests now due to the source's request port (one RXREQ per
        number, ``id_2`` 0: the store holds no receiver RegID of the source), and declare
        lost what the source did not give within ``retransmit_request_message_timeout``."""
        otr = src.otr
        if otr is None:
            return
        for action in otr.due(self.now):
            sqns = action.sequence_numbers
            if isinstance(action, OtrLost):
                for first, last in _runs(sqns):
                    self.declare_lost(src, first, last)
                continue
            self.stats["otr_requests"] = self.stats.get("otr_requests", 0) + len(sqns)
            self.send_to(src.request_addr, b"".join(control(UmeRxreq(
                transport_idx=src.transport_idx, id_2=0, seqnum=sqn, request_idx=sqn,
                rx_port=self.addr[1], rx_ip=self.addr[0])) for sqn in sqns))
            self.log(Level.INFO, f"source RegID {src.reg_id}: off-transport recovery asks "
                                 f"{src.request_addr[0]}:{src.request_addr[1]} for "
                                 f"{len(sqns)} messages {sqns[0]}..{sqns[-1]} "
                                 f"(attempt {action.attempt})")
        self._arm_otr(src)

    def _otr_answer(self, conn: Connection, tidx: int, sqn: int) -> SourceState | None:
        """The source whose request port answered our OTR request with this retransmission
        (None: nothing of ours waits for it there)."""
        for src in self.sources.values():
            if src.otr is not None and src.request_addr == conn.remote \
                    and src.topic_idx == tidx and sqn in src.otr:
                return src
        return None

    def declare_lost(self, src: SourceState, first: int, last: int) -> int:
        """Declare ``src``'s messages ``first``..``last`` unrecoverably lost (those the
        repository does not hold): their late copies are NACKed from now on.  Returns how many
        were declared; logs a WARNING and counts them (``declared_lost``)."""
        repo = src.repo
        new = [sqn for sqn in range(max(first, last - MAX_LOST + 1), last + 1)
               if sqn not in src.lost and (repo is None or sqn not in repo)]
        if not new:
            return 0
        src.lost.update(new)
        if len(src.lost) > MAX_LOST:
            src.lost = set(sorted(src.lost)[-MAX_LOST:])
        self.stats["declared_lost"] = self.stats.get("declared_lost", 0) + len(new)
        self.log(Level.WARNING, f"source RegID {src.reg_id}: messages {new[0]}..{new[-1]} "
                                f"declared unrecoverably lost ({len(new)}); a late copy of "
                                f"them is NACKed")
        return len(new)

    def _nack(self, src: SourceState, sqn: int) -> None:
        """Answer a copy of a message declared lost with a stability NACK (the ACK's NAK bit),
        at once: NACKs are rare and need no batching."""
        self.stats["nacks"] = self.stats.get("nacks", 0) + 1
        self._send_client(src, control(UmeAck(
            flags=ACK_NAK, type=AckType.STABLE, transport_idx=src.transport_idx,
            id_2=src.topic_idx, seqnum=sqn)))
        self.log(Level.INFO, f"source RegID {src.reg_id}: message {sqn} was declared lost; "
                             f"its copy NACKed")

    def _rpp_received(self, src: SourceState, repo: Repository, sqn: int,
                      duplicate: bool) -> None:
        """An RPP message was kept ("RPP Normal Operations"): with no blocking receiver the
        repository releases by its size threshold; the stability ACK goes now (memory, no
        write delay, or ack on reception) or once the message is written (a disk repository
        with a write delay; sooner if every blocking receiver consumed it before)."""
        if not any(r.rpp == BLOCKING for r in src.receivers.values()):
            repo.release_to_threshold()
        if sqn in src.awaiting_write:
            return  # a duplicate of a message still waiting for its write: ACKed then
        delay = repo.limits.write_delay
        if delay > 0 and repo.kind == "disk":
            self.set_timer_if_later(f"write {src.reg_id}", self.now + delay)
            values = src.rpp_values
            if not duplicate and not (values is not None and values.ack_on_reception):
                src.awaiting_write[sqn] = None
                return
        self._stable(src, sqn)

    def _flight_bytes(self, src: SourceState) -> int:
        """The flight size in bytes an RPP source's stability ACKs are withheld by: its
        effective ``ume_flight_size_bytes``, not the topic's maximum."""
        values = src.rpp_values
        return values.flight_size_bytes if values is not None else \
            src.policy.source_flight_size_bytes_maximum

    def _room(self, src: SourceState) -> bool:
        """At least one flight size of room is left below the size limit (RPP)."""
        repo = src.repo
        return repo is None or repo.limits.size_limit - repo.used_bytes >= self._flight_bytes(src)

    def _stable(self, src: SourceState, sqn: int) -> None:
        p = src.policy
        if src.rpp and src.repo is not None and (src.unacked or not self._room(src)):
            src.unacked.append(sqn)  # withheld: less than one flight size of room left
            return
        if p.stability_ack_minimum_number > 1:
            src.unacked.append(sqn)
            if len(src.unacked) >= p.stability_ack_minimum_number:
                self._flush_acks(src)
            else:
                self.set_timer_if_later(f"acks {src.reg_id}",
                                        self.now + p.stability_ack_interval / 1000)
            return
        src.ack_due.append(sqn)

    def _stable_acks(self, src: SourceState, sqns: list[int]) -> bytes:
        """Stability ACKs for ``sqns``, back to back: one template packed through the ACK's
        derived layout, only the sequence number changing."""
        key = (src.transport_idx, src.topic_idx)
        values = self._ack_templates.get(key)
        if values is None:
            values = _ACK_IN.template(type=AckType.STABLE, transport_idx=src.transport_idx,
                                      id_2=src.topic_idx)
            self._ack_templates[key] = values
        pack = _ACK_IN.pack
        if len(sqns) == 1:
            values[_ACK_SEQNUM] = sqns[0]
            return pack(*values)
        out = []
        for sqn in sqns:
            values[_ACK_SEQNUM] = sqn
            out.append(pack(*values))
        return b"".join(out)

    def _flush_acks(self, src: SourceState) -> None:
        """Send every ACK owed to ``src`` now (a full batch, the batching timer, room again
        for a withheld RPP source).  This can happen in the middle of a chunk, before
        :meth:`on_chunk_done` wrote the chunk's messages, so the repository is written out
        first: durable before acknowledged (see the repository module docstring)."""
        sqns = [*src.ack_due, *src.unacked]
        src.ack_due = []
        src.unacked.clear()
        self.cancel_timer(f"acks {src.reg_id}")
        if sqns:
            if src.repo is not None:
                src.repo.sync()
            self._send_client(src, self._stable_acks(src, sqns))

    def _release_withheld(self, src: SourceState) -> None:
        if not src.unacked or src.repo is None:
            return
        if self._room(src):
            self._flush_acks(src)

    def _send_due(self, src: SourceState) -> None:
        """Send the stability ACKs owed now, outside the chunk of the source's data (a write
        delay ended, receivers consumed messages): the repository is written out first."""
        if src.ack_due:
            sqns, src.ack_due = src.ack_due, []
            if src.repo is not None:
                src.repo.sync()
            self._send_client(src, self._stable_acks(src, sqns))

    def _write_delayed(self, src: SourceState) -> None:
        """The write delay of some of ``src``'s messages ended: write them, then send the
        stability ACKs that waited for the write."""
        repo = src.repo
        if repo is None:
            return
        written = repo.write_due(self.now)
        repo.sync()
        for sqn in written:
            if src.awaiting_write.pop(sqn, 0) is None:
                self._stable(src, sqn)
        self._send_due(src)
        due = repo.next_write_at()
        if due is not None:
            self.set_timer(f"write {src.reg_id}", due)

    def _warn_unconsumed(self, src: SourceState, released: tuple[int, ...]) -> None:
        newest = released[-1]
        for rcv in src.receivers.values():
            if rcv.reg_id in src.warned:
                continue
            if rcv.last_ack is None or rcv.last_ack < newest:
                src.warned.add(rcv.reg_id)
                self.log(Level.WARNING,
                         f"source RegID {src.reg_id}: repository released message {newest} "
                         f"before receiver RegID {rcv.reg_id} consumed it")

    def _on_ack(self, conn: Connection, ack_type: int, rcv_reg_id: int, id_2: int, seqnum: int,
                size: int) -> None:
        rcv = self.receivers.get(rcv_reg_id) or self.receivers.get(id_2)
        if rcv is None or ack_type != AckType.CDELV:
            self.drop(conn.remote, f"ACK from unknown receiver RegID {rcv_reg_id}", size)
            return
        rcv.last_activity = self.now
        rcv.active = True
        if rcv.last_ack is None or seqnum > rcv.last_ack:
            rcv.last_ack = seqnum
            if self._journal_path is not None:
                self._journal_due[rcv.reg_id] = seqnum  # written once per chunk
        src = self.sources.get(rcv.source_reg_id)
        if src is not None and src.rpp:
            self._rpp_release(src)

    def _rpp_release(self, src: SourceState) -> None:
        """Release what every blocking receiver consumed (consumption is cumulative; non-
        blocking receivers hold nothing back); with no blocking receiver, release by the size
        threshold.  A message released while it waited for its write delay is never written,
        and its stability ACK goes at once ("Receiver Acknowledgement")."""
        repo = src.repo
        if repo is None:
            return
        consumed = [r.consumed() for r in src.receivers.values() if r.rpp == BLOCKING]
        if not consumed:
            released = repo.release_to_threshold()
        elif any(c is None for c in consumed):
            return
        else:
            released = repo.release_through(min(c for c in consumed if c is not None))
        if not released:
            return
        if src.awaiting_write:
            for sqn in released:
                if src.awaiting_write.pop(sqn, 0) is None:
                    self._stable(src, sqn)
            self._send_due(src)
        self._release_withheld(src)

    def _on_keepalive(self, conn: Connection, ka: Header, size: int) -> None:
        client: Client | None = conn.tag if isinstance(conn.tag, Client) else None
        if client is None:
            client = self.sources.get(ka.reg_id) or self.receivers.get(ka.reg_id)
        if client is None:
            self.drop(conn.remote, f"keepalive from unknown RegID {ka.reg_id}", size)
            return
        client.last_activity = self.now
        if ka.r_flag:
            self._keepalive(client)

    def _keepalive(self, client: Client) -> None:
        no_tir = isinstance(client, SourceState) and not client.tir_seen
        # a source a proxy would stand in for is asked to answer (R flag): an idle but live
        # source must not look gone at its activity timeout (see _proxy_start)
        answer = isinstance(client, SourceState) and client.reg_id in self._proxy_keys
        self._send_client(client, control(UmeKeepalive(
            r_flag=int(answer),
            t_flag=int(no_tir), type=KeepaliveType.STORE, transport_idx=client.transport_idx,
            topic_idx=client.topic_idx, reg_id=client.reg_id)))

    # --- retransmissions -------------------------------------------------------------------

    def _on_rxreq(self, conn: Connection, id_2: int, seqnum: int, size: int) -> None:
        rcv = self.receivers.get(id_2)
        if rcv is None:
            self.drop(conn.remote, f"RXREQ for sqn {seqnum} names unknown receiver RegID "
                                   f"{id_2}: nothing retransmitted", size)
            return
        src = self.sources.get(rcv.source_reg_id)
        high = src.high_received if src is not None else None
        if src is not None and src.repo is not None and seqnum not in src.repo and (
                high is None or 0 < (seqnum - high) & 0xFFFFFFFF < 1 << 31):
            # not held and ahead of anything the source sent here (serial arithmetic): a
            # request for a number the source never sent (e.g. a forged OTR request) is bad
            # input, and the receiver's activity is not refreshed by it
            self.drop(conn.remote, f"RXREQ from receiver RegID {id_2} for sqn {seqnum}, "
                                   f"beyond the newest the store has from its source "
                                   f"({'none' if high is None else high}): nothing "
                                   f"retransmitted", size)
            return
        rcv.last_activity = self.now
        self.rx.received += 1
        if len(self._rxq) >= 4 * self._rate:
            self.rx.dropped += 1
            self.rx.total_dropped += 1
            return
        self._rxq.append((rcv, seqnum))
        self._serve_retransmissions()

    def _serve_retransmissions(self) -> None:
        # token bucket: at most rate/s, bursts of a tenth of a second
        rate = self._rate
        if self.now != self._rx_budget_at:  # else nothing to add (a burst's requests)
            self._rx_budget = min(rate / 10,
                                  self._rx_budget + (self.now - self._rx_budget_at) * rate)
            self._rx_budget_at = self.now
        while self._rxq and self._rx_budget >= 1 - 1e-9:
            rcv, sqn = self._rxq.popleft()
            self._rx_budget -= 1
            src = self.sources.get(rcv.source_reg_id)
            raw = src.repo.get(sqn) if src is not None and src.repo is not None else None
            if raw is None or rcv.conn is None:
                continue
            self.rx.serviced += 1
            self._send_client(rcv, as_retransmission(raw))
        if self._rxq:
            # never less than 0.1 ms ahead: float rounding must not make the timer due again
            # at the same instant with the same empty budget
            self.set_timer("rx", self.now + max((1 - self._rx_budget) / rate, 1e-4))

    def reset_rate_stats(self) -> None:
        """The web monitor's "Reset Rate Stats"."""
        self.rx = RetransmissionStats(total_dropped=self.rx.total_dropped, since=self.now)

    # --- timers -------------------------------------------------------------------------------

    def on_timer(self, name: str) -> None:
        if name == "check":
            self._check_clients()
            self.set_timer("check", self.now + self._check_interval())
        elif name == "rx":
            self._serve_retransmissions()
        elif name == "resolve":
            # say hello to the resolver so it relays advertisements to us; ask for unknown TIRs,
            # _TQRS_PER_QUERY at a time, taking turns so that many sources gone quiet cannot
            # keep a new one from ever being asked for
            # (restored sources too, while their RegID is theirs: a restarted store rejoins
            # them before they re-register)
            now = self.now
            missing = [s.topic for s in self.sources.values()
                       if not s.tir_seen and (s.active or s.holds_regid(now))]
            start = self._resolve_turn % len(missing) if missing else 0
            turn = (missing[start:] + missing[:start])[:_TQRS_PER_QUERY]
            self._resolve_turn = start + len(turn)
            self.send_lbmr(lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=t) for t in turn]))
            self.set_timer("resolve", self.now + 1.0)
        elif name == "proxy":
            self._proxy_tick()
        elif name.startswith("answer "):
            src = self.sources.get(int(name.split()[1]))
            if src is not None:
                self._answer(src)
        elif name.startswith("acks "):
            src = self.sources.get(int(name.split()[1]))
            if src is not None:
                self._flush_acks(src)
        elif name.startswith("write "):
            src = self.sources.get(int(name.split()[1]))
            if src is not None:
                self._write_delayed(src)
        elif name.startswith("otr "):
            src = self.sources.get(int(name.split()[1]))
            if src is not None:
                self._otr_due(src)

    def _check_clients(self) -> None:
        now = self.now
        for client in [*self.sources.values(), *self.receivers.values()]:
            policy = client.policy if isinstance(client, SourceState) else \
                self._policy_of(client)
            if client.active and client.expired(now):
                client.active = False
                self.log(Level.NOTICE, f"{client.role} RegID {client.reg_id} inactive "
                                       f"(activity timeout)")
                self._proxy_timed_out(client)
            if not client.active and client.lifetime_over(now) \
                    and not self._proxy_keeps(client):
                reason = "state lifetime expired" if client.state_lifetime else \
                    "activity timeout"
                self._delete_client(client, reason)
                continue
            if client.active and now - client.last_sent >= policy.keepalive_interval / 1000:
                self._keepalive(client)

    def _policy_of(self, client: Client) -> TopicPolicy:
        src = self.sources.get(getattr(client, "source_reg_id", 0))
        return src.policy if src is not None else TopicPolicy()

    def _delete_client(self, client: Client, reason: str) -> None:
        if isinstance(client, SourceState):
            self._proxy_forget(client)
            self.sources.pop(client.reg_id, None)
            for rcv in list(client.receivers.values()):
                self.receivers.pop(rcv.reg_id, None)
            if client.repo is not None:
                client.repo.clear()  # RPP too: "RPP Deregistration" deletes them at once
            client.awaiting_write.clear()
            self.cancel_timer(f"write {client.reg_id}")
            self._drop_routes(client)
            key = ("source", client.topic, client.session_id, 0)
        else:
            assert isinstance(client, ReceiverState)
            self.receivers.pop(client.reg_id, None)
            src = self.sources.get(client.source_reg_id)
            if src is not None:
                src.receivers.pop(client.reg_id, None)
                if src.rpp:
                    self._rpp_release(src)
            key = ("receiver", client.topic, client.session_id, client.source_reg_id)
        if self._sessions.get(key) == client.reg_id:
            del self._sessions[key]
        self._journal({"delete": client.reg_id})
        self.emit(ClientStateDeleted(client.role, client.reg_id, reason))
        self.log(Level.NOTICE, f"{client.role} RegID {client.reg_id} state deleted ({reason})")

    # --- proxy sources (reference_impl/proxy.py has the election) ---------------------------

    def _proxy_start(self) -> None:
        """Proxy sources (guide "Proxy Sources"; docs/semantics.md §1.11): a store with
        ``allow-proxy-source`` runs a :class:`~reference_impl.proxy.ProxyElection` for every
        source that registered with the ``ume_proxy_src`` enable flag and an explicit RegID or
        Session ID, and drives it from its own events: the source's activity timeout starts
        the wait, its re-registration ends the election (and deletes a proxy of ours), the
        deletion of its state forgets it, claims from other stores arrive as their proxy's
        PREG on the store port, and a connection that carried claims going away is that
        store lost (a re-election when it held the proxy).  *Choices*: a source asking for a
        proxy with RegID 0 and no Session ID is registered but not watched (a WARNING says
        why); the store's keepalives to a watched source ask for an answer (R flag), so a
        live source that sends nothing is not taken for gone; a watched source without a
        state lifetime keeps its state after its activity timeout (the proxy stands in for
        it) until it returns or is deregistered, with a state lifetime its state (and the
        proxy) goes when that ends; the watch is not
        journalled, so a restarted store watches a source again when it re-registers."""
        settings = self.settings
        if not settings.allow_proxy_source:
            return
        group = settings.proxy_stores
        if group and self.addr not in group:
            self.log(Level.WARNING, f"allow-proxy-source: this store ({self.addr[0]}:"
                                    f"{self.addr[1]}) is not among the group's stores; it "
                                    f"elects alone")
            group = ()
        index = group.index(self.addr) if group else 0
        peers = {i: addr for i, addr in enumerate(group) if i != index}
        seed = None if settings.seed is None else f"proxy {settings.seed}"
        self._proxy = ProxyElection(index, self.addr, peers,
                                    TopicPolicy().proxy_election_interval / 1000,
                                    random.Random(seed),
                                    quorum_required=settings.proxy_source_repo_quorum_required)

    def _proxy_registered(self, src: SourceState, message: LbmcMessage, preg: Header) -> None:
        """A source (re-)registered: it came back (the election ends), and it is watched
        when it asks for a proxy."""
        election = self._proxy
        if election is None:
            return
        previous = self._proxy_keys.pop(src.reg_id, None)
        if previous is not None:
            election.source_returned(previous, self.now)
            election.forget(previous)
        asked = message.header(UmeProxySrc)
        if asked is not None and asked.enable:
            if not preg.reg_id and not src.session_id:
                self.log(Level.WARNING, f"source RegID {src.reg_id} topic {src.topic!r}: no "
                                        f"proxy source for it: it registered without an "
                                        f"explicit RegID or Session ID")
            else:
                key = SourceKey(src.request_addr[0], src.request_addr[1], src.transport_idx,
                                src.topic_idx)
                self._proxy_keys[src.reg_id] = key
                election.watch(key, src.reg_id, src.policy.proxy_election_interval / 1000)
        self._proxy_apply()

    def _proxy_timed_out(self, client: Client) -> None:
        key = self._proxy_keys.get(client.reg_id) if isinstance(client, SourceState) else None
        if key is not None and self._proxy is not None:
            self._proxy.source_timed_out(key, self.now)
            self._proxy_apply()

    def _proxy_keeps(self, client: Client) -> bool:
        """A watched source without a state lifetime keeps its state (see _proxy_start)."""
        return isinstance(client, SourceState) and client.reg_id in self._proxy_keys \
            and not client.state_lifetime

    def _proxy_forget(self, src: SourceState) -> None:
        key = self._proxy_keys.pop(src.reg_id, None)
        if key is not None and self._proxy is not None:
            self._proxy.forget(key)
            self._proxy_apply()

    def _proxy_tick(self) -> None:
        if self._proxy is not None:
            self._proxy.on_timer(self.now)
            self._proxy_apply()

    def _proxy_peer_lost(self, peer: ProxyPeer) -> None:
        if self._proxy is not None:
            self.log(Level.NOTICE, f"proxy election: lost the connection to store {peer.index}")
            self._proxy.peer_lost(peer.index, self.now)
            self._proxy_apply()

    def _on_proxy_claim(self, conn: Connection, raw: bytes) -> None:
        if self._proxy is None:
            self.drop(conn.remote, "proxy source election claim at a store without "
                                   "allow-proxy-source", len(raw))
            return
        self._proxy.on_claim(raw, conn.remote, self.now)
        actions = self._proxy.actions()
        if not any(isinstance(a, Dropped) for a in actions) and conn.tag is None:
            conn.tag = ProxyPeer(decode_claim(raw).store_index)  # its loss: the store's
        self._proxy_apply(actions)

    def _proxy_apply(self, actions: list[Action] | None = None) -> None:
        """Carry out what the election asks for and arm its timer."""
        election = self._proxy
        if election is None:
            return
        for action in election.actions() if actions is None else actions:
            if isinstance(action, SendClaim):
                index = next(i for i, a in election.peers.items() if a == action.peer)
                self.send_to(action.peer, action.data, tag=ProxyPeer(index))
            elif isinstance(action, CreateProxy | DeleteProxy):
                entry = election.sources.get(action.source)
                reg_id = entry.reg_id if entry is not None else 0
                src = self.sources.get(reg_id)
                topic = src.topic if src is not None else "?"
                if isinstance(action, CreateProxy):
                    if src is not None:
                        self.send_lbmr(lbmr.LbmrPacket(tirs=[self._proxy_tir(src)]))
                    self.emit(ProxySourceCreated(topic, reg_id, action.token, action.reelect))
                    self.log(Level.NOTICE, f"proxy source created for topic {topic!r} (source "
                                           f"RegID {reg_id}, election token "
                                           f"{action.token:#010x}"
                                           f"{', re-election' if action.reelect else ''})")
                else:
                    for conn in self._proxy_conns.pop(reg_id, []):
                        if conn.open:  # its receivers look for the topic's source again
                            self.close_connection(conn)
                    self.emit(ProxySourceDeleted(topic, reg_id, action.reason))
                    self.log(Level.NOTICE, f"proxy source deleted for topic {topic!r} (source "
                                           f"RegID {reg_id}: {action.reason})")
            elif isinstance(action, Dropped):
                self.drop(action.peer, action.reason, action.size)
        at = election.next_timer()
        if at is None:
            self.cancel_timer("proxy")
        else:
            self.set_timer("proxy", at)

    def use_proxy_port(self, port: int) -> None:
        """The driver listens for the proxy sources' transport on ``port``."""
        self.settings = replace(self.settings, proxy_port=port)

    def _proxied(self) -> list[SourceState]:
        """The sources this store runs a proxy source for."""
        if self._proxy is None:
            return []
        out = []
        for key in self._proxy.proxies():
            src = self.sources.get(self._proxy.sources[key].reg_id)
            if src is not None:
                out.append(src)
        return out

    def _proxy_tir(self, src: SourceState) -> lbmr.Tir:
        """The proxy source's advertisement of ``src``'s topic.  *Choice* (the guide says
        only that the proxy "sends topic advertisements"): the proxy's transport and request
        address are the store port itself, and it names this store as the one to register
        with, under the source's RegID here, so a late receiver connects to this store,
        gets its SRI there (:meth:`_proxy_sri`), registers and recovers from the
        repository."""
        ip, port = self.addr
        proxy_port = self.settings.proxy_port or port
        lead = src.repo.lead_sqn if src.repo is not None else None
        options: list[lbmr.Record] = [
            lbmr.ToptUme(store=1, latejoin=1, qccap=1, store_tcp_port=port, store_tcp_addr=ip,
                         src_tcp_port=proxy_port, src_tcp_addr=ip, src_reg_id=src.reg_id,
                         transport_idx=src.transport_idx, high_seqnum=lead or 0,
                         low_seqnum=0),
            lbmr.ToptUmeStore(grp_idx=0, store_tcp_port=port, store_idx=0, store_ip_addr=ip,
                              src_reg_id=src.reg_id),
            lbmr.ToptExfunc(src_tcp_port=proxy_port, src_ip_addr=ip, ume=1, lj=1)]
        return lbmr.Tir(name=src.topic, ttl=1, index=src.topic_idx,
                        info=lbmr.TcpInfo(ip=ip, port=proxy_port), options=options)

    def _proxy_advertise(self, names: set[str | None]) -> None:
        tirs: list[lbmr.Record] = [self._proxy_tir(s) for s in self._proxied()
                                   if s.topic in names]
        for i in range(0, len(tirs), _TQRS_PER_QUERY):
            self.send_lbmr(lbmr.LbmrPacket(tirs=tirs[i:i + _TQRS_PER_QUERY]))

    def _proxy_sri(self, conn: Connection, req: Header) -> bool:
        """Answer an SRI request for a source we proxy (on the connection it came on, the
        one the receiver joined as the proxy's transport): the repository's range and this
        store, as the source's SRI would name it.  False when no proxy of ours matches."""
        src = next((s for s in self._proxied() if (s.transport_idx, s.topic_idx)
                    == (req.transport_idx, req.topic_idx)), None)
        if src is None:
            return False
        repo = src.repo
        low = repo.trail_sqn if repo is not None else None
        high = repo.lead_sqn if repo is not None else None
        joined = self._proxy_conns.setdefault(src.reg_id, [])
        if conn not in joined:
            joined.append(conn)
        self.write(conn, control(
            Sri(version=1, low_sqn=low or 0, high_sqn=high or 0, initial_sqn_known=1),
            TopicIdx(tidx=src.topic_idx), UmeStoreGroup(grp_idx=0, grp_sz=1),
            UmeStoreExt(grp_idx=0, store_tcp_port=self.addr[1], store_idx=0,
                        store_ip_addr=self.addr[0], src_reg_id=src.reg_id)))
        return True

    def proxies(self) -> list[str]:
        """The topics this store runs a proxy source for (tests, web monitor)."""
        if self._proxy is None:
            return []
        out = []
        for key in self._proxy.proxies():
            src = self.sources.get(self._proxy.sources[key].reg_id)
            out.append(src.topic if src is not None else "?")
        return out

    # --- disk state -------------------------------------------------------------------------

    def _journal(self, record: dict[str, object]) -> None:
        self._journal_lines([record])

    def _journal_lines(self, records: list[dict[str, object]]) -> None:
        """Append records to the state journal and hand them to the OS at once."""
        if self._journal_path is None or not records:
            return
        fh = self._journal_fh or self._open_journal()
        fh.write("".join(json.dumps(r) + "\n" for r in records))
        fh.flush()

    def _open_journal(self) -> TextIO:
        """The journal, opened for appending (created when missing); raises
        :class:`StoreFileError` when something else is in its place."""
        assert self._journal_path is not None
        self._journal_fh = os.fdopen(
            open_store_file(self._journal_path, os.O_WRONLY | os.O_APPEND, create=True), "a")
        return self._journal_fh

    def _journal_client(self, client: Client) -> None:
        record = self._client_record(client)
        if record is not None:
            self._journal(record)

    def _client_record(self, client: Client) -> dict[str, object] | None:
        """The journal record of ``client``; ``None`` when its state does not survive a
        restart (a memory repository, no journal)."""
        if self._journal_path is None:
            return None
        record = {k: v for k, v in asdict_shallow(client).items()
                  if k in _JOURNALLED}
        record["request_addr"] = list(client.request_addr)
        if isinstance(client, SourceState):
            record["policy"] = asdict(client.policy)
            record["rpp_values"] = None if client.rpp_values is None else \
                client.rpp_values.as_dict()
            if client.policy.repository_type != "disk":
                return None  # memory repositories do not survive a restart
        else:
            assert isinstance(client, ReceiverState)
            record["floor"] = client.floor
            src = self.sources.get(client.source_reg_id)
            if src is None or src.policy.repository_type != "disk":
                return None
        return {"client": record}

    def _restore(self) -> None:
        """Rebuild the registrations, acknowledgements and repositories of the journal, then
        compact it.  Raises :class:`StoreFileError` for damage the store must not restore
        around (see "Disk state" in the module docstring); nothing is changed on disk then."""
        path = self._journal_path
        assert path is not None
        try:
            fd = open_store_file(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        clients: dict[int, dict[str, Any]] = {}
        acks: dict[int, int] = {}
        with os.fdopen(fd, "rb") as fh:
            line_no = 0
            while line := fh.readline(journal.LINE_MAX + 1):
                line_no += 1
                if len(line) > journal.LINE_MAX:
                    raise StoreFileError(path, f"a line longer than {journal.LINE_MAX} bytes "
                                               f"is not a journal record{journal.REFUSED}",
                                         line=line_no)
                if not line.strip():
                    continue  # a blank line holds nothing
                try:
                    record = journal.parse_line(line)
                except ValueError as exc:
                    if not line.endswith(b"\n"):  # the last line, cut by a crash
                        self.log(Level.WARNING,
                                 f"{path}:{line_no}: last line torn ({exc}: a crash while it "
                                 f"was written); cut off, the {line_no - 1} lines before it "
                                 "are restored")
                        break
                    raise StoreFileError(path, f"{exc}{journal.REFUSED}", line=line_no) from None
                try:
                    journal.apply_record(record, clients, acks, _POLICY_TYPES)
                except ValueError as exc:
                    raise StoreFileError(path, f"{exc}{journal.REFUSED}", line=line_no) from None
        for rec in sorted(clients.values(), key=lambda r: r["role"] != "source"):
            self._restore_client(rec, acks)
        for src in self.sources.values():
            if src.rpp:  # what the receivers had consumed is still in the cache file
                self._rpp_release(src)
        self._rewrite_journal()
        self.log(Level.INFO, f"restored {len(self.sources)} sources and {len(self.receivers)} "
                             f"receivers from disk state")

    def _rewrite_journal(self) -> None:
        """Replace the journal by the records of the restored state: written to a new file
        that is renamed over the journal, so a crash meanwhile leaves the old one whole."""
        path = self._journal_path
        assert path is not None
        records = [self._client_record(client) for client in
                   [*self.sources.values(), *self.receivers.values()]]
        records += [{"ack": rcv.reg_id, "sqn": rcv.last_ack} for rcv in self.receivers.values()
                    if rcv.last_ack is not None and self._client_record(rcv) is not None]
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, stat.S_IMODE(os.lstat(path).st_mode))  # the journal's own
            with os.fdopen(fd, "w") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in records if r is not None))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _restore_client(self, rec: dict[str, Any], acks: dict[int, int]) -> None:
        common = dict(role=rec["role"], reg_id=rec["reg_id"], topic=rec["topic"],
                      session_id=rec["session_id"], transport_idx=rec["transport_idx"],
                      topic_idx=rec["topic_idx"], request_addr=tuple(rec["request_addr"]),
                      activity_timeout=rec["activity_timeout"],
                      state_lifetime=rec["state_lifetime"], rpp=rec["rpp"],
                      last_activity=self.now, active=False)
        if rec["role"] == "source":
            policy = TopicPolicy(**rec["policy"])
            values = rec.get("rpp_values")
            # an RPP source journalled before its values were kept ran with the topic's
            rpp_values = RppValues(**values) if values is not None else \
                store_values(policy) if rec["rpp"] else None
            src = SourceState(**common, policy=policy, rpp_values=rpp_values)
            try:
                src.repo = self._new_repository(src, new=False)
            except StoreFileError as exc:
                raise StoreFileError(exc.path, f"{exc.reason}; the store does not start "
                                     f"without the messages of source RegID {src.reg_id}: "
                                     "repair the file or move it away", line=exc.line) from None
            if src.repo.cache_file is not None and not src.repo.found_file:
                self.log(Level.WARNING, f"source RegID {src.reg_id}: its cache file "
                                        f"{src.repo.cache_file} is missing: restored with no "
                                        "messages")
            self.sources[src.reg_id] = src
            if src.session_id:
                self._sessions[("source", src.topic, src.session_id, 0)] = src.reg_id
        else:
            owner = self.sources.get(rec["source_reg_id"])
            if owner is None:
                return  # its source's state was deleted (receivers are not journalled then)
            rcv = ReceiverState(**common, source_reg_id=owner.reg_id, floor=rec.get("floor"))
            rcv.last_ack = acks.get(rcv.reg_id)
            self.receivers[rcv.reg_id] = rcv
            owner.receivers[rcv.reg_id] = rcv
            if rcv.session_id:
                self._sessions[("receiver", rcv.topic, rcv.session_id, owner.reg_id)] = \
                    rcv.reg_id

    def close(self) -> None:
        for src in self.sources.values():
            if src.repo is not None:
                src.repo.close()
        if self._journal_due:
            due, self._journal_due = self._journal_due, {}
            self._journal_lines([{"ack": reg_id, "sqn": sqn} for reg_id, sqn in due.items()])
        if self._journal_fh is not None:
            self._journal_fh.close()
            self._journal_fh = None
        self._unlock()
        super().close()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- for the web monitor ------------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """Everything the web monitor shows, as plain data."""
        seconds = max(self.now - self.rx.since, 1e-9)
        sources = []
        for src in self.sources.values():
            repo = src.repo
            sources.append({
                "reg_id": src.reg_id, "topic": src.topic, "session_id": src.session_id,
                "request_addr": f"{src.request_addr[0]}:{src.request_addr[1]}",
                "transport_idx": src.transport_idx, "topic_idx": src.topic_idx,
                "active": src.active, "last_activity": src.last_activity,
                "repository": repo.kind if repo is not None else None, "rpp": src.rpp,
                "message_map": len(repo) if repo is not None else 0,
                "window": [repo.trail_sqn, repo.mem_trail_sqn, repo.lead_sqn]
                if repo is not None else None,
                "memory": [repo.used_bytes if repo is not None else 0,
                           src.policy.repository_size_threshold, src.policy.repository_size_limit],
                "age_threshold": src.policy.repository_age_threshold,
                "drops": repo.intentional_drops if repo is not None else 0,
                "disk_writes_skipped": repo.disk_writes_skipped if repo is not None else 0,
                "offsets": [0, repo.file_offset if repo is not None else 0,
                            src.policy.repository_disk_file_size_limit],
                # the transport it is received on: (lbmr.TransportType, "ip:port", session ID),
                # as joined (a later advertisement, perhaps a stranger's, does not relabel it)
                "transport": None if src.transport is None else (
                    lbmr.TransportType.TCP if src.lbtru_sid is None
                    else lbmr.TransportType.LBTRM if src.transport in self._lbtrm_groups
                    else lbmr.TransportType.LBTRU, f"{src.transport[0]}:{src.transport[1]}",
                    src.lbtru_sid or 0),
                "receivers": [{"reg_id": r.reg_id, "session_id": r.session_id,
                               "ack": r.last_ack, "active": r.active,
                               "last_activity": r.last_activity, "rpp": r.rpp,
                               "topic_idx": r.topic_idx, "transport_idx": r.transport_idx,
                               "request_addr": f"{r.request_addr[0]}:{r.request_addr[1]}"}
                              for r in src.receivers.values()],
            })
        return {
            "name": self.settings.name, "interface": f"{self.addr[0]}:{self.addr[1]}",
            "cache_dir": str(self.settings.disk_cache_directory or ""),
            "state_dir": str(self.settings.disk_state_directory or ""),
            "retransmission_rate": self._rate, "seconds": seconds,
            "rx_received_rate": self.rx.received / seconds,
            "rx_service_rate": self.rx.serviced / seconds,
            "rx_drop_rate": self.rx.dropped / seconds,
            "rx_total_dropped": self.rx.total_dropped,
            "patterns": [(r.pattern, r.kind) for r in self.settings.topics],
            "sources": sources,
            "proxy": self.proxy_view(),
        }

    def proxy_view(self) -> dict[str, object]:
        """The store's part in proxy-source elections, as plain data (the web monitor's
        "Proxy Sources"): whether it allows them, its proxy sources' port, the group's stores
        and, per watched source, where its election stands here (``active``, ``waiting``,
        ``proxy``: this store runs it, ``following``: the store of index ``holder`` does)."""
        election = self._proxy
        if election is None:
            return {"allowed": False, "port": None, "group": [], "index": None, "sources": []}
        group = dict(election.peers)
        group[election.store_index] = election.store
        watched = []
        for key, entry in sorted(election.sources.items()):
            src = self.sources.get(entry.reg_id)
            if src is None:
                continue  # its state went; the election forgets it next
            holder = entry.holder.store_index if entry.holder is not None else None
            watched.append({
                "reg_id": entry.reg_id, "topic": src.topic, "session_id": src.session_id,
                "source": f"{key.ip}:{key.port}", "state": str(entry.phase),
                "token": entry.token or None,
                "holder": election.store_index if entry.phase == "proxy" else holder,
                "reelect": entry.reelect})
        return {"allowed": True, "port": self.settings.proxy_port or self.addr[1],
                "group": [f"{ip}:{port}" for _, (ip, port) in sorted(group.items())],
                "index": election.store_index, "sources": watched}


_POLICY_TYPES = {f.name: type(f.default) for f in fields(TopicPolicy)}
"""The journal's topic options and their types (:func:`reference_impl.journal.apply_record`)."""

_JOURNALLED = {"role", "reg_id", "topic", "session_id", "transport_idx", "topic_idx",
               "activity_timeout", "state_lifetime", "rpp", "source_reg_id"}


def asdict_shallow(obj: object) -> dict[str, object]:
    return {k: getattr(obj, k) for k in _JOURNALLED if hasattr(obj, k)}


def parse_any(raw: bytes) -> LbmcMessage:
    """Decode a framed message (for tests and tools)."""
    return parse_message(raw)[0]


PolicyLookup = Callable[[str], TopicPolicy | None]
