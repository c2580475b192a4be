"""What the daemon answers, as typed values. Each is made from the daemon's JSON
by ``from_json``, which ignores fields it does not know (a newer daemon may send
more); ``raw`` keeps the JSON as it came."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from ._errors import RunFailedError

def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass
class Artifact:
    """A file a run created or changed in the session's workspace (``kind``
    ``figure`` for a matplotlib figure the daemon saved)."""

    path: str
    size_bytes: int
    mime_type: str
    kind: str
    url: str
    _read: Optional[Callable[[str], bytes]] = field(default=None, repr=False, compare=False)
    _aread: Optional[Callable[[str], Awaitable[bytes]]] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Artifact":
        return cls(
            path=str(d["path"]),
            size_bytes=int(d.get("size_bytes", 0)),
            mime_type=str(d.get("mime_type", "application/octet-stream")),
            kind=str(d.get("kind", "file")),
            url=str(d.get("url", "")),
        )

    def read(self) -> bytes:
        """The file's bytes, downloaded now from its session (a sync client's result)."""
        if self._read is None:
            raise RuntimeError(
                "this artifact belongs to an async client's result: use `await artifact.aread()`"
                if self._aread is not None
                else "this artifact is not bound to a session: download it with session.files.download(path)"
            )
        return self._read(self.path)

    async def aread(self) -> bytes:
        """The file's bytes, downloaded now from its session (an async client's result)."""
        if self._aread is None:
            raise RuntimeError(
                "this artifact belongs to a sync client's result: use `artifact.read()`"
                if self._read is not None
                else "this artifact is not bound to a session: download it with session.files.download(path)"
            )
        return await self._aread(self.path)


@dataclass
class RunUsage:
    """What the run used: CPU time, peak memory and processes, and its network
    (``net``, when its policy has network) and full disk (``disk_full``:
    ``"workspace"`` or ``"host"``), as far as the daemon measured them."""

    cpu_ms: Optional[int] = None
    memory_peak_bytes: Optional[int] = None
    pids_peak: Optional[int] = None
    net: Optional[dict[str, Any]] = None
    disk_full: Optional[str] = None

    @classmethod
    def from_json(cls, d: Any) -> "RunUsage":
        if not isinstance(d, dict):
            return cls()
        full = d.get("disk_full")
        return cls(
            cpu_ms=_int(d.get("cpu_ms")),
            memory_peak_bytes=_int(d.get("memory_peak_bytes")),
            pids_peak=_int(d.get("pids_peak")),
            net=d.get("net") if isinstance(d.get("net"), dict) else None,
            disk_full=str(full) if isinstance(full, str) else None,
        )


@dataclass
class KernelException:
    """The exception a kernel cell raised."""

    name: str
    value: str
    traceback: str

    @classmethod
    def from_json(cls, d: Any) -> Optional["KernelException"]:
        if not isinstance(d, dict):
            return None
        tb = d.get("traceback", "")
        return cls(str(d.get("name", "")), str(d.get("value", "")), "\n".join(tb) if isinstance(tb, list) else str(tb))


@dataclass
class RunResult:
    """How a run ended. ``status`` other than ``ok`` is a result, not an
    exception: call :meth:`raise_for_status` to make it one."""

    run_id: str
    session_id: str
    status: str
    exit_code: Optional[int]
    signal: Optional[str]
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    artifacts: list[Artifact]
    artifacts_truncated: bool
    usage: RunUsage
    #: A kernel cell's final expression by mime type (``text/plain``, ``text/html``, ...).
    result: Optional[dict[str, str]] = None
    #: The exception a kernel cell raised.
    exception: Optional[KernelException] = None
    kernel_restarted: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunResult":
        res = d.get("result")
        return cls(
            run_id=str(d.get("run_id", "")),
            session_id=str(d.get("session_id", "")),
            status=str(d.get("status", "")),
            exit_code=_int(d.get("exit_code")),
            signal=d.get("signal") if isinstance(d.get("signal"), str) else None,
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            duration_ms=int(d.get("duration_ms", 0)),
            artifacts=[Artifact.from_json(a) for a in d.get("artifacts") or []],
            artifacts_truncated=bool(d.get("artifacts_truncated", False)),
            usage=RunUsage.from_json(d.get("usage")),
            result={str(k): str(v) for k, v in res.items()} if isinstance(res, dict) else None,
            exception=KernelException.from_json(d.get("exception")),
            kernel_restarted=bool(d.get("kernel_restarted", False)),
            raw=d,
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def figures(self) -> list[Artifact]:
        """The figures the run saved (``kind == "figure"``), in order."""
        return [a for a in self.artifacts if a.kind == "figure"]

    def raise_for_status(self) -> "RunResult":
        """Raise :class:`RunFailedError` unless the run's status is ``ok``, or a
        kernel cell raised; else return the result."""
        if not self.ok or self.exception is not None:
            raise RunFailedError(self)
        return self


@dataclass
class SessionInfo:
    """A session as the daemon lists it."""

    id: str
    mode: str
    policy: str
    created_at: str
    last_used_at: str
    ttl_s: int
    busy: bool = False
    #: Bytes of the host disk its workspace and packages take, as last measured.
    disk_bytes: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SessionInfo":
        return cls(
            id=str(d["id"]),
            mode=str(d.get("mode", "script")),
            policy=str(d.get("policy", "")),
            created_at=str(d.get("created_at", "")),
            last_used_at=str(d.get("last_used_at", "")),
            ttl_s=int(d.get("ttl_s", 0)),
            busy=bool(d.get("busy", False)),
            disk_bytes=int(d.get("disk_bytes", 0)),
        )


@dataclass
class FileEntry:
    """A file of a session's workspace."""

    path: str
    size_bytes: int
    mime_type: str
    modified_at: str
    url: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "FileEntry":
        return cls(
            path=str(d["path"]),
            size_bytes=int(d.get("size_bytes", 0)),
            mime_type=str(d.get("mime_type", "")),
            modified_at=str(d.get("modified_at", "")),
            url=str(d.get("url", "")),
        )


@dataclass
class RunSummary:
    """A run as a session's list of runs shows it (``session.runs()``); the
    whole record, with its code and result, is ``session.get_run(run_id)``."""

    run_id: str
    language: str
    mode: str
    #: ``running``, ``interrupted``, ``failed``, or how it ended (``ok``, ``error``, ...).
    status: str
    accepted_at: str
    finished_at: Optional[str]
    duration_ms: Optional[int]
    exit_code: Optional[int]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunSummary":
        return cls(
            run_id=str(d["run_id"]),
            language=str(d.get("language", "")),
            mode=str(d.get("mode", "")),
            status=str(d.get("status", "")),
            accepted_at=str(d.get("accepted_at", "")),
            finished_at=d.get("finished_at") if isinstance(d.get("finished_at"), str) else None,
            duration_ms=_int(d.get("duration_ms")),
            exit_code=_int(d.get("exit_code")),
        )


@dataclass
class RunRecord:
    """A run a session keeps: from the moment it was accepted (``running``) to
    how it ended, with the result its caller got (output cut to 64 KiB)."""

    run_id: str
    language: str
    mode: str
    status: str
    accepted_at: str
    finished_at: Optional[str]
    code: str
    error: Optional[str]
    result: Optional[RunResult]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunRecord":
        res = d.get("result")
        return cls(
            run_id=str(d["run_id"]),
            language=str(d.get("language", "")),
            mode=str(d.get("mode", "")),
            status=str(d.get("status", "")),
            accepted_at=str(d.get("accepted_at", "")),
            finished_at=d.get("finished_at") if isinstance(d.get("finished_at"), str) else None,
            code=str(d.get("code", "")),
            error=d.get("error") if isinstance(d.get("error"), str) else None,
            result=RunResult.from_json(res) if isinstance(res, dict) else None,
        )


@dataclass
class InstallResult:
    """What an install did: what it installed now (dependencies included) and
    which requirements were met already."""

    session_id: str
    installed: list[tuple[str, str]]
    unchanged: list[str]
    duration_ms: int
    layer_bytes: int
    layer_limit_bytes: int
    #: The install's network use (``usage.net``'s shape: hosts, bytes, ``cached_bytes``, refusals).
    net: Optional[dict[str, Any]] = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "InstallResult":
        return cls(
            session_id=str(d.get("session_id", "")),
            installed=[(str(p["name"]), str(p["version"])) for p in d.get("installed") or []],
            unchanged=[str(u) for u in d.get("unchanged") or []],
            duration_ms=int(d.get("duration_ms", 0)),
            layer_bytes=int(d.get("layer_bytes", 0)),
            layer_limit_bytes=int(d.get("layer_limit_bytes", 0)),
            net=d.get("net") if isinstance(d.get("net"), dict) else None,
            raw=d,
        )
