"""Flat UM configuration files: scopes, overrides, appending options, validation, profiles."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference_impl.cli
from reference_impl.config import (
    ClientConfig,
    ConfigError,
    ContextOptions,
    NamedStore,
    ReceiverOptions,
    SourceOptions,
    StoreAddress,
    StoreGroup,
    UnicastResolverDaemon,
    get_profile,
    load_client_config,
    parse_client_config,
    parse_session_id,
    profile_names,
)
from reference_impl.runtime import source_config
from reference_impl.source import SourceCore
from ump.cli import main

# The guide's RPP client sample, with the PDF's spaces-for-underscores damage repaired and the
# store names of docs/semantics.md §3.4 (store0rpp / store1rpp / store2rpp).
RPP_CLIENT = """\
#Sample UM Configuration File, UMP Version 5.3
source transport lbtrm
receiver ordered_delivery 1
context resolver_multicast_address 225.8.17.29
context request_tcp_port_low 55000
context request_tcp_port_high 55500
## Persistence Options ###
source ume_store_group 0:1
source ume_store_name store0rpp:2929:0
source ume_store_group 1:1
source ume_store_name store1rpp:2930:1
source ume_store_group 2:1
source ume_store_name store2rpp:2931:2
source ume_store_behavior qc
source ume_flight_size 500
source ume_flight_size_bytes 1000000
source ume_receiver_paced_persistence 1
source ume_repository_size_threshold 104857600
source ume_repository_size_limit 209715200
source ume_repository_disk_file_size_limit 1073741824
source ume_repository_ack_on_reception 1
source ume_write_delay 1000
receiver ume_receiver_paced_persistence 1
receiver ume_explicit_ack_only 1
source ume_proxy_source 1
#source ume_session_id 535353
context ume_source_liveness_timeout 4000
context ume_receiver_liveness_interval 1000
source ume_confirmed_delivery_notification 1
"""


def error_of(text: str, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_client_config(text, "client.cfg", **kwargs)  # type: ignore[arg-type]
    assert caught.value.file == "client.cfg"
    return caught.value


def test_rpp_sample() -> None:
    config = parse_client_config(RPP_CLIENT, "rpp.cfg")
    source, receiver, context = config.source, config.receiver, config.context
    assert source.stores == (
        NamedStore("store0rpp", 2929, 0),
        NamedStore("store1rpp", 2930, 1),
        NamedStore("store2rpp", 2931, 2),
    )
    assert source.ume_store_name == source.stores and source.ume_store == ()
    assert source.ume_store_group == (StoreGroup(0, 1), StoreGroup(1, 1), StoreGroup(2, 1))
    assert source.transport == "lbt-rm" and source.transport_supported
    assert (source.ume_flight_size, source.ume_flight_size_bytes) == (500, 1000000)
    assert source.ume_receiver_paced_persistence == 1
    assert source.ume_repository_size_threshold == 104857600
    assert source.ume_repository_ack_on_reception is True
    assert source.ume_write_delay == 1000
    assert source.ume_proxy_source is True
    assert source.ume_session_id == 0  # commented out
    assert source.ume_confirmed_delivery_notification == 1
    assert source.persistent and source.effective_late_join and not source.late_join
    assert receiver.ume_receiver_paced_persistence == 1
    assert receiver.ume_explicit_ack_only is True
    assert receiver.ume_use_ack_batching is False  # explicit ACKs turn batching off
    assert dict(receiver.other) == {"ordered_delivery": "1"}
    assert (context.request_tcp_port_low, context.request_tcp_port_high) == (55000, 55500)
    assert context.ume_source_liveness_timeout == 4000
    assert dict(context.other) == {"resolver_multicast_address": "225.8.17.29"}
    messages = [w.message for w in config.warnings]
    assert not any("lbt-rm" in m for m in messages)  # the reference runs LBT-RM (issue 20)
    # every store has an explicit RegID, so the proxy source request is acceptable
    assert not any("ume_proxy_source" in m for m in messages)
    without_ids = RPP_CLIENT.replace(":2929:", ":0:")
    assert any(
        "ume_proxy_source needs an explicit RegID" in w.message
        for w in parse_client_config(without_ids).warnings
    )


def test_defaults_come_from_the_profile() -> None:
    current = parse_client_config("")
    guide = parse_client_config("", profile="guide-5.3")
    assert current.profile == "current" and guide.profile == "guide-5.3"
    assert (current.source.ume_registration_interval, guide.source.ume_registration_interval) == (
        3000,
        500,
    )
    assert current.receiver.ume_registration_interval == 3000
    assert guide.receiver.ume_registration_interval == 500
    assert (current.source.ume_sri_inter_sri_interval, guide.source.ume_sri_inter_sri_interval) == (
        500,
        100,
    )
    assert current.source.ume_sri_max_number_of_sri_per_update == 20
    assert guide.source.ume_sri_max_number_of_sri_per_update == 10
    assert current.source.ume_store_activity_timeout == 10000
    assert guide.source.ume_store_activity_timeout == 3000
    assert current.source.ume_consensus_sequence_number_behavior == "highest"
    assert guide.source.ume_consensus_sequence_number_behavior == "majority"
    assert current.receiver.ume_consensus_sequence_number_behavior == "majority"
    assert (current.receiver.use_otr, guide.receiver.use_otr) == (2, 0)
    assert guide.receiver.retransmit_message_caching_proximity == 0xFFFFFFFF
    assert current.receiver.retransmit_message_caching_proximity == 5000
    assert (current.source.ume_store_behavior, guide.source.ume_store_behavior) == ("qc", "rr")
    assert current.source.transport == "tcp"
    assert (current.context.request_tcp_port_low, current.context.request_tcp_port_high) == (
        14391,
        14395,
    )
    assert not current.source.persistent and not current.source.effective_late_join
    assert current.warnings == ()


@pytest.mark.parametrize("profile", profile_names())
def test_every_client_default_is_valid_under_its_own_profile(profile: str) -> None:
    """Feeding the defaults back as explicit values must reproduce them."""
    defaults = get_profile(profile)
    explicit = {
        "context": {k: v for k, v in defaults.context.items() if k != "resolver_unicast_daemon"},
        "source": {
            k: v for k, v in defaults.source.items() if k not in ("stores", "ume_store_group")
        },
        "receiver": dict(defaults.receiver),
    }
    config = ClientConfig.from_mapping(explicit, profile=profile)
    for scope, options in (
        ("context", config.context),
        ("source", config.source),
        ("receiver", config.receiver),
    ):
        for name, value in defaults.section(scope).items():
            assert getattr(options, name) == value, (scope, name)


# --- appending options --------------------------------------------------------------------------


def test_ume_store_appends_and_clears() -> None:
    config = parse_client_config(
        "source ume_store 10.0.0.1:14567\n"
        "source ume_store 10.0.0.2:14567:77\n"
        "source ume_store 0.0.0.0:0\n"
        "source ume_store 10.0.0.3:14568:5:0\n"
        "source ume_store_name NEWYORK-1\n"
        "source ume_store 7:10.0.0.4:14569\n"
        "source ume_store 7:10.0.0.5:14569:9:0\n"
    )
    assert config.source.stores == (
        StoreAddress(0, "10.0.0.3", 14568, 5, 0),
        NamedStore("NEWYORK-1", 0, 0),
        StoreAddress(7, "10.0.0.4", 14569, 0, 0),
        StoreAddress(7, "10.0.0.5", 14569, 9, 0),
    )
    assert [str(s) for s in config.source.ume_store] == [
        "0:10.0.0.3:14568:5:0",
        "7:10.0.0.4:14569:0:0",
        "7:10.0.0.5:14569:9:0",
    ]
    assert config.source.groups() == (StoreGroup(0, 4),)


def test_clear_entry_clears_named_stores_too() -> None:
    config = parse_client_config("source ume_store_name a\nsource ume_store 0.0.0.0:0\n")
    assert config.source.stores == () and not config.source.persistent


def test_store_groups_append_clear_and_must_ascend() -> None:
    config = parse_client_config(
        "source ume_store_group 0:5\n"
        "source ume_store_group 1:3\n"
        "source ume_store_group 0:0\n"
        "source ume_store_group 0:3\n"
        "source ume_store_group 2:5\n"
    )
    assert config.source.ume_store_group == (StoreGroup(0, 3), StoreGroup(2, 5))
    error = error_of("source ume_store_group 1:3\nsource ume_store_group 1:2\n")
    assert error.line == 2 and "ascending GroupIDX order" in error.message
    assert "GroupSZ >= 1" in error_of("source ume_store_group 1:0").message


def test_stores_must_name_declared_groups_and_backup_stores_warn() -> None:
    text = (
        "source ume_store_group 0:1\n"
        "source ume_store 10.0.0.1:1:0:0\n"
        "source ume_store 10.0.0.2:1:0:0\n"
        "source ume_store 10.0.0.3:1:0:3\n"
    )
    error = error_of(text)
    assert error.line == 4 and "group 3, which no ume_store_group declares" in error.message
    config = parse_client_config(text.rsplit("\n", 2)[0] + "\n")
    (warning,) = config.warnings
    assert warning.line == 1 and "backup" in warning.message
    lone = parse_client_config("source ume_store 10.0.0.1:1:0:2\n")
    assert "no ume_store_group is configured" in lone.warnings[0].message
    # what the source core does with it: group 2 of one store, so one store makes quorum
    assert "each group's size is the number of stores naming it" in lone.warnings[0].message
    core = SourceCore("t", source_config(lone), ip="127.0.0.1", transport_port=1,
                      request_port=2, resolver=None, now=0.0)
    assert core.group_sizes == {2: 1}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.0.0.1", "[DomainID:]IP:port"),
        ("10.0.0.1:70000", "store port"),
        ("10.0.0.1:14567:1:2:3", "[DomainID:]IP:port"),
        ("10.0.0.300:1", "IPv4"),
        ("host.example:1", "IPv4"),
        ("0.0.0.0:14567", "clear entry"),
        ("10.0.0.1:0", "clear entry"),
        ("10.0.0.1:1:5:256", "GroupIDX: a decimal integer 0..255"),
        ("10.0.0.1:1:4294967296", "RegID: a decimal integer 0..4294967295"),
        ("x:10.0.0.1:1", "DomainID"),
    ],
)
def test_bad_store_addresses(value: str, expected: str) -> None:
    error = error_of(f"# header\nsource ume_store {value}\n")
    assert error.line == 2
    assert f"option 'ume_store' has invalid value {value!r}" in error.message
    assert expected in error.message


def test_named_stores_are_validated() -> None:
    assert "context-name" in error_of("source ume_store_name bad.name:1").message
    assert "context-name" in error_of("source ume_store_name " + "a" * 129).message
    config = parse_client_config("source ume_store_name " + "a" * 128 + ":4:0")
    assert config.source.stores == (NamedStore("a" * 128, 4, 0),)


def test_resolver_unicast_daemons_append() -> None:
    config = parse_client_config(
        "context resolver_unicast_daemon 10.0.0.1:15380\n"
        "context resolver_unicast_daemon 10.0.0.2:15381\n"
    )
    assert config.context.resolver_unicast_daemon == (
        UnicastResolverDaemon("10.0.0.1", 15380),
        UnicastResolverDaemon("10.0.0.2", 15381),
    )
    assert "not supported" in error_of("context resolver_unicast_daemon eth0->1.2.3.4:5").message
    assert "lbmrd port" in error_of("context resolver_unicast_daemon 1.2.3.4:0").message


# --- values, scopes, names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("17", 17),
        ("017", 15),
        ("0x1F", 31),
        ("0X1f", 31),
        ("535353", 535353),
        ("0xFFFFFFFFFFFFFFFE", 0xFFFFFFFFFFFFFFFE),
        ("18446744073709551614", 0xFFFFFFFFFFFFFFFE),
    ],
)
def test_session_id_bases(text: str, value: int) -> None:
    assert parse_session_id(text) == value
    config = parse_client_config(f"context ume_session_id {text}\nsource ume_session_id {text}")
    assert config.context.ume_session_id == config.source.ume_session_id == value


@pytest.mark.parametrize("text", ["0x", "09", "0xFFFFFFFFFFFFFFFF", "-1", "12a", "0x-1"])
def test_bad_session_ids(text: str) -> None:
    with pytest.raises(ValueError, match="session ID"):
        parse_session_id(text)
    assert "ume_session_id" in error_of(f"receiver ume_session_id {text}").message


def test_session_id_inheritance() -> None:
    config = parse_client_config("context ume_session_id 5\nreceiver ume_session_id 6\n")
    assert config.source.effective_session_id(config.context) == 5
    assert config.receiver.effective_session_id(config.context) == 6


def test_later_lines_override_and_comments_are_ignored() -> None:
    config = parse_client_config(
        "source ume_flight_size 10   # first\n"
        "   # a comment line\n"
        "\n"
        "SOURCE UME_FLIGHT_SIZE 20\n"
        "receiver delivery_control_maximum_burst_loss 1000000000\r\n"
    )
    assert config.source.ume_flight_size == 20
    assert config.receiver.delivery_control_maximum_burst_loss == 1000000000


def test_enumerations_are_case_insensitive_and_canonical() -> None:
    config = parse_client_config(
        "source ume_flight_size_behavior Notify\n"
        "source ume_retention_intergroup_stability_behavior any-group\n"
        "source ume_retention_intragroup_stability_behavior all-stores\n"
        "source ume_consensus_sequence_number_behavior LOWEST\n"
        "source transport LBT-RU\n"
    )
    source = config.source
    assert source.ume_flight_size_behavior == "notify"
    assert source.ume_retention_intergroup_stability_behavior == "any"
    assert source.ume_retention_intragroup_stability_behavior == "all"
    assert source.ume_consensus_sequence_number_behavior == "lowest"
    assert source.transport == "lbt-ru" and source.transport_supported
    error = error_of("source ume_flight_size_behavior wait")
    assert "block or notify" in error.message


def test_receiver_paced_persistence_modes_depend_on_scope_and_profile() -> None:
    text = "receiver ume_receiver_paced_persistence 2"
    assert parse_client_config(text).receiver.ume_receiver_paced_persistence == 2
    assert "one of 0, 1 for a receiver" in error_of(text, profile="guide-5.3").message
    assert "one of 0, 1 for a source" in error_of("source ume_receiver_paced_persistence 2").message


def test_round_robin_is_coerced_on_current_and_kept_on_guide() -> None:
    text = "source ume_store_behavior rr"
    current = parse_client_config(text)
    assert current.source.ume_store_behavior == "qc"
    assert "removed in UM 6.8" in current.warnings[0].message
    assert current.warnings[0].line == 1
    guide = parse_client_config(text, profile="guide-5.3")
    assert guide.source.ume_store_behavior == "rr" and guide.warnings == ()


def test_scope_and_name_errors() -> None:
    error = error_of("source ume_store_name a\nrecieve ume_use_store 1\n")
    assert error.line == 2 and "did you mean 'receiver'?" in error.message
    error = error_of("source ume_flight_sise 5")
    assert "unknown source option 'ume_flight_sise'" in error.message
    assert "did you mean 'ume_flight_size'?" in error.message
    error = error_of("receiver ume_flight_size 5")
    assert "is a source option, not a receiver option" in error.message
    error = error_of("context ume_store 10.0.0.1:1")
    assert "is a source option, not a context option" in error.message
    error = error_of("receiver retransmit_retention_size_limt 5")
    assert "nearest known option is 'retransmit_retention_size_limit'" in error.message
    error = error_of("source ume_flight_size")
    assert "expected 'scope option value'" in error.message


def test_deprecated_options() -> None:
    error = error_of("source ume_primary_store_address 10.0.0.1")
    assert "removed" in error.message and "ume_store" in error.message
    assert "ume_session_id" in error_of("source ume_registration_id 5").message
    config = parse_client_config(
        "source ume_retention_size_limit 1000000\n"
        "receiver ume_retransmit_request_interval 900\n"
        "source ume_message_map_tablesz 128\n"
        "receiver ume_use_late_join 0\n"
    )
    assert config.source.retransmit_retention_size_limit == 1000000
    assert config.receiver.retransmit_request_interval == 900
    assert config.receiver.use_late_join is False and not config.receiver.persistent
    assert [w.line for w in config.warnings] == [1, 2, 3, 4]
    assert "ignored" in config.warnings[2].message


def test_unmodelled_options_and_scopes_are_kept_verbatim() -> None:
    config = parse_client_config(
        "context fd_management_type epoll\n"
        "source implicit_batching_minimum_length 2048\n"
        "wildcard_receiver pattern_type pcre\n"
        "event_queue queue_size_warning 1000\n"
    )
    assert dict(config.context.other) == {"fd_management_type": "epoll"}
    assert dict(config.source.other) == {"implicit_batching_minimum_length": "2048"}
    assert dict(config.wildcard_receiver) == {"pattern_type": "pcre"}
    assert dict(config.event_queue) == {"queue_size_warning": "1000"}
    assert config.warnings == ()


def test_explicit_ack_and_batching_exclude_each_other_last_wins() -> None:
    later_batching = parse_client_config(
        "receiver ume_explicit_ack_only 1\nreceiver ume_use_ack_batching 1\n"
    )
    assert later_batching.receiver.ume_use_ack_batching is True
    assert later_batching.receiver.ume_explicit_ack_only is False
    assert "turns ume_explicit_ack_only off" in later_batching.warnings[0].message
    off = parse_client_config("receiver ume_explicit_ack_only 0\n")
    assert off.receiver.ume_use_ack_batching is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("source transport lbt-ipc", "tcp, lbt-ru or lbt-rm"),
        ("context request_tcp_port_low 15000\ncontext request_tcp_port_high 14000", "above"),
        ("context transport_tcp_port_high 100", "above"),
        ("context ume_proactive_keepalive_interval 1000", "at least 1500"),
        ("source ume_receiver_paced_persistence 1", "non-zero ume_flight_size_bytes"),
        ("source retransmit_retention_size_limit 60000", "65536-byte minimum"),
        ("source ume_flight_size 0", "1..4294967295"),
        ("receiver use_otr 3", "0..2"),
        ("source ume_proxy_source yes", "0 or 1"),
        ("source transport_tcp_port 65536", "0..65535"),
    ],
)
def test_invalid_values(text: str, expected: str) -> None:
    error = error_of(text)
    assert expected in error.message
    assert error.line is not None and error.line <= text.count("\n") + 1


def test_retention_minimum_depends_on_transport() -> None:
    text = "source transport lbtru\nsource retransmit_retention_size_limit 60000\n"
    assert parse_client_config(text).source.retransmit_retention_size_limit == 60000


def test_rpp_overrides_without_rpp_warn() -> None:
    config = parse_client_config("source ume_write_delay 100\n")
    assert "only matters for an RPP source" in config.warnings[0].message


def test_proactive_keepalive_on_the_guide_profile_warns() -> None:
    config = parse_client_config(
        "context ume_proactive_keepalive_interval 3000", profile="guide-5.3"
    )
    assert config.context.ume_proactive_keepalive_interval == 3000
    assert "6.9" in config.warnings[0].message


def test_load_client_config(tmp_path: Path) -> None:
    path = tmp_path / "lbm.cfg"
    path.write_text(RPP_CLIENT)
    assert load_client_config(path).source_file == str(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_client_config(tmp_path / "missing.cfg")
    path.write_bytes(b"source ume_flight_size \xff\xfe\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_client_config(path)


# --- from_mapping -------------------------------------------------------------------------------


def test_from_mapping_takes_typed_values_and_validates_them() -> None:
    source = SourceOptions.from_mapping(
        {
            "ume_store_group": [StoreGroup(0, 2)],
            "ume_store": ["10.0.0.1:14567", StoreAddress(0, "10.0.0.2", 14567, 3, 0)],
            "ume_store_name": NamedStore("later", 0, 0),
            "ume_proxy_source": True,
            "ume_flight_size": 64,
            "transport": "lbt-ru",
        }
    )
    assert [type(s).__name__ for s in source.stores] == [
        "StoreAddress",
        "StoreAddress",
        "NamedStore",
    ]
    assert source.stores[1] == StoreAddress(0, "10.0.0.2", 14567, 3, 0)
    assert (source.ume_proxy_source, source.ume_flight_size) == (True, 64)
    assert ReceiverOptions.from_mapping({"use_otr": 1}).otr_enabled_for_persistence
    assert not ContextOptions.from_mapping(
        {"request_tcp_bind_request_port": False}
    ).persistence_enabled
    with pytest.raises(ConfigError) as caught:
        SourceOptions.from_mapping({"ume_flight_size": 0})
    assert caught.value.file == "<mapping>" and caught.value.line is None
    with pytest.raises(ConfigError, match="cannot use a float"):
        SourceOptions.from_mapping({"ume_flight_size": 1.5})
    with pytest.raises(ConfigError, match="did you mean"):
        ReceiverOptions.from_mapping({"ume_use_stor": 1})
    guide = SourceOptions.from_mapping({}, profile="guide-5.3")
    assert guide.ume_registration_interval == 500


# --- round trips --------------------------------------------------------------------------------

addresses = st.builds(
    StoreAddress,
    domain_id=st.integers(0, 2**32 - 1),
    ip=st.ip_addresses(v=4).map(str).filter(lambda ip: ip != "0.0.0.0"),
    port=st.integers(1, 65535),
    reg_id=st.integers(0, 2**32 - 1),
    group_idx=st.just(0),
)


@given(st.lists(addresses, min_size=1, max_size=5))
def test_store_address_text_round_trips(stores: list[StoreAddress]) -> None:
    text = "".join(f"source ume_store {store}\n" for store in stores)
    assert parse_client_config(text).source.stores == tuple(stores)


@given(st.integers(0, 0xFFFFFFFFFFFFFFFE), st.sampled_from(["{:d}", "0x{:x}", "0x{:X}", "0{:o}"]))
def test_session_id_round_trips_in_every_base(value: int, style: str) -> None:
    assert parse_session_id(style.format(value)) == value


INTEGER_OPTIONS = [
    ("source", "ume_flight_size", 1, 2**32 - 1),
    ("source", "ume_flight_size_bytes", 0, 2**63 - 1),
    ("source", "ume_message_stability_timeout", 0, 2**32 - 1),
    ("source", "ume_store_activity_timeout", 1, 2**32 - 1),
    ("receiver", "retransmit_request_maximum", 0, 2**32 - 1),
    ("receiver", "ume_sri_request_maximum", 0, 2**32 - 1),
    ("context", "ume_ack_batching_interval", 1, 2**32 - 1),
    ("receiver", "otr_message_caching_threshold", 0, 2**32 - 1),
]


@given(
    st.sampled_from(INTEGER_OPTIONS).flatmap(
        lambda o: st.tuples(st.just(o), st.integers(o[2], o[3]))
    )
)
def test_integer_options_round_trip(case: tuple[tuple[str, str, int, int], int]) -> None:
    (scope, name, low, high), value = case
    config = parse_client_config(f"{scope} {name} {value}")
    assert getattr(getattr(config, scope), name) == value
    for outside in (low - 1, high + 1):
        if outside >= 0:
            with pytest.raises(ConfigError, match=f"{low}\\.\\.{high}"):
                parse_client_config(f"{scope} {name} {outside}")


# --- hostile input (issue 22 items 3 and 5) -----------------------------------------------------

HUGE = "9" * 5000  # past CPython's 4,300-digit int() limit


@pytest.mark.parametrize("line", [
    f"source ume_flight_size {HUGE}",
    f"receiver ume_session_id {HUGE}",
    f"context ume_session_id {HUGE}",
    f"source ume_store 10.0.0.1:{HUGE}",
    f"source ume_store {HUGE}:10.0.0.1:14567",
    f"source ume_store 10.0.0.1:14567:{HUGE}",
    f"source ume_store_name s1:{HUGE}",
    f"source ume_store_group 0:{HUGE}",
    f"context request_tcp_port_low {HUGE}",
    f"receiver ume_receiver_paced_persistence {HUGE}",
    "receiver ume_receiver_paced_persistence \u00b2",
    f"context resolver_unicast_daemon 127.0.0.1:{HUGE}",
], ids=lambda line: line.replace(HUGE, "<5000 digits>"))
def test_integers_past_the_digit_limit_and_non_ascii_digits_are_config_errors(line: str) -> None:
    error = error_of(f"# first\n{line}\n")
    assert error.line == 2
    assert HUGE not in error.message


def test_a_hex_session_id_of_any_length_is_range_checked() -> None:
    assert "session ID" in error_of(f"source ume_session_id 0x{'f' * 5000}\n").message


@pytest.mark.parametrize("breaker", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
                                     "\u2029", "\r"])
def test_a_comment_cannot_hide_a_live_line(breaker: str) -> None:
    """``str.splitlines()`` ended a line at each of these, so the rest of the comment became an
    option line (a hidden ``ume_store``); only ``\\n`` ends a line."""
    text = (f"# maintenance note{breaker}source ume_store 10.6.6.6:14567\n"
            "source ume_store 10.0.0.1:14567\n")
    config = parse_client_config(text, "client.cfg")
    assert [str(s) for s in config.source.stores] == ["0:10.0.0.1:14567:0:0"]


def test_line_numbers_count_only_line_feeds() -> None:
    text = "# a\x0bb\x0cc\u2028d\r\nsource ume_flight_size 0\n"
    assert error_of(text).line == 2


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u00a0", "\u200b",
                                  "\u202e", "\x00", "\r", "\x7f"])
def test_a_stray_character_outside_a_comment_is_an_error_at_its_column(char: str) -> None:
    error = error_of(f"source ume_store{char}10.0.0.1:14567\n")
    assert (error.line, error.column) == (1, 17)
    assert f"U+{ord(char):04X}" in error.message
    assert "\n" not in str(error) and char not in str(error)


def test_crlf_line_ends_and_a_leading_byte_order_mark_are_accepted() -> None:
    config = parse_client_config("\ufeffsource ume_flight_size 7\r\nsource ume_flight_size 8\r\n")
    assert config.source.ume_flight_size == 8


# --- quorum/consensus settings that contradict each other (issue 18) --------------------------

_TWO_GROUPS = (
    "source ume_store_group 0:3\n"
    "source ume_store_group 1:3\n"
    "source ume_store 10.0.0.1:14567:0:0\n"
    "source ume_store 10.0.0.2:14567:0:0\n"
    "source ume_store 10.0.0.3:14567:0:1\n"
)
"""Group 0 has its quorum (2 of 3), group 1 only one store of three."""

QC_CONTRADICTIONS: list[tuple[str, str, int, str]] = [
    # (what, file text, line the error names, words the message must hold)
    ("a lone group below its quorum",
     "source ume_store_group 0:3\nsource ume_store 10.0.0.1:14567\n",
     1, "group 0 (size 3) has 1 store but needs 2"),
    ("intragroup all with a store missing",
     "source ume_store_group 0:3\nsource ume_store 10.0.0.1:14567\n"
     "source ume_store 10.0.0.2:14567\n"
     "source ume_retention_intragroup_stability_behavior all\n",
     1, "has 2 stores but needs 3 to register (intragroup all)"),
    ("intergroup all with a group below its quorum",
     _TWO_GROUPS + "source ume_retention_intergroup_stability_behavior all\n",
     2, "intergroup all needs every group"),
    ("intergroup majority with one of two groups able",
     _TWO_GROUPS + "source ume_retention_intergroup_stability_behavior majority\n",
     2, "intergroup majority needs 2 of the 2 groups"),
    ("a declared group no store names, intergroup all",
     "source ume_store_group 0:1\nsource ume_store_group 1:1\n"
     "source ume_store 10.0.0.1:14567\n"
     "source ume_retention_intergroup_stability_behavior all-groups\n",
     2, "group 1 (size 1) has 0 stores"),
]

QC_ALREADY_REFUSED: list[tuple[str, str, int, str]] = [
    ("an unknown intergroup behaviour",
     "source ume_retention_intergroup_stability_behavior most\n", 1, "all-active"),
    ("an unknown intragroup behaviour",
     "source ume_retention_intragroup_stability_behavior majority\n", 1, "quorum"),
    ("an unknown consensus behaviour",
     "receiver ume_consensus_sequence_number_behavior median\n", 1, "lowest"),
    ("an unknown store behaviour", "source ume_store_behavior quorum\n", 1, "ume_store_behavior"),
    ("a store in an undeclared group",
     "source ume_store_group 0:1\nsource ume_store 10.0.0.1:14567:0:1\n", 2,
     "which no ume_store_group declares"),
    ("a GroupIDX past its range", "source ume_store 10.0.0.1:14567:0:256\n", 1, "0..255"),
]


@pytest.mark.parametrize(("what", "text", "line", "words"), QC_CONTRADICTIONS,
                         ids=[c[0] for c in QC_CONTRADICTIONS])
def test_qc_settings_that_can_never_register_are_refused(what: str, text: str, line: int,
                                                         words: str) -> None:
    error = error_of(text)
    assert error.line == line and words in error.message, str(error)
    assert "could never complete registration" in error.message


def test_a_dead_group_warns_when_the_other_groups_suffice() -> None:
    """Intergroup ``any`` (the default): group 0 registers on its own, so group 1 being
    short is a warning at its line, not an error."""
    config = parse_client_config(_TWO_GROUPS)
    (warning,) = config.warnings
    assert warning.line == 2 and "can never register" in warning.message
    fine = parse_client_config("source ume_store_group 0:3\nsource ume_store 10.0.0.1:14567\n"
                               "source ume_store 10.0.0.2:14567\n")
    assert fine.warnings == ()


def test_round_robin_contradicts_quorum_consensus_settings() -> None:
    """Guide "Round-Robin Store Usage": one store at a time, so QC groups are refused with
    ``rr`` (kept on the guide profile only) and a stability behaviour other than the default
    warns that it does nothing."""
    groups = "source ume_store_behavior rr\nsource ume_store_group 0:1\n" \
             "source ume_store 10.0.0.1:14567\n"
    error = error_of(groups, profile="guide-5.3")
    assert error.line == 2 and "round-robin" in error.message
    behaviour = parse_client_config("source ume_store_behavior rr\n"
                                    "source ume_retention_intragroup_stability_behavior all\n",
                                    profile="guide-5.3")
    (warning,) = behaviour.warnings
    assert warning.line == 2 and "has no effect with ume_store_behavior rr" in warning.message
    plain = "source ume_store_behavior rr\nsource ume_store 10.0.0.1:14567\n"
    assert parse_client_config(plain, profile="guide-5.3").source.ume_store_behavior == "rr"


@pytest.mark.parametrize("command", ["source", "receiver"])
@pytest.mark.parametrize(("what", "text", "line", "words"),
                         QC_CONTRADICTIONS + QC_ALREADY_REFUSED,
                         ids=[c[0] for c in QC_CONTRADICTIONS + QC_ALREADY_REFUSED])
def test_bad_qc_configuration_stops_the_command_at_start_up(
        command: str, what: str, text: str, line: int, words: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``ump source -c FILE`` and ``ump receiver -c FILE``: exit 2 and one line
    ``FILE:LINE: ...`` on stderr, before any process starts."""

    def accepted(*_: object) -> int:
        raise AssertionError("the configuration was accepted and the process would start")

    monkeypatch.setattr(reference_impl.cli, "_run", accepted)
    path = tmp_path / "qc.cfg"
    path.write_text(text)
    capsys.readouterr()
    code = main([command, "-c", str(path), "--topic", "t"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"{path}:{line}:") or f" {path}:{line}:" in err, err
    assert words in err, err
