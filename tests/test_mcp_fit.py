"""MCP results and schemas that real clients accept: the official Python SDK (its
streamable HTTP client refuses messages over 1 MiB) and schema-driven clients
like the MCP Inspector (which send a value of a "type or null" argument as a
string)."""

import asyncio
import json

from test_mcp import connect, images_of, text_of

ONE_MIB = 1024 * 1024

# Five big figures of noise (PNG compresses noise badly: several MB each).
FIGURES = """
import numpy as np, matplotlib.pyplot as plt
rng = np.random.default_rng(7)
for i in range(5):
    fig = plt.figure(figsize=(12, 8), dpi=150)
    plt.imshow(rng.random((500, 750, 3)), interpolation="nearest")
    plt.title(f"noise {i}")
print("made 5 figures")
"""


def test_a_run_with_big_figures_stays_within_one_mib_and_names_what_it_left_out(daemon):
    async def go():
        async with connect(daemon, "http") as s:
            return await s.call_tool("run_python", {"code": FIGURES, "timeout_s": 60})

    r = asyncio.run(go())
    text = text_of(r)
    assert not r.is_error, text
    assert "made 5 figures" in text
    size = len(r.model_dump_json(by_alias=True, exclude_none=True).encode())
    assert size < ONE_MIB, f"the result is {size} bytes"
    figures = [l.strip() for l in text.splitlines() if "(image/png" in l and "figure" in l]
    assert len(figures) == 5, text
    shown = images_of(r)
    notes = [l for l in text.splitlines() if l.startswith("note: image ")]
    # Every figure is shown or named in a note with where to fetch it.
    assert len(shown) + len(notes) == 5, (len(shown), notes)
    assert len(shown) >= 3, f"only {len(shown)} images shown: {notes}"
    for note in notes:
        path = note[len("note: image "):].split(":", 1)[0]
        assert f"/files/{path}" in note and "http://" in note and f'read_file with path "{path}"' in note, note
    total = sum(len(i.data) for i in shown)
    assert total < ONE_MIB - len(text)


def test_tool_arguments_are_plain_types_with_defaults(daemon):
    async def go():
        async with connect(daemon, "http") as s:
            tools = {t.name: t.input_schema for t in (await s.list_tools()).tools}
            ran = await s.call_tool("run_python", {"code": "print(3)", "timeout_s": 0})
            return tools, ran

    tools, ran = asyncio.run(go())
    for name, schema in tools.items():
        for arg, prop in schema.get("properties", {}).items():
            declared = json.dumps(prop)
            assert "null" not in declared and "anyOf" not in prop, f"{name}.{arg}: {declared}"
            assert isinstance(prop.get("type"), str), f"{name}.{arg}: {declared}"
    for tool in ("run_python", "run_shell"):
        t = tools[tool]["properties"]["timeout_s"]
        assert t["type"] == "number" and t["default"] == 0, t
        assert tools[tool]["properties"]["session_id"]["type"] == "string"
    assert tools["upload_file"]["properties"]["overwrite"] == {**tools["upload_file"]["properties"]["overwrite"],
                                                               "type": "boolean", "default": False}
    # The default (0) is the session policy's limit.
    assert not ran.is_error and "3" in text_of(ran), text_of(ran)


LOUD = 'description = "lots of output"\noutput_kb = 2048\nworkspace_mb = 64\nmax_artifacts = 5000\n'


def serialized(result):
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


def test_every_answer_fits_one_mib_and_says_what_was_cut(fresh_daemon):
    """A run with 2 MiB of output (a policy's output_kb = 2048), a file of 3 MB,
    a binary of 2 MB and a workspace of 6,000 files, through the official SDK over
    both transports: each answer is under 1 MiB, and says what it left out and
    where the rest is."""
    d = fresh_daemon(policies={"loud": LOUD})
    make = (
        "import os\n"
        "open('big.txt', 'w').write(''.join(f'line {i}\\n' for i in range(300000)))\n"
        "open('big.bin', 'wb').write(bytes(range(128, 256)) * 16000)\n"
        "os.makedirs('many')\n"
        "for i in range(6000):\n    open('many/' + 'n' * 150 + f'{i:05}', 'w').close()\n"
        "print('x' * 2000000)\n"
    )

    async def go(transport):
        async with connect(d, transport) as s:
            created = await s.call_tool("create_session", {"policy": "loud"})
            sid = next(l for l in text_of(created).splitlines() if l.startswith("session_id:")).split(":", 1)[1].strip()
            run = await s.call_tool("run_python", {"session_id": sid, "code": make})
            text = text_of(run)
            assert serialized(run) < ONE_MIB, serialized(run)
            assert "--- stdout (cut: the first " in text and "of its 2000001 bytes shown" in text, text[:300]
            assert "more files not listed here" in text, text[-500:]
            read = await s.call_tool("read_file", {"session_id": sid, "path": "big.txt"})
            assert not read.is_error and serialized(read) < ONE_MIB, serialized(read)
            assert "line 0\n" in text_of(read) and "big.txt's" in text_of(read) and f"sandboxctl files get {sid}" in text_of(read)
            binary = await s.call_tool("read_file", {"session_id": sid, "path": "big.bin"})
            assert binary.is_error and serialized(binary) < ONE_MIB
            assert text_of(binary).startswith("error artifact_too_large: big.bin is 2048000 bytes"), text_of(binary)
            assert f"/v1/sessions/{sid}/files/big.bin" in text_of(binary)
            listed = await s.call_tool("list_files", {"session_id": sid})
            assert not listed.is_error and serialized(listed) < ONE_MIB, serialized(listed)
            shown = json.loads(listed.content[0].text)
            assert 100 < len(shown) < 6002, len(shown)
            assert f"{len(shown)} of 6002 files shown, {6002 - len(shown)} more not shown" in text_of(listed), text_of(listed)[-300:]
            assert not (await s.call_tool("close_session", {"session_id": sid})).is_error

    for transport in ["http", "stdio"]:
        asyncio.run(go(transport))
