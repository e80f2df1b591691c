"""The proxy's client for its legs: its parser fed byte by byte (no socket), then real
servers: aiohttp's, for keep-alive, and raw sockets for the faults a real server will
not show on demand."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import itertools
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, note
from hypothesis import strategies as st
from multidict import CIMultiDict

from pd_policy_vllm.http.upstream import (
    Upstream,
    UpstreamDisconnected,
    UpstreamProtocolError,
    UpstreamUnreachable,
)
from pd_policy_vllm.http.upstream.connection import Connection

# --- the parser, fed by hand -------------------------------------------------------


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def _chunked(body: bytes, sizes: list[int], extension: bool, trailer: bool) -> bytes:
    out, at = bytearray(), 0
    for size in sizes:
        piece = body[at : at + size]
        if not piece:
            break
        at += len(piece)
        out += f"{len(piece):x}{';x=1' if extension else ''}\r\n".encode() + piece + b"\r\n"
    if at < len(body):
        out += f"{len(body) - at:X}\r\n".encode() + body[at:] + b"\r\n"
    return bytes(out + b"0\r\n" + (b"X-T: 1\r\n" if trailer else b"") + b"\r\n")


def _split(wire: bytes, cuts: list[int], from_end: tuple[int, ...] | list[int] = ()) -> list[bytes]:
    # Cuts near the end too: a body's last byte alone is where an off-by-one hides.
    ends = {max(len(wire) - k, 0) for k in from_end}
    points = sorted({c % (len(wire) + 1) for c in cuts} | ends | {0, len(wire)})
    return [wire[a:b] for a, b in itertools.pairwise(points)]


async def _fed(pieces: list[bytes], *, close: bool = False) -> tuple[int, bytes, bool]:
    connection = Connection()
    connection.connection_made(_Transport())
    connection.request(b"POST / HTTP/1.1\r\n\r\n", [b"{}"])
    for piece in pieces:
        connection.data_received(piece)
    if close:
        connection.connection_lost(None)
    # Nothing more will arrive: a parser that still waits is wrong, and must not hang.
    head = await asyncio.wait_for(connection.head(), 0.5)
    return head.status, await asyncio.wait_for(connection.read_all(), 0.5), connection.reusable


framings = st.sampled_from(["length", "chunked", "until-close"])


@given(body=st.binary(max_size=300), framing=framings,
       sizes=st.lists(st.integers(1, 40), max_size=12), cuts=st.lists(st.integers(0, 10**4)),
       from_end=st.lists(st.integers(1, 9), max_size=3), extension=st.booleans(),
       trailer=st.booleans())  # fmt: skip
def test_any_split_of_any_framing_reads_back_the_body(
    body: bytes, framing: str, sizes: list[int], cuts: list[int], from_end: list[int],
    extension: bool, trailer: bool,
) -> None:  # fmt: skip
    if framing == "chunked":
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        wire = head + _chunked(body, sizes, extension, trailer)
    elif framing == "length":
        wire = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    else:
        wire = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
    pieces = _split(wire, cuts, from_end)
    note(f"{len(pieces)} pieces")
    status, read, reusable = asyncio.run(_fed(pieces, close=framing == "until-close"))
    assert (status, read) == (200, body)
    # Only a framed body leaves the connection fit to carry the next request.
    assert reusable is (framing != "until-close")


def test_the_split_strategy_cuts_heads_and_chunk_lines_apart() -> None:
    # Measured over the same strategy: most examples are cut into several pieces.
    counts: list[int] = []

    @given(cuts=st.lists(st.integers(0, 10**4)))
    def run(cuts: list[int]) -> None:
        counts.append(len(_split(b"x" * 60, cuts)))

    run()
    assert sum(c >= 3 for c in counts) / len(counts) > 0.5


@pytest.mark.parametrize("wire", [
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
])  # fmt: skip
def test_a_response_that_is_not_http_1_1_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        asyncio.run(_fed([wire]))


@pytest.mark.parametrize("wire", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\nextra",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 200 OK\r\n",
])  # fmt: skip
def test_bytes_after_a_whole_answer_keep_the_answer_and_retire_the_connection(wire: bytes) -> None:
    # The answer is what its framing says; what follows is no answer to any request.
    assert asyncio.run(_fed([wire])) == (200, b"a", False)


def test_a_204_has_no_body_whatever_its_headers_say() -> None:
    wire = b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert asyncio.run(_fed([wire])) == (204, b"", True)


@pytest.mark.parametrize("wire", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    b"HTTP/1.1 200 OK\r\nContent-Le",
])  # fmt: skip
def test_a_connection_lost_before_the_end_is_a_disconnect(wire: bytes) -> None:
    with pytest.raises(UpstreamDisconnected):
        asyncio.run(_fed([wire], close=True))


@pytest.mark.parametrize(("header", "reusable"), [
    (b"Connection: close\r\n", False), (b"Connection: keep-alive\r\n", True), (b"", True),
])  # fmt: skip
def test_a_connection_is_reused_unless_the_server_asks_to_close_it(
    header: bytes, reusable: bool
) -> None:
    wire = b"HTTP/1.1 200 OK\r\n" + header + b"Content-Length: 2\r\n\r\nok"
    assert asyncio.run(_fed([wire])) == (200, b"ok", reusable)


def test_http_1_0_closes_unless_kept_alive() -> None:
    plain = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    other = b"HTTP/1.0 200 OK\r\nConnection: TE\r\nContent-Length: 2\r\n\r\nok"
    kept = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok"
    assert asyncio.run(_fed([plain]))[2] is False
    assert asyncio.run(_fed([other]))[2] is False
    assert asyncio.run(_fed([kept]))[2] is True


# --- real servers ------------------------------------------------------------------


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


async def _site(app: web.Application, host: str = "127.0.0.1") -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    addresses = runner.addresses
    return runner, int(addresses[0][1])


def _echo_app(peers: list[Any], seen: list[CIMultiDict[str]]) -> web.Application:
    async def echo(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        seen.append(CIMultiDict(request.headers))
        body = await request.read()
        if request.query.get("stream"):
            out = web.StreamResponse()
            await out.prepare(request)
            for i in range(0, len(body), 7):
                await out.write(body[i : i + 7])
            await out.write_eof()
            return out
        headers = {"Connection": "close"} if request.query.get("close") else None
        return web.Response(body=body, headers=headers)

    app = web.Application()
    app.router.add_post("/echo", echo)
    return app


def test_legs_to_a_real_server_share_a_kept_alive_connection_unless_it_closes() -> None:
    async def test() -> None:
        peers: list[Any] = []
        runner, port = await _site(_echo_app(peers, []))
        upstream = Upstream()
        try:
            url = f"http://127.0.0.1:{port}/echo"
            for query, body in (("", b"one"), ("?stream=1", b"two, chunked" * 5), ("", b"3")):
                async with await upstream.post(url + query, [body[:2], body[2:]], {}) as r:
                    assert (r.status, await r.read()) == (200, body)
            async with await upstream.post(url + "?close=1", b"4", {}) as r:
                assert await r.read() == b"4"
            async with await upstream.post(url, b"5", {}) as r:
                assert await r.read() == b"5"
        finally:
            upstream.close()
            await runner.cleanup()
        assert len(set(peers[:4])) == 1  # one connection, until the server closed it
        assert peers[4] != peers[3]

    _run(test)


def test_a_streamed_answer_is_read_piece_by_piece_as_it_arrives() -> None:
    async def test() -> None:
        runner, port = await _site(_echo_app([], []))
        upstream = Upstream()
        try:
            body = bytes(range(100))
            async with await upstream.post(f"http://127.0.0.1:{port}/echo?stream=1", body, {}) as r:
                pieces = [piece async for piece in r]
        finally:
            upstream.close()
            await runner.cleanup()
        assert b"".join(pieces) == body and len(pieces) > 1

    _run(test)


def test_credentials_in_the_url_are_basic_auth_and_replace_the_workers_key() -> None:
    async def test() -> None:
        seen: list[CIMultiDict[str]] = []
        runner, port = await _site(_echo_app([], seen))
        observed: list[tuple[str, bytes]] = []
        upstream = Upstream([lambda url, body: observed.append((url, body))])
        try:
            headers = {"Authorization": "Bearer key", "X-Request-Id": "r"}
            url = f"http://us%40r:p%3Ass@127.0.0.1:{port}/echo"
            async with await upstream.post(url, [b"a", b"b"], headers) as r:
                await r.read()
            async with await upstream.post(f"http://127.0.0.1:{port}/echo", b"c", headers) as r:
                await r.read()
        finally:
            upstream.close()
            await runner.cleanup()
        assert seen[0]["Authorization"] == "Basic " + base64.b64encode(b"us@r:p:ss").decode()
        assert seen[1]["Authorization"] == "Bearer key"
        assert seen[0]["X-Request-Id"] == "r" and seen[0]["Host"] == f"127.0.0.1:{port}"
        assert observed == [(url, b"ab"), (f"http://127.0.0.1:{port}/echo", b"c")]

    _run(test)


def test_a_header_goes_on_as_the_bytes_it_came_in_and_a_line_break_is_refused() -> None:
    async def test() -> None:
        seen: list[CIMultiDict[str]] = []
        runner, port = await _site(_echo_app([], seen))
        upstream = Upstream()
        # How aiohttp's server hands on a request id of non-UTF-8 bytes.
        request_id = b"r\xe9-\xff".decode("utf-8", "surrogateescape")
        try:
            url = f"http://127.0.0.1:{port}/echo"
            async with await upstream.post(url, b"x", {"X-Request-Id": request_id}) as r:
                assert await r.read() == b"x"
            with pytest.raises(ValueError, match="line break"):
                await upstream.post(url, b"x", {"X-Request-Id": "a\r\nX-Injected: 1"})
        finally:
            upstream.close()
            await runner.cleanup()
        assert seen[0]["X-Request-Id"] == request_id and len(seen) == 1

    _run(test)


def test_an_ipv6_literal_url_reaches_its_worker() -> None:
    async def test() -> None:
        seen: list[CIMultiDict[str]] = []
        runner, port = await _site(_echo_app([], seen), host="::1")
        upstream = Upstream()
        try:
            async with await upstream.post(f"http://[::1]:{port}/echo", b"v6", {}) as r:
                assert await r.read() == b"v6"
        finally:
            upstream.close()
            await runner.cleanup()
        assert seen[0]["Host"] == f"[::1]:{port}"

    _run(test)


def test_a_worker_that_is_not_listening_is_unreachable_not_disconnected() -> None:
    async def test() -> None:
        upstream = Upstream()
        # A port bound and held, never listened on: refused, and no one else's meanwhile.
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{held.getsockname()[1]}/x"
            with pytest.raises(UpstreamUnreachable) as caught:
                await upstream.post(url, b"", {})
        assert isinstance(caught.value, aiohttp.ClientConnectionError)
        assert not isinstance(caught.value, aiohttp.ServerDisconnectedError)
        assert "127.0.0.1" not in str(caught.value)  # a URL may carry credentials
        upstream.close()
        with pytest.raises(UpstreamUnreachable):
            await upstream.post("http://127.0.0.1:1/x", b"", {})

    _run(test)


def test_a_url_that_is_not_http_is_unreachable_and_not_quoted() -> None:
    async def test() -> None:
        for url in ("ftp://key@127.0.0.1/x", "127.0.0.1:8000", "http:///x"):
            with pytest.raises(UpstreamUnreachable, match="http") as caught:
                await Upstream().post(url, b"", {})
            assert "127.0.0.1" not in str(caught.value) and "key" not in str(caught.value)

    _run(test)


async def _raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]],
) -> tuple[asyncio.Server, int]:
    count = 0

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        try:
            await handle(reader, writer, count)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


def test_a_reused_connection_the_worker_closes_unanswered_is_retried_once_on_a_new_one() -> None:
    async def test() -> None:
        requests: list[tuple[int, bytes]] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         n: int) -> None:  # fmt: skip
            while True:
                body = await _read_request(reader)
                requests.append((n, body))
                if n == 1 and len(requests) == 2:
                    return  # closes the kept-alive connection without an answer
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()

        server, port = await _raw_server(handle)
        upstream = Upstream()
        try:
            for body in (b"first", b"second"):
                async with await upstream.post(f"http://127.0.0.1:{port}/", body, {}) as r:
                    assert await r.read() == body
            # The retried leg's connection is the one kept alive now.
            server.close()
            async with await upstream.post(f"http://127.0.0.1:{port}/", b"third", {}) as r:
                assert await r.read() == b"third"
        finally:
            upstream.close()
        assert requests == [(1, b"first"), (1, b"second"), (2, b"second"), (2, b"third")]

    _run(test)


@pytest.mark.parametrize("answer", [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],
                         ids=["unanswered", "mid-answer"])  # fmt: skip
def test_a_new_connection_the_worker_drops_is_a_disconnect_and_is_never_retried(
    answer: bytes,
) -> None:
    # The worker read the request on a connection made for it: it may have run it.
    async def test() -> None:
        calls = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         n: int) -> None:  # fmt: skip
            nonlocal calls
            await _read_request(reader)
            calls += 1
            writer.write(answer)
            await writer.drain()

        server, port = await _raw_server(handle)
        upstream = Upstream()
        try:
            with pytest.raises(UpstreamDisconnected):
                async with await upstream.post(f"http://127.0.0.1:{port}/", b"x", {}) as r:
                    await r.read()
        finally:
            upstream.close()
            server.close()
        assert calls == 1

    _run(test)


def test_leaving_an_answer_unread_closes_its_connection() -> None:
    # A client that went away: the worker sees its connection closed (vLLM then aborts).
    async def test() -> None:
        eof = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         n: int) -> None:  # fmt: skip
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
            await writer.drain()
            if not await reader.read(1):
                eof.set()

        server, port = await _raw_server(handle)
        upstream = Upstream()

        async def leave_early() -> None:
            async with await upstream.post(f"http://127.0.0.1:{port}/", b"x", {}) as r:
                assert await r.__anext__() == b"a"
                await asyncio.sleep(30)

        task = asyncio.ensure_future(leave_early())
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.wait_for(eof.wait(), 5)
        upstream.close()
        server.close()

    _run(test)


def _certificate(directory: Path) -> tuple[Path, Path]:
    # A self-signed certificate for 127.0.0.1, made here: no network, no openssl binary.
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pd-policy test worker")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert, private = directory / "cert.pem", directory / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    return cert, private


def test_an_https_worker_is_called_over_tls_and_its_certificate_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _certificate(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def call(trusted: bool) -> bytes:
        app = _echo_app([], [])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=served).start()
        port = int(runner.addresses[0][1])
        if trusted:  # the system's trust, with this worker's certificate as its store
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        upstream = Upstream()
        try:
            async with await upstream.post(f"https://127.0.0.1:{port}/echo", b"tls", {}) as r:
                return await r.read()
        finally:
            upstream.close()
            await runner.cleanup()

    with pytest.raises(UpstreamUnreachable):  # an untrusted certificate: no leg is sent
        asyncio.run(call(trusted=False))
    assert asyncio.run(call(trusted=True)) == b"tls"
