"""The MLflow UI in a real headless Chromium: a finished tiny run shows its metrics, and the
step viewer artifact renders its trajectories. Screenshots go to the test's tmp folder.

Needs Debian ``chromium`` + ``chromium-driver`` (``/usr/bin/chromium``, ``/usr/bin/chromedriver``)
and ``selenium`` (the ``test`` extra). Marked ``slow``: a 2-step flow run plus an MLflow server.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.flowrun import run_tiny_flow

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("CLEANER_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("CLEANER_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage", "--window-size=1500,1100"]
STEP = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"mlflow server exited ({proc.returncode}): {log.read_text()[-2000:]}"
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow server {url} did not answer within {timeout_s} s: {log.read_text()[-2000:]}")


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def site(prefect_harness, warm_model_dir, tmp_path_factory):
    """A finished 2-step run served by a real ``mlflow server``; yields (url, run info, work dir)."""
    from mlflow.tracking import MlflowClient

    work = tmp_path_factory.mktemp("browser")
    run_tiny_flow(work, warm_model_dir, "browsertest")
    store = f"sqlite:///{work / 'mlflow.db'}"
    run = MlflowClient(tracking_uri=store).search_runs(
        [MlflowClient(tracking_uri=store).get_experiment_by_name("tiny").experiment_id])[0]
    port = free_port()
    log = work / "mlflow-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", store,
             "--artifacts-destination", str(work / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc, log)
        yield url, run, work
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        pytest.fail(f"{CHROMIUM} / {DRIVER} missing: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, predicate, what: str, timeout_s: float = 90.0):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.5).until(predicate)
    except TimeoutException:
        pytest.fail(f"{what} not shown within {timeout_s} s at {driver.current_url}")


def test_run_page_shows_the_metrics(site, browser, tmp_path):
    url, run, _ = site
    browser.get(f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}")
    wait_for(browser, lambda d: "rollout/accuracy" in d.page_source, "metric rollout/accuracy")
    for key in ["saar/rollbacks_triggered", "tools/first_attempt_success_rate"]:
        assert key in browser.page_source, key
    assert "browsertest" in browser.page_source
    from selenium.webdriver.common.by import By

    cell = browser.find_element(By.XPATH, "//*[text()='rollout/raw_share']")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
    row = cell.find_element(By.XPATH, "./ancestor::*[@role='row' or self::tr][1]")
    shown = float(re.search(r"-?\d+(\.\d+)?(e-?\d+)?", row.text.replace("rollout/raw_share", "")).group(0))
    assert shown == pytest.approx(run.data.metrics["rollout/raw_share"], rel=1e-3), row.text
    shot = tmp_path / "run_page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def _expected_ids(work: Path) -> set[str]:
    """The trajectories the viewer of ``STEP`` must show, picked from DuckDB the same way."""
    import duckdb

    from tasks.reports.viewer import pick_pairs

    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    trajs = con.execute(f"SELECT * EXCLUDE (prompt_ids) FROM trajectories WHERE step = {STEP}").pl()
    con.close()
    return {r["traj_id"] for pair in pick_pairs(trajs, 4) for r in pair if r}


def test_viewer_artifact_renders_its_trajectories(site, browser, tmp_path):
    from selenium.webdriver.common.by import By

    url, run, work = site
    artifact = f"viewer/step_{STEP:06d}.html"
    got = httpx.get(f"{url}/get-artifact", params={"path": artifact, "run_uuid": run.info.run_id}, timeout=30)
    assert got.status_code == 200, f"{artifact} is not an artifact of the run (log_stage must log it): {got.text[:300]}"
    browser.get(f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/artifacts/{artifact}")
    frame = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe"), "the artifact's iframe")[0]
    browser.switch_to.frame(frame)
    cards = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".traj[data-traj]"), "trajectory cards")
    shown = {c.get_attribute("data-traj") for c in cards}
    assert shown == _expected_ids(work)
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith(f"Step {STEP}:")
    assert "accuracy" in browser.find_element(By.CSS_SELECTOR, "header .metrics").text
    browser.switch_to.default_content()
    shot = tmp_path / "viewer.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
