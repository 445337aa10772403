"""Passive judges of liveness: store keepalives and the sources' store activity timeout
(docs/semantics.md §1.11, §1.12).

What a peer hears of the other side of a connection is every frame carrying LBMC that side
sends on it (:attr:`~conformance.passive.observe.Observed.heard`).  Choices where the guide is
silent on what traffic shows:

* store keepalives (PSV-STORE-003): judged per granted registration on its connection, from
  the grant to the client's last frame on that connection (a client gone quiet may have
  left); the store's longest silence there may be at most ``keepalive-interval`` plus its
  ``source-check-interval`` (when it looks) plus :data:`SLACK`.  The limits are the store's
  XML (``--store-config``, the topic's options); without it the longest silence is
  informational;
* the store activity timeout (SRC-QRM-015): a source re-registering with a store that granted
  it before, while it did not re-register with its other stores within
  :data:`RESTART_WINDOW` seconds (so not a source restart), must have heard nothing from that
  store for ``ume_store_activity_timeout`` (``--source-config``; informational with the
  observed silence without it).  A source of one store is not judged: its restart looks the
  same on the wire.
"""

from __future__ import annotations

import itertools

from conformance.model import Role, passive_for
from conformance.passive.cases import passive_case
from conformance.passive.judgement import (
    Judgement,
    failed,
    informational,
    needs,
    passed,
)
from conformance.passive.observe import Observed, Registration, show

SLACK = 0.25
"""Seconds of timer and scheduling slack allowed on a configured interval."""

RESTART_WINDOW = 2.0
"""Seconds within which a source re-registering with all its stores is taken for a restart."""

needs("PSV-STORE-003", "no granted registration with traffic after the grant")
needs("SRC-QRM-015", "no source of several stores re-registered with one of them alone "
      "(with one store, a restart looks the same on the wire)")


def _keepalive_limits(obs: Observed, reg: Registration) -> tuple[float, float] | None:
    """(keepalive-interval, source-check-interval) in seconds for ``reg``'s topic at its
    store, from ``--store-config``; None without it (or when no store or topic matches)."""
    sc = obs.store_config_of(reg.store)
    if sc is None:
        return None
    topic = next((t for t in sc.topics if reg.topic is not None and t.matches(reg.topic)),
                 None)
    if topic is None:
        return None
    return topic.options.keepalive_interval / 1000, topic.options.source_check_interval / 1000


@passive_case("PSV-STORE-003", role=Role.STORE,
              title="A store keeps an idle client's connection alive every keepalive-interval",
              section="Options for a Topic's ume-attributes Element",
              requirement="keepalive-interval specifies how often a store will generate "
                          "keepalive traffic to sources and receivers if there has been no "
                          "traffic required in the normal course of operation.")
def store_keepalives(obs: Observed) -> list[Judgement]:
    worst: dict[str, tuple[float, int, int, Registration]] = {}
    for reg in obs.registrations:
        resp = reg.response
        if reg.deregister or not reg.granted or resp is None:
            continue
        client, store = reg.conn
        from_client = [t for f, t in obs.heard_after(client, store, resp.frame)]
        if not from_client:
            continue
        end = from_client[-1]
        times = [(resp.frame, resp.time)] + [(f, t) for f, t in obs.heard_after(
            store, client, resp.frame) if t <= end]
        gaps = [(b[1] - a[1], a[0], b[0]) for a, b in itertools.pairwise(times)]
        last = times[-1]
        # after the store's last frame, the client still talking on that connection for a
        # while shows the store alive (a dead store's connection is reset at the first write)
        tail = [(f, t) for f, t in obs.heard[(client, store)] if t > last[1]]
        if len(tail) >= 2 and tail[-1][1] - tail[0][1] >= 1.0:
            gaps.append((end - last[1], last[0], tail[-1][0]))
        longest = max(gaps, default=(0.0, resp.frame, resp.frame))
        name = f"store {show(store)}"
        if name not in worst or longest[0] > worst[name][0]:
            worst[name] = (*longest, reg)
    out = []
    for name, (gap, a, b, reg) in sorted(worst.items()):
        limits = _keepalive_limits(obs, reg)
        shown = f"{gap * 1000:.0f} ms"
        if limits is None:
            why = ("no --store-config given" if obs.store_config is None
                   else "--store-config has no store or topic for it")
            out.append(informational(name, f"its longest silence towards a live client: "
                                           f"{shown} (frames {a}-{b}; {why})", [a, b],
                                     observed=shown))
            continue
        interval, check = limits
        most = interval + check + SLACK
        if gap > most:
            out.append(failed(name, f"silent towards a live client for {shown} (frames "
                                    f"{a}-{b})", [a, b],
                              expected=f"<= {most * 1000:.0f} ms (keepalive-interval "
                                       f"{interval * 1000:.0f} ms)", observed=shown))
        else:
            out.append(passed(name, f"never silent towards a live client longer than {shown} "
                                    f"(keepalive-interval {interval * 1000:.0f} ms)", [a, b]))
    return out


@passive_for("SRC-QRM-015")
def reregisters_after_store_activity_timeout(obs: Observed) -> list[Judgement]:
    opts = obs.source_options
    out = []
    for client in obs.clients("source"):
        regs = client.registrations
        if len({r.store for r in regs}) < 2:
            continue
        judged: list[tuple[float, Registration, int]] = []
        for i, again in enumerate(regs):
            before = next((r for r in reversed(regs[:i]) if r.store == again.store), None)
            if before is None or not before.granted or before.response is None:
                continue
            others = {r.store for r in regs if r.store != again.store
                      and abs(r.time - again.time) <= RESTART_WINDOW}
            if others:
                continue  # a restart (or a registration round with every store)
            client_addr, store = before.conn
            heard = [(f, t) for f, t in obs.heard.get((store, client_addr), [])
                     if before.response.frame <= f < again.frame]
            last_f, last_t = heard[-1] if heard else (before.response.frame,
                                                      before.response.time)
            judged.append((again.time - last_t, again, last_f))
        if not judged:
            continue
        silence, again, last = min(judged, key=lambda j: j[0])
        frames = [last, again.frame]
        shown = f"{silence * 1000:.0f} ms"
        what = (f"re-registered with store {show(again.store)} (frame {again.frame}) after "
                f"{shown} without hearing from it")
        if opts is None:
            out.append(informational(client.name, f"{what} (no --source-config given)", frames,
                                     observed=shown))
            continue
        timeout = opts.ume_store_activity_timeout / 1000
        if silence < timeout - SLACK:
            out.append(failed(client.name, what, frames,
                              expected=f">= {timeout * 1000:.0f} ms (ume_store_activity_timeout)",
                              observed=shown))
        else:
            out.append(passed(client.name, f"{len(judged)} re-registration(s) with a silent "
                                           f"store, the soonest after {shown} (timeout "
                                           f"{timeout * 1000:.0f} ms)", frames))
    return out
