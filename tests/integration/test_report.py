"""The capacity-review report: built from a finished small tune, escaped, partial runs, a browser.

Every test reads the session's one small tune (``tuned_run``, see conftest.py); the ones
that change the run work on a copy. The browser test loads the report in headless
Chromium with the network cut off three ways (host resolver mapping every name to
nowhere, a proxy that does not exist, DevTools offline emulation) and fails on any
request that is not the file itself, on any console error, and on a chart that did not
render; it leaves a full-page screenshot and a PDF print in its tmp directory.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from reports.html import write_report
from tuner.errors import ReportError
from tuner.run.edge import EdgeResult
from tuner.run.evaluation import Evaluation
from tuner.run.recommendation import Recommendation
from tuner.run.records import TuneRecord
from tuner.run.summary import TuneSummary
from tuner.vllm.memory import Calibration
from workloads.load_result import LoadResult

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the shared tune takes minutes

SECTIONS = ("summary", "edge", "tradeoffs", "memory", "latency", "trials", "how")
PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'


class _Page(HTMLParser):
    """Tags with their attributes, and each script's attributes and body."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append((dict(attrs), ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            attrs, body = self.scripts[-1]
            self.scripts[-1] = (attrs, body + data)


def parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def chart_specs(text: str) -> dict[str, dict[str, Any]]:
    return {
        str(attrs["data-target"]): json.loads(body)
        for attrs, body in parse(text).scripts
        if attrs.get("class") == "fig-data"
    }


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("vllm-cache", "report.html"))
    return dst


@pytest.fixture(scope="module")
def report(tuned_run: Path) -> str:
    """The report `tuner tune` itself wrote at the end of the run."""
    path = tuned_run / "report.html"
    assert path.is_file(), "tuner tune did not write report.html"
    return path.read_text(encoding="utf-8")


# --- what the report holds -------------------------------------------------------------


def test_tune_writes_the_report_and_names_it_in_the_summary(tuned_run: Path) -> None:
    summary = TuneSummary.model_validate_json((tuned_run / "summary.json").read_text())
    assert summary.report == str(tuned_run / "report.html")


def test_report_is_one_self_contained_file(report: str) -> None:
    from plotly.offline import get_plotlyjs

    page = parse(report)
    plotly_head = get_plotlyjs()[:300]
    assert report.count(plotly_head) == 1, "plotly's JavaScript must be embedded exactly once"
    for tag, attrs in page.tags:
        for name in ("src", "href", "data", "action", "poster"):
            value = (attrs.get(name) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//", "ftp:")), (tag, name, value)
        assert not (tag == "link" and attrs.get("rel") == "stylesheet"), "no external stylesheet"
        assert not (tag == "script" and attrs.get("src")), "no script loaded from anywhere"
    styles = report[report.index("<style>") : report.index("</style>")]
    assert "@import" not in styles and "@font-face" not in styles and "url(" not in styles
    assert "@media print" in styles and "@page" in styles


def test_report_sections_come_in_the_order_a_reviewer_reads_them(report: str) -> None:
    positions = [report.index(f'<section class="card" id="{s}">') for s in SECTIONS]
    assert positions == sorted(positions)
    assert 'id="sim-banner"' in report and "SIMULATED" in report  # the sim backend


def test_every_chart_has_data_and_the_expected_charts_are_there(report: str) -> None:
    specs = chart_specs(report)
    for key in ("edge-map", "probe-memory", "tradeoffs", "latency-cdf", "bucket-latency"):
        assert f"chart-{key}" in specs, f"chart {key} missing"
    assert any(k.startswith("chart-memory-trial-") for k in specs)
    assert any(k.startswith("chart-memory-probe-") for k in specs)
    for key, spec in specs.items():
        assert spec["data"], f"{key} has no traces"
    names = {t.get("name") for t in specs["chart-edge-map"]["data"]}
    assert "memory model: starts inside this boundary" in names  # the predicted boundary
    assert "failed to start: out of memory" in names  # the small tune's edge probe at 1.0


def test_every_trial_is_in_the_table(tuned_run: Path, report: str) -> None:
    import optuna

    study_name = TuneSummary.model_validate_json((tuned_run / "summary.json").read_text()).study
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tuned_run / 'study.db'}")
    table = report[
        report.index('id="trials-table"') : report.index(
            "</table>", report.index('id="trials-table"')
        )
    ]
    rows = table.count("<tr") - 1  # the header row
    assert rows == len(study.trials) > 0
    for trial in study.trials:
        assert f'data-v="{trial.number}"' in table


def test_summary_shows_the_recommendation_beside_the_defaults(tuned_run: Path, report: str) -> None:
    rec = Recommendation.model_validate_json(
        (tuned_run / "recommendation" / "recommendation.json").read_text()
    )
    assert rec.recommended.measured is not None and rec.default is not None
    summary = report[report.index('id="summary"') : report.index('id="edge"')]
    assert f"{rec.recommended.measured.goodput:.2f} req/s" in summary
    assert rec.default.measured is not None
    assert f"{rec.default.measured.goodput:.2f}" in summary
    for label in ("TTFT p50", "TTFT p99", "ITL p99", "End-to-end p99", "Replicas"):
        assert label in summary
    assert "Headroom to the OOM edge" in summary
    # The variants' table says at which offered rate each was measured: the same one.
    held = rec.recommended.measured.rate_per_s
    assert held is not None
    table = summary[summary.index("What headroom costs") :]
    assert "Offered<br>req/s" in table and "the other variants at that same offered rate" in table
    assert table.count(f'<td class="num">{held:.2f}</td>') >= 3  # goodput may equal it


def test_latency_cdf_is_in_the_emulated_gpus_time_and_matches_the_measured_p99(
    tuned_run: Path, report: str
) -> None:
    """The CDF is rebuilt from requests.jsonl; its p99 must be the LoadResult's p99."""
    rec = Recommendation.model_validate_json(
        (tuned_run / "recommendation" / "recommendation.json").read_text()
    )
    confirmed = Evaluation.model_validate_json(
        (tuned_run / "confirm" / "recommended" / "evaluation.json").read_text()
    )
    assert confirmed.best is not None
    level_dir = tuned_run / "confirm" / "recommended" / Path(confirmed.best.dir).name
    load = LoadResult.from_file(level_dir / "requests.jsonl").in_virtual_time(rec.time_scale)
    spec = chart_specs(report)["chart-latency-cdf"]
    ttft = next(t for t in spec["data"] if t["xaxis"] == "x" and "recommended" in t["name"])
    xs, ys = ttft["x"], ttft["y"]
    p99_from_cdf = next(x for x, y in zip(xs, ys, strict=True) if y >= 0.99)
    assert load.ttft_ms.p99 is not None
    assert p99_from_cdf == pytest.approx(load.ttft_ms.p99, rel=0.05)
    assert max(ys) == pytest.approx(1.0)


# --- escaping ------------------------------------------------------------------------------


def _string_paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _string_paths(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _string_paths(value, (*path, i))
    elif isinstance(node, str):
        yield path


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        node = node[part]
    return node


def _set(node: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _add_to_dicts(node: Any, key: str, make: Callable[[], Any]) -> None:
    """Every dict named ``key`` gets an injected entry; every None ``failure`` becomes one."""
    if isinstance(node, dict):
        for name, value in list(node.items()):
            if name == key and isinstance(value, dict):
                value[f"x{PAYLOAD}"] = PAYLOAD
            elif name == "failure" and value is None:
                node[name] = make()
            else:
                _add_to_dicts(value, key, make)
    elif isinstance(node, list):
        for value in node:
            _add_to_dicts(value, key, make)


def inject(path: Path, model: type[BaseModel]) -> int:
    """Append the payload to every string the model accepts it in; returns how many took it."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    _add_to_dicts(
        doc, "flags", lambda: {"kind": "engine_died", "error_type": PAYLOAD, "message": PAYLOAD}
    )
    if "log_excerpt" in doc:
        doc["log_excerpt"] = (doc["log_excerpt"] or "") + PAYLOAD
    taken = 0
    for p in list(_string_paths(doc)):
        before = _get(doc, p)
        if PAYLOAD in before:
            taken += 1
            continue
        _set(doc, p, before + PAYLOAD)
        try:
            model.model_validate(doc)
        except ValidationError:
            _set(doc, p, before)  # an enum, a literal or a path: not free text
        else:
            taken += 1
    model.model_validate(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return taken


@pytest.fixture(scope="module")
def injected_run(tuned_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the run with the payload in every free-text field of every file and the study."""
    run = copy_run(tuned_run, tmp_path_factory.mktemp("injected") / "run")
    taken = inject(run / "tune.json", TuneRecord)
    taken += inject(run / "summary.json", TuneSummary)
    taken += inject(run / "edge" / "edge.json", EdgeResult)
    taken += inject(run / "recommendation" / "recommendation.json", Recommendation)
    taken += inject(run / "calibration.json", Calibration)
    for path in [*run.glob("trials/*/evaluation.json"), *run.glob("confirm/*/evaluation.json")]:
        taken += inject(path, Evaluation)
    assert taken > 50
    with sqlite3.connect(run / "study.db") as db:  # roles, failure messages, study attributes
        db.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE key = 'role'",
            (json.dumps(PAYLOAD),),
        )
        db.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE key IN ('failure_message', 'dir')",
            (json.dumps(PAYLOAD),),
        )
        db.execute("UPDATE study_user_attributes SET value_json = ? WHERE key IN ('model', 'workload')", (json.dumps(PAYLOAD),))  # fmt: skip
    write_report(run)
    return run


def test_everything_from_outside_is_escaped(injected_run: Path) -> None:
    text = (injected_run / "report.html").read_text(encoding="utf-8")
    assert "<script>window.__pwned" not in text
    assert "<img src=x" not in text
    page = parse(text)
    assert not [t for t, _ in page.tags if t == "img"]
    assert not [t for t, attrs in page.tags if any(k.startswith("on") for k in attrs)]
    own = text.count('<script type="application/json" class="fig-data"')
    assert text.lower().count("<script") == own + 2  # plotly.js and the page's own script
    shown = text.count("&lt;script&gt;window.__pwned=1&lt;/script&gt;")
    assert shown >= 30, f"the payload was shown escaped only {shown} times"
    for field in ("log excerpt", "Model", "Workload", "Notes from the run"):
        assert field in text
    # the charts carry it too, escaped for plotly's text and for the <script> element
    for _, body in page.scripts:
        assert "</script" not in body.lower() and "<img" not in body.lower()


# --- partial runs and bad directories ------------------------------------------------------


def test_a_run_without_recommendation_edge_or_study_still_reports(
    tuned_run: Path, tmp_path: Path
) -> None:
    run = copy_run(tuned_run, tmp_path / "run")
    for name in ("recommendation", "edge", "confirm"):
        shutil.rmtree(run / name)
    (run / "summary.json").unlink()
    (run / "study.db").unlink()
    for path in run.glob("trials/*/evaluation.json"):  # no trial met the SLOs
        doc = json.loads(path.read_text())
        doc.update(verdict="slo_missed", best=None, goodput_requests_per_s=0.0, rate_per_s=None)
        path.write_text(json.dumps(doc))
    text = write_report(run).read_text(encoding="utf-8")
    assert "No recommendation: no trial met the SLOs." in text
    missing = text[text.index('id="missing"') : text.index('id="summary"')]
    assert "recommendation" in missing and "OOM edge" in missing and "study" in missing
    assert "No OOM-edge result" in text
    specs = chart_specs(text)
    assert "chart-edge-map" in specs and "chart-tradeoffs" in specs
    assert text.count('class="pill" style="background: #ef6c00"') == len(list(run.glob("trials/*")))


def test_a_run_tuned_with_no_edge_says_so(tuned_run: Path, tmp_path: Path) -> None:
    run = copy_run(tuned_run, tmp_path / "run")
    shutil.rmtree(run / "edge")
    tune = json.loads((run / "tune.json").read_text())
    tune["config"]["edge"] = False
    (run / "tune.json").write_text(json.dumps(tune))
    rec = json.loads((run / "recommendation" / "recommendation.json").read_text())
    rec["edge"] = None
    (run / "recommendation" / "recommendation.json").write_text(json.dumps(rec))
    text = write_report(run).read_text(encoding="utf-8")
    assert "The OOM-edge search did not run (--no-edge)" in text
    assert "the run was started with --no-edge" in text
    assert "chart-memory-probe-" not in text


def test_the_load_generator_row_names_the_load_hosts(tuned_run: Path, tmp_path: Path) -> None:
    assert "Locust, 1 local process(es), open loop" in (tuned_run / "report.html").read_text()
    run = copy_run(tuned_run, tmp_path / "run")
    tune = json.loads((run / "tune.json").read_text())
    tune["config"].update(processes=0, load_workers=4, load_master_bind="10.0.0.5:5557")
    (run / "tune.json").write_text(json.dumps(tune))
    text = write_report(run).read_text(encoding="utf-8")
    assert (
        "Locust, 0 local process(es) and 4 worker(s) on load hosts (master 10.0.0.5:5557), "
        "open loop" in text
    )


def test_a_directory_that_is_not_a_tune_run_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"tune\.json is missing"):
        write_report(tmp_path)
    (tmp_path / "tune.json").write_text("{}")
    with pytest.raises(ReportError, match=r"tune.json: not the tune.json"):
        write_report(tmp_path)
    with pytest.raises(ReportError, match="not a directory"):
        write_report(tmp_path / "nope")
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "report", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "not a directory" in done.stderr


def test_tuner_report_rebuilds_the_report(tuned_run: Path, tmp_path: Path) -> None:
    run = copy_run(tuned_run, tmp_path / "moved")  # absolute paths inside are rebased
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "report", str(run)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(run / "report.html")
    text = (run / "report.html").read_text(encoding="utf-8")
    assert len(chart_specs(text)) >= 8
    assert str(run) in text


def _report_cmd(run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "report", str(run), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_damaged_study_is_said_on_the_terminal(tuned_run: Path, tmp_path: Path) -> None:
    run = copy_run(tuned_run, tmp_path / "run")
    db = run / "study.db"
    db.write_bytes(db.read_bytes()[:2048])  # truncated: the header, none of the tables
    done = _report_cmd(run)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tuner: WARNING:"), done.stderr
    assert str(db) in lines[0] and "could not be read" in lines[0]
    assert "Background on this error" not in lines[0]
    assert (run / "report.html").is_file()  # what the run's own files hold


def test_an_unreadable_storage_is_one_error_line_and_writes_nothing(
    tuned_run: Path, tmp_path: Path
) -> None:
    run = copy_run(tuned_run, tmp_path / "run")
    secret = "Rpt-s3cret-9"
    for url in (
        f"postgresql+psycopg://tuner@127.0.0.1:1/tuning?password={secret}",
        f"postgresql+psycopg://tuner:{secret}@127.0.0.1:1/tuning",
        f"postgresql+psycopg://tuner:{secret}@x@127.0.0.1:1/tuning",  # a raw '@' in it
        f"sqlite:///{tmp_path / 'nowhere.db'}",
    ):
        done = _report_cmd(run, "--storage", url)
        assert done.returncode == 2, done.stdout + done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("tuner: error:"), done.stderr
        assert secret not in done.stderr and "x@127" not in done.stderr
        assert "Background on this error" not in done.stderr
        assert not (run / "report.html").exists()
    assert not (tmp_path / "nowhere.db").exists()


def test_a_deleted_evaluation_is_read_from_the_studys_copy(tuned_run: Path, tmp_path: Path) -> None:
    run = copy_run(tuned_run, tmp_path / "run")
    (run / "trials" / "001" / "evaluation.json").unlink()
    done = _report_cmd(run)
    assert done.returncode == 0, done.stderr
    text = (run / "report.html").read_text(encoding="utf-8")
    assert "no evidence" not in text
    missing = text[text.index('id="missing"') : text.index('id="summary"')]
    assert "trial 1" in missing and "copy the study keeps" in missing


# --- in a real browser -----------------------------------------------------------------------

ALLOWED_SCHEMES = ("file:", "data:", "blob:", "about:")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip(
            "headless Chromium is not installed (Debian packages chromium and chromium-driver; "
            "tools/install_browser.sh installs them)"
        )
    options = Options()
    options.binary_location = chromium
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--window-size=1280,1000", "--hide-scrollbars",
        # No network: every name resolves to nothing, every connection goes to a proxy that
        # is not there, loopback included; Chrome's own background traffic is off.
        "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
        "--proxy-bypass-list=<-loopback>", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-default-apps",
        "--disable-extensions", "--no-first-run", "--disable-features=Translate,OptimizationHints",
    ):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except Exception as exc:  # a Chromium that cannot start here (no shared memory, ...)
        pytest.skip(f"headless Chromium does not start: {exc}".splitlines()[0])
    driver.set_page_load_timeout(120)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    try:
        yield driver
    finally:
        driver.quit()


def _load(driver: Any, path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what an earlier page left
    driver.get_log("performance")
    driver.get(path.as_uri())
    WebDriverWait(driver, 120).until(
        lambda d: d.execute_script(
            "const c = document.querySelectorAll('div.chart');"
            "return c.length > 0 && Array.from(c).every(d => d.querySelector('.main-svg'));"
        )
    )


def _requests(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
        elif message["method"] == "Network.webSocketCreated":
            urls.append(message["params"]["url"])
    urls += driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name);"
    )
    return urls


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.browser
def test_report_in_a_browser_offline(browser: Any, tuned_run: Path, tmp_path: Path) -> None:
    report = tuned_run / "report.html"
    _load(browser, report)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], f"console errors: {errors}"
    outgoing = [u for u in _requests(browser) if not u.startswith(ALLOWED_SCHEMES)]
    assert outgoing == [], f"the report asked the network for {outgoing}"
    rendered = browser.execute_script(
        "return Array.from(document.querySelectorAll('div.chart')).map(d => "
        "[d.id, d.querySelectorAll('.main-svg').length, d.getBoundingClientRect().width]);"
    )
    expected = len(chart_specs(report.read_text(encoding="utf-8")))
    assert len(rendered) == expected >= 8
    for chart_id, svgs, width in rendered:
        assert svgs >= 1 and width > 300, f"{chart_id} did not render"

    # the trial table sorts by a column
    browser.execute_script(
        "Array.from(document.querySelectorAll('#trials-table th')).find(t => t.textContent.startsWith('Goodput')).click();"
    )
    column = browser.execute_script(
        "const th = Array.from(document.querySelectorAll('#trials-table th'));"
        "const i = th.findIndex(t => t.textContent.startsWith('Goodput'));"
        "return Array.from(document.querySelectorAll('#trials-table tbody tr')).map(r => r.cells[i].dataset.v);"
    )
    values = [float(v) for v in column if v]
    assert values == sorted(values) and len(values) >= 2

    metrics = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})
    width, height = metrics["cssContentSize"]["width"], metrics["cssContentSize"]["height"]
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True,
         "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
    )  # fmt: skip
    png = base64.b64decode(shot["data"])
    (tmp_path / "report.png").write_bytes(png)
    assert _png_size(png)[1] > 3000  # the whole page, not the viewport

    # printed: the SIMULATED banner repeats on every page, navigation is left out
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    banner, nav = browser.execute_script(
        "return [getComputedStyle(document.getElementById('sim-banner')).position,"
        " getComputedStyle(document.querySelector('nav.toc')).display];"
    )
    assert (banner, nav) == ("fixed", "none")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
    pdf = base64.b64decode(
        browser.execute_cdp_cmd(
            "Page.printToPDF", {"printBackground": True, "preferCSSPageSize": True}
        )["data"]
    )
    (tmp_path / "report.pdf").write_bytes(pdf)
    assert pdf.startswith(b"%PDF") and len(pdf) > 50_000


@pytest.mark.browser
def test_injected_report_runs_no_injected_script(browser: Any, injected_run: Path) -> None:
    _load(browser, injected_run / "report.html")
    assert browser.execute_script("return window.__pwned === undefined;")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], f"console errors: {errors}"
    outgoing = [u for u in _requests(browser) if not u.startswith(ALLOWED_SCHEMES)]
    assert outgoing == []
    shown = browser.execute_script(
        "return document.body.innerText.split('window.__pwned=1').length - 1;"
    )
    assert shown >= 30


# --- pieces, without a run ---------------------------------------------------------------------


def test_pareto_front_keeps_only_undominated_points() -> None:
    from reports.charts import pareto

    points = [
        (500.0, 10.0, 1),
        (400.0, 12.0, 2),
        (900.0, 30.0, 3),
        (950.0, 25.0, 4),
        (400.0, 5.0, 5),
    ]
    assert [p[2] for p in pareto(points)] == [2, 3]


def test_gpu_timeline_is_placed_on_the_metrics_clock_only_when_it_fits(tmp_path: Path) -> None:
    import os

    from tuner.run.levels import timeline
    from tuner.serving.gpu_sampler import TIMELINE_COLUMNS

    level = tmp_path / "level-0"
    level.mkdir()
    rows = [f"{t},0,100,50,50,0.0,0.0,,50" for t in (0.0, 1.0, 2.0, 3.0)]
    (tmp_path / "gpu.csv").write_text(",".join(TIMELINE_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    (level / "metrics.csv").write_text(
        "unix_s,kv_cache_usage,running,waiting,preemptions_total\n"
        "1000001.000,0.1,1,0,0\n1000002.000,0.5,2,1,3\n"
    )
    os.utime(tmp_path / "gpu.csv", (1000003.0, 1000003.0))  # stopped at t_s 3.0
    placed = timeline("t", tmp_path, [("level 0", level)])
    assert placed.anchor_unix_s == pytest.approx(1000000.0)
    assert placed.note is None and len(placed.levels[0][1]) == 2
    os.utime(tmp_path / "gpu.csv", (2000000.0, 2000000.0))  # copied: the mtime says nothing
    unplaced = timeline("t", tmp_path, [("level 0", level)])
    assert (
        unplaced.anchor_unix_s is None and unplaced.note and "could not be placed" in unplaced.note
    )
