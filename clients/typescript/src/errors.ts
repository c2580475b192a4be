// The daemon's error envelope as exceptions, and the transport's.

/** An error the daemon answered: its HTTP status, its code (`session_not_found`,
 * `session_busy`, ...) and its message, which says what to do. */
export class SandboxdError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status: number = 0,
  ) {
    super(code ? `${code}: ${message}` : message);
    this.name = new.target.name;
    this.detail = message;
  }
  /** The daemon's message alone. */
  readonly detail: string;
}

/** 400, 413, 415: the request was refused as it is. */
export class InvalidRequestError extends SandboxdError {}
/** 401, 403: no token, an unknown one, or one that may not do this. */
export class AuthenticationError extends SandboxdError {}
/** 404: no such session, run, file or tool. */
export class NotFoundError extends SandboxdError {}
/** 409: the session is busy, or the session or file exists already. */
export class ConflictError extends SandboxdError {}
/** 422: the installer ran and failed; the message has its own words. */
export class PackageInstallError extends SandboxdError {}
/** 429: a quota of the daemon or the token is taken. */
export class RateLimitError extends SandboxdError {}
/** 503, 507: the daemon is stopping, busy, or out of disk. */
export class UnavailableError extends SandboxdError {}
/** The daemon could not be reached, or the connection broke. */
export class TransportError extends SandboxdError {
  constructor(message: string) {
    super("transport", message, 0);
  }
}

const BY_STATUS: Record<number, typeof SandboxdError> = {
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
};

// The status each code is answered with (an `error` event of a stream has none).
const STATUS_OF_CODE: Record<string, number> = {
  invalid_request: 400, invalid_session_id: 400, invalid_path: 400, policy_not_found: 400,
  unauthorized: 401, forbidden: 403, session_not_found: 404, run_not_found: 404, not_found: 404,
  file_exists: 409, file_busy: 409, session_exists: 409, session_busy: 409, code_too_large: 413,
  upload_too_large: 413, artifact_too_large: 413, unsupported_media_type: 415, request_timeout: 408,
  max_sessions: 429, max_runs: 429, max_listings: 429, max_connections: 429,
  package_install_failed: 422, unavailable: 503, insufficient_storage: 507, internal: 500,
};

/** The exception for an error answer (status 0: an `error` event, known by its code). */
export function errorFrom(status: number, body: unknown): SandboxdError {
  const env = body as { error?: { code?: unknown; message?: unknown } } | null;
  if (env && typeof env === "object" && env.error && typeof env.error === "object") {
    const code = String(env.error.code ?? "");
    const st = status || STATUS_OF_CODE[code] || 0;
    const Cls = BY_STATUS[st] ?? SandboxdError;
    return new Cls(code, String(env.error.message ?? ""), st);
  }
  const Cls = BY_STATUS[status] ?? SandboxdError;
  return new Cls("http_error", `HTTP ${status}: ${String(body).slice(0, 500)}`, status);
}

/** Thrown by `raiseForStatus` for a run whose status is not `ok`. */
export class RunFailedError extends SandboxdError {
  constructor(readonly result: { run_id: string; status: string; exit_code: number | null; signal: string | null; stderr: string }) {
    const tail = result.stderr.trim().split("\n").slice(-1)[0] ?? "";
    super(
      `run_${result.status}`,
      `run ${result.run_id} ended with status ${JSON.stringify(result.status)} (exit code ${result.exit_code}, signal ${result.signal}): ${tail}`,
      0,
    );
  }
}
