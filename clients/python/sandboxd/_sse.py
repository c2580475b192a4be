"""Server-sent events, parsed incrementally from the bytes as they arrive."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import SandboxdError


@dataclass
class Event:
    event: str
    data: str


class EventParser:
    """Feed it chunks of an ``text/event-stream`` body; it returns each event
    once its blank line has come (``event:`` and ``data:`` fields; comments and
    other fields are skipped, as the standard says)."""

    def __init__(self, limit: int = 64 << 20) -> None:
        self._buf = bytearray()
        self._scanned = 0  # the buffer holds no newline before this
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._limit = limit

    def feed(self, chunk: bytes) -> list[Event]:
        """The events `chunk` completes. An event longer than the limit is an
        error (:class:`SandboxdError`), not memory held."""
        self._buf += chunk
        out: list[Event] = []
        while True:
            cut = self._buf.find(b"\n", self._scanned)
            if cut < 0:
                self._scanned = len(self._buf)
                if self._size + len(self._buf) > self._limit:
                    raise SandboxdError("internal", f"an event of the stream is longer than {self._limit} bytes", 0)
                return out
            raw = bytes(self._buf[:cut])
            del self._buf[: cut + 1]
            self._scanned = 0
            self._size += len(raw)
            if self._size > self._limit:
                raise SandboxdError("internal", f"an event of the stream is longer than {self._limit} bytes", 0)
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:
                if self._data:
                    out.append(Event(self._event or "message", "\n".join(self._data)))
                self._event, self._data, self._size = "", [], 0
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)
