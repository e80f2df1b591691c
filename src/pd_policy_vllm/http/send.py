"""The exchange's ``Send``: a render, encode or prefill leg sent to its member, and its
answer read into what the next step needs.

A render's answer becomes the plan's prefill (or encode) leg, an encoder's answer the
prefill leg of a cache consumer, and the prefill's answer the handoff the decode leg
carries now, with its age (the seconds since the prefill leg went out), which the exchange
checks before any decode leg is sent (complete, and within the prefill's lease on its
KV). A prefill leg of
the client's own body is spliced from the client's bytes; every other leg is written
anew. Any failure, of the worker or of its answer, is the leg's failure.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from typing import Any

from pd_policy import PolicyError
from pd_policy.exchange.events import Event, Leg, LegAnswered, LegFailed, Send
from pd_policy_vllm.http.attempt import Attempt
from pd_policy_vllm.http.calls import post_json
from pd_policy_vllm.http.parsing import OFF_THE_LOOP
from pd_policy_vllm.http.upstream import Upstream
from pd_policy_vllm.openai.plan.events import kv_facts
from pd_policy_vllm.openai.plan.legs import prefill_bytes
from pd_policy_vllm.openai.plan.scale_out import GENERATE, RENDER
from pd_policy_vllm.openai.plan.steps import after_prefill, plan_encoded, plan_rendered
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["send"]


async def send(
    attempt: Attempt, action: Send[HttpWorker], upstream: Upstream, headers: Mapping[str, str]
) -> Event:
    """Send ``action``'s leg of ``attempt`` to its member over ``upstream`` (with
    ``headers``: the request's legs'), and what came of it."""
    plan, incoming, leg = attempt.plan, attempt.incoming, action.leg
    assert plan is not None
    member = action.member
    # A render goes to the encoder or the prefill, and is named by the member's role.
    name, url = member.role, member.worker.url
    started = time.monotonic()
    try:
        if leg is Leg.RENDER:
            assert plan.render is not None
            answer = await post_json(upstream, name, url + RENDER, plan.render, headers)
            attempt.plan = plan_rendered(plan, answer)
            return LegAnswered(leg)
        if leg is Leg.ENCODE:
            assert plan.encode is not None
            answer = await post_json(upstream, name, url + GENERATE, plan.encode, headers)
            attempt.plan = plan_encoded(plan, answer)
            return LegAnswered(leg)
        body: Any = plan.prefill
        raw = incoming.raw
        if (
            raw is not None
            and plan.body is incoming.body
            and plan.prefill_route == incoming.route.value
        ):
            # The client's own body (not pinned, rendered or translated): spliced. Finding
            # its members is a step of Python a value: a large body's, in a thread.
            splice = functools.partial(
                prefill_bytes, raw, incoming.body, incoming.route, plan.handoff
            )
            spliced = splice() if len(raw) < OFF_THE_LOOP else await asyncio.to_thread(splice)
            body = spliced if spliced is not None else body
        # Unparsed: the decode leg reads only what it needs, the ids as bytes.
        route = url + plan.prefill_route
        sent = time.monotonic()
        answer = await post_json(upstream, "prefill", route, body, headers, parse=False)
        attempt.reply, attempt.leg = after_prefill(plan, answer)
        # Its age counts from the sending, before the prefill's lease on the KV began.
        return LegAnswered(leg, kv_facts(attempt.leg, time.monotonic() - sent))
    except PolicyError as exc:
        return LegFailed(leg, exc)
    finally:
        attempt.legs.append((leg.value, time.monotonic() - started))
