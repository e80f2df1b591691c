"""The cycle collector, set for a server that makes many short-lived trees a request.

A request's work makes thousands of objects (its body's, its legs', the loop's), nearly
all of them freed by their counts as it ends; with Python's default threshold (700 new
objects) the collector runs every few requests, and now and then walks every object the
process holds, the modules' included. Measured on the proxy's bench (64 KiB images, 16
clients): 270 collections in 3 300 requests, about 3 % of its CPU. So, once the proxy is
set up and before it serves: what start-up made is moved out of the collector's sight
(``gc.freeze``: it lives as long as the process), and the youngest generation is collected every
[`YOUNG`][pd_policy_vllm.http.collector.YOUNG] new objects. Cycles are still found and
freed (a request that makes one still has it collected, a few requests later).
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["YOUNG", "settle"]

#: New objects between collections of the youngest generation (Python's default: 700).
YOUNG: Final = 10_000


def settle() -> None:
    """Collect what start-up left, freeze what remains, and collect the youngest
    generation every ``YOUNG`` new objects from now on (the older ones as before)."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, oldest)
