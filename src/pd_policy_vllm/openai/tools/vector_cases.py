"""The HTTP conformance vectors' cases: chat and completions bodies on every kind of decode
worker, the carve-outs and the refusals, the handoff under each contract
([`vector_handoffs`][pd_policy_vllm.openai.tools.vector_handoffs]), and the M-RoPE
metadata path with the render's answer it is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.tools.vector_handoffs import NIXL_RETURNED as _RETURNED
from pd_policy_vllm.openai.tools.vector_handoffs import handoff_cases

__all__ = ["http_cases", "render_answer"]

_WORKERS: Final = {
    "vision": {"supports_vision": True},
    "unknown": {"supports_vision": None},
    "lm_only": {"supports_vision": False},
    "lm_only_metadata": {"supports_vision": False, "accepts_mm_metadata": True},
}
_IMAGE: Final = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
_OTHER_IMAGE: Final = {"type": "image_url", "image_url": {"url": "https://media.example/b.png"}}


def render_answer(images: int, ids: list[int]) -> dict[str, Any]:
    """A render answer as vLLM's render route gives one: per image a hash, a placeholder,
    the whole processed item (pixels and grid) and its metadata-only item (the grid)."""
    return {
        "request_id": "chatcmpl-vector",
        "token_ids": ids,
        "model": "m",
        "stream": False,
        "sampling_params": {"max_tokens": 16, "temperature": 0.0},
        "cache_salt": None,
        "features": {
            "mm_hashes": {"image": [f"{i:064x}" for i in range(1, images + 1)]},
            "mm_placeholders": {
                "image": [{"offset": 3 + 8 * i, "length": 8} for i in range(images)]
            },
            "kwargs_data": {"image": [f"PIXELS-AND-GRID-{i}" for i in range(images)]},
            "mm_metadata": {"image": [f"GRID-{i}" for i in range(images)]},
        },
    }


def _chat(*parts: Any, **extra: Any) -> dict[str, Any]:
    content = [*parts, {"type": "text", "text": "What is in the picture?"}]
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def http_cases() -> list[dict[str, Any]]:
    """Every case, in the order of the document, without its expected outcome."""
    cases: list[dict[str, Any]] = []
    nixl = {"mode": "nixl"}

    def add(
        case_id: str,
        description: str,
        body: Any,
        *,
        route: str = Route.CHAT.value,
        workers: Sequence[str] = ("lm_only",),
        prefill_kv: Mapping[str, Any] = nixl,
        mrope: bool = False,
        response: Any = None,
        render: Any = None,
    ) -> None:
        case: dict[str, Any] = {
            "id": case_id,
            "description": description,
            "route": route,
            "body": body,
            "workers": [_WORKERS[w] for w in workers],
            "prefill_kv": dict(prefill_kv),
            "mrope": mrope,
        }
        if response is not None:
            case["prefill_response"] = response
        if render is not None:
            case.update(renders=True, render_response=render)
        cases.append(case)

    ids = list(range(100, 140))
    chat_reply = {"prompt_token_ids": ids, "kv_transfer_params": _RETURNED, "usage": {}}
    bodies = {
        "image": _chat(_IMAGE, max_tokens=16, temperature=0),
        "two_images": _chat(_IMAGE, _OTHER_IMAGE, max_tokens=16),
        "image_salted": _chat(_IMAGE, max_tokens=16, cache_salt="tenant-a"),
        "image_n2": _chat(_IMAGE, n=2, max_tokens=16),
        "image_streamed": _chat(
            _IMAGE,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=9,
            min_tokens=2,
        ),
        "text": {"model": "m", "messages": [{"role": "user", "content": "hello"}]},
        "text_n2": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2},
        "image_with_tools": _chat(_IMAGE, tools=[{"type": "function", "function": {"name": "f"}}]),
        # Media identity: each makes another item of the one image, or names it.
        "image_processing_option": _chat(_IMAGE, mm_processor_kwargs={"do_normalize": False}),
        "image_with_uuid": _chat({**_IMAGE, "uuid": "client-named"}),
        "uuid_alone": _chat({"type": "image_url", "image_url": None, "uuid": "client-named"}),
    }
    for name, body in bodies.items():
        for kind in _WORKERS:
            add(
                f"chat/{name}/{kind}",
                f"a chat body ({name}) to a {kind} decode worker",
                body,
                workers=[kind],
                response=chat_reply,
            )
        add(
            f"chat/{name}/lm_only/mrope",
            f"{name}, an M-RoPE model, an LM-only worker",
            body,
            mrope=True,
            response=chat_reply,
        )
    add(
        "chat/image/pool",
        "an M-RoPE image to a pool: the vision worker is chosen",
        bodies["image"],
        workers=["lm_only", "vision"],
        mrope=True,
        response=chat_reply,
    )
    # The metadata path: the prefill worker renders; the decode leg goes to generate.
    for name, count in (
        ("image", 1),
        ("two_images", 2),
        ("image_salted", 1),
        ("image_streamed", 1),
    ):
        rendered = render_answer(count, ids)
        add(
            f"chat/{name}/lm_only_metadata/mrope/rendered",
            f"{name}, an M-RoPE model, a worker that takes metadata, a prefill that renders",
            bodies[name],
            workers=["lm_only", "lm_only_metadata"],
            mrope=True,
            response={"prompt_token_ids": ids, "kv_transfer_params": _RETURNED},
            render=rendered,
        )
    one, broken = render_answer(1, ids), render_answer(2, ids)
    broken["features"]["mm_metadata"]["image"][1] = None
    for case_id, description, body, response, render in (
        ("unrendered", "a prefill without the render route: refused", bodies["image"], None, None),
        ("n2", "n>1: no handoff, so no metadata path", bodies["image_n2"], None, one),
        ("no_grid", "a render without an image's grid: 502", bodies["two_images"], None, broken),
        (
            "nothing_returned",
            "no KV parameters returned: 502",
            bodies["image"],
            {"prompt_token_ids": ids, "kv_transfer_params": None},
            one,
        ),
        (
            "other_ids",
            "prefill ids that are not the rendered ones: 502",
            bodies["image"],
            {"prompt_token_ids": ids[1:], "kv_transfer_params": _RETURNED},
            one,
        ),
    ):
        add(
            f"chat/image/lm_only_metadata/mrope/{case_id}",
            description,
            body,
            workers=["lm_only_metadata"],
            mrope=True,
            response=response,
            render=render,
        )
    add(
        "chat/image/nothing_returned",
        "the prefill returned no KV parameters: 502",
        bodies["image"],
        response={"prompt_token_ids": ids, "kv_transfer_params": None},
    )
    add(
        "chat/text/nothing_returned",
        "text recomputes without KV parameters",
        bodies["text"],
        response={"prompt_token_ids": ids},
    )
    add(
        "chat/image/no_ids",
        "a prefill that ignores return_token_ids",
        bodies["image"],
        response={"kv_transfer_params": _RETURNED},
    )
    for mode in (
        {"mode": "passthrough"},
        {"mode": "mooncake", "engine_id": "p0", "bootstrap_host": "10.0.0.1"},
        {"mode": "mooncake", "bootstrap_host": "10.0.0.1"},
    ):
        label = "_".join(str(v) for v in mode.values())
        add(
            f"chat/image/{label}",
            f"the handoff under {label}",
            bodies["image"],
            prefill_kv=mode,
            response={"prompt_token_ids": ids},
        )
    handoff_cases(add, image=bodies["image"], text=bodies["text"], ids=ids)
    completions = {"model": "m", "prompt": "Once upon a time", "max_tokens": 5}
    for kind in ("lm_only", "vision"):
        add(
            f"completions/text/{kind}",
            "completions take token ids",
            completions,
            route=Route.COMPLETIONS.value,
            workers=[kind],
            response={"choices": [{"prompt_token_ids": ids}], "kv_transfer_params": _RETURNED},
        )
    malformed: dict[str, Any] = {
        "salt_slash": _chat(_IMAGE, cache_salt="tenant/a"),
        "salt_long": _chat(_IMAGE, cache_salt="x" * 129),
        "salt_empty": _chat(_IMAGE, cache_salt=""),
        "echo_with_media": _chat(_IMAGE, echo=True),
        "prompt_embeds": _chat({"type": "prompt_embeds", "data": "AAAA"}),
        "unknown_part": _chat({"type": "hologram"}),
        "local_file": _chat({"type": "image_url", "image_url": {"url": "file:///srv/a.png"}}),
        "ftp_url": _chat({"type": "image_url", "image_url": {"url": "ftp://media.example/a"}}),
        "neither_data_nor_uuid": _chat({"type": "image_url", "image_url": None}),
        "no_messages": {"model": "m"},
        "n_zero": _chat(_IMAGE, n=0),
        "not_an_object": [1, 2],
    }
    for name, body in malformed.items():
        add(f"malformed/{name}", "a body the proxy refuses, naming the field", body)
    add(
        "malformed/completions_batch",
        "one prompt per request",
        {"prompt": ["a", "b"]},
        route=Route.COMPLETIONS.value,
    )
    return cases
