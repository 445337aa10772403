"""Named default profiles for every store option and every client (``lbm.cfg``) option.

Why profiles: the product changed many persistence defaults in UM 6.8 and 6.10, and the harness
has to speak to both worlds.  A store that follows the 5.3-era *Guide for Persistence* (the seed
text, ``docs/semantics.md`` §0) keeps sending keepalives every 500 ms and starts new receivers at
the next live message; a current (6.8+ / 6.17) store keepalives every 3 s and lets a new receiver
recover everything it holds.  Interoperating with a current product needs the current values; a
"guide 5.3" conformance run needs the old ones.  So every default lives here exactly once, keyed
by the option's product name, and the two parsers (:mod:`.store_xml`, :mod:`.client`) take a
``profile=`` argument instead of hard-coding numbers.

* ``current`` (:data:`DEFAULT_PROFILE`): UM 6.17 defaults (``docs/semantics.md`` §1.16, §3.3, §3.4).
* ``guide-5.3``: the seed guide's values where they differ (docs/semantics.md §8 lists every
  contradiction).  Options the guide does not document keep the pre-6.8 value from the release
  notes (for example ``ume_registration_interval`` 500 ms).

Besides values, a profile carries the few *validity rules* that changed between the two eras
(``<store port="0">`` only since 6.8, non-blocking RPP receivers only since 6.9, round-robin store
behaviour removed in 6.8, ``repository-disk-max-write-async-cbs`` pinned to 1).

This module is also the shared base of the package: :class:`ConfigError` and
:class:`ConfigWarning` live here because both parsers need them and both already import this
module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "DEFAULT_PROFILE",
    "ConfigError",
    "ConfigWarning",
    "Profile",
    "get_profile",
    "profile_differences",
    "profile_names",
]


class ConfigError(ValueError):
    """A configuration file (or mapping) that cannot be used, with the place it went wrong.

    Attributes:
        file: the file name as the caller gave it (``"<mapping>"`` for :func:`from_mapping`
            style constructors, ``"<string>"`` for text without a name), or ``None``.
        line: 1-based line number, or ``None`` when the problem is not tied to one line.
        column: 1-based column, or ``None`` (a flat client file gives one only for a stray
            character).
        message: what is wrong and, where possible, what would be right.
    """

    def __init__(
        self,
        file: str | None,
        line: int | None,
        message: str,
        column: int | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.column = column
        self.message = message
        super().__init__(_locate(file, line, column, message))


@dataclass(frozen=True)
class ConfigWarning:
    """Something accepted but worth an operator's attention (deprecated, ignored, mapped).

    Parsers never print or ``warnings.warn`` these: they collect them on the parse result so
    the caller (a store core, the CLI) decides how to log them, and tests can assert on them.
    """

    file: str | None
    line: int | None
    message: str
    column: int | None = None

    def __str__(self) -> str:
        return _locate(self.file, self.line, self.column, self.message)


def _locate(file: str | None, line: int | None, column: int | None, message: str) -> str:
    where = file or "<config>"
    if line is not None:
        where += f":{line}"
        if column is not None:
            where += f":{column}"
    return f"{where}: {message}"


@dataclass(frozen=True)
class Profile:
    """One coherent set of defaults and era-dependent validity rules.

    Attributes:
        name: the profile's name (``"current"``, ``"guide-5.3"``).
        summary: one line saying which product version it models.
        store: defaults of the store-wide options of a ``<store>`` (``disk-cache-directory`` ...).
        topic: defaults of the topic-level store options (``repository-type`` ...).  The
            guide-5.3 ``repository-type`` default is ``"no-cache"``, which the reference store
            does not implement; :mod:`.store_xml` turns that into a clear error for topics that
            leave the type unset.
        context / source / receiver: defaults of the client options, by scope, typed as the
            client dataclasses hold them (ints in the option's unit, bools for flags, canonical
            lower-case strings for enumerations).
        store_port_zero_allowed: ``<store port="0">`` (pick a port from the request range)
            exists since 6.8.
        receiver_rpp_modes: valid receiver ``ume_receiver_paced_persistence`` values; 2
            (non-blocking RPP receiver) exists since 6.9.
        round_robin_supported: ``ume_store_behavior rr`` is a real mode; since 6.8 the library
            coerces it to ``qc`` (log Core-9354-1/2).
        write_async_cbs_must_be_one: 6.17 deprecates ``repository-disk-max-write-async-cbs``
            and requires the value 1 (other values are replaced by 1, with a warning).
        proactive_keepalive_supported: ``ume_proactive_keepalive_interval`` exists (6.9+).
        rpp_supported: the product knows receiver-paced persistence (UMP 5.3+).  Without it
            (profile ``pre-5.3``) stores, sources and receivers never set, read or echo the
            RPP flag or the RPP options of a registration: the rows and columns "Pre-ver.
            5.3" of the guide's "UMP Version RPP Compatibility Matrix".
        rpp_late_join_unconsumed: a receiver whose first registration with an RPP repository
            comes after the first message may recover what the repository still holds (the
            guide's "Late Registering Receiver": "except for messages not yet consumed by all
            RPP receivers"); otherwise (the current docs) nothing sent before it registered.
    """

    name: str
    summary: str
    store: Mapping[str, object]
    topic: Mapping[str, object]
    context: Mapping[str, object]
    source: Mapping[str, object]
    receiver: Mapping[str, object]
    store_port_zero_allowed: bool
    receiver_rpp_modes: tuple[int, ...]
    round_robin_supported: bool
    write_async_cbs_must_be_one: bool
    proactive_keepalive_supported: bool
    rpp_supported: bool = True
    rpp_late_join_unconsumed: bool = False

    def section(self, name: str) -> Mapping[str, object]:
        """The defaults of one section by name (``"store"``, ``"topic"``, ``"source"`` ...)."""
        sections = {
            "store": self.store,
            "topic": self.topic,
            "context": self.context,
            "source": self.source,
            "receiver": self.receiver,
        }
        try:
            return sections[name]
        except KeyError:
            raise ValueError(
                f"unknown profile section {name!r}; sections are {', '.join(sections)}"
            ) from None


# --- store XML defaults (docs/semantics.md §3.3 / §3.4) -------------------------------------------

_STORE_LEVEL: dict[str, object] = {
    "disk-cache-directory": "umestored-cache",
    "disk-state-directory": "umestored-state",
    "allow-proxy-source": False,
    "proxy-source-repo-quorum-required": False,  # 6.15+; absent (= off) in the guide era
    "context-name": None,
    "retransmission-request-processing-rate": 262144,  # requests per second, all topics
}

_TOPIC_CURRENT: dict[str, object] = {
    "repository-type": "memory",
    "repository-size-threshold": 1024,  # bytes (6.10+)
    "repository-size-limit": 50331648,  # bytes (48 MB)
    "repository-age-threshold": 0,  # seconds, 0 = age ignored
    "repository-disk-file-size-limit": 104857600,  # bytes (100 MB)
    "repository-disk-file-preallocate": False,
    "repository-disk-async-buffer-length": 1024000,  # bytes
    "repository-disk-max-async-cbs": 10000,
    "repository-disk-max-read-async-cbs": 10000,
    "repository-disk-max-write-async-cbs": 1,
    "repository-disk-message-checksum": False,
    "repository-disk-write-delay": 0,  # ms (RPP, disk)
    "repository-allow-receiver-paced-persistence": False,
    "repository-allow-ack-on-reception": False,
    "source-flight-size-bytes-maximum": 4194304,  # bytes (RPP)
    "retransmission-request-forwarding": False,
    "source-activity-timeout": 30000,  # ms
    "source-state-lifetime": 0,  # ms, 0 = disabled
    "receiver-activity-timeout": 30000,  # ms
    "receiver-state-lifetime": 0,  # ms
    "source-check-interval": 750,  # ms
    "keepalive-interval": 3000,  # ms
    "receiver-new-registration-rollback": 2147483647,  # messages
    "proxy-election-interval": 60000,  # ms
    "stability-ack-interval": 200,  # ms
    "stability-ack-minimum-number": 1,  # fragments
}

_TOPIC_GUIDE_5_3: dict[str, object] = _TOPIC_CURRENT | {
    "repository-type": "no-cache",  # the value in the guide table's (garbled) default column
    "repository-size-threshold": 25165824,  # 24 MB
    "repository-disk-async-buffer-length": 65664,
    "repository-disk-max-async-cbs": 16,
    "repository-disk-max-read-async-cbs": 16,
    "repository-disk-max-write-async-cbs": 16,
    "source-check-interval": 100,
    "keepalive-interval": 500,
    "receiver-new-registration-rollback": 0,
    "proxy-election-interval": 5000,
}

# --- client defaults (docs/semantics.md §1.1-1.16, docs/wire-transports.md §B) --------------------

_CONTEXT_CURRENT: dict[str, object] = {
    "ume_ack_batching_interval": 100,  # ms
    "ume_proactive_keepalive_interval": 3000,  # ms; 0 or >= 1500
    "ume_receiver_liveness_interval": 0,  # ms
    "ume_source_liveness_timeout": 0,  # ms
    "ume_session_id": 0,
    "ume_user_receiver_registration_id": 0,
    "request_tcp_bind_request_port": True,
    "request_tcp_port_low": 14391,
    "request_tcp_port_high": 14395,
    "transport_tcp_port_low": 14371,
    "transport_tcp_port_high": 14390,
    "transport_lbtru_port_low": 14380,
    "transport_lbtru_port_high": 14389,
    # LBT-RM: the product's defaults (reference_impl/lbtrm_session.py's table says which
    # come from the guide and which from the UM Configuration Guide)
    "transport_lbtrm_multicast_address_low": "224.10.10.10",
    "transport_lbtrm_multicast_address_high": "224.10.10.14",
    "transport_lbtrm_source_port_low": 14390,
    "transport_lbtrm_source_port_high": 14399,
    "transport_lbtrm_data_rate_limit": 10_000_000,  # bits per second
    "transport_lbtrm_retransmit_rate_limit": 5_000_000,  # bits per second
    "transport_lbtrm_rate_interval": 100,  # ms
    "resolver_unicast_daemon": (),
}

_CONTEXT_GUIDE_5_3: dict[str, object] = _CONTEXT_CURRENT | {
    # the option does not exist before 6.9; 0 is its "pre-6.9 behaviour" value
    "ume_proactive_keepalive_interval": 0,
}

_SOURCE_CURRENT: dict[str, object] = {
    "stores": (),  # ume_store / ume_store_name entries, in configuration (= store index) order
    "ume_store_group": (),
    "ume_store_behavior": "qc",
    "ume_registration_interval": 3000,  # ms
    "ume_session_id": 0,
    "ume_activity_timeout": 0,  # ms, 0 = the store's value
    "ume_state_lifetime": 0,  # ms, 0 = disabled
    "ume_proxy_source": False,
    "ume_sri_inter_sri_interval": 500,  # ms
    "ume_sri_max_number_of_sri_per_update": 20,
    "ume_sri_immediate_sri_request_response": True,
    "ume_sri_request_response_latency": 100,  # ms
    "ume_sri_flush_sri_request_response": False,
    "ume_confirmed_delivery_notification": 0,
    "ume_consensus_sequence_number_behavior": "highest",
    "ume_flight_size": 1000,  # messages
    "ume_flight_size_behavior": "block",
    "ume_flight_size_bytes": 0,  # payload bytes, 0 = no byte limit
    "late_join": False,  # forced on by the library once a store is configured
    "ume_message_stability_lifetime": 1200000,  # ms
    "ume_message_stability_notification": 1,
    "ume_message_stability_timeout": 5000,  # ms, 0 = no proactive retransmission
    "ume_receiver_paced_persistence": 0,
    "ume_repository_ack_on_reception": False,
    "ume_repository_disk_file_size_limit": 0,  # bytes, 0 = the store's value
    "ume_repository_size_limit": 0,
    "ume_repository_size_threshold": 0,
    "ume_retention_intergroup_stability_behavior": "any",
    "ume_retention_intragroup_stability_behavior": "quorum",
    "ume_retention_unique_confirmations": 0,
    "ume_store_activity_timeout": 10000,  # ms
    "ume_store_check_interval": 500,  # ms
    "ume_write_delay": 0,  # ms
    "retransmit_retention_size_limit": 25165824,  # bytes
    "retransmit_retention_size_threshold": 0,  # bytes
    "retransmit_retention_age_threshold": 0,  # seconds
    "transport": "tcp",
    "transport_tcp_port": 0,  # 0 = pick from transport_tcp_port_low..high
    "transport_lbtru_port": 0,  # 0 = pick from transport_lbtru_port_low..high
    # the largest datagram; longer messages are fragmented (reference_impl/fragments.py)
    "transport_tcp_datagram_max_size": 65535,  # bytes (the most an LBMC msglen says)
    "transport_lbtru_datagram_max_size": 8192,  # bytes
    "transport_lbtru_transmission_window_size": 25_165_824,  # bytes kept to answer NAKs
    "transport_lbtrm_multicast_address": "",  # "" = pick from the context's range
    "transport_lbtrm_source_port": 0,  # 0 = pick from transport_lbtrm_source_port_low..high
    "transport_lbtrm_destination_port": 14400,
    "transport_lbtrm_datagram_max_size": 8192,  # bytes
    "transport_lbtrm_transmission_window_size": 25_165_824,  # bytes kept to answer NAKs
    "transport_lbtrm_sm_minimum_interval": 200,  # ms
    "transport_lbtrm_sm_maximum_interval": 10_000,  # ms
    "transport_lbtrm_ignore_interval": 500,  # ms
}

_SOURCE_GUIDE_5_3: dict[str, object] = _SOURCE_CURRENT | {
    "ume_store_behavior": "rr",
    "ume_registration_interval": 500,
    "ume_sri_inter_sri_interval": 100,
    "ume_sri_max_number_of_sri_per_update": 10,
    "ume_consensus_sequence_number_behavior": "majority",
    "ume_store_activity_timeout": 3000,
}

_RECEIVER_CURRENT: dict[str, object] = {
    "ume_activity_timeout": 0,  # ms
    "ume_state_lifetime": 0,  # ms
    "ume_session_id": 0,
    "ume_registration_interval": 3000,  # ms
    "ume_allow_confirmed_delivery": True,
    "ume_application_outstanding_maximum": 0,  # fragments, 0 = off
    "ume_consensus_sequence_number_behavior": "majority",
    # the source's QC rules, read by a receiver for its own registration completion
    "ume_retention_intragroup_stability_behavior": "quorum",
    "ume_retention_intergroup_stability_behavior": "any",
    "ume_explicit_ack_only": False,
    "ume_receiver_paced_persistence": 0,
    "ume_sri_request_interval": 1000,  # ms
    "ume_sri_request_maximum": 60,
    "ume_use_ack_batching": True,
    "use_late_join": True,
    "ume_use_store": True,
    "retransmit_request_interval": 500,  # ms
    "retransmit_request_maximum": 0,  # messages, 0 = unlimited
    "retransmit_request_outstanding_maximum": 10,
    "retransmit_request_message_timeout": 10000,  # ms
    "retransmit_initial_sequence_number_request": True,
    "retransmit_message_caching_proximity": 5000,  # messages
    "use_otr": 2,  # 2 = OTR for persistent receivers only
    "otr_request_initial_delay": 2000,  # ms
    "otr_request_minimum_interval": 1000,  # ms
    "otr_request_maximum_interval": 10000,  # ms
    "otr_message_caching_threshold": 10000,  # messages
    "delivery_control_maximum_burst_loss": 1024,  # messages
    "transport_lbtru_port_low": 14360,
    "transport_lbtru_port_high": 14379,
    "transport_lbtrm_nak_initial_backoff_interval": 50,  # ms
    "transport_lbtrm_nak_backoff_interval": 200,  # ms
    "transport_lbtrm_nak_suppress_interval": 1000,  # ms
    "transport_lbtrm_nak_generation_interval": 10_000,  # ms
    "transport_lbtrm_activity_timeout": 60_000,  # ms
    "transport_lbtrm_send_naks": True,
}

_RECEIVER_GUIDE_5_3: dict[str, object] = _RECEIVER_CURRENT | {
    "ume_registration_interval": 500,
    "retransmit_message_caching_proximity": 0xFFFFFFFF,
    "use_otr": 0,
}


def _frozen(mapping: dict[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping))


_PROFILES: dict[str, Profile] = {
    "current": Profile(
        name="current",
        summary="UM 6.8+ defaults as documented for UM 6.17",
        store=_frozen(_STORE_LEVEL),
        topic=_frozen(_TOPIC_CURRENT),
        context=_frozen(_CONTEXT_CURRENT),
        source=_frozen(_SOURCE_CURRENT),
        receiver=_frozen(_RECEIVER_CURRENT),
        store_port_zero_allowed=True,
        receiver_rpp_modes=(0, 1, 2),
        round_robin_supported=False,
        write_async_cbs_must_be_one=True,
        proactive_keepalive_supported=True,
    ),
    "guide-5.3": Profile(
        name="guide-5.3",
        summary="defaults of the UMP 5.3-era Guide for Persistence (pre-6.8 where it is silent)",
        store=_frozen(_STORE_LEVEL),
        topic=_frozen(_TOPIC_GUIDE_5_3),
        context=_frozen(_CONTEXT_GUIDE_5_3),
        source=_frozen(_SOURCE_GUIDE_5_3),
        receiver=_frozen(_RECEIVER_GUIDE_5_3),
        store_port_zero_allowed=False,
        receiver_rpp_modes=(0, 1),
        round_robin_supported=True,
        write_async_cbs_must_be_one=False,
        proactive_keepalive_supported=False,
        rpp_late_join_unconsumed=True,
    ),
    "pre-5.3": Profile(
        name="pre-5.3",
        summary="a UMP release before 5.3: the guide-5.3 defaults without receiver-paced "
                "persistence",
        store=_frozen(_STORE_LEVEL),
        topic=_frozen(_TOPIC_GUIDE_5_3),
        context=_frozen(_CONTEXT_GUIDE_5_3),
        source=_frozen(_SOURCE_GUIDE_5_3),
        receiver=_frozen(_RECEIVER_GUIDE_5_3),
        store_port_zero_allowed=False,
        receiver_rpp_modes=(0,),
        round_robin_supported=True,
        write_async_cbs_must_be_one=False,
        proactive_keepalive_supported=False,
        rpp_supported=False,
    ),
}

DEFAULT_PROFILE = "current"
"""The profile used when a caller does not choose one: interoperate with a current product."""


def profile_names() -> tuple[str, ...]:
    """Names accepted by :func:`get_profile` (and every ``profile=`` parameter)."""
    return tuple(_PROFILES)


def get_profile(profile: str | Profile = DEFAULT_PROFILE) -> Profile:
    """The :class:`Profile` called ``profile`` (a :class:`Profile` is passed through)."""
    if isinstance(profile, Profile):
        return profile
    try:
        return _PROFILES[profile]
    except KeyError:
        raise ValueError(
            f"unknown configuration profile {profile!r}; choose one of {', '.join(_PROFILES)}"
        ) from None


def profile_differences(
    a: str | Profile, b: str | Profile
) -> dict[tuple[str, str], tuple[object, object]]:
    """Every default that differs between two profiles: ``(section, option) -> (in a, in b)``.

    Used by tests and documentation to show exactly what choosing a profile changes.
    """
    first, second = get_profile(a), get_profile(b)
    out: dict[tuple[str, str], tuple[object, object]] = {}
    for section in ("store", "topic", "context", "source", "receiver"):
        left, right = first.section(section), second.section(section)
        for option in sorted(set(left) | set(right)):
            if left.get(option) != right.get(option):
                out[(section, option)] = (left.get(option), right.get(option))
    return out
