"""The Responses API (``POST /v1/responses``) through P/D, with the chat path's policy.

vLLM renders a Responses request into chat messages (``construct_input_messages``: the
``instructions`` as a system message, then each input message with its parts), and
takes the prefill's expanded ids from ``kv_transfer_params.prompt_token_ids`` when the
input holds no media, as the chat route does. So:

- the policy decides on the request's chat equivalent
  ([`chat_equivalent`][pd_policy_vllm.openai.plan.responses.chat_equivalent]), and the prefill
  leg is that chat request (``max_tokens`` 1, the expanded ids returned), rendered to
  the same prompt;
- the decode leg is the client's Responses request
  ([`responses_decode_leg`][pd_policy_vllm.openai.plan.responses.responses_decode_leg]): for a
  language-model-only decode, every media part removed, the expanded ids and the relayed
  KV in ``kv_transfer_params``, the folded ``cache_salt``; for a vision decode, the
  request itself with the KV. Its answer, streamed or not, is the client's.

What this path does not take is refused (400, naming the field) rather than answered
differently: ``previous_response_id`` and ``conversation`` (the history lives on the
worker that served it, which a P/D decode is not), ``tools`` (their chat form is not
the Responses form), and input items other than messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pd_policy import MalformedRequest
from pd_policy_vllm.openai.media.parts import without_media
from pd_policy_vllm.openai.plan.legs import Leg

__all__ = ["RESPONSES", "chat_equivalent", "responses_decode_leg"]

#: The route.
RESPONSES: Final = "/v1/responses"
#: Fields a Responses request may hold that the chat equivalent carries over as they are.
_SAMPLING: Final = (
    "model",
    "temperature",
    "top_p",
    "cache_salt",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "seed",
)
_STATEFUL: Final = ("previous_response_id", "conversation")


def _message(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, Mapping) or item.get("type", "message") != "message":
        raise MalformedRequest("P/D serves Responses input made of messages only", param=where)
    role, content = item.get("role"), item.get("content")
    if not isinstance(role, str) or not isinstance(content, str | list):
        raise MalformedRequest("a message needs a role and a content", param=where)
    return {"role": role, "content": content}


def _chat_part(part: Any, where: str) -> Any:
    # vLLM's chat route validates an input_image as the openai type, which needs a
    # detail; its chat form renders the same: the image, then the text, in order.
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise MalformedRequest(
                "P/D serves an input_image given by image_url (a URL or a "
                "data URL), not by file_id",
                param=where,
            )
        image = {"url": url, **({"detail": part["detail"]} if part.get("detail") else {})}
        return {"type": "image_url", "image_url": image}
    return part


def _chat_message(item: Any, where: str) -> dict[str, Any]:
    message = _message(item, where)
    content = message["content"]
    if isinstance(content, list):
        message["content"] = [_chat_part(p, f"{where}.content[{i}]") for i, p in enumerate(content)]
    return message


def chat_equivalent(body: Any) -> dict[str, Any]:
    """The chat request vLLM renders ``body`` (a Responses request) as: its instructions
    and input as messages (``input_text`` parts as ``text``, ``input_image`` parts as
    ``image_url``), its sampling fields, no stream.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400, naming the field)
    for a body that is not an object, and for what P/D does not serve here: a
    ``previous_response_id`` or ``conversation``, ``tools``, and input items other than
    messages.
    """
    if not isinstance(body, Mapping):
        raise MalformedRequest("the body must be a JSON object", param="body")
    for field in _STATEFUL:
        if body.get(field) is not None:
            raise MalformedRequest(
                f"{field} is not served in P/D: the history lives on the worker that "
                "answered it; send the whole conversation as input",
                param=field,
            )
    if body.get("tools"):
        raise MalformedRequest(
            "tools are not served over the Responses API in P/D; use /v1/chat/completions",
            param="tools",
        )
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise MalformedRequest("instructions must be a string", param="instructions")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        messages += [_chat_message(item, f"input[{i}]") for i, item in enumerate(given)]
    else:
        raise MalformedRequest("input must be a string or a list of messages", param="input")
    chat = {k: body[k] for k in _SAMPLING if k in body}
    if "n" in body:
        chat["n"] = body["n"]
    return {**chat, "messages": messages, "stream": False}


def responses_decode_leg(body: Mapping[str, Any], chat_leg: Leg, stripped: bool) -> Leg:
    """The decode leg for the Responses request ``body``, from the chat path's decode leg
    ``chat_leg`` (for its chat equivalent): the KV parameters, the forwarded ids and the
    salt it carries, on the client's own request, without its media when the chat leg
    was ``stripped`` of them (a language-model-only decode's forms). Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a chat leg that is not a
    chat completions leg (the metadata path)."""
    if chat_leg.route != "/v1/chat/completions" or chat_leg.derender is not None:
        raise MalformedRequest(
            "the Responses API is not served on the M-RoPE metadata path; use /v1/chat/completions",
            param="input",
        )
    leg = chat_leg.body
    out = dict(body)
    for key in ("kv_transfer_params", "cache_salt"):
        if key in leg:
            out[key] = leg[key]
    if stripped:
        for key in ("mm_processor_kwargs", "media_io_kwargs"):
            out.pop(key, None)
        given = body.get("input")
        if isinstance(given, list):
            kept = without_media({"messages": [_message(m, "input") for m in given]})
            out["input"] = [
                {**item, "content": message["content"]}
                for item, message in zip(given, kept, strict=True)
            ]
    return Leg(RESPONSES, out)
