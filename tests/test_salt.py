"""The cache-salt fold, on worked examples."""

from __future__ import annotations

import hashlib

from pd_policy import (
    Modality,
    MultimodalBatch,
    Request,
    decode_cache_salt,
    fold_cache_salt,
    fold_salt,
    upstream_cache_salt,
    upstream_decode_cache_salt,
)
from pd_policy.tools.scenarios import image_request

IMG, VID = Modality.IMAGE, Modality.VIDEO


def test_upstream_format_for_parity() -> None:
    assert upstream_cache_salt(["h1", "h2"]) == "mm:h1,h2"
    assert upstream_cache_salt([]) is None
    # The upstream format is ambiguous; ours is not.
    assert upstream_cache_salt(["a,b"]) == upstream_cache_salt(["a", "b"])
    assert fold_salt([(IMG, "a,b")]) != fold_salt([(IMG, "a"), (IMG, "b")])


def test_no_hashes_passes_the_callers_salt_through() -> None:
    assert fold_salt([], "tenant-1") == "tenant-1"
    assert fold_salt([], None) is None


def test_different_images_differ_and_the_same_image_repeats() -> None:
    a, b = fold_salt([(IMG, "A")]), fold_salt([(IMG, "B")])
    assert a != b
    assert fold_salt([(IMG, "A")]) == a


def test_order_modality_and_tenant_all_count() -> None:
    assert fold_salt([(IMG, "A"), (IMG, "B")]) != fold_salt([(IMG, "B"), (IMG, "A")])
    assert fold_salt([(IMG, "A")]) != fold_salt([(VID, "A")])
    assert fold_salt([(IMG, "A")], "tenant-1") != fold_salt([(IMG, "A")], "tenant-2")
    assert fold_salt([(IMG, "A")], None) != fold_salt([(IMG, "A")], "")


def test_the_encoding_is_pinned() -> None:
    # A change here changes every deployed decode prefix cache key: bump the version.
    domain = b"pd-policy/cache-salt/v1\x00"
    expected = hashlib.sha256(
        domain
        + b"+" + (6).to_bytes(8, "big") + b"tenant"
        + (1).to_bytes(8, "big")
        + b"I" + (1).to_bytes(8, "big") + b"A"
    ).hexdigest()  # fmt: skip
    assert fold_salt([(IMG, "A")], "tenant") == "mm1:" + expected


def test_the_length_is_bounded_however_many_images() -> None:
    many = [(IMG, "h" * 64)] * 10_000
    folded = fold_salt(many, "s" * 10_000)
    assert folded is not None
    assert len(folded) == 68


def test_decode_cache_salt_folds_only_payload_free_legs() -> None:
    request = image_request(cache_salt="tenant")
    # The full leg carries pixels: vLLM hashes the items itself, the caller's salt stays.
    assert decode_cache_salt(request) == "tenant"
    assert upstream_decode_cache_salt(request) is None
    stripped = request.derive(batches=(MultimodalBatch(mm_hashes=("A", "B")),))
    assert decode_cache_salt(stripped) == fold_salt([(IMG, "A"), (IMG, "B")], "tenant")
    assert fold_cache_salt(stripped) == decode_cache_salt(stripped)
    assert upstream_decode_cache_salt(stripped) == "mm:A,B"
    text = Request("r", input_ids=(1,), cache_salt="tenant")
    assert decode_cache_salt(text) == "tenant"
