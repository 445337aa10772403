"""Durability suite (``--suite durability``): store IUT, the "durable before acknowledged" rule.

A source counts a message stable, and may reclaim it, once its stores acknowledged it (the
guide's "Sources Using Quorum/Consensus"); a disk repository keeps state and data on disk
("Source Repositories"), and a store that fails and comes back serves the sources and receivers
that re-register with it ("Persistent Store Fault Tolerance", "Source Recovery", "Receiver
Recovery").  Together: a store must never acknowledge a message it could still lose by being
killed, so every message it acknowledged before a crash must be recoverable after its restart.
What happens to the messages that arrived but were not yet acknowledged is not judged.

Each case plays a source sending a burst of messages to a disk repository, records the
stability ACKs, SIGKILLs the store IUT the moment the last ACK arrived (a process kill, not a
power loss: what the store handed to the kernel survives), restarts it on its own files, lets
the source re-register and then a new receiver ask for every acknowledged message.  DUR-STORE-001
uses the default ACK per message; DUR-STORE-002 batches ACKs
(``stability-ack-minimum-number``/``-interval``), the other order of writes and ACKs a store
may take.
"""

from __future__ import annotations

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.peers import HarnessSource
from wire.lbmc import AckType, UmeAck

SUITE = "durability"
SECTION = "Persistent Store Fault Tolerance"
COUNT = 300
DISK: dict[str, str | int] = {"repository-type": "disk",
                              "receiver-new-registration-rollback": 2147483647}
REQUIREMENT = ("A store acknowledges a message as stable only once it is kept in the "
               "repository (for a disk repository: on disk), so a store killed right after "
               "its stability ACKs and restarted on its files still holds every message it "
               "acknowledged: the re-registering source learns a highest sequence number at "
               "least the last acknowledged one, and a receiver recovers every acknowledged "
               "message with its payload.")


def _acked(src: HarnessSource) -> set[int]:
    """The sequence numbers the store acknowledged as stable on the registration connection."""
    if src.link is None:
        return set()
    return {hd.seqnum for m in list(src.link.received) for hd in m.headers
            if isinstance(hd, UmeAck) and hd.type == AckType.STABLE}


def _crash_and_recover(h: CaseContext) -> None:
    src = h.source()
    resp = src.register(reg_id=0)
    h.check(not resp.e_flag, "the store refused the source",
            expected="the source registered", observed=repr(resp))
    reg_id = src.reg_id
    src.send(*range(COUNT))
    everything = set(range(COUNT))
    h.wait_until(lambda: _acked(src) >= everything, 5.0, f"stability ACKs for 0..{COUNT - 1}")
    acked = _acked(src)  # read at once: the kill follows the last ACK as closely as we can
    h.restart_iut(kill=True)
    h.check(bool(acked), "the store acknowledged nothing before the crash",
            expected=f"stability ACKs for 0..{COUNT - 1}", observed="none")
    h.note(f"{len(acked)} of {COUNT} messages acknowledged before the SIGKILL "
           f"(highest {max(acked)})")
    resp = src.register(reg_id=reg_id)
    h.check(not resp.e_flag, "the restarted store refused the returning source",
            expected="the source re-registered", observed=repr(resp))
    h.check(bool(resp.o_flag), "the restarted store forgot the source it acknowledged "
            "messages for", expected="O flag set", observed=repr(resp))
    high = resp.high_seqnum  # judged last: the lost messages are the clearer verdict
    rcv = h.receiver(src)
    h.check(not rcv.register(reg_id=0).e_flag, "the restarted store refused a receiver",
            expected="a receiver registered")
    link = rcv.connect()
    wanted = sorted(acked)
    for sqn in wanted:
        rcv.rxreq(sqn)

    def served() -> dict[int, bytes]:
        return {m.sqn: bytes(m.payload or b"") for m in list(link.received)
                if m.is_data_type and m.sqn in acked}

    h.wait_until(lambda: len(served()) == len(wanted), 5.0,
                 f"retransmissions of the {len(wanted)} acknowledged messages")
    got = served()
    lost = [sqn for sqn in wanted if sqn not in got]
    h.check(not lost, f"{len(lost)} acknowledged message(s) lost in the crash",
            expected=f"all {len(wanted)} acknowledged messages retransmitted after the restart",
            observed=f"not recoverable: {lost[:10]}{' ...' if len(lost) > 10 else ''}")
    wrong = [sqn for sqn, payload in got.items() if payload != bytes(src.data(sqn).payload)]
    h.check(not wrong, "acknowledged messages came back with another payload",
            expected="the payloads the source sent", observed=wrong[:10])
    h.check(high >= max(acked),
            "the restarted store told the source a highest sequence number below one it "
            "acknowledged (Source Recovery would resend or skip acknowledged messages)",
            expected=f"high_seqnum >= {max(acked)}", observed=high)


@case("DUR-STORE-001", suite=SUITE, role=Role.STORE, needs_restart=True, timeout=30.0,
      title="Every message acknowledged before a SIGKILL is recoverable after the restart",
      section=SECTION, requirement=REQUIREMENT, topic_options=DISK)
def crash_after_acks(h: CaseContext) -> None:
    """300 messages, an ACK for each (the default): SIGKILL at the last ACK, restart, the
    source re-registers, a receiver asks for every acknowledged message."""
    _crash_and_recover(h)


@case("DUR-STORE-002", suite=SUITE, role=Role.STORE, needs_restart=True, timeout=30.0,
      title="With batched stability ACKs too, every acknowledged message survives a SIGKILL",
      section=SECTION, requirement=REQUIREMENT,
      topic_options={**DISK, "stability-ack-minimum-number": 16,
                     "stability-ack-interval": 100})
def crash_after_batched_acks(h: CaseContext) -> None:
    """As DUR-STORE-001 with ACKs batched by 16 or every 100 ms: the batching must not let an
    ACK overtake the write of its message."""
    _crash_and_recover(h)
