"""The error taxonomy: every way the policy refuses a request.

Each error carries a stable ``code``, an HTTP ``status`` (also readable as
``error_status_hint``, as in h11), whether a gateway may retry it, and a message
that is safe to return to a client. Messages never echo media URLs, salts or
KV parameters: those can carry credentials or tenant names.

The worker errors (a leg that failed on its worker) are in ``worker_errors``;
the catalog of every code, which the docs table (``docs/errors.md``) is
generated from, in ``catalog``.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import ClassVar, Final

__all__ = [
    "ERROR_CODE_HEADER",
    "RETRYABLE_STATUSES",
    "Forbidden",
    "InvalidConfiguration",
    "MalformedRequest",
    "MediaRefsOnLanguageModelOnlyDecode",
    "MissingEncoderOutput",
    "MissingKvTransferParams",
    "MropeOnLanguageModelOnlyDecode",
    "MultimodalNotSupported",
    "NSamplesOnLanguageModelOnlyDecode",
    "NoDecodeWorkerAvailable",
    "NoWorkerAvailable",
    "PolicyError",
    "Unauthorized",
]

#: Response header that carries the error code, as the SMG gateway sends it.
ERROR_CODE_HEADER: Final = "X-SMG-Error-Code"

#: Statuses a gateway retries by default, unless the error is marked non-retryable.
RETRYABLE_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})


class PolicyError(Exception):
    """Base of every error the policy raises.

    Subclasses fix ``code``, ``status`` and ``meaning``; an instance adds the
    client-facing ``message`` and, for malformed input, the ``param`` (the field
    at fault). ``retryable`` is false for every error of the policy's own: the
    same request to the same pool fails the same way.
    """

    # Plain class attributes, not ClassVar: WorkerFailedToStart sets them per instance.
    code: str = "pd_policy_error"
    status: int = 500
    meaning: ClassVar[str] = "An error raised by the P/D policy."
    default_message: ClassVar[str] = "the P/D policy refused the request"

    def __init__(self, message: str | None = None, param: str | None = None) -> None:
        self.message: str = message if message is not None else self.default_message
        self.param: str | None = param
        super().__init__(self.message)

    @property
    def error_status_hint(self) -> int:
        """The HTTP status a gateway should answer with (the h11 name for ``status``)."""
        return self.status

    #: Whether a gateway may retry this kind of error (the catalog's answer).
    may_retry: ClassVar[bool] = False

    @property
    def retryable(self) -> bool:
        """Whether a gateway may retry: never, for the policy's own refusals."""
        return self.may_retry

    @property
    def error_type(self) -> str:
        """The OpenAI-style ``type``: the status' reason phrase in snake case."""
        return HTTPStatus(self.status).phrase.lower().replace(" ", "_").replace("-", "_")

    def to_body(self) -> dict[str, dict[str, str | None]]:
        """Render as the OpenAI-style error body ``{"error": {type, code, message, param}}``."""
        return {
            "error": {
                "type": self.error_type,
                "code": self.code,
                "message": self.message,
                "param": self.param,
            }
        }

    def headers(self) -> dict[str, str]:
        """Response headers a gateway should add: the error code header."""
        return {ERROR_CODE_HEADER: self.code}

    def __repr__(self) -> str:
        param = f", param={self.param!r}" if self.param is not None else ""
        return f"{type(self).__name__}({self.message!r}{param})"


class MalformedRequest(PolicyError):
    """The request (or worker description) is not well formed.

    ``param`` names the offending field, e.g. ``batches[0].placeholders[1]``.
    """

    code = "pd_invalid_request"
    status = 400
    meaning = (
        "The request is malformed: a wrong type, an unknown field, or fields that contradict "
        "each other (for instance a placeholder that runs past input_ids)."
    )
    default_message = "the request is malformed"


class MropeOnLanguageModelOnlyDecode(PolicyError):
    """A language-model-only decode worker cannot derive M-RoPE positions."""

    code = "pd_decode_language_model_only_mrope"
    status = 400
    meaning = (
        "The decode worker runs --language-model-only and the request carries M-RoPE grid "
        "tensors: the decode leg would mis-rotate every generated token."
    )
    default_message = (
        "the selected decode worker runs with --language-model-only, but this model's decode "
        "leg needs its M-RoPE grid tensors; run the decode pool with the vision encoder enabled"
    )


class MediaRefsOnLanguageModelOnlyDecode(PolicyError):
    """A language-model-only decode worker cannot expand media references."""

    code = "pd_decode_language_model_only_media_refs"
    status = 400
    meaning = (
        "The decode worker runs --language-model-only and the request carries media "
        "references, which each leg must expand itself."
    )
    default_message = (
        "the selected decode worker runs with --language-model-only and cannot expand media "
        "references; use router-side multimodal processing (--mm-processing=router)"
    )


class NSamplesOnLanguageModelOnlyDecode(PolicyError):
    """n>1 has no KV handoff, and a worker without an encoder cannot recompute images."""

    code = "pd_decode_language_model_only_n_samples"
    status = 400
    meaning = (
        "The decode worker runs --language-model-only and a multimodal request asks for n>1: "
        "n>1 skips the KV handoff, so decode would have to recompute the image locally."
    )
    default_message = (
        "the selected decode worker runs with --language-model-only and cannot recompute a "
        "multimodal prompt; n>1 parallel sampling needs decode workers with the vision "
        "encoder enabled"
    )


class MissingKvTransferParams(PolicyError):
    """After prefill, a stripped multimodal decode leg has no KV handoff."""

    code = "pd_decode_missing_kv_transfer_params"
    status = 502
    meaning = (
        "The prefill worker returned no kv_transfer_params for a multimodal request whose "
        "decode leg was stripped: decode would silently recompute an image-blind answer."
    )
    default_message = (
        "the prefill worker returned no kv_transfer_params for this multimodal request, and "
        "the language-model-only decode worker cannot recompute the prompt locally "
        "(outdated servicer or missing kv-transfer-config?)"
    )


class MissingEncoderOutput(PolicyError):
    """The encode leg answered without an encoder output for an item the prefill needs.

    ``param`` names the item (``batches[i].mm_hashes[j]``), never its hash.
    """

    code = "pd_prefill_missing_encoder_output"
    status = 502
    meaning = (
        "The encoder worker returned no ec_transfer_params entry for an item of the request, "
        "or one under another hash: the prefill worker would miss its encoder cache, which "
        "hangs or kills a vLLM engine, so no prefill is sent."
    )
    default_message = (
        "the encoder worker returned no output for an item of this request; no prefill was "
        "sent (a prefill that misses its encoder cache kills the engine)"
    )


class MultimodalNotSupported(PolicyError):
    """No worker that could serve this request's media exists or was selected."""

    code = "multimodal_not_supported"
    status = 400
    meaning = (
        "The request carries media that no selected (or registered) worker can process: every "
        "worker of the model runs as a language model only, or the selected worker does not "
        "advertise worker-side media processing."
    )
    default_message = (
        "multimodal input is not supported: the model's workers run as a language model only, "
        "without a vision encoder"
    )


class NoDecodeWorkerAvailable(PolicyError):
    """There is no decode worker to choose from."""

    code = "no_decode_worker_available"
    status = 503
    meaning = (
        "No decode worker is registered for the request's model; a worker may join, so a "
        "gateway may retry."
    )
    default_message = "no decode worker is available for this request"
    # Unlike the policy's refusals, this one depends on the pool, which changes.
    may_retry = True


class NoWorkerAvailable(PolicyError):
    """Every worker of a leg's kind that could serve the request is out of service
    (ejected, starting or draining), or none is registered.

    ``leg`` is ``"encode"``, ``"prefill"`` or ``"decode"``; the code names it
    (``no_prefill_worker_available``). A worker may come back, so a gateway may retry.
    """

    LEGS: ClassVar[tuple[str, ...]] = ("encode", "prefill", "decode")
    status = 503
    may_retry = True
    meaning = (
        "No worker of the leg's kind that could serve the request is in service: each is "
        "ejected after failures, starting, or draining, or none is registered. A worker may "
        "come back, so a gateway may retry."
    )

    def __init__(self, leg: str = "decode", message: str | None = None) -> None:
        if leg not in self.LEGS:
            raise ValueError(f"unknown leg {leg!r}")
        self.leg = leg
        self.code = f"no_{leg}_worker_available"
        super().__init__(
            message
            if message is not None
            else f"no {leg} worker that can serve this request is in service; retry later"
        )


class Unauthorized(PolicyError):
    """The client did not present a key the router accepts."""

    code = "pd_unauthorized"
    status = 401
    meaning = (
        "The router requires an API key from its clients, and the request carried none, or "
        "not one it accepts. No worker is called. The key is never echoed."
    )
    default_message = "a valid API key is required: send it as 'Authorization: Bearer <key>'"


class Forbidden(PolicyError):
    """The caller may not do this: a route for the router's admins, called without an
    admin key, or an admin's call the router's bounds do not allow."""

    code = "pd_forbidden"
    status = 403
    meaning = (
        "The route is the router's admins' (/admin/*) and the request carried no admin key "
        "(an API client's key is never one), or an admin asked for what the router's bounds "
        "refuse (a worker on a host --admin-allowed-hosts does not list). No worker is "
        "called. The key is never echoed."
    )
    default_message = "this route needs an admin key: send it as 'Authorization: Bearer <key>'"


class InvalidConfiguration(PolicyError):
    """The router's own configuration cannot serve P/D; raised at start-up, not per request.

    ``param`` names the setting at fault (``kv_connector``, ``bootstrap_host``, ...).
    """

    code = "pd_invalid_configuration"
    status = 500
    meaning = (
        "The router is configured in a way the policy cannot serve: a KV connector whose "
        "handoff contract is unknown, or a Mooncake prefill worker without a bootstrap host. "
        "Raised when the router starts, so that no request fails for it later."
    )
    default_message = "the router's P/D configuration is invalid"
