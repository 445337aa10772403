"""IUT profiles: which implementation is under test, and how the harness reaches or starts it.

A profile is a small TOML file::

    [iut]
    name = "acme store 2.1"
    role = "store"                 # store | source | receiver
    version = "current"            # UM defaults: "current", "guide-5.3" (docs/semantics.md §8)
                                   # or "pre-5.3" (a UMP before 5.3: no RPP)
    # either start it for every case ...
    launch = "/opt/acme/bin/umestored {config}"
    ready = "ready to accept registrations"   # text its output prints once it serves
    # ... or reach one that is already running (cases needing a restart become unsupported)
    # address = "10.0.0.5:14567"

    [cases]
    "REG-STORE-007" = { skip = "we do not support static RegIDs" }
    "REC-STORE-003" = { known_failure = "ACME-1234" }

Placeholders in ``launch`` (the harness fills them per case): ``{python}`` (this
interpreter), ``{config}`` (for a store, the umestored XML the harness wrote for the case; for a
source or receiver, the UM configuration file), ``{lbm_config}`` (the UM configuration file:
resolution through the harness and, for a source, ``ume_store`` lines naming the harness's
stores), ``{workdir}``, ``{port}`` (the store port), ``{resolver}`` (``host:port`` of the
harness's resolver daemon), ``{topic}``, ``{version}`` (the profile's UM version profile),
``{stores}`` (the harness stores of the case, ``host:port,host:port``) and ``{deliveries}``
(a file a receiver appends every delivered message to, one JSON object per line with
``"sqn"`` and ``"rx"``; without it the delivery-order checks are unsupported) and ``{acks}``
(a file the harness appends the sequence numbers a receiver's application acknowledges to, see
``explicit_ack_args``).  ``launch`` is
split like a shell command line (``shlex``) or may be given as a list.

Relative paths in ``launch`` are relative to the profile file's directory, wherever ``ump
conform`` is run from: the program (the first word) when it contains a ``/``, and every other
word that starts with ``./`` or ``../``, are made absolute when the file is read.  A program
named without a ``/`` is looked up on ``PATH``; other words are passed as written.  The IUT
runs in its work directory (``<out>/iut/<n>/``), where the files the harness writes for it are.

``deregister_signal = "SIGUSR1"`` (source or receiver) names the signal that makes the IUT
deregister from its stores (``lbm_src_ume_deregister``); the deregistration cases are
unsupported without it.

``nonblocking_args = ["--nonblocking"]`` and ``would_block_text = "would block"`` (a source
IUT, both or neither) say how to run the IUT with non-blocking sends and what its output says
when a send returns "would block" (docs/semantics.md §1.7): cases that need non-blocking sends
(SRC-FLT-009) append ``nonblocking_args`` (a list of words, or a command line split like
``launch``, placeholders allowed) to ``launch``, and look for ``would_block_text`` (matched
without regard to case) in what the IUT printed.  Without them those cases are unsupported.

``explicit_ack_args = ["--ack-file", "{acks}"]`` (a receiver IUT) names the words that make the
IUT acknowledge explicitly (``ume_explicit_ack_only`` 1, guide "Explicit Acknowledgments"):
its application acknowledges exactly the sequence numbers the harness appends to the ``{acks}``
file, one a line (``SQN``), each once that message was delivered.  The cases that judge
explicit-ACK mode (the quorum suite's RCV-QRM-*) append them to ``launch``; without them those
cases are unsupported.  ``consume_args = ["--consume-file", "{acks}"]`` (a receiver IUT) names
the words that make its application retain every delivery and consume (delete) exactly the
sequence numbers listed in ``{acks}``, in the order listed (guide "Batching Acknowledgments":
consumption out of order); the case that needs it is unsupported without them.

``web_monitor = true`` (a launched store) has the harness give the store a ``<web-monitor>``
on a free port in its XML; cases that judge what only the store's own statistics show (the
RPP suite's skipped disk writes) read its JSON pages there and do not judge it without one.

``instances = 3`` (a launched store) says how many instances of the store the harness may launch
as one Quorum/Consensus group (the proxy-source suite needs two or three; default 1: those cases
are unsupported).  Each instance gets a work directory, a port and a umestored XML of its own (the
product's format, the case's options), and every instance's ``<lbm-config>`` file names all the
group's stores in ``source ume_store`` lines, from which the product creates its proxy sources
(guide "Proxy Sources"); the launch command is the same, its placeholders filled per instance.

``transport = "lbt-rm"`` (a store IUT; ``tcp``, ``lbt-ru``, ``lbt-rm`` or ``all``) is the
transport the harness's sources send their data on to the store when ``ump conform`` is given
no ``--transport`` (default ``tcp``; :mod:`conformance.udp_transport`).

A store IUT may also be reached at an ``address``; a source or receiver IUT must be launched,
because its configuration names the peers the harness plays for the case.

The RPP compatibility matrix (``--suite rpp-matrix``) needs two kinds of topic at a store: one
that allows receiver-paced persistence and one that does not.  A launched store gets them from
the case's topic options; a store reached at an ``address`` names them with ``rpp_topic`` and
``spp_topic``: topic name prefixes the harness extends to ``<prefix>.<case id>.<n>.<random>``
(so a topic pattern such as ``conform[.]rpp[.].*`` with ``rpp_topic = "conform.rpp"``), the first
on a topic with ``repository-allow-receiver-paced-persistence`` 1 and RPP limits an RPP source
can register with (size threshold above the flight size in bytes), the second with it 0.
Without them the cases that need that kind of topic are ``unsupported``.  ``version =
"pre-5.3"`` declares a store, source or receiver from before UMP 5.3 (it knows nothing of
RPP): the matrix then runs its "Pre-ver. 5.3" column (store) or row (source, receiver) only.

Without ``--iut`` the built-in profile runs the reference store (:data:`REFERENCE_STORE`);
``--iut source`` and ``--iut receiver`` name the reference source and receiver
(:data:`BUILTIN_PROFILES`, :func:`resolve_profile`).
Every mistake is a :class:`ProfileError` naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shlex
import signal
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.verdicts import Role

VERSIONS = ("current", "guide-5.3", "pre-5.3")
"""UM version profiles an IUT may declare (``{version}`` in ``launch``); "pre-5.3" is a UMP
release before receiver-paced persistence."""


class ProfileError(Exception):
    """A profile that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class CaseExpectation:
    """What the profile says about one case: skip it, or expect it to fail (a known bug)."""

    skip: str | None = None
    known_failure: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class IutProfile:
    """A parsed profile; see the module docstring for the file format."""

    name: str
    role: Role
    version: str = "current"
    launch: tuple[str, ...] | None = None
    address: tuple[str, int] | None = None
    ready: str | None = None
    start_timeout: float = 20.0
    stop_signal: signal.Signals = signal.SIGTERM
    deregister_signal: signal.Signals | None = None
    cases: Mapping[str, CaseExpectation] = field(default_factory=dict)
    source: str = "<built-in>"
    transport: str = "tcp"
    rpp_topic: str | None = None
    spp_topic: str | None = None
    web_monitor: bool = False
    nonblocking_args: tuple[str, ...] | None = None
    would_block_text: str | None = None
    explicit_ack_args: tuple[str, ...] | None = None
    consume_args: tuple[str, ...] | None = None
    instances: int = 1

    @property
    def launches(self) -> bool:
        return self.launch is not None

    def expectation(self, case_id: str) -> CaseExpectation:
        return self.cases.get(case_id, CaseExpectation())


REFERENCE_STORE = IutProfile(
    name="ump-harness reference store", role=Role.STORE,
    launch=("{python}", "-m", "ump", "store", "-c", "{config}", "--profile", "{version}"),
    ready="ready to accept registrations", web_monitor=True, instances=3)
"""The default IUT: this project's store, started per case like any third-party store (with
its web monitor)."""

REFERENCE_SOURCE = IutProfile(
    name="ump-harness reference source", role=Role.SOURCE,
    launch=("{python}", "-m", "ump", "source", "-c", "{lbm_config}", "--topic", "{topic}",
            "--count", "100000000", "--rate", "50", "--linger", "0", "--profile", "{version}"),
    deregister_signal=signal.SIGUSR1, nonblocking_args=("--nonblocking",),
    would_block_text="would block")
"""This project's source, sending 50 messages a second for as long as a case runs (a case
sees the first data message within one registration round and is never short of traffic);
``--nonblocking`` makes it send like a non-blocking application, which prints "send would
block" the first time a send is refused."""

REFERENCE_RECEIVER = IutProfile(
    name="ump-harness reference receiver", role=Role.RECEIVER,
    launch=("{python}", "-m", "ump", "receiver", "-c", "{lbm_config}", "--topic", "{topic}",
            "--out", "{deliveries}", "--profile", "{version}"),
    deregister_signal=signal.SIGUSR1, explicit_ack_args=("--ack-file", "{acks}"),
    consume_args=("--consume-file", "{acks}"))
"""This project's receiver; it reports every delivered message in ``{deliveries}``,
deregisters on SIGUSR1 and, with ``--ack-file {acks}``, acknowledges only what the harness
writes to ``{acks}`` (with ``--consume-file {acks}``, consumes only what it lists)."""

BUILTIN_PROFILES: dict[str, IutProfile] = {
    "default": REFERENCE_STORE, "store": REFERENCE_STORE, "source": REFERENCE_SOURCE,
    "receiver": REFERENCE_RECEIVER}
"""Profile names ``--iut`` accepts besides a file: the reference implementation's processes."""

_IUT_KEYS = ("name", "role", "version", "launch", "address", "ready", "start_timeout",
             "stop_signal", "deregister_signal", "rpp_topic", "spp_topic", "web_monitor",
             "nonblocking_args", "would_block_text", "explicit_ack_args", "consume_args",
             "instances", "transport")
_CASE_KEYS = ("skip", "known_failure", "reason")
TRANSPORT_CHOICES = ("tcp", "lbt-ru", "lbt-rm", "all")
"""What ``transport`` may say (the transports of :mod:`conformance.udp_transport`, or all)."""


def _unknown(where: str, key: str, known: tuple[str, ...]) -> ProfileError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
    return ProfileError(f"{where}: unknown key {key!r}{hint}")


def _address(where: str, text: Any) -> tuple[str, int]:
    if not isinstance(text, str) or text.count(":") != 1:
        raise ProfileError(f"{where}: address must be \"host:port\", not {text!r}")
    host, port = text.rsplit(":", 1)
    if not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ProfileError(f"{where}: address must be \"host:port\" with a port 1-65535, "
                           f"not {text!r}")
    return host, int(port)


def parse_profile(data: Mapping[str, Any], source: str = "<profile>") -> IutProfile:
    """A profile from parsed TOML (``source`` names the file in errors)."""
    for key in data:
        if key not in ("iut", "cases"):
            raise _unknown(source, key, ("iut", "cases"))
    iut = data.get("iut")
    if not isinstance(iut, Mapping):
        raise ProfileError(f"{source}: needs an [iut] table (role and launch or address)")
    for key in iut:
        if key not in _IUT_KEYS:
            raise _unknown(f"{source} [iut]", key, _IUT_KEYS)
    where = f"{source} [iut]"
    try:
        role = Role(iut.get("role", ""))
    except ValueError:
        raise ProfileError(f"{where}: role must be one of store, source, receiver, "
                           f"not {iut.get('role')!r}") from None
    version = iut.get("version", "current")
    if version not in VERSIONS:
        raise ProfileError(f"{where}: version must be one of {', '.join(VERSIONS)}, "
                           f"not {version!r}")
    launch_raw = iut.get("launch")
    launch: tuple[str, ...] | None = None
    if isinstance(launch_raw, str):
        try:
            launch = tuple(shlex.split(launch_raw))
        except ValueError as exc:
            raise ProfileError(f"{where}: launch: {exc}") from None
    elif isinstance(launch_raw, list) and all(isinstance(x, str) for x in launch_raw):
        launch = tuple(launch_raw)
    elif launch_raw is not None:
        raise ProfileError(f"{where}: launch must be a command line or a list of strings")
    if launch is not None and not launch:
        raise ProfileError(f"{where}: launch is empty")
    address = _address(f"{where} address", iut["address"]) if "address" in iut else None
    if (launch is None) == (address is None):
        raise ProfileError(f"{where}: give exactly one of launch (start the IUT per case) "
                           f"or address (reach a running IUT)")
    if address is not None and role is not Role.STORE:
        raise ProfileError(f"{where}: a {role.value} IUT needs launch, not address (the "
                           f"harness writes its configuration to name the peers it plays)")
    if launch is not None:
        bad = _bad_placeholder(launch)
        if bad:
            raise ProfileError(f"{where}: launch uses unknown placeholder {{{bad}}} "
                               f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    timeout = iut.get("start_timeout", 20.0)
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ProfileError(f"{where}: start_timeout must be a positive number of seconds")
    stop_signal = _signal(where, "stop_signal", iut.get("stop_signal", "SIGTERM"))
    deregister_signal = None
    if "deregister_signal" in iut:
        if role == Role.STORE:
            raise ProfileError(f"{where}: deregister_signal is for a source or receiver IUT")
        deregister_signal = _signal(where, "deregister_signal", iut["deregister_signal"])
    web_monitor = iut.get("web_monitor", False)
    if not isinstance(web_monitor, bool):
        raise ProfileError(f"{where}: web_monitor must be true or false")
    if web_monitor and (role is not Role.STORE or launch is None):
        raise ProfileError(f"{where}: web_monitor is for a launched store IUT (the harness "
                           f"writes its <web-monitor> into the store's XML)")
    ready = iut.get("ready")
    if ready is not None and not isinstance(ready, str):
        raise ProfileError(f"{where}: ready must be a text")
    topics: dict[str, str | None] = {}
    for key in ("rpp_topic", "spp_topic"):
        value = iut.get(key)
        if value is not None:
            if role is not Role.STORE or address is None:
                raise ProfileError(f"{where}: {key} is for a store IUT reached at an address "
                                   f"(a launched store gets the harness's topic options)")
            if not isinstance(value, str) or not value.strip() or value != value.strip():
                raise ProfileError(f"{where}: {key} must be a topic name prefix such as "
                                   f"\"conform.rpp\", not {value!r}")
        topics[key] = value
    if topics["rpp_topic"] is not None and topics["rpp_topic"] == topics["spp_topic"]:
        raise ProfileError(f"{where}: rpp_topic and spp_topic must differ (one topic allows "
                           f"RPP, the other does not)")
    nonblocking_args, would_block_text = _nonblocking(where, iut, role)
    explicit_ack_args = _explicit_ack(where, iut, role)
    consume_args = _explicit_ack(where, iut, role, "consume_args")
    instances = _instances(where, iut, role, launch is not None)
    name = iut.get("name", role.value)
    transport = iut.get("transport", "tcp")
    if transport not in TRANSPORT_CHOICES:
        raise ProfileError(f"{where}: transport must be one of {', '.join(TRANSPORT_CHOICES)}, "
                           f"not {transport!r}")
    if transport != "tcp" and role is not Role.STORE:
        raise ProfileError(f"{where}: transport is for a store IUT (the harness's sources "
                           f"send to a store on it)")
    cases: dict[str, CaseExpectation] = {}
    raw_cases = data.get("cases", {})
    if not isinstance(raw_cases, Mapping):
        raise ProfileError(f"{source}: [cases] must be a table")
    for case_id, spec in raw_cases.items():
        cwhere = f"{source} [cases] {case_id}"
        if not isinstance(spec, Mapping):
            raise ProfileError(f"{cwhere}: must be a table like {{ skip = \"why\" }}")
        for key in spec:
            if key not in _CASE_KEYS:
                raise _unknown(cwhere, key, _CASE_KEYS)
        if ("skip" in spec) == ("known_failure" in spec):
            raise ProfileError(f"{cwhere}: give exactly one of skip or known_failure")
        cases[case_id] = CaseExpectation(skip=spec.get("skip"),
                                         known_failure=spec.get("known_failure"),
                                         reason=str(spec.get("reason", "")))
    return IutProfile(name=str(name), role=role, version=version, launch=launch,
                      address=address, ready=ready, start_timeout=float(timeout),
                      stop_signal=stop_signal, deregister_signal=deregister_signal,
                      cases=cases, source=source, rpp_topic=topics["rpp_topic"],
                      spp_topic=topics["spp_topic"], web_monitor=web_monitor,
                      transport=transport,
                      nonblocking_args=nonblocking_args, would_block_text=would_block_text,
                      explicit_ack_args=explicit_ack_args, consume_args=consume_args,
                      instances=instances)


def _instances(where: str, iut: Mapping[str, Any], role: Role, launched: bool) -> int:
    """``instances`` (see the module docstring), checked: a whole number from 1 for a
    launched store (the harness can start more of a store only when it starts it at all)."""
    if "instances" not in iut:
        return 1
    value = iut["instances"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProfileError(f"{where}: instances must be a whole number from 1, not {value!r}")
    if value > 1 and (role is not Role.STORE or not launched):
        raise ProfileError(f"{where}: instances is for a launched store IUT (the harness "
                           f"starts the group's instances itself)")
    return value


def _nonblocking(where: str, iut: Mapping[str, Any], role: Role
                 ) -> tuple[tuple[str, ...] | None, str | None]:
    """``nonblocking_args`` and ``would_block_text`` (see the module docstring), checked: a
    source's keys, both or neither (the one is no use without the other), a non-empty list of
    words with known placeholders and a non-blank text."""
    given = [key for key in ("nonblocking_args", "would_block_text") if key in iut]
    if not given:
        return None, None
    if role is not Role.SOURCE:
        raise ProfileError(f"{where}: {given[0]} is for a source IUT (non-blocking sends)")
    if len(given) == 1:
        missing = ({"nonblocking_args", "would_block_text"} - set(given)).pop()
        raise ProfileError(f"{where}: {given[0]} needs {missing} as well (how to run the IUT "
                           f"with non-blocking sends, and what it prints on \"would block\")")
    raw = iut["nonblocking_args"]
    args: tuple[str, ...]
    if isinstance(raw, str):
        try:
            args = tuple(shlex.split(raw))
        except ValueError as exc:
            raise ProfileError(f"{where}: nonblocking_args: {exc}") from None
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        args = tuple(raw)
    else:
        raise ProfileError(f"{where}: nonblocking_args must be a list of strings such as "
                           f"[\"--nonblocking\"] or a command line, not {raw!r}")
    if not args:
        raise ProfileError(f"{where}: nonblocking_args is empty (the words that make the IUT "
                           f"send without blocking)")
    bad = _bad_placeholder(args)
    if bad:
        raise ProfileError(f"{where}: nonblocking_args uses unknown placeholder {{{bad}}} "
                           f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    text = iut["would_block_text"]
    if not isinstance(text, str) or not text.strip():
        raise ProfileError(f"{where}: would_block_text must be the text the IUT prints when "
                           f"a send returns \"would block\", not {text!r}")
    return args, text


def _explicit_ack(where: str, iut: Mapping[str, Any], role: Role,
                  key: str = "explicit_ack_args") -> tuple[str, ...] | None:
    """``explicit_ack_args`` or ``consume_args`` (``key``; see the module docstring),
    checked: a receiver's key, a non-empty list of words (or a command line) with known
    placeholders that names the ``{acks}`` file (else the harness could not say what the
    application acknowledges or consumes)."""
    if key not in iut:
        return None
    if role is not Role.RECEIVER:
        raise ProfileError(f"{where}: {key} is for a receiver IUT (what its application "
                           f"acknowledges or consumes)")
    raw = iut[key]
    args: tuple[str, ...]
    if isinstance(raw, str):
        try:
            args = tuple(shlex.split(raw))
        except ValueError as exc:
            raise ProfileError(f"{where}: {key}: {exc}") from None
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        args = tuple(raw)
    else:
        raise ProfileError(f"{where}: {key} must be a list of strings such as "
                           f"[\"--ack-file\", \"{{acks}}\"] or a command line, not {raw!r}")
    if not args:
        raise ProfileError(f"{where}: {key} is empty (the words that make the IUT's "
                           f"application act on what the {{acks}} file lists)")
    bad = _bad_placeholder(args)
    if bad:
        raise ProfileError(f"{where}: {key} uses unknown placeholder {{{bad}}} "
                           f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    if not any("{acks}" in arg for arg in args):
        raise ProfileError(f"{where}: {key} must name the {{acks}} file (where the harness "
                           f"writes what the application acknowledges or consumes)")
    return args


def _signal(where: str, key: str, name: object) -> signal.Signals:
    try:
        return signal.Signals[str(name).upper()]
    except KeyError:
        raise ProfileError(f"{where}: {key} {name!r} is not a signal name") from None


PLACEHOLDERS = ("python", "config", "lbm_config", "workdir", "port", "resolver", "topic",
                "version", "stores", "deliveries", "acks")


def _bad_placeholder(argv: tuple[str, ...]) -> str | None:
    import string

    for arg in argv:
        for _, name, _, _ in string.Formatter().parse(arg):
            if name is not None and name not in PLACEHOLDERS:
                return name
    return None


def load_profile(path: str | Path) -> IutProfile:
    """Read a profile file; :class:`ProfileError` for anything wrong, with the file named."""
    name = str(path)
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ProfileError(f"{name}: cannot read the profile: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{name}: not valid TOML: {exc}") from None
    profile = parse_profile(data, name)
    if profile.launch is None:
        return profile
    base = Path(path).resolve().parent
    return dataclasses.replace(profile, launch=anchor_launch(profile.launch, base))


def anchor_launch(launch: tuple[str, ...], base: Path) -> tuple[str, ...]:
    """``launch`` with its relative paths made absolute from ``base`` (the rule is in the
    module docstring).  Why: the IUT runs in its own work directory, so a path the user wrote
    relative to the profile would otherwise name a file there."""
    def anchored(index: int, word: str) -> str:
        relative = word.startswith(("./", "../")) or (index == 0 and "/" in word
                                                       and not word.startswith(("/", "{")))
        return os.path.normpath(base / word) if relative else word
    return tuple(anchored(i, word) for i, word in enumerate(launch))


def resolve_profile(text: str | None) -> IutProfile:
    """``--iut``: a built-in name (:data:`BUILTIN_PROFILES`) or a profile file; none = the
    reference store.  An existing file wins over a built-in name of the same spelling."""
    if not text:
        return REFERENCE_STORE
    if text in BUILTIN_PROFILES and not Path(text).is_file():
        return BUILTIN_PROFILES[text]
    if not Path(text).exists() and "." not in Path(text).name:
        close = difflib.get_close_matches(text, list(BUILTIN_PROFILES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ProfileError(f"{text}: no such profile file, and not a built-in profile name "
                           f"({', '.join(BUILTIN_PROFILES)}){hint}")
    return load_profile(text)
