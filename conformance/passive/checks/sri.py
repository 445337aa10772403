"""Passive judges of the SRI a source sends on its transport: its content (which stores, with
which RegID) and its version numbers (docs/semantics.md §1.3).

A source's SRIs are those on its transports (:meth:`~conformance.passive.observe.Observed.
source_transports`) for its topic index.  Choices where the guide is silent on what traffic
shows:

* an SRI entry is judged only for a store whose grant to this source the capture holds: the
  RegID it names must be the one that store granted last (a grant less than :data:`SLACK`
  seconds before the SRI may not have reached the source yet: the one before it counts too);
* a granted store missing from an SRI fails only when the store was plainly registered then:
  granted at least :data:`SETTLED` seconds before, no PREG of the source to it since, and heard
  on that connection within :data:`SETTLED` seconds before the SRI and again after it (a store
  the source declared unresponsive, or whose connection broke because it died, leaves its
  SRI, docs/semantics.md §1.12);
* versions: within one run of a source's SRIs (a lower overall version starts a new run: the
  source restarted), a store's version never goes down; when it goes up the overall version
  goes up too, and the source must have re-registered with that store (a PREG to it captured
  after the last SRI showing the old version).  "No other store's version" is the same rule:
  a store that did not re-register keeps its version.  And a store re-registered (a PREG asked
  after an SRI naming it, granted before a later SRI whose overall version rose) must have a
  higher version there or in a later SRI of the run (an SRI sent for another store's grant
  may cross this one).  Judged only for stores whose registrations the capture holds.
"""

from __future__ import annotations

from conformance.model import passive_for
from conformance.passive.judgement import Judgement, failed, needs, passed, unsupported
from conformance.passive.observe import Addr, Client, Observed, Registration, Sri, show

SLACK = 0.05
"""Seconds an SRI and a store's grant may cross (the source had not read the grant yet)."""

SETTLED = 1.0
"""Seconds after which a granted, recently heard store must be in the source's SRI."""

needs("SRC-REG-006", "no SRI of a source whose registration was captured")
needs("SRC-REG-008", "no store's version changed in a source's SRIs (no store returned)")


def client_sris(obs: Observed, client: Client) -> list[Sri]:
    """The SRIs ``client`` (a source) sent: on its transports, for its topic index."""
    keys: set[tuple[Addr, int]] = set()
    for reg in client.registrations:
        for t in obs.source_transports(reg):
            keys.add((t, reg.topic_idx))
    return [s for s in obs.sris if (s.src, s.tidx) in keys]


def _grants(client: Client) -> dict[Addr, list[Registration]]:
    out: dict[Addr, list[Registration]] = {}
    for reg in client.registrations:
        if reg.granted:
            out.setdefault(reg.store, []).append(reg)
    return out


def _heard(obs: Observed, reg: Registration, since: float, until: float) -> bool:
    client, store = reg.conn
    return any(since <= t <= until for _f, t in obs.heard.get((store, client), []))


@passive_for("SRC-REG-006")
def sri_names_registered_stores(obs: Observed) -> list[Judgement]:
    out = []
    for client in obs.clients("source"):
        sris = client_sris(obs, client)
        grants = _grants(client)
        if not sris or not grants:
            continue
        bad: Judgement | None = None
        checked = 0
        for sri in sris:
            named = {e.store: e for e in sri.stores}
            for store, regs in grants.items():
                before = [r for r in regs if r.response is not None
                          and r.response.time < sri.time]
                if not before:
                    continue
                last = before[-1]
                assert last.response is not None
                allowed = {last.response.reg_id}
                if sri.time - last.response.time < SLACK and len(before) > 1 and \
                        before[-2].response is not None:
                    allowed.add(before[-2].response.reg_id)
                entry = named.get(store)
                if entry is not None:
                    checked += 1
                    if entry.reg_id not in allowed:
                        bad = failed(client.name, f"SRI (frame {sri.frame}) names RegID "
                                                  f"{entry.reg_id} at store {show(store)}, "
                                                  f"which granted {last.response.reg_id}",
                                     [*last.frames, sri.frame],
                                     expected=last.response.reg_id, observed=entry.reg_id)
                        break
                    continue
                again = [r for r in client.registrations if r.store == store
                         and last.frame < r.frame < sri.frame]
                if (sri.time - last.response.time >= SETTLED and not again
                        and _heard(obs, last, sri.time - SETTLED, sri.time)
                        and _heard(obs, last, sri.time, obs.end_time)):
                    bad = failed(client.name, f"SRI (frame {sri.frame}) leaves out store "
                                              f"{show(store)}, which granted RegID "
                                              f"{last.response.reg_id} (frame "
                                              f"{last.response.frame}) and is still heard",
                                 [*last.frames, sri.frame], expected=f"store {show(store)}",
                                 observed=sorted(show(s) for s in named))
                    break
            if bad:
                break
        if bad:
            out.append(bad)
        elif checked:
            out.append(passed(client.name, f"{len(sris)} SRI(s): every store named with the "
                                           "RegID it granted",
                              [*(f for regs in grants.values() for r in regs for f in r.frames),
                               sris[0].frame, sris[-1].frame]))
    return out


def _reregistered(client: Client, store: Addr, before: Sri, after: Sri) -> Registration | None:
    """A re-registration of ``client`` with ``store`` asked after SRI ``before`` and granted
    before SRI ``after`` (an earlier grant by that store is captured), or None.  A PREG asked
    before ``before`` may be a retry whose second answer the source ignores (it is registered
    already)."""
    grants = [r for r in client.registrations if r.store == store and r.granted]
    for reg in grants:
        assert reg.response is not None
        if before.frame < reg.frame and reg.response.frame < after.frame and any(
                g.frame < reg.frame for g in grants):
            return reg
    return None


@passive_for("SRC-REG-008")
def sri_versions_follow_reregistrations(obs: Observed) -> list[Judgement]:
    out = []
    for client in obs.clients("source"):
        sris = client_sris(obs, client)
        if len(sris) < 2:
            continue
        captured = {r.store for r in client.registrations}
        bad: Judgement | None = None
        bumps: list[int] = []
        blind: list[str] = []
        by_transport: dict[tuple[Addr, int], list[Sri]] = {}
        for s in sris:
            by_transport.setdefault((s.src, s.tidx), []).append(s)
        for run in by_transport.values():
            seen: dict[Addr, Sri] = {}  # store -> the last SRI naming it
            prev: Sri | None = None
            for sri in run:
                if prev is not None and sri.version < prev.version:
                    seen = {}  # a new run: the source restarted
                for e in sri.stores:
                    last = seen.get(e.store)
                    old = next((x for x in last.stores if x.store == e.store), None) \
                        if last is not None else None
                    seen[e.store] = sri
                    if last is None or old is None:
                        continue
                    if e.version == old.version:
                        redone = _reregistered(client, e.store, last, sri)
                        if redone is not None and sri.version > last.version and not any(
                                x.store == e.store and x.version > e.version
                                for later in run if later.frame > sri.frame
                                for x in later.stores):
                            bad = failed(client.name, f"store {show(e.store)} granted a "
                                                      f"re-registration (frame {redone.frame}) "
                                                      f"but its version stayed {e.version} "
                                                      f"(frame {sri.frame})",
                                         [last.frame, *redone.frames, sri.frame],
                                         expected=f"> {old.version}", observed=e.version)
                            break
                        continue
                    frames = [last.frame, sri.frame]
                    if e.version < old.version:
                        bad = failed(client.name, f"store {show(e.store)}'s version went down "
                                                  f"from {old.version} (frame {last.frame}) to "
                                                  f"{e.version} (frame {sri.frame})", frames,
                                     expected=f">= {old.version}", observed=e.version)
                    elif sri.version <= last.version:
                        bad = failed(client.name, f"store {show(e.store)}'s version went up "
                                                  f"(frame {sri.frame}) but the SRI version "
                                                  f"stayed {sri.version}", frames,
                                     expected=f"> {last.version}", observed=sri.version)
                    elif e.store not in captured:
                        blind.append(show(e.store))
                        continue
                    else:
                        again = [r for r in client.registrations if r.store == e.store
                                 and last.frame < r.frame < sri.frame]
                        if not again:
                            bad = failed(client.name, f"store {show(e.store)}'s version went "
                                                      f"up (frame {sri.frame}) without a "
                                                      "re-registration with it since frame "
                                                      f"{last.frame}", frames,
                                         expected=f"version {old.version}",
                                         observed=e.version)
                        else:
                            bumps.extend([*frames, again[-1].frame])
                    if bad:
                        break
                prev = sri
                if bad:
                    break
            if bad:
                break
        if bad:
            out.append(bad)
        elif bumps:
            out.append(passed(client.name, f"{len(bumps) // 3} store version rise(s), each "
                                           "after a re-registration with that store and with "
                                           "the SRI version", bumps))
        elif blind:
            out.append(unsupported(client.name, f"store version rises for {blind[0]}, whose "
                                                "registrations the capture does not hold"))
    return out
