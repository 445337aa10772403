"""Deliberately faulty sources and receivers: the harness must catch every one of them.

Run like ``ump source`` / ``ump receiver``, with the mutant's name first::

    python tests/conformance/mutant_client.py ignores-store-sqn source -c lbm.cfg --topic T

Each mutant patches one behaviour of the reference source (:class:`reference_impl.source
.SourceCore`) or receiver (:class:`reference_impl.receiver.ReceiverCore`) and is otherwise the
reference implementation, so a case that catches it checks exactly that behaviour.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from reference_impl import otr, quorum, receiver, runtime, source
from reference_impl.lbtrm_session import LbtrmReceiverSession, LbtrmSourceSession
from reference_impl.receiver import ReceiverCore
from reference_impl.source import FragmentedRetained, SourceCore, StoreLink
from wire import lbtrm
from wire.lbmc import UmePregResp

# --- sources ------------------------------------------------------------------------------------


def ignores_store_sqn() -> None:
    """Starts at sequence number 0 whatever the stores answer on re-registration."""
    source._consensus = lambda values, behaviour: -1


def sends_before_quorum() -> None:
    """Counts a group as complete (and a message as stable) with any one store."""
    def patched(self: SourceCore, members: set[int]) -> tuple[bool, set[int]]:
        groups = set(self.group_sizes)
        return bool(members), groups if members else set()
    SourceCore._groups_ok = patched  # type: ignore[method-assign]


def counts_refused_store() -> None:
    """Takes a registration refused with an error code for a granted one."""
    on_resp = SourceCore._on_preg_resp

    def patched(self: SourceCore, link: StoreLink, resp: Any) -> None:
        if resp.e_flag:
            resp = UmePregResp(s_flag=1, reg_id=resp.reg_id or 1,
                               transport_idx=resp.transport_idx, topic_idx=resp.topic_idx)
        on_resp(self, link, resp)
    SourceCore._on_preg_resp = patched  # type: ignore[method-assign]


def cumulative_stability() -> None:
    """Treats a stability ACK as acknowledging every older message too."""
    on_stable = SourceCore._on_stable

    def patched(self: SourceCore, link: StoreLink, sqn: int) -> None:
        for older in [s for s in self.retained if s <= sqn]:
            on_stable(self, link, older)
    SourceCore._on_stable = patched  # type: ignore[method-assign]


def counts_any_ack() -> None:
    """Counts a stability ACK for a sequence number it never sent as one for its oldest
    unstable message (it counts ACKs instead of matching them)."""
    on_stable = SourceCore._on_stable

    def patched(self: SourceCore, link: StoreLink, sqn: int) -> None:
        if sqn not in self.retained:
            unstable = [s for s, msg in self.retained.items() if not msg.stable]
            if unstable:
                sqn = min(unstable)
        on_stable(self, link, sqn)
    SourceCore._on_stable = patched  # type: ignore[method-assign]


def ignores_flight_size() -> None:
    """Never blocks on the flight size (the configured ume_flight_size is not used)."""
    config = runtime.source_config

    def patched(*args: Any, **kw: Any) -> Any:
        return dataclasses.replace(config(*args, **kw), ume_flight_size=1 << 30)
    runtime.source_config = patched


def ignores_sri_request() -> None:
    """Drops SRI requests (sends SRI only in its unsolicited bursts)."""
    on_message = SourceCore.on_message

    def patched(self: SourceCore, conn: Any, message: Any, raw: bytes) -> None:
        if any(type(h).__name__ == "SriReq" for h in message.headers):
            return
        on_message(self, conn, message, raw)
    SourceCore.on_message = patched  # type: ignore[method-assign]


def stale_store_version() -> None:
    """Names every store with version 1 in its SRI, however often it re-registered."""
    sri_bytes = SourceCore._sri_bytes

    def patched(self: SourceCore) -> bytes:
        versions = [link.version for link in self.links]
        for link in self.links:
            link.version = min(link.version, 1)
        try:
            return sri_bytes(self)
        finally:
            for link, version in zip(self.links, versions, strict=True):
                link.version = version
    SourceCore._sri_bytes = patched  # type: ignore[method-assign]


def deregisters_from_one_store() -> None:
    """Deregisters from the first registered store only."""
    def patched(self: SourceCore) -> None:
        self.deregistering = True
        for link in self.links:
            if link.registered:
                self.send_to(link.info.addr, source.control(self._preg(link, deregister=True)))
                return
    SourceCore.deregister = patched  # type: ignore[method-assign]


def _source_option(**values: Any) -> None:
    """Starts the source with ``values`` in place of the configured options."""
    config = runtime.source_config

    def patched(*args: Any, **kw: Any) -> Any:
        cfg = config(*args, **kw)
        return dataclasses.replace(cfg, **{k: f(getattr(cfg, k)) for k, f in values.items()})
    runtime.source_config = patched


def flight_bytes_count_headers() -> None:
    """Counts each message's LBMC header bytes towards ume_flight_size_bytes as well as its
    payload (the guide counts payload only)."""
    def patched(self: SourceCore, size: int) -> bool:
        cfg = self.config
        header = source.DATA_BASE.size
        return self.inflight >= cfg.ume_flight_size or (
            bool(cfg.ume_flight_size_bytes) and self.inflight_bytes + header * self.inflight
            + size + header > cfg.ume_flight_size_bytes)
    SourceCore._flight_would_exceed = patched  # type: ignore[method-assign]


def bytes_replace_count() -> None:
    """Once ume_flight_size_bytes is set, ignores ume_flight_size (either limit should bind)."""
    would_exceed = SourceCore._flight_would_exceed

    def patched(self: SourceCore, size: int) -> bool:
        cfg = self.config
        if cfg.ume_flight_size_bytes:
            return self.inflight_bytes + size > cfg.ume_flight_size_bytes
        return would_exceed(self, size)
    SourceCore._flight_would_exceed = patched  # type: ignore[method-assign]


def notify_blocks() -> None:
    """Blocks on the flight size whatever ume_flight_size_behavior says."""
    _source_option(ume_flight_size_behavior=lambda value: "block")


def stable_in_any_group() -> None:
    """Counts a message stable (and out of flight) once any one group has it, whatever
    ume_retention_intergroup_stability_behavior says."""
    _source_option(ume_retention_intergroup_stability_behavior=lambda value: "any")


def stable_with_one_store() -> None:
    """Counts a group as holding a message once any one of its stores acknowledged it (the
    intragroup rule is not applied to stability; registration still needs a quorum)."""
    def patched(self: SourceCore, mask: int, group: int) -> Any:
        ok = bool(mask)
        flags = source._STABLE_FLAGS[True, ok, True], source._STABLE_FLAGS[True, ok, False]
        return ok, *flags
    SourceCore._stability = patched  # type: ignore[method-assign]  # (never memoised)


def ignores_confirmations() -> None:
    """Takes a stable message out of flight without the configured delivery confirmations."""
    _source_option(ume_retention_unique_confirmations=lambda value: 0)


def hasty_proactive() -> None:
    """Resends an unstable message after 100 ms whatever ume_message_stability_timeout says
    (when it is not 0)."""
    _source_option(ume_message_stability_timeout=lambda value: min(value, 100))


def resends_with_timeout_zero() -> None:
    """Takes ume_message_stability_timeout 0 for 500 ms (0 turns retransmission off)."""
    _source_option(ume_message_stability_timeout=lambda value: value or 500)


def resends_forever() -> None:
    """Never gives up on an unstable message: ume_message_stability_lifetime is not used."""
    _source_option(ume_message_stability_lifetime=lambda value: 0)


# --- receivers ----------------------------------------------------------------------------------


def no_sri_request() -> None:
    """Waits for unsolicited SRI and never asks for it."""
    ReceiverCore._sri_request = lambda self: None  # type: ignore[method-assign]


def ignores_low_sqn() -> None:
    """Recovers from sequence number 0 whatever low sequence number the stores answer."""
    receiver.quorum.consensus = lambda answers, behaviour: 0


def never_rxreq() -> None:
    """Never asks a store for a retransmission (neither registration recovery nor
    off-transport recovery: no RXREQ leaves)."""
    ReceiverCore._send_rxreqs = lambda self, store, sqns: None  # type: ignore[method-assign]


def delivers_unrequested_rx() -> None:
    """Hands every retransmission below the delivery point to the application again (a
    duplicate, or a message below the low sequence number)."""
    on_data = ReceiverCore._on_data

    def patched(self: ReceiverCore, sqn: int, payload: bytes, *, retransmission: bool) -> None:
        if retransmission and self.complete and self.next_sqn is not None \
                and sqn < self.next_sqn:
            self.emit(receiver.MessageDelivered(sqn, payload, True))
            return
        on_data(self, sqn, payload, retransmission=retransmission)
    ReceiverCore._on_data = patched  # type: ignore[method-assign]


def _receiver_option(**values: Any) -> None:
    config = runtime.receiver_config

    def patched(*args: Any, **kw: Any) -> Any:
        return dataclasses.replace(config(*args, **kw), **values)
    runtime.receiver_config = patched


def ignores_outstanding_maximum() -> None:
    """Requests every missing message at once."""
    _receiver_option(retransmit_request_outstanding_maximum=0)


def hasty_rerequest() -> None:
    """Repeats unanswered RXREQs every 50 ms whatever the configured interval."""
    _receiver_option(retransmit_request_interval=50)


def no_consumption_ack() -> None:
    """Never acknowledges consumption to the stores."""
    ReceiverCore._send_ack_to = lambda self, store, sqn: None  # type: ignore[method-assign]


# --- receiver-paced persistence (guide "Receiver-paced Persistence Operations") ----------------


def source_omits_overrides() -> None:
    """An RPP source that sets the RPP flag but sends none of its overrides (guide "RPP
    Registration", "Implementing RPP": the source's ``ume_flight_size_bytes``,
    ``ume_repository_size_threshold`` ... travel with its registration, docs/semantics.md §2.2,
    docs/wire-lbmc.md §2.3)."""
    source.rpp.source_options = lambda config: []


def source_ignores_rpp_ack() -> None:
    """An RPP source that takes a grant without the RPP flag for a good one: no "Granted -
    Source Error" (the guide's "UMP Version RPP Compatibility Matrix", 5.3 RPP source with a
    pre-5.3 store; docs/semantics.md §2.1)."""
    SourceCore._rpp_not_acknowledged = lambda self, link: None  # type: ignore[method-assign]


def pre53_sets_rpp_flag() -> None:
    """A pre-5.3 source (profile ``pre-5.3``) that still sets the RPP flag in its PREG (a
    product before 5.3 knows nothing of RPP: the matrix's "Pre-ver. 5.3" rows)."""
    preg = SourceCore._preg

    def patched(self: SourceCore, link: StoreLink, deregister: bool = False) -> Any:
        header = preg(self, link, deregister)
        if not self.config.rpp_supported:
            header.w_flag = 1
        return header
    SourceCore._preg = patched  # type: ignore[method-assign]


def receiver_ignores_rpp_ack() -> None:
    """An RPP receiver that takes a grant without the RPP flag for a good one: no "Granted -
    Receiver Error" (the guide's "UMP Version RPP Compatibility Matrix", 5.3 RPP receiver with
    a pre-5.3 store; docs/semantics.md §2.1)."""
    ReceiverCore._rpp_not_acknowledged = lambda self, reg: None  # type: ignore[method-assign]


def receiver_nonblocking_as_blocking() -> None:
    """A non-blocking RPP receiver (``ume_receiver_paced_persistence`` 2) that registers as a
    blocking one: the RPP flag without its ``ume_receiver_paced_persistence 2`` option
    (docs/semantics.md §1.13; docs/wire-lbmc.md §2.3), so the store waits for it."""
    receiver.receiver_options = lambda mode: []


def receiver_acks_after_deregistration() -> None:
    """A receiver that goes on acknowledging consumption and keeping its stores alive after it
    deregistered (guide "RPP Deregistration": receivers "can still receive messages after
    deregistering, but cannot acknowledge message consumption")."""
    def unguarded(original: Callable[..., Any]) -> Callable[..., Any]:
        def patched(self: ReceiverCore, *args: Any) -> Any:
            saved = self.deregistering, self.deregistered
            self.deregistering = self.deregistered = False
            try:
                return original(self, *args)
            finally:
                self.deregistering, self.deregistered = saved
        return patched
    for name in ("_send_acks", "_send_ack_to", "_keepalive", "_arm_ack_timers"):
        setattr(ReceiverCore, name, unguarded(getattr(ReceiverCore, name)))
    left_store = ReceiverCore._left_store

    def still_counted(self: ReceiverCore, reg: Any, *, confirmed: bool) -> None:
        left_store(self, reg, confirmed=confirmed)
        reg.registered = True  # so its ACKs and keepalives still go there
    ReceiverCore._left_store = still_counted  # type: ignore[method-assign]
    deregister = ReceiverCore.deregister

    def deregister_keeping_timers(self: ReceiverCore) -> None:
        deregister(self)
        for st in list(self.sessions.values()):
            self._use(st)
            self._arm_ack_timers()
        self._rest()
    ReceiverCore.deregister = deregister_keeping_timers  # type: ignore[method-assign]


MUTANTS: dict[str, tuple[str, Callable[[], None]]] = {
    "ignores-store-sqn": ("source", ignores_store_sqn),
    "sends-before-quorum": ("source", sends_before_quorum),
    "counts-refused-store": ("source", counts_refused_store),
    "cumulative-stability": ("source", cumulative_stability),
    "ignores-flight-size": ("source", ignores_flight_size),
    "counts-any-ack": ("source", counts_any_ack),
    "ignores-sri-request": ("source", ignores_sri_request),
    "stale-store-version": ("source", stale_store_version),
    "deregisters-from-one-store": ("source", deregisters_from_one_store),
    "flight-bytes-count-headers": ("source", flight_bytes_count_headers),
    "bytes-replace-count": ("source", bytes_replace_count),
    "notify-blocks": ("source", notify_blocks),
    "stable-in-any-group": ("source", stable_in_any_group),
    "stable-with-one-store": ("source", stable_with_one_store),
    "ignores-confirmations": ("source", ignores_confirmations),
    "hasty-proactive": ("source", hasty_proactive),
    "resends-with-timeout-zero": ("source", resends_with_timeout_zero),
    "resends-forever": ("source", resends_forever),
    "no-sri-request": ("receiver", no_sri_request),
    "ignores-low-sqn": ("receiver", ignores_low_sqn),
    "never-rxreq": ("receiver", never_rxreq),
    "ignores-outstanding-maximum": ("receiver", ignores_outstanding_maximum),
    "hasty-rerequest": ("receiver", hasty_rerequest),
    "no-consumption-ack": ("receiver", no_consumption_ack),
    "delivers-unrequested-rx": ("receiver", delivers_unrequested_rx),
    "source-omits-overrides": ("source", source_omits_overrides),
    "source-ignores-rpp-ack": ("source", source_ignores_rpp_ack),
    "pre53-sets-rpp-flag": ("source", pre53_sets_rpp_flag),
    "receiver-ignores-rpp-ack": ("receiver", receiver_ignores_rpp_ack),
    "receiver-nonblocking-as-blocking": ("receiver", receiver_nonblocking_as_blocking),
    "receiver-acks-after-deregistration": ("receiver", receiver_acks_after_deregistration),
}



def ignores_nack() -> None:
    """Ignores stability NACKs (the ACK's NAK bit): keeps resending a message the store
    declared lost (docs/semantics.md §1.8)."""
    def patched(self: SourceCore, link: StoreLink, sqn: int, size: int) -> None:
        return None
    SourceCore._on_nack = patched  # type: ignore[method-assign]


MUTANTS["ignores-nack"] = ("source", ignores_nack)


def flight_counts_fragments() -> None:
    """Counts every fragment of a fragmented message against ume_flight_size, not the
    message once (guide "UMP Flight Size": "per message basis, not a per fragment basis")."""
    take, land = SourceCore._take_fragmented, SourceCore._maybe_land

    def patched_take(self: SourceCore, payload: bytes) -> tuple[int, bytes]:
        sqn, raw = take(self, payload)
        msg = self.retained.get(sqn)
        if isinstance(msg, FragmentedRetained):
            self.inflight += msg.count - 1  # one per fragment
        return sqn, raw

    def patched_land(self: SourceCore, sqn: int, msg: Any) -> None:
        was = msg.inflight
        land(self, sqn, msg)
        if was and not msg.inflight and isinstance(msg, FragmentedRetained):
            self.inflight -= msg.count - 1
    SourceCore._take_fragmented = patched_take  # type: ignore[method-assign]
    SourceCore._maybe_land = patched_land  # type: ignore[method-assign]


MUTANTS["flight-counts-fragments"] = ("source", flight_counts_fragments)


def nonblocking_waits() -> None:
    """A non-blocking source (``ump source --nonblocking``) whose sends wait for room like
    blocking ones: a full flight never returns "would block" to the application, which so
    never reports it (docs/semantics.md §1.7; guide "UMP Flight Size")."""
    send_messages = runtime.send_messages

    async def patched(*args: Any, **kw: Any) -> int:
        kw["nonblocking"] = False
        return await send_messages(*args, **kw)
    runtime.send_messages = patched


MUTANTS["nonblocking-waits"] = ("source", nonblocking_waits)


# --- the quorum suite, receiver IUT (RCV-QRM-*) --------------------------------------------------


def receiver_majority_over_all_stores() -> None:
    """Forms the 'majority' consensus low sequence number over every store's answer, not per
    group then the latest of the group majorities (docs/semantics.md §1.2, §1.9)."""
    consensus = quorum.consensus

    def patched(answers: Any, behaviour: str) -> int:
        if isinstance(answers, dict):
            answers = [v for group in answers.values() for v in group]
        return consensus(answers, behaviour)
    receiver.quorum.consensus = patched


MUTANTS["receiver-majority-over-all-stores"] = ("receiver", receiver_majority_over_all_stores)


def receiver_ignores_consensus_behavior() -> None:
    """Uses the 'majority' consensus whatever ume_consensus_sequence_number_behavior says."""
    _receiver_option(ume_consensus_sequence_number_behavior="majority")


MUTANTS["receiver-ignores-consensus-behavior"] = ("receiver",
                                                  receiver_ignores_consensus_behavior)


def receiver_ignores_intergroup() -> None:
    """Completes registration once any group has its quorum, whatever
    ume_retention_intergroup_stability_behavior says (the issue's receiver bug)."""
    _receiver_option(ume_retention_intergroup_stability_behavior="any")


MUTANTS["receiver-ignores-intergroup"] = ("receiver", receiver_ignores_intergroup)


def reregisters_with_unchanged_store() -> None:
    """On a new SRI version re-registers with every store, not only those whose version went
    up."""
    on_sri = ReceiverCore._on_sri

    def patched(self: ReceiverCore, sri: Any, message: Any) -> None:
        if sri.version > self.sri_version:
            for reg in self.stores.values():
                reg.version = -1  # every store looks changed
        on_sri(self, sri, message)
    ReceiverCore._on_sri = patched  # type: ignore[method-assign]


MUTANTS["reregisters-with-unchanged-store"] = ("receiver", reregisters_with_unchanged_store)


def never_retries_other_store() -> None:
    """Repeats an unanswered RXREQ at the store it asked first, never at another."""
    def patched(self: ReceiverCore) -> None:
        cfg = self.config
        timeout = cfg.retransmit_request_message_timeout / 1000
        interval = cfg.retransmit_request_interval / 1000
        lost = []
        for sqn, req in list(self.requests.items()):
            if self.now >= req.first + timeout:
                del self.requests[sqn]
                lost.append(sqn)
            elif self.now >= req.last + interval:
                same = [s for s in self.registered_stores if s.info.index == req.store]
                if same:
                    req.last, req.tries = self.now, req.tries + 1
                    self._send_rxreqs(same[0], [sqn])
        if lost:
            self._give_up(sorted(lost))
        self._request_more()
        if self.requests:
            self.set_timer(self._t("rx"), self.now + interval)
    ReceiverCore._retry_requests = patched  # type: ignore[method-assign]


MUTANTS["never-retries-other-store"] = ("receiver", never_retries_other_store)


def ignores_message_timeout() -> None:
    """Never gives up on a message no store retransmits (retransmit_request_message_timeout
    is not used)."""
    _receiver_option(retransmit_request_message_timeout=10**9)


MUTANTS["ignores-message-timeout"] = ("receiver", ignores_message_timeout)


def ignores_rx_maximum() -> None:
    """Recovers from the consensus low sequence number whatever retransmit_request_maximum
    says."""
    _receiver_option(retransmit_request_maximum=0)


MUTANTS["ignores-rx-maximum"] = ("receiver", ignores_rx_maximum)


def acks_before_app() -> None:
    """Acknowledges consumption on delivery (batched) although ume_explicit_ack_only is 1."""
    _receiver_option(ume_explicit_ack_only=0)


MUTANTS["acks-before-app"] = ("receiver", acks_before_app)


def acks_out_of_order() -> None:
    """Sends an explicit ACK for whatever the application acknowledges, even below an ACK
    already sent (the stores' ACKs are cumulative: it goes back)."""
    def patched(self: ReceiverCore, sqn: int, source: str | None = None) -> None:
        st = self.primary if source is None else self.session(source)
        if st is None:
            raise ValueError(f"no source {source!r}")
        self._use(st)
        try:
            st.consumed, st.acked = sqn, None
            self._send_acks()
        finally:
            self._rest()
    ReceiverCore.ack = patched  # type: ignore[method-assign]


MUTANTS["acks-out-of-order"] = ("receiver", acks_out_of_order)


def confirms_unasked() -> None:
    """Confirms delivery to the source whether or not its SRI asks for it."""
    on_sri = ReceiverCore._on_sri

    def patched(self: ReceiverCore, sri: Any, message: Any) -> None:
        on_sri(self, sri, message)
        self.acktosrc = True
    ReceiverCore._on_sri = patched  # type: ignore[method-assign]


MUTANTS["confirms-unasked"] = ("receiver", confirms_unasked)


def ignores_allow_confirmed_delivery() -> None:
    """Confirms delivery to a source that asks even with ume_allow_confirmed_delivery 0."""
    _receiver_option(ume_allow_confirmed_delivery=1)


MUTANTS["ignores-allow-confirmed-delivery"] = ("receiver", ignores_allow_confirmed_delivery)


# --- quorum/consensus (issue 18; SRC-QRM-*) -----------------------------------------------------


def registers_with_any_group() -> None:
    """Completes registration once any one group is registered, whatever
    ume_retention_intergroup_stability_behavior says (stability still follows it)."""
    groups_ok = SourceCore._groups_ok

    def patched(self: SourceCore, members: set[int]) -> tuple[bool, set[int]]:
        groups = groups_ok(self, members)[1]
        return bool(groups), groups
    SourceCore._groups_ok = patched  # type: ignore[method-assign]


MUTANTS["registers-with-any-group"] = ("source", registers_with_any_group)


def majority_of_groups_as_half() -> None:
    """Takes half of the groups (rounded down) for a majority: one group of three is enough."""
    meet = quorum.groups_meet

    def patched(inter: str, groups: int, ok: set[int], active: set[int]) -> bool:
        if inter == "majority":
            return bool(ok) and len(ok) >= groups // 2
        return meet(inter, groups, ok, active)
    quorum.groups_meet = patched


MUTANTS["majority-of-groups-as-half"] = ("source", majority_of_groups_as_half)


def all_active_registers_as_any() -> None:
    """Judges intergroup all-active registration by the groups that meet the intragroup rule
    (an active group is one with a quorum registered): any registered group completes."""
    groups_ok = SourceCore._groups_ok

    def patched(self: SourceCore, members: set[int]) -> tuple[bool, set[int]]:
        ok, groups = groups_ok(self, members)
        if self.config.ume_retention_intergroup_stability_behavior == "all-active":
            return bool(groups), groups
        return ok, groups
    SourceCore._groups_ok = patched  # type: ignore[method-assign]


MUTANTS["all-active-registers-as-any"] = ("source", all_active_registers_as_any)


def _group_rule(rule: str, registered: Callable[[int, int], bool] | None = None,
                stable: Callable[[int, int, int], bool] | None = None) -> None:
    """Replaces the intragroup rule ``rule`` for registration (size, registered) and/or
    stability (size, acked, registered but not acked) in :mod:`reference_impl.quorum`."""
    group_registered, group_stable = quorum.group_registered, quorum.group_stable
    change_registered, change_stable = registered, stable
    if change_registered is not None:
        def patched_registered(intra: str, size: int, registered: int) -> bool:
            if intra == rule:
                return change_registered(size, registered)
            return group_registered(intra, size, registered)
        quorum.group_registered = patched_registered
    if change_stable is not None:
        def patched_stable(intra: str, size: int, acked: int, registered_unacked: int) -> bool:
            if intra == rule:
                return change_stable(size, acked, registered_unacked)
            return group_stable(intra, size, acked, registered_unacked)
        quorum.group_stable = patched_stable


def intragroup_all_registers_at_quorum() -> None:
    """Completes registration with a quorum of a group under intragroup all."""
    _group_rule("all", registered=lambda size, count: count >= quorum.quorum(size))


MUTANTS["intragroup-all-registers-at-quorum"] = ("source", intragroup_all_registers_at_quorum)


def all_active_registers_as_all() -> None:
    """Waits for every store of a group to register under intragroup all-active."""
    _group_rule("all-active", registered=lambda size, count: count >= size)


MUTANTS["all-active-registers-as-all"] = ("source", all_active_registers_as_all)


def _stability_as_any(inter: str) -> None:
    """Counts a message stable with any one group under intergroup ``inter``."""
    stable_groups = SourceCore._stable_groups

    def patched(self: SourceCore, acked: set[int]) -> tuple[bool, set[int]]:
        ok, groups = stable_groups(self, acked)
        if self.config.ume_retention_intergroup_stability_behavior == inter:
            return bool(groups), groups
        return ok, groups
    SourceCore._stable_groups = patched  # type: ignore[method-assign]


def majority_stability_as_any() -> None:
    """Counts a message stable once any one group has it under intergroup majority
    (registration still needs a majority of the groups)."""
    _stability_as_any("majority")


MUTANTS["majority-stability-as-any"] = ("source", majority_stability_as_any)


def all_active_stability_as_any() -> None:
    """Counts a message stable once any one group has it under intergroup all-active."""
    _stability_as_any("all-active")


MUTANTS["all-active-stability-as-any"] = ("source", all_active_stability_as_any)


def intragroup_all_active_as_quorum() -> None:
    """Counts a message stable in a group at a quorum under intragroup all-active (it does not
    wait for the other registered stores)."""
    _group_rule("all-active", stable=lambda size, acked, waiting: acked >= quorum.quorum(size))


MUTANTS["intragroup-all-active-as-quorum"] = ("source", intragroup_all_active_as_quorum)


def intragroup_all_active_as_all() -> None:
    """Waits for every configured store of a group under intragroup all-active, registered or
    not."""
    _group_rule("all-active", stable=lambda size, acked, waiting: acked >= size)


MUTANTS["intragroup-all-active-as-all"] = ("source", intragroup_all_active_as_all)


def intragroup_all_stable_at_quorum() -> None:
    """Counts a message stable in a group at a quorum under intragroup all (registration still
    waits for every store)."""
    _group_rule("all", stable=lambda size, acked, waiting: acked >= quorum.quorum(size))


MUTANTS["intragroup-all-stable-at-quorum"] = ("source", intragroup_all_stable_at_quorum)


def majority_over_all_stores() -> None:
    """Forms the "majority" consensus over every store's answer at once, not per group."""
    def patched(values: Any, behaviour: str) -> int:
        flat = [v for group in values.values() for v in group] \
            if isinstance(values, dict) else list(values)
        return quorum.consensus(flat, behaviour)
    source._consensus = patched


MUTANTS["majority-over-all-stores"] = ("source", majority_over_all_stores)


def _consensus_as(wrong: str, instead: str) -> None:
    consensus = source._consensus

    def patched(values: Any, behaviour: str) -> int:
        return consensus(values, instead if behaviour == wrong else behaviour)
    source._consensus = patched


def consensus_lowest_as_highest() -> None:
    """Takes consensus lowest for highest (the current default)."""
    _consensus_as("lowest", "highest")


MUTANTS["consensus-lowest-as-highest"] = ("source", consensus_lowest_as_highest)


def consensus_highest_as_majority() -> None:
    """Takes consensus highest for majority (the guide's default)."""
    _consensus_as("highest", "majority")


MUTANTS["consensus-highest-as-majority"] = ("source", consensus_highest_as_majority)


def ignores_store_timeout() -> None:
    """Never finds a store unresponsive: ume_store_activity_timeout is not used."""
    _source_option(ume_store_activity_timeout=lambda value: 1 << 31)


MUTANTS["ignores-store-timeout"] = ("source", ignores_store_timeout)


def sends_after_quorum_lost() -> None:
    """Goes on sending when an unresponsive store takes the quorum away."""
    unresponsive = SourceCore._unresponsive

    def patched(self: SourceCore, link: StoreLink, suffix: str) -> None:
        complete = self.complete
        unresponsive(self, link, suffix)
        self.complete = complete
    SourceCore._unresponsive = patched  # type: ignore[method-assign]


MUTANTS["sends-after-quorum-lost"] = ("source", sends_after_quorum_lost)


def returning_store_not_resent() -> None:
    """Does not send a returning store the messages it lacks (only the stability timeout's
    proactive retransmission would)."""
    SourceCore._resend_unstable = lambda self, link: None  # type: ignore[method-assign]


MUTANTS["returning-store-not-resent"] = ("source", returning_store_not_resent)


def all_active_waits_for_lost_store() -> None:
    """Under all-active, keeps waiting for a store that became unresponsive: a message is
    judged again only when an ACK arrives."""
    SourceCore._restabilize = lambda self: None  # type: ignore[method-assign]


MUTANTS["all-active-waits-for-lost-store"] = ("source", all_active_waits_for_lost_store)


def acks_unbatched() -> None:
    """Acknowledges every delivery at once whatever ume_use_ack_batching says."""
    _receiver_option(ume_use_ack_batching=0)


MUTANTS["acks-unbatched"] = ("receiver", acks_unbatched)


def acks_highest_consumed() -> None:
    """Acknowledges the newest message the application consumed, not the contiguous run
    consumed (guide "Batching Acknowledgments": 4, 5, 7, 8, 6, 10, 3 -> 3 - 8)."""
    def patched(self: ReceiverCore) -> None:
        st = self._cur
        if st.consumed_out:
            st.consumed = max(st.consumed if st.consumed is not None else -1,
                              max(st.consumed_out))
            st.consumed_out.clear()
    ReceiverCore._advance_consumed = patched  # type: ignore[method-assign]


MUTANTS["acks-highest-consumed"] = ("receiver", acks_highest_consumed)


def all_stability_as_any() -> None:
    """Counts a message stable once any one group has it under intergroup all (registration
    still needs every group)."""
    _stability_as_any("all")


MUTANTS["all-stability-as-any"] = ("source", all_stability_as_any)


def all_stability_as_majority() -> None:
    """Counts a message stable once a majority of the groups have it under intergroup all
    (registration still needs every group)."""
    stable_groups = SourceCore._stable_groups

    def patched(self: SourceCore, acked: set[int]) -> tuple[bool, set[int]]:
        ok, groups = stable_groups(self, acked)
        if self.config.ume_retention_intergroup_stability_behavior == "all":
            return len(groups) > len(self.group_sizes) // 2, groups
        return ok, groups
    SourceCore._stable_groups = patched  # type: ignore[method-assign]


MUTANTS["all-stability-as-majority"] = ("source", all_stability_as_majority)


# --- the lbt-rm suite: a receiver's and a source's LBT-RM transport (issue 20) ---------------


def _lbtrm_receiver_setting(**values: Any) -> None:
    """The receiver's LBT-RM sessions run with ``values`` whatever its options say."""
    settings = runtime.lbtrm_receiver_settings

    def patched(client: Any) -> Any:
        return dataclasses.replace(settings(client), **values)
    runtime.lbtrm_receiver_settings = patched


def naks_at_once() -> None:
    """NAKs a gap the moment it is found (no initial backoff)."""
    _lbtrm_receiver_setting(nak_initial_backoff_interval=0.0)


def naks_not_backed_off() -> None:
    """NAKs a missing number again every 2 ms whatever its backoff interval (a NAK storm)."""
    _lbtrm_receiver_setting(nak_backoff_interval=0.002)


def ncf_ignored() -> None:
    """Takes no notice of an NCF but "Do not retry": keeps NAKing at its backoff interval."""
    on_ncf = LbtrmReceiverSession._on_rm_ncf

    def patched(self: LbtrmReceiverSession, packet: Any) -> None:
        if packet.reason == lbtrm.NcfReason.NO_RETRY:
            on_ncf(self, packet)
    LbtrmReceiverSession._on_rm_ncf = patched  # type: ignore[method-assign]


def retries_after_do_not_retry() -> None:
    """Takes an NCF "Do not retry" for "NAK Ignored": NAKs the number again later."""
    on_ncf = LbtrmReceiverSession._on_rm_ncf

    def patched(self: LbtrmReceiverSession, packet: Any) -> None:
        if packet.reason == lbtrm.NcfReason.NO_RETRY:
            packet = lbtrm.LbtrmNcf(ucast_port=packet.ucast_port, session_id=packet.session_id,
                                    trail_sqn=packet.trail_sqn, format=packet.format,
                                    reason=int(lbtrm.NcfReason.IGNORED), ncfs=list(packet.ncfs))
        on_ncf(self, packet)
    LbtrmReceiverSession._on_rm_ncf = patched  # type: ignore[method-assign]


def naks_forever() -> None:
    """Never gives a missing number up (the NAK generation interval is not applied)."""
    _lbtrm_receiver_setting(nak_generation_interval=3600.0)


def ignores_lbtrm_naks() -> None:
    """Drops every NAK on its LBT-RM unicast port (never retransmits)."""
    LbtrmSourceSession.receive = lambda self, data, addr, now: None  # type: ignore[method-assign]


def retransmits_every_nak() -> None:
    """Retransmits at every NAK (the ignore interval is not applied)."""
    init = LbtrmSourceSession.__init__

    def patched(self: LbtrmSourceSession, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        self.settings = dataclasses.replace(self.settings, ignore_interval=0.0)
    LbtrmSourceSession.__init__ = patched  # type: ignore[method-assign]


def no_session_messages() -> None:
    """Sends no LBT-RM session messages."""
    LbtrmSourceSession._arm_sm = lambda self: None  # type: ignore[method-assign]


def hasty_session_messages() -> None:
    """Sends each LBT-RM session message 0.2 ms after the DATA before it, whatever
    transport_lbtrm_sm_minimum_interval says (what a clock lagging behind the sends did)."""
    def arm(self: LbtrmSourceSession) -> None:
        self._set_timer("sm", self.now + 0.0002)
    LbtrmSourceSession._arm_sm = arm  # type: ignore[method-assign]


MUTANTS |= {
    "hasty-session-messages": ("source", hasty_session_messages),
    "naks-at-once": ("receiver", naks_at_once),
    "naks-not-backed-off": ("receiver", naks_not_backed_off),
    "ncf-ignored": ("receiver", ncf_ignored),
    "naks-forever": ("receiver", naks_forever),
    "retries-after-do-not-retry": ("receiver", retries_after_do_not_retry),
    "ignores-lbtrm-naks": ("source", ignores_lbtrm_naks),
    "retransmits-every-nak": ("source", retransmits_every_nak),
    "no-session-messages": ("source", no_session_messages),
}


# --- the otr suite: off-transport recovery (issue 20) ------------------------------------------


def otr_never_asked() -> None:
    """Never sends an OTR request: a gap its transport gave up on waits until it is lost."""
    due = otr.OtrCore.due

    def patched(self: otr.OtrCore, now: float) -> list[otr.Action]:
        return [a for a in due(self, now) if isinstance(a, otr.OtrLost)]
    otr.OtrCore.due = patched  # type: ignore[method-assign]


def otr_asks_at_once() -> None:
    """Asks for a transport gap at once and again every 50 ms (the otr_request_* options
    are not applied)."""
    def settings(self: receiver.ReceiverConfig) -> otr.OtrSettings:
        return otr.OtrSettings(0.0, 0.05, 0.05, self.retransmit_request_message_timeout / 1000)
    receiver.ReceiverConfig.otr_settings = property(settings)  # type: ignore[assignment,method-assign]


def otr_unflagged() -> None:
    """Delivers what off-transport recovery brought without the OTR flag."""
    delivered = receiver.MessageDelivered

    def unflagged(*args: Any, **kw: Any) -> Any:
        return dataclasses.replace(delivered(*args, **kw), otr=False)
    receiver.MessageDelivered = unflagged  # type: ignore[assignment,misc]


def otr_when_off() -> None:
    """Recovers a transport gap by OTR even with use_otr 0."""
    receiver.otr_applies = lambda use_otr, persistent: True


def otr_never_asks_source() -> None:
    """Asks only stores by OTR: a streaming source's request port (its retention) is never
    asked, so what its transport skipped is lost after the message timeout."""
    receiver.ReceiverCore._send_source_rxreqs = (  # type: ignore[method-assign]
        lambda self, src, sqns: None)


MUTANTS |= {
    "otr-never-asks-source": ("receiver", otr_never_asks_source),
    "otr-never-asked": ("receiver", otr_never_asked),
    "otr-asks-at-once": ("receiver", otr_asks_at_once),
    "otr-unflagged": ("receiver", otr_unflagged),
    "otr-when-off": ("receiver", otr_when_off),
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in MUTANTS or argv[1] != MUTANTS[argv[0]][0]:
        print(f"usage: mutant_client.py {{{','.join(MUTANTS)}}} source|receiver ARGS...",
              file=sys.stderr)
        return 2
    MUTANTS[argv[0]][1]()
    from ump.cli import main as ump_main

    return ump_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
