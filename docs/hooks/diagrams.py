"""Sequence diagrams drawn at build time: a ```` ```sequence ```` fence becomes an inline SVG.

The docs must read the same offline, so no diagram is left to a renderer that a
browser would fetch from a CDN. This MkDocs hook (``hooks:`` in ``mkdocs.yml``)
replaces each top-level ```` ```sequence ```` fenced block of a page with an
inline SVG before Markdown runs.

The format, one statement a line (blank lines and lines starting with ``#``
are ignored)::

    participant G: Gateway (pd_policy)     # a column: an id, then an optional label
    C -> G: chat request with an image     # a call: solid line, filled arrowhead
    P --> G: kv_transfer_params             # a reply: dashed line
    G -> G: relay_kv(leg, params)           # a step within one participant: a loop
    note over G: the 502 is raised here     # a note over one participant
    note over P, D: KV transfer             # a note spanning participants

Ids are letters, digits, ``_`` and ``.``; a participant that is used before
(or without) a ``participant`` line gets its id as label. Columns are in the
order of first appearance. Labels are plain text (escaped, never markup);
long ones wrap at spaces, and ``\\n`` in a label breaks the line.

The SVG draws everything in ``currentColor`` (notes and headers use it at a
low opacity), so it follows the theme's text colour in light and dark mode,
and uses a monospace font, whose advance width (0.6 em) lets the layout size
every box and column to its text without a browser.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final
from xml.sax.saxutils import escape

__all__ = [
    "DiagramError",
    "Message",
    "Note",
    "SequenceDiagram",
    "find_sequence_blocks",
    "on_page_markdown",
    "parse_sequence",
    "render_markdown",
    "render_sequence",
]

FENCE_INFO: Final = "sequence"

# Geometry, in px. The font is monospace at FONT_SIZE, so a character's advance is
# 0.6 em (DejaVu Sans Mono, Roboto Mono and Courier all measure 0.60 to 0.61 em);
# CHAR_W rounds up so that text never overruns the box computed for it.
FONT_SIZE: Final = 12
CHAR_W: Final = 7.3
LINE_H: Final = 16
MARGIN: Final = 12
HEAD_PAD_X: Final = 10
HEAD_PAD_Y: Final = 7
COLUMN_GAP: Final = 24
LABEL_PAD: Final = 10
SELF_LOOP_W: Final = 28
SELF_LOOP_H: Final = 18
NOTE_PAD: Final = 8
ROW_GAP: Final = 10
ARROW_LEN: Final = 9
ARROW_HALF: Final = 4

WRAP_HEAD: Final = 18
WRAP_MESSAGE: Final = 28
WRAP_NOTE: Final = 40

_ID: Final = r"[A-Za-z_][A-Za-z0-9_.]*"
_PARTICIPANT = re.compile(rf"^participant\s+(?P<id>{_ID})\s*(?::\s*(?P<label>.*))?$")
_MESSAGE = re.compile(
    rf"^(?P<src>{_ID})\s*(?P<arrow>-->|->)\s*(?P<dst>{_ID})\s*(?::\s*(?P<label>.*))?$"
)
_NOTE = re.compile(
    rf"^note\s+over\s+(?P<first>{_ID})\s*(?:,\s*(?P<last>{_ID}))?\s*:\s*(?P<text>.*)$"
)
_OPEN = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")


class DiagramError(ValueError):
    """A diagram source that does not follow the format; the message names the line."""


@dataclass(frozen=True)
class Message:
    """An arrow from ``src`` to ``dst`` (the same id for a step within one participant)."""

    src: str
    dst: str
    label: str
    reply: bool


@dataclass(frozen=True)
class Note:
    """A note over the participants ``first`` to ``last`` (the same id for one)."""

    first: str
    last: str
    text: str


@dataclass(frozen=True)
class SequenceDiagram:
    """A parsed diagram: the participants as ``(id, label)`` in column order, and the rows."""

    participants: tuple[tuple[str, str], ...]
    rows: tuple[Message | Note, ...]


def parse_sequence(source: str) -> SequenceDiagram:
    """Parse a diagram's source (the body of the fence).

    Raises :class:`DiagramError` naming the 1-based line of a statement that is
    not in the format, of a participant declared twice or after its first use,
    and of a diagram without any participant.
    """
    labels: dict[str, str] = {}
    declared: set[str] = set()
    rows: list[Message | Note] = []

    def use(pid: str) -> None:
        labels.setdefault(pid, pid)

    for number, raw in enumerate(source.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if m := _PARTICIPANT.match(line):
            pid = m["id"]
            if pid in labels:
                what = "declared twice" if pid in declared else "declared after its first use"
                raise DiagramError(f"line {number}: participant {pid!r} {what}")
            declared.add(pid)
            labels[pid] = _text(m["label"] or pid)
        elif m := _MESSAGE.match(line):
            use(m["src"])
            use(m["dst"])
            rows.append(Message(m["src"], m["dst"], _text(m["label"] or ""), m["arrow"] == "-->"))
        elif m := _NOTE.match(line):
            use(m["first"])
            use(m["last"] or m["first"])
            rows.append(Note(m["first"], m["last"] or m["first"], _text(m["text"])))
        else:
            raise DiagramError(
                f"line {number}: expected 'participant ID[: label]', 'A -> B: label', "
                f"'A --> B: label' or 'note over A[, B]: text', got {line!r}"
            )
    if not labels:
        raise DiagramError("a diagram needs at least one participant")
    return SequenceDiagram(tuple(labels.items()), tuple(rows))


def _text(label: str) -> str:
    return label.strip().replace("\\n", "\n")


def _cells(text: str) -> int:
    # East Asian wide characters take two cells of a monospace font.
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _width(text: str) -> float:
    return _cells(text) * CHAR_W


def _wrap(text: str, limit: int) -> list[str]:
    """Greedy word wrap at ``limit`` cells; a longer word keeps a line to itself."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            if line and _cells(line) + 1 + _cells(word) > limit:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return lines


def _block_width(lines: Sequence[str]) -> float:
    return max((_width(line) for line in lines), default=0.0)


def _num(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _text_element(lines: Sequence[str], x: float, y: float, anchor: str, extra: str = "") -> str:
    """``<text>`` whose first baseline is at ``y``, one ``<tspan>`` a line."""
    spans = "".join(
        f'<tspan x="{_num(x)}" dy="{0 if i == 0 else LINE_H}">{escape(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return f'<text x="{_num(x)}" y="{_num(y)}" text-anchor="{anchor}"{extra}>{spans}</text>'


@dataclass(frozen=True)
class _Need:
    """Column ``i`` to column ``j`` (i < j) must be at least ``distance`` apart."""

    i: int
    j: int
    distance: float


def _layout(
    heads: Sequence[list[str]],
    rows: Sequence[tuple[Message | Note, list[str]]],
    index: dict[str, int],
) -> tuple[list[float], float]:
    """The x of each lifeline and the total width."""
    n = len(heads)
    head_w = [_block_width(h) + 2 * HEAD_PAD_X for h in heads]
    left, right = head_w[0] / 2, head_w[-1] / 2
    needs = [_Need(i, i + 1, (head_w[i] + head_w[i + 1]) / 2 + COLUMN_GAP) for i in range(n - 1)]
    for row, lines in rows:
        w = _block_width(lines)
        if isinstance(row, Message):
            a, b = sorted((index[row.src], index[row.dst]))
            if a != b:
                needs.append(_Need(a, b, w + 2 * LABEL_PAD))
            elif a + 1 < n:
                needs.append(_Need(a, a + 1, max(w, SELF_LOOP_W) + 2 * LABEL_PAD))
            else:
                # The last column's steps put their label to the left (see _message),
                # in a gap that other rows widen anyway, instead of widening the diagram.
                right = max(right, SELF_LOOP_W + LABEL_PAD)
                if a > 0:
                    needs.append(_Need(a - 1, a, w + 2 * LABEL_PAD))
                else:
                    right = max(right, w + 2 * LABEL_PAD)
        else:
            a, b = index[row.first], index[row.last]
            a, b = min(a, b), max(a, b)
            box = w + 2 * NOTE_PAD
            if a == b:
                half = box / 2 + NOTE_PAD
                if a > 0:
                    needs.append(_Need(a - 1, a, half))
                else:
                    left = max(left, half)
                if a + 1 < n:
                    needs.append(_Need(a, a + 1, half))
                else:
                    right = max(right, half)
            else:
                # A spanning note reaches NOTE_PAD*2 past both lifelines.
                needs.append(_Need(a, b, box - 4 * NOTE_PAD))
    gaps = [0.0] * (n - 1)
    # Lower bounds only ever grow gaps, so settling the narrow spans first leaves every
    # wider span to add just what it still lacks: one pass in order of span suffices.
    for need in sorted(needs, key=lambda nd: nd.j - nd.i):
        have = sum(gaps[need.i : need.j])
        if have < need.distance:
            share = (need.distance - have) / (need.j - need.i)
            for k in range(need.i, need.j):
                gaps[k] += share
    xs = [MARGIN + left]
    for gap in gaps:
        xs.append(xs[-1] + gap)
    return xs, xs[-1] + right + MARGIN


def render_sequence(source: str) -> str:
    """The SVG (one line, no blank line, so Markdown keeps it as raw HTML) for a source.

    Raises :class:`DiagramError` as :func:`parse_sequence` does.
    """
    diagram = parse_sequence(source)
    index = {pid: i for i, (pid, _) in enumerate(diagram.participants)}
    heads = [_wrap(label, WRAP_HEAD) for _, label in diagram.participants]
    rows = [
        (
            row,
            _wrap(row.label, WRAP_MESSAGE)
            if isinstance(row, Message)
            else _wrap(row.text, WRAP_NOTE),
        )
        for row in diagram.rows
    ]
    xs, width = _layout(heads, rows, index)
    rows = [(row, _fit(row, lines, xs, index)) for row, lines in rows]

    parts: list[str] = []
    head_h = max(len(h) for h in heads) * LINE_H + 2 * HEAD_PAD_Y
    top = MARGIN
    for x, lines in zip(xs, heads, strict=True):
        w = _block_width(lines) + 2 * HEAD_PAD_X
        parts.append(
            f'<rect x="{_num(x - w / 2)}" y="{top}" width="{_num(w)}" height="{head_h}" rx="3" '
            'fill="currentColor" fill-opacity="0.06" stroke="currentColor"/>'
        )
        first = top + (head_h - len(lines) * LINE_H) / 2 + FONT_SIZE
        parts.append(_text_element(lines, x, first, "middle", ' font-weight="bold"'))

    y: float = top + head_h + ROW_GAP
    body: list[str] = []
    for row, lines in rows:
        y += ROW_GAP
        if isinstance(row, Message):
            last = index[row.src] == len(xs) - 1 > 0
            x1, x2 = xs[index[row.src]], xs[index[row.dst]]
            y = _message(body, row, lines, x1, x2, y, label_left=last)
        else:
            a, b = sorted((index[row.first], index[row.last]))
            y = _note(body, lines, xs[a], xs[b], y)
    bottom = y + ROW_GAP
    height = bottom + MARGIN

    lifelines = [
        f'<line x1="{_num(x)}" y1="{top + head_h}" x2="{_num(x)}" y2="{_num(bottom)}" '
        'stroke="currentColor" stroke-opacity="0.45"/>'
        for x in xs
    ]
    names = ", ".join(label.replace("\n", " ") for _, label in diagram.participants)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pd-sequence" role="img" '
        f'width="{_num(width)}" height="{_num(height)}" '
        f'viewBox="0 0 {_num(width)} {_num(height)}" '
        f'font-family="monospace" font-size="{FONT_SIZE}" fill="currentColor" '
        'style="max-width: 100%; height: auto">'
        f"<title>{escape('Sequence diagram: ' + names)}</title>"
        + "".join(lifelines + parts + body)
        + "</svg>"
    )


def _fit(
    row: Message | Note, lines: list[str], xs: Sequence[float], index: dict[str, int]
) -> list[str]:
    """A message's label re-wrapped to the room the layout gave its row.

    Every constraint of the layout still holds: the room is at least what the
    first wrap needed, and no line is longer than the room or the longest word.
    """
    if not isinstance(row, Message) or not row.label:
        return lines
    a, b = index[row.src], index[row.dst]
    if a != b:
        room = abs(xs[b] - xs[a])
    elif a + 1 < len(xs):
        room = xs[a + 1] - xs[a]
    elif a > 0:
        room = xs[a] - xs[a - 1]
    else:
        return lines
    return _wrap(row.label, max(WRAP_MESSAGE, int((room - 2 * LABEL_PAD) / CHAR_W)))


def _arrowhead(x: float, y: float, direction: int) -> str:
    """A filled head whose tip is at ``(x, y)``, pointing right (1) or left (-1)."""
    base = x - direction * ARROW_LEN
    points = " ".join(
        f"{_num(px)},{_num(py)}"
        for px, py in ((x, y), (base, y - ARROW_HALF), (base, y + ARROW_HALF))
    )
    return f'<polygon points="{points}" fill="currentColor"/>'


def _message(
    out: list[str],
    row: Message,
    lines: list[str],
    x1: float,
    x2: float,
    y: float,
    *,
    label_left: bool = False,
) -> float:
    """Draw one message from its row's top ``y``; returns the row's bottom.

    A step within one participant (``x1 == x2``) has its label right of its
    lifeline, or left of it with ``label_left``.
    """
    dash = ' stroke-dasharray="6 4"' if row.reply else ""
    label_h = len(lines) * LINE_H if row.label else 0
    group = [f"<title>{escape(row.label.replace(chr(10), ' '))}</title>"] if row.label else []
    if x1 == x2:
        if row.label:
            if label_left:
                group.append(_text_element(lines, x1 - LABEL_PAD / 2, y + FONT_SIZE, "end"))
            else:
                group.append(_text_element(lines, x1 + LABEL_PAD / 2, y + FONT_SIZE, "start"))
        ly = y + label_h + 4
        right = x1 + SELF_LOOP_W
        group.append(
            f'<path d="M{_num(x1)},{_num(ly)} H{_num(right)} V{_num(ly + SELF_LOOP_H)} '
            f'H{_num(x1 + ARROW_LEN)}" fill="none" stroke="currentColor"{dash}/>'
        )
        group.append(_arrowhead(x1, ly + SELF_LOOP_H, -1))
        bottom = ly + SELF_LOOP_H + ARROW_HALF
    else:
        if row.label:
            group.append(_text_element(lines, (x1 + x2) / 2, y + FONT_SIZE, "middle"))
        ay = y + label_h + 6
        direction = 1 if x2 > x1 else -1
        group.append(
            f'<line x1="{_num(x1)}" y1="{_num(ay)}" x2="{_num(x2 - direction * ARROW_LEN)}" '
            f'y2="{_num(ay)}" stroke="currentColor"{dash}/>'
        )
        group.append(_arrowhead(x2, ay, direction))
        bottom = ay + ARROW_HALF
    kind = "reply" if row.reply else "message"
    out.append(f'<g class="pd-sequence-{kind}">' + "".join(group) + "</g>")
    return bottom


def _note(out: list[str], lines: list[str], x1: float, x2: float, y: float) -> float:
    """Draw a note over the lifelines ``x1`` to ``x2`` from ``y``; returns its bottom."""
    w = _block_width(lines) + 2 * NOTE_PAD
    if x1 != x2:
        w = max(w, x2 - x1 + 4 * NOTE_PAD)
    h = len(lines) * LINE_H + 2 * NOTE_PAD - 4
    cx = (x1 + x2) / 2
    out.append(
        '<g class="pd-sequence-note">'
        f'<rect x="{_num(cx - w / 2)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" '
        'rx="2" fill="currentColor" fill-opacity="0.1" stroke="currentColor" '
        'stroke-opacity="0.6"/>'
        + _text_element(lines, cx, y + NOTE_PAD - 2 + FONT_SIZE, "middle")
        + "</g>"
    )
    return y + h


def find_sequence_blocks(markdown: str) -> list[tuple[int, int, str]]:
    """Every top-level ```` ```sequence ```` block: (first line, line after it, body), 0-based.

    Fences of other languages are skipped whole, so an example of the format
    inside a longer fence stays text. Raises :class:`DiagramError` for a
    ``sequence`` fence that is never closed.
    """
    lines = markdown.splitlines()
    blocks: list[tuple[int, int, str]] = []
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if m is None:
            i += 1
            continue
        fence = m["fence"]
        closing = re.compile(rf"^{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((k for k in range(i + 1, len(lines)) if closing.match(lines[k])), None)
        if end is None:
            if m["info"] == FENCE_INFO:
                raise DiagramError(f"line {i + 1}: a {FENCE_INFO} fence that is never closed")
            return blocks
        if m["info"] == FENCE_INFO:
            blocks.append((i, end + 1, "\n".join(lines[i + 1 : end])))
        i = end + 1
    return blocks


def render_markdown(markdown: str) -> str:
    """The page with each ```` ```sequence ```` block replaced by its SVG in a ``<div>``.

    Raises :class:`DiagramError` for a block that does not parse, naming the
    page line.
    """
    blocks = find_sequence_blocks(markdown)
    if not blocks:
        return markdown
    lines = markdown.splitlines()
    out: list[str] = []
    done = 0
    for start, stop, body in blocks:
        try:
            svg = render_sequence(body)
        except DiagramError as exc:
            raise DiagramError(f"the diagram at line {start + 1}: {exc}") from None
        # Blank lines around the <div> make Markdown take it as one raw HTML block.
        out += [*lines[done:start], "", f'<div class="pd-diagram">{svg}</div>', ""]
        done = stop
    out += lines[done:]
    return "\n".join(out) + ("\n" if markdown.endswith("\n") else "")


def on_page_markdown(markdown: str, /, *, page: Any, **_: Any) -> str:
    """MkDocs hook: draw the page's sequence diagrams; a malformed one fails the build."""
    try:
        return render_markdown(markdown)
    except DiagramError as exc:
        raise DiagramError(f"{page.file.src_path}: {exc}") from None
