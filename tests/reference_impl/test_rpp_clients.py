"""The reference source's and receiver's receiver-paced persistence (guide "RPP Registration",
"Implementing RPP", "UMP Version RPP Compatibility Matrix"; docs/semantics.md §1.13, §2).

Core level, in the simulator: what goes on the wire is read back from the simulated network's
trace with the wire decoders (``wire.lbmc.cfgopts`` for the RPP options, docs/wire-lbmc.md
§2.3), no tshark needed.  Checked: an RPP source's PREG carries the RPP flag and its non-zero
overrides, and every re-registration the same; refusals and the matrix's "Granted - Source
Error" / "Granted - Receiver Error"; a pre-5.3 client never sets, sends or reads anything of
RPP; a non-blocking receiver's mode option; the configuration errors; a non-blocking receiver
whose store no longer holds what it asks for reports the loss and goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reference_impl import events as ev
from reference_impl import rpp, runtime
from reference_impl.config import ConfigError, parse_client_config
from reference_impl.deployment import SimDeployment
from reference_impl.receiver import ReceiverConfig
from reference_impl.source import SourceConfig
from reference_impl.store import StoreCore, TopicPolicy, TopicRule
from tests.reference_impl.loopback import ROOT, loopback
from wire.lbmc import CfgOpt, CfgScope, Header, LbmcMessage, PregError, UmePreg, cfgopts
from wire.lbttcp import LbttcpStream

TOPIC = "rpp.orders"
RPP_SOURCE: dict[str, Any] = {"ume_receiver_paced_persistence": 1,
                              "ume_flight_size_bytes": 512}


def add_store(d: SimDeployment, name: str = "store0", *, allow_rpp: bool = True,
              **settings: Any) -> StoreCore:
    policy = TopicPolicy(repository_allow_receiver_paced_persistence=int(allow_rpp))
    return d.add_store(name, topics=(TopicRule(".*", policy, kind="PCRE"),), seed=7,
                       **settings)


def pregs(d: SimDeployment, store: StoreCore, *, source: bool) -> list[LbmcMessage]:
    """Every CONTROL message with a PREG of a source (``source``) or receiver that reached
    ``store``, decoded from the simulated network's trace, in order."""
    framers: dict[tuple[Any, Any], LbttcpStream] = {}
    out = []
    for packet in d.net.trace:
        if packet.proto != "tcp" or packet.dst != store.addr:
            continue
        key = (packet.src, packet.dst)
        if packet.kind == "syn":
            framers[key] = LbttcpStream()
            continue
        if packet.kind != "data":
            continue
        for item in framers.setdefault(key, LbttcpStream()).feed(packet.data):
            message = item.message
            preg = message.header(UmePreg) if message is not None else None
            if message is not None and preg is not None and bool(preg.s_flag) == source:
                out.append(message)
    return out


def preg_of(message: LbmcMessage) -> Header:
    preg = message.header(UmePreg)
    assert preg is not None
    return preg


def errors(d: SimDeployment, name: str) -> list[str]:
    return [e.text for e in d.events(name, ev.LogRecord)
            if isinstance(e, ev.LogRecord) and e.level is ev.Level.ERROR]


def always_w(store: StoreCore) -> None:
    """Make ``store`` set the RPP flag in every answer that grants (what a pre-5.3 client must
    not read)."""
    respond: Callable[..., None] = store._respond

    def patched(*args: Any, **kw: Any) -> None:
        respond(*args, **{**kw, "rpp": True})
    store._respond = patched  # type: ignore[method-assign]


# --- the source -------------------------------------------------------------------------------


def test_rpp_source_preg_carries_the_rpp_flag_and_its_nonzero_overrides_in_order() -> None:
    d = SimDeployment(seed=3)
    store = add_store(d)
    src = d.add_source("src", TOPIC, **RPP_SOURCE, ume_repository_size_limit=100_000,
                       ume_repository_size_threshold=900, ume_write_delay=0)
    assert d.run_until(lambda: src.complete, 5)
    (message,) = pregs(d, store, source=True)
    assert preg_of(message).w_flag == 1 and preg_of(message).d_flag == 0
    # OVERRIDES order; 0 (ume_write_delay, the unset ones) is "the store's value": not sent
    assert cfgopts(message) == [
        CfgOpt(CfgScope.SOURCE, "ume_flight_size_bytes", "512"),
        CfgOpt(CfgScope.SOURCE, "ume_repository_size_threshold", "900"),
        CfgOpt(CfgScope.SOURCE, "ume_repository_size_limit", "100000"),
    ]
    (success,) = d.events("src", ev.SourceRegistrationSuccess)
    assert isinstance(success, ev.SourceRegistrationSuccess) and success.rpp
    assert d.events("src", ev.RppNotAcknowledged) == []


def test_every_reregistration_presents_the_same_rpp_values() -> None:
    d = SimDeployment(seed=3)
    store = add_store(d)
    src = d.add_source("src", TOPIC, **RPP_SOURCE, ume_repository_size_threshold=900)
    assert d.run_until(lambda: src.complete, 5)
    d.restart("store0")  # a memory store comes back empty: the source registers again
    assert d.run_until(lambda: len(d.events("src", ev.SourceRegistrationSuccess)) == 2, 30)
    first, again = pregs(d, store, source=True)
    assert cfgopts(first) == cfgopts(again) == rpp.source_options(src.config) != []
    assert preg_of(first).w_flag == preg_of(again).w_flag == 1


def test_an_spp_source_sends_neither_the_flag_nor_its_overrides() -> None:
    d = SimDeployment(seed=3)
    store = add_store(d)
    src = d.add_source("src", TOPIC, ume_flight_size_bytes=512,
                       ume_repository_size_limit=100_000)
    assert d.run_until(lambda: src.complete, 5)
    (message,) = pregs(d, store, source=True)
    assert preg_of(message).w_flag == 0 and cfgopts(message) == []


def test_a_code_6_refusal_of_an_rpp_source_is_an_rpp_registration_failure() -> None:
    d = SimDeployment(seed=3)
    add_store(d, allow_rpp=False)
    src = d.add_source("src", TOPIC, **RPP_SOURCE)
    d.run(10)
    (refusal,) = d.events("src", ev.SourceRegistrationError)  # final: asked once
    assert isinstance(refusal, ev.SourceRegistrationError)
    assert refusal.code == PregError.ECONFIG and refusal.rpp
    assert refusal.text.startswith("RPP Source Registration Failure: ")
    assert "the store's log names the option" in refusal.text
    assert any("refused registration: RPP Source Registration Failure" in t
               for t in errors(d, "src"))
    assert not src.complete


def test_a_refusal_that_is_not_about_rpp_is_not_flagged_rpp() -> None:
    d = SimDeployment(seed=3)
    d.add_store("store0", topics=(TopicRule("^other$", TopicPolicy(), kind="PCRE"),), seed=7)
    d.add_source("src", TOPIC, **RPP_SOURCE)
    d.run(5)
    (refusal,) = d.events("src", ev.SourceRegistrationError)
    assert isinstance(refusal, ev.SourceRegistrationError)
    assert refusal.code == PregError.ENOPATTERN and not refusal.rpp


def test_a_grant_without_the_rpp_flag_is_granted_source_error_and_the_store_counts() -> None:
    d = SimDeployment(seed=3)
    add_store(d, rpp_supported=False)  # a store before 5.3: grants, does not confirm RPP
    src = d.add_source("src", TOPIC, **RPP_SOURCE)
    assert d.run_until(lambda: src.complete, 5)  # choice: kept and counted
    d.run(10)  # keepalives, store checks: reported once per registration
    (error,) = d.events("src", ev.RppNotAcknowledged)
    assert isinstance(error, ev.RppNotAcknowledged)
    assert (error.role, error.store.index, error.outcome) == \
        ("source", 0, "Granted - Source Error")
    assert error.text.startswith("Granted - Source Error: store 0")
    assert [t for t in errors(d, "src") if "Granted - Source Error" in t] == [error.text]
    (success,) = d.events("src", ev.SourceRegistrationSuccess)
    assert isinstance(success, ev.SourceRegistrationSuccess) and not success.rpp
    assert src.send(b"still sends") == 0


def test_a_pre53_source_never_sets_sends_or_reads_anything_of_rpp() -> None:
    d = SimDeployment(seed=3)
    store = add_store(d)
    always_w(store)
    src = d.add_source("src", TOPIC, rpp_supported=False, ume_flight_size_bytes=512,
                       ume_repository_size_limit=100_000)
    assert d.run_until(lambda: src.complete, 5)
    (message,) = pregs(d, store, source=True)
    assert preg_of(message).w_flag == 0 and cfgopts(message) == []
    (success,) = d.events("src", ev.SourceRegistrationSuccess)
    assert isinstance(success, ev.SourceRegistrationSuccess) and not success.rpp
    assert not src.links[0].rpp
    src.deregister()
    d.run(2)
    deregistration = pregs(d, store, source=True)[-1]
    assert preg_of(deregistration).d_flag == 1 and preg_of(deregistration).w_flag == 0


def test_source_config_refuses_rpp_under_a_profile_without_it() -> None:
    with pytest.raises(ValueError, match="predates receiver-paced persistence"):
        SourceConfig(rpp_supported=False, ume_receiver_paced_persistence=1)
    with pytest.raises(ValueError, match="expected one of 0, 1"):
        SourceConfig(ume_receiver_paced_persistence=2)


# --- the receiver -----------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "options"), [
    (1, []),
    (2, [CfgOpt(CfgScope.RECEIVER, rpp.RPP_OPTION, "2")]),
])
def test_rpp_receiver_preg_says_its_mode(mode: int, options: list[CfgOpt]) -> None:
    d = SimDeployment(seed=3)
    store = add_store(d)
    src = d.add_source("src", TOPIC, **RPP_SOURCE)
    rcv = d.add_receiver("rcv", TOPIC, ume_receiver_paced_persistence=mode)
    assert d.run_until(lambda: src.complete and rcv.complete, 10)
    (message,) = pregs(d, store, source=False)
    assert preg_of(message).w_flag == 1
    assert cfgopts(message) == options == rpp.receiver_options(mode)
    (success,) = d.events("rcv", ev.ReceiverRegistrationSuccess)
    assert isinstance(success, ev.ReceiverRegistrationSuccess) and success.rpp
    src.send(b"paced")
    assert d.run_until(lambda: d.events("rcv", ev.MessageDelivered) != [], 5)


def test_an_spp_receiver_sends_neither_flag_nor_option() -> None:
    d = SimDeployment(seed=3)
    store = add_store(d)
    d.add_source("src", TOPIC)
    rcv = d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: rcv.complete, 10)
    (message,) = pregs(d, store, source=False)
    assert preg_of(message).w_flag == 0 and cfgopts(message) == []


def test_an_rpp_receiver_on_an_spp_repository_is_an_rpp_registration_failure() -> None:
    d = SimDeployment(seed=3)
    add_store(d)
    d.add_source("src", TOPIC)  # SPP: its repository is not receiver-paced
    d.add_receiver("rcv", TOPIC, ume_receiver_paced_persistence=1)
    d.run(10)
    (refusal,) = d.events("rcv", ev.ReceiverRegistrationError)
    assert isinstance(refusal, ev.ReceiverRegistrationError)
    assert refusal.code == PregError.ECONFIG and refusal.rpp
    assert "RPP Receiver Registration Failure" in refusal.text


def test_a_grant_without_the_rpp_flag_is_granted_receiver_error_and_delivery_goes_on() -> None:
    d = SimDeployment(seed=3)
    add_store(d, rpp_supported=False)
    src = d.add_source("src", TOPIC)
    rcv = d.add_receiver("rcv", TOPIC, ume_receiver_paced_persistence=1)
    assert d.run_until(lambda: src.complete and rcv.complete, 10)  # kept and counted
    src.send(b"one")
    d.run(10)
    (error,) = d.events("rcv", ev.RppNotAcknowledged)
    assert isinstance(error, ev.RppNotAcknowledged)
    assert (error.role, error.outcome, error.source) == \
        ("receiver", "Granted - Receiver Error", rcv.primary.name)
    assert [t for t in errors(d, "rcv") if "Granted - Receiver Error" in t] == [error.text]
    assert [e.payload for e in d.events("rcv", ev.MessageDelivered)] == [b"one"]  # type: ignore


def test_a_pre53_receiver_never_sets_or_reads_the_rpp_flag() -> None:
    d = SimDeployment(seed=3)
    store = add_store(d)
    always_w(store)
    d.add_source("src", TOPIC)
    rcv = d.add_receiver("rcv", TOPIC, rpp_supported=False)
    assert d.run_until(lambda: rcv.complete, 10)
    (message,) = pregs(d, store, source=False)
    assert preg_of(message).w_flag == 0 and cfgopts(message) == []
    (success,) = d.events("rcv", ev.ReceiverRegistrationSuccess)
    assert isinstance(success, ev.ReceiverRegistrationSuccess) and not success.rpp
    assert d.events("rcv", ev.RppNotAcknowledged) == []


def test_receiver_config_refuses_rpp_under_a_profile_without_it() -> None:
    with pytest.raises(ValueError, match="predates receiver-paced persistence"):
        ReceiverConfig(rpp_supported=False, ume_receiver_paced_persistence=1)
    with pytest.raises(ValueError, match="expected one of 0, 1, 2"):
        ReceiverConfig(ume_receiver_paced_persistence=3)


def test_a_nonblocking_receiver_reports_what_the_store_no_longer_holds_and_goes_on() -> None:
    """Item 6: a non-blocking receiver whose store released messages before it asked for
    them (the store answers nothing for those) reports them lost after
    ``retransmit_request_message_timeout`` and delivers what follows; the source is never
    held back by it."""
    d = SimDeployment(seed=3)
    store = add_store(d)
    released = set(range(5, 10))
    on_rxreq = store._on_rxreq

    def answers_nothing_for_released(conn: Any, id_2: int, seqnum: int, size: int) -> None:
        if seqnum not in released:
            on_rxreq(conn, id_2, seqnum, size)
    store._on_rxreq = answers_nothing_for_released  # type: ignore[method-assign]
    src = d.add_source("src", TOPIC, **RPP_SOURCE)
    rcv = d.add_receiver("rcv", TOPIC, ume_receiver_paced_persistence=2, reg_id=4242,
                         retransmit_request_message_timeout=2000)
    assert d.run_until(lambda: src.complete and rcv.complete, 10)
    for i in range(5):
        src.send(b"m%d" % i)
    assert d.run_until(lambda: len(d.events("rcv", ev.MessageDelivered)) == 5, 5)
    d.run(1)  # its consumption ACKs reach the store
    d.kill("rcv")
    for i in range(5, 15):
        src.send(b"m%d" % i)
    assert d.run_until(lambda: src.inflight == 0, 10)  # nobody waits for the receiver
    d.restart("rcv")  # re-registers (its RegID) and asks for 5..14
    assert d.run_until(lambda: d.events("rcv", ev.UnrecoverableLoss) != [], 30)
    assert d.events("rcv", ev.UnrecoverableLoss) == [ev.UnrecoverableLoss(5, 9)]
    for i in range(15, 18):
        src.send(b"m%d" % i)
    assert d.run_until(lambda: len(d.events("rcv", ev.MessageDelivered)) == 13, 10)
    after = [e.sequence_number for e in d.events("rcv", ev.MessageDelivered)
             if isinstance(e, ev.MessageDelivered)][5:]
    assert after == list(range(10, 18))  # in order, the lost ones stepped over
    assert d.run_until(lambda: src.inflight == 0, 5)


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "line"), [
    ("pre-5.3", "source ume_receiver_paced_persistence 1"),
    ("pre-5.3", "receiver ume_receiver_paced_persistence 1"),
    ("guide-5.3", "receiver ume_receiver_paced_persistence 2"),
])
def test_a_mode_the_profile_does_not_know_is_a_one_line_error_naming_it(
        profile: str, line: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_client_config(line + "\n", "c.cfg", profile=profile)
    text = str(info.value)
    assert "\n" not in text and f"profile {profile!r}" in text and "c.cfg:1" in text


def test_the_profile_and_the_overrides_reach_the_cores() -> None:
    text = "\n".join([
        "source ume_receiver_paced_persistence 1", "source ume_flight_size_bytes 1000",
        "source ume_write_delay 5", "source ume_repository_ack_on_reception 1",
        "source ume_repository_size_threshold 2000", "source ume_repository_size_limit 3000",
        "source ume_repository_disk_file_size_limit 4000",
        "receiver ume_receiver_paced_persistence 2", ""])
    client = parse_client_config(text, "c.cfg")
    source = runtime.source_config(client)
    assert source.rpp and source.rpp_supported
    assert [o.value for o in rpp.source_options(source)] == \
        ["1000", "5", "1", "2000", "3000", "4000"]
    receiver = runtime.receiver_config(client)
    assert receiver.rpp_mode == rpp.NON_BLOCKING and receiver.rpp_supported
    old = parse_client_config("source ume_flight_size_bytes 1000\n", "c.cfg", profile="pre-5.3")
    assert not runtime.source_config(old).rpp_supported
    assert not runtime.receiver_config(old).rpp_supported
    assert not runtime.source_config(runtime.load_client(None, "pre-5.3")).rpp_supported
    assert runtime.receiver_config(runtime.load_client(None, "guide-5.3")).rpp_supported


# --- the profile through the command line -------------------------------------------------------


def test_ump_source_and_receiver_run_under_the_pre53_profile(tmp_path: Path) -> None:
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("client.cfg")
        out = tmp_path / "rcv.jsonl"
        receiver = lb.start("receiver", "--profile", "pre-5.3", "-c", str(cfg), "--topic",
                            TOPIC, "--out", str(out), "--count", "20")
        source = lb.start("source", "--profile", "pre-5.3", "-c", str(cfg), "--topic", TOPIC,
                          "--count", "100000", "--rate", "200")
        try:
            assert receiver.finish(30) == 0, receiver.stderr + source.stderr
            lines = out.read_text().splitlines()
            assert len(lines) >= 20 and '"sqn": 0,' in lines[0]
        finally:
            receiver.stop()
            source.stop()


@pytest.mark.parametrize("role", ["source", "receiver"])
def test_ump_clients_refuse_rpp_under_the_pre53_profile_in_one_line(
        tmp_path: Path, role: str) -> None:
    cfg = tmp_path / "rpp.cfg"
    cfg.write_text(f"{role} ume_receiver_paced_persistence 1\n")
    proc = subprocess.run([sys.executable, "-m", "ump", role, "--profile", "pre-5.3", "-c",
                           str(cfg), "--topic", TOPIC], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"ump {role}: ") and "profile 'pre-5.3'" in line and "rpp.cfg:1" in line


# --- the RPP client mutants of tests/conformance/mutant_client.py break what they say ---------


def _scenario_source_omits_overrides() -> object:
    d = SimDeployment(seed=3)
    store = add_store(d)
    d.add_source("src", TOPIC, **RPP_SOURCE, ume_repository_size_threshold=900)
    d.run(2)
    (message,) = pregs(d, store, source=True)
    return [preg_of(message).w_flag, len(cfgopts(message))]


def _scenario_ignores_rpp_ack(role: str) -> object:
    d = SimDeployment(seed=3)
    add_store(d, rpp_supported=False)
    d.add_source("src", TOPIC, **(RPP_SOURCE if role == "source" else {}))
    if role == "receiver":
        d.add_receiver("rcv", TOPIC, ume_receiver_paced_persistence=1)
    d.run(5)
    return len(d.events("src" if role == "source" else "rcv", ev.RppNotAcknowledged))


def _scenario_pre53_sets_rpp_flag() -> object:
    d = SimDeployment(seed=3)
    store = add_store(d)
    d.add_source("src", TOPIC, rpp_supported=False)
    d.run(2)
    return [preg_of(m).w_flag for m in pregs(d, store, source=True)]


def _scenario_nonblocking_as_blocking() -> object:
    d = SimDeployment(seed=3)
    store = add_store(d)
    d.add_source("src", TOPIC, **RPP_SOURCE)
    d.add_receiver("rcv", TOPIC, ume_receiver_paced_persistence=2)
    d.run(5)
    return [[o.name, o.value] for m in pregs(d, store, source=False) for o in cfgopts(m)]


def _scenario_acks_after_deregistration() -> object:
    d = SimDeployment(seed=3)
    store = add_store(d)
    src = d.add_source("src", TOPIC)
    rcv = d.add_receiver("rcv", TOPIC)
    d.run(5)
    src.send(b"before")
    d.run(2)
    rcv.deregister()
    d.run(2)
    count = len(d.net.trace)
    src.send(b"after")
    d.run(10)
    acks = 0
    for packet in d.net.trace[count:]:
        if packet.proto == "tcp" and packet.kind == "data" and packet.dst == store.addr \
                and packet.src[0] == d.ips["rcv"]:
            acks += 1
    return acks


SCENARIOS: dict[str, tuple[Callable[[], object], object]] = {
    "source-omits-overrides": (_scenario_source_omits_overrides, [1, 2]),
    "source-ignores-rpp-ack": (lambda: _scenario_ignores_rpp_ack("source"), 1),
    "receiver-ignores-rpp-ack": (lambda: _scenario_ignores_rpp_ack("receiver"), 1),
    "pre53-sets-rpp-flag": (_scenario_pre53_sets_rpp_flag, [0]),
    "receiver-nonblocking-as-blocking": (_scenario_nonblocking_as_blocking,
                                         [[rpp.RPP_OPTION, "2"]]),
    "receiver-acks-after-deregistration": (_scenario_acks_after_deregistration, 0),
}
"""Mutant name -> (a scenario observing the rule it breaks, what the reference shows)."""


@pytest.mark.parametrize("mutant", sorted(SCENARIOS))
def test_each_rpp_client_mutant_breaks_its_rule(mutant: str) -> None:
    scenario, reference = SCENARIOS[mutant]
    assert scenario() == reference
    code = ("import json, sys\n"
            f"sys.path.insert(0, {str(ROOT / 'tests' / 'conformance')!r})\n"
            "import mutant_client\n"
            f"mutant_client.MUTANTS[{mutant!r}][1]()\n"
            "from tests.reference_impl import test_rpp_clients as t\n"
            f"print(json.dumps(t.SCENARIOS[{mutant!r}][0]()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) != reference
