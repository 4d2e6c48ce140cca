"""The chat page in a real headless Chromium (Debian's chromium and chromium-driver).

``make test`` installs both when missing (the ``chromium`` target). The test
types a question, sees the answer grow, presses Stop, reloads and finds the
partial answer in the history; it saves a screenshot in ``tests/artifacts/``.
A page of another site (a second loopback port, or a name made to point at
the loopback) tries to drive the served agent, and the browser sees it refused.
"""

from __future__ import annotations

import functools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

pytestmark = pytest.mark.slow
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
REBOUND = "rebound.example"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.fail("chromium and chromium-driver are not installed: run `make chromium`")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=900,700"):
        options.add_argument(flag)
    # A name of another site that points at the loopback (what a DNS-rebinding page does).
    options.add_argument(f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # what it received
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def wait_until(check: Callable[[], Any], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("the page did not get there in time")
        time.sleep(0.05)


def answers(browser: webdriver.Chrome) -> list[str]:
    return [e.text.strip() for e in browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")]


def test_the_page_streams_stops_and_shows_the_partial_answer_after_a_reload(
    browser: webdriver.Chrome,
) -> None:
    with ServedAgent(delay=0.03) as server:
        browser.get(f"{server.url}/")
        assert "word-agent" in browser.title
        browser.find_element(By.ID, "input").send_keys("long")
        browser.find_element(By.ID, "send").click()
        # The answer grows as it streams.
        first = wait_until(lambda: len(answers(browser)) == 1 and len(answers(browser)[0]) > 10)
        grown = wait_until(lambda: len(answers(browser)[0].split()) >= 15 and answers(browser))
        assert first
        assert len(grown[0]) > 10
        browser.find_element(By.ID, "stop").click()
        stopped = wait_until(lambda: "(stopped)" in answers(browser)[0] and answers(browser))[0]
        shown = stopped.replace("(stopped)", "").split()
        time.sleep(0.5)  # the page no longer grows: the stream is closed
        assert answers(browser)[0].replace("(stopped)", "").split() == shown
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "serve_page_stopped.png"))
        browser.refresh()
        history = wait_until(lambda: answers(browser))
        stored = history[0].split()
        # The partial answer, as far as the server had sent it: what the page showed, then
        # at most the few words in flight when Stop was pressed; never the whole answer.
        assert stored[: len(shown)] == shown
        assert len(stored) < 200
        users = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".msg.user")]
        assert users == ["long"]
        # The conversation goes on in the same session, with the partial answer in it.
        browser.find_element(By.ID, "input").send_keys("and then")
        browser.find_element(By.ID, "send").click()
        try:
            wait_until(lambda: len(answers(browser)) == 2 and answers(browser)[1].endswith("then"))
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            browser.save_screenshot(str(ARTIFACTS / "serve_page.png"))
        assert answers(browser)[1] == "seen 3: and then"


def test_the_page_approves_and_denies_a_waiting_call_across_reloads(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    deleted = tmp_path / "deleted.log"  # the server process adds a line each time delete runs

    def runs() -> list[str]:
        return deleted.read_text().split() if deleted.exists() else []

    def buttons(name: str) -> list[Any]:
        return browser.find_elements(By.CSS_SELECTOR, f".msg.tool button.{name}")

    with ServedAgent(deleted=str(deleted)) as server:
        browser.get(f"{server.url}/")
        browser.find_element(By.ID, "input").send_keys("please delete my notes")
        browser.find_element(By.ID, "send").click()
        (approve,) = wait_until(lambda: buttons("approve"))
        row = browser.find_element(By.CSS_SELECTOR, ".msg.tool.waiting")
        assert 'delete({"path": "notes.txt"})' in row.text
        assert runs() == []
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "serve_page_pending.png"))
        approve.click()
        wait_until(lambda: answers(browser) == ["the tool said deleted notes.txt"])
        assert runs() == ["notes.txt"]
        assert buttons("approve") == []
        row = browser.find_element(By.CSS_SELECTOR, ".msg.tool")
        assert "(approved)" in row.text
        assert "→ deleted notes.txt" in row.text
        # After a reload the history is whole: the question, the call and its result, the answer.
        browser.refresh()
        wait_until(lambda: answers(browser))
        users = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".msg.user")]
        assert users == ["please delete my notes"]
        tools = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".msg.tool")]
        assert len(tools) == 1
        assert "→ deleted notes.txt" in tools[0]
        assert answers(browser) == ["the tool said deleted notes.txt"]
        assert buttons("approve") == []
        # A second call waits; the page is reloaded before anyone decides: the buttons are back.
        browser.find_element(By.ID, "input").send_keys("delete them again")
        browser.find_element(By.ID, "send").click()
        wait_until(lambda: buttons("deny"))
        browser.refresh()
        (deny,) = wait_until(lambda: buttons("deny"))
        browser.find_element(By.CSS_SELECTOR, ".msg.tool.waiting input.reason").send_keys(
            "keep them"
        )
        deny.click()
        wait_until(lambda: len(answers(browser)) == 2)
        assert answers(browser)[1].startswith("the tool said The user did not approve this call")
        assert "keep them" in answers(browser)[1]
        assert runs() == ["notes.txt"]  # the approved call ran once; the denied one never
        browser.refresh()
        wait_until(lambda: len(answers(browser)) == 2)
        tools = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".msg.tool")]
        assert len(tools) == 2
        assert "did not approve" in tools[1]
        assert buttons("approve") == []
        assert buttons("deny") == []
        browser.save_screenshot(str(ARTIFACTS / "serve_page_approvals.png"))


@pytest.fixture
def other_site(tmp_path: Path) -> Iterator[str]:
    """The address of a page of another origin: a static page on a second loopback port."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<html><body>another site</body></html>")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path / "site"))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as site:
        thread = threading.Thread(target=site.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{site.server_address[1]}/"
        finally:
            site.shutdown()
            thread.join()


#: A page's script: a run of the agent over AG-UI (``arguments[1]``, a RunAgentInput), sent
#: as ``arguments[2]`` says; it gives back what the page could read of the reply.
DRIVE = """
const [url, run, kind, done] = arguments;
const body = JSON.stringify(run);
const asks = {
  // No preflight: a "simple" request, sent at once; the page cannot read the reply.
  plain: {method: 'POST', mode: 'no-cors', headers: {'content-type': 'text/plain'}, body},
  // JSON from another origin: the browser asks first (a CORS preflight).
  json: {method: 'POST', headers: {'content-type': 'application/json'}, body},
};
fetch(url + '/ag-ui', asks[kind]).then(
  (r) => r.text().then((text) => done({status: r.status, text})),
  (e) => done({error: String(e)}));
"""


def run_input(thread: str) -> dict[str, Any]:
    question = {"id": "u1", "role": "user", "content": "please delete my notes"}
    return {"threadId": thread, "runId": "r1", "state": None, "messages": [question],
            "tools": [], "context": [], "forwardedProps": None}  # fmt: skip


def received(browser: webdriver.Chrome, url: str) -> list[tuple[str, int]]:
    """What the browser received for ``url``: (the request's kind, the status) each."""
    got = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.responseReceived":
            params = message["params"]
            if params["response"]["url"] == url:
                got.append((params["type"], params["response"]["status"]))
    return got


def held(server: ServedAgent, thread: str) -> list[Any]:
    reply = httpx.get(f"{server.url}/v1/sessions/{thread}/messages", verify=TLS)
    data: list[Any] = reply.json()["data"]
    return data


def test_a_page_of_another_origin_cannot_drive_the_agent(
    browser: webdriver.Chrome, other_site: str
) -> None:
    with ServedAgent() as server:
        browser.get(other_site)
        plain = browser.execute_async_script(DRIVE, server.url, run_input("from-plain"), "plain")
        json_ = browser.execute_async_script(DRIVE, server.url, run_input("from-json"), "json")
        assert plain == {"status": 0, "text": ""}  # opaque: sent, its reply hidden from the page
        assert json_["error"].startswith("TypeError")  # the preflight was refused
        # The browser saw both refused: the simple POST, and the preflight (the POST behind
        # it was never sent).
        assert received(browser, f"{server.url}/ag-ui") == [("Fetch", 403), ("Preflight", 403)]
        assert held(server, "from-plain") == held(server, "from-json") == []
        # The same run, asked by no page (curl, an SDK), goes through: the refusal is the page's.
        assert (
            httpx.post(f"{server.url}/ag-ui", json=run_input("direct"), verify=TLS).status_code
            == 200
        )
        assert [m["role"] for m in held(server, "direct")] == ["user", "assistant"]


def test_a_dns_rebinding_page_gets_a_refusal_it_can_read(browser: webdriver.Chrome) -> None:
    with ServedAgent() as server:
        # The page's own name now points at the loopback: to the browser, the server is of
        # the page's origin, so it may read every reply, and sees the refusal.
        rebound = f"http://{REBOUND}:{server.port}"
        browser.get(f"{rebound}/")
        assert "host_not_allowed" in browser.find_element(By.TAG_NAME, "body").text
        reply = browser.execute_async_script(DRIVE, rebound, run_input("rebound"), "json")
        assert reply["status"] == 400
        assert json.loads(reply["text"])["error"]["code"] == "host_not_allowed"
        assert held(server, "rebound") == []
