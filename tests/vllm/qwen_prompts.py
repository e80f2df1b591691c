"""Prompts for the tiny Qwen2-VL on which two images give two different answers.

Its random weights give near-tied logits: on a long text prompt the image often
does not change the greedy tokens. These prompts were measured to tell images
apart, and to place the image in a whole block or in the partial last one.
"""

from __future__ import annotations

from router_side import image

__all__ = ["A", "B", "prompt"]

_WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "cat", "sat", "on",
    "mat", "red", "green", "blue", "one", "two", "three", "four", "five", "six", "seven",
)  # fmt: skip


def prompt(variant: str, *, late: bool = False) -> str:
    """About 95 expanded ids over three 32-id blocks, the image in the first block or, with
    ``late``, in the partial last one; ``variant`` keeps tests out of each other's caches."""
    # 58 words put the image at ids 66..81 of 91: past the last whole block (64).
    words = " ".join([variant, *(_WORDS[(i * 7) % len(_WORDS)] for i in range(58 if late else 66))])
    image_part = "<|vision_start|><|image_pad|><|vision_end|>"
    user = f"{words} {image_part} hi" if late else f"{image_part} {words}"
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


#: Two 112x112 images: 16 placeholder ids each, grid (1, 8, 8).
A, B = image(1, side=112), image(2, side=112)
