"""``python -m benchmarks.wire``: run the wire codec benchmark (see :mod:`benchmarks.wire`)."""

from __future__ import annotations

from .runner import main

raise SystemExit(main())
