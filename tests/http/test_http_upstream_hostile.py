"""A worker's answer is input: every hostile one ends its leg with a typed error,
promptly, on a real socket, and never as a body the worker did not frame.

Each case is a raw asyncio server on 127.0.0.1 that reads the leg and writes a script
of bytes, pauses and closes; the client is the proxy's own, with small limits so that
a timeout is a fraction of a second. A hypothesis property then drives valid,
random and mutated answers through the same client and checks each against h11 (a
second, independent parser): the client either gives h11's status and body, or a
typed error, within a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Final

import aiohttp
import h11
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pd_policy_vllm.http.upstream import (
    Limits,
    Upstream,
    UpstreamDisconnected,
    UpstreamProtocolError,
    UpstreamTimeout,
)

#: Small bounds, so a case's fault shows in well under a second.
LIMITS: Final = Limits(read_timeout=0.3, max_response_bytes=4096, max_head_bytes=2048)
#: No case may take longer than this: the client must not be held past its timeouts.
BOUND: Final = 5.0
_OK: Final = b"HTTP/1.1 200 OK\r\n"
_CHUNKED: Final = _OK + b"Transfer-Encoding: chunked\r\n\r\n"

Script = Sequence[bytes | float | None]  # bytes written, a pause (s), None: close


async def _serve(script: Script) -> tuple[asyncio.Server, int, list[bytes]]:
    requests: list[bytes] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        requests.append(head + await reader.readexactly(length))
        try:
            for step in script:
                if step is None:
                    writer.close()
                    return
                if isinstance(step, float):
                    await asyncio.sleep(step)
                else:
                    writer.write(step)
                    await writer.drain()
            await asyncio.sleep(3 * BOUND)  # then hold the connection open, answering nothing
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], requests


async def _leg(script: Script, limits: Limits = LIMITS) -> tuple[int, bytes]:
    server, port, _ = await _serve(script)
    upstream = Upstream(limits=limits)
    try:

        async def call() -> tuple[int, bytes]:
            async with upstream.post(f"http://127.0.0.1:{port}/v1", b"{}", {}) as r:
                return r.status, await r.read()

        return await asyncio.wait_for(call(), BOUND)
    finally:
        upstream.close()
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 0.2)


def _outcome(script: Script, limits: Limits = LIMITS) -> tuple[int, bytes] | type[BaseException]:
    try:
        return asyncio.run(_leg(script, limits))
    except (UpstreamProtocolError, UpstreamDisconnected, UpstreamTimeout) as exc:
        return type(exc)


_PROTOCOL: Final = UpstreamProtocolError
HOSTILE: Final = {
    # llhttp skips blank lines before a status line (a server's leniency for requests).
    "a blank line before the status line": [b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"],
    "a status line split after a blank line": [
        b"\n",
        0.01,
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
    ],
    "negative chunk size": [_CHUNKED + b"-1\r\nab\r\n0\r\n\r\n"],
    "signed chunk size": [_CHUNKED + b"+2\r\nab\r\n0\r\n\r\n"],
    "0x chunk size": [_CHUNKED + b"0x2\r\nab\r\n0\r\n\r\n"],
    "underscore chunk size": [_CHUNKED + b"1_0\r\nab\r\n0\r\n\r\n"],
    "overflowing chunk size": [_CHUNKED + b"ffffffffffffffffff\r\nab"],
    "chunk size past the cap, then its bytes": [_CHUNKED + b"ffffffffffffffff\r\n" + b"a" * 5000],
    "conflicting Content-Length": [_OK + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc"],
    "repeated Content-Length": [_OK + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nab"],
    "Content-Length list": [_OK + b"Content-Length: 2, 2\r\n\r\nab"],
    "Content-Length with Transfer-Encoding": [
        _OK + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"
    ],
    "Transfer-Encoding not ending in chunked": [
        _OK + b"Transfer-Encoding: chunked, gzip\r\n\r\nab",
        None,
    ],
    "a coding before chunked": [
        _OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"
    ],
    "Transfer-Encoding gzip alone": [_OK + b"Transfer-Encoding: gzip\r\n\r\nab", None],
    "bare LF": [b"HTTP/1.1 200 OK\nContent-Length: 2\n\nab"],
    "bare LF after a chunk size": [_CHUNKED + b"2\nab\r\n0\r\n\r\n"],
    "oversized headers": [_OK + b"X-Big: " + b"a" * 4096 + b"\r\n\r\n"],
    "an endless header": [_OK + b"X-Endless: " + b"a" * 1500, 0.05, b"a" * 1500],
    "1xx flood": [b"HTTP/1.1 100 Continue\r\n\r\n" * 200],
    "an upgrade unasked": [
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
    ],
    "a declared body past the cap": [_OK + b"Content-Length: 4097\r\n\r\n"],
    "a chunked body past the cap": [
        _CHUNKED + b"800\r\n" + b"a" * 2048 + b"\r\n" + b"801\r\n" + b"a" * 2049 + b"\r\n0\r\n\r\n"
    ],
    "a read-to-close body past the cap": [_OK + b"Connection: close\r\n\r\n" + b"a" * 5000],
    "no status line": [b"garbage\r\n\r\n"],
    "a control byte in the reason phrase": [
        _OK.replace(b"OK", b"\x00K") + b"Content-Length: 0\r\n\r\n"
    ],
    "HTTP/2 preface": [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"],
}
DISCONNECTED: Final = {
    "stops mid-body": [_OK + b"Content-Length: 10\r\n\r\nabc", None],
    "stops mid-chunk": [_CHUNKED + b"5\r\nab", None],
    "stops mid-head": [_OK + b"Content-Le", None],
    "closes with no answer": [None],
}
SILENT: Final = {
    "never answers": [],
    "stalls mid-body": [_OK + b"Content-Length: 10\r\n\r\nabc"],
    "stalls after the head": [_CHUNKED],
    # llhttp does not tell a chunk's declared size: its bytes are counted as they come.
    "chunk size past the cap, then silence": [_CHUNKED + b"ffffffffffffffff\r\nab"],
    "trickles its head past the timeout": [b"H", 0.1, b"T", 0.1, b"T", 0.1, b"P", 0.1, b"/"]
    + [x for _ in range(20) for x in (b"1", 0.1)],
}


@pytest.mark.parametrize("script", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_answer_is_a_protocol_error(script: Script) -> None:
    assert _outcome(script) is UpstreamProtocolError


@pytest.mark.parametrize("script", DISCONNECTED.values(), ids=DISCONNECTED.keys())
def test_a_worker_that_stops_is_a_disconnect(script: Script) -> None:
    assert _outcome(script) is UpstreamDisconnected


@pytest.mark.parametrize("script", SILENT.values(), ids=SILENT.keys())
def test_a_silent_worker_is_a_timeout(script: Script) -> None:
    assert _outcome(script) is UpstreamTimeout


@pytest.mark.parametrize("interim", [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
])  # fmt: skip
def test_interim_answers_are_read_past(interim: bytes) -> None:
    final = _OK + b"Content-Length: 2\r\n\r\nok"
    assert _outcome([interim, 0.05, final]) == (200, b"ok")
    assert _outcome([interim + final]) == (200, b"ok")


def test_a_long_silence_inside_the_timeout_is_no_fault() -> None:
    # A long prefill is not a fault: silence up to the read timeout is waited out.
    limits = Limits(read_timeout=1.0)
    script: list[bytes | float | None] = [0.6, _CHUNKED + b"2\r\nab\r\n", 0.6, b"0\r\n\r\n"]
    assert _outcome(script, limits) == (200, b"ab")


def test_a_body_at_the_cap_is_read_whole() -> None:
    assert _outcome([_OK + b"Content-Length: 4096\r\n\r\n" + b"a" * 4096]) == (200, b"a" * 4096)


def test_the_event_loop_runs_while_a_worker_misbehaves() -> None:
    # The chunk size of -1 once spun the loop forever: here a ticker must keep ticking.
    async def test() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        with contextlib.suppress(UpstreamProtocolError):
            await _leg([_CHUNKED + b"-1\r\n" + b"ab\r\n" * 1000])
        with contextlib.suppress(UpstreamTimeout):
            await _leg([_CHUNKED + b"ffffffffffffffff\r\nab"])
        task.cancel()
        return ticks

    assert asyncio.run(test()) >= 5


def test_the_typed_errors_are_the_ones_the_legs_map_to_502_and_504() -> None:
    # relay.failed_leg reads these classes: a change here must show there.
    from pd_policy_vllm.http.calls import failed_leg

    assert failed_leg("prefill", UpstreamTimeout("silent")).status == 504
    assert failed_leg("prefill", UpstreamProtocolError("bad")).status == 502
    assert failed_leg("decode", UpstreamDisconnected("gone")).status == 502
    assert isinstance(UpstreamTimeout("x"), aiohttp.ClientError)


# --- the property: random and mutated answers, checked against h11 -------------------


def _h11(wire: bytes, closes: bool) -> tuple[int, bytes] | None:
    """h11's reading of ``wire`` as the answer to one POST, or None if h11 refuses it or
    it is not whole."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=LIMITS.max_head_bytes)
    head = [("Host", "x"), ("Content-Length", "0")]
    conn.send(h11.Request(method="POST", target="/", headers=head))
    conn.send(h11.EndOfMessage())
    conn.receive_data(wire)
    if closes:
        conn.receive_data(b"")
    status, body = None, bytearray()
    try:
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA or ev is h11.PAUSED or isinstance(ev, h11.ConnectionClosed):
                return None
            if isinstance(ev, h11.InformationalResponse):
                continue
            if isinstance(ev, h11.Response):
                status = ev.status_code
                codings = [v for k, v in ev.headers if k == b"transfer-encoding"]
                if codings and codings != [b"chunked"]:
                    return None
            elif isinstance(ev, h11.Data):
                body += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                assert status is not None
                return status, bytes(body)
    except h11.RemoteProtocolError:
        return None


def _valid(body: bytes, framing: str, sizes: list[int]) -> bytes:
    if framing == "length":
        return _OK + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if framing == "close":
        return _OK + b"Connection: close\r\n\r\n" + body
    out, at = bytearray(_CHUNKED), 0
    for size in sizes:
        piece = body[at : at + size]
        if piece:
            out += b"%x\r\n" % len(piece) + piece + b"\r\n"
            at += len(piece)
    if at < len(body):
        out += b"%x\r\n" % (len(body) - at) + body[at:] + b"\r\n"
    return bytes(out + b"0\r\n\r\n")


_TOKENS: Final = [b"-1", b"+1", b"0x1", b"1_0", b"f" * 18, b"\n", b"\r\n", b"Content-Length: 1\r\n",
                  b"Transfer-Encoding: chunked\r\n", b"HTTP/1.1 100 Continue\r\n\r\n", b":", b" ",
                  b"\x00", b"0\r\n\r\n"]  # fmt: skip


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, bool, bytes | None]:
    """An answer's bytes, whether the worker closes after them, and the body when they
    are valid and unmutated."""
    body = draw(st.binary(min_size=1, max_size=200))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    wire = _valid(body, framing, draw(st.lists(st.integers(1, 50), max_size=6)))
    closes = framing == "close" or draw(st.booleans())
    how = draw(st.sampled_from(["flip", "insert", "delete", "random", "valid"]))
    event(how)
    if how == "valid":
        return wire, closes, body
    if how == "random":
        return draw(st.binary(max_size=300)), closes, None
    at = draw(st.integers(0, len(wire)))
    if how == "flip":
        wire = wire[:at] + bytes([draw(st.integers(0, 255))]) + wire[at + 1 :]
    elif how == "insert":
        wire = wire[:at] + draw(st.sampled_from(_TOKENS) | st.binary(max_size=4)) + wire[at:]
    else:
        wire = wire[:at] + wire[at + draw(st.integers(1, 8)) :]
    return wire, closes, None


@given(answer=answers())
def test_any_answer_ends_with_its_body_or_a_typed_error_within_the_bound(
    answer: tuple[bytes, bool, bytes | None],
) -> None:
    wire, closes, body = answer
    outcome = _outcome([wire, None] if closes else [wire])
    if body is not None:
        assert outcome == (200, body)
        return
    if isinstance(outcome, tuple):
        # A body the client gives is the answer as h11 reads the same bytes too: a
        # mutation may leave an answer valid, but never turns it into another one.
        event("a mutated answer still read")
        assert outcome == _h11(wire, closes)
    else:
        event(f"refused: {outcome.__name__}")


def test_the_answers_strategy_reaches_valid_refused_and_still_read_answers() -> None:
    # Measured over the strategy: each kind of outcome is a real share of the examples.
    kinds: list[str] = []

    @settings(max_examples=400)
    @given(answer=answers())
    def run(answer: tuple[bytes, bool, bytes | None]) -> None:
        wire, closes, body = answer
        if body is not None:
            kinds.append("valid")
        else:
            kinds.append("h11 reads it" if _h11(wire, closes) else "h11 refuses it")

    run()
    for kind in ("valid", "h11 reads it", "h11 refuses it"):
        assert kinds.count(kind) / len(kinds) > 0.05, (kind, kinds.count(kind), len(kinds))
