// What the daemon answers, as it writes it (the API's own field names).

export type Status = "ok" | "error" | "timeout" | "oom" | "killed";
export type ToolFormat = "openai" | "openai-responses" | "anthropic" | "mcp";

export interface Artifact {
  path: string;
  size_bytes: number;
  mime_type: string;
  /** `figure` for a matplotlib figure the daemon saved, else `file`. */
  kind: "file" | "figure";
  url: string;
}

export interface RunUsage {
  cpu_ms?: number | null;
  memory_peak_bytes?: number | null;
  pids_peak?: number | null;
  /** Present when the run's policy has network. */
  net?: Record<string, unknown> | null;
  /** `workspace` or `host`: which room ran out. */
  disk_full?: "workspace" | "host" | null;
}

export interface KernelException {
  name: string;
  value: string;
  traceback: string;
}

/** How a run ended, as the daemon answers it. A status other than `ok` is a
 * result, not an exception: {@link raiseForStatus} makes it one. */
export interface RunResult {
  run_id: string;
  session_id: string;
  status: Status;
  exit_code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  duration_ms: number;
  artifacts: Artifact[];
  artifacts_truncated: boolean;
  usage?: RunUsage;
  /** A kernel cell's final expression by mime type. */
  result?: Record<string, string> | null;
  /** The exception a kernel cell raised. */
  exception?: KernelException | null;
  kernel_restarted?: boolean;
}

export interface SessionInfo {
  id: string;
  mode: "script" | "kernel";
  policy: string;
  created_at: string;
  last_used_at: string;
  ttl_s: number;
  busy?: boolean;
  /** Bytes of the host disk its workspace and packages take, as last measured. */
  disk_bytes?: number;
}

export interface FileEntry {
  path: string;
  size_bytes: number;
  mime_type: string;
  modified_at: string;
  url: string;
}

export interface RunSummary {
  run_id: string;
  language: string;
  mode: string;
  status: string;
  accepted_at: string;
  finished_at: string | null;
  duration_ms: number | null;
  exit_code: number | null;
}

export interface RunRecord {
  run_id: string;
  language: string;
  mode: string;
  status: string;
  accepted_at: string;
  finished_at: string | null;
  code: string;
  error: string | null;
  result: RunResult | null;
}

export interface InstallResult {
  session_id: string;
  installed: { name: string; version: string }[];
  unchanged: string[];
  duration_ms: number;
  layer_bytes: number;
  layer_limit_bytes: number;
}

/** A tool definition as an LLM API takes it (its shape depends on the format). */
export type ToolDefinition = Record<string, unknown>;
/** A tool call's answer in its format's shape (`content`/`output`, `is_error`, ...). */
export type ToolAnswer = Record<string, unknown> & { is_error?: boolean; isError?: boolean };
