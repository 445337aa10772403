"""The store web monitor: real HTTP against stores of a simulated deployment.

Each test builds a small :class:`SimDeployment` (store, source, receiver; milliseconds of real
time), starts :class:`WebMonitor` on 127.0.0.1 port 0 and fetches pages with ``urllib`` (in a
thread) or raw asyncio streams for requests no well-behaved client sends.  The sim clock is the
monitor's core clock and the wall clock is pinned, so times on the pages are exact.
"""

from __future__ import annotations

import asyncio
import functools
import html
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from reference_impl.aio import AioHost
from reference_impl.deployment import SimDeployment
from reference_impl.receiver import ReceiverCore
from reference_impl.repository import Repository, RetentionLimits
from reference_impl.source import SourceCore
from reference_impl.store import StoreCore, StoreSettings, TopicPolicy, TopicRule
from reference_impl.webmon import (
    PRODUCT,
    HttpLimits,
    WebMonitor,
    _contiguous,
    clock_time,
    parse_address,
)
from tests.reference_impl.loopback import free_port as _free_port

R = TypeVar("R")
WALL = 1_700_000_000.25  # pinned Unix time of "now" on the pages
VERSION = "0.1.0-test"
HOSTILE = 'evil<script>alert("x")</script>&\'</A> -  <A HREF="/x">1(2)</A> \nnext'


def async_test(timeout: float = 30.0) -> Callable[[Callable[..., Coroutine[Any, Any, R]]],
                                                  Callable[..., R]]:
    """Run an async test in a fresh loop, failing it (not hanging) after ``timeout`` s."""
    def wrap(fn: Callable[..., Coroutine[Any, Any, R]]) -> Callable[..., R]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> R:
            return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), timeout))
        return run
    return wrap


class World:
    """A deployment with one store, one source and one receiver that exchanged messages."""

    def __init__(self, topic: str = "topic.a", *, messages: int = 5,
                 store_options: dict[str, Any] | None = None,
                 policy: TopicPolicy | None = None, pattern: str = ".*",
                 transport: str = "tcp") -> None:
        self.d = SimDeployment(seed=1)
        policy = policy or TopicPolicy(repository_size_threshold=10_000_000)
        self.store: StoreCore = self.d.add_store(
            "store1", topics=(TopicRule(pattern, policy, kind="PCRE"),), **(store_options or {}))
        self.src: SourceCore = self.d.add_source("src", topic, ume_session_id=77,
                                                 transport=transport)
        self.rcv: ReceiverCore = self.d.add_receiver("rcv", topic, ume_session_id=88)
        assert self.d.run_until(lambda: self.src.complete and self.rcv.complete, 10)
        self.sent = [self.src.send(f"m{i}".encode()) for i in range(messages)]
        self.d.run(2)

    @property
    def src_id(self) -> int:
        return next(iter(self.store.sources))

    @property
    def rcv_id(self) -> int:
        return next(iter(self.store.receivers))

    def monitor(self, **options: Any) -> WebMonitor:
        """The monitor of this world; unless asked, pages follow the state at once (no
        snapshot reuse: ``max_age`` has its own test in test_webmon_load.py)."""
        options.setdefault("max_age", 0.0)
        return WebMonitor([self.store], version=VERSION, clock=lambda: self.d.now,
                          wall_clock=lambda: WALL, **options)


class Fetched:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json"
        return json.loads(self.body)


async def fetch(base: str, path: str, method: str = "GET") -> Fetched:
    """A real HTTP request with urllib, in a thread so the monitor's loop keeps running."""
    def go() -> Fetched:
        req = urllib.request.Request(base + path, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return Fetched(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                               resp.read())
        except urllib.error.HTTPError as err:
            return Fetched(err.code, {k.lower(): v for k, v in err.headers.items()},
                           err.read())
    return await asyncio.to_thread(go)


async def raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the one response (the server closes after errors)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()  # until the server closes
    writer.close()
    return parse_response(data)


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


def field(text: str, pattern: str) -> str:
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{pattern!r} found {len(found)} times in\n{text}"
    return str(found[0])


def sqns(text: str) -> list[int | None]:
    return [None if v == "-" else int(v, 16) for v in text.split(", ")]


def links(text: str) -> list[dict[str, Any]]:
    return [{"href": h, "reg_id": int(r), "session_id": int(s)}
            for h, r, s in re.findall(r'<A HREF="([^"]+)">(\d+)\((\d+)\)</A> ', text)]


# --- HTML -> data, for the JSON comparison -------------------------------------------------


def scrape_index(text: str) -> dict[str, Any]:
    return {"page": "index", "product": PRODUCT,
            "version": field(text, r"<H2>" + PRODUCT + r" v([^<]+)</H2>"),
            "build": field(text, r"<P>Build: ([^<]+)</P>"),
            "time": field(text, r"<P>Time: ([^<]+)</P>"),
            "stores_href": field(text, r'<A HREF="([^"]+)">Stores</A>')}


def scrape_stores(text: str) -> dict[str, Any]:
    return {"page": "stores", "stores": [
        {"index": int(i), "name": html.unescape(n), "href": h}
        for i, h, n in re.findall(r'<LI>Store (\d+):<A HREF="([^"]+)">([^<]*)</A>', text)]}


def scrape_store(text: str) -> dict[str, Any]:
    def dd(label: str) -> str:
        return html.unescape(field(text, rf"<DD>{label}: (.*)"))
    topics = [{"topic": html.unescape(t), "sources": links(rest)}
              for t, rest in re.findall(r'<UL><LI>"([^"]*)" -  (.*)</UL>', text)]
    return {
        "page": "store", "store": int(field(text, r"<H3>Store (\d+): ")),
        "name": html.unescape(field(text, r"<H3>Store \d+: ([^<]*)</H3>")),
        "interface": dd("Interface"), "cache_dir": dd("Cache Dir"), "state_dir": dd("State Dir"),
        "retransmission_request_processing_rate":
            int(dd("Configured Retransmission Request Processing Rate")),
        "seconds": int(dd("Total seconds used for rate calculations")),
        "received_rate": float(dd("Retransmission Request Received Rate")),
        "service_rate": float(dd("Retransmission Request Service Rate")),
        "drop_rate": float(dd("Retransmission Request Drop Rate")),
        "total_dropped": int(dd("Retransmission Request Total Dropped")),
        "patterns": [{"pattern": html.unescape(p), "type": k}
                     for p, k in re.findall(r'<UL><LI>"([^"]*)", (\w+)</UL>', text)],
        "topics": topics,
        "proxy_sources": scrape_proxy(text),
        "reset": reset_form(text),
    }


def scrape_proxy(text: str) -> dict[str, Any]:
    """The store page's "Proxy Sources" section as its JSON shows it."""
    summary = html.unescape(field(text, r"<DD>Proxy Sources: (.*)"))
    if summary == "not allowed":
        return {"allowed": False, "port": None, "group": [], "index": None, "sources": [],
                "running": 0}
    head = re.fullmatch(r"(\d+) running, port (\d+), store (\d+) of group (.*)", summary)
    assert head is not None, summary
    sources = [
        {"topic": html.unescape(t), "href": h, "reg_id": int(r), "session_id": int(sid),
         "source": src, "state": state, "holder": None if holder == "-" else int(holder),
         "token": None if token == "-" else int(token, 16), "reelect": bool(again)}
        for t, h, r, sid, src, state, holder, token, again in re.findall(
            r'<UL><LI>Proxy election "([^"]*)": <A HREF="([^"]+)">(\d+)\((\d+)\)</A> '
            r'source ([^,]+), state (\w+), holder (\S+), token ([0-9a-f-]+)'
            r'(, re-election)?</UL>', text)]
    return {"allowed": True, "running": int(head[1]), "port": int(head[2]),
            "index": int(head[3]), "group": head[4].split(", "), "sources": sources}


def reset_form(text: str) -> dict[str, str]:
    """The store page's Reset Rate Stats form as its JSON shows it."""
    found = re.search(r'<FORM METHOD="(POST)" ACTION="([^"]+)"><INPUT TYPE="hidden" '
                      r'NAME="token" VALUE="([^"]+)"><INPUT TYPE="submit" VALUE="([^"]+)">'
                      r'</FORM>', text)
    assert found is not None, text
    return {"href": found[2], "method": found[1], "token": html.unescape(found[3]),
            "label": found[4]}


def triple(text: str, label: str, keys: tuple[str, ...]) -> dict[str, int]:
    values = field(text, rf"<LI>{label}: (\d+ / \d+(?: / \d+)?)\n").split(" / ")
    return dict(zip(keys, map(int, values), strict=True))


def scrape_source(text: str, repository: str) -> dict[str, Any]:
    title = re.search(r"<H3>(\d+): Source \[(\d+) ([\d.]+)\.(\d+) (\d+)\.(\d+)\]</H3>", text)
    assert title is not None, text
    window_keys = ["trail_sqn", "mem_trail_sqn", "lead_sqn"] if repository == "disk" \
        else ["trail_sqn", "lead_sqn"]
    stats = field(text, r"<DD>LBM Stats: \[([^\]]+)\]")
    return {
        "page": "source", "store": int(field(text, r'<A HREF="/stores/(\d+)">Store')),
        "reg_id": int(title[1]), "domain": int(title[2]),
        "request_addr": f"{title[3]}:{title[4]}",
        "transport_idx": int(title[5]), "topic_idx": int(title[6]),
        "topic": html.unescape(field(text, r'<DD>Topic: "(.*)"\n')),
        "session_id": int(field(text, r"<DD>Session ID: (\d+)")),
        "last_activity": field(text, r"<DD>Last Activity: (\S+)"),
        "state": field(text, r"<DD>State: (\w+)"),
        "repository": field(text, r"<DD>Repository: (\w+)"),
        "rpp": int(field(text, r"<LI>Receiver Paced Persistence: (\d+)")),
        "message_map": int(field(text, r"<LI>Message Map: (\d+)")),
        "window": dict(zip(window_keys, sqns(field(text, r"<LI>Window: \[([^\]]+)\]")),
                           strict=True)),
        "memory": triple(text, "Memory", ("used", "threshold", "limit")),
        "age_threshold": int(field(text, r"<LI>Age Threshold: (\d+)")),
        "sync": dict(zip(("sync_complete_sqn", "sync_sqn", "contig_sqn"),
                         sqns(field(text, r"<LI>Sync: \[([^\]]+)\]")), strict=True)),
        "offsets": triple(text, "Offsets", ("start", "offset", "max")),
        "drops": triple(text, "Drops", ("active", "total")),
        "disk_writes_skipped": int(field(text, r"<LI>Disk Writes Skipped: (\d+)")),
        "source_string": None if stats == "-" else stats,
        "receivers": links(field(text, r"<DD>Receivers: (.*)")),
    }


def scrape_receiver(text: str) -> dict[str, Any]:
    title = re.search(r"<H3>(\d+): Receiver \[(\d+) ([\d.]+)\.(\d+) (\d+)\.(\d+)\]</H3>", text)
    assert title is not None, text
    src = re.search(r'<DD>Source RegID: <A HREF="([^"]+)">(\d+)</A>', text)
    assert src is not None
    ack = field(text, r"<DD>ACK: (\S+)")
    return {
        "page": "receiver", "store": int(src[1].split("/")[2]), "reg_id": int(title[1]),
        "domain": int(title[2]), "request_addr": f"{title[3]}:{title[4]}",
        "transport_idx": int(title[5]), "topic_idx": int(title[6]),
        "topic": html.unescape(field(text, r'<DD>Topic: "(.*)"\n')),
        "last_activity": field(text, r"<DD>Last Activity: (\S+)"),
        "state": field(text, r"<DD>State: (\w+)"),
        "source_reg_id": int(src[2]), "source_href": src[1],
        "source_session_id": int(field(text, r"<DD>Source Session ID: (\d+)")),
        "ack": None if ack == "-" else int(ack, 16),
    }


# --- tests -----------------------------------------------------------------------------------


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:15304") == ("127.0.0.1", 15304)
    assert parse_address("*:15304") == ("0.0.0.0", 15304)
    assert parse_address("[::1]:80") == ("::1", 80)
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    for bad in ("15304", ":15304", "localhost:80", "1.2.3.4:65536", "1.2.3.4:http", "*:"):
        with pytest.raises(ValueError, match="web monitor"):
            parse_address(bad)
    with pytest.raises(ValueError):
        WebMonitor([], version="x", address="nowhere")


def test_default_binds_loopback_only() -> None:
    mon = WebMonitor([], version="x")
    assert (mon.host, mon.port) == ("127.0.0.1", 0)


@async_test()
async def test_pages_reflect_the_deployment() -> None:
    w = World()
    async with w.monitor() as mon:
        base = f"http://127.0.0.1:{mon.port}"
        index = await fetch(base, "/")
        assert index.status == 200
        assert index.headers["content-type"] == "text/html; charset=utf-8"
        assert f"<H2>{PRODUCT} v{VERSION}</H2>" in index.text
        assert f"Time: {time.ctime(WALL)}" in index.text
        assert '<A HREF="/stores">Stores</A>' in index.text

        stores = await fetch(base, "/stores")
        assert '<LI>Store 0:<A HREF="/stores/0">store1</A>' in stores.text

        store = (await fetch(base, "/stores/0")).text
        assert "<H3>Store 0: store1</H3>" in store
        assert f"<DD>Interface: {w.store.addr[0]}:{w.store.addr[1]}" in store
        assert "<DD>Configured Retransmission Request Processing Rate: 262144" in store
        assert '<UL><LI>".*", PCRE</UL>' in store
        assert (f'<UL><LI>"topic.a" -  <A HREF="/stores/0/{w.src_id}">{w.src_id}(77)</A> </UL>'
                in store)

        source = (await fetch(base, f"/stores/0/{w.src_id}")).text
        req_ip, req_port = w.src.request_addr
        assert (f"<H3>{w.src_id}: Source [0 {req_ip}.{req_port} "
                f"{w.src.transport_idx}.{w.src.topic_idx}]</H3>") in source
        assert '<DD>Topic: "topic.a"' in source
        assert "<DD>Session ID: 77" in source
        assert "<DD>Repository: memory" in source
        assert f"<LI>Message Map: {len(w.sent)}" in source
        # memory repository: [trail, lead]; lead is the last sequence number sent
        assert f"<LI>Window: [{w.sent[0]:x}, {w.sent[-1]:x}]" in source
        used = w.store.sources[w.src_id].repo.used_bytes  # type: ignore[union-attr]
        assert used > 0
        assert f"<LI>Memory: {used} / 10000000 / 50331648" in source
        assert f"<LI>Sync: [{w.sent[-1]:x}, {w.sent[-1]:x}, {w.sent[-1]:x}]" in source
        assert "<LI>Drops: 0 / 0" in source
        transport = w.store.sources[w.src_id].transport
        assert transport is not None
        assert f"<DD>LBM Stats: [TCP:{transport[0]}:{transport[1]}]" in source
        assert f'<A HREF="/stores/0/{w.src_id}/{w.rcv_id}">{w.rcv_id}(88)</A>' in source
        src_state = w.store.sources[w.src_id]
        expected_time = WALL - (w.d.now - src_state.last_activity)
        assert f"<DD>Last Activity: {clock_time(expected_time)}" in source

        receiver = (await fetch(base, f"/stores/0/{w.src_id}/{w.rcv_id}")).text
        rcv_ip, rcv_port = w.rcv.request_addr
        assert f"<H3>{w.rcv_id}: Receiver [0 {rcv_ip}.{rcv_port} " in receiver
        assert f'<DD>Source RegID: <A HREF="/stores/0/{w.src_id}">{w.src_id}</A>' in receiver
        assert "<DD>Source Session ID: 77" in receiver
        assert w.rcv.acked == w.sent[-1]
        assert f"<DD>ACK: {w.sent[-1]:x}" in receiver

        # the pages follow the state: more messages move the window and the ACK
        more = [w.src.send(b"again") for _ in range(20)]
        w.d.run(1)
        source = (await fetch(base, f"/stores/0/{w.src_id}")).text
        assert f"<LI>Window: [{w.sent[0]:x}, {more[-1]:x}]" in source
        assert f"<LI>Message Map: {len(w.sent) + len(more)}" in source
        receiver = (await fetch(base, f"/stores/0/{w.src_id}/{w.rcv_id}")).text
        assert f"<DD>ACK: {more[-1]:x}" in receiver


@async_test()
async def test_json_holds_the_same_data_as_html() -> None:
    w = World()
    async with w.monitor() as mon:
        base = f"http://127.0.0.1:{mon.port}"
        pages: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
            ("/", scrape_index), ("/stores", scrape_stores), ("/stores/0", scrape_store),
            (f"/stores/0/{w.src_id}", lambda t: scrape_source(t, "memory")),
            (f"/stores/0/{w.src_id}/{w.rcv_id}", scrape_receiver),
        ]
        for path, scrape in pages:
            page_html = await fetch(base, path)
            page_json = await fetch(base, path + "?format=json")
            assert page_json.status == 200
            data = page_json.json()
            seen = scrape(page_html.text)
            if "time" in data:
                data["time"] = time.ctime(data["time"])
            if "last_activity" in data:
                data["last_activity"] = clock_time(data["last_activity"])
            assert seen == data, path
        # explicit html is the default form; json lists every link a crawler needs
        assert (await fetch(base, "/stores?format=html")).text == \
            (await fetch(base, "/stores")).text
        store = (await fetch(base, "/stores/0?format=json")).json()
        assert store["topics"][0]["sources"][0]["href"] == f"/stores/0/{w.src_id}"


@async_test()
async def test_disk_repository_shows_three_value_window_sync_and_offsets(
        tmp_path: Path) -> None:
    w = World(policy=TopicPolicy(repository_type="disk",
                                 repository_size_threshold=10_000_000),
              store_options={"disk_cache_directory": tmp_path / "cache",
                             "disk_state_directory": tmp_path / "state"})
    repo = w.store.sources[w.src_id].repo
    assert repo is not None and repo.cache_file is not None
    async with w.monitor() as mon:
        base = f"http://127.0.0.1:{mon.port}"
        store = (await fetch(base, "/stores/0")).text
        assert f"<DD>Cache Dir: {tmp_path / 'cache'}" in store
        assert f"<DD>State Dir: {tmp_path / 'state'}" in store
        page = await fetch(base, f"/stores/0/{w.src_id}")
        last = w.sent[-1]
        assert "<DD>Repository: disk" in page.text
        assert f"<LI>Window: [{w.sent[0]:x}, {w.sent[0]:x}, {last:x}]" in page.text
        assert f"<LI>Sync: [{last:x}, {last:x}, {last:x}]" in page.text
        file_size = repo.cache_file.stat().st_size
        assert f"<LI>Offsets: 0 / {file_size} / 104857600" in page.text
        data = (await fetch(base, f"/stores/0/{w.src_id}?format=json")).json()
        assert scrape_source(page.text, "disk") | {"last_activity": None} == \
            data | {"last_activity": None}


def test_contiguous_stops_at_the_first_gap() -> None:
    repo = Repository(RetentionLimits(size_threshold=1 << 30, size_limit=1 << 30))
    assert _contiguous(repo) is None
    raw = b"\x00" * 32
    for sqn in (10, 11, 12, 14, 15):
        repo.add(sqn, raw, 0.0)
    assert _contiguous(repo) == 12
    repo.add(13, raw, 0.0)
    assert _contiguous(repo) == 15


@async_test()
async def test_reset_rate_stats_zeroes_the_seconds_counter() -> None:
    w = World()
    w.d.run(3)
    async with w.monitor() as mon:
        base = f"http://127.0.0.1:{mon.port}"
        before = (await fetch(base, "/stores/0?format=json")).json()
        # the core's clock: the time of its latest input or timer
        assert before["seconds"] == int(w.store.now - w.store.rx.since) >= 4
        # rates are the counters over those seconds (requests counted by the core)
        w.store.rx.received, w.store.rx.total_dropped = 10, 3
        page = (await fetch(base, "/stores/0")).text
        rate = 10 / (w.store.now - w.store.rx.since)
        assert f"<DD>Retransmission Request Received Rate: {rate:.6f}" in page

        head = await fetch(base, "/stores/0/reset", method="HEAD")
        assert head.status == 200 and head.body == b""
        assert (await fetch(base, "/stores/0?format=json")).json()["seconds"] == \
            before["seconds"], "HEAD must not reset"

        status, _, body = await post(mon.port, before["reset"]["href"],
                                     f"token={before['reset']['token']}".encode())
        assert status == 200
        assert b"Rate Statistics have been reset" in body
        assert b'<A HREF="/stores/0">Back</A>' in body
        after = (await fetch(base, "/stores/0")).text
        assert "<DD>Total seconds used for rate calculations: 0" in after
        assert "<DD>Retransmission Request Received Rate: 0.000000" in after
        assert "<DD>Retransmission Request Total Dropped: 3" in after  # since start
        w.d.run(2)
        assert (await fetch(base, "/stores/0?format=json")).json()["seconds"] == 2


@async_test()
async def test_hostile_topic_name_is_escaped_everywhere() -> None:
    w = World(topic=HOSTILE, pattern="(?s).*")  # PCRE "." stops at a newline
    async with w.monitor() as mon:
        base = f"http://127.0.0.1:{mon.port}"
        escaped = ('evil&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#x27;&lt;/A&gt;'
                   ' -  &lt;A HREF=&quot;/x&quot;&gt;1(2)&lt;/A&gt; &#10;next')
        for path in ("/stores/0", f"/stores/0/{w.src_id}", f"/stores/0/{w.src_id}/{w.rcv_id}"):
            text = (await fetch(base, path)).text
            assert "<script>" not in text and 'HREF="/x"' not in text
            assert escaped in text
            # the topic stays on one line: line-based scrapers still see one field
            assert all("next" not in line or escaped in line for line in text.splitlines())
            data = (await fetch(base, path + "?format=json")).json()
            topic = data["topics"][0]["topic"] if path == "/stores/0" else data["topic"]
            assert topic == HOSTILE
        store = (await fetch(base, "/stores/0")).text
        assert links(field(store, r'<UL><LI>"[^"]*" -  (.*)</UL>')) == [
            {"href": f"/stores/0/{w.src_id}", "reg_id": w.src_id, "session_id": 77}]


def test_store_name_is_escaped() -> None:
    core = StoreCore(StoreSettings(name="<b>&store", ip="10.0.0.9", port=1))
    body = WebMonitor([core], version="1").render("/stores").body.decode()
    assert '<LI>Store 0:<A HREF="/stores/0">&lt;b&gt;&amp;store</A>' in body


@async_test()
async def test_http_errors() -> None:
    w = World()
    async with w.monitor() as mon:
        base, port = f"http://127.0.0.1:{mon.port}", mon.port
        for path in ("/nope", "/stores/1", "/stores/x", f"/stores/0/{w.src_id + 1}",
                     f"/stores/0/{w.src_id}/{w.rcv_id + 1}", "/stores/0/reset/1",
                     "/stores/0/1/2/3", "/../../etc/passwd", "/stores/0/..%2f..%2fetc",
                     "/index.html"):
            got = await fetch(base, path)
            assert got.status == 404, path
            assert got.headers["connection"] == "close"
        missing = await fetch(base, "/stores/7?format=json")
        assert missing.status == 404
        assert missing.json()["detail"] == "no store 7 (this daemon has 1)"

        for method in ("PUT", "DELETE", "OPTIONS"):
            got = await fetch(base, "/stores/0/reset", method=method)
            assert got.status == 405, method
            assert got.headers["allow"] == "GET, HEAD, POST"
            got = await fetch(base, "/stores/0", method=method)
            assert got.status == 405, method
            assert got.headers["allow"] == "GET, HEAD"
        assert (await fetch(base, "/stores/0/reset", method="POST")).status == 403  # no token
        assert w.store.rx.since == 0.0, "a refused method must not reset"

        bad_requests = [
            b"GET /stores\r\n\r\n",                                   # no version
            b"GET  /stores HTTP/1.1\r\nHost: a\r\n\r\n",              # double space
            b"GET stores HTTP/1.1\r\nHost: a\r\n\r\n",                # not a path
            b"GET /stores HTTP/1.1\r\n\r\n",                          # no Host
            b"GET /stores HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",    # two Hosts
            b"GET /stores HTTP/1.1\r\nHost a\r\n\r\n",                # no colon
            b"GET /stores HTTP/1.1\r\nHost : a\r\n\r\n",              # space before colon
            b"GET /stores HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",    # obs-fold
            b"GET /stores%zz HTTP/1.1\r\nHost: a\r\n\r\n",            # bad escape
            b"GET /stores%ff HTTP/1.1\r\nHost: a\r\n\r\n",            # not UTF-8
            b"GET /stores?format=xml HTTP/1.1\r\nHost: a\r\n\r\n",    # bad format
            b"GET /stores?x=1 HTTP/1.1\r\nHost: a\r\n\r\n",           # unknown parameter
            b"GET /stores HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody",
            b"GET /stores HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"GET /st\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",           # raw non-ASCII
            b"G(T /stores HTTP/1.1\r\nHost: a\r\n\r\n",               # bad method token
            b"GET /stores HTTP/1.1\r\nHost: a\rb\r\n\r\n",            # stray CR
        ]
        for request in bad_requests:
            status, headers, _ = await raw(port, request)
            assert status == 400, request
            assert headers["connection"] == "close"

        status, _, _ = await raw(port, b"GET /stores HTTP/2.0\r\nHost: a\r\n\r\n")
        assert status == 505
        status, _, _ = await raw(port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n")
        assert status == 414
        many = b"".join(b"X-%d: 1\r\n" % i for i in range(200))
        status, _, _ = await raw(port, b"GET / HTTP/1.1\r\nHost: a\r\n" + many + b"\r\n")
        assert status == 431
        status, _, _ = await raw(port, b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * 9000
                                 + b"\r\n\r\n")
        assert status == 431

        # what is fine: HTTP/1.0 without Host, absolute-form, a leading empty line, LF only,
        # the doubled slash store_scraper produces, and a trailing slash
        for request in (b"GET /stores HTTP/1.0\r\n\r\n",
                        b"GET http://a/stores HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                        b"\r\nGET /stores HTTP/1.0\r\n\r\n",
                        b"GET /stores HTTP/1.0\n\n",
                        b"GET //stores/ HTTP/1.0\r\n\r\n",
                        b"GET /%73tores HTTP/1.0\r\n\r\n"):
            status, headers, body = await raw(port, request)
            assert status == 200, request
            assert b'<LI>Store 0:<A HREF="/stores/0">store1</A>' in body
            assert headers["content-security-policy"] == \
                "default-src 'none'; form-action 'self'"
            assert headers["x-content-type-options"] == "nosniff"

        head = await fetch(base, "/stores/0", method="HEAD")
        get = await fetch(base, "/stores/0")
        assert head.status == 200 and head.body == b""
        assert head.headers["content-length"] == str(len(get.body))
    assert mon.stats["errors"] > 0


@async_test()
async def test_keep_alive_and_stop_closes_idle_connections() -> None:
    w = World()
    mon = w.monitor(limits=HttpLimits(max_requests=3))
    _, port = await mon.start()

    async def session(paths: list[bytes]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                                   list[str]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        modes = []
        for path in paths:
            writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers, _ = parse_response(head)
            assert status == 200
            body = await reader.readexactly(int(headers["content-length"]))
            assert body.startswith(b"<!DOCTYPE html>")
            modes.append(headers["connection"])
        return reader, writer, modes

    # the quota of requests per connection ends with an announced close
    reader, writer, modes = await session([b"/", b"/stores", b"/stores/0"])
    assert modes == ["keep-alive", "keep-alive", "close"]
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()

    reader, writer, modes = await session([b"/stores"])
    assert modes == ["keep-alive"]
    await mon.stop()  # must not wait for the idle keep-alive connection's timeout
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@async_test()
async def test_idle_client_is_dropped_after_the_header_timeout() -> None:
    mon = WebMonitor([], version="1", limits=HttpLimits(header_timeout=0.2))
    async with mon:
        reader, writer = await asyncio.open_connection("127.0.0.1", mon.port)
        writer.write(b"GET / HTTP/1.1\r\n")  # and never finishes the head
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert time.monotonic() - started < 3
        writer.close()


@async_test()
async def test_store_list_from_a_callable_follows_restarts() -> None:
    d = SimDeployment(seed=2)
    d.add_store("alpha")
    d.add_store("beta", port=14568)
    d.run(0.5)
    mon = WebMonitor(lambda: list(d.stores.values()), version="1", clock=lambda: d.now,
                     max_age=0.0)
    async with mon:
        base = f"http://127.0.0.1:{mon.port}"
        listing = (await fetch(base, "/stores?format=json")).json()
        assert [s["name"] for s in listing["stores"]] == ["alpha", "beta"]
        assert "<H3>Store 1: beta</H3>" in (await fetch(base, "/stores/1")).text
        d.run(4)
        assert (await fetch(base, "/stores/1?format=json")).json()["seconds"] == 4
        d.restart("beta")
        d.run(1)
        assert (await fetch(base, "/stores/1?format=json")).json()["seconds"] == 1


@async_test()
async def test_scraper_regexes_find_what_they_look_for() -> None:
    """Crawl as UltraMessaging's store_scraper does (docs/semantics.md §4): fetch ``$W/$HREF``,
    match each pattern line by line, with the patterns it uses."""
    w = World()
    second = w.d.add_source("src2", "topic.b", ume_session_id=5)
    assert w.d.run_until(lambda: second.complete, 10)
    async with w.monitor() as mon:
        base = f"http://127.0.0.1:{mon.port}"

        def per_line(text: str, pattern: str) -> list[str]:
            return [m[1] for line in text.splitlines() if (m := re.search(pattern, line))]

        assert (await fetch(base, "")).status == 200
        listing = (await fetch(base, "/stores")).text
        hrefs = per_line(listing, r'>Store \d+:<A HREF="([^"]+)"')
        assert hrefs == ["/stores/0"]
        store = (await fetch(base, "/" + hrefs[0])).text  # "//stores/0", as the scraper asks
        assert per_line(store, r"H3>Store \d+: ([^<]+)<") == ["store1"]
        ids: list[str] = []
        for line in store.splitlines():
            while (m := re.search(r'(LI>"[^"]+" - +)<A HREF="([^"]+)">[^/]+/A> ', line)):
                ids.append(m[2])
                line = line[:m.start()] + m[1] + line[m.end():]
        expected = sorted(f"/stores/0/{r}" for r in w.store.sources)
        assert sorted(ids) == expected and len(ids) == 2
        for href in ids:
            page = await fetch(base, "/" + href)
            assert page.status == 200
            reg_id = int(href.rsplit("/", 1)[1])
            src = w.store.sources[reg_id]
            lead = src.repo.lead_sqn if src.repo is not None else None
            text = page.text
            assert per_line(text, r"LI>Sync: \[([^\]]+)\]") == \
                [", ".join(["-" if lead is None else f"{lead:x}"] * 3)]
            assert per_line(text, r'DD>Topic: "([^"]+)"') == [src.topic]
            assert per_line(text, r"H3>(\d+):") == [str(reg_id)]
            assert per_line(text, r"H3>\d+: Source \[\d+ ([^ ]+) ") == \
                [f"{src.request_addr[0]}.{src.request_addr[1]}"]
            assert src.transport is not None
            assert per_line(text, r"DD>LBM Stats: \[([^\]]+)\]") == \
                [f"TCP:{src.transport[0]}:{src.transport[1]}"]
            assert per_line(text, r"DD>Session ID: (\d+)") == [str(src.session_id)]


@async_test()
async def test_serves_cores_driven_by_the_asyncio_host() -> None:
    """The deployment mode: a store core on real sockets and the monitor on the same loop,
    both on the default clock (``loop.time()``)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    store_port = probe.getsockname()[1]
    probe.close()
    core = StoreCore(StoreSettings(name="live", ip="127.0.0.1", port=store_port),
                     now=asyncio.get_running_loop().time())
    async with AioHost() as host:
        await host.listen_tcp(core, core.addr)
        async with WebMonitor([core], version=VERSION) as mon:
            base = f"http://127.0.0.1:{mon.port}"
            # the core's own timers (source check every 0.75 s) move its clock on the loop
            await asyncio.sleep(1.6)
            data = (await fetch(base, "/stores/0?format=json")).json()
            assert data["interface"] == f"127.0.0.1:{store_port}"
            assert data["seconds"] >= 1
            status, _, _ = await post(mon.port, data["reset"]["href"],
                                      f"token={data['reset']['token']}".encode())
            assert status == 200
            assert (await fetch(base, "/stores/0?format=json")).json()["seconds"] == 0


# --- issue 22 item 7: transport label, receiver request port, reset by POST -----------------


@async_test()
async def test_lbtru_source_is_shown_with_its_lbtru_source_string() -> None:
    """The LBM Stats source string names the transport the source really uses: an LBT-RU
    source is ``LBT-RU:ip:port:<session id %08x>``, not ``TCP:…``."""
    w = World(transport="lbt-ru")
    assert w.src.lbtru_session is not None
    sid = w.src.lbtru_session.session_id
    assert sid != 0
    transport = w.store.sources[w.src_id].transport
    assert transport is not None
    expected = f"LBT-RU:{transport[0]}:{transport[1]}:{sid:08x}"
    async with w.monitor() as mon:
        base = f"http://127.0.0.1:{mon.port}"
        page = (await fetch(base, f"/stores/0/{w.src_id}")).text
        assert f"<DD>LBM Stats: [{expected}]" in page
        assert "TCP:" not in page
        data = (await fetch(base, f"/stores/0/{w.src_id}?format=json")).json()
        assert data["source_string"] == expected
        assert scrape_source(page, "memory") | {"last_activity": None} == \
            data | {"last_activity": None}


@async_test(60)
async def test_receiver_title_shows_a_real_port_for_a_runtime_receiver(tmp_path: Path) -> None:
    """A receiver that announces request port 0 in its registration (a client with no request
    port; ``ump receiver`` announces the one it listens on): the receiver page title shows
    where the store really reaches it (the address its registration connection comes from),
    never port 0."""
    from reference_impl import runtime
    from reference_impl.config import ClientConfig
    from reference_impl.config.store_xml import parse_store_config
    from reference_impl.config.store_xml_writer import disk_store_xml
    from reference_impl.receiver import ReceiverCore

    resolver = ("127.0.0.1", _free_port(socket.SOCK_DGRAM))
    store_port = _free_port(socket.SOCK_STREAM)

    def client(**sections: dict[str, object]) -> ClientConfig:
        mapping: dict[str, dict[str, object]] = {
            "context": {"resolver_unicast_daemon": f"{resolver[0]}:{resolver[1]}"}}
        for scope, values in sections.items():
            mapping.setdefault(scope, {}).update(values)
        return ClientConfig.from_mapping(mapping)

    config = parse_store_config(disk_store_xml("s", store_port, r"t\..*", repository="memory"))
    async with AioHost() as host:
        await runtime.run_resolver(host, resolver)
        (store,) = await runtime.start_stores(host, config, resolver=resolver, base=tmp_path)
        receiver = ReceiverCore("t.x", runtime.receiver_config(client()), ip="127.0.0.1",
                                request_port=0, resolver=resolver, now=host.now())
        with host.starting(receiver):
            await host.bind_udp(receiver, ("127.0.0.1", 0))
        source = await runtime.start_source(host, "t.x", client(
            source={"ume_store": [f"127.0.0.1:{store_port}"]}))
        await host.wait_until(lambda: source.complete, timeout=15)
        await host.wait_until(lambda: bool(receiver.registered_stores), timeout=15)
        assert receiver.request_addr[1] == 0  # what the registration announces
        conn = receiver.connection_to(store.addr)
        assert conn is not None
        local_ip, local_port = conn.key[0]
        assert local_port != 0
        src_id, rcv_id = next(iter(store.sources)), next(iter(store.receivers))
        async with WebMonitor([store], version=VERSION) as mon:
            base = f"http://127.0.0.1:{mon.port}"
            page = (await fetch(base, f"/stores/0/{src_id}/{rcv_id}")).text
            assert f"<H3>{rcv_id}: Receiver [0 {local_ip}.{local_port} " in page
            assert ".0 " not in field(page, r"<H3>(.*)</H3>")
            data = (await fetch(base, f"/stores/0/{src_id}/{rcv_id}?format=json")).json()
            assert data["request_addr"] == f"{local_ip}:{local_port}"
            # the source announced its real request port: shown as announced
            source_page = (await fetch(base, f"/stores/0/{src_id}")).text
            assert f"[0 {source.request_addr[0]}.{source.request_addr[1]} " in source_page


def _reset_form(page: str) -> tuple[str, dict[str, str]]:
    """(action, fields) of the page's Reset Rate Stats form."""
    form = re.search(r'<FORM METHOD="POST" ACTION="([^"]+)">(.*?)</FORM>', page, re.S)
    assert form is not None, page
    fields = dict(re.findall(r'<INPUT TYPE="hidden" NAME="([^"]+)" VALUE="([^"]*)">', form[2]))
    assert 'VALUE="Reset Rate Stats"' in form[2]
    return html.unescape(form[1]), fields


async def post(port: int, path: str, body: bytes, *, headers: tuple[str, ...] = (),
               content_type: str = "application/x-www-form-urlencoded"
               ) -> tuple[int, dict[str, str], bytes]:
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
            f"Content-Type: {content_type}", f"Content-Length: {len(body)}", *headers]
    return await raw(port, ("\r\n".join(head) + "\r\n\r\n").encode() + body)


@async_test()
async def test_reset_is_a_post_from_the_store_page_form_and_get_changes_nothing() -> None:
    w = World()
    w.d.run(3)
    async with w.monitor() as mon:
        base, port = f"http://127.0.0.1:{mon.port}", mon.port
        seconds = (await fetch(base, "/stores/0?format=json")).json()["seconds"]
        assert seconds >= 4
        for method in ("GET", "HEAD"):
            got = await fetch(base, "/stores/0/reset", method=method)
            assert got.status == 200, method
            assert (await fetch(base, "/stores/0?format=json")).json()["seconds"] == seconds, \
                f"{method} must not reset"
        # GET shows the form (for a bookmarked link), as the store page does
        action, fields = _reset_form((await fetch(base, "/stores/0/reset")).text)
        store_action, store_fields = _reset_form((await fetch(base, "/stores/0")).text)
        assert (action, fields) == (store_action, store_fields) == \
            ("/stores/0/reset", {"token": fields["token"]})
        assert len(fields["token"]) >= 16
        token = fields["token"]

        # refused: no token, a wrong token, a cross-site Origin, a body that is too big
        for body, extra in ((b"", ()), (b"token=wrong", ()), (b"x=1", ()),
                            (f"token={token}".encode(), ("Origin: http://evil.example",)),
                            (f"token={token}".encode(),
                             ("Sec-Fetch-Site: cross-site",))):
            status, headers, _ = await post(port, action, body, headers=extra)
            assert status == 403, (body, extra)
            assert headers["connection"] == "close"
        status, _, _ = await post(port, action, b"token=" + b"a" * 5000)
        assert status == 413
        status, _, _ = await post(port, action, f"token={token}".encode(),
                                  content_type="text/plain")
        assert status == 415
        status, headers, _ = await post(port, "/stores/0", f"token={token}".encode())
        assert status == 405 and headers["allow"] == "GET, HEAD"
        assert (await fetch(base, "/stores/0?format=json")).json()["seconds"] == seconds
        for method in ("PUT", "DELETE"):
            got = await fetch(base, "/stores/0/reset", method=method)
            assert got.status == 405 and got.headers["allow"] == "GET, HEAD, POST"

        # the form's POST (same origin) resets
        status, _, body = await post(port, action, f"token={token}".encode(),
                                     headers=(f"Origin: http://127.0.0.1:{port}",))
        assert status == 200
        assert b"Rate Statistics have been reset" in body
        assert b'<A HREF="/stores/0">Back</A>' in body
        assert (await fetch(base, "/stores/0?format=json")).json()["seconds"] == 0
        w.d.run(2)
        status, _, body = await post(port, action + "?format=json", f"token={token}".encode())
        assert status == 200 and json.loads(body)["message"] == "Rate Statistics have been reset"
        assert (await fetch(base, "/stores/0?format=json")).json()["seconds"] == 0


@async_test()
async def test_store_pages_show_proxy_sources() -> None:
    """Three stores of a group elect a proxy for a departed source: over real HTTP, exactly
    one store page says it runs the proxy, the others follow that store, and each page's JSON
    holds what its HTML shows (issue 20: "the web monitor shows proxy sources")."""
    from tests.reference_impl.test_proxy_scenarios import NAMES, SETTLE, TOPIC, deployment

    d, _ = deployment(3)
    cores = [d.stores[n] for n in NAMES]
    async with WebMonitor(cores, version=VERSION, clock=lambda: d.now,
                          wall_clock=lambda: WALL, max_age=0.0) as mon:
        base = f"http://127.0.0.1:{mon.port}"
        before = [(await fetch(base, f"/stores/{i}?format=json")).json()["proxy_sources"]
                  for i in range(3)]
        assert [p["running"] for p in before] == [0, 0, 0]
        assert all(p["allowed"] and [w["state"] for w in p["sources"]] == ["active"]
                   for p in before)
        d.kill("src")
        d.run(SETTLE)
        pages = [(await fetch(base, f"/stores/{i}")).text for i in range(3)]
        data = [(await fetch(base, f"/stores/{i}?format=json")).json() for i in range(3)]
    for page, json_page in zip(pages, data, strict=True):
        assert scrape_proxy(page) == json_page["proxy_sources"]
    proxies = [p["proxy_sources"] for p in data]
    (holder,) = [i for i, p in enumerate(proxies) if p["running"] == 1]
    assert [i for i, c in enumerate(cores) if c.proxies() == [TOPIC]] == [holder]
    for i, p in enumerate(proxies):
        (watched,) = p["sources"]
        assert watched["topic"] == TOPIC and watched["holder"] == holder
        assert watched["state"] == ("proxy" if i == holder else "following")
        assert (watched["token"] is not None) == (i == holder)
        assert p["index"] == i and len(p["group"]) == 3
    assert f'state proxy, holder {holder}, token ' in pages[holder]


@async_test()
async def test_a_store_without_allow_proxy_source_says_so() -> None:
    w = World()
    async with w.monitor() as mon:
        page = await fetch(f"http://127.0.0.1:{mon.port}", "/stores/0")
    assert "<DD>Proxy Sources: not allowed" in page.text
