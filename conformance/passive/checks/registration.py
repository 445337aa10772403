"""Passive judges of registration: the stores' answers and the sources' behaviour around them.

Each judge states which of the capture's registrations it can decide and leaves the others
alone: a registration whose answer the capture lacks, or a re-registration whose earlier
registration was not captured, decides nothing (docs/semantics.md §1.1, §1.4, §1.9, §1.10).
Choices where the guide is silent on what traffic shows:

* a *re-registration* is a later PREG of the same client (same topic, and the same Session
  ID or requested RegID, :meth:`~conformance.passive.observe.Observed.clients`) at a store that
  granted it before.  Only one granted the *same* RegID again is judged: a store whose
  activity timeout had expired the client's state may grant it as new (a new RegID), which
  traffic cannot tell from a fault.  A missing OLD flag fails only when the client asked for
  RegID 0 with a Session ID (:func:`associated`: getting the same RegID back shows the store
  kept its state); a RegID asked for explicitly is granted to a store's new client as well, e.g.
  by a memory store that restarted;
* "an active source" (REG-STORE-003) is one still visibly served: its connection gets a
  stability ACK after the second source was granted the same RegID; or, with the store's XML
  (``--store-config``), one heard from less than its activity timeout before the grant
  (:func:`active_within_timeout`);
* "resumes after the consensus sequence number" (SRC-REG-003): the first new message after a
  granted re-registration must be above the highest sequence number the stores answered; one
  exactly after it passes, one further on is informational (a source re-registering without a
  restart goes on with its own numbering).
"""

from __future__ import annotations

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
from conformance.passive.observe import Client, Observed, Registration, show

KNOWN_CODES = range(1, 7)
"""The PREG-RESP error codes the guide defines (docs/wire-lbmc.md §2.1)."""


needs("REG-STORE-001", "no source registration asking for RegID 0 was answered")
needs("REG-STORE-003", "no source registration was granted")
needs("QRM-STORE-001", "no receiver registration was granted")
needs("REG-STORE-004", "no source re-registered with a store that had granted it before")
needs("REG-STORE-010", "no receiver re-registered with a store that had granted it before")
needs("REG-STORE-013", "no source deregistration was answered")
needs("PSV-STORE-001", "no registration was answered")
needs("SRC-REG-003", "no source re-registered and was answered OLD")
needs("SRC-REG-004", "no source registration was granted")


def store_name(reg: Registration) -> str:
    return f"store {show(reg.store)}"


def _by_store(obs: Observed) -> dict[str, list[Registration]]:
    out: dict[str, list[Registration]] = {}
    for reg in obs.registrations:
        out.setdefault(store_name(reg), []).append(reg)
    return out


def _reregistrations(client: Client) -> list[tuple[Registration, Registration]]:
    """(earlier grant, later registration granted the same RegID) at one store."""
    out = []
    granted: dict[tuple[str, int], Registration] = {}
    for reg in client.registrations:
        key = reg.store
        before = granted.get(key)
        if reg.granted and reg.response is not None:
            if before is not None and before.response is not None and \
                    reg.response.reg_id == before.response.reg_id:
                out.append((before, reg))
            granted[key] = reg
    return out


def associated(reg: Registration) -> bool:
    """Whether a grant shows the store kept the client's state: asked for RegID 0 with a
    Session ID, it named the RegID it associates with that Session ID ("How Stores Associate
    Session IDs and RegIDs"); a RegID asked for explicitly is granted to a new client too."""
    return reg.reg_id == 0 and reg.session_id != 0


@passive_for("REG-STORE-001")
def new_sources_get_nonzero_regids(obs: Observed) -> list[Judgement]:
    out = []
    for store, regs in _by_store(obs).items():
        asked = [r for r in regs if r.source and r.reg_id == 0 and r.granted]
        zero = [r for r in asked if r.response is not None and r.response.reg_id == 0]
        if zero:
            out.append(failed(store, f"granted RegID 0 to a source (frame {zero[0].frame})",
                              zero[0].frames, expected="a non-zero RegID", observed=0))
        elif asked:
            out.append(passed(store, f"{len(asked)} source registration(s) asking for RegID 0 "
                                     "were granted a non-zero RegID",
                              [f for r in asked for f in r.frames]))
    return out


@passive_for("REG-STORE-003")
def one_regid_one_active_source(obs: Observed) -> list[Judgement]:
    out = []
    for store, regs in _by_store(obs).items():
        grants = [r for r in regs if r.source and r.granted and r.response is not None]
        if not grants:
            continue
        clash = None
        for i, first in enumerate(grants):
            for second in grants[i + 1:]:
                assert first.response is not None and second.response is not None
                if first.response.reg_id != second.response.reg_id or _same_source(first,
                                                                                    second):
                    continue
                later = [a.frame for a in obs.stability_acks(first)
                         if a.frame > second.response.frame]
                later += active_within_timeout(obs, first, second)
                if later:
                    clash = (first, second, later[0])
                    break
            if clash:
                break
        if clash:
            first, second, ack = clash
            out.append(failed(
                store, f"RegID {second.response.reg_id if second.response else '?'} granted to "
                       f"a second source (frame {second.frame}) while the first was still "
                       f"active (frame {ack}: a stability ACK to it after the grant, or its "
                       "last activity within the activity timeout of --store-config)",
                [*first.frames, *second.frames, ack], expected="refusal (code 5)",
                observed="granted"))
        else:
            out.append(passed(store, f"{len(grants)} source grant(s): no RegID held by two "
                                     "active sources", [f for r in grants for f in r.frames]))
    return out


SLACK = 0.25
"""Seconds of timer slack allowed on a configured timeout."""


def active_within_timeout(obs: Observed, first: Registration, second: Registration
                          ) -> list[int]:
    """The frame of ``first``'s source's last activity before ``second``'s PREG when that is
    less than the activity timeout (less :data:`SLACK`) before ``second`` was granted, else
    ``[]``.  The timeout is the store's ``source-activity-timeout`` for the topic from
    ``--store-config``, or the source's own shorter one from its PREG; without the XML,
    nothing (the store's timeout is unknown).  Activity: what the source sent to the store on
    that connection (keepalives, data) and its data on its transports."""
    sc = obs.store_config_of(first.store)
    topic = None if sc is None else next(
        (t for t in sc.topics if first.topic is not None and t.matches(first.topic)), None)
    if topic is None or second.response is None or any(
            r.deregister and r.frame < second.frame and r.conn == first.conn
            for r in obs.registrations):
        return []
    timeout = topic.options.source_activity_timeout
    if first.activity_timeout:
        timeout = min(timeout, first.activity_timeout)
    client, store = first.conn
    frames = [(f, t) for f, t in obs.heard.get((client, store), []) if f < second.frame]
    transports = obs.source_transports(first)
    frames += [(d.frame, d.time) for d in obs.data_from(*transports)
               if d.frame < second.frame]
    if not frames:
        return []
    frame, when = max(frames)
    return [frame] if second.response.time - when < timeout / 1000 - SLACK else []


def _same_source(a: Registration, b: Registration) -> bool:
    """Whether ``b`` provably comes from ``a``'s source (the store's reading of "a different
    source", reference_impl/store.py "RegID ownership"): on ``a``'s connection; or from its
    host with its Session ID; or, neither having one, with its request address and its
    transport and topic indexes (a restart on the same ports)."""
    if a.conn == b.conn:
        return True
    if a.topic != b.topic or a.conn[0][0] != b.conn[0][0] or a.resp_addr[0] != b.resp_addr[0]:
        return False
    if a.session_id or b.session_id:
        return a.session_id == b.session_id
    return a.resp_addr == b.resp_addr and a.resp_addr[1] != 0 and (
        a.transport_idx, a.topic_idx) == (b.transport_idx, b.topic_idx)


@passive_for("QRM-STORE-001")
def one_regid_one_active_receiver(obs: Observed) -> list[Judgement]:
    """A RegID granted to a second receiver while the first still acknowledges (its
    consumption ACKs after the grant show it active) fails: the store must refuse "any new
    request for the receiver's RegID" within its activity timeout."""
    out = []
    owner = {id(r): c.name for c in obs.clients("receiver") for r in c.registrations}
    for store, regs in _by_store(obs).items():
        grants = [r for r in regs if not r.source and r.granted and r.response is not None]
        if not grants:
            continue
        clash = None
        for i, first in enumerate(grants):
            for second in grants[i + 1:]:
                assert first.response is not None and second.response is not None
                if first.response.reg_id != second.response.reg_id or \
                        owner.get(id(first)) == owner.get(id(second)):
                    continue
                later = [a for a in obs.acks_between(*first.conn) if a.kind == "consumption"
                         and a.frame > second.response.frame
                         and first.response.reg_id in (a.rcv_reg_id, a.id_2)]
                if later:
                    clash = (first, second, later[0].frame)
                    break
            if clash:
                break
        if clash:
            first, second, ack = clash
            out.append(failed(
                store, f"RegID {second.response.reg_id if second.response else '?'} granted to "
                       f"a second receiver (frame {second.frame}) while the first still "
                       f"acknowledged (frame {ack})", [*first.frames, *second.frames, ack],
                expected="a refusal", observed="granted"))
        else:
            out.append(passed(store, f"{len(grants)} receiver grant(s): no RegID held by two "
                                     "active receivers", [f for r in grants for f in r.frames]))
    return out


@passive_for("REG-STORE-004")
def reregistered_source_old_and_high(obs: Observed) -> list[Judgement]:
    out = []
    for client in obs.clients("source"):
        pairs = _reregistrations(client)
        if not pairs:
            continue
        for before, again in pairs:
            resp = again.response
            assert resp is not None
            store = store_name(again)
            acked = [a for a in obs.stability_acks(before) if not a.nak and a.frame < again.frame]
            top = max(acked, key=lambda a: a.sqn) if acked else None
            frames = [*before.frames, *again.frames] + ([top.frame] if top else [])
            if not resp.old and not associated(again):
                out.append(unsupported(store, f"{client.name} re-registered asking for its "
                                              f"RegID (frame {again.frame}): a store that "
                                              "lost its state grants it as new"))
            elif not resp.old:
                out.append(failed(store, f"{client.name} re-registered with its Session ID "
                                         f"and got its RegID {resp.reg_id} again without the "
                                         "OLD flag", frames, expected="OLD flag",
                                  observed="no OLD flag"))
            elif top is not None and resp.high_sqn < top.sqn:
                out.append(failed(store, f"{client.name}: high sequence number {resp.high_sqn} "
                                         f"below the {top.sqn} the store acknowledged as stable",
                                  frames, expected=f">= {top.sqn}", observed=resp.high_sqn))
            else:
                out.append(passed(store, f"{client.name} re-registered: OLD, high sequence "
                                         f"number {resp.high_sqn}"
                                         + (f" (highest stable {top.sqn})" if top else ""),
                                  frames))
    return out


@passive_for("REG-STORE-010")
def reregistered_receiver_low_sqn(obs: Observed) -> list[Judgement]:
    out = []
    for client in obs.clients("receiver"):
        for before, again in _reregistrations(client):
            resp = again.response
            assert resp is not None
            store = store_name(again)
            acks = [a for a in obs.acks_to(again.store) if a.kind == "consumption"
                    and a.rcv_reg_id == resp.reg_id and a.frame < again.frame]
            if not acks:
                out.append(unsupported(store, f"{client.name} re-registered (frame "
                                              f"{again.frame}) but no consumption ACK of it "
                                              "was captured before"))
                continue
            last = max(acks, key=lambda a: a.sqn)  # cumulative: the highest covers all
            frames = [*before.frames, *again.frames, last.frame]
            if not resp.old and not associated(again):
                out.append(unsupported(store, f"{client.name} re-registered asking for its "
                                              f"RegID (frame {again.frame}): a store that "
                                              "lost its state grants it as new"))
            elif not resp.old:
                out.append(failed(store, f"{client.name} re-registered with its Session ID "
                                         f"and got its RegID {resp.reg_id} again without the "
                                         "OLD flag", frames, expected="OLD flag",
                                  observed="no OLD flag"))
            elif resp.low_sqn != last.sqn + 1:
                out.append(failed(store, f"{client.name}: low sequence number {resp.low_sqn}, "
                                         f"last acknowledged {last.sqn}", frames,
                                  expected=last.sqn + 1, observed=resp.low_sqn))
            else:
                out.append(passed(store, f"{client.name} re-registered: OLD, low sequence "
                                         f"number {resp.low_sqn} = last ACK {last.sqn} + 1",
                                  frames))
    return out


@passive_for("REG-STORE-013")
def deregistration_answered_with_d(obs: Observed) -> list[Judgement]:
    out = []
    for store, regs in _by_store(obs).items():
        dereg = [r for r in regs if r.source and r.deregister and r.response is not None]
        bad = [r for r in dereg if r.response is not None and not r.response.deregister]
        if bad:
            out.append(failed(store, f"a deregistration (frame {bad[0].frame}) answered "
                                     "without the deregister flag", bad[0].frames,
                              expected="D flag", observed="no D flag"))
        elif dereg:
            out.append(passed(store, f"{len(dereg)} deregistration(s) answered with the "
                                     "deregister flag", [f for r in dereg for f in r.frames]))
    return out


@passive_case("PSV-STORE-001", role=Role.STORE,
              title="A refused registration carries one of the guide's error codes",
              section="Registration Identifier",
              requirement="A refusal is a registration response with the error flag and an "
                          "error code: 1 no matching pattern, 2 source RegID not found, 3 RegID "
                          "in use by a receiver, 4 topic name differs, 5 RegID in use by a "
                          "different source, 6 incompatible configuration.")
def refusal_codes(obs: Observed) -> list[Judgement]:
    """Every PREG-RESP with the E flag names a code the guide defines (1-6)."""
    out = []
    for store, regs in _by_store(obs).items():
        answered = [r for r in regs if r.response is not None]
        refused = [r for r in answered if r.response is not None and r.response.error]
        bad = [r for r in refused if r.response is not None
               and r.response.code not in KNOWN_CODES]
        if bad and bad[0].response is not None:
            out.append(failed(store, f"refusal with error code {bad[0].response.code}",
                              bad[0].frames, expected="1-6", observed=bad[0].response.code))
        elif answered:
            out.append(passed(store, f"{len(answered)} answer(s), {len(refused)} refusal(s), "
                                     "every refusal with a known code",
                              [f for r in answered for f in r.frames]))
    return out


@passive_for("SRC-REG-003")
def source_resumes_after_store_sqn(obs: Observed) -> list[Judgement]:
    """Judged on sources of one store (with several, the consensus behaviour decides)."""
    from conformance.passive.checks.stability import incarnations

    out = []
    for inc in incarnations(obs):
        resp = inc.reg.response
        if resp is None or not resp.old or not any(
                b is not inc.reg and b.granted and b.frame < inc.reg.frame
                for b in inc.client.registrations):
            continue
        name = inc.client.name
        if inc.stores != 1:
            out.append(unsupported(name, "a source of several stores: where it resumes "
                                         "depends on its consensus behaviour"))
            continue
        if not inc.data:
            out.append(unsupported(name, f"no data captured after the re-registration "
                                         f"(frame {resp.frame})"))
            continue
        first = min(inc.data, key=lambda d: (d.sqn, d.frame))
        frames = [*inc.reg.frames, first.frame]
        high = resp.high_sqn
        if first.sqn <= high:
            out.append(failed(name, f"after the store answered high sequence number {high} "
                                    f"the source sent {first.sqn} again", frames,
                              expected=high + 1, observed=first.sqn))
        elif first.sqn == high + 1:
            out.append(passed(name, f"resumed at {first.sqn} after the store's {high}",
                              frames))
        else:
            out.append(informational(name, f"resumed at {first.sqn}, past the store's "
                                           f"{high} + 1", frames, observed=first.sqn))
    return out


@passive_for("SRC-REG-004")
def no_data_before_registration(obs: Observed) -> list[Judgement]:
    """Judged on registrations before which the client held no grant at another store (with a
    grant elsewhere the source may legitimately be sending)."""
    out = []
    for client in obs.clients("source"):
        windows = []
        stores_granted: set[tuple[str, int]] = set()
        for reg in client.registrations:
            if reg.granted and reg.response is not None:
                if not (stores_granted - {reg.store}):
                    windows.append(reg)
                stores_granted.add(reg.store)
        bad = None
        checked = []
        for reg in windows:
            assert reg.response is not None
            transports = obs.source_transports(reg)
            if not transports:
                continue
            checked.append(reg)
            early = [d for d in obs.data_from(*transports) if d.kind == "data"
                     and d.tidx == reg.topic_idx and reg.frame < d.frame < reg.response.frame]
            if early:
                bad = (reg, early[0])
                break
        if bad:
            reg, d = bad
            out.append(failed(client.name, f"data sqn {d.sqn} (frame {d.frame}) between its "
                                           f"PREG (frame {reg.frame}) and the answer",
                              [*reg.frames, d.frame], expected="no data before registration",
                              observed=f"sqn {d.sqn}"))
        elif checked:
            out.append(passed(client.name, f"no data between PREG and grant in "
                                           f"{len(checked)} registration(s)",
                              [f for r in checked for f in r.frames]))
        elif windows:
            out.append(unsupported(client.name, "its transport was not identified (no SRI "
                                                "or TIR naming it was captured)"))
    return out

