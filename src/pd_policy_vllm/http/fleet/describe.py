"""What a worker is, read from its server, or from what the operator says of it.

A worker is described whole, whatever its role: its capability (``supports_vision``,
``accepts_mm_metadata``, its encoder-cache role), how it hands KV over, whether it
serves vLLM's scale-out routes, and what it does with media. The proxy reads it at
start-up, and again each time the worker comes back after an ejection: a worker
restarted as another kind (with ``--language-model-only``, say) is routed as what it
is now, never as what it was.

vLLM's HTTP server describes itself only in development mode
(``VLLM_SERVER_DEV_MODE=1``): ``GET /server_info?config_format=json``. For a worker
that does not, the [`OperatorSays`][pd_policy_vllm.http.fleet.describe.OperatorSays]
flags do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import attrs

from pd_policy import (
    EncoderCacheRole,
    InvalidConfiguration,
    KvConnectorMode,
    MediaFetchRules,
    PrefillKv,
    Support,
    WorkerCapability,
)
from pd_policy.authority import host_of_url, worker_url
from pd_policy.decode_kv import DecodeKv
from pd_policy.kv_lease import prefill_lease
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.auth import for_url
from pd_policy_vllm.http.fleet.members import member_name
from pd_policy_vllm.kv_events.source import kv_source_from_config
from pd_policy_vllm.openai.media.identity import WorkerMedia
from pd_policy_vllm.openai.plan.scale_out import DERENDER, RENDER
from pd_policy_vllm.openai.workers import (
    HttpWorker,
    capability_from_config,
    media_from_config,
    prefill_kv_from_config,
)

__all__ = ["CAPABILITIES", "UNDESCRIBED_DECODE", "OperatorSays", "describe", "server_info"]

_log = logging.getLogger(__name__)

#: What ``--decode-capability`` can say of a decode worker that does not describe itself.
CAPABILITIES: Final = {
    "vision": WorkerCapability(Support.TRUE),
    "lm-only": WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.FALSE),
    "lm-only+metadata": WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE),
}

#: What a decode worker is taken as when nothing describes it: language-model-only.
UNDESCRIBED_DECODE: Final = CAPABILITIES["lm-only"]


@attrs.frozen(slots=True)
class OperatorSays:
    """What the operator says of workers that do not describe themselves (and what
    overrides them): the KV handoff contract and Mooncake bootstrap port, a decode
    worker's capability and how it takes KV, and the media domains a worker allows
    (``None``: unknown)."""

    kv_mode: KvConnectorMode | None = None
    bootstrap_port: int | None = None
    capability: WorkerCapability | None = None
    allowed_media_domains: tuple[str, ...] | None = None
    decode_kv: DecodeKv | None = None
    #: What of a worker's ``vllm_config`` the configuration file states for it (its
    #: ``kv_transfer_config``, ``kv_events_config`` and ``cache_config``): read as its
    #: ``/server_info`` would be, for its KV connector and its KV events.
    stated: Mapping[str, Any] | None = attrs.field(default=None, eq=False)


async def server_info(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]
) -> dict[str, Any] | None:
    """The worker's ``/server_info`` (its ``vllm_config`` and ``vllm_env``), or ``None``
    when it does not serve it (a redirect included). Raises ``aiohttp.ClientError`` when
    it cannot be reached."""
    # A worker is its own URL: a redirect is not followed, so the workers' key and the
    # proxy's calls go nowhere the operator or an admin did not name.
    async with session.get(
        f"{url}/server_info",
        params={"config_format": "json"},
        headers=for_url(headers, url),
        allow_redirects=False,
    ) as response:
        if response.status != 200:
            return None
        info = await response.json()
    return info if isinstance(info, dict) else None


async def _serves(
    session: aiohttp.ClientSession, url: str, route: str, headers: Mapping[str, str]
) -> bool:
    # Without --enable-scale-out every such route answers 403, and a server without the
    # route 404; with it, an empty body is a validation error (400 or 422).
    async with session.post(
        url + route, json={}, headers=for_url(headers, url), allow_redirects=False
    ) as response:
        return response.status in (400, 422)


def _host(url: str) -> str | None:
    # Whole, and bare: "fe80::1%eth0" of "http://[fe80::1%25eth0]:8000".
    return host_of_url(url)


async def describe(
    session: aiohttp.ClientSession,
    url: str,
    role: str,
    says: OperatorSays,
    headers: Mapping[str, str] | None = None,
) -> HttpWorker:
    """The ``role`` (``prefill``, ``decode`` or ``encode``) worker at ``url``, as its
    server describes it, else as ``says``.

    ``headers`` go with every call (the workers' API key). ``renders`` says whether it
    serves vLLM's scale-out routes: a prefill or an encoder the render route, a decode
    the derender route. A prefill's KV events are read from its configuration
    ([`kv_source_from_config`][pd_policy_vllm.kv_events.source.kv_source_from_config]).
    Raises ``aiohttp.ClientError`` for a worker that cannot be
    reached, and [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for
    one this library cannot serve: a prefill whose KV connector neither it nor the
    operator names, settings of the wrong type, an address
    [`worker_url`][pd_policy.authority.worker_url] cannot read one way only (a bare
    ``fe80::1`` or ``[fe80::1]:8000`` is read whole, as ``http://[fe80::1]...``).
    """
    url = worker_url(url)
    headers = dict(headers or {})
    info = await server_info(session, url, headers)
    route = DERENDER if role == "decode" else RENDER
    renders = await _serves(session, url, route, headers)
    config = info.get("vllm_config") if info is not None else None
    assumed = False
    if isinstance(config, Mapping):
        capability = capability_from_config(config)
        media = media_from_config(config, info.get("vllm_env") if info else None)
    else:
        # --decode-capability speaks of the decode workers only; a prefill or an encoder
        # that does not describe itself stays unknown (treated as vision-capable).
        stated = says.capability if role == "decode" else None
        assumed = role == "decode" and stated is None
        if assumed:
            # Fail closed: a decode nothing describes may be --language-model-only, and an
            # image sent there fails deep in its engine. The stripped leg serves both kinds.
            _log.warning(
                "decode %s: not described (no /server_info, no capability configured): "
                "taken as language-model-only, it is sent no media",
                member_name(url),
            )
            stated = UNDESCRIBED_DECODE
        capability = stated if stated is not None else WorkerCapability()
        ec = (says.stated or {}).get("ec_transfer_config")
        if isinstance(ec, Mapping) and ec:  # the file states its E/P/D role
            ec_role, connector = ec.get("ec_role"), ec.get("ec_connector")
            encoder_cache = EncoderCacheRole.from_vllm(
                ec_role if isinstance(ec_role, str) else None,
                connector if isinstance(connector, str) else None,
            )
            capability = attrs.evolve(capability, encoder_cache=encoder_cache)
        if role == "decode" and says.decode_kv is not None:
            capability = attrs.evolve(capability, decode_kv=says.decode_kv)
        media = WorkerMedia()
        if says.allowed_media_domains is not None:
            # The operator states the worker's rules: an empty list is vLLM's "any host".
            rules = MediaFetchRules(allowed_domains=says.allowed_media_domains, known=True)
            media = WorkerMedia(rules)
    kv, events = PrefillKv(KvConnectorMode.NIXL), None
    if role == "prefill":
        kv = _prefill_kv(config, url, says)
        read = config if isinstance(config, Mapping) else says.stated
        if isinstance(read, Mapping):
            events, why = kv_source_from_config(read, url)
            if events is None:
                _log.info("%s: no KV-event routing on this prefill: %s", member_name(url), why)
    return HttpWorker(
        url, capability, kv=kv, renders=renders, media=media, kv_events=events, assumed=assumed
    )


def _prefill_kv(config: Any, url: str, says: OperatorSays) -> PrefillKv:
    # The server's own configuration, else the file's statement of its connector.
    stated = says.stated or {}
    if not isinstance(config, Mapping) and stated.get("kv_transfer_config"):
        config = stated
    if isinstance(config, Mapping):
        return prefill_kv_from_config(
            config, url, mode=says.kv_mode, bootstrap_port=says.bootstrap_port
        )
    if says.kv_mode is None:
        raise InvalidConfiguration(
            "a prefill worker does not describe its KV connector: pass --kv-mode, or state "
            "its kv_transfer_config in the configuration file's [[workers]]",
            param="kv_mode",
        )
    return PrefillKv(
        says.kv_mode,
        bootstrap_host=_host(url),
        bootstrap_port=says.bootstrap_port or 8998,
        lease=prefill_lease({}, says.kv_mode),  # NIXL's default: the worker says nothing
    )
