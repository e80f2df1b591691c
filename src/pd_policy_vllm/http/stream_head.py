"""Where a decode's event stream says whether its leg started: the status goes out then.

vLLM answers a streamed request 200 at once, and a request that fails before its first
output (a KV load that failed: the prefill died, its blocks are gone) ends that stream
with an error event. A chat stream opens with a preamble, the role of each choice, sent
when the engine's first output arrives, which a failed load is too: the failure comes
right behind it. A proxy that sent its own 200 with the worker's would tell the client
that the request had started, and hand it vLLM's untyped error after.

So the proxy holds a decode stream's head until its first event that is not preamble
([`decisive`][pd_policy_vllm.http.stream_head.decisive]): an error event there is the
leg's failure before its first output
([`stream_failure`][pd_policy_vllm.http.stream_head.stream_failure]), typed with its
status, that the client gets instead of a 200 (and that may be tried again). Held at
most [`HELD`][pd_policy_vllm.http.stream_head.HELD] bytes: past that the stream goes
out as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from pd_policy import WorkerFailedToStart
from pd_policy_vllm.http.redact import Redactor

__all__ = ["HELD", "decisive", "event_data", "stream_failure"]

#: The bytes of a decode stream's preamble held back at most (a role per choice).
HELD: Final = 64 * 1024
#: The delta of a preamble: the role, and an empty content.
_PREAMBLE_DELTA: Final = frozenset({"role", "content"})


def event_data(buffer: bytes) -> list[bytes]:
    """The data of each whole server-sent event in ``buffer`` (those ended by a blank
    line); vLLM sends one ``data:`` line per event."""
    found = []
    for event in buffer.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]:
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                found.append(line[5:].strip())
    return found


def _preamble_choice(choice: object) -> bool:
    if not isinstance(choice, Mapping) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    if not isinstance(delta, Mapping) or not set(delta) <= _PREAMBLE_DELTA:
        return False
    return delta.get("content") in ("", None) and not choice.get("token_ids")


def decisive(data: bytes) -> bool:
    """Whether an event's ``data`` says the leg started or failed: anything but a chat
    chunk whose every choice only names its role (the preamble)."""
    try:
        chunk: Any = json.loads(data)
    except ValueError:
        return True  # [DONE], or not JSON: the stream goes out as it is
    if not isinstance(chunk, Mapping) or chunk.get("object") != "chat.completion.chunk":
        return True
    choices = chunk.get("choices")
    return not isinstance(choices, list) or not all(_preamble_choice(c) for c in choices)


def stream_failure(data: bytes, redactor: Redactor) -> WorkerFailedToStart | None:
    """The decode leg's failure an event's ``data`` reports (vLLM's ``{"error": {"message",
    "code"}}``): its status (a 502 for one that is not an HTTP error status) and its
    message, every key of ``redactor`` redacted; ``None`` for any other event."""
    try:
        event: Any = json.loads(data)
    except ValueError:
        return None
    error = event.get("error") if isinstance(event, Mapping) else None
    if not isinstance(error, Mapping):
        return None
    code = error.get("code")
    status = code if type(code) is int and 400 <= code <= 599 else 502
    detail = redactor.text(str(error.get("message", "")))
    return WorkerFailedToStart("decode", detail=detail, http_status=status)
