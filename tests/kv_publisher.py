"""vLLM's own KV-event publisher (``ZmqEventPublisher``) on ports the OS picks as it binds
them, read back after: no test picks a free port and binds it later (another process
may take it in between).

Its sockets bind ``tcp://*:*`` (ZeroMQ's "any port", on every interface, as a worker's
``tcp://*:PORT`` does), and the publisher states the ports it got in its configuration,
as ``tcp://*:PORT``. A port given is bound as it is (a publisher restarted where it was).
"""

from __future__ import annotations

import zmq
from vllm.distributed.kv_events import ZmqEventPublisher

__all__ = ["bound_publisher", "port_of"]


class _Publisher(ZmqEventPublisher):  # type: ignore[misc]
    @staticmethod
    def _bind(sock: zmq.Socket, endpoint: str) -> str:  # type: ignore[type-arg]
        # Called as the publisher is made, before its thread starts: the socket is ours.
        sock.bind(endpoint)
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)  # tcp://0.0.0.0:PORT
        return f"tcp://*:{port_of(bound)}"


def port_of(endpoint: str) -> int:
    """The port of a ``tcp://host:PORT`` endpoint."""
    return int(endpoint.rsplit(":", 1)[1])


def bound_publisher(
    topic: str = "",
    port: int | None = None,
    replay_port: int | None = None,
    *,
    buffer_steps: int = 10_000,
) -> tuple[ZmqEventPublisher, int, int]:
    """A publisher of ``topic`` with its replay socket, on ``port`` and ``replay_port`` (the
    OS's pick for each not given), keeping its last ``buffer_steps`` batches for a replay
    (vLLM's default); it, and the ports it is bound on."""
    events = f"tcp://*:{port}" if port is not None else "tcp://*:*"
    replay = f"tcp://*:{replay_port}" if replay_port is not None else "tcp://*:*"
    publisher = _Publisher(
        0, endpoint=events, replay_endpoint=replay, buffer_steps=buffer_steps, topic=topic
    )
    config = publisher.get_publisher_config()
    assert config.replay_endpoint is not None
    return publisher, port_of(config.endpoint), port_of(config.replay_endpoint)
