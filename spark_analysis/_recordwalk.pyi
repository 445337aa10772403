"""Type stub of the compiled record walk (``_recordwalk.c``; see its docstring)."""

from typing import Any

def walk(buf: bytes | bytearray | memoryview, pos: int, limit: int, header_size: int,
         length_at: int, big_endian: bool, out: Any, /) -> tuple[int, int]: ...
