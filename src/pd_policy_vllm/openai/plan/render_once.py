"""Render once: the prefill leg as token-in from a render the router already holds.

A router that renders a request before it places it (KV-event routing learns the
expanded prompt from a prefill's render route:
[`kv_routing`][pd_policy_vllm.http.fleet.kv_routing]) holds what a prefill sent the
client's body would compute again: the chat template applied, the prompt tokenized,
every media item decoded, processed and hashed.
[`plan_render_once`][pd_policy_vllm.openai.plan.render_once.plan_render_once] makes that
render the prefill leg: the rendered request, whole, to the prefill's
[`GENERATE`][pd_policy_vllm.openai.plan.scale_out.GENERATE], for one token and tagged
for the handoff, as the M-RoPE metadata path's prefill leg is
([`prefill_generate_body`][pd_policy_vllm.openai.plan.scale_out.prefill_generate_body]).

The answer cannot change: vLLM's chat and completions routes are that render followed
by that generate (its chat server renders with the render route's code), so the prefill
computes the same KV for the same ids, under the same block names (the render's item
hashes, the client's ``cache_salt``, which the rendered request carries). The decode
leg is the one the plan holds, its identities and salt unchanged, with the ids the
generate returns (checked equal to the rendered ones).

A plan takes the render
([`takes_render`][pd_policy_vllm.openai.plan.render_once.takes_render]) when:

- a prefill runs (one sample), and the plan has no render of its own (the metadata
  path and E/P/D build their legs from theirs);
- no item is uncached (a URL the proxy did not fetch: its decode leg's salt is its own);
- the prefill serves the scale-out routes;
- the legs may go to two routes: NIXL push pairs them by route
  ([`check_leg_routes`][pd_policy.wires.check_leg_routes]), so under it the prefill
  leg stays on the decode leg's route;

and the render is one prompt with its ids, and for each item its hash, its placeholder
and its processed tensors ([`read_prompt`][pd_policy_vllm.openai.plan.render_once.read_prompt]):
vLLM's generate route reads an item without them as one its cache holds. Otherwise the
plan is left as it was. The caller checks that the render is of the plan's body, under
the media settings of the prefill it was placed on.

A render carries each item's tensors (megabytes an image, which the router parses)
only when asked; [`render_tensors`][pd_policy_vllm.openai.plan.render_once.render_tensors]
says when a router's render before placement should ask.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from pd_policy import KvConnectorMode, WorkerStreamError
from pd_policy.wire_errors import LegRoutesDiffer
from pd_policy.wires import check_leg_routes
from pd_policy_vllm.openai.plan.scale_out import (
    GENERATE,
    Rendered,
    prefill_generate_body,
    read_render,
)
from pd_policy_vllm.openai.plan.steps import Plan
from pd_policy_vllm.openai.wire.codec import token_ids

__all__ = ["plan_render_once", "read_prompt", "render_tensors", "takes_render"]


def _bad(detail: str) -> WorkerStreamError:
    return WorkerStreamError("prefill", "", f"the render response {detail}", http_status=502)


def render_tensors(*, mrope: bool, render_once: bool, modes: Iterable[KvConnectorMode]) -> bool:
    """Whether a router's render of a request before it is placed asks for each item's
    processed tensors: when a plan may take the render over. An M-RoPE model's metadata
    path does; a plan rendered once does under a prefill connector (``modes``: the
    prefills') that lets the legs go to two routes."""
    return mrope or (render_once and any(not mode.legs_share_route for mode in modes))


def takes_render(plan: Plan[Any], *, decode_route: str, serves_generate: bool) -> bool:
    """Whether ``plan``'s prefill leg may be token-in from a render the router holds (the
    module's rules): ``decode_route`` is where its decode leg goes, ``serves_generate``
    whether its prefill serves the scale-out routes."""
    if plan.prefill is None or plan.render is not None or plan.rendered is not None:
        return False
    if plan.epd or plan.uncached or not serves_generate:
        return False
    try:
        check_leg_routes(plan.handoff.mode, GENERATE, decode_route)
    except LegRoutesDiffer:
        return False  # NIXL push: the prefill leg stays on the decode leg's route
    return True


def read_prompt(answer: Any) -> Rendered:
    """A render's ``answer`` (a completions render answers a list: of one prompt) as a
    prefill leg takes it. Raises a ``prefill_stream_error`` (502) for an answer that is
    not one prompt with its ids, that would have the generate route read media of its own
    (``content_parts``), or whose item lacks its hash, its placeholder or its processed
    tensors."""
    if isinstance(answer, list):
        if len(answer) != 1:
            raise _bad("is not one prompt")
        answer = answer[0]
    if not isinstance(answer, Mapping):
        raise _bad("is not an object")
    if answer.get("content_parts") is not None:
        # Read with the expanded ids, raw media would be expanded a second time.
        raise _bad("has content parts")
    features = answer.get("features")
    if features is None:
        ids = token_ids(answer.get("token_ids"))
        if ids is None:
            raise _bad("has no token_ids")
        return Rendered(dict(answer), ids, {}, {}, {})
    rendered = read_render(answer, metadata=False)
    tensors = features.get("kwargs_data")
    for modality, hashes in rendered.mm_hashes.items():
        items = tensors.get(modality) if isinstance(tensors, Mapping) else None
        if not (
            isinstance(items, list)
            and len(items) == len(hashes)
            and all(isinstance(item, str) and item for item in items)
        ):
            raise _bad(f"does not carry every {modality}'s processed tensors")
    return rendered


def plan_render_once(
    plan: Plan[Any], answer: Any, *, decode_route: str, serves_generate: bool
) -> Plan[Any]:
    """``plan`` with its prefill leg token-in from the render's ``answer`` (the rendered
    request to [`GENERATE`][pd_policy_vllm.openai.plan.scale_out.GENERATE], and the render
    the prefill's ids are checked against) when it takes the render
    ([`takes_render`][pd_policy_vllm.openai.plan.render_once.takes_render]); else
    ``plan``. Raises as [`read_prompt`][pd_policy_vllm.openai.plan.render_once.read_prompt]
    for an answer it cannot take: the caller keeps ``plan`` then."""
    if not takes_render(plan, decode_route=decode_route, serves_generate=serves_generate):
        return plan
    rendered = read_prompt(answer)
    prefill = prefill_generate_body(rendered, plan.handoff)
    return attrs.evolve(plan, prefill=prefill, prefill_route=GENERATE, rendered=rendered)
