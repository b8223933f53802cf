"""A real headless Chromium (Debian's `chromium`, driven by Playwright's Python client) and
a console served by uvicorn on a free loopback port.

No browser is ever downloaded: Playwright launches the system's Chromium. Without one (or
without the Playwright package) these tests skip with a one-line reason, except under
`CI=true`, where `scripts/test` installs both and a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from steptrail.runtime import Runtime

IN_CI = os.environ.get("CI", "").lower() == "true"
CHROMIUM = os.environ.get("STEPTRAIL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        return f"browser tests need the console and browser extras ({error.name} missing)"
    if not os.path.exists(CHROMIUM):
        return f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


# Module scope, not session: Playwright's sync API keeps an event loop marked as running on
# the main thread while it is open, and every later test that calls `asyncio.run` (the async
# runtime, pydantic-ai) would then fail with "cannot be called from a running event loop".
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = _missing()
    if why is not None:
        if IN_CI:
            pytest.fail(f"under CI=true the browser tests must run: {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (own cookies) and page; a script dialog fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = context.new_page()
    dialogs: list[str] = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    tab.set_default_timeout(15_000)
    yield tab
    context.close()
    assert dialogs == [], f"a script ran in the page: {dialogs}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(rt: Runtime, **config: Any) -> Iterator[str]:
    """The console for `rt` on a free loopback port, until the block ends."""
    import uvicorn

    from steptrail.console import ConsoleConfig, create_app

    port = free_port()
    settings = {"operator": "console:browser", "poll_seconds": 5.0, **config}
    app = create_app(rt, ConsoleConfig(port=port, **settings))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="console-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive(), "the console did not start"
        assert time.monotonic() < deadline, "the console did not start in 20 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
