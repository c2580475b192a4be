"""Run records: each run is kept from the moment it is accepted, paged newest first,
bounded per session, removed with the session; a run the daemon's end cut off reads
`interrupted` after a restart, and a kernel session's first cell after a restart says
`kernel_restarted`. A new session the state directory cannot hold is refused (507)."""

import json
import os
import shutil
import subprocess
import threading
import time

from conftest import error_code, new_session
from harness import TEST_POLICY, Daemon, scratch_dir

ZERO_ID = "0" * 32


def runs_of(c, sid, **params):
    r = c.get(f"/v1/sessions/{sid}/runs", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def all_runs(c, sid, limit=100):
    """Every record of the session, newest first, page by page."""
    got, before = [], None
    while True:
        page = runs_of(c, sid, limit=limit, **({"before": before} if before else {}))
        got += page["runs"]
        before = page["next"]
        if before is None:
            return got


def test_runs_are_recorded_paged_newest_first_and_go_with_their_session(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        assert runs_of(c, sid) == {"runs": [], "next": None}
        done = [
            c.post(f"/v1/sessions/{sid}/runs", json=body).json()
            for body in ({"code": "print('a')"}, {"code": "1/0"}, {"code": "echo hi", "language": "shell"})
        ]
        assert [r["status"] for r in done] == ["ok", "error", "ok"]
        first = runs_of(c, sid, limit=2)
        assert [r["run_id"] for r in first["runs"]] == [done[2]["run_id"], done[1]["run_id"]]
        assert first["next"] == done[1]["run_id"]
        second = runs_of(c, sid, limit=2, before=first["next"])
        assert [r["run_id"] for r in second["runs"]] == [done[0]["run_id"]] and second["next"] is None
        summary = second["runs"][0]
        assert (summary["status"], summary["language"], summary["mode"], summary["exit_code"]) == ("ok", "python", "script", 0)
        assert summary["duration_ms"] == done[0]["duration_ms"]

        for result, code, language in zip(done, ("print('a')", "1/0", "echo hi"), ("python", "python", "shell")):
            rec = c.get(f"/v1/sessions/{sid}/runs/{result['run_id']}").json()
            assert (rec["run_id"], rec["code"], rec["language"], rec["mode"]) == (result["run_id"], code, language, "script")
            assert rec["status"] == result["status"] and rec["result"] == result, rec
            assert rec["accepted_at"] <= rec["finished_at"] and rec["error"] is None
            assert (rec["code_truncated"], rec["output_cut"]) == (False, False)
        assert "ZeroDivisionError" in c.get(f"/v1/sessions/{sid}/runs/{done[1]['run_id']}").json()["result"]["stderr"]

        # What the daemon refuses before a run is accepted leaves no record.
        too_big = c.post(f"/v1/sessions/{sid}/runs", json={"code": "#" * (101 * 1024)})
        assert (too_big.status_code, error_code(too_big)) == (413, "code_too_large")
        assert len(all_runs(c, sid)) == 3

        # Bad queries and unknown runs: the envelope, and what to do.
        for params in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"before": "xyz"}, {"before": "A" * 32}):
            r = c.get(f"/v1/sessions/{sid}/runs", params=params)
            assert (r.status_code, error_code(r)) == (400, "invalid_request"), (params, r.text)
        r = c.get(f"/v1/sessions/{sid}/runs", params={"before": ZERO_ID})
        assert (r.status_code, error_code(r)) == (404, "run_not_found") and "GET /v1/sessions/" in r.json()["error"]["message"]
        for run_id in (ZERO_ID, "abc", "%2e%2e%2fsession.json"):
            r = c.get(f"/v1/sessions/{sid}/runs/{run_id}")
            assert (r.status_code, error_code(r)) == (404, "run_not_found"), (run_id, r.text)
        r = c.get("/v1/sessions/no-such-session/runs")
        assert (r.status_code, error_code(r)) == (404, "session_not_found")

        on_disk = daemon.state / "sessions" / sid / "runs"
        assert sorted(p.name.split("-", 1)[1] for p in on_disk.iterdir()) == sorted(f"{r['run_id']}.json" for r in done)
        assert os.stat(on_disk).st_mode & 0o777 == 0o700
        assert {os.stat(p).st_mode & 0o777 for p in on_disk.iterdir()} == {0o600}
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        r = c.get(f"/v1/sessions/{sid}/runs")
        assert (r.status_code, error_code(r)) == (404, "session_not_found")
        assert not on_disk.parent.exists()


def test_records_are_bounded_and_keep_the_start_of_long_code_and_output(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        ids = [c.post(f"/v1/sessions/{sid}/runs", json={"code": "true", "language": "shell"}).json()["run_id"]
               for _ in range(103)]
        kept = all_runs(c, sid, limit=37)
        assert [r["run_id"] for r in kept] == ids[::-1][:100]
        r = c.get(f"/v1/sessions/{sid}/runs/{ids[0]}")
        assert (r.status_code, error_code(r)) == (404, "run_not_found")

        code = "print('x' * 90000)\n" + "#" * (99 * 1024)  # 100 KiB of code: within code_kb
        result = c.post(f"/v1/sessions/{sid}/runs", json={"code": code}).json()
        assert len(result["stdout"]) == 90001 and not result["stdout_truncated"]
        rec = c.get(f"/v1/sessions/{sid}/runs/{result['run_id']}").json()
        assert rec["code"] == code and rec["code_truncated"] is False
        assert rec["output_cut"] is True and rec["result"]["stdout"] == "x" * 65536
        assert len(all_runs(c, sid)) == 100
        c.delete(f"/v1/sessions/{sid}")


def test_a_record_stays_readable_whatever_names_and_bytes_the_run_chose(daemon):
    """Control bytes take 6 bytes each as JSON, and a run may make 100 artifacts with
    names near PATH_MAX: the record keeps fewer artifacts rather than become too large
    to read back (which would make the run vanish from its session)."""
    code = r"""
import os
name = '\x01' * 250
for i in range(100):
    d = os.path.join(*([name] * 14), str(i))
    os.makedirs(d)
    open(os.path.join(d, name), 'w').close()
print('\x01' * 60000)
"""
    with daemon.http() as c:
        sid = new_session(c)
        result = c.post(f"/v1/sessions/{sid}/runs", json={"code": code}).json()
        assert result["status"] == "ok" and len(result["artifacts"]) == 100, result["stderr"]
        rec = c.get(f"/v1/sessions/{sid}/runs/{result['run_id']}")
        assert rec.status_code == 200, rec.text
        rec = rec.json()
        assert rec["status"] == "ok" and rec["artifacts_cut"] is True
        assert 0 < len(rec["result"]["artifacts"]) < 100
        assert rec["result"]["artifacts"] == result["artifacts"][: len(rec["result"]["artifacts"])]
        assert [r["run_id"] for r in runs_of(c, sid)["runs"]] == [result["run_id"]]
        stored = next((daemon.state / "sessions" / sid / "runs").iterdir())
        assert stored.stat().st_size <= 1024 * 1024
        c.delete(f"/v1/sessions/{sid}")


# A kernel cell that forges its own reply (the cell's nonce is in the kernel's frame):
# 64 KiB of stdout, then a result and an exception whose texts are control
# characters (6 bytes each in JSON), filling the kernel's 1 MiB line. As the record
# stores them, they take more than that line: the record used to be written past
# its 1 MiB bound, then answered 500 and dropped out of the session's runs.
FORGE_LARGE = r"""
import json, sys
frame = sys._getframe(1)
channel, nonce = frame.f_locals["channel"], frame.f_locals["nonce"]
channel.send({"kind": "chunk", "nonce": nonce, "stream": "stdout", "text": "\x01" * 65536})
reply = {"kind": "reply", "nonce": nonce,
         "result": {"text/plain": "\x01" * 65536, "text/html": "\x01" * 65536},
         "exception": {"name": "\x01" * 256, "value": "", "traceback": ""},
         "exit_code": 1, "stdout_truncated": False, "stderr_truncated": False}
room = (1 << 20) - len(json.dumps(reply, ensure_ascii=False).encode())
reply["exception"]["value"] = "\x01" * (room // 6)
channel.send(reply)
"""


def test_a_forged_oversized_kernel_result_is_cut_to_fit_its_record(daemon, kernel):
    sid = kernel()
    with daemon.http() as c:
        forged = c.post(f"/v1/sessions/{sid}/runs", json={"code": FORGE_LARGE}).json()
        # The caller got the forged reply, as the daemon keeps it (64 KiB a text).
        assert forged["status"] == "error" and forged["kernel_restarted"] is False, forged["stderr"]
        assert forged["result"] == {"text/plain": "\x01" * 65536, "text/html": "\x01" * 65536}
        assert forged["exception"]["name"] == "\x01" * 256 and len(forged["exception"]["value"]) > 40_000
        assert forged["stdout"] == "\x01" * 65536
        # As JSON, the result and the exception alone take the bound but a few
        # hundred bytes: with the record's own fields, cutting the output and the
        # code (all a record could cut before) left it past its bound.
        as_json = len(json.dumps(forged["result"]).encode()) + len(json.dumps(forged["exception"]).encode())
        assert 1024 * 1024 - 1024 < as_json <= 1024 * 1024, as_json
        r = c.get(f"/v1/sessions/{sid}/runs/{forged['run_id']}")
        assert r.status_code == 200, r.text
        rec = r.json()
        assert rec["status"] == "error" and rec["kernel_result_cut"] is True and rec["output_cut"] is True
        assert rec["code"] == FORGE_LARGE and rec["code_truncated"] is False
        kept = rec["result"]
        # What is kept of each text is its start; the longest were cut first.
        for field in ("text/plain", "text/html"):
            assert forged["result"][field].startswith(kept["result"][field])
        for field in ("name", "value", "traceback"):
            assert forged["exception"][field].startswith(kept["exception"][field])
        assert kept["exception"]["name"] == forged["exception"]["name"]
        assert len(kept["result"]["text/plain"]) == len(kept["result"]["text/html"]) < 65536
        assert forged["stdout"].startswith(kept["stdout"])
        # The run stays in its session's list, and its record within its bound.
        assert [x["run_id"] for x in runs_of(c, sid)["runs"]][0] == forged["run_id"]
        stored = [p for p in (daemon.state / "sessions" / sid / "runs").iterdir() if forged["run_id"] in p.name]
        assert len(stored) == 1 and stored[0].stat().st_size <= 1024 * 1024
        # The kernel goes on; the forging cell's own reply, a cell late, was dropped.
        after = c.post(f"/v1/sessions/{sid}/runs", json={"code": "6 * 7"}).json()
        assert after["result"] == {"text/plain": "42"} and after["kernel_restarted"] is False, after


def test_another_token_sees_no_record(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a", "tok-b"])
    with d.http("tok-a") as a, d.http("tok-b") as b, d.uds() as operator:
        sid = new_session(a, id="mine")
        run_id = a.post(f"/v1/sessions/{sid}/runs", json={"code": "print(1)"}).json()["run_id"]
        assert [r["run_id"] for r in runs_of(a, sid)["runs"]] == [run_id]
        for path in (f"/v1/sessions/{sid}/runs", f"/v1/sessions/{sid}/runs/{run_id}"):
            r = b.get(path)
            assert (r.status_code, error_code(r)) == (404, "session_not_found"), r.text
        key = operator.get("/v1/sessions").json()[0]["id"]
        assert key.endswith(".mine")
        assert operator.get(f"/v1/sessions/{key}/runs/{run_id}").json()["status"] == "ok"


def test_a_run_cut_off_by_the_daemons_end_reads_interrupted_after_the_restart(fresh_daemon):
    d = fresh_daemon()
    with d.http() as c:
        sid = new_session(c, id="cut")
        finished = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print('before')"}).json()
    box = {}

    def long_run():
        try:
            box["r"] = d.run("import time; time.sleep(60)", session_id=sid)
        except Exception as e:  # the daemon is killed under it
            box["e"] = e

    t = threading.Thread(target=long_run, daemon=True)
    t.start()
    deadline = time.time() + 60
    with d.http() as c:
        while True:
            runs = runs_of(c, sid)["runs"]
            if len(runs) == 2 and runs[0]["status"] == "running":
                break
            assert time.time() < deadline, runs
            time.sleep(0.05)
        running = c.get(f"/v1/sessions/{sid}/runs/{runs[0]['run_id']}").json()
    assert running["finished_at"] is None and running["result"] is None and running["code"] == "import time; time.sleep(60)"
    d.proc.kill()
    d.proc.wait()
    t.join(30)
    assert "r" not in box, box
    d.start()
    with d.http() as c:
        runs = runs_of(c, sid)["runs"]
        assert [r["status"] for r in runs] == ["interrupted", "ok"], runs
        rec = c.get(f"/v1/sessions/{sid}/runs/{running['run_id']}").json()
        assert (rec["status"], rec["finished_at"], rec["result"]) == ("interrupted", None, None)
        assert "daemon stopped" in rec["error"]
        assert c.get(f"/v1/sessions/{sid}/runs/{finished['run_id']}").json()["result"] == finished
        # The session goes on; new runs are recorded after the old ones.
        again = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print('after')"}).json()
        assert [r["run_id"] for r in runs_of(c, sid)["runs"]] == [again["run_id"], running["run_id"], finished["run_id"]]
    d.assert_clean()


def test_the_first_cell_after_a_restart_says_the_kernel_was_restarted(fresh_daemon):
    d = fresh_daemon()
    with d.http() as c:
        used = new_session(c, id="used", mode="kernel")
        unused = new_session(c, id="unused", mode="kernel")
        # A shell run in a kernel session starts no kernel.
        assert c.post(f"/v1/sessions/{unused}/runs", json={"code": "true", "language": "shell"}).json()["status"] == "ok"
        assert c.post(f"/v1/sessions/{used}/runs", json={"code": "x = 41"}).json()["kernel_restarted"] is False
        assert c.post(f"/v1/sessions/{used}/runs", json={"code": "x + 1"}).json()["result"]["text/plain"] == "42"
    d.proc.kill()
    d.proc.wait()
    d.start()
    with d.http() as c:
        first = c.post(f"/v1/sessions/{used}/runs", json={"code": "x + 1"}).json()
        assert (first["status"], first["kernel_restarted"], first["exception"]["name"]) == ("error", True, "NameError"), first
        assert first["stderr"].startswith("sandboxd: the daemon restarted since this session's last cell"), first["stderr"]
        second = c.post(f"/v1/sessions/{used}/runs", json={"code": "x = 1; x"}).json()
        assert (second["status"], second["kernel_restarted"], second["result"]["text/plain"]) == ("ok", False, "1")
        assert not second["stderr"].startswith("sandboxd:")
        # A kernel session that never ran a cell lost nothing.
        fresh = c.post(f"/v1/sessions/{unused}/runs", json={"code": "2 + 2"}).json()
        assert (fresh["kernel_restarted"], fresh["result"]["text/plain"]) == (False, "4")
    # A clean stop loses the kernel too.
    d.stop()
    d.start()
    with d.http() as c:
        after = c.post(f"/v1/sessions/{used}/runs", json={"code": "x"}).json()
        assert (after["kernel_restarted"], after["exception"]["name"]) == (True, "NameError"), after


BIG_POLICY = TEST_POLICY.replace("workspace_mb = 16", "workspace_mb = 400")
SMALL_BIG_POLICY = TEST_POLICY  # workspace_mb = 16, the least a policy may say
# A small workspace and a big package layer: the layer counts as the workspace does.
BIG_LAYER_POLICY = TEST_POLICY.replace("packages_mb = 64", "packages_mb = 400")


def test_a_session_the_state_filesystem_cannot_hold_is_refused_with_507():
    base = scratch_dir("storage-")
    state = base / "d" / "state"
    state.mkdir(parents=True)
    # Each session may take its workspace_mb, its packages_mb (64 in the test
    # policies) and 14 MiB of run records and conversations: 700 MiB (the daemon wants
    # 512 MiB free to start) holds one `big` session (400 + 64 + 14) and a `tiny` one
    # (16 + 64 + 14), not two `big` ones, nor a `big` one and a `big-layer` one (16 + 400 + 14).
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700m,mode=0711", "sandboxd-test-507", str(state)], check=True)
    d = Daemon(base / "d", policies={"big": BIG_POLICY, "big2": BIG_POLICY, "big-layer": BIG_LAYER_POLICY})
    try:
        d.start()
        with d.http() as c:
            first = new_session(c, id="first", policy="big")
            # Used, so that its images are made (a session not used yet counts its
            # policy's sizes).
            assert c.post(f"/v1/sessions/{first}/runs", json={"code": "print(1)"}).json()["status"] == "ok"
            r = c.post("/v1/sessions", json={"id": "second", "policy": "big"})
            assert (r.status_code, error_code(r)) == (507, "insufficient_storage"), r.text
            message = r.json()["error"]["message"]
            assert "MiB free" in message and "close sessions" in message and "workspace_mb or packages_mb" in message
            r = c.post("/v1/sessions", json={"id": "layered", "policy": "big-layer"})
            assert (r.status_code, error_code(r)) == (507, "insufficient_storage"), r.text
            assert "this one needs 430 MiB (its workspace, package layer, run records and conversations" in r.json()["error"]["message"]
            r = c.post("/v1/runs", json={"code": "print(1)", "policy": "big"})
            assert (r.status_code, error_code(r)) == (507, "insufficient_storage"), r.text
            # Nothing was made for the refused ones.
            assert [s["id"] for s in c.get("/v1/sessions").json()] == [first]
            assert sorted(p.name for p in (state / "sessions").iterdir()) == [first]
        # The session's image keeps its size when its policy's workspace_mb shrinks:
        # that size is what counts.
        d.stop()
        (d.policies / "big.toml").write_text(SMALL_BIG_POLICY)
        d.start()
        with d.http() as c:
            r = c.post("/v1/sessions", json={"id": "second", "policy": "big2"})
            assert (r.status_code, error_code(r)) == (507, "insufficient_storage"), r.text
            # A smaller workspace still fits; closing one frees its room.
            small = new_session(c, policy="tiny")
            assert c.post(f"/v1/sessions/{small}/runs", json={"code": "print('fits')"}).json()["stdout"] == "fits\n"
            assert c.delete(f"/v1/sessions/{first}").status_code == 200
            assert new_session(c, id="second", policy="big2") == "second"
    finally:
        d.stop()
        subprocess.run(["umount", str(state)], check=False)
    d.assert_clean()
    shutil.rmtree(base, ignore_errors=True)
