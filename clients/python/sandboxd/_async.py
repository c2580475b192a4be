"""The asynchronous client: the same shape as the synchronous one
(:mod:`sandboxd._sync`), each call awaited."""

from __future__ import annotations

import asyncio
import inspect
import os
from pathlib import Path
from typing import IO, Any, AsyncIterator, Optional, Sequence, Union

import httpx

from . import _core as core
from ._core import Endpoint, OutputCallback, Request
from ._errors import SandboxdError
from ._models import FileEntry, InstallResult, RunRecord, RunResult, RunSummary, SessionInfo
from ._sync import CHUNK, FileData


class AsyncClient:
    """:class:`sandboxd.Client`, for asyncio. Output callbacks may be plain
    functions or coroutine functions."""

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        socket: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self.endpoint = Endpoint.resolve(url, socket, token)
        transport = httpx.AsyncHTTPTransport(uds=self.endpoint.socket) if self.endpoint.socket else None
        self._http = httpx.AsyncClient(
            base_url=self.endpoint.base_url,
            transport=transport,
            headers=self.endpoint.headers(),
            timeout=core.timeout_of(timeout),
        )
        self.tools = AsyncTools(self)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, req: Request, content: Any = None) -> Any:
        try:
            r = await self._http.request(
                req.method, req.path, params=req.params or None, json=req.json, content=content, headers=req.headers()
            )
        except httpx.TransportError as e:
            raise core.unreachable(self.endpoint, e) from e
        return core.answer(r)

    async def _stream_run(
        self, req: Request, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]
    ) -> dict[str, Any]:
        stream = core.Stream(on_stdout, on_stderr)
        try:
            async with self._http.stream(req.method, req.path, json=req.json, headers=req.headers()) as r:
                if r.status_code >= 400:
                    await r.aread()
                    core.answer(r)
                async for chunk in r.aiter_raw():
                    for returned in stream.feed(chunk):
                        if inspect.isawaitable(returned):
                            await returned
        except httpx.TransportError as e:
            raise core.unreachable(self.endpoint, e) from e
        return stream.finish()

    async def health(self) -> dict[str, Any]:
        """The daemon's health report."""
        out: dict[str, Any] = await self._send(Request("GET", "/v1/health"))
        return out

    async def policies(self) -> list[dict[str, Any]]:
        """The daemon's policies and their limits."""
        out: list[dict[str, Any]] = await self._send(Request("GET", "/v1/policies"))
        return out

    async def session(
        self,
        mode: str = "script",
        *,
        policy: Optional[str] = None,
        ttl_s: Optional[int] = None,
        id: Optional[str] = None,
    ) -> "AsyncSession":
        """Make a session; ``async with await client.session() as s:`` closes it at the end."""
        body = core.session_body(mode, policy, ttl_s, id)
        return AsyncSession(self, SessionInfo.from_json(await self._send(Request("POST", "/v1/sessions", json=body))))

    async def get_session(self, id: str) -> "AsyncSession":
        """An existing session, by id."""
        info = await self._send(Request("GET", f"/v1/sessions/{core.seg(id)}", session=id))
        return AsyncSession(self, SessionInfo.from_json(info))

    async def sessions(self) -> list[SessionInfo]:
        """The open sessions (this token's)."""
        return [SessionInfo.from_json(s) for s in await self._send(Request("GET", "/v1/sessions"))]

    async def run(
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
        """Run ``code`` once, in a session made for it and closed after it (its
        figures are kept: ``await artifact.aread()``)."""
        async with await self.session(policy=policy) as s:
            result = await s.run(
                code, language=language, timeout_s=timeout_s, packages=packages, on_stdout=on_stdout, on_stderr=on_stderr
            )
            kept = {a.path: await s.files.download(a.path) for a in core.figures_to_keep(result.figures)}
        read = core.one_shot_reader(kept)

        async def aread(path: str) -> bytes:
            return read(path)

        for a in result.artifacts:
            a._aread = aread
        return result


class AsyncSession:
    """:class:`sandboxd.Session`, for asyncio."""

    def __init__(self, client: AsyncClient, info: SessionInfo) -> None:
        self.client = client
        self.info = info
        self.id = info.id
        self.files = AsyncFiles(self)
        self.secrets = AsyncSecrets(self)

    def __repr__(self) -> str:
        return f"AsyncSession(id={self.id!r}, mode={self.info.mode!r}, policy={self.info.policy!r})"

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _path(self, tail: str = "") -> str:
        return f"/v1/sessions/{core.seg(self.id)}{tail}"

    async def run(
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
        """Run ``code`` in this session and return how it ended (see
        :meth:`sandboxd.Session.run`); callbacks may be coroutine functions."""
        body = core.run_body(
            code, language=language, timeout_s=timeout_s, packages=packages, autosave_figures=autosave_figures
        )
        req = Request("POST", self._path("/runs"), json=body, session=self.id)
        if on_stdout is not None or on_stderr is not None:
            req.accept = "text/event-stream"
            raw = await self.client._stream_run(req, on_stdout, on_stderr)
        else:
            raw = await self.client._send(req)
        result = RunResult.from_json(raw)
        for a in result.artifacts:
            a._aread = self.files.download
        return result

    def start(self, code: str, **options: Any) -> "AsyncRun":
        """Start ``code`` as a task (the options of :meth:`run`)."""
        return AsyncRun(self, asyncio.ensure_future(self.run(code, **options)))

    async def cancel(self) -> bool:
        """Stop the run going on in this session; False when nothing was running."""
        out = await self.client._send(Request("DELETE", self._path("/run"), session=self.id))
        return bool(out.get("status") == "cancelled")

    async def install(self, packages: Union[str, Sequence[str]]) -> InstallResult:
        """Install packages into the session's package layer."""
        req = Request("POST", self._path("/packages"), json={"packages": core.requirements(packages)}, session=self.id)
        return InstallResult.from_json(await self.client._send(req))

    async def runs(self, limit: Optional[int] = None) -> AsyncIterator[RunSummary]:
        """The session's runs, newest first: ``async for record in session.runs()``."""
        before: Optional[str] = None
        seen = 0
        while limit is None or seen < limit:
            page = await self.client._send(core.runs_page(self._path("/runs"), self.id, before, limit, seen))
            for r in page.get("runs", []):
                seen += 1
                yield RunSummary.from_json(r)
            before = page.get("next")
            if not before or not page.get("runs"):
                return

    async def get_run(self, run_id: str) -> RunRecord:
        """One run the session keeps, with its code and result."""
        req = Request("GET", self._path(f"/runs/{core.seg(run_id)}"), session=self.id)
        return RunRecord.from_json(await self.client._send(req))

    async def refresh(self) -> SessionInfo:
        """The session as the daemon has it now."""
        self.info = SessionInfo.from_json(await self.client._send(Request("GET", self._path(), session=self.id)))
        return self.info

    async def close(self) -> None:
        """Close the session: stop its code, delete its files (twice: nothing)."""
        try:
            await self.client._send(Request("DELETE", self._path(), session=self.id))
        except SandboxdError as e:
            if e.code != "session_not_found":
                raise


class AsyncRun:
    """A run started as a task (:meth:`AsyncSession.start`)."""

    def __init__(self, session: AsyncSession, task: "asyncio.Future[RunResult]") -> None:
        self.session = session
        self._task = task

    def done(self) -> bool:
        return self._task.done()

    async def result(self) -> RunResult:
        """The run's result, once it has ended."""
        return await asyncio.shield(self._task)

    async def cancel(self) -> bool:
        """Stop the run (its result says ``killed``); False if it had ended. A
        run whose request has not reached the daemon yet is stopped as soon as
        it has."""
        deadline = asyncio.get_running_loop().time() + core.CANCEL_PATIENCE_S
        while not self.done():
            if await self.session.cancel():
                return True
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.wait([self._task], timeout=core.CANCEL_RETRY_S)
        return False


class AsyncFiles:
    """:class:`sandboxd.Files`, for asyncio."""

    def __init__(self, session: AsyncSession) -> None:
        self._s = session

    async def list(self) -> list[FileEntry]:
        """Every file of the workspace, recursively, sorted by path."""
        out = await self._s.client._send(Request("GET", self._s._path("/files"), session=self._s.id))
        return [FileEntry.from_json(f) for f in out]

    async def upload(self, path: str, data: FileData, *, overwrite: bool = False) -> FileEntry:
        """Write ``data`` to ``path``: bytes, a ``str`` (the file's text), a
        ``pathlib.Path`` (a local file, streamed) or a binary file object."""
        req = core.upload(self._s.id, path, overwrite)
        core.check_binary(data)
        if isinstance(data, str):
            return FileEntry.from_json(await self._s.client._send(req, content=data.encode()))
        if isinstance(data, (bytes, bytearray, memoryview)):
            return FileEntry.from_json(await self._s.client._send(req, content=bytes(data)))
        if isinstance(data, os.PathLike):
            with open(data, "rb") as f:
                return FileEntry.from_json(await self._s.client._send(req, content=_achunks(f)))
        return FileEntry.from_json(await self._s.client._send(req, content=_achunks(data)))

    async def upload_file(self, path: str, local: "Union[str, os.PathLike[str]]", *, overwrite: bool = False) -> FileEntry:
        """Upload the local file ``local`` to ``path``, streamed."""
        return await self.upload(path, Path(local), overwrite=overwrite)

    async def download(self, path: str) -> bytes:
        """A file's bytes."""
        c = self._s.client
        try:
            r = await c._http.get(core.file_path(self._s.id, path), headers={core.SESSION_HEADER: self._s.id})
        except httpx.TransportError as e:
            raise core.unreachable(c.endpoint, e) from e
        if r.status_code >= 400:
            core.answer(r)
        return r.content

    async def download_to(self, path: str, dest: "Union[str, os.PathLike[str]]") -> int:
        """Stream a file to the local file ``dest`` (into it when it is a directory); its size."""
        c = self._s.client
        n = 0
        dest = core.destination(path, dest)
        f, tmp = core.part_file(dest)
        try:
            url = core.file_path(self._s.id, path)
            with f:
                async with c._http.stream("GET", url, headers={core.SESSION_HEADER: self._s.id}) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        core.answer(r)
                    async for chunk in r.aiter_bytes(CHUNK):
                        n += f.write(chunk)
            tmp.replace(dest)
        except httpx.TransportError as e:
            raise core.unreachable(c.endpoint, e) from e
        finally:
            f.close()
            tmp.unlink(missing_ok=True)
        return n

    async def delete(self, path: str) -> None:
        """Delete a file of the workspace."""
        await self._s.client._send(Request("DELETE", core.file_path(self._s.id, path), session=self._s.id))


async def _achunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(f.read, CHUNK):
        yield chunk


class AsyncSecrets:
    """:class:`sandboxd.Secrets`, for asyncio."""

    def __init__(self, session: AsyncSession) -> None:
        self._s = session

    async def set(self, name: str, value: str, hosts: Sequence[str]) -> dict[str, Any]:
        body = {"value": value, "hosts": list(hosts)}
        req = Request("PUT", self._s._path(f"/secrets/{core.seg(name)}"), json=body, session=self._s.id)
        out: dict[str, Any] = await self._s.client._send(req)
        return out

    async def list(self) -> list[dict[str, Any]]:
        req = Request("GET", self._s._path("/secrets"), session=self._s.id)
        out: list[dict[str, Any]] = await self._s.client._send(req)
        return out

    async def delete(self, name: str) -> None:
        req = Request("DELETE", self._s._path(f"/secrets/{core.seg(name)}"), session=self._s.id)
        await self._s.client._send(req)


class AsyncTools:
    """:class:`sandboxd.Tools`, for asyncio."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def definitions(self, format: str = "openai") -> list[dict[str, Any]]:
        """The tools as ``format``'s API takes them."""
        out = await self._c._send(Request("GET", "/v1/tools", params={"format": core.check_format(format)}))
        tools: list[dict[str, Any]] = out["tools"]
        return tools

    async def openai(self) -> list[dict[str, Any]]:
        return await self.definitions("openai")

    async def openai_responses(self) -> list[dict[str, Any]]:
        return await self.definitions("openai-responses")

    async def anthropic(self) -> list[dict[str, Any]]:
        return await self.definitions("anthropic")

    async def call(self, name: str, arguments: Any = None, *, format: str = "openai") -> dict[str, Any]:
        """Run one tool call with the model's arguments (see :meth:`sandboxd.Tools.call`)."""
        out: dict[str, Any] = await self._c._send(core.tool_call(name, format), content=core.tool_arguments(arguments))
        return out
