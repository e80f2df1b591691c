"""The conformance cases of a request's life (the ``exchange`` operation): the legs in order,
the handoff checked before the decode, blame, retries within the budget, nothing retried
after the first byte, the client leaving, the deadline, and events out of turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["exchange_cases"]

_TWO: Final = {"prefill": ["p0", "p1"], "decode": ["d0", "d1"]}
_HANDED: Final = {"params": {"do_remote_prefill": True, "transfer_id": "t"}}


def _planned(*legs: str, form: str = "text_plus_hashes", multimodal: bool = True) -> dict[str, Any]:
    return {
        "event": "planned",
        "legs": list(legs),
        "form": form,
        "multimodal": multimodal,
        "mode": "transfer",
    }


#: A NIXL prefill with a lease of 30 s on its KV, and its answers: in time, and 26 s after
#: its leg went out (4 s left, under the 5 s a decode needs).
_LEASED: Final = {**_planned("prefill"), "mode": "nixl", "lease": 30}
_NIXL: Final = {
    "do_remote_prefill": True,
    "remote_engine_id": "e",
    "remote_block_ids": [[1]],
    "remote_host": "h",
    "remote_port": 9,
}
_IN_TIME: Final = {"event": "leg_answered", "leg": "prefill", "kv": {"params": _NIXL, "age": 1}}
_LATE: Final = {"event": "leg_answered", "leg": "prefill", "kv": {"params": _NIXL, "age": 26}}


def _failed(
    leg: str, status: int, *, worker: str | None = None, stream: bool = False
) -> dict[str, Any]:
    error = {"worker": worker or leg, "status": status, "stream": stream}
    return {"event": "leg_failed", "leg": leg, "error": error}


_BEGIN: Final = {"event": "begin"}
_FIRST: Final = {"event": "first_byte"}
_PREFILLED: Final = {"event": "leg_answered", "leg": "prefill", "kv": _HANDED}
_DECODED: Final = {"event": "leg_answered", "leg": "decode"}


def exchange_cases(add: Callable[..., None]) -> None:
    """Append the cases, through ``add(case_id, description, operation, **fields)``."""
    pd = [_BEGIN, _planned("prefill")]
    again = [_planned("prefill"), _PREFILLED, _DECODED]
    cases: dict[str, tuple[str, dict[str, Any], list[dict[str, Any]]]] = {
        "pd/ok": (
            "prefill, the handoff checked, decode, credit",
            _TWO,
            [*pd, _PREFILLED, _FIRST, _DECODED],
        ),
        "pd/no_handoff": (
            "a stripped image leg handed nothing: the 502, no decode",
            _TWO,
            [*pd, {"event": "leg_answered", "leg": "prefill", "kv": {"params": {}}}],
        ),
        "pd/text_recomputes": (
            "text keeps the local recompute, whatever it was handed",
            _TWO,
            [
                _BEGIN,
                _planned("prefill", multimodal=False),
                {"event": "leg_answered", "leg": "prefill"},
                _DECODED,
            ],
        ),
        "pd/decode_alone": (
            "n>1: no prefill, the decode at once",
            _TWO,
            [_BEGIN, _planned(form="full"), _DECODED],
        ),
        "retry/decode_503": (
            "a decode 503 before any byte: penalized, left out, tried again",
            _TWO,
            [*pd, _PREFILLED, _failed("decode", 503), *again],
        ),
        "retry/prefill_400": (
            "a worker's 400 is not retried, nor held against it",
            _TWO,
            [*pd, _failed("prefill", 400)],
        ),
        "retry/429": (
            "a 429 is retried elsewhere but not held against the worker",
            _TWO,
            [*pd, _failed("prefill", 429), *again],
        ),
        "retry/nobody_left": (
            "no member left to retry on: the failure that made it try",
            {"prefill": ["p0"], "decode": ["d0"]},
            [*pd, _PREFILLED, _failed("decode", 502)],
        ),
        "lease/expired_retried": (
            "a prefill's answer past its lease: not relayed, its prefill left out, tried again",
            _TWO,
            [_BEGIN, _LEASED, _LATE, _LEASED, _IN_TIME, _DECODED],
        ),
        "lease/expired_nobody_left": (
            "a prefill's answer past its lease, no other prefill: the 502",
            {"prefill": ["p0"], "decode": ["d0"]},
            [_BEGIN, _LEASED, _LATE],
        ),
        "retry/fetch_then_refused": (
            "a media host that did not answer is retried; a refusal is not",
            _TWO,
            [
                _BEGIN,
                {"event": "plan_failed", "error": {"code": "pd_media_unreachable"}},
                {"event": "plan_failed", "error": {"code": "pd_invalid_request"}},
            ],
        ),
        "late/stream_error": (
            "after the first byte a failure ends the stream: no retry",
            _TWO,
            [*pd, _PREFILLED, _FIRST, _failed("decode", 502, stream=True)],
        ),
        "epd/order": (
            "render and encode on the encoder, then prefill, then decode",
            {**_TWO, "encode": ["e0"]},
            [
                _BEGIN,
                _planned("render", "encode", "prefill"),
                {"event": "leg_answered", "leg": "render"},
                {"event": "leg_answered", "leg": "encode"},
                _PREFILLED,
                _DECODED,
            ],
        ),
        "metadata/render_on_prefill": (
            "without an encode, the prefill renders",
            _TWO,
            [
                _BEGIN,
                _planned("render", "prefill", form="mrope_metadata"),
                {"event": "leg_answered", "leg": "render"},
                _PREFILLED,
                _DECODED,
            ],
        ),
        "client_left": (
            "the client leaves mid-prefill: released, nobody blamed",
            _TWO,
            [*pd, {"event": "client_left"}],
        ),
        "deadline/before_first_byte": (
            "the deadline passes: a 504",
            _TWO,
            [*pd, {"event": "deadline_passed"}],
        ),
        "deadline/after_first_byte": (
            "the deadline passes mid-stream: its last event",
            _TWO,
            [*pd, _PREFILLED, _FIRST, {"event": "deadline_passed"}],
        ),
        "out_of_turn/first_byte": (
            "a first byte before any decode: a router's bug",
            _TWO,
            [_BEGIN, _FIRST],
        ),
        "out_of_turn/encode_without_encoder": (
            "an encode leg with no encoder placed",
            _TWO,
            [_BEGIN, _planned("encode", "prefill")],
        ),
    }
    for name, (description, members, events) in cases.items():
        add(f"exchange/{name}", description, "exchange", members=members, attempts=2, events=events)
    add(
        "exchange/budget/one_attempt",
        "a budget of one: the first failure is the last",
        "exchange",
        members=_TWO,
        attempts=1,
        events=[*pd, _failed("prefill", 503)],
    )
