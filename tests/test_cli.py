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


# --- what one command leaves: sessions on the daemon, bytes on the operator's disk -----

SPARSE = """
for i in range(3):
    with open(f"sparse{i}.bin", "wb") as f:
        f.write(b"head")
        f.truncate(300 * 1024 * 1024)  # a hole: no space in the workspace
        f.seek(300 * 1024 * 1024 - 4)
        f.write(b"tail")
open("small.txt", "w").write("x")
"""
SPARSE_SIZE = 300 * 1024 * 1024


def session_ids(daemon):
    with daemon.uds() as c:
        return sorted(s["id"] for s in c.get("/v1/sessions").json())


def ctl_measured(daemon, *args, stdin=""):
    """Run sandboxctl under GNU time: (exit code, stdout, stderr, its peak RSS in KiB).
    (A child's ru_maxrss seen from here would include this Python process, whose
    memory a forked child starts with.)"""
    import tempfile
    with tempfile.NamedTemporaryFile(mode="r") as peak:
        r = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", peak.name, str(CTL), "--socket", str(daemon.socket),
                            *args], input=stdin, capture_output=True, text=True, timeout=300)
        return r.returncode, r.stdout, r.stderr, int(peak.read().split()[-1])


def test_run_without_a_session_leaves_none_unless_kept(daemon, tmp_path):
    """Each `run` without --session used to leave its session (and say so only when
    there were files): it is closed after the run, --save included; --keep keeps it
    and prints its id."""
    before = session_ids(daemon)
    for _ in range(3):
        r = ctl(daemon, "run", stdin="open('f.txt', 'w').write('x'); print('ok')")
        assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
        assert "closed with the run's session" in r.stderr and "f.txt" in r.stderr, r.stderr
    r = ctl(daemon, "run", "--save", str(tmp_path / "out"), stdin="open('f.txt', 'w').write('saved')")
    assert r.returncode == 0 and (tmp_path / "out" / "f.txt").read_text() == "saved", r.stderr
    r = ctl(daemon, "run", stdin="raise SystemExit(4)")
    assert r.returncode == 4
    assert session_ids(daemon) == before

    kept = ctl(daemon, "run", "--keep", stdin="open('k.txt', 'w').write('kept')")
    assert kept.returncode == 0, kept.stderr
    line = [l for l in kept.stderr.splitlines() if l.startswith("sandboxctl: session ") and " kept: " in l]
    assert len(line) == 1 and " kept: run in it with --session " in line[0], kept.stderr
    sid = line[0].split()[2]
    assert session_ids(daemon) == sorted(before + [sid])
    assert ctl(daemon, "files", "get", sid, "k.txt").stdout == "kept"
    assert ctl(daemon, "sessions", "rm", sid).returncode == 0
    # --keep is for the session a run makes: with --session it is refused.
    r = ctl(daemon, "run", "--keep", "--session", "x", stdin="1")
    assert r.returncode == 2 and "cannot be used with" in r.stderr, r.stderr
    assert session_ids(daemon) == before


def test_save_keeps_holes_streams_and_stays_within_max_bytes(daemon, tmp_path):
    """Three sparse 300 MiB files (which cost the sandbox nothing) once became 901 MB on
    the operator's disk at 629 MB of sandboxctl's memory. Saved now: the same bytes,
    a few blocks on disk, sandboxctl's memory bounded; past --max-bytes nothing is
    saved, and a download past it leaves no partial file."""
    sid = ctl(daemon, "sessions", "new").stdout.strip()
    try:
        out = tmp_path / "out"
        code, stdout, stderr, peak_kib = ctl_measured(daemon, "run", "--session", sid, "--save", str(out), "-",
                                                      stdin=SPARSE)
        assert code == 0, stderr
        print(f"sandboxctl peak RSS {peak_kib} KiB")
        assert peak_kib < 32 * 1024, f"sandboxctl used {peak_kib} KiB"
        import os
        for i in range(3):
            f = out / f"sparse{i}.bin"
            st = os.stat(f)
            assert st.st_size == SPARSE_SIZE
            assert st.st_blocks * 512 <= 64 * 1024, f"{f} takes {st.st_blocks * 512} bytes on disk"
            with open(f, "rb") as fh:
                assert fh.read(4) == b"head"
                fh.seek(SPARSE_SIZE - 4)
                assert fh.read() == b"tail"
                fh.seek(123 * 1024 * 1024)
                assert fh.read(1 << 16) == bytes(1 << 16)
        assert (out / "small.txt").read_text() == "x"
        assert sorted(p.name for p in out.iterdir()) == ["small.txt", "sparse0.bin", "sparse1.bin", "sparse2.bin"]

        # The run's files hold 900 MiB: past --max-bytes 500M nothing at all is saved.
        capped = tmp_path / "capped"
        code, _, stderr, _ = ctl_measured(daemon, "run", "--session", sid, "--save", str(capped),
                                          "--max-bytes", "500M", "-", stdin=SPARSE)
        assert code == 73, stderr
        assert "more than --max-bytes (524288000); nothing was saved" in stderr, stderr
        assert not capped.exists() or list(capped.iterdir()) == []
        # The default (1 GiB) holds them; one file past a smaller cap is refused whole.
        got = tmp_path / "one.bin"
        r = ctl(daemon, "files", "get", sid, "sparse1.bin", "-o", str(got), "--max-bytes", "100M")
        assert r.returncode == 73 and "(--max-bytes); nothing of it was kept" in r.stderr, r.stderr
        assert list(tmp_path.glob("one.bin*")) == [] and list(tmp_path.glob(".sandboxctl-*")) == []
        r = ctl(daemon, "files", "get", sid, "sparse1.bin", "--max-bytes", "100M")
        assert r.returncode == 73 and r.stdout == "", r.stderr
        code, _, stderr, peak_kib = ctl_measured(daemon, "files", "get", sid, "sparse1.bin", "-o", str(got))
        assert code == 0 and os.stat(got).st_size == SPARSE_SIZE and os.stat(got).st_blocks * 512 <= 64 * 1024, stderr
        assert peak_kib < 32 * 1024, f"sandboxctl used {peak_kib} KiB"
    finally:
        ctl(daemon, "sessions", "rm", sid)


def test_save_never_writes_outside_its_directory(daemon, tmp_path):
    """Names come from the sandbox: a symlink already in the save directory is never
    followed (the file is skipped and named, the rest saved, exit 73), a symlink at a
    file's own name is replaced, not written through, and a name is saved as the
    bytes it is (a backslash is a byte of one name, never a separator)."""
    import os
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(elsewhere, out / "sub")
    os.symlink(elsewhere / "victim", out / "plain.txt")
    sid = ctl(daemon, "sessions", "new").stdout.strip()
    try:
        code = ("import os\nos.makedirs('sub', exist_ok=True)\nopen('sub/victim', 'w').write('pwned')\n"
                "open('plain.txt', 'w').write('mine')\nopen('back\\\\..\\\\slash', 'w').write('b')\n")
        r = ctl(daemon, "run", "--session", sid, "--save", str(out), "-", stdin=code)
        assert r.returncode == 73, r.stderr
        assert "sub/victim: a directory on its way is a symlink in the save directory: not followed: not saved" \
            in r.stderr, r.stderr
        assert "1 of the run's 3 files were not saved" in r.stderr, r.stderr
        assert (elsewhere / "victim").read_text() == "keep"
        assert os.path.islink(out / "sub") and not os.path.islink(out / "plain.txt")
        assert (out / "plain.txt").read_text() == "mine"
        assert (out / "back\\..\\slash").read_text() == "b"
        assert sorted(os.listdir(out)) == ["back\\..\\slash", "plain.txt", "sub"]
        assert os.listdir(elsewhere) == ["victim"]
    finally:
        ctl(daemon, "sessions", "rm", sid)
