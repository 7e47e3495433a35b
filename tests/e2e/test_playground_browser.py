"""The playground in a real browser, on a fresh dashboard that starts its own `kvlab serve` on the first Run:
a share link opened, Run (disabled while in flight, its progress shown), the answers marked, the token maps
(each occurrence of the needle boxed once, a legend, each map opened at the needle; StreamingLLM at 75% keeps
none of it), then Save as experiment and Launch; Cancel; own text with its max new tokens and the hint of an
empty baseline; the configs editor's first columns."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import psutil
import pytest

from kvlab.dashboard import page_table
from kvlab.dashboard.playground import config_text, shade
from kvlab.store import Store
from tests.e2e.browsing import wait_idle
from tests.e2e.dashboard_server import CHROMIUM, start_dashboard
from tests.test_doctor import Behaviour, serve  # noqa: F401  (a server that records the Authorization it gets)
from tests.waiting import SAFETY_S

playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: scripts/setup.sh --dev")
expect = playwright.expect

pytestmark = [pytest.mark.e2e, pytest.mark.model,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no {CHROMIUM}: `apt-get install chromium`")]

CONFIGS = [{"evict": "streaming_llm", "ratio": 0.75}, {"evict": "snapkv", "ratio": 0.75, "query_aware": True}]
DASHBOARD_KEY = "sk-e2e-dashboards-own-key-0123456789"


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """One dashboard for the module's tests: its playground server, started by the first Run, serves them all."""
    folder = tmp_path_factory.mktemp("playground")
    url = f"sqlite:///{folder / 'kvlab.sqlite'}"
    with Store(url):
        pass  # the store's tables, as a first visit finds them
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("KVLAB_PLAYGROUND_URL", raising=False)
        for var in ("KVLAB_BASE_URL", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            patch.delenv(var, raising=False)
        # the dashboard's own key (issue 47 row 10): no link may aim it at a host of its choosing
        process, base = start_dashboard(url, folder / "streamlit.log", extra_env={"KVLAB_LOG_DIR": str(folder),
                                                                                  "KVLAB_API_KEY": DASHBOARD_KEY})
    try:
        yield base, url
    finally:
        started = psutil.Process(process.pid).children(recursive=True)  # its playground server among them
        process.terminate()
        process.wait(timeout=SAFETY_S)
        # SIGTERM ends the process by the signal after the server's shutdown (no atexit): the app's lifespan
        # stops what it started (kvlab.dashboard.process_exit), or the model's server would outlive it.
        _, alive = psutil.wait_procs(started, timeout=SAFETY_S)
        assert not alive, [" ".join(p.cmdline()) for p in alive]


@pytest.fixture
def page(dashboard, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 2400})
    opened = context.new_page()
    opened.set_default_timeout(SAFETY_S * 1000)
    try:
        yield opened
    finally:
        context.close()


def _open(page, base: str, query: str):
    """The playground at ``query``, idle, and its Run button."""
    page.goto(f"{base}/{page_table.PLAYGROUND.url_path}?{query}")
    run = page.get_by_test_id("stMain").get_by_role("button", name="Run")
    run.wait_for()
    wait_idle(page, after_input=False)
    return run


def _run_in_flight(page, run, progress: bool = True, done=None) -> None:
    """Click Run and see it in flight: disabled (a second click queues nothing), its progress shown (``progress``:
    a Run long enough for its first look, a quarter of a second on).  An own text's few tokens may be done before
    the button's disabled state is ever polled (a full suite once saw the button enabled again for 900 s): with
    ``done``, what the finished run shows, either event will do."""
    run.click()
    if done is None:
        expect(run).to_be_disabled()
    else:
        in_flight = page.get_by_test_id("stMain").get_by_role("button", name="Run", disabled=True)
        expect(in_flight.or_(done).first).to_be_visible()
    if progress:
        expect(page.get_by_test_id("stProgress")).to_be_visible()


def _header_cells(page, table) -> list[str]:
    """A data editor's column headings, as its accessible grid gives them (the grid itself is a canvas)."""
    headers = table.locator("th[role=columnheader]")
    headers.first.wait_for(state="attached")
    return [cell.text_content() or "" for cell in headers.all()]


def _metric(page, label: str):
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def test_a_playground_link_runs_maps_the_needle_and_becomes_an_experiment(dashboard, page):
    base, store_url = dashboard
    query = urlencode([("length", "1024"), ("seed", "3"), *(("config", config_text(c)) for c in CONFIGS)])
    run = _open(page, base, query)
    main = page.get_by_test_id("stMain")
    _run_in_flight(page, run)
    # the first Run starts kvlab serve, then the server's own progress
    expect(page.get_by_test_id("stProgress")).to_contain_text("configs answered")
    # the last config's token-map heading (the results table's cells, drawn on a canvas, hold the same
    # label in hidden cells: a heading is what the reader sees)
    main.locator("strong").filter(has_text="snapkv:r0.75/qa").wait_for()
    expect(run).to_be_enabled()
    wait_idle(page, after_input=False)
    verdicts = main.locator("p").filter(has_text="(right)").count(), main.locator("p").filter(
        has_text="(wrong)").count()
    assert verdicts[0] >= 1 and verdicts[1] >= 1  # the baseline right, StreamingLLM wrong
    maps = main.locator("[data-kvlab-map]")
    expect(maps).to_have_count(3)
    expect(main.locator("[data-kvlab-legend]")).to_contain_text("evicted by every head")
    for index in range(3):
        token_map = maps.nth(index)
        boxes = token_map.locator("[data-kvlab-answer]")
        expect(boxes).to_have_count(2)  # the passkey says its key twice: one box around each
        assert boxes.nth(0).text_content() == boxes.nth(1).text_content()
        # opened scrolled to the needle, mid-context: its first box within the map's visible part
        assert token_map.evaluate("map => map.scrollTop") > 0
        shown, box = token_map.bounding_box(), boxes.nth(0).bounding_box()
        assert shown["y"] <= box["y"] and box["y"] + box["height"] <= shown["y"] + shown["height"]
    for box in maps.nth(1).locator("[data-kvlab-answer]").all():  # StreamingLLM: the needle evicted by all
        for token in box.locator("span").all():
            assert token.get_attribute("style") == f"background:{shade(0.0)}"

    page.get_by_role("button", name="Save as experiment").click()
    page.get_by_role("heading", name="New experiment").wait_for()
    page.get_by_text("Loaded the playground's configs").wait_for()
    # the whole task: 10 items (spread over 5 depths), under the baseline and the 2 configs
    expect(_metric(page, "Evaluations")).to_have_text("30")
    items = page.get_by_label("Items per length", exact=True)
    items.fill("1")
    items.press("Enter")
    expect(_metric(page, "Evaluations")).to_have_text("3")
    wait_idle(page, after_input=False)
    page.get_by_test_id("stMain").get_by_role("button", name="Launch", exact=True).click()
    # the experiment's page, or the form's refusal (which fails here with its text, not a wait)
    page.get_by_role("heading", name="playground-passkey").or_(
        page.get_by_test_id("stAlertContentError")).first.wait_for()
    errors = page.get_by_test_id("stAlertContentError")
    assert errors.count() == 0, errors.first.inner_text()
    assert f"/{page_table.EXPERIMENT.url_path}?id=1" in page.url
    with Store(store_url) as store:
        experiment = store.get_experiment(1)
        store.cancel_experiment(1)  # its workers stop: the test is about the hand-over, not the run
    assert experiment.name == "playground-passkey"
    assert [c["evict"] for c in experiment.spec["configs"]] == [c["evict"] for c in CONFIGS]
    assert experiment.spec["tasks"][0]["context_lengths"] == [1024]


def test_cancel_stops_a_run_in_flight_and_a_later_run_answers(dashboard, page):
    """Cancel while the server works: the page says so, Run is enabled again at once, and the next Run answers
    (its server stopped the cancelled run: tests/serve/test_playground_runs.py sees it stop within a layer)."""
    run = _open(page, dashboard[0], urlencode([("length", "2048"), ("seed", "11")]))
    _run_in_flight(page, run)
    expect(page.get_by_test_id("stProgress")).to_contain_text("configs answered")  # the server's own progress
    page.get_by_test_id("stMain").get_by_role("button", name="Cancel").click()
    expect(page.get_by_text("The Run was cancelled.")).to_be_visible()
    expect(run).to_be_enabled()
    expect(page.locator("[data-kvlab-map]")).to_have_count(0)
    _run_in_flight(page, run)
    expect(page.locator("[data-kvlab-map]")).to_have_count(5)  # the baseline and the 4 default configs
    expect(run).to_be_enabled()


OWN_TEXT = {"source": "text", "context": "The secret code is 4417. Remember: 4417.", "question": " The secret code is",
            "answer": "4417", "config": config_text({"quant": "int8"})}


def test_own_text_sends_its_max_new_tokens_and_an_empty_baseline_says_why(dashboard, page):
    """Max new tokens reaches the server: 3 tokens give the code's first two digits (SmolLM2 writes " 4417" as a
    space and four digits); 1 token is the space alone, a blank answer, and the page says why it can be."""
    run = _open(page, dashboard[0], urlencode(OWN_TEXT | {"max_new_tokens": "3"}))
    expect(page.get_by_label("Max new tokens", exact=True)).to_have_value("3")
    main = page.get_by_test_id("stMain")
    baseline = main.locator("p").filter(has_text=re.compile(r"^baseline \("))
    _run_in_flight(page, run, progress=False, done=baseline.filter(has_text="44"))
    expect(baseline).to_have_text("baseline (wrong): 44")
    expect(main.locator("[data-kvlab-map]").first.locator("[data-kvlab-answer]")).to_have_count(2)
    expect(page.get_by_text("The baseline answered nothing")).to_have_count(0)
    tokens = page.get_by_label("Max new tokens", exact=True)
    tokens.fill("1")
    tokens.press("Enter")
    expect(page).to_have_url(re.compile(r"[?&]max_new_tokens=1(&|$)"))  # in the link, like every field
    wait_idle(page, after_input=False)
    _run_in_flight(page, run, progress=False, done=page.get_by_text("The baseline answered nothing"))
    expect(page.get_by_text("The baseline answered nothing")).to_contain_text("its one new token (all that Max new "
                                                                              "tokens allows) was blank space")
    expect(baseline).to_have_text(re.compile(r"^baseline \(wrong\):\s*$"))


def test_the_configs_editor_opens_with_name_method_ratio_and_format_in_view(dashboard, page):
    base = dashboard[0]
    _open(page, base, "")
    editor = page.get_by_test_id("stMain").locator("[data-testid=stDataFrame]").first
    assert _header_cells(page, editor)[:3] == ["evict", "ratio (removed)", "quant"]  # a config's name: its label
    page.goto(f"{base}/{page_table.NEW.url_path}")
    page.get_by_role("heading", name="KV-cache configs").wait_for()
    editor = page.get_by_test_id("stMain").locator("[data-testid=stDataFrame]").filter(
        has=page.locator("th", has_text="evict"))
    assert _header_cells(page, editor)[:4] == ["name", "evict", "ratio (removed)", "quant"]
    names = editor.locator("td[aria-colindex='1']")  # each row's name, as the grid's accessible table has it
    names.first.wait_for(state="attached")
    assert names.count() >= 1 and all((cell.text_content() or "").strip() for cell in names.all())


def test_a_share_link_does_not_aim_the_dashboards_key_at_its_host(dashboard, page, serve):  # noqa: F811
    """Issue 47 row 10: `/playground?engine=endpoint&base_url=http://HOST/v1&model_id=m&source=text&context=x&
    question=q` and one click on Run sent `Authorization: Bearer <KVLAB_API_KEY>` to HOST without a word."""
    recorder = Behaviour(models=("m",))
    host = serve(recorder)
    run = _open(page, dashboard[0], urlencode({"engine": "endpoint", "base_url": f"{host}/v1", "model_id": "m",
                                               "source": "text", "context": "x", "question": "q"}))
    said = page.get_by_text("Key: none sent.")
    expect(said).to_contain_text(f"not to {host}: it is not sent there")  # said before the Run
    run.click()
    page.get_by_test_id("stAlertContentError").or_(page.get_by_test_id("stDataFrame").nth(1)).first.wait_for()
    expect(run).to_be_enabled()
    assert recorder.authorization and not any(DASHBOARD_KEY in sent for sent in recorder.authorization)
    assert DASHBOARD_KEY not in page.content()


def test_out_of_range_link_numbers_are_one_line_each_and_the_page_is_drawn(dashboard, page):
    """Issue 47 row 12: `length=200000`, `seed=-5`, `depth=2` (and `row=0`, `seed=1e23`, `length=10`) stopped
    the page with "Something went wrong on this page (StreamlitValueAboveMaxError...)"."""
    for query, lines in ((urlencode({"length": "200000", "seed": "-5", "depth": "2"}), [
                             "length=200000 is out of range (64-8,192); left at its default",
                             "depth=2 is out of range (0.0-1.0); left at its default",
                             "seed=-5 is out of range (0-9,007,199,254,740,991); left at its default"]),
                         (urlencode({"length": "10", "seed": "1e23"}), [
                             "length=10 is out of range (64-8,192); left at its default",
                             "seed=1e23 is out of range (0-9,007,199,254,740,991); left at its default"]),
                         (urlencode({"source": "file", "row": "0"}), [
                             "row=0 is out of range (1-9,007,199,254,740,991); left at its default"])):
        _open(page, dashboard[0], query)
        warnings = page.get_by_test_id("stAlertContentWarning")
        expect(warnings).to_have_count(len(lines))
        assert [w.inner_text().split("\n")[-1] for w in warnings.all()] == [f"The link's {line}" for line in lines]
        expect(page.get_by_text("Something went wrong")).to_have_count(0)
        expect(page.get_by_label("Context (tokens)" if "row" not in query else "Row", exact=True)).to_have_value(
            "1024" if "row" not in query else "1")


def test_own_text_too_long_for_a_link_stays_out_of_it_and_save_is_off(dashboard, page):
    """Issue 47 row 7: own-text links carried the whole text (~1,000 characters); Save as experiment was enabled
    for own text, then failed."""
    _open(page, dashboard[0], urlencode({"source": "text", "question": "What is the code?"}))
    save = page.get_by_role("button", name="Save as experiment")
    expect(save).to_be_disabled()
    context = page.get_by_label("Context (compressed)")
    context.fill("The secret code is 4417. " * 44)  # 1,100 characters
    context.press("Control+Enter")
    sidebar = page.get_by_test_id("stSidebar")
    expect(sidebar).to_contain_text("characters) is not in the link")
    link = sidebar.locator("code").first.inner_text()
    assert "context=" not in link and "question=" not in link and "source=text" in link
    assert "context=" not in page.url
    expect(context).to_have_value("The secret code is 4417. " * 44)  # the page keeps it
