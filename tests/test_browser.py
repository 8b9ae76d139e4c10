"""The lab in a real browser: JupyterLab on 127.0.0.1 in headless Chromium, served as `make lab` serves it (the
checkout's root, here a git copy with the notebook filter installed the way `make setup` installs it). 00's links
open the notebooks inside JupyterLab; notebooks run; in 05 every heading is followed by its own outputs; a slider
dragged with the mouse redraws its chart; no chart is wider than its output area; after Run All and save the checkout is clean. Every request that would leave
127.0.0.1 is blocked and fails the test. Screenshots go to artifacts/browser/.

Needs Debian's chromium (/usr/bin/chromium) and playwright (in the [test] extra). Skipped when
chromium is absent, except under CI (CI=true), where its absence is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

ROOT = Path(__file__).parent.parent
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
TIMEOUT_MS = 180_000
VIEWPORT_WIDTH = 1280   # a laptop screen; with the file browser open the output area is ~850 px wide

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError("the browser test needs chromium: apt-get install -y chromium")
    pytest.skip("needs Debian's chromium (apt-get install -y chromium)", allow_module_level=True)


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A git repository holding the notebooks, the filter and the Makefile, set up as `make setup` sets it up
    (running notebooks must not touch this repository's files)."""
    repo = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "notebooks", repo / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(ROOT / "tools", repo / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Makefile", ".gitattributes"):
        shutil.copy(ROOT / name, repo / name)
    (repo / ".gitignore").write_text(".ipynb_checkpoints/\n")
    git(repo, "init", "-q")
    subprocess.run(["make", "-s", "-C", str(repo), "notebook-filter"], check=True)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "notebooks")
    return repo


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory, checkout):
    """JupyterLab on the checkout's root, as `make lab` starts it."""
    work = tmp_path_factory.mktemp("lab")
    nb_dir = checkout
    user_settings = {  # no news pop-up; render every cell (no windowing) so off-screen outputs exist in the DOM
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
        "notebook-extension/tracker": {"windowingMode": "none"},
    }
    for name, values in user_settings.items():
        path = work / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port = support.free_port()
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"), "TREEWY_DEVICE": "cpu",
           "TREEWY_SMALL": "1", "JUPYTER_CONFIG_DIR": str(work / "config")}
    log = open(work / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
         f"--ServerApp.root_dir={nb_dir}", f"--config={ROOT / 'tools' / 'jupyter_lab_config.py'}", "--allow-root"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status", timeout=2)
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("JupyterLab did not start:\n" + (work / "jupyterlab.log").read_text()[-3000:])
            time.sleep(0.5)
    yield url
    os.killpg(proc.pid, 15)
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser_context():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    outside: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": VIEWPORT_WIDTH, "height": 1000})

        def guard(route):
            url = route.request.url
            if url.startswith(("data:", "blob:")) or urlparse(url).hostname == "127.0.0.1":
                route.continue_()
            else:
                outside.append(url)
                route.abort()

        ctx.route("**/*", guard)
        yield ctx, outside
        browser.close()


def run_all(page, base: str, notebook: str) -> None:
    page.goto(f"{base}/lab/tree/notebooks/{notebook}", timeout=TIMEOUT_MS)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=TIMEOUT_MS)
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=TIMEOUT_MS)  # kernel ready
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def drag_slider(page, label: str, fraction: float) -> None:
    """Drag the handle of the slider described as ``label`` by ``fraction`` of its track, with the mouse."""
    slider = page.locator(".widget-slider", has=page.get_by_text(label, exact=True)).first
    slider.scroll_into_view_if_needed()
    track = slider.locator(".noUi-target").bounding_box()
    handle = slider.locator(".noUi-handle").bounding_box()
    x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + fraction * track["width"], y, steps=8)
    page.mouse.up()


def svg_texts(page) -> list[str]:
    return page.locator(".jp-OutputArea svg text").evaluate_all("els => els.map(e => e.textContent)")


def assert_charts_fit(page, name: str) -> None:
    """Every chart (a vega SVG) is at most as wide as the output area holding it."""
    # one synchronous evaluate: a locator's evaluate_all queries and evaluates in two round trips, and a chart
    # redrawn between them is detached (CI saw closest() return null so)
    sizes = page.evaluate(
        "() => [...document.querySelectorAll('.jp-OutputArea-output svg.marks')].map(e => "
        "[e.getBoundingClientRect().width, e.closest('.jp-OutputArea-output').clientWidth])")
    assert sizes, f"{name}: no chart rendered"
    too_wide = [s for s in sizes if s[0] > s[1] + 0.5]
    assert not too_wide, f"{name}: charts wider than their output area (chart px, area px): {too_wide}"


def save(page, notebook: str) -> None:
    """Save the notebook from the browser (File > Save Notebook) and wait until the server has written it."""
    page.get_by_role("menuitem", name="File", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Save Notebook", exact=True).click()
    page.get_by_text("Saving completed", exact=False).first.wait_for(timeout=TIMEOUT_MS)


def test_start_here_links_open_notebooks_inside_jupyterlab(jupyterlab, browser_context):
    ctx, outside = browser_context
    page = ctx.new_page()
    run_all(page, jupyterlab, "00_start_here.ipynb")
    page.get_by_text("running on", exact=False).first.wait_for(timeout=TIMEOUT_MS)
    page.evaluate("window.__notReloaded = true")
    for stem in ("01_pseudo_value_rewrite", "04_acceptance_sweeps", "06_serving_with_vllm"):
        tab = page.locator(".lm-TabBar-tab", has_text=f"{stem}.ipynb")
        page.bring_to_front()
        page.locator(".jp-RenderedMarkdown a", has_text=stem[:2] + " ·").first.click()
        tab.first.wait_for(timeout=TIMEOUT_MS)
        page.locator(".lm-TabBar-tab", has_text="00_start_here.ipynb").first.click()
    assert page.evaluate("window.__notReloaded === true"), "a link reloaded JupyterLab"
    page.screenshot(path=ARTIFACTS / "00_links.png", full_page=False)
    assert not outside, f"requests left 127.0.0.1: {outside}"


def test_tree_notebook_slider_redraws_the_tree(jupyterlab, browser_context):
    ctx, outside = browser_context
    page = ctx.new_page()
    run_all(page, jupyterlab, "02_tree_construction.ipynb")
    status = page.get_by_text("N = 21 drafts, depth 3", exact=False).first
    status.wait_for(timeout=TIMEOUT_MS)
    page.get_by_text("widths (3, 2, 2): N = 21 drafts").first.wait_for(timeout=TIMEOUT_MS)
    page.locator(".widget-slider", has=page.get_by_text("level 1", exact=True)).first.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "02_before.png", full_page=False)
    drag_slider(page, "level 1", 2 / 7)                       # level 1: 3 -> 5 on a 1..8 track
    page.get_by_text("widths (5, 2, 2): N = 35 drafts").first.wait_for(timeout=TIMEOUT_MS)
    page.get_by_text("N = 35 drafts, depth 3", exact=False).first.wait_for(timeout=TIMEOUT_MS)
    texts = svg_texts(page)
    assert any("widths (5, 2, 2)" in t for t in texts), texts
    assert not any("widths (3, 2, 2)" in t for t in texts), "the tree chart kept its old title"
    page.screenshot(path=ARTIFACTS / "02_after.png", full_page=False)
    assert_charts_fit(page, "02")
    assert not outside, f"requests left 127.0.0.1: {outside}"


def sections(page) -> list[tuple[str, list[str]]]:
    """(heading, texts of the outputs of the code cells under it, up to the next heading) in notebook order."""
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").first.evaluate("""nb => {
        const out = [];
        for (const cell of nb.querySelectorAll(':scope .jp-Cell')) {
            const h = cell.classList.contains('jp-MarkdownCell') && cell.querySelector('h2');
            if (h) out.push([h.textContent.replace(/\u00b6$/, '').trim(), []]);
            else if (out.length && cell.classList.contains('jp-CodeCell'))
                for (const o of cell.querySelectorAll('.jp-OutputArea-output'))
                    if (o.textContent.trim() || o.querySelector('svg, canvas')) out[out.length - 1][1].push(
                        o.textContent.trim() || '(chart)');
        }
        return out; }""")


def test_serving_notebook_memory_slider_redraws_the_curves(jupyterlab, browser_context):
    ctx, outside = browser_context
    page = ctx.new_page()
    run_all(page, jupyterlab, "05_serving_curves.ipynb")
    page.get_by_text("store-all pool full from concurrency", exact=False).first.wait_for(timeout=TIMEOUT_MS)
    page.locator(".jp-OutputArea-output", has_text=re.compile("Simulated and measured ratios part|"
                                                              "Every simulated ratio is within")
                 ).first.wait_for(timeout=TIMEOUT_MS)   # the last cell with an output has run
    # every numbered heading is followed by its own outputs (05's section 3 once printed at the very bottom)
    found = sections(page)
    numbered = [(h, outs) for h, outs in found if h[:1].isdigit()]
    assert [h[:1] for h, _ in numbered] == ["1", "2", "3", "4"], found
    assert all(outs for _, outs in numbered), [(h, len(outs)) for h, outs in numbered]
    by_number = {h[:1]: " ".join(outs) for h, outs in numbered}
    assert "SIMULATED now" in by_number["3"] and "Below the knee" in by_number["3"], by_number["3"][:300]
    assert "SIMULATED now" not in by_number["4"], "section 3's table printed under section 4"
    assert "ratios part" in by_number["4"] or "is within" in by_number["4"], by_number["4"][-300:]
    assert not any(outs for h, outs in found if not h[:1].isdigit()), "outputs under What we saw / Try this"
    before = [t for t in svg_texts(page) if t.startswith("SIMULATED")]
    assert before and "gmu 0.60" in before[0], before
    page.locator(".widget-slider", has=page.get_by_text("gpu mem util", exact=True)).first.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "05_before.png", full_page=False)
    drag_slider(page, "gpu mem util", 0.45)                    # 0.60 -> about 0.90 on a 0.30..0.95 track
    page.get_by_text("press Run to update", exact=False).first.wait_for(timeout=TIMEOUT_MS)
    page.locator(".widget-button", has_text="Run").first.click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-OutputArea svg text')].some("
        "e => e.textContent.startsWith('SIMULATED') && !e.textContent.includes('gmu 0.60'))", timeout=TIMEOUT_MS)
    after = [t for t in svg_texts(page) if t.startswith("SIMULATED")]
    assert after and "gmu 0.60" not in after[0], after
    page.screenshot(path=ARTIFACTS / "05_after.png", full_page=False)
    assert_charts_fit(page, "05")
    assert not outside, f"requests left 127.0.0.1: {outside}"


def test_checkout_is_clean_after_run_all(jupyterlab, browser_context, checkout):
    """Runs after the notebooks above: save them with their outputs; git must see no change."""
    ctx, _ = browser_context
    page = ctx.new_page()
    run_all(page, jupyterlab, "02_tree_construction.ipynb")
    page.get_by_text("N = 21 drafts, depth 3", exact=False).first.wait_for(timeout=TIMEOUT_MS)
    before = (checkout / "notebooks" / "02_tree_construction.ipynb").stat().st_mtime_ns
    save(page, "02_tree_construction.ipynb")
    assert (checkout / "notebooks" / "02_tree_construction.ipynb").stat().st_mtime_ns > before, "not saved"
    assert git(checkout, "status", "--porcelain") == ""
