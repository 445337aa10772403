"""Every event the reference cores hand to their application, as small dataclasses.

The cores never call back into application code; like aioquic's ``QuicConnection`` they queue
events that the application drains with ``next_event()``.  Each event mirrors a row of the
guide's "Source Events" and "Receiver Events" tables (chapter "Designing Persistence
Applications"), so a reader can map what the reference implementation reports onto the product
documentation one to one.  Store-side events mirror the store's log lines and the daemon
statistics events of docs/semantics.md §4 (source or receiver registered, state deleted ...).

Sequence numbers are the topic sequence numbers of the LBMC data header; store indexes are
positions in the source's configured store list (``ume_store`` order), as in the product.

Events are read-only by contract.  Most are frozen dataclasses; the four that come once or
more per message (:class:`MessageStable`, :class:`MessageReclaimed`,
:class:`DeliveryConfirmation`, :class:`MessageDelivered`) are slotted dataclasses that are not
frozen, because a frozen dataclass's ``__init__`` sets every field through
``object.__setattr__`` and costs about three times as much, a cost the source pays twice per
message at 100,000 messages per second.  They still compare and hash by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag, StrEnum

Addr = tuple[str, int]


class Level(StrEnum):
    """Severity of a :class:`LogRecord` (the product's log levels)."""

    INFO = "INFO"
    NOTICE = "NOTICE"
    WARNING = "WARNING"
    ERROR = "ERROR"


@dataclass(frozen=True)
class LogRecord:
    """A line the component would write to its log.

    Attributes:
        component: who logs it ("store <name>", "source <topic>", "receiver <topic>").
        level: the severity.
        text: the message, written for an operator.
    """

    component: str
    level: Level
    text: str


@dataclass(frozen=True)
class InputDropped:
    """Bytes from the network were malformed or made no sense in the current state; they were
    logged and dropped without changing any state (issue 3: bad input is never a crash).

    Attributes:
        peer: where the bytes came from.
        reason: why they were dropped.
        size: how many bytes were dropped.
    """

    peer: Addr
    reason: str
    size: int


# --- source events (guide: "Source Events") -----------------------------------------------------


@dataclass(frozen=True)
class StoreInfo:
    """Which store an event is about.

    Attributes:
        index: position of the store in the source's store list (``ume_store`` order).
        group: its QC group index.
        addr: its (IP, TCP port).
    """

    index: int
    group: int
    addr: Addr


@dataclass(frozen=True)
class SourceRegistrationSuccess:
    """"Store Registration Success": the source registered with one store.

    Attributes:
        store: the store.
        reg_id: the RegID the store granted (save it to re-register after a restart).
        old: the store already had state for this source (a re-registration).
        sequence_number: the highest sequence number the store holds for this source (the
            source resumes after it when ``old``); 0 for a new registration.
        rpp: the store acknowledged receiver-paced persistence.
    """

    store: StoreInfo
    reg_id: int
    old: bool
    sequence_number: int
    rpp: bool = False


@dataclass(frozen=True)
class SourceRegistrationComplete:
    """"Store Registration Complete": enough stores registered (intra/intergroup rules); the
    source may send.

    Attributes:
        sequence_number: the consensus sequence number the source sends next.
        quorum: completion came from a quorum rule (QC), as the product's QUORUM flag.
    """

    sequence_number: int
    quorum: bool = True


@dataclass(frozen=True)
class SourceRegistrationError:
    """"Store Registration Error" (or "RPP Source Registration Failure" when ``rpp``).

    Attributes:
        store: the store that refused.
        code: the PREG_RESP error code (``wire.lbmc.PregError``).
        text: what happened, for a log.
        rpp: the refusal is about receiver-paced persistence.
    """

    store: StoreInfo
    code: int
    text: str
    rpp: bool = False


@dataclass(frozen=True)
class StoreUnresponsive:
    """"Store Unresponsive": a store fell silent for ``ume_store_activity_timeout`` or gave no
    registration response.

    Attributes:
        store: the store.
        text: the product's wording, e.g. ``store 0 [127.0.0.1:14567] unresponsive`` with
            ``- no registration response`` and ``(quorum lost)`` suffixes.
        quorum_lost: the remaining stores no longer satisfy the group rules: sends now fail.
    """

    store: StoreInfo
    text: str
    quorum_lost: bool


class StableFlags(IntFlag):
    """Flags of :class:`MessageStable` (the product's MESSAGE_STABLE_EX flags)."""

    INTRAGROUP = 0x1  # stable within the store's group
    INTERGROUP = 0x2  # stable across groups
    STABLE = 0x4  # the message is now stable for the source as a whole
    STORE = 0x8  # the event names a store


@dataclass(slots=True, unsafe_hash=True)
class MessageStable:
    """"Store Message Stable": one store acknowledged a message.

    Attributes:
        sequence_number: the message.
        store: the acknowledging store.
        flags: intragroup/intergroup/overall stability reached with this acknowledgement.
    """

    sequence_number: int
    store: StoreInfo
    flags: StableFlags


@dataclass(frozen=True)
class MessageNotStable:
    """"Store Message Not Stable": ``ume_message_stability_lifetime`` expired; the source stops
    retransmitting the message and reclaims it (forced).

    Attributes:
        sequence_number: the message.
    """

    sequence_number: int


@dataclass(frozen=True)
class MessageNacked:
    """A store answered a message with a stability NACK (docs/semantics.md §1.8: "a stability
    ACK carrying the NAK flag", docs/wire-lbmc.md §2.1): it declared the message unrecoverably
    lost (e.g. an LBT-RU gap it could not repair) and will never hold it.  The source stops
    proactively retransmitting the message to that store.

    Attributes:
        sequence_number: the message.
        store: the store that NACKed it.
        abandoned: the stores that did not NACK it can no longer make it stable under the
            group rules (always so with one store): the source stopped waiting for it, took it
            out of flight (as "Store Message Not Stable" does at the end of
            ``ume_message_stability_lifetime``) and reclaimed it, forced
            (:class:`MessageReclaimed` follows).  False: it stays in flight for the others.
    """

    sequence_number: int
    store: StoreInfo
    abandoned: bool


@dataclass(slots=True, unsafe_hash=True)
class DeliveryConfirmation:
    """"Delivery Confirmation": a receiver confirmed it consumed a message.

    Attributes:
        sequence_number: the message.
        receiver_reg_id: the receiver's RegID.
        unique_confirmations: distinct receivers that confirmed it so far.
        unique_met: ``ume_retention_unique_confirmations`` is met (the UNIQUEACKS flag).
        explicit: the receiver acknowledged explicitly (the EXACK flag).
    """

    sequence_number: int
    receiver_reg_id: int
    unique_confirmations: int
    unique_met: bool
    explicit: bool = False


@dataclass(slots=True, unsafe_hash=True)
class MessageReclaimed:
    """"Store Message Reclaimed" (and "Store Forced Reclaim" when ``forced``).

    Attributes:
        sequence_number: the message released from the source's retention buffer.
        forced: released before its retention rules were met (size limit or stability lifetime).
    """

    sequence_number: int
    forced: bool = False


class FlightState(StrEnum):
    OVER = "over"
    UNDER = "under"


@dataclass(frozen=True)
class FlightSizeNotification:
    """"Flight Size Notification": in-flight messages crossed ``ume_flight_size`` (or bytes).

    Attributes:
        state: OVER when a send exceeded it, UNDER when stability brought it back below.
        inflight: messages in flight after the change.
    """

    state: FlightState
    inflight: int


@dataclass(frozen=True)
class SourceDeregistered:
    """"RPP Source Deregistration Success" (per store) or "... Complete" (``store`` is None).

    Attributes:
        store: the store that confirmed, or None once every store confirmed.
    """

    store: StoreInfo | None


@dataclass(frozen=True)
class RppNotAcknowledged:
    """"Granted - Source Error" or "Granted - Receiver Error" (the guide's "UMP Version RPP
    Compatibility Matrix", docs/semantics.md §2.1): a store granted an RPP client's
    registration without acknowledging RPP (the RPP flag clear in a successful PREG_RESP), as
    a store that predates RPP (5.3) does.  The client keeps the registration (the store
    granted it, holds state for it and counts on its keepalives) and counts it like any other;
    this event, and an ERROR log line with the same phrase, tell the application that this
    store does not pace the source by its receivers, so that it can deregister or stop.

    Attributes:
        role: ``"source"`` or ``"receiver"``: who registered.
        store: the store that granted without the acknowledgement.
        text: what happened, starting with the matrix's phrase (:attr:`outcome`).
        source: for a receiver, the source the registration was for (its source string);
            empty for a source.
    """

    role: str
    store: StoreInfo
    text: str
    source: str = ""

    @property
    def outcome(self) -> str:
        """The matrix cell's wording: ``Granted - Source Error`` / ``Granted - Receiver
        Error``."""
        return "Granted - Source Error" if self.role == "source" else \
            "Granted - Receiver Error"


# --- receiver events (guide: "Receiver Events") -------------------------------------------------


@dataclass(frozen=True)
class ReceiverRegistrationSuccess:
    """"Store Registration Success" for a receiver.

    Attributes:
        store: the store (index into the SRI's store list).
        reg_id: the receiver RegID the store granted.
        source_reg_id: the source's RegID at that store.
        old: the store knew this receiver (a re-registration).
        low_sequence_number: where the store says this receiver should start.
        rpp: the store acknowledged receiver-paced persistence.
    """

    store: StoreInfo
    reg_id: int
    source_reg_id: int
    old: bool
    low_sequence_number: int
    rpp: bool = False


@dataclass(frozen=True)
class ReceiverRegistrationComplete:
    """"Store Registration Complete": the receiver may receive; recovery starts here.

    Attributes:
        sequence_number: the consensus low sequence number after the recovery callback.
        high_sequence_number: the newest sequence number known to exist (from stores and
            live data); recovery requests everything from ``sequence_number`` up to it.
    """

    sequence_number: int
    high_sequence_number: int


@dataclass(frozen=True)
class ReceiverRegistrationError:
    """"Store Registration Error" (or "RPP Receiver Registration Failure" when ``rpp``).

    Attributes:
        store: the store that refused, or None when registration failed before any store
            answered (e.g. ``ume_sri_request_maximum`` SRI requests went unanswered).
        code: the PREG_RESP error code, or -1 when no store was involved.
        text: what happened.
        rpp: an RPP receiver refused with code 6 (source and store configuration
            incompatible): the store's repository is not RPP, or the receiver's mode differs
            from its first registration's.
    """

    store: StoreInfo | None
    code: int
    text: str
    rpp: bool = False


@dataclass(frozen=True)
class ReceiverDeregistered:
    """"RPP Receiver Deregistration Success" (per store) or "... Complete" (``store`` is
    None): the receiver's :meth:`~reference_impl.receiver.ReceiverCore.deregister` was
    confirmed by a store (a PREG_RESP with the deregister flag), or by every store it had
    registered with.  Mirrors :class:`SourceDeregistered`.

    Attributes:
        store: the store that confirmed (an index into that source's SRI store list), or None
            once every store of every source confirmed.
        source: the source the confirmed registration was for (its source string); empty
            for the final event.
    """

    store: StoreInfo | None
    source: str = ""


@dataclass(frozen=True)
class RegistrationChange:
    """"Store Registration Change": a new SRI version changed the store list.

    Attributes:
        text: what changed, for a log.
    """

    text: str


@dataclass(slots=True, unsafe_hash=True)
class MessageDelivered:
    """A message handed to the application, in sequence order and never twice.

    Attributes:
        sequence_number: the topic sequence number (of its source: each source of a topic
            numbers its own messages).
        payload: the application bytes.
        retransmission: it came from recovery (the product's UME_RETRANSMIT flag).
        source: the source it came from, as the product's source string
            (``TCP:10.0.0.5:14371``, ``LBT-RU:10.0.0.5:14380``); a receiver joins every
            source of its topic, each with its own order.  Empty when not known.
        otr: it came from off-transport recovery (the product's ``LBM_MSG_FLAG_OTR``;
            :mod:`reference_impl.otr`): the transport had given up on it.
    """

    sequence_number: int
    payload: bytes = field(repr=False)
    retransmission: bool = False
    source: str = ""
    otr: bool = False


@dataclass(frozen=True)
class UnrecoverableLoss:
    """Messages that could not be recovered (``retransmit_request_message_timeout`` expired or
    the store no longer had them).

    Attributes:
        first, last: the lost range, inclusive.
    """

    first: int
    last: int


@dataclass(frozen=True)
class OtrRequested:
    """The receiver asked a store for messages its transport gave up on (off-transport
    recovery, :mod:`reference_impl.otr`).

    Attributes:
        first, last: the lowest and highest sequence number asked for.
        count: how many sequence numbers were asked for (the gap's numbers still missing).
        attempt: 1 for a gap's first request, then 2, 3 ... as it is asked again.
        store: the store asked (its request address).
        source: the source string of the source whose messages they are.
    """

    first: int
    last: int
    count: int
    attempt: int
    store: Addr
    source: str = ""


# --- store events (store log / daemon statistics events) ----------------------------------------


@dataclass(frozen=True)
class ClientRegistered:
    """A source or receiver registration the store granted.

    Attributes:
        role: "source" or "receiver".
        reg_id: the granted RegID.
        topic: the topic.
        session_id: the client's Session ID (0: none).
        old: the store already had state for it.
    """

    role: str
    reg_id: int
    topic: str
    session_id: int
    old: bool


@dataclass(frozen=True)
class ClientRejected:
    """A registration the store refused.

    Attributes:
        role: "source" or "receiver".
        reg_id: the RegID asked for.
        code: the PREG_RESP error code.
        text: why.
    """

    role: str
    reg_id: int
    code: int
    text: str


@dataclass(frozen=True)
class ClientStateDeleted:
    """The store deleted a client's state.

    Attributes:
        role: "source" or "receiver".
        reg_id: its RegID.
        reason: "activity timeout", "state lifetime expired" or "deregistered".
    """

    role: str
    reg_id: int
    reason: str


@dataclass(frozen=True)
class ProxySourceCreated:
    """The store won (or started) a proxy-source election and created a proxy for a source
    whose activity timed out (guide "How Proxy Sources Operate"; daemon event "proxy source
    created").

    Attributes:
        topic: the source's topic.
        reg_id: the source's RegID at this store (the proxy registers with it).
        token: this store's election token.
        reelect: it replaces a proxy whose store died.
    """

    topic: str
    reg_id: int
    token: int
    reelect: bool


@dataclass(frozen=True)
class ProxySourceDeleted:
    """The store deleted its proxy source (daemon event "proxy source deleted").

    Attributes:
        topic: the source's topic.
        reg_id: the source's RegID at this store.
        reason: "election lost", "source returned" or "source deleted".
    """

    topic: str
    reg_id: int
    reason: str


Event = (
    LogRecord | InputDropped | SourceRegistrationSuccess | SourceRegistrationComplete
    | SourceRegistrationError | StoreUnresponsive | MessageStable | MessageNotStable
    | MessageNacked
    | DeliveryConfirmation | MessageReclaimed | FlightSizeNotification | SourceDeregistered
    | RppNotAcknowledged | ReceiverRegistrationSuccess | ReceiverRegistrationComplete
    | ReceiverRegistrationError | ReceiverDeregistered | RegistrationChange | MessageDelivered
    | UnrecoverableLoss | OtrRequested | ClientRegistered | ClientRejected | ClientStateDeleted
    | ProxySourceCreated | ProxySourceDeleted
)
