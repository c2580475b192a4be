"""The synchronous client."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator, Optional, Sequence, Union

import httpx

from . import _core as core
from ._core import Endpoint, OutputCallback, Request
from ._errors import SandboxdError
from ._models import FileEntry, InstallResult, RunRecord, RunResult, RunSummary, SessionInfo

FileData = Union[bytes, str, "os.PathLike[str]", IO[bytes]]
CHUNK = 1 << 20


class Client:
    """A client of one sandboxd daemon.

    By default it talks to the Unix socket ``/run/sandboxd/sandboxd.sock``
    (``SANDBOXD_SOCKET``), or to ``SANDBOXD_URL`` when that is set; ``url`` or
    ``socket`` choose explicitly. ``token`` (default ``SANDBOXD_TOKEN``) is sent
    as a bearer token. ``timeout`` is how long to wait for an answer (a run
    answers when it ends; default 600 s).

    Example::

        with Client() as client:
            print(client.run("print(6 * 7)").stdout)   # 42
    """

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        socket: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self.endpoint = Endpoint.resolve(url, socket, token)
        transport = httpx.HTTPTransport(uds=self.endpoint.socket) if self.endpoint.socket else None
        self._http = httpx.Client(
            base_url=self.endpoint.base_url,
            transport=transport,
            headers=self.endpoint.headers(),
            timeout=core.timeout_of(timeout),
        )
        self.tools = Tools(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending -----------------------------------------------------------

    def _send(self, req: Request, content: Any = None) -> Any:
        try:
            r = self._http.request(
                req.method, req.path, params=req.params or None, json=req.json, content=content, headers=req.headers()
            )
        except httpx.TransportError as e:
            raise core.unreachable(self.endpoint, e) from e
        return core.answer(r)

    def _stream_run(
        self, req: Request, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]
    ) -> dict[str, Any]:
        stream = core.Stream(on_stdout, on_stderr)
        try:
            with self._http.stream(req.method, req.path, json=req.json, headers=req.headers()) as r:
                if r.status_code >= 400:
                    r.read()
                    core.answer(r)
                for chunk in r.iter_raw():
                    stream.feed(chunk)
        except httpx.TransportError as e:
            raise core.unreachable(self.endpoint, e) from e
        return stream.finish()

    # -- the daemon ----------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The daemon's health report (``status``, ``version``, and with a
        token or over the socket its pool, sessions and storage)."""
        out: dict[str, Any] = self._send(Request("GET", "/v1/health"))
        return out

    def policies(self) -> list[dict[str, Any]]:
        """The daemon's policies and their limits."""
        out: list[dict[str, Any]] = self._send(Request("GET", "/v1/policies"))
        return out

    # -- sessions ------------------------------------------------------------

    def session(
        self,
        mode: str = "script",
        *,
        policy: Optional[str] = None,
        ttl_s: Optional[int] = None,
        id: Optional[str] = None,
    ) -> "Session":
        """Make a session (``mode`` ``"script"``: each run a fresh process;
        ``"kernel"``: one interpreter whose state lasts between runs). Use it as
        a context manager to close it at the end."""
        info = SessionInfo.from_json(self._send(Request("POST", "/v1/sessions", json=core.session_body(mode, policy, ttl_s, id))))
        return Session(self, info)

    def get_session(self, id: str) -> "Session":
        """An existing session, by id."""
        info = SessionInfo.from_json(self._send(Request("GET", f"/v1/sessions/{core.seg(id)}", session=id)))
        return Session(self, info)

    def sessions(self) -> list[SessionInfo]:
        """The open sessions (this token's)."""
        return [SessionInfo.from_json(s) for s in self._send(Request("GET", "/v1/sessions"))]

    def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: Optional[float] = None,
        policy: Optional[str] = None,
        packages: Optional[Union[str, Sequence[str]]] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> RunResult:
        """Run ``code`` once, in a session made for it and closed after it. The
        figures it saved are downloaded before the session closes
        (``artifact.read()``); to keep its other files, run in a
        :meth:`session` instead."""
        with self.session(policy=policy) as s:
            result = s.run(
                code, language=language, timeout_s=timeout_s, packages=packages, on_stdout=on_stdout, on_stderr=on_stderr
            )
            read = core.one_shot_reader({a.path: s.files.download(a.path) for a in core.figures_to_keep(result.figures)})
        for a in result.artifacts:
            a._read = read
        return result


class Session:
    """A session: a workspace (``/mnt/data``) kept between its runs, and in
    ``kernel`` mode an interpreter whose state lasts. Close it (or use it as a
    context manager) when done; an idle one closes itself after its TTL."""

    def __init__(self, client: Client, info: SessionInfo) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        self.files = Files(self)
        self.secrets = Secrets(self)

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, mode={self.info.mode!r}, policy={self.info.policy!r})"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _path(self, tail: str = "") -> str:
        return f"/v1/sessions/{core.seg(self.id)}{tail}"

    def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: Optional[float] = None,
        packages: Optional[Union[str, Sequence[str]]] = None,
        autosave_figures: Optional[bool] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> RunResult:
        """Run ``code`` (``language`` ``"python"`` or ``"shell"``) in this
        session and return how it ended. ``packages`` are installed first.
        With ``on_stdout``/``on_stderr``, output is handed to them as it comes
        (server-sent events), in order, before the result returns."""
        body = core.run_body(
            code, language=language, timeout_s=timeout_s, packages=packages, autosave_figures=autosave_figures
        )
        req = Request("POST", self._path("/runs"), json=body, session=self.id)
        if on_stdout is not None or on_stderr is not None:
            req.accept = "text/event-stream"
            raw = self.client._stream_run(req, on_stdout, on_stderr)
        else:
            raw = self.client._send(req)
        return self._bind(RunResult.from_json(raw))

    def _bind(self, result: RunResult) -> RunResult:
        for a in result.artifacts:
            a._read = self.files.download
        return result

    def start(self, code: str, **options: Any) -> "Run":
        """Start ``code`` in the background (the options of :meth:`run`): the
        :class:`Run` can be waited for or cancelled."""
        return Run(self, code, options)

    def cancel(self) -> bool:
        """Stop the run going on in this session (it ends ``killed``); False
        when nothing was running."""
        out = self.client._send(Request("DELETE", self._path("/run"), session=self.id))
        return bool(out.get("status") == "cancelled")

    def install(self, packages: Union[str, Sequence[str]]) -> InstallResult:
        """Install packages (``["requests==2.32.3", "tabulate"]``) into the
        session's package layer, for its every later run; raises
        :class:`PackageInstallError` with the installer's words when it fails."""
        req = Request("POST", self._path("/packages"), json={"packages": core.requirements(packages)}, session=self.id)
        return InstallResult.from_json(self.client._send(req))

    def runs(self, limit: Optional[int] = None) -> Iterator[RunSummary]:
        """The session's runs, newest first (a page at a time as you go);
        :meth:`get_run` has a run's code and result."""
        before: Optional[str] = None
        seen = 0
        while limit is None or seen < limit:
            page = self.client._send(core.runs_page(self._path("/runs"), self.id, before, limit, seen))
            for r in page.get("runs", []):
                seen += 1
                yield RunSummary.from_json(r)
            before = page.get("next")
            if not before or not page.get("runs"):
                return

    def get_run(self, run_id: str) -> RunRecord:
        """One run the session keeps."""
        return RunRecord.from_json(
            self.client._send(Request("GET", self._path(f"/runs/{core.seg(run_id)}"), session=self.id))
        )

    def refresh(self) -> SessionInfo:
        """The session as the daemon has it now (``busy``, ``last_used_at``)."""
        self.info = SessionInfo.from_json(self.client._send(Request("GET", self._path(), session=self.id)))
        return self.info

    def close(self) -> None:
        """Close the session: stop its code and delete its files. Closing a
        closed session does nothing."""
        try:
            self.client._send(Request("DELETE", self._path(), session=self.id))
        except SandboxdError as e:
            if e.code != "session_not_found":
                raise


class Run:
    """A run started in the background (:meth:`Session.start`)."""

    def __init__(self, session: Session, code: str, options: dict[str, Any]) -> None:
        self.session = session
        self._result: Optional[RunResult] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._go, args=(code, options), daemon=True)
        self._thread.start()

    def _go(self, code: str, options: dict[str, Any]) -> None:
        try:
            self._result = self.session.run(code, **options)
        except BaseException as e:  # handed to whoever waits
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: Optional[float] = None) -> RunResult:
        """Wait for the run's result (raises what the run raised; TimeoutError
        if it has not ended within ``timeout`` seconds)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the run in session {self.session.id} has not ended yet")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> bool:
        """Stop the run (its result says ``killed``); False if it had ended. A
        run whose request has not reached the daemon yet is stopped as soon as
        it has."""
        deadline = time.monotonic() + core.CANCEL_PATIENCE_S
        while not self.done():
            if self.session.cancel():
                return True
            if time.monotonic() > deadline:
                return False
            self._thread.join(core.CANCEL_RETRY_S)
        return False


class Files:
    """A session's workspace files."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def list(self) -> list[FileEntry]:
        """Every file of the workspace, recursively, sorted by path."""
        out = self._s.client._send(Request("GET", self._s._path("/files"), session=self._s.id))
        return [FileEntry.from_json(f) for f in out]

    def upload(self, path: str, data: FileData, *, overwrite: bool = False) -> FileEntry:
        """Write ``data`` to ``path`` in the workspace: bytes, a ``str`` (the
        file's text, UTF-8: not a file name), a local file as a
        ``pathlib.Path`` (streamed; or use :meth:`upload_file`), or a file open
        in binary mode (streamed). An existing file is replaced only with
        ``overwrite=True`` (else :class:`ConflictError`)."""
        req = core.upload(self._s.id, path, overwrite)
        core.check_binary(data)
        if isinstance(data, str):
            return FileEntry.from_json(self._s.client._send(req, content=data.encode()))
        if isinstance(data, (bytes, bytearray, memoryview)):
            return FileEntry.from_json(self._s.client._send(req, content=bytes(data)))
        if isinstance(data, os.PathLike):
            with open(data, "rb") as f:
                return FileEntry.from_json(self._s.client._send(req, content=_chunks(f)))
        return FileEntry.from_json(self._s.client._send(req, content=_chunks(data)))

    def upload_file(self, path: str, local: "Union[str, os.PathLike[str]]", *, overwrite: bool = False) -> FileEntry:
        """Upload the local file ``local`` to ``path``, streamed."""
        return self.upload(path, Path(local), overwrite=overwrite)

    def download(self, path: str) -> bytes:
        """A file's bytes."""
        c = self._s.client
        try:
            r = c._http.get(core.file_path(self._s.id, path), headers={core.SESSION_HEADER: self._s.id})
        except httpx.TransportError as e:
            raise core.unreachable(c.endpoint, e) from e
        if r.status_code >= 400:
            core.answer(r)
        return r.content

    def download_to(self, path: str, dest: "Union[str, os.PathLike[str]]") -> int:
        """Stream a file to the local file ``dest`` (into it, under the file's
        name, when it is a directory), written whole or not at all; its size."""
        c = self._s.client
        n = 0
        dest = core.destination(path, dest)
        f, tmp = core.part_file(dest)
        try:
            with f, c._http.stream("GET", core.file_path(self._s.id, path), headers={core.SESSION_HEADER: self._s.id}) as r:
                if r.status_code >= 400:
                    r.read()
                    core.answer(r)
                for chunk in r.iter_bytes(CHUNK):
                    n += f.write(chunk)
            tmp.replace(dest)
        except httpx.TransportError as e:
            raise core.unreachable(c.endpoint, e) from e
        finally:
            f.close()
            tmp.unlink(missing_ok=True)
        return n

    def delete(self, path: str) -> None:
        """Delete a file of the workspace."""
        self._s.client._send(Request("DELETE", core.file_path(self._s.id, path), session=self._s.id))


def _chunks(f: IO[bytes]) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk


class Secrets:
    """A session's own secrets: write-only (no route answers a value). Its
    sandboxes see a placeholder in the variable; the egress proxy puts the
    value in its place only in requests to ``hosts``."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def set(self, name: str, value: str, hosts: Sequence[str]) -> dict[str, Any]:
        req = Request(
            "PUT",
            self._s._path(f"/secrets/{core.seg(name)}"),
            json={"value": value, "hosts": list(hosts)},
            session=self._s.id,
        )
        out: dict[str, Any] = self._s.client._send(req)
        return out

    def list(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self._s.client._send(Request("GET", self._s._path("/secrets"), session=self._s.id))
        return out

    def delete(self, name: str) -> None:
        self._s.client._send(Request("DELETE", self._s._path(f"/secrets/{core.seg(name)}"), session=self._s.id))


class Tools:
    """The daemon's tools (the same MCP serves) in an LLM API's format, and
    calls of them with a model's arguments."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def definitions(self, format: str = "openai") -> list[dict[str, Any]]:
        """The tools as ``format``'s API takes them (``openai``,
        ``openai-responses``, ``anthropic`` or ``mcp``)."""
        out = self._c._send(Request("GET", "/v1/tools", params={"format": core.check_format(format)}))
        tools: list[dict[str, Any]] = out["tools"]
        return tools

    def openai(self) -> list[dict[str, Any]]:
        return self.definitions("openai")

    def openai_responses(self) -> list[dict[str, Any]]:
        return self.definitions("openai-responses")

    def anthropic(self) -> list[dict[str, Any]]:
        return self.definitions("anthropic")

    def call(self, name: str, arguments: Any = None, *, format: str = "openai") -> dict[str, Any]:
        """Run tool ``name`` with the model's ``arguments`` (a dict, or the JSON
        string the model wrote) and return what to hand back to the model in
        ``format``'s shape; bad arguments come back as a result with
        ``is_error``, for the model to act on."""
        out: dict[str, Any] = self._c._send(core.tool_call(name, format), content=core.tool_arguments(arguments))
        return out
