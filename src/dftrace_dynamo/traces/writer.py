"""Writes trace files in the DFTracer layout: ``[`` first, one JSON object per
line, ``]`` last; compressed as independent gzip members or zstd frames so a
reader (and Perfetto) can use every complete member of a cut file."""

import os
import zlib

import zstandard

MEMBER_BYTES = 4 << 20  # uncompressed bytes per gzip member / zstd frame


def compression_for(path):
    """``"gzip"``, ``"zstd"`` or ``None`` (plain) from the file extension."""
    name = str(path).lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst"):
        return "zstd"
    return None


def compress(data, compression):
    """``data`` as one gzip member or zstd frame (``compression`` None: as it is)."""
    if compression == "gzip":
        comp = zlib.compressobj(1, zlib.DEFLATED, 31)
        return comp.compress(data) + comp.flush()
    if compression == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(data)
    return data


class TraceWriter:
    """``json_array=True`` writes a strict JSON array (commas between objects)
    for viewers that do not accept the comma-less DFTracer layout."""

    def __init__(self, path, json_array=False):
        self.path = str(path)
        self.compression = compression_for(path)
        self._json_array = json_array
        self._file = open(self.path, "xb")
        self._buf = bytearray(b"[\n")
        self._first = True
        self.events = 0

    def write(self, line):
        """Appends one JSON object given as bytes without its newline."""
        if self._json_array and not self._first:
            self._buf += b",\n"
        self._first = False
        self._buf += line
        if not self._json_array:
            self._buf += b"\n"
        self.events += 1
        if len(self._buf) >= MEMBER_BYTES:
            self._flush()

    def _flush(self):
        if not self._buf:
            return
        data = bytes(self._buf)
        self._buf.clear()
        self._file.write(compress(data, self.compression))

    def close(self):
        self._buf += b"\n]\n" if self._json_array else b"]\n"
        self._flush()
        self._file.close()

    def abort(self):
        """Closes and removes the file: a failed command leaves no partial output."""
        self._file.close()
        os.unlink(self.path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
