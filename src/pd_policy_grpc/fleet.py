"""``FleetPd``: sequential P/D over a fleet of gRPC workers, with health and retries.

The roster is the core's ([`pd_policy.Roster`][pd_policy.roster.Roster]), of
[`GrpcWorker`][pd_policy_grpc.fleet.GrpcWorker]s: each one's channel and what its own
``GetModelInfo`` and ``GetServerInfo`` said it is. For each request:

1. the prefill is chosen among the members that can process its media, by affinity to
   its items' content hashes (its prefix cache holds them), bounded by load; the
   decode among the members that can serve it (never one that cannot while one that
   can is listed), by load: the core's [`place`][pd_policy.placement.place], which
   the HTTP proxy uses too;
2. the pair serves it as [`SequentialPd`][pd_policy_grpc.client.SequentialPd] does
   (or [`SequentialPdBytes`][pd_policy_grpc.raw.client.SequentialPdBytes] on bytes);
3. a worker's failure before the first decode response (unreachable, or a status the
   default rules retry) counts against that worker, and the request is planned again
   without it, while attempts are left ([`pd_policy.fail`][pd_policy.lifecycle.fail]).
   After the first response nothing is retried: the failure ends the stream.

[`probe_once`][pd_policy_grpc.fleet.FleetPd.probe_once] calls each worker's
``HealthCheck``; a worker that fails it is ejected, and one that passes after an
ejection is described again before it is re-admitted: it may have come back as
another kind (restarted with ``--language-model-only``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, Protocol

import attrs

import grpc
from pd_policy import (
    DEFAULT_BOOTSTRAP_PORT,
    DecodeCandidate,
    Health,
    HealthState,
    InvalidConfiguration,
    KvConnectorMode,
    NoWorkerAvailable,
    PolicyError,
    PrefillKv,
    Request,
    RequestLife,
    Roster,
    RosterMember,
    Stage,
    WorkerCapability,
    WorkerFailedToStart,
    begin,
    done,
    fail,
    place,
    responding,
    routable,
)
from pd_policy_grpc.capability import capability_from_info
from pd_policy_grpc.client import SequentialPd
from pd_policy_grpc.kv import prefill_kv_from_info
from pd_policy_grpc.raw.reader import RawRequest, read_request
from pd_policy_grpc.view import request_view
from pd_policy_grpc.wire import pb, pb_grpc

__all__ = ["FleetPd", "GrpcWorker", "describe_worker"]


@attrs.frozen(slots=True)
class GrpcWorker:
    """One gRPC worker: its ``address`` (``host:port``, an IPv6 host in brackets), its
    channel, its capability, and, for a prefill, how it hands KV over."""

    address: str
    channel: grpc.aio.Channel = attrs.field(eq=False, repr=False)
    capability: WorkerCapability
    kv: PrefillKv | None = None


async def describe_worker(
    channel: grpc.aio.Channel,
    address: str,
    role: str,
    *,
    kv_mode: KvConnectorMode | None = None,
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT,
    timeout: float = 10.0,
) -> GrpcWorker:
    """The worker at ``address`` as its own ``GetModelInfo`` and ``GetServerInfo`` describe
    it (``kv_mode`` and ``bootstrap_port``: the operator's, for a prefill). Raises
    ``grpc.aio.AioRpcError`` when it cannot be asked, and
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a prefill
    whose connector's contract is unknown."""
    stub = pb_grpc.VllmEngineStub(channel)
    model = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout)
    server = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout)
    kv = None
    if role == "prefill":
        kv = prefill_kv_from_info(server, address, mode=kv_mode, bootstrap_port=bootstrap_port)
    return GrpcWorker(address, channel, capability_from_info(model, server), kv)


#: A member of a gRPC fleet.
Member = RosterMember[GrpcWorker]


class Pair(Protocol):
    """A pair's router, as ``SequentialPd`` and ``SequentialPdBytes`` are."""

    def generate(self, request: Any) -> AsyncGenerator[Any]: ...

    async def aclose(self) -> None: ...


#: What makes a pair's router, from SequentialPd's arguments.
PairRouter = Callable[..., Pair]


def _view(request: Any) -> Request:
    return request.view() if isinstance(request, RawRequest) else request_view(request)


def _capability(member: Member) -> WorkerCapability:
    return member.worker.capability


class FleetPd:
    """Serve requests over the prefill and decode members of ``roster``.

    ``router`` makes a pair's router from SequentialPd's arguments (``SequentialPd``
    for messages, ``SequentialPdBytes`` for bytes); ``attempts`` bounds the attempts of
    a request in all; ``timeout`` is each call's. A roster on the monotonic clock is made
    when none is given. See the module docs.
    """

    def __init__(
        self,
        roster: Roster[GrpcWorker] | None = None,
        *,
        router: PairRouter = SequentialPd,
        attempts: int = 2,
        timeout: float | None = None,
        probe_timeout: float = 2.0,
    ) -> None:
        self.roster = roster if roster is not None else Roster(clock=time.monotonic)
        self.router, self.timeout = router, timeout
        self.attempts, self.probe_timeout = attempts, probe_timeout
        self._pairs: dict[tuple[str, str], tuple[GrpcWorker, GrpcWorker, Pair]] = {}
        self._generation = self.roster.generation
        #: Retired pairs' aclose, awaited by this router's.
        self._closing: set[asyncio.Task[None]] = set()

    def add(self, role: str, worker: GrpcWorker, *, healthy: bool = True) -> Member:
        """Add ``worker`` as a ``role`` member, in service at once when ``healthy`` (it was
        just described), else starting until a probe passes. Raises
        [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a prefill
        without its handoff (``kv``), and ``ValueError`` for an unknown role."""
        if role == "prefill" and worker.kv is None:
            raise InvalidConfiguration("a prefill worker needs its KV handoff (kv)", param="kv")
        health = HealthState(Health.HEALTHY) if healthy else HealthState()
        return self.roster.join(Member(role, worker.address, worker, health))

    def choose(self, request: Any, exclude: Sequence[str] = ()) -> tuple[Member, Member]:
        """The prefill and decode members for ``request`` (a message, or a read
        ``RawRequest``), leaving out those named in ``exclude``.

        Raises the carve-out that explains why when no listed decode can serve it,
        [`MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported] (400) when
        no listed prefill can process its media, and
        [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable] (503, retryable)
        when the ones that could are all out of service."""
        return self._place(_view(request), exclude)

    def _place(self, view: Request, exclude: Sequence[str]) -> tuple[Member, Member]:
        placed = place(self.roster, view, capability=_capability, exclude=exclude)
        return placed.prefill, placed.decode

    def _pair(self, prefill: Member, decode: Member) -> Pair:
        if self._generation != self.roster.generation:
            # Members left or were described anew since: their pairs go now, not at the
            # next pair built, so that the table holds only live pairs however the fleet
            # churns and whichever pairs its traffic reuses.
            self._generation = self.roster.generation
            self._retire_stale()
        key = (prefill.name, decode.name)
        cached = self._pairs.get(key)
        if cached is not None and cached[0] is prefill.worker and cached[1] is decode.worker:
            return cached[2]
        # A member described anew gets a router of its own: its capability or handoff may
        # have changed.
        pair = self.router(
            prefill.worker.channel, [DecodeCandidate(decode.worker.capability,
                                                     decode.worker.channel)],
            kv=prefill.worker.kv, timeout=self.timeout,
        )  # fmt: skip
        self._pairs[key] = (prefill.worker, decode.worker, pair)
        return pair

    def _retire_stale(self) -> None:
        current = {m.name: m.worker for m in self.roster}
        for key, (p, d, pair) in list(self._pairs.items()):
            if current.get(key[0]) is not p or current.get(key[1]) is not d:
                del self._pairs[key]
                task = asyncio.ensure_future(pair.aclose())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def _blame(self, error: PolicyError, prefill: Member, decode: Member) -> Member | None:
        member = {"prefill": prefill, "decode": decode}.get(getattr(error, "leg", ""))
        if member is not None and isinstance(error, WorkerFailedToStart) and error.status >= 500:
            self.roster.failed(member)
        return member

    async def generate(self, request: Any) -> AsyncGenerator[Any]:
        """Serve ``request`` (a ``GenerateRequest``, or its bytes with a bytes router);
        yields the decode worker's responses. Raises the policy's errors, and the last
        attempt's failure (see the module docs)."""
        if isinstance(request, bytes | bytearray | memoryview):
            request = read_request(bytes(request))
        view = _view(request)
        # n>1 runs no prefill (each sample decodes alone): its first leg is the decode.
        first_leg = Stage.PREFILLING if view.n <= 1 else Stage.DECODING
        life = RequestLife(attempts=self.attempts)
        last: PolicyError | None = None
        while True:
            try:
                prefill, decode = self._place(view, life.failed_on)
            except NoWorkerAvailable:
                if last is None:
                    raise
                # No other worker to try: the caller gets the failure that made it try.
                raise last from None
            life = begin(life, first_leg)
            members = (prefill, decode)
            for member in members:
                member.outstanding += 1
            try:
                stream = self._pair(prefill, decode).generate(request)
                async with contextlib.aclosing(stream):
                    try:
                        first = await anext(stream)
                    except StopAsyncIteration:
                        first = None
                    except PolicyError as exc:
                        last = exc
                        blamed = self._blame(exc, prefill, decode)
                        life = fail(life, exc, blamed.name if blamed is not None else None)
                        if life.stage is Stage.PLANNING:
                            continue
                        raise
                    if life.stage is not Stage.DECODING:
                        life = begin(life, Stage.DECODING)
                    life = responding(life)
                    if first is not None:
                        yield first
                    try:
                        async for response in stream:
                            yield response
                    except PolicyError as exc:
                        self._blame(exc, prefill, decode)  # the stream ends with it
                        raise
                for member in members:
                    self.roster.succeeded(member)
                done(life)
                return
            finally:
                for member in members:
                    member.outstanding -= 1

    async def probe_once(self, *, kv_mode: KvConnectorMode | None = None) -> None:
        """Probe every member once (see the module docs); ``kv_mode`` as for
        [`describe_worker`][pd_policy_grpc.fleet.describe_worker]."""

        async def probe(member: Member) -> None:
            stub = pb_grpc.VllmEngineStub(member.worker.channel)
            try:
                answer = await stub.HealthCheck(pb.HealthCheckRequest(),
                                                timeout=self.probe_timeout)  # fmt: skip
                healthy = bool(answer.healthy)
            except grpc.aio.AioRpcError:
                healthy = False
            if not healthy:
                self.roster.probe_failed(member)
                return
            if routable(member.health):
                return
            try:
                worker = await describe_worker(
                    member.worker.channel, member.worker.address, member.role,
                    kv_mode=kv_mode,
                    timeout=self.probe_timeout,
                )  # fmt: skip
            except grpc.aio.AioRpcError:
                self.roster.probe_failed(member)
                return
            self.roster.readmit(member, worker)

        await asyncio.gather(*(probe(m) for m in self.roster))

    async def aclose(self) -> None:
        """Wait for every pair's deferred decode aborts, retired pairs' included."""
        await asyncio.gather(*(pair.aclose() for _, _, pair in self._pairs.values()),
                             *list(self._closing))  # fmt: skip
