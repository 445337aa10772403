"""RPP suite (``--suite rpp``): every receiver-paced persistence rule, for every IUT role.

The guide's chapter "Receiver-paced Persistence Operations" ("RPP Registration", "RPP Normal
Operations", "Late Registering Receiver", "Early Exiting Receiver", "RPP Deregistration",
"Implementing RPP") and docs/semantics.md §1.13, §1.14, §2.1, §2.2.  The rules themselves are
not re-typed here: the cases are generated from, and compute their expectations with, the
tables and checks of :mod:`reference_impl.rpp` (:data:`~reference_impl.rpp.OVERRIDES`,
:func:`~reference_impl.rpp.effective_values`, :func:`~reference_impl.rpp.source_options`,
:func:`~reference_impl.rpp.receiver_options`).  How the values travel (one EXTOPT
configuration option per value after the PREG) is docs/wire-lbmc.md §2.3.

**Store IUT** (``RPP-STORE-NNN``; the harness plays RPP sources and receivers with Scapy
packets): every override accepted at the topic's maximum and refused (code 6, ECONFIG) above
it; ack on reception where the topic does not allow it and the disk-only overrides on a memory
topic refused; each consistency rule; every re-registration refusal; garbled options and
contradictory flags refused while the store goes on serving an existing source and receiver;
stability withheld once less than one flight size (bytes) of room is left and resumed after
consumption; acknowledgement on reception; release only after every blocking receiver
consumed; non-blocking receivers that never consume; late registering and early exiting
receivers; receiver and source deregistration.

What a black box shows and what it does not:

* *room*: the cases fill a repository with messages of a known payload size (RPP sizes count
  the payload only, §1.13) and compute, with the effective values, which messages leave at
  least one flight size (bytes) of room below the size limit; no message is sent whose room
  would equal the flight size exactly, so "at least one flight size" and "more than one" give
  the same expectation;
* *released*: a message a store no longer holds is one it does not retransmit (an RXREQ
  answered within half a second is "held", none is "released"); a store that releases later
  than the moment the rule allows is not distinguishable from a slow one, so release is judged
  half a second after the consumption that allows it;
* *acknowledged on reception*: the stability ACK comes (memory), and for a disk topic with a
  long write delay it comes long before the delay ends; whether the message was written to
  disk is not visible on the wire;
* *write delay skips the disk*: only a store's own statistics show it; with a profile that
  gives the store a web monitor (``web_monitor = true``, the reference store's profile) the
  case reads its JSON count of skipped disk writes, without one that part is noted, not
  judged (the stability ACK right after the consumption is judged either way).

**Source IUT** (``SRC-RPP-NNN``; the harness plays the store with
:class:`~conformance.store_peer.HarnessStore`, which records every PREG): the PREG carries the
RPP flag and exactly the source's non-zero overrides, again on re-registration; a source
refused with code 6 does not send.

**Receiver IUT** (``RCV-RPP-NNN``): a blocking receiver's PREG has the RPP flag and no mode
option, a non-blocking one's the flag and ``ume_receiver_paced_persistence 2``; a deregistering
receiver sends a PREG with the D flag to each store and acknowledges nothing after it.

*Choices where the guide is silent*, each applied by a case below: a refusal is an error-coded
PREG_RESP with code 6 (ECONFIG, "source and store configuration incompatible"); the late
registering receiver's low sequence number is the next message (``current`` profile, §1.14) or
the oldest message not consumed by every receiver (``guide-5.3`` profile: the guide's "Late
Joining receivers can always start at the current message retained by the repository"); a
deregistered source's messages are gone when a receiver's RXREQ for them goes unanswered.
"""

from __future__ import annotations

import functools
import json
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conformance.context import CaseContext
from conformance.model import Role, Unsupported, case
from conformance.net import has
from conformance.packets import LBMC_Extopt
from conformance.peers import HarnessReceiver, HarnessSource
from conformance.store_peer import HarnessStore
from conformance.suites.source import FAST_REGISTRATION
from reference_impl import rpp
from wire.lbmc import (
    CFGOPT_SUBTYPE,
    AckType,
    CfgOpt,
    CfgScope,
    PregError,
    UmeAck,
    UmePreg,
    UmePregResp,
)

SUITE = "rpp"

S_REGISTRATION = "RPP Registration"
S_NORMAL = "RPP Normal Operations"
S_LATE = "Late Registering Receiver"
S_EARLY = "Early Exiting Receiver"
S_DEREGISTRATION = "RPP Deregistration"
S_IMPLEMENTING = "Implementing RPP"

ALLOW = {"repository-allow-receiver-paced-persistence": 1}

# --- topics ----------------------------------------------------------------------------------

LIMITS_DISK: dict[str, str | int] = {
    **ALLOW, "repository-type": "disk",
    "source-flight-size-bytes-maximum": 4096, "repository-disk-write-delay": 500,
    "repository-allow-ack-on-reception": 1, "repository-size-threshold": 65536,
    "repository-size-limit": 131072, "repository-disk-file-size-limit": 1 << 20}
"""A disk topic with every RPP maximum set (all consistent: threshold > flight size, limit
below 90 % of the file limit): the override and consistency cases share it (one IUT)."""

LIMITS_MEMORY: dict[str, str | int] = {
    k: v for k, v in LIMITS_DISK.items()
    if k not in ("repository-type", "repository-disk-write-delay",
                 "repository-disk-file-size-limit")} | {
    "repository-type": "memory", "repository-allow-ack-on-reception": 0}
"""The same maxima on a memory topic that does not allow ack on reception."""

SMALL: dict[str, str | int] = {
    **ALLOW, "source-flight-size-bytes-maximum": 1000,
    "repository-size-threshold": 2000, "repository-size-limit": 4000}
"""A (memory, the harness's base type) topic a few dozen small messages fill: the
withholding cases."""

EARLY: dict[str, str | int] = {**SMALL, "source-check-interval": 100}
""":data:`SMALL`, checking client activity every 100 ms (the early exiting receiver)."""

ROOMY: dict[str, str | int] = dict(ALLOW)
"""An RPP topic far from any limit (the harness's base topic: memory, large sizes)."""

PAYLOAD = 128
"""Payload bytes of every message the withholding cases send."""


# --- small helpers -----------------------------------------------------------------------------


CaseFn = Callable[[CaseContext], None]


def _case(case_id: str, **spec: Any) -> Callable[[CaseFn], CaseFn]:
    """:func:`~conformance.model.case`, the check ``unsupported`` against an IUT whose profile
    is ``pre-5.3``: such a product knows no RPP (what it does with RPP clients is the
    compatibility matrix's, ``--suite rpp-matrix``)."""
    def register(fn: CaseFn) -> CaseFn:
        @functools.wraps(fn)
        def run(h: CaseContext) -> None:
            if h.iut_version == "pre-5.3":
                raise Unsupported("the profile's version is pre-5.3, which knows no RPP")
            fn(h)
        return case(case_id, **spec)(run)
    return register



def _opt(name: str, value: int | str) -> CfgOpt:
    """A source's override, as it travels."""
    return CfgOpt(CfgScope.SOURCE, name, str(value))


def _granted(h: CaseContext, resp: Any, who: str, *, rpp_mode: bool = True) -> None:
    """Granted, and (for an RPP registration) with RPP acknowledged in the response."""
    h.check(not resp.e_flag, f"the store refused {who} (error code {resp.error_code})",
            expected="PREG_RESP without the E (error) flag", observed=repr(resp))
    if rpp_mode:
        h.check(bool(resp.w_flag), f"the store granted {who} without acknowledging RPP mode",
                expected="PREG_RESP with the RPP flag (\"The repository's registration "
                         "response to both a source and a receiver acknowledges RPP mode\")",
                observed=repr(resp))


def _refused(h: CaseContext, resp: Any, who: str) -> None:
    """Refused with code 6 (ECONFIG), the store's "configuration incompatible" answer."""
    h.check(bool(resp.e_flag), f"the store granted {who}",
            expected=f"PREG_RESP with the E flag and code {int(PregError.ECONFIG)} (ECONFIG)",
            observed=repr(resp))
    h.check(resp.error_code == PregError.ECONFIG,
            f"the store refused {who} with another code than ECONFIG",
            expected=f"error code {int(PregError.ECONFIG)} (ECONFIG)", observed=resp.error_code)


def _rpp_source(h: CaseContext, name: str = "source",
                options: Sequence[CfgOpt] = ()) -> HarnessSource:
    src = h.source(name)
    _granted(h, src.register(reg_id=0, rpp=True, options=options), f"RPP {name}")
    return src


def _receiver(h: CaseContext, src: HarnessSource, name: str = "receiver",
              mode: int = rpp.BLOCKING, **preg: Any) -> HarnessReceiver:
    rcv = h.receiver(src, name)
    resp = rcv.register(reg_id=0, rpp=True, options=rpp.receiver_options(mode), **preg)
    _granted(h, resp, f"{name} ({'non-blocking' if mode == rpp.NON_BLOCKING else 'blocking'})")
    return rcv


def _send(src: HarnessSource, sqns: Sequence[int], size: int = PAYLOAD) -> None:
    """Data messages with ``size``-byte payloads on the source's transport."""
    links = src.store_links()
    for sqn in sqns:
        body = f"{src.topic} #{sqn} ".encode().ljust(size, b".")[:size]
        for link in links:
            link.send(src.data(sqn, body))


def _stable(src: HarnessSource) -> int | None:
    """The highest sequence number the store acknowledged as stable to ``src`` (None: none)."""
    if src.link is None:
        return None
    acked = [hd.seqnum for m in list(src.link.received) for hd in m.headers
             if isinstance(hd, UmeAck) and hd.type == AckType.STABLE]
    return max(acked) if acked else None


def _stable_at_least(src: HarnessSource, sqn: int) -> bool:
    """Whether the store acknowledged ``sqn`` (or later) as stable to ``src``."""
    high = _stable(src)
    return high is not None and high >= sqn


def _stable_reaches(src: HarnessSource, sqn: int) -> Callable[[], bool]:
    return lambda: _stable_at_least(src, sqn)


def _served(rcv: HarnessReceiver, sqn: int, timeout: float, h: CaseContext) -> bool:
    """Ask the store for ``sqn`` and say whether a retransmission came within ``timeout``."""
    link = rcv.connect()
    before = sum(1 for m in list(link.received) if m.is_data_type and m.sqn == sqn)
    rcv.rxreq(sqn)
    return h.wait_until(
        lambda: sum(1 for m in list(link.received) if m.is_data_type and m.sqn == sqn) > before,
        timeout, f"a retransmission of {sqn} to {rcv.name}")


def _roomy(limit: int, flight: int, count: int, size: int = PAYLOAD) -> int:
    """The last of ``count`` messages after which at least ``flight`` bytes of the size
    ``limit`` are left (-1: none); the case sizes must never hit the boundary exactly."""
    assert all(limit - size * (i + 1) != flight for i in range(count)), "boundary message"
    return max((i for i in range(count) if limit - size * (i + 1) >= flight), default=-1)


def _effective(topic: dict[str, str | int], options: Sequence[CfgOpt]) -> rpp.RppValues:
    """The values the store must apply (the rules module, over the topic's values)."""
    policy = {o.policy_field: int(topic.get(o.store_option, 0)) for o in rpp.OVERRIDES}
    view = type("Policy", (), policy)()
    return rpp.effective_values(view, rpp.requested_overrides(options),
                                disk=topic.get("repository-type") == "disk")


# --- store: overrides ----------------------------------------------------------------------


def _maximum(topic: dict[str, str | int], override: rpp.Override) -> int:
    return int(topic[override.store_option])


def _override_case(number: int, override: rpp.Override) -> None:
    above = "asked for where the topic allows it" if override.flag else \
        "accepted at the topic's maximum and refused above it"

    @_case(f"RPP-STORE-{number:03d}", suite=SUITE, role=Role.STORE,
          title=f"Override {override.option}: {above}",
          section=S_IMPLEMENTING, topic_options=LIMITS_DISK,
          requirement="Sources can reconfigure the repository's source-flight-size-bytes-"
                      "maximum to a value less than or equal to the maximum ... The source can "
                      "reconfigure the repository's options with values less than or equal to "
                      "the maximum configured for the repository ... If the repository has "
                      "repository-allow-ack-on-reception enabled (1), the source can choose to "
                      "keep it enabled or turn it off.")
    def run(h: CaseContext) -> None:
        top = _maximum(LIMITS_DISK, override)
        if override.flag:
            _rpp_source(h, "source asking 1", [_opt(override.option, 1)])
            return
        _rpp_source(h, f"source asking {top}", [_opt(override.option, top)])
        src = h.source(f"source asking {top + 1}")
        resp = src.register(reg_id=0, rpp=True, options=[_opt(override.option, top + 1)])
        _refused(h, resp, f"an RPP source asking {override.option} {top + 1} (the topic's "
                          f"{override.store_option} is {top})")

    run.__doc__ = (f"Disk topic with {override.store_option} {_maximum(LIMITS_DISK, override)}: "
                   + ("an RPP source asking 1 is granted with RPP acknowledged."
                      if override.flag else
                      "an RPP source asking exactly that is granted (RPP acknowledged), one "
                      "asking one more is refused with code 6."))


for _n, _o in enumerate(rpp.OVERRIDES, start=1):
    _override_case(_n, _o)


@_case("RPP-STORE-007", suite=SUITE, role=Role.STORE,
      title="ume_repository_ack_on_reception 1 is refused where the topic does not allow it",
      section=S_IMPLEMENTING, topic_options=LIMITS_MEMORY,
      requirement="If the repository has repository-allow-ack-on-reception disabled (0), the "
                  "source cannot turn it on.")
def ack_on_reception_not_allowed(h: CaseContext) -> None:
    """Topic with ``repository-allow-ack-on-reception 0``: a source asking 1 is refused with
    code 6; asking 0 (the store's value) is granted."""
    option = next(o.option for o in rpp.OVERRIDES if o.flag)
    _rpp_source(h, "source asking 0", [_opt(option, 0)])
    src = h.source("source asking 1")
    _refused(h, src.register(reg_id=0, rpp=True, options=[_opt(option, 1)]),
             f"an RPP source asking {option} 1 on a topic that does not allow it")


def _disk_only_case(number: int, override: rpp.Override) -> None:
    @_case(f"RPP-STORE-{number:03d}", suite=SUITE, role=Role.STORE,
          title=f"Override {override.option} (disk repositories only) is refused on a memory "
                f"topic",
          section=S_IMPLEMENTING, topic_options=LIMITS_MEMORY,
          requirement="If the repository is a disk repository (repository-type = disk or "
                      "reduced-fd), set the maximum write delay with the repository option, "
                      "repository-disk-write-delay ... ume_repository_disk_file_size_limit: the "
                      "disk options exist for disk repositories only (docs/semantics.md §2.2).")
    def run(h: CaseContext) -> None:
        src = h.source()
        _refused(h, src.register(reg_id=0, rpp=True, options=[_opt(override.option, 1000)]),
                 f"an RPP source asking {override.option} 1000 on a memory topic")

    run.__doc__ = (f"A memory topic: an RPP source asking {override.option} 1000 is refused "
                   f"with code 6 (the option has no meaning without a disk repository).")


for _n, _o in enumerate((o for o in rpp.OVERRIDES if o.disk_only), start=8):
    _disk_only_case(_n, _o)


# --- store: consistency -----------------------------------------------------------------------

_CONSISTENCY = "The effective values must also be consistent: threshold not above limit, " \
    "limit not above 90 % of the disk file limit, and threshold above the flight size in " \
    "bytes (docs/semantics.md §2.2; the guide: the store does not send stability " \
    "acknowledgements if new messages would exceed the available space)."


def _consistency(h: CaseContext, bad: list[CfgOpt], good: list[CfgOpt], what: str) -> None:
    """``good`` (consistent, a control) is granted; ``bad`` is refused with code 6.  Both
    are checked against the rules module first, so the case and the rules cannot drift."""
    try:
        _effective(LIMITS_DISK, bad)
    except rpp.RppRefused:
        pass
    else:
        raise AssertionError(f"the rules module accepts {bad}")
    _effective(LIMITS_DISK, good)
    _rpp_source(h, "consistent source", good)
    src = h.source("inconsistent source")
    _refused(h, src.register(reg_id=0, rpp=True, options=bad), f"an RPP source whose {what}")


@_case("RPP-STORE-010", suite=SUITE, role=Role.STORE,
      title="A size threshold above the size limit is refused",
      section=S_IMPLEMENTING, topic_options=LIMITS_DISK, requirement=_CONSISTENCY)
def threshold_above_limit(h: CaseContext) -> None:
    """Both values below the topic's maxima, the threshold above the limit: refused; the same
    threshold with a limit above it: granted."""
    _consistency(h, [_opt("ume_repository_size_threshold", 40000),
                     _opt("ume_repository_size_limit", 30000)],
                 [_opt("ume_repository_size_threshold", 30000),
                  _opt("ume_repository_size_limit", 40000)],
                 "size threshold 40000 is above its size limit 30000")


@_case("RPP-STORE-011", suite=SUITE, role=Role.STORE,
      title="On a disk topic, a size limit above 90% of the disk file size limit is refused",
      section=S_IMPLEMENTING, topic_options=LIMITS_DISK, requirement=_CONSISTENCY)
def limit_above_file_share(h: CaseContext) -> None:
    """Size limit 131072 (the topic's): a disk file limit of 131072 leaves it above 90 %
    (refused); 145636 puts 90 % just above it (granted)."""
    _consistency(h, [_opt("ume_repository_disk_file_size_limit", 131072)],
                 [_opt("ume_repository_disk_file_size_limit", 145636)],
                 "size limit 131072 is above 90% of its disk file size limit 131072")


@_case("RPP-STORE-012", suite=SUITE, role=Role.STORE,
      title="A size threshold not above the flight size in bytes is refused",
      section=S_IMPLEMENTING, topic_options=LIMITS_DISK, requirement=_CONSISTENCY)
def threshold_not_above_flight(h: CaseContext) -> None:
    """Flight size 4096 bytes (the topic's maximum): a threshold of 4096 is refused, 4097 is
    granted (the store must hold one whole flight above its threshold)."""
    _consistency(h, [_opt("ume_repository_size_threshold", 4096)],
                 [_opt("ume_repository_size_threshold", 4097)],
                 "size threshold 4096 is not above its flight size of 4096 bytes")


# --- store: re-registration -----------------------------------------------------------------

_REREG = "Re-registration must request same configuration options or the store rejects the " \
    "request ... the source determines the repository's behavior for new registrations " \
    "(a source or receiver may not switch between SPP and RPP, a receiver not between " \
    "blocking and non-blocking: docs/semantics.md §2.1)."


def _again(h: CaseContext, client: HarnessSource | HarnessReceiver, **preg: Any) -> Any:
    """The client's connection ends (as when it restarts) and it registers again with its
    RegID."""
    if client.link is not None:
        client.link.close()
    return client.register(reg_id=client.reg_id, **preg)


@_case("RPP-STORE-013", suite=SUITE, role=Role.STORE,
      title="An SPP source re-registering as RPP is refused",
      section=S_REGISTRATION, topic_options=ROOMY, requirement=_REREG)
def spp_source_becomes_rpp(h: CaseContext) -> None:
    src = h.source()
    _granted(h, src.register(reg_id=0), "an SPP source", rpp_mode=False)
    _refused(h, _again(h, src, rpp=True), "a previously SPP source re-registering as RPP")


@_case("RPP-STORE-014", suite=SUITE, role=Role.STORE,
      title="An RPP source re-registering as SPP is refused",
      section=S_REGISTRATION, topic_options=ROOMY, requirement=_REREG)
def rpp_source_becomes_spp(h: CaseContext) -> None:
    src = _rpp_source(h)
    _refused(h, _again(h, src, rpp=False), "a previously RPP source re-registering as SPP")


@_case("RPP-STORE-015", suite=SUITE, role=Role.STORE,
      title="An RPP source re-registering with other RPP values is refused, with the same "
            "values granted",
      section=S_REGISTRATION, topic_options=ROOMY, requirement=_REREG)
def rpp_source_changes_values(h: CaseContext) -> None:
    """First registration with flight size 2048 bytes: again with 2048 is granted (OLD),
    with 1024 refused."""
    first = [_opt("ume_flight_size_bytes", 2048)]
    src = _rpp_source(h, options=first)
    resp = _again(h, src, rpp=True, options=first)
    _granted(h, resp, "the RPP source re-registering with the same values")
    h.check(bool(resp.o_flag), "the re-registration was not answered as an old client",
            expected="O flag set", observed=repr(resp))
    _refused(h, _again(h, src, rpp=True, options=[_opt("ume_flight_size_bytes", 1024)]),
             "the RPP source re-registering with ume_flight_size_bytes 1024 (first 2048)")


def _receiver_switch(number: int, first: int, then: int) -> None:
    names = {rpp.SPP: "SPP", rpp.BLOCKING: "blocking RPP", rpp.NON_BLOCKING: "non-blocking RPP"}

    @_case(f"RPP-STORE-{number:03d}", suite=SUITE, role=Role.STORE,
          title=f"A {names[first]} receiver re-registering as {names[then]} is refused",
          section=S_REGISTRATION, topic_options=ROOMY, requirement=_REREG)
    def run(h: CaseContext) -> None:
        spp_source = rpp.SPP in (first, then) and first == rpp.SPP
        src = h.source()
        _granted(h, src.register(reg_id=0, rpp=not spp_source),
                 "the source", rpp_mode=not spp_source)
        rcv = h.receiver(src)
        resp = rcv.register(reg_id=0, rpp=first != rpp.SPP, options=rpp.receiver_options(first))
        _granted(h, resp, f"a {names[first]} receiver", rpp_mode=first != rpp.SPP)
        same = _again(h, rcv, rpp=first != rpp.SPP, options=rpp.receiver_options(first))
        _granted(h, same, f"the {names[first]} receiver again", rpp_mode=first != rpp.SPP)
        _refused(h, _again(h, rcv, rpp=then != rpp.SPP, options=rpp.receiver_options(then)),
                 f"a previously {names[first]} receiver re-registering as {names[then]}")

    run.__doc__ = (f"A receiver registers {names[first]} (of an "
                   f"{'SPP' if first == rpp.SPP else 'RPP'} source), again the same way "
                   f"(granted), then as {names[then]}: refused with code 6.")


for _n, (_a, _b) in enumerate(((rpp.BLOCKING, rpp.SPP), (rpp.SPP, rpp.BLOCKING),
                               (rpp.BLOCKING, rpp.NON_BLOCKING),
                               (rpp.NON_BLOCKING, rpp.BLOCKING)), start=16):
    _receiver_switch(_n, _a, _b)


# --- store: garbled options and contradictory flags ----------------------------------------


@dataclass(frozen=True)
class Garbled:
    """A registration the store must refuse without harm to anyone else.

    Attributes:
        title: what is wrong with it.
        receiver: a receiver's PREG (else a new source's).
        rpp_flag: the PREG's RPP flag.
        options: its configuration options (a :class:`CfgOpt`, or raw EXTOPT data bytes for
            an option that is not a whole CFGOPT).
    """

    title: str
    receiver: bool
    rpp_flag: bool
    options: tuple[CfgOpt | bytes, ...]


GARBLED: tuple[Garbled, ...] = (
    Garbled("an unknown RPP source option name", False, True,
            (_opt("ume_flight_size_bites", 1000),)),
    Garbled("an override value that is not a decimal integer", False, True,
            (_opt("ume_flight_size_bytes", "1e3"),)),
    Garbled("an override given twice", False, True,
            (_opt("ume_flight_size_bytes", 1000), _opt("ume_flight_size_bytes", 2000))),
    Garbled("a configuration option that is not whole (its value has no NUL)", False, True,
            (b"\x01\x00ume_flight_size_bytes\x001000",)),
    Garbled("overrides on a registration without the RPP flag", False, False,
            (_opt("ume_flight_size_bytes", 1000),)),
    Garbled("a receiver mode other than 1 or 2", True, True,
            (CfgOpt(CfgScope.RECEIVER, rpp.RPP_OPTION, "3"),)),
    Garbled("a non-blocking receiver mode without the RPP flag", True, False,
            (CfgOpt(CfgScope.RECEIVER, rpp.RPP_OPTION, str(rpp.NON_BLOCKING)),)),
)
"""The garbled and contradictory registrations, one case each (the rules module's list)."""


def _garbled_case(number: int, bad: Garbled) -> None:
    @_case(f"RPP-STORE-{number:03d}", suite=SUITE, role=Role.STORE,
          title=f"A registration with {bad.title} is refused; the store serves others on",
          section=S_REGISTRATION, topic_options=ROOMY,
          requirement="A source registration request includes ... designation of a RPP topic "
                       "... reconfigured repository configuration option values; receiver "
                       "registration request includes its designation as a RPP receiver: a "
                       "registration whose RPP designation or options cannot be understood is "
                       "refused (code 6, docs/semantics.md §2.1), and nothing is lost for the "
                       "store's other clients.")
    def run(h: CaseContext) -> None:
        src = _rpp_source(h, "existing source")
        rcv = _receiver(h, src, "existing receiver")
        _send(src, [0])
        h.check(h.wait_until(_stable_reaches(src, 0), 2.0, "stability of 0"),
                "the store did not acknowledge the existing source's message 0",
                expected="a stability ACK for 0", observed=_stable(src))
        if bad.receiver:
            other = h.receiver(src, "garbled receiver")
            pkt = other.preg(reg_id=0, rpp=bad.rpp_flag)
            link = other.connect()
        else:
            other_src = h.source("garbled source")
            pkt = other_src.preg(reg_id=0, rpp=bad.rpp_flag)
            link = other_src.connect()
        for option in bad.options:
            if isinstance(option, CfgOpt):
                header = option.header()
                pkt = pkt / LBMC_Extopt(subtype=header.subtype, data=header.data)
            else:
                pkt = pkt / LBMC_Extopt(subtype=CFGOPT_SUBTYPE, data=option)
        h.note(f"a registration with {bad.title}")
        link.send(pkt)
        resp = link.expect(has(UmePregResp), h.scaled(3.0), "PREG_RESP").header(UmePregResp)
        assert resp is not None
        _refused(h, resp, f"a registration with {bad.title}")
        _send(src, [1])
        h.check(h.wait_until(_stable_reaches(src, 1), 2.0, "stability of 1"),
                "after the refusal the store no longer acknowledges the existing source",
                expected="a stability ACK for 1", observed=_stable(src))
        h.check(_served(rcv, 0, 2.0, h) and _served(rcv, 1, 2.0, h),
                "after the refusal the store no longer serves the existing receiver",
                expected="retransmissions of 0 and 1", observed="none")

    run.__doc__ = (f"An RPP source and a blocking receiver are served (message 0 stable); "
                   f"a new {'receiver' if bad.receiver else 'source'} registers with "
                   f"{bad.title}: refused with code 6; the source's message 1 is still "
                   f"acknowledged and the receiver still gets 0 and 1 retransmitted.")


for _n, _g in enumerate(GARBLED, start=20):
    _garbled_case(_n, _g)


# --- store: stability withheld until one flight size of room ------------------------------


def _withheld(h: CaseContext, options: Sequence[CfgOpt], count: int) -> None:
    """An RPP source with ``options`` on :data:`SMALL`, a blocking receiver that consumes
    nothing, ``count`` messages of :data:`PAYLOAD` bytes: stability ACKs exactly while at
    least one flight size (bytes) of room is left, none after; after the receiver's
    consumption ACK, the withheld ones come."""
    values = _effective(SMALL, options)
    last = _roomy(values.size_limit, values.flight_size_bytes, count)
    h.note(f"effective flight size {values.flight_size_bytes} bytes, size limit "
           f"{values.size_limit}: messages 0..{last} leave at least one flight of room, "
           f"{last + 1}..{count - 1} do not")
    assert 0 <= last < count - 1 and count * PAYLOAD <= values.size_limit
    src = _rpp_source(h, options=options)
    rcv = _receiver(h, src)
    _send(src, range(count))
    h.wait_until(_stable_reaches(src, last), 3.0, f"stability ACKs up to {last}")
    h.wait_until(_stable_reaches(src, last + 1), 0.5, "a stability ACK past the room "
                 "(must not come)")
    h.check(_stable_at_least(src, last),
            "the store stopped acknowledging while at least one flight size of room was left",
            expected=f"stability ACKs up to {last}", observed=f"up to {_stable(src)}")
    h.check(_stable(src) == last,
            "the store acknowledged a message that left less than one flight size of room",
            expected=f"no stability ACK past {last} before the receiver consumes",
            observed=f"up to {_stable(src)}")
    rcv.ack(count - 1)
    h.wait_until(_stable_reaches(src, count - 1), 3.0, "the withheld stability ACKs")
    h.check(_stable_at_least(src, count - 1),
            "the store did not resume acknowledging after the receiver consumed everything",
            expected=f"stability ACKs up to {count - 1}", observed=f"up to {_stable(src)}")


_ROOM = "The store uses the source's flight size (bytes) to regulate the source's speed, by " \
    "withholding stability acknowledgements if the repository does not have at least one " \
    "flight size available ... A lack of available space in the repository blocks the " \
    "source until the repository reclaims the necessary storage space and sends a stability " \
    "acknowledgement."


@_case("RPP-STORE-030", suite=SUITE, role=Role.STORE,
      title="Stability is withheld once less than one flight size of room is left, and "
            "resumes after consumption",
      section=S_NORMAL, topic_options=SMALL, requirement=_ROOM)
def withheld_topic_values(h: CaseContext) -> None:
    """Size limit 4000, flight size 1000 bytes (the topic's), 29 messages of 128 bytes, a
    blocking receiver that consumes nothing until the end: ACKs for 0..22 only; after it
    consumes 28, ACKs up to 28."""
    _withheld(h, [], 29)


@_case("RPP-STORE-031", suite=SUITE, role=Role.STORE,
      title="The withholding uses the source's lower ume_flight_size_bytes",
      section=S_NORMAL, topic_options=SMALL, requirement=_ROOM)
def withheld_flight_override(h: CaseContext) -> None:
    """As RPP-STORE-030 with the source's flight size 500 bytes: ACKs for 0..26 (a store
    applying its own 1000 stops at 22)."""
    _withheld(h, [_opt("ume_flight_size_bytes", 500)], 29)


@_case("RPP-STORE-032", suite=SUITE, role=Role.STORE,
      title="The withholding uses the source's lower ume_repository_size_limit",
      section=S_NORMAL, topic_options=SMALL, requirement=_ROOM)
def withheld_limit_override(h: CaseContext) -> None:
    """As RPP-STORE-030 with the source's size limit 3000: 20 messages, ACKs for 0..14 (a
    store applying its own 4000 acknowledges them all)."""
    _withheld(h, [_opt("ume_repository_size_limit", 3000)], 20)


# --- store: acknowledgement on reception ---------------------------------------------------


@_case("RPP-STORE-033", suite=SUITE, role=Role.STORE,
      title="A memory RPP repository acknowledges on reception, before any consumption",
      section=S_NORMAL, topic_options=ROOMY,
      requirement="Memory repositories send the stability notice upon reception.")
def memory_acks_on_reception(h: CaseContext) -> None:
    """A blocking receiver that consumes nothing: messages 0..4 are still acknowledged at
    once (the repository has room; stability is not consumption)."""
    src = _rpp_source(h)
    _receiver(h, src)
    _send(src, range(5))
    h.check(h.wait_until(_stable_reaches(src, 4), 3.0, "stability ACKs for 0..4"),
            "the memory repository did not acknowledge on reception",
            expected="stability ACKs for 0..4 within 3 s", observed=f"up to {_stable(src)}")


DISK_DELAY: dict[str, str | int] = {
    **ALLOW, "repository-type": "disk", "repository-allow-ack-on-reception": 1,
    "repository-disk-write-delay": 10000, "source-flight-size-bytes-maximum": 4096,
    "repository-size-threshold": 65536,
    "repository-size-limit": 131072, "repository-disk-file-size-limit": 1 << 20}


@_case("RPP-STORE-034", suite=SUITE, role=Role.STORE,
      title="A disk repository with ack on reception acknowledges at once, not after its "
            "write delay",
      section=S_NORMAL, topic_options=DISK_DELAY,
      requirement="Acknowledge on Reception - If you configure the repository for "
                  "repository-allow-ack-on-reception and the source also sets "
                  "ume_repository_ack_on_reception, the repository sends a stability "
                  "acknowledgement to the source immediately upon reception.")
def disk_ack_on_reception(h: CaseContext) -> None:
    """Disk topic, write delay 10 s, ack on reception allowed; the source asks for it and a
    blocking receiver consumes nothing: the ACKs for 0..4 must come within 3 s (a store
    acknowledging after the write would take 10 s).  Whether the message reaches the disk
    is not visible on the wire and not judged."""
    src = _rpp_source(h, options=[_opt("ume_repository_ack_on_reception", 1)])
    _receiver(h, src)
    _send(src, range(5))
    h.check(h.wait_until(_stable_reaches(src, 4), 3.0, "stability ACKs for 0..4"),
            "the disk repository did not acknowledge on reception",
            expected="stability ACKs for 0..4 within 3 s (write delay 10 s)",
            observed=f"up to {_stable(src)}")


@_case("RPP-STORE-035", suite=SUITE, role=Role.STORE,
       title="Within the write delay, a message every receiver consumed is acknowledged at "
             "once (and never written)",
       section=S_NORMAL, topic_options=DISK_DELAY,
       requirement="Receiver Acknowledgement - If a repository receives acknowledgements from "
                   "all receivers before writing the message to disk, it immediately sends a "
                   "stability acknowledgement to the source. If the disk write has not already "
                   "been initiated, UMP does not write the message to disk ... Write Delay ... "
                   "eliminating the need to persist the message to disk.")
def write_delay_skips_disk(h: CaseContext) -> None:
    """Disk topic, write delay 10 s, no ack on reception: messages 0..4 with a blocking
    receiver are not acknowledged for 0.7 s (a disk repository acknowledges once written, and
    the delay holds the write); the receiver consumes 4: the ACKs for 0..4 come at once.
    That the messages then never reach the disk is visible only in the store's statistics:
    judged when the profile gives the store a web monitor whose JSON source page counts
    skipped disk writes (``disk_writes_skipped``, the reference store's: 5), otherwise noted
    as not observable."""
    src = _rpp_source(h)
    rcv = _receiver(h, src)
    _send(src, range(5))
    h.wait_until(_stable_reaches(src, 0), 0.7, "a stability ACK before the write (must not "
                 "come)")
    h.check(_stable(src) is None, "the disk repository acknowledged a message neither written "
            "(write delay 10 s) nor consumed", expected="no stability ACK before consumption",
            observed=f"ACKs up to {_stable(src)}")
    rcv.ack(4)
    h.check(h.wait_until(_stable_reaches(src, 4), 3.0, "stability ACKs after consumption"),
            "the store did not acknowledge at once what every receiver consumed before its "
            "write", expected="stability ACKs for 0..4 within 3 s of the consumption",
            observed=f"up to {_stable(src)}")
    skipped = _disk_writes_skipped(h, src)
    if skipped is not None:
        h.check(skipped >= 5, "the store wrote messages to disk that every receiver consumed "
                "within the write delay", expected="5 disk writes skipped (web monitor JSON "
                "disk_writes_skipped)", observed=skipped)


def _disk_writes_skipped(h: CaseContext, src: HarnessSource) -> int | None:
    """The store's count of skipped disk writes for ``src`` from its web monitor's JSON source
    page (``/stores/0/<regid>?format=json``, key ``disk_writes_skipped``); None, with a note,
    when the harness reaches no web monitor or the page has no such count."""
    monitor = h.web_monitor
    if monitor is None:
        h.note("not judged: whether the messages were written (the profile gives no web "
               "monitor; the wire does not show disk writes)")
        return None
    url = f"http://{monitor[0]}:{monitor[1]}/stores/0/{src.reg_id}?format=json"
    try:
        with urllib.request.urlopen(url, timeout=h.scaled(2.0)) as reply:
            page = json.loads(reply.read())
    except (OSError, ValueError) as exc:
        h.note(f"not judged: the web monitor's {url} gave no JSON ({exc})")
        return None
    value = page.get("disk_writes_skipped") if isinstance(page, dict) else None
    if not isinstance(value, int):
        h.note(f"not judged: the web monitor's {url} shows no disk_writes_skipped count")
        return None
    h.note(f"web monitor: {value} disk write(s) skipped")
    return value


# --- store: release, non-blocking, late and early receivers, deregistration -----------------


@_case("RPP-STORE-036", suite=SUITE, role=Role.STORE,
      title="A message is released only after every blocking receiver consumed it",
      section=S_NORMAL, topic_options=ROOMY,
      requirement="The repository retains RPP messages until all RPP receivers acknowledge "
                  "consumption. The repository maintains an accurate count of all RPP "
                  "receivers.")
def released_after_every_blocking(h: CaseContext) -> None:
    """Two blocking receivers; messages 0..4; A consumes 4: B's RXREQs for 0..4 are still
    answered.  B consumes 4: half a second later nobody gets 2 any more (released)."""
    src = _rpp_source(h)
    a, b = _receiver(h, src, "receiver A"), _receiver(h, src, "receiver B")
    _send(src, range(5))
    h.wait_until(_stable_reaches(src, 4), 2.0, "stability of 0..4")
    a.ack(4)
    h.wait_until(lambda: False, 0.3, "the store taking A's consumption")
    # the first message not served decides (a store that released them all would otherwise
    # cost a wait per message)
    missing = next((sqn for sqn in range(5) if not _served(b, sqn, 2.0, h)), None)
    h.check(missing is None, "the store released messages receiver B had not consumed",
            expected="retransmissions of 0..4 to B after only A consumed them",
            observed=f"{missing} not served")
    b.ack(4)
    h.wait_until(lambda: False, 0.5, "the store releasing 0..4")
    h.check(not _served(a, 2, 0.5, h), "the store still holds a message every blocking "
            "receiver consumed", expected="no retransmission of 2 after A and B consumed 4",
            observed="retransmitted")


@_case("RPP-STORE-037", suite=SUITE, role=Role.STORE,
      title="A non-blocking receiver that never consumes does not hold back stability",
      section=S_NORMAL, topic_options=SMALL,
      requirement="ume_receiver_paced_persistence 2: a non-blocking RPP receiver; only "
                  "blocking receivers' consumption keeps messages, so a non-blocking receiver "
                  "can be overrun (docs/semantics.md §1.13).")
def non_blocking_overrun(h: CaseContext) -> None:
    """Size limit 4000, flight 1000 bytes, one non-blocking receiver that consumes nothing:
    40 messages of 128 bytes (5120 bytes, beyond the limit) are all acknowledged."""
    src = _rpp_source(h)
    _receiver(h, src, mode=rpp.NON_BLOCKING)
    _send(src, range(40))
    h.check(h.wait_until(_stable_reaches(src, 39), 3.0, "stability ACKs for 0..39"),
            "the store withheld stability for a non-blocking receiver's sake",
            expected="stability ACKs for all 40 messages", observed=f"up to {_stable(src)}")


@_case("RPP-STORE-038", suite=SUITE, role=Role.STORE,
      title="A late registering receiver starts past the messages sent before it registered "
            "(guide profile: at the oldest unconsumed)",
      section=S_LATE, topic_options=ROOMY,
      requirement="Late joining receivers that register after the first RPP topic message has "
                  "been sent cannot receive any messages sent prior to their registration, "
                  "except for messages not yet consumed by all RPP receivers.")
def late_registering_receiver(h: CaseContext) -> None:
    """Blocking receiver A, messages 0..4, A consumes 0..1; then C registers.  Current
    profile (§1.14: nothing sent before its first registration): C's low sequence number is
    5.  ``guide-5.3`` profile ("Late Joining receivers can always start at the current message
    retained by the repository, defined as the earliest message not consumed by all RPP
    receivers"): 2."""
    src = _rpp_source(h)
    a = _receiver(h, src, "receiver A")
    _send(src, range(5))
    h.wait_until(_stable_reaches(src, 4), 2.0, "stability of 0..4")
    a.ack(1)
    h.wait_until(lambda: False, 0.3, "the store taking A's consumption")
    c = h.receiver(src, "late receiver C")
    resp = c.register(reg_id=0, rpp=True)
    _granted(h, resp, "the late receiver")
    wanted = 2 if h.iut_version == "guide-5.3" else 5
    h.check_equal(resp.low_seqnum, wanted,
                  f"the late receiver's low sequence number ({h.iut_version} profile)")


@_case("RPP-STORE-039", suite=SUITE, role=Role.STORE,
      title="An early exiting receiver holds its messages until its state lifetime ends",
      section=S_EARLY, topic_options=EARLY, timeout=15.0,
      requirement="the repository retains all messages published since the receiver's last "
                  "acknowledged message ... until its receiver state lifetime expires and the "
                  "repository deletes the receiver state information ... the repository also "
                  "deletes all messages being held solely for this receiver.")
def early_exiting_receiver(h: CaseContext) -> None:
    """Size limit 4000, flight 1000 bytes.  Receiver A consumes everything; receiver B
    (activity timeout 300 ms, state lifetime 3 s) consumes nothing and goes away.  29
    messages of 128 bytes: ACKs stop at 22 and stay stopped past B's activity timeout (1 s);
    once its lifetime ended the store releases B's messages and the ACKs come (by 6 s)."""
    src = _rpp_source(h)
    a = _receiver(h, src, "receiver A")
    b = _receiver(h, src, "receiver B", activity_timeout=300, state_lifetime=3000)
    count, last = 29, _roomy(int(SMALL["repository-size-limit"]),
                             int(SMALL["source-flight-size-bytes-maximum"]), 29)
    _send(src, range(count))
    h.wait_until(_stable_reaches(src, last), 3.0, f"stability ACKs up to {last}")
    a.ack(count - 1)
    assert b.link is not None
    b.link.close()
    h.note("receiver B exits without consuming")
    h.wait_until(_stable_reaches(src, last + 1), 1.0,
                 "stability past the room within B's state lifetime (must not come)")
    h.check(_stable(src) == last, "the store released an early exiting receiver's messages "
            "before its state lifetime ended",
            expected=f"no stability ACK past {last} within 1 s (lifetime 3 s)",
            observed=f"up to {_stable(src)}")
    h.wait_until(_stable_reaches(src, count - 1), 6.0, "stability after B's state lifetime")
    h.check(_stable_at_least(src, count - 1), "the store kept the early exiting receiver's "
            "messages after its state lifetime ended",
            expected=f"stability ACKs up to {count - 1}", observed=f"up to {_stable(src)}")


@_case("RPP-STORE-040", suite=SUITE, role=Role.STORE,
      title="A deregistered receiver no longer holds messages back",
      section=S_DEREGISTRATION, topic_options=SMALL,
      requirement="If you deregister a RPP receiver, UMP automatically updates the number of "
                  "receiver acknowledgements required to maintain RPP behavior.")
def receiver_deregistration(h: CaseContext) -> None:
    """Receivers A and B, 29 messages of 128 bytes (size limit 4000, flight 1000): ACKs stop
    at 22; A consumes everything; B deregisters (PREG with the D flag): the withheld ACKs
    come."""
    src = _rpp_source(h)
    a, b = _receiver(h, src, "receiver A"), _receiver(h, src, "receiver B")
    count, last = 29, _roomy(int(SMALL["repository-size-limit"]),
                             int(SMALL["source-flight-size-bytes-maximum"]), 29)
    _send(src, range(count))
    h.wait_until(_stable_reaches(src, last), 3.0, f"stability ACKs up to {last}")
    a.ack(count - 1)
    h.wait_until(_stable_reaches(src, last + 1), 0.5, "stability while B holds (must not come)")
    h.check(_stable(src) == last, "the store acknowledged past the room while receiver B "
            "still held every message", expected=f"no stability ACK past {last}",
            observed=f"up to {_stable(src)}")
    b.link = b.connect()
    b.link.send(b.preg(reg_id=b.reg_id, rpp=True, deregister=True))
    h.note("receiver B deregisters")
    h.wait_until(_stable_reaches(src, count - 1), 3.0, "stability after B deregistered")
    h.check(_stable_at_least(src, count - 1), "the store kept waiting for a deregistered "
            "receiver", expected=f"stability ACKs up to {count - 1}",
            observed=f"up to {_stable(src)}")


@_case("RPP-STORE-041", suite=SUITE, role=Role.STORE,
      title="A deregistering RPP source's messages are deleted",
      section=S_DEREGISTRATION, topic_options=ROOMY,
      requirement="lbm_src_ume_deregistration() also deletes any persisted RPP messages in the "
                  "source's repository.")
def source_deregistration(h: CaseContext) -> None:
    """Messages 0..4, a blocking receiver that consumes nothing gets 2 retransmitted; the
    source deregisters: the receiver's RXREQ for 3 then goes unanswered."""
    src = _rpp_source(h)
    rcv = _receiver(h, src)
    _send(src, range(5))
    h.wait_until(_stable_reaches(src, 4), 2.0, "stability of 0..4")
    h.check(_served(rcv, 2, 2.0, h), "the store did not retransmit a held message",
            expected="a retransmission of 2 before the deregistration", observed="none")
    src.connect().send(src.preg(reg_id=src.reg_id, rpp=True, deregister=True))
    h.note("the source deregisters")
    h.wait_until(lambda: False, 0.5, "the store deleting the source's messages")
    h.check(not _served(rcv, 3, 0.5, h), "the store still retransmits a deregistered RPP "
            "source's messages", expected="no retransmission of 3", observed="retransmitted")


@_case("RPP-STORE-042", suite=SUITE, role=Role.STORE,
      title="A new RPP source is refused on a topic that does not allow RPP; an SPP one is not",
      section=S_IMPLEMENTING,
      topic_options={"repository-allow-receiver-paced-persistence": 0},
      requirement="Set repository-allow-receiver-paced-persistence = 1 for the repository in "
                  "the umestored XML configuration file (docs/semantics.md §2.1: store allows "
                  "0, source RPP 1: refused, RPP not allowed).")
def rpp_not_allowed(h: CaseContext) -> None:
    """A topic with ``repository-allow-receiver-paced-persistence 0``: a first registration
    asking RPP (flag and a flight size override) is refused with code 6 - the source decides a
    new repository's mode, and this topic may not have an RPP one; an SPP source is granted
    without the RPP flag."""
    src = h.source("RPP source")
    _refused(h, src.register(reg_id=0, rpp=True, options=[_opt("ume_flight_size_bytes", 1000)]),
             "a new RPP source on a topic that does not allow RPP")
    spp = h.source("SPP source")
    resp = spp.register(reg_id=0)
    _granted(h, resp, "an SPP source", rpp_mode=False)
    h.check(not resp.w_flag, "the store acknowledged RPP to an SPP source",
            expected="PREG_RESP without the RPP flag", observed=repr(resp))


# --- source IUT --------------------------------------------------------------------------------

SOURCE_OVERRIDES: dict[str, int] = {
    "ume_flight_size_bytes": 3000, "ume_write_delay": 0, "ume_repository_ack_on_reception": 1,
    "ume_repository_size_threshold": 40000, "ume_repository_size_limit": 0,
    "ume_repository_disk_file_size_limit": 900000}
"""What SRC-RPP-001 configures: some overrides set, the others explicitly 0 ("the store's
value", never sent)."""


def _source_options(values: dict[str, int]) -> dict[str, str | int]:
    return {**FAST_REGISTRATION, "source ume_receiver_paced_persistence": 1,
            **{f"source {name}": value for name, value in values.items()}}


def _preg_options(h: CaseContext, seen: Any, what: str) -> list[CfgOpt]:
    try:
        return rpp.parse_options(seen.message)
    except rpp.RppRefused as exc:
        h.check(False, f"{what} carries a garbled configuration option",
                expected="whole CFGOPT extended options (docs/wire-lbmc.md §2.3)",
                observed=str(exc))
        raise


@_case("SRC-RPP-001", suite=SUITE, role=Role.SOURCE, timeout=15.0,
      title="An RPP source's PREG has the RPP flag and exactly its non-zero overrides, again "
            "when it re-registers",
      section=S_REGISTRATION,
      requirement="A source registration request includes ... Designation of a RPP topic ... "
                  "Reconfigured repository configuration option values ... Re-registration "
                  "must request same configuration options or the store rejects the request.")
def source_sends_overrides(h: CaseContext) -> None:
    """Overrides set as :data:`SOURCE_OVERRIDES` (three non-zero, three 0): the PREG has the
    W flag and one source-scope configuration option per non-zero value with its value (the
    rules module's :func:`~reference_impl.rpp.source_options`), no other.  The store then
    goes silent until the source re-registers (store activity timeout 1 s): that PREG carries
    the same options."""
    store = h.store()
    h.start_iut(store, options={**_source_options(SOURCE_OVERRIDES),
                                "source ume_store_activity_timeout": 1000,
                                "source ume_store_check_interval": 100})
    view = type("Config", (), SOURCE_OVERRIDES)()
    expected = sorted((o.name, o.value) for o in rpp.source_options(view))
    h.wait_until(lambda: bool(store.source_pregs()), 4.0, "the source's PREG")
    h.check(bool(store.source_pregs()), "the source sent no PREG", expected="a source PREG",
            observed="none")
    first = store.source_pregs()[0]
    preg = first.message.header(UmePreg)
    assert preg is not None
    h.check(bool(preg.w_flag), "the RPP source's PREG lacks the RPP flag",
            expected="PREG with the W (RPP) flag", observed=first.message.label())
    options = _preg_options(h, first, "the PREG")
    h.check(all(o.scope == CfgScope.SOURCE for o in options),
            "the PREG carries configuration options of another scope than source",
            expected="scope source", observed=[o.scope for o in options])
    h.check_equal(sorted((o.name, o.value) for o in options), expected,
                  "the overrides the PREG carries")
    h.wait_until(lambda: bool(store.data_sqns()), 4.0, "data after registration")
    count = len(store.source_pregs())
    store.silent = True
    h.note("the store goes silent until the source registers again")
    h.wait_until(lambda: len(store.source_pregs()) > count, 6.0, "the source re-registering")
    store.silent = False
    again = store.source_pregs()
    h.check(len(again) > count, "the source never re-registered with the silent store",
            expected="a new PREG after the store activity timeout", observed="none")
    h.check_equal(sorted((o.name, o.value) for o in _preg_options(h, again[count], "the "
                         "re-registration")), expected, "the overrides the re-registration "
                  "carries")


@_case("SRC-RPP-002", suite=SUITE, role=Role.SOURCE, timeout=15.0,
      title="An RPP source refused with code 6 does not send as registered",
      section=S_REGISTRATION,
      requirement="Re-registration must request same configuration options or the store "
                  "rejects the request: a source the store refuses (code 6, configuration "
                  "incompatible) is not registered and may not send.")
def refused_source_does_not_send(h: CaseContext) -> None:
    """The one store answers every PREG with code 6: no data message may appear on the
    transport for two registration intervals, and the source keeps trying to register.  The
    failure the source reports reaches its application only and is not judged."""
    store = h.store()
    store.refuse = int(PregError.ECONFIG)
    h.start_iut(store, options=_source_options({"ume_flight_size_bytes": 3000}))
    h.wait_until(lambda: bool(store.source_pregs()), 4.0, "the source's PREG")
    h.check(bool(store.source_pregs()), "the source sent no PREG", expected="a source PREG",
            observed="none")
    h.wait_until(lambda: bool(store.data_sqns()), 2.5, "data after a refusal (must not come)")
    h.check(not store.data_sqns(), "the source sent data although its store refused it",
            expected="no data after a code 6 refusal",
            observed=f"data messages {store.data_sqns()[:5]}")


# --- receiver IUT ------------------------------------------------------------------------------


def _receiver_setup(h: CaseContext, mode: int, stores: int = 1,
                    extra: dict[str, str | int] | None = None
                    ) -> tuple[HarnessSource, list[HarnessStore]]:
    peers = [h.store() for _ in range(stores)]
    src = h.source(topic=h.iut_topic, stores=tuple(peers))
    src.answer_sri_requests = True
    h.start_iut(options={"receiver ume_receiver_paced_persistence": mode, **(extra or {})})
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    src.send_sri(src.sri(high=src.high_sent()))
    h.wait_until(lambda: all(s.granted for s in peers), 3.0, "the receiver's registrations")
    h.check(all(s.granted for s in peers), "the receiver did not register with every store",
            expected="a receiver PREG at every store",
            observed={s.name: len(s.receiver_pregs()) for s in peers})
    return src, peers


def _receiver_mode_case(case_id: str, mode: int) -> None:
    name = "blocking" if mode == rpp.BLOCKING else "non-blocking"

    @_case(case_id, suite=SUITE, role=Role.RECEIVER,
          title=f"A {name} RPP receiver's PREG has the RPP flag and "
                + ("no mode option" if mode == rpp.BLOCKING else
                   "the ume_receiver_paced_persistence 2 option"),
          section=S_REGISTRATION,
          requirement="Receiver registration request includes its designation as a RPP "
                      "receiver (LBMC_UME_PREG_FLAG_REGISTER flag); ume_receiver_paced_"
                      "persistence 1 blocking, 2 non-blocking (docs/semantics.md §1.13).")
    def run(h: CaseContext) -> None:
        _src, (store,) = _receiver_setup(h, mode)
        seen = store.receiver_pregs()[0]
        preg = seen.message.header(UmePreg)
        assert preg is not None
        h.check(bool(preg.w_flag), f"the {name} receiver's PREG lacks the RPP flag",
                expected="PREG with the W (RPP) flag", observed=seen.message.label())
        options = _preg_options(h, seen, "the receiver's PREG")
        h.check_equal([(o.scope, o.name, o.value) for o in options],
                      [(o.scope, o.name, o.value) for o in rpp.receiver_options(mode)],
                      f"the configuration options of the {name} receiver's PREG")

    run.__doc__ = (f"Receiver started with ume_receiver_paced_persistence {mode}: its PREG "
                   f"carries the W flag and "
                   + ("no configuration option (the flag says blocking)."
                      if mode == rpp.BLOCKING else
                      f"exactly one receiver-scope option {rpp.RPP_OPTION} 2."))


_receiver_mode_case("RCV-RPP-001", rpp.BLOCKING)
_receiver_mode_case("RCV-RPP-002", rpp.NON_BLOCKING)


@_case("RCV-RPP-003", suite=SUITE, role=Role.RECEIVER, timeout=15.0,
      title="A deregistering RPP receiver deregisters from each store and acknowledges "
            "nothing after",
      section=S_DEREGISTRATION,
      requirement="Receivers can still receive messages after deregistering, but cannot "
                  "acknowledge message consumption. The receiver must restart in order to "
                  "register again with the RPP store.")
def receiver_deregisters(h: CaseContext) -> None:
    """Two stores; the blocking receiver consumes 0..2 (ACKs at both); the harness asks it to
    deregister (the profile's ``deregister_signal``): each store gets a receiver PREG with the
    D flag and the RegID it granted; messages 3..5 published afterwards get no consumption ACK
    at either store."""
    src, stores = _receiver_setup(h, rpp.BLOCKING, 2)
    src.publish(*range(3))
    h.wait_until(lambda: all(s.acked_up_to() == 2 for s in stores), 3.0,
                 "consumption ACKs for 0..2")
    for store in stores:
        h.check_equal(store.acked_up_to(), 2, f"the consumption ACKed to {store.name}")
    granted = {store: {reg_id for _when, reg_id in store.snapshot_granted()} for store in stores}
    h.deregister_iut()

    def deregistrations(store: HarnessStore) -> list[Any]:
        return [p for p in (s.message.header(UmePreg) for s in store.receiver_pregs())
                if p is not None and p.d_flag]

    h.wait_until(lambda: all(deregistrations(s) for s in stores), 4.0,
                 "a deregistration at each store")
    for store in stores:
        seen = deregistrations(store)
        h.check(bool(seen), f"the receiver did not deregister from {store.name}",
                expected="a receiver PREG with the D flag", observed="none")
        h.check(seen[0].reg_id in granted[store],
                f"the deregistration sent to {store.name} names another RegID",
                expected=f"one of {sorted(granted[store])}", observed=seen[0].reg_id)
    acks = {store: len(store.snapshot(store.acks)) for store in stores}
    src.publish(3, 4, 5)
    h.wait_until(lambda: any(len(s.snapshot(s.acks)) > acks[s] for s in stores), 1.0,
                 "consumption ACKs after the deregistration (must not come)")
    for store in stores:
        late = store.snapshot(store.acks)[acks[store]:]
        h.check(not late, f"the receiver acknowledged consumption to {store.name} after "
                          f"deregistering", expected="no consumption ACK",
                observed=f"{len(late)} ACK(s), up to {store.acked_up_to()}")
