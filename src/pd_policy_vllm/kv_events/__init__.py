"""vLLM's KV events, read into the core's prefix index: what each worker's cache holds.

A worker started with ``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``
publishes every block it caches or evicts on a ZeroMQ PUB socket (the ``*`` makes it
bind), and keeps its last batches for a replay. [`wire`][pd_policy_vllm.kv_events.wire]
decodes a batch, refusing what is not one; [`feed`][pd_policy_vllm.kv_events.feed]
subscribes to a worker, feeds the index in order and replays what it missed. The sockets
have no authentication: bind them on the workers' private network, where only the
router reaches them. The index takes their events as hints, so a wrong one costs a cache
miss, never a wrong answer (see ``docs/routing.md``).

Needs ``pyzmq`` and ``msgspec`` (the ``http`` extra; both come with vLLM).
"""
