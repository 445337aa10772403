"""``python -m benchmarks.analyze``: ``ump analyze`` end to end against tshark (see the package)."""

from __future__ import annotations

from . import main

raise SystemExit(main())
