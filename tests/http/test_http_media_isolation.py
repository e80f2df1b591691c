"""Each media fetch stands alone: nothing one tenant's fetch left behind goes out on
another's, and no credential goes out at all.

The attack: a media host sets a session cookie on tenant A's fetch (a host A logged in
to, or one that tags whoever fetches); the proxy's one media session kept it in its
cookie jar and sent it on tenant B's next fetch from that host, so B's request was
served as A (A's private image), and the host learned that A and B share a proxy. So
the media session keeps no cookie, reads no credential from the environment or a
``.netrc``, and keeps no connection from one fetch to the next; a URL carrying
credentials (``http://user:pass@host/``) is refused, before any connection. Against a
real aiohttp media host on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
from media_stands import Served, chat, media_proxy, post

from pd_policy import MediaFetchRules, MediaRefused, Modality
from pd_policy_vllm.http.media.fetch import PINNED_MEDIA_TYPE, fetch_media
from pd_policy_vllm.http.media.guard import MediaLimits, media_session

RULES = MediaFetchRules(allowed_domains=["localhost"], known=True)
LAB = MediaLimits(allow_private_hosts=True)
#: The session a lab gets (no address guard), and the guarded one, allowing the host alone.
SESSIONS = pytest.mark.parametrize(
    "limits", [LAB, MediaLimits(allow_networks=["127.0.0.1/32"])], ids=["lab", "guarded"]
)


def _image_of(leg: dict[str, object]) -> bytes:
    url = leg["messages"][0]["content"][0]["image_url"]["url"]  # type: ignore[index]
    prefix = f"data:{PINNED_MEDIA_TYPE};base64,"
    assert isinstance(url, str) and url.startswith(prefix)
    return base64.b64decode(url[len(prefix) :])


def test_a_cookie_set_on_one_tenants_fetch_never_goes_out_on_anothers() -> None:
    async def main() -> None:
        async with media_proxy([RULES]) as served:
            status, _ = await post(served.url, chat(served.media + "/set-cookie", salt="a"))
            assert status == 200
            status, _ = await post(served.url, chat(served.media + "/frame", salt="b"), "key-b")
            assert status == 200
            assert [a["path"] for a in served.host.asked] == ["/set-cookie", "/frame"]
            assert [a["cookie"] for a in served.host.asked] == [None, None]
            # B's prefill got B's image, not A's.
            assert _image_of(served.prefills[0].calls[-1]["body"]) == b"frame 1"

    asyncio.run(main())


@SESSIONS
def test_no_cookie_goes_from_one_fetch_to_the_next_on_one_session(limits: MediaLimits) -> None:
    async def main(served: Served) -> None:
        async with media_session(limits) as session:
            for path in ("/set-cookie", "/frame", "/to-frame"):
                await fetch_media(session, served.media + path, Modality.IMAGE, RULES,
                                  param="p", limits=limits)  # fmt: skip
            assert len(session.cookie_jar) == 0
        assert all(a["cookie"] is None for a in served.host.asked)

    _with_host(main)


@SESSIONS
def test_no_connection_is_kept_from_one_fetch_to_the_next(limits: MediaLimits) -> None:
    async def main(served: Served) -> None:
        async with media_session(limits) as session:
            for _ in range(3):
                await fetch_media(session, served.media + "/frame", Modality.IMAGE, RULES,
                                  param="p", limits=limits)  # fmt: skip
        ports = [a["port"] for a in served.host.asked]
        assert len(set(ports)) == 3, ports

    _with_host(main)


@pytest.mark.parametrize("userinfo", ["alice:s3cret@", "alice@", ":s3cret@"])
def test_a_url_carrying_credentials_is_refused_before_any_connection(userinfo: str) -> None:
    async def main() -> None:
        async with media_proxy([RULES]) as served:
            url = served.media.replace("//", "//" + userinfo) + "/frame"
            status, answer = await post(served.url, chat(url))
            assert status == 400 and answer["error"]["code"] == "pd_media_refused"
            assert "alice" not in str(answer) and "s3cret" not in str(answer)
            assert served.host.asked == [] and served.prefills[0].calls == []

    asyncio.run(main())


def test_a_redirect_carrying_credentials_is_refused() -> None:
    async def main(served: Served) -> None:
        async with media_session(LAB) as session:
            with pytest.raises(MediaRefused):
                await fetch_media(session, served.media.replace("//", "//u:p@") + "/frame",
                                  Modality.IMAGE, RULES, param="p", limits=LAB)  # fmt: skip
        assert served.host.asked == []

    _with_host(main)


def test_no_credential_is_read_from_the_environment_or_a_netrc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine localhost login tenant password from-netrc\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HOME", str(tmp_path))

    async def main(served: Served) -> None:
        async with media_session(LAB) as session:
            await fetch_media(session, served.media + "/frame", Modality.IMAGE, RULES,
                              param="p", limits=LAB)  # fmt: skip
        assert [a["authorization"] for a in served.host.asked] == [None]

    _with_host(main)


def _with_host(test: object) -> None:
    async def main() -> None:
        async with media_proxy([RULES]) as served:
            await test(served)  # type: ignore[operator]

    asyncio.run(main())
