"""Refusals of a pairing the KV wire cannot carry: raised before any leg is sent.

Both are the fleet's facts meeting the request's shape, so the same request to the
same fleet fails the same way: non-retryable 400s, as the decode carve-outs are.
"""

from __future__ import annotations

from .errors import PolicyError

__all__ = ["LegRoutesDiffer", "MediaOnBlindDecode"]


class MediaOnBlindDecode(PolicyError):
    """The decode worker could answer a stripped multimodal leg image-blind: its connector
    matches blocks by content hash or loads nothing, or it recomputes a failed load
    (see [`DecodeKv`][pd_policy.decode_kv.DecodeKv])."""

    code = "pd_decode_blind_to_media"
    status = 400
    meaning = (
        "The request carries media and the only decode workers that could serve it would "
        "take a stripped leg (no pixels) whose KV they may not load: their KV connector "
        "matches blocks by content hash (an offloading tier such as the OffloadingConnector's "
        "P2P tier, a KV store), they have no connector, or their kv_load_failure_policy is "
        '"recompute". Each would answer image-blind, with a 200. Refused before any leg is '
        "sent; text requests still go to them."
    )
    default_message = (
        "no decode worker can take this multimodal request: each would get it without its "
        "media and could recompute it image-blind (a KV connector that matches blocks by "
        'content hash or loads nothing, or kv_load_failure_policy "recompute"); add decode '
        "workers that load the prefill's transfer and fail on a failed load"
    )


class LegRoutesDiffer(PolicyError):
    """The KV connector pairs the legs by request id *and* route, and this request's legs
    go to two routes: the decode would never be matched."""

    code = "pd_handoff_routes_differ"
    status = 400
    meaning = (
        "The prefill worker's KV connector pairs the prefill and the decode by request id "
        "with the route's prefix (NixlPushConnector: chatcmpl-, cmpl-, generate-tokens-), "
        "and this request's prefill leg and decode leg go to different routes (E/P/D with a "
        "model that publishes no metadata, the Responses API): the decode would wait out "
        "its registration (480 s) and fail. Refused before any leg is sent."
    )
    default_message = (
        "this request's prefill and decode legs would go to different routes, and the "
        "prefill's KV connector (NIXL push) pairs them by request id and route; use "
        "/v1/chat/completions or /v1/completions, or a pull connector (NixlConnector)"
    )
