"""The LBT-RM suite: a source's and a receiver's LBT-RM transport (NAKs, NCFs, backoff).

Persistence sits on top of the transport, and the guide says the transport's own loss repair is
unchanged by it (guide, "Receiver Recovery": "The source retransmits messages in response to
NAKs from the receiver. Stores do not participate"); its options are the product's
``transport_lbtrm_*`` (guide, "Configuring for Persistence and Recovery", the sample
configuration's "Transport LBT-RM Reliability Options").  What each option means is in
``docs/wire-transports.md`` §2.6; the layouts in §2.2-2.3.

Against a source IUT (started with ``source transport lbt-rm`` on a group and port of the case's
own) the harness is a receiver (:class:`~conformance.lbtrm_peers.LbtrmTap`) that NAKs what it
chooses; against a receiver IUT it is a source
(:class:`~conformance.lbtrm_peers.LbtrmScriptedSource`) that leaves a gap and watches the NAKs.
The cases are about LBT-RM (``transport="lbt-rm"``): they run on it whatever ``ump conform
--transport`` says.

Time bounds.  A lower bound on a delay (a NAK no sooner than half the initial backoff) is not
scaled by ``--time-scale``, since a slow machine only makes delays longer; waits for something
to come are scaled.  The slack below each lower bound (10 ms) covers the clocks of two
processes reading one loopback.
"""

from __future__ import annotations

import itertools
import random
import time

from conformance.context import CaseContext
from conformance.lbtrm_peers import LbtrmScriptedSource, LbtrmTap
from conformance.model import Role, Unsupported, case
from conformance.udp_transport import LBT_RM, fresh_group, group_members
from wire import lbmr, lbtrm

SUITE = "lbt-rm"
SLACK = 0.01
"""Seconds allowed below a lower bound (see the module docstring)."""

# --- a source IUT ---------------------------------------------------------------------------


def _source(h: CaseContext, **options: str | int) -> LbtrmTap:
    """Start the source IUT on LBT-RM (a group and destination port of the case's own, any
    further ``source transport_lbtrm_*`` options) and join its session as a receiver."""
    group, port = fresh_group(random.Random())
    h.start_iut(options={"source transport": "lbt-rm",
                         "source transport_lbtrm_multicast_address": group,
                         "source transport_lbtrm_destination_port": port,
                         **{f"source transport_lbtrm_{k}": v for k, v in options.items()}})
    tir = h.wait_tir(timeout=6.0)
    if not isinstance(tir.info, lbmr.LbtrmInfo):
        raise Unsupported(f"the source advertised a {type(tir.info).__name__} transport, not "
                          f"LBT-RM, for 'source transport lbt-rm'")
    tap = LbtrmTap(tir.info, h.recorder)
    h.closers.append(tap.close)
    h.note(f"receiving {tir.info.mcast_addr}:{tir.info.udp_dest_port}; NAKs go to "
           f"{tap.source[0]}:{tap.source[1]}, session {tap.session_id:#010x}")
    h.check(tap.wait(lambda: len(tap.data()) >= 3, h.scaled(4.0)),
            "the source sent no DATA on its LBT-RM session", expected="DATA datagrams",
            observed=f"{len(tap.data())} DATA")
    return tap


def _rx(tap: LbtrmTap, sqn: int, since: float) -> list[float]:
    """Arrival times of retransmissions (RX flag) of ``sqn`` since ``since``."""
    return [t for t, p in tap.data() if p.sqn == sqn and p.rx and t >= since]


@case("SRC-LBTRM-001", suite=SUITE, role=Role.SOURCE, transport=LBT_RM,
      title="A NAK for a message sent is answered with its retransmission to the group",
      section="Receiver Recovery",
      requirement="The source retransmits messages in response to NAKs from the receiver: a "
                  "selective NAK to the source's unicast port for a sequence number it sent "
                  "brings that DATA again, with the retransmission flag, to the group.")
def source_retransmits_a_naked_message(h: CaseContext) -> None:
    tap = _source(h)
    sqn = tap.data()[-1][1].sqn
    sent = tap.nak(sqn)
    h.note(f"NAK for sqn {sqn}")
    tap.wait(lambda: bool(_rx(tap, sqn, sent)), h.scaled(1.5))
    h.check(bool(_rx(tap, sqn, sent)), "the source did not retransmit the NAKed message",
            expected=f"DATA(RX) sqn {sqn} within {h.scaled(1.5):.1f} s",
            observed=[p.info() for t, p in tap.seen if t >= sent][:10])


IGNORE_MS = 1000


@case("SRC-LBTRM-002", suite=SUITE, role=Role.SOURCE, transport=LBT_RM,
      title="NAKs repeated within the ignore interval bring no second retransmission",
      section="Configuring for Persistence and Recovery",
      requirement="transport_lbtrm_ignore_interval: a sequence number is retransmitted at most "
                  "once per ignore interval; a NAK for it within the interval is answered with "
                  "NCF 'NAK Ignored' or not at all, and one after the interval is answered again.",
      timeout=15.0)
def source_ignores_repeated_naks(h: CaseContext) -> None:
    tap = _source(h, ignore_interval=IGNORE_MS)
    sqn = tap.data()[-1][1].sqn
    first = tap.nak(sqn)
    h.check(tap.wait(lambda: bool(_rx(tap, sqn, first)), h.scaled(1.5)),
            "the source did not retransmit the NAKed message",
            expected=f"DATA(RX) sqn {sqn}", observed="none")
    answered = _rx(tap, sqn, first)[0]
    for _ in range(4):  # four more NAKs, well inside the interval
        time.sleep(0.05)
        tap.nak(sqn)
    quiet_until = answered + IGNORE_MS / 1000 - 0.1
    time.sleep(max(0.0, quiet_until - time.monotonic()))
    again = [t for t in _rx(tap, sqn, first) if t < quiet_until]
    h.check(len(again) == 1, "the source retransmitted again within its ignore interval",
            expected=f"one DATA(RX) of sqn {sqn} in {IGNORE_MS} ms after the first",
            observed=f"{len(again)} retransmissions")
    ncfs = [p for t, p in tap.of(lbtrm.LbtrmNcf) if isinstance(p, lbtrm.LbtrmNcf)
            and sqn in p.ncfs]
    h.check(all(p.reason == lbtrm.NcfReason.IGNORED for p in ncfs),
            "an NCF for the repeated NAKs gave another reason than 'NAK Ignored'",
            expected="NCF reason NAK Ignored (or none)",
            observed=[lbtrm.ncf_reason_text(p.reason) for p in ncfs])
    time.sleep(max(0.0, answered + IGNORE_MS / 1000 + 0.1 - time.monotonic()))
    later = tap.nak(sqn)
    if not tap.wait(lambda: bool(_rx(tap, sqn, later)), h.scaled(1.0)):
        # a datagram may be lost on a busy machine: NAK once more, as a receiver's backoff
        # would (both NAKs are past the interval)
        tap.nak(sqn)
        tap.wait(lambda: bool(_rx(tap, sqn, later)), h.scaled(1.0))
    h.check(bool(_rx(tap, sqn, later)),
            "the source did not retransmit once its ignore interval was over",
            expected=f"DATA(RX) sqn {sqn} after {IGNORE_MS} ms", observed="none")


SM_MIN_MS = 10


@case("SRC-LBTRM-003", suite=SUITE, role=Role.SOURCE, transport=LBT_RM,
      title="Session messages to the group carry the leading edge of the session",
      section="Configuring for Persistence and Recovery",
      requirement="transport_lbtrm_sm_minimum_interval: when the source has sent no DATA for "
                  "that long it sends a session message (SM) to the group naming its newest "
                  "sequence number, so receivers learn of a lost last message.", timeout=12.0)
def source_sends_session_messages(h: CaseContext) -> None:
    """The reference source sends 50 messages a second: a 10 ms minimum interval leaves room
    for an SM between two messages.  What is judged: SMs come, each names the newest DATA
    sent before it, and they wait the minimum interval: the median time from an SM back to
    the source's datagram before it (DATA or SM) is at least half of ``sm_minimum_interval``
    (half and the median: loopback delivery may delay one datagram more than the SM behind
    it, never most of them).  The doubling up to ``sm_maximum_interval`` is not judged: it
    needs a source idle for longer than this one ever is."""
    tap = _source(h, sm_minimum_interval=SM_MIN_MS, sm_maximum_interval=SM_MIN_MS * 8)
    start = time.monotonic()
    tap.wait(lambda: len([1 for t, _ in tap.of(lbtrm.LbtrmSm) if t > start]) >= 5,
             h.scaled(3.0))
    seen = [(t, p) for t, p in tap.seen if t > start]
    sms = [(t, p) for t, p in seen if isinstance(p, lbtrm.LbtrmSm)]
    h.check(len(sms) >= 5, "the source sent no session messages between its messages",
            expected=f"SMs {SM_MIN_MS} ms after DATA", observed=f"{len(sms)} SMs")
    bad_lead = []
    for t, sm in sms:
        before = [p for u, p in seen if u < t and isinstance(p, lbtrm.LbtrmData) and not p.rx]
        if before and isinstance(sm, lbtrm.LbtrmSm) and sm.lead_sqn != before[-1].sqn:
            bad_lead.append((sm.lead_sqn, before[-1].sqn))
    h.check(not bad_lead, "a session message named another leading edge than the newest DATA",
            expected="lead_sqn = the newest DATA's sqn", observed=bad_lead[:5])
    sent_at = [t for t, p in seen if isinstance(p, lbtrm.LbtrmData | lbtrm.LbtrmSm)]
    after = sorted(t - max(u for u in sent_at if u < t)
                   for t, _ in sms if any(u < t for u in sent_at))
    if after:
        median_ms = after[len(after) // 2] * 1000
        h.check(median_ms >= SM_MIN_MS / 2,
                "session messages come sooner than transport_lbtrm_sm_minimum_interval after "
                "the source's previous datagram",
                expected=f">= {SM_MIN_MS / 2:g} ms after it (median)",
                observed=f"{median_ms:.2f} ms (median of {len(after)})")


# --- a receiver IUT ---------------------------------------------------------------------------

GAP = 3


def _receiver(h: CaseContext, **options: int) -> tuple[LbtrmScriptedSource, float]:
    """Start the receiver IUT (its ``receiver transport_lbtrm_*`` options), wait for it to join
    the harness source's group, send DATA 0-2 and 4 (3 is the gap); returns the source and when
    DATA 4 left."""
    src = LbtrmScriptedSource(h.iut_topic, h.recorder)
    h.closers.append(src.close)
    h.resolver.serve(src)
    before = group_members(src.group[0]) or 0
    h.start_iut(options={f"receiver transport_lbtrm_{k}": v for k, v in options.items()})
    joined = h.wait_until(lambda: (group_members(src.group[0]) or 0) > before, 6.0,
                          "the receiver joining the group")
    h.check(joined, "the receiver did not join the source's LBT-RM group",
            expected=f"a membership of {src.group[0]} on loopback", observed="none")
    for sqn in range(GAP):
        src.data(sqn)
        time.sleep(0.005)
    sent = src.data(GAP + 1, trail=0)
    h.note(f"DATA 0..{GAP - 1} and {GAP + 1} sent; {GAP} is the gap")
    return src, sent


def _keep_alive(src: LbtrmScriptedSource, until: float, every: float = 0.1) -> None:
    """Session messages (lead = the newest sent, GAP + 1) until ``until``."""
    while time.monotonic() < until:
        src.sm(GAP + 1)
        time.sleep(min(every, max(0.0, until - time.monotonic())))


INITIAL_MS = 200
BACKOFF_MS = 200


@case("RCV-LBTRM-001", suite=SUITE, role=Role.RECEIVER, transport=LBT_RM,
      title="A gap is NAKed after the initial backoff interval, not at once",
      section="Configuring for Persistence and Recovery",
      requirement="transport_lbtrm_nak_initial_backoff_interval: a receiver that detects a gap "
                  "waits a random time (0.5 to 1.5 times the interval) before its first NAK, so "
                  "receivers that lost the same datagram do not NAK together.")
def receiver_naks_after_initial_backoff(h: CaseContext) -> None:
    src, sent = _receiver(h, nak_initial_backoff_interval=INITIAL_MS,
                          nak_backoff_interval=BACKOFF_MS)
    src.wait(lambda: bool(src.naks_of(GAP)), h.scaled(2.0))
    naks = src.naks_of(GAP)
    h.check(bool(naks), "the receiver never NAKed the gap",
            expected=f"a NAK for {GAP}", observed=src.naks())
    delay = naks[0] - sent
    h.check(delay >= INITIAL_MS / 1000 / 2 - SLACK,
            "the receiver NAKed the gap sooner than half its initial backoff interval",
            expected=f">= {INITIAL_MS // 2} ms after the gap ({INITIAL_MS} ms x [0.5, 1.5))",
            observed=f"{delay * 1000:.1f} ms")


WINDOW = 1.5


@case("RCV-LBTRM-002", suite=SUITE, role=Role.RECEIVER, transport=LBT_RM,
      title="An unrepaired gap is NAKed at backoff intervals, not in a storm",
      section="Configuring for Persistence and Recovery",
      requirement="transport_lbtrm_nak_backoff_interval: after a NAK the receiver waits a "
                  "random time (0.5 to 1.5 times the interval) before NAKing the same sequence "
                  "number again; a gap the source does not repair brings a bounded number of "
                  "NAKs.", timeout=12.0)
def receiver_backs_off(h: CaseContext) -> None:
    src, sent = _receiver(h, nak_initial_backoff_interval=50, nak_backoff_interval=BACKOFF_MS)
    _keep_alive(src, sent + WINDOW)
    naks = [t for t in src.naks_of(GAP) if t <= sent + WINDOW]
    # first NAK after >= 25 ms, then one per >= 100 ms at the most
    bound = 1 + int((WINDOW - 0.025) / (BACKOFF_MS / 1000 / 2)) + 1
    h.check(bool(naks), "the receiver never NAKed the gap",
            expected=f"NAKs for {GAP}", observed=src.naks())
    gaps = [round((b - a) * 1000, 1) for a, b in itertools.pairwise(naks)]
    h.check(len(naks) <= bound, "the receiver NAKed one gap in a storm",
            expected=f"at most {bound} NAKs for {GAP} in {WINDOW} s "
                     f"(backoff {BACKOFF_MS} ms x [0.5, 1.5))",
            observed=f"{len(naks)} NAKs, {gaps[:10]} ms apart")
    short = [g for g in gaps if g < BACKOFF_MS / 2 - SLACK * 1000]
    h.check(not short, "the receiver NAKed again sooner than half its backoff interval",
            expected=f">= {BACKOFF_MS // 2} ms between NAKs for {GAP}", observed=f"{short} ms")


SUPPRESS_MS = 1000


@case("RCV-LBTRM-003", suite=SUITE, role=Role.RECEIVER, transport=LBT_RM,
      title="An NCF 'NAK Ignored' quiets the receiver's NAKs for that sequence number",
      section="Configuring for Persistence and Recovery",
      requirement="transport_lbtrm_nak_suppress_interval: a receiver that gets an NCF for a "
                  "sequence number it NAKed (the source is busy with it) holds its NAKs for it "
                  "back, up to the suppress interval (at least half of it here), rather than "
                  "NAKing at its backoff interval.", timeout=12.0)
def receiver_suppresses_after_ncf(h: CaseContext) -> None:
    src, _ = _receiver(h, nak_initial_backoff_interval=50, nak_backoff_interval=BACKOFF_MS,
                       nak_suppress_interval=SUPPRESS_MS)
    h.check(src.wait(lambda: bool(src.naks_of(GAP)), h.scaled(2.0)),
            "the receiver never NAKed the gap", expected=f"a NAK for {GAP}", observed="none")
    ncf = src.ncf(lbtrm.NcfReason.IGNORED, GAP)
    h.note(f"NCF 'NAK Ignored' for {GAP}")
    quiet = SUPPRESS_MS / 1000 / 2 - 2 * SLACK
    _keep_alive(src, ncf + quiet)
    after = [round((t - ncf) * 1000, 1) for t in src.naks_of(GAP) if ncf + SLACK < t < ncf + quiet]
    h.check(not after, "the receiver kept NAKing after the NCF",
            expected=f"no NAK for {GAP} within {quiet * 1000:.0f} ms of the NCF "
                     f"(suppress interval {SUPPRESS_MS} ms)",
            observed=f"NAKs {after} ms after the NCF")


GENERATION_MS = 800


@case("RCV-LBTRM-004", suite=SUITE, role=Role.RECEIVER, transport=LBT_RM,
      title="A receiver stops NAKing a sequence number after the NAK generation interval",
      section="Configuring for Persistence and Recovery",
      requirement="transport_lbtrm_nak_generation_interval: a sequence number still missing "
                  "that long after the gap was found is given up (unrecoverable on the "
                  "transport; the stores or OTR may still recover it): no more NAKs for it.",
      timeout=12.0)
def receiver_gives_up_after_generation_interval(h: CaseContext) -> None:
    src, sent = _receiver(h, nak_initial_backoff_interval=50, nak_backoff_interval=BACKOFF_MS,
                          nak_generation_interval=GENERATION_MS)
    # the backoff randomization may set the last NAK up to 1.5 backoffs past the interval's
    # start of that NAK: nothing after generation interval + 1.5 backoffs + slack
    limit = GENERATION_MS / 1000 + 1.5 * BACKOFF_MS / 1000 + 0.05
    _keep_alive(src, sent + limit + 1.0)
    naks = src.naks_of(GAP)
    h.check(bool(naks), "the receiver never NAKed the gap",
            expected=f"NAKs for {GAP}", observed=src.naks())
    late = [round((t - sent) * 1000) for t in naks if t > sent + limit]
    h.check(not late, "the receiver kept NAKing past its NAK generation interval",
            expected=f"no NAK for {GAP} later than {limit * 1000:.0f} ms after the gap "
                     f"(generation interval {GENERATION_MS} ms)",
            observed=f"NAKs {late[:10]} ms after the gap")



@case("RCV-LBTRM-005", suite=SUITE, role=Role.RECEIVER, transport=LBT_RM,
      title="An NCF 'Do not retry' ends the receiver's NAKs for that sequence number",
      section="Configuring for Persistence and Recovery",
      requirement="An NCF with reason 'Do not retry' says the source can no longer retransmit "
                  "the sequence number (it left the transmission window): the receiver gives "
                  "it up at once (the stores or OTR may still recover it) and NAKs it no more.",
      timeout=12.0)
def receiver_gives_up_at_do_not_retry(h: CaseContext) -> None:
    src, _ = _receiver(h, nak_initial_backoff_interval=50, nak_backoff_interval=BACKOFF_MS,
                       nak_suppress_interval=400)
    h.check(src.wait(lambda: bool(src.naks_of(GAP)), h.scaled(2.0)),
            "the receiver never NAKed the gap", expected=f"a NAK for {GAP}", observed="none")
    ncf = src.ncf(lbtrm.NcfReason.NO_RETRY, GAP)
    h.note(f"NCF 'Do not retry' for {GAP}")
    _keep_alive(src, ncf + 1.2)
    after = [round((t - ncf) * 1000, 1) for t in src.naks_of(GAP) if t > ncf + SLACK]
    h.check(not after, "the receiver NAKed a sequence number the source said not to retry",
            expected=f"no NAK for {GAP} after the NCF", observed=f"NAKs {after} ms after it")
