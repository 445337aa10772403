"""umestored XML: the guide's examples, every error class, pattern precedence, profiles, DTDs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.config import (
    DEFAULT_PROFILE,
    DTD_VERSIONS,
    ConfigError,
    get_profile,
    load_store_config,
    parse_store_config,
    profile_differences,
    profile_names,
    validate_structure,
)
from reference_impl.config.store_xml import (
    _DTDS,
    _derive,
    _Nothing,
    _nullable,
    _parse_model,
    dump_dtd,
    store_option_names,
    topic_option_names,
)
from reference_impl.config.store_xml_writer import StoreXml, TopicXml, store_daemon_xml

# --- documents ----------------------------------------------------------------------------------

# The guide's "Store Configuration Example" (DTD 1.2), transcribed.
GUIDE_EXAMPLE = """<?xml version="1.0"?>
<ume-store version="1.2">
  <daemon>
    <log>stored.log</log>
    <pidfile>stored.pid</pidfile>
    <web-monitor>*:15304</web-monitor>
  </daemon>
  <stores>
    <store name="test-store" port="14567">
      <ume-attributes>
        <option type="store" name="disk-cache-directory" value="cache"/>
        <option type="store" name="disk-state-directory" value="state"/>
        <option type="store" name="context-name" value="remote-store"/>
      </ume-attributes>
      <topics>
        <topic pattern="test*" type="PCRE">
          <ume-attributes>
            <option type="store" name="repository-type" value="disk"/>
            <option type="store" name="repository-size-threshold" value="104857600"/>
            <option type="store" name="repository-size-limit" value="209715200"/>
            <option type="store" name="repository-disk-file-size-limit" value="1073741824"/>
            <option type="store" name="source-activity-timeout" value="120000"/>
            <option type="store" name="receiver-activity-timeout" value="120000"/>
            <option type="store" name="retransmission-request-forwarding" value="0"/>
          </ume-attributes>
        </topic>
      </topics>
    </store>
  </stores>
</ume-store>
"""

# The guide's RPP store file (DTD 1.2), with the PDF extraction damage repaired.
RPP_EXAMPLE = """<?xml version="1.0"?>
<ume-store version="1.2">
  <daemon>
    <log>/configs/stores/umestored1/umestored.log</log>
    <lbm-license-file>/bin/umq_exp_license.txt</lbm-license-file>
    <lbm-license-file>/bin/lbm_ume_umq_udx_rdma_license.txt</lbm-license-file>
    <lbm-config>/configs/lbm4store.cfg</lbm-config>
    <pidfile>/configs/stores/umestored1/umestored.pid</pidfile>
    <web-monitor>*:15404</web-monitor>
  </daemon>
  <stores>
    <store name="rpp-ump-test-store-1" port="14667">
      <ume-attributes>
        <option type="store" name="disk-cache-directory" value="/stores/store1/cache"/>
        <option type="store" name="disk-state-directory" value="/stores/store1/state"/>
        <option type="store" name="allow-proxy-source" value="0" />
        <option type="store" name="context-name" value="store1rpp"/>
      </ume-attributes>
      <topics>
        <topic pattern="ABC*" type="PCRE">
          <ume-attributes>
            <option type="store" name="repository-allow-receiver-paced-persistence"
                    value="1"/>
            <option type="store" name="repository-type" value="disk"/>
            <option type="store" name="repository-size-threshold" value="104857600"/>
            <option type="store" name="repository-size-limit" value="209715200"/>
            <option type="store" name="repository-disk-file-size-limit"
                    value="1073741824"/>
            <option type="store" name="repository-allow-ack-on-reception" value="1"/>
            <option type="store" name="repository-disk-write-delay" value="1000"/>
            <option type="store" name="receiver-new-registration-rollback" value="0"/>
            <option type="store" name="source-activity-timeout" value="120000"/>
            <option type="store" name="receiver-activity-timeout" value="30000"/>
            <option type="store" name="retransmission-request-forwarding" value="0"/>
          </ume-attributes>
        </topic>
      </topics>
    </store>
  </stores>
</ume-store>
"""

# A minimal DTD 1.0 memory store on port 14567 (the shape of the product's example file).
MINIMAL_1_0 = """<?xml version="1.0"?>
<ume-store version="1.0">
  <daemon>
    <log>ume-example-stored.log</log>
  </daemon>
  <stores>
    <store name="ume-example-store" port="14567">
      <topics>
        <topic pattern=".*" type="PCRE">
          <ume-attributes>
            <option type="store" name="repository-type" value="memory"/>
          </ume-attributes>
        </topic>
      </topics>
    </store>
  </stores>
</ume-store>
"""


def store_doc(
    store_body: str,
    *,
    version: str = "1.3",
    daemon: str = "",
    store_attrs: str = 'name="s" port="14567"',
) -> str:
    """A one-store document around ``store_body``."""
    return (
        '<?xml version="1.0"?>\n'
        f'<ume-store version="{version}">\n'
        f"  <daemon>{daemon}</daemon>\n"
        "  <stores>\n"
        f"    <store {store_attrs}>\n"
        f"{store_body}\n"
        "    </store>\n"
        "  </stores>\n"
        "</ume-store>\n"
    )


def attrs(*options: tuple[str, str] | tuple[str, str, str]) -> str:
    """A ``<ume-attributes>`` block; each option is (name, value) or (type, name, value)."""
    lines = []
    for option in options:
        if len(option) == 2:
            lines.append(f'<option type="store" name="{option[0]}" value="{option[1]}"/>')
        else:
            lines.append(f'<option type="{option[0]}" name="{option[1]}" value="{option[2]}"/>')
    return "<ume-attributes>" + "".join(lines) + "</ume-attributes>"


def topic(pattern: str, *options: tuple[str, str] | tuple[str, str, str], kind: str = "") -> str:
    kind_attr = f' type="{kind}"' if kind else ""
    inner = attrs(*options) if options else ""
    return f'<topic pattern="{pattern}"{kind_attr}>{inner}</topic>'


MEMORY = ("repository-type", "memory")


def simple(*topics: str, store_options: str = "", **kwargs: str) -> str:
    store_attributes = store_options or attrs(("context-name", "c1"))
    return store_doc(store_attributes + "<topics>" + "".join(topics) + "</topics>", **kwargs)


def error_of(text: str, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_store_config(text, "store.xml", **kwargs)  # type: ignore[arg-type]
    assert caught.value.file == "store.xml"
    return caught.value


def line_of(text: str, needle: str) -> int:
    """1-based line of the first occurrence of ``needle``."""
    return text[: text.index(needle)].count("\n") + 1


def column_of(text: str, needle: str) -> int:
    offset = text.index(needle)
    return offset - (text.rfind("\n", 0, offset) + 1) + 1


# --- valid examples -----------------------------------------------------------------------------


def test_guide_example_parses_with_its_values_and_current_defaults() -> None:
    config = parse_store_config(GUIDE_EXAMPLE, "guide.xml")
    assert config.version == "1.2"
    assert config.profile == DEFAULT_PROFILE == "current"
    daemon = config.daemon
    assert daemon.log is not None and daemon.log.path == "stored.log"
    assert daemon.log.destination == "file"
    assert daemon.pidfile == "stored.pid"
    assert daemon.web_monitor is not None
    assert (daemon.web_monitor.host, daemon.web_monitor.port) == (None, 15304)
    assert str(daemon.web_monitor) == "*:15304"

    (store,) = config.stores
    assert (store.name, store.port, store.interface) == ("test-store", 14567, "0.0.0.0")
    assert store.interface_network.num_addresses == 1
    assert store.disk_cache_directory == "cache"
    assert store.disk_state_directory == "state"
    assert store.context_name == "remote-store"
    assert store.retransmission_request_processing_rate == 262144

    options = config.topic_options("test-store", "test.topic")
    assert options is not None
    assert options.repository_type == "disk"
    assert options.repository_size_threshold == 104857600
    assert options.repository_size_limit == 209715200
    assert options.repository_disk_file_size_limit == 1073741824
    assert options.source_activity_timeout == options.receiver_activity_timeout == 120000
    assert options.retransmission_request_forwarding is False
    # unset options come from the current profile
    assert options.keepalive_interval == 3000
    assert options.source_check_interval == 750
    assert options.receiver_new_registration_rollback == 2147483647
    assert options.value("proxy-election-interval") == 60000
    assert config.warnings == ()


def test_guide_example_under_guide_profile_takes_the_guide_defaults() -> None:
    config = parse_store_config(GUIDE_EXAMPLE, profile="guide-5.3")
    options = config.topic_options("test-store", "test.topic")
    assert options is not None
    assert (options.keepalive_interval, options.source_check_interval) == (500, 100)
    assert options.receiver_new_registration_rollback == 0
    assert options.proxy_election_interval == 5000
    assert options.repository_disk_max_write_async_cbs == 16
    # explicit values are the same in both profiles
    assert options.repository_size_threshold == 104857600


def test_rpp_example() -> None:
    config = parse_store_config(RPP_EXAMPLE, "rpp.xml")
    assert config.daemon.lbm_license_files == (
        "/bin/umq_exp_license.txt",
        "/bin/lbm_ume_umq_udx_rdma_license.txt",
    )
    assert config.daemon.lbm_config == "/configs/lbm4store.cfg"
    store = config.store("rpp-ump-test-store-1")
    assert (store.port, store.context_name, store.allow_proxy_source) == (14667, "store1rpp", False)
    options = store.topic_options("ABC.quotes")
    assert options is not None
    assert options.repository_allow_receiver_paced_persistence is True
    assert options.repository_allow_ack_on_reception is True
    assert options.repository_disk_write_delay == 1000
    assert options.receiver_new_registration_rollback == 0
    assert options.source_flight_size_bytes_maximum == 4194304  # not set: the default
    assert store.topic_options("XYZ") is None
    assert config.warnings == ()


def test_minimal_dtd_1_0_memory_store() -> None:
    config = parse_store_config(MINIMAL_1_0)
    (store,) = config.stores
    assert (store.port, store.context_name) == (14567, None)
    assert config.daemon.web_monitor is None  # omitted = disabled
    options = store.topic_options("anything at all")
    assert options is not None and options.repository_type == "memory"


def test_load_store_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "store.xml"
    path.write_text(GUIDE_EXAMPLE)
    assert load_store_config(path).stores[0].name == "test-store"
    with pytest.raises(ConfigError, match="cannot read") as caught:
        load_store_config(tmp_path / "missing.xml")
    assert caught.value.file == str(tmp_path / "missing.xml")


def test_dtd_1_3_daemon_elements() -> None:
    daemon = (
        '<log type="file" size="23" frequency="daily">/var/log/store01.log</log>'
        '<xml-config application-name="tnwgd">lbm_cfg.xml</xml-config>'
        "<web-monitor>10.1.2.3:8080</web-monitor><uid>1234</uid><gid>99</gid>"
        '<daemon-monitor topic="mon"><publishing-interval><group name="default" ivl="10"/>'
        '<group name="store" ivl="20"/></publishing-interval>'
        '<remote-snapshot-request allow="1"/></daemon-monitor>'
    )
    config = parse_store_config(simple(topic("t", MEMORY), daemon=daemon))
    d = config.daemon
    assert d.log is not None
    assert (d.log.type, d.log.size_mb, d.log.frequency) == ("file", 23, "daily")
    assert (d.xml_config, d.xml_config_application_name) == ("lbm_cfg.xml", "tnwgd")
    assert d.web_monitor is not None and (d.web_monitor.host, d.web_monitor.port) == (
        "10.1.2.3",
        8080,
    )
    assert (d.uid, d.gid) == ("1234", "99")
    assert d.daemon_monitor is not None
    assert d.daemon_monitor.topic == "mon"
    assert dict(d.daemon_monitor.publishing_interval) == {"default": 10, "store": 20}
    assert d.daemon_monitor.remote_snapshot_request is True
    assert d.daemon_monitor.remote_config_changes_request is False
    assert any("deprecated" in w.message for w in config.warnings)


def test_repeated_daemon_elements_keep_the_last_with_a_warning() -> None:
    daemon = "<web-monitor>*:1</web-monitor><web-monitor>*:2</web-monitor><uid>a</uid>"
    config = parse_store_config(simple(topic("t", MEMORY), daemon=daemon))
    assert config.daemon.web_monitor is not None and config.daemon.web_monitor.port == 2
    (warning,) = config.warnings
    assert "<web-monitor> given more than once" in warning.message


def test_text_whitespace_follows_xml_space() -> None:
    daemon = '<pidfile>\n   a   b  </pidfile><lbm-config xml:space="preserve"> x  y </lbm-config>'
    config = parse_store_config(simple(topic("t", MEMORY), daemon=daemon))
    assert config.daemon.pidfile == "a b"
    assert config.daemon.lbm_config == " x  y "


def test_lbm_options_are_kept_per_scope_and_interface_range_parses() -> None:
    body = (
        attrs(("lbm-context", "transport_lbtrm_receiver_socket_buffer", "1048576"))
        + "<topics>"
        + topic(
            "t",
            MEMORY,
            ("lbm-receiver", "transport_lbtrm_send_naks", "0"),
            ("lbm-source", "transport", "lbtru"),
        )
        + "</topics>"
    )
    config = parse_store_config(
        store_doc(body, store_attrs='name="s" port="14567" interface="10.29.3.16/25"')
    )
    (store,) = config.stores
    assert dict(store.lbm_context) == {"transport_lbtrm_receiver_socket_buffer": "1048576"}
    options = store.topic_options("t")
    assert options is not None
    assert dict(options.lbm_receiver) == {"transport_lbtrm_send_naks": "0"}
    assert dict(options.lbm_source) == {"transport": "lbtru"}
    assert str(store.interface_network) == "10.29.3.0/25"
    assert store.interface == "10.29.3.16/25"


# --- pattern matching and precedence --------------------------------------------------------------


def test_first_matching_topic_in_document_order_wins() -> None:
    text = simple(
        topic(r"^orders\.", MEMORY, ("keepalive-interval", "1111"), kind="PCRE"),
        topic("orders.special", MEMORY, ("keepalive-interval", "2222")),
        topic("quotes", ("repository-type", "disk")),
    )
    config = parse_store_config(text)
    first = config.topic_options("s", "orders.special")
    assert first is not None and first.keepalive_interval == 1111
    swapped = simple(
        topic("orders.special", MEMORY, ("keepalive-interval", "2222")),
        topic(r"^orders\.", MEMORY, ("keepalive-interval", "1111"), kind="PCRE"),
    )
    second = parse_store_config(swapped).topic_options("s", "orders.special")
    assert second is not None and second.keepalive_interval == 2222
    quotes = config.topic_options("s", "quotes")
    assert quotes is not None and quotes.repository_type == "disk"
    assert config.topic_options("s", "quotes.more") is None  # direct = exact
    assert config.topic_options("s", "news") is None


def test_pcre_patterns_are_searched_not_anchored() -> None:
    (store,) = parse_store_config(simple(topic("test*", MEMORY, kind="PCRE"))).stores
    (configured,) = store.topics
    # PCRE "test*" is "tes" then any number of "t": the glob reading would reject "tesxx"
    assert configured.matches("tesxx")
    assert configured.matches("a.test")
    assert not configured.matches("tex")


def test_store_level_topic_options_are_defaults_under_topic_ones() -> None:
    store_options = attrs(
        ("disk-cache-directory", "cache"),
        ("repository-type", "disk"),
        ("keepalive-interval", "1000"),
    )
    text = simple(
        topic("a", ("keepalive-interval", "2000")),
        topic("b", ("repository-size-limit", "1000000")),
        store_options=store_options,
    )
    config = parse_store_config(text)
    (store,) = config.stores
    a, b = store.topic_options("a"), store.topic_options("b")
    assert a is not None and b is not None
    assert (a.keepalive_interval, a.repository_type) == (2000, "disk")
    assert (b.keepalive_interval, b.repository_type, b.repository_size_limit) == (
        1000,
        "disk",
        1000000,
    )
    assert b.source_check_interval == get_profile().topic["source-check-interval"]
    assert dict(store.topic_defaults) == {"repository-type": "disk", "keepalive-interval": 1000}
    assert dict(store.topics[0].explicit) == {"keepalive-interval": 2000}


def test_store_level_options_written_after_topics_still_apply_in_dtd_1_2() -> None:
    body = "<topics>" + topic("a") + "</topics>" + attrs(MEMORY, ("keepalive-interval", "900"))
    options = parse_store_config(store_doc(body, version="1.2")).topic_options("s", "a")
    assert options is not None and options.keepalive_interval == 900


def test_restore_last_is_inherited_and_overridden() -> None:
    body = (
        '<restore-last behavior="hours" value="24"/>'
        + attrs(MEMORY)
        + "<topics>"
        + topic("inherits")
        + '<topic pattern="own"><restore-last behavior="none"/></topic>'
        + "</topics>"
    )
    (store,) = parse_store_config(store_doc(body)).stores
    inherits, own = store.topic_options("inherits"), store.topic_options("own")
    assert inherits is not None and own is not None
    assert inherits.restore_last is not None and inherits.restore_last.hours == 24
    assert own.restore_last is not None and own.restore_last.hours is None


# --- error classes -----------------------------------------------------------------------------


def test_malformed_xml_reports_line_and_column() -> None:
    text = GUIDE_EXAMPLE.replace("<pidfile>stored.pid</pidfile>", "<pidfile>stored.pid</pidfle>")
    error = error_of(text)
    assert "malformed XML" in error.message and "mismatched tag" in error.message
    assert error.line == line_of(text, "</pidfle>")
    start = column_of(text, "</pidfle>")
    assert error.column is not None and start <= error.column < start + len("</pidfle>")
    assert str(error).startswith(f"store.xml:{error.line}:{error.column}: ")


def test_undefined_entity_is_malformed() -> None:
    error = error_of(simple(topic("t&bogus;", MEMORY)))
    assert "undefined entity" in error.message


@pytest.mark.parametrize(
    "prolog",
    [
        '<!DOCTYPE ume-store [<!ENTITY lol "lol">]>',
        '<!DOCTYPE ume-store SYSTEM "file:///etc/passwd">',
        '<!DOCTYPE ume-store [<!ENTITY ext SYSTEM "file:///etc/passwd">]>',
    ],
)
def test_doctype_and_entity_declarations_are_refused(prolog: str) -> None:
    text = GUIDE_EXAMPLE.replace('<?xml version="1.0"?>\n', f'<?xml version="1.0"?>\n{prolog}\n')
    error = error_of(text)
    assert "DOCTYPE declarations are refused" in error.message
    assert error.line == 2
    with pytest.raises(ConfigError):
        validate_structure(text)


def test_xinclude_is_refused() -> None:
    body = '<xi:include href="attrs.xml"/>' + "<topics>" + topic("t", MEMORY) + "</topics>"
    error = error_of(store_doc(body, version="1.2"))
    assert "XInclude is not supported" in error.message


def test_missing_required_attribute() -> None:
    text = simple(topic("t", MEMORY), store_attrs='name="s"')
    error = error_of(text)
    assert "missing its required attribute 'port'" in error.message
    assert error.line == line_of(text, "<store ")
    assert "required attribute 'version'" in error_of("<ume-store><daemon/></ume-store>").message
    no_pattern = simple('<topic type="PCRE">' + attrs(MEMORY) + "</topic>")
    assert "'pattern'" in error_of(no_pattern).message


def test_element_order_depends_on_the_dtd_version() -> None:
    body = "<topics>" + topic("t", MEMORY) + "</topics>" + attrs(("context-name", "x"))
    assert parse_store_config(store_doc(body, version="1.2")).stores[0].context_name == "x"
    text = store_doc(body, version="1.3")
    error = error_of(text)
    assert "misplaced in <store>" in error.message
    assert "restore-last?, publishing-interval?, ume-attributes+, topics+" in error.message
    assert error.line == line_of(text, "<ume-attributes>")
    # the root's order is fixed in every version
    swapped = GUIDE_EXAMPLE.replace("<daemon>", "<stores/><daemon>", 1)
    assert "misplaced in <ume-store>" in error_of(swapped).message


def test_incomplete_content_and_foreign_elements() -> None:
    text = store_doc(attrs(MEMORY), version="1.3")
    error = error_of(text)
    assert "<store> is incomplete" in error.message and "<topics>" in error.message
    assert error.line == line_of(text, "</store>")
    error = error_of(
        simple(topic("t", MEMORY), daemon="<xml-config>x.xml</xml-config>", version="1.2")
    )
    assert "not part of DTD version 1.2" in error.message and "1.3" in error.message
    error = error_of(simple(topic("t", MEMORY), daemon="<nonsense/>"))
    assert "<nonsense> is not part of DTD" in error.message
    assert (
        "must be empty"
        in error_of(
            simple(topic("t", MEMORY)).replace('value="memory"/>', 'value="memory">x</option>')
        ).message
    )
    assert (
        "text only"
        in error_of(simple(topic("t", MEMORY), daemon="<pidfile><uid/></pidfile>")).message
    )
    assert (
        "may not contain text"
        in error_of(simple(topic("t", MEMORY)).replace("<topics>", "<topics>oops")).message
    )


def test_undeclared_attributes_and_enumerations() -> None:
    error = error_of(
        simple(topic("t", MEMORY), daemon='<web-monitor permission="read-only">*:1</web-monitor>')
    )
    assert "'permission'" in error.message and "DTD 1.0, 1.1, 1.2" in error.message
    ok = parse_store_config(
        simple(
            topic("t", MEMORY),
            version="1.2",
            daemon='<web-monitor permission="read-only">*:1</web-monitor>',
        )
    )
    assert ok.daemon.web_monitor is not None and ok.daemon.web_monitor.permission == "read-only"
    error = error_of(simple(topic("t", MEMORY, kind="glob")))
    assert "must be one of direct, PCRE, regexp" in error.message


def test_lowercase_pcre_type_is_accepted_with_a_warning() -> None:
    config = parse_store_config(simple(topic("^alert\\.", MEMORY, kind="pcre")))
    assert config.stores[0].topics[0].type == "PCRE"
    assert config.stores[0].topics[0].matches("alert.x")
    assert any('"PCRE"' in w.message for w in config.warnings)


@pytest.mark.parametrize(
    ("where", "option_type", "allowed"),
    [
        ("store", "lbm-source", "store, lbm-context"),
        ("store", "lbm-receiver", "store, lbm-context"),
        ("topic", "lbm-context", "store, lbm-receiver, lbm-source"),
    ],
)
def test_option_type_must_suit_its_location(where: str, option_type: str, allowed: str) -> None:
    bad = (option_type, "transport", "lbtru")
    if where == "store":
        text = simple(topic("t", MEMORY), store_options=attrs(bad))
    else:
        text = simple(topic("t", MEMORY, bad))
    error = error_of(text)
    assert f'option type "{option_type}" is not allowed inside <{where}>' in error.message
    assert allowed in error.message
    assert error.line == line_of(text, f'type="{option_type}"')


def test_unknown_option_names_the_nearest_one() -> None:
    text = GUIDE_EXAMPLE.replace('"repository-size-limit"', '"repository-size-limt"')
    error = error_of(text)
    assert "unknown store option 'repository-size-limt'" in error.message
    assert "did you mean 'repository-size-limit'?" in error.message
    assert error.line == line_of(text, "repository-size-limt")
    far = error_of(simple(topic("t", MEMORY, ("zzz", "1"))))
    assert "known options:" in far.message and "keepalive-interval" in far.message


def test_store_wide_option_inside_a_topic_is_an_error() -> None:
    error = error_of(simple(topic("t", MEMORY, ("disk-cache-directory", "cache"))))
    assert "store-wide option" in error.message


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("repository-disk-file-size-limit", "1000", "196992.."),
        ("repository-disk-async-buffer-length", "65663", "65664.."),
        ("keepalive-interval", "0", "1..4294967295 (milliseconds)"),
        ("receiver-new-registration-rollback", "2147483648", "0..2147483647 (messages)"),
        ("repository-size-limit", "-1", "decimal integer"),
        ("repository-size-limit", "0x10", "decimal integer"),
        ("retransmission-request-forwarding", "2", "0 or 1"),
        ("repository-type", "tape", "memory or disk"),
        ("repository-type", "no-cache", "not implemented"),
    ],
)
def test_out_of_range_values_say_what_is_expected(option: str, value: str, expected: str) -> None:
    text = simple(topic("t", MEMORY, (option, value)))
    error = error_of(text)
    assert f"option {option!r} has invalid value {value!r}" in error.message
    assert expected in error.message
    assert error.line == line_of(text, f'name="{option}" value="{value}"')


@pytest.mark.parametrize("name", ["bad name", "a" * 129, "", "dot.ted"])
def test_bad_context_name(name: str) -> None:
    error = error_of(simple(topic("t", MEMORY), store_options=attrs(("context-name", name))))
    assert "context-name" in error.message and "1 to 128 characters" in error.message
    assert (
        parse_store_config(
            simple(topic("t", MEMORY), store_options=attrs(("context-name", "A-z_0" * 25 + "abc")))
        )
        .stores[0]
        .context_name
        == "A-z_0" * 25 + "abc"
    )


def test_other_semantic_errors() -> None:
    assert (
        "IPv4 address or CIDR"
        in error_of(
            simple(topic("t", MEMORY), store_attrs='name="s" port="1" interface="eth0"')
        ).message
    )
    assert (
        "port" in error_of(simple(topic("t", MEMORY), store_attrs='name="s" port="70000"')).message
    )
    assert (
        "Address:Port"
        in error_of(simple(topic("t", MEMORY), daemon="<web-monitor>15304</web-monitor>")).message
    )
    assert (
        "IPv4 address or *"
        in error_of(simple(topic("t", MEMORY), daemon="<web-monitor>host:1</web-monitor>")).message
    )
    assert "regular expression" in error_of(simple(topic("(unclosed", MEMORY, kind="PCRE"))).message
    assert "root element must be <ume-store>" in error_of("<stores/>").message
    assert "not a known DTD version" in error_of(simple(topic("t", MEMORY), version="2.0")).message
    two = store_doc(
        attrs(("context-name", "same")) + "<topics>" + topic("t", MEMORY) + "</topics>"
    ).replace(
        "</stores>",
        '<store name="s2" port="14568">'
        + attrs(("context-name", "same"))
        + "<topics>"
        + topic("t", MEMORY)
        + "</topics></store></stores>",
    )
    assert "context-name 'same' is already used" in error_of(two).message
    same_name = two.replace('name="s2"', 'name="s"')
    assert "store name 's' is already used" in error_of(same_name).message


def test_no_cache_default_of_the_guide_profile_needs_an_explicit_type() -> None:
    text = simple(topic("t", ("keepalive-interval", "700")))
    error = error_of(text, profile="guide-5.3")
    assert "defaults it to no-cache" in error.message
    assert error.line == line_of(text, "<topic ")
    current = parse_store_config(text).topic_options("s", "t")
    assert current is not None and current.repository_type == "memory"
    explicit = parse_store_config(simple(topic("t", MEMORY)), profile="guide-5.3")
    assert explicit.topic_options("s", "t") is not None


def test_profile_dependent_validity() -> None:
    zero_port = simple(topic("t", MEMORY), store_attrs='name="s" port="0"')
    assert parse_store_config(zero_port).stores[0].port == 0
    assert "needs UM 6.8+" in error_of(zero_port, profile="guide-5.3").message
    write_cbs = simple(topic("t", MEMORY, ("repository-disk-max-write-async-cbs", "16")))
    guide = parse_store_config(write_cbs, profile="guide-5.3")
    options = guide.topic_options("s", "t")
    assert options is not None and options.repository_disk_max_write_async_cbs == 16
    assert guide.warnings == ()
    current = parse_store_config(write_cbs)
    options = current.topic_options("s", "t")
    assert options is not None and options.repository_disk_max_write_async_cbs == 1
    assert "deprecated" in current.warnings[0].message


# --- warnings ----------------------------------------------------------------------------------


def test_warnings_for_mapped_deprecated_and_suspicious_settings() -> None:
    text = simple(
        topic(
            "t",
            ("repository-type", "reduced-fd"),
            ("repository-size-threshold", "2000000"),
            ("repository-size-limit", "1000000"),
            ("keepalive-interval", "20000"),
            ("keepalive-interval", "20000"),
        ),
        topic("m", MEMORY, ("repository-disk-write-delay", "10")),
    )
    config = parse_store_config(text)
    options = config.topic_options("s", "t")
    assert options is not None and options.repository_type == "disk"
    messages = " | ".join(w.message for w in config.warnings)
    assert "reduced-fd" in messages
    assert "exceeds repository-size-limit" in messages
    assert "at least twice keepalive-interval" in messages
    assert "set again" in messages
    assert "no effect on a memory repository" in messages
    assert all(w.file == "<string>" and w.line for w in config.warnings)


def test_umq_remnants_are_ignored_with_warnings() -> None:
    text = simple(
        '<topic pattern="t"><application-sets><x/></application-sets>'
        + attrs(MEMORY, ("queue", "q", "1"))
        + "</topic>",
        version="1.2",
    ).replace("</stores>", "</stores><queues><queue name='q'/></queues>")
    config = parse_store_config(text)
    messages = [w.message for w in config.warnings]
    assert any("<application-sets> ignored" in m for m in messages)
    assert any("<queues> ignored" in m for m in messages)
    assert any("queue option 'q' ignored" in m for m in messages)
    assert (
        "not part of DTD version 1.3"
        in error_of(text.replace('version="1.2"', 'version="1.3"')).message
    )


# --- profiles -----------------------------------------------------------------------------------


def test_profile_names_and_lookup() -> None:
    assert set(profile_names()) == {"current", "guide-5.3", "pre-5.3"}
    assert get_profile().name == DEFAULT_PROFILE
    with pytest.raises(ValueError, match=r"guide-5\.3"):
        get_profile("5.4")


def test_the_documented_default_changes() -> None:
    diff = profile_differences("guide-5.3", "current")
    expected = {
        ("topic", "keepalive-interval"): (500, 3000),
        ("topic", "source-check-interval"): (100, 750),
        ("topic", "receiver-new-registration-rollback"): (0, 2147483647),
        ("topic", "repository-size-threshold"): (25165824, 1024),
        ("topic", "proxy-election-interval"): (5000, 60000),
        ("topic", "repository-type"): ("no-cache", "memory"),
        ("source", "ume_registration_interval"): (500, 3000),
        ("receiver", "ume_registration_interval"): (500, 3000),
        ("source", "ume_sri_inter_sri_interval"): (100, 500),
        ("source", "ume_sri_max_number_of_sri_per_update"): (10, 20),
        ("source", "ume_store_activity_timeout"): (3000, 10000),
        ("source", "ume_consensus_sequence_number_behavior"): ("majority", "highest"),
        ("source", "ume_store_behavior"): ("rr", "qc"),
        ("receiver", "use_otr"): (0, 2),
        ("receiver", "retransmit_message_caching_proximity"): (0xFFFFFFFF, 5000),
    }
    for key, values in expected.items():
        assert diff[key] == values, key
    # the receiver's consensus default did not change
    assert ("receiver", "ume_consensus_sequence_number_behavior") not in diff
    assert profile_differences("current", "current") == {}


@pytest.mark.parametrize("profile", profile_names())
def test_every_topic_default_is_valid_under_its_own_profile(profile: str) -> None:
    """Writing each default explicitly must parse back to the same value (defaults and
    validators agree)."""
    defaults = dict(get_profile(profile).topic)
    defaults["repository-type"] = "memory"  # no-cache is the documented, unsupported default
    written = [
        (name, str(int(value)) if isinstance(value, bool | int) else str(value))
        for name, value in defaults.items()
    ]
    options = parse_store_config(simple(topic("t", *written)), profile=profile).topic_options(
        "s", "t"
    )
    assert options is not None
    assert {name: options.value(name) for name in topic_option_names()} == defaults


def test_option_catalogue_matches_the_profiles() -> None:
    for profile in profile_names():
        assert set(get_profile(profile).topic) == set(topic_option_names())
        assert set(get_profile(profile).store) == set(store_option_names())


# --- DTDs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", DTD_VERSIONS)
def test_dump_dtd_declares_every_element_it_references(version: str) -> None:
    text = dump_dtd(version)
    declared = set(re.findall(r"<!ELEMENT (\S+) ", text))
    referenced = set()
    for model in re.findall(r"<!ELEMENT \S+ (\(.*\)[*+?]?)>", text):
        referenced |= set(re.findall(r"[a-z][a-z-]*", model)) - {"pcdata"}
    assert referenced <= declared
    assert ("xml-config" in declared) == (version == "1.3")
    assert ("queues" in declared) == (version in ("1.1", "1.2"))
    assert "<!ATTLIST ume-store version CDATA #REQUIRED>" in text
    with pytest.raises(ValueError, match=r"1\.3"):
        dump_dtd("9.9")


def _model_regex(content: str) -> str:
    """A content model as a Python regex over ``<name>`` tokens (an independent matcher)."""
    tokens = re.sub(r"([a-z][a-z-]*)", r"(?:<\1>)", content)
    return tokens.replace(",", "").replace(" ", "")


CHILDREN = ["restore-last", "publishing-interval", "ume-attributes", "topics", "daemon", "stores"]


@given(
    version=st.sampled_from(DTD_VERSIONS),
    element=st.sampled_from(["store", "ume-store", "topic", "daemon"]),
    children=st.lists(st.sampled_from(CHILDREN), max_size=6),
)
def test_derivative_matcher_agrees_with_a_regex_matcher(
    version: str, element: str, children: list[str]
) -> None:
    content = _DTDS[version][element].content
    state = _parse_model(content)
    for child in children:
        state = _derive(state, child)
        if isinstance(state, _Nothing):
            break
    ours = not isinstance(state, _Nothing) and _nullable(state)
    theirs = re.fullmatch(_model_regex(content), "".join(f"<{c}>" for c in children))
    assert ours == (theirs is not None)


XMLLINT = shutil.which("xmllint")

STRUCTURE_CASES = [
    GUIDE_EXAMPLE,
    RPP_EXAMPLE,
    MINIMAL_1_0,
    simple(topic("t", MEMORY)),
    store_doc("<topics>" + topic("t", MEMORY) + "</topics>" + attrs(MEMORY), version="1.3"),
    store_doc("<topics>" + topic("t", MEMORY) + "</topics>" + attrs(MEMORY), version="1.2"),
    store_doc(attrs(MEMORY), version="1.3"),
    store_doc(
        '<restore-last behavior="hours"/>' + attrs(MEMORY) + "<topics>" + topic("t") + "</topics>"
    ),
    store_doc(
        attrs(MEMORY) + '<restore-last behavior="hours"/>' + "<topics>" + topic("t") + "</topics>"
    ),
    simple(topic("t", MEMORY), daemon="<xml-config>x</xml-config>", version="1.2"),
    simple(topic("t", MEMORY), daemon='<log frequency="daily">x</log>', version="1.1"),
    simple(topic("t", MEMORY), store_attrs='name="s"'),
    simple('<topic pattern="t" type="glob"/>'),
    simple('<topic pattern="t"><ume-attributes/></topic>'),
]


@pytest.mark.skipif(XMLLINT is None, reason="xmllint (libxml2-utils) is not installed")
@pytest.mark.parametrize("case", range(len(STRUCTURE_CASES)))
def test_structure_verdicts_agree_with_xmllint(case: int, tmp_path: Path) -> None:
    """libxml2 validating against dump_dtd() must accept exactly what we accept."""
    text = STRUCTURE_CASES[case]
    version = re.search(r'ume-store version="([\d.]+)"', text)
    assert version is not None
    dtd = tmp_path / "umestored.dtd"
    dtd.write_text(dump_dtd(version.group(1)))
    document = tmp_path / "store.xml"
    document.write_text(text)
    assert XMLLINT is not None
    result = subprocess.run(
        [XMLLINT, "--noout", "--dtdvalid", str(dtd), str(document)],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        validate_structure(text)
        ours = True
    except ConfigError:
        ours = False
    assert ours == (result.returncode == 0), result.stderr


# --- hostile input (issue 22 item 3): one ConfigError with file and line, never a traceback -----

HUGE = "9" * 5000  # past CPython's 4,300-digit int() limit


@pytest.mark.parametrize("encoding", ["x-nonesuch", "rot13", "shift_jis", "utf-7", "undefined",
                                      "idna"])
def test_a_declared_encoding_python_cannot_read_is_a_config_error(encoding: str) -> None:
    text = f'<?xml version="1.0" encoding="{encoding}"?>\n' + simple(topic("t"))
    error = error_of(text)
    assert error.line == 1
    assert repr(encoding) in error.message and "encoding" in error.message


@pytest.mark.parametrize("where", ["port", "option", "store-option", "restore-last", "log-size",
                                   "web-monitor", "group-ivl"])
def test_integers_past_the_digit_limit_are_config_errors(where: str) -> None:
    docs = {
        "port": simple(topic("t"), store_attrs=f'name="s" port="{HUGE}"'),
        "option": simple(topic("t", ("keepalive-interval", HUGE))),
        "store-option": simple(topic("t"), store_options=attrs(
            ("retransmission-request-processing-rate", HUGE))),
        "restore-last": store_doc(f'<restore-last behavior="hours" value="{HUGE}"/>'
                                  + attrs(MEMORY) + "<topics>" + topic("t") + "</topics>"),
        "log-size": simple(topic("t"), daemon=f'<log type="file" size="{HUGE}">x.log</log>'),
        "web-monitor": simple(topic("t"), daemon=f"<web-monitor>*:{HUGE}</web-monitor>"),
        "group-ivl": store_doc('<publishing-interval><group name="store" ivl="' + HUGE
                               + '"/></publishing-interval>' + attrs(MEMORY) + "<topics>"
                               + topic("t") + "</topics>"),
    }
    text = docs[where]
    error = error_of(text)
    assert error.line == line_of(text, HUGE)
    assert "(5000 characters)" in error.message and HUGE not in error.message


def test_leading_zeros_do_not_count_against_the_digit_limit() -> None:
    padded = "0" * 5000 + "14567"
    config = parse_store_config(simple(topic("t"), store_attrs=f'name="s" port="{padded}"'))
    assert config.stores[0].port == 14567


@pytest.mark.parametrize("digits", ["\u0661\u0664\u0665\u0666\u0667", "\u00b2", "1\u00a0"])
def test_only_ascii_digits_are_numbers(digits: str) -> None:
    error = error_of(simple(topic("t"), store_attrs=f'name="s" port="{digits}"'))
    assert "<store port>" in error.message


@settings(max_examples=200, deadline=None)
@given(name=st.text(min_size=1, max_size=40), pattern=st.text(min_size=1, max_size=40))
def test_the_writer_round_trips_any_name_xml_can_carry_and_refuses_the_rest(
        name: str, pattern: str) -> None:
    """Store names and topic patterns are written as attributes: whatever XML 1.0 can carry
    reads back unchanged (line breaks and tabs included); anything else (C0 controls, lone
    surrogates, U+FFFE/U+FFFF) is refused when writing, not left for a reader to choke on."""
    def carried(text: str) -> bool:
        return all(c in "\t\n\r" or "\x20" <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd"
                   or c >= "\U00010000" for c in text)

    store = StoreXml(name, 14567, options={"context-name": "ctx"},
                     topics=[TopicXml(pattern, {"repository-type": "memory"}, type="direct")])
    if not (carried(name) and carried(pattern)):
        with pytest.raises(ValueError, match=r"XML 1\.0"):
            store_daemon_xml([store])
        return
    (parsed,) = parse_store_config(store_daemon_xml([store])).stores
    assert (parsed.name, parsed.topics[0].pattern) == (name, pattern)
