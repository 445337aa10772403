"""The rpp-matrix suite (``--suite rpp-matrix``): the guide's "UMP Version RPP Compatibility
Matrix", every cell, in every role.

The matrix (:data:`reference_impl.rpp.MATRIX`, read from there, not repeated here) gives the
result of a registration for six client kinds (rows: pre-5.3 / 5.3 RPP / 5.3 non-RPP source and
receiver) and three store kinds (columns: pre-5.3 store, 5.3 RPP store, 5.3 non-RPP store).
One case per cell and role:

* **store IUT** (``MTX-STORE-001..018``, column by column so that cases with one topic setup
  follow each other): the harness plays the row's client with its own packets - a pre-5.3 or
  5.3 non-RPP client sends no RPP (W) flag and no options, a 5.3 RPP source the W flag and RPP
  overrides (:func:`reference_impl.rpp.source_options`, docs/wire-lbmc.md §2.3), a 5.3 RPP
  receiver the W flag.  The column is the IUT: "5.3 RPP store" is a topic that allows RPP
  (:data:`RPP_TOPIC`) whose repository is RPP, "5.3 non-RPP store" a topic that does not
  (:data:`SPP_TOPIC`, an SPP repository); a store reached at an address names such topics in
  its profile (``rpp_topic``/``spp_topic``, :mod:`conformance.profile`).  "Pre-ver. 5.3 Store"
  is a store whose profile says ``version = "pre-5.3"``; such a store runs that column only,
  every other store the two 5.3 columns only (the rest is ``unsupported``).
* **source IUT** (``SRC-MTX-001..009``) and **receiver IUT** (``RCV-MTX-001..009``): the IUT is
  one row - a ``pre-5.3`` profile is the pre-5.3 row; any other version runs the 5.3 RPP and
  5.3 non-RPP rows, chosen by the case's ``ume_receiver_paced_persistence`` option - and the
  harness plays the column with a :class:`~conformance.store_peer.HarnessStore` of that kind.

**Asterisked cells** ("refers only to the re-registration of a source with an existing source
repository") run as re-registrations: against a store IUT the harness first makes the
repository (an RPP source on the RPP topic, an SPP source on the other), closes its connection
and registers the same RegID again as the row's source; in front of a source IUT the harness
store already holds an RPP or SPP repository for the RegID the source is configured with.
Receiver cells register with a source the harness registered first (RPP on the RPP topic, SPP
otherwise, a plain one with a pre-5.3 store).

**Verdicts.**  Store IUT: *Granted* is a PREG_RESP without the E flag whose W flag confirms
RPP exactly when a 5.3 store grants an RPP client; *Granted - Source/Receiver Error* is a grant
without the W flag (a pre-5.3 store never sets it); *Rejected* is a PREG_RESP with the E flag.
*Choice* (the guide names no code): the code should be 6 (ECONFIG, "source and store
configuration incompatible", docs/semantics.md §2.1); another error code is ``non-strict``.
Client IUT: its PREG's W flag and options must be the row's (a 5.3 RPP source sends the
override the case configured; *choice*: a PREG with no override at all is ``non-strict``,
since how overrides travel is this project's encoding, docs/wire-lbmc.md §2.3); then
*Granted*: it goes on as registered (a source sends data, a receiver acknowledges what the
source publishes) and reports no error; *Granted - Source/Receiver Error*: its output shows
the guide's phrase ("Granted - Source Error"), case-insensitively; *Rejected*: it does not go on
as registered (a source sends no data, a receiver sends the refusing store no consumption ACK
for a second and a half after the refusal) and (*choice*, ``non-strict`` otherwise) its output
mentions the refusal ("refused" or "rejected").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from conformance.context import CaseContext
from conformance.model import Failed, HarnessError, NonStrict, Role, Unsupported, case
from conformance.peers import HarnessSource
from conformance.store_peer import HarnessStore, Seen
from conformance.suites.source import FAST_REGISTRATION
from reference_impl import rpp
from wire.lbmc import CfgOpt, PregError, UmePreg

SUITE = "rpp-matrix"
SECTION = "UMP Version RPP Compatibility Matrix"
PRE53 = "pre-5.3"
"""The profile version of a UMP release before 5.3 (:data:`conformance.profile.VERSIONS`)."""

PRE53_STORE, RPP_STORE, SPP_STORE = rpp.STORE_KINDS
PRE53_SOURCE, RPP_SOURCE, SPP_SOURCE, PRE53_RECEIVER, RPP_RECEIVER, SPP_RECEIVER = \
    rpp.CLIENT_KINDS

FLIGHT_BYTES = 1 << 20
"""The ``ume_flight_size_bytes`` the RPP sources ask for (below the topic's maximum)."""

RPP_TOPIC: dict[str, str | int] = {
    "repository-allow-receiver-paced-persistence": 1,
    # the maximum an RPP source may ask for; the base topic's size threshold (64 MiB,
    # conformance.iut) is above it, so the consistency checks pass (docs/semantics.md §2.2)
    "source-flight-size-bytes-maximum": 4 << 20,
}
"""A launched store's topic for the "5.3 RPP store" column."""

SPP_TOPIC: dict[str, str | int] = {"repository-allow-receiver-paced-persistence": 0}
"""A launched store's topic for the "5.3 non-RPP store" column."""

SOURCE_OVERRIDES: list[CfgOpt] = rpp.source_options(
    SimpleNamespace(ume_flight_size_bytes=FLIGHT_BYTES,
                    ume_repository_size_threshold=32 << 20))
"""The overrides the harness's RPP sources send (consistent: threshold above the flight)."""

SETTLE = 1.5
"""Seconds a refused client is watched for going on as registered (scaled)."""

CELL_OF: dict[str, rpp.Cell] = {}
"""Case ID -> the matrix cell it checks (the HTML report draws the grid from it)."""

CASE_OF: dict[Role, dict[tuple[str, str], str]] = {}
"""IUT role -> (client kind, store kind) -> the ID of the case checking that cell."""


def _is_source(kind: str) -> bool:
    return kind.endswith("source")


def _asks_rpp(kind: str) -> bool:
    return kind in (RPP_SOURCE, RPP_RECEIVER)


def _requirement(cell: rpp.Cell) -> str:
    text = (f"The following table indicates the result of registration requests across UMP "
            f"versions: {cell.client} with a {cell.store}: {cell.label}.")
    if cell.outcome is rpp.Outcome.SOURCE_ERROR:
        text += (" Granted - Source Error indicates that the store granted the registration "
                 "but the source detected that RPP behavior was not acknowledged by the store.")
    if cell.outcome is rpp.Outcome.RECEIVER_ERROR:
        text += (" Granted - Receiver Error indicates that the store granted the registration "
                 "but the receiver detected that RPP behavior was not acknowledged by the "
                 "store.")
    if cell.reregistration:
        text += (" * Refers only to the re-registration of a source with an existing source "
                 "repository because the source determines the repository's behavior for new "
                 "registrations.")
    return text


def _title(cell: rpp.Cell) -> str:
    return f"{cell.client} with a {cell.store}: {cell.label}"


# --- the store IUT ------------------------------------------------------------------------------


def _preg_args(kind: str) -> dict[str, Any]:
    """What the harness's client of ``kind`` puts in its PREG: the W flag and options."""
    if kind == RPP_SOURCE:
        return {"rpp": True, "options": SOURCE_OVERRIDES}
    if kind == RPP_RECEIVER:
        return {"rpp": True, "options": rpp.receiver_options(rpp.BLOCKING)}
    return {"rpp": False, "options": ()}


def _store_topic(h: CaseContext, allows_rpp: bool) -> str:
    """A fresh topic of the kind the column needs: from the case's topic options for a launched
    store, from the profile's ``rpp_topic``/``spp_topic`` for one at an address."""
    profile = h.iut_profile
    if profile.address is None:
        return h.topic()
    key = "rpp_topic" if allows_rpp else "spp_topic"
    prefix = profile.rpp_topic if allows_rpp else profile.spp_topic
    if prefix is None:
        raise Unsupported(f"the store is reached at an address and its profile names no {key}, "
                          f"so the harness has no topic that "
                          f"{'allows' if allows_rpp else 'does not allow'} RPP")
    return prefix + h.topic().removeprefix("conform")


def _store_column(h: CaseContext, cell: rpp.Cell) -> None:
    """Unsupported unless the store IUT is of the cell's column kind."""
    version = h.iut_profile.version
    if cell.store == PRE53_STORE and version != PRE53:
        raise Unsupported(f"the column is a pre-5.3 store; the IUT's profile says version "
                          f"{version!r} (declare version = \"pre-5.3\" for a store from before "
                          f"UMP 5.3)")
    if cell.store != PRE53_STORE and version == PRE53:
        raise Unsupported(f"the column is a {cell.store}; the IUT's profile says version "
                          f"\"pre-5.3\"")


def _describe(resp: Any) -> str:
    if resp.e_flag:
        return f"PREG_RESP with the E flag, error code {resp.error_code}"
    return f"PREG_RESP granting RegID {resp.reg_id}, W flag {'set' if resp.w_flag else 'clear'}"


def _judge_store_answer(h: CaseContext, cell: rpp.Cell, resp: Any, who: str) -> None:
    """The store IUT's answer to the row's client, against the cell (module docstring)."""
    outcome = cell.outcome
    if outcome is rpp.Outcome.REJECTED:
        h.check(bool(resp.e_flag), f"the store granted {who} where the guide's matrix says "
                f"{cell.label}", expected="PREG_RESP with the E (error) flag",
                observed=_describe(resp))
        h.prefer(resp.error_code == PregError.ECONFIG,
                 f"the store refused {who}, but not with error code 6 (ECONFIG)",
                 expected="error code 6 (ECONFIG)", observed=resp.error_code)
        return
    h.check(not resp.e_flag, f"the store refused {who} (error code {resp.error_code}) where "
            f"the guide's matrix says {cell.label}", expected="PREG_RESP without the E flag",
            observed=_describe(resp))
    confirms = outcome is rpp.Outcome.GRANTED and _asks_rpp(cell.client) \
        and cell.store != PRE53_STORE
    if confirms:
        h.check(bool(resp.w_flag), f"the store granted {who} without confirming RPP (W flag): "
                f"the client would report an error, the matrix says {cell.label}",
                expected="W flag set in the PREG_RESP", observed=_describe(resp))
    else:
        reason = ("a pre-5.3 store never sets the RPP flag, which is how the client detects "
                  "that RPP was not acknowledged" if cell.store == PRE53_STORE
                  else f"{who} did not ask for RPP")
        h.check(not resp.w_flag, f"the store set the RPP (W) flag granting {who}: {reason}",
                expected="W flag clear in the PREG_RESP", observed=_describe(resp))


def _make_repository(h: CaseContext, src: HarnessSource, kind: str) -> Any:
    """Register ``src`` as a new source of ``kind``: the repository a cell needs."""
    resp = src.register(reg_id=0, **_preg_args(kind))
    h.check(not resp.e_flag, f"the store refused a new {kind} (error code {resp.error_code}), "
            f"which the case needs to make the repository", expected="PREG_RESP without the "
            "E flag", observed=_describe(resp))
    if _asks_rpp(kind):
        h.check(bool(resp.w_flag), f"the store did not confirm RPP (W flag) for a new {kind} on "
                f"a topic that allows RPP", expected="W flag set", observed=_describe(resp))
    h.note(f"the store holds {'an RPP' if _asks_rpp(kind) else 'an SPP'} repository for source "
           f"RegID {resp.reg_id}")
    return resp


def _store_cell(h: CaseContext, cell: rpp.Cell) -> None:
    _store_column(h, cell)
    topic = h.topic() if cell.store == PRE53_STORE else \
        _store_topic(h, cell.store == RPP_STORE)
    # the kind of source that makes the repository (a re-registration's first registration,
    # and the source a receiver registers for)
    maker = {PRE53_STORE: PRE53_SOURCE, RPP_STORE: RPP_SOURCE, SPP_STORE: SPP_SOURCE}[cell.store]
    src = h.source(topic=topic)
    if _is_source(cell.client):
        if cell.reregistration:
            first = _make_repository(h, src, maker)
            assert src.link is not None
            src.link.close()
            who = f"a {cell.client} re-registering RegID {first.reg_id}"
            resp = src.register(reg_id=first.reg_id, **_preg_args(cell.client))
        else:
            who = f"a new {cell.client}"
            resp = src.register(reg_id=0, **_preg_args(cell.client))
    else:
        _make_repository(h, src, maker)
        rcv = h.receiver(src)
        who = f"a {cell.client}"
        resp = rcv.register(reg_id=0, **_preg_args(cell.client))
    _judge_store_answer(h, cell, resp, who)


# --- source and receiver IUTs -------------------------------------------------------------------


def _client_row(h: CaseContext, cell: rpp.Cell) -> None:
    """Unsupported unless the client IUT can be the cell's row."""
    version = h.iut_profile.version
    if cell.client.startswith("pre-5.3") and version != PRE53:
        raise Unsupported(f"the row is a {cell.client}; the IUT's profile says version "
                          f"{version!r} (declare version = \"pre-5.3\" for a client from before "
                          f"UMP 5.3)")
    if not cell.client.startswith("pre-5.3") and version == PRE53:
        raise Unsupported(f"the row is a {cell.client}; the IUT's profile says version "
                          f"\"pre-5.3\"")


def _client_options(kind: str) -> dict[str, str | int]:
    """The UM options that make a (5.3) IUT the row's kind; none for a pre-5.3 client, which
    knows no RPP option."""
    if kind == RPP_SOURCE:
        return {"source ume_receiver_paced_persistence": 1,
                "source ume_flight_size_bytes": FLIGHT_BYTES}
    if kind == SPP_SOURCE:
        return {"source ume_receiver_paced_persistence": 0}
    if kind == RPP_RECEIVER:
        return {"receiver ume_receiver_paced_persistence": rpp.BLOCKING}
    if kind == SPP_RECEIVER:
        return {"receiver ume_receiver_paced_persistence": rpp.SPP}
    return {}


def _first_preg(h: CaseContext, store: HarnessStore, kind: str) -> Seen:
    pregs = store.source_pregs if _is_source(kind) else store.receiver_pregs
    h.wait_until(lambda: bool(pregs()), 4.0, f"the {kind}'s PREG")
    h.check(bool(pregs()), f"the {kind} sent no PREG", expected=f"a PREG at {store.name}",
            observed="none")
    return pregs()[0]


def _check_client_preg(h: CaseContext, store: HarnessStore, seen: Seen, kind: str) -> list[str]:
    """The PREG's W flag and options are the row's; returns what is only non-strict."""
    soft: list[str] = []
    w_flag, options = store.preg_rpp(seen)
    wants = _asks_rpp(kind)
    h.check(w_flag == int(wants), f"the {kind}'s PREG {'lacks' if wants else 'carries'} the "
            f"RPP (W) flag", expected=f"W flag {'set' if wants else 'clear'}",
            observed=f"W flag {'set' if w_flag else 'clear'}")
    if isinstance(options, str):
        raise Failed(f"the {kind}'s PREG carries garbled options: {options}",
                     expected="well-formed configuration options", observed=options)
    shown = [f"{o.name} {o.value}" for o in options]
    if _is_source(kind):
        if not wants:
            h.check(not options, f"the {kind}'s PREG carries configuration options",
                    expected="no options", observed=shown)
            return soft
        try:
            got = rpp.requested_overrides(options)
        except rpp.RppRefused as exc:
            raise Failed(f"the RPP source's options are not RPP overrides: {exc}",
                         expected="RPP override options", observed=shown) from None
        expected = {"ume_flight_size_bytes": FLIGHT_BYTES}
        if not got:
            soft.append("the RPP source's PREG carries none of the overrides it was configured "
                        "with (ume_flight_size_bytes; docs/wire-lbmc.md §2.3)")
        else:
            h.check(got == expected, "the RPP source's PREG asks for other overrides than "
                    "configured", expected=expected, observed=got)
        return soft
    try:
        mode = rpp.receiver_mode(w_flag, options)
    except rpp.RppRefused as exc:
        raise Failed(f"the {kind}'s PREG is contradictory: {exc}",
                     expected="a receiver mode the store can read", observed=shown) from None
    h.check_equal(mode, rpp.BLOCKING if wants else rpp.SPP, f"the mode the {kind}'s PREG asks for")
    return soft


def _log(h: CaseContext) -> str:
    return h.client_iut.log_since(0).lower()


def _store_answered(h: CaseContext, store: HarnessStore, cell: rpp.Cell) -> float:
    """Wait for the harness store's answer and make sure it is the matrix's (a harness bug
    otherwise); the time it was sent."""
    refused = cell.outcome is rpp.Outcome.REJECTED
    answers: Callable[[], list[Any]] = \
        store.snapshot_refusals if refused else store.snapshot_granted
    h.wait_until(lambda: bool(answers()), 3.0, "the harness store's answer")
    if not answers():
        other = store.snapshot_granted() if refused else store.snapshot_refusals()
        raise HarnessError(f"the harness store playing a {cell.store} did not "
                           f"{'refuse' if refused else 'grant'} the {cell.client} "
                           f"(its answers: {other})")
    return float(answers()[0][0])


def _goes_on(h: CaseContext, store: HarnessStore, src: HarnessSource | None, kind: str,
             timeout: float) -> bool:
    """Whether the client goes on as registered within ``timeout``: a source sends data, a
    receiver acknowledges what the harness's source publishes."""
    if src is None:
        return h.wait_until(lambda: bool(store.data_sqns()), timeout, "data from the source")
    src.publish(*range(5))
    return h.wait_until(lambda: store.acked_up_to() is not None, timeout,
                        "a consumption ACK from the receiver")


def _judge_client(h: CaseContext, cell: rpp.Cell, store: HarnessStore,
                  src: HarnessSource | None, soft: list[str]) -> None:
    outcome = cell.outcome
    answered = _store_answered(h, store, cell)
    error_phrases = [o.value.lower() for o in (rpp.Outcome.SOURCE_ERROR,
                                               rpp.Outcome.RECEIVER_ERROR)]
    if outcome is rpp.Outcome.GRANTED:
        went_on = _goes_on(h, store, src, cell.client, 4.0)
        h.check(went_on, f"the {cell.client} did not go on as registered after the grant",
                expected="data on the transport" if src is None else
                "a consumption ACK for what the source published",
                observed="nothing")
        said = [p for p in error_phrases if p in _log(h)]
        h.check(not said, f"the {cell.client} reported an RPP error although the store "
                f"granted what it asked for", expected="no RPP registration error",
                observed=said)
    elif outcome is rpp.Outcome.REJECTED:
        went_on = _goes_on(h, store, src, cell.client, SETTLE)
        h.check(not went_on, f"the {cell.client} went on as registered although the store "
                f"refused it", expected="no data" if src is None else
                "no consumption ACK to the refusing store",
                observed=store.data_sqns()[:5] if src is None else
                f"ACK up to {store.acked_up_to()}")
        log = _log(h)
        if "refused" not in log and "rejected" not in log:
            soft.append(f"the {cell.client}'s output does not mention the refusal "
                        f"('refused' or 'rejected')")
    else:
        phrase = outcome.value.lower()
        h.wait_until(lambda: phrase in _log(h), 3.0, f"{outcome.value!r} in the IUT's output")
        h.check(phrase in _log(h), f"the {cell.client} did not report that the store did not "
                f"acknowledge RPP", expected=f"{outcome.value!r} in the IUT's output",
                observed=f"{time.monotonic() - answered:.1f} s after the grant: not said")
    if soft:
        raise NonStrict("; ".join(soft))


def _source_iut_cell(h: CaseContext, cell: rpp.Cell) -> None:
    _client_row(h, cell)
    store = h.store()
    store.kind = cell.store
    reg_ids: dict[HarnessStore, int] = {}
    if cell.reregistration:
        reg_id = h.random.randrange(100_000, 1 << 30)
        mode = rpp.BLOCKING if cell.store == RPP_STORE else rpp.SPP
        store.repositories[reg_id] = mode
        store.old = True
        reg_ids[store] = reg_id
        h.note(f"{store.name} ({cell.store}) holds an existing {'RPP' if mode else 'SPP'} "
               f"repository for RegID {reg_id}: the source re-registers onto it")
    h.start_iut(store, reg_ids=reg_ids,
                options={**FAST_REGISTRATION, **_client_options(cell.client)})
    seen = _first_preg(h, store, cell.client)
    if cell.reregistration:
        asked = seen.message.header(UmePreg)
        assert asked is not None
        h.check_equal(asked.reg_id, reg_ids[store], "the RegID the source re-registers with "
                      "(its ume_store line)")
    soft = _check_client_preg(h, store, seen, cell.client)
    _judge_client(h, cell, store, None, soft)


def _receiver_iut_cell(h: CaseContext, cell: rpp.Cell) -> None:
    _client_row(h, cell)
    store = h.store()
    store.kind = cell.store
    if cell.store != PRE53_STORE:
        mode = rpp.BLOCKING if cell.store == RPP_STORE else rpp.SPP
        store.repositories[store.source_reg_id] = mode
        h.note(f"{store.name} ({cell.store}) holds an {'RPP' if mode else 'SPP'} repository "
               f"for the harness's source (RegID {store.source_reg_id})")
    src = h.source(topic=h.iut_topic, stores=(store,))
    src.answer_sri_requests = True
    h.start_iut(options=_client_options(cell.client))
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    src.send_sri(src.sri(high=src.high_sent()))
    seen = _first_preg(h, store, cell.client)
    soft = _check_client_preg(h, store, seen, cell.client)
    _judge_client(h, cell, store, src, soft)


# --- the cases ----------------------------------------------------------------------------------


def _register(case_id: str, cell: rpp.Cell, role: Role,
              body: Callable[[CaseContext, rpp.Cell], None], doc: str, **extra: Any) -> None:
    def run(h: CaseContext) -> None:
        body(h, cell)

    run.__doc__ = doc
    run.__name__ = run.__qualname__ = f"cell_{case_id.lower().replace('-', '_')}"
    case(case_id, suite=SUITE, role=role, section=SECTION, title=_title(cell),
         requirement=_requirement(cell), **extra)(run)
    CELL_OF[case_id] = cell
    CASE_OF.setdefault(role, {})[cell.client, cell.store] = case_id


def _store_doc(cell: rpp.Cell) -> str:
    how = ("re-registers the same RegID as the row's source after the harness made the "
           "repository" if cell.reregistration and _is_source(cell.client)
           else "registers as a new client" if _is_source(cell.client)
           else "registers for a source the harness registered first")
    flag = "W flag" if _asks_rpp(cell.client) else "no W flag"
    return (f"The harness plays a {cell.client} ({flag}) that {how}; the store IUT is a "
            f"{cell.store} and must answer {cell.label} (module docstring: verdicts).")


def _client_doc(cell: rpp.Cell) -> str:
    return (f"The IUT is a {cell.client}; the harness store plays a {cell.store}"
            + (" already holding the repository of the RegID the IUT is configured with"
               if cell.reregistration and _is_source(cell.client) else "")
            + f". Expected: {cell.label} (module docstring: verdicts).")


def _cells_by_column(rows: tuple[str, ...]) -> list[rpp.Cell]:
    return [rpp.cell(client, store) for store in rpp.STORE_KINDS for client in rows]


for _n, _cell in enumerate(_cells_by_column(rpp.CLIENT_KINDS), start=1):
    _topic_options = {RPP_STORE: RPP_TOPIC, SPP_STORE: SPP_TOPIC}.get(_cell.store, {})
    _register(f"MTX-STORE-{_n:03d}", _cell, Role.STORE, _store_cell, _store_doc(_cell),
              topic_options=dict(_topic_options))
for _n, _cell in enumerate(_cells_by_column(rpp.CLIENT_KINDS[:3]), start=1):
    _register(f"SRC-MTX-{_n:03d}", _cell, Role.SOURCE, _source_iut_cell, _client_doc(_cell),
              timeout=15.0)
for _n, _cell in enumerate(_cells_by_column(rpp.CLIENT_KINDS[3:]), start=1):
    _register(f"RCV-MTX-{_n:03d}", _cell, Role.RECEIVER, _receiver_iut_cell, _client_doc(_cell),
              timeout=15.0)
