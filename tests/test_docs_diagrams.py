"""The docs' sequence diagrams are drawn at build time into SVG that parses and says it all.

The hook (docs/hooks/diagrams.py) turns each ```sequence fence into inline SVG,
so the site needs no Mermaid renderer from a CDN: no ```mermaid fence may come
back, and every participant and message of a diagram must be in its SVG.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HOOK = DOCS / "hooks" / "diagrams.py"
SVG = "{http://www.w3.org/2000/svg}"


def _load_hook() -> ModuleType:
    # The hook is a file MkDocs loads by path, not an installed module.
    spec = importlib.util.spec_from_file_location("pd_policy_docs_diagrams", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hook = _load_hook()
render_sequence: Callable[[str], str] = hook.render_sequence
render_markdown: Callable[[str], str] = hook.render_markdown
find_blocks: Callable[[str], list[tuple[int, int, str]]] = hook.find_sequence_blocks
DiagramError: type[Exception] = hook.DiagramError


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _diagrams() -> list[tuple[str, str]]:
    """Every (page:line, body) of a ```sequence block in docs/."""
    found = []
    for page in _pages():
        for start, _, body in find_blocks(page.read_text(encoding="utf-8")):
            found.append((f"{page.relative_to(DOCS)}:{start + 1}", body))
    return found


DIAGRAMS = _diagrams()


def _expected(body: str) -> tuple[list[str], list[str]]:
    """Participant labels and message/note texts, read from the source independently of
    the hook's parser (a plain split on the first ': ')."""
    participants, labels = [], []
    for raw in body.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, sep, tail = line.partition(":")
        if line.startswith("participant "):
            participants.append(tail.strip() if sep else head.split()[1])
        elif sep and tail.strip():
            labels.append(tail.strip())
    return participants, labels


def _texts(root: ET.Element) -> list[str]:
    """The text of each <text> element, its lines (<tspan>s) joined by a space."""
    return [
        " ".join(span.text or "" for span in text.iter(f"{SVG}tspan"))
        for text in root.iter(f"{SVG}text")
    ]


def test_the_docs_have_diagrams() -> None:
    # The overview's P/D request, at least: an empty list would make the next test vacuous.
    assert any(page.startswith("index.md:") for page, _ in DIAGRAMS)


@pytest.mark.parametrize(("where", "body"), DIAGRAMS, ids=[w for w, _ in DIAGRAMS])
def test_each_diagram_is_an_svg_with_all_its_words(where: str, body: str) -> None:
    svg = render_sequence(body)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    width, height = float(root.attrib["width"]), float(root.attrib["height"])
    assert width > 0 and height > 0
    assert root.attrib["viewBox"].split() == ["0", "0", root.attrib["width"], root.attrib["height"]]
    texts = _texts(root)
    participants, labels = _expected(body)
    assert participants, f"{where}: declares no participant"
    for label in [*participants, *labels]:
        assert label in texts, f"{where}: {label!r} is not drawn"
    # Nothing is drawn in a fixed colour: light and dark themes both read it.
    colours = {v for el in root.iter() for k, v in el.attrib.items() if k in {"fill", "stroke"}}
    assert colours <= {"currentColor", "none"}, colours


def test_text_is_escaped() -> None:
    body = 'participant A: <script>&"\nA -> B: a < b && c > "d"\nnote over A, B: </svg>'
    root = ET.fromstring(render_sequence(body))
    assert {'<script>&"', 'a < b && c > "d"', "</svg>"} <= set(_texts(root))
    assert not list(root.iter("script"))


def test_replies_are_dashed_and_calls_are_not() -> None:
    root = ET.fromstring(render_sequence("A -> B: call\nB --> A: reply"))
    lines = {g.get("class"): g.find(f"{SVG}line") for g in root.iter(f"{SVG}g")}
    call, reply = lines["pd-sequence-message"], lines["pd-sequence-reply"]
    assert call is not None and reply is not None
    assert "stroke-dasharray" not in call.attrib
    assert "stroke-dasharray" in reply.attrib


def test_long_labels_wrap_and_widen_the_columns() -> None:
    label = "relay_kv(leg, params); ensure_kv_handoff — no params ⇒ 502 " * 2
    root = ET.fromstring(render_sequence(f"A -> B: {label}"))
    (text,) = [t for t in root.iter(f"{SVG}text") if len(list(t.iter(f"{SVG}tspan"))) > 1]
    assert " ".join(s.text or "" for s in text.iter(f"{SVG}tspan")) == label.strip()
    xs = [float(line.attrib["x1"]) for line in root.iter(f"{SVG}line")]
    span = max(xs) - min(xs)
    longest = max(len(s.text or "") for s in text.iter(f"{SVG}tspan"))
    assert span >= longest * hook.CHAR_W


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("A -> B: ok\nA => B: no such arrow", 2),
        ("participant A\nparticipant A", 2),
        ("A -> B: x\nparticipant B: late", 2),
        ("note left of A: not supported", 1),
    ],
)
def test_a_malformed_diagram_names_its_line(body: str, line: int) -> None:
    with pytest.raises(DiagramError, match=rf"line {line}\b"):
        render_sequence(body)


def test_an_empty_diagram_is_refused() -> None:
    with pytest.raises(DiagramError, match="at least one participant"):
        render_sequence("# nothing but a comment\n")


def test_render_markdown_replaces_only_sequence_fences() -> None:
    page = (
        "# Title\n\n```sequence\nA -> B: hello\n```\n\n"
        "````markdown\n```sequence\nC -> D: shown as text\n```\n````\n\n"
        "```python\nx = 1\n```\n"
    )
    out = render_markdown(page)
    assert out.count("<svg") == 1
    assert "C -> D: shown as text" in out and "x = 1" in out
    (line,) = [raw for raw in out.splitlines() if raw.startswith('<div class="pd-diagram">')]
    # One line with blank lines around it: Markdown keeps it as a raw HTML block.
    lines = out.splitlines()
    index = lines.index(line)
    assert lines[index - 1] == "" and lines[index + 1] == ""
    ET.fromstring(line)


def test_an_unclosed_sequence_fence_is_an_error() -> None:
    with pytest.raises(DiagramError, match="never closed"):
        render_markdown("```sequence\nA -> B: x\n")


def test_no_mermaid_fence_remains() -> None:
    fence = re.compile(r"^\s*(`{3,}|~{3,})\s*mermaid", re.M)
    offenders = [
        str(p.relative_to(ROOT)) for p in _pages() if fence.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []
    assert "mermaid" not in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_mkdocs_runs_the_hook() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^hooks:\n  - docs/hooks/diagrams\.py$", config, re.M)
