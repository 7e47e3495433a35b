"""Figures (traces, Pareto front, baseline band, units on every axis) and their exports."""

from __future__ import annotations

import html
import re

import pytest

from kvlab.analysis.summary import breakdown, summarize
from kvlab.core.margins import Margins
from kvlab.core.units import MIB
from kvlab.dashboard import charts
from kvlab.dashboard.chart_export import browser_path, figure_html, figure_image, redact, report_html
from kvlab.dashboard.compare_view import compare_rows
from kvlab.paths import STATIC_DIR
from kvlab.store import TelemetrySample
from tests.dashboard_data import PROFILE, item_result

RESULTS = [item_result(config, index, length, depth) for config in PROFILE
           for index, (length, depth) in enumerate((n, d) for n in (256, 512) for d in (0.1, 0.9) for _ in range(2))]
SUMMARIES = summarize(RESULTS, "baseline", Margins(max_drop=0.5))  # 8 items: only a wide margin can show one
needs_chromium = pytest.mark.skipif(browser_path() is None, reason="no Chromium: `apt-get install chromium`")


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_tradeoff_bytes_has_front_band_and_sweet_spot():
    fig = charts.tradeoff_figure(SUMMARIES, "bytes")
    assert fig.layout.xaxis.title.text == "physical KV cache (MiB)"
    assert "accuracy" in fig.layout.yaxis.title.text and "95% CI" in fig.layout.yaxis.title.text
    configs = _trace(fig, "configs")
    assert list(configs.text) == ["baseline", "int4", "int2", "snapkv-50"]
    by_name = {s.config_name: s for s in SUMMARIES}
    assert configs.x[1] == pytest.approx(by_name["int4"].physical_kv_bytes / MIB)
    assert list(configs.error_y.arrayminus)[2] == pytest.approx(0.5 - by_name["int2"].ci_low)
    # int2 (fewest bytes) and int4 (baseline accuracy at a quarter of the bytes) dominate the rest
    front = _trace(fig, "Pareto front")
    assert list(front.x) == pytest.approx([by_name["int2"].physical_kv_bytes / MIB,
                                           by_name["int4"].physical_kv_bytes / MIB])
    assert list(front.y) == [0.5, 1.0]
    band = next(s for s in fig.layout.shapes if s.type == "rect")
    assert (band.y0, band.y1) == pytest.approx((by_name["baseline"].ci_low, by_name["baseline"].ci_high))
    assert list(_trace(fig, "sweet spot").x) == pytest.approx([by_name["int4"].physical_kv_bytes / MIB])
    assert any("sweet spot: int4 (3.70x, decided by passkey: accuracy)" in a.text for a in fig.layout.annotations)
    assert any("-0.5, Holm" in a.text.replace("<br>", " ") for a in fig.layout.annotations)
    hover = _trace(fig, "configs").hovertext
    assert "vs baseline (pooled) +0.000 [" in hover[1] and "acceptable on every task" in hover[1]
    assert "not acceptable: passkey stopped it (accuracy)" in hover[2] and "non-inferior at" not in hover[2]


def test_tradeoff_without_a_non_inferior_config_says_why():
    fig = charts.tradeoff_figure(summarize(RESULTS, "baseline"), "bytes")
    assert not any(t.name == "sweet spot" for t in fig.data)
    notes = [a.text.replace("<br>", " ") for a in fig.layout.annotations]
    assert any("No config is shown non-inferior within 0.05 on 8 items" in text for text in notes)


def test_tradeoff_ratio_axis_and_bad_axis():
    fig = charts.tradeoff_figure(SUMMARIES, "ratio")
    assert fig.layout.xaxis.title.text.startswith("compression ratio (x")
    assert list(_trace(fig, "configs").x) == pytest.approx([1.0, 1 / 0.27, 1 / 0.15, 2.0], rel=1e-3)
    with pytest.raises(ValueError, match="axis"):
        charts.tradeoff_figure(SUMMARIES, "tokens")


def test_tradeoff_without_baseline_results_draws_no_band():
    fig = charts.tradeoff_figure([s for s in SUMMARIES if s.config_name != "baseline"], "bytes")
    assert not [s for s in fig.layout.shapes if s.type == "rect"]
    assert "sweet spot" not in {t.name for t in fig.data}


FIDELITY_RESULTS = [item_result(config, index, length, depth, fidelity=True) for config in PROFILE
                    for index, (length, depth) in enumerate((n, d) for n in (256, 512) for d in (0.1, 0.9)
                                                            for _ in range(2))]
FIDELITY_SUMMARIES = summarize(FIDELITY_RESULTS, "baseline", Margins(max_drop=0.5, min_agreement=0.5))


def test_tradeoff_y_metric_mean_kl_with_its_interval_and_margin():
    fig = charts.tradeoff_figure(FIDELITY_SUMMARIES, "ratio", metric="KL")
    assert "mean KL" in fig.layout.yaxis.title.text and "nats" in fig.layout.yaxis.title.text
    assert "lower is better" in fig.layout.yaxis.title.text
    configs = _trace(fig, "configs")
    measured = [s for s in FIDELITY_SUMMARIES if s.mean_kl is not None]
    assert list(configs.text) == ["int4", "int2", "snapkv-50"]  # the baseline has no KL against itself
    assert list(configs.y) == pytest.approx([s.mean_kl for s in measured])
    assert list(configs.error_y.array) == pytest.approx([s.kl_ci_high - s.mean_kl for s in measured])
    assert list(configs.error_y.arrayminus) == pytest.approx([s.mean_kl - s.kl_ci_low for s in measured])
    assert not [s for s in fig.layout.shapes if s.type == "rect"]  # no baseline accuracy band on a KL view
    # the front trades bytes against KL, lower being better: a config is on it unless another holds fewer
    # bytes with no more KL (by hand, from the summaries)
    dominated = {s.config_name for s in measured for o in measured
                 if o is not s and o.physical_kv_bytes <= s.physical_kv_bytes and o.mean_kl <= s.mean_kl}
    front = _trace(fig, "Pareto front")
    assert sorted(front.y) == sorted(s.mean_kl for s in measured if s.config_name not in dominated)
    assert dominated and len(front.y) < len(measured)  # the front really leaves some config out
    [margin] = [s for s in fig.layout.shapes if s.type == "line"]
    assert margin.y0 == margin.y1 == FIDELITY_SUMMARIES[0].max_kl
    sweet = _trace(fig, "sweet spot")  # int4: certified, the others not
    assert list(sweet.y) == pytest.approx([measured[0].mean_kl])
    rule = " ".join(a.text.replace("<br>", " ") for a in fig.layout.annotations)
    assert "fidelity to the baseline certified (mean KL below 0.05 nats per token and top-1 agreement above 50%" in rule
    assert "mean KL " in configs.hovertext[0] and "decided by passkey: fidelity" in configs.hovertext[0]


def test_tradeoff_y_metric_agreement_and_an_experiment_without_fidelity():
    fig = charts.tradeoff_figure(FIDELITY_SUMMARIES, "bytes", metric="agreement")
    configs = _trace(fig, "configs")
    measured = [s for s in FIDELITY_SUMMARIES if s.agreement is not None]
    assert list(configs.y) == pytest.approx([s.agreement for s in measured])
    assert list(configs.error_y.arrayminus) == pytest.approx([s.agreement - s.agreement_ci_low for s in measured])
    assert "agreement" in fig.layout.yaxis.title.text
    [margin] = [s for s in fig.layout.shapes if s.type == "line"]
    assert margin.y0 == 0.5  # min_agreement
    unmeasured = charts.tradeoff_figure(SUMMARIES, "bytes", metric="KL")
    assert list(_trace(unmeasured, "configs").x) == [] and "sweet spot" not in {t.name for t in unmeasured.data}
    assert any("not measured" in a.text for a in unmeasured.layout.annotations)
    with pytest.raises(ValueError, match="metric"):
        charts.tradeoff_figure(SUMMARIES, "bytes", metric="perplexity")


def test_one_items_kl_along_its_tokens_marks_each_first_divergence():
    item = "passkey-256-0"  # int2 and snapkv-50 get it wrong: they diverge there, int4 does not
    fidelities = {r.config_name: r.fidelity for r in FIDELITY_RESULTS if r.item_id == item and r.fidelity}
    fig = charts.item_kl_figure(FIDELITY_RESULTS, item)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["int4", "int2", "snapkv-50"]
    for line in lines:
        assert list(line.x) == list(range(fidelities[line.name].tokens))
        assert list(line.y) == pytest.approx(fidelities[line.name].kl)
    marks = {t.name: t for t in fig.data if t.mode == "markers"}
    assert set(marks) == {"int2: first divergence", "snapkv-50: first divergence"}
    for name in ("int2", "snapkv-50"):
        at = fidelities[name].first_divergence
        assert at is not None and list(marks[f"{name}: first divergence"].x) == [at]
        assert list(marks[f"{name}: first divergence"].y) == pytest.approx([fidelities[name].kl[at]])
    assert fidelities["int2"].first_divergence != fidelities["snapkv-50"].first_divergence  # the x is each one's own
    assert fig.layout.xaxis.title.text.startswith("token position") and "nats" in fig.layout.yaxis.title.text
    assert lines[0].hovertemplate.startswith("%{fullData.name}<br>")
    empty = charts.item_kl_figure(RESULTS, item)  # results without fidelity
    assert not empty.data and any("no config" in a.text for a in empty.layout.annotations)


def test_latency_in_milliseconds():
    fig = charts.latency_figure(SUMMARIES)
    assert fig.layout.yaxis.title.text.startswith("TTFT (ms") and fig.layout.yaxis2.title.text.startswith("TPOT (ms")
    assert fig.layout.xaxis.title.text == "compression ratio (x)"
    ttft = fig.data[0]
    assert ttft.y[0] == pytest.approx(1000 * SUMMARIES[0].ttft_s)


def test_breakdown_by_length():
    fig = charts.breakdown_figure(breakdown(RESULTS, lambda r: r.context_length), "context length")
    assert fig.layout.xaxis.title.text == "context length (tokens)"
    assert [t.name for t in fig.data] == ["baseline", "int4", "int2", "snapkv-50"]
    assert list(fig.data[0].x) == ["256 tokens", "512 tokens"]


def test_needle_heatmap():
    assert charts.needle_configs(RESULTS) == ["baseline", "int4", "int2", "snapkv-50"]
    fig = charts.needle_heatmap(RESULTS, "int2")
    heat = fig.data[0]
    assert list(heat.x) == ["256", "512"] and list(heat.y) == ["0.10", "0.90"]
    assert heat.z[0][0] == 0.0 and heat.z[1][0] == 1.0  # int2 misses the first 2 of every 4 items
    assert fig.layout.xaxis.title.text == "context length (tokens)"
    assert fig.layout.yaxis.title.text == "needle depth (fraction of context)"


def _samples(source="cpu"):
    return [TelemetrySample(experiment_id=1, worker_id="w", ts=100.0 + i, phase=phase, source=source,
                            rss_bytes=900 * MIB, kv_bytes=i * MIB, gpu_utilization=50.0 if source == "nvml" else None,
                            gpu_memory_used_bytes=2000 * MIB if source == "nvml" else None)
            for i, phase in enumerate(("load", "prefill", "compress", "decode"))]


def test_telemetry_by_phase_in_mib():
    fig = charts.telemetry_figure(_samples())
    assert fig.layout.yaxis.title.text == "RSS (MiB)" and fig.layout.yaxis2.title.text == "KV (MiB)"
    assert fig.layout.xaxis2.title.text == "time since first sample (s)"
    prefill = [t for t in fig.data if t.name == "prefill"]
    assert [list(t.y) for t in prefill] == [[900.0], [1.0]] and list(prefill[0].x) == [1.0]
    assert not charts.has_gpu(_samples())


def test_telemetry_names_each_node():
    samples = [TelemetrySample(experiment_id=1, worker_id=worker, ts=100.0 + i, phase="decode", source="cpu",
                               rss_bytes=(i + 1) * MIB, kv_bytes=MIB)
               for worker in ("ray:hostA:1a2b3c4d:ab12cd", "hostB-4242-ef34ab") for i in range(2)]
    lines = [t for t in charts.telemetry_figure(samples).data if t.mode == "lines"]
    assert [t.name for t in lines] == ["hostA (ray node 1a2b3c4d)", "hostB"] * 2  # the RSS rows, then the KV rows
    assert lines[0].hovertemplate.startswith("%{fullData.name}<br>")  # the name, never inside the template


def test_gpu_figure():
    samples = _samples("nvml")
    assert charts.has_gpu(samples)
    fig = charts.gpu_figure(samples)
    assert fig.layout.yaxis.title.text == "utilization (%)" and fig.layout.yaxis2.title.text == "memory (MiB)"
    assert list(next(t for t in fig.data if t.name == "decode").y) == [50.0]


def test_compare_and_parallel():
    fig = charts.compare_figure({"#1 a": SUMMARIES, "#2 b": SUMMARIES[:2]}, "ratio")
    assert [t.name for t in fig.data] == ["#1 a", "#1 a: Pareto front", "#2 b", "#2 b: Pareto front"]
    assert fig.layout.xaxis.title.text.startswith("compression ratio (x")
    rows = compare_rows({1: SUMMARIES}, ["1/int4", "1/snapkv-50"])
    assert [(r.config_name, r.quant_bits, r.removed_fraction) for r in rows] == [("int4", 4.0, 0.0),
                                                                                  ("snapkv-50", 16.0, 0.5)]
    parallel = charts.parallel_figure(rows)
    labels = [d.label for d in parallel.data[0].dimensions]
    assert labels == ["experiment", "KV bits (per element)", "evicted (fraction of tokens)", "ratio achieved (x)",
                      "accuracy (0-1)"]


def test_the_page_bundle_is_the_plotly_js_of_plotly_py_and_draws_the_pages_figures():
    """The dashboard draws with the vendored cartesian bundle (pages/plotly_view.py): the same
    plotly.js version as plotly.py's full bundle (the one the exports use), and every figure but the
    parallel coordinates within its trace types."""
    from plotly.offline import get_plotlyjs

    from pages import plotly_view

    def version(script: str) -> str:
        return re.search(r"plotly\.js [^\n]*?v(\d+\.\d+\.\d+)", script[:300]).group(1)

    bundle = (STATIC_DIR / plotly_view.BUNDLE).read_text()
    assert version(bundle) == version(get_plotlyjs()) == plotly_view.PLOTLY_JS_VERSION
    assert "plotly.js (cartesian" in bundle[:100]
    figures = [charts.tradeoff_figure(SUMMARIES), charts.latency_figure(SUMMARIES),
               charts.tradeoff_figure(FIDELITY_SUMMARIES, metric="KL"), charts.item_kl_figure(FIDELITY_RESULTS,
                                                                                              "passkey-256-0"),
               charts.breakdown_figure(breakdown(RESULTS, lambda r: r.task, "baseline"), "task"),
               charts.needle_heatmap(RESULTS, "baseline"), charts.telemetry_figure(_samples()),
               charts.gpu_figure(_samples("nvml")), charts.compare_figure({"#1 a": SUMMARIES})]
    assert all(plotly_view.drawable(fig) for fig in figures)
    assert not plotly_view.drawable(charts.parallel_figure(compare_rows({1: SUMMARIES}, ["1/int4"])))


def test_html_export_is_self_contained():
    page = figure_html(charts.tradeoff_figure(SUMMARIES))
    assert page.lower().startswith("<!doctype html>") and "plotly" in page and "Plotly.newPlot" in page
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert len(page) > 3_000_000  # plotly.js itself is inlined: the file opens offline


def test_report_has_charts_tables_spec_and_no_credentials():
    page = report_html("kvlab: test", {"experiment": 1}, {"Summary": [{"config": "int4", "KV (MiB)": "2.278"}]},
                       {"Memory vs accuracy": charts.tradeoff_figure(SUMMARIES)},
                       'name = "x"\n[backend]\nbase_url = "http://user:hunter2@host:8000/v1"\n',
                       {"versions": {"kvlab": "0.1.0"}})
    assert page.count("<script type='text/javascript'>") == 1 and "Plotly.newPlot" in page
    assert "<td>int4</td>" in page and "base_url" in page and "Memory vs accuracy" in page
    assert "hunter2" not in page and "http://***@host:8000/v1" in page
    assert redact({"a": ["postgresql://u:p@db/kvlab"]}) == {"a": ["postgresql://***@db/kvlab"]}


@needs_chromium
def test_image_exports_have_the_right_magic():
    fig = charts.tradeoff_figure(SUMMARIES)
    assert figure_image(fig, "png").startswith(b"\x89PNG\r\n\x1a\n")
    svg = figure_image(fig, "svg")
    assert svg.lstrip().startswith(b"<svg") and b"physical KV cache (MiB)" in svg
    assert figure_image(fig, "pdf").startswith(b"%PDF")
    with pytest.raises(ValueError, match="format"):
        figure_image(fig, "bmp")


#: A config name as an adversary writes it into a shared store: Plotly reads figure text as HTML.
MARKUP = '<a href="http://evil.example">int4</a><span style="font-size:99px">&big</span>'


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _assert_inert(fig) -> None:
    """No text of the figure holds the name's markup, and the name is shown (escaped) somewhere."""
    texts = _strings(fig.to_plotly_json())
    assert not [t for t in texts if re.search(r"<(a|span)\b", t)]
    assert any("&lt;a href=\"http://evil.example\"&gt;int4&lt;/a&gt;&lt;span" in t for t in texts)
    assert not [t for t in texts if "&big" in t and "&amp;big" not in t]  # a bare & would start an entity


def test_names_with_markup_are_text_in_every_figure_and_the_report():
    from dataclasses import replace

    from kvlab.dashboard import tune_charts
    from kvlab.tune.progress import Point

    results = [replace(r, config_name=MARKUP) if r.config_name == "int4" else r for r in FIDELITY_RESULTS]
    summaries = summarize(results, "baseline", Margins(max_drop=0.5))
    figures = [charts.tradeoff_figure(summaries, axis, title=f"{MARKUP}: memory vs {metric}", metric=metric)
               for axis in charts.X_TITLES for metric in charts.Y_TITLES]
    figures.append(charts.item_kl_figure(results, "passkey-256-0"))
    figures += [charts.latency_figure(summaries), charts.needle_heatmap(results, MARKUP),
                charts.breakdown_figure(breakdown(results, lambda r: r.task, "baseline"), "task"),
                charts.compare_figure({f"#1 {MARKUP}": summaries}),
                charts.telemetry_figure([TelemetrySample(experiment_id=1, worker_id=f"{MARKUP}-4242-ef34ab", ts=1.0,
                                                         phase="decode", source="cpu", rss_bytes=MIB, kv_bytes=MIB)])]
    point = Point(trial_id=2, label=MARKUP, number=0, state="stopped", reason=f"worse than {MARKUP}", rung=0,
                  judged_items=4, accuracy=0.5, diff=-0.5, diff_low=-0.9, diff_high=-0.1, kv_bytes=1e6, ttft_ms=None,
                  tpot_ms=None, feasible=False)
    figures += [tune_charts.front_figure([point], [point], (4e6, 1.0), MARKUP, title=MARKUP),
                tune_charts.hypervolume_figure([point], [0.5])]
    for fig in figures:
        _assert_inert(fig)
    page = report_html(f"kvlab: {MARKUP}", {"sweet spot": MARKUP}, {"Summary": [{"config": MARKUP}]},
                       {"Memory vs accuracy": figures[0]}, "", {})
    outside_scripts = re.sub(r"<script\b.*?</script>", "", page, flags=re.DOTALL)  # plotly.js itself has "<a"
    assert not re.search(r"<(a|span)\b", outside_scripts)
    assert "http://evil.example" in page and not re.search(r'<a href=\\?"http://evil', page)  # the figure's JSON too


def test_an_exported_chart_carries_the_pages_caveat():
    """Issue 47 row 7: the page warns that a sweet spot rests on few items; the exported figure says so too."""
    from kvlab.dashboard.chart_export import with_caveat

    summaries = summarize([item_result(c, i, 256, 0.1) for c in PROFILE for i in range(2)], "baseline", Margins())
    fig = charts.tradeoff_figure(summaries, "bytes", "baseline")
    caveat = "Few items: this sweet spot rests on 2 items; the margin of 0.05 needs about 1,000 <items> & more."
    exported = with_caveat(fig, caveat)
    assert with_caveat(fig, None) is fig and len(fig.layout.annotations) < len(exported.layout.annotations)
    text = exported.layout.annotations[-1].text
    assert text.replace("<br>", " ") == html.escape(caveat)  # plotly reads the text as HTML
    assert "rests on 2 items" in figure_html(exported) and "rests on 2 items" not in figure_html(fig)
