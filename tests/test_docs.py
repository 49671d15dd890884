"""The docs site (``mkdocs.yml``, ``make docs``): it builds strict (a broken link fails it), its generated reference
pages list every config key with its docstring and every ``cleaner`` command, and a served page opens in a real
headless Chromium with its navigation."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def leaf_fields(model, prefix=""):
    """(dotted path, docstring) of every non-section field, walked here by hand (not with flows.reference)."""
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        subs = [t for t in (field.annotation, *getattr(field.annotation, "__args__", ()))
                if isinstance(t, type) and issubclass(t, BaseModel)]
        if subs:
            yield from leaf_fields(subs[0], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", " ".join(field.description.split())


def test_the_config_reference_lists_every_field_with_its_docstring():
    from flows.config import RunConfig
    from flows.reference import config_reference

    page = config_reference()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    fields = dict(leaf_fields(RunConfig))
    assert len(fields) > 200 and set(fields) <= set(rows)
    for path, doc in fields.items():
        assert doc.replace("|", "\\|") in rows[path], path
    raw_share = rows["rollout.saar.raw_share"]
    assert "`float`" in raw_share and "`0.3`" in raw_share  # type and default, as the pydantic tree says


def test_the_cli_reference_lists_every_command_and_its_options():
    from flows.cli import app
    from flows.reference import cli_reference

    page = cli_reference()
    names = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    groups = [g.name for g in app.registered_groups]
    assert len(names) > 12 and {"serve", "sandbox", "data"} <= set(groups)
    for name in [*names, *groups]:
        assert f"## `cleaner {name}`" in page, name
    compare = page.split("## `cleaner compare`")[1].split("\n## ")[0]
    for option in ("--config", "--set", "--compare-id", "--rerun", "--dispatch"):
        assert f"`{option}`" in compare, option
    assert "## `cleaner serve start`" in page  # sub-commands of groups too


def test_the_site_builds_with_the_generated_pages(site):
    for page in ("index.html", "reference/config/index.html", "reference/cli/index.html", "threat_model/index.html",
                 "model_cards/tiny-warm/index.html", "regimes/index.html"):
        assert (site / page).exists(), page
    assert "rollout.saar.raw_share" in (site / "reference/config/index.html").read_text()


def _text(html: str) -> str:
    """What a reader sees of an HTML page: its text, tags and entities gone."""
    from html.parser import HTMLParser

    parts: list[str] = []
    parser = HTMLParser()
    parser.handle_data = parts.append
    parser.feed(html)
    return " ".join("".join(parts).split())


def test_the_config_reference_shows_union_types_and_pipes_without_a_backslash(site):
    text = _text((site / "reference/config/index.html").read_text())
    assert "\\|" not in text
    assert "model.base str | None None Frozen base model folder" in text  # a union type in a code span
    assert "Allowed range of P(correct | clean first call)." in text  # an escaped pipe in the meaning column
    assert "\\|" not in _text((site / "reference/cli/index.html").read_text())


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\nSee [the missing page](missing.md).\n")
    config = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config.write_text(text.replace("infra/docs_hooks.py", str(ROOT / "infra" / "docs_hooks.py")))
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "missing.md" in done.stderr and "Aborted" in done.stdout + done.stderr


@pytest.mark.slow
def test_a_served_page_opens_in_a_browser_and_its_navigation_leads_to_the_config_reference(site, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    from tests.test_browser import CHROMIUM, DRIVER, FLAGS, free_port, wait_for

    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        pytest.fail(f"{CHROMIUM} / {DRIVER} missing: apt-get install -y chromium chromium-driver")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=site,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    driver = None
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=2.0)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
        driver.get(url)
        assert "CLEANER" in driver.title
        link = wait_for(driver, lambda d: next((a for a in d.find_elements(By.CSS_SELECTOR, "nav a")
                                                if a.get_attribute("href").endswith("/reference/config/")), None),
                        "the navigation's link to the config reference")
        driver.get(link.get_attribute("href"))
        wait_for(driver, lambda d: "rollout.saar.raw_share" in d.find_element(By.TAG_NAME, "body").text,
                 "the config reference's rollout.saar.raw_share row")
        driver.save_screenshot(str(tmp_path / "config_reference.png"))
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)


def test_the_reference_command_names_its_pages_on_bad_input():
    done = subprocess.run([sys.executable, "-m", "flows.reference", "configs"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "usage: python -m flows.reference {config|cli}" in done.stderr
