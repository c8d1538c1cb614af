"""ZstdReader: the one zstd decompressor of the stages that read The Pile's .jsonl.zst files (prepare_data.py's
sources and eval.py's Pile bits per byte). Unlike zstandard's stream_reader, it refuses an empty file and a
truncated last frame instead of ending early, which would silently drop the rest of a cut-off download."""

from __future__ import annotations

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # the first 4 bytes of a zstd frame


class ZstdReader:
    """Decompress a stream of zstd frames; raise on an empty file or a truncated last frame (zstandard's own
    stream_reader just ends early there, which would silently drop the rest of a cut-off download).
    read(n) returns up to n bytes, b"" at the end, without the copies of an io.BufferedReader."""

    def __init__(self, raw, chunk_bytes: int = 1 << 24):
        import zstandard

        self.raw, self.zstd, self.chunk_bytes = raw, zstandard, chunk_bytes
        self.obj, self.fed, self.buf, self.pos, self.empty = self._new(), False, b"", 0, True

    def _new(self):
        return self.zstd.ZstdDecompressor(max_window_size=2**31).decompressobj()

    def read(self, n: int) -> bytes:
        while self.pos == len(self.buf):
            data = self.raw.read(self.chunk_bytes)
            if not data:
                if self.empty:
                    raise self.zstd.ZstdError("the file is empty (0 bytes)")
                if self.fed and not self.obj.eof:
                    raise self.zstd.ZstdError("the stream ends inside a zstd frame (truncated file)")
                return b""
            self.empty = False
            parts = []
            while data:
                parts.append(self.obj.decompress(data))
                self.fed = True
                if self.obj.eof:  # a frame ended: the next one starts in unused_data
                    data, self.obj, self.fed = self.obj.unused_data, self._new(), False
                else:
                    data = b""
            self.buf, self.pos = b"".join(parts), 0
        out = self.buf[self.pos:self.pos + n] if self.pos or n < len(self.buf) else self.buf
        self.pos += len(out)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()
