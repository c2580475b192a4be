// The TypeScript SDK against a real daemon (started by tests/test_sdk_typescript.py,
// which passes where it is): every method on both transports, the Unix socket
// (no token) and HTTP (a tenant's token). Run with Node's own test runner:
//   SANDBOXD_TEST_SOCKET=... SANDBOXD_TEST_URL=... SANDBOXD_TEST_TOKEN=... node --test test/

import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  AuthenticationError,
  Client,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  PackageInstallError,
  RunFailedError,
  TransportError,
  VERSION,
  figures,
  raiseForStatus,
} from "../dist/index.js";

const { SANDBOXD_TEST_SOCKET: SOCKET, SANDBOXD_TEST_URL: URL_, SANDBOXD_TEST_TOKEN: TOKEN } = process.env;
assert.ok(SOCKET && URL_ && TOKEN, "run by tests/test_sdk_typescript.py, which starts the daemon");

const transports = {
  socket: () => new Client({ socket: SOCKET }),
  http: () => new Client({ url: URL_, token: TOKEN }),
};

const PNG = [0x89, 0x50, 0x4e, 0x47];
const sha = (b) => createHash("sha256").update(b).digest("hex");

async function until(f, what) {
  const end = Date.now() + 30_000;
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test("the SDK is the daemon's version", async () => {
  const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url)));
  assert.equal(pkg.version, VERSION);
  const cargo = await readFile(new URL("../../../Cargo.toml", import.meta.url), "utf8");
  assert.equal(cargo.match(/^version = "([^"]+)"/m)[1], VERSION);
});

for (const [name, make] of Object.entries(transports)) {
  test(`${name}: a one-shot run keeps its figures and leaves no session`, async () => {
    const client = make();
    const before = (await client.sessions()).map((s) => s.id).sort();
    const r = await client.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nprint('drawn')");
    assert.deepEqual([r.status, r.exit_code, r.stdout], ["ok", 0, "drawn\n"]);
    const [fig] = figures(r);
    assert.deepEqual([...r.figures.get(fig.path).slice(0, 4)], PNG);
    assert.equal(r.figures.get(fig.path).length, fig.size_bytes);
    assert.deepEqual((await client.sessions()).map((s) => s.id).sort(), before);
    assert.ok(r.usage.memory_peak_bytes > 0);
  });

  test(`${name}: a failed run is a result, raiseForStatus makes it an exception`, async () => {
    const client = make();
    await client.withSession({}, async (s) => {
      const r = await s.run("import sys; print('bad', file=sys.stderr); sys.exit(3)");
      assert.deepEqual([r.status, r.exit_code, r.stderr], ["error", 3, "bad\n"]);
      assert.throws(() => raiseForStatus(r), (e) => e instanceof RunFailedError && e.code === "run_error" && e.result === r);
      assert.equal((await s.run("exit 4", { language: "shell" })).exit_code, 4);
      const t = await s.run("import time; time.sleep(30)", { timeoutS: 1 });
      assert.equal(t.status, "timeout");
    });
  });

  test(`${name}: files round-trip byte-exact, 50 MiB streamed both ways`, async () => {
    const client = make();
    const dir = await mkdtemp(join(tmpdir(), "sdk-ts-"));
    try {
      const big = Buffer.alloc(50 << 20);
      for (let i = 0; i < big.length; i += 64) createHash("sha512").update(String(i)).digest().copy(big, i);
      await writeFile(join(dir, "big.bin"), big);
      await client.withSession({}, async (s) => {
        assert.equal((await s.files.uploadFile("in/big.bin", join(dir, "big.bin"))).size_bytes, 50 << 20);
        await s.files.upload("in/text.txt", "héllo\n");
        await s.files.upload("name with spaces #1%.bin", new Uint8Array([...Array(256).keys()]));
        const r = await s.run("import hashlib; print(hashlib.sha256(open('in/big.bin','rb').read()).hexdigest())");
        assert.equal(r.stdout.trim(), sha(big), "the sandbox read other bytes than were uploaded");
        assert.deepEqual((await s.files.list()).map((f) => f.path), ["in/big.bin", "in/text.txt", "name with spaces #1%.bin"]);
        assert.deepEqual([...(await s.files.download("name with spaces #1%.bin"))], [...Array(256).keys()]);
        assert.equal(new TextDecoder().decode(await s.files.download("/mnt/data/in/text.txt")), "héllo\n");
        await writeFile(join(dir, "victim"), "keep");
        await symlink(join(dir, "victim"), join(dir, "out.bin.part")); // where a naive download would write
        assert.equal(await s.files.downloadTo("in/big.bin", join(dir, "out.bin")), 50 << 20);
        assert.equal(sha(await readFile(join(dir, "out.bin"))), sha(big));
        assert.equal(await readFile(join(dir, "victim"), "utf8"), "keep", "the download wrote through a link");
        assert.deepEqual((await readdir(dir)).filter((n) => n.endsWith(".part")), ["out.bin.part"]);
        await assert.rejects(s.files.upload("in/text.txt", "again"), (e) => e instanceof ConflictError && e.code === "file_exists");
        await s.files.upload("in/text.txt", "again", { overwrite: true });
        await assert.rejects(s.files.upload("../escape", "x"), (e) => e instanceof InvalidRequestError && e.code === "invalid_path");
        await s.files.delete("in/text.txt");
        await assert.rejects(s.files.download("in/text.txt"), (e) => e instanceof NotFoundError && e.code === "not_found");
        await assert.rejects(s.files.downloadTo("in/text.txt", join(dir, "none.bin")), NotFoundError);
        assert.ok(!existsSync(join(dir, "none.bin")));
        assert.deepEqual((await readdir(dir)).filter((n) => n.endsWith(".part")), ["out.bin.part"], "a failed download left a part");
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test(`${name}: a kernel keeps its state and reports values and exceptions`, async () => {
    const client = make();
    await client.withSession({ mode: "kernel" }, async (k) => {
      assert.equal(k.info.mode, "kernel");
      await k.run("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})");
      assert.equal((await k.run("int(df.a.sum())")).result["text/plain"], "6");
      const r = await k.run("1 / 0");
      assert.equal(r.exception.name, "ZeroDivisionError");
      assert.throws(() => raiseForStatus(r), RunFailedError);
      assert.equal((await k.run("df.shape")).result["text/plain"], "(3, 1)");
    });
  });

  test(`${name}: output streams to the callbacks in order before the result`, async () => {
    const client = make();
    const got = [];
    const code = "import sys, time\nfor i in range(5):\n    print('out', i, flush=True)\n    print('err', i, file=sys.stderr, flush=True)\n    time.sleep(0.05)\n";
    const r = await client.withSession({}, (s) =>
      s.run(code, { onStdout: (t) => got.push(["out", t]), onStderr: async (t) => got.push(["err", t]) }),
    );
    const joined = (k) => got.filter(([w]) => w === k).map(([, t]) => t).join("");
    assert.equal(joined("out"), r.stdout);
    assert.equal(r.stdout, [0, 1, 2, 3, 4].map((i) => `out ${i}\n`).join(""));
    assert.equal(joined("err"), [0, 1, 2, 3, 4].map((i) => `err ${i}\n`).join(""));
    assert.ok(got.length >= 4, JSON.stringify(got));
  });

  test(`${name}: a background run is cancelled and recorded`, async () => {
    const client = make();
    await client.withSession({}, async (s) => {
      const run = s.start("import time; time.sleep(60)");
      await until(async () => (await s.refresh()).busy, "the run to start");
      await assert.rejects(s.run("print(1)"), (e) => e instanceof ConflictError && e.code === "session_busy");
      assert.equal(await run.cancel(), true);
      assert.equal((await run.result()).status, "killed");
      assert.equal(run.done, true);
      assert.equal(await run.cancel(), false);
      await s.run("print('after')");
      const runs = [];
      for await (const r of s.runs()) runs.push(r);
      assert.deepEqual(runs.map((r) => r.status), ["ok", "killed"]);
      assert.equal((await s.getRun(runs[0].run_id)).result.stdout, "after\n");
      const one = [];
      for await (const r of s.runs(1)) one.push(r);
      assert.equal(one.length, 1);
    });
  });

  test(`${name}: a run cancelled as soon as it is started is stopped`, async () => {
    const client = make();
    await client.withSession({}, async (s) => {
      for (let i = 0; i < 3; i++) {
        const run = s.start("import time; time.sleep(60)");
        assert.equal(await run.cancel(), true);
        assert.equal((await run.result()).status, "killed");
      }
    });
  });

  test(`${name}: API errors are exceptions with the daemon's code`, async () => {
    const client = make();
    await assert.rejects(client.getSession("no-such-session"), (e) => e instanceof NotFoundError && e.code === "session_not_found" && e.status === 404);
    await assert.rejects(client.session({ policy: "no-such-policy" }), (e) => e instanceof InvalidRequestError && e.code === "policy_not_found");
    await assert.rejects(client.session({ mode: "repl" }), TypeError);
    const s = await client.session({ id: `ts-named-${name}` });
    await assert.rejects(client.session({ id: `ts-named-${name}` }), (e) => e instanceof ConflictError && e.code === "session_exists");
    await s.close();
    await s.close();
    await assert.rejects(s.run("print(1)"), NotFoundError);
  });

  test(`${name}: eight runs at once`, async () => {
    const client = make();
    const out = await Promise.all(
      [...Array(8).keys()].map((i) => client.withSession({}, async (s) => [s.id, (await s.run(`print(${i} * ${i})`)).stdout.trim()])),
    );
    assert.deepEqual(out.map(([, o]) => o), [...Array(8).keys()].map((i) => String(i * i)));
    assert.equal(new Set(out.map(([id]) => id)).size, 8);
  });

  test(`${name}: tool definitions per format, and calls with good and bad arguments`, async () => {
    const client = make();
    const names = ["run_python", "run_shell", "create_session", "list_sessions", "close_session", "install_packages", "upload_file", "list_files", "read_file"];
    assert.deepEqual((await client.tools.openai()).map((t) => t.function.name), names);
    assert.deepEqual((await client.tools.anthropic()).map((t) => t.name), names);
    assert.deepEqual((await client.tools.openaiResponses()).map((t) => t.name), names);
    assert.equal((await client.tools.definitions("mcp"))[0].inputSchema.type, "object");
    await assert.rejects(client.tools.definitions("gemini"), TypeError);
    await client.withSession({}, async (s) => {
      const ok = await client.tools.call("run_python", JSON.stringify({ code: "print(2 + 2)", session_id: s.id }));
      assert.equal(ok.is_error, false);
      assert.match(ok.content, /status: ok[\s\S]*4/);
      const bad = await client.tools.call("run_python", { cod: "x" }, { format: "anthropic" });
      assert.equal(bad.is_error, true);
      assert.match(bad.content[0].text, /unknown field `cod`/);
      const broken = await client.tools.call("run_python", '{"code": ', { format: "openai-responses" });
      assert.equal(broken.is_error, true);
      assert.match(broken.output, /not JSON/);
    });
    const madeUp = await client.tools.call("rm_rf", {}, { format: "anthropic" });
    assert.equal(madeUp.is_error, true);
    assert.match(madeUp.content[0].text, /^error not_found: there is no tool "rm_rf": call one of run_python/);
  });
}

test("the transport and the token come from the environment", async () => {
  const saved = { ...process.env };
  try {
    delete process.env.SANDBOXD_URL;
    process.env.SANDBOXD_SOCKET = SOCKET;
    assert.equal((await new Client().health()).status, "ok");
    process.env.SANDBOXD_URL = URL_;
    process.env.SANDBOXD_TOKEN = TOKEN;
    const c = new Client();
    assert.equal(c.endpoint.socket, undefined);
    assert.ok("pool" in (await c.health()), "the token was not sent");
    process.env.SANDBOXD_TOKEN = "wrong";
    await assert.rejects(new Client().sessions(), (e) => e instanceof AuthenticationError && e.code === "unauthorized" && e.status === 401);
  } finally {
    process.env = saved;
  }
  const nowhere = new Client({ socket: "/nonexistent/sandboxd.sock" });
  await assert.rejects(nowhere.health(), (e) => e instanceof TransportError && /nonexistent\/sandboxd.sock/.test(e.message) && /SANDBOXD_SOCKET/.test(e.message));
});

test("packages install into the session", async () => {
  const client = transports.http();
  await client.withSession({}, async (s) => {
    const got = await s.install(["tabulate==0.9.0"]);
    assert.ok(got.installed.some((p) => p.name === "tabulate") || got.unchanged.includes("tabulate==0.9.0"), JSON.stringify(got));
    assert.equal((await s.run("import tabulate; print(tabulate.__version__)")).stdout, "0.9.0\n");
    await assert.rejects(s.install(["no-such-package-sandboxd-test==1.0"]), (e) => e instanceof PackageInstallError && e.code === "package_install_failed");
  });
});

test("the Vercel AI SDK runs the model's tool calls in the session", async () => {
  const { generateText, stepCountIs } = await import("ai");
  const { MockLanguageModelV2 } = await import("ai/test");
  const { sandboxdTools } = await import("../dist/ai.js");
  const client = transports.http();
  await client.withSession({}, async (s) => {
    const tools = await sandboxdTools(s);
    assert.deepEqual(Object.keys(tools).sort(), ["install_packages", "list_files", "read_file", "run_python", "run_shell", "upload_file"]);
    const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };
    const code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nopen('note.txt', 'w').write('hi')\nprint(6 * 7)";
    const model = new MockLanguageModelV2({
      doGenerate: [
        {
          content: [{ type: "tool-call", toolCallId: "c1", toolName: "run_python", input: JSON.stringify({ code }) }],
          finishReason: "tool-calls",
          usage,
          warnings: [],
        },
        { content: [{ type: "text", text: "It is 42." }], finishReason: "stop", usage, warnings: [] },
      ],
    });
    const out = await generateText({ model, tools, stopWhen: stepCountIs(3), prompt: "6 * 7, and a plot" });
    assert.equal(out.text, "It is 42.");
    const [result] = out.steps[0].toolResults;
    assert.equal(result.output.isError, false);
    assert.match(result.output.text, /status: ok[\s\S]*42/);
    assert.equal(result.output.images[0].mediaType, "image/png");
    // The model's second turn saw the figure as media, and the run happened in this session.
    const seen = model.doGenerateCalls[1].prompt.find((m) => m.role === "tool").content[0].output;
    assert.equal(seen.type, "content");
    assert.ok(seen.value.some((p) => p.type === "media" && p.mediaType === "image/png"));
    assert.equal(new TextDecoder().decode(await s.files.download("note.txt")), "hi");
    // The session is the set's: a schema without session_id, and a bad argument is the model's to fix.
    const err = await tools.run_python.execute({ code: 1 }, { toolCallId: "c2", messages: [] });
    assert.equal(err.isError, true);
    await assert.rejects(sandboxdTools(s, { only: ["close_session"] }), TypeError);
  });
});
