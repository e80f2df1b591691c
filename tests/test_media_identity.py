"""A media item's identity: the rule for its basis, and when two items are the same.

The rule is stated once more as a flat list and checked over every combination of
its inputs; the identity is checked to be equal exactly when every input is, over
generated inputs built to collide (adversarial strings, reordered keys, factors moved
from one slot to another).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import MalformedRequest, Modality, PolicyError
from pd_policy.media.identity import (
    IDENTITY_PREFIX,
    HashFactors,
    IdentityBasis,
    MediaSource,
    identity_basis,
    item_identity,
)
from strategies import adversarial_text, hex_digests

SOURCES, BASES = tuple(MediaSource), tuple(IdentityBasis)


def rule(source: MediaSource, *, uuid: bool, pinned: bool, worker: bool) -> Any:
    """The rule as a flat list: the first line that applies decides."""
    rules: list[tuple[bool, Any]] = [
        (source is MediaSource.NAMED and not uuid, MalformedRequest),  # nothing to name it by
        (pinned and source is not MediaSource.REMOTE, MalformedRequest),  # only URLs are fetched
        (uuid, IdentityBasis.CLIENT),  # vLLM keys the prefill's caches by the uuid
        (source is MediaSource.INLINE, IdentityBasis.CONTENT),
        (pinned, IdentityBasis.CONTENT),  # fetched once, the same bytes to every leg
        (worker, IdentityBasis.WORKER),  # the worker that fetched it says what it saw
    ]
    return next((outcome for applies, outcome in rules if applies), IdentityBasis.UNCACHED)


COMBINATIONS: list[tuple[MediaSource, bool, bool, bool]] = [
    (source, uuid, pinned, worker)
    for source in SOURCES
    for uuid, pinned, worker in itertools.product((False, True), repeat=3)
]


@pytest.mark.parametrize(("source", "uuid", "pinned", "worker"), COMBINATIONS)
def test_every_combination_takes_the_basis_the_rule_says(
    source: MediaSource, uuid: bool, pinned: bool, worker: bool
) -> None:
    expected = rule(source, uuid=uuid, pinned=pinned, worker=worker)
    try:
        got: Any = identity_basis(source, has_uuid=uuid, pinned=pinned, worker_hashes=worker)
    except PolicyError as exc:
        assert exc.status == 400
        got = type(exc)
    assert got == expected


def test_every_basis_is_reached_and_a_name_is_never_content() -> None:
    outcomes = {rule(s, uuid=u, pinned=p, worker=w) for s, u, p, w in COMBINATIONS}
    assert set(BASES) <= outcomes
    # The incident: a URL's text is a name, not its content. Unless the router holds the
    # bytes it sends, a remote or local item is never identified by content.
    for source, uuid, pinned, worker in COMBINATIONS:
        if source in (MediaSource.REMOTE, MediaSource.LOCAL) and not pinned:
            assert (
                rule(source, uuid=uuid, pinned=pinned, worker=worker) is not IdentityBasis.CONTENT
            )


# Factor mappings whose keys and values are built to collide when encoded naively.
_json_leaf = st.none() | st.booleans() | st.integers(-3, 3) | adversarial_text
_mapping = st.dictionaries(st.sampled_from(["a", "b", "a,b", ":", "num_frames"]), _json_leaf,
                           max_size=3)  # fmt: skip
values = hex_digests | adversarial_text
Inputs = tuple[Modality, IdentityBasis, str, tuple[dict[str, Any], ...]]
inputs = st.tuples(
    st.sampled_from(list(Modality)), st.sampled_from(BASES), values,
    st.tuples(_mapping, _mapping, _mapping, _mapping),
)  # fmt: skip


def identity(a: Inputs) -> str:
    modality, basis, value, maps = a
    return item_identity(modality, basis, value, HashFactors(*maps))


def _canonical(a: Inputs) -> tuple[Any, ...]:
    # The test's own notion of "the same factor": JSON text with sorted keys (1 and true
    # are different values to JSON, though equal to Python).
    return (*a[:3], *(json.dumps(m, sort_keys=True) if m else "" for m in a[3]))


@given(inputs, inputs)
def test_two_items_share_an_identity_exactly_when_every_input_is_equal(
    a: Inputs, b: Inputs
) -> None:
    same = _canonical(a) == _canonical(b)
    event("equal inputs" if same else "different inputs")
    assert (identity(a) == identity(b)) is same


@given(inputs, st.sampled_from(["modality", "basis", "value", "factor"]), st.data())
def test_changing_any_one_input_changes_the_identity(
    a: Inputs, which: str, data: st.DataObject
) -> None:
    modality, basis, value, maps = a
    if which == "modality":
        modality = data.draw(st.sampled_from([m for m in Modality if m is not modality]))
    elif which == "basis":
        basis = data.draw(st.sampled_from([b for b in BASES if b is not basis]))
    elif which == "value":
        value = data.draw(values.filter(lambda v: v != a[2]))
    elif len({json.dumps(m, sort_keys=True) for m in maps}) > 1:
        maps = (*maps[1:], maps[0])  # each factor moved to another's slot
    else:
        maps = ({"changed": True}, *maps[1:])
    assert identity((modality, basis, value, maps)) != identity(a)


@given(st.dictionaries(st.text(max_size=4), _json_leaf, max_size=5))
def test_the_order_of_a_factors_keys_does_not_matter(kwargs: dict[str, Any]) -> None:
    reordered = dict(reversed(list(kwargs.items())))
    a = item_identity(Modality.IMAGE, IdentityBasis.CONTENT, "d", HashFactors(kwargs))
    b = item_identity(Modality.IMAGE, IdentityBasis.CONTENT, "d", HashFactors(reordered))
    assert a == b


def test_worked_examples() -> None:
    content = item_identity(Modality.IMAGE, IdentityBasis.CONTENT, "ab" * 32)
    assert content.startswith(IDENTITY_PREFIX) and len(content) == len(IDENTITY_PREFIX) + 64
    # No factors, an empty mapping and None are one factor; a real option is another item.
    assert HashFactors() == HashFactors({}, {}, {}, {})
    other = HashFactors({"do_normalize": False})
    assert item_identity(Modality.IMAGE, IdentityBasis.CONTENT, "ab" * 32, other) != content
    # The same value under another basis is another item: a client's uuid that happens to
    # equal some content digest does not name that content.
    assert item_identity(Modality.IMAGE, IdentityBasis.CLIENT, "ab" * 32) != content
    # A video and an image of one digest are two items.
    assert item_identity(Modality.VIDEO, IdentityBasis.CONTENT, "ab" * 32) != content


@pytest.mark.parametrize(
    ("args", "param"),
    [
        ((Modality.IMAGE, IdentityBasis.CONTENT, ""), "value"),
        ((Modality.IMAGE, IdentityBasis.CONTENT, 3), "value"),
        (("image", IdentityBasis.CONTENT, "d"), "modality"),
        ((Modality.IMAGE, "content", "d"), "basis"),
        ((Modality.IMAGE, IdentityBasis.CONTENT, "d", {"a": 1}), "factors"),
    ],
)
def test_ill_typed_inputs_are_typed_errors(args: tuple[Any, ...], param: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        item_identity(*args)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("value", "param"),
    [([1], "mm_processor_kwargs"), ("{}", "mm_processor_kwargs"),
     ({"x": float("nan")}, "mm_processor_kwargs"), ({"x": object()}, "mm_processor_kwargs")],
)  # fmt: skip
def test_a_factor_must_be_a_json_object(value: Any, param: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        HashFactors(value)
    assert caught.value.param == param
    assert "nan" not in caught.value.message.lower()
