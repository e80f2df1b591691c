"""What the proxy shows Prometheus at ``GET /metrics``.

- ``pd_policy_requests_total{route, form, outcome}``: requests by the decode form they
  took and their outcome (``ok``, or the refusal's or failure's error code);
- ``pd_policy_leg_seconds{leg}``: each leg's latency (render, encode, prefill, decode);
- ``pd_policy_ttft_seconds``: from a streamed request's arrival to its answer's first
  body byte to the client (a whole answer has none);
- ``pd_policy_request_duration_seconds{route}``: every request's, arrival to its end;
- ``pd_policy_media_fetches_total{outcome}``, ``pd_policy_upstream_queued_total`` and
  ``pd_policy_upstream_waiting``: remote media fetched, legs that waited for a worker
  connection (and wait now);
- ``process_*``: the process's CPU, memory and open files;
- ``pd_policy_decode_leg_bytes``: the bytes of each decode leg the proxy sent;
- ``pd_policy_worker_outstanding{role, worker}`` and ``pd_policy_worker_up{role, worker}``
  (1 when routable): each member's load and health;
- ``pd_policy_retries_total{leg}`` and ``pd_policy_ejections_total{role, worker}``;
- ``pd_policy_process_restarts_total``: with ``--processes N``, the processes restarted
  after they died;
- with KV-event routing: ``pd_policy_kv_routing_total{outcome}`` (``hit``: the prefill
  chosen held some of the request's blocks, ``miss``: none held, ``fallback``: not looked
  up), ``pd_policy_kv_blocks_total{kind}`` (the prompt blocks of the requests routed,
  ``cached`` on the prefill chosen or ``computed``), and per fed prefill
  ``pd_policy_kv_event_lag_seconds`` (its last batch's age on arrival, clocks apart),
  ``pd_policy_kv_blocks_indexed``, ``pd_policy_kv_synced`` (1 when its blocks count) and
  ``pd_policy_kv_resyncs_total`` (its blocks forgotten after lost events).

A ``worker`` label is the member's name (``scheme://host:port``): no credentials, no
path. No label holds a key, a salt or a request's content. Each proxy has a registry of
its own (tests run several in one process). With ``--processes N``, a scrape answers
for every process ([`siblings`][pd_policy_vllm.http.siblings]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from pd_policy import Health, routable
from pd_policy_vllm.http.fleet.members import Fleet, Member

if TYPE_CHECKING:
    from pd_policy.cache.prefix_index import PrefixIndex
    from pd_policy_vllm.http.fleet.kv_routing import Lookup
    from pd_policy_vllm.http.upstream import Upstream
    from pd_policy_vllm.kv_events.feed import FeedStats

__all__ = ["CONTENT_TYPE", "Metrics", "latency_buckets"]

#: The ``/metrics`` content type (Prometheus' text format).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def latency_buckets(longest: float) -> tuple[float, ...]:
    """The latency buckets, from 5 ms to at least ``longest`` seconds (the longest a
    request or a leg may take): doubling past a minute, so that a ten-minute decode leg
    lands in a bucket of its own, not in ``+Inf``."""
    buckets = list(_LATENCY)
    while buckets[-1] < longest:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


_BYTES: Final = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)


class Metrics:
    """The proxy's metrics, in a registry of their own."""

    def __init__(self, longest: float = 600.0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        latency = latency_buckets(longest)
        ProcessCollector(registry=r)  # CPU, memory, open files: process_*
        self.requests = Counter(
            "pd_policy_requests",
            "Requests, by decode form and outcome",
            ["route", "form", "outcome"],
            registry=r,
        )
        self.legs = Histogram(
            "pd_policy_leg_seconds",
            "Each leg's latency: render, encode, prefill, decode",
            ["leg"],
            buckets=latency,
            registry=r,
        )
        self.ttft = Histogram(
            "pd_policy_ttft_seconds",
            "Arrival to a streamed answer's first body byte to the client",
            buckets=latency,
            registry=r,
        )
        self.duration = Histogram(
            "pd_policy_request_duration_seconds",
            "Arrival to the answer's end, for every request (refusals included)",
            ["route"],
            buckets=latency,
            registry=r,
        )
        self.decode_bytes = Histogram(
            "pd_policy_decode_leg_bytes",
            "Bytes of each decode leg the proxy sent",
            buckets=_BYTES,
            registry=r,
        )
        self.outstanding = Gauge(
            "pd_policy_worker_outstanding",
            "Requests a member holds",
            ["role", "worker"],
            registry=r,
        )
        self.up = Gauge(
            "pd_policy_worker_up", "1 when the member is routed to", ["role", "worker"], registry=r
        )
        self.retries = Counter(
            "pd_policy_retries",
            "Attempts planned again, by the leg that failed",
            ["leg"],
            registry=r,
        )
        self.ejections = Counter(
            "pd_policy_ejections", "Members ejected", ["role", "worker"], registry=r
        )

        self.kv_routing = Counter(
            "pd_policy_kv_routing",
            "Requests by what the prefill chosen held of their KV blocks",
            ["outcome"],
            registry=r,
        )
        self.kv_blocks = Counter(
            "pd_policy_kv_blocks",
            "Prompt blocks of the requests routed, cached on the prefill chosen or computed",
            ["kind"],
            registry=r,
        )
        self.kv_lag = Gauge(
            "pd_policy_kv_event_lag_seconds",
            "A fed prefill's last KV-event batch's age on arrival",
            ["worker"],
            registry=r,
        )
        self.kv_indexed = Gauge(
            "pd_policy_kv_blocks_indexed", "Blocks indexed per fed prefill", ["worker"], registry=r
        )
        self.kv_synced = Gauge(
            "pd_policy_kv_synced", "1 when a fed prefill's blocks count", ["worker"], registry=r
        )
        self.kv_resyncs = Counter(
            "pd_policy_kv_resyncs",
            "A fed prefill's blocks forgotten after lost or unreadable events",
            ["worker"],
            registry=r,
        )
        self._resyncs_seen: dict[str, int] = {}
        self.media_fetches = Counter(
            "pd_policy_media_fetches",
            "Remote media items the proxy fetched, by outcome (ok, or the error code)",
            ["outcome"],
            registry=r,
        )
        self.upstream_queued = Counter(
            "pd_policy_upstream_queued",
            "Legs that waited for a connection to a worker",
            registry=r,
        )
        self.upstream_waiting = Gauge(
            "pd_policy_upstream_waiting",
            "Legs waiting for a connection to a worker now",
            registry=r,
        )
        self._queued_seen = 0
        self.process_restarts = Counter(
            "pd_policy_process_restarts",
            "With --processes N: restarts of this process's slot after a process died",
            registry=r,
        )

        # Children by label values: ``labels()`` takes a lock and checks the values on
        # every call, and every request makes four. The label sets are few and bounded
        # (legs, routes, forms, codes).
        self._leg_children: dict[str, Histogram] = {}
        self._request_children: dict[tuple[str, str, str], Counter] = {}
        self._duration_children: dict[str, Histogram] = {}

    def observe_leg(self, leg: str, seconds: float) -> None:
        """One leg's latency."""
        child = self._leg_children.get(leg)
        if child is None:
            child = self._leg_children[leg] = self.legs.labels(leg)
        child.observe(seconds)

    def observe_duration(self, route: str, seconds: float) -> None:
        """One request's time, arrival to its answer's last byte."""
        child = self._duration_children.get(route)
        if child is None:
            child = self._duration_children[route] = self.duration.labels(route)
        child.observe(seconds)

    def fetched(self, outcome: str) -> None:
        """One remote media fetch's end: ``ok``, or its error code."""
        self.media_fetches.labels(outcome).inc()

    def count_request(self, route: str, form: str, outcome: str) -> None:
        """One request's end, by its route, decode form and outcome."""
        key = (route, form, outcome)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()

    def record(
        self,
        route: str,
        form: str,
        outcome: str,
        *,
        legs: Sequence[tuple[str, float]] = (),
        retried: Sequence[str] = (),
        ttft: float | None = None,
        decode_bytes: int | None = None,
        duration: float | None = None,
    ) -> None:
        """One request's end, all at once: its count by route, decode form and outcome,
        its end-to-end ``duration``, each leg's latency, the legs whose failures were
        tried again, and, when its decode was relayed, the decode leg's bytes and, for a
        stream, its time to the first body byte."""
        if duration is not None:
            self.observe_duration(route, duration)
        for leg, seconds in legs:
            self.observe_leg(leg, seconds)
        for leg in retried:
            self.retries.labels(leg).inc()
        if ttft is not None:
            self.ttft.observe(ttft)
        if decode_bytes is not None:
            self.decode_bytes.observe(decode_bytes)
        self.count_request(route, form, outcome)

    def kv_routed(self, lookup: Lookup | None, prefill: str | None) -> None:
        """One request's KV-event routing: what was ``lookup``ed, and the ``prefill`` it
        went to (``None``: none was chosen)."""
        if lookup is None or prefill is None:
            self.kv_routing.labels("fallback").inc()
            return
        held = lookup.cached.get(prefill, 0)
        self.kv_routing.labels("hit" if held else "miss").inc()
        self.kv_blocks.labels("cached").inc(held)
        self.kv_blocks.labels("computed").inc(lookup.blocks - held)

    def kv_feeds(self, stats: Mapping[str, FeedStats], index: PrefixIndex) -> None:
        """The fed prefills' feeds as they are now (their lag, blocks, sync, resyncs)."""
        for worker, seen in stats.items():
            lag = seen.lag()
            if lag is not None:
                self.kv_lag.labels(worker).set(lag)
            self.kv_indexed.labels(worker).set(index.held(worker))
            self.kv_synced.labels(worker).set(1 if index.synced(worker) else 0)
            new = seen.resyncs - self._resyncs_seen.get(worker, 0)
            if new > 0:
                self.kv_resyncs.labels(worker).inc(new)
            self._resyncs_seen[worker] = seen.resyncs

    def health_changed(self, member: Member, before: Health) -> None:
        """Follow a member's health (the fleet's ``on_change``)."""
        self.up.labels(member.role, member.name).set(1 if routable(member.health) else 0)
        if member.health.health is Health.EJECTED and before is not Health.EJECTED:
            self.ejections.labels(member.role, member.name).inc()

    def render(self, fleet: Fleet, upstream: Upstream | None = None) -> bytes:
        """The text format, with every member's load and health as they are now, and the
        legs ``upstream`` (the legs' client) queued for a worker connection."""
        if upstream is not None:
            self.upstream_waiting.set(upstream.waiting)
            queued = upstream.queued
            if queued > self._queued_seen:  # a closed client starts again from 0
                self.upstream_queued.inc(queued - self._queued_seen)
            self._queued_seen = queued
        for member in fleet:
            self.outstanding.labels(member.role, member.name).set(member.outstanding)
            self.up.labels(member.role, member.name).set(1 if routable(member.health) else 0)
        return generate_latest(self.registry)
