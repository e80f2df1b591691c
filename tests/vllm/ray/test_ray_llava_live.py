"""Ray Serve LLM's P/D on this CPU with the policy's decode server, against a full-vision
engine, and Ray's own path beside it.

The deployment (``ray_pd``, ``ray_stand.py``: one driver process with its own Ray
cluster on 127.0.0.1, stopped by its process group) runs two applications on the tiny
LLaVA and the ``TransferConnector``:

- ``/``: [`build_pd_policy_app`][pd_policy_ray.builder.build_pd_policy_app], a full-vision
  prefill and two ``language_model_only`` decode replicas;
- ``/own``: Ray's ``build_pd_openai_app`` with the same configs and one decode replica.

The baseline is a full-vision engine of the same model in this process.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from live_engines import BLOCK_SIZE
from ray_chat import answer, body, close, engine_answers
from ray_chat import ask as ask_url
from ray_fleet import RayFleet
from tiny_models import TinyModel


@pytest.fixture(scope="module")
def baseline(llava: TinyModel) -> Any:
    """What one full-vision engine answers, by image: token texts and their logprobs."""
    return engine_answers(llava)


def ask(fleet: RayFleet, payload: dict[str, Any], prefix: str = "") -> tuple[int, Any]:
    return ask_url(fleet.url, payload, prefix)


def test_images_equal_a_full_vision_engine_on_language_model_only_replicas(
    ray_pd: RayFleet, baseline: Any
) -> None:
    seen: Counter[str] = Counter()
    for picture in ("A", "B", "A", "B", "A", "B", "A", "B"):
        status, reply = ask(ray_pd, body(picture))
        assert status == 200, reply
        text, logprobs = answer(reply)
        want_text, want_logprobs, prompt = baseline[picture]
        assert text == want_text, picture
        assert close(logprobs, want_logprobs), picture
        kv = reply["kv_transfer_params"]
        assert reply["usage"]["prompt_tokens"] == prompt
        # Every prompt token but the last came from the prefill's KV or the replica's own
        # cache: the decode computed none of the image's tokens itself.
        assert kv["loaded_tokens"] + kv["local_cached_tokens"] == prompt - 1
        if not seen[picture]:
            # Its first time anywhere: no replica holds a block of it. B after A shares
            # their text prefix, yet hits nothing: the salts differ.
            assert kv["local_cached_tokens"] == 0, picture
        seen[picture] += 1
    assert baseline["A"][0] != baseline["B"][0]  # the images tell the answers apart


def test_replicas_share_the_load_and_each_keeps_images_apart(
    ray_pd: RayFleet, baseline: Any
) -> None:
    before = ray_pd.decode_calls()
    hits: dict[str, list[int]] = {"A": [], "B": []}
    for picture in ("A", "B") * 6:
        status, reply = ask(ray_pd, body(picture))
        assert status == 200, reply
        # On whichever replica served it, and whatever that replica held: its own answer.
        assert answer(reply)[0] == baseline[picture][0], picture
        hits[picture].append(reply["kv_transfer_params"]["local_cached_tokens"])
    after = ray_pd.decode_calls()
    served = {replica: after[replica] - before.get(replica, 0) for replica in after}
    assert len(served) == 2 and all(n > 0 for n in served.values()), served
    # Sent again, an image is served from the cache of a replica that saw it; never from
    # more of a block than the image shares with the other one's prompt (none: the salts).
    assert max(hits["A"]) > 0 and max(hits["B"]) > 0
    assert all(hit % BLOCK_SIZE == 0 for hit in hits["A"] + hits["B"])


def test_text_through_pd_equals_the_engine(ray_pd: RayFleet, baseline: Any) -> None:
    status, reply = ask(ray_pd, body(None))
    assert status == 200, reply
    text, logprobs = answer(reply)
    assert text == baseline[None][0]
    assert close(logprobs, baseline[None][1])


def test_rays_own_path_fails_on_a_language_model_only_decode(ray_pd: RayFleet) -> None:
    # The reason the adapter exists: Ray's decode leg is the client's request, images
    # included, and the decode engine has no vision encoder.
    status, reply = ask(ray_pd, body("A"), prefix="/own")
    assert status == 400
    assert "At most 0 image(s)" in reply["error"]["message"]
    status, reply = ask(ray_pd, body(None), prefix="/own")
    assert status == 200, reply  # the deployment itself works


def test_n_above_one_with_an_image_is_a_typed_400(ray_pd: RayFleet) -> None:
    status, reply = ask(ray_pd, body("A", n=2))
    assert status == 400, reply
    assert "pd_decode_language_model_only_n_samples: " in reply["error"]["message"]


def test_a_wrong_typed_salt_is_a_400_that_does_not_quote_it(ray_pd: RayFleet) -> None:
    # Ray's ingress validates the request as vLLM's model first: vLLM's own 400.
    status, reply = ask(ray_pd, body("A", cache_salt=["s3cr3t-salt"]))
    assert status == 400, reply
    assert "s3cr3t" not in reply["error"]["message"]


def test_the_replicas_read_themselves_as_language_model_only(ray_pd: RayFleet) -> None:
    lines = ray_pd.capability_lines()
    assert len(lines) == 2, lines
    assert all("supports_vision=FALSE" in line and "kv=TRANSFER" in line for line in lines.values())


def test_a_media_reference_the_worker_would_not_read_is_a_typed_400(ray_pd: RayFleet) -> None:
    payload = body(None)
    payload["messages"][0]["content"].append(
        {"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}
    )
    status, reply = ask(ray_pd, payload)
    assert status == 400, reply
    assert "pd_media_refused" in reply["error"]["message"]
    assert "/etc/hostname" not in reply["error"]["message"]
