"""Real headless Chromium (Debian `chromium` + `chromium-driver`) for the tests of what a person sees.

A test module that uses it calls `require_chromium()` at import: skipped where no Chromium is installed,
except under CI (`CI` set), where `.ci/run` installs it and a missing browser is a failure.
"""

import os
import pathlib
import shutil
import tempfile
import time

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def require_chromium() -> None:
    if CHROMIUM and DRIVER:
        return
    if os.environ.get("CI"):
        raise RuntimeError("CI needs Debian's chromium and chromium-driver (installed by .ci/run)")
    pytest.skip(
        "no chromium/chromedriver on this machine (apt-get install chromium chromium-driver)", allow_module_level=True
    )


def chromium():
    """A Chromium driver with a fresh profile (empty localStorage: what a new visitor sees) and the profile's
    folder; the `browser` fixture (tests/conftest.py) gives one per test module."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="copc-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(120)
    return driver, profile


def page_text(driver) -> str:
    return driver.find_element("tag name", "body").text


def wait_for(driver, check, timeout: float = 90, what: str = "the page") -> object:
    """Poll `check(driver)` until it returns something truthy; on time-out fail with the page's text."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check(driver)
        except Exception:  # the page is still being built (an element not there yet, a script error)
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: not shown within {timeout:.0f} s; the page reads:\n{page_text(driver)[:3000]}"
            )
        time.sleep(0.5)


def screenshot(driver, name: str, fallback: pathlib.Path) -> pathlib.Path:
    """Save what the browser shows as `name` in $COPC_SCREENSHOT_DIR (else `fallback`); returns its path."""
    shot = pathlib.Path(os.environ.get("COPC_SCREENSHOT_DIR", fallback)) / name
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000, shot
    return shot


def severe_errors(driver) -> list[dict]:
    """The console's errors since the last call (chromium logs a deprecation of software WebGL as a warning)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
