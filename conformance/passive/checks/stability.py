"""Passive judges of normal operation: stability and consumption ACKs, flight size,
proactive retransmission (docs/semantics.md §1.5, §1.7, §1.8).

A source's *incarnation* is one granted registration and what follows it until the client's
next PREG: the data on the transports whose SRI names its RegID at that store (same topic
index), and the stability ACKs on that registration's connection.  Choices where the guide is
silent on what traffic shows:

* a stability ACK is judged only on a registration the capture holds, so a capture that
  starts mid-stream does not make the store look as if it acknowledged unsent messages;
* flight size and the stability timeout are configured values: with the source's UM
  configuration (``--source-config``) they are judged (flight size only for a source of one
  store, where "stable" is one ACK); without it the observed maximum / minimum is reported as
  informational;
* the stability-timeout check allows 50 ms of timer slack below the configured timeout, and
  does not time a first resend from a send in the first second of its flow (:data:`BURST`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from conformance.model import Role, passive_for
from conformance.passive.cases import passive_case
from conformance.passive.judgement import (
    Judgement,
    failed,
    informational,
    needs,
    passed,
    unsupported,
)
from conformance.passive.observe import Ack, Addr, Client, Data, Observed, Registration, show

SLACK = 0.05
"""Seconds of timer slack allowed below a configured interval."""

BURST = 1.0
"""Seconds from a flow's first data message (source to one destination) in which the wire's
send time is not the application's: what a source held back goes out at once then."""


needs("PSV-STORE-002", "no stability ACK on a captured source registration")
needs("PSV-RCV-001", "no consumption ACK was captured")
needs("SRC-REC-002", "no data of a registered source on an identified transport")
needs("SRC-PRX-001", "no proactive retransmission was captured")


@dataclass
class Incarnation:
    """One granted source registration and its traffic (module docstring)."""

    client: Client
    reg: Registration
    transports: set[Addr]
    data: list[Data]
    acks: list[Ack]
    stores: int


def sent_by(d: Data, reg: Registration, transports: set[Addr]) -> bool:
    """Whether ``d`` is the source's send: on its transport (data or a proactive
    retransmission), or a proactive retransmission on its connection to the store (what a
    source resends to the one store that has not acknowledged, docs/semantics.md §1.8)."""
    if d.kind not in ("data", "prorx") or d.tidx != reg.topic_idx:
        return False
    return d.src in transports or (d.src, d.dst) == reg.conn


def sent_by_source(obs: Observed, reg: Registration, transports: set[Addr]) -> list[Data]:
    """Every data message :func:`sent_by` the source of ``reg`` (the same for all its
    registrations of one topic on one connection: remembered per observation)."""
    key = (frozenset(transports), reg.conn, reg.topic_idx)
    cache: dict[Any, list[Data]] = obs.memo("sent_by_source", lambda _obs: {})
    found = cache.get(key)
    if found is None:
        # the transports' part is shared by the source's registrations on every connection
        # (a re-registration comes on a new one): made once, then merged with the
        # connection's resends in capture order
        ids = obs.memo("data_ids", lambda o: {id(d): i for i, d in enumerate(o.data)})
        on_transports = cache.get((key[0], None, reg.topic_idx))
        if on_transports is None:
            on_transports = cache[(key[0], None, reg.topic_idx)] = [
                d for d in obs.data_from(*transports) if sent_by(d, reg, transports)]
        on_conn = [] if reg.conn[0] in transports else [
            d for d in obs.data_from(reg.conn[0]) if sent_by(d, reg, transports)]
        found = on_transports if not on_conn else sorted(
            [*on_transports, *on_conn], key=lambda d: ids[id(d)])
        cache[key] = found
    return found


def incarnations(obs: Observed) -> list[Incarnation]:
    """Every granted source registration with its traffic, computed once per observation
    (six judges read them)."""
    result: list[Incarnation] = obs.memo("incarnations", _incarnations)
    return result


def _incarnations(obs: Observed) -> list[Incarnation]:
    out = []
    for client in obs.clients("source"):
        regs = client.registrations
        stores = len({r.store for r in regs})
        for i, reg in enumerate(regs):
            if not reg.granted or reg.response is None:
                continue
            end = next((r.frame for r in regs[i + 1:] if r.store == reg.store), None)
            transports = obs.source_transports(reg)
            data = obs.after(sent_by_source(obs, reg, transports), reg.response.frame, end)
            acks = [a for a in obs.stability_acks(reg) if end is None or a.frame < end]
            out.append(Incarnation(client, reg, transports, data, acks, stores))
    return out


@passive_case("PSV-STORE-002", role=Role.STORE,
              title="A stability ACK names a message the source sent, after it was sent",
              section="Message Stability",
              requirement="The store keeps the message and sends the source a stability ACK: "
                          "it acknowledges messages it received from the source.")
def stability_acks_follow_data(obs: Observed) -> list[Judgement]:
    """Every stability ACK (not a NACK) on a captured registration follows a data message of
    that sequence number on the source's transport."""
    out = []
    by_store: dict[str, list[Incarnation]] = {}
    for inc in incarnations(obs):
        by_store.setdefault(f"store {show(inc.reg.store)}", []).append(inc)
    for store, incs in by_store.items():
        judged = [i for i in incs if i.transports]
        if not judged:
            out.append(unsupported(store, "no source transport identified (no SRI naming the "
                                          "RegIDs it granted was captured)"))
            continue
        bad = None
        count = 0
        firsts: dict[int, dict[int, int]] = {}
        for inc in judged:
            every = sent_by_source(obs, inc.reg, inc.transports)
            sent = firsts.get(id(every))
            if sent is None:  # the same for every registration of a source at a store
                sent = firsts[id(every)] = {}
                for d in every:
                    sent.setdefault(d.sqn, d.frame)
            # a store's own OTR request is answered from the source's request port with
            # retransmissions (docs/wire-lbmc.md §5): the store then holds those too
            for d in obs.data_from(inc.reg.resp_addr):
                if d.kind == "retrans" and d.dst[0] == inc.reg.store[0] and \
                        d.tidx == inc.reg.topic_idx and d.frame < sent.get(d.sqn, d.frame + 1):
                    sent = {**sent, d.sqn: d.frame}
            for ack in inc.acks:
                if ack.nak:
                    continue
                count += 1
                first = sent.get(ack.sqn)
                if first is None or first > ack.frame:
                    bad = (inc, ack)
                    break
            if bad:
                break
        if bad:
            inc, ack = bad
            out.append(failed(store, f"stability ACK for sqn {ack.sqn} (frame {ack.frame}) "
                                     "before the source sent it", [*inc.reg.frames, ack.frame],
                              expected="an ACK after the data", observed=f"ACK {ack.sqn}"))
        elif count:
            out.append(passed(store, f"{count} stability ACK(s), each after its message",
                              [i.reg.frame for i in judged]))
    return out


@passive_case("PSV-RCV-001", role=Role.RECEIVER,
              title="Batched and explicit consumption ACKs never go back",
              section="Message Consumption",
              requirement="An ACK of sequence number N is cumulative: it covers everything up "
                          "to N. With ACK batching the receiver acknowledges the contiguous "
                          "consumed prefix; explicit ACKs acknowledge all earlier messages, so "
                          "they go in ascending order.")
def consumption_acks_ascend(obs: Observed) -> list[Judgement]:
    """Per receiver connection to a store (one registration), the ACKed sequence numbers
    never decrease (repeating the latest, as a keepalive does, is allowed).  A receiver with
    neither batching nor explicit ACKs acknowledges at once in receive order, where a
    recovered message is acknowledged after later live ones (docs/semantics.md §1.5), so
    without the receivers' configuration a step back is informational."""
    opts = obs.receiver_options
    ordered = opts is not None and (opts.ume_use_ack_batching or opts.ume_explicit_ack_only)
    names: dict[tuple[Addr, Addr], str] = {}
    for client in obs.clients("receiver"):
        for reg in client.registrations:
            names[reg.conn] = client.name
    streams: dict[tuple[Addr, Addr, int], list[Ack]] = {}
    for ack in obs.acks:
        if ack.kind == "consumption":
            streams.setdefault((ack.src, ack.dst, ack.rcv_reg_id), []).append(ack)
    back: dict[str, tuple[Ack, Ack, Addr]] = {}
    every: dict[str, list[Ack]] = {}
    for (src, dst, _reg_id), acks in streams.items():
        who = names.get((src, dst), f"receiver {show(src)}")
        step = next(((a, b) for a, b in itertools.pairwise(acks) if b.sqn < a.sqn), None)
        if step and who not in back:
            back[who] = (*step, dst)
        every.setdefault(who, []).extend(acks)
    out = []
    for who, acks in every.items():
        if who not in back:
            out.append(passed(who, f"{len(acks)} consumption ACK(s), never going back",
                              [acks[0].frame, acks[-1].frame]))
            continue
        a, b, dst = back[who]
        what = f"ACK {b.sqn} (frame {b.frame}) after ACK {a.sqn} (frame {a.frame}) to {show(dst)}"
        if ordered:
            out.append(failed(who, what, [a.frame, b.frame], expected=f">= {a.sqn}",
                              observed=b.sqn))
        else:
            why = ("no --receiver-config given" if opts is None
                   else "neither ACK batching nor explicit ACKs: receive order")
            out.append(informational(who, f"{what} ({why})", [a.frame, b.frame],
                                     observed=b.sqn))
    return out


@passive_for("SRC-REC-002")
def flight_size_kept(obs: Observed) -> list[Judgement]:
    """At most ``ume_flight_size`` messages unstable (sent, not yet acknowledged) when the
    source blocks; informational with the observed maximum without its configuration."""
    opts = obs.source_options
    out = []
    for inc in incarnations(obs):
        if not inc.transports or not inc.data:
            continue
        stable: set[int] = set()
        sent: set[int] = set()
        flying = 0  # len(sent - stable), kept as the sets grow
        acks = iter(inc.acks)
        pending = next(acks, None)
        worst, worst_frame = 0, inc.data[0].frame
        for d in inc.data:
            while pending is not None and pending.frame < d.frame:
                if not pending.nak and pending.sqn not in stable:
                    stable.add(pending.sqn)
                    flying -= pending.sqn in sent
                pending = next(acks, None)
            if d.sqn not in sent:
                sent.add(d.sqn)
                flying += d.sqn not in stable
            if flying > worst:
                worst, worst_frame = flying, d.frame
        frames = [*inc.reg.frames, worst_frame]
        name = inc.client.name
        if opts is None or inc.stores != 1:
            why = ("no --source-config given" if opts is None
                   else "a source of several stores: stability needs the group rules")
            out.append(informational(name, f"at most {worst} message(s) in flight ({why})",
                                     frames, observed=worst))
        elif opts.ume_flight_size_behavior == "block" and worst > opts.ume_flight_size:
            out.append(failed(name, f"{worst} messages in flight, ume_flight_size "
                                    f"{opts.ume_flight_size}", frames,
                              expected=f"<= {opts.ume_flight_size}", observed=worst))
        else:
            out.append(passed(name, f"at most {worst} message(s) in flight (ume_flight_size "
                                    f"{opts.ume_flight_size}, {opts.ume_flight_size_behavior})",
                              frames))
    return out


@passive_for("SRC-PRX-001")
def proactive_after_timeout(obs: Observed) -> list[Judgement]:
    """A proactive retransmission of a message comes no sooner than
    ``ume_message_stability_timeout`` after its previous proactive retransmission
    (informational with the shortest observed gap without the source's configuration), and
    never once its only store acknowledged it (:func:`resent_after`).  A first resend is not
    timed from a send in the first :data:`BURST` seconds of its flow: the timeout runs from
    the application's send, which may be well before the wire's (an LBT-TCP source holds its
    messages until a receiver connects, then sends them in a burst)."""
    opts = obs.source_options
    out = []
    for inc in incarnations(obs):
        last: dict[int, Data] = {}
        gaps: list[tuple[float, Data, Data]] = []
        flows: dict[tuple[Addr, Addr], float] = {}  # a flow's first data: its burst begins
        for d in inc.data:
            flows.setdefault((d.src, d.dst), d.time)
            before = last.get(d.sqn)
            if d.kind == "prorx" and before is not None and (
                    before.kind == "prorx"
                    or before.time - flows[(before.src, before.dst)] >= BURST):
                gaps.append((d.time - before.time, before, d))
            last[d.sqn] = d
        name = inc.client.name
        settled = resent_after(inc, nak=False)
        if settled is not None:
            ack, again = settled
            out.append(failed(name, f"sqn {again.sqn} proactively resent (frame {again.frame}) "
                                    f"after its stability ACK (frame {ack.frame})",
                              [ack.frame, again.frame], expected="no resend once stable",
                              observed=f"resend of {again.sqn}"))
            continue
        resent = [d for d in inc.data if d.kind == "prorx"]
        if resent and opts is not None and opts.ume_message_stability_timeout == 0:
            out.append(failed(name, "proactive retransmission with "
                                    "ume_message_stability_timeout 0 (off)",
                              [resent[0].frame], expected="none",
                              observed=f"sqn {resent[0].sqn}"))
            continue
        if not gaps:
            if resent:
                out.append(informational(name, f"{len(resent)} proactive retransmission(s), "
                                               "none timed: each follows a send in its flow's "
                                               "first second, which may have been held back",
                                         [resent[0].frame, resent[-1].frame],
                                         observed=len(resent)))
            continue
        gap, a, b = min(gaps, key=lambda g: g[0])
        frames = [a.frame, b.frame]
        if opts is None:
            out.append(informational(name, f"{len(gaps)} proactive retransmission(s), the "
                                           f"soonest {gap * 1000:.0f} ms after the previous "
                                           "send (no --source-config given)", frames,
                                     observed=f"{gap * 1000:.0f} ms"))
            continue
        timeout = opts.ume_message_stability_timeout / 1000
        if gap < timeout - SLACK:
            out.append(failed(name, f"sqn {b.sqn} proactively resent {gap * 1000:.0f} ms after "
                                    f"its previous send", frames,
                              expected=f">= {timeout * 1000:.0f} ms",
                              observed=f"{gap * 1000:.0f} ms"))
        else:
            out.append(passed(name, f"{len(gaps)} proactive retransmission(s), none sooner "
                                    f"than {timeout * 1000:.0f} ms", frames))
    return out


def resent_after(inc: Incarnation, *, nak: bool) -> tuple[Ack, Data] | None:
    """The first proactive retransmission of a message after the source's only store
    acknowledged it (``nak`` false) or NACKed it (``nak`` true), :data:`SLACK` seconds on (an
    ACK and a resend may cross); None when there is none or the source has several stores
    (a message acknowledged by one is still resent to the others)."""
    if inc.stores != 1:
        return None
    settled: dict[int, Ack] = {}
    acks = iter(inc.acks)
    pending = next(acks, None)
    for d in inc.data:
        while pending is not None and pending.frame < d.frame:
            if pending.nak == nak:
                settled.setdefault(pending.sqn, pending)
            pending = next(acks, None)
        ack = settled.get(d.sqn)
        if d.kind == "prorx" and ack is not None and d.time - ack.time > SLACK:
            return ack, d
    return None


needs("SRC-PRX-004", "no stability NACK of a source of one store")


@passive_for("SRC-PRX-004")
def no_resend_after_nack(obs: Observed) -> list[Judgement]:
    """A message the store NACKed (the ACK's NAK bit) is not proactively resent."""
    out = []
    for inc in incarnations(obs):
        if inc.stores != 1 or not any(a.nak for a in inc.acks):
            continue
        name = inc.client.name
        found = resent_after(inc, nak=True)
        if found is not None:
            nack, again = found
            out.append(failed(name, f"sqn {again.sqn} resent (frame {again.frame}) after the "
                                    f"store NACKed it (frame {nack.frame})",
                              [nack.frame, again.frame], expected="no resend",
                              observed=f"resend of {again.sqn}"))
        else:
            nacks = [a for a in inc.acks if a.nak]
            out.append(passed(name, f"{len(nacks)} NACKed message(s), none resent",
                              [a.frame for a in nacks]))
    return out


REACK_WAIT = 1.0
"""Seconds within which a store acknowledges a duplicate again (beyond any
``stability-ack-interval`` batching, 200 ms by default)."""

needs("PRX-STORE-002", "no proactive retransmission of an acknowledged message reached a "
                       "store over TCP")


@passive_for("PRX-STORE-002")
def duplicate_acknowledged_again(obs: Observed) -> list[Judgement]:
    """A proactive retransmission of a message the store already acknowledged, which reached
    the store (over its registration connection, or an LBT-TCP transport to its host: TCP
    delivers it), gets another stability ACK (or NACK) of that number within
    :data:`REACK_WAIT` seconds, when the store is heard on that connection after that time
    (a store that died decides nothing)."""
    out = []
    for inc in incarnations(obs):
        client, store = inc.reg.conn
        latest = obs.memo("latest_heard", lambda o: {k: max(t for _f, t in v) for k, v in
                                                     o.heard.items() if v}).get((store, client))
        by_sqn: dict[int, list[Ack]] = {}
        for a in inc.acks:
            by_sqn.setdefault(a.sqn, []).append(a)
        acked: dict[int, Ack] = {}
        acks = iter(inc.acks)
        pending = next(acks, None)
        checked: list[int] = []
        bad: Judgement | None = None
        for d in inc.data:
            while pending is not None and pending.frame < d.frame:
                if not pending.nak:
                    acked.setdefault(pending.sqn, pending)
                pending = next(acks, None)
            if d.kind != "prorx":
                continue
            reached = (d.src, d.dst) == inc.reg.conn or (
                d.via == "lbttcp" and d.src in inc.transports and d.dst[0] == store[0])
            first = acked.get(d.sqn)
            if not reached or first is None or latest is None or not (
                    latest > d.time + REACK_WAIT):
                continue
            again = next((a for a in by_sqn.get(d.sqn, ()) if a.frame > d.frame
                          and a.time - d.time <= REACK_WAIT), None)
            if again is None:
                bad = failed(f"store {show(store)}", f"sqn {d.sqn} resent (frame {d.frame}) "
                                                     f"after its stability ACK (frame "
                                                     f"{first.frame}) was not acknowledged "
                                                     "again", [first.frame, d.frame],
                             expected="another stability ACK", observed="none")
                break
            checked += [d.frame, again.frame]
        if bad is not None:
            out.append(bad)
        elif checked:
            out.append(passed(f"store {show(store)}", f"{len(checked) // 2} duplicate(s) of "
                                                      "acknowledged messages acknowledged "
                                                      "again", checked))
    return out
