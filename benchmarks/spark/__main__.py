"""``python -m benchmarks.spark``: decode-to-Parquet speed against tshark (see the package)."""

from __future__ import annotations

from . import main

raise SystemExit(main())
