"""Type stub of the compiled header decode (``_netheaders.c``; see its docstring)."""

from typing import Any

PARAMS: tuple[str, ...]
OUTPUTS: tuple[str, ...]
REASONS: tuple[str, ...]

def decode(data: Any, starts: Any, lengths: Any, linktypes: Any, params: Any, out: Any,
           /) -> None: ...
