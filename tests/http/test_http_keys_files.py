"""Keys files: one key a line, ``#`` starting a comment wherever the line's first
non-blank character is; blank lines skipped. An indented comment that became a key would
admit whoever sends its text, and one in the workers' file would stop the proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from pd_policy import InvalidConfiguration
from pd_policy_vllm.http.auth import read_keys

LISTED = "# the keys\n  # an old key, retired\n\tkey-1\n\n   \n\t# another comment\n  key-2  \n"


@pytest.mark.parametrize("which", ["client", "admin"])
def test_an_indented_comment_in_a_keys_file_is_no_key(tmp_path: Path, which: str) -> None:
    path = tmp_path / "keys"
    path.write_text(LISTED)
    if which == "client":
        keys = read_keys({}, client_keys_file=path).clients
    else:
        keys = read_keys({}, admin_keys_file=path).admins
    assert keys == ("key-1", "key-2")
    assert not any("#" in key for key in keys)


def test_an_indented_comment_in_the_worker_key_file_is_no_key(tmp_path: Path) -> None:
    path = tmp_path / "worker-key"
    path.write_text("  # the workers' key, rotated monthly\n\n  w0rker-key\n\t# end\n")
    assert read_keys({}, worker_key_file=path).worker == "w0rker-key"


@pytest.mark.parametrize(
    ("kwarg", "param"),
    [
        ("client_keys_file", "api_keys_file"),
        ("admin_keys_file", "admin_api_keys_file"),
        ("worker_key_file", "worker_api_key_file"),
    ],
)
def test_a_keys_file_of_comments_and_blanks_holds_no_key(
    tmp_path: Path, kwarg: str, param: str
) -> None:
    path = tmp_path / "keys"
    path.write_text("  # only comments\n\n\t#\n   \n")
    with pytest.raises(InvalidConfiguration) as caught:
        read_keys({}, **{kwarg: path})  # type: ignore[arg-type]
    assert caught.value.param == param and "#" not in caught.value.message
