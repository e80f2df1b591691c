"""`make mutants` breaks the code by editing its text: every edit must still find its text."""

from __future__ import annotations

import pytest

from mutants import MUTANTS, ROOT, Mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutant_still_finds_its_text(mutant: Mutant) -> None:
    # A mutant whose text the code no longer has stops `make mutants`; found here, in
    # `make test`, when the code changes, instead of at the next mutation run.
    assert (ROOT / "src" / mutant.path).read_text().count(mutant.old) == 1
