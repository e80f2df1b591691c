"""The text the tiny LLaVA's live tests send after the image.

Long enough that a prompt spans several 32-id blocks past the image's 36
placeholders; the tests put a variant word before it to keep out of each other's
caches.
"""

from __future__ import annotations

from typing import Final

__all__ = ["TEXT"]

TEXT: Final = " ".join(["describe the red dog on the mat and the blue cat"] * 6)
