"""A persistent source process for the store soak: sends without end and logs what is stable.

``ump source`` counts stable messages but does not say which ones; the soak needs the exact
set the source was told is stable (``MessageStable`` with ``StableFlags.STABLE``) to prove that
none of them is lost when the store is killed.  This runs the same pieces as ``ump source``
(:func:`reference_impl.runtime.start_source`, :func:`~reference_impl.runtime.send_messages`)
in a process of its own, so the store and the source share nothing but sockets:

    python tests/soak/soak_source.py -c source.cfg --topic soak.t --rate 1000 \
        --stable-log stable.txt

Every stable sequence number is appended to ``--stable-log`` as one line, written before the
next event is handled (line buffering), so a line that is in the file was reported stable.
Payloads are ``"<sequence number>:"`` padded with dots (as ``ump source`` sends them), so a
receiver can check each message's content against its number.  Per-message events (stability,
reclaims, flight size) are not logged; the rest is, at INFO with ``-v``.  SIGUSR1 stops the sending
(``soak source: stopped sending after N messages`` on stderr) but keeps the source up, so
receivers still find the topic and recover it from the store; SIGINT or SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from reference_impl import runtime
from reference_impl.aio import AioHost, run_forever
from reference_impl.events import (
    Event,
    FlightSizeNotification,
    MessageReclaimed,
    MessageStable,
    StableFlags,
)

SEND_TIMEOUT = 3600.0
"""How long a send may wait for the flight size to open (the store may be down): the soak
stops the process long before."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak_source", description=__doc__.split("\n")[0])
    parser.add_argument("-c", "--config", required=True, help="UM configuration file")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second")
    parser.add_argument("--size", type=int, default=64, help="payload bytes")
    parser.add_argument("--stable-log", required=True, help="append stable sequence numbers")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    args = parser.parse_args(argv)
    client = runtime.load_client(args.config, "current")
    sent = {"n": 0}
    stable_log = open(args.stable_log, "a", buffering=1)  # noqa: SIM115 - closed below

    async def setup(host: AioHost) -> None:
        source = await runtime.start_source(host, args.topic, client)

        def handle(core: Any, event: Event) -> None:
            if isinstance(event, MessageStable):
                if event.flags & StableFlags.STABLE:
                    stable_log.write(f"{event.sequence_number}\n")
            elif not isinstance(event, FlightSizeNotification | MessageReclaimed):
                runtime.log_event(event)

        runtime.handle_events(host, [source], handle)

        async def work() -> None:
            await host.wait_until(lambda: source.complete, timeout=60)
            print(f"soak source: registered; next sequence number {source.next_sqn}",
                  file=sys.stderr, flush=True)
            await runtime.send_messages(
                host, source, 1 << 40, rate=args.rate, size=args.size, start=source.next_sqn,
                timeout=SEND_TIMEOUT, progress=lambda n: sent.__setitem__("n", sent["n"] + n))

        loop = asyncio.get_running_loop()
        task = loop.create_task(work())

        def stop_sending() -> None:
            task.cancel()
            print(f"soak source: stopped sending after {sent['n']} messages", file=sys.stderr,
                  flush=True)

        loop.add_signal_handler(signal.SIGUSR1, stop_sending)

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        code = run_forever(setup)
    finally:
        stable_log.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
