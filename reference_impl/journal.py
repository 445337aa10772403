"""The disk store's state journal as it is read back: one JSON record a line, each checked.

A store with disk repositories journals its registrations, consumption acknowledgements and
deletions (``{"client": {...}}``, ``{"ack": RegID, "sqn": N}``, ``{"delete": RegID}``) and
restores them when it starts (:meth:`reference_impl.store.StoreCore._restore`).  What is read
back is damage or an attack as often as a crash: every field a record restores is checked
here, so a bad line is refused with a reason (the store then refuses to start, naming the file
and line) rather than restored into state that fails later.  Only a torn last line, a crash in
mid-write, is the store's to cut off.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Mapping
from typing import Any

from wire import lbmr
from wire.errors import WireError

LINE_MAX = 1 << 20
"""Longest journal line read (bytes): a record is well under 2 KB (a topic name is at most a
few hundred bytes), so a longer line is damage, and reading one whole could take any memory."""
REFUSED = "; the store does not start on a damaged state journal: repair the line or move the "\
          "file away"
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> float:
    raise _NotJson(f"{name} is not a journal value")


def parse_line(line: bytes) -> object:
    """One journal line as JSON; ``ValueError`` saying why it is not."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {line[exc.start]:#04x} at column "
                         f"{exc.start + 1})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except _NotJson:
        raise
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg.removesuffix(' at')} at column "
                         f"{exc.colno})") from None
    except RecursionError:
        raise ValueError("not a journal record (JSON nested too deeply)") from None
    except ValueError:  # an integer past Python's digit limit
        raise ValueError("not a journal record (a number too long)") from None


def _int(value: object, what: str, high: int) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise ValueError(f"{what} must be an integer 0..{high}, not {_short(value)}")
    return value


def _seconds(value: object, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a number of seconds, not {_short(value)}")
    return float(value)


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else f"{text[:60]}..."


_CLIENT_FIELDS = {"role", "reg_id", "topic", "session_id", "transport_idx", "topic_idx",
                  "activity_timeout", "state_lifetime", "rpp", "request_addr"}
_POLICY_POSITIVE = frozenset({"source_check_interval", "keepalive_interval",
                              "stability_ack_interval", "stability_ack_minimum_number",
                              "source_flight_size_bytes_maximum"})
"""Topic options the XML reader never lets be 0: they pace the store's timers and batches (a
check interval of 0 would spin the store)."""
_REPOSITORY_TYPES = ("memory", "disk")
_OPTIONAL = {"source": frozenset({"rpp_values"}), "receiver": frozenset({"floor"})}
"""Fields a record may lack: an RPP source's effective values (``rpp_values``) and a
receiver's ``floor`` (the sequence number before its first low one) came later."""
_RPP_FIELDS = ("flight_size_bytes", "write_delay", "ack_on_reception", "size_threshold",
               "size_limit", "disk_file_size_limit")
"""The fields of :class:`reference_impl.rpp.RppValues` (the journal imports none of the
parties; tests/reference_impl/test_store_rpp.py checks the two agree)."""


def _check_client(rec: object, policy_types: Mapping[str, type]) -> dict[str, Any]:
    """A journalled client record with every field it restores checked (``ValueError``)."""
    if not isinstance(rec, dict):
        raise ValueError(f"a client record is a JSON object, not {_short(rec)}")
    role = rec.get("role")
    if role not in ("source", "receiver"):
        raise ValueError(f'client role must be "source" or "receiver", not {_short(role)}')
    wanted = _CLIENT_FIELDS | ({"policy"} if role == "source" else {"source_reg_id"})
    optional = _OPTIONAL[role]  # absent in journals written before RPP values were kept
    missing = sorted(wanted - rec.keys())
    extra = sorted(rec.keys() - wanted - optional)
    if missing:
        raise ValueError(f"{role} record without {', '.join(missing)}")
    if extra:
        raise ValueError(f"{role} record with unknown field(s) {_short(extra)}")
    _int(rec["reg_id"], "reg_id", _U32)
    topic = rec["topic"]
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a topic name, not {_short(topic)}")
    try:  # the store queries its sources' topics: a name resolution cannot carry is damage
        lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=topic)]).build()
    except WireError as exc:
        raise ValueError(f"topic {_short(topic)} cannot be resolved: {exc.reason}") from None
    _int(rec["session_id"], "session_id", _U64)
    _int(rec["transport_idx"], "transport_idx", _U32)
    _int(rec["topic_idx"], "topic_idx", _U32)
    _seconds(rec["activity_timeout"], "activity_timeout")
    _seconds(rec["state_lifetime"], "state_lifetime")
    _int(rec["rpp"], "rpp", 2)
    addr = rec["request_addr"]
    try:
        ip, port = addr
        ipaddress.IPv4Address(ip)
        _int(port, "port", 0xFFFF)
    except (TypeError, ValueError):
        raise ValueError(f"request_addr must be [IPv4 address, port], not {_short(addr)}") \
            from None
    if role == "receiver":
        _int(rec["source_reg_id"], "source_reg_id", _U32)
        floor = rec.get("floor")
        if floor is not None and (type(floor) is not int or not -1 <= floor <= _U32):
            raise ValueError(f"floor must be null or an integer -1..{_U32}, not "
                             f"{_short(floor)}")
        return rec
    _check_rpp_values(rec.get("rpp_values"), rec["rpp"])
    policy = rec["policy"]
    if not isinstance(policy, dict):
        raise ValueError(f"policy must be an object of topic options, not {_short(policy)}")
    for name, value in policy.items():
        kind = policy_types.get(name)
        if kind is None:
            raise ValueError(f"policy option {_short(name)} is not one this store knows")
        if kind is str:
            if value not in _REPOSITORY_TYPES:
                raise ValueError(f"policy option {name} must be one of {_REPOSITORY_TYPES}, "
                                 f"not {_short(value)}")
        elif _int(value, f"policy option {name}", _U64) == 0 and name in _POLICY_POSITIVE:
            raise ValueError(f"policy option {name} must be at least 1, not 0")
    return rec


def _check_rpp_values(values: object, rpp: int) -> None:
    """A source record's ``rpp_values``: ``null`` (or absent) for an SPP source, else the six
    effective RPP values (:class:`reference_impl.rpp.RppValues`), integers, ack on reception 0
    or 1.  An RPP source journalled before the values were kept has none: the store restores
    it with its topic's values, the only ones such a store ever applied."""
    if values is None:
        return
    if not rpp:
        raise ValueError("an SPP source record with rpp_values")
    if not isinstance(values, dict) or sorted(values) != sorted(_RPP_FIELDS):
        raise ValueError(f"rpp_values must be an object of {', '.join(_RPP_FIELDS)}, not "
                         f"{_short(values)}")
    for name in _RPP_FIELDS:
        _int(values[name], f"rpp_values {name}", 1 if name == "ack_on_reception" else _U64)


def apply_record(record: object, clients: dict[int, dict[str, Any]],
                 acks: dict[int, int], policy_types: Mapping[str, type]) -> None:
    """Fold one journal record into ``clients`` and ``acks``; ``ValueError`` for a record
    that is not of one of the three shapes the store writes (each field checked)."""
    keys = sorted(record) if isinstance(record, dict) else None
    if keys == ["client"]:
        rec = _check_client(record["client"], policy_types)  # type: ignore[index]
        clients[rec["reg_id"]] = rec
    elif keys == ["ack", "sqn"]:
        reg_id = _int(record["ack"], "ack (a receiver RegID)", _U32)  # type: ignore[index]
        sqn = _int(record["sqn"], "sqn", _U32)  # type: ignore[index]
        acks[reg_id] = max(acks.get(reg_id, -1), sqn)
    elif keys == ["delete"]:
        clients.pop(_int(record["delete"], "delete (a RegID)", _U32), None)  # type: ignore[index]
    else:
        raise ValueError('not a journal record: one is {"client": {...}}, {"ack": RegID, '
                         '"sqn": N} or {"delete": RegID}, not ' + _short(record))
