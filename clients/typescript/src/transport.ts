// Where the daemon is, and one request to it: fetch for an HTTP URL, Node's own
// `http` module for the Unix socket (fetch cannot reach one). Both answer a
// status and the body as chunks, read as they arrive.

import { request as httpRequest } from "node:http";

export const DEFAULT_SOCKET = "/run/sandboxd/sandboxd.sock";
/** The header naming the session a request is about (a fleet's router reads it). */
export const SESSION_HEADER = "Sandboxd-Session";

export interface ClientOptions {
  /** The daemon's HTTP address (default `SANDBOXD_URL`). */
  url?: string;
  /** The daemon's Unix socket (default `SANDBOXD_SOCKET`, else /run/sandboxd/sandboxd.sock). */
  socket?: string;
  /** A bearer token (default `SANDBOXD_TOKEN`). */
  token?: string;
  /** How long to wait for an answer, in ms (a run answers when it ends; default 600 000). */
  timeoutMs?: number;
}

export interface Endpoint {
  baseUrl: string;
  socket?: string;
  token?: string;
  timeoutMs: number;
}

export function resolveEndpoint(o: ClientOptions = {}): Endpoint {
  if (o.url && o.socket) throw new TypeError("pass url or socket, not both");
  const env = process.env;
  const token = o.token ?? (env.SANDBOXD_TOKEN || undefined);
  const timeoutMs = o.timeoutMs ?? 600_000;
  let url = o.url;
  let socket = o.socket;
  if (url === undefined && socket === undefined) {
    url = env.SANDBOXD_URL || undefined;
    if (url === undefined) socket = env.SANDBOXD_SOCKET || DEFAULT_SOCKET;
  }
  if (url !== undefined) return { baseUrl: url.replace(/\/+$/, ""), token, timeoutMs };
  return { baseUrl: "http://sandboxd", socket, token, timeoutMs };
}

export function describe(e: Endpoint): string {
  return e.socket ? `the Unix socket ${e.socket}` : e.baseUrl;
}

export interface Raw {
  status: number;
  body: AsyncIterable<Uint8Array>;
}

export type Body = string | Uint8Array | AsyncIterable<Uint8Array> | undefined;

export interface Outgoing {
  method: string;
  path: string;
  query?: Record<string, string>;
  headers?: Record<string, string>;
  body?: Body;
  signal?: AbortSignal;
}

function target(o: Outgoing): string {
  const q = o.query && Object.keys(o.query).length ? `?${new URLSearchParams(o.query)}` : "";
  return `${o.path}${q}`;
}

/** Send one request; the answer's body is read as it arrives. */
export async function send(e: Endpoint, o: Outgoing): Promise<Raw> {
  const headers: Record<string, string> = { ...(o.headers ?? {}) };
  if (e.token) headers.Authorization = `Bearer ${e.token}`;
  const signal = o.signal ? AbortSignal.any([o.signal, AbortSignal.timeout(e.timeoutMs)]) : AbortSignal.timeout(e.timeoutMs);
  if (!e.socket) {
    const init: RequestInit & { duplex?: "half" } = { method: o.method, headers, signal };
    if (o.body !== undefined) {
      init.body = isIterable(o.body) ? (iterableStream(o.body) as unknown as RequestInit["body"]) : (o.body as RequestInit["body"]);
      if (isIterable(o.body)) init.duplex = "half";
    }
    const res = await fetch(`${e.baseUrl}${target(o)}`, init);
    const body = res.body ? (res.body as unknown as AsyncIterable<Uint8Array>) : empty();
    return { status: res.status, body };
  }
  return new Promise<Raw>((resolve, reject) => {
    const req = httpRequest({ socketPath: e.socket, path: target(o), method: o.method, headers, signal }, (res) =>
      resolve({ status: res.statusCode ?? 0, body: res as AsyncIterable<Uint8Array> }),
    );
    req.on("error", reject);
    if (o.body === undefined) {
      req.end();
    } else if (isIterable(o.body)) {
      pump(o.body, req).then(
        () => req.end(),
        (err: unknown) => req.destroy(err instanceof Error ? err : new Error(String(err))),
      );
    } else {
      req.end(o.body);
    }
  });
}

function isIterable(b: Body): b is AsyncIterable<Uint8Array> {
  return typeof b === "object" && b !== null && Symbol.asyncIterator in b;
}

async function pump(body: AsyncIterable<Uint8Array>, req: import("node:http").ClientRequest): Promise<void> {
  for await (const chunk of body) {
    if (!req.write(chunk)) await new Promise<void>((r) => req.once("drain", () => r()));
  }
}

function iterableStream(body: AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const it = body[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { value, done } = await it.next();
      if (done) controller.close();
      else controller.enqueue(value);
    },
  });
}

async function* empty(): AsyncIterable<Uint8Array> {}

/** The whole body, as bytes. */
export async function readAll(body: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  let n = 0;
  for await (const c of body) {
    parts.push(c);
    n += c.length;
  }
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
