"""pd-policy: how a multimodal LLM request is split between prefill and decode workers.

The seed's policy is the top of this package: it decides what the decode leg of a request
may carry for a decode worker (vLLM's ``--language-model-only`` among them), builds that
leg, folds media identity into its ``cache_salt``, checks the KV handoff after prefill,
and refuses what cannot work with typed errors; pure, on the standard library and
``attrs``. Its sub-packages hold the rest of the core: ``fleet``, ``exchange``,
``cache``, ``media`` (``docs/architecture.md``); ``tools`` explains and checks it.
"""

from __future__ import annotations

from .batch import Modality, MultimodalBatch, PlaceholderRange
from .capability import (
    EngineFacts,
    MediaProcessorAdvert,
    MmInputProbe,
    advertise_media_processor,
    derive_accepts_mm_metadata,
    derive_supports_vision,
)
from .catalog import ERROR_CATALOG, CatalogEntry
from .client_errors import (
    BodyTooLarge,
    ClientTooSlow,
    Overloaded,
    RequestTimedOut,
    RouterOwnedField,
    TooManyMediaItems,
)
from .codec import request_from_json, request_to_json, worker_from_json, worker_to_json
from .connectors import (
    DEFAULT_BOOTSTRAP_PORT,
    NIXL_PREFILL_PARAMS,
    KvConnectorMode,
    KvHandoff,
    PrefillKv,
    apply_kv_handoff,
    mint_transfer_id,
    plan_kv_handoff,
)
from .decision import (
    DecodeForm,
    decide_decode_form,
    sequential_pd_decode_form,
    unidentified_media,
)
from .encoder_cache import (
    EC_ROLE_LABEL,
    EncoderCacheRole,
    EncoderOutput,
    encoder_outputs,
    ensure_encoder_outputs,
)
from .epd import (
    ConsumerPrefill,
    PrefillForm,
    encode_leg,
    encoder_consumer_leg,
    needs_encode_leg,
    select_encoder_workers,
    select_prefill_workers,
)
from .errors import (
    ERROR_CODE_HEADER,
    Forbidden,
    InvalidConfiguration,
    MalformedRequest,
    MediaRefsOnLanguageModelOnlyDecode,
    MissingEncoderOutput,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    MultimodalNotSupported,
    NoDecodeWorkerAvailable,
    NoWorkerAvailable,
    NSamplesOnLanguageModelOnlyDecode,
    PolicyError,
    Unauthorized,
)
from .handoff import check_kv_handoff, ensure_kv_handoff, relay_kv
from .handoff_fields import KV_FLAG_FIELDS, REQUIRED_KV_FIELDS, missing_kv_fields
from .legs import (
    build_decode_leg,
    clone_without_mm,
    decode_leg,
    ensure_language_model_only_leg,
    identity_only,
    metadata_only,
)
from .media_errors import MediaFetchFailed, MediaRefused, MediaUnreachable, MissingMediaIdentity
from .mrope import MROPE_GRID_KEYS, grids_kept_on_cpu, has_mrope_grids, mrope_metadata_gap
from .prefill import prefill_batch, prefill_leg
from .request import LegacyKvParams, MediaRef, Request
from .router_fields import ROUTER_FIELDS, OnClient, RouterField, check_client_fields
from .salt import (
    SALT_FOLD_PREFIX,
    SALT_FOLD_VERSION,
    decode_cache_salt,
    fold_cache_salt,
    fold_salt,
    upstream_cache_salt,
    upstream_decode_cache_salt,
)
from .selection import DecodeCandidate, ensure_model_accepts_media, select_decode_workers
from .tensor import PayloadLocation, TensorDescriptor
from .wires import CONNECTOR_MODES, connector_mode
from .worker import (
    MM_MEDIA_REF_SCHEMES_LABEL,
    MM_METADATA_LABEL,
    MM_PROCESSOR_LABEL,
    SUPPORTS_VISION_LABEL,
    Support,
    VisionSupport,
    WorkerCapability,
)
from .worker_errors import WorkerFailedToStart, WorkerStreamError, grpc_status_to_http

# The sub-packages' names. Where the seed's policy is vendored alone (docs/vendoring.md),
# the sub-packages are not there: the package imports without their names.
_SUBPACKAGES = tuple(f"{__name__}.{name}" for name in ("cache", "exchange", "fleet", "media"))
try:
    from .exchange import Exchange
    from .exchange.states import ExchangeError, Phase
    from .fleet.balance import (
        CACHE_SLACK,
        DEFAULT_BOUND,
        Balance,
        WorkerSnapshot,
        choose,
        rendezvous_order,
    )
    from .fleet.health import (
        Health,
        HealthPolicy,
        HealthState,
        drain,
        eject,
        leg_failed,
        leg_succeeded,
        probe_failed,
        readmit,
        routable,
    )
    from .fleet.placement import Placement, media_affinity, place
    from .fleet.probing import Prober, ProbeTimes
    from .fleet.roster import ROLES, Roster
    from .fleet.roster import Member as RosterMember
    from .media.identity import (
        IDENTITY_PREFIX,
        HashFactors,
        IdentityBasis,
        MediaSource,
        identity_basis,
        item_identity,
    )
    from .media.rules import DEFAULT_FETCH_TIMEOUTS, MediaFetchRules, check_media_url, media_source
    from .media.uuid_scope import ANONYMOUS, SCOPED_UUID_PREFIX, ClientUuids, Tenant, forwarded_uuid
except ModuleNotFoundError as exc:
    if exc.name is None or not exc.name.startswith(_SUBPACKAGES):
        raise

__version__ = "0.1.0"

__all__ = [
    "ANONYMOUS",
    "CACHE_SLACK",
    "CONNECTOR_MODES",
    "DEFAULT_BOOTSTRAP_PORT",
    "DEFAULT_BOUND",
    "DEFAULT_FETCH_TIMEOUTS",
    "EC_ROLE_LABEL",
    "ERROR_CATALOG",
    "ERROR_CODE_HEADER",
    "IDENTITY_PREFIX",
    "KV_FLAG_FIELDS",
    "MM_MEDIA_REF_SCHEMES_LABEL",
    "MM_METADATA_LABEL",
    "MM_PROCESSOR_LABEL",
    "MROPE_GRID_KEYS",
    "NIXL_PREFILL_PARAMS",
    "REQUIRED_KV_FIELDS",
    "ROLES",
    "ROUTER_FIELDS",
    "SALT_FOLD_PREFIX",
    "SALT_FOLD_VERSION",
    "SCOPED_UUID_PREFIX",
    "SUPPORTS_VISION_LABEL",
    "Balance",
    "BodyTooLarge",
    "CatalogEntry",
    "ClientTooSlow",
    "ClientUuids",
    "ConsumerPrefill",
    "DecodeCandidate",
    "DecodeForm",
    "EncoderCacheRole",
    "EncoderOutput",
    "EngineFacts",
    "Exchange",
    "ExchangeError",
    "Forbidden",
    "HashFactors",
    "Health",
    "HealthPolicy",
    "HealthState",
    "IdentityBasis",
    "InvalidConfiguration",
    "KvConnectorMode",
    "KvHandoff",
    "LegacyKvParams",
    "MalformedRequest",
    "MediaFetchFailed",
    "MediaFetchRules",
    "MediaProcessorAdvert",
    "MediaRef",
    "MediaRefsOnLanguageModelOnlyDecode",
    "MediaRefused",
    "MediaSource",
    "MediaUnreachable",
    "MissingEncoderOutput",
    "MissingKvTransferParams",
    "MissingMediaIdentity",
    "MmInputProbe",
    "Modality",
    "MropeOnLanguageModelOnlyDecode",
    "MultimodalBatch",
    "MultimodalNotSupported",
    "NSamplesOnLanguageModelOnlyDecode",
    "NoDecodeWorkerAvailable",
    "NoWorkerAvailable",
    "OnClient",
    "Overloaded",
    "PayloadLocation",
    "Phase",
    "PlaceholderRange",
    "Placement",
    "PolicyError",
    "PrefillForm",
    "PrefillKv",
    "ProbeTimes",
    "Prober",
    "Request",
    "RequestTimedOut",
    "Roster",
    "RosterMember",
    "RouterField",
    "RouterOwnedField",
    "Support",
    "Tenant",
    "TensorDescriptor",
    "TooManyMediaItems",
    "Unauthorized",
    "VisionSupport",
    "WorkerCapability",
    "WorkerFailedToStart",
    "WorkerSnapshot",
    "WorkerStreamError",
    "advertise_media_processor",
    "apply_kv_handoff",
    "build_decode_leg",
    "check_client_fields",
    "check_kv_handoff",
    "check_media_url",
    "choose",
    "clone_without_mm",
    "connector_mode",
    "decide_decode_form",
    "decode_cache_salt",
    "decode_leg",
    "derive_accepts_mm_metadata",
    "derive_supports_vision",
    "drain",
    "eject",
    "encode_leg",
    "encoder_consumer_leg",
    "encoder_outputs",
    "ensure_encoder_outputs",
    "ensure_kv_handoff",
    "ensure_language_model_only_leg",
    "ensure_model_accepts_media",
    "fold_cache_salt",
    "fold_salt",
    "forwarded_uuid",
    "grids_kept_on_cpu",
    "grpc_status_to_http",
    "has_mrope_grids",
    "identity_basis",
    "identity_only",
    "item_identity",
    "leg_failed",
    "leg_succeeded",
    "media_affinity",
    "media_source",
    "metadata_only",
    "mint_transfer_id",
    "missing_kv_fields",
    "mrope_metadata_gap",
    "needs_encode_leg",
    "place",
    "plan_kv_handoff",
    "prefill_batch",
    "prefill_leg",
    "probe_failed",
    "readmit",
    "relay_kv",
    "rendezvous_order",
    "request_from_json",
    "request_to_json",
    "routable",
    "select_decode_workers",
    "select_encoder_workers",
    "select_prefill_workers",
    "sequential_pd_decode_form",
    "unidentified_media",
    "upstream_cache_salt",
    "upstream_decode_cache_salt",
    "worker_from_json",
    "worker_to_json",
]
