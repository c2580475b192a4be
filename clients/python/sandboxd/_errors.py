"""Errors: the daemon's error envelope as exceptions, and the transport's."""

from __future__ import annotations

from typing import Any


class SandboxdError(Exception):
    """An error the daemon answered: its HTTP status, its error code
    (``session_not_found``, ``session_busy``, ...) and its message, which says
    what to do."""

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message
        self.status = status


class InvalidRequestError(SandboxdError):
    """400, 413, 415: the request was refused as it is (a bad field, too much code)."""


class AuthenticationError(SandboxdError):
    """401, 403: no token, an unknown one, or one that may not do this."""


class NotFoundError(SandboxdError):
    """404: no such session, run, file or tool."""


class ConflictError(SandboxdError):
    """409: the session is busy, or the session or file exists already."""


class PackageInstallError(SandboxdError):
    """422: the installer ran and failed; the message has its own words."""


class RateLimitError(SandboxdError):
    """429: a quota of the daemon or the token is taken (sessions, runs, connections)."""


class UnavailableError(SandboxdError):
    """503, 507: the daemon is stopping, busy, or out of disk."""


class TransportError(SandboxdError):
    """The daemon could not be reached, or the connection broke."""

    def __init__(self, message: str) -> None:
        super().__init__("transport", message, 0)


class RunFailedError(SandboxdError):
    """Raised by :meth:`RunResult.raise_for_status` for a run whose status is not ``ok``."""

    def __init__(self, result: Any) -> None:
        tail = (result.stderr or "").strip().splitlines()[-1:] or [""]
        super().__init__(
            f"run_{result.status}",
            f"run {result.run_id} ended with status {result.status!r} (exit code {result.exit_code}, "
            f"signal {result.signal}): {tail[0]}",
            0,
        )
        self.result = result


_BY_STATUS: dict[int, type[SandboxdError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidRequestError,
    415: InvalidRequestError,
    422: PackageInstallError,
    429: RateLimitError,
    503: UnavailableError,
    507: UnavailableError,
}


# The status each code is answered with (an `error` event of a stream has no status).
_STATUS_OF_CODE: dict[str, int] = {
    "invalid_request": 400, "invalid_session_id": 400, "invalid_path": 400, "policy_not_found": 400,
    "unauthorized": 401, "forbidden": 403, "session_not_found": 404, "run_not_found": 404,
    "not_found": 404, "file_exists": 409, "file_busy": 409, "session_exists": 409, "session_busy": 409,
    "code_too_large": 413, "upload_too_large": 413, "artifact_too_large": 413,
    "unsupported_media_type": 415, "request_timeout": 408, "max_sessions": 429, "max_runs": 429,
    "max_listings": 429, "max_connections": 429, "package_install_failed": 422,
    "unavailable": 503, "insufficient_storage": 507, "internal": 500,
}


def error_from(status: int, body: Any) -> SandboxdError:
    """The exception for an error answer (status 0: an `error` event of a
    stream, known by its code): its envelope, or what the body was."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = str(err.get("code", ""))
        status = status or _STATUS_OF_CODE.get(code, 0)
        return _BY_STATUS.get(status, SandboxdError)(code, str(err.get("message", "")), status)
    cls = _BY_STATUS.get(status, SandboxdError)
    return cls("http_error", f"HTTP {status}: {str(body)[:500]}", status)
