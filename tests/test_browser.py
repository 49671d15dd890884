"""The MLflow UI in a real headless Chromium over a finished tiny run (``tracked_run``): the run shows
its metrics, the step viewer artifact renders its trajectories, the experiment opens in the
model-training view, a trace shows a SAAR rollback on the span it replaced, a logged checkpoint's page
lists its evaluation metrics, and the registered model carries the ``best`` alias.

Screenshots go to the test's tmp folder; with ``CLEANER_DOCS_SCREENSHOTS=docs/img`` the four MLflow
views are also written there, downscaled (the PNGs in ``docs/img`` come from this test).

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

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

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
def site(tracked_run):
    """The finished 2-step run served by ``cleaner ui`` (the README's browsing command: a real ``mlflow server``);
    yields (url, run info, work dir, the link ``cleaner ui`` printed, the server's process group)."""
    from mlflow.tracking import MlflowClient

    work, result = tracked_run
    store = f"sqlite:///{work / 'mlflow.db'}"
    run = MlflowClient(tracking_uri=store).get_run(result["mlflow_run_id"])
    port = free_port()
    log = work / "mlflow-server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "ui", "--port", str(port), "--set", f"tracking.mlflow_uri={store}",
             ],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc, log)
        printed = re.search(r"http://\S+", " ".join(log.read_text().split()[:40])).group(0)
        yield url, run, work, printed, proc.pid
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
    calm_assistant(driver)
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


def _group_rss_mb(pgid: int) -> tuple[int, float]:
    """(processes, total resident MB) of a process group."""
    procs, rss = 0, 0.0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if os.getpgid(int(status.parent.name)) != pgid:
                continue
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except (OSError, ValueError):
            continue
        procs += 1
        rss += int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
    return procs, rss


def test_cleaner_ui_is_light_and_its_link_opens_the_training_view(site, browser, tmp_path):
    """`cleaner ui` serves the store in 2 processes under 1 GB (``mlflow ui``'s defaults: 15 and ~2.2 GB), and the
    experiment link it prints opens the model-training view (Runs, Models, the registry), not the GenAI one
    (Evaluation runs, Judges, Prompts), in a fresh browser."""
    url, run, _, printed, pgid = site
    procs, rss = _group_rss_mb(pgid)
    print(f"cleaner ui: {procs} processes, {rss:.0f} MB resident")
    assert procs <= 3 and rss < 1024, (procs, rss)
    assert printed == f"{url}/#/experiments/{run.info.experiment_id}/runs?workflowType=machine_learning"
    from selenium.webdriver.common.by import By

    browser.get(printed)
    wait_for(browser, lambda d: run.info.run_name in d.page_source, "the run in the experiment's table")
    nav = " ".join(e.text for e in browser.find_elements(By.TAG_NAME, "aside") + browser.find_elements(By.TAG_NAME, "nav"))
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "Model registry" in page and "Evaluation runs" not in page and "Judges" not in page, nav or page[:500]
    docs_shot(browser, tmp_path, "mlflow_training_view.png")


def test_run_page_shows_the_metrics(site, browser, tmp_path):
    url, run, *_ = site
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

    url, run, work, *_ = site
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


def calm_assistant(driver) -> None:
    """A fresh browser profile opens MLflow's assistant panel over a third of the page on first load;
    tell the UI it already did (as a user who closed it once), so pages show what they are about."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (
        "try { localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
        " localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false'); } catch (e) {}")})


def dismiss_tips(driver) -> None:
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.XPATH, "//button[normalize-space(.)='Got it']"):
        try:
            button.click()
        except Exception:  # noqa: BLE001 - a tip that vanished meanwhile
            pass


def docs_shot(driver, tmp_path: Path, name: str) -> Path:
    """Screenshot to the tmp folder and, when asked, a downscaled copy into the docs folder."""
    shot = tmp_path / name
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if folder := os.environ.get("CLEANER_DOCS_SCREENSHOTS"):
        from PIL import Image

        img = Image.open(shot).convert("RGB")
        img = img.resize((1000, round(img.height * 1000 / img.width)), Image.LANCZOS)
        Path(folder).mkdir(parents=True, exist_ok=True)
        img.quantize(colors=96, dither=Image.Dither.NONE).save(Path(folder) / name, optimize=True)
    return shot


def _cfg(url: str):
    from tasks.stores.config import TrackingConfig

    return TrackingConfig(ui_url=url)


def test_experiment_opens_in_the_training_view(site, browser, tmp_path):
    from selenium.webdriver.common.by import By

    from tasks.stores.links import experiment_url

    url, run, *_ = site
    browser.get(experiment_url(_cfg(url), run.info.experiment_id))
    wait_for(browser, lambda d: "browsertest" in d.page_source, "the run row")
    nav = browser.find_element(By.TAG_NAME, "body").text
    for item in ("Runs", "Models", "Traces", "Model registry"):
        assert item in nav, item
    for genai in ("Judges", "Evaluation runs", "Sessions", "Playground"):  # the GenAI view's sidebar
        assert genai not in nav, genai
    wait_for(browser, lambda d: re.search(r"tiny\s+v\d", d.find_element(By.TAG_NAME, "body").text),
             "the run's registered model in the Models column")
    assert "/train (" in browser.find_element(By.TAG_NAME, "body").text  # the training prompt set, a dataset input
    docs_shot(browser, tmp_path, "mlflow_experiment.png")


def _rollback_trace(site) -> tuple[str, str, str]:
    """(trace id, span name, error kind) of a training trace whose turn span carries a recovered rollback."""
    import mlflow

    _, run, work, *_ = site
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    found = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list",
                                 filter_string="tags.rollback = 'true' AND tags.kind = 'train'", max_results=100)
    spans = [(t.info.trace_id, s) for t in found for s in t.data.spans if s.attributes.get("saar.rollback")]
    assert spans, "no training trace with a rollback: the seeded 2-step run is expected to have one"
    trace_id, span = max(spans, key=lambda ts: ts[1].attributes.get("saar.outcome") == "recovered")
    return trace_id, span.name, span.attributes["saar.errors"][0]


def test_a_trace_shows_the_rollback_on_the_span_it_replaced(site, browser, tmp_path):
    from selenium.webdriver.common.by import By

    url, run, *_ = site
    trace_id, span_name, error = _rollback_trace(site)
    browser.get(f"{url}/#/experiments/{run.info.experiment_id}/traces?workflowType=machine_learning"
                f"&selectedEvaluationId={trace_id}")
    node = wait_for(browser, lambda d: d.find_elements(By.XPATH, f"//*[normalize-space(text())='{span_name}']"),
                    f"span {span_name!r} in the trace's span tree")[0]
    dismiss_tips(browser)
    node.click()
    tab = wait_for(browser, lambda d: d.find_elements(By.XPATH, "//*[@role='tab' and normalize-space(.)='Attributes']"),
                   "the span's Attributes tab")[0]
    tab.click()
    wait_for(browser, lambda d: "saar.decisions" in d.page_source, "the span's saar.* attributes")
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "saar.rollback" in text and "saar.outcome" in text and error in text
    assert "(cut by SAAR)" in text or "saar.attempts" in text
    docs_shot(browser, tmp_path, "mlflow_trace_rollback.png")


def test_a_logged_checkpoint_lists_its_evaluation_metrics(site, browser, tmp_path):
    import duckdb

    url, run, work, *_ = site
    model_id = next(o.model_id for o in run.outputs.model_outputs if o.step == 2)
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    (value,) = con.execute("SELECT value FROM evaluations WHERE policy_version = 2 AND key = "
                           "'eval/saar_off/all/pass_at_1' AND run_id = 'browsertest'").fetchone()
    con.close()
    browser.get(f"{url}/#/experiments/{run.info.experiment_id}/models/{model_id}?workflowType=machine_learning")
    from selenium.webdriver.common.by import By

    # the element itself, not the page source: the name is in the source (the page's state) before its cell renders
    cells = wait_for(browser, lambda d: d.find_elements(By.XPATH, "//*[text()='eval/saar_off/all/pass_at_1']"),
                     "the model's metrics")
    cell = cells[0]
    row = cell.find_element(By.XPATH, "./ancestor::*[@role='row' or self::tr][1]")
    assert f"{value:g}"[:5] in row.text and "browsertest" in row.text, row.text
    assert "tiny-policy-000002" in browser.page_source
    docs_shot(browser, tmp_path, "mlflow_logged_model.png")


def test_the_registered_model_carries_the_best_alias(site, browser, tmp_path):
    from selenium.webdriver.common.by import By

    url, *_ = site
    browser.get(f"{url}/#/models/tiny?workflowType=machine_learning")
    wait_for(browser, lambda d: "cleaner.pass_at_1" in d.page_source, "the registered versions")
    wait_for(browser, lambda d: "best" in d.find_element(By.TAG_NAME, "body").text.split("Aliases", 1)[-1],
             "the best alias")
    docs_shot(browser, tmp_path, "mlflow_registry.png")
