"""Proxy source elections: which store of a Quorum/Consensus group runs a departed source's proxy.

The guide's "Proxy Sources" chapter ("How Proxy Sources Operate", "Proxy Source Elections") and
docs/semantics.md §1.11 give the rule; this module holds it once, as a sans-IO state machine
(:class:`ProxyElection`, one per store, ``input, now -> actions``) that a store core or a
simulator scenario drives:

1. A source registered with ``ume_proxy_source`` 1 (its PREG carries the ``ume_proxy_src``
   header with the enable flag) at a store with ``allow-proxy-source`` 1 is *watched*
   (:meth:`ProxyElection.watch`).  Nothing else is eligible.
2. When the source's activity timeout runs out (:meth:`ProxyElection.source_timed_out`) the
   store waits a random time in [0.5, 1.5] x ``proxy-election-interval``.
3. If by then it has received no *claim* from another store's proxy for that source, it
   creates the proxy (:class:`CreateProxy`) and sends a claim to every other store of the
   group (:class:`SendClaim`).  A claim is the proxy source's PREG: one LBMC CONTROL message
   of ``ume_preg`` with the P ("proxy source") flag, ``ume_pser`` naming the source (its
   request address, transport and topic index) and the store, and ``ume_psrc_election_token``
   with the store's index and a random non-zero 32-bit token (:func:`encode_claim`).
4. Two stores that both created a proxy each receive the other's claim; the claim with the
   higher (token, store index) wins, so exactly one proxy survives: the loser deletes its
   proxy (:class:`DeleteProxy`, reason ``"election lost"``) and follows the winner.  *Choice*
   (the guide only says "the nature of the random values ensures that only one store ...
   keeps its proxy source"): equal tokens are broken by the higher store index, so the order
   is total and two stores can never both win or both lose.  A winner that hears a losing
   claim sends its own claim to that store again, so one lost claim cannot leave two proxies
   on an unreliable path.
5. The original source registering again (:meth:`ProxyElection.source_returned`) deletes the
   proxy (reason ``"source returned"``) and ends the election.
6. A store whose proxy-holding peer dies (:meth:`ProxyElection.peer_lost`: its connection
   went) starts a new wait, and its claim then carries the PSER re-election flag.  *Choice*
   (the guide only says the other stores "detect a source failure again"): a running proxy
   repeats its claim to every other store each ``proxy-election-interval``, and a store that
   hears none from the proxy it follows for :data:`SILENCE` intervals treats its store as
   dead too, so a proxy cut off without its connections being reset is replaced as well
   (when the cut heals, the two proxies' claims meet and the lower one goes, as in 4).

7. ``proxy-source-repo-quorum-required`` (docs/semantics.md §1.11: "only stores that hold
   state for that topic/RegID participate and a quorum of them is required"; *choice*, the
   guide says no more): a store with the option counts who takes part.  A store that follows a
   claim answers it with a *support*: the proxy's PREG_RESP (:func:`encode_support`, UME PREG
   response + PSER + PSRC-ETOK with the supporter's index and the claim's token), every time
   the claim comes.  Only a store that watches the source (holds its state: the source
   registered there) follows, so only such stores support.  The claimant creates its proxy
   (:class:`CreateProxy`) only once it and its supporters make a quorum of the group (a
   majority of its stores); until then it claims, and wins or loses, as before, but advertises
   nothing.  All stores of a group are meant to set the option alike.

Bad input (issue 20 "Bad input"): a claim that does not decode, that names a source this store
does not watch (a PSER for an unknown source), or that is forged - its sender is not a store of
the group, the token's store index is not the sender's, or the token is 0 (never drawn) - is
logged and dropped (:class:`Dropped`); no proxy is created and no state changes.

*Choices* where the guide is silent: the group's stores (``peers``) come from the store's
configuration (in the product, the ``ume_store`` list of the LBM configuration the proxy source
is created from); a store that hears a claim before its own timeout ran out follows that proxy
at once (the source is gone for that store too, only later); the tokens come from the ``rng``
the store is given, so a seeded scenario is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from wire.errors import WireError
from wire.lbmc import (
    LbmcMessage,
    UmePreg,
    UmePregResp,
    UmePser,
    UmePsrcElectionToken,
    parse_message,
)

Addr = tuple[str, int]

WAIT_LOW, WAIT_HIGH = 0.5, 1.5
"""The random wait after the activity timeout, as multiples of ``proxy-election-interval``."""

SILENCE = 3.0
"""A proxy's store that sent no claim for this many ``proxy-election-interval``s is taken for
dead (module docstring, 6); the proxy repeats its claim every interval."""

_CTXINST0 = bytes(8)


@dataclass(frozen=True, order=True)
class SourceKey:
    """A source as every store of the group names it (what ``ume_pser`` carries).

    Attributes:
        ip: the source's request IP (the PREG's ``resp_ip``).
        port: its request port (``resp_port``).
        transport_idx: its transport index.
        topic_idx: its topic index.
    """

    ip: str
    port: int
    transport_idx: int
    topic_idx: int


@dataclass(frozen=True)
class Claim:
    """One store's claim to run the proxy source for ``source`` (the proxy's PREG).

    Attributes:
        source: the source the proxy stands in for.
        store: the claiming store's (IP, port).
        store_index: the claiming store's index in the group.
        token: the random election token (1 .. 2**32 - 1).
        reelect: set when the claim follows the loss of an earlier proxy's store.
        reg_id: the RegID the proxy registers with (the source's at the claiming store).
    """

    source: SourceKey
    store: Addr
    store_index: int
    token: int
    reelect: bool = False
    reg_id: int = 0

    def rank(self) -> tuple[int, int]:
        """What an election compares: the token, then the store index (module docstring, 4)."""
        return (self.token, self.store_index)


def encode_claim(claim: Claim) -> bytes:
    """The claim as one LBMC CONTROL message: PREG (P and S flags) + PSER + PSRC-ETOK."""
    src, store = claim.source, claim.store
    message = LbmcMessage(headers=[
        UmePreg(s_flag=1, p_flag=1, reg_id=claim.reg_id, transport_idx=src.transport_idx,
                topic_idx=src.topic_idx, resp_port=store[1], resp_ip=store[0]),
        UmePser(source_ip=src.ip, store_ip=store[0], transport_idx=src.transport_idx,
                topic_idx=src.topic_idx, source_port=src.port, store_port=store[1],
                reelect=int(claim.reelect), source_ctxinst=_CTXINST0,
                store_ctxinst=_CTXINST0),
        UmePsrcElectionToken(store_index=claim.store_index, token=claim.token),
    ])
    return message.build()


def encode_support(support: Claim) -> bytes:
    """A store's support of a claim (module docstring, 7): the proxy's PREG_RESP, with the
    claim's PSER (the supporter as store) and PSRC-ETOK (the supporter's index, the claim's
    token), as one LBMC CONTROL message; it decodes with :func:`decode_claim`."""
    src, store = support.source, support.store
    message = LbmcMessage(headers=[
        UmePregResp(reg_id=support.reg_id, transport_idx=src.transport_idx,
                    topic_idx=src.topic_idx),
        UmePser(source_ip=src.ip, store_ip=store[0], transport_idx=src.transport_idx,
                topic_idx=src.topic_idx, source_port=src.port, store_port=store[1],
                reelect=int(support.reelect), source_ctxinst=_CTXINST0,
                store_ctxinst=_CTXINST0),
        UmePsrcElectionToken(store_index=support.store_index, token=support.token),
    ])
    return message.build()


def is_support(data: bytes) -> bool:
    """Whether ``data`` is a support (a PREG_RESP with PSER), not a claim."""
    try:
        message, _ = parse_message(data)
    except WireError:
        return False
    return message.header(UmePregResp) is not None and message.header(UmePser) is not None


def decode_claim(data: bytes) -> Claim:
    """A claim back from its bytes; :class:`ValueError` (one line) when they are not one."""
    try:
        message, used = parse_message(data)
    except WireError as exc:
        raise ValueError(f"not an LBMC message: {exc}") from None
    if used != len(data):
        raise ValueError(f"{len(data) - used} bytes after the claim")
    found: dict[type, object] = {}
    for header in message.headers:
        found.setdefault(type(header), header)
    preg, pser, etok = (found.get(UmePreg), found.get(UmePser), found.get(UmePsrcElectionToken))
    resp = found.get(UmePregResp)
    if isinstance(resp, UmePregResp) and preg is None:  # a support (module docstring, 7)
        preg = UmePreg(s_flag=1, p_flag=1, reg_id=resp.reg_id)
    if not (isinstance(preg, UmePreg) and isinstance(pser, UmePser)
            and isinstance(etok, UmePsrcElectionToken)):
        raise ValueError("a claim needs PREG, PSER and PSRC-ETOK headers")
    if not preg.p_flag:
        raise ValueError("the PREG of a claim has no proxy-source flag")
    return Claim(
        source=SourceKey(pser.source_ip, pser.source_port, pser.transport_idx, pser.topic_idx),
        store=(pser.store_ip, pser.store_port), store_index=etok.store_index,
        token=etok.token, reelect=bool(pser.reelect), reg_id=preg.reg_id)


# --- actions the machine asks its driver to carry out -------------------------------------------


@dataclass(frozen=True)
class SendClaim:
    """Send ``data`` (an encoded :class:`Claim`) to the store at ``peer``.

    Attributes:
        peer: the other store's (IP, port).
        data: the LBMC bytes.
    """

    peer: Addr
    data: bytes


@dataclass(frozen=True)
class CreateProxy:
    """Create the proxy source for ``source`` on this store ("proxy source created").

    Attributes:
        source: the source it stands in for.
        token: this store's election token for it.
        reelect: this proxy replaces one whose store died.
    """

    source: SourceKey
    token: int
    reelect: bool


@dataclass(frozen=True)
class DeleteProxy:
    """Delete this store's proxy for ``source`` ("proxy source deleted").

    Attributes:
        source: the source it stood in for.
        reason: ``"election lost"``, ``"source returned"`` or ``"source deleted"``.
    """

    source: SourceKey
    reason: str


@dataclass(frozen=True)
class Dropped:
    """A claim was logged and dropped without any state change (bad input).

    Attributes:
        peer: who sent it.
        reason: why, in one line.
        size: its length in bytes.
    """

    peer: Addr
    reason: str
    size: int


Action = SendClaim | CreateProxy | DeleteProxy | Dropped


@dataclass(frozen=True)
class ProxyPeer:
    """Tag of a connection that carried claims to or from another store of the group: when it
    goes (the store died), the driver calls :meth:`ProxyElection.peer_lost` with ``index``.

    Attributes:
        index: the other store's index in the group.
    """

    index: int


class Phase(StrEnum):
    """Where one watched source stands at one store."""

    ACTIVE = "active"  # the source is alive (or came back)
    WAITING = "waiting"  # its activity timed out; the random wait runs
    PROXY = "proxy"  # this store runs its proxy
    FOLLOWING = "following"  # another store's proxy holds it


@dataclass
class Watched:
    """One watched source's election state.

    Attributes:
        phase: see :class:`Phase`.
        reg_id: the source's RegID here (the proxy registers with it).
        deadline: end of the random wait (WAITING).
        token: this store's token (PROXY).
        holder: the winning claim known so far (FOLLOWING).
        reelect: the next claim is a re-election.
        interval: its ``proxy-election-interval`` in seconds (None: the store's default).
        refresh: when the proxy repeats its claim next (PROXY).
        heard: when the followed proxy's store last claimed (FOLLOWING).
        gone: the source's activity timed out here (only then does a lost proxy mean a new
            election; a store that followed a claim while the source was still alive to it
            just stops following).
    """

    phase: Phase = Phase.ACTIVE
    reg_id: int = 0
    deadline: float | None = None
    token: int = 0
    holder: Claim | None = None
    reelect: bool = False
    interval: float | None = None
    refresh: float | None = None
    heard: float | None = None
    gone: bool = False
    supporters: set[int] = field(default_factory=set)
    established: bool = False


@dataclass
class ProxyElection:
    """The proxy-source elections of one store (module docstring).

    Attributes:
        store_index: this store's index in the group (``ume_psrc_election_token.store_index``).
        store: this store's (IP, port).
        peers: the group's other stores, index -> (IP, port).
        interval: ``proxy-election-interval`` in seconds, for sources watched without one
            of their own (the option is a topic's: :meth:`watch` takes the topic's value).
        rng: where the waits and tokens come from.
        quorum_required: ``proxy-source-repo-quorum-required`` (module docstring, 7).
    """

    store_index: int
    store: Addr
    peers: Mapping[int, Addr]
    interval: float
    rng: random.Random = field(default_factory=random.Random)
    quorum_required: bool = False
    sources: dict[SourceKey, Watched] = field(default_factory=dict)
    _actions: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 <= self.store_index <= 0xFF:
            raise ValueError(f"store index {self.store_index}: 0..255 (one byte on the wire)")
        if self.interval <= 0:
            raise ValueError(f"proxy-election-interval {self.interval}: more than 0")

    # --- inputs ----------------------------------------------------------------------------

    def watch(self, source: SourceKey, reg_id: int, interval: float | None = None) -> None:
        """A source asking for a proxy registered here: it takes part in elections, with
        its topic's ``proxy-election-interval`` (seconds) when given."""
        if interval is not None and interval <= 0:
            raise ValueError(f"proxy-election-interval {interval}: more than 0")
        entry = self.sources.setdefault(source, Watched())
        entry.reg_id, entry.interval = reg_id, interval

    def source_timed_out(self, source: SourceKey, now: float) -> None:
        """The source's activity timeout ran out here: start the random wait."""
        entry = self.sources.get(source)
        if entry is None:
            return
        entry.gone = True
        if entry.phase is Phase.ACTIVE:
            self._wait(entry, now)

    def source_returned(self, source: SourceKey, now: float) -> None:
        """The original source registered again: its proxy (if ours) goes, the election ends."""
        entry = self.sources.get(source)
        if entry is None:
            return
        if entry.phase is Phase.PROXY and entry.established:
            self._actions.append(DeleteProxy(source, "source returned"))
        self.sources[source] = Watched(reg_id=entry.reg_id, interval=entry.interval)

    def forget(self, source: SourceKey) -> None:
        """The source's state was deleted here: no more elections for it."""
        entry = self.sources.pop(source, None)
        if entry is not None and entry.phase is Phase.PROXY and entry.established:
            self._actions.append(DeleteProxy(source, "source deleted"))

    def peer_lost(self, store_index: int, now: float) -> None:
        """Another store of the group died: sources whose proxy it held are elected again."""
        for entry in self.sources.values():
            holder = entry.holder
            if entry.phase is Phase.FOLLOWING and holder and holder.store_index == store_index:
                entry.holder, entry.heard = None, None
                if entry.gone:
                    entry.reelect = True
                    self._wait(entry, now)
                else:
                    entry.phase = Phase.ACTIVE

    def on_claim(self, data: bytes, sender: Addr, now: float) -> None:
        """Another store's claim (or, module docstring 7, its support of our claim) arrived
        from ``sender``."""
        if is_support(data):
            self._on_support(data, sender)
            return
        try:
            claim = decode_claim(data)
        except ValueError as exc:
            self._drop(sender, f"proxy claim: {exc}", len(data))
            return
        problem = self._forged(claim, sender)
        if problem:
            self._drop(sender, problem, len(data))
            return
        entry = self.sources.get(claim.source)
        if entry is None:
            self._drop(sender, f"proxy claim (PSER) for unknown source {_name(claim.source)}",
                       len(data))
            return
        if entry.phase is Phase.PROXY:
            if claim.rank() > (entry.token, self.store_index):
                if entry.established:
                    self._actions.append(DeleteProxy(claim.source, "election lost"))
                self._follow(entry, claim, now)
                self._support(claim)
            else:  # we win: make sure the loser hears it (module docstring, 4)
                self._actions.append(SendClaim(claim.store, encode_claim(self._claim(
                    claim.source, entry))))
            return
        if entry.phase is Phase.FOLLOWING and entry.holder is not None \
                and entry.holder.store_index != claim.store_index \
                and entry.holder.rank() > claim.rank():
            return  # a claim losing to the proxy we follow: its store deletes its proxy
        self._follow(entry, claim, now)
        self._support(claim)

    def _support(self, claim: Claim) -> None:
        """Answer a claim we follow with our support (module docstring, 7)."""
        if self.quorum_required:
            self._actions.append(SendClaim(claim.store, encode_support(Claim(
                claim.source, self.store, self.store_index, claim.token, claim.reelect,
                claim.reg_id))))

    def _on_support(self, data: bytes, sender: Addr) -> None:
        """A store follows our claim: count it; the proxy is created at a quorum."""
        try:
            support = decode_claim(data)
        except ValueError as exc:
            self._drop(sender, f"proxy claim support: {exc}", len(data))
            return
        problem = self._forged(support, sender)
        entry = self.sources.get(support.source)
        if problem is None and entry is None:
            problem = f"proxy claim support for unknown source {_name(support.source)}"
        if problem is not None or entry is None:
            self._drop(sender, problem or "?", len(data))
            return
        if entry.phase is not Phase.PROXY or support.token != entry.token:
            self._drop(sender, f"proxy claim support from store {support.store_index} for no "
                               f"claim of ours (token {support.token:#010x})", len(data))
            return  # a late one after we lost, or a forgery: nothing changes
        entry.supporters.add(support.store_index)
        self._establish(support.source, entry)

    @property
    def quorum(self) -> int:
        """Stores a proxy needs with ``quorum_required``: a majority of the group."""
        return (len(self.peers) + 1) // 2 + 1

    def _establish(self, source: SourceKey, entry: Watched) -> None:
        """Create the proxy once it may exist (at once without ``quorum_required``)."""
        if entry.established or entry.phase is not Phase.PROXY:
            return
        if self.quorum_required and 1 + len(entry.supporters) < self.quorum:
            return
        entry.established = True
        self._actions.append(CreateProxy(source, entry.token, entry.reelect))

    def on_timer(self, now: float) -> None:
        """Waits that ended: create the proxy and claim it at every other store; running
        proxies repeat their claim; a followed proxy silent too long is elected again."""
        for source, entry in sorted(self.sources.items()):
            interval = self._interval(entry)
            if entry.phase is Phase.WAITING and entry.deadline is not None \
                    and entry.deadline <= now:
                entry.phase, entry.deadline = Phase.PROXY, None
                entry.token = self.rng.randint(1, 0xFFFFFFFF)
                entry.supporters, entry.established = set(), False
                self._establish(source, entry)
                self._claim_everywhere(source, entry, now)
            elif entry.phase is Phase.PROXY and entry.refresh is not None \
                    and entry.refresh <= now:
                self._claim_everywhere(source, entry, now)
            elif entry.phase is Phase.FOLLOWING and entry.heard is not None \
                    and entry.heard + SILENCE * interval <= now and entry.holder is not None:
                self.peer_lost(entry.holder.store_index, now)

    # --- outputs ---------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        """The earliest end of a wait, claim repeat or follower's patience, or None."""
        deadlines = []
        for e in self.sources.values():
            if e.deadline is not None:
                deadlines.append(e.deadline)
            if e.phase is Phase.PROXY and e.refresh is not None:
                deadlines.append(e.refresh)
            if e.phase is Phase.FOLLOWING and e.heard is not None:
                deadlines.append(e.heard + SILENCE * self._interval(e))
        return min(deadlines) if deadlines else None

    def actions(self) -> list[Action]:
        """Drain what the driver must do, in order."""
        out, self._actions = self._actions, []
        return out

    def proxies(self) -> list[SourceKey]:
        """The sources this store runs a proxy for."""
        return sorted(s for s, e in self.sources.items()
                      if e.phase is Phase.PROXY and e.established)

    # --- helpers ---------------------------------------------------------------------------

    def _interval(self, entry: Watched) -> float:
        return self.interval if entry.interval is None else entry.interval

    def _wait(self, entry: Watched, now: float) -> None:
        entry.phase, entry.refresh = Phase.WAITING, None
        entry.deadline = now + self.rng.uniform(WAIT_LOW, WAIT_HIGH) * self._interval(entry)

    def _follow(self, entry: Watched, claim: Claim, now: float) -> None:
        entry.phase, entry.deadline, entry.token, entry.holder = \
            Phase.FOLLOWING, None, 0, claim
        entry.refresh, entry.heard = None, now
        entry.supporters, entry.established = set(), False

    def _claim_everywhere(self, source: SourceKey, entry: Watched, now: float) -> None:
        data = encode_claim(self._claim(source, entry))
        for index in sorted(self.peers):
            self._actions.append(SendClaim(self.peers[index], data))
        entry.refresh = now + self._interval(entry)

    def _claim(self, source: SourceKey, entry: Watched) -> Claim:
        return Claim(source, self.store, self.store_index, entry.token, entry.reelect,
                     entry.reg_id)

    def _forged(self, claim: Claim, sender: Addr) -> str | None:
        """Why a decoded claim cannot be a group store's, or None."""
        who = self.peers.get(claim.store_index)
        if who is None:
            return (f"forged proxy claim: store index {claim.store_index} is no other store "
                    f"of the group")
        if who != claim.store or who[0] != sender[0]:
            return (f"forged proxy claim: store index {claim.store_index} is "
                    f"{who[0]}:{who[1]}, the claim came from {sender[0]}:{sender[1]}")
        if claim.token == 0:
            return "forged proxy claim: election token 0 is never drawn"
        return None

    def _drop(self, sender: Addr, reason: str, size: int) -> None:
        self._actions.append(Dropped(sender, reason, size))


def _name(source: SourceKey) -> str:
    return f"{source.ip}:{source.port} transport {source.transport_idx} topic {source.topic_idx}"
