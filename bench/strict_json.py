"""What the strict JSON checks cost a client's body: the front door's parse with them ÷ the bare
parse (msgspec's decode), on the common bodies, as the proxy admits each (``skim`` for chat,
``loads`` for completions and the Responses API, then the tenant's uuids scoped).

The checks are a bounded depth and no key written twice
([`strict`][pd_policy_vllm.openai.wire.strict]). Informative, not a target: ratios timed back
to back (``paired_ratio``), so a shared machine's drift cancels.

Run: ``python bench/strict_json.py``.
"""

from __future__ import annotations

import base64
import json
import random
import types
from collections.abc import Callable
from typing import Any, Final

from measuring import paired_ratio

from pd_policy import ClientUuids
from pd_policy_vllm.openai.media.tenant import scoped_body
from pd_policy_vllm.openai.wire import codec, skim

ROUNDS: Final = 15


def _image_url(size: int) -> str:
    return "data:image/png;base64," + base64.b64encode(random.Random(1).randbytes(size)).decode()


def _chat(messages: int, image: int = 0) -> bytes:
    rng = random.Random(3)
    words = ["the", "proxy", "note:", "a", "worker", "at 12:30", "json", "https://example.com/x"]
    body: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [
        {"role": ("user", "assistant")[i % 2], "content": " ".join(rng.choices(words, k=40))}
        for i in range(messages)
    ]}  # fmt: skip
    if image:
        body["messages"][0]["content"] = [
            {"type": "text", "text": "What is in this image? Answer: briefly."},
            {"type": "image_url", "image_url": {"url": _image_url(image)}},
        ]
    return json.dumps(body).encode()


def _completion(ids: int) -> bytes:
    rng = random.Random(2)
    prompt = [rng.randrange(151_000) for _ in range(ids)]
    return json.dumps({"model": "m", "max_tokens": 16, "prompt": prompt}).encode()


def _responses(image: int) -> bytes:
    content = [{"type": "input_text", "text": "What is this?"},
               {"type": "input_image", "image_url": _image_url(image)}]  # fmt: skip
    return json.dumps({"model": "m", "input": [{"role": "user", "content": content}]}).encode()


#: Each body, and whether the front door skims it (chat) or parses it whole.
BODIES: Final = {
    "chat, a 500 KB image": (_chat(1, image=375_000), True),
    "completions, 100k ids": (_completion(100_000), False),
    "chat, 20 messages": (_chat(20), True),
    "chat, 200 messages": (_chat(200), True),
    "responses, a 500 KB image": (_responses(375_000), False),
}


def _bare(raw: bytes | bytearray | str, *, what: str = "the body") -> Any:
    # The parse without the checks: what loads was before them.
    return codec._DECODER.decode(raw)


#: skim, calling the bare parse (its own code, over its module's names but ``loads``).
_BARE_SKIM: Final = types.FunctionType(skim.skim.__code__, {**vars(skim), "loads": _bare})
_BARE_SKIM.__kwdefaults__ = skim.skim.__kwdefaults__


def _admit(raw: bytes, skims: bool, parse: Callable[..., Any], skim_: Callable[..., Any]) -> Any:
    body = skim_(raw) if skims else parse(raw)
    return scoped_body(body, raw, None, keyed=False, mode=ClientUuids.SCOPED)


def measure() -> dict[str, float]:
    """Per body: admitted with the checks ÷ without them."""
    out = {}
    for name, (raw, skims) in BODIES.items():

        def checked(raw: bytes = raw, skims: bool = skims) -> Any:
            return _admit(raw, skims, codec.loads, skim.skim)

        def bare(raw: bytes = raw, skims: bool = skims) -> Any:
            return _admit(raw, skims, _bare, _BARE_SKIM)

        out[name] = paired_ratio(checked, bare, rounds=ROUNDS)
    return out


if __name__ == "__main__":
    for body, ratio in measure().items():
        print(f"{body:28} {ratio:5.2f}")
