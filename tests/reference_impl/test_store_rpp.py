"""The reference store's receiver-paced persistence (RPP), driven with real registration bytes:
the guide's "RPP Registration" (every override at its maximum and above it, the consistency
rules, garbled and contradictory registrations, the re-registration refusals, receiver modes
against the repository), "RPP Normal Operations" (stability ACKs withheld until one effective
flight size of room is left, memory and disk acknowledgement, the write delay, release only
after every blocking receiver, non-blocking receivers overrun), "Late Registering Receiver"
(both profiles), "Early Exiting Receiver", "RPP Deregistration", a pre-5.3 store (the
compatibility matrix's first column) and the RPP values across a restart (docs/semantics.md
§1.13, §1.14, §2.1, §2.2).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import journal, rpp, runtime
from reference_impl.config.store_xml import parse_store_config
from reference_impl.context import control
from reference_impl.events import ClientRejected, Level, LogRecord
from reference_impl.fastmsg import data_message
from reference_impl.repository import StoreFileError
from reference_impl.rpp import OVERRIDES, RppValues
from reference_impl.sim import ConnKey, StreamEvent, StreamEventKind, StreamWrite
from reference_impl.store import StoreCore, StoreSettings, TopicPolicy, TopicRule
from reference_impl.webmon import WebMonitor
from wire import lbmr
from wire.lbmc import (
    CFGOPT_SUBTYPE,
    AckType,
    CfgOpt,
    CfgScope,
    Extopt,
    Header,
    MessageType,
    PregError,
    Topicname,
    UmeAck,
    UmePreg,
    UmePregResp,
    UmeRxreq,
)
from wire.lbttcp import LbttcpStream

STORE = ("10.0.0.2", 14567)
REQUEST = ("10.0.0.3", 14391)
TRANSPORT = ("10.0.0.3", 14371)
RESOLVER = ("10.0.0.1", 15380)
RECEIVER_IP = "10.0.0.4"
TRANSPORT_CONN: ConnKey = ((STORE[0], 50001), TRANSPORT)
HEAD = len(data_message(1, 0, b""))  # RPP sizes count the payload only

RPP_POLICY = TopicPolicy(
    repository_allow_receiver_paced_persistence=1, repository_allow_ack_on_reception=1,
    repository_size_threshold=5000, repository_size_limit=10_000,
    repository_disk_file_size_limit=100_000, source_flight_size_bytes_maximum=1000,
    repository_disk_write_delay=500, receiver_activity_timeout=1000)
"""A topic that allows RPP, with small limits (the write delay matters on disk only)."""
DISK = dataclasses.replace(RPP_POLICY, repository_type="disk")


def source_opts(**values: int) -> list[CfgOpt]:
    return [CfgOpt(CfgScope.SOURCE, name, str(value)) for name, value in values.items()]


class Bench:
    """A store core with one topic (``hot``) under ``policy``; sources and receivers register
    on connections of their own with real PREG bytes (their configuration options after the
    PREG, as the wire carries them)."""

    def __init__(self, policy: TopicPolicy, tmp: Path | None = None, *,
                 rpp_supported: bool = True, late_unconsumed: bool = False) -> None:
        self.settings = StoreSettings(
            "s1", STORE[0], STORE[1], topics=(TopicRule(".*", policy, kind="PCRE"),),
            resolver=RESOLVER, seed=1, rpp_supported=rpp_supported,
            rpp_late_join_unconsumed=late_unconsumed,
            disk_cache_directory=tmp / "cache" if tmp else None,
            disk_state_directory=tmp / "state" if tmp else None)
        self.store = StoreCore(self.settings, now=0.0)
        self.now = 1.0
        self.port = 50100
        self.framers: dict[ConnKey, LbttcpStream] = {}
        self.answers: dict[ConnKey, list[Header]] = {}
        self.stable: list[int] = []
        self.retransmitted: dict[ConnKey, list[int]] = {}
        self.logs: list[LogRecord] = []
        self.source_conn: ConnKey | None = None
        self.joined = False

    # --- plumbing -----------------------------------------------------------------------------

    def connect(self, ip: str) -> ConnKey:
        self.port += 1
        key: ConnKey = (STORE, (ip, self.port))
        self.store.stream_event(StreamEvent(StreamEventKind.ACCEPTED, key), self.now)
        return key

    def send(self, key: ConnKey, raw: bytes) -> None:
        self.store.stream_event(StreamEvent(StreamEventKind.DATA, key, raw), self.now)
        self.pump()

    def pump(self) -> None:
        for command in self.store.stream_commands(self.now):
            if not isinstance(command, StreamWrite):
                continue
            framer = self.framers.setdefault(command.conn, LbttcpStream())
            for item in framer.feed(command.data):
                message = item.message
                assert message is not None
                if message.type == MessageType.RETRANS:
                    self.retransmitted.setdefault(command.conn, []).append(message.sqn)
                for h in message.headers:
                    if isinstance(h, UmePregResp):
                        self.answers.setdefault(command.conn, []).append(h)
                    elif isinstance(h, UmeAck) and h.type == AckType.STABLE:
                        assert command.conn == self.source_conn
                        self.stable.append(h.seqnum)
        self.store.datagrams_to_send(self.now)
        for event in self.store.events():
            if isinstance(event, LogRecord):
                self.logs.append(event)

    def answer(self, key: ConnKey) -> Header:
        (resp,) = self.answers.pop(key)
        return resp

    def tick(self, until: float) -> None:
        due = self.store.get_timer()
        while due is not None and due <= until:
            self.now = max(self.now, due)
            self.store.handle_timer(due)
            self.pump()
            due = self.store.get_timer()
        self.now = until

    def warnings(self) -> list[str]:
        out = [r.text for r in self.logs if r.level == Level.WARNING]
        self.logs.clear()
        return out

    # --- clients ------------------------------------------------------------------------------

    def source(self, options: list[CfgOpt] | None = None, *, w: int = 1, reg_id: int = 0,
               d: int = 0, extra: list[object] | None = None) -> Header:
        """Register (or re-register, deregister) the source; its answer."""
        if self.source_conn is None:
            self.source_conn = self.connect(REQUEST[0])
        headers: list[object] = [
            UmePreg(s_flag=1, w_flag=w, d_flag=d, reg_id=reg_id, transport_idx=1, topic_idx=1,
                    resp_port=REQUEST[1], resp_ip=REQUEST[0]), Topicname(topic="hot")]
        headers += [o.header() for o in options or []] + (extra or [])
        self.send(self.source_conn, control(*headers))
        if not self.joined and self.store.sources:
            tir = lbmr.Tir(name="hot", ttl=1, index=1,
                           info=lbmr.TcpInfo(ip=TRANSPORT[0], port=TRANSPORT[1]),
                           options=[lbmr.ToptUme(store=1, src_tcp_port=REQUEST[1],
                                                 src_tcp_addr=REQUEST[0], transport_idx=1)])
            self.store.receive(lbmr.LbmrPacket(tirs=[tir]).build(), RESOLVER, self.now)
            self.store.stream_event(StreamEvent(StreamEventKind.CONNECTED, TRANSPORT_CONN),
                                    self.now)
            self.joined = True
            self.pump()
        return self.answer(self.source_conn)

    @property
    def src_id(self) -> int:
        (reg_id,) = self.store.sources
        return reg_id

    def receiver(self, mode: int = 1, *, reg_id: int = 0, conn: ConnKey | None = None,
                 options: list[CfgOpt] | None = None, d: int = 0) -> tuple[ConnKey, Header]:
        """Register a receiver of the source in ``mode`` (0 SPP, 1 blocking, 2 non-blocking)."""
        key = conn or self.connect(RECEIVER_IP)
        opts = rpp.receiver_options(mode) if options is None else options
        self.send(key, control(
            UmePreg(s_flag=0, w_flag=int(bool(mode)), d_flag=d, reg_id=reg_id,
                    src_reg_id=self.src_id, transport_idx=1, topic_idx=1,
                    resp_port=14500 + self.port % 100, resp_ip=RECEIVER_IP),
            Topicname(topic="hot"), *[o.header() for o in opts]))
        return key, self.answer(key)

    def data(self, *sqns: int, size: int = 100) -> None:
        self.send(TRANSPORT_CONN, b"".join(data_message(1, s, b"p" * size) for s in sqns))

    def consume(self, key: ConnKey, reg_id: int, sqn: int) -> None:
        self.send(key, control(UmeAck(type=AckType.CDELV, transport_idx=1, id_2=reg_id,
                                      rcv_reg_id=reg_id, seqnum=sqn)))

    def held(self) -> list[int]:
        src = self.store.sources[self.src_id]
        assert src.repo is not None
        return src.repo.sqns()


def refused(resp: Header) -> int:
    assert resp.e_flag == 1
    return int(resp.error_code)


def rpp_source(policy: TopicPolicy = RPP_POLICY, tmp: Path | None = None,
               **overrides: int) -> Bench:
    bench = Bench(policy, tmp)
    resp = bench.source(source_opts(**overrides))
    assert (resp.e_flag, resp.w_flag) == (0, 1), bench.warnings()
    return bench


# --- registration: overrides, consistency, garbled and contradictory input -----------------------


@pytest.mark.parametrize("override", [o for o in OVERRIDES if not o.flag], ids=lambda o: o.option)
def test_each_override_is_granted_at_its_maximum_and_refused_above(override: rpp.Override,
                                                                   tmp_path: Path) -> None:
    top = getattr(DISK, override.policy_field)
    bench = rpp_source(DISK, tmp_path / "a", **{override.option: top})
    (src,) = bench.store.sources.values()
    assert src.rpp_values == rpp.store_values(DISK)
    bench.store.close()

    other = Bench(DISK, tmp_path / "b")
    assert refused(other.source(source_opts(**{override.option: top + 1}))) == PregError.ECONFIG
    (line,) = other.warnings()
    assert override.option in line and str(top + 1) in line and str(top) in line
    assert override.store_option in line
    assert not other.store.sources
    other.store.close()


def test_lower_values_are_the_repository_s() -> None:
    bench = rpp_source(ume_flight_size_bytes=400, ume_repository_size_threshold=3000,
                       ume_repository_size_limit=8000, ume_repository_ack_on_reception=1)
    (src,) = bench.store.sources.values()
    assert src.rpp_values == RppValues(400, 500, 1, 3000, 8000, 100_000)
    assert src.repo is not None
    assert (src.repo.limits.size_threshold, src.repo.limits.size_limit) == (3000, 8000)
    assert src.repo.limits.write_delay == 0  # a memory repository writes nothing


@pytest.mark.parametrize(("disk", "overrides", "words"), [
    (False, {"ume_repository_size_limit": 4000}, ["threshold 5000", "size limit 4000"]),
    (True, {"ume_repository_disk_file_size_limit": 11_000}, ["size limit 10000", "90%",
                                                              "11000"]),
    (False, {"ume_repository_size_threshold": 1000}, ["threshold 1000", "flight size 1000"]),
    (False, {"ume_flight_size_bytes": 1000, "ume_repository_size_threshold": 900},
     ["threshold 900", "flight size 1000"]),
], ids=["threshold-above-limit", "limit-above-90pc-of-file", "threshold-not-above-flight",
        "threshold-below-flight"])
def test_inconsistent_effective_values_are_refused(disk: bool, overrides: dict[str, int],
                                                   words: list[str], tmp_path: Path) -> None:
    bench = Bench(DISK if disk else RPP_POLICY, tmp_path if disk else None)
    assert refused(bench.source(source_opts(**overrides))) == PregError.ECONFIG
    (line,) = bench.warnings()
    assert "inconsistent RPP values" in line and all(w in line for w in words), line
    assert not bench.store.sources


def test_the_90_percent_rule_is_for_disk_repositories_only() -> None:
    policy = dataclasses.replace(RPP_POLICY, repository_disk_file_size_limit=10_000)
    bench = rpp_source(policy)  # memory: the disk file limit does not bound the size limit
    assert bench.store.sources


def test_ack_on_reception_asked_without_permission_is_refused() -> None:
    bench = Bench(dataclasses.replace(RPP_POLICY, repository_allow_ack_on_reception=0))
    assert refused(bench.source(source_opts(ume_repository_ack_on_reception=1))) == \
        PregError.ECONFIG
    (line,) = bench.warnings()
    assert "ume_repository_ack_on_reception 1" in line
    assert "repository-allow-ack-on-reception is 0" in line


@pytest.mark.parametrize("option", ["ume_write_delay", "ume_repository_disk_file_size_limit"])
def test_disk_only_overrides_are_refused_on_memory_repositories(option: str) -> None:
    bench = Bench(RPP_POLICY)
    assert refused(bench.source(source_opts(**{option: 10}))) == PregError.ECONFIG
    (line,) = bench.warnings()
    assert option in line and "memory" in line


GARBLED = {
    "not-a-number": [CfgOpt(CfgScope.SOURCE, "ume_flight_size_bytes", "10k")],
    "unknown-name": [CfgOpt(CfgScope.SOURCE, "ume_flight_size", "10")],
    "twice": source_opts(ume_flight_size_bytes=10) * 2,
    "receiver-scope": [CfgOpt(CfgScope.RECEIVER, "ume_flight_size_bytes", "10")],
    "flag-not-0-or-1": [CfgOpt(CfgScope.SOURCE, "ume_repository_ack_on_reception", "2")],
}


@pytest.mark.parametrize("options", GARBLED.values(), ids=GARBLED.keys())
def test_garbled_options_are_refused(options: list[CfgOpt]) -> None:
    bench = Bench(RPP_POLICY)
    assert refused(bench.source(options)) == PregError.ECONFIG
    (line,) = bench.warnings()
    assert "garbled RPP option" in line and options[0].name in line


def test_an_option_that_is_not_a_whole_cfgopt_is_refused() -> None:
    bench = Bench(RPP_POLICY)
    broken = Extopt(subtype=CFGOPT_SUBTYPE, data=b"\x01\x00ume_flight_size_bytes")  # no NULs
    assert refused(bench.source([], extra=[broken])) == PregError.ECONFIG
    assert "garbled RPP option" in bench.warnings()[0]


def test_options_without_the_rpp_flag_are_contradictory() -> None:
    bench = Bench(RPP_POLICY)
    assert refused(bench.source(source_opts(ume_flight_size_bytes=10), w=0)) == \
        PregError.ECONFIG
    (line,) = bench.warnings()
    assert "contradictory" in line and "ume_flight_size_bytes 10" in line
    assert not bench.store.sources


def test_rpp_source_on_a_topic_that_does_not_allow_rpp_is_refused() -> None:
    bench = Bench(dataclasses.replace(RPP_POLICY, repository_allow_receiver_paced_persistence=0))
    assert refused(bench.source()) == PregError.ECONFIG
    assert "RPP is not allowed" in bench.warnings()[0]
    resp = bench.source(w=0)  # the same source as SPP is granted, without the flag
    assert (resp.e_flag, resp.w_flag) == (0, 0)


@pytest.mark.parametrize(("options", "w", "words"), [
    ([CfgOpt(CfgScope.RECEIVER, rpp.RPP_OPTION, "2")], 0, "RPP flag clear"),
    ([CfgOpt(CfgScope.RECEIVER, rpp.RPP_OPTION, "3")], 1, f"{rpp.RPP_OPTION} 3"),
    ([CfgOpt(CfgScope.RECEIVER, "ume_flight_size_bytes", "3")], 1, "unexpected receiver"),
], ids=["mode-without-flag", "mode-3", "unknown-receiver-option"])
def test_garbled_and_contradictory_receiver_registrations_are_refused(
        options: list[CfgOpt], w: int, words: str) -> None:
    bench = rpp_source()
    bench.warnings()
    _key, resp = bench.receiver(w, options=options)
    assert refused(resp) == PregError.ECONFIG
    assert words in bench.warnings()[0]
    assert not bench.store.receivers


# --- re-registration ---------------------------------------------------------------------------


def test_source_switching_modes_or_values_is_refused_each_with_its_own_line() -> None:
    bench = Bench(RPP_POLICY)
    first = bench.source(w=0)
    spp_id = first.reg_id
    assert refused(bench.source(w=1, reg_id=spp_id)) == PregError.ECONFIG
    assert "previously SPP source re-registers as RPP" in bench.warnings()[0]

    other = rpp_source(ume_flight_size_bytes=500)
    reg_id = other.src_id
    other.warnings()
    assert refused(other.source(w=0, reg_id=reg_id)) == PregError.ECONFIG
    assert "previously RPP source re-registers as SPP" in other.warnings()[0]
    assert refused(other.source(source_opts(ume_flight_size_bytes=600), reg_id=reg_id)) == \
        PregError.ECONFIG
    (line,) = other.warnings()
    assert "ume_flight_size_bytes 600" in line and "has 500" in line
    # the same values are granted, with OLD and the RPP flag
    again = other.source(source_opts(ume_flight_size_bytes=500), reg_id=reg_id)
    assert (again.e_flag, again.o_flag, again.w_flag) == (0, 1, 1)


def test_receiver_switching_modes_is_refused_each_with_its_own_line() -> None:
    spp = Bench(RPP_POLICY)
    spp.source(w=0)
    key, resp = spp.receiver(0)
    assert refused(spp.receiver(1, reg_id=resp.reg_id, conn=key)[1]) == PregError.ECONFIG
    assert "previously SPP receiver re-registers as RPP" in spp.warnings()[0]

    bench = rpp_source()
    key, resp = bench.receiver(1)
    for mode, words in ((2, "previously blocking RPP receiver re-registers as non-blocking"),
                        (0, "previously RPP receiver re-registers as SPP")):
        assert refused(bench.receiver(mode, reg_id=resp.reg_id, conn=key)[1]) == \
            PregError.ECONFIG
        assert words in bench.warnings()[0]
    key2, resp2 = bench.receiver(2)
    assert refused(bench.receiver(1, reg_id=resp2.reg_id, conn=key2)[1]) == PregError.ECONFIG
    assert "previously non-blocking RPP receiver re-registers as blocking" in \
        bench.warnings()[0]
    assert {r.rpp for r in bench.store.receivers.values()} == {1, 2}


@pytest.mark.parametrize(("repository", "mode", "granted"), [
    (0, 0, True), (0, 1, False), (0, 2, False), (1, 0, False), (1, 1, True), (1, 2, True)])
def test_receiver_mode_against_the_repository(repository: int, mode: int,
                                              granted: bool) -> None:
    bench = Bench(RPP_POLICY)
    bench.source(w=repository)
    _, resp = bench.receiver(mode)
    if granted:
        assert (resp.e_flag, resp.w_flag) == (0, int(bool(mode)))
        (rcv,) = bench.store.receivers.values()
        assert rcv.rpp == mode
    else:
        assert refused(resp) == PregError.ECONFIG
        assert not bench.store.receivers


def test_a_refused_registration_leaves_every_other_client_alone() -> None:
    bench = rpp_source()
    key, resp = bench.receiver(1)
    bench.data(0, 1, 2)
    bench.consume(key, resp.reg_id, 0)
    store = bench.store
    before = [(s.reg_id, s.rpp_values, s.repo.sqns() if s.repo else None, s.active)
              for s in store.sources.values()]
    receivers = [(r.reg_id, r.rpp, r.last_ack, r.floor) for r in store.receivers.values()]
    assert refused(bench.source(source_opts(ume_flight_size_bytes=999), reg_id=bench.src_id))
    assert refused(bench.receiver(2, reg_id=resp.reg_id, conn=key)[1])
    assert refused(bench.receiver(0)[1])
    assert [(s.reg_id, s.rpp_values, s.repo.sqns() if s.repo else None, s.active)
            for s in store.sources.values()] == before
    assert [(r.reg_id, r.rpp, r.last_ack, r.floor)
            for r in store.receivers.values()] == receivers
    bench.data(3)
    assert bench.stable == [0, 1, 2, 3]


# --- normal operation ----------------------------------------------------------------------------


def test_stability_acks_wait_for_one_effective_flight_size_of_room() -> None:
    # limit 10000, effective flight 2000 (the topic's maximum is 4000)
    policy = dataclasses.replace(RPP_POLICY, source_flight_size_bytes_maximum=4000)
    bench = rpp_source(policy, ume_flight_size_bytes=2000)
    key, resp = bench.receiver(1)
    bench.data(*range(7), size=1000)  # 7000 held: 3000 of room, below the topic's maximum
    assert bench.stable == list(range(7))
    bench.data(7, size=1000)  # 8000: exactly one flight of room
    bench.data(8, size=500)   # 8500: less than a flight left
    bench.data(9, size=100)
    assert bench.stable == list(range(8))
    (src,) = bench.store.sources.values()
    assert src.unacked == [8, 9] and src.repo is not None and src.repo.used_bytes == 8600
    bench.consume(key, resp.reg_id, 0)  # releases 1000: 2400 of room
    assert bench.stable == list(range(10))


def test_a_memory_repository_acknowledges_on_reception() -> None:
    bench = rpp_source()  # the topic's write delay does not apply to memory
    bench.data(0, 1)
    assert bench.stable == [0, 1]


def test_disk_acknowledges_after_the_write_delay(tmp_path: Path) -> None:
    bench = rpp_source(DISK, tmp_path)
    bench.receiver(1)
    (src,) = bench.store.sources.values()
    assert src.repo is not None and src.repo.cache_file is not None
    bench.data(0, 1)
    assert bench.stable == [] and src.repo.cache_file.read_bytes() == b""
    bench.tick(bench.now + 0.4)
    assert bench.stable == []
    bench.tick(bench.now + 0.2)
    assert bench.stable == [0, 1]
    on_disk = [i.message.sqn for i in LbttcpStream().feed(src.repo.cache_file.read_bytes())
               if i.message]
    assert on_disk == [0, 1]
    assert src.repo.disk_writes_skipped == 0
    bench.store.close()


def test_disk_without_write_delay_acknowledges_after_the_write(tmp_path: Path) -> None:
    bench = rpp_source(dataclasses.replace(DISK, repository_disk_write_delay=0), tmp_path)
    (src,) = bench.store.sources.values()
    bench.data(0)
    assert bench.stable == [0]
    assert src.repo is not None and src.repo.cache_file is not None
    assert len(LbttcpStream().feed(src.repo.cache_file.read_bytes())) == 1
    bench.store.close()


def test_ack_on_reception_acknowledges_before_the_write(tmp_path: Path) -> None:
    bench = rpp_source(DISK, tmp_path, ume_repository_ack_on_reception=1)
    bench.receiver(1)
    (src,) = bench.store.sources.values()
    assert src.repo is not None and src.repo.cache_file is not None
    bench.data(0, 1)
    assert bench.stable == [0, 1]  # durable-before-ACK deliberately does not hold here
    assert src.repo.cache_file.read_bytes() == b""
    bench.tick(bench.now + 0.6)
    assert len(LbttcpStream().feed(src.repo.cache_file.read_bytes())) == 2
    bench.store.close()


def test_messages_consumed_within_the_write_delay_never_reach_the_disk(tmp_path: Path) -> None:
    bench = rpp_source(DISK, tmp_path)
    key, resp = bench.receiver(1)
    key2, resp2 = bench.receiver(1)
    bench.data(0, 1, 2)
    bench.consume(key, resp.reg_id, 1)
    assert bench.stable == []  # one blocking receiver still needs them
    bench.consume(key2, resp2.reg_id, 1)
    assert bench.stable == [0, 1]  # consumed by every blocking receiver: acknowledged at once
    bench.tick(bench.now + 0.6)
    assert bench.stable == [0, 1, 2]
    (src,) = bench.store.sources.values()
    assert src.repo is not None and src.repo.cache_file is not None
    on_disk = [i.message.sqn for i in LbttcpStream().feed(src.repo.cache_file.read_bytes())
               if i.message]
    assert on_disk == [2] and src.repo.disk_writes_skipped == 2
    sources: Any = bench.store.snapshot()["sources"]
    (shown,) = sources
    assert shown["disk_writes_skipped"] == 2
    monitor = WebMonitor([bench.store], version="1", clock=lambda: bench.now)
    page = monitor.render(f"/stores/0/{src.reg_id}").body.decode()
    assert "<LI>Disk Writes Skipped: 2\n" in page
    data = json.loads(monitor.render(f"/stores/0/{src.reg_id}?format=json").body)
    assert data["disk_writes_skipped"] == 2
    bench.store.close()


def test_release_waits_for_every_blocking_receiver() -> None:
    bench = rpp_source()
    (k1, r1), (k2, r2) = bench.receiver(1), bench.receiver(1)
    bench.data(0, 1, 2, 3)
    bench.consume(k1, r1.reg_id, 3)
    assert bench.held() == [0, 1, 2, 3]
    bench.consume(k2, r2.reg_id, 1)  # cumulative: 0 and 1
    assert bench.held() == [2, 3]
    bench.consume(k2, r2.reg_id, 0)  # an older ACK changes nothing
    assert bench.held() == [2, 3]


def test_non_blocking_receivers_hold_nothing_back_and_may_be_overrun() -> None:
    bench = rpp_source()
    kb, rb = bench.receiver(1)
    kn, rn = bench.receiver(2)
    bench.data(0, 1, 2)
    bench.consume(kb, rb.reg_id, 2)
    assert bench.held() == []
    bench.send(kn, control(UmeRxreq(request_idx=1, transport_idx=1, id_2=rn.reg_id, seqnum=1,
                                    rx_port=14500, rx_ip=RECEIVER_IP)))
    assert bench.retransmitted.get(kn, []) == []


def test_with_no_blocking_receiver_the_size_threshold_releases() -> None:
    bench = rpp_source()  # threshold 5000
    bench.receiver(2)
    bench.data(*range(10), size=1000)
    assert bench.held() == [5, 6, 7, 8, 9]
    assert bench.stable == list(range(10))  # never short of room


# --- late, early exiting and deregistering receivers ---------------------------------------------


@pytest.mark.parametrize("late_unconsumed", [False, True], ids=["current", "guide-5.3"])
def test_a_late_receiver_starts_at_the_next_or_the_oldest_unconsumed(
        late_unconsumed: bool) -> None:
    bench = Bench(RPP_POLICY, late_unconsumed=late_unconsumed)
    bench.source()
    key, first = bench.receiver(1)
    assert first.low_seqnum == 0  # before the first message
    bench.data(0, 1, 2, 3)
    bench.consume(key, first.reg_id, 1)
    _, late = bench.receiver(1)
    assert late.low_seqnum == (2 if late_unconsumed else 4)
    assert bench.held() == [2, 3]


def test_a_re_registering_receiver_gets_everything_since_its_last_ack() -> None:
    bench = rpp_source()
    key, resp = bench.receiver(1)
    bench.data(0, 1, 2)
    again = bench.receiver(1, reg_id=resp.reg_id, conn=key)[1]
    assert (again.o_flag, again.low_seqnum) == (1, 0)  # nothing acknowledged yet
    bench.consume(key, resp.reg_id, 1)
    assert bench.receiver(1, reg_id=resp.reg_id, conn=key)[1].low_seqnum == 2


def test_an_early_exiting_receiver_holds_its_messages_until_its_state_lifetime() -> None:
    policy = dataclasses.replace(RPP_POLICY, receiver_activity_timeout=1000,
                                 receiver_state_lifetime=5000)
    bench = rpp_source(policy)
    (k1, r1), (k2, r2) = bench.receiver(1), bench.receiver(1)
    bench.data(0, 1, 2)
    bench.consume(k1, r1.reg_id, 0)
    start = bench.now
    for t in range(1, 8):  # k2 keeps consuming, k1 went quiet
        bench.tick(start + t * 0.5)
        bench.consume(k2, r2.reg_id, 2)
    assert not bench.store.receivers[r1.reg_id].active  # inactive after its activity timeout
    assert bench.held() == [1, 2]  # still held for it
    bench.tick(start + 6.5)
    assert r1.reg_id not in bench.store.receivers  # lifetime over: deleted, held ones released
    assert bench.held() == []


def test_an_early_exiting_receiver_recovers_if_it_returns_in_time() -> None:
    policy = dataclasses.replace(RPP_POLICY, receiver_state_lifetime=5000)
    bench = rpp_source(policy)
    key, resp = bench.receiver(1)
    bench.data(0, 1, 2)
    bench.consume(key, resp.reg_id, 0)
    bench.tick(bench.now + 3)
    assert not bench.store.receivers[resp.reg_id].active
    again = bench.receiver(1, reg_id=resp.reg_id, conn=key)[1]
    assert (again.e_flag, again.o_flag, again.low_seqnum) == (0, 1, 1)
    bench.send(key, control(UmeRxreq(request_idx=1, transport_idx=1, id_2=resp.reg_id,
                                     seqnum=2, rx_port=14500, rx_ip=RECEIVER_IP)))
    assert bench.retransmitted[key] == [2]


def test_without_a_state_lifetime_the_activity_timeout_ends_the_hold() -> None:
    bench = rpp_source()  # receiver activity timeout 1 s, no lifetime
    (_, quiet), (key, busy) = bench.receiver(1), bench.receiver(1)
    bench.data(0, 1)
    for _t in range(1, 5):
        bench.tick(bench.now + 0.5)
        bench.consume(key, busy.reg_id, 1)
    assert quiet.reg_id not in bench.store.receivers and bench.held() == []


def test_receiver_deregistration_lowers_the_acks_a_message_needs() -> None:
    bench = rpp_source()
    (k1, r1), (k2, r2) = bench.receiver(1), bench.receiver(1)
    bench.data(0, 1, 2)
    bench.consume(k1, r1.reg_id, 2)
    assert bench.held() == [0, 1, 2]
    _, bye = bench.receiver(1, reg_id=r2.reg_id, conn=k2, d=1)
    assert (bye.e_flag, bye.d_flag) == (0, 1)
    assert r2.reg_id not in bench.store.receivers and bench.held() == []


def test_source_deregistration_deletes_its_messages_at_once(tmp_path: Path) -> None:
    bench = rpp_source(dataclasses.replace(DISK, repository_disk_write_delay=0), tmp_path)
    bench.receiver(1)
    bench.data(0, 1)
    (src,) = bench.store.sources.values()
    assert src.repo is not None and src.repo.cache_file is not None
    cache = src.repo.cache_file
    assert cache.exists() and src.repo.sqns() == [0, 1]
    bye = bench.source(reg_id=src.reg_id, d=1)
    assert (bye.e_flag, bye.d_flag) == (0, 1)
    assert not bench.store.sources and not bench.store.receivers
    assert not cache.exists() and len(src.repo) == 0
    bench.store.close()


# --- a pre-5.3 store -----------------------------------------------------------------------------


def test_a_pre_5_3_store_grants_everything_as_spp_without_the_flag() -> None:
    bench = Bench(dataclasses.replace(RPP_POLICY, repository_allow_receiver_paced_persistence=0),
                  rpp_supported=False)
    resp = bench.source(source_opts(ume_flight_size_bytes=999_999))  # not even read
    assert (resp.e_flag, resp.w_flag) == (0, 0)
    (src,) = bench.store.sources.values()
    assert (src.rpp, src.rpp_values) == (0, None)
    for mode in (0, 1, 2):
        _, answer = bench.receiver(mode)
        assert (answer.e_flag, answer.w_flag) == (0, 0)
    assert {r.rpp for r in bench.store.receivers.values()} == {0}
    assert not [e for e in bench.store.events() if isinstance(e, ClientRejected)]


# --- disk state ----------------------------------------------------------------------------------


def test_a_restarted_store_keeps_the_rpp_values(tmp_path: Path) -> None:
    bench = rpp_source(DISK, tmp_path, ume_flight_size_bytes=700, ume_write_delay=100)
    _key, resp = bench.receiver(1)
    reg_id = bench.src_id
    values = bench.store.sources[reg_id].rpp_values
    bench.store.close()

    again = Bench(DISK, tmp_path)
    src = again.store.sources[reg_id]
    assert src.rpp == 1 and src.rpp_values == values
    assert src.repo is not None and src.repo.limits.write_delay == 0.1
    assert again.store.receivers[resp.reg_id].floor == -1
    assert refused(again.source(source_opts(ume_flight_size_bytes=800), reg_id=reg_id)) == \
        PregError.ECONFIG
    assert "ume_flight_size_bytes 800" in again.warnings()[0]
    ok = again.source(source_opts(ume_flight_size_bytes=700, ume_write_delay=100), reg_id=reg_id)
    assert (ok.e_flag, ok.o_flag, ok.w_flag) == (0, 1, 1)
    again.store.close()


def test_the_journal_knows_the_rpp_values_fields() -> None:
    assert tuple(f.name for f in dataclasses.fields(RppValues)) == journal._RPP_FIELDS


@pytest.mark.parametrize(("values", "words"), [
    ({"flight_size_bytes": 1}, "rpp_values must be an object"),
    ({**RppValues(1, 2, 2, 4, 5, 6).as_dict()}, "rpp_values ack_on_reception"),
    ({**RppValues(1, 2, 0, 4, 5, 6).as_dict(), "flight_size_bytes": -1},
     "rpp_values flight_size_bytes"),
    ("x", "rpp_values must be an object"),
])
def test_a_journal_with_bad_rpp_values_is_refused(values: object, words: str,
                                                  tmp_path: Path) -> None:
    bench = rpp_source(DISK, tmp_path)
    bench.store.close()
    state = next((tmp_path / "state").glob("*.state"))
    lines = state.read_text().splitlines()
    record = json.loads(lines[0])
    record["client"]["rpp_values"] = values
    state.write_text(json.dumps(record) + "\n")
    with pytest.raises(StoreFileError, match=words):
        Bench(DISK, tmp_path)


# --- the profile reaches the store ---------------------------------------------------------------

PROFILE_XML = """<?xml version="1.0"?>
<ume-store version="1.2">
  <daemon><web-monitor>127.0.0.1:15404</web-monitor></daemon>
  <stores>
    <store name="s" port="14667">
      <ume-attributes>
        <option type="store" name="disk-cache-directory" value="cache"/>
        <option type="store" name="disk-state-directory" value="state"/>
      </ume-attributes>
      <topics>
        <topic pattern=".*" type="PCRE">
          <ume-attributes>
            <option type="store" name="repository-type" value="memory"/>
            <option type="store" name="repository-allow-receiver-paced-persistence"
                    value="1"/>
          </ume-attributes>
        </topic>
      </topics>
    </store>
  </stores>
</ume-store>
"""


@pytest.mark.parametrize(("profile", "supported", "late", "warned"), [
    ("current", True, False, False), ("guide-5.3", True, True, False),
    ("pre-5.3", False, False, True)])
def test_store_settings_take_rpp_from_the_profile(profile: str, supported: bool, late: bool,
                                                  warned: bool, tmp_path: Path) -> None:
    config = parse_store_config(PROFILE_XML, "s.xml", profile=profile)
    notes = [w.message for w in config.warnings if "receiver-paced" in w.message]
    assert bool(notes) == warned
    if warned:
        assert "has no effect" in notes[0] and "pre-5.3" in notes[0]
    settings = runtime.store_settings(config.stores[0], resolver=RESOLVER, base=tmp_path,
                                      profile=config.profile)
    assert (settings.rpp_supported, settings.rpp_late_join_unconsumed) == (supported, late)


def test_a_restarted_store_releases_what_was_consumed_before(tmp_path: Path) -> None:
    policy = dataclasses.replace(DISK, repository_disk_write_delay=0)
    bench = rpp_source(policy, tmp_path)
    key, resp = bench.receiver(1)
    bench.data(0, 1, 2, 3)
    bench.consume(key, resp.reg_id, 1)
    assert bench.held() == [2, 3]
    bench.store.close()
    again = Bench(policy, tmp_path)  # the cache file still has 0 and 1: released again
    assert again.held() == [2, 3]
    assert again.store.receivers[resp.reg_id].last_ack == 1
    again.store.close()


def test_an_rpp_source_journalled_without_its_values_gets_the_topic_s(tmp_path: Path) -> None:
    bench = rpp_source(DISK, tmp_path)
    bench.receiver(1)
    bench.store.close()
    state = next((tmp_path / "state").glob("*.state"))
    records = [json.loads(line) for line in state.read_text().splitlines()]
    for record in records:
        record.get("client", {}).pop("rpp_values", None)
        record.get("client", {}).pop("floor", None)
    state.write_text("".join(json.dumps(r) + "\n" for r in records))
    again = Bench(DISK, tmp_path)
    (src,) = again.store.sources.values()
    assert src.rpp_values == rpp.store_values(DISK)
    (rcv,) = again.store.receivers.values()
    assert rcv.floor is None
    again.store.close()


@pytest.mark.parametrize("floor", ["x", -2, 1 << 40, 1.5])
def test_a_journal_with_a_bad_receiver_floor_is_refused(floor: object, tmp_path: Path) -> None:
    bench = rpp_source(DISK, tmp_path)
    bench.receiver(1)
    bench.store.close()
    state = next((tmp_path / "state").glob("*.state"))
    records = [json.loads(line) for line in state.read_text().splitlines()]
    for record in records:
        if record.get("client", {}).get("role") == "receiver":
            record["client"]["floor"] = floor
    state.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(StoreFileError, match="floor must be"):
        Bench(DISK, tmp_path)


steps = st.lists(st.one_of(
    st.tuples(st.just("data"), st.integers(1, 4)),
    st.tuples(st.just("consume"), st.integers(0, 1)),
    st.tuples(st.just("tick"), st.sampled_from([0.1, 0.3, 0.6]))), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(script=steps, delay=st.sampled_from([0, 200]))
def test_rpp_disk_acks_only_written_or_consumed_messages(script: list[tuple[str, Any]],
                                                         delay: int) -> None:
    """Durable before acknowledged, RPP edition: without ack on reception, every message a
    disk store called stable is in its cache file, or every blocking receiver consumed it."""
    with tempfile.TemporaryDirectory() as tmp:
        policy = dataclasses.replace(DISK, repository_disk_write_delay=delay,
                                     receiver_activity_timeout=600_000)
        bench = rpp_source(policy, Path(tmp))
        receivers = [bench.receiver(1), bench.receiver(1)]
        (src,) = bench.store.sources.values()
        assert src.repo is not None and src.repo.cache_file is not None
        sent = 0
        for what, arg in script:
            if what == "data":
                bench.data(*range(sent, sent + arg))
                sent += arg
            elif what == "consume" and sent:
                key, resp = receivers[arg]
                bench.consume(key, resp.reg_id, sent - 1)
            elif what == "tick":
                bench.tick(bench.now + arg)
            on_disk = {i.message.sqn for i in
                       LbttcpStream().feed(src.repo.cache_file.read_bytes()) if i.message}
            marks = [bench.store.receivers[r.reg_id].consumed() for _, r in receivers]
            consumed = min(-1 if m is None else m for m in marks)
            assert all(s in on_disk or s <= consumed for s in bench.stable)
        bench.tick(bench.now + 1)
        assert sorted(bench.stable) == list(range(sent))  # each acknowledged in the end
        bench.store.close()
