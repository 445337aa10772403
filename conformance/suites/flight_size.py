"""Flight-size suite (``--suite flight-size``): how many messages a source IUT keeps in flight.

The guide's chapter "UMP Flight Size" says a message is in flight until the source has the
stability acknowledgements its group rules ask for (chapter "Sources Using Quorum/Consensus
Store Configuration") **and** ``ume_retention_unique_confirmations`` delivery confirmations;
``ume_flight_size`` counts messages, ``ume_flight_size_bytes`` counts payload bytes only (no
UM or network overhead), either limit exceeded triggers ``ume_flight_size_behavior``: ``block``
(the send waits) or ``notify`` (the send goes ahead and the application is told).

A black-box harness sees the flight size only through traffic, so every case withholds
stability ACKs at the harness stores (:class:`~conformance.store_peer.HarnessStore`) and counts
the data messages the source puts on its transport: under ``block`` no more may appear than the
limit allows, and exactly the ones the limit allows must appear (a source that stops early
sends too little, which is a failure of its own).  The OVER/UNDER notifications of ``notify``
reach the application only, so the notify case judges what is on the wire (sends go on past the
limit) and does not judge the events.  Each case sets every option that decides its verdict.

The non-blocking send's "would block" (docs/semantics.md §1.7) reaches the application only,
and a blocking and a non-blocking source put the same messages on the wire under ``block``
(the one waits, the other is refused and tries again).  So SRC-FLT-009 judges it through the
IUT's output: the profile says how to run the source with non-blocking sends
(``nonblocking_args``, ``ump source --nonblocking`` for the reference source) and what it
prints when a send returns "would block" (``would_block_text``); without them the case is
unsupported.  A source that waits silently instead (a blocking send in a non-blocking
application) fails it.  The reference core's non-blocking send
(:meth:`~reference_impl.source.SourceCore.try_send`: "would block" returned as a value, the
message neither sent nor counted) is also tested on its own, tests/reference_impl/
test_would_block.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.packets import LBMC, LBMC_UmeAck
from conformance.store_peer import HarnessStore
from conformance.suites.source import FAST_REGISTRATION
from wire.lbmc import AckType, Frag

SUITE = "flight-size"


def _settled(h: CaseContext, store: HarnessStore, quiet: float, limit: float, what: str) -> None:
    """Wait until ``store`` saw at least one data message and then none for ``quiet`` seconds
    (at most ``limit`` seconds in all): a blocked source stops sending, a slow one does not."""
    if not h.wait_until(lambda: bool(store.data_sqns()), 4.0, f"{what}: the first message"):
        h.check(False, f"{what}: the source sent no data message",
                expected="data on the transport after Registration Complete",
                observed=f"{len(store.source_pregs())} PREG(s), no data")
    deadline = time.monotonic() + h.scaled(limit)
    while time.monotonic() < deadline:
        if not h.wait_until(_more_than(store, len(store.data_sqns())), quiet,
                            f"{what}: more data"):
            return


def _more_than(store: HarnessStore, count: int) -> Callable[[], bool]:
    return lambda: len(store.data_sqns()) > count


def _blocked_at(h: CaseContext, store: HarnessStore, expected: list[int], what: str) -> None:
    """The source sent exactly ``expected`` and nothing more within half a second."""
    h.wait_until(lambda: len(store.data_sqns()) >= len(expected), 2.0, what)
    h.wait_until(lambda: len(store.data_sqns()) > len(expected), 0.5,
                 f"{what}: one message too many (must not come)")
    sent = sorted(store.data_sqns())
    shown = sent if len(sent) <= 12 else [*sent[:10], "...", sent[-1]]
    h.check(sent == expected, f"{what}: {len(sent)} message(s) where {len(expected)} may fly",
            expected=expected, observed=shown)


@case("SRC-FLT-001", suite=SUITE, role=Role.SOURCE,
      title="ume_flight_size N, behaviour block: N unstable messages, one more per stable one",
      section="UMP Flight Size",
      requirement="By default, when a source sends a message that exceeds its flight size, the "
                  "call to send blocks ... UMP considers a sent message in flight until the "
                  "source receives the configured number of stability acknowledgements.",
      timeout=12.0)
def count_limit_blocks(h: CaseContext) -> None:
    """Flight size 3, no stability ACK: exactly 0..2 go out; the harness acknowledges 0 and
    exactly one more message (3) may follow."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 3,
                                "source ume_flight_size_bytes": 0,
                                "source ume_flight_size_behavior": "block"})
    _settled(h, store, 0.5, 3.0, "sending with flight size 3")
    _blocked_at(h, store, [0, 1, 2], "the messages sent with flight size 3 and no ACK")
    store.send_stable(0)
    _blocked_at(h, store, [0, 1, 2, 3], "the messages sent after message 0 became stable")


@case("SRC-FLT-002", suite=SUITE, role=Role.SOURCE,
      title="ume_flight_size_bytes counts payload bytes only: the limit is filled exactly",
      section="UMP Flight Size",
      requirement="The UMP flight size bytes mechanism operates with only payload data. UM or "
                  "network overhead is not included in the byte count.",
      timeout=12.0)
def bytes_limit_counts_payload(h: CaseContext) -> None:
    """Flight size 1000 messages, 2048 bytes, no stability ACK.  The unstable payload bytes on
    the wire must never exceed 2048, and the source must not stop while the next message (taken
    to be as long as the last one seen) would still fit: a source counting any header byte
    stops one message early (64-byte payloads: 31 messages instead of 32)."""
    limit = 2048
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 1000,
                                "source ume_flight_size_bytes": limit,
                                "source ume_flight_size_behavior": "block"})
    _settled(h, store, 0.6, 6.0, "sending with flight size 2048 bytes")
    sizes = [len(bytes(s.message.payload or b"")) for s in store.snapshot(store.data)]
    total = sum(sizes)
    h.check(total <= limit, "the source put more unstable payload bytes on the wire than "
            "ume_flight_size_bytes allows",
            expected=f"at most {limit} payload bytes unstable",
            observed=f"{len(sizes)} messages, {total} payload bytes")
    h.check(total + sizes[-1] > limit,
            "the source stopped before the payload bytes reached ume_flight_size_bytes (does "
            "it count header bytes?)",
            expected=f"another {sizes[-1]}-byte message while {limit - total} bytes are free",
            observed=f"{len(sizes)} messages, {total} payload bytes, then nothing")


@case("SRC-FLT-003", suite=SUITE, role=Role.SOURCE,
      title="With both limits set, the message count limit binds when it is the smaller",
      section="UMP Flight Size",
      requirement="If configuring both ume_flight_size and ume_flight_size_bytes, UMP uses the "
                  "smaller of the two flight sizes on a per send basis: ume_flight_size "
                  "exceeded, ume_flight_size_bytes not exceeded: ume_flight_size_behavior "
                  "executes.",
      timeout=12.0)
def either_limit_binds(h: CaseContext) -> None:
    """Flight size 4 messages and 1 MiB: the byte limit is far away, the count limit must
    still stop the source at 0..3 (a source that uses only the byte limit once it is set
    sends on)."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 4,
                                "source ume_flight_size_bytes": 1 << 20,
                                "source ume_flight_size_behavior": "block"})
    _settled(h, store, 0.5, 3.0, "sending with flight size 4 messages / 1 MiB")
    _blocked_at(h, store, [0, 1, 2, 3], "the messages sent with flight size 4 and 1 MiB")


@case("SRC-FLT-004", suite=SUITE, role=Role.SOURCE,
      title="Behaviour notify: sends go on past the flight size",
      section="UMP Flight Size",
      requirement="You can configure ume_flight_size_behavior to either block any sends that "
                  "would exceed the flight size or allow the sends while notifying your "
                  "application.",
      timeout=12.0)
def notify_does_not_block(h: CaseContext) -> None:
    """Flight size 3, behaviour notify, no stability ACK: the source must go on sending (at
    least 8 messages).  The OVER/UNDER notifications reach only the application; the wire
    cannot show them, so they are not judged here."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 3,
                                "source ume_flight_size_bytes": 0,
                                "source ume_flight_size_behavior": "notify"})
    h.wait_until(lambda: len(store.data_sqns()) >= 8, 5.0, "8 messages with flight size 3")
    h.check(len(store.data_sqns()) >= 8, "the source blocked although the flight size "
            "behaviour is notify",
            expected="sends continuing past 3 unstable messages",
            observed=f"messages {sorted(store.data_sqns())}")


@case("SRC-FLT-005", suite=SUITE, role=Role.SOURCE,
      title="A message stays in flight until stable by the intergroup rule (all groups)",
      section="Sources Using Quorum/Consensus Store Configuration",
      requirement="When using stores in a Quorum/Consensus configuration, intragroup and "
                  "intergroup stability settings affect whether UMP considers a message in "
                  "flight (ume_retention_intergroup_stability_behavior all: stable once every "
                  "group has it).",
      timeout=12.0)
def inflight_until_intergroup_stable(h: CaseContext) -> None:
    """Two groups of one store each, intergroup behaviour ``all``, flight size 3.  Store A
    (group 0) acknowledges everything, store B (group 1) nothing: no message is stable, so
    exactly 0..2 go out; once B acknowledges 0, exactly one more (3) may follow."""
    a, b = h.store(group=0), h.store(group=1)
    b.ack = False
    h.start_iut(a, b, groups=((0, 1), (1, 1)),
                options={**FAST_REGISTRATION, "source ume_flight_size": 3,
                         "source ume_flight_size_bytes": 0,
                         "source ume_flight_size_behavior": "block",
                         "source ume_retention_intragroup_stability_behavior": "quorum",
                         "source ume_retention_intergroup_stability_behavior": "all"})
    _settled(h, b, 0.5, 3.0, "sending with one group of two acknowledging")
    _blocked_at(h, b, [0, 1, 2], "the messages sent while only group 0 acknowledged")
    b.send_stable(0)
    _blocked_at(h, b, [0, 1, 2, 3], "the messages sent after group 1 acknowledged message 0")


@case("SRC-FLT-006", suite=SUITE, role=Role.SOURCE,
      title="With unique confirmations 2, a stable message stays in flight until 2 receivers "
            "confirmed it",
      section="UMP Flight Size",
      requirement="Consider three stores in a single QC group, and two receivers ... until a "
                  "source receives a stability notification from two of the three stores, UMP "
                  "considers a given message in-flight. In addition, if you set "
                  "ume_retention_unique_confirmations to 2, that same message would be "
                  "considered in flight until the source receives two stability notifications "
                  "AND two delivery confirmation notifications.",
      timeout=15.0)
def confirmations_keep_in_flight(h: CaseContext) -> None:
    """The guide's example: three stores in one group (quorum), A and B acknowledge every
    message, C none; unique confirmations 2, flight size 2.  Messages 0 and 1 are stable but
    unconfirmed: nothing more may go out.  Receiver 1 confirms up to 1: still nothing.
    Receiver 2 confirms 0: exactly one more message (2) may follow.  The confirmations are
    delivery-confirmation ACKs sent to the source's request port (from its TIR)."""
    a, b, c = h.store(), h.store(), h.store()
    c.ack = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**FAST_REGISTRATION, "source ume_flight_size": 2,
                         "source ume_flight_size_bytes": 0,
                         "source ume_flight_size_behavior": "block",
                         "source ume_retention_intragroup_stability_behavior": "quorum",
                         "source ume_retention_unique_confirmations": 2})
    _settled(h, c, 0.5, 3.0, "sending with stable but unconfirmed messages")
    _blocked_at(h, c, [0, 1], "the messages sent while stable but never confirmed")
    tap = h.tap()
    if tap.request_addr is None:
        h.check(False, "the source's TIR names no request port for delivery confirmations",
                expected="a UME option with the source's request port", observed=None)

    def confirm(reg_id: int, sqn: int) -> None:
        h.note(f"receiver RegID {reg_id} confirms delivery up to {sqn}")
        tap.sri_request()  # opens the request connection (and is harmless)
        assert tap.request is not None
        tap.request.send(LBMC() / LBMC_UmeAck(type=int(AckType.CDELV),
                                              transport_idx=tap.transport_idx,
                                              id_2=reg_id, rcv_reg_id=reg_id, seqnum=sqn))

    confirm(7001, 1)
    _blocked_at(h, c, [0, 1], "the messages sent with one receiver's confirmations")
    confirm(7002, 0)
    _blocked_at(h, c, [0, 1, 2], "the messages sent once message 0 had two confirmations")


@case("SRC-FLT-007", suite=SUITE, role=Role.SOURCE,
      title="A message stays in flight until a quorum of its store group acknowledged it",
      section="UMP Flight Size",
      requirement="Consider a case with three stores in a single QC group ... Given the default "
                  "configuration, until a source receives a stability notification from two of "
                  "the three stores, UMP considers a given message in-flight.",
      timeout=12.0)
def inflight_until_intragroup_quorum(h: CaseContext) -> None:
    """The first half of the guide's example: three stores in one group, intragroup behaviour
    ``quorum`` (set explicitly), flight size 2.  Only A acknowledges: one store of three is no
    quorum, so exactly 0 and 1 go out; once B acknowledges 0, exactly one more (2) may
    follow."""
    a, b, c = h.store(), h.store(), h.store()
    b.ack = c.ack = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**FAST_REGISTRATION, "source ume_flight_size": 2,
                         "source ume_flight_size_bytes": 0,
                         "source ume_flight_size_behavior": "block",
                         "source ume_retention_intragroup_stability_behavior": "quorum",
                         "source ume_retention_unique_confirmations": 0})
    _settled(h, c, 0.5, 3.0, "sending with one store of three acknowledging")
    _blocked_at(h, c, [0, 1], "the messages sent while one store of three acknowledged")
    b.send_stable(0)
    _blocked_at(h, c, [0, 1, 2], "the messages sent once two stores of three acknowledged 0")


FRAGMENT_DATAGRAM = 44
"""``transport_tcp_datagram_max_size`` of SRC-FLT-008: 16 payload bytes per fragment (the LBMC
data and FRAG headers take 28), so a 64-byte message is 4 fragments."""


def _fragment_groups(store: HarnessStore
                     ) -> tuple[dict[int, list[tuple[int, int, int, int]]], int]:
    """The data messages the store saw as fragmented messages: first sequence number ->
    [(sqn, offset, piece length, total length)], and how many carried no FRAG header."""
    groups: dict[int, list[tuple[int, int, int, int]]] = {}
    whole = 0
    for seen in store.snapshot(store.data):
        message = seen.message
        frag = message.header(Frag)
        if frag is None:
            whole += 1
            continue
        groups.setdefault(frag.first_sqn, []).append(
            (message.sqn, frag.offset, len(bytes(message.payload or b"")), frag.len))
    return groups, whole


def _complete(store: HarnessStore, first: int) -> bool:
    """Every piece of the fragmented message ``first`` reached the store (the pieces at
    distinct offsets add up to its total, as tshark reassembles, docs/wire-lbmc.md §3.1)."""
    pieces = _fragment_groups(store)[0].get(first, [])
    totals = {total for *_, total in pieces}
    by_offset = {offset: length for _, offset, length, _ in pieces}
    return len(totals) == 1 and sum(by_offset.values()) >= totals.pop()


def _fragmented_at(h: CaseContext, store: HarnessStore, count: int, what: str) -> list[int]:
    """The source sent exactly ``count`` whole fragmented messages (every fragment of each, no
    fragment of a further one) and nothing more within half a second; their first sequence
    numbers."""
    def firsts() -> list[int]:
        return sorted(_fragment_groups(store)[0])

    h.wait_until(lambda: len(firsts()) >= count and _complete(store, firsts()[count - 1]),
                 2.0, what)
    h.wait_until(lambda: len(store.data_sqns()) > sum(
        len(_fragment_groups(store)[0][f]) for f in firsts()[:count]), 0.5,
        f"{what}: one fragment too many (must not come)")
    groups, whole = _fragment_groups(store)
    if whole and not groups:
        h.check(False, f"{what}: the source did not fragment its messages",
                expected=f"messages longer than transport_tcp_datagram_max_size "
                         f"{FRAGMENT_DATAGRAM} sent as LBMC fragments (FRAG headers)",
                observed=f"{whole} data message(s) without a FRAG header")
    done = [first for first in sorted(groups) if _complete(store, first)]
    sent = sorted(store.data_sqns())
    shown = sent if len(sent) <= 16 else [*sent[:14], "...", sent[-1]]
    h.check(len(groups) == count and done == sorted(groups),
            f"{what}: {len(groups)} fragmented message(s) ({len(done)} complete, "
            f"{len(sent)} fragments) where {count} may fly",
            expected=f"every fragment of exactly {count} message(s)",
            observed=f"messages starting at {sorted(groups)}, data sqns {shown}")
    return sorted(groups)


@case("SRC-FLT-008", suite=SUITE, role=Role.SOURCE,
      title="A fragmented message counts once against ume_flight_size and flies until every "
            "fragment is stable",
      section="UMP Flight Size",
      requirement="The UMP flight size mechanism operates on a per message basis, not a per "
                  "fragment basis.",
      timeout=15.0)
def fragments_count_once(h: CaseContext) -> None:
    """Flight size 2, ``transport_tcp_datagram_max_size`` 44 (the source's messages, longer
    than 16 bytes, go out as k fragments each), no stability ACK: exactly the 2k fragments of
    2 messages go out (a source counting fragments stops after one message, or inside it).
    The harness then acknowledges every fragment of the first message but its last: still
    nothing more; then the last: exactly one more message, all its fragments."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 2,
                                "source ume_flight_size_bytes": 0,
                                "source ume_flight_size_behavior": "block",
                                "source transport_tcp_datagram_max_size": FRAGMENT_DATAGRAM})
    _settled(h, store, 0.5, 3.0, "sending fragmented messages with flight size 2")
    firsts = _fragmented_at(h, store, 2, "the fragmented messages sent with flight size 2")
    first = sorted(piece[0] for piece in _fragment_groups(store)[0][firsts[0]])
    if len(first) < 2:
        h.check(False, "the first message was not fragmented",
                expected="at least 2 fragments", observed=first)
    store.send_stable(*first[:-1])
    _fragmented_at(h, store, 2, "the messages sent with one fragment of message "
                                f"{firsts[0]} unstable")
    store.send_stable(first[-1])
    _fragmented_at(h, store, 3, f"the messages sent once every fragment of message "
                                f"{firsts[0]} was stable")


@case("SRC-FLT-009", suite=SUITE, role=Role.SOURCE,
      title="Behaviour block with non-blocking sends: a full flight returns would-block, the "
            "messages on the wire are the same",
      section="UMP Flight Size",
      requirement="By default, when a source sends a message that exceeds it's flight size, "
                  "the call to send blocks. ... If the source uses a non-blocking send, the "
                  "send returns an LBM_EWOULD_BLOCK.",
      timeout=12.0)
def nonblocking_send_would_block(h: CaseContext) -> None:
    """SRC-FLT-001 with non-blocking sends: flight size 3, no stability ACK, exactly 0..2 go
    out; while the flight is full the IUT's output must report a "would block" result (the
    profile's ``would_block_text``: a non-blocking send returns instead of waiting, and the
    output is how a black box shows what its application got); the harness acknowledges 0 and
    exactly one more message (3) may follow (the refused message is sent once there is
    room)."""
    text = h.iut_profile.would_block_text
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 3,
                                "source ume_flight_size_bytes": 0,
                                "source ume_flight_size_behavior": "block"},
                nonblocking=True)
    assert text is not None  # (start_iut made the case unsupported without it)
    _settled(h, store, 0.5, 3.0, "sending with flight size 3, non-blocking sends")
    _blocked_at(h, store, [0, 1, 2], "the messages sent with flight size 3 and no ACK")

    def reported() -> bool:
        return text.lower() in h.iut_output().lower()
    h.wait_until(reported, 2.0, f"the IUT to report {text!r}")
    said = [line.strip() for line in h.iut_output().splitlines() if line.strip()]
    h.check(reported(), "a non-blocking send into a full flight did not report \"would "
            "block\" (did it wait like a blocking send?)",
            expected=f"the IUT's output contains {text!r} (profile would_block_text)",
            observed=said[-5:] or "no output")
    store.send_stable(0)
    _blocked_at(h, store, [0, 1, 2, 3], "the messages sent after message 0 became stable")
