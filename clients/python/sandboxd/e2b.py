"""A small stand-in for E2B's code interpreter (``from e2b_code_interpreter import
Sandbox``) over a sandboxd kernel session, for code written against E2B:

    from sandboxd.e2b import Sandbox

    with Sandbox() as sandbox:
        execution = sandbox.run_code("import numpy as np; np.arange(4).sum()")
        print(execution.text)                  # 6
        execution.logs.stdout, execution.results, execution.error

It covers ``run_code`` (``Execution`` with ``logs``, ``results``, ``error``,
``text``; figures as ``Result.png``, base64), ``files.write``/``read``/``list``
and ``kill``; paths under E2B's ``/home/user`` are the session's workspace.
Everything else of E2B's API is not here: use :class:`sandboxd.Client`.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ._core import figures_to_keep
from ._sync import Client, Session

HOME = "/home/user/"


@dataclass
class OutputMessage:
    line: str
    timestamp: int
    error: bool = False


@dataclass
class Logs:
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class Result:
    """A cell's value (``is_main_result``) or a figure it made, by format."""

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    latex: Optional[str] = None
    json: Optional[Any] = None
    is_main_result: bool = False
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class ExecutionError:
    name: str
    value: str
    traceback: str


@dataclass
class Execution:
    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The main result's text, as E2B's ``Execution.text``."""
        return next((r.text for r in self.results if r.is_main_result), None)


_MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
         "text/latex": "latex", "image/png": "png", "image/jpeg": "jpeg"}


def _path(path: str) -> str:
    return path[len(HOME):] if path.startswith(HOME) else path


class Files:
    def __init__(self, session: Session) -> None:
        self._s = session

    def write(self, path: str, data: Union[str, bytes]) -> None:
        self._s.files.upload(_path(path), data, overwrite=True)

    def read(self, path: str, format: str = "text") -> Union[str, bytes]:
        data = self._s.files.download(_path(path))
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    def list(self, path: str = HOME) -> list[str]:
        prefix = _path(path).strip("/")
        return [f.path for f in self._s.files.list() if not prefix or f.path.startswith(prefix + "/")]


class Sandbox:
    """A kernel session of the daemon (``Client()``'s, from the environment, or
    ``client``'s), closed by :meth:`kill` or at the end of a ``with`` block."""

    def __init__(self, client: Optional[Client] = None, *, policy: Optional[str] = None) -> None:
        self._own = client is None
        self._client = client or Client()
        self._session = self._client.session(mode="kernel", policy=policy)
        self.sandbox_id = self._session.id
        self.files = Files(self._session)
        self._count = 0

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def run_code(
        self,
        code: str,
        on_stdout: Optional[Callable[[OutputMessage], Any]] = None,
        on_stderr: Optional[Callable[[OutputMessage], Any]] = None,
        timeout: Optional[float] = None,
    ) -> Execution:
        def relay(cb: Optional[Callable[[OutputMessage], Any]], error: bool) -> Optional[Callable[[str], Any]]:
            return None if cb is None else (lambda text: cb(OutputMessage(text, time.time_ns(), error)))

        r = self._session.run(code, timeout_s=timeout, on_stdout=relay(on_stdout, False), on_stderr=relay(on_stderr, True))
        self._count += 1
        ex = Execution(logs=Logs(r.stdout.splitlines(keepends=True), r.stderr.splitlines(keepends=True)),
                       execution_count=self._count)
        # The sandbox names its files: a "figure" may be anything it wrote. Kept within caps.
        for fig in figures_to_keep(r.figures):
            ex.results.append(Result(png=base64.b64encode(fig.read()).decode()))
        if r.result:
            main = Result(is_main_result=True)
            for mime, value in r.result.items():
                if mime in _MIME:
                    setattr(main, _MIME[mime], value)
                else:
                    main.extra[mime] = value
            ex.results.append(main)
        if r.exception is not None:
            ex.error = ExecutionError(r.exception.name, r.exception.value, r.exception.traceback)
        elif r.status != "ok":
            ex.error = ExecutionError(r.status.capitalize(), f"the cell ended with status {r.status}", r.stderr)
        return ex

    def kill(self) -> None:
        self._session.close()
        if self._own:
            self._client.close()
