"""The quorum suite, store IUT (QRM-STORE-*): the receiver activity timeout and state lifetime
(client value against store value, the shorter wins) and a retransmission request naming an
unknown RegID (guide "Activity Timeout and State Lifetime Options", "Registration Identifier";
docs/semantics.md §1.11).

What a store case can see of a receiver's state is the store's answer when the receiver
registers again: the OLD flag and the low sequence number (its last acknowledged message + 1)
while the store still holds its state; a new registration (no OLD flag) once the state was
deleted; a refusal (code 3) to another receiver asking for the RegID while it is still held.
The scripted receivers go away by closing their connection (a SIGKILLed receiver's socket closes
at once; the store must not take that as the end of the RegID, only its activity timeout).

Timing: the options are in milliseconds and are not scaled by ``--time-scale``; the probes are.
The probe that must still find the state comes one scaled second after the receiver left, well
inside a 2.5 s lifetime at time scales up to 2; the probe that must find it deleted comes after
four scaled seconds.
"""

from __future__ import annotations

import time

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.packets import LBMC, LBMC_UmeRxreq
from conformance.peers import HarnessReceiver, HarnessSource
from wire.lbmc import PregError

SUITE = "quorum"
S_TOPIC_OPTIONS = "Options for a Topic's ume-attributes Element"
CHECK: dict[str, str | int] = {"source-check-interval": 100,
                               "receiver-new-registration-rollback": 2147483647}
"""Every case: the store checks activity every 100 ms; a new receiver starts at the oldest
message held (so a new and a returning receiver are told apart by the OLD flag, and the low
sequence number says which one the store took it for)."""
ACKED = 2
"""What each receiver acknowledges before it goes away: a returning receiver starts at 3."""
SHORT, LONG = 2500, 60000
"""State lifetimes in ms: the one that must win, and the one that must not."""


def _source(h: CaseContext, count: int = 5) -> HarnessSource:
    """A source with ``count`` stable messages."""
    src = h.source()
    resp = src.register(reg_id=0)
    h.check(not resp.e_flag, "the store refused the source", observed=repr(resp))
    src.send(*range(count))
    src.expect_stable(count - 1)
    return src


def _leaving_receiver(h: CaseContext, src: HarnessSource, name: str,
                      **preg: int) -> HarnessReceiver:
    """A receiver that registers (``preg``: its client lifetime values), acknowledges
    :data:`ACKED` and goes away (closes its connection to the store)."""
    rcv = h.receiver(src, name)
    resp = rcv.register(reg_id=0, **preg)
    h.check(not resp.e_flag, f"the store refused {name}", observed=repr(resp))
    rcv.ack(ACKED)
    time.sleep(0.05)  # the ACK goes out before the connection closes
    assert rcv.link is not None
    rcv.link.close()
    h.note(f"{name} (RegID {rcv.reg_id}) acknowledged {ACKED} and went away")
    return rcv


def _still_held(h: CaseContext, rcv: HarnessReceiver, when: str) -> None:
    """``rcv`` registers again with its RegID: the store must still know it."""
    resp = rcv.register(reg_id=rcv.reg_id)
    h.check(not resp.e_flag, f"the store refused {rcv.name} {when}", observed=repr(resp))
    h.check(bool(resp.o_flag), f"the store forgot {rcv.name} {when}",
            expected="O flag set (its state is still held)", observed=repr(resp))
    h.check_equal(resp.low_seqnum, ACKED + 1, f"the low sequence number of {rcv.name} {when}")


def _deleted(h: CaseContext, rcv: HarnessReceiver, when: str) -> None:
    """``rcv`` registers again with its RegID: the store must take it for a new receiver."""
    resp = rcv.register(reg_id=rcv.reg_id)
    h.check(not resp.e_flag, f"the store refused {rcv.name} {when}", observed=repr(resp))
    h.check(not resp.o_flag, f"the store still held the state of {rcv.name} {when}",
            expected="O flag clear (a new registration)", observed=repr(resp))


def _wait(h: CaseContext, seconds: float, what: str) -> None:
    h.wait_until(lambda: False, seconds, what)


@case("QRM-STORE-001", suite=SUITE, role=Role.STORE, section=S_TOPIC_OPTIONS, timeout=15.0,
      title="A receiver's RegID is held for its activity timeout, then released with its state",
      requirement="receiver-activity-timeout: Establishes the period of time from a "
                  "receiver's last activity to the release of the receiver's RegID. Stores "
                  "return an error to any new request for the receiver's RegID during this "
                  "period. (Without a state lifetime the state goes with it, docs/semantics.md "
                  "§1.11.)",
      topic_options={**CHECK, "receiver-activity-timeout": 1000})
def receiver_activity_timeout(h: CaseContext) -> None:
    """Receiver A registers, acknowledges and goes away; receiver B (another request port)
    asks for A's RegID at once (refused: code 3) and again after two activity timeouts:
    granted as a new registration, A's state deleted."""
    src = _source(h)
    a = _leaving_receiver(h, src, "receiver A")
    b = h.receiver(src, "receiver B")
    b.request_port = a.request_port + 1  # another process: not A's request port
    resp = b.register(reg_id=a.reg_id)
    h.check(bool(resp.e_flag), "another receiver got the RegID of a receiver within its "
            "activity timeout", expected="refused (code 3)", observed=repr(resp))
    h.check_equal(resp.error_code, int(PregError.EREGID), "the refusal's code")
    _wait(h, 2.0, "two receiver activity timeouts")
    resp = b.register(reg_id=a.reg_id)
    h.check(not resp.e_flag, "the RegID of a receiver silent past its activity timeout was "
            "not released", expected="granted", observed=repr(resp))
    h.check(not resp.o_flag, "the state of a receiver silent past its activity timeout (no "
            "state lifetime) was kept", expected="O flag clear (a new registration)",
            observed=repr(resp))


@case("QRM-STORE-002", suite=SUITE, role=Role.STORE, section=S_TOPIC_OPTIONS, timeout=15.0,
      title="A receiver's shorter ume_state_lifetime wins over the store's lifetime",
      requirement="receiver-state-lifetime: Establishes the period of time from a receiver's "
                  "last activity to the deletion of the receiver's state and cache by the "
                  "store. You can also configure ume_state_lifetime for the receiver. The "
                  "store uses whichever is shorter.",
      topic_options={**CHECK, "receiver-activity-timeout": 300,
                     "receiver-state-lifetime": LONG})
def client_lifetime_shorter(h: CaseContext) -> None:
    """Receivers X and Y (ume_state_lifetime 2.5 s; the store's is 60 s; activity timeout
    0.3 s) acknowledge and go away: X is still known after 1 s (past its activity timeout,
    within its lifetime), Y is new after 4 s (its own lifetime won)."""
    _lifetime_case(h, client=SHORT)


@case("QRM-STORE-003", suite=SUITE, role=Role.STORE, section=S_TOPIC_OPTIONS, timeout=15.0,
      title="The store's shorter receiver-state-lifetime wins over the receiver's",
      requirement="receiver-state-lifetime: Establishes the period of time from a receiver's "
                  "last activity to the deletion of the receiver's state and cache by the "
                  "store. You can also configure ume_state_lifetime for the receiver. The "
                  "store uses whichever is shorter.",
      topic_options={**CHECK, "receiver-activity-timeout": 300,
                     "receiver-state-lifetime": SHORT})
def store_lifetime_shorter(h: CaseContext) -> None:
    """As QRM-STORE-002 with the values swapped: the receivers ask for 60 s, the store's
    receiver-state-lifetime is 2.5 s, and it must win."""
    _lifetime_case(h, client=LONG)


def _lifetime_case(h: CaseContext, *, client: int) -> None:
    src = _source(h)
    x = _leaving_receiver(h, src, "receiver X", state_lifetime=client)
    y = _leaving_receiver(h, src, "receiver Y", state_lifetime=client)
    start = time.monotonic()
    _wait(h, 1.0, "past the activity timeout, within the shorter lifetime")
    _still_held(h, x, f"{time.monotonic() - start:.1f} s after it left (past its activity "
                      "timeout, within the shorter lifetime)")
    _wait(h, max(0.0, 4.0 - (time.monotonic() - start) / h.scaled(1.0)),
          "past the shorter lifetime")
    _deleted(h, y, f"{time.monotonic() - start:.1f} s after it left (the shorter lifetime "
                   f"is {SHORT / 1000} s)")


@case("QRM-STORE-004", suite=SUITE, role=Role.STORE, section="Registration Identifier",
      title="A retransmission request naming an unknown RegID gets no retransmission",
      requirement="A RegID is a 32-bit number that uniquely identifies a source or a receiver "
                  "to a store ... Receivers unicast retransmission requests. If the store has "
                  "the message, it unicasts the retransmission to the receiver (\"Receiver "
                  "Recovery\"): a request naming no registered receiver has no receiver to "
                  "go to.",
      topic_options=CHECK)
def unknown_regid_rxreq(h: CaseContext) -> None:
    """A registered receiver's connection carries requests for 1..3 naming a RegID nobody
    registered (and one naming the source's RegID): nothing may come back within a second.
    Then the receiver asks for 2 with its own RegID, which must come (the store serves the
    connection at all)."""
    src = _source(h)
    rcv = h.receiver(src)
    resp = rcv.register(reg_id=0)
    h.check(not resp.e_flag, "the store refused the receiver", observed=repr(resp))
    taken = {rcv.reg_id, src.reg_id}
    unknown = next(r for r in (h.random.randint(1, 0xFFFFFFFF) for _ in range(100))
                   if r not in taken)
    link = rcv.connect()
    local = link.local
    for idx, (reg_id, sqn) in enumerate([(unknown, 1), (unknown, 2), (unknown, 3),
                                          (src.reg_id, 1)], start=1):
        link.send(LBMC() / LBMC_UmeRxreq(
            request_idx=idx, transport_idx=src.transport_idx, id_2=reg_id, seqnum=sqn,
            rx_port=rcv.request_port, rx_ip=local[0]))
    h.note(f"RXREQs for 1..3 naming unknown RegID {unknown}, for 1 naming source RegID "
           f"{src.reg_id}")
    _wait(h, 1.0, "a retransmission for a request naming an unknown RegID (must not come)")
    served = [m.sqn for m in link.received if m.is_data_type]
    h.check(served == [], "the store retransmitted for a request naming no registered "
            "receiver", expected="no data message", observed=served)
    rcv.rxreq(2)
    got = rcv.expect_data(2)
    h.check_equal(got.payload, bytes(src.data(2).payload),
                  "the payload retransmitted for the receiver's own request")


@case("QRM-STORE-005", suite=SUITE, role=Role.STORE, section=S_TOPIC_OPTIONS, timeout=15.0,
      title="A receiver's consumption ACKs are activity: its RegID stays its own past the timeout",
      requirement="receiver-activity-timeout: Establishes the period of time from a "
                  "receiver's last activity to the release of the receiver's RegID. Stores "
                  "return an error to any new request for the receiver's RegID during this "
                  "period.",
      topic_options={**CHECK, "receiver-activity-timeout": 600})
def acks_are_activity(h: CaseContext) -> None:
    """Receiver A (activity timeout 0.6 s) sends a consumption ACK every 0.15 s for 2 s, four
    activity timeouts after its registration: receiver B (another request port) asking for
    A's RegID then must be refused (code 3).  A stops; two timeouts later B gets it."""
    src = _source(h)
    a = h.receiver(src, "receiver A")
    resp = a.register(reg_id=0)
    h.check(not resp.e_flag, "the store refused receiver A", observed=repr(resp))
    end = time.monotonic() + 2.0
    sqn = 0
    while time.monotonic() < end:
        a.ack(sqn % 5)
        sqn += 1
        time.sleep(0.15)
    h.note(f"receiver A sent {sqn} consumption ACKs over 2 s (activity timeout 0.6 s)")
    b = h.receiver(src, "receiver B")
    b.request_port = a.request_port + 1  # another process: not A's request port
    resp = b.register(reg_id=a.reg_id)
    h.check(bool(resp.e_flag), "another receiver got the RegID of a receiver that kept "
            "acknowledging (its ACKs were not counted as activity)",
            expected="refused (code 3)", observed=repr(resp))
    h.check_equal(resp.error_code, int(PregError.EREGID), "the refusal's code")
    _wait(h, 1.5, "past A's activity timeout after its last ACK")
    resp = b.register(reg_id=a.reg_id)
    h.check(not resp.e_flag, "the RegID of a receiver silent past its activity timeout was "
            "not released", expected="granted", observed=repr(resp))


@case("QRM-STORE-006", suite=SUITE, role=Role.STORE, section=S_TOPIC_OPTIONS, timeout=15.0,
      title="A receiver's own ume_activity_timeout replaces the store's receiver-activity-timeout",
      requirement="An activity timeout can be configured for the source/receiver with the UM "
                  "Configuration Option cited above or with a topic's ume-attribute configured "
                  "in the umestored XML configuration file. (The client's value overrides the "
                  "store's, docs/semantics.md §1.11.)",
      topic_options={**CHECK, "receiver-activity-timeout": LONG})
def client_activity_timeout(h: CaseContext) -> None:
    """The store's receiver-activity-timeout is 60 s; receiver A registers asking for 1 s
    (``ume_activity_timeout``, the client-lifetime header), acknowledges and goes away.
    Receiver B (another request port) asks for A's RegID at once: refused (code 3); after two
    of A's timeouts: granted as a new registration (A's state went with its timeout: no state
    lifetime).  A store that keeps its own 60 s refuses B the second time too."""
    src = _source(h)
    a = _leaving_receiver(h, src, "receiver A", activity_timeout=1000)
    b = h.receiver(src, "receiver B")
    b.request_port = a.request_port + 1  # another process: not A's request port
    resp = b.register(reg_id=a.reg_id)
    h.check(bool(resp.e_flag), "another receiver got the RegID of a receiver within its "
            "activity timeout", expected="refused (code 3)", observed=repr(resp))
    h.check_equal(resp.error_code, int(PregError.EREGID), "the refusal's code")
    _wait(h, 2.0, "two of the receiver's own activity timeouts")
    resp = b.register(reg_id=a.reg_id)
    h.check(not resp.e_flag, "the store kept the RegID of a receiver silent past its own "
            "ume_activity_timeout (1 s; the store's value is 60 s)", expected="granted",
            observed=repr(resp))
    h.check(not resp.o_flag, "the state of a receiver silent past its own activity timeout "
            "(no state lifetime) was kept", expected="O flag clear (a new registration)",
            observed=repr(resp))
