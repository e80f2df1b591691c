"""The whole policy on one request, as data: the form and leg it yields, or the error.

This is what the CLI explains, the demo tabulates and the conformance vectors
record. ``plan`` runs the same steps a router runs: decide, build the leg, and,
when told what the prefill returned, relay the KV parameters and check the
handoff.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from pd_policy.codec import request_to_json
from pd_policy.connectors import KvConnectorMode
from pd_policy.decision import DecodeForm
from pd_policy.errors import PolicyError
from pd_policy.fields import redacted_repr
from pd_policy.handoff import ensure_kv_handoff, relay_kv
from pd_policy.legs import build_decode_leg
from pd_policy.request import LegacyKvParams, Request, kv_params_text
from pd_policy.salt import decode_cache_salt, upstream_decode_cache_salt
from pd_policy.worker import WorkerCapability

__all__ = ["Outcome", "PrefillResult", "plan"]


@attrs.frozen(slots=True)
class PrefillResult:
    """What the prefill leg returned about the KV handoff (nothing, for a failed handoff),
    and ``mode``, the contract of the prefill's connector the handoff is checked under."""

    kv_transfer_params: str | None = attrs.field(
        default=None, converter=kv_params_text, repr=redacted_repr
    )
    kv_legacy: LegacyKvParams | None = None
    mode: KvConnectorMode = KvConnectorMode.NIXL

    @classmethod
    def returned(
        cls, params: Mapping[str, Any] | str, mode: KvConnectorMode = KvConnectorMode.NIXL
    ) -> PrefillResult:
        """A prefill that returned ``params`` (a JSON object or its text)."""
        return cls(kv_transfer_params=kv_params_text(params), mode=mode)

    @classmethod
    def nothing(cls, mode: KvConnectorMode = KvConnectorMode.NIXL) -> PrefillResult:
        """A prefill that returned no KV parameters."""
        return cls(mode=mode)


@attrs.frozen(slots=True)
class Outcome:
    """The result of [`plan`][pd_policy.tools.outcome.plan]: either a form and leg, or an error."""

    form: DecodeForm | None
    leg: Request | None
    #: The salt a decode worker gives the leg
    #: ([`pd_policy.decode_cache_salt`][pd_policy.salt.decode_cache_salt]).
    cache_salt: str | None = attrs.field(repr=redacted_repr)
    #: What an SMG servicer gives the same leg
    #: ([`pd_policy.upstream_decode_cache_salt`][pd_policy.salt.upstream_decode_cache_salt]).
    upstream_cache_salt: str | None = attrs.field(repr=redacted_repr)
    error: PolicyError | None = attrs.field(default=None, eq=False)
    #: Whether the post-prefill handoff check ran.
    handoff_checked: bool = False

    @property
    def ok(self) -> bool:
        """True when the request can be served."""
        return self.error is None

    @property
    def status(self) -> int:
        """200 when the request can be served, else the error's HTTP status."""
        return 200 if self.error is None else self.error.status

    def served_json(self) -> dict[str, Any]:
        """A served outcome as JSON: status 200, the form, the leg and both salts.

        Raises ``ValueError`` for a refused outcome, whose JSON form is the
        caller's to choose (an error body, or the code and status alone).
        """
        if self.form is None or self.leg is None:
            raise ValueError("a refused outcome has no form or leg")
        return {
            "status": 200,
            "form": self.form.value,
            "decode_leg": request_to_json(self.leg),
            "cache_salt": self.cache_salt,
            "upstream_cache_salt": self.upstream_cache_salt,
        }


def plan(
    request: Request, decode_worker: WorkerCapability, prefill: PrefillResult | None = None
) -> Outcome:
    """Run the policy on ``request`` for ``decode_worker``; never raises ``PolicyError``.

    With ``prefill`` (what the prefill leg returned), the leg also gets the
    relayed KV parameters and the post-prefill check runs.
    """
    try:
        form, leg = build_decode_leg(request, decode_worker)
        if prefill is not None:
            leg = relay_kv(leg, prefill.kv_transfer_params, prefill.kv_legacy)
            ensure_kv_handoff(request, form, leg, prefill.mode)
    except PolicyError as exc:
        return Outcome(None, None, None, None, exc, prefill is not None)
    return Outcome(
        form,
        leg,
        decode_cache_salt(leg),
        upstream_decode_cache_salt(leg),
        None,
        prefill is not None,
    )
