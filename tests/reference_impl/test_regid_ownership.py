"""Who may register a source RegID the store already knows (issue 22 items 1 and 2), driven
through the sans-IO cores with real PREG, TIR and data bytes:

* a RegID stays its source's until the source's activity timeout ran out since it was last
  heard, whatever happened to its connection (a SIGKILLed source) or to the store (restored
  state counts from the restart) - the guide's "Activity Timeout and State Lifetime Options";
* except for a registration that provably comes from the owner: its own connection, or one
  from the owner's IP with the owner's Session ID (without one: its request address and
  indexes);
* a restarted store rejoins the sources it restored and keeps their live data;
* a source treats a closed store connection as the store being unresponsive and registers
  again at once, and it retries "RegID in use" refusals.
"""

from __future__ import annotations

from pathlib import Path

from reference_impl.context import control
from reference_impl.events import InputDropped, StoreUnresponsive
from reference_impl.fastmsg import data_message
from reference_impl.sim import Connect, ConnKey, StreamEvent, StreamEventKind, StreamWrite
from reference_impl.source import SourceConfig, SourceCore, StoreSpec
from reference_impl.store import TopicPolicy
from tests.reference_impl.store_bench import RESOLVER, STORE, StoreBench
from wire import lbmr
from wire.lbmc import Header, PregError, Topicname, UmePreg, UmePregResp, UmeSid, parse_message

OWNER = ("10.0.0.3", 14391)  # the real source's request address
OWNER_TRANSPORT = ("10.0.0.3", 14371)
THIEF = ("10.0.0.9", 14391)  # another host
THIEF_LOCAL = ("10.0.0.3", 14392)  # the owner's host, its own request port
TOPIC = "orders"
REG_ID = 77
TIMEOUT_MS = 5000
POLICY = TopicPolicy(source_activity_timeout=TIMEOUT_MS, repository_size_threshold=1 << 30)
DISK = TopicPolicy(source_activity_timeout=TIMEOUT_MS, repository_type="disk",
                   repository_size_threshold=1 << 30)


class Bench(StoreBench):
    """A store core and the connections source registrations arrive on."""

    def __init__(self, policy: TopicPolicy = POLICY, tmp: Path | None = None,
                 now: float = 0.0) -> None:
        super().__init__(policy, tmp, now)

    def register(self, key: ConnKey, now: float, *, request: tuple[str, int] = OWNER,
                 reg_id: int = REG_ID, session_id: int = 0, topic_idx: int = 1) -> Header:
        """Send a source PREG on ``key``; returns the store's answer (the store answers a
        granted registration at once when it has joined the transport, else after its join
        wait, which this bench lets pass)."""
        headers: list[object] = [UmePreg(s_flag=1, reg_id=reg_id, transport_idx=1,
                                         topic_idx=topic_idx, resp_ip=request[0],
                                         resp_port=request[1]), Topicname(topic=TOPIC)]
        if session_id:
            headers.append(UmeSid(sid=session_id))
        self.send(key, now, *headers)
        answer = self.answers(key, now)
        if not answer:
            self.store.handle_timer(now + 2.5)  # JOIN_WAIT: answered without the transport
            answer = self.answers(key, now + 2.5)
        assert len(answer) == 1, answer
        return answer[0]


def refused(resp: Header) -> bool:
    return bool(resp.e_flag) and resp.error_code == PregError.EACTIVE


def granted(resp: Header) -> bool:
    return not resp.e_flag and resp.reg_id == REG_ID


# --- (b) a source whose connection closed keeps its RegID for its activity timeout ----------------


def test_a_killed_sources_regid_is_refused_to_another_source_until_its_activity_timeout() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0))
    heard = bench.store.sources[REG_ID].last_activity
    bench.close(owner, 3.6)  # SIGKILL: the kernel closes the socket at once
    thief = bench.connect(THIEF[0], 3.9)  # 0.3 s later
    assert refused(bench.register(thief, 3.9, request=THIEF))
    bench.tick(heard + TIMEOUT_MS / 1000 - 0.1)
    assert refused(bench.register(bench.connect(THIEF[0], heard + 4.9), heard + 4.9,
                                  request=THIEF))
    # the timeout ran out: the RegID is free (the state went with it: no state lifetime)
    bench.tick(heard + TIMEOUT_MS / 1000 + 1.0)
    late = heard + TIMEOUT_MS / 1000 + 1.0
    assert granted(bench.register(bench.connect(THIEF[0], late), late, request=THIEF))


def test_a_thief_on_the_owners_host_with_its_own_request_port_is_refused() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0))
    bench.close(owner, 2.0)
    assert refused(bench.register(bench.connect(THIEF_LOCAL[0], 2.1), 2.1,
                                  request=THIEF_LOCAL))


def test_the_owners_request_address_from_another_host_is_refused() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0))
    bench.close(owner, 2.0)
    forged = bench.connect(THIEF[0], 2.1)  # names the owner's address, comes from elsewhere
    assert refused(bench.register(forged, 2.1, request=OWNER))


def test_a_live_sources_regid_is_refused_while_data_keeps_it_active() -> None:
    """Ownership is counted from the last thing heard, data on the transport included: a
    source whose registration connection closed but which still sends is still the owner."""
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0))
    state = bench.store.sources[REG_ID]
    bench.close(owner, 1.5)
    state.last_activity = 9.0  # what _persist does for data from its transport at 9.0
    bench.tick(12.0)
    assert refused(bench.register(bench.connect(THIEF[0], 12.0), 12.0, request=THIEF))


# --- the same-source exception ---------------------------------------------------------------


def test_the_owner_reconnecting_from_its_own_address_is_granted_at_once() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0, session_id=0x5E55))
    bench.close(owner, 2.0)
    again = bench.register(bench.connect(OWNER[0], 2.1), 2.1, session_id=0x5E55)
    assert granted(again) and again.o_flag == 1


def test_a_retried_preg_on_the_owners_connection_is_granted() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0))
    assert granted(bench.register(owner, 1.2))  # its answer was lost: the source retries


def test_with_a_session_id_the_owner_is_its_session_id_from_its_host() -> None:
    """A restarted application finds its RegID again by its Session ID ("Managing RegIDs with
    Session IDs"), on whatever request port it got; another Session ID, or the same one from
    another host, is not the owner."""
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0, session_id=5))
    bench.close(owner, 2.0)
    assert refused(bench.register(bench.connect(OWNER[0], 2.1), 2.1, session_id=6))
    assert refused(bench.register(bench.connect(OWNER[0], 2.1), 2.1))  # no Session ID
    assert refused(bench.register(bench.connect(THIEF[0], 2.2), 2.2, request=THIEF,
                                  session_id=5))
    assert refused(bench.register(bench.connect(THIEF[0], 2.2), 2.2, request=OWNER,
                                  session_id=5))
    restarted = bench.register(bench.connect(THIEF_LOCAL[0], 2.3), 2.3, request=THIEF_LOCAL,
                               session_id=5, reg_id=0)
    assert granted(restarted) and restarted.o_flag == 1


def test_without_a_session_id_the_owner_is_its_request_address_and_indexes() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0))
    bench.close(owner, 2.0)
    assert refused(bench.register(bench.connect(OWNER[0], 2.1), 2.1, topic_idx=2))
    assert refused(bench.register(bench.connect(OWNER[0], 2.2), 2.2, session_id=5))
    assert granted(bench.register(bench.connect(OWNER[0], 2.3), 2.3))


def test_weak_regids_are_held_only_while_the_owner_is_connected() -> None:
    """Activity timeout 0 ("weak RegIDs"): no serialization beyond the open connection."""
    bench = Bench(TopicPolicy(source_activity_timeout=0, repository_size_threshold=1 << 30))
    owner = bench.connect(OWNER[0], 1.0)
    assert granted(bench.register(owner, 1.0))
    assert refused(bench.register(bench.connect(THIEF[0], 1.5), 1.5, request=THIEF))
    bench.close(owner, 2.0)
    assert granted(bench.register(bench.connect(THIEF[0], 2.1), 2.1, request=THIEF))


# --- (a) restored state belongs to its source for an activity timeout after the restart --------


def restarted(tmp_path: Path, restart_at: float) -> tuple[Bench, int]:
    """A disk store that held the owner's registration and 5 messages, restarted at
    ``restart_at``; returns it and the highest sequence number it holds."""
    first = Bench(DISK, tmp_path)
    owner = first.connect(OWNER[0], 1.0)
    assert granted(first.register(owner, 1.0))
    state = first.store.sources[REG_ID]
    for sqn in range(5):  # as if from the transport
        first.store._persist(state, sqn, data_message(1, sqn, b"real %d" % sqn))
    first.store.on_chunk_done(first.store.connections[owner])
    first.store.close()
    return Bench(DISK, tmp_path, now=restart_at), 4


def test_after_a_store_restart_an_impostor_cannot_take_a_restored_regid(tmp_path: Path) -> None:
    bench, high = restarted(tmp_path, 100.0)
    assert REG_ID in bench.store.sources
    assert refused(bench.register(bench.connect(THIEF[0], 100.2), 100.2, request=THIEF))
    assert refused(bench.register(bench.connect(THIEF_LOCAL[0], 100.3), 100.3,
                                  request=THIEF_LOCAL))
    # the real source re-registers: granted as the old one, told what the store holds
    real = bench.register(bench.connect(OWNER[0], 100.4), 100.4)
    assert granted(real) and real.o_flag == 1 and real.high_seqnum == high
    assert refused(bench.register(bench.connect(THIEF[0], 100.5), 100.5, request=THIEF))
    assert bench.store.sources[REG_ID].request_addr == OWNER


def test_restored_state_is_owned_for_an_activity_timeout_counted_from_the_restart(
        tmp_path: Path) -> None:
    bench, _ = restarted(tmp_path, 100.0)
    bench.tick(104.5)
    assert refused(bench.register(bench.connect(THIEF[0], 104.5), 104.5, request=THIEF))
    bench.tick(106.0)  # nobody came back: the RegID and its state are free
    assert granted(bench.register(bench.connect(THIEF[0], 106.0), 106.0, request=THIEF))


# --- item 2: the restarted store rejoins restored sources --------------------------------------


def test_a_restarted_store_rejoins_a_restored_source_and_keeps_its_live_data(
        tmp_path: Path) -> None:
    bench, _ = restarted(tmp_path, 100.0)
    store = bench.store
    store.handle_timer(100.0)
    queried = [lbmr.LbmrPacket.parse(data) for data, _ in store.datagrams_to_send(100.0)]
    assert TOPIC in [q.name for p in queried for q in p.tqrs]  # asks for the restored topic
    tir = lbmr.Tir(name=TOPIC, ttl=1, index=1,
                   info=lbmr.TcpInfo(ip=OWNER_TRANSPORT[0], port=OWNER_TRANSPORT[1]),
                   options=[lbmr.ToptUme(store=1, src_tcp_port=OWNER[1], src_tcp_addr=OWNER[0],
                                         transport_idx=1)])
    store.receive(lbmr.LbmrPacket(tirs=[tir]).build(), RESOLVER, 100.1)
    connects = [c for c in store.stream_commands(100.1) if isinstance(c, Connect)]
    assert [c.remote for c in connects] == [OWNER_TRANSPORT]
    transport: ConnKey = ((STORE[0], 50999), OWNER_TRANSPORT)
    store.stream_event(StreamEvent(StreamEventKind.CONNECTED, transport), 100.1)
    live = b"".join(data_message(1, sqn, b"live %d" % sqn) for sqn in range(5, 9))
    store.stream_event(StreamEvent(StreamEventKind.DATA, transport, live), 100.2)
    repo = store.sources[REG_ID].repo
    assert repo is not None and repo.sqns() == list(range(9))
    assert not [e for e in store.events() if isinstance(e, InputDropped)]
    # and when the source re-registers it learns the store holds everything up to 8
    real = bench.register(bench.connect(OWNER[0], 100.3), 100.3)
    assert granted(real) and real.high_seqnum == 8


# --- the source side -------------------------------------------------------------------------


def registered_source() -> tuple[SourceCore, ConnKey]:
    """A source registered with one store (answered on its PREG connection)."""
    src = SourceCore(TOPIC, SourceConfig(ume_store=(StoreSpec(*STORE, reg_id=REG_ID),)),
                     ip=OWNER[0], transport_port=OWNER_TRANSPORT[1], request_port=OWNER[1],
                     now=0.0)
    (connect,) = [c for c in src.stream_commands(0.0) if isinstance(c, Connect)]
    key: ConnKey = ((OWNER[0], 40000), connect.remote)
    src.stream_event(StreamEvent(StreamEventKind.CONNECTED, key), 0.01)
    src.stream_event(StreamEvent(StreamEventKind.DATA, key, control(UmePregResp(
        s_flag=1, reg_id=REG_ID, transport_idx=1, topic_idx=1))), 0.02)
    src.handle_timer(3.0)  # the join wait and the registration interval
    assert src.complete
    src.stream_commands(3.0)
    src.events()
    return src, key


def test_a_source_reregisters_at_once_when_its_store_connection_closes() -> None:
    src, key = registered_source()
    src.stream_event(StreamEvent(StreamEventKind.RESET, key), 3.5)
    (event,) = [e for e in src.events() if isinstance(e, StoreUnresponsive)]
    assert event.text == "store 0 [10.0.0.2:14567] unresponsive (quorum lost)"
    assert not src.complete
    commands = src.stream_commands(3.5)
    assert [c.remote for c in commands if isinstance(c, Connect)] == [STORE]  # a new PREG


def test_a_source_retries_a_regid_in_use_refusal() -> None:
    """"RegID in use" clears when the holder's activity timeout ran out at the store."""
    src = SourceCore(TOPIC, SourceConfig(ume_store=(StoreSpec(*STORE, reg_id=REG_ID),)),
                     ip=OWNER[0], transport_port=OWNER_TRANSPORT[1], request_port=OWNER[1],
                     now=0.0)
    (connect,) = [c for c in src.stream_commands(0.0) if isinstance(c, Connect)]
    key: ConnKey = ((OWNER[0], 40000), connect.remote)
    src.stream_event(StreamEvent(StreamEventKind.CONNECTED, key), 0.01)
    src.stream_commands(0.01)
    src.stream_event(StreamEvent(StreamEventKind.DATA, key, control(UmePregResp(
        e_flag=1, error_code=PregError.EACTIVE, s_flag=1, reg_id=REG_ID))), 0.02)
    due = src.get_timer()
    while due is not None and due <= 3.6:
        src.handle_timer(due)
        due = src.get_timer()
    pregs = [parse_message(c.data)[0] for c in src.stream_commands(3.6)
             if isinstance(c, StreamWrite) and c.conn == key]
    assert any(isinstance(h, UmePreg) and h.reg_id == REG_ID for m in pregs for h in m.headers)
