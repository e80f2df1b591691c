"""Which settings a reload applies: the names [`reload`][pd_policy_vllm.http.reload] acts
on and the settings table's "on reload" column reads
([`shown`][pd_policy_vllm.http.config.shown]). Data alone, so that the table's generator
imports no proxy."""

from __future__ import annotations

from typing import Final

__all__ = ["LIMITS", "RELOADED"]

#: The limits a reload applies: each is read as a request, a connection or a leg begins.
LIMITS: Final = frozenset(
    {
        "max_media_items", "max_content_parts", "header_timeout", "body_timeout",
        "max_client_connections", "request_timeout", "worker_read_timeout",
        "max_response_mib", "max_connections_per_worker", "worker_queue_timeout",
    }
)  # fmt: skip
#: The settings a reload applies; every other one takes a restart.
RELOADED: Final = LIMITS | frozenset(
    {
        "prefill", "decode", "encode", "workers", "kv_mode", "bootstrap_port",
        "decode_capability", "decode_kv_transfer_config", "allowed_media_domains",
        "api_keys_file", "admin_api_key", "admin_api_keys_file", "discover",
    }
)  # fmt: skip
