"""Live P/D on this CPU: vision prefill engines, language-model-only decode engines.

``make demo-live`` runs it. It builds the tests' tiny local models (no model hub),
starts the engines in this process, and serves images A, B, A through the policy
(``pd_policy_vllm.LocalPd``) and the transfer connector, next to a single full engine
that answers the same requests: for the grid-less LLaVA (the decode leg carries ids
and hashes), and for the M-RoPE Qwen2-VL (the decode leg carries each image's grid,
hash and placeholder, and no pixels). Then it shows the hazard that the salt fold
exists for, and the refusals. It prints one table.

Run: ``python examples/live_pd.py`` (in the venv that ``make test`` builds).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engines in this process
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # the tiny-model builders live with the tests


def main() -> int:
    import numpy as np
    from PIL import Image
    from tiny_models import build_llava, build_qwen2vl
    from vllm import LLM, SamplingParams

    from pd_policy import PolicyError
    from pd_policy_vllm.local_pd import LocalPd
    from pd_policy_vllm.transfer_connector import kv_transfer_config

    work = Path(tempfile.mkdtemp(prefix="pd-policy-demo-"))
    llava, qwen = build_llava(work / "llava"), build_qwen2vl(work / "qwen2vl")
    settings: dict[str, Any] = {
        "kv_cache_memory_bytes": 64 * 2**20, "enforce_eager": True, "dtype": "float32",
        "max_model_len": 1024, "max_num_seqs": 2, "seed": 0, "block_size": 32,
    }  # fmt: skip

    def engine(model: Any, role: str, **extra: Any) -> Any:
        options = {k: extra.pop(k) for k in ("return_params",) if k in extra}
        config = kv_transfer_config(role, work / "transfers", **options)
        return LLM(model=str(model.path), kv_transfer_config=config, **settings, **extra)

    baseline = engine(llava, "kv_producer", limit_mm_per_prompt={"image": 1})
    prefill = engine(llava, "kv_producer", limit_mm_per_prompt={"image": 1})
    silent = engine(llava, "kv_producer", limit_mm_per_prompt={"image": 1}, return_params=False)
    decode = engine(llava, "kv_consumer", language_model_only=True)
    # Full-vision Qwen2-VL engines first: in one process, one made after a
    # language-model-only engine of the same model fails on its first image.
    qwen_limits = {"image": 1, "video": 0}
    qwen_baseline = engine(qwen, "kv_producer", limit_mm_per_prompt=qwen_limits)
    qwen_prefill = engine(qwen, "kv_producer", limit_mm_per_prompt=qwen_limits)
    qwen_decode = engine(qwen, "kv_consumer", language_model_only=True)
    qwen_no_kv = engine(qwen, "kv_producer", language_model_only=True)

    def picture(seed: int) -> Any:
        rng = np.random.default_rng(seed)
        return Image.fromarray(rng.integers(0, 255, (84, 84, 3), dtype=np.uint8))

    images = {"A": picture(1), "B": picture(2)}
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    prompt = "USER: <image>\n" + " ".join(["describe the red dog on the mat"] * 8) + "\nASSISTANT:"

    rows = [["request", "decode output", "one full engine", "match", "decode cache hit",
             "KV loaded", "decode leg"]]  # fmt: skip
    for label, fold in (("", True), ("no fold: ", False)):
        pd = LocalPd(prefill, decode, fold_salt=fold)
        variant = prompt.replace("describe", "show" if fold else "tell")
        for name in ("A", "B", "A"):
            result = pd.generate(variant, [images[name]], greedy)
            request = {"prompt": variant, "multi_modal_data": {"image": [images[name]]}}
            out = baseline.generate([request], greedy, use_tqdm=False)[0].outputs[0]
            expected = list(out.token_ids)
            report = result.decode_kv_report or {}
            rows.append([
                f"{label}image {name}", str(list(result.token_ids)), str(expected),
                "yes" if list(result.token_ids) == expected else "NO",
                str(report.get("local_cached_tokens", "-")), str(report.get("loaded_tokens", "-")),
                f"ids, hashes; salt {(result.cache_salt or 'none')[:8]}",
            ])  # fmt: skip

    words = " ".join(("red dog blue cat on the mat " * 10).split()[:66])
    qwen_prompt = (
        f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|> {words}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    qwen_images = {name: image.resize((112, 112)) for name, image in images.items()}
    pd = LocalPd(qwen_prefill, qwen_decode)
    for name in ("A", "B", "A"):
        result = pd.generate(qwen_prompt, [qwen_images[name]], greedy)
        request = {"prompt": qwen_prompt, "multi_modal_data": {"image": [qwen_images[name]]}}
        out = qwen_baseline.generate([request], greedy, use_tqdm=False)[0].outputs[0]
        expected = list(out.token_ids)
        report = result.decode_kv_report or {}
        rows.append([
            f"Qwen2-VL image {name}", str(list(result.token_ids)), str(expected),
            "yes" if list(result.token_ids) == expected else "NO",
            str(report.get("local_cached_tokens", "-")), str(report.get("loaded_tokens", "-")),
            "ids, grid, hash; no pixels",
        ])  # fmt: skip

    def refusal(label: str, run: Any) -> None:
        try:
            run()
        except PolicyError as exc:
            rows.append([label, f"refused: {exc.status} {exc.code}", "-", "-", "-", "-", "-"])
        else:
            rows.append([label, "served", "-", "-", "-", "-", "-"])

    refusal("Qwen2-VL image, LM-only decode takes no KV", lambda: LocalPd(
        qwen_prefill, qwen_no_kv).generate(qwen_prompt, [qwen_images["A"]], greedy))  # fmt: skip
    refusal("image, n=2", lambda: LocalPd(prefill, decode).generate(
        prompt, [images["A"]], SamplingParams(n=2, max_tokens=4, temperature=0.5)))  # fmt: skip
    refusal("image, prefill returned no KV", lambda: LocalPd(silent, decode).generate(
        prompt, [images["A"]], greedy))  # fmt: skip
    text = "USER: " + " ".join(["tell me about the blue cat"] * 8) + "\nASSISTANT:"
    result = LocalPd(silent, decode).generate(text, [], greedy)
    expected = list(
        baseline.generate([{"prompt": text}], greedy, use_tqdm=False)[0].outputs[0].token_ids
    )
    match = "yes" if list(result.token_ids) == expected else "NO"
    tokens = str(list(result.token_ids))
    rows.append(
        ["text, prefill returned no KV", tokens, str(expected), match, "-", "recomputed", "-"]
    )

    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    print("Live P/D on CPU: tiny LLaVA and Qwen2-VL, vision prefill -> language-model-only decode")
    print()
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print("The decode output equals one full engine's, image for image; A again hits the")
    print("decode prefix cache and B does not. Without the salt fold, B is served A's cached")
    print("blocks and its answer is no longer B's. Qwen2-VL's decode engine has no vision")
    print("tower: it takes each image's grid and hash, and the prefill's KV.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
