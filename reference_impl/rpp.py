"""Receiver-paced persistence (RPP): the rules every party applies, written once.

The guide's "Receiver-paced Persistence Operations" ("RPP Registration", "Implementing RPP",
"UMP Version RPP Compatibility Matrix") and docs/semantics.md §1.13, §2.1, §2.2.  This module
holds facts, not a party: the store (:mod:`reference_impl.store`) checks a registration with
:func:`effective_values` and :func:`reregistration_refusal`, the source
(:mod:`reference_impl.source`) and receiver (:mod:`reference_impl.receiver`) build their
registration's options with :func:`source_options` / :func:`receiver_options`, and the
conformance cases read the same tables (:data:`OVERRIDES`, :data:`MATRIX`) to know what to
expect.  It imports nothing of the parties.

**How the values travel** (the wire format is not in tshark's dissector; our choice,
docs/wire-lbmc.md §2.3): after the PREG, in the same CONTROL message, one EXTOPT configuration
option per value (:class:`wire.lbmc.CfgOpt`): scope *source* for a source's overrides, scope
*receiver* for a receiver's mode, the product's option name and its value as configuration-file
text.  A source sends only the overrides it sets (0 means "the store's value" and is not sent);
a blocking RPP receiver sends none (the RPP flag says it), a non-blocking one sends
``ume_receiver_paced_persistence 2``.

**What a store refuses** (code 6, ECONFIG, "source and store configuration incompatible", each
with its own log line naming the option and both values; nothing about the store changes):

* a garbled option (not a whole CFGOPT, an unknown name, a value that is not a decimal
  integer, a name given twice) and contradictory flags (options on a registration without the
  RPP flag; a receiver mode that is not 1 or 2 with the flag);
* an override above the topic's maximum, ``ume_repository_ack_on_reception 1`` where the
  topic does not allow it, ``ume_write_delay`` or ``ume_repository_disk_file_size_limit`` on a
  memory repository (they exist only for disk repositories, "Implementing RPP" step 5);
* effective values that are inconsistent (§2.2): size threshold above the size limit; for a
  disk repository, a size limit above 90 % of the disk file limit; a size threshold not above
  the flight size in bytes (the store must hold one whole flight above its threshold).
  *Choice*: the 90 % rule applies to disk repositories only, since a memory repository has
  no file;
* on an existing repository (re-registration): a switch between SPP and RPP, a receiver that
  switches between blocking and non-blocking, an RPP source whose values differ from its
  first registration's (:func:`reregistration_refusal`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from wire import WireError
from wire.lbmc import CfgOpt, CfgScope

RPP_OPTION = "ume_receiver_paced_persistence"
"""The source and receiver option that asks for RPP (receivers: 1 blocking, 2 non-blocking)."""

SPP, BLOCKING, NON_BLOCKING = 0, 1, 2
"""Receiver modes (``ume_receiver_paced_persistence``); a source is SPP (0) or RPP (1)."""

DISK_FILE_SHARE = 0.9
"""The size limit may be at most this share of the disk file limit (docs/semantics.md §2.2)."""


class RppRefused(ValueError):
    """A registration the RPP rules refuse; ``str()`` is the reason the store logs.

    Attributes:
        option: the option the refusal is about (``None`` for a mode switch).
    """

    def __init__(self, reason: str, option: str | None = None) -> None:
        super().__init__(reason)
        self.option = option


@dataclass(frozen=True)
class Override:
    """One value an RPP source may lower (docs/semantics.md §2.2).

    Attributes:
        option: the source's option name, as it travels (``ume_flight_size_bytes``).
        store_option: the topic option that is the maximum (``source-flight-size-bytes-maximum``).
        field: the :class:`RppValues` (and ``TopicPolicy``) attribute holding it.
        flag: a 0/1 permission rather than a maximum (ack on reception).
        disk_only: exists only for disk repositories.
    """

    option: str
    store_option: str
    field: str
    flag: bool = False
    disk_only: bool = False

    @property
    def policy_field(self) -> str:
        """The store topic policy's attribute (the XML name with ``_`` for ``-``)."""
        return self.store_option.replace("-", "_")


OVERRIDES: tuple[Override, ...] = (
    Override("ume_flight_size_bytes", "source-flight-size-bytes-maximum", "flight_size_bytes"),
    Override("ume_write_delay", "repository-disk-write-delay", "write_delay", disk_only=True),
    Override("ume_repository_ack_on_reception", "repository-allow-ack-on-reception",
             "ack_on_reception", flag=True),
    Override("ume_repository_size_threshold", "repository-size-threshold", "size_threshold"),
    Override("ume_repository_size_limit", "repository-size-limit", "size_limit"),
    Override("ume_repository_disk_file_size_limit", "repository-disk-file-size-limit",
             "disk_file_size_limit", disk_only=True),
)
"""Every RPP override, in the order a source sends them."""

BY_OPTION: Mapping[str, Override] = {o.option: o for o in OVERRIDES}


@dataclass(frozen=True)
class RppValues:
    """The values an RPP repository runs with (bytes; ``write_delay`` in milliseconds;
    ``ack_on_reception`` 0/1).  A store keeps the values of the first registration and
    compares every re-registration's with them."""

    flight_size_bytes: int
    write_delay: int
    ack_on_reception: int
    size_threshold: int
    size_limit: int
    disk_file_size_limit: int

    def as_dict(self) -> dict[str, int]:
        return {o.field: getattr(self, o.field) for o in OVERRIDES}


def store_values(policy: Any) -> RppValues:
    """The topic's own values (a ``TopicPolicy``, or anything with its attribute names): what
    a source that overrides nothing gets.  A permission (ack on reception) is not a value: a
    source gets it only when it asks, so it is 0 here."""
    return RppValues(**{o.field: 0 if o.flag else int(getattr(policy, o.policy_field))
                        for o in OVERRIDES})


def _integer(option: CfgOpt) -> int:
    text = option.value.strip()
    if not text.isdigit() or text != option.value:
        raise RppRefused(f"garbled RPP option: {option.name} value {option.value!r} is not a "
                         f"non-negative decimal integer", option.name)
    return int(text)


def requested_overrides(options: Iterable[CfgOpt]) -> dict[str, int]:
    """The overrides a source's registration asks for, by option name (a value of 0 is
    dropped: "use the store's value").  :class:`RppRefused` for a garbled set."""
    out: dict[str, int] = {}
    seen: set[str] = set()
    for option in options:
        if option.scope != CfgScope.SOURCE or option.name not in BY_OPTION:
            raise RppRefused(f"garbled RPP option: {option.name!r} (scope {option.scope}) is "
                             f"not an RPP source option", option.name)
        if option.name in seen:
            raise RppRefused(f"garbled RPP option: {option.name} given twice", option.name)
        seen.add(option.name)
        value = _integer(option)
        override = BY_OPTION[option.name]
        if override.flag and value > 1:
            raise RppRefused(f"garbled RPP option: {option.name} is 0 or 1, not {value}",
                             option.name)
        if value:
            out[option.name] = value
    return out


def effective_values(policy: Any, requested: Mapping[str, int], *, disk: bool) -> RppValues:
    """The values an RPP source gets: each requested override checked against the topic's
    maximum, then the whole set checked for consistency (module docstring).  ``policy`` is
    the topic's ``TopicPolicy``; ``disk``: the repository is a disk one.  Raises
    :class:`RppRefused` naming the option and both values."""
    base = store_values(policy)
    values = base
    for name, value in requested.items():
        override = BY_OPTION[name]
        limit = int(getattr(policy, override.policy_field))
        if override.disk_only and not disk:
            raise RppRefused(f"{name} {value} is for disk repositories only; the topic's "
                             f"repository is a memory one", name)
        if override.flag:
            if value and not limit:
                raise RppRefused(f"{name} {value} asked for but {override.store_option} is "
                                 f"{limit}", name)
        elif value > limit:
            raise RppRefused(f"{name} {value} is above the store's {override.store_option} "
                             f"{limit}", name)
        values = replace(values, **{override.field: value})
    if values.size_threshold > values.size_limit:
        raise RppRefused(f"inconsistent RPP values: repository size threshold "
                         f"{values.size_threshold} is above the size limit {values.size_limit}",
                         "ume_repository_size_threshold")
    if disk and values.size_limit > DISK_FILE_SHARE * values.disk_file_size_limit:
        raise RppRefused(f"inconsistent RPP values: repository size limit {values.size_limit} "
                         f"is above 90% of the disk file size limit "
                         f"{values.disk_file_size_limit}", "ume_repository_size_limit")
    if values.size_threshold <= values.flight_size_bytes:
        raise RppRefused(f"inconsistent RPP values: repository size threshold "
                         f"{values.size_threshold} is not above the flight size "
                         f"{values.flight_size_bytes} bytes", "ume_flight_size_bytes")
    return values


def reregistration_refusal(*, role: str, old_mode: int, new_mode: int,
                           old_values: RppValues | None = None,
                           new_values: RppValues | None = None) -> str | None:
    """Why a re-registration onto an existing repository is refused, or None
    (docs/semantics.md §2.1 last paragraph).  ``role`` is ``"source"`` or ``"receiver"``;
    modes as :data:`SPP`/:data:`BLOCKING`/:data:`NON_BLOCKING`."""
    if bool(old_mode) != bool(new_mode):
        was, now = ("RPP", "SPP") if old_mode else ("SPP", "RPP")
        return f"previously {was} {role} re-registers as {now}"
    if role == "receiver" and old_mode != new_mode:
        was, now = (("blocking", "non-blocking") if old_mode == BLOCKING
                    else ("non-blocking", "blocking"))
        return f"previously {was} RPP receiver re-registers as {now}"
    if role == "source" and old_values is not None and new_values is not None \
            and old_values != new_values:
        changed = [(o, getattr(old_values, o.field), getattr(new_values, o.field))
                   for o in OVERRIDES
                   if getattr(old_values, o.field) != getattr(new_values, o.field)]
        first, was, now = changed[0]
        return (f"RPP source re-registers with {first.option} {now}, its repository has "
                f"{was}" + (f" (and {len(changed) - 1} more values differ)"
                            if len(changed) > 1 else ""))
    return None


def check_mode(role: str, value: int, rpp_supported: bool) -> None:
    """A source's or receiver's ``ume_receiver_paced_persistence`` must be a mode its product
    knows: sources 0 or 1, receivers 0, 1 or 2; 0 only before 5.3.  ValueError otherwise."""
    modes = ((SPP, BLOCKING, NON_BLOCKING) if role == "receiver" else (SPP, BLOCKING)) \
        if rpp_supported else (SPP,)
    if value not in modes:
        raise ValueError(f"{role} {RPP_OPTION} {value}: expected one of "
                         f"{', '.join(map(str, modes))}"
                         + ("" if rpp_supported else
                            " (the profile predates receiver-paced persistence, 5.3)"))


def receiver_mode(w_flag: int, options: Iterable[CfgOpt]) -> int:
    """A receiver registration's mode: the RPP flag, and for a non-blocking receiver its
    ``ume_receiver_paced_persistence 2`` option.  :class:`RppRefused` for garbled or
    contradictory input (an unknown option, a mode option without the flag or other than
    1 or 2)."""
    mode = BLOCKING if w_flag else SPP
    seen = False
    for option in options:
        if option.scope != CfgScope.RECEIVER or option.name != RPP_OPTION:
            raise RppRefused(f"garbled RPP option: unexpected receiver option {option.name!r}",
                             option.name)
        if seen:
            raise RppRefused(f"garbled RPP option: {RPP_OPTION} given twice", RPP_OPTION)
        seen = True
        value = _integer(option)
        if not w_flag or value not in (BLOCKING, NON_BLOCKING):
            raise RppRefused(f"contradictory RPP registration: {RPP_OPTION} {value} with the "
                             f"RPP flag {'set' if w_flag else 'clear'}", RPP_OPTION)
        mode = value
    return mode


def source_options(config: Any) -> list[CfgOpt]:
    """The configuration options an RPP source's PREG carries: each override it sets
    (non-zero), in :data:`OVERRIDES` order.  ``config`` has the option names as attributes
    (``SourceConfig``/``SourceOptions``)."""
    out = []
    for override in OVERRIDES:
        value = int(getattr(config, override.option, 0) or 0)
        if value:
            out.append(CfgOpt(CfgScope.SOURCE, override.option, str(value)))
    return out


def receiver_options(mode: int) -> list[CfgOpt]:
    """The configuration options a receiver's PREG carries for its mode."""
    if mode == NON_BLOCKING:
        return [CfgOpt(CfgScope.RECEIVER, RPP_OPTION, str(NON_BLOCKING))]
    return []


def parse_options(message: Any) -> list[CfgOpt]:
    """The configuration options of a registration message (:func:`wire.lbmc.cfgopts`), a
    garbled one turned into :class:`RppRefused`."""
    from wire.lbmc import cfgopts

    try:
        return cfgopts(message)
    except WireError as exc:
        raise RppRefused(f"garbled RPP option: {exc}") from None


# --- the guide's compatibility matrix ----------------------------------------------------------


class Outcome(Enum):
    """A cell of the "UMP Version RPP Compatibility Matrix"."""

    GRANTED = "Granted"
    REJECTED = "Rejected"
    SOURCE_ERROR = "Granted - Source Error"
    RECEIVER_ERROR = "Granted - Receiver Error"


CLIENT_KINDS = ("pre-5.3 source", "5.3 RPP source", "5.3 non-RPP source",
                "pre-5.3 receiver", "5.3 RPP receiver", "5.3 non-RPP receiver")
"""The matrix's rows, in the guide's order."""

STORE_KINDS = ("pre-5.3 store", "5.3 RPP store", "5.3 non-RPP store")
"""The matrix's columns, in the guide's order."""


@dataclass(frozen=True)
class Cell:
    """One cell: who registers, with what store, and the outcome the guide gives.

    Attributes:
        client: one of :data:`CLIENT_KINDS`.
        store: one of :data:`STORE_KINDS`.
        outcome: the guide's outcome.
        reregistration: the guide's asterisk: the cell is about a source re-registering onto
            an existing repository ("the source determines the repository's behavior for new
            registrations").
    """

    client: str
    store: str
    outcome: Outcome
    reregistration: bool

    @property
    def label(self) -> str:
        return self.outcome.value + (" *" if self.reregistration else "")


_G, _R = Outcome.GRANTED, Outcome.REJECTED
MATRIX: tuple[Cell, ...] = tuple(
    Cell(client, store, outcome, star)
    for client, row in (
        ("pre-5.3 source", ((_G, False), (_R, True), (_G, True))),
        ("5.3 RPP source", ((Outcome.SOURCE_ERROR, False), (_G, True), (_R, True))),
        ("5.3 non-RPP source", ((_G, False), (_R, True), (_G, True))),
        ("pre-5.3 receiver", ((_G, False), (_R, False), (_G, False))),
        ("5.3 RPP receiver", ((Outcome.RECEIVER_ERROR, False), (_G, False), (_R, False))),
        ("5.3 non-RPP receiver", ((_G, False), (_R, False), (_G, False))),
    )
    for store, (outcome, star) in zip(STORE_KINDS, row, strict=True)
)
"""The 18 cells of the guide's matrix, row by row."""


def cell(client: str, store: str) -> Cell:
    return next(c for c in MATRIX if c.client == client and c.store == store)
