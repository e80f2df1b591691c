"""How much a worker's answer may cost the proxy: time, bytes and connections.

Every bound is generous by default. A long prefill is not a fault, nor is a long
answer: the defaults are there so that a worker that is broken or hostile ends its
leg with a typed error instead of holding a client, a connection or memory forever.
"""

from __future__ import annotations

from typing import Final

import attrs

__all__ = ["DEFAULT_LIMITS", "Limits"]


@attrs.frozen(slots=True)
class Limits:
    """The bounds on one worker's answers.

    ``read_timeout``: seconds a leg may wait for the worker's head once the request is
    written (a prefill's whole run, for a non-streamed leg), and the longest silence
    between two pieces of its body; past it the leg fails with ``UpstreamTimeout``
    (504). ``max_response_bytes``: the largest body a leg reads (declared or sent);
    past it, ``UpstreamProtocolError`` (502). ``max_head_bytes``: the status line and
    headers, 1xx answers included. ``max_connections``: connections open at once to
    one worker; a leg past it waits for one to free, at most ``queue_timeout`` seconds,
    then fails as unreachable (503, so another worker may be tried). ``connect_timeout``:
    seconds to open a connection.
    """

    read_timeout: float = attrs.field(default=600.0, validator=attrs.validators.gt(0))
    max_response_bytes: int = attrs.field(
        default=256 * 1024 * 1024, validator=attrs.validators.gt(0)
    )
    max_head_bytes: int = attrs.field(default=64 * 1024, validator=attrs.validators.gt(0))
    max_connections: int = attrs.field(default=256, validator=attrs.validators.gt(0))
    queue_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    connect_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))


#: The bounds a proxy uses unless told otherwise.
DEFAULT_LIMITS: Final = Limits()
