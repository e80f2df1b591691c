"""SMG's protos cannot carry E/P/D: no encoder-cache field anywhere a router would need one.

docs/epd.md says so and pd_policy_grpc builds no encode leg; this fails when a new
smg-grpc-proto gains such a field, so that the decision is revisited.
"""

from __future__ import annotations

import pytest

from pd_policy_grpc.wire import pb


@pytest.mark.parametrize(
    "message", [pb.GenerateRequest, pb.GenerateComplete, pb.GetServerInfoResponse]
)
def test_no_message_a_router_uses_has_an_encoder_cache_field(message: type) -> None:
    names = [f.name for f in message.DESCRIPTOR.fields]  # type: ignore[attr-defined]
    assert not [n for n in names if n.startswith("ec_") or "encoder_cache" in n], names
