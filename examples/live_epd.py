"""E/P/D over HTTP on this CPU: encode, prefill, decode on three real ``vllm serve`` workers.

``make demo-epd`` runs it. For the tests' tiny Qwen2-VL and LLaVA in turn (built
locally, no model hub), it starts on 127.0.0.1 an encoder-only worker
(``ec_producer``), a prefill worker that consumes its cache (``ec_consumer``, KV
producer), a ``--language-model-only`` decode worker (KV consumer) and a plain
full-vision prefill, the baseline, with the proxy in front of the first three, told
what each is by the demo (no worker runs vLLM's development mode). The KV
goes over vLLM's ``NixlConnector`` (both prefills NIXL producers the decode reads), NIXL's
progress thread off by the tests' switch (``PD_POLICY_TEST_NIXL_PROGRESS_THREAD=on`` runs
it as shipped); the encoder's cache goes over vLLM's example encoder-cache connector. It sends
images A, B, A through the proxy and to the baseline, and prints one table: the
tokens, whether they and their log-probabilities match, and the bytes of pixels
each leg carried. Then it stops every process it started, by process id.

Run: ``python examples/live_epd.py`` (in the venv that ``make test`` builds). About
three minutes, most of it the servers starting.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # the model builders and server helpers


def _item_bytes(leg: dict[str, Any] | None) -> int:
    """Bytes of serialized multimodal items a generate leg carried: whole items (pixels)
    and metadata-only items (a grid) alike."""
    features = (leg or {}).get("features") or {}
    parts = [features.get("kwargs_data") or {}, features.get("mm_metadata") or {}]
    return sum(len(item or "") for data in parts for items in data.values() for item in items)


def main() -> int:
    from epd_peers import answer, chat_body, epd_fleet
    from http_fleets import http_fleet
    from llava_prompts import TEXT
    from nixl_peers import nixl_note
    from qwen_prompts import _WORDS
    from router_side import image
    from tiny_models import build_llava, build_qwen2vl

    from pd_policy_vllm.openai.plan.scale_out import GENERATE

    print(nixl_note("the workers' KV"), flush=True)
    work = Path(tempfile.mkdtemp(prefix="pd-policy-epd-demo-"))
    qwen_words = " ".join(_WORDS[(i * 7) % len(_WORDS)] for i in range(66))
    llava_words = TEXT
    models = [
        ("Qwen2-VL", build_qwen2vl, True, {"image": 1, "video": 0}, 112, qwen_words),
        ("LLaVA", build_llava, False, {"image": 1}, None, llava_words),
    ]
    rows: list[tuple[str, str, list[int], bool, float, int, int, int]] = []
    for name, build, mrope, limits, side, words in models:
        model = build(work / name)

        def body(seed: int, side: int | None = side, words: str = words) -> dict[str, Any]:
            return chat_body(image(seed, side=side) if side else image(seed), words)

        servers = http_fleet(
            model, work / f"{name}-servers", scale_out=mrope, limits=limits, nixl=True
        )
        with servers as running, epd_fleet(running, mrope=mrope) as fleet:
            for label, seed in (("A", 1), ("B", 2), ("A", 1)):
                want = answer(fleet.baseline, body(seed))
                before = len(fleet.proxy.sent)
                got = answer(fleet.proxy.url, body(seed))
                legs = {s.url: s.body for s in fleet.proxy.sent[before:]}
                worst = max(abs(a - b) for a, b in zip(got[1], want[1], strict=True))
                urls = (fleet.encoder, fleet.prefill, fleet.decode)
                enc, pre, dec = (_item_bytes(legs.get(url + GENERATE)) for url in urls)
                rows.append((name, label, got[0], got[0] == want[0], worst, enc, pre, dec))
    print(f"{'model':9} {'img':3} {'E/P/D tokens':27} {'same':4} {'max |dlogprob|':>14} "
          f"{'items: encode':>14} {'prefill':>8} {'decode':>7}")  # fmt: skip
    for name, label, tokens, same, worst, enc, pre, dec in rows:
        print(f"{name:9} {label:3} {tokens!s:27} {'yes' if same else 'NO':4} {worst:14.1e} "
              f"{enc:14,} {pre:8,} {dec:7,}")  # fmt: skip
    print(
        "\nSame: the tokens equal one full-vision server's. Items: bytes of serialized "
        "multimodal items\neach leg carried, pixels or a grid. Qwen2-VL's pixels stop at the "
        "encoder (prefill and\ndecode get the grid alone); LLaVA's prefill gets the image but "
        "loads its encoding by hash,\nand its decode gets none."
    )
    # A grid is about a hundred bytes; an image, a hundred thousand.
    ok = all(same and worst <= 1e-5 and not math.isnan(worst) and dec < 1000
             and (pre < 1000 or model == "LLaVA")
             for model, _, _, same, worst, _, pre, dec in rows)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
