"""``python -m benchmarks.store``: run the store benchmark (see :mod:`benchmarks.store`)."""

from __future__ import annotations

from . import main

raise SystemExit(main())
