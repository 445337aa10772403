"""Passive judges of LBT-RU and LBT-RM reliability: NAKs and NCFs (docs/wire-transports.md
§1.3-1.5, §2.3-2.6; the reference's sessions: reference_impl/lbtru_session.py,
reference_impl/lbtrm_session.py).

Sessions are keyed as :class:`~conformance.passive.observe.Tpkt` says.  Choices where the
guide is silent on what traffic shows:

* a receiver learns that a sequence number exists only from the source's DATA (original or
  retransmitted) or from an SM's leading edge; so a NAK may name only numbers up to the
  leading edge the session showed before it.  A NAK on a session whose source traffic the
  capture does not hold before it decides nothing;
* an NCF answers a NAK: every number it lists was NAKed on that session before.  Unless the
  capture holds the session from its start (its first packet an SM, or DATA with sequence
  number 0), NCFs within :data:`NCF_GRACE` of its first captured packet decide nothing (the
  NAK they answer may precede the capture).  A capture that lost packets (a kernel drop at
  the capture point) can make a NAK look early: read such a verdict with the capture tool's
  drop count.
"""

from __future__ import annotations

from conformance.model import Role, passive_for
from conformance.passive.cases import passive_case
from conformance.passive.judgement import Judgement, failed, needs, passed
from conformance.passive.observe import Observed, Tpkt, show

NCF_GRACE = 1.0
"""Seconds after a session's first captured packet in which an NCF is not judged."""

needs("PSV-RCV-002", "no LBT-RU or LBT-RM NAK after its session's source traffic")
needs("PSV-SRC-001", "no LBT-RU or LBT-RM NCF")


def session_name(role: str, t: Tpkt) -> str:
    proto = "LBT-RM" if t.session[0] == "lbtrm" else "LBT-RU"
    if t.session[0] == "lbtrm":
        where = f"{t.session[1]}:{t.session[2]}"
    else:
        where = str(t.session[1] if role == "source" else t.session[2])
    sid = t.session[3]
    sid_text = f" session {sid:#x}" if isinstance(sid, int) and sid else ""
    if role == "receiver" and t.session[0] == "lbtrm":
        return f"{proto} receiver {show(t.sender)} of {where}{sid_text}"
    return f"{proto} {role} {where}{sid_text}"


@passive_case("PSV-RCV-002", role=Role.RECEIVER,
              title="A NAK names only sequence numbers the source has sent",
              section="Transport LBT-RM Reliability Options",
              requirement="Receivers NAK the sequence numbers they miss (a gap in what the "
                          "source sent): a number beyond the source's leading edge is not "
                          "missing yet.")
def naks_within_leading_edge(obs: Observed) -> list[Judgement]:
    lead: dict[tuple[object, ...], tuple[int, int]] = {}
    bad: dict[str, Judgement] = {}
    good: dict[str, list[int]] = {}
    for t in obs.transport:
        if t.kind in ("data", "rx", "sm"):
            top = lead.get(t.session)
            if top is None or t.lead > top[0]:
                lead[t.session] = (t.lead, t.frame)
            continue
        if t.kind != "nak" or t.session not in lead:
            continue
        who = session_name("receiver", t)
        edge, at = lead[t.session]
        beyond = [s for s in t.sqns if s > edge]
        if beyond and who not in bad:
            bad[who] = failed(who, f"NAK (frame {t.frame}) for {beyond[0]}, past the leading "
                                   f"edge {edge} (frame {at})", [at, t.frame],
                              expected=f"<= {edge}", observed=beyond[0])
        good.setdefault(who, []).append(t.frame)
    return [bad.get(who) or passed(who, f"{len(frames)} NAK(s), each within the leading edge",
                                   frames)
            for who, frames in good.items()]


@passive_case("PSV-SRC-001", role=Role.SOURCE,
              title="An NCF answers a NAK: it lists only NAKed sequence numbers",
              section="Transport LBT-RM Reliability Options",
              requirement="A source that will not retransmit a NAKed sequence number says so "
                          "with an NCF (NAK confirmation) for that number.")
def ncfs_answer_naks(obs: Observed) -> list[Judgement]:
    first: dict[tuple[object, ...], Tpkt] = {}
    naked: dict[tuple[object, ...], set[int]] = {}
    bad: dict[str, Judgement] = {}
    good: dict[str, list[int]] = {}
    for t in obs.transport:
        start = first.setdefault(t.session, t)
        if t.kind == "nak":
            naked.setdefault(t.session, set()).update(t.sqns)
        from_start = start.kind == "sm" or (start.kind == "data" and start.sqns == [0])
        if t.kind != "ncf" or (not from_start and t.time - start.time < NCF_GRACE):
            continue
        who = session_name("source", t)
        unasked = [s for s in t.sqns if s not in naked.get(t.session, set())]
        if unasked and who not in bad:
            bad[who] = failed(who, f"NCF (frame {t.frame}) for {unasked[0]}, never NAKed",
                              [t.frame], expected="a NAKed number", observed=unasked[0])
        good.setdefault(who, []).append(t.frame)
    return [bad.get(who) or passed(who, f"{len(frames)} NCF(s), each for a NAKed number",
                                   frames)
            for who, frames in good.items()]


ANSWER_WAIT = 1.0
"""Seconds within which a NAK is answered: a source answers at once (the active case
SRC-LBTRM-001 waits 1.5 s; a capture of it ends soon after, and the source must be heard
after this time for a silence to count)."""

QUIET = 5.0
"""Seconds without a NAK, retransmission or NCF of a sequence number before a NAK of it must be
answered: a repeat within the source's ignore interval may go unanswered (SRC-LBTRM-002)."""

needs("SRC-LBTRM-001", "no LBT-RM NAK for a number the source sent, with its source still "
                       "heard after the answer time")


@passive_for("SRC-LBTRM-001")
def naks_answered(obs: Observed) -> list[Judgement]:
    """Every LBT-RM NAK for a number the session's source had sent (not NAKed, resent or
    NCFed in the :data:`QUIET` seconds before) gets a retransmission or an NCF of that number
    within :data:`ANSWER_WAIT` seconds, when the source is still heard on that session after
    that time (a NAK to a source that restarted, or one the capture lost, decides nothing)."""
    lead: dict[tuple[object, ...], int] = {}
    touched: dict[tuple[tuple[object, ...], int], float] = {}
    asked: list[tuple[Tpkt, int]] = []
    answers: dict[tuple[tuple[object, ...], int], list[Tpkt]] = {}
    last_source: dict[tuple[object, ...], float] = {}
    for t in obs.transport:
        if t.session[0] != "lbtrm":
            continue
        if t.kind in ("data", "rx", "sm"):
            lead[t.session] = max(lead.get(t.session, t.lead), t.lead)
            last_source[t.session] = t.time
        for s in t.sqns:
            key = (t.session, s)
            if t.kind == "nak" and t.session in lead and s <= lead[t.session] and \
                    t.time - touched.get(key, -QUIET - 1) > QUIET:
                asked.append((t, s))
            if t.kind in ("rx", "ncf"):
                answers.setdefault(key, []).append(t)
            if t.kind in ("nak", "rx", "ncf"):
                touched[key] = t.time
    bad: dict[str, Judgement] = {}
    good: dict[str, list[int]] = {}
    for nak, s in asked:
        who = session_name("source", nak)
        answer = next((a for a in answers.get((nak.session, s), [])
                       if nak.time <= a.time <= nak.time + ANSWER_WAIT), None)
        if answer is not None:
            good.setdefault(who, []).extend([nak.frame, answer.frame])
        elif last_source.get(nak.session, 0.0) > nak.time + ANSWER_WAIT and who not in bad:
            bad[who] = failed(who, f"NAK (frame {nak.frame}) for {s} answered neither by a "
                                   f"retransmission nor by an NCF within {ANSWER_WAIT} s",
                              [nak.frame], expected="DATA(RX) or NCF", observed="none")
    return [bad.get(who) or passed(who, f"{len(good[who]) // 2} NAK(s) answered by a "
                                        "retransmission or an NCF", good[who])
            for who in sorted({*bad, *good})]
