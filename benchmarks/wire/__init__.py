"""Throughput of the wire codecs: ``python -m benchmarks.wire [--quick] [--json PATH]``.

What is measured, on one core, with :func:`time.perf_counter` (calibrated runs, best of N):

* per LBMC extended-header kind, parse and build through the Construct definition
  (``kind.struct.parse(bytes)`` / ``kind.struct.build(values)``) and through the fast path
  derived from it (``kind.fast.unpack_from(buf, off)``: raw tuple, the hot-loop form;
  ``kind.fast.decode()``: dict in Construct's value form; ``kind.fast.pack(values)``), with the
  fast/Construct ratios taken in the same run.  Variable-layout kinds (topicname,
  ume_storename, apphdr, apphdr_chain, tsni) have no complete fast layout and get Construct
  figures only;
* whole messages (:func:`wire.lbmc.parse_message`, :meth:`wire.lbmc.LbmcMessage.build`) for a
  CONTROL + ume_preg, a ume_ack stability ack and a DATA message with a 64-byte payload;
* a columnar decode of 1,000,000 packed ume_ack headers with ``np.frombuffer`` and the derived
  dtype, in headers per second;
* the packet parse of ``wire.lbtru``, ``wire.lbtrm``, ``wire.lbmr`` and ``wire.lbttcp`` when
  those modules exist ("not available" otherwise).

The summary judges two targets of the raw fast path over every fixed-layout kind: at least
1,000,000 header parses per second, and at least 10x Construct parse.  The benchmark reports;
it never fails the process because a target is missed.
"""

from __future__ import annotations

from .runner import BenchResults, HeaderResult, main, run

__all__ = ["BenchResults", "HeaderResult", "main", "run"]
