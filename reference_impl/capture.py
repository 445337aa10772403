"""Record real loopback traffic to a pcap while a scenario runs on :mod:`reference_impl.aio`.

The simulator writes its own pcap; a run on real sockets needs the kernel's view instead, so
``ump dissect``, tshark and the Spark reader can check what actually went over the wire.
:class:`LoopbackCapture` wraps an external capture tool, because capturing needs privileges
(root, or CAP_NET_RAW + CAP_NET_ADMIN) that a test process should not have to hold itself.

Backends, in the order ``backend="auto"`` tries them:

* ``tcpdump`` (``apt-get install tcpdump``);
* ``dumpcap`` (ships with tshark, which the wire tests need anyway);
* ``scapy``'s ``AsyncSniffer`` (in-process; filters in Python, as compiling BPF would need one
  of the tools above).  It is the slowest and cannot report kernel drops (``dropped`` stays
  ``None``), so it is only the fallback; its socket gets a 64 MiB receive buffer to absorb
  bursts.

The two hard parts are the ends of the capture:

* **Start**: :meth:`LoopbackCapture.start` returns only once the capture is live: tcpdump's
  "listening on" (printed after the filter is installed) or scapy's start callback.  dumpcap
  prints "Capturing on" *before* it captures, so for it a start probe (a UDP datagram like
  the stop sentinel below) is sent until it shows up in the recorded stream.
* **Stop**: a capture tool stopped with SIGINT can lose packets still in the kernel's ring
  buffer.  So :meth:`LoopbackCapture.stop` first sends a *sentinel* UDP datagram with a unique
  payload through the interface and waits until it appears in the recorded stream: the kernel
  hands packets to the capture in order, so everything sent before the sentinel is recorded
  by then.  Sentinel and probe frames are removed from the file afterwards.  The tools write
  the pcap to a pipe (``-w -``) that this module copies to the file, which is how it can watch
  for the sentinel, and why tcpdump's privilege drop never meets a directory it cannot write.  A
  sentinel can only travel over ``lo`` or ``any``; on other interfaces the capture waits a short
  grace period instead.

Every packet counts: a sentinel that never shows up raises :class:`CaptureError`, and kernel
drops reported by the tool are logged and kept in :attr:`LoopbackCapture.dropped`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal

from wire.errors import WireError
from wire.pcap import LINKTYPE_ETHERNET, PcapWriter, has_nanosecond_stamps, read_capture

__all__ = ["Backend", "CaptureError", "LoopbackCapture", "available_backends"]

log = logging.getLogger(__name__)

Backend = Literal["auto", "tcpdump", "dumpcap", "scapy"]
SNAPLEN = 262144  # above the loopback MTU (65536): frames are never truncated
SENTINEL_IFACES = ("lo", "any")
BUFFER_KIB = 64 * 1024
"""Kernel capture buffer.  Not "immediate mode": libpcap then uses a ring of fixed slots as
big as the MTU, about 30 of them for loopback's 64 KiB MTU, and a burst of small packets
overflows it.  Without it packets are packed into blocks handed over when full or after
tcpdump's 1 s timeout; the stop sentinel covers that delay."""
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux: above rmem_max, as root
GRACE = 0.25  # wait before stopping when no sentinel can be sent


class CaptureError(RuntimeError):
    """The capture could not start, or could not prove it recorded everything."""


def available_backends() -> list[str]:
    """Capture backends installed here, in the order ``auto`` tries them (privileges aside)."""
    found = [tool for tool in ("tcpdump", "dumpcap") if shutil.which(tool)]
    try:
        import scapy.sendrecv  # noqa: F401
    except ImportError:
        pass
    else:
        found.append("scapy")
    return found


def _check_ports(ports: Iterable[int] | None) -> list[int] | None:
    if ports is None:
        return None
    out = []
    for p in ports:
        if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= 65535:
            raise ValueError(f"capture port must be an integer in 1..65535, not {p!r}")
        out.append(p)
    if not out:
        raise ValueError("ports must name at least one port (or be None for all traffic)")
    return out


class LoopbackCapture:
    """Capture traffic on ``iface`` (default loopback) to the pcap file ``path``.

    ``ports`` limits the capture to TCP and UDP packets from or to those ports; ``None`` keeps
    everything.  Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, path: str | Path, ports: Iterable[int] | None = None, iface: str = "lo",
                 *, backend: Backend = "auto", start_timeout: float = 10.0,
                 stop_timeout: float = 10.0) -> None:
        if backend not in ("auto", "tcpdump", "dumpcap", "scapy"):
            raise ValueError(f"unknown capture backend {backend!r}")
        self.path = Path(path)
        self.ports = _check_ports(ports)
        self.iface = iface
        self.requested: Backend = backend
        self.backend: str | None = None  # the one that started
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.frames: int | None = None  # frames in the file, after stop()
        self.dropped: int | None = None  # packets the kernel dropped, if the tool says
        self._secret = uuid.uuid4().hex.encode()  # in every probe and sentinel we send
        self._start_token = b"ump-capture-start:" + self._secret
        self._token = b"ump-capture-end:" + self._secret
        self._sentinel_sock: socket.socket | None = None
        self._runner: _ToolRun | _ScapyRun | None = None

    # --- public -------------------------------------------------------------------------------

    @property
    def uses_sentinel(self) -> bool:
        return self.iface in SENTINEL_IFACES

    def bpf_filter(self, sentinel_port: int | None = None) -> str:
        """The BPF expression the tools get: the ports, plus the sentinel's UDP port."""
        if self.ports is None:
            return ""
        expr = " or ".join(f"port {p}" for p in self.ports)
        return f"({expr}) or udp port {sentinel_port}" if sentinel_port else expr

    def start(self) -> LoopbackCapture:
        if self._runner is not None:
            raise CaptureError("capture already started")
        if not self.path.parent.is_dir():
            raise CaptureError(f"cannot write {self.path}: no directory {self.path.parent}")
        if self.iface != "any":  # checked here: scapy would quietly sniff another interface
            try:
                socket.if_nametoindex(self.iface)
            except OSError:
                raise CaptureError(f"no network interface {self.iface!r}") from None
        sentinel_port = None
        if self.uses_sentinel:
            self._sentinel_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._sentinel_sock.bind(("127.0.0.1", 0))  # receives it: no ICMP unreachable
            sentinel_port = int(self._sentinel_sock.getsockname()[1])
        candidates = ([self.requested] if self.requested != "auto"
                      else available_backends())
        if not candidates:
            self._close_sentinel()
            raise CaptureError("no capture backend: install tcpdump (apt-get install tcpdump), "
                               "tshark's dumpcap, or scapy")
        reasons = []
        for name in candidates:
            try:
                self._runner = self._launch(name, sentinel_port)
                if name == "dumpcap" and not self._probe(self._runner, self._start_token,
                                                          self.start_timeout):
                    self._runner.stop(self.stop_timeout)
                    self._runner.discard()
                    self._runner = None
                    raise CaptureError(f"no packet reached the capture within "
                                       f"{self.start_timeout} s")
            except CaptureError as exc:
                reasons.append(f"{name}: {exc}")
                continue
            self.backend = name
            log.debug("capturing on %s with %s (filter %r)", self.iface, name,
                      self.bpf_filter(sentinel_port))
            return self
        self._close_sentinel()
        raise CaptureError(f"cannot capture on {self.iface!r} (capturing needs root or "
                           "CAP_NET_RAW and CAP_NET_ADMIN): " + "; ".join(reasons))

    def stop(self) -> int:
        """Make sure every packet sent so far is recorded, stop, write the file; frame count."""
        runner = self._runner
        if runner is None:
            raise CaptureError("capture not started")
        self._runner = None
        try:
            if self._sentinel_sock is None:
                time.sleep(GRACE)
                complete = True
            else:
                complete = self._probe(runner, self._token, self.stop_timeout)
            runner.stop(self.stop_timeout)
        finally:
            self._close_sentinel()
        self.dropped = runner.dropped
        if self.dropped:
            log.warning("capture on %s: the kernel dropped %d packet(s)", self.iface,
                        self.dropped)
        self.frames = runner.finish(self.path, self._secret)
        if not complete:
            raise CaptureError(
                f"the capture's end marker never arrived within {self.stop_timeout} s: the last "
                f"packets may be missing from {self.path}")
        return self.frames

    def __enter__(self) -> LoopbackCapture:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._runner is None:
            return
        if exc is None:
            self.stop()
            return
        try:  # the body failed: keep what we have, but do not hide the body's error
            self.stop()
        except CaptureError as err:
            log.warning("capture stopped with an error after a failure: %s", err)

    # --- internals ----------------------------------------------------------------------------

    def _launch(self, name: str, sentinel_port: int | None) -> _ToolRun | _ScapyRun:
        bpf = self.bpf_filter(sentinel_port)
        if name == "scapy":
            ports = None if self.ports is None else {*self.ports, sentinel_port}
            return _ScapyRun(self.iface, ports, (self._start_token, self._token),
                             self.start_timeout)
        exe = shutil.which(name)
        if exe is None:
            raise CaptureError(f"{name} is not installed")
        if name == "tcpdump":
            argv = [exe, "-i", self.iface, "-w", "-", "-U", "-n", "-s", str(SNAPLEN),
                    "-B", str(BUFFER_KIB)] + ([bpf] if bpf else [])
            ready = "listening on"
        else:
            argv = [exe, "-i", self.iface, "-w", "-", "-P", "-s", str(SNAPLEN),
                    "-B", str(BUFFER_KIB // 1024)] + \
                (["-f", bpf] if bpf else [])
            ready = "Capturing on"
        raw = self.path.with_name(self.path.name + ".partial")
        return _ToolRun(name, argv, ready, (self._start_token, self._token), raw,
                        self.start_timeout)

    def _probe(self, runner: _ToolRun | _ScapyRun, token: bytes, timeout: float) -> bool:
        """Send ``token`` through the interface until the capture has recorded it."""
        if self._sentinel_sock is None:
            return True
        target = self._sentinel_sock.getsockname()
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while time.monotonic() < deadline:  # resend: the capture may drop one under load
                s.sendto(token, target)
                if runner.seen[token].wait(0.1):
                    return True
        return False

    def _close_sentinel(self) -> None:
        if self._sentinel_sock is not None:
            self._sentinel_sock.close()
            self._sentinel_sock = None


def _strip_sentinel(raw: Path, path: Path, token: bytes) -> int:
    """Move the capture in ``raw`` to ``path`` without the frames holding ``token`` (our
    probes and sentinels); returns the frame count.

    Two streaming passes (find, then copy), so a long capture is never held in memory.
    """
    frames, linktype, rewrite = 0, LINKTYPE_ETHERNET, False
    try:
        for rec in read_capture(raw):
            linktype = rec.linktype
            if token in rec.data:
                rewrite = True
            else:
                frames += 1
    except WireError as exc:  # a tool killed mid-record: what came before is still good
        log.warning("capture %s ends with a partial record (%s); keeping the complete ones",
                    raw, exc)
        rewrite = True  # rewrite, so the file is well-formed
    if not rewrite:
        os.replace(raw, path)
        return frames
    nanosecond = has_nanosecond_stamps(raw)
    with PcapWriter(path, linktype=linktype, nanosecond=nanosecond) as writer:
        try:
            for rec in read_capture(raw):
                if token not in rec.data:
                    writer.write(rec.ts, rec.data)
        except WireError:
            pass  # reported above
    raw.unlink()
    return frames


class _ToolRun:
    """An external capture tool writing pcap to our pipe; two threads drain its output."""

    def __init__(self, name: str, argv: list[str], ready_text: str, tokens: tuple[bytes, ...],
                 raw: Path, timeout: float) -> None:
        self.name = name
        self.seen = {token: threading.Event() for token in tokens}
        self.dropped: int | None = None
        self._ready = threading.Event()
        self._ready_text = ready_text
        self._stderr: list[str] = []
        self._raw: Path | None = raw
        try:
            self._fh: BinaryIO = open(raw, "wb")  # noqa: SIM115 - closed in stop()/_discard()
        except OSError as exc:
            raise CaptureError(f"cannot write {raw}: {exc.strerror or exc}") from exc
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         stdin=subprocess.DEVNULL)
        except OSError as exc:
            self._discard()
            raise CaptureError(f"cannot run {argv[0]}: {exc}") from exc
        self._err_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._out_thread = threading.Thread(target=self._copy_stdout, daemon=True)
        self._err_thread.start()
        self._out_thread.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.02):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                self._err_thread.join(1)
                self._out_thread.join(1)
                self._discard()
                said = " ".join(line.strip() for line in self._stderr).strip()
                if self.proc.returncode is not None and self.proc.returncode != -9:
                    raise CaptureError(f"{name} exited: {said or 'no message'}")
                raise CaptureError(f"{name} did not start capturing within {timeout} s "
                                   f"({said or 'no message'})")

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self._stderr.append(line)
            if self._ready_text in line:
                self._ready.set()

    def _copy_stdout(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        tail = b""
        keep = max(map(len, self.seen)) - 1
        while chunk := os.read(fd, 1 << 16):
            self._fh.write(chunk)
            window = tail + chunk
            for token, event in self.seen.items():
                if not event.is_set() and token in window:
                    event.set()
            tail = window[-keep:]
        self._fh.flush()

    def stop(self, timeout: float) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGINT for %s s; killing it", self.name, timeout)
            self.proc.kill()
            self.proc.wait()
        self._out_thread.join(timeout)
        self._err_thread.join(timeout)
        self._fh.close()
        said = "".join(self._stderr)
        # tcpdump: "3 packets dropped by kernel"; dumpcap: "received/dropped on ...: 9/0"
        m = re.search(r"(\d+) packets? dropped by kernel", said) or \
            re.search(r"received/dropped on interface '.*?': \d+/(\d+)", said)
        self.dropped = int(m.group(1)) if m else None

    def finish(self, path: Path, secret: bytes) -> int:
        assert self._raw is not None
        if self._raw.stat().st_size == 0:
            said = "".join(self._stderr).strip()
            self._discard()
            raise CaptureError(f"{self.name} wrote nothing: {said or 'no message'}")
        frames = _strip_sentinel(self._raw, path, secret)
        self._raw = None
        return frames

    def discard(self) -> None:
        self._discard()

    def _discard(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        if self._raw is not None:
            self._raw.unlink(missing_ok=True)
            self._raw = None


class _ScapyRun:
    """Scapy's AsyncSniffer, filtering ports in Python (no BPF compiler without the tools)."""

    def __init__(self, iface: str, ports: set[int | None] | None, tokens: tuple[bytes, ...],
                 timeout: float) -> None:
        try:
            from scapy.config import conf
            from scapy.layers.inet import TCP, UDP
            from scapy.sendrecv import AsyncSniffer
        except ImportError as exc:
            raise CaptureError("scapy is not installed") from exc
        try:
            # L2Socket, not the sniffer's default listen socket: it skips the outgoing copy of
            # each packet, which loopback shows twice (libpcap skips it too)
            self.sock = conf.L2socket(iface=iface)
        except Exception as exc:
            raise CaptureError(f"scapy could not open {iface!r}: {exc}") from exc
        # scapy's 64 KiB default overflows on a burst of a few hundred packets, silently
        for option in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
            try:
                self.sock.ins.setsockopt(socket.SOL_SOCKET, option, BUFFER_KIB * 1024)
                break
            except OSError:
                continue
        self.seen = {token: threading.Event() for token in tokens}
        self.dropped: int | None = None
        started = threading.Event()

        def wanted(pkt: Any) -> bool:
            if ports is None:
                return True
            for layer in (TCP, UDP):
                if layer in pkt:
                    return pkt[layer].sport in ports or pkt[layer].dport in ports
            return False

        def is_sentinel(pkt: Any) -> bool:
            raw = bytes(pkt)
            for token, event in self.seen.items():
                if token in raw:
                    event.set()
            return False  # keep sniffing until stop(): packets after it are kept too

        self.sniffer = AsyncSniffer(opened_socket=self.sock, store=True, lfilter=wanted,
                                    started_callback=started.set, stop_filter=is_sentinel)
        self.sniffer.start()
        deadline = time.monotonic() + timeout
        while not started.wait(0.02):
            thread = getattr(self.sniffer, "thread", None)
            if (thread is not None and not thread.is_alive()) or time.monotonic() > deadline:
                err = getattr(self.sniffer, "exception", None)
                if thread is not None and thread.is_alive():
                    try:
                        self.sniffer.stop()
                    except Exception as exc:
                        err = err or exc
                self.sock.close()
                raise CaptureError(f"scapy could not sniff on {iface!r}: {err or 'timed out'}")

    def stop(self, timeout: float) -> None:
        try:
            self.packets: list[Any] = list(self.sniffer.stop(join=True) or [])
        finally:
            self.sock.close()

    def discard(self) -> None:
        pass

    def finish(self, path: Path, secret: bytes) -> int:
        from scapy.utils import wrpcap
        keep = [p for p in self.packets if secret not in bytes(p)]
        wrpcap(str(path), keep)
        return len(keep)
