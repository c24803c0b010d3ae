"""Prometheus metrics of the server, in a registry of their own (one per app, so several apps can coexist).

Request counts come from the HTTP middleware; the engine loop sets the gauges after every step (and
after applying submit/abort commands, so a cancelled request shows at once) and observes latencies.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Time to first token covers queueing and prefill; million-token prefills take many minutes.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LENGTH_BUCKETS = tuple(float(4**i) for i in range(11))  # 1 .. 1M tokens
E2E_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)

# Endpoints counted under their own label; anything else (fuzzers, scanners) is "other", which keeps the
# label set bounded.
KNOWN_ENDPOINTS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/openapi.json", "/docs"}
)


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "infinitehip_http_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"], registry=r
        )
        self.running = Gauge("infinitehip_requests_running", "Sequences holding KV cache (prefilling or decoding)", registry=r)
        self.waiting = Gauge("infinitehip_requests_waiting", "Sequences accepted but not yet running", registry=r)
        self.kv_usage = Gauge("infinitehip_kv_cache_usage_ratio", "Fraction of KV cache pages in use (0..1)", registry=r)
        self.ttft = Histogram(
            "infinitehip_time_to_first_token_seconds", "From request arrival to its first token (queue + prefill)",
            buckets=TTFT_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "infinitehip_inter_token_latency_seconds", "Time between consecutive tokens of one sequence",
            buckets=ITL_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "infinitehip_request_latency_seconds", "From arrival to the last token of a sequence",
            buckets=E2E_BUCKETS, registry=r,
        )
        self.prefill_tokens = Counter("infinitehip_prefill_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter("infinitehip_generation_tokens", "Tokens generated", registry=r)
        self.prefill_throughput = Gauge(
            "infinitehip_prefill_tokens_per_second", "Prefill throughput of the latest step that prefilled", registry=r
        )
        # KV offloading (absent while the KV is resident): cumulative bank counters since the engine started.
        self.kv_bank_hits = Gauge("infinitehip_kv_bank_hits", "Requested KV rows already in the GPU bank", ["bank"], registry=r)
        self.kv_bank_misses = Gauge("infinitehip_kv_bank_misses", "Requested KV rows copied from host memory", ["bank"],
                                    registry=r)
        self.kv_bank_hit_ratio = Gauge("infinitehip_kv_bank_hit_ratio", "hits / (hits + misses) of a GPU bank", ["bank"],
                                       registry=r)
        # Prefix caching (absent while it is off): cumulative since the engine started.
        self.prefix_queried = Gauge("infinitehip_prefix_cache_queried_tokens",
                                    "Prompt tokens of admitted sequences looked up in the prefix cache", registry=r)
        self.prefix_hits = Gauge("infinitehip_prefix_cache_hit_tokens",
                                 "Prompt tokens served from the prefix cache (not prefilled)", registry=r)
        self.prefix_hit_rate = Gauge("infinitehip_prefix_cache_hit_rate", "hit tokens / queried tokens", registry=r)
        self.prefix_cached = Gauge("infinitehip_prefix_cache_cached_tokens",
                                   "Tokens in KV pages named by their prefix (in use or evictable)", registry=r)
        self.prefix_evictions = Gauge("infinitehip_prefix_cache_evictions",
                                      "Cached prefix pages evicted to make room", registry=r)
        self.preemptions = Counter("infinitehip_preemptions", "Sequences preempted (KV freed, recomputed later)",
                                   registry=r)
        self.queue_time = Histogram("infinitehip_queue_time_seconds", "From request arrival to its admission",
                                    buckets=TTFT_BUCKETS, registry=r)
        self.prompt_length = Histogram("infinitehip_prompt_tokens", "Prompt length of each sequence",
                                       buckets=LENGTH_BUCKETS, registry=r)
        self.generation_length = Histogram("infinitehip_generation_tokens_per_sequence",
                                           "Tokens generated by each finished sequence", buckets=LENGTH_BUCKETS,
                                           registry=r)
        self.finished = Counter(
            "infinitehip_sequences_finished", "Finished sequences by reason (stop, length, abort, error)", ["reason"],
            registry=r,
        )

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(endpoint=path if path in KNOWN_ENDPOINTS else "other", status=str(status)).inc()

    def set_engine_state(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)

    def set_kv_banks(self, stats: dict) -> None:
        """stats: {"mask": BankStats, "attention": BankStats} (LLMEngine.kv_stats)."""
        for name, bank in stats.items():
            self.kv_bank_hits.labels(bank=name).set(bank.total_hits)
            self.kv_bank_misses.labels(bank=name).set(bank.total_misses)
            self.kv_bank_hit_ratio.labels(bank=name).set(bank.hit_ratio)

    def set_prefix_cache(self, stats, cached_tokens: int) -> None:
        """stats: PrefixCacheStats (LLMEngine.prefix_cache_stats)."""
        self.prefix_queried.set(stats.queries)
        self.prefix_hits.set(stats.hits)
        self.prefix_hit_rate.set(stats.hit_rate)
        self.prefix_cached.set(cached_tokens)
        self.prefix_evictions.set(stats.evictions)

    def observe_step(self, prefill_tokens: int, generated_tokens: int, seconds: float) -> None:
        if prefill_tokens:
            self.prefill_tokens.inc(prefill_tokens)
            if seconds > 0:
                self.prefill_throughput.set(prefill_tokens / seconds)
        if generated_tokens:
            self.generation_tokens.inc(generated_tokens)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
