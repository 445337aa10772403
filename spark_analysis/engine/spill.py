"""Tables set aside on local disk while a capture is analysed in parts
(:func:`spark_analysis.engine.run.analyze_in_parts`): :class:`Spill`.

Each table is an Arrow IPC *stream* file, written a batch at a time and read back
memory-mapped (no copy until a step combines its columns).  The stream format, not the
file format, because the batches of a dictionary-encoded column read from Parquet each come
with their own dictionary, and only a stream may replace a dictionary between batches.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa


class Spill:
    """Tables by name under ``directory``: :meth:`add` batches, :meth:`close`, then
    :meth:`read`.

    ``compressed``: LZ4 frames, a sixth of the bytes on disk (the packets and topic
    messages of 10,000,000 frames: 200 MB instead of 1.3 GB) for a few hundredths of a
    second per million rows written and read; but a table read back is then decompressed
    into memory, where an uncompressed one stays mapped until its pages are touched."""

    def __init__(self, directory: str | Path, compressed: bool = False) -> None:
        self._options = pa.ipc.IpcWriteOptions(compression="lz4" if compressed else None)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._writers: dict[str, tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = {}
        self._schemas: dict[str, pa.Schema] = {}

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.arrows"

    def add(self, name: str, table: pa.Table) -> None:
        """Append ``table``'s rows to table ``name`` (every part of one name has one schema,
        dictionaries aside).  A table without rows only sets the schema."""
        if name not in self._schemas:
            self._schemas[name] = table.schema
        if not table.num_rows:
            return
        if name not in self._writers:
            sink = pa.OSFile(str(self._path(name)), "wb")
            self._writers[name] = (sink, pa.ipc.new_stream(sink, self._schemas[name],
                                                          options=self._options))
        self._writers[name][1].write_table(table.cast(self._schemas[name]))

    def close(self) -> None:
        """Finish every table (after the last :meth:`add`)."""
        for sink, writer in self._writers.values():
            writer.close()
            sink.close()
        self._writers.clear()

    def read(self, name: str) -> pa.Table:
        """Table ``name`` (no rows when none was added), memory-mapped (no more rows may be
        added to it).  The table stays readable when the file is removed (POSIX)."""
        if name not in self._schemas:
            raise KeyError(name)
        if name in self._writers:
            sink, writer = self._writers.pop(name)
            writer.close()
            sink.close()
        path = self._path(name)
        if not path.exists():
            return self._schemas[name].empty_table()
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()
