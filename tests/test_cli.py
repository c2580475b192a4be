"""sandboxctl, the real binary, against a real daemon (Unix socket by default)."""

import json
import subprocess

from harness import CTL


def ctl(daemon, *args, stdin=None, http=False):
    target = ["--url", daemon.url] if http else ["--socket", str(daemon.socket)]
    return subprocess.run([str(CTL), *target, *args], input=stdin, capture_output=True, text=True, timeout=120)


def test_run_prints_like_the_program_and_exits_with_its_code(daemon):
    r = ctl(daemon, "run", "-", stdin="import sys\nprint('to out')\nprint('to err', file=sys.stderr)\nsys.exit(3)\n")
    assert (r.returncode, r.stdout, r.stderr.splitlines()[0]) == (3, "to out\n", "to err")
    r = ctl(daemon, "run", "--shell", stdin="echo shell; exit 0", http=True)
    assert (r.returncode, r.stdout) == (0, "shell\n")
    r = ctl(daemon, "run", "--timeout", "1", stdin="import time; time.sleep(30)")
    assert r.returncode == 124 and "time limit" in r.stderr


def test_run_json_session_and_save(daemon, tmp_path):
    sid = ctl(daemon, "sessions", "new", "--id", "cli-1").stdout.strip()
    assert sid == "cli-1"
    script = tmp_path / "plot.py"
    script.write_text("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nopen('sub_out.txt', 'w').write('x')\nprint('done')\n")
    out = tmp_path / "out"
    r = ctl(daemon, "run", str(script), "--session", sid, "--save", str(out))
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    saved = sorted(p.name for p in out.iterdir())
    assert "sub_out.txt" in saved and any(n.startswith("figure-") and n.endswith(".png") for n in saved)
    assert (out / "sub_out.txt").read_text() == "x"
    r = ctl(daemon, "run", "--json", "--session", sid, stdin="print(open('sub_out.txt').read())")
    result = json.loads(r.stdout)
    assert result["stdout"] == "x\n" and result["session_id"] == sid
    listing = ctl(daemon, "sessions", "ls").stdout
    assert any(line.split("\t")[0] == sid for line in listing.splitlines())
    assert json.loads(ctl(daemon, "sessions", "show", sid).stdout)["id"] == sid
    assert ctl(daemon, "sessions", "rm", sid).returncode == 0
    r = ctl(daemon, "sessions", "show", sid)
    assert r.returncode == 2
    assert r.stderr.startswith("sandboxctl: ") and r.stderr.rstrip().endswith("(session_not_found)")
    assert len(r.stderr.strip().splitlines()) == 1


def test_files_commands(daemon, tmp_path):
    sid = ctl(daemon, "sessions", "new").stdout.strip()
    local = tmp_path / "in.txt"
    local.write_text("hello file")
    assert ctl(daemon, "files", "put", sid, str(local), "dir/in.txt").returncode == 0
    again = ctl(daemon, "files", "put", sid, str(local), "dir/in.txt")
    assert again.returncode == 2 and "(file_exists)" in again.stderr
    assert ctl(daemon, "files", "put", sid, str(local), "dir/in.txt", "--overwrite").returncode == 0
    ls = ctl(daemon, "files", "ls", sid).stdout
    assert "10\ttext/plain\tdir/in.txt" in ls
    assert ctl(daemon, "files", "get", sid, "dir/in.txt").stdout == "hello file"
    target = tmp_path / "back.txt"
    assert ctl(daemon, "files", "get", sid, "dir/in.txt", "-o", str(target)).returncode == 0
    assert target.read_text() == "hello file"
    assert ctl(daemon, "files", "rm", sid, "dir/in.txt").returncode == 0
    assert "(not_found)" in ctl(daemon, "files", "get", sid, "dir/in.txt").stderr


def test_health_unreachable_and_completions(daemon, tmp_path):
    h = json.loads(ctl(daemon, "health").stdout)
    assert h["status"] == "ok"
    r = subprocess.run([str(CTL), "--socket", str(tmp_path / "none.sock"), "health"], capture_output=True, text=True)
    assert r.returncode == 69 and "cannot reach sandboxd" in r.stderr
    comp = subprocess.run([str(CTL), "completions", "bash"], capture_output=True, text=True)
    assert comp.returncode == 0 and "sandboxctl" in comp.stdout


def test_names_the_sandbox_chose_reach_the_terminal_escaped(daemon):
    """A file name is sandboxed code's choice: `files ls` and the artifacts list show
    its control characters escaped, so no escape sequence reaches the terminal."""
    sid = ctl(daemon, "sessions", "new").stdout.strip()
    made = ctl(daemon, "run", "--session", sid, stdin="open('x\\x1b]0;pwned\\x07\\nfake.txt', 'w').write('1')\n")
    assert made.returncode == 0, made.stderr
    assert "\x1b" not in made.stderr and "\\u{1b}]0;pwned\\u{7}\\nfake.txt" in made.stderr, made.stderr
    ls = ctl(daemon, "files", "ls", sid)
    assert ls.returncode == 0 and "\x1b" not in ls.stdout and "\x07" not in ls.stdout
    assert ls.stdout == "1\ttext/plain\tx\\u{1b}]0;pwned\\u{7}\\nfake.txt\n", ls.stdout
    assert ctl(daemon, "sessions", "rm", sid).returncode == 0


def test_sessions_runs_lists_and_shows_run_records(daemon):
    sid = ctl(daemon, "sessions", "new").stdout.strip()
    first = json.loads(ctl(daemon, "run", "--session", sid, "--json", "-", stdin="print('one')").stdout)
    second = json.loads(ctl(daemon, "run", "--session", sid, "--json", "--shell", "-", stdin="exit 3").stdout)
    listed = ctl(daemon, "sessions", "runs", sid)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [r[:3] for r in rows] == [[second["run_id"], "error", "shell"], [first["run_id"], "ok", "python"]]
    older = ctl(daemon, "sessions", "runs", sid, "--limit", "1", "--before", second["run_id"])
    assert [line.split("\t")[0] for line in older.stdout.splitlines()] == [first["run_id"]]
    shown = json.loads(ctl(daemon, "sessions", "run", sid, first["run_id"]).stdout)
    assert (shown["code"], shown["status"], shown["result"]["stdout"]) == ("print('one')", "ok", "one\n")
    missing = ctl(daemon, "sessions", "run", sid, "0" * 32)
    assert missing.returncode != 0 and missing.stderr.rstrip().endswith("(run_not_found)"), missing.stderr
    ctl(daemon, "sessions", "rm", sid)
