"""``ump resolver``, ``ump store``, ``ump source``, ``ump receiver`` and ``ump demo``.

Each command is one UM process of the reference implementation on real sockets (see
:mod:`reference_impl.runtime`); ``ump demo`` starts all of them as separate processes on
loopback, kills and restarts the receiver and the source mid-stream, and checks that every
message arrived once and in order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, TextIO

from reference_impl import consumer, explicit_ack, runtime
from reference_impl.aio import AioHost, run_forever
from reference_impl.config import ClientConfig, ConfigError, profile_names
from reference_impl.config.store_xml import StoreDaemonConfig, load_store_config
from reference_impl.config.values import one_line, shown
from reference_impl.events import (
    Addr,
    FlightSizeNotification,
    MessageDelivered,
    MessageStable,
    ReceiverDeregistered,
    SourceDeregistered,
    SourceRegistrationComplete,
    StoreUnresponsive,
)
from reference_impl.repository import StoreFileError, directory_problem, state_file
from reference_impl.source import SendError

log = logging.getLogger("ump")
WOULD_BLOCK_LINE = "send would block (flight size reached); retrying once the flight has room"
"""What ``ump source --nonblocking`` prints (once, after ``ump source: ``) the first time a send
returns "would block"; the reference source profile's ``would_block_text`` is part of it."""
INTERRUPTED = 130
"""Exit status of ``ump source`` cut short by Ctrl-C (SIGINT), the shell's convention."""


def _addr(text: str) -> Addr:
    host, _, port = text.rpartition(":")
    try:
        return (host or "127.0.0.1", int(port))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected IP:PORT, got {text!r}") from None


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)


def register(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    common.add_argument("--profile", choices=profile_names(), default="current",
                        help="default values: the current product or the guide (5.3)")

    p = sub.add_parser("resolver", parents=[common], help="run the unicast resolver daemon",
                       description="Relay LBMR topic resolution between contexts (lbmrd role).")
    p.add_argument("--listen", type=_addr, default=runtime.DEFAULT_RESOLVER,
                   help="UDP address to listen on (default 127.0.0.1:15380)")
    p.set_defaults(handler=cmd_resolver)

    p = sub.add_parser("store", parents=[common], help="run a store daemon (umestored)",
                       description="Run the stores of a umestored XML configuration file.")
    p.add_argument("-c", "--config", required=True, help="umestored XML configuration file")
    p.add_argument("--resolver", type=_addr, default=None,
                   help="resolver daemon IP:PORT (default: from <lbm-config>, else "
                        "127.0.0.1:15380)")
    p.set_defaults(handler=cmd_store)

    p = sub.add_parser("source", parents=[common], help="run a persistent source",
                       description="Register with the configured stores and send messages.")
    p.add_argument("-c", "--config", help="UM configuration file (ume_store ...)")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=1000, help="messages to send (default 1000)")
    p.add_argument("--until-sqn", type=int, default=None,
                   help="send until the next sequence number is at or above this one "
                        "(resumes after restarts; a fragmented message takes one number per "
                        "fragment, and one that starts below it is sent whole)")
    p.add_argument("--rate", type=float, default=0.0, help="messages per second (0: max)")
    p.add_argument("--size", type=int, default=64, help="payload bytes (default 64)")
    p.add_argument("--linger", type=float, default=2.0,
                   help="seconds to wait for stability at the end (default 2)")
    p.add_argument("--deregister", action="store_true",
                   help="deregister from every store at the end (SIGUSR1 does it at any time)")
    p.add_argument("--nonblocking", action="store_true",
                   help="send like a non-blocking application: a send refused with \"would "
                        "block\" (flight size reached, ume_flight_size_behavior block) is "
                        "reported, counted and retried once the flight has room")
    p.add_argument("--wait-start", action="store_true",
                   help="once registered, send nothing until SIGUSR2 (lets receivers register "
                        "before the first message, which RPP requires)")
    p.set_defaults(handler=cmd_source)

    p = sub.add_parser("receiver", parents=[common], help="run a persistent receiver",
                       description="Receive a topic; print or log every delivered message.")
    p.add_argument("-c", "--config", help="UM configuration file")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=0, help="exit after this many (0: never)")
    p.add_argument("--out", help="append deliveries as JSON lines to this file")
    p.add_argument("--reg-id", type=int, default=0, help="RegID to ask the stores for")
    p.add_argument("--dedupe", action="store_true",
                   help="skip deliveries at or below the highest sequence number already in "
                        "--out (the application-level de-duplication the guide asks for)")
    p.add_argument("--consume-rate", type=float, default=0.0, metavar="R",
                   help="the application consumes at most R messages per second and "
                        "acknowledges each once consumed (ume_explicit_ack_only 1; default 0: "
                        "at once)")
    p.add_argument("--explicit-ack", type=int, default=0, metavar="MS",
                   help="explicit ACKs only (ume_explicit_ack_only 1): every MS ms the "
                        "application acknowledges the newest message delivered so far")
    p.add_argument("--ack-file", metavar="PATH",
                   help="explicit ACKs only (ume_explicit_ack_only 1): the application "
                        "acknowledges the sequence numbers appended to PATH, one a line "
                        "(SQN or SOURCE SQN), each once its message was delivered")
    p.add_argument("--consume-file", metavar="PATH",
                   help="the application retains every delivery and consumes (deletes) the "
                        "sequence numbers appended to PATH, one a line, in that order (any "
                        "order): only the contiguous run consumed is acknowledged")
    p.add_argument("--deregister", action="store_true",
                   help="deregister from every store once --count messages were delivered, "
                        "then exit (SIGUSR1 deregisters at any time; the receiver then goes on "
                        "receiving without acknowledging)")
    p.set_defaults(handler=cmd_receiver)

    p = sub.add_parser("demo", parents=[common],
                       help="resolver, store, source and receiver on loopback, with restarts",
                       description="Start every reference process on loopback, kill and "
                                   "restart the receiver and the source mid-stream, and check "
                                   "that every message arrived once and in order.")
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--workdir", help="where configurations, logs and state go (default: temp)")
    p.add_argument("--store-port", type=int, default=None, metavar="PORT",
                   help="the store's TCP port (default: a free one; 14567 with --capture; "
                        "0: a free one)")
    p.add_argument("--resolver-port", type=int, default=None, metavar="PORT",
                   help="the resolver daemon's UDP port (default: a free one; 15380 with "
                        "--capture; 0: a free one)")
    p.add_argument("--capture", help="also capture the loopback traffic to this pcap")
    p.add_argument("--transport", choices=("tcp", "lbt-ru", "lbt-rm"), default="tcp",
                   help="the source's data transport (default tcp)")
    p.add_argument("--rpp", action="store_true",
                   help="receiver-paced persistence instead: an RPP source, a fast and a slow "
                        "blocking receiver, no crashes; checks the source was paced")
    p.set_defaults(handler=cmd_demo)


def _run(setup: Any, verbose: bool, sigint_status: int = 0) -> int:
    _setup_logging(verbose)
    try:
        return run_forever(setup, sigint_status=sigint_status)
    except (ConfigError, runtime.RuntimeError_) as exc:
        print(f"ump: {one_line(str(exc))}", file=sys.stderr)
        return 2


def cmd_resolver(args: argparse.Namespace) -> int:
    async def setup(host: AioHost) -> None:
        await runtime.run_resolver(host, args.listen)
    return _run(setup, args.verbose)


def _store_lbm_config(config_file: str, config: StoreDaemonConfig, profile: str) -> Addr | None:
    """The resolver daemon named by the ``<lbm-config>`` file (see :func:`_store_lbm_client`)."""
    client = _store_lbm_client(config_file, config, profile)
    return None if client is None else runtime.resolver_of(client)


def _store_lbm_client(config_file: str, config: StoreDaemonConfig,
                      profile: str) -> ClientConfig | None:
    """The ``<lbm-config>`` file, read like ``ump source -c`` (None: there is none).

    An error in that file names the file and its line, plus the store file's ``<lbm-config>``
    line; a file that cannot be read at all (missing, a directory, not UTF-8) is reported at
    that ``<lbm-config>`` line.
    """
    daemon = config.daemon
    if not daemon.lbm_config:
        return None
    path = Path(config_file).parent / daemon.lbm_config
    try:
        client = runtime.load_client(str(path), profile)
    except ConfigError as exc:
        if exc.line is None:
            raise ConfigError(config_file, daemon.lbm_config_line,
                              f"<lbm-config> {shown(str(path), 300)}: {exc.message}") from None
        raise ConfigError(exc.file, exc.line,
                          f"{exc.message} (read as the <lbm-config> of "
                          f"{config_file}:{daemon.lbm_config_line})", exc.column) from None
    return client


def _check_store_directories(config_file: str, config: StoreDaemonConfig, base: Path) -> None:
    """Refuse, before anything starts, a cache or state directory the store cannot write in,
    and a state file that is not a file: each would otherwise fail at the first registration
    or restore, deep inside the running process."""
    for store in config.stores:
        for option, directory in (("disk-cache-directory", store.disk_cache_directory),
                                  ("disk-state-directory", store.disk_state_directory)):
            path = base / directory
            problem = directory_problem(path)
            if problem is not None:
                raise ConfigError(config_file, store.line,
                                  f"store {shown(store.name)}: {option} {shown(str(path), 300)} "
                                  f"{problem}")
        journal = state_file(base / store.disk_state_directory, store.name)
        if os.path.lexists(journal) and not journal.is_file():
            raise ConfigError(config_file, store.line,
                              f"store {shown(store.name)}: its state file "
                              f"{shown(str(journal), 300)} exists and is not a regular file")


def _config_error(command: str, exc: ConfigError) -> int:
    """Print a configuration error as one line (whatever the file held) and give status 2."""
    print(f"ump {command}: {one_line(str(exc))}", file=sys.stderr)
    return 2


def cmd_store(args: argparse.Namespace) -> int:
    try:
        config = load_store_config(args.config, profile=args.profile)
        resolver = args.resolver or _store_lbm_config(args.config, config, args.profile)
        group: tuple[Addr, ...] = ()
        if any(store.allow_proxy_source for store in config.stores):  # proxy elections' group
            group = runtime.proxy_group(_store_lbm_client(args.config, config, args.profile))
        otr = runtime.store_otr(_store_lbm_client(args.config, config, args.profile))
        base = Path(args.config).resolve().parent
        _check_store_directories(args.config, config, base)
    except ConfigError as exc:
        return _config_error("store", exc)
    for warning in config.warnings:
        print(f"ump store: warning: {one_line(str(warning))}", file=sys.stderr)
    resolver = resolver or runtime.DEFAULT_RESOLVER

    async def setup(host: AioHost) -> None:
        try:
            cores = await runtime.start_stores(host, config, resolver=resolver, base=base,
                                               proxy_group=group, otr=otr)
        except StoreFileError as exc:  # damaged state or cache: the operator decides
            raise ConfigError(str(exc.path), exc.line, exc.reason) from None
        runtime.handle_events(host, list(cores), lambda core, event: runtime.log_event(event))
        if config.daemon.web_monitor is not None:
            from reference_impl.webmon import WebMonitor
            monitor = WebMonitor(cores, version="ump-harness reference store",
                                 address=str(config.daemon.web_monitor),
                                 clock=host.now)
            try:
                where = await monitor.start()
            except OSError as exc:  # the address is the file's: report it like a bad value
                raise ConfigError(args.config, config.daemon.web_monitor_line,
                                  f"<web-monitor> {config.daemon.web_monitor}: cannot listen "
                                  f"there: {exc.strerror or exc}") from None
            print(f"web monitor on http://{where[0]}:{where[1]}/", file=sys.stderr)
        for core in cores:
            print(f'Store "{core.name}" ready to accept registrations on '
                  f"{core.addr[0]}:{core.addr[1]}", file=sys.stderr, flush=True)
    return _run(setup, args.verbose)


def _topic_refused(command: str, topic: str) -> bool:
    """Say in one line why ``topic`` cannot be used (see :func:`runtime.check_topic`), before
    any socket is bound: a name the wire cannot carry must not surface mid-run."""
    try:
        runtime.check_topic(topic)
    except runtime.RuntimeError_ as exc:
        print(f"ump {command}: {exc}", file=sys.stderr)
        return True
    return False


QUORUM_LOST_LINE = ("quorum lost: not currently registered with enough stores; sending waits "
                    "until they return")
"""What ``ump source`` prints when an unresponsive store takes the quorum away (its sends
would fail with "not registered"; the blocking loop waits instead, docs/semantics.md §1.12)."""
QUORUM_BACK_LINE = "registered again (quorum regained); sending resumes"
"""What ``ump source`` prints when Registration Complete comes back after a quorum loss."""


def cmd_source(args: argparse.Namespace) -> int:
    if _topic_refused("source", args.topic):
        return 2
    try:
        client = runtime.load_client(args.config, args.profile)
    except ConfigError as exc:
        return _config_error("source", exc)
    status = {"code": 0}

    async def setup(host: AioHost) -> None:
        source = await runtime.start_source(host, args.topic, client)
        stable = {"n": 0}
        left: set[int] = set()  # stores that confirmed our deregistration

        quorum = {"lost": False}  # waiting for the stores (docs/semantics.md §1.12)

        def handle(core: Any, event: Any) -> None:
            if isinstance(event, MessageStable):
                stable["n"] += 1
            elif not isinstance(event, FlightSizeNotification):
                if isinstance(event, SourceDeregistered) and event.store is not None:
                    left.add(event.store.index)
                runtime.log_event(event)
            # quorum lost: sends fail (not registered) and the sending loop waits for the
            # stores, so say so, and say when sending resumes
            if isinstance(event, StoreUnresponsive) and event.quorum_lost:
                quorum["lost"] = True
                print(f"ump source: {QUORUM_LOST_LINE}", file=sys.stderr, flush=True)
            elif isinstance(event, SourceRegistrationComplete) and quorum["lost"]:
                quorum["lost"] = False
                print(f"ump source: {QUORUM_BACK_LINE}", file=sys.stderr, flush=True)
        runtime.handle_events(host, [source], handle)

        def deregister() -> None:
            if not (source.deregistering or source.deregistered):
                print("ump source: deregistering from every store", file=sys.stderr,
                      flush=True)
                host.call(source, lambda now: source.deregister())
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, deregister)
        go = asyncio.Event()  # --wait-start: SIGUSR2 starts the traffic
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, go.set)

        async def work() -> None:
            try:
                await host.wait_until(lambda: source.complete or not source.persistent
                                      or source.deregistering or source.deregistered,
                                      timeout=30)
            except TimeoutError:
                print("ump source: registration did not complete within 30 s",
                      file=sys.stderr)
                status["code"] = 1
                host.close()
                return
            if source.complete or not source.persistent:  # (not deregistered before that)
                print(f"ump source: registered; next sequence number {source.next_sqn}",
                      file=sys.stderr, flush=True)
            if args.wait_start:
                await go.wait()
                print("ump source: SIGUSR2: sending", file=sys.stderr, flush=True)
            count = args.count
            if args.until_sqn is not None:  # at most one message per sequence number
                count = max(0, args.until_sqn - source.next_sqn)
            peak = {"bytes": 0}  # the most payload bytes in flight, right after a send
            refused = {"n": 0}  # --nonblocking: sends that returned "would block"
            done = {"n": 0}  # messages sent so far (what a SIGTERM summary reports)

            def sent_some(n: int) -> None:
                done["n"] += n
                peak["bytes"] = max(peak["bytes"], source.inflight_bytes)

            def would_block(refusal: SendError) -> None:
                if not refused["n"]:
                    print(f"ump source: {WOULD_BLOCK_LINE}", file=sys.stderr, flush=True)
                refused["n"] += 1

            def summary(sent: int) -> None:
                print(f"ump source: sent {sent} messages, {source.inflight} still in flight",
                      file=sys.stderr, flush=True)
                if source.config.ume_flight_size_bytes:
                    print(f"ump source: in-flight bytes max {peak['bytes']} "
                          f"(ume_flight_size_bytes {source.config.ume_flight_size_bytes})",
                          file=sys.stderr, flush=True)
                if args.nonblocking:
                    print(f"ump source: {refused['n']} send{'' if refused['n'] == 1 else 's'} "
                          f"returned would-block", file=sys.stderr, flush=True)
            try:
                sent = await runtime.send_messages(host, source, count, rate=args.rate,
                                                   size=args.size, start=source.next_sqn,
                                                   progress=sent_some, until_sqn=args.until_sqn,
                                                   nonblocking=args.nonblocking,
                                                   would_block=would_block)
            except asyncio.CancelledError:
                # stopped (SIGTERM, Ctrl-C) while sending: the operator still learns what
                # went out, what is in flight and how many sends would have blocked
                summary(done["n"])
                raise
            if not source.deregistering and not source.deregistered:
                with contextlib.suppress(TimeoutError):
                    await host.wait_until(lambda: source.inflight == 0, timeout=args.linger)
            summary(sent)
            if args.until_sqn is not None:  # fragments: fewer messages than numbers
                status["code"] = 0 if source.next_sqn >= args.until_sqn else 1
            else:
                status["code"] = 0 if sent == count else 1
            if args.deregister:
                deregister()
            if source.deregistering or source.deregistered:
                # deregistered (--deregister, or SIGUSR1 at any time): the guide's
                # "RPP Deregistration" says a deregistered source is blocked until it is
                # re-created, so there is nothing left to do but exit
                try:
                    await host.wait_until(lambda: source.deregistered, timeout=10)
                    print(f"ump source: deregistered from {len(left)} "
                          f"store{'' if len(left) == 1 else 's'}", file=sys.stderr, flush=True)
                    status["code"] = 0
                except TimeoutError:
                    print("ump source: not every store confirmed the deregistration within "
                          "10 s", file=sys.stderr)
                    status["code"] = 1
            host.close()
        # owned by the host: a Ctrl-C cancels it and its end is always consumed
        host.spawn(work(), name="ump source")
    code = _run(setup, args.verbose, sigint_status=INTERRUPTED)
    if code == INTERRUPTED:
        print("ump source: interrupted", file=sys.stderr)
        return code
    return code or status["code"]


def _receiver_out(name: str | None, dedupe: bool) -> tuple[runtime.DeliveryFloors, TextIO]:
    """The delivery log ``--out`` names, opened for appending (stdout without one), and what
    it already holds for ``--dedupe``.  Checked before anything starts, so a log that cannot
    be used is one line (:class:`runtime.RuntimeError_`), not a traceback from a running
    receiver."""
    if not name:
        return runtime.DeliveryFloors(), sys.stdout
    path = Path(name)
    where = f"--out {shown(name, 300)}"
    if path.is_dir():
        raise runtime.RuntimeError_(f"{where} is a directory; it names the file deliveries "
                                    "are appended to")
    try:
        floors = runtime.DeliveryFloors.read(path) if dedupe else runtime.DeliveryFloors()
    except runtime.RuntimeError_ as exc:
        raise runtime.RuntimeError_(f"{exc} (--dedupe reads the floors from {where})") \
            from None
    except OSError as exc:
        raise runtime.RuntimeError_(f"{where} cannot be read for --dedupe: "
                                    f"{exc.strerror or exc}") from None
    try:
        out = open(path, "a", buffering=1)  # noqa: SIM115 (closed by cmd_receiver)
    except OSError as exc:
        raise runtime.RuntimeError_(f"{where} cannot be opened for appending: "
                                    f"{exc.strerror or exc}") from None
    return floors, out


def cmd_receiver(args: argparse.Namespace) -> int:
    """Run a receiver.  Deregistration (guide "RPP Deregistration") mirrors ``ump source``:
    SIGUSR1 deregisters at any time and the receiver goes on delivering (the guide: it still
    receives but no longer acknowledges), saying so when every store confirmed;
    ``--deregister`` deregisters after ``--count`` deliveries and exits, 0 when every store
    confirmed within 10 s, else 1.  ``--explicit-ack MS`` and ``--ack-file PATH`` make an
    application that acknowledges explicitly (:mod:`reference_impl.explicit_ack`)."""
    if _topic_refused("receiver", args.topic):
        return 2
    if args.deregister and args.count <= 0:
        print("ump receiver: --deregister needs --count (deregister after that many "
              "deliveries); SIGUSR1 deregisters at any time", file=sys.stderr)
        return 2
    try:
        client = runtime.load_client(args.config, args.profile)
    except ConfigError as exc:
        return _config_error("receiver", exc)
    try:
        floors, out = _receiver_out(args.out, args.dedupe)
    except runtime.RuntimeError_ as exc:
        print(f"ump receiver: {one_line(str(exc))}", file=sys.stderr)
        return 2

    if args.consume_rate < 0:
        print(f"ump receiver: --consume-rate must be positive (0: at once), not "
              f"{args.consume_rate}", file=sys.stderr)
        return 2
    if args.consume_rate:  # the application acknowledges what it consumed, nothing else
        client = consumer.explicit_ack_only(client)
    acking = [name for name, given in (("--consume-rate", args.consume_rate),
                                       ("--explicit-ack", args.explicit_ack),
                                       ("--ack-file", args.ack_file),
                                       ("--consume-file", args.consume_file)) if given]
    if len(acking) > 1:
        print(f"ump receiver: {acking[0]} and {acking[1]} exclude each other (each is how the "
              f"application acknowledges)", file=sys.stderr)
        return 2
    if args.explicit_ack < 0 or args.explicit_ack > 3_600_000:
        print(f"ump receiver: --explicit-ack must be a period of 1-3600000 ms, not "
              f"{args.explicit_ack}", file=sys.stderr)
        return 2
    for name, path in (("--ack-file", args.ack_file), ("--consume-file", args.consume_file)):
        if path is not None and (not path or os.path.isdir(path)):
            print(f"ump receiver: {name} must name a file, not {path!r}", file=sys.stderr)
            return 2
    if args.explicit_ack or args.ack_file:  # explicit_ack.py: the application acknowledges
        client = consumer.explicit_ack_only(client)

    status = {"code": 0}

    async def setup(host: AioHost) -> None:
        receiver = await runtime.start_receiver(host, args.topic, client, reg_id=args.reg_id)
        writer = runtime.DeliveryLog(out)
        skipped = {"n": 0}
        left: set[tuple[str, int]] = set()  # (source, store) that confirmed our leaving
        finishing: list[bool] = []  # --deregister: the leaving has started
        loop = asyncio.get_running_loop()

        def deregister() -> None:
            if not host.closed and not receiver.left:
                print("ump receiver: deregistering from every store", file=sys.stderr,
                      flush=True)
                host.call(receiver, lambda now: receiver.deregister())

        async def finish() -> None:  # --deregister: leave after --count deliveries, exit
            deregister()
            try:
                await host.wait_until(lambda: receiver.deregistered, timeout=10)
            except TimeoutError:
                print("ump receiver: not every store confirmed the deregistration within "
                      "10 s", file=sys.stderr)
                status["code"] = 1
            host.close()

        def handle(core: Any, event: Any) -> None:
            if isinstance(event, MessageDelivered) and floors.seen(event):
                skipped["n"] += 1
                return
            writer(core, event)
            if isinstance(event, ReceiverDeregistered):
                if event.store is not None:
                    left.add((event.source, event.store.index))
                else:
                    print(f"ump receiver: deregistered from {len(left)} "
                          f"store{'' if len(left) == 1 else 's'}", file=sys.stderr, flush=True)
            if args.count and writer.count >= args.count:
                if not args.deregister:
                    host.close()
                elif not finishing:  # once; not from inside this call into the core
                    finishing.append(True)
                    loop.call_soon(lambda: host.closed or host.spawn(finish(),
                                                                     name="ump receiver"))
        # SIGUSR1: deregister, between two calls into the core
        loop.add_signal_handler(signal.SIGUSR1, lambda: loop.call_soon(deregister))
        if args.explicit_ack or args.ack_file or args.consume_file:  # as the app says
            if args.consume_file:  # before anything is delivered: nothing awaits this turn
                receiver.retain_messages()
            acker = explicit_ack.ExplicitAcker(host, receiver, every_ms=args.explicit_ack,
                                               ack_file=args.ack_file or args.consume_file,
                                               consume=bool(args.consume_file))

            def offer(core: Any, event: Any) -> None:
                if isinstance(event, MessageDelivered):  # (a --dedupe skip was consumed)
                    acker.offer(event)
                handle(core, event)
            runtime.handle_events(host, [receiver], offer)
            acker.start()
        elif args.consume_rate:  # deliveries wait for the slow application, then are ACKed
            paced = consumer.PacedConsumer(host, receiver, args.consume_rate,
                                           lambda event: handle(receiver, event))
            runtime.handle_events(host, [receiver], lambda core, event: paced.offer(event)
                                  if isinstance(event, MessageDelivered) else handle(core, event))
            paced.start()
        else:
            runtime.handle_events(host, [receiver], handle)
    try:
        return _run(setup, args.verbose) or status["code"]
    finally:
        if out is not sys.stdout:
            out.close()


def cmd_demo(args: argparse.Namespace) -> int:
    from reference_impl.demo import run_demo
    _setup_logging(args.verbose)
    return run_demo(messages=args.messages, workdir=args.workdir, store_port=args.store_port,
                    resolver_port=args.resolver_port, capture=args.capture,
                    profile=args.profile, transport=args.transport, rpp=args.rpp)
