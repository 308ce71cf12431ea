"""GET /metrics: Prometheus text, from prometheus-client.

Two kinds of numbers:
- per-process request counters and latencies, kept by prometheus-client; labelled from closed
  sets only (method, route pattern, status), so no request adds a series. ``leash web`` is one
  process; with ``PROMETHEUS_MULTIPROC_DIR`` set, several processes write files a scrape adds up;
- the queue's state, read from Redis at scrape time by ``RedisCollector`` in one round trip:
  the same answer from every process, so it needs no multiprocess bookkeeping.

``LEASH_METRICS_TOKEN`` set: a scrape must send ``Authorization: Bearer <token>`` (Prometheus:
``authorization: {credentials: <token>}``). Unset, /metrics is open in development only: in
production (``LEASH_API_TOKENS`` or a trusted user header set) it is a 403 unless
``LEASH_METRICS_PUBLIC=1`` publishes it on purpose.

If Redis cannot be reached the scrape still answers, with ``leash_redis_up 0``: a scrape that
fails looks like a dead web process, not an unreachable store.
"""

from __future__ import annotations

import hmac
import logging
import time

import redis
from flask import Blueprint, Flask, Response, current_app, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from werkzeug.exceptions import Forbidden, Unauthorized

from jobs.archive import pending as archive_pending
from jobs.core import clock, deferrals, switches
from jobs.models import concurrency as model_concurrency
from jobs.read import fleet
from jobs.usage.prices import usd
from jobs.usage.report import model_totals

from . import app_settings, guessing

log = logging.getLogger(__name__)
bp = Blueprint("metrics", __name__)
disable_created_metrics()  # the *_created series double the output and nothing here reads them

REQUESTS = Counter("leash_http_requests", "HTTP requests answered.", ["method", "route", "status"], registry=None)
LATENCY = Histogram("leash_http_request_duration_seconds", "Time to answer an HTTP request.", ["route"],
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=None)


class RedisCollector:
    """Gauges and counters computed from Redis when scraped."""

    def __init__(self, connection: redis.Redis, queues: list[str]):
        self.connection = connection
        self.queues = queues  # every queue the deployment serves (LEASH_QUEUE)

    def describe(self):
        return []  # names are known only after a read; do not touch Redis at registration

    def collect(self):
        now = clock.wall()
        try:
            counts = fleet.scrape_counts(self.connection, self.queues, now)
            models = model_concurrency.snapshot(self.connection)
            spent = model_totals(self.connection)
            operations = _operations(self.connection, self.queues, now)
        except redis.exceptions.RedisError:
            yield GaugeMetricFamily("leash_redis_up", "1 if Redis answered this scrape.", value=0)
            return
        yield GaugeMetricFamily("leash_redis_up", "1 if Redis answered this scrape.", value=1)
        # Ready to run now; jobs held back by their owner's concurrency limit wait in per-owner
        # sets and are not counted here.
        gauge = GaugeMetricFamily("leash_queue_depth", "Jobs ready to run, waiting in the RQ queue.", labels=["queue"])
        for queue, ready in zip(self.queues, counts.ready, strict=True):
            gauge.add_metric([queue], ready)
        yield gauge
        gauge = GaugeMetricFamily("leash_jobs_scheduled", "Jobs waiting for a retry's backoff to pass.",
                                  labels=["queue"])
        for queue, scheduled in zip(self.queues, counts.scheduled, strict=True):
            gauge.add_metric([queue], scheduled)
        yield gauge
        yield GaugeMetricFamily("leash_jobs_running", "Jobs holding a lease.", value=counts.running)
        yield GaugeMetricFamily("leash_jobs_stale", "Running jobs whose lease has expired (worker stopped "
                                                    "reporting; about to be reclaimed).", value=counts.stale)
        yield GaugeMetricFamily("leash_jobs_failed_index", "Failed jobs in the dead-letter index.",
                                value=counts.failed_index)
        by_outcome = {
            "succeeded": CounterMetricFamily("leash_jobs_succeeded", "Jobs that succeeded, every item answered, "
                                             "by kind.", labels=["kind"]),
            # Succeeded too (the state), but some items hold an error instead of an answer.
            "succeeded_with_item_errors": CounterMetricFamily(
                "leash_jobs_succeeded_with_item_errors", "Jobs that succeeded with item errors, by kind.",
                labels=["kind"]),
            "failed": CounterMetricFamily("leash_jobs_failed", "Jobs that failed, by kind.", labels=["kind"]),
            # A cancel ends in failed too, but is not a failure.
            "canceled": CounterMetricFamily("leash_jobs_canceled", "Jobs canceled, by kind.", labels=["kind"]),
            "stopped": CounterMetricFamily("leash_jobs_stopped", "Jobs stopped by RQ's stop command, by kind.",
                                           labels=["kind"]),
        }
        for field, value in sorted(counts.totals.items()):
            outcome, _, kind = field.partition(":")
            if outcome in by_outcome:
                by_outcome[outcome].add_metric([kind], value)
        yield from by_outcome.values()
        yield CounterMetricFamily("leash_lease_reclaims", "Expired leases reclaimed.", value=counts.reclaims)
        yield CounterMetricFamily("leash_rejected_writes", "Writes refused from superseded attempts (zombies).",
                                  value=counts.rejected_writes)
        yield from _model_families(models)
        yield from _usage_families(spent)
        yield from operations


def _operations(connection: redis.Redis, queues: list[str], now: float) -> list:
    """What an operator alerts on: workers by state, the oldest queued job's age and the paused
    queues, jobs deferred while they wait (for room in a budget, for their provider), and how
    far the archive is behind."""
    workers = GaugeMetricFamily("leash_workers", "Workers registered, by state (busy, idle, quiet: finishing "
                                "its job and taking no new one, suspended: `rq suspend`).", labels=["state"])
    for state, count in fleet.worker_states(connection).items():
        workers.add_metric([state], count)
    oldest = GaugeMetricFamily("leash_queue_oldest_age_seconds", "Seconds the oldest job ready to run has waited "
                               "in the queue (0 when it is empty).", labels=["queue"])
    paused_now = switches.paused(connection)
    paused = GaugeMetricFamily("leash_queue_paused", "1 while an operator has paused the queue (leash pause).",
                               labels=["queue"])
    for queue, age in fleet.oldest_ages(connection, queues, now).items():
        oldest.add_metric([queue], round(age or 0.0, 1))
        paused.add_metric([queue], 1 if queue in paused_now else 0)
    waiting = GaugeMetricFamily("leash_jobs_waiting", "Jobs deferred until something outside them frees up: room "
                                "in a budget (budget), their model provider back (provider).", labels=["for"])
    for reason, count in deferrals.counts(connection).items():
        waiting.add_metric([reason], count)
    behind = archive_pending.behind(connection, now)
    archive_jobs = GaugeMetricFamily("leash_archive_backlog_jobs", "Ended jobs waiting to be written to the SQL "
                                     "archive.", value=behind["waiting"])
    archive_lag = GaugeMetricFamily("leash_archive_lag_seconds", "Seconds the oldest ended job has waited to be "
                                    "archived (0 when none waits).", value=behind["oldest_seconds"])
    return [workers, oldest, paused, waiting, archive_jobs, archive_lag]


def _usage_families(spent: dict[str, dict[str, int]]):
    """Tokens and cost per model (never per owner: one series per model keeps the scrape
    bounded; an owner's figures are at GET /usage and `leash usage`)."""
    tokens = CounterMetricFamily("leash_model_tokens", "Tokens the model's calls used (as the server reported, "
                                 "or estimated when it reported none).", labels=["model", "direction"])
    calls = CounterMetricFamily("leash_model_calls", "Model calls counted for usage.", labels=["model"])
    cost = CounterMetricFamily("leash_model_cost_usd", "What the model's priced calls cost (USD; calls of "
                               "models with no known price are left out).", labels=["model"])
    unpriced = CounterMetricFamily("leash_model_unpriced_calls", "Calls whose model has no known price.",
                                   labels=["model"])
    hits = CounterMetricFamily("leash_model_cache_hits", "Requests answered from leash's request cache (no call, "
                               "no cost).", labels=["model"])
    for model, totals in spent.items():
        hits.add_metric([model], totals["cache_hits"])
        tokens.add_metric([model, "input"], totals["input_tokens"])
        tokens.add_metric([model, "output"], totals["output_tokens"])
        tokens.add_metric([model, "cached_input"], totals["cached_input_tokens"])
        calls.add_metric([model], totals["calls"])
        cost.add_metric([model], usd(totals["cost_nusd"]))
        unpriced.add_metric([model], totals["unpriced_calls"])
    yield from (tokens, calls, cost, unpriced, hits)


def _model_families(models: list[model_concurrency.ModelConcurrency]):
    """The adaptive concurrency of each model and what moved it."""
    limit = GaugeMetricFamily("leash_model_concurrency", "Calls each job may have in flight to this model now "
                              "(halved by a 429 or a timeout, grows back after clean answers).", labels=["model"])
    answers = CounterMetricFamily("leash_model_answers", "Model calls answered.", labels=["model"])
    rate_limited = CounterMetricFamily("leash_model_429s", "Model calls answered 429.", labels=["model"])
    timed_out = CounterMetricFamily("leash_model_timeouts", "Model calls that timed out.", labels=["model"])
    for model in models:
        limit.add_metric([model.model], model.limit)
        answers.add_metric([model.model], model.answers)
        rate_limited.add_metric([model.model], model.rate_limited)
        timed_out.add_metric([model.model], model.timed_out)
    yield from (limit, answers, rate_limited, timed_out)


#: Methods counted by name; any other (a client may send any token as a method) is "other",
#: so no client can add series to /metrics. Routes and statuses come from closed sets already.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _method() -> str:
    return request.method if request.method in METHODS else "other"


def _route() -> str:
    return request.url_rule.rule if request.url_rule is not None else "<unmatched>"


def _start_timer():
    g.leash_started = time.perf_counter()


def _record(response: Response) -> Response:
    started = g.pop("leash_started", None)
    if started is not None:
        route = _route()
        REQUESTS.labels(_method(), route, str(response.status_code)).inc()
        LATENCY.labels(route).observe(time.perf_counter() - started)
    return response


class MetricsTokenRequired(Unauthorized):
    description = "GET /metrics needs 'Authorization: Bearer <LEASH_METRICS_TOKEN>'"

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'Bearer realm="leash metrics"')]


#: /metrics in production (LEASH_API_TOKENS or a trusted header set) without a token or
#: LEASH_METRICS_PUBLIC=1: job counts, tokens and cost across owners are nobody's business.
CLOSED = ("/metrics is closed: in production it needs LEASH_METRICS_TOKEN (scrapers send it as "
          "'Authorization: Bearer <token>'), or LEASH_METRICS_PUBLIC=1 to publish the numbers on purpose")


def _check_token() -> None:
    """With LEASH_METRICS_TOKEN set, only a scraper presenting it sees the numbers; without it,
    only development or LEASH_METRICS_PUBLIC=1 shows them to anyone."""
    found = app_settings.current()
    expected = found.web.metrics_token
    if not expected:
        if found.metrics_closed:
            raise Forbidden(CLOSED)
        return
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    presented = presented.strip() if scheme.lower() == "bearer" else ""
    guessing.check("metrics", presented, "metrics tokens")
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        if "Authorization" in request.headers:
            guessing.failed("metrics", presented, "metrics tokens")
        raise MetricsTokenRequired()


@bp.get("/metrics")
def metrics():
    _check_token()
    # content_type, not mimetype: CONTENT_TYPE_LATEST already carries its charset.
    return Response(generate_latest(current_app.extensions["leash_metrics"]), content_type=CONTENT_TYPE_LATEST)


def init_app(app: Flask) -> None:
    found = app_settings.of(app)
    if found.metrics_closed:
        log.warning("GET /metrics answers 403: set LEASH_METRICS_TOKEN for your scraper "
                    "(or LEASH_METRICS_PUBLIC=1 to publish it)")
    registry = CollectorRegistry(auto_describe=False)
    if found.web.prometheus_multiproc_dir:
        MultiProcessCollector(registry)
    else:
        registry.register(REQUESTS)
        registry.register(LATENCY)
    registry.register(RedisCollector(app.extensions["leash_redis"], found.jobs.queues))
    app.extensions["leash_metrics"] = registry
    app.before_request(_start_timer)
    app.after_request(_record)
    app.register_blueprint(bp)
