"""Which members of a roster take one attempt at a request: an encoder (in E/P/D), a
prefill and a decode, chosen by the core's rules before any worker is called.

One function for every router, so that the HTTP proxy and the gRPC fleet cannot drift
apart. For each role, in this order:

1. the *compatible* members (the core's selection over each one's capability): the
   encoder and prefill by the request's media, the decode by the request as it will
   be when the decode is called (the chosen prefill may render it first);
2. of those, the *routable* ones, leaving out those an earlier attempt failed on;
3. the prefill by the *KV blocks* of the request it holds, when the router knows them
   (its KV events), then the encoder and the prefill by *affinity* to the request's
   media (their prefix and encoder caches hold it), each bounded by load; the decode
   by load alone
   ([`Roster.choose`][pd_policy.fleet.roster.Roster.choose]).

Pure but for the roster's draw counter: the members' health and load are read, never
moved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

import attrs

from ..epd import select_encoder_workers, select_prefill_workers
from ..errors import MultimodalNotSupported
from ..request import Request
from ..selection import DecodeCandidate, select_decode_workers
from ..worker import WorkerCapability
from .roster import Member, Roster

__all__ = ["Placement", "media_affinity", "place"]

W = TypeVar("W")


@attrs.frozen(slots=True)
class Placement(Generic[W]):
    """The members one attempt goes to; ``encoder`` is ``None`` outside E/P/D."""

    prefill: Member[W]
    decode: Member[W]
    encoder: Member[W] | None = None

    @property
    def members(self) -> tuple[Member[W], ...]:
        """The members in the order the legs run."""
        return tuple(m for m in (self.encoder, self.prefill, self.decode) if m is not None)


def media_affinity(request: Request) -> str | None:
    """The affinity key of ``request``: its media items' content hashes, in order, or
    ``None`` for a request without media (it goes by load alone)."""
    return ",".join(h for b in request.batches for h in b.mm_hashes) or None


def place(
    roster: Roster[W],
    request: Request,
    *,
    capability: Callable[[Member[W]], WorkerCapability],
    exclude: Sequence[str] = (),
    encode: bool = False,
    decided: Callable[[Member[W], bool], Request] | None = None,
    cached: Mapping[str, int] | None = None,
) -> Placement[W]:
    """The members of ``roster`` that take an attempt at ``request``, leaving out those
    named in ``exclude``.

    ``capability`` says what a member can serve now (an adapter may demote a decode for
    a route it lacks). ``encode`` says the request runs E/P/D when an encoder that can
    take it is listed. ``decided(prefill, encoded)`` gives the request as the decode
    will see it after that prefill (default: ``request`` itself). ``cached`` says how
    many of the request's leading KV blocks each prefill holds, by name (from their KV
    events): the prefill that holds the most takes it, within the load bound.

    Raises [`MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported] (400)
    when prefills are listed and none can process the request's media, the carve-out
    that explains why when decodes are listed and none can serve it, and
    [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable] (503, retryable) for a
    role whose compatible members are all out of service (or none is listed).
    """

    def candidates(role: str) -> list[DecodeCandidate[Member[W]]]:
        return [DecodeCandidate(capability(m), m) for m in roster.of(role)]

    affinity = media_affinity(request)
    encoder = None
    if encode:
        encoders = select_encoder_workers(candidates("encode"))
        if encoders:
            encoder = roster.choose(
                "encode", [c.handle for c in encoders], affinity=affinity, exclude=exclude
            )
    encoded = encoder is not None
    listed = candidates("prefill")
    prefills = select_prefill_workers(request, listed, encoded=encoded)
    if listed and not prefills:
        raise MultimodalNotSupported(
            "no prefill worker of this fleet loads the encoder's outputs (ec_consumer)"
            if encoded
            else "no prefill worker of this fleet can process the request's media: each runs "
            "as a language model only, or as an encoder"
        )
    prefill = roster.choose(
        "prefill",
        [c.handle for c in prefills],
        affinity=affinity,
        exclude=exclude,
        cached=cached,
    )
    seen = decided(prefill, encoded) if decided is not None else request
    compatible = [c.handle for c in select_decode_workers(seen, candidates("decode"))]
    decode = roster.choose("decode", compatible, exclude=exclude)
    return Placement(prefill, decode, encoder)
