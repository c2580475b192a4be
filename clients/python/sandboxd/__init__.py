"""sandboxd's Python client: run untrusted Python in sandboxd's native Linux
sandboxes, from scripts, services and agent loops.

    from sandboxd import Client

    with Client() as client, client.session() as session:
        result = session.run("import pandas as pd; print(pd.__version__)")
        print(result.status, result.stdout)

:class:`Client` (and :class:`AsyncClient`, the same shape for asyncio) talks to
the daemon's Unix socket by default (``SANDBOXD_SOCKET``, or ``SANDBOXD_URL``
for HTTP; ``SANDBOXD_TOKEN`` is the bearer token). :mod:`sandboxd.tools` gives
the daemon's tools in each LLM API's format.
"""

from ._async import AsyncClient, AsyncFiles, AsyncRun, AsyncSession, AsyncTools
from ._errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PackageInstallError,
    RateLimitError,
    RunFailedError,
    SandboxdError,
    TransportError,
    UnavailableError,
)
from ._models import (
    Artifact,
    FileEntry,
    InstallResult,
    KernelException,
    RunRecord,
    RunResult,
    RunSummary,
    RunUsage,
    SessionInfo,
)
from ._sync import Client, Files, Run, Secrets, Session, Tools

__version__ = "0.1.0"

__all__ = [
    "Artifact",
    "AsyncClient",
    "AsyncFiles",
    "AsyncRun",
    "AsyncSession",
    "AsyncTools",
    "AuthenticationError",
    "Client",
    "ConflictError",
    "FileEntry",
    "Files",
    "InstallResult",
    "InvalidRequestError",
    "KernelException",
    "NotFoundError",
    "PackageInstallError",
    "RateLimitError",
    "Run",
    "RunFailedError",
    "RunRecord",
    "RunResult",
    "RunSummary",
    "RunUsage",
    "SandboxdError",
    "Secrets",
    "Session",
    "SessionInfo",
    "Tools",
    "TransportError",
    "UnavailableError",
]
