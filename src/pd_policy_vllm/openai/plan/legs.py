"""The P/D legs as OpenAI-compatible bodies for vLLM's HTTP server: pure shaping, no I/O.

- [`prefill_body`][pd_policy_vllm.openai.plan.legs.prefill_body]: the client's body,
  sanitised as SMG's HTTP router does (``stream: false``, no ``stream_options``,
  ``n: 1``, no ``min_tokens``, the output cap set to 1 on whichever key the client
  used), asking for the expanded prompt ids (``return_token_ids``) and tagged for the
  handoff.
- [`read_prefill`][pd_policy_vllm.openai.plan.legs.read_prefill]: what the prefill's
  non-streaming response says: the expanded ids, the KV parameters, the usage.
- [`decode_body`][pd_policy_vllm.openai.plan.legs.decode_body]: the decode leg for the
  decided form, from the client's body and the prefill's reply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from pd_policy import (
    ROUTER_FIELDS,
    DecodeForm,
    KvHandoff,
    MalformedRequest,
    OnClient,
    Request,
    WorkerStreamError,
    decode_cache_salt,
    fold_cache_salt,
)
from pd_policy_vllm.openai.media.parts import without_media
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.scale_out import Derender
from pd_policy_vllm.openai.wire.codec import loads, reply_fields, token_ids
from pd_policy_vllm.openai.wire.splice import Spliced, members, splice_parts
from pd_policy_vllm.openai.wire.token_ids import TokenIds, token_ids_of

__all__ = ["Leg", "PrefillReply", "decode_body", "prefill_body", "prefill_bytes", "read_prefill"]

#: A request's own media processing options: a leg without media carries neither.
_MEDIA_OPTIONS: Final = ("mm_processor_kwargs", "media_io_kwargs")
#: The router's fields a client may send, which no leg of a client's body carries (the
#: router sets its own: a front door drops them first, and a splice of the client's bytes
#: must too).
_DROPPED: Final = frozenset(f.path[0] for f in ROUTER_FIELDS if f.on_client is OnClient.DROP)


@attrs.frozen(slots=True)
class Leg:
    """An HTTP leg: the route to send it to, and its JSON body; for a leg whose output is
    tokens (the metadata path), how to derender it for the client.

    A body that forwards the prefill's ids holds them as a
    [`TokenIds`][pd_policy_vllm.openai.wire.token_ids.TokenIds] (a sequence equal to the list of
    ids, kept as the bytes the worker sent): write the body with
    [`dumps`][pd_policy_vllm.openai.wire.codec.dumps], which sends those bytes as they are, not
    with ``json.dumps``, which does not know the type."""

    route: str
    body: dict[str, Any]
    derender: Derender | None = None


def _prefill_changes(
    body: Mapping[str, Any], route: Route, handoff: KvHandoff
) -> tuple[dict[str, Any], frozenset[str]]:
    # The members the prefill leg sets and the ones it drops, in the order it sets them.
    if not handoff.runs_prefill:
        raise ValueError("this handoff runs no prefill leg (n>1: decode runs alone)")
    changes: dict[str, Any] = {"stream": False}
    drop = {"stream_options", "min_tokens", *_DROPPED}
    if "n" in body:
        changes["n"] = 1
    if route is Route.CHAT and "max_completion_tokens" in body:
        changes["max_completion_tokens"] = 1
        drop.add("max_tokens")
    else:
        changes["max_tokens"] = 1
    changes["return_token_ids"] = True
    if handoff.prefill_params is not None:
        changes["kv_transfer_params"] = json.loads(handoff.prefill_params)
    return changes, frozenset(drop)


def prefill_body(body: Mapping[str, Any], route: Route, handoff: KvHandoff) -> dict[str, Any]:
    """The prefill leg's body (a new dict; ``body`` is not changed).

    Raises ``ValueError`` for a handoff that runs no prefill (n>1).
    """
    changes, drop = _prefill_changes(body, route, handoff)
    leg = {key: value for key, value in body.items() if key not in drop}
    leg.update(changes)
    return leg


def prefill_bytes(
    raw: bytes | bytearray, body: Mapping[str, Any], route: Route, handoff: KvHandoff
) -> Spliced | None:
    """[`prefill_body`][pd_policy_vllm.openai.plan.legs.prefill_body] of ``body`` written as
    ``raw`` (the client's bytes that parse to it) with only the members it changes
    rewritten ([`splice_parts`][pd_policy_vllm.openai.wire.splice.splice_parts]): every other
    byte, the media included, as the client sent it. ``None`` when ``raw`` is not an
    object the splice can read; write ``prefill_body`` then. Raises as ``prefill_body``
    does."""
    changes, drop = _prefill_changes(body, route, handoff)
    found = members(raw)
    return splice_parts(raw, found, changes, drop) if found is not None else None


@attrs.frozen(slots=True)
class PrefillReply:
    """What a non-streaming prefill response says about the handoff."""

    #: The prompt ids after the worker's processor expanded its media (any sequence of
    #: non-negative ints is taken; they are held as the JSON the decode leg sends).
    prompt_token_ids: TokenIds = attrs.field(converter=token_ids_of)
    #: The KV parameters the engine returned, or ``None``.
    kv_transfer_params: dict[str, Any] | None
    #: The response's ``usage`` object, as sent.
    usage: dict[str, Any]


def _bad_reply(detail: str) -> WorkerStreamError:
    return WorkerStreamError("prefill", "", detail, http_status=502)


def _parsed_fields(response: Any, route: Route) -> tuple[TokenIds | None, Any, Any]:
    if not isinstance(response, Mapping):
        return None, None, None
    source: Any = response
    if route is Route.COMPLETIONS:
        choices = response.get("choices")
        source = choices[0] if isinstance(choices, list) and choices else {}
    ids = token_ids(source.get("prompt_token_ids") if isinstance(source, Mapping) else None)
    expanded = TokenIds.of(ids) if ids is not None else None
    return expanded, response.get("kv_transfer_params"), response.get("usage")


def read_prefill(response: Mapping[str, Any] | bytes, route: Route) -> PrefillReply:
    """Read the prefill's response (parsed, or its bytes: then the ids are never parsed):
    ids from the top level (chat) or the first choice (completions),
    ``kv_transfer_params`` from the top level.

    Raises [`WorkerStreamError`][pd_policy.worker_errors.WorkerStreamError] (502, leg
    ``prefill``) when it is not JSON, has no prompt ids (a worker that ignores
    ``return_token_ids``) or they are not token ids, or its KV parameters are not an
    object.
    """
    if isinstance(response, bytes):
        what = "the prefill response"
        try:
            fields = reply_fields(response, in_choice=route is Route.COMPLETIONS, what=what)
            if fields is None:
                fields = _parsed_fields(loads(response, what=what), route)
        except MalformedRequest as exc:
            raise _bad_reply(exc.message) from None
    else:
        fields = _parsed_fields(response, route)
    expanded, params, usage = fields
    if expanded is None:
        raise _bad_reply("the prefill response has no prompt_token_ids (return_token_ids)")
    if params is not None and not isinstance(params, dict):
        raise _bad_reply("the prefill response's kv_transfer_params is not an object")
    return PrefillReply(expanded, params, dict(usage) if isinstance(usage, Mapping) else {})


def decode_body(
    body: Mapping[str, Any],
    route: Route,
    form: DecodeForm,
    leg: Request,
    reply: PrefillReply | None,
    *,
    uncached: bool = False,
) -> Leg:
    """The decode leg for ``form``: ``leg`` is the core's decode leg (after the relay),
    ``reply`` what the prefill returned (``None`` when no prefill ran, n>1).

    - ``TEXT_PLUS_HASHES``, chat: the body with every media part removed from
      ``messages``, the expanded ids in ``kv_transfer_params.prompt_token_ids``
      (vLLM then skips templating), the relayed KV parameters, and
      ``cache_salt`` = the folded salt
      ([`pd_policy.decode_cache_salt`][pd_policy.salt.decode_cache_salt]:
      the media's identities and the caller's salt; 68 characters). Tools,
      reasoning and sampling options stay.
    - ``TEXT_PLUS_HASHES``, completions: the token-id ``prompt``, the KV
      parameters and the salt.
    - ``IDENTITY_ONLY`` and ``FULL`` (a vision-capable worker): the body
      itself, with the relayed KV parameters. When ``uncached`` (an item is a URL the
      proxy did not fetch: the decode worker reads it again) and the leg takes the
      prefill's KV, ``cache_salt`` is the folded salt too: what the worker reads then
      never enters its cache under the prefill's KV.

    A stripped leg carries no ``mm_processor_kwargs`` or ``media_io_kwargs``: they are
    in the items' identities, and a worker that does not trust per-request options
    refuses a request that sends them.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a stripped leg with media
    and no prompt ids to forward (it would be answered image-blind), and for a
    form HTTP does not serve here (``MROPE_METADATA``).
    """
    out = dict(body)
    params = leg.kv_transfer_params_dict()
    if form in (DecodeForm.IDENTITY_ONLY, DecodeForm.FULL):
        if params is not None:
            out["kv_transfer_params"] = params
        if uncached and leg.relays_kv and leg.has_mm_inputs:
            out["cache_salt"] = fold_cache_salt(leg)
        return Leg(route.value, out)
    if form is not DecodeForm.TEXT_PLUS_HASHES:
        raise MalformedRequest(f"no HTTP decode leg for the form {form.name}", param="form")
    ids = reply.prompt_token_ids if reply is not None else None
    if ids is None and leg.has_mm_inputs:
        raise MalformedRequest("a stripped leg with media needs the prefill's prompt ids", "prompt")
    salt = decode_cache_salt(leg)
    if salt is not None:
        out["cache_salt"] = salt
    for option in _MEDIA_OPTIONS:
        out.pop(option, None)
    if route is Route.COMPLETIONS:
        if ids is not None:
            out["prompt"] = ids
        if params is not None:
            out["kv_transfer_params"] = params
        return Leg(route.value, out)
    out["messages"] = without_media(body)
    if ids is not None:
        out["kv_transfer_params"] = {**(params or {}), "prompt_token_ids": ids}
    elif params is not None:
        out["kv_transfer_params"] = params
    return Leg(route.value, out)
