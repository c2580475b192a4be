"""Takes the console's screenshots in docs/ (run as root from the repo after `make
test` set up its venv): target/test-venv/bin/python docs/screenshots.py

A daemon of the test harness, Debian's headless Chromium, one session with a plot,
and a chat with the tests' scripted stand-in LLM (tests/llm_standin.py)."""

import sys
import time
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent / "tests"))
import json  # noqa: E402

from harness import Daemon, scratch_dir  # noqa: E402
from llm_standin import StandIn  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

llm = StandIn(model="qwen2.5-coder-7b-instruct")
d = Daemon(scratch_dir("shots-"), args=["--llm-url", llm.url]).start()
opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,900", "--hide-scrollbars"):
    opts.add_argument(a)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
try:
    with d.http() as c:
        sid = c.post("/v1/sessions", json={"id": "analysis"}).json()["id"]
        c.put(f"/v1/sessions/{sid}/files/sales.csv", content=b"month,amount\njan,10\nfeb,14\nmar,9\napr,21\n")
        c.post("/v1/sessions", json={"id": "scratch", "mode": "kernel"})
    driver.get(d.url + f"/#/s/{sid}")
    wait = WebDriverWait(driver, 60)
    wait.until(lambda dr: dr.find_elements(By.CSS_SELECTOR, "#code"))
    editor = driver.find_element(By.CSS_SELECTOR, "#code")
    editor.send_keys("import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.describe())\n"
                     "ax = df.plot.bar(x='month', y='amount', title='Sales')\n")
    driver.find_element(By.CSS_SELECTOR, "#run").click()
    wait.until(lambda dr: dr.execute_script(
        "const i = document.querySelector('#figures img'); return i && i.complete && i.naturalWidth > 0"))
    time.sleep(0.5)
    driver.save_screenshot(str(here / "console-session.png"))
    driver.get(d.url + "/#/")
    driver.refresh()
    wait.until(lambda dr: dr.find_elements(By.CSS_SELECTOR, "tr[data-session]"))
    driver.save_screenshot(str(here / "console-sessions.png"))
    code = ("import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.read_csv('sales.csv')\n"
            "print(df['amount'].agg(['sum', 'mean', 'max']))\n"
            "df.plot.line(x='month', y='amount', marker='o', title='Monthly sales')\n")
    llm.answer(("call", "run_python", json.dumps({"code": code})),
               ("text", "Sales total 54 over four months, 13.5 a month on average. April is the best month (21), "
                        "March the weakest (9): the line shows the dip in March and the jump after it."))
    driver.get(d.url + f"/#/chat/{sid}")
    driver.refresh()
    wait.until(lambda dr: dr.find_elements(By.CSS_SELECTOR, "#chat-input"))
    box = driver.find_element(By.CSS_SELECTOR, "#chat-input")
    box.send_keys("How did sales go? Plot them by month.")
    driver.find_element(By.CSS_SELECTOR, "#chat-send").click()
    wait.until(lambda dr: dr.execute_script(
        "const i = document.querySelector('#chat-log img.figure'); return i && i.complete && i.naturalWidth > 0"))
    wait.until(lambda dr: dr.find_element(By.CSS_SELECTOR, "#chat-send").get_attribute("disabled") is None)
    time.sleep(0.5)
    driver.save_screenshot(str(here / "console-chat.png"))
finally:
    driver.quit()
    d.stop()
    llm.close()
