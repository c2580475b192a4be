// sandboxd's TypeScript client: run untrusted Python in sandboxd's native Linux
// sandboxes from Node (>= 20), with no dependency beyond Node itself.
//
//   import { Client } from "sandboxd";
//   const client = new Client();                     // SANDBOXD_SOCKET / SANDBOXD_URL / SANDBOXD_TOKEN
//   const result = await client.run("print(6 * 7)");  // result.stdout === "42\n"

import { createReadStream, createWriteStream } from "node:fs";
import { open, rename, rm } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { basename, dirname, join } from "node:path";
import { errorFrom, InvalidRequestError, RunFailedError, SandboxdError, TransportError } from "./errors.js";
import {
  describe,
  readAll,
  resolveEndpoint,
  send,
  SESSION_HEADER,
  type Body,
  type ClientOptions,
  type Endpoint,
  type Outgoing,
} from "./transport.js";
import type {
  FileEntry,
  InstallResult,
  RunRecord,
  RunResult,
  RunSummary,
  SessionInfo,
  ToolAnswer,
  ToolDefinition,
  ToolFormat,
} from "./types.js";

export * from "./errors.js";
export * from "./types.js";
export { DEFAULT_SOCKET, SESSION_HEADER, type ClientOptions } from "./transport.js";
export const VERSION = "0.1.0";

export type OutputCallback = (text: string) => unknown;

export interface RunOptions {
  /** `python` (the default) or `shell`. */
  language?: "python" | "shell";
  /** Wall-clock limit in seconds (at most the policy's). */
  timeoutS?: number;
  /** Packages installed before the code runs. */
  packages?: string[];
  autosaveFigures?: boolean;
  /** Output as the run writes it (server-sent events), before the result. */
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** Aborting stops waiting for the answer (and, the connection gone, the run). */
  signal?: AbortSignal;
}

export interface SessionOptions {
  /** `script` (each run a fresh process; the default) or `kernel` (state lasts between runs). */
  mode?: "script" | "kernel";
  policy?: string;
  ttlS?: number;
  id?: string;
}

const FORMATS: ToolFormat[] = ["openai", "openai-responses", "anthropic", "mcp"];
/** The most a one-shot run keeps of its figures, each and all together. */
const MAX_KEPT_FIGURE = 32 << 20;
const MAX_KEPT_FIGURES = 128 << 20;
/** The longest server-sent event a run's stream may carry. */
const MAX_EVENT = 64 << 20;

/** A session id, run id or tool name as one path segment. `.` and `..` are
 * refused: fetch folds them (encoded or not) into another route. */
function seg(s: string): string {
  if (s === "." || s === "..") {
    throw new InvalidRequestError("invalid_request", `${JSON.stringify(s)} is not an id or a name: use the one the daemon gave`, 400);
  }
  return encodeURIComponent(s);
}

/** The URL path of a workspace file: each part percent-encoded from UTF-8,
 * `/mnt/data/` stripped. A `.` or `..` part is refused here, as the daemon refuses
 * it (`invalid_path`): a URL library would fold it away and name another file. */
export function filePath(session: string, path: string): string {
  const rel = path.startsWith("/mnt/data/") ? path.slice("/mnt/data/".length) : path;
  const parts = rel.split("/");
  if (parts.some((p) => p === "." || p === "..")) {
    throw new InvalidRequestError(
      "invalid_path",
      `invalid path ${JSON.stringify(path)}: use a relative path inside the workspace, without \`.\` or \`..\` parts`,
      400,
    );
  }
  return `/v1/sessions/${seg(session)}/files/${parts.map(encodeURIComponent).join("/")}`;
}

function runBody(code: string, o: RunOptions & { policy?: string }): Record<string, unknown> {
  const body: Record<string, unknown> = { code, language: o.language ?? "python" };
  if (o.timeoutS !== undefined) body.timeout_s = o.timeoutS;
  if (o.packages?.length) body.packages = o.packages;
  if (o.autosaveFigures !== undefined) body.autosave_figures = o.autosaveFigures;
  if (o.policy !== undefined) body.policy = o.policy;
  return body;
}

/** The exception for an error answer's body (the error envelope, or what it was). */
function failure(status: number, bytes: Uint8Array): SandboxdError {
  const text = new TextDecoder().decode(bytes);
  try {
    return errorFrom(status, JSON.parse(text));
  } catch {
    return errorFrom(status, text);
  }
}

/** Throw {@link RunFailedError} unless the run ended `ok` (and no kernel cell raised). */
export function raiseForStatus(result: RunResult): RunResult {
  if (result.status !== "ok" || result.exception) throw new RunFailedError(result);
  return result;
}

/** The figures a run saved, in order. */
export function figures(result: RunResult) {
  return result.artifacts.filter((a) => a.kind === "figure");
}

/** Server-sent events, parsed as the bytes arrive. */
export class EventParser {
  private buf = "";
  private event = "";
  private data: string[] = [];
  private decoder = new TextDecoder();

  private size = 0;
  private scanned = 0;

  constructor(private readonly limit = MAX_EVENT) {}

  /** The events `chunk` completes; an event longer than the limit is an error, not memory held. */
  feed(chunk: Uint8Array): { event: string; data: string }[] {
    this.buf += this.decoder.decode(chunk, { stream: true });
    const out: { event: string; data: string }[] = [];
    for (let cut = this.buf.indexOf("\n", this.scanned); ; cut = this.buf.indexOf("\n")) {
      if (cut < 0) {
        this.scanned = this.buf.length;
        if (this.size + this.buf.length > this.limit) throw new SandboxdError("internal", `an event of the stream is longer than ${this.limit} bytes`, 0);
        return out;
      }
      this.scanned = 0;
      const line = this.buf.slice(0, cut).replace(/\r$/, "");
      this.buf = this.buf.slice(cut + 1);
      this.size += line.length;
      if (this.size > this.limit) throw new SandboxdError("internal", `an event of the stream is longer than ${this.limit} bytes`, 0);
      if (line === "") {
        if (this.data.length) out.push({ event: this.event || "message", data: this.data.join("\n") });
        this.event = "";
        this.data = [];
        this.size = 0;
      } else if (!line.startsWith(":")) {
        const i = line.indexOf(":");
        const name = i < 0 ? line : line.slice(0, i);
        let value = i < 0 ? "" : line.slice(i + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (name === "event") this.event = value;
        else if (name === "data") this.data.push(value);
      }
    }
  }
}

/** A client of one sandboxd daemon: the Unix socket /run/sandboxd/sandboxd.sock by
 * default (`SANDBOXD_SOCKET`), or `SANDBOXD_URL` over HTTP; `SANDBOXD_TOKEN` is
 * sent as the bearer token. */
export class Client {
  readonly endpoint: Endpoint;
  readonly tools: Tools;

  constructor(options: ClientOptions = {}) {
    this.endpoint = resolveEndpoint(options);
    this.tools = new Tools(this);
  }

  /** @internal Send a request; the raw answer (errors not yet read). */
  async raw(o: Outgoing) {
    try {
      return await send(this.endpoint, o);
    } catch (e) {
      if (e instanceof Error && (e.name === "AbortError" || e.name === "TimeoutError")) throw e;
      const hint = this.endpoint.socket
        ? "is sandboxd running, and may this user open its socket? (set SANDBOXD_SOCKET or SANDBOXD_URL)"
        : "is sandboxd running and listening there? (set SANDBOXD_URL or SANDBOXD_SOCKET)";
      const cause = e instanceof Error ? ((e.cause as Error | undefined)?.message ?? e.message) : String(e);
      throw new TransportError(`could not talk to sandboxd at ${describe(this.endpoint)}: ${cause}; ${hint}`);
    }
  }

  /** @internal Send a request and read its JSON answer (an error envelope thrown). */
  async call<T>(o: Outgoing & { json?: unknown }): Promise<T> {
    const headers = { ...(o.headers ?? {}) };
    let body: Body = o.body;
    if (o.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(o.json);
    }
    const res = await this.raw({ ...o, headers, body });
    const bytes = await readAll(res.body);
    if (res.status >= 400) throw failure(res.status, bytes);
    return JSON.parse(new TextDecoder().decode(bytes)) as T;
  }

  /** The daemon's health report. */
  health(): Promise<Record<string, unknown>> {
    return this.call({ method: "GET", path: "/v1/health" });
  }

  /** The daemon's policies and their limits. */
  policies(): Promise<Record<string, unknown>[]> {
    return this.call({ method: "GET", path: "/v1/policies" });
  }

  /** Make a session; close it when done (or use {@link withSession}). */
  async session(options: SessionOptions = {}): Promise<Session> {
    const mode = options.mode ?? "script";
    if (mode !== "script" && mode !== "kernel") throw new TypeError(`mode ${JSON.stringify(mode)}: use "script" or "kernel"`);
    const json: Record<string, unknown> = { mode };
    if (options.policy !== undefined) json.policy = options.policy;
    if (options.ttlS !== undefined) json.ttl_s = options.ttlS;
    if (options.id !== undefined) json.id = options.id;
    return new Session(this, await this.call<SessionInfo>({ method: "POST", path: "/v1/sessions", json }));
  }

  /** Run `fn` with a new session, closed afterwards whatever happens. */
  async withSession<T>(options: SessionOptions, fn: (s: Session) => Promise<T>): Promise<T> {
    const s = await this.session(options);
    try {
      return await fn(s);
    } finally {
      await s.close();
    }
  }

  /** An existing session, by id. */
  async getSession(id: string): Promise<Session> {
    const info = await this.call<SessionInfo>({ method: "GET", path: `/v1/sessions/${seg(id)}`, headers: { [SESSION_HEADER]: id } });
    return new Session(this, info);
  }

  /** The open sessions (this token's). */
  sessions(): Promise<SessionInfo[]> {
    return this.call({ method: "GET", path: "/v1/sessions" });
  }

  /** Run `code` once, in a session made for it and closed after it. Its figures
   * are downloaded first: `figures` maps each figure's path to its bytes. */
  async run(code: string, options: RunOptions & { policy?: string } = {}): Promise<RunResult & { figures: Map<string, Uint8Array> }> {
    return this.withSession({ policy: options.policy }, async (s) => {
      const result = await s.run(code, options);
      // The sandbox names its files: a "figure" may be anything it wrote. Kept within caps.
      const kept = new Map<string, Uint8Array>();
      let total = 0;
      for (const f of figures(result)) {
        if (f.size_bytes > MAX_KEPT_FIGURE || total + f.size_bytes > MAX_KEPT_FIGURES) continue;
        total += f.size_bytes;
        kept.set(f.path, await s.files.download(f.path));
      }
      return Object.assign(result, { figures: kept });
    });
  }
}

/** A session: a workspace (/mnt/data) kept between its runs, and in `kernel`
 * mode an interpreter whose state lasts. */
export class Session {
  readonly id: string;
  readonly files: Files;
  readonly secrets: Secrets;

  constructor(
    readonly client: Client,
    public info: SessionInfo,
  ) {
    this.id = info.id;
    this.files = new Files(this);
    this.secrets = new Secrets(this);
  }

  /** @internal */
  path(tail = ""): string {
    return `/v1/sessions/${seg(this.id)}${tail}`;
  }

  /** @internal */
  call<T>(o: Outgoing & { json?: unknown }): Promise<T> {
    return this.client.call<T>({ ...o, headers: { ...(o.headers ?? {}), [SESSION_HEADER]: this.id } });
  }

  /** Run `code` in this session and answer how it ended. With `onStdout` or
   * `onStderr`, output is handed to them as it comes, in order, before the result. */
  async run(code: string, options: RunOptions = {}): Promise<RunResult> {
    const json = runBody(code, options);
    if (!options.onStdout && !options.onStderr) {
      return this.call<RunResult>({ method: "POST", path: this.path("/runs"), json, signal: options.signal });
    }
    const res = await this.client.raw({
      method: "POST",
      path: this.path("/runs"),
      headers: { "Content-Type": "application/json", Accept: "text/event-stream", [SESSION_HEADER]: this.id },
      body: JSON.stringify(json),
      signal: options.signal,
    });
    if (res.status >= 400) throw failure(res.status, await readAll(res.body));
    const parser = new EventParser();
    for await (const chunk of res.body) {
      for (const ev of parser.feed(chunk)) {
        let data: { text?: unknown } & Record<string, unknown>;
        try {
          data = ev.data ? JSON.parse(ev.data) : {};
        } catch (e) {
          throw new SandboxdError("internal", `the run's event stream sent a ${JSON.stringify(ev.event)} event that is not JSON (${e})`, 0);
        }
        if (ev.event === "stdout" && options.onStdout) await options.onStdout(String(data.text ?? ""));
        else if (ev.event === "stderr" && options.onStderr) await options.onStderr(String(data.text ?? ""));
        else if (ev.event === "result") return data as unknown as RunResult;
        else if (ev.event === "error") throw errorFrom(0, data);
      }
    }
    throw new SandboxdError("internal", "the run's event stream ended without a result: retry the run", 0);
  }

  /** Start `code` in the background: the handle can be awaited or cancelled. */
  start(code: string, options: RunOptions = {}): RunHandle {
    return new RunHandle(this, this.run(code, options));
  }

  /** Stop the run going on in this session (it ends `killed`); false when nothing ran. */
  async cancel(): Promise<boolean> {
    const out = await this.call<{ status: string }>({ method: "DELETE", path: this.path("/run") });
    return out.status === "cancelled";
  }

  /** Install packages into the session's package layer, for its every later run. */
  install(packages: string[]): Promise<InstallResult> {
    return this.call({ method: "POST", path: this.path("/packages"), json: { packages } });
  }

  /** The session's runs, newest first (a page at a time as you go). */
  async *runs(limit?: number): AsyncGenerator<RunSummary> {
    let before: string | null = null;
    let seen = 0;
    while (limit === undefined || seen < limit) {
      const query: Record<string, string> = { limit: String(limit ? Math.min(100, limit - seen) : 100) };
      if (before) query.before = before;
      const page = await this.call<{ runs: RunSummary[]; next: string | null }>({ method: "GET", path: this.path("/runs"), query });
      for (const r of page.runs) {
        seen += 1;
        yield r;
      }
      before = page.next;
      if (!before || page.runs.length === 0) return;
    }
  }

  /** One run the session keeps, with its code and result. */
  getRun(runId: string): Promise<RunRecord> {
    return this.call({ method: "GET", path: this.path(`/runs/${seg(runId)}`) });
  }

  /** The session as the daemon has it now. */
  async refresh(): Promise<SessionInfo> {
    this.info = await this.call<SessionInfo>({ method: "GET", path: this.path() });
    return this.info;
  }

  /** Close the session: stop its code, delete its files. Closing it twice does nothing. */
  async close(): Promise<void> {
    try {
      await this.call({ method: "DELETE", path: this.path() });
    } catch (e) {
      if (!(e instanceof SandboxdError && e.code === "session_not_found")) throw e;
    }
  }

  async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")](): Promise<void> {
    await this.close();
  }
}

/** A run started in the background ({@link Session.start}). */
export class RunHandle {
  private ended = false;
  readonly promise: Promise<RunResult>;

  constructor(
    readonly session: Session,
    run: Promise<RunResult>,
  ) {
    this.promise = run.finally(() => {
      this.ended = true;
    });
    this.promise.catch(() => undefined); // awaited by result(); never an unhandled rejection
  }

  get done(): boolean {
    return this.ended;
  }

  result(): Promise<RunResult> {
    return this.promise;
  }

  /** Stop the run (its result says `killed`); false if it had ended. A run whose
   * request has not reached the daemon yet (it answers `idle` until then) is
   * stopped as soon as it has. */
  async cancel(): Promise<boolean> {
    const deadline = Date.now() + 30_000;
    while (!this.ended) {
      if (await this.session.cancel()) return true;
      if (Date.now() > deadline) return false;
      await Promise.race([this.promise.catch(() => undefined), new Promise((r) => setTimeout(r, 20))]);
    }
    return false;
  }
}

/** A session's workspace files. */
export class Files {
  constructor(private readonly s: Session) {}

  list(): Promise<FileEntry[]> {
    return this.s.call({ method: "GET", path: this.s.path("/files") });
  }

  /** Write `data` (text, bytes, or chunks streamed) to `path`; an existing file
   * is replaced only with `overwrite`. */
  async upload(path: string, data: string | Uint8Array | AsyncIterable<Uint8Array>, options: { overwrite?: boolean } = {}): Promise<FileEntry> {
    const query: Record<string, string> = options.overwrite ? { overwrite: "true" } : {};
    return this.s.call({ method: "PUT", path: filePath(this.s.id, path), query, body: data });
  }

  /** Upload the local file `local` to `path`, streamed. */
  async uploadFile(path: string, local: string, options: { overwrite?: boolean } = {}): Promise<FileEntry> {
    // Opened first, so a missing file is an error of its own before any request.
    await (await open(local, "r")).close();
    return this.upload(path, createReadStream(local, { highWaterMark: 1 << 20 }), options);
  }

  /** A file's bytes. */
  async download(path: string): Promise<Uint8Array> {
    const res = await this.s.client.raw({ method: "GET", path: filePath(this.s.id, path), headers: { [SESSION_HEADER]: this.s.id } });
    const bytes = await readAll(res.body);
    if (res.status >= 400) throw failure(res.status, bytes);
    return bytes;
  }

  /** Stream a file to the local file `dest` (written whole or not at all); its size. */
  async downloadTo(path: string, dest: string): Promise<number> {
    const res = await this.s.client.raw({ method: "GET", path: filePath(this.s.id, path), headers: { [SESSION_HEADER]: this.s.id } });
    if (res.status >= 400) throw failure(res.status, await readAll(res.body));
    // A new file beside dest, made exclusively (nothing already there, a planted
    // link included, is written through), renamed over dest when whole.
    const tmp = join(dirname(dest), `.${basename(dest)}.${randomBytes(6).toString("hex")}.part`);
    let n = 0;
    try {
      const out = createWriteStream(tmp, { flags: "wx", mode: 0o600 });
      await new Promise<void>((resolve, reject) => out.once("open", () => resolve()).once("error", reject));
      for await (const chunk of res.body) {
        n += chunk.length;
        if (!out.write(chunk)) await new Promise<void>((r) => out.once("drain", () => r()));
      }
      await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
      await rename(tmp, dest);
    } finally {
      await rm(tmp, { force: true });
    }
    return n;
  }

  async delete(path: string): Promise<void> {
    await this.s.call({ method: "DELETE", path: filePath(this.s.id, path) });
  }
}

/** A session's own secrets: write-only (no route answers a value). */
export class Secrets {
  constructor(private readonly s: Session) {}

  set(name: string, value: string, hosts: string[]): Promise<Record<string, unknown>> {
    return this.s.call({ method: "PUT", path: this.s.path(`/secrets/${seg(name)}`), json: { value, hosts } });
  }

  list(): Promise<Record<string, unknown>[]> {
    return this.s.call({ method: "GET", path: this.s.path("/secrets") });
  }

  async delete(name: string): Promise<void> {
    await this.s.call({ method: "DELETE", path: this.s.path(`/secrets/${seg(name)}`) });
  }
}

/** The daemon's tools (the same MCP serves) in an LLM API's format, and calls of them. */
export class Tools {
  constructor(private readonly c: Client) {}

  /** The tools as `format`'s API takes them. */
  async definitions(format: ToolFormat = "openai"): Promise<ToolDefinition[]> {
    if (!FORMATS.includes(format)) throw new TypeError(`format ${JSON.stringify(format)}: use one of ${FORMATS.join(", ")}`);
    const out = await this.c.call<{ tools: ToolDefinition[] }>({ method: "GET", path: "/v1/tools", query: { format } });
    return out.tools;
  }

  openai(): Promise<ToolDefinition[]> {
    return this.definitions("openai");
  }

  openaiResponses(): Promise<ToolDefinition[]> {
    return this.definitions("openai-responses");
  }

  anthropic(): Promise<ToolDefinition[]> {
    return this.definitions("anthropic");
  }

  /** Run tool `name` with the model's arguments (an object, or the JSON string
   * the model wrote); bad arguments, and a name that is no tool, come back as an
   * answer with `is_error`. */
  async call(name: string, args: unknown = {}, options: { format?: ToolFormat; signal?: AbortSignal } = {}): Promise<ToolAnswer> {
    const format = options.format ?? "openai";
    if (!FORMATS.includes(format)) throw new TypeError(`format ${JSON.stringify(format)}: use one of ${FORMATS.join(", ")}`);
    const body = typeof args === "string" ? (args.trim() ? args : "{}") : JSON.stringify(args ?? {});
    return this.c.call<ToolAnswer>({
      method: "POST",
      path: `/v1/tools/${seg(name)}`,
      query: { format },
      headers: { "Content-Type": "application/json" },
      body,
      signal: options.signal,
    });
  }
}
