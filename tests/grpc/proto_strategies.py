"""Wire messages for the gRPC adapter's tests: core requests written as ``GenerateRequest``.

Payload bytes are fabricated (zeros, capped in size): the policy never reads them.
"""

from __future__ import annotations

from hypothesis import reject
from hypothesis import strategies as st

from pd_policy_grpc.wire import pb
from strategies import requests
from wire_messages import tensor_to_proto, to_proto

__all__ = ["protos", "tensor_to_proto", "to_proto"]


@st.composite
def protos(draw: st.DrawFn, *, mm: bool | None = None) -> pb.GenerateRequest:
    request = draw(requests(mm=mm))
    wire_n = 0 if request.n == 1 and draw(st.booleans()) else None
    try:
        return to_proto(request, unspecified_image=draw(st.booleans()), wire_n=wire_n)
    except UnicodeEncodeError:
        # The core takes any str (lone surrogates included); proto strings must be UTF-8.
        reject()
