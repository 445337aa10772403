"""``python -m benchmarks.judge``: ``ump conform --capture`` at scale against tshark (see the
package)."""

from __future__ import annotations

from . import main

raise SystemExit(main())
