"""Passive judge of RPP stability withholding (the guide's "RPP Normal Operations",
docs/semantics.md §1.13 and §2.2).

An RPP store "uses the source's flight size (bytes) to regulate the source's speed, by
withholding stability acknowledgements if the repository does not have at least one flight
size available": a stability ACK must leave at least the effective ``ume_flight_size_bytes``
of room below the effective repository size limit.  The active case RPP-STORE-030 states the
rule; the same case judges it here over observed traffic.

What the capture shows and what it needs:

* an RPP source registration: the PREG's RPP flag (``w_flag``) and a grant;
* the effective values: the topic's ``source-flight-size-bytes-maximum`` and
  ``repository-size-limit`` from ``--store-config``, lowered by the source's overrides
  (:func:`reference_impl.rpp.effective_values`, the rule the store applies).  A PREG without
  extended options asked for no override; one with them is judged only with the source's
  ``--source-config`` (the options' contents are not in the observation);
* what the repository holds when it acknowledges ``n``: at least every message it
  acknowledged so far, ``n`` included (payload bytes, as the store counts), less those any RPP
  receiver of that source at that store has consumed (consumption ACKs are cumulative).  This
  is a *lower bound* (*choice*: a message consumed by one receiver counts as released, since
  which receivers are blocking travels in options too; messages received but not yet
  acknowledged are not counted), so a store is failed only when even that leaves less than
  one flight size of room: never a false failure.

Without ``--store-config`` the least room left at a stability ACK is informational.
"""

from __future__ import annotations

import heapq
from typing import Any

from conformance.model import passive_for
from conformance.passive.checks.stability import incarnations, sent_by_source
from conformance.passive.judgement import Judgement, failed, informational, needs, passed
from conformance.passive.observe import Ack, Observed, Registration, show

needs("RPP-STORE-030", "no stability ACK to a granted RPP source registration was captured")


def _effective(obs: Observed, reg: Registration) -> tuple[int, int] | str:
    """(effective size limit, effective flight size in bytes) for ``reg``, or why not known."""
    from reference_impl import rpp

    sc = obs.store_config_of(reg.store)
    topic = None if sc is None else next(
        (t for t in sc.topics if reg.topic is not None and t.matches(reg.topic)), None)
    if topic is None:
        return ("no --store-config given" if obs.store_config is None
                else "the store's XML has no topic of this registration")
    requested: dict[str, int] = {}
    if reg.extopt:
        if obs.source_options is None:
            return ("the source's RPP overrides travel in its PREG's extended options: give "
                    "its --source-config")
        requested = rpp.requested_overrides(rpp.source_options(obs.source_options))
    policy: Any = topic.options
    try:
        values = rpp.effective_values(policy, requested,
                                      disk=getattr(policy, "repository_type", "") == "disk")
    except rpp.RppRefused as exc:
        return f"the overrides are refused by the rules ({exc})"
    return values.size_limit, values.flight_size_bytes


def _consumed(obs: Observed, reg: Registration, reg_id: int) -> list[Ack]:
    """Consumption ACKs to ``reg``'s store from the RPP receivers of its source, in capture
    order."""
    conns = {r.conn for r in obs.registrations
             if not r.source and r.rpp and r.granted and r.store == reg.store
             and r.src_reg_id == reg_id}
    acks = [a for c in conns for a in obs.acks_between(*c) if a.kind == "consumption"]
    return sorted(acks, key=lambda a: a.frame) if len(conns) > 1 else acks


@passive_for("RPP-STORE-030")
def stability_withheld_without_room(obs: Observed) -> list[Judgement]:
    out = []
    for inc in incarnations(obs):
        reg, resp = inc.reg, inc.reg.response
        if not reg.rpp or resp is None:
            continue
        acks = [a for a in inc.acks if not a.nak]
        if not acks:
            continue
        name = f"store {show(reg.store)}"
        who = f"{inc.client.name} (RegID {resp.reg_id})"
        sizes: dict[int, int] = {}
        for d in sent_by_source(obs, reg, inc.transports):
            sizes.setdefault(d.sqn, d.size)
        consumed = iter(_consumed(obs, reg, resp.reg_id))
        pending = next(consumed, None)
        upto = -1  # highest sequence number consumed by an RPP receiver so far
        held, stored = 0, set()
        heap: list[int] = []  # acknowledged, not yet consumed
        limits = _effective(obs, reg)
        least: tuple[int, Ack] | None = None
        bad: tuple[int, Ack] | None = None
        for ack in acks:
            while pending is not None and pending.frame < ack.frame:
                upto = max(upto, pending.sqn)
                pending = next(consumed, None)
            while heap and heap[0] <= upto:
                held -= sizes.get(heapq.heappop(heap), 0)
            if ack.sqn not in stored and ack.sqn > upto:
                stored.add(ack.sqn)
                heapq.heappush(heap, ack.sqn)
                held += sizes.get(ack.sqn, 0)
            if isinstance(limits, tuple):
                room = limits[0] - held
                if room < limits[1] and bad is None:
                    bad = (room, ack)
            if least is None or held > least[0]:
                least = (held, ack)
        if isinstance(limits, str):
            assert least is not None
            out.append(informational(name, f"{who}: {len(acks)} stability ACK(s), at least "
                                           f"{least[0]} bytes held at the fullest (frame "
                                           f"{least[1].frame}); room not judged: {limits}",
                                     [*reg.frames, least[1].frame], observed=least[0]))
        elif bad is not None:
            room, ack = bad
            out.append(failed(name, f"{who}: stability ACK for sqn {ack.sqn} (frame "
                                    f"{ack.frame}) left at most {room} bytes below the size "
                                    f"limit {limits[0]}, less than one flight size "
                                    f"({limits[1]} bytes)", [*reg.frames, ack.frame],
                              expected=f">= {limits[1]} bytes of room",
                              observed=f"<= {room} bytes"))
        else:
            assert least is not None
            out.append(passed(name, f"{who}: {len(acks)} stability ACK(s), each leaving at "
                                    f"least one flight size ({limits[1]} bytes) below the "
                                    f"size limit {limits[0]}", [*reg.frames, least[1].frame]))
    return out
