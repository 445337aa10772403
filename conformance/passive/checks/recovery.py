"""Passive judges of receiver recovery: retransmission requests (docs/semantics.md §1.9 step 4).

A receiver's requests are the RXREQs on its registration connections; a request is answered
by a retransmission of that sequence number from the store to the receiver on the same
connection.  Choices where the guide is silent on what traffic shows:

* *outstanding* at a request: the distinct sequence numbers this receiver asked for and has
  not yet been sent (re-requests of one number count once), dropping requests older than
  ``retransmit_request_message_timeout`` (given up);
* the limits are configured values: with the receivers' UM configuration
  (``--receiver-config``) they are judged; without it the observed maximum outstanding / the
  shortest re-request gap is reported as informational;
* consumption ACKs (RCV-REC-005) are expected from a receiver registration once the store
  retransmitted messages to it (what the capture shows it got: live data on a transport may
  have gone to another listener) and the capture goes on for :data:`ACK_GRACE` seconds more;
  an explicit-ACK-only receiver acknowledges only what its application acknowledges, so a
  receiver without any ACK fails only with its configuration given (``--receiver-config``,
  ``ume_explicit_ack_only`` 0), and is informational otherwise (also when only its source's
  data, not a retransmission to it, was captured).  An ACK naming a RegID other
  than the one the store assigned fails in any case;
* a re-request sooner than 75 % of ``retransmit_request_interval`` fails (the margin the active
  case RCV-REC-003 allows for timer granularity).
"""

from __future__ import annotations

from conformance.model import passive_for
from conformance.passive.judgement import (
    Judgement,
    failed,
    informational,
    needs,
    passed,
    unsupported,
)
from conformance.passive.observe import Addr, Data, Observed, Rxreq, show

MARGIN = 0.75
"""Fraction of retransmit_request_interval a re-request may come early (RCV-REC-003)."""

ACK_GRACE = 1.0
"""Seconds of capture after a source's data within which a receiver's ACK is expected (ten
times the default ume_ack_batching_interval, docs/semantics.md §1.5)."""

DEFAULT_MESSAGE_TIMEOUT = 10.0
"""retransmit_request_message_timeout's default, seconds (docs/semantics.md §1.9 step 4)."""


needs("RCV-REC-002", "no retransmission request was captured")
needs("RCV-REC-005", "no granted receiver registration followed by its source's data")
needs("RCV-REC-003", "no retransmission request was repeated")


def _receivers(obs: Observed) -> dict[str, list[tuple[Addr, Addr]]]:
    """Receiver name -> its registration connections (client, store)."""
    out: dict[str, list[tuple[Addr, Addr]]] = {}
    for client in obs.clients("receiver"):
        out[client.name] = [r.conn for r in client.registrations]
    return out


def _traffic(obs: Observed, conns: list[tuple[Addr, Addr]]
             ) -> list[Rxreq | Data]:
    """The receiver's RXREQs and the retransmissions it got, in capture order."""
    ends = set(conns)
    back = {(store, client) for client, store in conns}
    reqs: list[Rxreq | Data] = [r for r in obs.rxreqs if (r.src, r.dst) in ends]
    rx: list[Rxreq | Data] = [d for d in obs.data if d.kind == "retrans" and (d.src, d.dst)
                              in back]
    return sorted(reqs + rx, key=lambda x: x.frame)


@passive_for("RCV-REC-002")
def outstanding_maximum(obs: Observed) -> list[Judgement]:
    opts = obs.receiver_options
    timeout = (opts.retransmit_request_message_timeout / 1000 if opts is not None
               else DEFAULT_MESSAGE_TIMEOUT)
    out = []
    for name, conns in _receivers(obs).items():
        items = _traffic(obs, conns)
        if not any(isinstance(x, Rxreq) for x in items):
            continue
        open_: dict[int, float] = {}
        worst, at = 0, 0
        for x in items:
            if isinstance(x, Data):
                open_.pop(x.sqn, None)
                continue
            open_ = {s: t for s, t in open_.items() if x.time - t < timeout}
            open_.setdefault(x.sqn, x.time)
            if len(open_) > worst:
                worst, at = len(open_), x.frame
        requests = sum(isinstance(x, Rxreq) for x in items)
        if opts is None:
            out.append(informational(name, f"{requests} RXREQ(s), at most {worst} "
                                           "outstanding (no --receiver-config given; the "
                                           "default maximum is 10)", [at], observed=worst))
        elif worst > opts.retransmit_request_outstanding_maximum:
            out.append(failed(name, f"{worst} RXREQs outstanding", [at],
                              expected=f"<= {opts.retransmit_request_outstanding_maximum}",
                              observed=worst))
        else:
            out.append(passed(name, f"{requests} RXREQ(s), at most {worst} outstanding "
                                    f"(maximum {opts.retransmit_request_outstanding_maximum})",
                              [at]))
    return out


@passive_for("RCV-REC-003")
def rerequest_interval(obs: Observed) -> list[Judgement]:
    opts = obs.receiver_options
    out = []
    for name, conns in _receivers(obs).items():
        last: dict[int, Rxreq] = {}
        gaps: list[tuple[float, Rxreq, Rxreq]] = []
        for x in _traffic(obs, conns):
            if isinstance(x, Data):
                last.pop(x.sqn, None)
                continue
            before = last.get(x.sqn)
            if before is not None:
                gaps.append((x.time - before.time, before, x))
            last[x.sqn] = x
        if not gaps:
            continue
        gap, a, b = min(gaps, key=lambda g: g[0])
        frames = [a.frame, b.frame]
        shown = f"{gap * 1000:.0f} ms"
        if opts is None:
            out.append(informational(name, f"{len(gaps)} re-request(s), the soonest {shown} "
                                           "after the previous (no --receiver-config given)",
                                     frames, observed=shown))
            continue
        interval = opts.retransmit_request_interval / 1000
        if gap < MARGIN * interval:
            out.append(failed(name, f"sqn {b.sqn} asked again {shown} after the previous "
                                    "request", frames,
                              expected=f">= {interval * 1000:.0f} ms", observed=shown))
        else:
            out.append(passed(name, f"{len(gaps)} re-request(s), none sooner than "
                                    f"{interval * 1000:.0f} ms", frames))
    return out


@passive_for("RCV-REC-005")
def consumption_acked_with_assigned_regid(obs: Observed) -> list[Judgement]:
    opts = obs.receiver_options
    end = max((d.time for d in obs.data), default=0.0)
    assigned: dict[tuple[Addr, Addr], set[int]] = {}
    for reg in obs.registrations:
        if not reg.source and reg.granted and reg.response is not None:
            assigned.setdefault(reg.conn, set()).add(reg.response.reg_id)
    out = []
    for client in obs.clients("receiver"):
        for reg in client.registrations:
            resp = reg.response
            if not reg.granted or resp is None:
                continue
            transports = obs.transports(reg.store, reg.src_reg_id)
            # only whether the source sent anything to it, and the first such message
            sent = [d for d in [next((d for d in obs.after(obs.data_from(*transports),
                                                           resp.frame)
                                      if d.kind == "data" and d.time < end - ACK_GRACE), None)]
                    if d is not None]
            # what the capture shows this receiver got: the store's retransmissions to it
            # (live data on a transport may have gone to another listener)
            got = [d for d in obs.data_from(reg.store)
                   if d.kind == "retrans" and (d.src, d.dst) == (
                reg.store, reg.conn[0]) and d.frame > resp.frame and d.time < end - ACK_GRACE]
            on_conn = [a for a in obs.acks_between(*reg.conn) if a.kind == "consumption"
                       and a.frame > resp.frame]
            acks = [a for a in on_conn if {a.rcv_reg_id, a.id_2} - {0} == {resp.reg_id}]
            if not sent and not got and not acks:
                continue
            where = f"{client.name} at store {show(reg.store)}"
            # one connection carries the registrations of every topic the receiver has there
            wrong = [a for a in on_conn if not {a.rcv_reg_id, a.id_2} - {0} <= assigned.get(
                reg.conn, set())]
            if wrong:
                a = wrong[0]
                out.append(failed(where, f"an ACK (frame {a.frame}) names RegID "
                                         f"{a.rcv_reg_id or a.id_2}, which the store did not "
                                         "assign on that connection", [*reg.frames, a.frame],
                                  expected=resp.reg_id, observed=a.rcv_reg_id or a.id_2))
            elif acks:
                out.append(passed(where, f"{len(acks)} consumption ACK(s) with RegID "
                                         f"{resp.reg_id}", [*reg.frames, acks[0].frame]))
            elif got and opts is not None and not opts.ume_explicit_ack_only:
                out.append(failed(where, f"no consumption ACK after the store's "
                                         f"retransmissions to it (frame {got[0].frame} on)",
                                  [*reg.frames, got[0].frame], expected="consumption ACKs",
                                  observed="none"))
            elif opts is None or not got:
                why = ("no --receiver-config given: an explicit-ACK-only receiver may have had "
                       "nothing to acknowledge" if opts is None else
                       "the capture shows no message delivered to it, only its source's data")
                out.append(informational(where, f"no consumption ACK ({why})",
                                         [*reg.frames, (got or sent)[0].frame]))
            else:
                out.append(unsupported(where, "an explicit-ACK-only receiver: what it "
                                              "acknowledges is its application's choice"))
    return out


RATE_SLACK = 1.25
"""The rate check's allowance: 25 % over the configured rate plus :data:`RATE_BURST`
messages in any one second (the active case REC-STORE-005's margin for one burst)."""

RATE_BURST = 5

needs("REC-STORE-005", "no retransmission from a store was captured")


def busiest_second(times: list[float]) -> tuple[int, int, int]:
    """(most messages within any one second, index of its first, index of its last) of the
    sorted ``times``."""
    best, first, last = 0, 0, 0
    lo = 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        if hi - lo + 1 > best:
            best, first, last = hi - lo + 1, lo, hi
    return best, first, last


@passive_for("REC-STORE-005")
def retransmission_rate(obs: Observed) -> list[Judgement]:
    """A store's retransmissions (to every receiver) within any one second stay within its
    ``retransmission-request-processing-rate`` from ``--store-config``; informational with the
    busiest second without it."""
    by_store: dict[Addr, list[Data]] = {}
    for d in obs.data:
        if d.kind == "retrans":
            by_store.setdefault(d.src, []).append(d)
    out = []
    for store, sent in sorted(by_store.items()):
        count, i, j = busiest_second([d.time for d in sent])
        frames = [sent[i].frame, sent[j].frame]
        name = f"store {show(store)}"
        sc = obs.store_config_of(store)
        what = (f"{len(sent)} retransmission(s), at most {count} within one second (frames "
                f"{frames[0]}-{frames[1]})")
        if sc is None:
            why = ("no --store-config given" if obs.store_config is None
                   else "--store-config has no store on that port")
            out.append(informational(name, f"{what} ({why})", frames, observed=count))
            continue
        rate = sc.retransmission_request_processing_rate
        most = int(rate * RATE_SLACK) + RATE_BURST
        if count > most:
            out.append(failed(name, what, frames, expected=f"<= {most} (rate {rate}/s)",
                              observed=count))
        else:
            out.append(passed(name, f"{what}, within the rate {rate}/s", frames))
    return out


RX_ANSWER = 1.0
"""Seconds after a retransmission request within which a retransmission of its sequence
number to the requester is taken for its answer."""

needs("QRM-STORE-004", "no retransmission request naming a source's RegID at that store")


@passive_for("QRM-STORE-004")
def no_retransmission_for_a_source_regid(obs: Observed) -> list[Judgement]:
    """An RXREQ naming the RegID the store granted a source is no receiver's (one RegID
    names one client at a store), so no retransmission may answer it: a retransmission of that
    sequence number to the requester within :data:`RX_ANSWER` seconds, with no request from a
    RegID granted to a receiver for it in between, fails.  A RegID the capture does not show
    granted decides nothing: the receiver may have registered before the capture began."""
    sources: dict[Addr, set[int]] = {}
    receivers: dict[Addr, set[int]] = {}
    for reg in obs.registrations:
        if reg.granted and reg.response is not None and not reg.deregister:
            (sources if reg.source else receivers).setdefault(reg.store, set()).add(
                reg.response.reg_id)
    out = []
    judged: dict[str, list[int]] = {}
    bad: dict[str, Judgement] = {}
    for req in obs.rxreqs:
        store = req.dst
        if req.reg_id not in sources.get(store, set()) or \
                req.reg_id in receivers.get(store, set()):
            continue
        name = f"store {show(store)}"
        answer = next((d for d in obs.data_from(store) if d.kind == "retrans" and d.sqn == req.sqn
                       and (d.src, d.dst) == (store, req.src) and d.frame > req.frame
                       and d.time - req.time <= RX_ANSWER), None)
        legit = answer is not None and any(
            r.sqn == req.sqn and (r.src, r.dst) == (req.src, store)
            and r.reg_id in receivers.get(store, set()) and req.frame < r.frame < answer.frame
            for r in obs.rxreqs)
        if answer is not None and not legit and name not in bad:
            bad[name] = failed(name, f"retransmitted sqn {req.sqn} (frame {answer.frame}) for a "
                                     f"request naming source RegID {req.reg_id} (frame "
                                     f"{req.frame})", [req.frame, answer.frame],
                               expected="no retransmission", observed=f"sqn {req.sqn}")
        judged.setdefault(name, []).append(req.frame)
    for name, frames in sorted(judged.items()):
        out.append(bad.get(name) or passed(name, f"{len(frames)} request(s) naming a source's "
                                                 "RegID, none answered", frames))
    return out


needs("OTR-STORE-001", "no retransmission from a store to a receiver whose registration was "
                       "captured")


@passive_for("OTR-STORE-001")
def retransmissions_answer_requests(obs: Observed) -> list[Judgement]:
    """A store retransmits to a receiver only what it asked for (docs/semantics.md §1.9: a
    request the store cannot serve gets no answer): every retransmission on the connection of
    a receiver registration the capture holds follows a retransmission request of that
    receiver for that very sequence number.  A store that answers a request for a number it
    does not hold with another message (its newest, as if the number were clamped) fails.
    *Choice*: only connections whose registration was captured are judged, so every request
    on them was captured too (a capture that starts mid-stream decides nothing)."""
    asked: dict[tuple[Addr, Addr, int], int] = {}
    for req in obs.rxreqs:
        asked.setdefault((req.src, req.dst, req.sqn), req.frame)
    conns: dict[tuple[Addr, Addr], int] = {}
    for reg in obs.registrations:
        if not reg.source and reg.granted and reg.response is not None and not reg.deregister:
            frame = conns.get(reg.conn)
            conns[reg.conn] = reg.response.frame if frame is None else min(
                frame, reg.response.frame)
    judged: dict[str, list[int]] = {}
    bad: dict[str, Judgement] = {}
    for store in sorted({store for _client, store in conns}):
        name = f"store {show(store)}"
        for d in obs.data_from(store):
            registered = conns.get((d.dst, d.src))
            if d.kind != "retrans" or registered is None or d.frame < registered:
                continue
            first = asked.get((d.dst, d.src, d.sqn))
            if (first is None or first > d.frame) and name not in bad:
                bad[name] = failed(name, f"retransmitted sqn {d.sqn} (frame {d.frame}) to "
                                         f"{show(d.dst)}, which had not asked for it",
                                   [registered, d.frame], expected="only requested numbers",
                                   observed=f"sqn {d.sqn}")
            judged.setdefault(name, []).append(d.frame)
    out = []
    for name, frames in sorted(judged.items()):
        out.append(bad.get(name) or passed(
            name, f"{len(frames)} retransmission(s), each answering a request for its number",
            [frames[0], frames[-1]]))
    return out
