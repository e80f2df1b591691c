"""The properties ``make fuzz`` runs at 100,000 examples each, and what they ran.

Mark such a property with [`fuzz`][] (a pytest marker) and wrap its body in
[`counted`][] under ``@given``; ``make test`` runs it at the profile's usual
count, ``make fuzz`` selects it with ``-m fuzz`` under the ``fuzz`` profile, and
the terminal summary (``tests/conftest.py``) reports examples per second.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

import pytest

P = ParamSpec("P")
R = TypeVar("R")

fuzz: Final = pytest.mark.fuzz
#: Examples each counted property ran, by test name: generated, replayed and shrunk alike.
EXAMPLES: Final[Counter[str]] = Counter()


def counted(test: Callable[P, R]) -> Callable[P, R]:
    """``test``, counting each call in [`EXAMPLES`][]; goes between ``@given`` and the body."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        EXAMPLES[test.__name__] += 1
        return test(*args, **kwargs)

    return run
