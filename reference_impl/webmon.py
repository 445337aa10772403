"""The store web monitor of the reference daemon (docs/semantics.md §4; the guide's "Web Monitor").

umestored serves a small read-only HTML monitor (``<web-monitor>Address:Port</web-monitor>``).
Operators read it and tools scrape it (UltraMessaging's ``store_scraper`` greps the pages line by
line), so :class:`WebMonitor` reproduces the product's URL layout and the HTML fragments those
tools match, and adds a JSON form of every page for tools written today.

URL layout (a number is decimal ASCII; repeated or trailing ``/`` are ignored, because
``store_scraper`` fetches ``$W/$HREF`` and so asks for ``//stores/0``):

=====================================  ========================================================
``/``                                  index: banner and version, build line, time, "Stores"
``/stores``                            ``Store N:<A HREF="/stores/N">name</A>`` per store
``/stores/<n>``                        store page (``<H3>Store N: name</H3>``, rates, topics)
``/stores/<n>/reset``                  "Reset Rate Stats": POST zeroes the rate-calculation
                                       seconds; GET shows the form that POSTs it
``/stores/<n>/<src-regid>``            source page (``<H3>REGID: Source [...]</H3>``, Window...)
``/stores/<n>/<src-regid>/<rcv-regid>``  receiver page (``ACK: <hex>``)
=====================================  ========================================================

**JSON.**  Append ``?format=json`` to any URL (``?format=html`` is the default).  The JSON
object holds exactly the values the HTML shows, in their native types (integers where the HTML
prints hex, Unix times where it prints clock times, ``null`` where it prints ``-``), plus the
``href`` of every link, so a tool can crawl the JSON alone.  A query string was chosen over a
``/json`` path suffix because it leaves the product's URL space alone (``/stores/<n>/json``
would sit where RegIDs go) and needs no second route per page.  Any other query parameter is
a 400: a typo must not silently give HTML.

**Fields the store core does not model.**  Pages show what :meth:`StoreCore.snapshot` and the
core's public ``sources`` give.  Values this reference store has no counterpart for are left
out rather than printed as invented zeros: the source page has no "In Progress", "Active ULBs"
or "Loss" line (writes are synchronous and the store never sees unrecoverable loss on LBT-TCP),
and "LBM Stats" carries only the source string of the transport the store receives the source
on (:func:`source_string`: ``TCP:ip:port`` or ``LBT-RU:ip:port:<session ID %08x>``; the store
keeps no LBT-TCP session ID, so TCP strings have none), because the core counts no
per-transport messages, bytes, duplicates or NAKs.  "Sync" is derived: disk writes
reach the OS before the store acknowledges, so the completed and submitted sync SQNs are both
the newest SQN held (for a memory repository "held" is all the persistence there is), and
``contig_sqn`` is the end of the gap-free run starting at the trail.  "Drops" shows
``0 / total``: intentional drops happen synchronously, so none is ever in progress.  "Disk
Writes Skipped" (JSON ``disk_writes_skipped``) is this store's own line, not the product's: the
RPP messages that every blocking receiver consumed before their write delay ended, so they
were never written to the cache file (the guide's "Receiver Acknowledgement").  Memory
repositories show a two-value Window ``[trail, lead]`` as the product does; disk repositories
show ``[trail, mem_trail, lead]``.  "Last Activity" converts the core's clock to wall-clock time
of day (``HH:MM:SS.ffffff``, local time).  Source and receiver pages add a ``State:
active|inactive`` line (an expired client whose state is still kept).  A title's ``IP.port`` is
the request address the client's registration announced; a client that announced port 0 (a
third-party client without a request port; ``ump source`` and ``ump receiver`` always announce
theirs) is shown at the address its registration connection comes from, where the store really
reaches it.

**Proxy sources.**  The store page adds a "Proxy Sources" section of this monitor's own (the
product's pages show none; guide "Proxy Sources", docs/semantics.md §1.11): whether the store
allows proxy sources, their port, the group it elects in, and per watched source where its
election stands here (``active``, ``waiting``, ``proxy`` when this store runs it,
``following`` another store's), the index of the store running the proxy and this store's
election token.  JSON: ``proxy_sources``.

**Threading.**  There is none.  The HTTP server runs on the asyncio loop that drives the cores
(:class:`reference_impl.aio.AioHost` calls into a core only from loop callbacks), and a page is
built in one synchronous stretch with no ``await`` in between, so it needs no lock (the
product's monitor thread takes a lock and slows message processing; here a store costs the
loop at most one snapshot per ``max_age``, see "Load").  A page shows the store's snapshot,
which is at most ``max_age`` old, plus two live reads cut to fit it (the contiguous run of the
Sync line, the connection address of a client that announced port 0).  Do not hand this
monitor cores that another thread drives.  "Reset Rate Stats" calls
:meth:`StoreCore.reset_rate_stats` the same way.

**Reset Rate Stats is a POST.**  The product's store page links to ``/stores/<n>/reset`` and a
plain GET resets, so a prefetching browser, a crawler or any page on the web (an ``<IMG>``
pointing at the monitor) could reset the statistics.  Here GET and HEAD never change state:
the store page (and a GET of the reset URL, for old bookmarks) carries a form that POSTs
``token=<form token>`` (``application/x-www-form-urlencoded``) to the reset URL, and only that
POST resets.  Cross-site request forgery is refused in two ways: the form token is a random
value drawn when the monitor starts, which a page of another origin cannot read (the
same-origin policy; no CORS header is ever sent), and a request whose ``Origin`` is not this
monitor (``http://`` + its ``Host``) or whose ``Sec-Fetch-Site`` says ``cross-site`` or
``same-site`` is refused whatever its token.  Refusals are 403; a POST to any other page is
405.  Tools read the token from the store page's JSON (``reset.token``).  Not covered: DNS
rebinding (a hostile name resolved to the monitor's address makes the attacker's page same
origin); the monitor has no authentication at all, so bind it to loopback or a management
network, and the worst a forged reset does is restart the rate averages.

**HTTP.**  A deliberately small HTTP/1.1 server on :func:`asyncio.start_server`: GET and HEAD,
POST only to the reset URL (405 with ``Allow`` otherwise), 404 for unknown paths, 400 for
malformed requests (bad request line, bad header syntax, obsolete line folding, missing or
repeated ``Host`` on HTTP/1.1, bad percent-escape, a body on anything but POST, chunked
bodies, unknown query parameters), 411/413/415 for a POST body without a length, over
:attr:`HttpLimits.body_bytes` or not a form, 414/431 over the size limits
(:class:`HttpLimits`), 505 for other HTTP versions.
Keep-alive is supported on HTTP/1.1; any error response closes the connection.  Paths are only
ever matched against the routes above: nothing is read from the filesystem, so there is no path
to traverse (the product's monitor had such a hole, docs/semantics.md §4).  Responses carry
``Cache-Control: no-store``, ``X-Content-Type-Options: nosniff`` and a
``Content-Security-Policy`` that forbids scripts; every user-supplied string (topic names!) is
HTML-escaped, control characters included, so a topic cannot break the page or the
one-field-per-line layout scrapers depend on.

**Load.**  A monitor that serves a fixed number of connections and waits long for each
request head is easy to lock out: the old limits (64 connections, 10 s per head) let 64
slowloris clients, or a flood of ordinary ones, answer every operator with 503.  Now:

* a request head must be complete within :attr:`HttpLimits.header_timeout` (2 s) of when the
  monitor starts waiting for it, however the client spreads its bytes;
* a new connection is never refused for a connection that is merely waiting: over the
  per-address cap (:attr:`HttpLimits.max_per_client`) the address's own least valuable
  connection is reset, over the total cap (:attr:`HttpLimits.max_connections`) that of the
  address holding the most connections.  Least valuable is a connection lingering after its
  last response, then an idle keep-alive one, then one still waiting for its first request
  head, oldest first; an operator's fresh connection from another address is never the one
  to go.  Only when every connection is writing a response is the new one answered 503;
* pages are answered from a snapshot: a store is snapshotted at most once per ``max_age``
  (0.5 s; a snapshot walks every source and receiver, about 20 ms for 2,000 sources) and a
  page built from it is served again for that long, so the loop time monitoring takes from
  the stores is bounded whatever the request rate.  Pages are at most ``max_age`` old; the
  reset POST drops every snapshot and page, so the page after it is fresh.

Measured on loopback (``tests/reference_impl/test_webmon_load.py``, 2-core machine with a load
average of 6-10 from other work): with 200 slowloris clients and 200 clients fetching ``/``
back to back, an operator's six page fetches took at most 0.37 s with the default limits (all
clients on 127.0.0.1; the flood got about 2,000 pages meanwhile), and at most 0.15 s with caps
of 64 connections and 16 per address and the attackers on other addresses (about 3,000
evictions).  With the old limits every one of the operator's fetches got 503.  Clients that
share an address with an attacker (NAT, or everyone on loopback) share its per-address cap.

**Address.**  ``address`` is the XML ``web-monitor`` value, ``Address:Port`` or ``*:Port``
(``str()`` of :class:`reference_impl.config.store_xml.WebMonitorAddress` fits); ``*`` binds all
interfaces (0.0.0.0) and must be asked for explicitly: the default is ``127.0.0.1:0`` because
the monitor has no authentication.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import ipaddress
import json
import logging
import re
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

from reference_impl.repository import Repository
from reference_impl.store import Client, StoreCore
from wire.lbmr import TransportType

__all__ = [
    "PRODUCT",
    "HttpLimits",
    "Response",
    "WebMonitor",
    "clock_time",
    "parse_address",
    "source_string",
]

log = logging.getLogger(__name__)

PRODUCT = "UltraMessaging Persistent Store"
RESET_MESSAGE = "Rate Statistics have been reset"
DOMAIN_ID = 0  # the reference implementation has no UM domain IDs
READ_METHODS = ("GET", "HEAD")
ACTION_METHODS = (*READ_METHODS, "POST")  # the methods of an action URL (reset)
FORM_TYPE = "application/x-www-form-urlencoded"
LINGER_SECONDS = 1.0  # after a response that closes the connection, see WebMonitor._linger
LINGER_BYTES = 1 << 20
PAGE_CACHE_ENTRIES = 1024  # built pages kept for WebMonitor.max_age (a few MB at most)

StoreList = Sequence[StoreCore] | Callable[[], Sequence[StoreCore]]

_REASONS = {
    200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 411: "Length Required", 413: "Content Too Large",
    414: "URI Too Long", 415: "Unsupported Media Type", 431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable", 505: "HTTP Version Not Supported",
}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/([0-9])\.([0-9])")
_TARGET_CHARS = re.compile(r"[\x21-\x7e]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_NUMBER = re.compile(r"[0-9]{1,10}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# --- addresses -----------------------------------------------------------------------------


def parse_address(text: str) -> tuple[str, int]:
    """``Address:Port`` / ``*:Port`` / ``[v6]:Port`` -> (host, port); ``*`` is 0.0.0.0.

    Port 0 asks the kernel for a free port (tests).  Raises ValueError with the reason.
    """
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"web monitor address {text!r} must be Address:Port or *:Port")
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"web monitor port {port_text!r} must be a number 0-65535")
    if host == "*":
        return "0.0.0.0", int(port_text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"web monitor address {host!r} must be an IP address or * (all interfaces)"
        ) from None
    return host, int(port_text)


# --- formatting ----------------------------------------------------------------------------


def _control_ref(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "&#xFFFD;" if code == 0 else f"&#{code};"


def esc(value: object) -> str:
    """HTML-escape a value, quotes and control characters too: a topic name with a newline
    must not split a line that scrapers read as one field."""
    return _CONTROL.sub(_control_ref, html.escape(str(value), quote=True))


def hex_or_dash(value: int | None) -> str:
    return "-" if value is None else format(value, "x")


def clock_time(epoch: float | None) -> str:
    """A Unix time as the monitor's time of day (``HH:MM:SS.ffffff``, local time)."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch).strftime("%H:%M:%S.%f")


def _dotted(addr: str) -> str:
    """``ip:port`` as the product writes it in page titles: ``ip.port``."""
    ip, _, port = addr.rpartition(":")
    return f"{ip}.{port}"


SOURCE_STRING_LABELS = {TransportType.TCP: "TCP", TransportType.LBTRU: "LBT-RU"}
"""How a UM source string names each transport the store can receive (wire-transports: taps
and statistics write ``TCP:ip:port[:sid]`` and ``LBT-RU:ip:port[:sid]``)."""


def source_string(kind: TransportType, addr: str, session_id: int) -> str:
    """A transport as UM source strings write it: ``LABEL:ip:port``, plus ``:<session ID as
    %08x>`` when the session ID is not 0.  A transport without a label (the store joins only
    LBT-TCP and LBT-RU) is named by its TIR type name."""
    label = SOURCE_STRING_LABELS.get(kind, TransportType(kind).name)
    return f"{label}:{addr}" + (f":{session_id:08x}" if session_id else "")


def _request_addr(announced: str, client: Client | None) -> str:
    """The ``ip:port`` a page title shows for a client: the request address its registration
    announced or, when that names port 0 (a client with no request port, as ``ump receiver``),
    the address its registration connection comes from, which is where the store really
    reaches it.  Port 0 is only shown when the store no longer has that connection."""
    if not announced.endswith(":0") or client is None or client.conn is None:
        return announced
    ip, port = client.conn.remote
    return f"{ip}:{port}"


def _sqn_list(values: dict[str, int | None]) -> str:
    return "[" + ", ".join(hex_or_dash(v) for v in values.values()) + "]"


# --- responses -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    """One HTTP response, before serialisation."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class HttpError(Exception):
    """A request the server refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


@dataclass(frozen=True)
class Page:
    """A page as data (the JSON form) and as HTML (rendered from that data only)."""

    title: str
    data: dict[str, Any]
    body: list[str]


@dataclass(frozen=True)
class HttpLimits:
    """Bounds that keep a misbehaving client from costing the store's loop memory or time.

    Attributes:
        request_line: longest request line (bytes, without CRLF); beyond it 414.
        header_line: longest header line; beyond it 431.
        header_bytes: all header lines together; beyond it 431.
        header_count: number of header lines; beyond it 431.
        header_timeout: seconds from when the monitor starts waiting for a request (the
            connection's accept, or the end of the previous response on a keep-alive
            connection) until the whole head is in: a total, not a per-read, deadline, so a
            client trickling a byte at a time gets no longer than a silent one.  Then the
            connection is closed.
        write_timeout: seconds a response may take to drain to a slow reader.
        max_connections: concurrent connections.  A new connection beyond it does not get
            refused: the least valuable connection goes instead (see "Load" in the module
            docstring); only when every connection is busy writing a response is the new one
            answered 503.  The effective cap is also at most a quarter of the process's file
            descriptor limit, so the monitor cannot starve the store of sockets.
        max_per_client: concurrent connections from one client IP address; a new one beyond
            it replaces that address's own least valuable connection.
        max_requests: requests served on one keep-alive connection.
        body_bytes: longest POST body (the reset form is about 40 bytes); beyond it 413.
    """

    request_line: int = 8192
    header_line: int = 8192
    header_bytes: int = 32768
    header_count: int = 100
    header_timeout: float = 2.0
    write_timeout: float = 10.0
    max_connections: int = 1024
    max_per_client: int = 512
    max_requests: int = 1000
    body_bytes: int = 1024


@dataclass(eq=False)
class _Conn:
    """One open client connection as the admission logic sees it.

    ``state`` is what the connection waits for: ``head`` (a request head; ``served`` tells a
    new connection from an idle keep-alive one), ``write`` (a response to drain) or
    ``linger`` (the client to close after the last response); ``since`` is when it entered
    that state (``time.monotonic``).
    """

    task: asyncio.Task[None]
    writer: asyncio.StreamWriter
    client: str
    since: float
    state: str = "head"
    served: int = 0

    def enter(self, state: str) -> None:
        self.state, self.since = state, time.monotonic()

    @property
    def rank(self) -> int:
        """Eviction order: lingering after a final response, idle keep-alive, waiting for
        its first request head (writing a response is never evicted)."""
        if self.state == "linger":
            return 0
        return 1 if self.served else 2


@dataclass
class _Request:
    method: str
    target: str
    version: tuple[int, int]
    headers: list[tuple[str, str]] = field(default_factory=list)

    def header_values(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n == name]

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for v in self.header_values("connection")
                  for t in v.split(",")}
        return self.version >= (1, 1) and "close" not in tokens


# --- the monitor ---------------------------------------------------------------------------


class WebMonitor:
    """Pages over a list of store cores, and the HTTP server that serves them.

    Args:
        stores: the daemon's stores in configuration order (their index is the store number),
            or a callable returning them on every request (for daemons that restart stores).
        version: shown in the banner ("UltraMessaging Persistent Store v<version>").
        address: ``Address:Port`` or ``*:Port`` (see :func:`parse_address`).
        clock: the clock the cores' ``now`` comes from; the default ``time.monotonic`` is what
            asyncio's ``loop.time()`` and so :class:`~reference_impl.aio.AioHost` use.  A
            simulated deployment passes its virtual clock.
        wall_clock: Unix time (shown as the current time and used to convert core times).
        limits: HTTP size and time limits.
        max_age: seconds a store snapshot and the pages built from it are served again
            (real time, ``time.monotonic``); 0 builds every page afresh.  Bounds the loop time
            monitoring costs the stores whatever the request rate (see "Load").
    """

    def __init__(self, stores: StoreList, *, version: str, address: str = "127.0.0.1:0",
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 limits: HttpLimits | None = None, max_age: float = 0.5) -> None:
        self._stores = stores
        self.version = version
        self.host, self.port = parse_address(address)
        self.clock = clock
        self.wall_clock = wall_clock
        self.limits = limits or HttpLimits()
        self.max_age = max_age
        # store index -> (taken at, core, snapshot); (path parts, JSON?) -> (built at, answer)
        self._snapshots: dict[int, tuple[float, StoreCore, dict[str, Any]]] = {}
        self._pages: dict[tuple[tuple[str, ...], bool], tuple[float, Response]] = {}
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], _Conn] = {}
        self._by_client: dict[str, dict[asyncio.Task[None], _Conn]] = {}  # the same, by address
        self._max_connections = self.limits.max_connections
        self.stats: dict[str, int] = {"requests": 0, "errors": 0, "connections": 0,
                                      "evicted": 0, "refused": 0}
        self._form_token = secrets.token_urlsafe(24)  # see "Reset Rate Stats is a POST"

    # --- data ------------------------------------------------------------------------------

    def stores(self) -> Sequence[StoreCore]:
        return self._stores() if callable(self._stores) else self._stores

    def _store(self, number: str) -> tuple[int, StoreCore]:
        stores = self.stores()
        index = int(number)
        if index >= len(stores):
            raise HttpError(404, f"no store {index} (this daemon has {len(stores)})")
        return index, stores[index]

    def _snapshot(self, index: int, core: StoreCore) -> dict[str, Any]:
        """The store's :meth:`StoreCore.snapshot`, taken at most once per ``max_age``."""
        now = time.monotonic()
        cached = self._snapshots.get(index)
        if cached is not None and cached[1] is core and now - cached[0] < self.max_age:
            return cached[2]
        taken: dict[str, Any] = core.snapshot()
        if self.max_age > 0:
            self._snapshots[index] = (now, core, taken)
        return taken

    def _forget(self) -> None:
        """Drop every snapshot and page (after an action changed what they show)."""
        self._snapshots.clear()
        self._pages.clear()

    def _wall(self, core_time: float) -> float:
        """A core time (its ``now`` clock) as Unix time."""
        return self.wall_clock() - (self.clock() - core_time)

    # --- pages -----------------------------------------------------------------------------

    def index_page(self) -> Page:
        now = self.wall_clock()
        build = (f"ump-harness reference implementation, Python "
                 f"{sys.version_info.major}.{sys.version_info.minor}."
                 f"{sys.version_info.micro}")
        data = {"page": "index", "product": PRODUCT, "version": self.version, "build": build,
                "time": now, "stores_href": "/stores"}
        body = [
            f"<H2>{esc(PRODUCT)} v{esc(self.version)}</H2>",
            f"<P>Build: {esc(build)}</P>",
            f"<P>Time: {esc(time.ctime(now))}</P>",
            '<P><A HREF="/stores">Stores</A></P>',
        ]
        return Page(f"{PRODUCT} v{self.version}", data, body)

    def stores_page(self) -> Page:
        entries = [{"index": i, "name": core.settings.name, "href": f"/stores/{i}"}
                   for i, core in enumerate(self.stores())]
        body = [f"<H2>{esc(PRODUCT)}s</H2>", "<UL>"]
        body += [f'<LI>Store {e["index"]}:<A HREF="{esc(e["href"])}">{esc(e["name"])}</A></LI>'
                 for e in entries]
        body.append("</UL>")
        return Page(f"{PRODUCT}s", {"page": "stores", "stores": entries}, body)

    def store_page(self, number: str) -> Page:
        index, core = self._store(number)
        snap = self._snapshot(index, core)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for src in snap["sources"]:
            by_topic.setdefault(src["topic"], []).append({
                "reg_id": src["reg_id"], "session_id": src["session_id"],
                "href": f"/stores/{index}/{src['reg_id']}"})
        data = {
            "page": "store", "store": index, "name": snap["name"],
            "interface": snap["interface"], "cache_dir": snap["cache_dir"],
            "state_dir": snap["state_dir"],
            "retransmission_request_processing_rate": snap["retransmission_rate"],
            "seconds": int(snap["seconds"]),
            "received_rate": round(snap["rx_received_rate"], 6),
            "service_rate": round(snap["rx_service_rate"], 6),
            "drop_rate": round(snap["rx_drop_rate"], 6),
            "total_dropped": snap["rx_total_dropped"],
            "patterns": [{"pattern": p, "type": k} for p, k in snap["patterns"]],
            "topics": [{"topic": t, "sources": s} for t, s in by_topic.items()],
            "proxy_sources": self._proxy_sources(index, snap),
            "reset": self._reset_form(index),
        }
        body = [
            f"<H3>Store {index}: {esc(data['name'])}</H3>",
            "<DL>",
            f"<DD>Interface: {esc(data['interface'])}",
            f"<DD>Cache Dir: {esc(data['cache_dir'])}",
            f"<DD>State Dir: {esc(data['state_dir'])}",
            "<DD>Configured Retransmission Request Processing Rate: "
            f"{data['retransmission_request_processing_rate']}",
            f"<DD>Total seconds used for rate calculations: {data['seconds']}",
            f"<DD>Retransmission Request Received Rate: {data['received_rate']:.6f}",
            f"<DD>Retransmission Request Service Rate: {data['service_rate']:.6f}",
            f"<DD>Retransmission Request Drop Rate: {data['drop_rate']:.6f}",
            f"<DD>Retransmission Request Total Dropped: {data['total_dropped']}",
            f"<DD>Patterns: {len(data['patterns'])}",
        ]
        body += [f'<UL><LI>"{esc(p["pattern"])}", {esc(p["type"])}</UL>'
                 for p in data["patterns"]]
        body.append(f"<DD>Topics: {len(data['topics'])}")
        for topic in data["topics"]:
            # one line per topic, every link followed by a space: store_scraper's loop
            # strips `<A HREF="...">regid(sid)</A> ` repeatedly from `<LI>"topic" -  `
            links = "".join(
                f'<A HREF="{esc(s["href"])}">{s["reg_id"]}({s["session_id"]})</A> '
                for s in topic["sources"])
            body.append(f'<UL><LI>"{esc(topic["topic"])}" -  {links}</UL>')
        body += _proxy_html(data["proxy_sources"])
        body += ["</DL>", _form_html(data["reset"])]
        return Page(f"Store {index}: {data['name']}", data, body)

    def _proxy_sources(self, index: int, snap: dict[str, Any]) -> dict[str, Any]:
        """The store page's "Proxy Sources" (guide "Proxy Sources"; this monitor's own
        section, the product's pages show none): whether the store allows proxy sources,
        their port, the group it elects in and each watched source's election state, with
        the source page's ``href``."""
        proxy = dict(snap.get("proxy") or {"allowed": False, "port": None, "group": [],
                                            "index": None, "sources": []})
        proxy["sources"] = [{**w, "href": f"/stores/{index}/{w['reg_id']}"}
                            for w in proxy["sources"]]
        proxy["running"] = sum(1 for w in proxy["sources"] if w["state"] == "proxy")
        return proxy

    def _reset_form(self, index: int) -> dict[str, Any]:
        return {"href": f"/stores/{index}/reset", "method": "POST",
                "token": self._form_token, "label": "Reset Rate Stats"}

    def reset_form_page(self, number: str) -> Page:
        """GET of the reset URL: the form, no reset (GET is safe; see the module docstring)."""
        index, core = self._store(number)
        name = core.settings.name
        data: dict[str, Any] = {"page": "reset_form", "store": index, "name": name,
                                "reset": self._reset_form(index),
                                "back_href": f"/stores/{index}"}
        body = [f"<H3>Store {index}: {esc(name)}</H3>", _form_html(data["reset"]),
                f'<P><A HREF="/stores/{index}">Back</A></P>']
        return Page(f"Store {index}: {name}", data, body)

    def reset_page(self, number: str, form: dict[str, str]) -> Page:
        """POST of the reset form: reset, if the form carries this monitor's token."""
        index, core = self._store(number)
        token = form.get("token", "")
        if not hmac.compare_digest(token.encode(), self._form_token.encode()):
            raise HttpError(403, "missing or wrong form token (reload the store page)")
        core.reset_rate_stats()
        self._forget()
        name = core.settings.name
        data = {"page": "reset", "store": index, "name": name, "message": RESET_MESSAGE,
                "back_href": f"/stores/{index}"}
        body = [f"<H3>Store {index}: {esc(name)}</H3>", f"<P>{RESET_MESSAGE}</P>",
                f'<P><A HREF="/stores/{index}">Back</A></P>']
        return Page(f"Store {index}: {name}", data, body)

    def _source(self, index: int, core: StoreCore, reg_text: str) -> dict[str, Any]:
        reg_id = int(reg_text)
        snap = self._snapshot(index, core)
        for src in snap["sources"]:
            if src["reg_id"] == reg_id:
                return src
        raise HttpError(404, f"no source RegID {reg_id} in store {index}")

    def source_page(self, number: str, reg_text: str) -> Page:
        index, core = self._store(number)
        src = self._source(index, core, reg_text)
        reg_id = src["reg_id"]
        state = core.sources.get(reg_id)
        repo = state.repo if state is not None else None
        trail, mem_trail, lead = src["window"] or (None, None, None)
        window: dict[str, int | None] = {"trail_sqn": trail}
        if src["repository"] == "disk":
            window["mem_trail_sqn"] = mem_trail
        window["lead_sqn"] = lead
        transport = src["transport"]
        used, threshold, limit = src["memory"]
        start, offset, max_offset = src["offsets"]
        data = {
            "page": "source", "store": index, "reg_id": reg_id, "domain": DOMAIN_ID,
            "request_addr": src["request_addr"], "transport_idx": src["transport_idx"],
            "topic_idx": src["topic_idx"], "topic": src["topic"],
            "session_id": src["session_id"],
            "last_activity": self._wall(src["last_activity"]),
            "state": "active" if src["active"] else "inactive",
            "repository": src["repository"], "rpp": src["rpp"],
            "message_map": src["message_map"], "window": window,
            "memory": {"used": used, "threshold": threshold, "limit": limit},
            "age_threshold": src["age_threshold"],
            "sync": _sync(repo, lead),
            "offsets": {"start": start, "offset": offset, "max": max_offset},
            "drops": {"active": 0, "total": src["drops"]},
            "disk_writes_skipped": src["disk_writes_skipped"],
            "source_string": None if transport is None else source_string(*transport),
            "receivers": [{"reg_id": r["reg_id"], "session_id": r["session_id"],
                           "href": f"/stores/{index}/{reg_id}/{r['reg_id']}"}
                          for r in src["receivers"]],
        }
        title = (f"{reg_id}: Source [{DOMAIN_ID} {_dotted(data['request_addr'])} "
                 f"{data['transport_idx']}.{data['topic_idx']}]")
        memory, drops, offs = data["memory"], data["drops"], data["offsets"]
        links = "".join(f'<A HREF="{esc(r["href"])}">{r["reg_id"]}({r["session_id"]})</A> '
                        for r in data["receivers"])
        body = [
            f"<H3>{esc(title)}</H3>",
            "<DL>",
            f'<DD>Topic: "{esc(data["topic"])}"',
            f"<DD>Session ID: {data['session_id']}",
            f"<DD>Last Activity: {clock_time(data['last_activity'])}",
            f"<DD>State: {data['state']}",
            f"<DD>Repository: {esc(data['repository'] or '-')}",
            "<DD><UL>",
            f"<LI>Receiver Paced Persistence: {data['rpp']}",
            f"<LI>Message Map: {data['message_map']}",
            f"<LI>Window: {_sqn_list(window)}",
            f"<LI>Memory: {memory['used']} / {memory['threshold']} / {memory['limit']}",
            f"<LI>Age Threshold: {data['age_threshold']}",
            f"<LI>Sync: {_sqn_list(data['sync'])}",
            f"<LI>Offsets: {offs['start']} / {offs['offset']} / {offs['max']}",
            f"<LI>Drops: {drops['active']} / {drops['total']}",
            f"<LI>Disk Writes Skipped: {data['disk_writes_skipped']}",
            "</UL>",
            f"<DD>LBM Stats: [{esc(data['source_string'] or '-')}]",
            f"<DD>Receivers: {links}",
            "</DL>",
            f'<P><A HREF="/stores/{index}">Store {index}</A></P>',
        ]
        return Page(title, data, body)

    def receiver_page(self, number: str, src_text: str, rcv_text: str) -> Page:
        index, core = self._store(number)
        src = self._source(index, core, src_text)
        rcv_id = int(rcv_text)
        rcv = next((r for r in src["receivers"] if r["reg_id"] == rcv_id), None)
        if rcv is None:
            raise HttpError(404, f"no receiver RegID {rcv_id} of source RegID "
                                 f"{src['reg_id']} in store {index}")
        data = {
            "page": "receiver", "store": index, "reg_id": rcv_id, "domain": DOMAIN_ID,
            "request_addr": _request_addr(rcv["request_addr"], core.receivers.get(rcv_id)),
            "transport_idx": rcv["transport_idx"],
            "topic_idx": rcv["topic_idx"], "topic": src["topic"],
            "last_activity": self._wall(rcv["last_activity"]),
            "state": "active" if rcv["active"] else "inactive",
            "source_reg_id": src["reg_id"], "source_href": f"/stores/{index}/{src['reg_id']}",
            "source_session_id": src["session_id"], "ack": rcv["ack"],
        }
        title = (f"{rcv_id}: Receiver [{DOMAIN_ID} {_dotted(data['request_addr'])} "
                 f"{data['transport_idx']}.{data['topic_idx']}]")
        body = [
            f"<H3>{esc(title)}</H3>",
            "<DL>",
            f'<DD>Topic: "{esc(data["topic"])}"',
            f"<DD>Last Activity: {clock_time(data['last_activity'])}",
            f"<DD>State: {data['state']}",
            f'<DD>Source RegID: <A HREF="{esc(data["source_href"])}">{data["source_reg_id"]}</A>',
            f"<DD>Source Session ID: {data['source_session_id']}",
            f"<DD>ACK: {hex_or_dash(data['ack'])}",
            "</DL>",
        ]
        return Page(title, data, body)

    # --- routing ---------------------------------------------------------------------------

    def route(self, path: str, *, method: str = "GET",
              form: dict[str, str] | None = None) -> Page:
        """The page at ``path`` (already percent-decoded) for ``method``; a POST's ``form`` is
        its decoded body.  Raises HttpError (404 unknown path, 405 method, 403 bad token)."""
        parts = [p for p in path.split("/") if p]
        if parts and (parts[0] != "stores" or len(parts) > 4
                      or not all(_NUMBER.fullmatch(p) for p in parts[1:2] + parts[3:])
                      or (len(parts) > 2 and parts[2] != "reset"
                          and not _NUMBER.fullmatch(parts[2]))
                      or (len(parts) > 3 and parts[2] == "reset")):
            raise HttpError(404, "no such page")
        action = len(parts) == 3 and parts[2] == "reset"
        allowed = ACTION_METHODS if action else READ_METHODS
        if method not in allowed:
            raise HttpError(405, f"method {method} is not allowed here "
                                 f"({', '.join(allowed)})", (("Allow", ", ".join(allowed)),))
        if action:
            if method == "POST":
                return self.reset_page(parts[1], form or {})
            return self.reset_form_page(parts[1])
        if not parts:
            return self.index_page()
        if len(parts) == 1:
            return self.stores_page()
        if len(parts) == 2:
            return self.store_page(parts[1])
        if len(parts) == 3:
            return self.source_page(parts[1], parts[2])
        return self.receiver_page(parts[1], parts[2], parts[3])

    def render(self, target: str, *, method: str = "GET",
               form: dict[str, str] | None = None) -> Response:
        """Answer a request target (``/path?query``) without a socket; errors as responses.

        HEAD is answered like GET (same headers); only a POST (with ``form``, its decoded
        body) performs an action.
        """
        want_json = False
        try:
            path, want_json = _parse_target(target)
            key = (tuple(p for p in path.split("/") if p), want_json)
            now = time.monotonic()
            cached = self._pages.get(key) if method in READ_METHODS else None
            if cached is not None and now - cached[0] < self.max_age:
                return cached[1]
            page = self.route(path, method=method, form=form)
        except HttpError as err:
            return self._error(err, want_json)
        except Exception:
            log.exception("web monitor: building %s failed", target)
            return self._error(HttpError(500, "internal error (see the store log)"), want_json)
        if want_json:
            response = Response(200, "application/json", _json_bytes(page.data))
        else:
            response = Response(200, "text/html; charset=utf-8",
                                _html_bytes(page.title, page.body))
        if method in READ_METHODS and self.max_age > 0:
            if len(self._pages) >= PAGE_CACHE_ENTRIES:
                self._pages = {k: v for k, v in self._pages.items()
                               if now - v[0] < self.max_age}
                if len(self._pages) >= PAGE_CACHE_ENTRIES:
                    self._pages.clear()
            self._pages[key] = (now, response)
        return response

    def _error(self, err: HttpError, want_json: bool) -> Response:
        self.stats["errors"] += 1
        reason = _REASONS.get(err.status, "Error")
        if want_json:
            body = _json_bytes({"status": err.status, "error": reason, "detail": err.message})
            return Response(err.status, "application/json", body, err.headers)
        page = [f"<H3>{err.status} {esc(reason)}</H3>", f"<P>{esc(err.message)}</P>"]
        return Response(err.status, "text/html; charset=utf-8",
                        _html_bytes(f"{err.status} {reason}", page), err.headers)

    # --- server ----------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Listen; returns the bound (host, port) (the real port when port 0 was asked)."""
        if self._server is not None:
            raise RuntimeError("web monitor already started")
        line_limit = max(self.limits.request_line, self.limits.header_line) + 2
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=line_limit)
        sockname = self._server.sockets[0].getsockname()
        self.port = int(sockname[1])
        self._max_connections = _connection_cap(self.limits.max_connections)
        log.info("web monitor listening on %s:%d (at most %d connections)", sockname[0],
                 self.port, self._max_connections)
        return str(sockname[0]), self.port

    async def stop(self) -> None:
        """Stop listening and close every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for conn in list(self._connections.values()):
            conn.writer.close()
        tasks = list(self._connections)
        if tasks:
            await asyncio.wait(tasks, timeout=self.limits.write_timeout)
        for task in tasks:
            task.cancel()
        await server.wait_closed()

    async def __aenter__(self) -> WebMonitor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.stats["connections"] += 1
        peer = writer.get_extra_info("peername")
        conn = _Conn(task, writer, str(peer[0]) if peer else "?", time.monotonic())
        self._add(conn)
        try:
            if not self._admit(conn):
                self.stats["refused"] += 1
                conn.enter("write")
                await self._send(writer, self._error(HttpError(503, "too many connections"),
                                                     False), head_only=False, close=True)
                return
            for served in range(self.limits.max_requests):
                conn.served = served
                conn.enter("head")
                last = served + 1 == self.limits.max_requests
                if not await self._one_request(reader, conn, last=last):
                    break
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled (or was evicted): nothing to answer
        finally:
            conn.enter("linger")
            with contextlib.suppress(Exception):
                await self._linger(reader, writer)
            self._remove(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _admit(self, new: _Conn) -> bool:
        """Make room for ``new`` (already counted) within the caps; False if none can be made.

        Over the per-client cap the client's own least valuable connection goes; over the
        total cap, that of the client address holding the most connections (so flooding
        from one address costs that address, not the others).  Least valuable: lingering,
        then idle keep-alive, then waiting for a first request head, oldest first within
        each; a connection writing a response is never evicted.
        """
        if len(self._by_client[new.client]) > self.limits.max_per_client:
            clients = [new.client]
        elif len(self._connections) > self._max_connections:
            # the addresses holding the most connections, most first (a short list: the
            # scan below usually finds a victim in the first)
            clients = sorted(self._by_client, key=lambda c: -len(self._by_client[c]))
        else:
            return True
        for client in clients:
            victims = [c for c in self._by_client[client].values()
                       if c is not new and c.state != "write"]
            if victims:
                self._evict(min(victims, key=lambda c: (c.rank, c.since)))
                return True
        return False

    def _add(self, conn: _Conn) -> None:
        self._connections[conn.task] = conn
        self._by_client.setdefault(conn.client, {})[conn.task] = conn

    def _remove(self, conn: _Conn) -> None:
        if self._connections.pop(conn.task, None) is None:
            return
        same = self._by_client[conn.client]
        del same[conn.task]
        if not same:
            del self._by_client[conn.client]

    def _evict(self, conn: _Conn) -> None:
        """Drop a connection at once (reset: no response, nothing to linger for)."""
        self.stats["evicted"] += 1
        self._remove(conn)
        conn.writer.transport.abort()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then discard what the client still sends, briefly.

        Closing a socket with unread input makes the kernel send RST, and an RST can destroy
        the response (a 400 or 503 explaining the refusal) before the client read it.
        """
        if writer.is_closing() or self._server is None:
            return
        if writer.can_write_eof():
            writer.write_eof()
        discarded = 0
        async with asyncio.timeout(LINGER_SECONDS):
            while discarded < LINGER_BYTES:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                discarded += len(chunk)

    async def _one_request(self, reader: asyncio.StreamReader, conn: _Conn,
                           *, last: bool) -> bool:
        """Serve one request (``last``: the connection's quota is used up); False when the
        connection must close."""
        writer = conn.writer
        try:
            async with asyncio.timeout(self.limits.header_timeout):
                request = await self._read_request(reader)
        except HttpError as err:
            conn.enter("write")
            await self._send(writer, self._error(err, False), head_only=False, close=True)
            return False
        if request is None:
            return False
        self.stats["requests"] += 1
        form = None
        try:
            _check_request(request)
            if request.method == "POST":
                _check_same_origin(request)
                async with asyncio.timeout(self.limits.header_timeout):
                    form = await self._read_form(reader, request)
        except HttpError as err:
            conn.enter("write")
            await self._send(writer, self._error(err, False),
                             head_only=request.method == "HEAD", close=True)
            return False
        conn.enter("write")
        response = self.render(request.target, method=request.method, form=form)
        keep = request.keep_alive and response.status == 200 and not last
        await self._send(writer, response, head_only=request.method == "HEAD", close=not keep)
        return keep

    async def _read_request(self, reader: asyncio.StreamReader) -> _Request | None:
        limits = self.limits
        line = await _read_line(reader, limits.request_line, 414, "request line too long")
        if line is None:
            return None
        if line == "":  # one empty line before the request line is tolerated (RFC 9112 2.2)
            line = await _read_line(reader, limits.request_line, 414, "request line too long")
            if line is None:
                return None
        request = _parse_request_line(line)
        total = 0
        while True:
            header = await _read_line(reader, limits.header_line, 431, "header line too long")
            if header is None:
                raise asyncio.IncompleteReadError(b"", None)
            if header == "":
                return request
            total += len(header) + 2
            if total > limits.header_bytes or len(request.headers) >= limits.header_count:
                raise HttpError(431, "request headers too large")
            request.headers.append(_parse_header(header))

    async def _read_form(self, reader: asyncio.StreamReader,
                         request: _Request) -> dict[str, str]:
        """A POST's body: a small ``application/x-www-form-urlencoded`` form."""
        lengths = request.header_values("content-length")
        if not lengths:
            raise HttpError(411, "a POST needs a Content-Length")
        if len(lengths) > 1 or not lengths[0].isascii() or not lengths[0].isdigit():
            raise HttpError(400, "malformed Content-Length")
        length = int(lengths[0])
        if length > self.limits.body_bytes:
            raise HttpError(413, f"a form is at most {self.limits.body_bytes} bytes")
        types = request.header_values("content-type")
        if length and (not types or types[0].split(";")[0].strip().lower() != FORM_TYPE):
            raise HttpError(415, f"a POST body must be {FORM_TYPE}")
        body = await reader.readexactly(length)
        try:
            pairs = parse_qsl(body.decode("ascii"), keep_blank_values=True,
                              strict_parsing=bool(body))
        except (UnicodeDecodeError, ValueError):
            raise HttpError(400, "malformed form body") from None
        form = dict(pairs)
        if len(form) != len(pairs):
            raise HttpError(400, "a form field is repeated")
        return form

    async def _send(self, writer: asyncio.StreamWriter, response: Response, *,
                    head_only: bool, close: bool) -> None:
        lines = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}",
                 f"Date: {formatdate(usegmt=True)}",
                 f"Server: ump-harness-webmon/{self.version}",
                 f"Content-Type: {response.content_type}",
                 f"Content-Length: {len(response.body)}",
                 "Cache-Control: no-store",
                 "X-Content-Type-Options: nosniff",
                 "Content-Security-Policy: default-src 'none'; form-action 'self'",
                 f"Connection: {'close' if close else 'keep-alive'}"]
        lines += [f"{name}: {value}" for name, value in response.headers]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        writer.write(head if head_only else head + response.body)
        async with asyncio.timeout(self.limits.write_timeout):
            await writer.drain()


# --- HTTP parsing helpers ------------------------------------------------------------------


async def _read_line(reader: asyncio.StreamReader, limit: int, status: int,
                     message: str) -> str | None:
    """One CRLF- (or LF-) terminated line without its terminator; None at a clean EOF."""
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise HttpError(status, message) from None
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise
    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
    if len(raw) > limit:
        raise HttpError(status, message)
    if b"\r" in raw or b"\x00" in raw:
        raise HttpError(400, "stray CR or NUL in the request head")
    return raw.decode("latin-1")


def _parse_request_line(line: str) -> _Request:
    parts = line.split(" ")
    if len(parts) != 3 or not all(parts):
        raise HttpError(400, "malformed request line (want: METHOD SP target SP HTTP/1.1)")
    method, target, version_text = parts
    if not _TOKEN.fullmatch(method):
        raise HttpError(400, "malformed method")
    version = _VERSION.fullmatch(version_text)
    if version is None:
        raise HttpError(400, f"malformed HTTP version {version_text!r}")
    major, minor = int(version.group(1)), int(version.group(2))
    if major != 1:
        raise HttpError(505, f"HTTP/{major}.{minor} is not supported (use HTTP/1.1)")
    if not _TARGET_CHARS.fullmatch(target):
        raise HttpError(400, "request target has characters that must be percent-encoded")
    return _Request(method, target, (major, minor))


def _parse_header(line: str) -> tuple[str, str]:
    if line[0] in " \t":
        raise HttpError(400, "obsolete header line folding is not accepted")
    name, sep, value = line.partition(":")
    if not sep or not _TOKEN.fullmatch(name):
        raise HttpError(400, f"malformed header line {line[:40]!r}")
    value = value.strip(" \t")
    if not _FIELD_VALUE.fullmatch(value):
        raise HttpError(400, f"control character in header {name!r}")
    return name.lower(), value


def _connection_cap(wanted: int) -> int:
    """``wanted``, but at most a quarter of the soft file descriptor limit (at least 16)."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no such limit here (Windows)
        return wanted
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return wanted
    return max(1, min(wanted, max(16, soft // 4)))


def _check_request(request: _Request) -> None:
    """What a syntactically valid request must also satisfy before it is routed (the
    method is checked by :meth:`WebMonitor.route`, which knows the page)."""
    hosts = request.header_values("host")
    if request.version >= (1, 1) and len(hosts) != 1:
        raise HttpError(400, "an HTTP/1.1 request needs exactly one Host header")
    if request.header_values("transfer-encoding"):
        raise HttpError(400, "request bodies are not accepted")
    lengths = request.header_values("content-length")
    if request.method != "POST" and any(v != "0" for v in lengths):
        raise HttpError(400, "request bodies are not accepted")


def _check_same_origin(request: _Request) -> None:
    """Refuse a POST a browser says comes from another site (see the module docstring)."""
    sites = request.header_values("sec-fetch-site")
    if sites and sites[-1].lower() not in ("same-origin", "none"):
        raise HttpError(403, f"cross-site request refused (Sec-Fetch-Site: {sites[-1]})")
    origins = request.header_values("origin")
    if origins:
        hosts = request.header_values("host")
        if len(origins) > 1 or len(hosts) != 1 \
                or origins[0].lower() != f"http://{hosts[0].lower()}":
            raise HttpError(403, "cross-origin request refused (Origin is not this monitor)")


def _parse_target(target: str) -> tuple[str, bool]:
    """(percent-decoded path, JSON wanted) of an origin- or absolute-form target."""
    if target.startswith(("http://", "https://")):
        split = urlsplit(target)
        target = (split.path or "/") + (f"?{split.query}" if split.query else "")
    if not target.startswith("/"):
        raise HttpError(400, "request target must be a path starting with /")
    if "#" in target:
        raise HttpError(400, "a fragment (#) does not belong in a request")
    raw_path, _, query = target.partition("?")
    if _BAD_PERCENT.search(raw_path):
        raise HttpError(400, "malformed percent-escape in the path")
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, "path is not UTF-8") from None
    want_json = False
    if query:
        try:
            params = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            raise HttpError(400, "malformed query string") from None
        for key, value in params:
            if key != "format" or value not in ("json", "html") or len(params) > 1:
                raise HttpError(400, "the only query parameter is format=json or format=html")
            want_json = value == "json"
    return path, want_json


def _sync(repo: Repository | None, lead: int | None) -> dict[str, int | None]:
    """Sync ``[sync_complete_sqn, sync_sqn, contig_sqn]`` (see the module docstring).

    ``repo`` is live while ``lead`` comes from a snapshot up to ``max_age`` old: the contiguous
    run is cut at that lead so the page never shows a contig_sqn past its own window."""
    contig = _contiguous(repo) if repo is not None else None
    if contig is not None and lead is not None:
        contig = min(contig, lead)
    return {"sync_complete_sqn": lead, "sync_sqn": lead, "contig_sqn": contig}


def _contiguous(repo: Repository) -> int | None:
    """End of the gap-free run of SQNs that starts at the trail.

    O(1) in the usual case (as many messages as SQNs between trail and lead); otherwise a scan
    that stops at the first gap.
    """
    trail, lead = repo.trail_sqn, repo.lead_sqn
    if trail is None or lead is None:
        return None
    if len(repo) == lead - trail + 1:
        return lead
    sqn = trail
    while sqn + 1 in repo:
        sqn += 1
    return sqn


def _proxy_html(proxy: dict[str, Any]) -> list[str]:
    """The "Proxy Sources" lines of the store page (see :meth:`WebMonitor._proxy_sources`):
    one summary line, then one line per watched source (``state`` is ``active``,
    ``waiting``, ``proxy`` or ``following``; ``holder`` the index of the store running its
    proxy; ``-`` for none)."""
    if not proxy["allowed"]:
        return ["<DD>Proxy Sources: not allowed"]
    lines = [f"<DD>Proxy Sources: {proxy['running']} running, port {proxy['port']}, "
             f"store {proxy['index']} of group {esc(', '.join(proxy['group']))}"]
    for w in proxy["sources"]:
        token = "-" if w["token"] is None else f"{w['token']:08x}"
        holder = "-" if w["holder"] is None else w["holder"]
        lines.append(f'<UL><LI>Proxy election "{esc(w["topic"])}": <A HREF="{esc(w["href"])}">'
                     f'{w["reg_id"]}({w["session_id"]})</A> source {esc(w["source"])}, '
                     f'state {w["state"]}, holder {holder}, token {token}'
                     f'{", re-election" if w["reelect"] else ""}</UL>')
    return lines


def _form_html(form: dict[str, Any]) -> str:
    """An action form (one hidden token, one button) on one line."""
    return (f'<FORM METHOD="{esc(form["method"])}" ACTION="{esc(form["href"])}">'
            f'<INPUT TYPE="hidden" NAME="token" VALUE="{esc(form["token"])}">'
            f'<INPUT TYPE="submit" VALUE="{esc(form["label"])}"></FORM>')


def _json_bytes(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=False) + "\n").encode("ascii")


def _html_bytes(title: str, body: list[str]) -> bytes:
    text = "\n".join([
        "<!DOCTYPE html>",
        f'<HTML><HEAD><META charset="utf-8"><TITLE>{esc(title)}</TITLE></HEAD><BODY>',
        *body,
        f'<HR><P><A HREF="/">{esc(PRODUCT)}</A> web monitor (ump-harness reference '
        'implementation) - <A HREF="?format=json">this page as JSON</A></P>',
        "</BODY></HTML>",
        "",
    ])
    return text.encode("utf-8", "replace")
