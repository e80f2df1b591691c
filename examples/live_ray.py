"""Ray Serve LLM's P/D on this CPU, with language-model-only decode replicas.

``make demo-ray`` runs it. It builds the tests' tiny LLaVA (no model hub), deploys on
127.0.0.1, in one Ray cluster of its own, two applications of it on the project's
``TransferConnector``: ``build_pd_policy_app`` (a full-vision prefill, two
``language_model_only`` decode replicas) and Ray's own ``build_pd_openai_app`` with the
same configs. It sends images A, B, A to both and prints their answers beside a
full-vision engine's, with what each decode took from the prefill's KV and from its own
cache. A third application serves the tiny Qwen2-VL (an M-RoPE model) on one
``language_model_only`` decode replica by the metadata path; its A, B, A answers are
printed beside a full-vision Qwen2-VL engine's. Then it stops the cluster by process id.

Run: ``python examples/live_ray.py`` (in the venv that ``make test`` builds). About six
minutes, most of it Ray deploying seven engines; about 13 GB.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # the model builder and server helpers


def main() -> int:
    from http_peers import data_url, http_json
    from live_engines import BLOCK_SIZE, start_engine
    from qwen_prompts import _WORDS, A, B
    from ray_fleet import ray_fleet
    from router_side import image
    from tiny_models import build_llava, build_qwen2vl
    from vllm import SamplingParams

    images = {"A": image(11), "B": image(12)}

    def messages(picture: str) -> list[Any]:
        text = {"type": "text", "text": "What is in the picture?"}
        media = {"type": "image_url", "image_url": {"url": data_url(images[picture])}}
        return [{"role": "user", "content": [text, media]}]

    with tempfile.TemporaryDirectory(prefix="pd-policy-ray-") as tmp:
        root = Path(tmp)
        model = build_llava(root / "llava")
        llm = start_engine(model, block_size=BLOCK_SIZE)
        params = SamplingParams(max_tokens=6, temperature=0)
        baseline = {p: llm.chat(messages(p), params, use_tqdm=False)[0].outputs[0].text
                    for p in images}  # fmt: skip
        llm.llm_engine.engine_core.shutdown()
        qwen = build_qwen2vl(root / "qwen2vl")
        words = " ".join(["ray", *(_WORDS[(i * 7) % len(_WORDS)] for i in range(66))])

        def qwen_messages(picture: str) -> list[Any]:
            media = {"type": "image_url", "image_url": {"url": data_url({"A": A, "B": B}[picture])}}
            return [{"role": "user", "content": [media, {"type": "text", "text": words}]}]

        llm = start_engine(qwen, block_size=BLOCK_SIZE)
        qwen_baseline = {p: list(llm.chat(qwen_messages(p), params, use_tqdm=False)[0]
                                 .outputs[0].token_ids) for p in ("A", "B")}  # fmt: skip
        llm.llm_engine.engine_core.shutdown()
        (root / "fleet").mkdir()
        print("deploying Ray Serve LLM (three applications, seven engines)...", flush=True)
        with ray_fleet(root / "fleet", model.path, qwen.path) as fleet:
            rows = []
            for picture in ("A", "B", "A"):
                body = {"model": "llava", "messages": messages(picture), "max_tokens": 6,
                        "temperature": 0}  # fmt: skip
                status, reply = http_json(f"{fleet.url}/v1/chat/completions", body, timeout=300)
                own, own_reply = http_json(f"{fleet.url}/own/v1/chat/completions", body,
                                           timeout=300)  # fmt: skip
                ours = reply["choices"][0]["message"]["content"] if status == 200 else reply
                kv = (reply.get("kv_transfer_params") or {}) if status == 200 else {}
                message = own_reply["error"]["message"] if own != 200 else ""
                message = message.split("(Request ID")[0].removeprefix("Message: ")
                rows.append((picture, baseline[picture], status, ours, kv.get("loaded_tokens"),
                             kv.get("local_cached_tokens"), own, message))  # fmt: skip
            served = fleet.decode_calls()
            mrope_rows = []
            for picture in ("A", "B", "A"):
                body = {"model": "qwen2vl", "messages": qwen_messages(picture), "max_tokens": 6,
                        "temperature": 0, "return_token_ids": True}  # fmt: skip
                status, reply = http_json(f"{fleet.url}/mrope/v1/chat/completions", body,
                                          timeout=300)  # fmt: skip
                got = reply["choices"][0]["token_ids"] if status == 200 else reply
                mrope_rows.append((picture, qwen_baseline[picture], status, got))
    print()
    print("| image | full-vision engine | policy app (LM-only decode) | equal | KV loaded | "
          "own cache | Ray's own app |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---|")
    for picture, want, status, got, loaded, cached, own, message in rows:
        print(f"| {picture} | {want!r} | {status} {got!r} | {got == want} | {loaded} | {cached} "
              f"| {own} {message.strip()} |")  # fmt: skip
    print()
    print("requests by decode replica:", dict(served))
    print()
    print("Qwen2-VL (M-RoPE), the metadata path: grids and no pixels to the LM-only decode")
    print("| image | full-vision engine (token ids) | policy app (LM-only decode) | equal |")
    print("|---|---|---|---|")
    for picture, want, status, got in mrope_rows:
        print(f"| {picture} | {want} | {status} {got} | {got == want} |")
    print()
    ok = all(got == want for _, want, _, got, *_ in rows) and all(r[6] == 400 for r in rows)
    ok = ok and all(got == want for _, want, _, got in mrope_rows)
    print("every answer equals the engine's, and Ray's own path fails:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
