"""Driving Debian's headless Chromium for the browser tests: start it, wait, sign in on Airflow's login form.

Without chromium and chromedriver, or when the browser does not start, the
test fails under ``CI=true`` and is skipped elsewhere (``airflowstandalone.unavailable``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from airflowstandalone import unavailable

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"  # screenshots (git-ignored)


def chromium() -> Iterator:
    """A headless Chromium under chromedriver (selenium), quit when the generator is closed."""
    chromium_bin, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium_bin and driver_bin):
        unavailable("Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_bin
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1500,1100"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    except Exception as e:  # noqa: BLE001 - any failure to start the browser is reported the same way
        unavailable(f"headless chromium did not start: {e}")
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, condition, timeout_s: float = 60.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s).until(condition)


def sign_in(driver, server, user: str = "admin"):
    """Sign ``user`` in through the SimpleAuthManager's own login form (signing out whoever was in)."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{server.url}/")
    wait(driver, lambda d: d.find_elements(By.NAME, "username"))
    driver.find_element(By.NAME, "username").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(server.passwords[user])
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(driver, lambda d: "/auth/login" not in d.current_url and d.get_cookie("_token"))
    return driver
