"""Packages at run time, from the real package index (CI machines reach PyPI and
files.pythonhosted.org; the default policy allows those two hosts only): installed
into the session's package layer, importable by every later run of the session
(script, pooled, kernel), never by another session; `pip install` from the code;
the daemon's package cache serving a second install; and the installs that must
fail, failing with the installer's own words and leaving the layer as it was.

The wheels are small pure-Python ones, pinned: tabulate, six, idna.
"""

import json
import re
import subprocess

import pytest

from conftest import error_code, new_session
from harness import CTL

TABULATE = "tabulate==0.9.0"
SIX = "six==1.16.0"


def install(client, sid, packages, expect=200):
    r = client.post(f"/v1/sessions/{sid}/packages", json={"packages": packages}, timeout=300)
    assert r.status_code == expect, r.text
    return r.json()


def run(client, sid, code):
    r = client.post(f"/v1/sessions/{sid}/runs", json={"code": code}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def metric(daemon, name):
    with daemon.http() as c:
        text = c.get("/metrics").text
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))


def test_an_installed_wheel_is_imported_by_later_script_and_pooled_runs_and_no_other_session(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        before = run(c, sid, "import tabulate")
        assert before["status"] == "error" and "ModuleNotFoundError: No module named 'tabulate'" in before["stderr"]
        result = install(c, sid, [TABULATE])
        assert result["installed"] == [{"name": "tabulate", "version": "0.9.0"}]
        assert result["session_id"] == sid and 0 < result["layer_bytes"] < result["layer_limit_bytes"]
        assert result["net"]["hosts"] and result["net"]["refused"] == []
        # A cold run (shell) and pooled Python runs alike.
        daemon.wait_pool_ready()
        hits = metric(daemon, "sandboxd_pool_hits_total")
        py = run(c, sid, "import tabulate, sys\nprint(tabulate.__version__)\nprint(tabulate.__file__)")
        assert py["status"] == "ok" and py["stdout"].splitlines()[0] == "0.9.0", py
        assert py["stdout"].splitlines()[1].startswith("/opt/packages/current/lib/python3.11/site-packages/")
        assert metric(daemon, "sandboxd_pool_hits_total") == hits + 1, "the run was not pooled"
        sh = c.post(f"/v1/sessions/{sid}/runs", json={"code": "python -c 'import tabulate; print(tabulate.__version__)'",
                                                      "language": "shell"}).json()
        assert sh["stdout"] == "0.9.0\n", sh
        # Not in the workspace: neither listed nor an artifact.
        assert all("tabulate" not in f["path"] for f in c.get(f"/v1/sessions/{sid}/files").json())
        assert result["installed"] and py["artifacts"] == []
        # Another session never sees it.
        other = new_session(c)
        miss = run(c, other, "import tabulate")
        assert "ModuleNotFoundError: No module named 'tabulate'" in miss["stderr"]
        # Installed again: nothing to do.
        again = install(c, sid, [TABULATE])
        assert again["installed"] == [] and again["unchanged"] == [TABULATE.split("==")[0]] or again["unchanged"] == [TABULATE]


def test_a_kernel_sees_packages_installed_after_it_started_without_restarting(daemon, kernel):
    sid = kernel()
    with daemon.http() as c:
        first = run(c, sid, "x = 41\ntry:\n    import six\nexcept ImportError as e:\n    print(e)")
        assert first["stdout"] == "No module named 'six'\n", first
        install(c, sid, [SIX])
        second = run(c, sid, "import six\nprint(six.__version__)\nx + 1")
        assert second["status"] == "ok" and second["stdout"] == "1.16.0\n", second
        assert second["result"]["text/plain"] == "42" and not second["kernel_restarted"]


def test_pip_install_from_the_code_goes_into_the_layer(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        r = run(c, sid, "import subprocess, sys\n"
                        "p = subprocess.run([sys.executable, '-m', 'pip', 'install', 'idna==3.10'], capture_output=True, text=True)\n"
                        "print(p.returncode)\nprint(p.stdout[-400:])\nprint(p.stderr[-2000:], file=sys.stderr)\n"
                        "import idna\nprint(idna.__file__)")
        assert r["status"] == "ok", r
        assert r["stdout"].splitlines()[0] == "0" and "Successfully installed idna-3.10" in r["stdout"], r
        assert r["stdout"].strip().splitlines()[-1].startswith("/opt/packages/current/lib/python3.11/site-packages/idna/")
        # A plain `pip install` of what the rootfs has is satisfied, and touches nothing.
        sh = c.post(f"/v1/sessions/{sid}/runs", json={"code": "pip install seaborn 2>&1 | grep -i seaborn", "language": "shell"}).json()
        assert "Requirement already satisfied: seaborn" in sh["stdout"], sh
        later = run(c, sid, "import idna; print(idna.__version__)")
        assert later["stdout"] == "3.10\n"


def test_a_second_session_installing_the_same_wheel_downloads_nothing_of_it(fresh_daemon):
    """Nor asks the index for its page: the daemon keeps pages while fresh (its
    mirror here says nothing of freshness: kept for the heuristic 60 s)."""
    hit, miss = ('sandboxd_package_cache_requests_total{result="%s"}' % r for r in ("hit", "miss"))
    page_hit, page_miss = ('sandboxd_package_index_pages_total{result="%s"}' % r for r in ("hit", "miss"))
    daemon = fresh_daemon()
    with daemon.http() as c:
        # The daemon's cache is its own (tests/harness.py): the first install fetches the wheel.
        first = install(c, new_session(c), [SIX])
        # (its second pass had the page from the daemon's memory).
        assert metric(daemon, miss) >= 1 and metric(daemon, page_miss) >= 1
        hits, misses = metric(daemon, hit), metric(daemon, miss)
        page_hits, page_misses = metric(daemon, page_hit), metric(daemon, page_miss)
        second = install(c, new_session(c), [SIX])
    assert second["installed"] == [{"name": "six", "version": "1.16.0"}]
    # six 1.16.0's wheel is 11 053 bytes: every fetch of it was answered from the
    # cache (uv may read it more than once: its metadata, then the whole file).
    assert metric(daemon, miss) == misses, "the second install fetched a file from the index"
    assert metric(daemon, hit) > hits
    # The project's page too: from the daemon's memory, the index not asked.
    assert metric(daemon, page_miss) == page_misses, "the second install asked the index for a page"
    assert metric(daemon, page_hit) > page_hits
    assert second["net"]["cached_bytes"] > 11053, second["net"]
    assert second["net"]["bytes_in"] - second["net"]["cached_bytes"] < first["net"]["bytes_in"]


PLAIN_WAY = r"""
import hashlib, json, urllib.error, urllib.request
def get(url, accept="application/vnd.pypi.simple.v1+json"):
    return urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept}), timeout=60).read()
files = json.loads(get("http://pypi.org:443/simple/six/"))["files"]
wheel = next(f for f in files if f["filename"] == "six-1.16.0-py2.py3-none-any.whl")
print(wheel["url"].split("/packages/")[0])
print(hashlib.sha256(get(wheel["url"], "*/*")).hexdigest() == wheel["hashes"]["sha256"])
html = get("http://pypi.org:443/simple/six/", "text/html").decode()
print(html.count('href="http://files.pythonhosted.org:443/packages/') > 10, "https://files.pythonhosted.org" in html)
for url in ("http://files.pythonhosted.org:8443/packages/", "http://pypi.org:66979/simple/"):
    try:
        get(url)
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode().strip())
"""


def test_the_package_hosts_are_reached_in_plain_http_that_the_proxy_carries_over_tls(daemon):
    """How the installer reaches the index without starting TLS (egress/plain.rs):
    a plain request that names a package host's TLS port goes there over TLS, and
    the index page's links to the package hosts come back in that plain form;
    another port is not a package host's and is checked as ever."""
    with daemon.http() as c:
        sid = new_session(c)
        r = run(c, sid, PLAIN_WAY)
    assert r["status"] == "ok", r
    lines = r["stdout"].splitlines()
    assert lines[:3] == ["http://files.pythonhosted.org:443", "True", "True False"], r
    assert lines[3].startswith("403 port_not_allowed: "), r
    # A port that is none is not port 80.
    assert lines[4] == "400 bad_request: 66979 is not a port (1 to 65535)", r
    hosts = r["usage"]["net"]["hosts"]
    assert "pypi.org:443" in hosts and "files.pythonhosted.org:443" in hosts, r["usage"]["net"]


# patsy 1.0.1 needs numpy, which the rootfs holds: the install is patsy alone.
PATSY = "patsy==1.0.1"
LAYER_SITE = "/opt/packages/current/lib/python3.11/site-packages"


def test_what_the_rootfs_holds_is_not_installed_again_and_the_layer_holds_only_the_install(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        result = install(c, sid, [PATSY, "seaborn"])
        # numpy (patsy's dependency) and seaborn are the rootfs's: not installed, not replaced.
        assert result["installed"] == [{"name": "patsy", "version": "1.0.1"}], result
        assert result["unchanged"] == ["seaborn"], result
        # Compiled at install, by the installer itself: runs write no bytecode
        # (PYTHONDONTWRITEBYTECODE), so a package left uncompiled would be compiled
        # at every run's import.
        pycache = f"import os; print(os.path.isdir({LAYER_SITE!r} + '/patsy/__pycache__'))"
        assert run(c, sid, pycache)["stdout"] == "True\n"
        out = run(c, sid, "import os, numpy, patsy, seaborn\n"
                          "print(numpy.__file__)\nprint(patsy.__file__)\nprint(seaborn.__file__)\n"
                          f"print(sorted(os.listdir({LAYER_SITE!r})))\n"
                          f"print(sorted(os.listdir('/opt/packages/current')))\n"
                          f"print(sorted(os.listdir({LAYER_SITE!r} + '/patsy/__pycache__'))[:1])")
        assert out["status"] == "ok", out
        numpy_file, patsy_file, seaborn_file, site, top, pycache = out["stdout"].splitlines()
        assert numpy_file.startswith("/opt/py/") and seaborn_file.startswith("/opt/py/"), out["stdout"]
        assert patsy_file.startswith(LAYER_SITE + "/patsy/"), out["stdout"]
        # No stand-in of the rootfs's packages, no lock of uv's: only what was installed.
        assert eval(site) == ["patsy", "patsy-1.0.1.dist-info"], site
        assert eval(top) == ["bin", "lib"] or eval(top) == ["lib"], top
        assert eval(pycache)[0].endswith(".cpython-311.pyc"), pycache
        # A second install next to it keeps it, and sees numpy as installed still.
        again = install(c, sid, [TABULATE])
        assert again["installed"] == [{"name": "tabulate", "version": "0.9.0"}], again
        both = run(c, sid, "import patsy, tabulate; print(patsy.__version__, tabulate.__version__)")
        assert both["stdout"] == "1.0.1 0.9.0\n", both
        # An install with nothing to do leaves nothing beside the layer either.
        assert install(c, sid, ["seaborn"])["installed"] == []
        left = run(c, sid, "import os; print(sorted(os.listdir('/opt/packages')))")
        assert left["stdout"] == "['current']\n", left


PTH_EXIT = "import os; os._exit(3)\n"


def test_uvs_record_of_the_interpreter_is_made_once_without_any_sessions_layer(fresh_daemon):
    """The daemon asks uv about the rootfs's Python once, in a sandbox of its own, and
    gives the record to every install: a session's layer, which its code writes, is
    not in that sandbox. Here the first install is in a session whose layer holds a
    .pth file that kills any Python that reads it: the record is made all the same,
    that session's own install dies of its .pth, and another session's installs work."""
    daemon = fresh_daemon()
    with daemon.http() as c:
        tainted = new_session(c)
        planted = c.post(f"/v1/sessions/{tainted}/runs", json={
            "language": "shell",
            "code": f"mkdir -p {LAYER_SITE} && printf '{PTH_EXIT}' > {LAYER_SITE}/00-exit.pth && echo planted"}).json()
        assert planted["stdout"] == "planted\n", planted
        r = install(c, tainted, [SIX], expect=422)
        assert r["error"]["message"].startswith("installing six==1.16.0 failed"), r
        log = daemon.log_text()
        assert log.count("uv's record of the rootfs's Python made") == 1, log[-3000:]
        assert "could not be made" not in log
        for _ in range(2):
            sid = new_session(c)
            assert install(c, sid, [SIX])["installed"] == [{"name": "six", "version": "1.16.0"}]
        log = daemon.log_text()
        assert log.count("uv's record of the rootfs's Python made") == 1, "the record was made more than once"
        assert log.count("run_id=uv-probe-") >= 1 and len(set(
            l.split("run_id=uv-probe-")[1].split()[0] for l in log.splitlines() if "run_id=uv-probe-" in l)) == 1


@pytest.mark.parametrize("packages,words", [
    (["sandboxd-no-such-package-" + "x" * 8], "sandboxd-no-such-package-xxxxxxxx"),
    (["tabulate==0.0.0"], "tabulate"),
    (["numpy==1.26.4"], "numpy"),
    (["tabulate==0.9.0", "tabulate==0.8.10"], "tabulate"),
])
def test_what_cannot_be_installed_is_a_structured_error_and_changes_nothing(daemon, packages, words):
    with daemon.http() as c:
        sid = new_session(c)
        install(c, sid, [SIX])
        r = install(c, sid, packages, expect=422)
        assert error_code_of(r) == "package_install_failed"
        message = r["error"]["message"]
        assert message.startswith(f"installing {' '.join(packages)} failed:") and words in message, message
        # uv asked the index in plain HTTP (egress/plain.rs); its words name it as the policy does.
        assert "pypi.org:443" not in message, message
        # The layer is as it was: six is there, nothing else is.
        assert run(c, sid, "import six; print(six.__version__)")["stdout"] == "1.16.0\n"
        assert run(c, sid, "import tabulate")["status"] == "error"


def error_code_of(body):
    return body.get("error", {}).get("code")


def test_requests_that_are_not_requirements_are_refused_before_anything_runs(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        for bad in (["--index-url=https://evil.example/simple"], ["requests @ https://evil.example/r.whl"], [], ["a;b"]):
            r = c.post(f"/v1/sessions/{sid}/packages", json={"packages": bad})
            assert (r.status_code, error_code(r)) == (400, "invalid_request"), r.text
        strict = new_session(c, policy="strict")
        r = c.post(f"/v1/sessions/{strict}/packages", json={"packages": [SIX]})
        assert (r.status_code, error_code(r)) == (400, "invalid_request")
        assert 'policy "strict" installs no packages (network = "none")' in r.json()["error"]["message"]
        r = c.post("/v1/runs", json={"code": "print(1)", "policy": "strict", "packages": [SIX]})
        assert (r.status_code, error_code(r)) == (400, "invalid_request")


def test_a_runs_packages_are_installed_before_its_code(daemon):
    with daemon.http() as c:
        r = c.post("/v1/runs", json={"code": "import six; print(six.__version__)", "packages": [SIX]}, timeout=300)
        assert r.status_code == 200 and r.json()["stdout"] == "1.16.0\n", r.text
        # The install's network use is in the run's: the index, and the file (or the cache).
        net = r.json()["usage"]["net"]
        assert net["hosts"][0] == "pypi.org:443" and "files.pythonhosted.org:443" in net["hosts"], net
        assert net["connections"] >= 2 and net["bytes_in"] > 10000, net
        sessions = {s["id"] for s in c.get("/v1/sessions").json()}
        bad = c.post("/v1/runs", json={"code": "print(1)", "packages": ["tabulate==0.0.0"]}, timeout=300)
        assert (bad.status_code, error_code(bad)) == (422, "package_install_failed")
        # The session made for the run is named nowhere in the error: it is gone, not left to its TTL.
        assert {s["id"] for s in c.get("/v1/sessions").json()} == sessions


QUOTA_POLICY = """
description = "A small package layer and a short install limit."
packages_mb = 16
install_timeout_s = 20
"""


def test_a_package_over_the_quota_or_the_time_limit_fails_and_leaves_the_layer_as_it_was(fresh_daemon):
    d = fresh_daemon(policies={"small": QUOTA_POLICY, "quick": "install_timeout_s = 1\n"})
    with d.http() as c:
        sid = new_session(c, policy="small")
        install(c, sid, [SIX])
        # sympy unpacks to ~60 MiB: it cannot fit 16 MiB.
        r = install(c, sid, ["sympy==1.13.3"], expect=422)
        assert "the session's package layer is full (packages_mb = 16)" in r["error"]["message"], r
        assert run(c, sid, "import six; print(six.__version__)")["stdout"] == "1.16.0\n"
        assert run(c, sid, "import sympy")["status"] == "error"
        quick = new_session(c, policy="quick")
        r = install(c, quick, ["sympy==1.13.3"], expect=422)
        assert "it took longer than the policy's install_timeout_s (1 s); the layer is as it was" in r["error"]["message"]
        assert run(c, quick, "import sympy")["status"] == "error"


# docopt 0.6.2 is published as a source distribution only.
DOCOPT = "docopt==0.6.2"


def test_a_package_without_a_wheel_is_refused_by_name_unless_the_policy_builds_from_source(fresh_daemon):
    d = fresh_daemon(policies={"builds": "source_builds = true\ninstall_timeout_s = 240\n"})
    with d.http() as c:
        sid = new_session(c)
        r = install(c, sid, [DOCOPT], expect=422)
        message = r["error"]["message"]
        assert message.startswith(f"installing {DOCOPT} failed:") and "docopt" in message, message
        assert "docopt==0.6.2 has no usable wheels" in message, message
        assert message.endswith("nothing was installed, the session's packages are as they were"), message
        assert run(c, sid, "import docopt")["status"] == "error"
        # A policy that builds from source: the build runs in the session's sandbox.
        builds = new_session(c, policy="builds")
        install(c, builds, [DOCOPT])
        out = run(c, builds, "import docopt; print(docopt.__version__)")
        assert out["stdout"] == "0.6.2\n", out


def test_sandboxctl_pip_install(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    p = subprocess.run([str(CTL), "--socket", str(daemon.socket), "pip", "install", "--session", sid, SIX],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "Successfully installed six-1.16.0\n"
    assert re.search(r"the session's package layer holds \d+ KiB of 64 MiB; \d+ ms", p.stderr), p.stderr
    p = subprocess.run([str(CTL), "--socket", str(daemon.socket), "pip", "install", "--session", sid, "six==0.0.0"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "package_install_failed" in p.stderr, p.stderr
    # From a requirements file (here on stdin), as pip reads one.
    p = subprocess.run([str(CTL), "--socket", str(daemon.socket), "pip", "install", "--session", sid, "-r", "-"],
                       input=f"# what the code needs\n{SIX}  # pinned\n\n", capture_output=True, text=True, timeout=300)
    assert (p.returncode, p.stdout) == (0, "Nothing to install: six already satisfied.\n"), p
    # A pip option in it is refused before anything is asked of the daemon.
    p = subprocess.run([str(CTL), "--socket", str(daemon.socket), "pip", "install", "--session", sid, "-r", "-"],
                       input="six\n--index-url https://example.org/simple\n", capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and p.stdout == "", p
    assert "- line 2: pip option --index-url is not supported" in p.stderr, p.stderr
