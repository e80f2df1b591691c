"""The conformance cases of the KV wires: every connector served or refused, the configs
that need more than a name, a decode's KV load, the route rule of NIXL push, and a
hash-matched or recomputing decode passed over for a request with media."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pd_policy.codec import worker_to_json
from pd_policy.tools.scenarios import image_request, mrope_request, text_request
from pd_policy.wires import CONNECTORS

from .fixtures import WORKERS, req

__all__ = ["wire_cases"]

_P2P: Final = {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [{"type": "p2p"}]}
_FS: Final = {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [{"type": "fs"}]}


def _multi(*names: str) -> dict[str, Any]:
    children = [{"kv_connector": n, "kv_role": "kv_both"} for n in names]
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": children}}


_CONFIGS: Final[dict[str, dict[str, Any]]] = {
    "none": {},
    "nixl_push": {"kv_connector": "NixlPushConnector", "kv_role": "kv_producer"},
    "offloading_p2p": {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": _P2P},
    "offloading_fs": {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": _FS},
    "multi_nixl_lmcache": _multi("NixlConnector", "LMCacheConnectorV1"),
    "multi_nixl_cpu_offload": _multi("NixlConnector", "SimpleCPUOffloadConnector"),
    "multi_lmcache_offloading": _multi("LMCacheConnectorV1", "OffloadingConnector"),
    "multi_two_handoffs": _multi("NixlConnector", "MooncakeConnector"),
    "multi_local_only": _multi("SimpleCPUOffloadConnector", "HiSparseConnector"),
    "multi_with_a_refused": _multi("NixlConnector", "HF3FSKVConnector"),
    "multi_nested": _multi("NixlConnector", "MultiConnector"),
    "multi_push": _multi("NixlPushConnector", "OffloadingConnector"),
    "multi_no_list": {"kv_connector": "MultiConnector"},
    "recompute": {"kv_connector": "NixlConnector", "kv_load_failure_policy": "recompute"},
    "unknown": {"kv_connector": "MyConnector"},
}


def wire_cases(add: Callable[..., None]) -> None:
    """Append the cases, through ``add(case_id, description, operation, **fields)``."""
    for name in CONNECTORS:
        add(f"wires/connector/{name or 'none'}", "every connector, served or refused",
            "connector_mode", kv_connector=name)  # fmt: skip
    for name, config in _CONFIGS.items():
        add(f"wires/config/{name}", "a prefill's contract from its whole config",
            "kv_config_mode", kv_transfer_config=config)  # fmt: skip
        add(f"wires/decode_kv/{name}", "how a decode with this config takes KV",
            "decode_kv", kv_transfer_config=config)  # fmt: skip
    for stated in ("nixl", "passthrough"):
        add(f"wires/config/nixl_push/stated_{stated}", "the operator's mode, but push stays push",
            "kv_config_mode", kv_transfer_config=_CONFIGS["nixl_push"], stated=stated)  # fmt: skip
    routes = {
        "chat": ("/v1/chat/completions", "/v1/chat/completions"),
        "metadata_path": ("/inference/v1/generate", "/inference/v1/generate"),
        "epd_no_metadata": ("/inference/v1/generate", "/v1/chat/completions"),
        "responses": ("/v1/chat/completions", "/v1/responses"),
    }
    for name, (prefill, decode) in routes.items():
        for mode in ("nixl", "nixl_push"):
            add(f"wires/routes/{name}/{mode}", "legs paired by route share one",
                "leg_routes", mode=mode, prefill_route=prefill, decode_route=decode)  # fmt: skip
    plain, content = worker_to_json(WORKERS["lm_only"]), worker_to_json(WORKERS["lm_only_content"])
    metadata = worker_to_json(WORKERS["lm_only_metadata"])
    recompute = worker_to_json(WORKERS["lm_only_metadata_recompute"])
    for shape, request, pool in (
        ("image_n1", image_request(), [content, plain]),
        ("image_n1_only_blind", image_request(), [content, content]),
        ("text_n1", text_request(), [content, plain]),
        ("mrope_n1", mrope_request(), [recompute, metadata]),
        ("mrope_n1_only_blind", mrope_request(), [recompute]),
    ):
        add(f"wires/select/{shape}", "a decode blind to a stripped leg is passed over for media",
            "select_decode_workers", request=req(request), candidates=pool)  # fmt: skip
