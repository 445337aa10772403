"""The RPP rules module (:mod:`reference_impl.rpp`) on its own: the override table
(docs/semantics.md §2.2), the overrides a registration asks for and the values it gets, each
refusal naming its option and both values, the re-registration refusals (§2.1), receiver
modes, the options clients build, and the guide's "UMP Version RPP Compatibility Matrix"
(18 cells, in the guide's order).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_impl import rpp
from reference_impl.rpp import (
    BLOCKING,
    MATRIX,
    NON_BLOCKING,
    OVERRIDES,
    SPP,
    Outcome,
    RppRefused,
    RppValues,
)
from reference_impl.store import TopicPolicy
from wire.lbmc import CFGOPT_SUBTYPE, CfgOpt, CfgScope, Extopt, LbmcMessage, UmePreg

POLICY = TopicPolicy(repository_allow_receiver_paced_persistence=1,
                     repository_allow_ack_on_reception=1, repository_size_threshold=5000,
                     repository_size_limit=10_000, repository_disk_file_size_limit=100_000,
                     source_flight_size_bytes_maximum=1000, repository_disk_write_delay=500)


def opt(name: str, value: object, scope: int = CfgScope.SOURCE) -> CfgOpt:
    return CfgOpt(scope, name, str(value))


def test_the_override_table() -> None:
    assert [(o.option, o.store_option, o.flag, o.disk_only) for o in OVERRIDES] == [
        ("ume_flight_size_bytes", "source-flight-size-bytes-maximum", False, False),
        ("ume_write_delay", "repository-disk-write-delay", False, True),
        ("ume_repository_ack_on_reception", "repository-allow-ack-on-reception", True, False),
        ("ume_repository_size_threshold", "repository-size-threshold", False, False),
        ("ume_repository_size_limit", "repository-size-limit", False, False),
        ("ume_repository_disk_file_size_limit", "repository-disk-file-size-limit", False,
         True),
    ]
    policy_fields = {f.name for f in dataclasses.fields(TopicPolicy)}
    assert all(o.policy_field in policy_fields for o in OVERRIDES)
    assert [o.field for o in OVERRIDES] == [f.name for f in dataclasses.fields(RppValues)]


def test_a_source_that_asks_nothing_gets_the_topic_values_without_ack_on_reception() -> None:
    assert rpp.store_values(POLICY) == RppValues(1000, 500, 0, 5000, 10_000, 100_000)
    assert rpp.effective_values(POLICY, {}, disk=True) == rpp.store_values(POLICY)


def test_requested_overrides_drop_zeros_and_keep_the_rest() -> None:
    asked = rpp.requested_overrides([opt("ume_flight_size_bytes", 0),
                                     opt("ume_repository_size_limit", 9000),
                                     opt("ume_repository_ack_on_reception", 1)])
    assert asked == {"ume_repository_size_limit": 9000, "ume_repository_ack_on_reception": 1}


@pytest.mark.parametrize(("options", "option", "words"), [
    ([opt("ume_flight_size_bytes", "1e3")], "ume_flight_size_bytes", "'1e3'"),
    ([opt("ume_flight_size_bytes", " 10")], "ume_flight_size_bytes", "' 10'"),
    ([opt("ume_flight_size_bytes", "-1")], "ume_flight_size_bytes", "'-1'"),
    ([opt("ume_flight_size", 1)], "ume_flight_size", "not an RPP source option"),
    ([opt("ume_flight_size_bytes", 1, CfgScope.CONTEXT)], "ume_flight_size_bytes",
     "not an RPP source option"),
    ([opt("ume_write_delay", 1), opt("ume_write_delay", 1)], "ume_write_delay", "twice"),
    ([opt("ume_repository_ack_on_reception", 2)], "ume_repository_ack_on_reception",
     "0 or 1, not 2"),
])
def test_garbled_overrides_are_refused(options: list[CfgOpt], option: str, words: str) -> None:
    with pytest.raises(RppRefused, match="garbled RPP option") as caught:
        rpp.requested_overrides(options)
    assert caught.value.option == option and words in str(caught.value)


@pytest.mark.parametrize("override", [o for o in OVERRIDES if not o.flag], ids=lambda o: o.option)
def test_each_maximum_is_granted_and_above_it_refused_naming_both_values(
        override: rpp.Override) -> None:
    top = getattr(POLICY, override.policy_field)
    assert getattr(rpp.effective_values(POLICY, {override.option: top}, disk=True),
                   override.field) == top
    with pytest.raises(RppRefused) as caught:
        rpp.effective_values(POLICY, {override.option: top + 1}, disk=True)
    text = str(caught.value)
    assert caught.value.option == override.option
    assert f"{override.option} {top + 1}" in text and f"{override.store_option} {top}" in text


def test_ack_on_reception_needs_the_topic_s_permission() -> None:
    values = rpp.effective_values(POLICY, {"ume_repository_ack_on_reception": 1}, disk=False)
    assert values.ack_on_reception == 1
    closed = dataclasses.replace(POLICY, repository_allow_ack_on_reception=0)
    with pytest.raises(RppRefused, match="ume_repository_ack_on_reception 1 asked for but "
                                         "repository-allow-ack-on-reception is 0"):
        rpp.effective_values(closed, {"ume_repository_ack_on_reception": 1}, disk=False)


@pytest.mark.parametrize("option", ["ume_write_delay", "ume_repository_disk_file_size_limit"])
def test_disk_only_overrides(option: str) -> None:
    assert rpp.effective_values(POLICY, {option: 100_000 if "file" in option else 5},
                                disk=True)
    with pytest.raises(RppRefused, match=f"{option} 5 is for disk repositories only"):
        rpp.effective_values(POLICY, {option: 5}, disk=False)


@pytest.mark.parametrize(("asked", "disk", "option", "words"), [
    ({"ume_repository_size_limit": 4999}, False, "ume_repository_size_threshold",
     "threshold 5000 is above the size limit 4999"),
    ({"ume_repository_disk_file_size_limit": 11_110}, True, "ume_repository_size_limit",
     "size limit 10000 is above 90% of the disk file size limit 11110"),
    ({"ume_repository_size_threshold": 1000}, False, "ume_flight_size_bytes",
     "threshold 1000 is not above the flight size 1000 bytes"),
])
def test_consistency_rules(asked: dict[str, int], disk: bool, option: str, words: str) -> None:
    with pytest.raises(RppRefused, match="inconsistent RPP values") as caught:
        rpp.effective_values(POLICY, asked, disk=disk)
    assert caught.value.option == option and words in str(caught.value)


def test_the_90_percent_rule_is_disk_only_and_inclusive() -> None:
    # exactly 90 %: allowed
    assert rpp.effective_values(POLICY, {"ume_repository_disk_file_size_limit": 11_112},
                                disk=True).disk_file_size_limit == 11_112
    small_file = dataclasses.replace(POLICY, repository_disk_file_size_limit=10_000)
    assert rpp.effective_values(small_file, {}, disk=False)


@given(flight=st.integers(1, 2000), threshold=st.integers(1, 6000), limit=st.integers(1, 12_000))
def test_effective_values_are_consistent_or_refused(flight: int, threshold: int,
                                                    limit: int) -> None:
    asked = {"ume_flight_size_bytes": flight, "ume_repository_size_threshold": threshold,
             "ume_repository_size_limit": limit}
    try:
        values = rpp.effective_values(POLICY, asked, disk=True)
    except RppRefused as exc:
        assert exc.option in asked or exc.option == "ume_repository_size_limit"
        return
    assert values.flight_size_bytes < values.size_threshold <= values.size_limit
    assert values.size_limit <= 0.9 * values.disk_file_size_limit
    assert (values.flight_size_bytes, values.size_threshold, values.size_limit) == \
        (flight, threshold, limit)


def test_reregistration_refusals() -> None:
    refusal = rpp.reregistration_refusal
    assert refusal(role="source", old_mode=SPP, new_mode=1) == \
        "previously SPP source re-registers as RPP"
    assert refusal(role="source", old_mode=1, new_mode=SPP) == \
        "previously RPP source re-registers as SPP"
    assert refusal(role="receiver", old_mode=SPP, new_mode=NON_BLOCKING) == \
        "previously SPP receiver re-registers as RPP"
    assert refusal(role="receiver", old_mode=BLOCKING, new_mode=NON_BLOCKING) == \
        "previously blocking RPP receiver re-registers as non-blocking"
    assert refusal(role="receiver", old_mode=NON_BLOCKING, new_mode=BLOCKING) == \
        "previously non-blocking RPP receiver re-registers as blocking"
    old = rpp.store_values(POLICY)
    assert refusal(role="source", old_mode=1, new_mode=1, old_values=old, new_values=old) is None
    assert refusal(role="receiver", old_mode=BLOCKING, new_mode=BLOCKING) is None
    one = dataclasses.replace(old, write_delay=7)
    assert refusal(role="source", old_mode=1, new_mode=1, old_values=old, new_values=one) == \
        "RPP source re-registers with ume_write_delay 7, its repository has 500"
    two = dataclasses.replace(one, size_limit=9000)
    text = refusal(role="source", old_mode=1, new_mode=1, old_values=old, new_values=two)
    assert text is not None and text.endswith("(and 1 more values differ)")


@pytest.mark.parametrize(("w", "options", "mode"), [
    (0, [], SPP), (1, [], BLOCKING),
    (1, [opt(rpp.RPP_OPTION, 2, CfgScope.RECEIVER)], NON_BLOCKING),
    (1, [opt(rpp.RPP_OPTION, 1, CfgScope.RECEIVER)], BLOCKING),
])
def test_receiver_modes(w: int, options: list[CfgOpt], mode: int) -> None:
    assert rpp.receiver_mode(w, options) == mode


@pytest.mark.parametrize(("w", "options", "words"), [
    (0, [opt(rpp.RPP_OPTION, 2, CfgScope.RECEIVER)], "contradictory"),
    (1, [opt(rpp.RPP_OPTION, 0, CfgScope.RECEIVER)], "contradictory"),
    (1, [opt(rpp.RPP_OPTION, 3, CfgScope.RECEIVER)], "contradictory"),
    (1, [opt(rpp.RPP_OPTION, 2)], "unexpected receiver option"),
    (1, [opt(rpp.RPP_OPTION, 2, CfgScope.RECEIVER)] * 2, "given twice"),
    (1, [opt(rpp.RPP_OPTION, "two", CfgScope.RECEIVER)], "not a non-negative decimal"),
])
def test_bad_receiver_registrations(w: int, options: list[CfgOpt], words: str) -> None:
    with pytest.raises(RppRefused, match=words):
        rpp.receiver_mode(w, options)


def test_client_options_round_trip() -> None:
    config = SimpleNamespace(ume_flight_size_bytes=900, ume_write_delay=0,
                             ume_repository_ack_on_reception=1,
                             ume_repository_size_threshold=None)
    options = rpp.source_options(config)
    assert [(o.scope, o.name, o.value) for o in options] == [
        (CfgScope.SOURCE, "ume_flight_size_bytes", "900"),
        (CfgScope.SOURCE, "ume_repository_ack_on_reception", "1")]
    assert rpp.requested_overrides(options) == {"ume_flight_size_bytes": 900,
                                                "ume_repository_ack_on_reception": 1}
    for mode in (BLOCKING, NON_BLOCKING):
        assert rpp.receiver_mode(1, rpp.receiver_options(mode)) == mode
    assert rpp.receiver_options(BLOCKING) == []


def test_parse_options_reads_the_message_and_refuses_a_broken_one() -> None:
    message = LbmcMessage(headers=[UmePreg(s_flag=1, w_flag=1),
                                   opt("ume_flight_size_bytes", 10).header()])
    assert rpp.parse_options(message) == [opt("ume_flight_size_bytes", 10)]
    broken = LbmcMessage(headers=[UmePreg(s_flag=1, w_flag=1),
                                  Extopt(subtype=CFGOPT_SUBTYPE, data=b"\x01\x00name")])
    with pytest.raises(RppRefused, match="garbled RPP option"):
        rpp.parse_options(broken)


def test_the_matrix_has_the_guide_s_18_cells_in_order() -> None:
    assert len(MATRIX) == 18
    assert [(c.client, c.store) for c in MATRIX] == [
        (client, store) for client in rpp.CLIENT_KINDS for store in rpp.STORE_KINDS]
    labels = [c.label for c in MATRIX]
    assert labels == [
        "Granted", "Rejected *", "Granted *",
        "Granted - Source Error", "Granted *", "Rejected *",
        "Granted", "Rejected *", "Granted *",
        "Granted", "Rejected", "Granted",
        "Granted - Receiver Error", "Granted", "Rejected",
        "Granted", "Rejected", "Granted",
    ]
    assert rpp.cell("5.3 RPP source", "pre-5.3 store").outcome is Outcome.SOURCE_ERROR
    assert all(c.outcome in (Outcome.GRANTED, Outcome.SOURCE_ERROR, Outcome.RECEIVER_ERROR)
               for c in MATRIX if c.store == "pre-5.3 store")
