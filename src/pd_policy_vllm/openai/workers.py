"""What the proxy knows about each worker: read from its server at start-up, or from flags.

vLLM's HTTP server exposes its configuration only in development mode
(``VLLM_SERVER_DEV_MODE=1``): ``GET /server_info?config_format=json`` returns
the whole ``VllmConfig``. From it the proxy reads, per worker, whether it runs
``--language-model-only``, its multimodal limits and embedding settings, and
its KV connector, role and engine id. Nothing else a worker serves says so
(``/v1/models``, ``/metrics`` and ``/version`` do not), nor does anything say
whether the model's positions are M-RoPE; those come from flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from pd_policy import (
    EncoderCacheRole,
    EngineFacts,
    InvalidConfiguration,
    KvConnectorMode,
    MalformedRequest,
    MediaFetchRules,
    MmInputProbe,
    Modality,
    PrefillKv,
    Support,
    WorkerCapability,
    derive_accepts_mm_metadata,
    derive_supports_vision,
)
from pd_policy.authority import host_of_url, worker_url
from pd_policy.kv_lease import prefill_lease
from pd_policy.wires import decode_kv_from_config, handoff_mode
from pd_policy_vllm.kv_events.source import KvSource
from pd_policy_vllm.openai.media.identity import WorkerMedia

__all__ = [
    "HttpWorker",
    "capability_from_config",
    "engine_facts_from_config",
    "media_from_config",
    "prefill_kv_from_config",
]


def _base_url(url: str) -> str:
    # An address is kept whole: "fe80::1" and "[fe80::1]:8000" become http://[fe80::1]...
    return worker_url(url)


@attrs.frozen(slots=True)
class HttpWorker:
    """A worker of the proxy: its base URL, its capability (a decode worker's), and how it
    hands KV over (a prefill worker's).

    ``url`` is normalised by [`worker_url`][pd_policy.authority.worker_url]: an address
    without a scheme gets ``http://``, an IPv6 address its brackets. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for one it cannot
    read one way only (``http://fe80::1:8000``)."""

    url: str = attrs.field(converter=_base_url)
    capability: WorkerCapability = attrs.field(factory=WorkerCapability)
    kv: PrefillKv = attrs.field(factory=lambda: PrefillKv(KvConnectorMode.NIXL))
    #: It serves vLLM's scale-out routes (``--enable-scale-out``): render, generate and
    #: derender, which the M-RoPE metadata path takes.
    renders: bool = False
    #: What it does with media (a prefill worker's): its fetch rules and processing settings.
    media: WorkerMedia = attrs.field(factory=WorkerMedia)
    #: Where it publishes its KV events and how it names its blocks (a prefill worker's),
    #: when a router can follow them; else ``None``.
    kv_events: KvSource | None = None
    #: Nothing described it (no ``/server_info``, nothing configured): its capability is
    #: what a router assumes of such a worker (a decode: language-model-only).
    assumed: bool = False


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name)
    return value if isinstance(value, Mapping) else {}


def engine_facts_from_config(config: Mapping[str, Any]) -> EngineFacts:
    """The engine facts a worker's ``/server_info`` JSON (its ``vllm_config``) states.

    vLLM's own multimodal-input check is not in the dump, so its rule is applied
    to what the config says: a language-model-only engine takes multimodal input
    only with ``enable_mm_embeds``. The limits are read only under
    ``--language-model-only`` (all 0): the dump lists the explicit limits, and a
    modality left out keeps vLLM's default, so they cannot prove an engine
    blind otherwise.
    """
    model = _section(config, "model_config")
    mm = model.get("multimodal_config")
    kv = _section(config, "kv_transfer_config")
    if not isinstance(mm, Mapping):
        return EngineFacts(is_multimodal_model=False, mm_input_probe=MmInputProbe.UNSUPPORTED)
    lm_only = mm.get("language_model_only") is True
    embeds = mm.get("enable_mm_embeds") is True
    probe = MmInputProbe.SUPPORTED if embeds or not lm_only else MmInputProbe.UNSUPPORTED
    consumer = bool(kv.get("kv_connector")) and kv.get("kv_role") in {"kv_consumer", "kv_both"}
    return EngineFacts(
        is_multimodal_model=True,
        mm_input_probe=probe,
        enable_mm_embeds=embeds,
        language_model_only=lm_only,
        is_kv_consumer=consumer,
        allow_missing_mm_embeddings=mm.get("allow_missing_mm_embeddings") is True,
    )


def capability_from_config(config: Mapping[str, Any]) -> WorkerCapability:
    """The capability a worker's configuration gives it (``supports_vision`` and
    ``accepts_mm_metadata``, by the core's rules; its encoder-cache role, as vLLM
    reads its ``ec_transfer_config``; and how it takes KV, from its
    ``kv_transfer_config``: its connector and ``kv_load_failure_policy``, by
    [`decode_kv_from_config`][pd_policy.wires.decode_kv_from_config])."""
    facts = engine_facts_from_config(config)
    ec = _section(config, "ec_transfer_config")
    role, connector = (ec.get(k) for k in ("ec_role", "ec_connector"))
    role = role if isinstance(role, str) else None
    connector = connector if isinstance(connector, str) else None
    return WorkerCapability(
        Support.from_bool(derive_supports_vision(facts)),
        accepts_mm_metadata=Support.from_bool(derive_accepts_mm_metadata(facts)),
        encoder_cache=EncoderCacheRole.from_vllm(
            role if isinstance(role, str) else None,
            connector if isinstance(connector, str) else None,
        ),
        decode_kv=decode_kv_from_config(_section(config, "kv_transfer_config")),
    )


def prefill_kv_from_config(
    config: Mapping[str, Any],
    url: str,
    *,
    mode: KvConnectorMode | None = None,
    bootstrap_port: int | None = None,
) -> PrefillKv:
    """How a prefill worker hands KV over, from its configuration and its URL.

    The contract is its connector's
    ([`handoff_mode`][pd_policy.wires.handoff_mode], which reads a ``MultiConnector``'s
    connectors and an offloading tier; ``mode`` overrides it, for a connector this
    library does not know), the Mooncake
    engine id its ``engine_id``, the bootstrap host its URL's host, the
    data-parallel size its ``parallel_config``, and a NIXL prefill's lease on its KV
    its ``kv_lease_duration`` ([`prefill_lease`][pd_policy.kv_lease.prefill_lease]). Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a refused or
    unknown connector, saying why.
    """
    kv = _section(config, "kv_transfer_config")
    parallel = _section(config, "parallel_config")
    options: dict[str, Any] = {}
    if bootstrap_port is not None:
        options["bootstrap_port"] = bootstrap_port
    contract = handoff_mode(kv, stated=mode)
    return PrefillKv(
        contract,
        engine_id=kv.get("engine_id") or None,
        bootstrap_host=host_of_url(url),
        dp_size=max(int(parallel.get("data_parallel_size") or 1), 1),
        lease=prefill_lease(kv, contract),
        **options,
    )


_MIB = 2**20
_TIMEOUT_ENV = {
    Modality.IMAGE: "VLLM_IMAGE_FETCH_TIMEOUT",
    Modality.VIDEO: "VLLM_VIDEO_FETCH_TIMEOUT",
    Modality.AUDIO: "VLLM_AUDIO_FETCH_TIMEOUT",
}


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def media_from_config(
    config: Mapping[str, Any], env: Mapping[str, Any] | None = None
) -> WorkerMedia:
    """What a worker does with media, from its ``/server_info``: the ``vllm_config`` (its
    ``--allowed-media-domains``, ``--allowed-local-media-path``, ``--mm-processor-kwargs``
    and ``--media-io-kwargs``) and the ``vllm_env`` (its fetch time-outs and size caps,
    vLLM's defaults for what it does not list). The rules are then ``known``.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for settings
    of the wrong type (a worker this library cannot read).
    """
    model = _section(config, "model_config")
    mm = _mapping(model.get("multimodal_config"))
    env = env or {}
    defaults = MediaFetchRules()

    def megabytes(name: str, default: int) -> int:
        value = env.get(name)
        return int(value) * _MIB if type(value) is int and value > 0 else default

    timeouts = {m: env[name] for m, name in _TIMEOUT_ENV.items() if type(env.get(name)) is int}
    redirects = env.get("VLLM_MEDIA_URL_ALLOW_REDIRECTS", True)
    try:
        rules = MediaFetchRules(
            allowed_domains=model.get("allowed_media_domains") or None,
            allowed_local_path=model.get("allowed_local_media_path") or None,
            allow_redirects=bool(redirects),
            max_download_bytes=megabytes(
                "VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", defaults.max_download_bytes
            ),
            max_audio_bytes=megabytes("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", defaults.max_audio_bytes),
            timeouts=timeouts,
            known=True,
        )
    except MalformedRequest as exc:
        raise InvalidConfiguration(
            f"the worker's media settings: {exc.message}", exc.param
        ) from None
    return WorkerMedia(
        rules, _mapping(mm.get("mm_processor_kwargs")), _mapping(mm.get("media_io_kwargs"))
    )
