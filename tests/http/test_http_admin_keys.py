"""The admins' keys: read from the flag, a file or the environment, a separate set from the
clients', each compared in full in constant time, and logged only by an id that is not
the key."""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest

from pd_policy import InvalidConfiguration
from pd_policy_vllm.http.auth import Keys, key_id, read_keys

ADMIN, CLIENT = "admin-K3Y", "client-K3Y"


def test_every_admin_key_is_compared_in_full_whichever_matches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    keys = Keys(admins=("first", "second", "third"))
    for given in ("first", "third", "nope"):
        compared.clear()
        found = keys.admin(f"Bearer {given}")
        assert found == (key_id(given) if given != "nope" else None)
        assert compared == [b"first", b"second", b"third"]
    assert keys.admin(None) is None and keys.admin("Basic first") is None
    assert keys.admin("bearer  second ") == key_id("second")


def test_a_key_id_says_which_key_and_not_what_it_is() -> None:
    assert key_id(ADMIN) == key_id(ADMIN) != key_id(CLIENT)
    assert len(key_id(ADMIN)) == 8 and "K3Y" not in key_id(ADMIN)
    assert "K3Y" not in repr(Keys("worker-K3Y", (CLIENT,), (ADMIN,)))


def test_admin_keys_come_from_the_flag_the_file_or_the_environment(tmp_path: Path) -> None:
    env = {"PD_POLICY_ADMIN_API_KEYS": " a1 , a2,", "PD_POLICY_API_KEYS": "c1"}
    keys = read_keys(env, admin_keys=["f1"])
    assert keys.admins == ("f1", "a1", "a2") and keys.clients == ("c1",)
    path = tmp_path / "admins"
    path.write_text("# the admins\nfile1\n\nfile2\n")
    assert read_keys(env, admin_keys_file=path).admins == ("file1", "file2")
    path.write_text("# none\n")
    with pytest.raises(InvalidConfiguration, match="admin keys file"):
        read_keys(env, admin_keys_file=path)
    assert read_keys({}).admins == ()
