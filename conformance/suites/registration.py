"""Registration suite: how a store IUT registers sources and receivers.

The harness plays the sources and receivers (scripted, every packet crafted with the Scapy
layers of :mod:`wire.scapy_layers`) and the resolver daemon.  Section names are the product
guide's (the UM Guide for Persistence); the PREG_RESP flags and error codes are those of the
LBMC dissector (``PregError``).
"""

from __future__ import annotations

from typing import Any

from conformance.context import CaseContext
from conformance.model import Role, Strength, case
from wire.lbmc import PregError

SUITE = "registration"


def _granted(h: CaseContext, resp: object, who: str) -> None:
    h.check(not resp.e_flag, f"the store refused {who} (error code {resp.error_code})",  # type: ignore[attr-defined]
            expected="PREG_RESP without the E (error) flag", observed=repr(resp))


def _refused(h: CaseContext, resp: Any, who: str, *, preferred: PregError | None = None,
             meaning: str = "") -> None:
    """The store must refuse (MUST); with ``preferred`` it should say why with that error
    code (SHOULD: a different code is non-strict)."""
    h.check(bool(resp.e_flag), f"the store granted {who}",
            expected="PREG_RESP with the E (error) flag", observed=repr(resp))
    if preferred is not None:
        h.prefer(resp.error_code == preferred, f"refused, but not with the {meaning} code",
                 expected=f"error code {int(preferred)} ({preferred.name})",
                 observed=resp.error_code)


@case("REG-STORE-001", suite=SUITE, role=Role.STORE,
      title="A new source registering with RegID 0 is assigned a non-zero RegID",
      section="Registration Identifier",
      requirement="UMP identifies sources and receivers with Registration Identifiers ... a "
                  "RegID is a 32-bit number that uniquely identifies a source or a receiver to "
                  "a store.")
def new_source_is_assigned_a_regid(h: CaseContext) -> None:
    """A PREG with RegID 0 asks the store to choose; the answer must name a usable RegID and
    must not claim the source is known (OLD flag)."""
    src = h.source()
    resp = src.register(reg_id=0)
    _granted(h, resp, "a new source")
    h.check(resp.reg_id != 0, "the assigned RegID is 0", expected="a RegID other than 0",
            observed=resp.reg_id)
    h.check(not resp.o_flag, "a brand-new source was answered as an old client",
            expected="O flag clear", observed=repr(resp))


@case("REG-STORE-002", suite=SUITE, role=Role.STORE,
      title="A source registering with a static RegID gets exactly that RegID",
      section="Adding Fault Recovery with Registration IDs",
      requirement="Sources and receivers may specify the RegID they want; the store uses the "
                  "RegID the application gives it.")
def static_regid_is_granted(h: CaseContext) -> None:
    """Static RegIDs are how applications without Session IDs find their state again."""
    src = h.source()
    wanted = h.random.randrange(100_000, 1 << 31)
    resp = src.register(reg_id=wanted)
    _granted(h, resp, "a source with a static RegID")
    h.check_equal(resp.reg_id, wanted, "the RegID in PREG_RESP")


@case("REG-STORE-003", suite=SUITE, role=Role.STORE,
      title="A second source asking for the RegID an active source holds is refused",
      section="Registration Identifier",
      requirement="No two active sources or receivers can share a RegID or use the same RegID "
                  "at the same time.")
def active_regid_collision_is_refused(h: CaseContext) -> None:
    """Two live sources with one RegID would corrupt each other's repository ("strong
    RegIDs"): the second registration must be refused while the first is active."""
    first = h.source("source A")
    resp = first.register(reg_id=0)
    _granted(h, resp, "source A")
    second = h.source("source B", topic=first.topic)
    clash = second.register(reg_id=resp.reg_id)
    _refused(h, clash, f"source B the RegID {resp.reg_id} that source A holds")


@case("REG-STORE-004", suite=SUITE, role=Role.STORE,
      title="A re-registering source gets the OLD flag and the highest sequence number stored",
      section="Sources Must Be Able to Resume Sending",
      requirement="When a source re-registers, the store responds that the source is an old "
                  "client along with the highest sequence number it holds for that source, so "
                  "the source resumes after it.")
def reregistration_gets_old_flag_and_high_sqn(h: CaseContext) -> None:
    """Register, send 0..9 and see them stable, drop the connection, register again with
    the same RegID: OLD + high sequence number 9."""
    src = h.source()
    resp = src.register(reg_id=0)
    _granted(h, resp, "the source")
    src.send(*range(10))
    src.expect_stable(9)
    assert src.link is not None
    src.link.close()
    again = src.register(reg_id=resp.reg_id)
    _granted(h, again, "the re-registering source")
    h.check(bool(again.o_flag), "the re-registration was not answered as an old client",
            expected="O flag set", observed=repr(again))
    h.check_equal(again.high_seqnum, 9, "high_seqnum of the re-registration")


@case("REG-STORE-005", suite=SUITE, role=Role.STORE,
      title="Registering twice with one topic and Session ID gives the same RegID",
      section="How Stores Associate Session IDs and RegIDs",
      requirement="When a store receives a registration request from a source or receiver "
                  "with a particular Session ID, it checks to see if it already has a source "
                  "or receiver for that topic/Session ID. If it does, then it responds with "
                  "that source's or receiver's RegID.")
def session_id_finds_the_same_regid(h: CaseContext) -> None:
    src = h.source()
    sid = h.random.randrange(1, 1 << 60)
    first = src.register(reg_id=0, session_id=sid)
    _granted(h, first, "a source with a Session ID")
    assert src.link is not None
    src.link.close()
    second = src.register(reg_id=0, session_id=sid)
    _granted(h, second, "the same source again")
    h.check_equal(second.reg_id, first.reg_id, "the RegID for the same topic and Session ID")
    h.check(bool(second.o_flag), "the second registration was not answered as an old client",
            expected="O flag set", observed=repr(second))


@case("REG-STORE-006", suite=SUITE, role=Role.STORE,
      title="One Session ID on two topics gives two different RegIDs",
      section="How Stores Associate Session IDs and RegIDs",
      requirement="If it does not find a source or receiver for that topic/Session ID pair, "
                  "the store assigns a new RegID.")
def session_id_is_per_topic(h: CaseContext) -> None:
    sid = h.random.randrange(1, 1 << 60)
    a, b = h.source("source A"), h.source("source B")
    ra = a.register(reg_id=0, session_id=sid)
    rb = b.register(reg_id=0, session_id=sid)
    _granted(h, ra, "source A")
    _granted(h, rb, "source B")
    h.check(ra.reg_id != rb.reg_id, "two topics with one Session ID share a RegID",
            expected="different RegIDs", observed=(ra.reg_id, rb.reg_id))
    h.check(not rb.o_flag, "a new topic/Session ID pair was answered as an old client",
            expected="O flag clear", observed=repr(rb))


@case("REG-STORE-007", suite=SUITE, role=Role.STORE,
      title="A source whose topic matches no topic pattern of the store is refused",
      section="Store Element",
      requirement="A store persists only topics that match one of its topic patterns; a "
                  "registration for any other topic is refused (no pattern).")
def unmatched_topic_is_refused(h: CaseContext) -> None:
    src = h.source(topic=f"unmatched.{h.random.randrange(10**9)}")
    resp = src.register(reg_id=0)
    _refused(h, resp, "a topic outside its patterns", preferred=PregError.ENOPATTERN,
             meaning="no-pattern")


@case("REG-STORE-008", suite=SUITE, role=Role.STORE,
      title="A receiver naming a registered source's RegID is registered",
      section="Receiver Registration",
      requirement="Receivers unicast registrations to the store. The store unicasts responses "
                  "back to the receivers. Stores use RegIDs to identify sources and receivers.")
def receiver_registers(h: CaseContext) -> None:
    src = h.source()
    _granted(h, src.register(reg_id=0), "the source")
    rcv = h.receiver(src)
    resp = rcv.register(reg_id=0)
    _granted(h, resp, "the receiver")
    h.check(resp.reg_id not in (0, src.reg_id), "the receiver's RegID is 0 or the source's",
            expected="a RegID of its own", observed=resp.reg_id)
    h.check(not resp.o_flag, "a new receiver was answered as an old client",
            expected="O flag clear", observed=repr(resp))


@case("REG-STORE-009", suite=SUITE, role=Role.STORE,
      title="A receiver naming an unknown source RegID is refused",
      section="Receiver Registration",
      requirement="Receivers include the source's RegID in their registration request; the "
                  "store can register a receiver only for a source it knows.")
def receiver_for_unknown_source_is_refused(h: CaseContext) -> None:
    src = h.source()
    _granted(h, src.register(reg_id=0), "the source")
    rcv = h.receiver(src)
    resp = rcv.register(reg_id=0, source_reg_id=src.reg_id ^ 0x5A5A5A5A)
    _refused(h, resp, "a receiver of a source it does not know",
             preferred=PregError.ESRCREGID, meaning="unknown-source-RegID")


@case("REG-STORE-010", suite=SUITE, role=Role.STORE,
      title="A re-registering receiver gets OLD and its last acknowledged sequence number + 1",
      section="Receiver Recovery",
      requirement="Each store returns the sequence number after the last message this "
                  "receiver acknowledged (low sequence number = last ACK + 1).")
def receiver_reregistration_low_sqn(h: CaseContext) -> None:
    src = h.source()
    _granted(h, src.register(reg_id=0), "the source")
    src.send(*range(10))
    src.expect_stable(9)
    rcv = h.receiver(src)
    resp = rcv.register(reg_id=0)
    _granted(h, resp, "the receiver")
    rcv.ack(4)  # TCP keeps order: the store reads the ACK before the connection's end
    assert rcv.link is not None
    rcv.link.close()
    again = rcv.register(reg_id=resp.reg_id)
    _granted(h, again, "the re-registering receiver")
    h.check(bool(again.o_flag), "the receiver's re-registration was not answered as old",
            expected="O flag set", observed=repr(again))
    h.check_equal(again.low_seqnum, 5, "low_seqnum after consuming up to 4")


@case("REG-STORE-011", suite=SUITE, role=Role.STORE,
      title="A receiver with a Session ID gets the same RegID when it registers again",
      section="How Stores Associate Session IDs and RegIDs",
      requirement="When a store receives a registration request from a source or receiver "
                  "with a particular Session ID ... it responds with that source's or "
                  "receiver's RegID.")
def receiver_session_id(h: CaseContext) -> None:
    src = h.source()
    _granted(h, src.register(reg_id=0), "the source")
    rcv = h.receiver(src)
    sid = h.random.randrange(1, 1 << 60)
    first = rcv.register(reg_id=0, session_id=sid)
    _granted(h, first, "the receiver")
    assert rcv.link is not None
    rcv.link.close()
    second = rcv.register(reg_id=0, session_id=sid)
    _granted(h, second, "the receiver again")
    h.check_equal(second.reg_id, first.reg_id, "the receiver's RegID for the same Session ID")


@case("REG-STORE-012", suite=SUITE, role=Role.STORE,
      title="A receiver asking for a RegID that a source holds is refused",
      section="Registration Identifier",
      requirement="No two active sources or receivers can share a RegID or use the same RegID "
                  "at the same time.")
def receiver_cannot_take_a_source_regid(h: CaseContext) -> None:
    src = h.source()
    _granted(h, src.register(reg_id=0), "the source")
    rcv = h.receiver(src)
    resp = rcv.register(reg_id=src.reg_id)
    _refused(h, resp, "a receiver the source's RegID")


@case("REG-STORE-013", suite=SUITE, role=Role.STORE, strength=Strength.SHOULD,
      title="A source deregistering is answered with the deregister flag",
      section="Deregistration",
      requirement="A source can deregister from its stores; the store confirms the "
                  "deregistration and deletes the source's state.")
def source_deregistration(h: CaseContext) -> None:
    src = h.source()
    resp = src.register(reg_id=0)
    _granted(h, resp, "the source")
    answer = src.register(reg_id=resp.reg_id, deregister=True)
    h.check(bool(answer.d_flag) and not answer.e_flag,
            "the deregistration was not confirmed",
            expected="PREG_RESP with the D flag and no error", observed=repr(answer))
