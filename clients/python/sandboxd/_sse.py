"""Server-sent events, parsed incrementally from the bytes as they arrive."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Event:
    event: str
    data: str


class EventParser:
    """Feed it chunks of an ``text/event-stream`` body; it returns each event
    once its blank line has come (``event:`` and ``data:`` fields; comments and
    other fields are skipped, as the standard says)."""

    def __init__(self) -> None:
        self._buf = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        self._buf += chunk
        out: list[Event] = []
        while True:
            cut = self._buf.find(b"\n")
            if cut < 0:
                return out
            raw, self._buf = self._buf[:cut], self._buf[cut + 1 :]
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:
                if self._data:
                    out.append(Event(self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)
