"""The exchange's ``Relay``: the decode leg built from what the prefill handed over, sent to
its member, and its answer relayed to the client
([`DecodeRelay`][pd_policy_vllm.http.relay.DecodeRelay]).

Another API planned as chat (the Responses API) gets its decode leg made of the chat
one. A failure before the first byte is the leg's, for the exchange to try again; one
after it is the stream's last event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from pd_policy import PolicyError
from pd_policy.exchange.events import Event, Leg, LegAnswered, LegFailed, Relay
from pd_policy_vllm.http.attempt import Attempt
from pd_policy_vllm.http.relay import DecodeRelay
from pd_policy_vllm.http.upstream import Upstream
from pd_policy_vllm.openai.plan.steps import STRIPPED, decode_leg_of, handed_over
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["relay"]


async def relay(
    attempt: Attempt,
    action: Relay[HttpWorker],
    upstream: Upstream,
    headers: Mapping[str, str],
    first_byte: Callable[[], object],
) -> Event:
    """The exchange's ``Relay``: ``attempt``'s decode leg built from what the prefill
    handed over, sent to its member and relayed to the client (``first_byte`` is called
    as the first byte goes out), and what came of it."""
    plan, incoming = attempt.plan, attempt.incoming
    assert plan is not None
    started = time.monotonic()
    try:
        leg = decode_leg_of(plan, attempt.leg or handed_over(plan, None), attempt.reply)
        if incoming.translate is not None:
            leg = incoming.translate(leg, plan.form in STRIPPED)
        decode = attempt.relay = DecodeRelay(
            attempt.client, first_byte, upstream.redactor, incoming.echo
        )
        url = action.member.worker.url
        late = await decode.run(upstream, url, leg, headers, stream=incoming.stream)
    except PolicyError as exc:
        return LegFailed(Leg.DECODE, exc)
    finally:
        attempt.legs.append((Leg.DECODE.value, time.monotonic() - started))
    return LegAnswered(Leg.DECODE) if late is None else LegFailed(Leg.DECODE, late)
