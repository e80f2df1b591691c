"""What a router's [`Exchange`][pd_policy.exchange.machine.Exchange] is told of a plan: the legs
before the decode, the handoff check, and the handoff a core decode leg carries.

Every router of OpenAI bodies (the proxy, the Ray decode server) reports its plans with
these, so that one plan is one set of events wherever it runs.
"""

from __future__ import annotations

from typing import Any

from pd_policy import Request
from pd_policy.exchange.events import HandoffCheck, KvFacts, Leg, Planned
from pd_policy_vllm.openai.plan.steps import Plan

__all__ = ["kv_facts", "planned"]


def kv_facts(leg: Request, age: float = 0.0) -> KvFacts:
    """The handoff the core decode ``leg`` carries, as the exchange checks it; ``age``: the
    seconds since its prefill leg was sent (0: planned, before any prefill answered)."""
    legacy = leg.kv_legacy
    pair = (legacy.remote_host, legacy.remote_port) if legacy is not None else None
    return KvFacts(leg.kv_transfer_params, pair, age)


def planned(plan: Plan[Any]) -> Planned:
    """The event of ``plan``: its legs before the decode (a render on the metadata path and
    in E/P/D, an encode in E/P/D, a prefill unless the decode runs alone), the handoff
    check (with the prefill's lease on its KV) and the handoff the decode leg carries up
    front (a minted transfer)."""
    legs = {Leg.PREFILL} if plan.handoff.runs_prefill else set()
    if plan.render is not None:
        legs.add(Leg.RENDER)
    if plan.epd:
        legs.add(Leg.ENCODE)
    handoff = plan.handoff
    check = HandoffCheck(plan.form, plan.request.has_mm_inputs, handoff.mode, handoff.lease)
    return Planned(frozenset(legs), check, kv_facts(plan.leg))
