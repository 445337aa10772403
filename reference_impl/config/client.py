"""Parse UM flat configuration files (the ``lbm.cfg`` format) into typed client options.

The reference source and receiver read the same configuration text as the product's library,
so one file drives both in an interoperability run.  The format is one option per line::

    # comment
    context  request_tcp_port_low  14391
    source   ume_store             10.29.3.16:14567:0:0
    receiver ume_use_store         1

Scopes are ``context``, ``source``, ``receiver``, ``wildcard_receiver`` and ``event_queue``.
A later line overrides an earlier one, except for the *appending* options: each ``ume_store``,
``ume_store_name`` and ``ume_store_group`` line adds an entry (``ume_store 0.0.0.0:0`` clears
the store list, ``ume_store_group 0:0`` the group list), and ``resolver_unicast_daemon`` adds a
daemon.  The result is three frozen dataclasses - :class:`ContextOptions`,
:class:`SourceOptions`, :class:`ReceiverOptions` - holding every persistence option of
``docs/semantics.md`` §1.1-1.16 plus the transport and port options the reference implementation
uses; ``from_mapping`` constructors build the same objects from a dict (Python API users,
tests), running exactly the same validation.

Which options are checked, and how:

* Every ``ume_*`` and ``retransmit_*`` option is known: a misspelt one is an error that names
  the nearest known option, and one used in the wrong scope is an error naming its scope.  Those
  families are what persistence behaviour hangs on, so a typo must not silently fall back to a
  default.
* The ``transport_lbtrm_*`` options the reference LBT-RM transport runs with
  (:mod:`reference_impl.lbtrm_session` has their product defaults and what each does) are
  parsed and checked in their scopes: context (rate limits, the group and unicast port
  ranges), source (group, ports, window, session messages, ignore interval, largest
  datagram), receiver (NAK timing, activity timeout, ``send_naks``).
* Other UM options (``resolver_*``, ``ordered_delivery`` ...) are not
  modelled; they are kept verbatim in each scope's ``other`` mapping (nothing is lost) without a
  warning, because UM has hundreds of them and the reference implementation ignores them.
* Deprecated names: aliases with a current equivalent (``ume_retention_size_limit``,
  ``ume_late_join``, ``ume_retransmit_request_interval`` ...) are mapped, with a warning;
  ``ume_message_map_tablesz`` (harmless) is ignored with a warning; the removed store-address
  options (``ume_primary_store_address`` ...) and ``ume_registration_id`` are errors, because
  ignoring them would silently drop a store or an identity.
* Scope and option names are case-insensitive (folded to lower case); enumeration values too.
  A ``#`` starts a comment anywhere on a line and only a line feed ends it (see
  :func:`parse_client_config`: no other character ends a line or separates fields, as
  ``str.splitlines()`` and ``str.split()`` would).  Integers are decimal, except Session IDs (hex
  ``0x..``, octal with a leading 0, or decimal, as the product reads them since 5.2.2).

Field names are the option names; units are the product's (milliseconds for intervals and
timeouts, bytes for sizes, seconds for ``retransmit_retention_age_threshold``).  Ranges that the
wire format fixes (group index, group size, RegID, Domain ID, store port) are derived from the
Construct definitions in :mod:`wire.lbmc`, not restated here.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from reference_impl.config.profiles import (
    DEFAULT_PROFILE,
    ConfigError,
    ConfigWarning,
    Profile,
    get_profile,
)
from reference_impl.config.values import (
    character_name,
    config_lines,
    decimal_in_range,
    read_config_bytes,
    shown,
    stray_character,
)
from reference_impl.fragments import DATAGRAM_BOUNDS
from wire.fields import members
from wire.lbmc import UmeStoreExt, UmeStoreGroup

__all__ = [
    "SCOPES",
    "ClientConfig",
    "ContextOptions",
    "NamedStore",
    "ReceiverOptions",
    "SourceOptions",
    "StoreAddress",
    "StoreGroup",
    "UnicastResolverDaemon",
    "load_client_config",
    "parse_client_config",
    "parse_session_id",
]

SCOPES: tuple[str, ...] = ("context", "source", "receiver", "wildcard_receiver", "event_queue")
"""Scopes of a flat UM configuration line."""


def _field_max(header: Any, name: str) -> int:
    """Largest value the named wire field of an LBMC header can carry."""
    for member in members(header.kind.struct):
        if member.name == name:
            return int((1 << (8 * member.sizeof())) - 1)
    raise LookupError(f"{header.kind.name} has no field {name!r}")


_MAX_GROUP_INDEX = _field_max(UmeStoreGroup, "grp_idx")
_MAX_GROUP_SIZE = _field_max(UmeStoreGroup, "grp_sz")
_MAX_REG_ID = _field_max(UmeStoreExt, "src_reg_id")
_MAX_DOMAIN_ID = _field_max(UmeStoreExt, "domain_id")
_MAX_PORT = _field_max(UmeStoreExt, "store_tcp_port")
_U32 = 0xFFFFFFFF
_SIZE_MAX = (1 << 63) - 1
_MAX_SESSION_ID = 0xFFFFFFFFFFFFFFFE
_STORE_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


# =================================================================================================
# Value types
# =================================================================================================


@dataclass(frozen=True)
class StoreAddress:
    """One ``ume_store`` entry, ``[DomainID:]IP:port[:RegID[:GroupIDX]]``.

    ``reg_id`` 0 asks the store to assign one; ``domain_id`` 0 is the local topic resolution
    domain.
    """

    domain_id: int
    ip: str
    port: int
    reg_id: int = 0
    group_idx: int = 0

    def __str__(self) -> str:
        return f"{self.domain_id}:{self.ip}:{self.port}:{self.reg_id}:{self.group_idx}"


@dataclass(frozen=True)
class NamedStore:
    """One ``ume_store_name`` entry, ``name[:RegID[:GroupIDX]]``; the name is a store's
    ``context-name`` and is resolved to an address through topic resolution."""

    name: str
    reg_id: int = 0
    group_idx: int = 0

    def __str__(self) -> str:
        return f"{self.name}:{self.reg_id}:{self.group_idx}"


@dataclass(frozen=True)
class StoreGroup:
    """One ``ume_store_group`` entry, ``GroupIDX:GroupSZ`` (quorum = majority of ``size``)."""

    index: int
    size: int

    def __str__(self) -> str:
        return f"{self.index}:{self.size}"


@dataclass(frozen=True)
class UnicastResolverDaemon:
    """One ``resolver_unicast_daemon`` entry (an lbmrd to send topic resolution to)."""

    ip: str
    port: int

    def __str__(self) -> str:
        return f"{self.ip}:{self.port}"


class _BadValue(Exception):
    """A value outside its option's domain; the message says what is expected."""


def _decimal(text: str, low: int, high: int, what: str) -> int:
    number = decimal_in_range(text, low, high)
    if number is None:
        raise _BadValue(f"{what}: a decimal integer {low}..{high}")
    return number


def _ipv4(text: str, what: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text.strip()))
    except ValueError:
        raise _BadValue(f"{what}: a dotted IPv4 address") from None


def parse_session_id(text: str) -> int:
    """A Session ID as the product reads it: ``0x``-prefixed hex, leading-0 octal, or decimal;
    0 means "none" and the largest value is 0xFFFFFFFFFFFFFFFE.  Raises ``ValueError``."""
    try:
        return _session_id(text)
    except _BadValue as exc:
        raise ValueError(str(exc)) from None


def _session_id(text: str) -> int:
    value = text.strip().lower()
    expected = "a session ID 0..0xFFFFFFFFFFFFFFFE (hex 0x.., octal 0.., or decimal)"
    if value.startswith("0x"):
        digits, base = value[2:], 16
        valid = bool(digits) and all(c in "0123456789abcdef" for c in digits)
    elif len(value) > 1 and value.startswith("0"):
        digits, base = value[1:], 8
        valid = all(c in "01234567" for c in digits)
    else:
        decimal = decimal_in_range(value, 0, _MAX_SESSION_ID)
        if decimal is None:
            raise _BadValue(expected)
        return decimal
    if not valid:
        raise _BadValue(expected)
    number = int(digits, base)  # base 16 or 8: no digit limit applies to powers of two
    if number > _MAX_SESSION_ID:
        raise _BadValue(expected)
    return number


def _parse_store_address(text: str) -> StoreAddress | None:
    """An ``ume_store`` value; ``None`` for the clear entry ``0.0.0.0:0``."""
    expected = "[DomainID:]IP:port[:RegID[:GroupIDX]] (e.g. 10.29.3.16:14567 or 0.0.0.0:0)"
    parts = [p.strip() for p in text.split(":")]
    if len(parts) < 2:
        raise _BadValue(expected)
    if "." in parts[0]:
        domain = 0
        ip_text, port_text, rest = parts[0], parts[1], parts[2:]
    else:
        if len(parts) < 3:
            raise _BadValue(expected)
        domain = _decimal(parts[0], 0, _MAX_DOMAIN_ID, "DomainID")
        ip_text, port_text, rest = parts[1], parts[2], parts[3:]
    if len(rest) > 2:
        raise _BadValue(expected)
    ip = _ipv4(ip_text, "store IP")
    port = _decimal(port_text, 0, _MAX_PORT, "store port")
    reg_id = _decimal(rest[0], 0, _MAX_REG_ID, "RegID") if rest else 0
    group = _decimal(rest[1], 0, _MAX_GROUP_INDEX, "GroupIDX") if len(rest) > 1 else 0
    if ip == "0.0.0.0" and port == 0:
        return None
    if ip == "0.0.0.0" or port == 0:
        raise _BadValue(f"{expected}; 0.0.0.0 and port 0 only appear in the clear entry 0.0.0.0:0")
    return StoreAddress(domain, ip, port, reg_id, group)


def _parse_named_store(text: str) -> NamedStore:
    parts = [p.strip() for p in text.split(":")]
    if not 1 <= len(parts) <= 3 or not _STORE_NAME.fullmatch(parts[0]):
        raise _BadValue(
            "name[:RegID[:GroupIDX]] where name is 1-128 letters, digits, '-' or '_' "
            "(a store's context-name)"
        )
    reg_id = _decimal(parts[1], 0, _MAX_REG_ID, "RegID") if len(parts) > 1 else 0
    group = _decimal(parts[2], 0, _MAX_GROUP_INDEX, "GroupIDX") if len(parts) > 2 else 0
    return NamedStore(parts[0], reg_id, group)


def _parse_store_group(text: str) -> StoreGroup | None:
    """An ``ume_store_group`` value; ``None`` for the clear entry ``0:0``."""
    parts = text.split(":")
    if len(parts) != 2:
        raise _BadValue("GroupIDX:GroupSZ (e.g. 0:3, or 0:0 to clear)")
    index = _decimal(parts[0], 0, _MAX_GROUP_INDEX, "GroupIDX")
    size = _decimal(parts[1], 0, _MAX_GROUP_SIZE, "GroupSZ")
    if index == 0 and size == 0:
        return None
    if size == 0:
        raise _BadValue("GroupIDX:GroupSZ with GroupSZ >= 1 (0:0 clears the list)")
    return StoreGroup(index, size)


def _parse_unicast_daemon(text: str) -> UnicastResolverDaemon:
    if "->" in text:
        raise _BadValue("IP:port (the Iface->IP:port form is not supported by the reference impl)")
    host, sep, port = text.rpartition(":")
    if not sep:
        raise _BadValue("IP:port of an lbmrd (e.g. 10.29.3.1:15380)")
    return UnicastResolverDaemon(
        _ipv4(host, "lbmrd IP"), _decimal(port, 1, _MAX_PORT, "lbmrd port")
    )


# =================================================================================================
# Option catalogue
# =================================================================================================


@dataclass
class _ValueContext:
    profile: Profile
    scope: str
    warn: Callable[[str], None]


_Parser = Callable[[str, _ValueContext], object]


def _uint(low: int, high: int, unit: str) -> _Parser:
    def parse(text: str, _ctx: _ValueContext) -> int:
        return _decimal(text, low, high, unit)

    return parse


def _flag(text: str, _ctx: _ValueContext) -> bool:
    value = text.strip()
    if value not in ("0", "1"):
        raise _BadValue("0 or 1")
    return value == "1"


def _enum(*choices: str, aliases: Mapping[str, str] | None = None) -> _Parser:
    table = {c: c for c in choices} | dict(aliases or {})

    def parse(text: str, _ctx: _ValueContext) -> str:
        value = text.strip().lower()
        if value not in table:
            raise _BadValue(" or ".join(sorted(table)))
        return table[value]

    return parse


def _session(text: str, _ctx: _ValueContext) -> int:
    return _session_id(text)


def _ms(low: int = 0) -> _Parser:
    return _uint(low, _U32, "milliseconds")


def _bytes(low: int = 0) -> _Parser:
    return _uint(low, _SIZE_MAX, "bytes")


def _port(text: str, _ctx: _ValueContext) -> int:
    return _decimal(text, 0, _MAX_PORT, "port (0 = pick one from the range)")


def _port_bound(text: str, _ctx: _ValueContext) -> int:
    return _decimal(text, 1, _MAX_PORT, "port")


def _store_behavior(text: str, ctx: _ValueContext) -> str:
    value = _enum("rr", "qc")(text, ctx)
    if value == "rr" and not ctx.profile.round_robin_supported:
        ctx.warn(
            "ume_store_behavior rr (round-robin) was removed in UM 6.8; using qc, as the "
            f"library does (profile {ctx.profile.name!r})"
        )
        return "qc"
    return str(value)


def _rpp_mode(text: str, ctx: _ValueContext) -> int:
    """``ume_receiver_paced_persistence``: a source is 0 or 1, a receiver what its profile
    allows (:attr:`Profile.receiver_rpp_modes`); a profile without RPP (``pre-5.3``,
    :attr:`Profile.rpp_supported`) allows only 0 for both, and the error names the profile."""
    if ctx.scope == "source":
        modes: tuple[int, ...] = (0, 1) if ctx.profile.rpp_supported else (0,)
    else:
        modes = ctx.profile.receiver_rpp_modes
    value = decimal_in_range(text, 0, max(modes))
    if value not in modes:
        raise _BadValue(f"one of {', '.join(map(str, modes))} for a {ctx.scope} "
                        f"(profile {ctx.profile.name!r})")
    return value


def _proactive_keepalive(text: str, ctx: _ValueContext) -> int:
    value = _decimal(text, 0, _U32, "milliseconds")
    if 0 < value < 1500:
        raise _BadValue("0 (off) or at least 1500 milliseconds")
    if not ctx.profile.proactive_keepalive_supported:
        ctx.warn(
            "ume_proactive_keepalive_interval exists only since UM 6.9 "
            f"(profile {ctx.profile.name!r})"
        )
    return value


_TRANSPORTS = {
    "tcp": "tcp",
    "lbt-ru": "lbt-ru",
    "lbtru": "lbt-ru",
    "lbt-rm": "lbt-rm",
    "lbtrm": "lbt-rm",
}


def _transport(text: str, ctx: _ValueContext) -> str:
    value = text.strip().lower()
    if value not in _TRANSPORTS:
        raise _BadValue("tcp, lbt-ru or lbt-rm (other UM transports are not supported here)")
    return _TRANSPORTS[value]


def _multicast(text: str, _ctx: _ValueContext) -> str:
    value = _ipv4(text, "multicast group")
    if not ipaddress.IPv4Address(value).is_multicast:
        raise _BadValue("a multicast group: a dotted IPv4 address in 224.0.0.0/4")
    return value


def _multicast_or_none(text: str, ctx: _ValueContext) -> str:
    """A source's own group; 0.0.0.0 (or nothing set) picks one of the context's range."""
    return "" if text.strip() in ("", "0.0.0.0") else _multicast(text, ctx)


_STABILITY = _enum(
    "any", "majority", "all", "all-active", aliases={"any-group": "any", "all-groups": "all"}
)
_CONSENSUS = _enum("lowest", "majority", "highest")
_SRC, _RCV, _CTX = "source", "receiver", "context"

# option -> (scopes, parser).  Appending options are handled separately.
_OPTIONS: dict[str, tuple[tuple[str, ...], _Parser]] = {
    # context
    "ume_ack_batching_interval": ((_CTX,), _ms(1)),
    "ume_proactive_keepalive_interval": ((_CTX,), _proactive_keepalive),
    "ume_receiver_liveness_interval": ((_CTX,), _ms()),
    "ume_source_liveness_timeout": ((_CTX,), _ms()),
    "ume_user_receiver_registration_id": ((_CTX,), _uint(0, _U32, "id")),
    "request_tcp_bind_request_port": ((_CTX,), _flag),
    "request_tcp_port_low": ((_CTX,), _port_bound),
    "request_tcp_port_high": ((_CTX,), _port_bound),
    "transport_tcp_port_low": ((_CTX,), _port_bound),
    "transport_tcp_port_high": ((_CTX,), _port_bound),
    "transport_lbtru_port_low": ((_CTX, _RCV), _port_bound),
    "transport_lbtru_port_high": ((_CTX, _RCV), _port_bound),
    # LBT-RM, context scope (reference_impl/lbtrm_session.py): rates in bits per second
    "transport_lbtrm_multicast_address_low": ((_CTX,), _multicast),
    "transport_lbtrm_multicast_address_high": ((_CTX,), _multicast),
    "transport_lbtrm_source_port_low": ((_CTX,), _port_bound),
    "transport_lbtrm_source_port_high": ((_CTX,), _port_bound),
    "transport_lbtrm_data_rate_limit": ((_CTX,), _uint(1, _SIZE_MAX, "bits per second")),
    "transport_lbtrm_retransmit_rate_limit": ((_CTX,), _uint(1, _SIZE_MAX, "bits per second")),
    "transport_lbtrm_rate_interval": ((_CTX,), _ms(1)),
    # shared
    "ume_session_id": ((_CTX, _SRC, _RCV), _session),
    "ume_activity_timeout": ((_SRC, _RCV), _ms()),
    "ume_state_lifetime": ((_SRC, _RCV), _ms()),
    "ume_registration_interval": ((_SRC, _RCV), _ms(1)),
    "ume_consensus_sequence_number_behavior": ((_SRC, _RCV), _CONSENSUS),
    "ume_receiver_paced_persistence": ((_SRC, _RCV), _rpp_mode),
    # source
    "ume_store_behavior": ((_SRC,), _store_behavior),
    "ume_proxy_source": ((_SRC,), _flag),
    "ume_sri_inter_sri_interval": ((_SRC,), _ms(1)),
    "ume_sri_max_number_of_sri_per_update": ((_SRC,), _uint(0, _U32, "SRIs")),
    "ume_sri_immediate_sri_request_response": ((_SRC,), _flag),
    "ume_sri_request_response_latency": ((_SRC,), _ms()),
    "ume_sri_flush_sri_request_response": ((_SRC,), _flag),
    "ume_confirmed_delivery_notification": ((_SRC,), _uint(0, 3, "mode")),
    "ume_flight_size": ((_SRC,), _uint(1, _U32, "messages")),
    "ume_flight_size_behavior": ((_SRC,), _enum("block", "notify")),
    "ume_flight_size_bytes": ((_SRC,), _bytes()),
    "late_join": ((_SRC,), _flag),
    "ume_message_stability_lifetime": ((_SRC,), _ms()),
    "ume_message_stability_notification": ((_SRC,), _uint(0, 3, "mode")),
    "ume_message_stability_timeout": ((_SRC,), _ms()),
    "ume_repository_ack_on_reception": ((_SRC,), _flag),
    "ume_repository_disk_file_size_limit": ((_SRC,), _bytes()),
    "ume_repository_size_limit": ((_SRC,), _bytes()),
    "ume_repository_size_threshold": ((_SRC,), _bytes()),
    # a receiver reads them too, for its own registration completion (reference_impl/receiver.py)
    "ume_retention_intergroup_stability_behavior": ((_SRC, _RCV), _STABILITY),
    "ume_retention_intragroup_stability_behavior": (
        (_SRC, _RCV),
        _enum("quorum", "all-active", "all", aliases={"all-stores": "all"}),
    ),
    "ume_retention_unique_confirmations": ((_SRC,), _uint(0, _U32, "confirmations")),
    "ume_store_activity_timeout": ((_SRC,), _ms(1)),
    "ume_store_check_interval": ((_SRC,), _ms(1)),
    "ume_write_delay": ((_SRC,), _ms()),
    "retransmit_retention_size_limit": ((_SRC,), _bytes()),
    "retransmit_retention_size_threshold": ((_SRC,), _bytes()),
    "retransmit_retention_age_threshold": ((_SRC,), _uint(0, _U32, "seconds")),
    "transport": ((_SRC,), _transport),
    "transport_tcp_port": ((_SRC,), _port),
    "transport_lbtru_port": ((_SRC,), _port),
    # the largest datagram of each transport: longer messages go out as fragments
    # (reference_impl/fragments.py says what the bounds are and why)
    "transport_tcp_datagram_max_size": ((_SRC,), _uint(*DATAGRAM_BOUNDS["tcp"], "bytes")),
    "transport_lbtru_datagram_max_size": ((_SRC,), _uint(*DATAGRAM_BOUNDS["lbt-ru"], "bytes")),
    # payload bytes an LBT-RU source keeps to answer NAKs (reference_impl/lbtru_session.py)
    "transport_lbtru_transmission_window_size": ((_SRC,), _bytes(1)),
    "transport_lbtrm_multicast_address": ((_SRC,), _multicast_or_none),
    "transport_lbtrm_source_port": ((_SRC,), _port),
    "transport_lbtrm_destination_port": ((_SRC,), _port_bound),
    "transport_lbtrm_datagram_max_size": ((_SRC,), _uint(*DATAGRAM_BOUNDS["lbt-rm"], "bytes")),
    "transport_lbtrm_transmission_window_size": ((_SRC,), _bytes(1)),
    "transport_lbtrm_sm_minimum_interval": ((_SRC,), _ms(1)),
    "transport_lbtrm_sm_maximum_interval": ((_SRC,), _ms(1)),
    "transport_lbtrm_ignore_interval": ((_SRC,), _ms()),
    # receiver
    "ume_allow_confirmed_delivery": ((_RCV,), _flag),
    "ume_application_outstanding_maximum": ((_RCV,), _uint(0, _U32, "fragments")),
    "ume_explicit_ack_only": ((_RCV,), _flag),
    "ume_sri_request_interval": ((_RCV,), _ms(1)),
    "ume_sri_request_maximum": ((_RCV,), _uint(0, _U32, "requests")),
    "ume_use_ack_batching": ((_RCV,), _flag),
    "use_late_join": ((_RCV,), _flag),
    "ume_use_store": ((_RCV,), _flag),
    "retransmit_request_interval": ((_RCV,), _ms(1)),
    "retransmit_request_maximum": ((_RCV,), _uint(0, _U32, "messages")),
    "retransmit_request_outstanding_maximum": ((_RCV,), _uint(1, _U32, "messages")),
    "retransmit_request_message_timeout": ((_RCV,), _ms(1)),  # 0 would lose every gap
    "retransmit_initial_sequence_number_request": ((_RCV,), _flag),
    "retransmit_message_caching_proximity": ((_RCV,), _uint(0, _U32, "messages")),
    "use_otr": ((_RCV,), _uint(0, 2, "mode (2 = persistent receivers only)")),
    "otr_request_initial_delay": ((_RCV,), _ms()),
    "otr_request_minimum_interval": ((_RCV,), _ms(1)),
    "otr_request_maximum_interval": ((_RCV,), _ms(1)),
    "otr_message_caching_threshold": ((_RCV,), _uint(0, _U32, "messages")),
    "delivery_control_maximum_burst_loss": ((_RCV,), _uint(0, _U32, "messages")),
    "transport_lbtrm_nak_initial_backoff_interval": ((_RCV,), _ms()),
    "transport_lbtrm_nak_backoff_interval": ((_RCV,), _ms(1)),
    "transport_lbtrm_nak_suppress_interval": ((_RCV,), _ms(1)),
    "transport_lbtrm_nak_generation_interval": ((_RCV,), _ms(1)),
    "transport_lbtrm_activity_timeout": ((_RCV,), _ms(1)),
    "transport_lbtrm_send_naks": ((_RCV,), _flag),
}

_APPENDING: dict[str, str] = {
    "ume_store": _SRC,
    "ume_store_name": _SRC,
    "ume_store_group": _SRC,
    "resolver_unicast_daemon": _CTX,
}

_ALIASES: dict[str, str] = {
    "ume_retention_size_limit": "retransmit_retention_size_limit",
    "ume_retention_size_threshold": "retransmit_retention_size_threshold",
    "ume_late_join": "late_join",
    "ume_use_late_join": "use_late_join",
    "ume_retransmit_request_interval": "retransmit_request_interval",
    "ume_retransmit_request_maximum": "retransmit_request_maximum",
    "ume_retransmit_request_outstanding_maximum": "retransmit_request_outstanding_maximum",
}

_IGNORED = {"ume_message_map_tablesz": "it has no effect in current releases"}

_REMOVED = {
    **{
        f"ume_{rank}_store_{part}": "use ume_store DomainID:IP:port:RegID:GroupIDX instead"
        for rank in ("primary", "secondary", "tertiary")
        for part in ("address", "port")
    },
    "ume_registration_id": "give the RegID in ume_store / ume_store_name, or use ume_session_id",
}

# options whose family is fully modelled: unknown names in it are typos, not extensions
_MODELLED_PREFIXES = ("ume_", "retransmit_")


def _known_in(scope: str) -> list[str]:
    names = [n for n, (scopes, _) in _OPTIONS.items() if scope in scopes]
    return names + [n for n, s in _APPENDING.items() if s == scope]


# =================================================================================================
# The option dataclasses
# =================================================================================================


def _frozen_other(values: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(values or {}))


@dataclass(frozen=True)
class ContextOptions:
    """Context-scope options (one UM context: its request port, ranges, Session ID ...)."""

    ume_ack_batching_interval: int
    ume_proactive_keepalive_interval: int
    ume_receiver_liveness_interval: int
    ume_source_liveness_timeout: int
    ume_session_id: int
    ume_user_receiver_registration_id: int
    request_tcp_bind_request_port: bool
    request_tcp_port_low: int
    request_tcp_port_high: int
    transport_tcp_port_low: int
    transport_tcp_port_high: int
    transport_lbtru_port_low: int
    transport_lbtru_port_high: int
    transport_lbtrm_multicast_address_low: str
    transport_lbtrm_multicast_address_high: str
    transport_lbtrm_source_port_low: int
    transport_lbtrm_source_port_high: int
    transport_lbtrm_data_rate_limit: int
    transport_lbtrm_retransmit_rate_limit: int
    transport_lbtrm_rate_interval: int
    resolver_unicast_daemon: tuple[UnicastResolverDaemon, ...]
    other: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, object], *, profile: str | Profile = DEFAULT_PROFILE
    ) -> ContextOptions:
        """Build from option names to values (strings as in a file, or typed values)."""
        return ClientConfig.from_mapping({"context": values}, profile=profile).context

    @property
    def persistence_enabled(self) -> bool:
        """UIM request port binding carries all persistence control traffic; without it
        (``request_tcp_bind_request_port 0``) persistence is off."""
        return self.request_tcp_bind_request_port


@dataclass(frozen=True)
class SourceOptions:
    """Source-scope options.

    ``stores`` is the source's store list in configuration order (``ume_store`` and
    ``ume_store_name`` entries interleaved as written): a store's position is its store index.
    """

    stores: tuple[StoreAddress | NamedStore, ...]
    ume_store_group: tuple[StoreGroup, ...]
    ume_store_behavior: Literal["qc", "rr"]
    ume_registration_interval: int
    ume_session_id: int
    ume_activity_timeout: int
    ume_state_lifetime: int
    ume_proxy_source: bool
    ume_sri_inter_sri_interval: int
    ume_sri_max_number_of_sri_per_update: int
    ume_sri_immediate_sri_request_response: bool
    ume_sri_request_response_latency: int
    ume_sri_flush_sri_request_response: bool
    ume_confirmed_delivery_notification: int
    ume_consensus_sequence_number_behavior: Literal["lowest", "majority", "highest"]
    ume_flight_size: int
    ume_flight_size_behavior: Literal["block", "notify"]
    ume_flight_size_bytes: int
    late_join: bool
    ume_message_stability_lifetime: int
    ume_message_stability_notification: int
    ume_message_stability_timeout: int
    ume_receiver_paced_persistence: int
    ume_repository_ack_on_reception: bool
    ume_repository_disk_file_size_limit: int
    ume_repository_size_limit: int
    ume_repository_size_threshold: int
    ume_retention_intergroup_stability_behavior: Literal["any", "majority", "all", "all-active"]
    ume_retention_intragroup_stability_behavior: Literal["quorum", "all-active", "all"]
    ume_retention_unique_confirmations: int
    ume_store_activity_timeout: int
    ume_store_check_interval: int
    ume_write_delay: int
    retransmit_retention_size_limit: int
    retransmit_retention_size_threshold: int
    retransmit_retention_age_threshold: int
    transport: Literal["tcp", "lbt-ru", "lbt-rm"]
    transport_tcp_port: int
    transport_lbtru_port: int
    transport_tcp_datagram_max_size: int
    transport_lbtru_datagram_max_size: int
    transport_lbtru_transmission_window_size: int
    transport_lbtrm_multicast_address: str
    transport_lbtrm_source_port: int
    transport_lbtrm_destination_port: int
    transport_lbtrm_datagram_max_size: int
    transport_lbtrm_transmission_window_size: int
    transport_lbtrm_sm_minimum_interval: int
    transport_lbtrm_sm_maximum_interval: int
    transport_lbtrm_ignore_interval: int
    other: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, object], *, profile: str | Profile = DEFAULT_PROFILE
    ) -> SourceOptions:
        """Build from option names to values (strings as in a file, or typed values).

        Appending options (``ume_store``, ``ume_store_name``, ``ume_store_group``) take one
        entry or a list of entries (strings or :class:`StoreAddress` / :class:`NamedStore` /
        :class:`StoreGroup`); mapping order is configuration order.
        """
        return ClientConfig.from_mapping({"source": values}, profile=profile).source

    @property
    def ume_store(self) -> tuple[StoreAddress, ...]:
        """The ``ume_store`` (address) entries, in order."""
        return tuple(s for s in self.stores if isinstance(s, StoreAddress))

    @property
    def ume_store_name(self) -> tuple[NamedStore, ...]:
        """The ``ume_store_name`` entries, in order."""
        return tuple(s for s in self.stores if isinstance(s, NamedStore))

    @property
    def persistent(self) -> bool:
        """A source with at least one store is persistent."""
        return bool(self.stores)

    @property
    def effective_late_join(self) -> bool:
        """Late join as the library runs it: forced on for a persistent source."""
        return self.late_join or self.persistent

    @property
    def transport_supported(self) -> bool:
        """Whether the reference implementation can run this source's transport."""
        return self.transport in ("tcp", "lbt-ru", "lbt-rm")

    def effective_session_id(self, context: ContextOptions) -> int:
        """This source's Session ID, inheriting the context's when its own is 0."""
        return self.ume_session_id or context.ume_session_id

    def groups(self) -> tuple[StoreGroup, ...]:
        """Configured groups, or the implicit single group of all stores when none is set."""
        if self.ume_store_group:
            return self.ume_store_group
        return (StoreGroup(0, len(self.stores)),) if self.stores else ()


@dataclass(frozen=True)
class ReceiverOptions:
    """Receiver-scope options."""

    ume_activity_timeout: int
    ume_state_lifetime: int
    ume_session_id: int
    ume_registration_interval: int
    ume_allow_confirmed_delivery: bool
    ume_application_outstanding_maximum: int
    ume_consensus_sequence_number_behavior: Literal["lowest", "majority", "highest"]
    ume_retention_intragroup_stability_behavior: Literal["quorum", "all-active", "all"]
    ume_retention_intergroup_stability_behavior: Literal["any", "majority", "all", "all-active"]
    ume_explicit_ack_only: bool
    ume_receiver_paced_persistence: int
    ume_sri_request_interval: int
    ume_sri_request_maximum: int
    ume_use_ack_batching: bool
    use_late_join: bool
    ume_use_store: bool
    retransmit_request_interval: int
    retransmit_request_maximum: int
    retransmit_request_outstanding_maximum: int
    retransmit_request_message_timeout: int
    retransmit_initial_sequence_number_request: bool
    retransmit_message_caching_proximity: int
    use_otr: int
    otr_request_initial_delay: int
    otr_request_minimum_interval: int
    otr_request_maximum_interval: int
    otr_message_caching_threshold: int
    delivery_control_maximum_burst_loss: int
    transport_lbtru_port_low: int
    transport_lbtru_port_high: int
    transport_lbtrm_nak_initial_backoff_interval: int
    transport_lbtrm_nak_backoff_interval: int
    transport_lbtrm_nak_suppress_interval: int
    transport_lbtrm_nak_generation_interval: int
    transport_lbtrm_activity_timeout: int
    transport_lbtrm_send_naks: bool
    other: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, object], *, profile: str | Profile = DEFAULT_PROFILE
    ) -> ReceiverOptions:
        """Build from option names to values (strings as in a file, or typed values)."""
        return ClientConfig.from_mapping({"receiver": values}, profile=profile).receiver

    @property
    def persistent(self) -> bool:
        """Whether this receiver takes part in persistence when its source is persistent
        (``ume_use_store`` 1 and late join, which persistent recovery rides on, on)."""
        return self.ume_use_store and self.use_late_join

    @property
    def otr_enabled_for_persistence(self) -> bool:
        """``use_otr`` 1 (always) or 2 (persistent receivers only)."""
        return self.use_otr in (1, 2)

    def effective_session_id(self, context: ContextOptions) -> int:
        """This receiver's Session ID, inheriting the context's when its own is 0."""
        return self.ume_session_id or context.ume_session_id


@dataclass(frozen=True)
class ClientConfig:
    """A whole flat configuration file.

    ``wildcard_receiver`` and ``event_queue`` options are kept verbatim (the reference
    implementation has no wildcard receivers or event queues).
    """

    profile: str
    context: ContextOptions
    source: SourceOptions
    receiver: ReceiverOptions
    wildcard_receiver: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    event_queue: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    source_file: str = "<string>"
    warnings: tuple[ConfigWarning, ...] = ()

    @classmethod
    def from_mapping(
        cls,
        scopes: Mapping[str, Mapping[str, object]],
        *,
        profile: str | Profile = DEFAULT_PROFILE,
    ) -> ClientConfig:
        """Build from ``{scope: {option: value}}``; values are strings (as in a file) or typed
        values (ints, bools, the entry dataclasses, lists of entries for appending options)."""
        reader = _Reader("<mapping>", get_profile(profile))
        for scope, options in scopes.items():
            for name, value in options.items():
                for text in _as_texts(name, value):
                    reader.apply(scope, name, text, None)
        return reader.finish()


def _as_texts(name: str, value: object) -> list[str]:
    """Configuration-file spelling of a mapping value (lists only for appending options)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool):
        return ["1" if value else "0"]
    if isinstance(value, int | StoreAddress | NamedStore | StoreGroup | UnicastResolverDaemon):
        return [str(value)]
    if name.lower() in _APPENDING and isinstance(value, Iterable):
        return [text for item in value for text in _as_texts(name, item)]
    raise ConfigError(
        "<mapping>", None, f"option {name!r}: cannot use a {type(value).__name__} value"
    )


# =================================================================================================
# Reading
# =================================================================================================


class _Reader:
    """Applies option lines in order, then builds and cross-checks the dataclasses."""

    def __init__(self, filename: str, profile: Profile) -> None:
        self.filename = filename
        self.profile = profile
        self.warnings: list[ConfigWarning] = []
        self.values: dict[str, dict[str, object]] = {_CTX: {}, _SRC: {}, _RCV: {}}
        self.lines: dict[tuple[str, str], int | None] = {}
        self.other: dict[str, dict[str, str]] = {scope: {} for scope in SCOPES}
        self.stores: list[tuple[StoreAddress | NamedStore, int | None]] = []
        self.groups: list[tuple[StoreGroup, int | None]] = []
        self.daemons: list[UnicastResolverDaemon] = []

    def error(self, line: int | None, message: str) -> ConfigError:
        return ConfigError(self.filename, line, message)

    def warn(self, line: int | None, message: str) -> None:
        self.warnings.append(ConfigWarning(self.filename, line, message))

    def apply(self, scope_text: str, name_text: str, value: str, line: int | None) -> None:
        scope, name = scope_text.strip().lower(), name_text.strip().lower()
        if scope not in SCOPES:
            close = difflib.get_close_matches(scope, SCOPES, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"scopes: {', '.join(SCOPES)}"
            raise self.error(line, f"unknown scope {shown(scope_text)}; {hint}")
        if scope in ("wildcard_receiver", "event_queue"):
            self.other[scope][name] = value
            return
        if name in _REMOVED:
            raise self.error(line, f"option {name!r} was removed from UM; {_REMOVED[name]}")
        if name in _IGNORED:
            self.warn(line, f"option {name!r} is deprecated and ignored: {_IGNORED[name]}")
            return
        if name in _ALIASES:
            self.warn(line, f"option {name!r} is deprecated; read as {_ALIASES[name]!r}")
            name = _ALIASES[name]
        if name in _APPENDING:
            self.check_scope(scope, name, (_APPENDING[name],), line)
            self.append(name, value, line)
            return
        if name in _OPTIONS:
            scopes, parser = _OPTIONS[name]
            self.check_scope(scope, name, scopes, line)
            self.set(scope, name, self.typed(scope, name, value, parser, line), line)
            return
        if name.startswith(_MODELLED_PREFIXES):
            raise self.unknown(scope, name, line)
        self.other[scope][name] = value

    def check_scope(self, scope: str, name: str, scopes: tuple[str, ...], line: int | None) -> None:
        if scope not in scopes:
            raise self.error(
                line,
                f"option {name!r} is a {' / '.join(scopes)} option, not a {scope} option",
            )

    def unknown(self, scope: str, name: str, line: int | None) -> ConfigError:
        known = _known_in(scope)
        close = difflib.get_close_matches(name, [*_OPTIONS, *_APPENDING], n=1, cutoff=0.6)
        if not close:
            hint = f"known {scope} options: {', '.join(sorted(known))}"
        elif close[0] in known:
            hint = f"did you mean {close[0]!r}?"
        else:
            scopes = _OPTIONS[close[0]][0] if close[0] in _OPTIONS else (_APPENDING[close[0]],)
            hint = f"the nearest known option is {close[0]!r}, a {' / '.join(scopes)} option"
        return self.error(line, f"unknown {scope} option {shown(name)}; {hint}")

    def typed(self, scope: str, name: str, value: str, parser: _Parser, line: int | None) -> object:
        context = _ValueContext(self.profile, scope, lambda m: self.warn(line, m))
        try:
            return parser(value, context)
        except _BadValue as exc:
            raise self.error(
                line, f"{scope} option {name!r} has invalid value {shown(value)}: expected {exc}"
            ) from None

    def set(self, scope: str, name: str, value: object, line: int | None) -> None:
        values = self.values[scope]
        values[name] = value
        self.lines[(scope, name)] = line
        # explicit ACKs and ACK batching exclude each other: the last one turned on wins
        rivals = {"ume_explicit_ack_only": "ume_use_ack_batching"}
        rivals |= {b: a for a, b in rivals.items()}
        rival = rivals.get(name)
        if scope == _RCV and rival is not None and value is True:
            if values.get(rival) is True:
                self.warn(line, f"{name} 1 turns {rival} off (they exclude each other)")
            values[rival] = False

    def append(self, name: str, value: str, line: int | None) -> None:
        try:
            if name == "ume_store":
                address = _parse_store_address(value)
                if address is None:
                    self.stores.clear()
                else:
                    self.stores.append((address, line))
            elif name == "ume_store_name":
                self.stores.append((_parse_named_store(value), line))
            elif name == "ume_store_group":
                group = _parse_store_group(value)
                if group is None:
                    self.groups.clear()
                elif self.groups and group.index <= self.groups[-1][0].index:
                    raise _BadValue(
                        f"a group index above {self.groups[-1][0].index}: groups must be given "
                        "in ascending GroupIDX order"
                    )
                else:
                    self.groups.append((group, line))
            else:
                self.daemons.append(_parse_unicast_daemon(value))
        except _BadValue as exc:
            raise self.error(
                line, f"option {name!r} has invalid value {shown(value)}: expected {exc}"
            ) from None

    # -- building ------------------------------------------------------------------------------

    def finish(self) -> ClientConfig:
        profile = self.profile
        context_values: dict[str, Any] = dict(profile.context) | self.values[_CTX]
        context_values["resolver_unicast_daemon"] = tuple(self.daemons)
        context = ContextOptions(**context_values, other=_frozen_other(self.other[_CTX]))
        self.check_range(_CTX, "request_tcp_port", context_values)
        self.check_range(_CTX, "transport_tcp_port", context_values)
        self.check_range(_CTX, "transport_lbtru_port", context_values)
        self.check_range(_CTX, "transport_lbtrm_source_port", context_values)
        self.check_range(_CTX, "transport_lbtrm_multicast_address", context_values,
                         key=lambda ip: int(ipaddress.IPv4Address(ip)))

        source_values: dict[str, Any] = dict(profile.source) | self.values[_SRC]
        source_values["stores"] = tuple(store for store, _ in self.stores)
        source_values["ume_store_group"] = tuple(group for group, _ in self.groups)
        source = SourceOptions(**source_values, other=_frozen_other(self.other[_SRC]))
        self.check_source(source)

        receiver_values: dict[str, Any] = dict(profile.receiver) | self.values[_RCV]
        receiver = ReceiverOptions(**receiver_values, other=_frozen_other(self.other[_RCV]))
        self.check_range(_RCV, "transport_lbtru_port", receiver_values)
        if receiver.otr_request_minimum_interval > receiver.otr_request_maximum_interval:
            self.warn(
                self.lines.get((_RCV, "otr_request_minimum_interval")),
                "otr_request_minimum_interval exceeds otr_request_maximum_interval",
            )

        if (
            source.ume_proxy_source
            and not source.effective_session_id(context)
            and any(store.reg_id == 0 for store in source.stores)
        ):
            self.warn(
                self.lines.get((_SRC, "ume_proxy_source")),
                "ume_proxy_source needs an explicit RegID for every store or a Session ID; "
                "stores refuse the proxy request otherwise",
            )
        return ClientConfig(
            profile=profile.name,
            context=context,
            source=source,
            receiver=receiver,
            wildcard_receiver=_frozen_other(self.other["wildcard_receiver"]),
            event_queue=_frozen_other(self.other["event_queue"]),
            source_file=self.filename,
            warnings=tuple(self.warnings),
        )

    def check_range(self, scope: str, stem: str, values: Mapping[str, Any],
                    key: Callable[[Any], int] = int) -> None:
        low, high = values[f"{stem}_low"], values[f"{stem}_high"]
        if key(low) > key(high):
            line = self.lines.get((scope, f"{stem}_high")) or self.lines.get((scope, f"{stem}_low"))
            raise self.error(line, f"{scope} {stem}_low {low} is above {stem}_high {high}")

    def check_source(self, source: SourceOptions) -> None:
        line_of = dict(self.lines)
        if self.groups:
            sizes = {group.index: group.size for group, _ in self.groups}
            members_per_group: dict[int, int] = {}
            for store, line in self.stores:
                if store.group_idx not in sizes:
                    raise self.error(
                        line,
                        f"store {store} is in group {store.group_idx}, which no ume_store_group "
                        f"declares (groups: {', '.join(map(str, sizes))})",
                    )
                members_per_group[store.group_idx] = members_per_group.get(store.group_idx, 0) + 1
            for group, line in self.groups:
                count = members_per_group.get(group.index, 0)
                if count > group.size:
                    self.warn(
                        line,
                        f"group {group.index} has {count} stores but size {group.size}: "
                        "extra ('backup') stores are an unsupported practice",
                    )
        else:
            for store, line in self.stores:
                if store.group_idx != 0:
                    self.warn(
                        line,
                        f"store {store} names group {store.group_idx} but no ume_store_group is "
                        "configured; each group's size is the number of stores naming it",
                    )
        self.check_quorum_consensus(source)
        if source.ume_receiver_paced_persistence == 1 and source.ume_flight_size_bytes == 0:
            raise self.error(
                line_of.get((_SRC, "ume_receiver_paced_persistence")),
                "an RPP source (ume_receiver_paced_persistence 1) needs a non-zero "
                "ume_flight_size_bytes",
            )
        minimum = 65536 if source.transport == "tcp" else 8192
        if source.retransmit_retention_size_limit < minimum:
            raise self.error(
                line_of.get((_SRC, "retransmit_retention_size_limit")),
                f"retransmit_retention_size_limit {source.retransmit_retention_size_limit} is "
                f"below the {minimum}-byte minimum for transport {source.transport}",
            )
        if source.ume_receiver_paced_persistence == 0:
            for name in (
                "ume_write_delay",
                "ume_repository_size_threshold",
                "ume_repository_size_limit",
                "ume_repository_disk_file_size_limit",
                "ume_repository_ack_on_reception",
            ):
                if self.values[_SRC].get(name):
                    self.warn(line_of.get((_SRC, name)), f"{name} only matters for an RPP source")

    def check_quorum_consensus(self, source: SourceOptions) -> None:
        """Refuse QC settings under which the source could never complete registration.

        Guide "Sources Using Quorum/Consensus": a group registers when a quorum (a simple
        majority of its *configured* size) of its stores did, or every one of them with the
        intragroup behaviour ``all``; the intergroup behaviour then needs every group
        (``all``), a majority of the groups (``majority``) or one (``any``, ``all-active``).
        Which stores are in which group is known here, so a group with too few stores is
        found at start-up instead of as a source that never completes registration.  A group
        that can never register while the others still suffice only warns (it is dead weight,
        most likely a wrong GroupIDX).  Round-robin (guide "Round-Robin Store Usage", kept on
        the guide profile only) uses one store at a time, so QC groups contradict it (an
        error) and a non-default stability behaviour has no effect (a warning).
        """
        line_of = self.lines.get
        if source.ume_store_behavior == "rr":
            for name in ("ume_retention_intragroup_stability_behavior",
                         "ume_retention_intergroup_stability_behavior"):
                value = self.values[_SRC].get(name)
                if value is not None and value != self.profile.source.get(name):
                    self.warn(
                        line_of((_SRC, name)),
                        f"{name} {value} is a quorum/consensus setting and has no effect with "
                        "ume_store_behavior rr (round-robin uses one store at a time)",
                    )
            if self.groups:
                group, line = self.groups[0]
                raise self.error(
                    line,
                    f"ume_store_group {group.index}:{group.size} declares a quorum/consensus "
                    "group, but ume_store_behavior is rr (round-robin uses one store at a time)",
                )
            return
        if not self.groups or not self.stores:
            return
        intra = source.ume_retention_intragroup_stability_behavior
        inter = source.ume_retention_intergroup_stability_behavior
        members: dict[int, int] = {}
        for store, _ in self.stores:
            members[store.group_idx] = members.get(store.group_idx, 0) + 1
        short: list[tuple[StoreGroup, int | None, int, int]] = []
        for group, line in self.groups:
            need = group.size if intra == "all" else group.size // 2 + 1
            if members.get(group.index, 0) < need:
                short.append((group, line, members.get(group.index, 0), need))
        if not short:
            return
        total = len(self.groups)
        required = {"all": total, "majority": total // 2 + 1}.get(inter, 1)
        rule = {"all": "every group", "majority": f"{required} of the {total} groups"}.get(
            inter, "at least one group")
        for group, line, count, need in short:
            why = (f"group {group.index} (size {group.size}) has {count} "
                   f"store{'' if count == 1 else 's'} but needs {need} to register "
                   f"(intragroup {intra})")
            if total - len(short) < required:
                raise self.error(
                    line,
                    f"{why}; intergroup {inter} needs {rule} to register, so the source "
                    "could never complete registration",
                )
            self.warn(line, f"{why}, so it can never register (the other groups suffice)")


def parse_client_config(
    text: str,
    filename: str = "<string>",
    *,
    profile: str | Profile = DEFAULT_PROFILE,
) -> ClientConfig:
    """Parse flat UM configuration text; raise :class:`ConfigError` on any problem.

    Only ``\\n`` (or ``\\r\\n``) ends a line and a ``#`` comment runs to that end, whatever
    it holds: a vertical tab, form feed, U+2028 or the like inside a comment does not start a
    live line (``str.splitlines()`` would split there, letting a comment hide an option).  Outside
    comments, only spaces and tabs separate fields; any other control, format or separator
    character is an error at its line and column, since an editor shows such a line as
    something other than what it says.  A byte-order mark at the very start is skipped.
    """
    reader = _Reader(filename, get_profile(profile))
    for number, raw in config_lines(text.removeprefix("\ufeff")):
        live = raw.partition("#")[0]
        stray = stray_character(live)
        if stray is not None:
            index, char = stray
            raise ConfigError(
                filename,
                number,
                f"{character_name(char)} outside a comment; only spaces and tabs may separate "
                "the fields of a line",
                index + 1,
            )
        line = live.strip(" \t")
        if not line:
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise ConfigError(
                filename,
                number,
                f"expected 'scope option value', got {shown(line)}",
            )
        reader.apply(parts[0], parts[1], parts[2].strip(" \t"), number)
    return reader.finish()


def load_client_config(
    path: str | Path, *, profile: str | Profile = DEFAULT_PROFILE
) -> ClientConfig:
    """Read and parse a flat UM configuration file (see :func:`parse_client_config`)."""
    name = str(path)
    try:
        text = read_config_bytes(path).decode("utf-8")
    except OSError as exc:
        raise ConfigError(name, None, f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            name, None, f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        ) from None
    except ValueError as exc:
        raise ConfigError(name, None, str(exc)) from None
    return parse_client_config(text, name, profile=profile)
