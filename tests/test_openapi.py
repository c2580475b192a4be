"""The OpenAPI document tells the truth: it is a valid OpenAPI 3.1 document
(openapi-spec-validator), and a third-party fuzzer that trusts it (schemathesis,
all of its checks) finds no server error and no answer the document does not
describe. Plus the edges it once missed: JSON bodies that are not objects, file
names with control characters in `Content-Disposition`, URL parts that are not
UTF-8, and files reached through a symlinked directory."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from openapi_spec_validator import validate

from conftest import new_session


def error_of(r):
    return r.status_code, r.json()["error"]["code"]


def test_the_document_is_valid_openapi(daemon):
    with daemon.http() as c:
        r = c.get("/v1/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    validate(doc)  # raises on the first error
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), ids
    schemas = doc["components"]["schemas"]
    # The rules the daemon enforces, from its own policies.
    with daemon.http() as c:
        policies = c.get("/v1/policies").json()
    run = schemas["RunRequest"]["properties"]
    assert run["timeout_s"]["maximum"] == max(p["timeout_s"] for p in policies)
    assert run["timeout_s"]["exclusiveMinimum"] == 0
    assert run["policy"]["enum"] == sorted(p["name"] for p in policies) + [None]
    # Every field a policy is served with is documented.
    assert set(policies[0]) == set(schemas["Policy"]["properties"])
    upload = doc["paths"]["/v1/sessions/{id}/files/{path}"]["put"]["requestBody"]["content"]
    body = upload["application/octet-stream"]["schema"]
    body = schemas[body["$ref"].rsplit("/", 1)[1]] if "$ref" in body else body
    assert (body["type"], body["format"]) == ("string", "binary")


# Small, quick runs whatever the fuzzer sends: every policy it can name times out
# in 2 s, in a small workspace, and pools a bare interpreter.
FUZZ_POLICY = """
description = "schemathesis: small and quick"
memory_mb = 256
cpus = 0.5
pids = 16
timeout_s = 2
grace_s = 1
output_kb = 8
code_kb = 4
upload_mb = 1
tmp_mb = 8
shm_mb = 8
workspace_mb = 16
file_size_mb = 1
open_files = 64
max_artifacts = 3
preload = []
"""

# Every check the installed schemathesis has, but positive_data_acceptance: it
# expects a 2xx for any valid input, and a valid session id names no session.
EXCLUDED_CHECKS = ["positive_data_acceptance"]

# Code longer than the policy's `code_kb` (the schema's maxLength) is refused with
# its own documented answer, 413 `code_too_large`: a rejection too.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]

# DELETE /v1/sessions/{id}/run stops the run in flight; the session and its run
# records stay (and DELETE .../chat stops a conversation; its records stay).
# use_after_free takes every URL the deleted one is a prefix of for the deleted
# resource, and /v1/sessions/{id}/runs (and /runs/{run_id}) start with .../run,
# .../chats with .../chat: its false alarm (ST301) for those, its check everywhere else.
[[operations]]
include-operation-id = ["list_runs", "get_run", "list_chats", "get_chat"]
checks.use_after_free.enabled = false
"""


def schemathesis(url, tmp_path, examples, seed, extra=()):
    """Run `st run` over the daemon's document; returns (exit code, output, events)."""
    report = tmp_path / "report.ndjson"
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    st = Path(sys.executable).parent / "st"
    cmd = [
        str(st), "--config-file", str(config), "run", f"{url}/v1/openapi.json",
        "--checks", "all", "--exclude-checks", ",".join(EXCLUDED_CHECKS),
        "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(examples),
        "--workers", "2",
        "--seed", str(seed),
        "--generation-database", "none",
        # Not a speed assertion: a request that takes this long is hung.
        "--max-response-time", "60", "--request-timeout", "90",
        "--no-color", "--output-truncate", "false",
        "--report", "ndjson", "--report-ndjson-path", str(report),
        *extra,
    ]
    env = dict(os.environ, SCHEMATHESIS_HOOKS="schemathesis_hooks",
               PYTHONPATH=str(Path(__file__).parent), NO_COLOR="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path, env=env)
    events = [json.loads(line) for line in report.read_text().splitlines() if line.strip()] if report.exists() else []
    return out.returncode, out.stdout + out.stderr, events


def test_schemathesis_finds_no_failures(fresh_daemon, tmp_path):
    """schemathesis over the served document, every check, against a daemon of its
    own: bounded by examples per operation (a few minutes on 2 cores), and by a
    session quota that refuses (429, documented) rather than fills the disk. The
    runs it makes are at most 2 s each."""
    d = fresh_daemon(
        policies={"default": FUZZ_POLICY, "strict": FUZZ_POLICY, "tiny": FUZZ_POLICY},
        # The chat's model endpoint: a port nothing listens on (a chat is an error event).
        args=["--max-sessions", "40", "--session-ttl-s", "120", "--pool-size", "1", "--llm-url", "http://127.0.0.1:9/v1"],
    )
    started = time.monotonic()
    code, text, events = schemathesis(d.url, tmp_path, os.environ.get("SANDBOXD_SCHEMATHESIS_EXAMPLES", "50"),
                                      os.environ.get("SANDBOXD_SCHEMATHESIS_SEED", "20261124"))
    took = time.monotonic() - started
    summary = "\n".join(text.splitlines()[-40:])
    assert code == 0, f"schemathesis failed after {took:.0f} s:\n{text[-20000:]}\n{d.log_text()}"
    # It really tested every operation, with many requests, and found nothing.
    doc = httpx.get(f"{d.url}/v1/openapi.json").json()
    operations = sum(len(methods) for methods in doc["paths"].values())
    assert operations >= 17, sorted(doc["paths"])
    assert re.search(rf"Selected: {operations}/{operations}\b", text) and re.search(rf"Tested: {operations}\b", text), summary
    generated = int(re.search(r"(\d+) generated", text).group(1))
    assert generated > 300, summary
    assert "Failures:" not in text and "Errors:" not in text, summary
    # And the daemon is still healthy.
    with d.http() as c:
        assert c.get("/v1/health").json()["status"] == "ok"


@pytest.mark.parametrize("body", ["[]", '["print(1)"]', '"print(1)"', "1", "null", "true"])
def test_a_json_body_that_is_not_an_object_is_refused(daemon, body):
    with daemon.http() as c:
        sid = new_session(c)
        for path in ["/v1/runs", f"/v1/sessions/{sid}/runs", "/v1/sessions"]:
            before = len(c.get("/v1/sessions").json())
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
            assert error_of(r) == (400, "invalid_request"), (path, r.text)
            assert r.json()["error"]["message"].startswith("the request body is not a JSON object"), r.text
            # Nothing ran, nothing was made.
            assert len(c.get("/v1/sessions").json()) == before
        assert c.get(f"/v1/sessions/{sid}/files").json() == []
        c.delete(f"/v1/sessions/{sid}")


@pytest.mark.parametrize("name, fallback, encoded", [
    ("esc\x1b[31mred.txt", "esc_[31mred.txt", "esc%1B%5B31mred.txt"),
    ("new\nline.txt", "new_line.txt", "new%0Aline.txt"),
    ('quote"semi;x.txt', "quote_semi;x.txt", "quote%22semi%3Bx.txt"),
    ("r\u00e9sum\u00e9 \u2603.txt", "r_sum_ _.txt", "r%C3%A9sum%C3%A9%20%E2%98%83.txt"),
])
def test_a_download_names_any_file_in_content_disposition(daemon, name, fallback, encoded):
    """A name the sandbox chose, control characters and all: 200 and an RFC 6266
    header (it was a 500 "failed to parse header value")."""
    with daemon.http() as c:
        sid = new_session(c)
        made = daemon.run(f"open({name!r}, 'wb').write(b'abc')", session_id=sid)
        assert made["status"] == "ok", made
        r = c.get(f"/v1/sessions/{sid}/files/{quote(name, safe='')}")
        assert r.status_code == 200, r.text
        assert r.content == b"abc"
        assert r.headers["content-disposition"] == f"inline; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
        assert r.headers["content-security-policy"] == "sandbox"
        c.delete(f"/v1/sessions/{sid}")


def test_url_parts_that_are_not_utf8_are_refused_in_the_envelope_or_are_file_names(daemon):
    """A session id is text: one that is not UTF-8 is refused in the envelope. A file
    name is bytes: `%FE` in a file route is the byte 0xfe (the listing writes it
    `\\xfe`), not an error."""
    with daemon.http() as c:
        sid = new_session(c)
        for method, url in [("GET", "/v1/sessions/%FF"), ("DELETE", "/v1/sessions/%C3"),
                            ("PUT", f"/v1/sessions/{sid}/files/a?overwrite=true&overwrite=false")]:
            r = c.request(method, url, content=b"x" if method == "PUT" else None)
            assert error_of(r) == (400, "invalid_request"), (method, url, r.text)
        assert c.get(f"/v1/sessions/{sid}/files").json() == []
        assert error_of(c.get(f"/v1/sessions/{sid}/files/%FF.txt")) == (404, "not_found")
        r = c.put(f"/v1/sessions/{sid}/files/a%FE", content=b"x")
        assert r.status_code == 201 and r.json()["path"] == "a\\xfe", r.text
        [entry] = c.get(f"/v1/sessions/{sid}/files").json()
        assert (entry["path"], entry["url"]) == ("a\\xfe", f"{daemon.url}/v1/sessions/{sid}/files/a%FE")
        assert c.get(f"/v1/sessions/{sid}/files/a%FE").content == b"x"
        assert c.delete(f"/v1/sessions/{sid}/files/a%FE").json() == {"status": "deleted", "path": "a\\xfe"}
        assert c.get(f"/v1/sessions/{sid}/files").json() == []
        c.delete(f"/v1/sessions/{sid}")


def test_nothing_is_reached_through_a_symlinked_directory(daemon, tmp_path):
    """`d -> <host dir>`, `w -> .` (back into the workspace): PUT, GET and DELETE
    through either are 400 invalid_path naming the link, and write nothing at the
    target, on the host or in the workspace."""
    target = Path("/var/tmp") / f"sandboxd-openapi-target-{os.getpid()}"
    target.mkdir(mode=0o777, exist_ok=True)
    (target / "x.txt").write_text("host")
    try:
        with daemon.http() as c:
            sid = new_session(c)
            made = daemon.run(f"import os\nos.symlink({str(target)!r}, 'd')\nos.symlink('.', 'w')\n"
                              "os.mkdir('real')\nos.symlink('/etc', 'real/etc')", session_id=sid)
            assert made["status"] == "ok", made
            for path, link in [("d/x.txt", "d"), ("d/new/y.txt", "d"), ("w/x.txt", "w"), ("real/etc/passwd", "real/etc")]:
                message = f"{link} is a symbolic link, which the daemon never follows: name the real file or directory instead"
                for method in ["PUT", "GET", "DELETE"]:
                    r = c.request(method, f"/v1/sessions/{sid}/files/{path}?overwrite=true",
                                  content=b"data" if method == "PUT" else None)
                    assert r.status_code == 400, (method, path, r.text)
                    assert r.json()["error"] == {"code": "invalid_path", "message": message}, (method, path)
            assert sorted(os.listdir(target)) == ["x.txt"] and (target / "x.txt").read_text() == "host"
            assert c.get(f"/v1/sessions/{sid}/files").json() == []
            listed = daemon.run("import os\nprint(sorted(os.listdir('.')), os.listdir('real'))", session_id=sid)
            assert listed["stdout"] == "['d', 'real', 'w'] ['etc']\n", listed
            c.delete(f"/v1/sessions/{sid}")
    finally:
        for f in target.iterdir():
            f.unlink()
        target.rmdir()
