"""The Python SDK (clients/python, installed into the test venv from the checkout by
tests/clients.sh) against a real daemon, over both transports: the Unix socket
(no token: the operator) and loopback HTTP with a tenant's token. Also the tools
over HTTP (`/v1/tools`) as the LLM APIs' own packages type them, the examples
driven by a scripted model, the README's examples, and mypy --strict."""

import asyncio
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sandboxd
import sandboxd.tools
from sandboxd import AsyncClient, Client

ROOT = Path(__file__).resolve().parents[1]
SDK = ROOT / "clients" / "python"
TOKEN = "sdk-tenant-token"


@pytest.fixture(scope="module")
def d(fresh_daemon_module):
    return fresh_daemon_module(tokens=[TOKEN])


@pytest.fixture(params=["socket", "http"])
def client(request, d):
    c = Client(socket=str(d.socket)) if request.param == "socket" else Client(d.url, token=TOKEN)
    yield c
    c.close()


def test_the_sdk_is_the_daemons_version():
    cargo = (ROOT / "Cargo.toml").read_text()
    version = re.search(r'(?m)^version = "([^"]+)"', cargo).group(1)
    assert sandboxd.__version__ == version
    assert f'version = "{version}"' in (SDK / "pyproject.toml").read_text()
    # Installed from this checkout, not from anywhere else.
    assert Path(sandboxd.__file__).read_bytes() == (SDK / "sandboxd" / "__init__.py").read_bytes()


def test_a_one_shot_run_keeps_its_figures_and_leaves_no_session(client):
    before = {s.id for s in client.sessions()}
    r = client.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nprint('drawn')")
    assert (r.status, r.exit_code, r.stdout) == ("ok", 0, "drawn\n")
    assert r.ok and r.raise_for_status() is r
    [fig] = r.figures
    assert fig.read().startswith(b"\x89PNG") and len(fig.read()) == fig.size_bytes
    assert {s.id for s in client.sessions()} == before, "the one-shot run's session was left open"
    assert r.usage.cpu_ms is not None and r.usage.memory_peak_bytes > 0


def test_a_failed_run_is_a_result_and_raise_for_status_makes_it_an_exception(client):
    with client.session() as s:
        r = s.run("import sys; print('bad', file=sys.stderr); sys.exit(3)")
        assert (r.status, r.exit_code, r.stderr) == ("error", 3, "bad\n")
        with pytest.raises(sandboxd.RunFailedError) as e:
            r.raise_for_status()
        assert e.value.result is r and e.value.code == "run_error" and "bad" in e.value.message
        assert s.run("exit 4", language="shell").exit_code == 4
        t = s.run("import time; time.sleep(30)", timeout_s=1)
        assert t.status == "timeout" and t.signal == "SIGTERM", "a timeout asks first (grace_s)"


def test_sessions_files_round_trip_byte_exact(client, tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        for i in range(50):
            f.write(hashlib.sha512(str(i).encode()).digest() * (1 << 14))  # 50 MiB, every byte value
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    with client.session() as s:
        assert s.files.upload("in/big.bin", big).size_bytes == 50 << 20
        assert s.files.upload("in/text.txt", "héllo\n").size_bytes == 7
        with open(big, "rb") as f:
            s.files.upload("copy.bin", f)
        s.files.upload("name with spaces #1%.bin", bytes(range(256)))
        r = s.run("import hashlib; print(hashlib.sha256(open('in/big.bin','rb').read()).hexdigest())")
        assert r.stdout.strip() == digest, "the sandbox read other bytes than were uploaded"
        assert [f.path for f in s.files.list()] == ["copy.bin", "in/big.bin", "in/text.txt", "name with spaces #1%.bin"]
        assert s.files.download("name with spaces #1%.bin") == bytes(range(256))
        assert s.files.download("in/text.txt").decode() == "héllo\n"
        out = tmp_path / "out.bin"
        victim = tmp_path / "victim"
        victim.write_text("keep")
        os.symlink(victim, f"{out}.part")  # planted where a naive download would write
        assert s.files.download_to("copy.bin", out) == 50 << 20
        assert hashlib.sha256(out.read_bytes()).hexdigest() == digest and not out.is_symlink()
        assert victim.read_text() == "keep", "the download wrote through a link"
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part") and not p.is_symlink()]
        with pytest.raises(sandboxd.ConflictError) as e:
            s.files.upload("in/text.txt", b"again")
        assert (e.value.code, e.value.status) == ("file_exists", 409) and "overwrite" in e.value.message
        s.files.upload("in/text.txt", b"again", overwrite=True)
        assert s.files.download("/mnt/data/in/text.txt") == b"again"
        s.files.delete("copy.bin")
        with pytest.raises(sandboxd.NotFoundError) as e:
            s.files.download("copy.bin")
        assert e.value.code == "not_found"
        with pytest.raises(sandboxd.InvalidRequestError) as e:
            s.files.upload("../escape", b"x")
        assert e.value.code == "invalid_path"
        # A str is the file's text; a local file is a Path, or upload_file's name.
        local = tmp_path / "local.csv"
        local.write_text("a,b\n")
        s.files.upload("t.csv", str(local))
        assert s.files.download("t.csv") == str(local).encode()
        s.files.upload_file("l.csv", str(local))
        assert s.files.download("l.csv") == b"a,b\n"
        with open(local) as text_mode, pytest.raises(TypeError, match="text mode"):
            s.files.upload("x.csv", text_mode)
        assert s.files.download_to("l.csv", tmp_path) == 4 and (tmp_path / "l.csv").read_bytes() == b"a,b\n"


def test_a_kernel_keeps_its_state_and_reports_values_and_exceptions(client):
    with client.session(mode="kernel") as k:
        assert k.info.mode == "kernel"
        k.run("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})")
        assert k.run("int(df.a.sum())").result["text/plain"] == "6"
        r = k.run("1 / 0")
        assert r.exception.name == "ZeroDivisionError" and "division by zero" in r.exception.value
        assert "Traceback" in r.exception.traceback
        with pytest.raises(sandboxd.RunFailedError):
            r.raise_for_status()
        assert k.run("df.shape").result["text/plain"] == "(3, 1)", "an exception lost the kernel's state"


def test_output_streams_to_the_callbacks_in_order_before_the_result(client):
    got = []
    code = (
        "import sys, time\n"
        "for i in range(5):\n"
        "    print('out', i, flush=True)\n"
        "    print('err', i, file=sys.stderr, flush=True)\n"
        "    time.sleep(0.05)\n"
    )
    with client.session() as s:
        r = s.run(code, on_stdout=lambda t: got.append(("out", t)), on_stderr=lambda t: got.append(("err", t)))
    assert "".join(t for k, t in got if k == "out") == r.stdout == "".join(f"out {i}\n" for i in range(5))
    assert "".join(t for k, t in got if k == "err") == r.stderr == "".join(f"err {i}\n" for i in range(5))
    # Streamed as written: the first line came in an event of its own, long before the last.
    assert len(got) >= 4, got


def test_a_background_run_is_cancelled_and_recorded(client):
    with client.session() as s:
        run = s.start("import time; print('started', flush=True); time.sleep(60)")
        deadline = time.monotonic() + 30
        while not s.refresh().busy and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(sandboxd.ConflictError) as e:
            s.run("print(1)")
        assert e.value.code == "session_busy"
        assert run.cancel() is True
        r = run.result(timeout=30)
        assert run.done() and r.status == "killed"
        assert run.cancel() is False
        assert s.cancel() is False, "nothing runs any more"
        s.run("print('after')")
        records = list(s.runs())
        assert [x.status for x in records] == ["ok", "killed"], "newest first"
        assert records[0].exit_code == 0 and records[0].duration_ms >= 0
        assert s.get_run(records[0].run_id).result.stdout == "after\n"
        assert s.get_run(records[1].run_id).code.startswith("import time")
        assert len(list(s.runs(limit=1))) == 1


def test_api_errors_are_exceptions_with_the_daemons_code(client, d):
    with pytest.raises(sandboxd.NotFoundError) as e:
        client.get_session("no-such-session")
    assert (e.value.code, e.value.status) == ("session_not_found", 404)
    with pytest.raises(sandboxd.InvalidRequestError) as e:
        client.session(policy="no-such-policy")
    assert e.value.code == "policy_not_found"
    with pytest.raises(ValueError):
        client.session(mode="repl")
    with client.session(id="sdk-named") as s:
        with pytest.raises(sandboxd.ConflictError) as e:
            client.session(id="sdk-named")
        assert e.value.code == "session_exists"
        assert client.get_session("sdk-named").info.id == s.id
    s.close()  # closing a closed session does nothing
    with pytest.raises(sandboxd.NotFoundError):
        s.run("print(1)")
    with pytest.raises(ValueError, match="socket="):
        Client(str(d.socket))
    with Client(d.url, token=TOKEN, timeout=0.5) as impatient, impatient.session() as slow:
        with pytest.raises(sandboxd.TransportError) as e:
            slow.run("import time; time.sleep(3)")
        assert "did not answer in time" in str(e.value) and "timeout" in str(e.value)


def test_a_run_cancelled_as_soon_as_it_is_started_is_stopped(client):
    """The cancel may reach the daemon before the run does: it waits for it."""
    with client.session() as s:
        for _ in range(3):
            run = s.start("import time; time.sleep(60)")
            assert run.cancel() is True
            assert run.result(timeout=30).status == "killed"


def test_the_transport_and_the_token_are_found_from_the_environment(d, monkeypatch, tmp_path):
    monkeypatch.delenv("SANDBOXD_URL", raising=False)
    monkeypatch.setenv("SANDBOXD_SOCKET", str(d.socket))
    with Client() as c:
        assert c.endpoint.socket == str(d.socket) and c.health()["status"] == "ok"
    monkeypatch.setenv("SANDBOXD_URL", d.url)
    monkeypatch.setenv("SANDBOXD_TOKEN", TOKEN)
    with Client() as c:
        assert c.endpoint.socket is None and "pool" in c.health(), "the token was not sent"
    monkeypatch.setenv("SANDBOXD_TOKEN", "wrong")
    with Client() as c, pytest.raises(sandboxd.AuthenticationError) as e:
        c.sessions()
    assert (e.value.code, e.value.status) == ("unauthorized", 401)
    with Client(socket=str(tmp_path / "nothing.sock")) as c, pytest.raises(sandboxd.TransportError) as e:
        c.health()
    assert "nothing.sock" in str(e.value) and "SANDBOXD_SOCKET" in str(e.value)


def test_the_async_client_runs_eight_at_once(d):
    async def main():
        async with AsyncClient(d.url, token=TOKEN) as c:
            async def one(i):
                async with await c.session() as s:
                    r = await s.run(f"import os; print({i} * {i}, os.getpid())")
                    return s.id, r
            done = await asyncio.gather(*(one(i) for i in range(8)))
            assert [r.stdout.split()[0] for _, r in done] == [str(i * i) for i in range(8)]
            assert len({sid for sid, _ in done}) == 8
            # Same shape as the sync client: streaming, files, records, cancel, kernel.
            async with await c.session(mode="kernel") as k:
                chunks = []

                async def on_out(text):
                    chunks.append(text)
                await k.run("x = 20", on_stdout=on_out)
                r = await k.run("print(x + 1)\nx * 2", on_stdout=on_out)
                assert "".join(chunks) == "21\n" and r.result["text/plain"] == "40"
                await k.files.upload("f.bin", b"\x00\xff" * 1000)
                assert await k.files.download("f.bin") == b"\x00\xff" * 1000
                assert [f.path for f in await k.files.list()] == ["f.bin"]
                run = k.start("import time; time.sleep(60)")
                assert await run.cancel() is True, "cancelled before the run reached the daemon"
                assert (await run.result()).status == "killed"
                assert [x.status async for x in k.runs()][:1] == ["killed"]
            one_shot = await c.run("import matplotlib.pyplot as plt; plt.plot([1])")
            assert (await one_shot.figures[0].aread()).startswith(b"\x89PNG")
            with pytest.raises(sandboxd.NotFoundError):
                await c.get_session("gone")
    asyncio.run(main())


def test_packages_install_into_the_session(client):
    with client.session() as s:
        got = s.install(["tabulate==0.9.0"])
        assert got.installed == [("tabulate", "0.9.0")] or got.unchanged == ["tabulate==0.9.0"], got
        assert got.net is not None and "pypi.org:443" in got.net["hosts"], got.net
        assert s.run("import tabulate; print(tabulate.__version__)").stdout == "0.9.0\n"
        with pytest.raises(sandboxd.PackageInstallError) as e:
            s.install(["no-such-package-sandboxd-test==1.0"])
        assert e.value.code == "package_install_failed" and e.value.status == 422
        # One string is one requirement (not a letter per package).
        again = s.install("tabulate==0.9.0")
        assert again.installed == [] and again.unchanged == ["tabulate"], again
        assert s.run("import six; print(six.__version__)", packages="six==1.16.0").stdout == "1.16.0\n"


# --- tools over HTTP --------------------------------------------------------------------


def _keys_within(value, typed_dict):
    """Every key of `value` is one `typed_dict` declares (pydantic ignores others)."""
    hints = {}
    for klass in reversed(typed_dict.__mro__):
        hints.update(getattr(klass, "__annotations__", {}))
    extra = set(value) - set(hints)
    assert not extra, f"{typed_dict.__name__} has no {extra}"


def test_tool_definitions_are_each_apis_own_types(client):
    from anthropic.types import ToolParam
    from openai.types.chat import ChatCompletionFunctionToolParam
    from openai.types.responses import FunctionToolParam
    from pydantic import TypeAdapter

    names = ["run_python", "run_shell", "create_session", "list_sessions", "close_session",
             "install_packages", "upload_file", "list_files", "read_file"]
    for fmt, typed in (("openai", ChatCompletionFunctionToolParam), ("openai-responses", FunctionToolParam),
                       ("anthropic", ToolParam)):
        tools = client.tools.definitions(fmt)
        assert [t["function"]["name"] if fmt == "openai" else t["name"] for t in tools] == names
        for t in tools:
            TypeAdapter(typed).validate_python(t)
            _keys_within(t, typed)
            schema = t["function"]["parameters"] if fmt == "openai" else t.get("parameters", t.get("input_schema"))
            assert schema["type"] == "object" and "$schema" not in schema
            assert "double" not in json.dumps(schema), "a number format JSON Schema does not define"
    # The descriptions state the loaded policy's limits; MCP lists the same tools.
    run_python = client.tools.anthropic()[0]
    assert "60 s, 512 MiB memory" in run_python["description"]
    mcp = client.tools.definitions("mcp")
    assert [t["name"] for t in mcp] == names and mcp[0]["description"] == run_python["description"]
    assert mcp[0]["annotations"]["destructiveHint"] is True
    with pytest.raises(ValueError):
        client.tools.definitions("gemini")


def test_tool_calls_answer_in_each_format_and_bad_arguments_are_results(client):
    from anthropic.types import ToolResultBlockParam
    from openai.types.chat import ChatCompletionToolMessageParam, ChatCompletionUserMessageParam
    from openai.types.responses.response_input_item_param import FunctionCallOutput
    from pydantic import TypeAdapter

    plot = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('plotted')"
    with client.session() as s:
        args = {"code": plot, "session_id": s.id}
        # OpenAI gives arguments as a JSON string: passed through as it is.
        oa = client.tools.call("run_python", json.dumps(args))
        assert oa["is_error"] is False and "status: ok" in oa["content"] and "plotted" in oa["content"]
        messages = sandboxd.tools.openai_messages("call_1", oa)
        TypeAdapter(ChatCompletionToolMessageParam).validate_python(messages[0])
        TypeAdapter(ChatCompletionUserMessageParam).validate_python(messages[1])
        assert messages[1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")

        an = client.tools.call("run_python", args, format="anthropic")
        block = sandboxd.tools.anthropic_block("toolu_1", an)
        TypeAdapter(ToolResultBlockParam).validate_python(block)
        assert [c["type"] for c in an["content"]] == ["text", "image"]
        assert an["content"][1]["source"]["media_type"] == "image/png"

        rs = client.tools.call("run_python", args, format="openai-responses")
        item = sandboxd.tools.openai_responses_item("fc_1", rs)
        TypeAdapter(FunctionCallOutput).validate_python(item)
        assert [o["type"] for o in rs["output"]] == ["input_text", "input_image"]

        mc = client.tools.call("list_files", {"session_id": s.id}, format="mcp")
        assert mc["isError"] is False and "figure-" in mc["content"][0]["text"]

        # Bad arguments, broken JSON included, are results the model can act on.
        bad = client.tools.call("run_python", {"cod": "print(1)"})
        assert bad["is_error"] is True and "unknown field `cod`" in bad["content"]
        broken = client.tools.call("run_python", '{"code": "print(1)"', format="anthropic")
        assert broken["is_error"] is True and "not JSON" in broken["content"][0]["text"]
        assert client.tools.call("run_python", {"code": "print(1)", "session_id": "x/y"})["is_error"] is True
        assert client.tools.call("list_sessions")["is_error"] is False
    # A name the model made up is a result too, naming the tools there are.
    made_up = client.tools.call("rm_rf", {}, format="anthropic")
    assert made_up["is_error"] is True
    assert made_up["content"][0]["text"].startswith('error not_found: there is no tool "rm_rf": call one of run_python')


def test_a_tool_call_whose_client_leaves_is_stopped(d):
    """Its run is cancelled as an MCP client's cancel cancels it: the session made
    for it is closed, nothing keeps running."""
    import httpx

    marker = f"sdk-left-{os.getpid()}"
    with httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2) as h:
        before = {s["id"] for s in h.get("/v1/sessions").json()}
        with pytest.raises(httpx.ReadTimeout):
            h.post("/v1/tools/run_python", json={"code": f"import time; print('{marker}'); time.sleep(120)"})
        def state():
            return {s["id"] for s in h.get("/v1/sessions").json()}, h.get("/v1/health").json()["busy_sessions"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and state() != (before, 0):
            time.sleep(0.1)
        sessions, busy = state()
        assert sessions == before, "the session made for the call was kept"
        assert busy == 0, "the call's run still runs"
        # Not only a run: an install in a session made for it goes too.
        h.timeout = httpx.Timeout(0.05)  # gone long before the install's sandbox has started
        with pytest.raises(httpx.ReadTimeout):
            h.post("/v1/tools/install_packages", json={"packages": ["tabulate==0.9.0"]})
        h.timeout = httpx.Timeout(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and state() != (before, 0):
            time.sleep(0.1)
        assert state() == (before, 0), "the session made for the install was kept"


# --- examples, README, types -----------------------------------------------------------


class ScriptedOpenAI:
    """A stand-in for `openai.OpenAI()`: answers with the openai package's own
    types, a tool call first and then text, and checks every request it gets
    against the package's request types."""

    def __init__(self, first, final):
        self.replies = [first, final]
        self.requests = []
        self.chat = self
        self.completions = self
        self.responses = self

    def create(self, **kw):
        self.requests.append(json.loads(json.dumps(kw)))
        return self.replies.pop(0)


def _run_example(name, env_client):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, SDK / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def default_client(d, monkeypatch):
    """sandboxd.tools' module-level client, made from the environment (this daemon)."""
    monkeypatch.setenv("SANDBOXD_URL", d.url)
    monkeypatch.setenv("SANDBOXD_TOKEN", TOKEN)
    monkeypatch.setattr(sandboxd.tools, "_client", None)
    yield
    if sandboxd.tools._client is not None:
        sandboxd.tools._client.close()


def test_the_openai_chat_example_runs_the_models_code(default_client):
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
    from pydantic import TypeAdapter

    call = {"id": "call_1", "type": "function",
            "function": {"name": "run_python", "arguments": json.dumps({"code": "print(sum(range(101)))"})}}

    def completion(message):
        return ChatCompletion.model_validate({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                              "choices": [{"index": 0, "finish_reason": "stop", "message": message}]})
    llm = ScriptedOpenAI(completion({"role": "assistant", "content": None, "tool_calls": [call]}),
                         completion({"role": "assistant", "content": "5050"}))
    assert _run_example("openai_chat", None).agent(llm, "sum 0..100") == "5050"
    second = llm.requests[1]["messages"]
    for m in second:
        TypeAdapter(ChatCompletionMessageParam).validate_python(m)
    assert second[2]["role"] == "tool" and "5050" in second[2]["content"]


def test_the_openai_responses_example_runs_the_models_code(default_client):
    from openai.types.responses import Response, ResponseInputItemParam
    from pydantic import TypeAdapter

    def response(output):
        return Response.model_validate({"id": "r", "object": "response", "created_at": 0, "model": "m",
                                        "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
                                        "tools": []})
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "run_python",
            "arguments": json.dumps({"code": "print(6 * 7)"}), "status": "completed"}
    text = {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "42", "annotations": []}]}
    llm = ScriptedOpenAI(response([call]), response([text]))
    assert _run_example("openai_responses", None).agent(llm, "6 * 7") == "42"
    items = llm.requests[1]["input"]
    for item in items:
        TypeAdapter(ResponseInputItemParam).validate_python(item)
    assert items[-1]["type"] == "function_call_output" and "42" in items[-1]["output"]


def test_the_anthropic_example_runs_the_models_code(default_client):
    from anthropic.types import Message, MessageParam
    from pydantic import TypeAdapter

    def message(content, stop):
        return Message.model_validate({"id": "m", "type": "message", "role": "assistant", "model": "m",
                                       "content": content, "stop_reason": stop, "stop_sequence": None,
                                       "usage": {"input_tokens": 1, "output_tokens": 1}})
    use = {"type": "tool_use", "id": "toolu_1", "name": "run_python",
           "input": {"code": "import matplotlib.pyplot as plt; plt.plot([1, 2]); print('ok')"}}

    class ScriptedAnthropic(ScriptedOpenAI):
        @property
        def messages(self):
            return self
    llm = ScriptedAnthropic(message([use], "tool_use"), message([{"type": "text", "text": "done"}], "end_turn"))
    assert _run_example("anthropic_messages", None).agent(llm, "plot") == "done"
    conversation = llm.requests[1]["messages"]
    for m in conversation:
        TypeAdapter(MessageParam).validate_python(m)
    result = conversation[2]["content"][0]
    assert result["type"] == "tool_result" and [c["type"] for c in result["content"]] == ["text", "image"]


def test_the_readmes_examples_run(d, tmp_path):
    text = (SDK / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 8
    env = dict(os.environ, SANDBOXD_SOCKET=str(d.socket))
    env.pop("SANDBOXD_URL", None)
    for i, code in enumerate(blocks):
        script = tmp_path / f"example{i}.py"
        script.write_text(code)
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"README example {i} failed:\n{code}\n{out.stderr[-3000:]}"
        # What the comments say it prints, it prints.
        for said in re.findall(r"# (ok 6|45|killed|package_install_failed|False status: ok \(exit code 0\)|status: ok \(exit code 0\)|6)", code):
            assert said in out.stdout, f"README example {i} did not print {said!r}:\n{out.stdout}"


def test_the_sdk_type_checks_strictly():
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", "/dev/null", "sandboxd", "examples"],
        cwd=SDK, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_output_callbacks_run_on_the_callers_thread_in_order(d):
    """The sync client calls them on the thread that called run()."""
    seen = []
    with Client(socket=str(d.socket)) as c, c.session() as s:
        s.run("print('a'); print('b')", on_stdout=lambda t: seen.append((threading.get_ident(), t)))
    assert seen and all(tid == threading.get_ident() for tid, _ in seen)
    assert "".join(t for _, t in seen) == "a\nb\n"


# --- framework glue: through the frameworks' own tool-calling paths ---------------------


def test_langchain_tools_run_in_the_session_through_langchains_tool_call_path(client):
    from langchain_core.messages import ToolMessage
    from sandboxd.langchain import sandboxd_tools

    with client.session() as s:
        tools = {t.name: t for t in sandboxd_tools(client, s)}
        assert sorted(tools) == ["install_packages", "list_files", "read_file", "run_python", "run_shell", "upload_file"]
        assert "session_id" not in tools["run_python"].args, "the session is the binding's, not the model's"
        code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nopen('lc.txt', 'w').write('x')\nprint(6 * 7)"
        msg = tools["run_python"].invoke({"name": "run_python", "args": {"code": code}, "id": "call_1", "type": "tool_call"})
        assert isinstance(msg, ToolMessage) and msg.tool_call_id == "call_1"
        assert "status: ok" in msg.content and "42" in msg.content
        assert len(msg.artifact) == 1 and msg.artifact[0].startswith("data:image/png;base64,iVBOR")
        assert s.files.download("lc.txt") == b"x", "the call ran in another session"
        bad = tools["run_python"].invoke({"name": "run_python", "args": {"code": "print(1)", "timeout_s": -1}, "id": "c2", "type": "tool_call"})
        assert "error" in bad.content.lower()
        # No argument of the model's picks another tool or another session.
        steer = tools["run_python"].invoke({"code": "print(1)", "_name": "close_session", "session_id": "other"})
        assert "unknown field `_name`" in steer, steer
        assert s.refresh().id == s.id, "the bound session was closed by the model's arguments"
    unbound = {t.name for t in sandboxd_tools(client)}
    assert {"create_session", "close_session", "run_python"} <= unbound


def test_openai_agents_tools_run_in_the_session_through_the_runner(client):
    from agents import Agent, Runner, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
    from sandboxd.agents import sandboxd_tools

    class ScriptedModel(Model):
        """The Agents SDK's model interface, answering a tool call, then text."""

        def __init__(self):
            self.inputs = []

        async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                               tracing, **kw):
            self.inputs.append(input)
            if len(self.inputs) == 1:
                out = [ResponseFunctionToolCall(type="function_call", id="fc1", call_id="c1", name="run_python",
                                                arguments=json.dumps({"code": "open('ag.txt','w').write('y'); print(6 * 7)"}),
                                                status="completed")]
            else:
                out = [ResponseOutputMessage(type="message", id="m1", role="assistant", status="completed",
                                             content=[ResponseOutputText(type="output_text", text="42", annotations=[])])]
            return ModelResponse(output=out, usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    set_tracing_disabled(True)  # no traces sent anywhere
    with client.session() as s:
        model = ScriptedModel()
        tools = sandboxd_tools(client, s)
        assert [t.name for t in tools] == ["run_python", "run_shell", "install_packages", "upload_file", "list_files", "read_file"]
        result = Runner.run_sync(Agent(name="analyst", tools=tools, model=model), "what is 6 * 7?")
        assert result.final_output == "42"
        [output] = [i for i in model.inputs[1] if isinstance(i, dict) and i.get("type") == "function_call_output"]
        assert "status: ok" in output["output"] and "42" in output["output"]
        assert s.files.download("ag.txt") == b"y", "the call ran in another session"
        # Arguments as a JSON string holding the object (which the daemon would read
        # without the binding) are refused, not sent elsewhere.
        with client.session() as other:
            other.files.upload("secret.txt", b"theirs")
            escape = json.dumps(json.dumps({"code": "print(open('secret.txt').read())", "session_id": other.id}))
            said = asyncio.run(tools[0].on_invoke_tool(None, escape))
            assert "not one JSON object" in said and "theirs" not in said, said
        before = {x.id for x in client.sessions()}
        said = asyncio.run(tools[0].on_invoke_tool(None, json.dumps(json.dumps({"code": "print(1)"}))))
        assert "not one JSON object" in said and {x.id for x in client.sessions()} == before, "a session was made"


def test_the_e2b_shim_runs_code_written_for_e2b(client):
    from sandboxd.e2b import Sandbox

    out = []
    with Sandbox(client) as sandbox:
        sandbox.files.write("/home/user/data.csv", "a,b\n1,2\n3,4\n")
        assert sandbox.files.read("/home/user/data.csv") == "a,b\n1,2\n3,4\n"
        ex = sandbox.run_code("import pandas as pd\ndf = pd.read_csv('data.csv')\nprint('rows', len(df))\nint(df.b.sum())",
                              on_stdout=lambda m: out.append(m.line))
        assert ex.text == "6" and ex.error is None and ex.logs.stdout == ["rows 2\n"] and "".join(out) == "rows 2\n"
        plot = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
        assert plot.results[0].png and base64.b64decode(plot.results[0].png).startswith(b"\x89PNG")
        err = sandbox.run_code("df.nope")
        assert err.error.name == "AttributeError" and "nope" in err.error.value
        assert sandbox.run_code("df.shape").text == "(2, 2)", "state lasts between cells, as in E2B"
        assert sandbox.files.list() == ["data.csv"] or "data.csv" in sandbox.files.list()
        sid = sandbox.sandbox_id
    with pytest.raises(sandboxd.NotFoundError):
        client.get_session(sid)
