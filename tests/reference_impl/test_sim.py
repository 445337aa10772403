"""The simulated network: delivery, timers, impairments, streams, determinism and pcap export."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_impl import events as ev_module
from reference_impl.sim import (
    CallbackEndpoint,
    CapturedPacket,
    Chunking,
    Endpoint,
    LinkConfig,
    SimNetwork,
    SimulationError,
    StreamEndpoint,
    StreamEventKind,
    VirtualClock,
)
from wire.pcap import TCP_FIN, TCP_RST, TCP_SYN, decode_frame, read_capture

A, B, C = ("10.0.0.1", 1000), ("10.0.0.2", 2000), ("10.0.0.3", 3000)
GROUP = ("239.1.2.3", 14400)


def three_nodes(seed: int = 0, **kwargs: object) -> tuple[SimNetwork, list[CallbackEndpoint]]:
    net = SimNetwork(seed, **kwargs)  # type: ignore[arg-type]
    eps = []
    for name, addr in zip("abc", (A, B, C), strict=True):
        net.add_node(name, addr[0])
        ep = CallbackEndpoint()
        net.bind(name, addr[1], ep)
        eps.append(ep)
    return net, eps


class Ticker:
    """A minimal sans-IO core: a periodic timer that sends one numbered datagram per tick."""

    def __init__(self, period: float, dst: tuple[str, int]) -> None:
        self.period, self.dst = period, dst
        self.next: float | None = period
        self.fired: list[float] = []
        self._out: list[tuple[bytes, tuple[str, int]]] = []

    def receive(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        pass

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, tuple[str, int]]]:
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        return self.next

    def handle_timer(self, now: float) -> None:
        assert self.next is not None
        self.fired.append(now)
        self._out.append((len(self.fired).to_bytes(4, "big"), self.dst))
        self.next += self.period


def test_protocols_describe_the_cores() -> None:
    assert isinstance(Ticker(1.0, B), Endpoint)
    assert not isinstance(Ticker(1.0, B), StreamEndpoint)
    assert isinstance(CallbackEndpoint(), StreamEndpoint)


def test_clock_only_moves_forward() -> None:
    clock = VirtualClock(5.0)
    clock.advance_to(7.5)
    assert clock.now == 7.5
    with pytest.raises(SimulationError):
        clock.advance_to(7.0)


# --- datagrams ----------------------------------------------------------------------------------


def test_datagram_arrives_after_link_delay_in_send_order() -> None:
    net, (a, b, _) = three_nodes()
    net.set_link("a", "b", LinkConfig(delay=0.010))
    for i in range(5):
        a.send(bytes([i]), B)
    net.run_until(0.0099)
    assert b.received == []
    net.run_until(0.010)
    assert [(t, src, d) for t, src, d in b.received] == [(0.010, A, bytes([i])) for i in range(5)]


def test_one_way_delay_and_callbacks_can_reply() -> None:
    net, (a, b, _) = three_nodes()
    net.set_link("a", "b", LinkConfig(delay=0.003), both_ways=False)
    net.set_link("b", "a", LinkConfig(delay=0.020), both_ways=False)
    b.on_datagram = lambda data, src, now: b.send(b"re:" + data, src)
    a.send(b"ping", B)
    assert net.run_until_idle(max_time=1.0)
    assert a.received == [(pytest.approx(0.023), B, b"re:ping")]


class TwoPorts(CallbackEndpoint):
    """A CallbackEndpoint bound on two ports that records the port each datagram hit and
    sends from a chosen port (the optional multi-port interface)."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[tuple[int, bytes, tuple[str, int]]] = []
        self.from_port: list[tuple[int, bytes, tuple[str, int]]] = []

    def receive_at(self, local_port: int, data: bytes, addr: tuple[str, int],
                   now: float) -> None:
        self.hits.append((local_port, data, addr))

    def datagrams_from(self, now: float) -> list[tuple[int, bytes, tuple[str, int]]]:
        out, self.from_port = self.from_port, []
        return out


def test_a_multi_port_endpoint_knows_the_port_hit_and_sends_from_any_port() -> None:
    net, (a, b, _) = three_nodes()
    two = TwoPorts()
    net.bind("c", 3001, two)  # c: 3000 plain, 3001 and 3002 the multi-port endpoint
    net.bind("c", 3002, two)
    a.send(b"to-3001", (C[0], 3001))
    a.send(b"to-3002", (C[0], 3002))
    net.run_until(0.01)
    assert two.hits == [(3001, b"to-3001", A), (3002, b"to-3002", A)]
    assert two.received == []  # receive_at replaces receive
    two.from_port.append((3002, b"from-3002", B))
    two.send(b"default", B)  # datagrams_to_send: from the first port bound
    net.run_until(0.02)
    assert sorted((src, d) for _, src, d in b.received) == [
        ((C[0], 3001), b"default"), ((C[0], 3002), b"from-3002")]
    # a plain endpoint on the same node is untouched by all this
    a.send(b"plain", C)
    net.run_until(0.03)
    assert [d for _, _, d in net.endpoint(C).received] == [b"plain"]  # type: ignore[union-attr]


def test_multicast_reaches_every_member_but_the_sender() -> None:
    net, (a, b, c) = three_nodes()
    for addr in (A, B, C):
        net.join(addr, GROUP)
    net.leave(C, GROUP)
    a.send(b"m", GROUP)
    net.run_until_idle(1.0)
    assert a.received == [] and c.received == []
    assert [d for _, _, d in b.received] == [b"m"]
    assert [(p.dst, p.node) for p in net.trace] == [(GROUP, "b")]


def test_jitter_spreads_arrivals_within_bounds() -> None:
    net, (a, b, _) = three_nodes(seed=3)
    net.set_link("a", "b", LinkConfig(delay=0.010, jitter=0.005))
    for i in range(200):
        a.send(i.to_bytes(2, "big"), B)
    net.run_until_idle(1.0)
    times = [t for t, _, _ in b.received]
    assert len(times) == 200
    assert min(times) >= 0.010 and max(times) < 0.015
    order = [int.from_bytes(d, "big") for _, _, d in b.received]
    assert order != sorted(order)  # jitter reorders


# --- timers -------------------------------------------------------------------------------------


def test_timers_fire_at_virtual_times_without_sleeping() -> None:
    net, (_, b, _) = three_nodes()
    net.add_node("t", "10.0.0.9")
    ticker = Ticker(0.5, B)
    net.bind("t", 1, ticker)
    start = time.perf_counter()
    net.run_until(3600.0)  # an hour of virtual time
    elapsed = time.perf_counter() - start
    assert len(ticker.fired) == 7200
    assert ticker.fired[:3] == [0.5, 1.0, 1.5] and ticker.fired[-1] == 3600.0
    assert len(b.received) == 7199  # the last tick's datagram is still in flight
    assert net.now == 3600.0
    assert elapsed < 1.0  # about 0.1 s here: 14,400 steps, no sleeping


def test_timer_in_the_past_fires_now_and_idle_detection() -> None:
    net, (a, _, _) = three_nodes()
    net.run_until(10.0)
    fired: list[float] = []
    a.on_timer = fired.append
    a.timer = 2.0
    assert net.run_until_idle(max_time=20.0)
    assert fired == [10.0]
    a.timer = 50.0
    assert not net.run_until_idle(max_time=20.0)
    assert net.now == 20.0 and fired == [10.0]


def test_a_timer_that_never_moves_is_reported() -> None:
    net, (a, _, _) = three_nodes()
    a.on_timer = lambda now: setattr(a, "timer", now)
    a.timer = 1.0
    with pytest.raises(SimulationError, match="without time advancing"):
        net.run_until(2.0)


def test_step_does_one_thing_at_a_time() -> None:
    net, (a, b, _) = three_nodes()
    a.send(b"x", B)
    b.timer = 0.00005
    b.on_timer = lambda now: None
    assert net.step() and net.now == 0.00005 and b.received == []
    assert net.step() and len(b.received) == 1
    assert not net.step()


class PollingNetwork(SimNetwork):
    """The simulator as it chose its next step before timers had a heap: every endpoint's
    ``get_timer`` polled on every step, in bind order, past deadlines clamped to now.  The
    reference the heap must agree with, step for step."""

    def _next(self) -> tuple[float, tuple[object, Endpoint] | None] | None:  # type: ignore[override]
        best: tuple[float, tuple[object, Endpoint] | None] | None = None
        if self._queue:
            best = (self._queue[0][0], None)
        seen: set[int] = set()
        for node, port in self._bound:
            ep = node.endpoints.get(port)
            if ep is None or not node.alive or id(ep) in seen:
                continue
            seen.add(id(ep))
            t = ep.get_timer()
            if t is not None and (best is None or max(t, self.now) < best[0]):
                best = (max(t, self.now), (node, ep))
        return best


class Recorder:
    """A core with several named deadlines (the earliest is its timer) that logs firings and
    re-arms some in the past, some at shared times, some never again."""

    def __init__(self, name: str, log: list[tuple[float, str, str]],
                 deadlines: dict[str, float]) -> None:
        self.name, self.log, self.deadlines = name, log, dict(deadlines)
        self._out: list[tuple[bytes, tuple[str, int]]] = []

    def receive(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        self.log.append((now, self.name, f"got {data!r}"))
        if data == b"past":
            # already due, and the later bound the earlier: they fire now, in bind order
            self.deadlines["late"] = now - 1.0 - int(self.name[1]) / 10

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, tuple[str, int]]]:
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        return min(self.deadlines.values(), default=None)

    def handle_timer(self, now: float) -> None:
        for name, at in sorted(self.deadlines.items()):
            if at > now:
                continue
            del self.deadlines[name]
            self.log.append((now, self.name, name))
            if name.startswith("tick") and now < 3.0:
                self.deadlines[name] = round(now + 0.25, 2)  # shared with the other tickers
                self._out.append((b"past" if now == 1.0 else b"t", A))


def timer_story(network: type[SimNetwork]) -> tuple[list[tuple[float, str, str]], list[object]]:
    net, (a, _, _) = three_nodes(seed=9, chunking=Chunking(1, 3))
    if network is not SimNetwork:
        net.__class__ = network
    log: list[tuple[float, str, str]] = []
    for i in range(4):
        net.add_node(f"r{i}", f"10.0.1.{i}")
        net.bind(f"r{i}", 7, Recorder(f"r{i}", log, {"tick": 0.5, f"once{i}": 0.75 + i / 4}))

    def echo(data: bytes, src: tuple[str, int], now: float) -> None:
        log.append((now, "a", data.decode()))
        if data == b"past":
            a.send(data, src)

    a.on_datagram = echo
    net.call_at(1.6, lambda: net.kill("r1"))
    net.call_at(2.2, lambda: net.restart("r1"))
    net.call_at(2.3, lambda: net.restart("r2", {7: Recorder("r2'", log, {"fresh": 1.0})}))
    net.run_until(4.0)
    return log, list(net.trace)


def test_timer_heap_agrees_with_polling_every_endpoint() -> None:
    log, trace = timer_story(SimNetwork)
    assert (log, trace) == timer_story(PollingNetwork)
    late = [(t, who) for t, who, what in log if what == "late"]
    assert len(late) == 4 and all(1.0 < t < 1.01 for t, _ in late)  # past deadlines fired
    assert any(who == "r2'" and what == "fresh" for _, who, what in log)
    assert not any(who == "r1" and 1.6 < t < 2.2 for t, who, _ in log)  # dead: silent


def test_a_deployment_runs_identically_with_the_timer_heap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_impl import deployment as dep_module
    from reference_impl.store import TopicPolicy, TopicRule

    def run() -> tuple[list[CapturedPacket], list[tuple[float, str, ev_module.Event]]]:
        d = dep_module.SimDeployment(seed=5)
        rules = (TopicRule(".*", TopicPolicy(repository_size_threshold=10_000_000),
                           kind="PCRE"),)
        for i in range(3):
            d.add_store(f"store{i}", topics=rules, seed=100 + i)
        src = d.add_source("src", "t")
        d.add_receiver("rcv", "t")
        assert d.run_until(lambda: src.complete, 5)
        for i in range(60):
            src.send(b"x%d" % i)
            d.run(0.0013)
        d.kill("store1")
        d.kill("rcv")
        for i in range(60):
            src.send(b"y%d" % i)
            d.run(0.0007)
        d.restart("store1")
        d.restart("rcv")
        d.run(8)
        return list(d.net.trace), list(d.log)

    heap = run()
    monkeypatch.setattr(dep_module, "SimNetwork", PollingNetwork)
    polled = run()
    assert heap == polled
    assert sum(isinstance(e, ev_module.MessageDelivered) for _, n, e in heap[1] if n == "rcv") \
        >= 120


# --- impairments --------------------------------------------------------------------------------


def test_loss_duplication_reorder_statistics() -> None:
    n = 4000
    net, (a, b, _) = three_nodes(seed=11)
    net.set_link("a", "b", LinkConfig(delay=0.001, loss=0.2, duplicate=0.1, reorder=0.05,
                                      reorder_delay=0.01))
    for i in range(n):
        net.call_at(i * 0.0001, lambda i=i: a.send(i.to_bytes(4, "big"), B))
    net.run_until_idle(10.0)
    got = [int.from_bytes(d, "big") for _, _, d in b.received]
    stats = net.stats
    assert stats["lost"] + len(set(got)) == n
    assert len(got) - len(set(got)) == stats["duplicated"]
    assert 0.17 < stats["lost"] / n < 0.23
    assert 0.07 < stats["duplicated"] / (n - stats["lost"]) < 0.13
    assert 0.03 < stats["reordered"] / (n - stats["lost"]) < 0.07
    inversions = sum(1 for x, y in itertools.pairwise(got) if y < x)
    assert inversions > 0.02 * n


def test_partition_cuts_datagrams_in_flight_and_heals() -> None:
    net, (a, b, c) = three_nodes()
    net.set_link("a", "b", LinkConfig(delay=0.010))
    a.send(b"before", B)  # in flight when the cut happens
    net.run_until(0.005)
    net.partition(["a"], ["b"])
    a.send(b"during", B)
    a.send(b"to-c", C)
    net.run_until(0.1)
    assert b.received == [] and [d for _, _, d in c.received] == [b"to-c"]
    assert net.stats["partitioned"] == 2
    b.send(b"back", A)  # both ways
    net.run_until(0.2)
    assert a.received == []
    net.heal()
    a.send(b"after", B)
    net.run_until_idle(1.0)
    assert [d for _, _, d in b.received] == [b"after"]


def test_one_way_partition() -> None:
    net, (a, b, _) = three_nodes()
    net.partition(["a"], ["b"], both_ways=False)
    a.send(b"lost", B)
    b.send(b"ok", A)
    net.run_until_idle(1.0)
    assert b.received == [] and [d for _, _, d in a.received] == [b"ok"]
    net.heal(["b"], ["a"])
    a.send(b"now", B)
    net.run_until_idle(1.0)
    assert [d for _, _, d in b.received] == [b"now"]


# --- streams ------------------------------------------------------------------------------------


def kinds(ep: CallbackEndpoint) -> list[StreamEventKind]:
    return [e.kind for _, e in ep.events]


def test_stream_connect_accept_data_close() -> None:
    net, (a, b, _) = three_nodes()
    net.set_link("a", "b", LinkConfig(delay=0.010))
    a.connect(("10.0.0.1", 0), B)
    net.run_until(0.010)
    assert kinds(b) == [StreamEventKind.ACCEPTED] and a.events == []
    net.run_until(0.020)
    (t, ev), = a.events
    assert (t, ev.kind, ev.conn[1]) == (0.020, StreamEventKind.CONNECTED, B)
    conn = ev.conn
    assert conn[0] == ("10.0.0.1", 50000)
    a.write(conn, b"hello ")
    a.write(conn, b"world")
    a.close(conn)
    net.run_until_idle(1.0)
    server_conn = (B, conn[0])
    assert b.stream_bytes(server_conn) == b"hello world"
    assert kinds(b)[-1] is StreamEventKind.CLOSED
    assert b.events[-1][0] == pytest.approx(0.030)


def test_stream_to_nobody_is_refused() -> None:
    net, (a, _, _) = three_nodes()
    a.connect(A, ("10.0.0.2", 9))
    a.connect(("10.0.0.1", 0), ("10.9.9.9", 1))
    net.run_until_idle(10.0)
    assert kinds(a) == [StreamEventKind.REFUSED] * 2
    assert a.events[0][0] == pytest.approx(0.0002)  # RST from the host
    assert a.events[1][0] == net.connect_timeout  # no such host: timeout


def test_writes_before_connected_arrive_after_accept() -> None:
    net, (a, b, _) = three_nodes()
    a.connect(A, B)
    a.write((A, B), b"early")
    net.run_until_idle(1.0)
    assert kinds(b) == [StreamEventKind.ACCEPTED, StreamEventKind.DATA]
    assert b.stream_bytes((B, A)) == b"early"


def test_stream_stalls_across_partition_then_resumes_in_order() -> None:
    net, (a, b, _) = three_nodes()
    a.connect(A, B)
    net.run_until(0.1)
    net.partition(["a"], ["b"])
    for part in (b"one", b"two", b"three"):
        a.write((A, B), part)
    net.run_until(5.0)
    assert b.stream_bytes((B, A)) == b""
    net.heal()
    net.run_until_idle(10.0)
    assert b.stream_bytes((B, A)) == b"onetwothree"
    assert b.events[-1][0] > 5.0


def test_partition_can_sever_streams() -> None:
    net, (a, b, c) = three_nodes()
    a.connect(A, B)
    a.connect(A, C)
    net.run_until(0.1)
    net.partition(["a"], ["b"], sever_streams=True)
    net.run_until_idle(1.0)
    assert kinds(a)[-1] is StreamEventKind.RESET and a.events[-1][1].conn == (A, B)
    assert kinds(b)[-1] is StreamEventKind.RESET
    assert kinds(c) == [StreamEventKind.ACCEPTED]
    a.write((A, B), b"dropped")
    net.run_until_idle(2.0)
    assert net.stats["stream_writes_dropped"] == 1


def test_kill_resets_streams_notifies_peers_and_restart_brings_fresh_state() -> None:
    net, (a, b, c) = three_nodes()
    net.set_link("a", "b", LinkConfig(delay=0.010))
    a.connect(A, B)
    c.connect(C, B)
    net.run_until(0.1)
    a.write((A, B), b"in flight")
    net.run_until(0.105)
    net.kill("b")
    net.run_until(0.2)
    assert kinds(a)[-1] is StreamEventKind.RESET
    assert a.events[-1][0] == pytest.approx(0.115)  # RST takes one link delay
    assert kinds(c)[-1] is StreamEventKind.RESET
    assert b.stream_bytes((B, A)) == b""  # a dead node hears nothing
    a.send(b"to the dead", B)
    net.run_until(0.3)
    assert b.received == [] and net.stats["unreachable"] == 1
    fresh = CallbackEndpoint()
    net.restart("b", {2000: fresh})
    a.connect(A, B)
    a.write((A, B), b"again")
    net.run_until_idle(1.0)
    assert fresh.stream_bytes((B, A)) == b"again"
    assert b.events[-1][1].kind is StreamEventKind.ACCEPTED  # the old one never heard more


def test_timers_of_a_dead_node_do_not_fire() -> None:
    net, (a, _, _) = three_nodes()
    fired: list[float] = []
    a.on_timer = fired.append
    a.timer = 1.0
    net.kill("a")
    net.run_until(2.0)
    assert fired == []
    net.restart("a")
    net.run_until(3.0)
    assert fired == [2.0]


@given(
    writes=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=25),
    gaps=st.lists(st.floats(0, 0.01), min_size=25, max_size=25),
    min_size=st.integers(1, 8),
    extra=st.one_of(st.none(), st.integers(0, 200)),
    merge=st.sampled_from([0.0, 0.002, 0.05]),
    jitter=st.sampled_from([0.0, 0.01]),
    seed=st.integers(0, 2**32),
)
def test_stream_chunking_never_changes_the_byte_sequence(
    writes: list[bytes], gaps: list[float], min_size: int, extra: int | None, merge: float,
    jitter: float, seed: int,
) -> None:
    chunking = Chunking(min_size, None if extra is None else min_size + extra, merge)
    net, (a, b, _) = three_nodes(seed, chunking=chunking,
                                 link=LinkConfig(delay=0.001, jitter=jitter))
    a.connect(A, B)
    t = 0.0
    for data, gap in zip(writes, gaps, strict=False):
        t += gap
        net.call_at(t, lambda data=data: a.write((A, B), data))
    net.call_at(t, lambda: a.close((A, B)))
    assert net.run_until_idle(100.0)
    chunks = [e.data for _, e in b.events if e.kind is StreamEventKind.DATA]
    assert b"".join(chunks) == b"".join(writes)
    assert kinds(b)[-1] is StreamEventKind.CLOSED
    if extra is not None:
        assert all(len(c) <= min_size + extra for c in chunks)
    times = [t for t, _ in b.events]
    assert times == sorted(times)


def test_chunking_splits_and_merges() -> None:
    net, (a, b, _) = three_nodes(chunking=Chunking(1, 3, merge_window=0.01))
    a.connect(A, B)
    net.run_until(0.1)
    a.write((A, B), b"abcdefghij")
    net.run_until_idle(1.0)
    split = [e.data for _, e in b.events if e.kind is StreamEventKind.DATA]
    assert len(split) >= 4 and b"".join(split) == b"abcdefghij"

    net, (a, b, _) = three_nodes(chunking=Chunking(merge_window=0.01))
    a.connect(A, B)
    net.run_until(0.1)
    for part in (b"ab", b"cd", b"ef"):
        a.write((A, B), part)
    net.run_until_idle(1.0)
    assert [e.data for _, e in b.events if e.kind is StreamEventKind.DATA] == [b"abcdef"]


# --- determinism and capture --------------------------------------------------------------------


def scenario(seed: int) -> tuple[list[CapturedPacket], SimNetwork]:
    net, (a, b, c) = three_nodes(seed, chunking=Chunking(1, 50, 0.001))
    net.set_link("a", "b", LinkConfig(delay=0.002, jitter=0.003, loss=0.1, duplicate=0.1,
                                      reorder=0.1))
    net.join(C, GROUP)
    net.join(B, GROUP)
    b.on_datagram = lambda data, src, now: b.send(b"ack" + data, src)
    a.connect(A, B)
    for i in range(100):
        net.call_at(0.01 + i * 0.001, lambda i=i: a.send(i.to_bytes(2, "big"), B))
        net.call_at(0.01 + i * 0.001, lambda i=i: a.send(b"mc%d" % i, GROUP))
        net.call_at(0.01 + i * 0.001, lambda i=i: a.write((A, B), bytes([i]) * (i + 1)))
    net.call_at(0.2, lambda: a.close((A, B)))
    c.connect(C, B)
    net.call_at(0.05, lambda: net.kill("c"))
    net.run_until_idle(5.0)
    return net.trace, net


def test_same_seed_same_trace_different_seed_different_trace(tmp_path: Path) -> None:
    trace1, net1 = scenario(42)
    trace2, net2 = scenario(42)
    trace3, _ = scenario(43)
    assert trace1 == trace2
    assert trace1 != trace3
    net1.write_pcap(tmp_path / "1.pcap")
    net2.write_pcap(tmp_path / "2.pcap")
    assert (tmp_path / "1.pcap").read_bytes() == (tmp_path / "2.pcap").read_bytes()


def test_capture_hook_sees_every_delivery() -> None:
    net, (a, _, _) = three_nodes()
    seen: list[CapturedPacket] = []
    net.capture_hooks.append(seen.append)
    a.send(b"x", B)
    a.connect(A, B)
    a.write((A, B), b"y")
    net.run_until_idle(1.0)
    assert seen == net.trace
    assert [(p.proto, p.kind, p.data) for p in seen] == [
        ("udp", "data", b"x"), ("tcp", "syn", b""), ("tcp", "data", b"y")]


def test_without_trace_the_hooks_still_see_every_delivery(tmp_path: Path) -> None:
    kept, _ = scenario(42)
    net, (a, _, _) = three_nodes(keep_trace=False)
    seen: list[CapturedPacket] = []
    net.capture_hooks.append(seen.append)
    a.send(b"x", B)
    a.connect(A, B)
    a.write((A, B), b"y")
    net.run_until_idle(1.0)
    assert net.trace == []
    assert [(p.proto, p.kind, p.data) for p in seen] == [
        ("udp", "data", b"x"), ("tcp", "syn", b""), ("tcp", "data", b"y")]
    with pytest.raises(SimulationError, match="keep_trace"):
        net.write_pcap(tmp_path / "none.pcap")
    assert not (tmp_path / "none.pcap").exists()
    assert kept  # the default keeps it


def test_pcap_export_decodes(tmp_path: Path) -> None:
    trace, net = scenario(7)
    path = tmp_path / "sim.pcap"
    frames = net.write_pcap(path, epoch=1_700_000_000.0)
    records = list(read_capture(path))
    assert len(records) == frames
    segments = [decode_frame(r.linktype, r.data) for r in records]
    udp = [(s.src, s.sport, s.dst, s.dport, s.payload) for s in segments if s.proto == "udp"]
    assert udp == [(p.src[0], p.src[1], p.dst[0], p.dst[1], p.data)
                   for p in trace if p.proto == "udp"]
    assert records[0].ts == pytest.approx(1_700_000_000.0 + trace[0].time)
    # the stream a -> b reassembles from TCP sequence numbers to what was written
    tcp_ab = [s for s in segments
              if s.proto == "tcp" and (s.src, s.sport, s.dst, s.dport) == (*A, *B)]
    assert tcp_ab[0].flags & TCP_SYN and tcp_ab[-1].flags & TCP_FIN
    data = sorted((s.seq, s.payload) for s in tcp_ab if s.payload)
    base = tcp_ab[0].seq + 1
    pos = base
    for seq, payload in data:
        assert seq == pos
        pos += len(payload)
    assert b"".join(p for _, p in data) == b"".join(bytes([i]) * (i + 1) for i in range(100))
    # the stream c -> b was reset when c died: b received an RST from c's address
    assert any(s.flags & TCP_RST and (s.src, s.sport, s.dst, s.dport) == (*C, *B)
               for s in segments)


def test_misuse_is_reported() -> None:
    net, (a, _, _) = three_nodes()
    with pytest.raises(SimulationError):
        net.add_node("a", "10.0.0.7")
    with pytest.raises(SimulationError):
        net.bind("a", 1000, CallbackEndpoint())
    with pytest.raises(SimulationError):
        net.join(A, B)
    with pytest.raises(ValueError, match="probability"):
        LinkConfig(loss=1.5)
    with pytest.raises(ValueError, match="min_size"):
        Chunking(0)
    a.connect(A, B)
    net.run_until(0.1)
    with pytest.raises(SimulationError, match="already exists"):
        net.connect(A, B)
