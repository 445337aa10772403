"""Deliberately faulty stores: the harness must catch every one of them.

Run like ``ump store``, with the mutant's name first::

    python tests/conformance/mutant_store.py grants-active-regid -c store.xml --profile current

Each mutant patches one behaviour of the reference store (:class:`reference_impl.store
.StoreCore`) and is otherwise the reference store, so a case that catches it checks exactly
that behaviour.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from reference_impl import runtime
from reference_impl.store import StoreCore
from wire.lbmc import PregError


def grants_active_regid() -> None:
    """Grants a source the RegID another active source holds (instead of refusing it)."""
    reject = StoreCore._reject

    def patched(self: StoreCore, conn: Any, preg: Any, error: PregError, text: str) -> None:
        if error == PregError.EACTIVE:
            self._respond(conn, preg, reg_id=preg.reg_id)
            return
        reject(self, conn, preg, error, text)
    StoreCore._reject = patched  # type: ignore[method-assign, assignment]


def forgets_old_flag() -> None:
    """Answers every registration as if the client were new (no OLD flag)."""
    respond = StoreCore._respond

    def patched(self: StoreCore, conn: Any, preg: Any, **kw: Any) -> None:
        kw["old"] = False
        respond(self, conn, preg, **kw)
    StoreCore._respond = patched  # type: ignore[method-assign]


def wrong_low_sqn() -> None:
    """Tells receivers a low sequence number one past the right one."""
    respond = StoreCore._respond

    def patched(self: StoreCore, conn: Any, preg: Any, **kw: Any) -> None:
        if not preg.s_flag and not kw.get("error"):
            kw["low"] = kw.get("low", 0) + 1
        respond(self, conn, preg, **kw)
    StoreCore._respond = patched  # type: ignore[method-assign]


def ignores_rate_limit() -> None:
    """Serves retransmission requests as fast as they come, whatever the configured rate."""
    settings = runtime.store_settings

    def patched(*args: Any, **kw: Any) -> Any:
        import dataclasses

        s = settings(*args, **kw)
        return dataclasses.replace(s, retransmission_request_processing_rate=10**9)
    runtime.store_settings = patched


def drops_duplicate() -> None:
    """Drops a message it already holds without acknowledging it again (a proactive
    retransmission whose first stability ACK was lost never becomes stable)."""
    from reference_impl.repository import AddResult, Repository

    add = Repository.add

    def patched(self: Repository, sqn: int, raw: bytes, now: float) -> AddResult:
        result = add(self, sqn, raw, now)
        return AddResult(dropped=True) if result.duplicate else result
    Repository.add = patched  # type: ignore[method-assign]


def acks_before_writing() -> None:
    """Acknowledges messages it holds only in its own memory: its disk repositories write
    lazily, once 64 KiB have gathered (a clean shutdown writes the rest), while the stability
    ACKs go out per chunk as usual - so a SIGKILL loses the newest acknowledged messages."""
    from reference_impl.repository import Repository

    sync, close = Repository.sync, Repository.close

    def lazy(self: Repository) -> None:
        if sum(len(raw) for raw in self._unwritten) >= 1 << 16:
            sync(self)

    def closing(self: Repository) -> None:
        sync(self)
        close(self)
    Repository.sync = lazy  # type: ignore[method-assign]
    Repository.close = closing  # type: ignore[method-assign]


# --- receiver-paced persistence (reference_impl/store.py, "Receiver-paced persistence") ----------


def grants_rpp_not_allowed() -> None:
    """Grants an RPP source on a topic that does not allow RPP (``repository-allow-receiver-
    paced-persistence`` 0; docs/semantics.md §2.1: refused)."""
    import dataclasses

    from reference_impl.store import StoreSettings, TopicPolicy

    policy_for = StoreSettings.policy_for

    def patched(self: StoreSettings, topic: str) -> TopicPolicy | None:
        policy = policy_for(self, topic)
        if policy is None:
            return None
        return dataclasses.replace(policy, repository_allow_receiver_paced_persistence=1)
    StoreSettings.policy_for = patched  # type: ignore[method-assign]


def releases_on_any_ack() -> None:
    """Releases an RPP message once ANY blocking receiver consumed it, though another blocking
    receiver still needs it (the guide: held until every RPP receiver acknowledged it)."""
    from reference_impl.rpp import BLOCKING
    from reference_impl.store import SourceState

    release = StoreCore._rpp_release

    def patched(self: StoreCore, src: SourceState) -> None:
        blocking = [r for r in src.receivers.values() if r.rpp == BLOCKING]
        known = [c for c in (r.consumed() for r in blocking) if c is not None]
        saved = [(r, r.floor) for r in blocking]
        for r in blocking if known else ():
            r.floor = max(known)  # everyone counts as far as the furthest one
        try:
            release(self, src)
        finally:
            for r, floor in saved:
                r.floor = floor
    StoreCore._rpp_release = patched  # type: ignore[method-assign]


def ignores_override_maximum() -> None:
    """Grants RPP overrides above the topic's maximum (docs/semantics.md §2.2: refused), the
    consistency rules still checked."""
    import dataclasses

    from reference_impl import store
    from reference_impl.rpp import OVERRIDES, RppValues

    effective = store.effective_values

    def patched(policy: Any, requested: Any, *, disk: bool) -> RppValues:
        raised = dataclasses.replace(policy, **{
            o.policy_field: max(getattr(policy, o.policy_field), requested.get(o.option, 0))
            for o in OVERRIDES if not o.flag})
        return effective(raised, requested, disk=disk)
    store.effective_values = patched


def ignores_consistency() -> None:
    """Grants RPP values that are inconsistent (threshold above the limit, the limit above
    90 % of the disk file limit, the threshold not above the flight size; docs/semantics.md
    §2.2: refused)."""
    import dataclasses

    from reference_impl import store
    from reference_impl.rpp import BY_OPTION, RppRefused, RppValues, store_values

    effective = store.effective_values

    def patched(policy: Any, requested: Any, *, disk: bool) -> RppValues:
        try:
            return effective(policy, requested, disk=disk)
        except RppRefused as exc:
            if not str(exc).startswith("inconsistent"):
                raise
            return dataclasses.replace(store_values(policy), **{
                BY_OPTION[name].field: value for name, value in requested.items()})
    store.effective_values = patched


def accepts_changed_rpp_values() -> None:
    """Grants an RPP source's re-registration with values other than its first registration's
    (docs/semantics.md §2.1: refused); the repository keeps its old values."""
    from reference_impl import store

    refusal = store.reregistration_refusal

    def patched(**kw: Any) -> str | None:
        kw.pop("old_values", None)
        kw.pop("new_values", None)
        return refusal(**kw)
    store.reregistration_refusal = patched


def acks_rpp_without_room() -> None:
    """Never withholds an RPP stability ACK, however little room is left below the size limit
    (the guide's "RPP Normal Operations": withheld while less than one flight size is left)."""
    StoreCore._room = lambda self, src: True  # type: ignore[method-assign]


def writes_despite_consumed() -> None:
    """Writes a delayed RPP message to disk even when every receiver consumed it before its
    write delay ended (the guide's "Receiver Acknowledgement": it is never written)."""
    from reference_impl.repository import Repository

    release = Repository.release_through

    def patched(self: Repository, sqn: int) -> list[int]:
        for early in [s for s in self._delayed if s <= sqn]:
            del self._delayed[early]
            self._append(early, self._mem[early][0])
        self.sync()
        return release(self, sqn)
    Repository.release_through = patched  # type: ignore[method-assign]


def blocking_is_non_blocking() -> None:
    """Treats non-blocking RPP receivers as blocking ones: they hold messages back
    (docs/semantics.md §1.13: only blocking receivers do; a slow non-blocking one is
    overrun)."""
    from reference_impl.rpp import BLOCKING, NON_BLOCKING
    from reference_impl.store import SourceState

    def holding(method: Callable[..., None]) -> Callable[..., None]:
        def patched(self: StoreCore, src: SourceState, *args: Any) -> None:
            flipped = [r for r in src.receivers.values() if r.rpp == NON_BLOCKING]
            for r in flipped:
                r.rpp = BLOCKING
            try:
                method(self, src, *args)
            finally:
                for r in flipped:
                    r.rpp = NON_BLOCKING
        return patched
    StoreCore._rpp_release = holding(StoreCore._rpp_release)  # type: ignore[method-assign]
    StoreCore._rpp_received = holding(StoreCore._rpp_received)  # type: ignore[method-assign]


def late_receiver_gets_history() -> None:
    """Starts a late RPP receiver at the oldest message held under the current profile too
    (the current docs: nothing sent before its first registration; docs/semantics.md §1.14)."""
    settings = runtime.store_settings

    def patched(*args: Any, **kw: Any) -> Any:
        import dataclasses

        return dataclasses.replace(settings(*args, **kw), rpp_late_join_unconsumed=True)
    runtime.store_settings = patched


def forgets_early_exiter() -> None:
    """Deletes an RPP receiver, and the messages held for it, when its activity timeout
    expires instead of when its state lifetime does (the guide's "Early Exiting Receiver")."""
    from reference_impl.store import ReceiverState

    lifetime_over = ReceiverState.lifetime_over

    def patched(self: ReceiverState, now: float) -> bool:
        if self.rpp:
            return now - self.last_activity > self.activity_timeout
        return lifetime_over(self, now)
    ReceiverState.lifetime_over = patched  # type: ignore[method-assign, assignment]


def keeps_deregistered_receiver() -> None:
    """Answers an RPP receiver's deregistration but still waits for its ACKs: what it had not
    consumed is never released (the guide's "RPP Deregistration": the number of ACKs
    required is updated)."""
    from reference_impl.store import Client, ReceiverState

    delete = StoreCore._delete_client

    def patched(self: StoreCore, client: Client, reason: str) -> None:
        if not (isinstance(client, ReceiverState) and client.rpp and reason == "deregistered"):
            delete(self, client, reason)
            return
        src = self.sources.get(client.source_reg_id)
        self._rpp_release = lambda src: None  # type: ignore[method-assign]
        try:
            delete(self, client, reason)
        finally:
            del self._rpp_release
        if src is not None:
            src.receivers[client.reg_id] = client  # a ghost the release still waits for
    StoreCore._delete_client = patched  # type: ignore[method-assign]


def keeps_deregistered_source_messages() -> None:
    """Answers an RPP source's deregistration but keeps its state and retained messages, so
    its receivers still recover them (the guide's "RPP Deregistration": deleted at once)."""
    from reference_impl.store import Client, SourceState

    deregister = StoreCore._deregister

    def patched(self: StoreCore, conn: Any, preg: Any, client: Client | None) -> None:
        if isinstance(client, SourceState) and client.rpp:
            self._respond(conn, preg, reg_id=client.reg_id)
            return
        deregister(self, conn, preg, client)
    StoreCore._deregister = patched  # type: ignore[method-assign]


MUTANTS: dict[str, Callable[[], None]] = {
    "grants-active-regid": grants_active_regid,
    "forgets-old-flag": forgets_old_flag,
    "wrong-low-sqn": wrong_low_sqn,
    "ignores-rate-limit": ignores_rate_limit,
    "drops-duplicate": drops_duplicate,
    "acks-before-writing": acks_before_writing,
    "grants-rpp-not-allowed": grants_rpp_not_allowed,
    "releases-on-any-ack": releases_on_any_ack,
    "ignores-override-maximum": ignores_override_maximum,
    "ignores-consistency": ignores_consistency,
    "accepts-changed-rpp-values": accepts_changed_rpp_values,
    "acks-rpp-without-room": acks_rpp_without_room,
    "writes-despite-consumed": writes_despite_consumed,
    "blocking-is-non-blocking": blocking_is_non_blocking,
    "late-receiver-gets-history": late_receiver_gets_history,
    "forgets-early-exiter": forgets_early_exiter,
    "keeps-deregistered-receiver": keeps_deregistered_receiver,
    "keeps-deregistered-source-messages": keeps_deregistered_source_messages,
}


# --- receiver activity timeout, state lifetime, unknown RegIDs (the quorum suite, issue 18) ------


def receivers_never_time_out() -> None:
    """Never lets a receiver time out: it stays active and keeps its RegID and state however
    long it is silent (the guide's "receiver-activity-timeout" releases the RegID)."""
    from reference_impl.store import ReceiverState

    ReceiverState.expired = lambda self, now: False  # type: ignore[method-assign]
    ReceiverState.holds_regid = lambda self, now: True  # type: ignore[method-assign]


MUTANTS["receivers-never-time-out"] = receivers_never_time_out


def store_lifetime_ignored() -> None:
    """Takes a client's own ume_state_lifetime whenever it sends one, even when the store's
    receiver-state-lifetime (or source-state-lifetime) is shorter (the guide: "The store uses
    whichever is shorter")."""
    lifetimes = StoreCore._lifetimes

    def patched(self: StoreCore, life: Any, timeout_ms: int,
                lifetime_ms: int) -> tuple[float, float]:
        activity, lifetime = lifetimes(self, life, timeout_ms, lifetime_ms)
        if life is not None and life.lifetime:
            lifetime = life.lifetime / 1000
        return activity, lifetime
    StoreCore._lifetimes = patched  # type: ignore[method-assign]


MUTANTS["store-value-ignored"] = store_lifetime_ignored


def answers_unknown_regid() -> None:
    """Serves a retransmission request naming a RegID it does not know as if the receiver
    registered on that connection (or else any receiver) had asked."""
    from reference_impl.store import ReceiverState

    on_rxreq = StoreCore._on_rxreq

    def patched(self: StoreCore, conn: Any, id_2: int, seqnum: int, size: int) -> None:
        if id_2 not in self.receivers:
            tag = conn.tag if isinstance(conn.tag, ReceiverState) else None
            rcv = tag or next(iter(self.receivers.values()), None)
            if rcv is not None:
                id_2 = rcv.reg_id
        on_rxreq(self, conn, id_2, seqnum, size)
    StoreCore._on_rxreq = patched  # type: ignore[method-assign]


MUTANTS["answers-unknown-regid"] = answers_unknown_regid


def acks_are_not_activity() -> None:
    """Does not count a receiver's consumption ACKs as activity: a receiver that only
    acknowledges times out and loses its RegID while it is still there."""
    on_ack = StoreCore._on_ack

    def patched(self: StoreCore, conn: Any, ack_type: int, rcv_reg_id: int, id_2: int,
                seqnum: int, size: int) -> None:
        rcv = self.receivers.get(rcv_reg_id) or self.receivers.get(id_2)
        before = None if rcv is None else (rcv.last_activity, rcv.active)
        on_ack(self, conn, ack_type, rcv_reg_id, id_2, seqnum, size)
        if rcv is not None and before is not None:
            rcv.last_activity, rcv.active = before
    StoreCore._on_ack = patched  # type: ignore[method-assign]


MUTANTS["acks-are-not-activity"] = acks_are_not_activity


def client_timeout_ignored() -> None:
    """Keeps its own receiver-activity-timeout (and source-activity-timeout) when a client
    asks for another with ``ume_activity_timeout`` (the client's value replaces the store's,
    docs/semantics.md §1.11)."""
    lifetimes = StoreCore._lifetimes

    def patched(self: StoreCore, life: Any, timeout_ms: int,
                lifetime_ms: int) -> tuple[float, float]:
        _, lifetime = lifetimes(self, life, timeout_ms, lifetime_ms)
        return timeout_ms / 1000, lifetime
    StoreCore._lifetimes = patched  # type: ignore[method-assign]


MUTANTS["client-timeout-ignored"] = client_timeout_ignored


# --- proxy sources (the proxy suite, issue 20) ----------------------------------------------------


def proxy_never_elected() -> None:
    """Never starts a proxy-source election: a watched source's activity timeout passes and no
    store creates a proxy (guide "How Proxy Sources Operate": the stores elect one)."""
    StoreCore._proxy_timed_out = lambda self, client: None  # type: ignore[method-assign]


MUTANTS["proxy-never-elected"] = proxy_never_elected


def two_proxies() -> None:
    """Ignores the other stores' proxy claims (their proxy's PREG with the election token):
    every store whose wait ends keeps a proxy of its own, so the group runs several (guide
    "Proxy Source Elections": only one store keeps its proxy source)."""
    StoreCore._on_proxy_claim = lambda self, conn, raw: None  # type: ignore[method-assign]


MUTANTS["two-proxies"] = two_proxies


def proxy_without_allow() -> None:
    """Takes part in proxy-source elections whatever ``allow-proxy-source`` says (guide
    "Enabling the Proxy Source Option": the stores must be configured for it)."""
    import dataclasses

    settings = runtime.store_settings

    def patched(*args: Any, **kw: Any) -> Any:
        return dataclasses.replace(settings(*args, **kw), allow_proxy_source=True)
    runtime.store_settings = patched


MUTANTS["proxy-without-allow"] = proxy_without_allow


def ignores_repo_quorum() -> None:
    """Elects proxy sources as if ``proxy-source-repo-quorum-required`` were 0: a store that
    alone holds a source's state runs its proxy (docs/semantics.md §1.11: a quorum of the
    stores holding the state is required)."""
    import dataclasses

    settings = runtime.store_settings

    def patched(*args: Any, **kw: Any) -> Any:
        return dataclasses.replace(settings(*args, **kw),
                                   proxy_source_repo_quorum_required=False)
    runtime.store_settings = patched


MUTANTS["ignores-repo-quorum"] = ignores_repo_quorum


def proxy_sends_without_quorum() -> None:
    """Its proxy source sends the source's retained messages to every receiver that joins its
    transport and asks for SRI, whether or not a quorum of the group's stores is there (guide
    "How Proxy Sources Operate": without quorum a proxy "cannot send messages")."""
    proxy_sri = StoreCore._proxy_sri

    def patched(self: StoreCore, conn: Any, req: Any) -> bool:
        answered = proxy_sri(self, conn, req)
        if answered:
            for src in self._proxied():
                if src.repo is not None and (src.transport_idx, src.topic_idx) == \
                        (req.transport_idx, req.topic_idx):
                    for sqn in src.repo.sqns():
                        raw = src.repo.get(sqn)
                        if raw is not None:
                            self.write(conn, raw)
        return answered
    StoreCore._proxy_sri = patched  # type: ignore[method-assign]


MUTANTS["proxy-sends-without-quorum"] = proxy_sends_without_quorum


def accepts_forged_claims() -> None:
    """Takes any decodable proxy claim for a watched source at its word: a token of 0, a store
    index outside the group or one that is not the claiming store's (docs/semantics.md §1.11:
    such a claim is logged and dropped)."""
    from reference_impl.proxy import ProxyElection

    ProxyElection._forged = lambda self, claim, sender: None  # type: ignore[method-assign]


MUTANTS["accepts-forged-claims"] = accepts_forged_claims


def proxy_ignores_sri() -> None:
    """Its proxy source advertises the topic but never answers an SRI request, so a late
    receiver cannot learn the store to register with (guide "Proxy Sources": the proxy lets new
    receivers "request Source Registration Information (SRI)")."""
    StoreCore._proxy_sri = lambda self, conn, req: False  # type: ignore[method-assign]


MUTANTS["proxy-ignores-sri"] = proxy_ignores_sri


def proxy_outlives_source() -> None:
    """Keeps its proxy source when the original source registers again (guide "How Proxy
    Sources Operate": "The store deletes the proxy source")."""
    from reference_impl.proxy import ProxyElection

    ProxyElection.source_returned = lambda self, source, now: None  # type: ignore[method-assign]
    ProxyElection.forget = lambda self, source: None  # type: ignore[method-assign]


MUTANTS["proxy-outlives-source"] = proxy_outlives_source


def no_reelection() -> None:
    """Never elects again when the store running the proxy dies or falls silent (guide: the
    other stores "detect a source failure again and elect a new store")."""
    from reference_impl.proxy import ProxyElection

    ProxyElection.peer_lost = lambda self, store_index, now: None  # type: ignore[method-assign]


MUTANTS["no-reelection"] = no_reelection


def answers_beyond_newest() -> None:
    """Answers a retransmission request for a number its source never sent (an OTR request
    out of range) with the newest message it holds, as if the number were clamped."""
    on_rxreq = StoreCore._on_rxreq

    def patched(self: StoreCore, conn: Any, id_2: int, seqnum: int, size: int) -> None:
        rcv = self.receivers.get(id_2)
        src = self.sources.get(rcv.source_reg_id) if rcv is not None else None
        if src is not None and src.high_received is not None and seqnum > src.high_received:
            seqnum = src.high_received
        on_rxreq(self, conn, id_2, seqnum, size)
    StoreCore._on_rxreq = patched  # type: ignore[method-assign]


MUTANTS["answers-beyond-newest"] = answers_beyond_newest


def serves_only_registration_history() -> None:
    """Serves a receiver only what the store held when it registered: a gap in the live
    stream after that (an OTR request) gets nothing."""
    register = StoreCore._register_receiver
    on_rxreq = StoreCore._on_rxreq
    history: dict[int, int] = {}

    def registering(self: StoreCore, *args: Any, **kw: Any) -> Any:
        before = set(self.receivers)
        result = register(self, *args, **kw)
        for reg_id in set(self.receivers) - before:
            src = self.sources.get(self.receivers[reg_id].source_reg_id)
            history[reg_id] = -1 if src is None or src.high_received is None \
                else src.high_received
        return result

    def patched(self: StoreCore, conn: Any, id_2: int, seqnum: int, size: int) -> None:
        if seqnum > history.get(id_2, seqnum):
            return
        on_rxreq(self, conn, id_2, seqnum, size)
    StoreCore._register_receiver = registering  # type: ignore[method-assign]
    StoreCore._on_rxreq = patched  # type: ignore[method-assign]


MUTANTS["serves-only-registration-history"] = serves_only_registration_history


def store_otr_never_asked() -> None:
    """Ignores ``use_otr 1`` in its ``<lbm-config>``: what its transport gave up on is
    declared lost at once and never asked of the source (docs/semantics.md §1.9)."""
    runtime.store_otr = lambda client: None


MUTANTS["store-otr-never-asked"] = store_otr_never_asked


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in MUTANTS:
        print(f"usage: mutant_store.py {{{','.join(MUTANTS)}}} STORE-ARGS...", file=sys.stderr)
        return 2
    MUTANTS[argv[0]]()
    from ump.cli import main as ump_main

    return ump_main(["store", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
