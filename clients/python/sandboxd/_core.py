"""What the sync and async clients share: where the daemon is, each request as
data (:class:`Request`), and how an answer is read. The clients only send."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Union
from urllib.parse import quote

import httpx

from ._errors import SandboxdError, TransportError, error_from
from ._sse import EventParser

DEFAULT_SOCKET = "/run/sandboxd/sandboxd.sock"
#: The header naming the session a request is about (a fleet's router reads it).
SESSION_HEADER = "Sandboxd-Session"
FORMATS = ("openai", "openai-responses", "anthropic", "mcp")

OutputCallback = Callable[[str], Any]


@dataclass
class Endpoint:
    """Where the daemon listens, and the token to send."""

    base_url: str
    socket: Optional[str]
    token: Optional[str]

    @classmethod
    def resolve(cls, url: Optional[str], socket: Optional[str], token: Optional[str]) -> "Endpoint":
        """``url`` or ``socket`` if given, else ``SANDBOXD_URL``, else
        ``SANDBOXD_SOCKET``, else the default socket; the token from ``token``
        or ``SANDBOXD_TOKEN``."""
        if url and socket:
            raise ValueError("pass url or socket, not both")
        token = token if token is not None else os.environ.get("SANDBOXD_TOKEN") or None
        if url is None and socket is None:
            url = os.environ.get("SANDBOXD_URL") or None
            if url is None:
                socket = os.environ.get("SANDBOXD_SOCKET") or DEFAULT_SOCKET
        if url is not None:
            if not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"url {url!r}: give an http:// or https:// address; for a Unix socket pass socket={url!r}"
                )
            return cls(url.rstrip("/"), None, token)
        return cls("http://sandboxd", socket, token)

    def describe(self) -> str:
        return f"the Unix socket {self.socket}" if self.socket else self.base_url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def timeout_of(timeout: Optional[float]) -> httpx.Timeout:
    """A connect timeout of 10 s, and `timeout` (default 600 s) to wait for an
    answer: a run answers when it ends."""
    return httpx.Timeout(600.0 if timeout is None else timeout, connect=10.0)


def unreachable(endpoint: Endpoint, e: Exception) -> TransportError:
    if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
        return TransportError(
            f"sandboxd at {endpoint.describe()} did not answer in time ({type(e).__name__}): a run answers when it "
            "ends, so make the client's timeout (Client(timeout=...), seconds) longer than the run's timeout_s"
        )
    hint = (
        "is sandboxd running, and may this user open its socket? (set SANDBOXD_SOCKET or SANDBOXD_URL)"
        if endpoint.socket
        else "is sandboxd running and listening there? (set SANDBOXD_URL or SANDBOXD_SOCKET)"
    )
    return TransportError(f"could not talk to sandboxd at {endpoint.describe()}: {e}; {hint}")


@dataclass
class Request:
    """One API request, as data."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None
    #: A session-scoped request names its session in the `Sandboxd-Session` header.
    session: Optional[str] = None
    accept: Optional[str] = None
    content_type: Optional[str] = None

    def headers(self) -> dict[str, str]:
        h = {}
        if self.session is not None:
            h[SESSION_HEADER] = self.session
        if self.accept is not None:
            h["Accept"] = self.accept
        if self.content_type is not None:
            h["Content-Type"] = self.content_type
        return h


def tool_call(name: str, format: str) -> Request:
    return Request(
        "POST", f"/v1/tools/{seg(name)}", params={"format": check_format(format)}, content_type="application/json"
    )


def runs_page(path: str, session: str, before: Optional[str], limit: Optional[int], seen: int) -> Request:
    params = {"limit": str(min(100, limit - seen) if limit else 100)}
    if before is not None:
        params["before"] = before
    return Request("GET", path, params=params, session=session)


def upload(session: str, path: str, overwrite: bool) -> Request:
    params = {"overwrite": "true"} if overwrite else {}
    return Request("PUT", file_path(session, path), params=params, session=session)


#: How long a background run's cancel keeps asking while its request has not
#: reached the daemon yet (the daemon answers `idle` until it has).
CANCEL_PATIENCE_S = 30.0
CANCEL_RETRY_S = 0.02


def check_binary(data: Any) -> None:
    """A file object must be open in binary mode: its bytes are sent as they are."""
    read = getattr(data, "read", None)
    if read is not None and not isinstance(data, (bytes, bytearray, memoryview, str)) and isinstance(read(0), str):
        raise TypeError("the file is open in text mode: open it with 'rb', or pass its text as a str")


def destination(path: str, dest: "os.PathLike[str] | str") -> "os.PathLike[str] | str":
    """Where a download goes: `dest`, or into it under the file's own name when it is a directory."""
    if os.path.isdir(dest):
        return os.path.join(dest, os.path.basename(path.rstrip("/")) or "download")
    return dest


#: The most a one-shot run keeps of its figures (each, and all together): the
#: sandbox names its files, and a "figure" may be anything it wrote.
MAX_KEPT_FIGURE = 32 << 20
MAX_KEPT_FIGURES = 128 << 20


def figures_to_keep(figures: "Sequence[Any]") -> list[Any]:
    """The figures a one-shot run downloads before its session closes: those
    within the caps, in order."""
    kept, total = [], 0
    for a in figures:
        if a.size_bytes <= MAX_KEPT_FIGURE and total + a.size_bytes <= MAX_KEPT_FIGURES:
            kept.append(a)
            total += a.size_bytes
    return kept


def part_file(dest: "os.PathLike[str] | str") -> "tuple[Any, Path]":
    """A new file beside `dest` to download into, open for writing, and its
    name: made with O_EXCL and written only through the handle (nothing already
    there, nor a link swapped in later, is written through); renamed over `dest`
    when whole."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=f".{os.path.basename(os.fspath(dest))}.", suffix=".part",
                                dir=os.path.dirname(os.path.abspath(dest)))
    return os.fdopen(fd, "wb"), Path(name)


def one_shot_reader(kept: dict[str, bytes]) -> Callable[[str], bytes]:
    """A one-shot run's artifacts' reader: the figures kept before its session closed."""

    def read(path: str) -> bytes:
        if path in kept:
            return kept[path]
        raise SandboxdError(
            "session_not_found",
            f"{path}: the session of a one-shot run is closed (it kept its figures up to {MAX_KEPT_FIGURE >> 20} MiB "
            "each); run in client.session() to keep its files",
            404,
        )

    return read


def seg(s: str) -> str:
    """A session id, run id or tool name as one path segment (`.` and `..`
    encoded, so that no URL library folds them into another route)."""
    return {".": "%2E", "..": "%2E%2E"}.get(s, quote(s, safe=""))


def file_path(session: str, path: str) -> str:
    """The URL path of a workspace file, relative to the workspace (a path under
    `/mnt/data/`, where the sandbox sees it, is taken as relative to it); each
    part percent-encoded from UTF-8."""
    if path.startswith("/mnt/data/"):
        path = path[len("/mnt/data/") :]
    # `.` and `..` are sent as they are written (encoded, so no URL library
    # folds them away): the daemon answers `invalid_path`, not another file.
    parts = [seg(p) for p in path.split("/")]
    return f"/v1/sessions/{seg(session)}/files/{'/'.join(parts)}"


def requirements(packages: Union[str, Sequence[str]]) -> List[str]:
    """Requirements as the daemon takes them: a list. One string is one
    requirement ("tabulate==0.9.0"), not a sequence of one-letter names."""
    if isinstance(packages, (bytes, bytearray)):
        raise TypeError("packages: pass requirement strings (str), not bytes")
    return [packages] if isinstance(packages, str) else list(packages)


def run_body(
    code: str,
    *,
    language: str = "python",
    timeout_s: Optional[float] = None,
    packages: Optional[Union[str, Sequence[str]]] = None,
    autosave_figures: Optional[bool] = None,
    policy: Optional[str] = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "language": language}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if packages:
        body["packages"] = requirements(packages)
    if autosave_figures is not None:
        body["autosave_figures"] = autosave_figures
    if policy is not None:
        body["policy"] = policy
    return body


def session_body(
    mode: str, policy: Optional[str], ttl_s: Optional[int], id: Optional[str]
) -> dict[str, Any]:
    if mode not in ("script", "kernel"):
        raise ValueError(f"mode {mode!r}: use 'script' or 'kernel'")
    body: dict[str, Any] = {"mode": mode}
    for name, value in (("policy", policy), ("ttl_s", ttl_s), ("id", id)):
        if value is not None:
            body[name] = value
    return body


def check_format(format: str) -> str:
    if format not in FORMATS:
        raise ValueError(f"format {format!r}: use one of {', '.join(FORMATS)}")
    return format


def tool_arguments(arguments: Any) -> bytes:
    """A tool call's body: a dict as JSON, a string (the model's JSON, as OpenAI
    gives it) as it is, None as no arguments."""
    import json

    if arguments is None:
        return b"{}"
    if isinstance(arguments, (str, bytes)):
        text = arguments.encode() if isinstance(arguments, str) else arguments
        return text if text.strip() else b"{}"
    return json.dumps(arguments).encode()


def answer(response: httpx.Response) -> Any:
    """The JSON of a successful answer; the error envelope as an exception."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    if response.status_code >= 400:
        raise error_from(response.status_code, body)
    return body


#: The longest server-sent event a run's stream may carry (its result, with
#: output capped by the policy, is far smaller).
MAX_EVENT = 64 << 20


class Stream:
    """Reads a run's server-sent events: output to the callbacks as it comes,
    then the result (or the error) at the end."""

    def __init__(self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]) -> None:
        self._parser = EventParser(MAX_EVENT)
        self._on = {"stdout": on_stdout, "stderr": on_stderr}
        self.result: Optional[dict[str, Any]] = None

    def feed(self, chunk: bytes) -> list[Any]:
        """Handle the events `chunk` completes; returns what the callbacks
        returned (an async client awaits those that are awaitable)."""
        import json

        returned: list[Any] = []
        for ev in self._parser.feed(chunk):
            try:
                data = json.loads(ev.data) if ev.data else {}
            except ValueError as e:
                raise SandboxdError("internal", f"the run's event stream sent a {ev.event!r} event that is not JSON ({e})", 0) from e
            if not isinstance(data, dict):
                raise SandboxdError("internal", f"the run's event stream sent a {ev.event!r} event that is not an object", 0)
            if ev.event in self._on:
                cb = self._on[ev.event]
                if cb is not None:
                    returned.append(cb(str(data.get("text", ""))))
            elif ev.event == "result":
                self.result = data
            elif ev.event == "error":
                raise error_from(0, data)
        return returned

    def finish(self) -> dict[str, Any]:
        if self.result is None:
            raise SandboxdError("internal", "the run's event stream ended without a result: retry the run", 0)
        return self.result
