"""A leg that carries a long data URL is written around it: the same bytes as ``dumps``,
the URL a view of its own bytes rather than a copy in one buffer of the leg's size.

A pinned remote item (64 MiB, 85 MiB as base64), or a client's large image on a leg
written anew, was copied into the leg's buffer by the encoder on the event loop: a
fifth of a second for 256 MiB, every other client waiting.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pd_policy_vllm.openai.wire import codec
from pd_policy_vllm.openai.wire.codec import dumps
from pd_policy_vllm.openai.wire.data_url import DataUrl
from pd_policy_vllm.openai.wire.splice import WRITTEN_APART, Spliced, written


def url(size: int, fill: str = "A") -> DataUrl:
    made = DataUrl.of("data:image/png;base64," + fill * size)
    assert made is not None
    return made


def bodies() -> list[Any]:
    big, other, small = url(WRITTEN_APART), url(WRITTEN_APART * 2, "B"), url(10)
    return [
        {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": big, "detail": "low"}},
            {"type": "text", "text": 'a "quoted" é'},
            {"type": "input_image", "image_url": other},
            {"type": "image_url", "image_url": {"url": small}},
        ]}, {"role": "assistant", "content": "plain"}], "n": 1},
        {"messages": [{"role": "user", "content": [{"video_url": {"url": big}, "uuid": "u"}]},
                      {"role": "user", "content": [{"audio_url": {"url": big}}]}],
         "kv_transfer_params": {"x": [1, 2.5]}},
        {"prompt": "no messages"},
        {"messages": "not a list"},
        [1, 2],
    ]  # fmt: skip


@pytest.mark.parametrize("msgspec", [True, False])
@pytest.mark.parametrize("body", bodies())
def test_written_is_dumps(body: Any, msgspec: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "USE_MSGSPEC", msgspec and codec.USE_MSGSPEC)
    before = json.dumps(body, default=str)
    got = written(body)
    assert bytes(got) == dumps(body)
    assert json.dumps(body, default=str) == before  # the body is not changed


def test_a_long_url_is_a_view_of_its_own_bytes() -> None:
    body = bodies()[0]
    got = written(body)
    assert isinstance(got, Spliced)
    long = [body["messages"][0]["content"][0]["image_url"]["url"],
            body["messages"][0]["content"][2]["image_url"]]  # fmt: skip
    views = [p for p in got.parts if isinstance(p, memoryview) and p.obj is not None]
    assert [v.obj for v in views if len(v) >= WRITTEN_APART] == [u.raw for u in long]
    assert written({"messages": [{"role": "user", "content": "hi"}]}) == dumps(
        {"messages": [{"role": "user", "content": "hi"}]}
    )
