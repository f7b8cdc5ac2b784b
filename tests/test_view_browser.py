"""`metarag view` in a real browser: Playwright drives Debian's Chromium (headless, the system's
executable: Playwright's own browser download cannot reach its servers here) over scripted runs.
Opens the runs page, filters to wrong answers, opens a question, expands a prompt and checks what is
shown; saves screenshots under the test's tmp_path (and --screenshot-dir when given).

Skipped, with the reason, where playwright or the browser is missing; METARAG_REQUIRE_BROWSER=1 (CI)
turns that skip into a failure."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
CHROMIUM = os.environ.get("METARAG_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def _missing() -> str | None:
    try:
        import fastapi  # noqa: F401
        import playwright.sync_api  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as exc:
        return f"{exc.name} is not installed (pip install 'metarag[view,browser]')"
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set METARAG_CHROMIUM)"
    return None


MISSING = _missing()
if MISSING:
    if os.environ.get("METARAG_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"METARAG_REQUIRE_BROWSER=1 but the browser tests cannot run: {MISSING}")
    pytest.skip(f"browser tests skipped: {MISSING}", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402
from test_view import make_evoctx_run, make_flaky_run, make_rerank_run, make_runs  # noqa: E402

from metarag.evaluate.runs import RunStore  # noqa: E402
from metarag.view.server import ViewServer  # noqa: E402

# generous: the page answers in milliseconds, but the test machine's few cores are shared
TIMEOUT_MS = 30_000
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, tmp_path, request):
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # a 4xx answer the page itself shows (an unknown question) is no page error
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" and not msg.text.startswith(
        "Failed to load resource: the server responded with a status of 4") else None)
    # nothing may come from outside the viewer: any other request fails the test
    outside: list[str] = []
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("http://127.0.0.1:")
               else (outside.append(route.request.url), route.abort()))
    if os.environ.get("METARAG_BROWSER_THROTTLE"):  # slow the page's CPU down N times, to shake out races
        page.context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate",
                                               {"rate": float(os.environ["METARAG_BROWSER_THROTTLE"])})
    yield page
    try:  # the page as the test left it: the artifact to look at when a test failed
        page.screenshot(path=str(tmp_path / "last-page.png"), full_page=True)
        copy_out(request, tmp_path / "last-page.png", f"last-page-{request.node.name}.png")
    except Exception:  # a page that cannot be drawn any more leaves no picture
        pass
    context.close()
    assert not outside, f"the page asked for outside resources: {outside}"
    assert not errors, f"errors in the page: {errors}"


def copy_out(request, path: Path, name: str) -> None:
    """Also keep a screenshot under --screenshot-dir, when given."""
    target = request.config.getoption("--screenshot-dir")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)


def shoot(page, tmp_path: Path, request, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    copy_out(request, path, path.name)
    assert path.stat().st_size > 10_000  # a page was drawn, not a blank
    return path


def test_runs_page_filter_to_wrong_answers_open_a_question_and_its_prompt(page, tmp_path, request):
    runs = make_runs(tmp_path / "runs")
    not_a_run = tmp_path / "not-a-run"
    not_a_run.mkdir()
    with ViewServer.start([runs["good"], runs["paris"], runs["iterdrag"], not_a_run]) as server:
        page.goto(server.url)
        # the runs page: the report table, one row per run, and the folder that is no run said so
        rows = page.locator("#report tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.nth(0)).to_contain_text("100.0 (61.0–100.0)")  # EM with its Wilson interval
        # 5 discordant pairs, all one way: exact McNemar p = 0.0625, so no mark (a t-test would give one)
        expect(rows.nth(1)).to_contain_text("16.7 (3.0–56.4)")
        expect(rows.nth(1)).to_contain_text("-83.30.06")
        expect(rows.nth(1)).not_to_contain_text("*")
        expect(page.locator(".run-error")).to_contain_text("not a metarag run folder")
        expect(page.locator(".run-card").first).to_contain_text("scripted:scripted")
        shoot(page, tmp_path, request, "view-runs")

        # the question list, filtered to questions the always-Paris run (A) gets wrong and the reader (B) right
        page.click("#to-questions")
        expect(page.locator("#questions tbody tr")).to_have_count(6)
        page.select_option("#run-a", "1")
        page.select_option("#run-b", "0")
        page.select_option("#filter", "flip")
        expect(page.locator("#questions tbody tr")).to_have_count(5)
        expect(page.locator("#total")).to_have_text("1–5 of 5 questions")
        expect(page.locator("#pairs")).to_contain_text("5 wins")
        first = page.locator("#questions tbody tr").first
        expect(first).to_have_attribute("data-id", "q1")
        expect(first.locator("td.answer").nth(0)).to_have_class("answer cell-right")
        expect(first.locator("td.answer").nth(1)).to_have_class("answer cell-wrong")
        expect(first.locator("td.answer").nth(1)).to_contain_text("Paris")
        shoot(page, tmp_path, request, "view-questions")

        # the question page: the runs side by side, the passages with the supporting one marked
        first.click()
        columns = page.locator(".run-column")
        expect(columns).to_have_count(3)
        expect(page.locator("#qtitle")).to_have_text("What is the capital of Italy?")
        expect(columns.nth(0).locator(".run-answer")).to_contain_text("Rome")
        expect(columns.nth(1).locator(".run-answer")).to_contain_text("Paris")
        retrieve = columns.nth(0).locator('.step[data-kind="retrieve"]').first
        expect(retrieve.locator("tr.support")).to_have_count(1)
        expect(retrieve.locator("tr.support")).to_contain_text("Italy")
        expect(columns.nth(0).locator("svg.chart-timeline")).to_have_count(1)
        expect(columns.nth(0).locator("svg.chart-cost rect")).to_have_count(6)  # 3 steps x (tokens, latency)
        # the prompt is collapsed until asked for
        prompt = columns.nth(0).locator('.step[data-kind="generate"] details.prompt').first
        expect(prompt).not_to_have_attribute("open", "")
        body = prompt.locator("pre").last
        expect(body).to_be_hidden()
        prompt.locator("summary").click()
        expect(prompt).to_have_attribute("open", "")
        expect(body).to_be_visible()
        expect(body).to_contain_text("Italy is a country in Europe. Its capital is Rome.")
        expect(body).to_contain_text("Question: What is the capital of Italy?")
        shoot(page, tmp_path, request, "view-question")

        # back to the filtered list, as it was
        page.go_back()
        expect(page.locator("#questions tbody tr")).to_have_count(5)


def test_evoctx_trajectory_and_decisions_are_drawn(page, tmp_path, request, corpus):
    path = make_evoctx_run(tmp_path, corpus)
    with ViewServer.start([path]) as server:
        page.goto(server.url + "#/questions")
        expect(page.locator("#questions tbody tr")).to_have_count(1)
        expect(page.locator("#questions td.answer .flag")).to_have_text("over")
        page.select_option("#filter", "over-search")
        expect(page.locator("#questions tbody tr")).to_have_count(1)
        page.locator("#questions tbody tr").first.click()
        chart = page.locator("svg.chart-evoctx")
        expect(chart).to_have_count(1)
        expect(chart.locator("polyline")).to_have_count(5)  # d_near, d_cent, d_90, margin, oracle margin
        expect(chart).to_contain_text("τ near 0.3")
        decisions = page.locator('.step[data-kind="decide"]')
        expect(decisions).to_have_count(3)
        expect(decisions.nth(0)).to_contain_text("RETRIEVE")
        expect(decisions.nth(0).locator(".signals")).to_contain_text("oracle_margin")
        expect(page.locator('.step[data-kind="judge"]').first).to_contain_text("evoctx-decision-model")
        expect(page.locator(".run-answer")).to_contain_text("Dijon")
        shoot(page, tmp_path, request, "view-evoctx")


def test_bad_input_is_said_on_the_page(page, tmp_path, request):
    runs = make_runs(tmp_path / "runs")
    store = RunStore(runs["good"])
    lines = store.results_path.read_text().splitlines()
    record = json.loads(lines[1])
    record["trace"]["steps"].insert(1, {"kind": "telepathy", "usage": {"llm_requests": 1}, "thought": "Rome?"})
    lines[1] = json.dumps(record)
    store.results_path.write_text("\n".join(lines[:4]) + "\n" + lines[4][:25])  # and a torn last line
    with ViewServer.start([runs["good"]]) as server:
        page.goto(server.url)
        problems = page.locator(".problem")
        expect(problems.filter(has_text="unknown step kind 'telepathy'")).to_have_count(1)
        expect(problems.filter(has_text="line 5 is torn")).to_have_count(1)
        expect(page.locator("#report tbody tr")).to_contain_text("4 (partial)")
        page.goto(server.url + "#/q/q1")
        unknown = page.locator(".step.unknown-step")
        expect(unknown).to_have_count(1)
        expect(unknown.locator(".step-note")).to_contain_text("unknown step kind 'telepathy'")
        expect(unknown.locator("pre.raw")).to_contain_text('"thought": "Rome?"')
        expect(page.locator('.step[data-kind="answer"]')).to_contain_text("Rome")
        shoot(page, tmp_path, request, "view-bad-input")
        page.goto(server.url + "#/q/nope")
        expect(page.locator("#page-error")).to_contain_text("no run has a question with id 'nope'")


def test_failed_questions_and_reranked_passages(page, tmp_path, request):
    runs = make_runs(tmp_path / "runs")
    flaky = make_flaky_run(tmp_path / "runs", runs["data"])
    with ViewServer.start([runs["good"], flaky]) as server:
        page.goto(server.url + "#/questions?filter=failed")
        rows = page.locator("#questions tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first.locator("td.answer").nth(1)).to_have_class("answer cell-failed")
        expect(rows.first.locator("td.answer").nth(1)).to_contain_text("model crashed")
        rows.first.click()
        expect(page.locator(".run-column").nth(1).locator("pre.trace-error")).to_contain_text("model crashed")
    with ViewServer.start([make_rerank_run(tmp_path)]) as server:
        page.goto(server.url + "#/q/r1")
        retrieve = page.locator('.step[data-kind="retrieve"] table.hits tbody tr')
        expect(retrieve).to_have_count(3)
        # each retrieved passage's rank after the reranker: Gamma 1st, Alpha 2nd, Beta dropped
        expect(retrieve.nth(0)).to_contain_text("Alpha")
        expect(retrieve.nth(0).locator("td").nth(1)).to_have_text("2")
        expect(retrieve.nth(1).locator("td").nth(1)).to_have_text("dropped")
        expect(retrieve.nth(2).locator("td").nth(1)).to_have_text("1")
        reranked = page.locator('.step[data-kind="rerank"] table.hits tbody tr')
        expect(reranked.nth(0)).to_contain_text("Gamma")
        expect(reranked.nth(0).locator("td").nth(1)).to_have_text("3")  # its rank before
        expect(page.locator('.step[data-kind="rerank"]')).to_contain_text("kept 2 of 3")
        # a reply cut at its token budget says so; one that ended is not marked
        generated = page.locator('.step[data-kind="generate"]')
        expect(generated.nth(0).locator(".badge.cut")).to_have_text("cut at max_tokens")
        expect(generated.nth(1).locator(".badge.cut")).to_have_count(0)
        expect(generated.nth(0).locator(".other-fields")).to_have_count(0)
        shoot(page, tmp_path, request, "view-rerank")
