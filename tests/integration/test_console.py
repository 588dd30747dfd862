"""The web console (docs/admin.md) in a real browser against a real service: Debian's Chromium,
headless, driven through chromedriver by Selenium, the way an operator uses it.

The service runs in the test's event loop, so every blocking Selenium call runs in a worker
thread (``asyncio.to_thread``): the service keeps serving while the browser waits. Each page
is saved as a PNG under ``$CDC_TEST_ARTIFACTS/console/`` (default ``test-artifacts/``) for a
person to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from mariadb_cdc_client import CdcClient
from mariadb_cdc_client.format.names import table_ref
from tests.conftest import RunningService, Source, make_config, start_service
from tests.helpers import PASSWORD, USER, RawClient, until

pytestmark = [pytest.mark.mariadb, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("CDC_TEST_ARTIFACTS", "test-artifacts")) / "console"
ROWS = 1200  # shown as 1,200: the browser speaks en-US (--lang)
HOSTILE = '<b onmouseover=x>t&amp;"'  # a table name that is markup if it is not escaped
KICKED = b"ERR FORBIDDEN disconnected by an administrator\n"  # docs/admin.md
WAIT = 30.0  # seconds for anything the console shows to show up

# The rows of a table as the browser shows them, read in one go (a refresh may replace cells
# between two WebDriver calls).
ROWS_SCRIPT = """
return [...document.querySelectorAll(arguments[0] + ' tbody tr')].map(row => ({
  key: row.dataset.key, cells: [...row.cells].map(cell => cell.textContent)}));
"""


def chromium_or_skip() -> None:
    """Without Chromium the test skips, except under CI, where a missing browser is a
    failure (tests/run.sh installs it)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if not missing:
        return
    why = f"{' and '.join(missing)} missing (apt-get install chromium chromium-driver)"
    if os.environ.get("CI"):
        pytest.fail(f"the console's browser test needs {why}")
    pytest.skip(why)


def chrome(profile: Path) -> Any:
    """Headless Chromium as root in a container: no sandbox, nothing fetched from outside,
    and selenium-manager never asked for a driver (there is no internet)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--window-size=1366,900", "--lang=en-US",
                     f"--user-data-dir={profile}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors (CSP)
    return webdriver.Chrome(options=options,
                            service=Service(executable_path=CHROMEDRIVER))


class Console:
    """The console as a person sees it: blocking Selenium calls (run them in a thread)."""

    def __init__(self, driver: Any, url: str) -> None:
        self.driver = driver
        self.url = url

    def wait(self, condition: Callable[[Any], Any], what: str, timeout: float = WAIT) -> Any:
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        waiter = WebDriverWait(self.driver, timeout, poll_frequency=0.1,
                               ignored_exceptions=[StaleElementReferenceException])
        return waiter.until(condition, message=f"the console never showed {what}")

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def shown(self, css: str) -> bool:
        from selenium.webdriver.common.by import By

        found = self.driver.find_elements(By.CSS_SELECTOR, css)
        return bool(found) and found[0].is_displayed()

    def text(self, css: str) -> str:
        return str(self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            css) or "")

    def rows(self, table: str) -> list[dict[str, Any]]:
        return list(self.driver.execute_script(ROWS_SCRIPT, f"#{table}"))

    # -- what a person does --------------------------------------------------------------

    def open(self, url: str) -> None:
        self.driver.get(url)

    def enter_token(self, token: str) -> None:
        self.wait(lambda d: self.shown("#token-input"), "the token prompt")
        field = self.find("#token-input")
        field.clear()
        field.send_keys(token)
        self.find("#token-submit").click()

    def go(self, page: str) -> None:
        self.find(f'#tabs a[data-tab="{page}"]').click()
        self.wait(lambda d: self.shown(f"#page-{page}"), f"the {page} page")

    def button(self, table: str, key: str, action: str) -> Any:
        """An action's button in the row of ``key`` (found by its value: a table name is no
        safe part of a CSS selector)."""
        script = ("const row = [...document.querySelectorAll(`#${arguments[0]} tbody tr`)]"
                  "  .find(r => r.dataset.key === arguments[1]);"
                  "return row ? row.querySelector(`button[data-action='${arguments[2]}']`) : null;")
        return self.wait(lambda d: d.execute_script(script, table, key, action),
                         f"the {action} button of {key}")

    def act(self, button: Any, answer: str = "yes") -> str:
        """Click an action's button and answer its confirmation; the question asked."""
        button.click()
        self.wait(lambda d: self.shown("#confirm-yes"), "the confirmation")
        question = self.text("#confirm-text")
        self.find(f"#confirm-{answer}").click()
        self.wait(lambda d: not self.shown("#confirm"), "the confirmation closing")
        return question

    def message(self, kind: str, containing: str) -> str:
        css = f'#messages .message[data-kind="{kind}"]'

        def found(_: Any) -> str | None:
            texts = self.driver.execute_script(
                "return [...document.querySelectorAll(arguments[0])].map(m => m.textContent)",
                css)
            return next((t for t in texts if containing in t), None)

        return str(self.wait(found, f"a message saying {containing!r}"))

    def screenshot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        # let the tab's last refresh paint (no spinner, no half-built table)
        self.wait(lambda d: self.text("#status").startswith("updated"), "a finished refresh")
        assert self.driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))

    def errors(self) -> list[str]:
        """The browser console's errors (a script's, a CSP violation), but for the API's
        error answers the test provoked (the page shows those itself)."""
        return [entry["message"] for entry in self.driver.get_log("browser")
                if entry["level"] == "SEVERE" and "the server responded with a status of"
                not in entry["message"]]


# -- the service and its clients ------------------------------------------------------------


def write_token(directory: Path) -> tuple[str, str]:
    token = secrets.token_urlsafe(24)
    path = directory / "admin.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, str(path)


def fill(source: Source) -> tuple[str, str]:
    """Two tables: orders, and one whose name is markup; their protocol references."""
    db = source.database
    values = ", ".join(f"({i}, 'item {i}', {i % 7})" for i in range(1, ROWS + 1))
    source.execute(
        f"CREATE TABLE `{db}`.orders (id INT PRIMARY KEY, item VARCHAR(40), qty INT)",
        f"INSERT INTO `{db}`.orders VALUES {values}",
        f"CREATE TABLE `{db}`.`{HOSTILE}` (id INT PRIMARY KEY)",
        f"INSERT INTO `{db}`.`{HOSTILE}` VALUES (1), (2)")
    return table_ref(db, "orders"), table_ref(db, HOSTILE)


@contextlib.asynccontextmanager
async def console_service(tmp_path: Path, source: Source, users_file: str, token_file: str
                          ) -> AsyncIterator[RunningService]:
    config = make_config(str(tmp_path / "data"), source.url, users_file,
                         admin={"listen": "127.0.0.1:0", "token_file": token_file})
    running = await start_service(config)
    try:
        yield running
    finally:
        if not running.task.done():
            await running.stop()


@contextlib.asynccontextmanager
async def raw_client(port: int, table: str) -> AsyncIterator[tuple[RawClient, str]]:
    """A client that has read all of ``table`` and waits for more; its address as the
    service sees it."""
    client = await RawClient.connect(port)
    try:
        await client.login()
        await client.send(f"REQUEST-DATA {table}\n".encode())
        for _ in range(1 + ROWS):  # the schema, then every row
            assert (await client.line()).startswith(b"{")
        host, local_port = client.writer.get_extra_info("sockname")[:2]
        yield client, f"{host}:{local_port}"
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def library_client(port: int, table: str) -> AsyncIterator[asyncio.Task[None]]:
    """The client library following ``table`` (all of it read before this yields)."""
    received: list[Any] = []

    async def follow() -> None:
        async with CdcClient("127.0.0.1", port, USER, PASSWORD, format="AVRO") as client:
            async for event in client.stream(table):
                received.append(event)

    task = asyncio.create_task(follow())
    try:
        await until(lambda: len(received) >= 1 + ROWS or task.done(), what="the rows")
        assert not task.done(), task.exception()
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def browser(profile: Path, url: str) -> AsyncIterator[Console]:
    """Chromium on the console's URL; what it showed when the test failed is failure.png."""
    driver = await asyncio.to_thread(chrome, profile)
    try:
        yield Console(driver, url)
    except BaseException:
        with contextlib.suppress(Exception):
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(driver.save_screenshot, str(ARTIFACTS / "failure.png"))
        raise
    finally:
        await asyncio.to_thread(driver.quit)


# -- the test -------------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_console_shows_the_service_and_takes_its_actions(tmp_path: Path, source: Source,
                                                               users_file: str):
    chromium_or_skip()
    token, token_file = write_token(tmp_path)
    orders, hostile = fill(source)
    async with console_service(tmp_path, source, users_file, token_file) as running:
        await running.caught_up(source)
        host, port = running.service.admin.address  # type: ignore[misc]
        async with library_client(running.port, orders) as follower, \
                raw_client(running.port, orders) as (raw, raw_address), \
                browser(tmp_path / "chromium", f"http://{host}:{port}/console/") as console:
            await asyncio.to_thread(sign_in_refused_then_accepted, console, token)
            await asyncio.to_thread(overview, console)
            kept_id, raw_id = await asyncio.to_thread(clients, console, raw_address, orders)
            await asyncio.to_thread(tables, console, orders, hostile)
            await asyncio.to_thread(dump, console, orders)
            source.execute(f"DROP TABLE `{source.database}`.`{HOSTILE}`")
            await running.caught_up(source)
            await asyncio.to_thread(dump_refused, console, hostile)
            await asyncio.to_thread(kick, console, raw_id, kept_id)
            assert (await raw.closed()).endswith(KICKED)
            assert not follower.done(), "the client that was not disconnected lost its stream"
            await asyncio.to_thread(reload_users, console)
            assert await asyncio.to_thread(console.errors) == []


def sign_in_refused_then_accepted(console: Console, token: str) -> None:
    root = console.url.removesuffix("console/")
    console.open(root)  # / leads to the console, which asks for the token first
    console.enter_token("not-the-token-" + "x" * 16)
    console.wait(lambda d: "the token was refused" in console.text("#login-error")
                 and console.shown("#login-error"), "the wrong token's refusal")
    assert console.driver.current_url == console.url
    console.enter_token(token)
    console.wait(lambda d: not console.shown("#login"), "the prompt going away")
    console.wait(lambda d: console.text("#status").startswith("updated"), "a refresh")


def overview(console: Console) -> None:
    console.wait(lambda d: console.text("#rep-state") == "replicating", "replicating")
    console.wait(lambda d: console.text("#rep-clients") == "2", "two clients")
    # a few lag samples, two seconds apart: the chart has drawn a line
    console.wait(lambda d: console.driver.execute_script(
        "const l = document.querySelector('#lag-chart polyline');"
        "return l ? l.points.numberOfItems >= 4 : false;"), "the lag chart's line", 60)
    assert console.text("#rep-position").startswith("0-1-")
    assert console.text("#lag-now").startswith("now ")
    console.screenshot("overview")


def clients(console: Console, raw_address: str, orders: str) -> tuple[str, str]:
    """Both clients listed, streaming orders as cdcuser; (the library's id, the raw one's)."""
    console.go("clients")
    console.wait(lambda d: len(console.rows("clients-table")) == 2, "both clients")
    rows = console.rows("clients-table")
    for row in rows:
        cells = row["cells"]
        assert cells[2].startswith(USER), cells
        assert cells[4] == "streaming", cells
        assert cells[5].startswith(orders), cells
    by_address = {row["cells"][1]: row["key"] for row in rows}
    raw_id = by_address.pop(raw_address)
    [kept_id] = by_address.values()
    console.screenshot("clients")
    return kept_id, raw_id


def tables(console: Console, orders: str, hostile: str) -> None:
    console.go("tables")

    def shown() -> dict[str, list[str]]:
        return {row["key"]: row["cells"] for row in console.rows("tables-table")}

    # orders: its records with thousands separators, and the two clients reading it
    console.wait(lambda d: shown().get(orders, [])[2:3] == [f"{ROWS:,}"]
                 and shown()[orders][7] == "2" and hostile in shown(),
                 f"{orders} with {ROWS:,} records and 2 clients, and {hostile}")
    assert shown()[hostile][0] == hostile  # shown as text, not taken for markup
    assert not console.driver.execute_script("return document.querySelector('#tables-table b')")
    console.screenshot("tables")


def dump(console: Console, orders: str) -> None:
    question = console.act(console.button("tables-table", orders, "dump"))
    assert orders in question
    console.message("ok", f"Dump of {orders} queued")
    # the dumps page by its address, loaded afresh (the token stays in the tab)
    console.open(console.url + "#dumps")
    console.driver.refresh()
    console.wait(lambda d: console.shown("#page-dumps") and not console.shown("#login"),
                 "the dumps page")
    console.wait(lambda d: any(r["cells"][1] == orders for r in console.rows("dumps-table")),
                 "the finished dump", 90)
    row = next(r["cells"] for r in console.rows("dumps-table") if r["cells"][1] == orders)
    assert row[3] == f"{ROWS:,}"  # rows
    console.screenshot("dumps")


def dump_refused(console: Console, hostile: str) -> None:
    """A dump of a table gone from the source: the API's error, shown as text."""
    console.go("tables")
    console.act(console.button("tables-table", hostile, "dump"))
    shown = console.message("error", f"Could not dump {hostile}: ")
    assert "no table" in shown, shown
    assert not console.driver.execute_script("return document.querySelector('#messages b')")


def kick(console: Console, raw_id: str, kept_id: str) -> None:
    console.go("clients")
    button = console.button("clients-table", raw_id, "kick")
    console.act(button, answer="no")  # thought better of it: nothing happens
    assert raw_id in {r["key"] for r in console.rows("clients-table")}
    question = console.act(button)
    assert f"Client {raw_id} " in question
    console.message("ok", f"Client {raw_id} was disconnected")
    console.wait(lambda d: [r["key"] for r in console.rows("clients-table")] == [kept_id],
                 "the disconnected client gone")


def reload_users(console: Console) -> None:
    console.find("#reload-users").click()
    console.message("ok", "The users file was read again: 1 user.")
