"""The media identity table of ``docs/index.md``, computed by the proxy's own functions.

Each row is one way a media item arrives in a chat body; each column a path through the
proxy. A cell is what [`media_parts`][pd_policy_vllm.openai.media.parts.media_parts] reads the
part as and what [`part_basis`][pd_policy_vllm.openai.media.identity.part_basis] gives it there,
or the refusal. A test holds the docs to it;
``python -m pd_policy_vllm.openai.tools.identity_table --write docs/index.md`` rewrites it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from pd_policy import IdentityBasis, MediaFetchRules, MediaSource, PolicyError
from pd_policy.tools.tables import splice
from pd_policy_vllm.openai.media.identity import part_basis
from pd_policy_vllm.openai.media.parts import media_parts

__all__ = ["NAME", "identity_table", "main"]

#: The generated block's name in ``docs/index.md``.
NAME: Final = "media-identity"

_DATA: Final = "data:image/png;base64,iVBORw0KGgo="
_WAYS: Final[tuple[tuple[str, dict[str, Any]], ...]] = (
    ("`data:` URL", {"type": "image_url", "image_url": {"url": _DATA}}),
    ("`input_audio`", {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}),
    ("remote URL (`http(s)`)", {"type": "image_url", "image_url": {"url": "https://m.example/a"}}),
    ("local file (`file:`)", {"type": "image_url", "image_url": {"url": "file:///srv/media/a"}}),
    ("a part with a `uuid`", {"type": "image_url", "image_url": {"url": _DATA}, "uuid": "u1"}),
    ("a `uuid` alone (no data)", {"type": "image_url", "image_url": None, "uuid": "u1"}),
    ("embeddings (`image_embeds`)", {"type": "image_embeds", "image_embeds": "AAAA"}),
    ("neither data nor `uuid`", {"type": "image_url", "image_url": None}),
)
_RULES: Final = MediaFetchRules(allowed_local_path="/srv/media", known=True)
#: The paths: a header, whether the proxy fetches remote items, whether a worker renders.
_PATHS: Final = (
    ("P/D, the proxy knows the worker's rules (it fetches)", True, False),
    ("P/D, it does not (`--remote-media uncached`)", False, False),
    ("metadata path and E/P/D (a worker renders first)", False, True),
)
_WORDS: Final = {
    IdentityBasis.CONTENT: "its bytes",
    IdentityBasis.CLIENT: "the client's `uuid`, within its tenant",
    IdentityBasis.WORKER: "the fetching worker's hash",
    IdentityBasis.UNCACHED: "none: uncached",
}


def _cell(part: dict[str, Any], fetches: bool, renders: bool) -> str:
    body = {"messages": [{"role": "user", "content": [part]}]}
    try:
        (read,) = media_parts(body, _RULES)
        basis = part_basis(read, fetches=fetches, renders=renders)
    except PolicyError as exc:
        return f"{exc.status} `{exc.code}`"
    pinned = fetches and not renders and read.source is MediaSource.REMOTE and read.uuid is None
    return _WORDS[basis] + (" (fetched once by the proxy)" if pinned else "")


def identity_table() -> str:
    """The table, as markdown."""
    lines = [
        "| media arrives as | " + " | ".join(p[0] for p in _PATHS) + " |",
        "|---" * (len(_PATHS) + 1) + "|",
    ]
    for label, part in _WAYS:
        cells = [_cell(part, fetches, renders) for _, fetches, renders in _PATHS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table, or with ``--write DOC`` splice it into ``DOC``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(identity_table())
        return 0
    if len(args) != 2 or args[0] != "--write":
        print(
            "usage: python -m pd_policy_vllm.openai.tools.identity_table [--write DOC]",
            file=sys.stderr,
        )
        return 2
    doc = Path(args[1])
    doc.write_text(splice(doc.read_text(encoding="utf-8"), NAME, identity_table()), "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
