"""The wire codec benchmark: measurements, report table, JSON record and command line.

See :mod:`benchmarks.wire` for what is measured and why.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import construct
import numpy as np

from wire import lbmc

from . import transports as _transports
from .samples import HeaderSample, MessageSample, header_samples, message_samples
from .timing import Rate, measure

PARSE_TARGET = 1_000_000
"""Raw fast-path header parses per second one core must reach, for every fixed kind."""

RATIO_TARGET = 10.0
"""Minimum speed-up of the raw fast path over Construct parsing, for every fixed kind."""

DEFAULT_DURATION = 0.1
DEFAULT_REPEAT = 3
QUICK_DURATION = 0.01
QUICK_REPEAT = 2
NUMPY_COUNT = 1_000_000
NUMPY_KIND = "ume_ack"


# --- results ------------------------------------------------------------------------------------


def _ratio(fast: Rate | None, slow: Rate) -> float | None:
    return None if fast is None else fast.per_second / slow.per_second


@dataclass(frozen=True)
class HeaderResult:
    """Throughput of one header kind; the fast figures are ``None`` for variable layouts."""

    kind: str
    code: int
    size: int
    fixed: bool
    construct_parse: Rate
    construct_build: Rate
    fast_raw: Rate | None
    fast_decode: Rate | None
    fast_pack: Rate | None

    @property
    def parse_ratio(self) -> float | None:
        """Raw fast-path parses per Construct parse."""
        return _ratio(self.fast_raw, self.construct_parse)

    @property
    def decode_ratio(self) -> float | None:
        return _ratio(self.fast_decode, self.construct_parse)

    @property
    def build_ratio(self) -> float | None:
        return _ratio(self.fast_pack, self.construct_build)

    def to_json(self) -> dict[str, Any]:
        def rate(r: Rate | None) -> dict[str, Any] | None:
            return None if r is None else r.to_json()

        return {
            "kind": self.kind, "code": self.code, "size": self.size, "fixed": self.fixed,
            "construct_parse": rate(self.construct_parse),
            "construct_build": rate(self.construct_build),
            "fast_unpack_from": rate(self.fast_raw), "fast_decode": rate(self.fast_decode),
            "fast_pack": rate(self.fast_pack), "parse_ratio": self.parse_ratio,
            "decode_ratio": self.decode_ratio, "build_ratio": self.build_ratio,
        }


@dataclass(frozen=True)
class MessageResult:
    """Whole-message throughput of :func:`wire.lbmc.parse_message` and ``LbmcMessage.build``."""

    name: str
    description: str
    size: int
    parse: Rate
    build: Rate

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "size": self.size,
                "parse_message": self.parse.to_json(), "build": self.build.to_json()}


@dataclass(frozen=True)
class ColumnarResult:
    """Columnar decode of ``count`` packed headers; each rate counts whole-buffer calls."""

    kind: str
    count: int
    itemsize: int
    rows: tuple[tuple[str, Rate], ...]

    def headers_per_second(self, rate: Rate) -> float:
        return rate.per_second * self.count

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "count": self.count, "itemsize": self.itemsize,
            "rows": [{"method": m, "headers_per_second": self.headers_per_second(r),
                      "calls": r.to_json()} for m, r in self.rows],
        }


@dataclass(frozen=True)
class TransportResult:
    """A transport/resolver packet parse row, or why it is not available."""

    name: str
    description: str
    size: int
    function: str | None
    parse: Rate | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "size": self.size,
                "function": self.function,
                "parse": None if self.parse is None else self.parse.to_json(),
                "available": self.parse is not None, "reason": self.reason}


@dataclass(frozen=True)
class Target:
    """A pass/fail line of the summary."""

    name: str
    passed: bool | None  # None: nothing to judge (no fixed kind selected)
    worst: float | None
    worst_kind: str | None
    failing: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "worst": self.worst,
                "worst_kind": self.worst_kind, "failing": list(self.failing)}


@dataclass
class BenchResults:
    """Everything one run measured, plus the settings and machine it ran on."""

    settings: dict[str, Any]
    meta: dict[str, Any]
    headers: list[HeaderResult] = field(default_factory=list)
    messages: list[MessageResult] = field(default_factory=list)
    columnar: ColumnarResult | None = None
    transports: list[TransportResult] = field(default_factory=list)

    def targets(self) -> list[Target]:
        fixed = [h for h in self.headers if h.fixed and h.fast_raw is not None]

        def parses(h: HeaderResult) -> float:
            return 0.0 if h.fast_raw is None else h.fast_raw.per_second

        def ratio(h: HeaderResult) -> float:
            return h.parse_ratio or 0.0

        out = []
        checks: tuple[tuple[str, Callable[[HeaderResult], float], float], ...] = (
            (f"fast path >= {PARSE_TARGET:,} header parses/s", parses, PARSE_TARGET),
            (f"fast path >= {RATIO_TARGET:g}x Construct", ratio, RATIO_TARGET),
        )
        for name, value, limit in checks:
            if not fixed:
                out.append(Target(name, None, None, None, ()))
                continue
            worst = min(fixed, key=value)
            failing = tuple(h.kind for h in fixed if value(h) < limit)
            out.append(Target(name, not failing, value(worst), worst.kind, failing))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": "benchmarks.wire", "settings": self.settings, "meta": self.meta,
            "headers": [h.to_json() for h in self.headers],
            "messages": [m.to_json() for m in self.messages],
            "columnar": None if self.columnar is None else self.columnar.to_json(),
            "transports": [t.to_json() for t in self.transports],
            "targets": [t.to_json() for t in self.targets()],
        }


# --- measurements -------------------------------------------------------------------------------


def bench_header(sample: HeaderSample, duration: float, repeat: int) -> HeaderResult:
    """Construct parse/build and (fixed kinds) fast unpack_from/decode/pack of one header."""
    struct_def = sample.construct
    raw, values = sample.raw, sample.values

    def timed(fn: Callable[..., Any], *args: Any) -> Rate:
        return measure(fn, *args, duration=duration, repeat=repeat)

    construct_parse = timed(struct_def.parse, raw)
    construct_build = timed(struct_def.build, values)
    fast_raw = fast_decode = fast_pack = None
    if sample.fixed:
        fast = sample.kind.fast
        assert fast is not None
        fast_raw = timed(fast.unpack_from, raw, 0)
        fast_decode = timed(fast.decode, raw, 0)
        fast_pack = timed(fast.pack, values)
    return HeaderResult(
        kind=sample.kind.name, code=sample.kind.code, size=len(raw), fixed=sample.fixed,
        construct_parse=construct_parse, construct_build=construct_build,
        fast_raw=fast_raw, fast_decode=fast_decode, fast_pack=fast_pack,
    )


def bench_message(sample: MessageSample, duration: float, repeat: int) -> MessageResult:
    return MessageResult(
        name=sample.name, description=sample.description, size=len(sample.raw),
        parse=measure(lbmc.parse_message, sample.raw, duration=duration, repeat=repeat),
        build=measure(sample.message.build, duration=duration, repeat=repeat),
    )


def packed_headers(kind_name: str, count: int) -> tuple[lbmc.HeaderKind, bytes]:
    """``count`` back-to-back headers of one fixed kind, the sequence-number-like last member
    counting up so every record differs; checked against Construct and the fast path."""
    kind = next(k for k in lbmc.header_kinds() if k.name == kind_name)
    fast = kind.fast
    assert fast is not None and kind.struct is not None
    (sample,) = header_samples({kind_name})
    array = np.zeros(count, dtype=fast.dtype())
    for name, value in zip(fast.names, fast.unpack_from(sample.raw, 0), strict=True):
        array[name] = value
    counter = "seqnum" if "seqnum" in fast.names else fast.names[-1]
    array[counter] = np.arange(count, dtype=np.uint64) & 0xFFFFFFFF
    buf = array.tobytes()
    if len(buf) != count * fast.size:
        raise AssertionError("numpy dtype is not packed like the wire layout")
    for index in {0, count // 2, count - 1}:
        record = buf[index * fast.size : (index + 1) * fast.size]
        parsed = kind.struct.parse(record)
        if parsed[counter] != index & 0xFFFFFFFF:
            raise AssertionError(f"packed record {index} does not decode with Construct")
        if fast.decode(buf, index * fast.size)[counter] != parsed[counter]:
            raise AssertionError(f"packed record {index}: fast path disagrees with Construct")
    return kind, buf


def bench_columnar(count: int, duration: float, repeat: int,
                   kind_name: str = NUMPY_KIND) -> ColumnarResult:
    """``np.frombuffer`` with the derived dtype over ``count`` packed headers.

    ``frombuffer`` alone only creates a zero-copy view (no byte is read), so the meaningful
    figure is the second row: the view plus every column converted to a native-endian array.
    ``struct.iter_unpack`` (row tuples, pure stdlib) is shown for comparison.
    """
    kind, buf = packed_headers(kind_name, count)
    fast = kind.fast
    assert fast is not None
    dtype = fast.dtype()
    names = fast.names
    native = [dtype[n].newbyteorder("=") for n in names]

    def view(data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype)

    def columns(data: bytes) -> list[np.ndarray]:
        array = np.frombuffer(data, dtype)
        return [array[n].astype(t) for n, t in zip(names, native, strict=True)]

    def iter_rows(data: bytes) -> int:
        n = 0
        for _ in fast.codec.iter_unpack(data):
            n += 1
        return n

    first = columns(buf)
    if int(first[names.index("seqnum" if "seqnum" in names else names[-1])][-1]) != (
            (count - 1) & 0xFFFFFFFF):
        raise AssertionError("columnar decode gives a wrong last record")
    rows = (
        ("np.frombuffer(buf, dtype) view only (zero-copy)", measure(view, buf, duration=duration,
                                                                    repeat=repeat)),
        ("np.frombuffer + all columns to native arrays", measure(columns, buf, duration=duration,
                                                                  repeat=repeat)),
        ("struct.iter_unpack over the buffer (tuples)", measure(iter_rows, buf,
                                                                duration=duration,
                                                                repeat=repeat)),
    )
    return ColumnarResult(kind=kind_name, count=count, itemsize=fast.size, rows=rows)


def bench_transports(duration: float, repeat: int) -> list[TransportResult]:
    out = []
    for case in _transports.probe_all():
        rate = None
        if case.parse is not None:
            rate = measure(case.parse, case.sample, duration=duration, repeat=repeat)
        out.append(TransportResult(case.name, case.description, len(case.sample),
                                   case.function, rate, case.reason))
    return out


# --- report -------------------------------------------------------------------------------------


def _n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _r(rate: Rate | None) -> str:
    return "n/a" if rate is None else f"{rate.per_second:,.0f}"


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:,.1f}x"


def _per_call(rate: Rate) -> str:
    ns = rate.ns_per_call
    if ns >= 1e6:
        return f"{ns / 1e6:,.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:,.2f} us"
    return f"{ns:,.0f} ns"


HEADER_COLUMNS = (
    ("kind", 24, "<"), ("code", 4, ">"), ("size", 4, ">"),
    ("construct parse/s", 17, ">"), ("fast parse/s (raw)", 18, ">"),
    ("fast decode/s (dict)", 20, ">"), ("raw/cons", 8, ">"),
    ("construct build/s", 17, ">"), ("fast pack/s", 12, ">"), ("pack/cons", 9, ">"),
)


def _row(cells: Sequence[str]) -> str:
    return "  ".join(f"{c:{align}{width}}" for c, (_, width, align)
                     in zip(cells, HEADER_COLUMNS, strict=True)).rstrip()


def header_row(h: HeaderResult) -> str:
    return _row((
        h.kind, f"{h.code:02x}", f"{h.size}" if h.fixed else f"{h.size}*",
        _r(h.construct_parse), _r(h.fast_raw), _r(h.fast_decode), _x(h.parse_ratio),
        _r(h.construct_build), _r(h.fast_pack), _x(h.build_ratio),
    ))


def header_table_head() -> str:
    head = _row([name for name, _, _ in HEADER_COLUMNS])
    return head + "\n" + "-" * len(head)


def _verdict(passed: bool | None) -> str:
    return "n/a" if passed is None else ("PASS" if passed else "FAIL")


def summary_lines(results: BenchResults) -> list[str]:
    parse_target, ratio_target = results.targets()
    lines = [
        f"{parse_target.name}: {_verdict(parse_target.passed)} "
        f"(min {_n(parse_target.worst)} over kinds"
        + (f", {parse_target.worst_kind})" if parse_target.worst_kind else ")"),
        f"{ratio_target.name}: {_verdict(ratio_target.passed)} "
        f"(min ratio {_x(ratio_target.worst)}"
        + (f", {ratio_target.worst_kind})" if ratio_target.worst_kind else ")"),
    ]
    for target in (parse_target, ratio_target):
        if target.failing:
            lines.append(f"  failing {target.name}: {', '.join(target.failing)}")
    variable = [h.kind for h in results.headers if not h.fixed]
    if variable:
        lines.append(f"  (variable layouts, Construct only, not judged: {', '.join(variable)})")
    return lines


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": sys.version.split()[0], "implementation": platform.python_implementation(),
        "platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
        "construct": construct.__version__, "numpy": np.__version__,
        "utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


# --- driver -------------------------------------------------------------------------------------


def run(
    kinds: set[str] | None = None, *, duration: float = DEFAULT_DURATION,
    repeat: int = DEFAULT_REPEAT, numpy_count: int = NUMPY_COUNT, messages: bool = True,
    columnar: bool = True, transports: bool = True, out: TextIO | None = None,
) -> BenchResults:
    """Run the benchmark, printing the report to ``out`` (``None``: print nothing).

    Args:
        kinds: header kind names to measure (``None``: all of :func:`wire.lbmc.header_kinds`).
        duration: target seconds of one timed run (the iteration count is calibrated to it).
        repeat: timed runs per figure; the best is kept.
        numpy_count: packed headers in the columnar decode buffer.
        messages, columnar, transports: run those sections.
    """
    def say(text: str = "") -> None:
        if out is not None:
            out.write(text + "\n")
            out.flush()

    samples = header_samples(kinds)  # raises ValueError on an unknown kind, before any output
    results = BenchResults(
        settings={"kinds": sorted(kinds) if kinds else None, "duration_s": duration,
                  "repeat": repeat, "numpy_count": numpy_count},
        meta=machine(),
    )
    meta = results.meta
    say(f"benchmarks.wire  Python {meta['python']}  construct {meta['construct']}  "
        f"numpy {meta['numpy']}  cpu: {meta['cpu']}")
    say(f"single core, time.perf_counter, ~{duration:g} s per run, best of {repeat}; "
        "figures are calls per second")
    say()
    say("LBMC extended headers")
    say(header_table_head())
    for sample in samples:
        result = bench_header(sample, duration, repeat)
        results.headers.append(result)
        say(header_row(result))
    say("* variable layout: size of the sample; no complete fast layout (n/a)")
    say()
    for line in summary_lines(results):
        say(line)

    if messages:
        say()
        say("Whole LBMC messages (wire.lbmc.parse_message / LbmcMessage.build)")
        say(f"{'message':<24}  {'size':>4}  {'parse_message/s':>15}  {'build/s':>12}  "
            "description")
        for msg in message_samples():
            mres = bench_message(msg, duration, repeat)
            results.messages.append(mres)
            say(f"{mres.name:<24}  {mres.size:>4}  {_r(mres.parse):>15}  {_r(mres.build):>12}  "
                f"{mres.description}")

    if columnar:
        say()
        cres = bench_columnar(numpy_count, duration, repeat)
        results.columnar = cres
        say(f"Columnar decode of {cres.count:,} packed {cres.kind} headers "
            f"({cres.itemsize} bytes each, dtype from kind.fast.dtype())")
        for method, rate in cres.rows:
            say(f"  {method:<48}  {cres.headers_per_second(rate):>16,.0f} headers/s"
                f"  ({_per_call(rate)} per buffer)")

    if transports:
        say()
        say("Transport / resolver packet parse (optional modules)")
        for tres in bench_transports(duration, repeat):
            results.transports.append(tres)
            if tres.parse is None:
                say(f"  {tres.name:<7} not available  ({tres.reason})")
            else:
                say(f"  {tres.name:<7} {_r(tres.parse):>12} packets/s  {tres.size:>4} bytes  "
                    f"{tres.function}  [{tres.description}]")
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.wire",
        description="Parse/build throughput of the LBMC Construct definitions vs the derived "
                    "fast path, whole messages, columnar numpy decode and transport parsers.",
    )
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: ~{QUICK_DURATION:g} s per run, best of {QUICK_REPEAT}")
    parser.add_argument("--json", metavar="PATH", type=Path,
                        help="also write the results as JSON to PATH")
    parser.add_argument("--kinds", metavar="K1,K2",
                        help="only these header kinds (e.g. ume_preg,ume_ack)")
    parser.add_argument("--duration", type=float, metavar="S",
                        help=f"seconds per timed run (default {DEFAULT_DURATION:g}, "
                             f"--quick {QUICK_DURATION:g})")
    parser.add_argument("--repeat", type=int, metavar="N",
                        help=f"timed runs per figure, best kept (default {DEFAULT_REPEAT}, "
                             f"--quick {QUICK_REPEAT})")
    parser.add_argument("--numpy-count", type=int, default=NUMPY_COUNT, metavar="N",
                        help=f"headers in the columnar decode buffer (default {NUMPY_COUNT:,})")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 even when a target fails: the
    benchmark reports, it does not gate)."""
    args = parse_args(argv)
    duration = args.duration or (QUICK_DURATION if args.quick else DEFAULT_DURATION)
    repeat = args.repeat or (QUICK_REPEAT if args.quick else DEFAULT_REPEAT)
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()} if args.kinds else None
    try:
        results = run(kinds, duration=duration, repeat=repeat, numpy_count=args.numpy_count,
                      out=sys.stdout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(results.to_json(), indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    return 0
