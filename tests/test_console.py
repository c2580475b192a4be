"""The web console (GET / on the HTTP listener), driven in a real browser: Debian's
headless Chromium through Selenium and Debian's chromedriver (installed by
packaging/host-tools.sh --test), against a real daemon.

What a person does (create a session, run a plot and see it, watch output stream,
upload a CSV and use it, download a figure, keep a kernel's variable, read the
history after a restart), what a run must not do to the page (markup, scripts and
handlers in output, file names, figures and a kernel's HTML run nothing), and what
a token sees."""

import base64
import hashlib
import shutil
import time
from pathlib import Path

import pytest

from conftest import new_session, require
from harness import scratch_dir

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

# A page-wide flag every XSS probe below tries to set; the page never sets it.
PROBE = "window.__pwned"


@pytest.fixture(scope="module")
def downloads():
    d = scratch_dir("console-downloads-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(downloads):
    require(Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(),
            "Debian's chromium and chromium-driver (packaging/host-tools.sh --test)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000", f"--user-data-dir={scratch_dir('console-profile-')}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def wait(driver, cond, timeout=30, what="the page"):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: cond(d))
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}; page text:\n{driver.find_element(By.TAG_NAME, 'body').text[:3000]}")


def find(driver, css):
    return driver.find_element(By.CSS_SELECTOR, css)


def open_console(driver, daemon, fragment="#/"):
    driver.get(daemon.url + "/" + fragment)
    driver.refresh()  # a new fragment alone does not load the page again
    wait(driver, lambda d: "Loading" not in find(d, "main").text, what="the console to load")


def run_cell(driver, code, timeout=60):
    editor = find(driver, "#code")
    editor.clear()
    editor.send_keys(code)
    editor.send_keys(Keys.CONTROL, Keys.ENTER)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#status-badge"), timeout, "the run's result")
    return find(driver, "#status-badge").text


def csp_violations(driver):
    return [e for e in driver.get_log("browser") if "Content Security Policy" in e.get("message", "")]


def test_the_console_is_served_with_a_strict_policy_on_http_only(daemon):
    with daemon.http() as c:
        page = c.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        csp = page.headers["content-security-policy"]
        # One script runs: console.js, by its hash (the page's tag carries it as `integrity`).
        assert "script-src 'sha256-" in csp and "unsafe" not in csp and "frame-ancestors 'none'" in csp
        digest = csp.split("script-src '")[1].split("'")[0]
        assert f'integrity="{digest}"' in page.text
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["x-frame-options"] == "DENY"
        for asset, kind in (("/console/console.js", "text/javascript"), ("/console/console.css", "text/css")):
            r = c.get(asset)
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
            assert r.headers["content-security-policy"] == csp
            if asset.endswith(".js"):
                want = "sha256-" + base64.b64encode(hashlib.sha256(r.content).digest()).decode()
                assert digest == want  # the hash is of the script served
        # The guard holds for the console too: a name the daemon does not serve (DNS
        # rebinding) is refused before any page.
        rebound = c.get("/", headers={"Host": "attacker.example"})
        assert rebound.status_code == 403
        assert c.get("/console/other.js").status_code == 404
    with daemon.uds() as u:
        assert u.get("/").status_code == 404  # no browser reaches the socket


def test_a_person_creates_a_session_runs_a_plot_and_sees_it(browser, daemon):
    open_console(browser, daemon)
    find(browser, "#create-session").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#code"), what="the session page")
    sid = find(browser, "#session-id").text
    with daemon.http() as c:
        assert c.get(f"/v1/sessions/{sid}").status_code == 200
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('console')\nprint('plotted')"
    assert run_cell(browser, code) == "ok"
    assert "plotted" in find(browser, "#output").text
    img = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#figures img"), what="the figure")[0]
    wait(browser, lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100,
         what="the figure to decode")
    assert img.get_attribute("src").startswith("blob:")
    # The run is in the history, and the session in the list, with the disk its
    # workspace now takes.
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#history details.run"), what="the history")
    open_console(browser, daemon)
    assert find(browser, f'tr[data-session="{sid}"]')
    disk = find(browser, f'tr[data-session="{sid}"] td.disk').text
    assert disk.endswith(("KiB", "MiB")) and not disk.startswith("0 "), disk
    assert csp_violations(browser) == []


def test_output_streams_line_by_line_while_the_run_goes_on(browser, daemon):
    with daemon.http() as c:
        sid = new_session(c)
    open_console(browser, daemon, f"#/s/{sid}")
    editor = find(browser, "#code")
    editor.send_keys("import time\nfor i in range(4):\n    print('line', i, flush=True)\n    time.sleep(0.7)\n")
    find(browser, "#run").click()
    wait(browser, lambda d: "line 0" in find(d, "#output").text, what="the first line")
    # The first line is on the page while the run is still going: not one answer at the end.
    assert "line 3" not in find(browser, "#output").text
    assert find(browser, "#run").get_attribute("disabled") is not None
    wait(browser, lambda d: "line 1" in find(d, "#output").text and "line 3" not in find(d, "#output").text,
         what="the second line before the last")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#status-badge"), what="the result")
    assert find(browser, "#output").text.splitlines() == [f"line {i}" for i in range(4)]


def test_an_uploaded_csv_is_previewed_and_used_and_a_figure_is_downloaded(browser, daemon, downloads):
    with daemon.http() as c:
        sid = new_session(c)
    src = scratch_dir("console-upload-") / "sales.csv"
    src.write_text("month,amount\njan,10\n\"feb, \"\"late\"\"\",20\nmar,30\n")
    open_console(browser, daemon, f"#/s/{sid}")
    find(browser, "#upload-input").send_keys(str(src))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'li[data-path="sales.csv"]'), what="the uploaded file")
    with daemon.http() as c:
        assert c.get(f"/v1/sessions/{sid}/files/sales.csv").content == src.read_bytes()
    find(browser, 'li[data-path="sales.csv"] .file-name').click()
    cells = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#preview table.csv td"), what="the CSV preview")
    assert [c.text for c in cells[:6]] == ["jan", "10", 'feb, "late"', "20", "mar", "30"]
    code = ("import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(len(df))\n"
            "ax = df.plot(x='month', y='amount')\nax.figure.savefig('sales.png')")
    assert run_cell(browser, code) == "ok"
    assert find(browser, "#output").text.strip() == "3"
    row = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'li[data-path="sales.png"]'), what="the figure's file")[0]
    row.find_element(By.CSS_SELECTOR, ".download").click()
    with daemon.http() as c:
        want = c.get(f"/v1/sessions/{sid}/files/sales.png").content
    saved = Path(downloads) / "sales.png"
    wait(browser, lambda d: saved.exists() and saved.read_bytes() == want, what="the downloaded figure")


def test_a_kernel_session_keeps_a_variable_and_shows_its_result(browser, daemon):
    open_console(browser, daemon)
    browser.find_element(By.CSS_SELECTOR, "#new-mode option[value=kernel]").click()
    find(browser, "#create-session").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#code"), what="the session page")
    assert run_cell(browser, "x = 41") == "ok"
    assert run_cell(browser, "x + 1") == "ok"
    assert find(browser, "#result .kernel-result").text == "42"
    assert run_cell(browser, "1 / 0") == "error"
    assert "ZeroDivisionError" in find(browser, "#result .exception").text


XSS_OUTPUT = ("print('<script>" + PROBE + "=1</script><img src=x onerror=\"" + PROBE + "=2\">')\n"
              "import sys; print('<svg onload=\"" + PROBE + "=3\">', file=sys.stderr)\n")
XSS_FILES = (
    "open('<img src=x onerror=" + PROBE.replace("window.", "") + "=4>.txt', 'w').write('<script>" + PROBE + "=5</script>')\n"
    "svg = '<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"40\" height=\"40\" onload=\"" + PROBE + "=6\">'"
    " + '<script>" + PROBE + "=7</script><rect width=\"40\" height=\"40\"/></svg>'\n"
    "open('evil.svg', 'w').write(svg)\n"
    "open('page.html', 'w').write('<script>" + PROBE + "=8</script>')\n"
)


def test_nothing_a_run_writes_runs_in_the_page(browser, daemon):
    with daemon.http() as c:
        sid = new_session(c)
    open_console(browser, daemon, f"#/s/{sid}")
    assert run_cell(browser, XSS_OUTPUT + XSS_FILES) == "ok"
    out = find(browser, "#output").text
    assert "<script>window.__pwned=1</script>" in out and '<svg onload="window.__pwned=3">' in out  # shown as text
    files = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "ul.files li.file"), what="the files")
    names = {li.get_attribute("data-path") for li in files}
    assert "<img src=x onerror=__pwned=4>.txt" in names and "evil.svg" in names
    # Preview each: the text file as text, the SVG as an image (its scripts do not run).
    for name in ("<img src=x onerror=__pwned=4>.txt", "evil.svg", "page.html"):
        li = next(li for li in find_all(browser, "ul.files li.file") if li.get_attribute("data-path") == name)
        li.find_element(By.CSS_SELECTOR, ".file-name").click()
        wait(browser, lambda d: name in find(d, "#preview h3").text and len(find(d, "#preview").text) > len(name)
             or d.find_elements(By.CSS_SELECTOR, "#preview img"), what=f"the preview of {name}")
        time.sleep(0.3)
    assert "<script>window.__pwned=8</script>" in find(browser, "#preview").text
    # The SVG was shown from a data: URL (an opaque origin if opened as a page), never
    # from a blob: URL, which would be of the console's origin.
    evil = next(li for li in find_all(browser, "ul.files li.file") if li.get_attribute("data-path") == "evil.svg")
    evil.find_element(By.CSS_SELECTOR, ".file-name").click()
    img = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#preview img"), what="the SVG preview")[0]
    assert img.get_attribute("src").startswith("data:image/svg+xml;base64,")
    assert browser.execute_script("return typeof " + PROBE) == "undefined"
    assert browser.find_elements(By.CSS_SELECTOR, "main script, main svg, main iframe:not([sandbox])") == []


def test_a_file_of_the_session_never_runs_as_the_consoles_script(browser, daemon):
    with daemon.http() as c:
        sid = new_session(c)
        assert c.put(f"/v1/sessions/{sid}/files/g.js", content=PROBE.encode() + b" = 11;").status_code in (200, 201)
        # A browser asking for it as a script or style sheet is refused; as a page or
        # a fetch it is served (with `CSP: sandbox`).
        for dest in ("script", "worker", "style"):
            r = c.get(f"/v1/sessions/{sid}/files/g.js", headers={"Sec-Fetch-Dest": dest})
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (dest, r.text)
        for dest in ("document", "empty"):
            assert c.get(f"/v1/sessions/{sid}/files/g.js", headers={"Sec-Fetch-Dest": dest}).status_code == 200
        csp = c.get("/").headers["content-security-policy"]
    assert "script-src 'sha256-" in csp and "'self'" not in csp.split("script-src")[1].split(";")[0]
    open_console(browser, daemon, f"#/s/{sid}")
    # Markup that got into the page (as if by a flaw) loading the session's file as
    # a script: the policy allows only console.js by its hash.
    browser.execute_script(f"const s = document.createElement('script'); s.src = '/v1/sessions/{sid}/files/g.js';"
                           "document.body.append(s);")
    time.sleep(1)
    assert browser.execute_script("return typeof " + PROBE) == "undefined"
    assert any("Content Security Policy" in e["message"] for e in browser.get_log("browser"))


def test_the_console_works_by_any_name_the_daemon_serves(browser, daemon):
    """Results and listings carry URLs of the daemon's public_url (here 127.0.0.1):
    a console opened as localhost still shows and deletes files, through its own origin."""
    with daemon.http() as c:
        sid = new_session(c)
    browser.get(f"http://localhost:{daemon.port}/#/s/{sid}")
    browser.refresh()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#code"), what="the session page")
    assert run_cell(browser, "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nopen('x.txt', 'w').write('x')") == "ok"
    img = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#figures img"), what="the figure")[0]
    wait(browser, lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100,
         what="the figure to decode")
    li = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'li[data-path="x.txt"]'), what="x.txt")[0]
    browser.execute_script("window.confirm = () => true")
    li.find_element(By.CSS_SELECTOR, ".delete").click()
    wait(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, 'li[data-path="x.txt"]'), what="x.txt deleted")
    with daemon.http() as c:
        assert c.get(f"/v1/sessions/{sid}/files/x.txt").status_code == 404


def test_a_large_workspace_and_a_wide_csv_are_shown_in_part(browser, daemon):
    with daemon.http() as c:
        sid = new_session(c)
        code = ("import os\nos.mkdir('many')\nfor i in range(620):\n    open(f'many/{i:04}', 'w').close()\n"
                "open('wide.csv', 'w').write(','.join(f'c{i}' for i in range(5000)) + '\\n' + ','.join('1' * 5000))")
        assert c.post(f"/v1/sessions/{sid}/runs", json={"code": code}).json()["status"] == "ok"
    open_console(browser, daemon, f"#/s/{sid}")
    wait(browser, lambda d: len(find_all(d, "ul.files li.file")) == 500, what="the first 500 files")
    # A tree: many/ is a directory whose files are named by their own names.
    assert find(browser, 'li.dir[data-dir="many"] summary').text == "many/"
    assert find(browser, 'li.dir[data-dir="many"] li[data-path="many/0007"] .file-name').text == "0007"
    find(browser, "#more-files").click()
    wait(browser, lambda d: len(find_all(d, "ul.files li.file")) == 621, what="all files")
    li = next(li for li in find_all(browser, "ul.files li.file") if li.get_attribute("data-path") == "wide.csv")
    li.find_element(By.CSS_SELECTOR, ".file-name").click()
    wait(browser, lambda d: find_all(d, "#preview table.csv th"), what="the CSV preview")
    assert len(find_all(browser, "#preview table.csv th")) == 50


def find_all(driver, css):
    return driver.find_elements(By.CSS_SELECTOR, css)


def test_a_kernels_html_result_is_shown_in_a_frame_that_runs_no_script(browser, daemon):
    open_console(browser, daemon)
    browser.find_element(By.CSS_SELECTOR, "#new-mode option[value=kernel]").click()
    find(browser, "#create-session").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#code"), what="the session page")
    code = ("import pandas as pd\n"
            "class Evil(pd.DataFrame):\n"
            "    def _repr_html_(self):\n"
            "        return '<table><tr><td id=cell>safe</td></tr></table><script>parent." + PROBE.replace("window.", "")
            + "=9;document.title=\"x\"</script><img src=x onerror=\"parent." + PROBE.replace("window.", "") + "=10\">'\n"
            "Evil({'a': [1]})")
    assert run_cell(browser, code) == "ok"
    frame = find(browser, "#result iframe")
    assert frame.get_attribute("sandbox") == ""
    browser.switch_to.frame(frame)
    try:
        assert find(browser, "#cell").text == "safe"  # the table is shown
        assert browser.execute_script("return document.title") != "x"
    finally:
        browser.switch_to.default_content()
    time.sleep(0.5)
    assert browser.execute_script("return typeof " + PROBE) == "undefined"


def test_the_history_survives_a_daemon_restart(browser, fresh_daemon):
    d = fresh_daemon()
    with d.http() as c:
        sid = new_session(c)
        assert c.post(f"/v1/sessions/{sid}/runs", json={"code": "print('before the restart')"}).json()["status"] == "ok"
    d.stop()
    d.start()
    open_console(browser, d, f"#/s/{sid}")
    run = wait(browser, lambda d_: d_.find_elements(By.CSS_SELECTOR, "#history details.run"), what="the history")[0]
    run.find_element(By.TAG_NAME, "summary").click()
    wait(browser, lambda d_: "before the restart" in run.text, what="the run's record")
    assert "print('before the restart')" in run.find_element(By.CSS_SELECTOR, "pre.code").text


def test_a_token_sees_only_its_own_sessions(browser, fresh_daemon):
    d = fresh_daemon(tokens=["token-a", "token-b"])
    with d.http(token="token-a") as a, d.http(token="token-b") as b:
        mine = new_session(a)
        theirs = new_session(b)
    browser.get(d.url + "/#/")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    # No token: the daemon answers 401 and the console asks for one.
    wait(browser, lambda d_: find(d_, "#token-dialog").get_attribute("open") is not None, what="the token dialog")
    find(browser, "#token-input").send_keys("token-a")
    find(browser, "#token-save").click()
    wait(browser, lambda d_: d_.find_elements(By.CSS_SELECTOR, f'tr[data-session="{mine}"]'), what="token A's session")
    assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-session="{theirs}"]') == []
    # Another session's page by its id: the daemon says it is not found for this token.
    browser.get(d.url + f"/#/s/{theirs}")
    browser.refresh()
    wait(browser, lambda d_: "session_not_found" in find(d_, "main").text, what="the refusal")
    browser.execute_script("sessionStorage.clear()")


def test_the_status_page_shows_health_the_pool_and_live_metrics(browser, daemon):
    open_console(browser, daemon, "#/status")
    wait(browser, lambda d: find(d, "#health-status").text in ("ok", "degraded"), what="health")
    assert "templates" in find(browser, "#health").text
    assert find_all(browser, "#check tr")
    wait(browser, lambda d: len(find_all(d, "#charts canvas")) == 5, what="the charts")
    # Each chart shows its figure once the first scrape is in; sessions is the
    # shared daemon's count, which the page reads from /metrics.
    with daemon.http() as c:
        sessions = len(c.get("/v1/sessions").json())
    wait(browser, lambda d: all(s.text != "–" for s in find_all(d, "#charts .chart span")), what="the first scrape")
    shown = {c.get_attribute("data-series"): c for c in find_all(browser, "#charts canvas")}
    assert set(shown) == {"runs per second", "sessions", "idle templates", "pool hits per second", "pool misses per second"}
    values = [s.text for s in find_all(browser, "#charts .chart span")]
    assert int(values[1]) >= 1 and sessions >= 1


# --- the chat page (#/chat), against a scripted stand-in LLM (tests/llm_standin.py) ---

@pytest.fixture(scope="module")
def chatd(fresh_daemon_module, llm):
    return fresh_daemon_module(args=["--llm-url", llm.url, "--llm-timeout-s", "5"])


CHAT_PLOT = "import matplotlib.pyplot as plt\nplt.plot([2, 7, 1])\nplt.title('from the chat')\nprint('drawn')"
# What a model might say, copying markup from a page it read: shown as text.
CHAT_XSS = "Done <img src=x onerror=\"" + PROBE + "=21\"><script>" + PROBE + "=22</script>"


def send_chat(driver, message):
    box = find(driver, "#chat-input")
    box.send_keys(message)
    box.send_keys(Keys.ENTER)


def test_the_chat_runs_the_models_tool_call_and_shows_its_figure(browser, chatd, llm):
    import json as _json
    with chatd.http() as c:
        sid = new_session(c)
    llm.answer(("call", "run_python", _json.dumps({"code": CHAT_PLOT})), ("text", CHAT_XSS))
    open_console(browser, chatd, f"#/chat/{sid}")
    assert find(browser, "#nav-chat").get_attribute("class") == "active"
    send_chat(browser, "Plot 2, 7, 1")
    img = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .tool-result img.figure"),
               60, "the tool result's figure")[0]
    wait(browser, lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100,
         what="the figure to decode")
    # The call's code as text, its result folded under its first line, the model's
    # words as it wrote them (markup included, as text).
    assert find(browser, "#chat-log .tool-call .tool-name").text == "run_python"
    assert find(browser, "#chat-log .tool-call pre.code").text == CHAT_PLOT
    assert find(browser, "#chat-log .tool-result summary").text.startswith("status: ok")
    wait(browser, lambda d: CHAT_XSS in [e.text for e in d.find_elements(By.CSS_SELECTOR, "#chat-log .msg.assistant")],
         what="the model's answer")
    assert find(browser, "#chat-log .msg.user").text == "Plot 2, 7, 1"
    assert find(browser, "#chat-model").text == "model stand-in"
    wait(browser, lambda d: find(d, "#chat-send").get_attribute("disabled") is None, what="the turn's end")
    assert browser.execute_script("return typeof " + PROBE) == "undefined"
    # The page's address names the conversation; it is listed, and opened again
    # from the daemon it shows the same steps, the figure included.
    cid = browser.current_url.rsplit("/", 1)[1]
    assert len(cid) == 32
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-list li.current a"), what="the conversation list")
    assert find(browser, "#chat-list li.current a").text == "Plot 2, 7, 1"
    open_console(browser, chatd, f"#/chat/{sid}/{cid}")
    img = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .tool-result img.figure"),
               what="the kept figure")[0]
    wait(browser, lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100,
         what="the kept figure to decode")
    shown = browser.find_elements(By.CSS_SELECTOR, "#chat-log .msg.assistant:not(.empty)")
    assert [e.text for e in shown] == [CHAT_XSS]
    assert browser.execute_script("return typeof " + PROBE) == "undefined"
    assert csp_violations(browser) == []
    # /chat is the page's chat view.
    browser.get(chatd.url + "/chat")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-session"), what="the chat's session picker")
    assert browser.current_url.endswith("/#/chat")


def test_the_chat_says_when_the_endpoint_is_down_and_stops_on_request(browser, chatd, llm):
    import json as _json
    with chatd.http() as c:
        sid = new_session(c)
    open_console(browser, chatd, f"#/chat/{sid}")
    llm.down()
    try:
        send_chat(browser, "hello?")
        alert = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .notice.error"),
                     what="the endpoint's failure")[0]
    finally:
        llm.up()
    assert alert.text.startswith("unavailable: cannot reach the model endpoint")
    wait(browser, lambda d: find(d, "#chat-send").get_attribute("disabled") is None, what="the turn's end")
    # A long tool call, stopped from the page.
    llm.answer(("call", "run_python", _json.dumps({"code": "import time\ntime.sleep(60)"})))
    send_chat(browser, "sleep a minute")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .tool-call.running"), what="the tool call")
    find(browser, "#chat-stop").click()
    wait(browser, lambda d: "Stopped." in [e.text for e in d.find_elements(By.CSS_SELECTOR, "#chat-log .notice")],
         20, "the stop")
    assert find(browser, "#chat-log .tool-result summary").text == f"error cancelled: the call in session {sid} was stopped"
    assert find(browser, "#chat-send").get_attribute("disabled") is None
    # A prompt-injected call naming another session, and malformed arguments: each
    # a failed result on the page (nothing ran), and the model goes on.
    with chatd.http() as c:
        other = new_session(c)
    llm.answer(("calls", [("read_file", _json.dumps({"session_id": other, "path": "secret.txt"})),
                          ("run_python", '{"code": ')]),
               ("text", "I cannot reach that session."))
    send_chat(browser, "read the other session's secret.txt")
    wait(browser, lambda d: "I cannot reach that session." in [e.text for e in d.find_elements(By.CSS_SELECTOR, "#chat-log .msg.assistant")],
         what="the model's answer after the refused calls")
    failed = [e.find_element(By.TAG_NAME, "summary").text for e in browser.find_elements(By.CSS_SELECTOR, "#chat-log .tool-result.failed")]
    assert failed[-2].startswith(f"error forbidden: this conversation is bound to session {sid}"), failed
    assert failed[-1].startswith("error invalid_request: the arguments are not JSON"), failed
    with chatd.http() as c:
        assert c.get(f"/v1/sessions/{other}/runs").json()["runs"] == []
        deadline = time.time() + 15
        while time.time() < deadline and c.get(f"/v1/sessions/{sid}").json()["busy"]:
            time.sleep(0.1)
        assert c.get(f"/v1/sessions/{sid}").json()["busy"] is False
