"""The cores backend: captures played by the reference implementation's sans-IO cores.

What must hold whatever the cores' details (other work changes them): every frame dissects
cleanly and as tshark dissects it, the sidecar's counts equal an independent recount from the
capture and agree with the events the cores reported, runs are deterministic, restarts show
re-registrations with the OLD flag, every output format holds the same frames, and scenarios
the cores cannot play are refused with a message (or played over LBT-TCP when asked).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from captures import cli
from captures.cores import CoresBackend, TcpFrames
from captures.generator import (
    CaptureFormat,
    FrameSink,
    RunPlan,
    generate,
    port_map,
    select_backend,
)
from captures.scenarios import PRESETS, Restart, Scenario, ScenarioError, Transport, preset
from wire.dissect import FrameReport, check_against_tshark, dissect_file
from wire.pcap import read_capture, tcp_frame
from wire.tshark import PortMap

from .test_generator import flatten, recount

PORTS = PortMap(store_ports=[14567])
CORES_PRESETS = sorted(n for n, s in PRESETS.items() if select_backend("auto", s).name == "cores")
SIZES = {"tcp-restarts": 600}
"""Messages per preset in these tests (the presets' own sizes, except a shorter restart run)."""


def _meta(path: Path) -> dict[str, Any]:
    return dict(json.loads(Path(f"{path}.meta.json").read_text()))


def _reports(path: Path) -> list[FrameReport]:
    return list(dissect_file(path, PORTS))


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("cores")
    made = {}
    for name in CORES_PRESETS:
        path = out / f"{name}.pcap"
        generate(preset(name), path, seed=11, messages=SIZES.get(name), progress=False)
        made[name] = path
    return made


def _lbmc(reports: list[FrameReport]) -> list[tuple[FrameReport, dict[str, Any]]]:
    out = []
    for r in reports:
        for occ in r.occurrences:
            if occ.protocol == "lbmc":
                fields: dict[str, Any] = {}
                for name, value in occ.fields:
                    fields.setdefault(name, value)
                out.append((r, fields))
    return out


# --- the capture through the oracle and the recount -----------------------------------------------


def test_the_tcp_presets_are_played_by_the_cores() -> None:
    assert CORES_PRESETS == ["tcp-basic", "tcp-qc", "tcp-restarts"]
    for name in ("basic", "qc3", "lossy-lbtrm", "restarts", "big"):
        assert select_backend("auto", preset(name)).name == "wire", name


@pytest.mark.oracle
@pytest.mark.parametrize("name", CORES_PRESETS)
def test_every_frame_dissects_as_tshark_dissects_it(name: str, captures: dict[str, Path]
                                                    ) -> None:
    path = captures[name]
    reports = _reports(path)
    assert reports and {r.status for r in reports} <= {"um", "not-um"}  # nothing malformed
    assert check_against_tshark(path, reports, port_map(preset(name))) == []
    assert _meta(path)["events"]["malformed_frames"] == 0


@pytest.mark.parametrize("name", CORES_PRESETS)
def test_sidecar_counts_equal_an_independent_recount(name: str, captures: dict[str, Path]
                                                     ) -> None:
    path = captures[name]
    meta = _meta(path)
    assert meta["generator"]["backend"] == "cores"
    expected = flatten(meta["expected"])
    assert recount(_reports(path)) == expected
    assert expected["frames",] == sum(1 for _ in read_capture(path))


@pytest.mark.parametrize("name", CORES_PRESETS)
def test_registrations_in_the_capture_are_what_the_stores_reported(
        name: str, captures: dict[str, Path]) -> None:
    """``expected`` comes from the frames, ``events`` from the cores: they must tell one story."""
    meta = _meta(captures[name])
    frames, events = flatten(meta["expected"]), flatten(meta["events"])
    for role in ("source", "receiver"):
        granted = events["store", "registered", role, "new"] + \
            events["store", "registered", role, "old"]
        assert granted == frames["registrations", role, "accepted"] > 0, role
        assert events["store", "registered", role, "old"] == \
            frames["registrations", role, "old-client"]
        refused = {k[-1]: v for k, v in events.items() if k[:3] == ("store", "rejected", role)}
        assert refused == {k[-1]: v for k, v in frames.items()
                           if k[:2] == ("registrations", role) and k[-1].startswith("error-")}
    assert meta["messages_sent"] == SIZES.get(name, preset(name).messages)
    assert sum(t["messages"] for t in meta["topics"]) == meta["messages_sent"]


def test_a_run_without_restarts_delivers_everything_once(captures: dict[str, Path]) -> None:
    meta = _meta(captures["tcp-qc"])
    sc = preset("tcp-qc")
    sent = meta["messages_sent"]
    events, frames = flatten(meta["events"]), flatten(meta["expected"])
    assert events["receiver", "delivered"] == sent * sc.receivers
    # every store acknowledges every message; the source reports stability until a quorum
    assert frames["acks", "stable"] == sent * sc.stores
    assert sent * (sc.stores // 2 + 1) <= events["source", "stable"] <= sent * sc.stores
    assert events["source", "reclaimed"] == sent
    # LBT-TCP fans every message out to each connected receiver and store
    assert frames["lbmc", "DATA"] == sent * (sc.receivers + sc.stores)
    for receiver in meta["receivers"]:
        assert receiver["delivered"] == {t["name"]: t["messages"] for t in meta["topics"]}


@pytest.mark.parametrize("name", CORES_PRESETS)
def test_each_topic_numbers_its_messages_from_zero_without_holes(
        name: str, captures: dict[str, Path]) -> None:
    path = captures[name]
    meta = _meta(path)
    source_of = {t["transport_addr"].split(":")[0]: t for t in meta["topics"]}
    sqns: dict[str, set[int]] = defaultdict(set)
    for r, f in _lbmc(_reports(path)):
        if f["lbmc.type"] == 0 and r.sport == 14371 and r.src in source_of:
            sqns[source_of[r.src]["name"]].add(f["lbmc.sqn"])
    restarts = len(preset(name).source_restarts)
    for topic in meta["topics"]:
        seen = sqns[topic["name"]]
        assert seen == set(range(len(seen))), topic["name"]
        # a message sent just before its source died may be sent again after the restart
        assert topic["messages"] - restarts <= len(seen) <= topic["messages"]


def test_restarts_reregister_with_the_old_flag(captures: dict[str, Path]) -> None:
    path = captures["tcp-restarts"]
    meta = _meta(path)
    sc = preset("tcp-restarts")
    ip_of = {name: ip for ip, name in meta["hosts"].items()}
    history: dict[tuple[str | None, int], list[str]] = defaultdict(list)
    for r, f in _lbmc(_reports(path)):
        if "lbmc.ume_preg_resp.s_flag" in f:
            state = ("refused" if f["lbmc.ume_preg_resp.code.e_flag"]
                     else "old" if f["lbmc.ume_preg_resp.code.o_flag"] else "new")
            history[(r.dst, f["lbmc.ume_preg_resp.s_flag"])].append(state)
    (receiver,) = sc.receiver_restarts
    receiver_ips = [ip for name, ip in ip_of.items()
                    if name.startswith(f"receiver-{receiver.index}.")]
    (source,) = sc.source_restarts
    source_ips = [ip for name, ip in ip_of.items() if name.startswith(f"source-{source.index}.")]
    assert receiver_ips and source_ips
    for ips, s_flag in ((receiver_ips, 0), (source_ips, 1)):
        for ip in ips:
            states = history[(ip, s_flag)]
            assert states[0] == "new" and "old" in states, (ip, states)
    # the misconfigured source is refused as many times as it tries, never granted
    rogue = history[(ip_of["rogue-source"], 1)]
    assert rogue == ["refused"] * sc.collision_attempts
    assert flatten(meta["expected"])["registrations", "source", "error-5"] >= 1
    # the restarted receiver recovered what it missed from the stores
    frames = flatten(meta["expected"])
    assert frames["rxreq",] > 0 and frames["lbmc", "RX-DATA"] > 0


def test_a_source_restarted_late_in_a_run_registers_again(tmp_path: Path) -> None:
    """Restart times of several seconds, where the source core's completion deadline used to
    re-arm itself at one instant for ever (see ``captures.cores.SOURCE_INTERVAL_STEP_MS``)."""
    scenario = Scenario(name="late", sources=1, receivers=1, store_groups=(3,),
                        transports=(Transport.LBTTCP,), messages=1000, rate=100.0,
                        registration_interval=0.3,
                        source_restarts=(Restart(0, at=0.6, downtime=0.3),),
                        store_restarts=(Restart(2, at=0.55, downtime=1.0),)).validate()
    result = generate(scenario, tmp_path / "late.pcap", progress=False)
    events = flatten(result.meta["events"])
    assert events["source", "registration", "complete"] == 2
    assert result.meta["messages_sent"] == 1000
    assert any("every 250 ms, not 300 ms" in note for note in result.meta["notes"])


# --- determinism, sizes, formats ------------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.pcap" for i in range(3)]
    for path, seed in zip(paths, (3, 3, 4), strict=True):
        generate(preset("tcp-basic"), path, seed=seed, messages=40, progress=False)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert Path(f"{paths[0]}.meta.json").read_text() == Path(f"{paths[1]}.meta.json").read_text()
    assert paths[0].read_bytes() != paths[2].read_bytes()  # stores draw other RegIDs


def test_packets_gives_exactly_that_many_frames(tmp_path: Path) -> None:
    path = tmp_path / "p.pcap"
    result = generate(preset("tcp-basic"), path, packets=777, progress=False)
    assert result.frames == 777 == sum(1 for _ in read_capture(path))
    assert recount(_reports(path)) == flatten(_meta(path)["expected"])


FORMATS = [CaptureFormat(), CaptureFormat(nanosecond=True), CaptureFormat(big_endian=True),
           CaptureFormat(pcapng=True), CaptureFormat(pcapng=True, nanosecond=True,
                                                     big_endian=True)]


def test_every_format_holds_the_same_frames(tmp_path: Path) -> None:
    made = []
    for i, fmt in enumerate(FORMATS):
        path = tmp_path / f"f{i}.{'pcapng' if fmt.pcapng else 'pcap'}"
        generate(preset("tcp-basic"), path, seed=5, messages=20, fmt=fmt, progress=False)
        made.append((fmt, [(r.ts, r.data) for r in read_capture(path)]))
    reference = made[1][1]  # nanosecond pcap
    assert len({ts for ts, _ in reference}) > 10
    for fmt, records in made:
        assert [d for _, d in records] == [d for _, d in reference]
        truncation = 0.0 if fmt.nanosecond else 1e-6
        for (ts, _), (ref_ts, _) in zip(records, reference, strict=True):
            assert -5e-7 <= ref_ts - ts < truncation + 5e-7


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
       st.sampled_from([0x02, 0x12, 0x10, 0x18, 0x11, 0x14]), st.binary(max_size=300),
       st.integers(1, 65535), st.integers(1, 65535))
def test_tcp_frames_equal_the_wire_encoder(seq: int, ack: int, flags: int, payload: bytes,
                                           sport: int, dport: int) -> None:
    src, dst = ("10.1.0.7", sport), ("10.3.2.200", dport)
    assert TcpFrames(src, dst).frame(seq, ack, flags, payload) == \
        tcp_frame(src[0], sport, dst[0], dport, seq, ack, flags, payload)


# --- what the cores cannot play -------------------------------------------------------------------


def test_unsupported_features_are_named_and_refused(tmp_path: Path) -> None:
    missing = CoresBackend.unsupported(preset("lossy-lbtrm"))
    assert any("lbtrm" in m for m in missing)
    assert any("receiver_loss" in m for m in missing)
    assert any("unrecoverable" in m for m in missing)
    assert CoresBackend.unsupported(preset("tcp-restarts")) == []
    out = tmp_path / "refused.pcap"
    with pytest.raises(ScenarioError, match="cores backend cannot play lbtrm"):
        generate(preset("lossy-lbtrm"), out, backend="cores", messages=10, progress=False)
    assert not out.exists()  # no half-written capture left behind


def test_the_fallback_plays_any_scenario_over_lbttcp(tmp_path: Path) -> None:
    out = tmp_path / "fallback.pcap"
    scenario = Scenario(name="mix", sources=2, receivers=1, store_groups=(1, 1),
                        transports=(Transport.LBTRM, Transport.LBTRU), receiver_loss=0.01,
                        messages=30, rate=2000.0,
                        receiver_restarts=(Restart(0, at=0.5, downtime=0.05),)).validate()
    result = generate(scenario, out, backend=CoresBackend(lbttcp_fallback=True), progress=False)
    meta = result.meta
    assert len(meta["substitutions"]) == 2
    assert {t["transport"] for t in meta["topics"]} == {"lbttcp"}
    assert meta["messages_sent"] == 30
    assert recount(_reports(out)) == flatten(meta["expected"])


def test_the_run_keeps_no_trace_and_drains_every_event() -> None:
    """Memory is bounded: the simulator's trace list stays empty and no core holds events."""
    from captures.cores import _CoresRun

    scenario = preset("tcp-basic").with_messages(300)
    run = _CoresRun(RunPlan(scenario, 300, 300, 0), FrameSink())
    run.run()
    assert run.dep.net.trace == [] and run.dep.log == []
    assert all(not core.events() for _, core in run.cores())
    assert run.sink.frames > 300 * 2


# --- the CLI --------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ump")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def test_cli_backend_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.pcap"
    assert _cli(["captures", "generate", "--scenario", "tcp-basic", "--messages", "10",
                 "--out", str(out)]) == 0
    assert "backend cores" in capsys.readouterr().out
    assert _meta(out)["generator"]["backend"] == "cores"
    assert _cli(["captures", "generate", "--scenario", "tcp-basic", "--messages", "10",
                 "--backend", "wire", "--out", str(out)]) == 0
    assert _meta(out)["generator"]["backend"] == "wire"
    assert _cli(["captures", "generate", "--scenario", "basic", "--backend", "cores",
                 "--out", str(tmp_path / "x.pcap")]) == 2
    err = capsys.readouterr().err
    assert "cannot play lbtru" in err and "--lbttcp-fallback" in err
    assert not (tmp_path / "x.pcap").exists()
    assert _cli(["captures", "generate", "--scenario", "basic", "--lbttcp-fallback",
                 "--out", str(tmp_path / "x.pcap")]) == 2
    assert "only applies to --backend cores" in capsys.readouterr().err
    assert _cli(["captures", "generate", "--scenario", "basic", "--backend", "cores",
                 "--lbttcp-fallback", "--messages", "5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "backend cores" in printed and "note: lbtru transports" in printed
    assert _cli(["captures", "list"]) == 0
    assert "backend cores" in capsys.readouterr().out


# --- speed and memory -----------------------------------------------------------------------------


@pytest.mark.slow
def test_hundred_thousand_messages_speed_and_memory(tmp_path: Path) -> None:
    """The figure for the notes: frames per CPU second of the cores backend, 100k messages."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.process_time()
    result = generate(preset("tcp-basic"), tmp_path / "big.pcap", messages=100_000,
                      progress=False)
    cpu = time.process_time() - started
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(f"\n100k messages: {result.frames} frames, {result.seconds:.1f} s wall, {cpu:.1f} s "
          f"CPU, {result.frames / cpu:,.0f} frames per CPU second, peak RSS +{grown:.0f} MiB")
    assert result.messages == 100_000
    assert grown < 300  # the ~400k frames are streamed, never kept
