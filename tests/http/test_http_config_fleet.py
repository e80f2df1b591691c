"""A fleet the configuration file describes, over stand-ins that do not describe
themselves (no ``/server_info``: vLLM without development mode), and a decode nothing
describes, which gets no media."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from fleet_stands import Stand, serving
from test_http_fleet import chat, post

from pd_policy import EncoderCacheRole, InvalidConfiguration, KvConnectorMode, Support
from pd_policy_vllm.http.cli import configuration, probe_of, read_fleet
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.proxy import Proxy


@contextlib.asynccontextmanager
async def proxy_of(argv: list[str], toml: str = "", tmp: Path | None = None) -> AsyncIterator[
    tuple[str, Fleet]
]:  # fmt: skip
    """The proxy as ``pd-policy-proxy`` would start with ``argv`` and the file ``toml``."""
    if toml:
        assert tmp is not None
        path = tmp / "proxy.toml"
        path.write_text(toml)
        argv = [*argv, "--config", str(path)]
    args, _ = configuration(argv, {})
    fleet = await read_fleet(args)
    async with serving(Proxy(fleet=fleet, mrope=False).app()) as url:
        yield url, fleet


def _images_in(stand: Stand) -> int:
    """How many of the calls ``stand`` received carried an image."""
    return sum("image_url" in str(call["body"]) for call in stand.calls)


def test_an_undescribed_decode_is_taken_as_language_model_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    decode = Stand("d", describes=False)

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            prefill.url, decode.url = p, d
            argv = ["--prefill", p, "--decode", d, "--kv-mode", "nixl", "--no-mrope"]
            with caplog.at_level(logging.WARNING):
                async with proxy_of(argv) as (url, fleet):
                    (member,) = fleet.of("decode")
                    assert member.worker.capability.supports_vision is Support.FALSE
                    status, answer, _ = await post(url, chat(1))
                    assert status == 200, answer
                    refused, error, _ = await post(url, {**chat(2), "n": 2})
                    assert refused == 400, error  # the carve-out of an LM-only decode

    asyncio.run(main())
    assert len(decode.calls) == 1 and _images_in(decode) == 0  # never an image
    leg = decode.calls[0]["body"]
    assert leg["cache_salt"]  # the image's content hash, folded
    assert "image_url" in str(prefill.calls[0]["body"])  # the prefill had it
    assert any("taken as language-model-only" in r.getMessage() for r in caplog.records)


def test_a_decode_the_operator_calls_vision_still_gets_the_image() -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    decode = Stand("d", describes=False)

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            argv = ["--prefill", p, "--decode", d, "--kv-mode", "nixl", "--no-mrope",
                    "--decode-capability", "vision"]  # fmt: skip
            async with proxy_of(argv) as (url, fleet):
                (member,) = fleet.of("decode")
                assert member.worker.capability.supports_vision is Support.TRUE
                status, answer, _ = await post(url, chat(1))
                assert status == 200, answer

    asyncio.run(main())
    assert _images_in(decode) == 1


FILE = """
mrope = false

[[workers]]
url = "{p}"
role = "prefill"
kv_transfer_config = {{ kv_connector = "NixlConnector", kv_role = "kv_producer" }}
kv_events_config = {{ enable_kv_cache_events = true, publisher = "zmq", endpoint = "tcp://*:5557" }}
block_size = 16
labels = {{ zone = "a" }}

[[workers]]
url = "{blind}"
role = "decode"
capability = "lm-only"
kv_transfer_config = {{ kv_connector = "NixlConnector", kv_load_failure_policy = "recompute" }}

[[workers]]
url = "{d}"
role = "decode"
capability = "lm-only"
kv_transfer_config = {{ kv_connector = "NixlConnector", kv_role = "kv_consumer" }}
"""


def test_a_fleet_from_the_file_alone_with_no_worker_in_development_mode(tmp_path: Path) -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    blind, decode = Stand("blind", describes=False), Stand("d", describes=False)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            urls = [await stack.enter_async_context(serving(s.app()))
                    for s in (prefill, blind, decode)]  # fmt: skip
            toml = FILE.format(p=urls[0], blind=urls[1], d=urls[2])
            async with proxy_of([], toml, tmp_path) as (url, fleet):
                (p,) = fleet.of("prefill")
                assert p.worker.kv.mode is KvConnectorMode.NIXL  # from its kv_transfer_config
                events = p.worker.kv_events
                assert events is not None and events.endpoint == "tcp://127.0.0.1:5557"
                assert events.block_size == 16
                answers = await asyncio.gather(*(post(url, chat(i)) for i in range(4)))
                assert [status for status, _, _ in answers] == [200] * 4
                text = await asyncio.gather(*(post(url, chat(i, image=False)) for i in range(4)))
                assert [status for status, _, _ in text] == [200] * 4

    asyncio.run(main())
    # The decode that recomputes a failed load never gets a stripped image leg: the four
    # image requests went to the other; text may go to either.
    assert len(blind.calls) + len(decode.calls) == 8
    assert _images_in(decode) == 0
    salted = [c for c in decode.calls if c["body"].get("cache_salt")]  # the images' legs
    assert len(salted) == 4 and not any(c["body"].get("cache_salt") for c in blind.calls)


def test_a_worker_the_file_describes_is_described_so_again_when_it_comes_back(
    tmp_path: Path,
) -> None:
    # A prefill that comes back after an ejection is described anew: by its own table of
    # the file, not by the flags, which say nothing of its connector.
    prefill, decode = Stand("p", lm_only=False, describes=False), Stand("d", describes=False)

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            path = tmp_path / "proxy.toml"
            path.write_text(
                FILE.split("[[workers]]")[0]
                + "[[workers]]"
                + FILE.split("[[workers]]")[1].format(p=p)
                + f'[[workers]]\nurl = "{d}"\nrole = "decode"\n'
            )
            args, _ = configuration(["--config", str(path)], {})
            fleet = await read_fleet(args)
            (member,) = fleet.of("prefill")
            probe = probe_of(args)
            async with aiohttp.ClientSession() as session:
                again = await describe(session, p, "prefill", probe.says_of(member))
                assert again.kv.mode is KvConnectorMode.NIXL and again.kv_events is not None
                with pytest.raises(InvalidConfiguration, match="kv_transfer_config"):
                    await describe(session, p, "prefill", probe.says)  # the flags alone

    asyncio.run(main())


def test_the_file_states_an_e_p_d_workers_encoder_cache_role(tmp_path: Path) -> None:
    # What /server_info's ec_transfer_config says in development mode, the file says: an
    # encoder that produces the cache, a prefill that consumes it (and one that does not,
    # which the E/P/D check then refuses).
    stands = [Stand(name, lm_only=False, describes=False) for name in ("e", "p", "q")]

    async def main() -> list[EncoderCacheRole]:
        async with contextlib.AsyncExitStack() as stack:
            urls = [await stack.enter_async_context(serving(s.app())) for s in stands]
            path = tmp_path / "proxy.toml"
            ec = 'ec_connector = "ECExampleConnector"'
            path.write_text(
                f"mrope = false\n"
                f'[[workers]]\nurl = "{urls[0]}"\nrole = "encode"\n'
                f'ec_transfer_config = {{ ec_role = "ec_producer", {ec} }}\n'
                f'[[workers]]\nurl = "{urls[1]}"\nrole = "prefill"\nkv_mode = "nixl"\n'
                f'ec_transfer_config = {{ ec_role = "ec_consumer", {ec} }}\n'
                f'[[workers]]\nurl = "{urls[2]}"\nrole = "prefill"\nkv_mode = "nixl"\n'
                f'[[workers]]\nurl = "{urls[1]}"\nrole = "decode"\n'
            )
            args, _ = configuration(["--config", str(path)], {})
            async with aiohttp.ClientSession() as session:
                return [
                    (
                        await describe(session, e.url, e.role, e.says(OperatorSays()))
                    ).capability.encoder_cache
                    for e in args.workers[:3]
                ]

    roles = asyncio.run(main())
    assert roles == [EncoderCacheRole.PRODUCER, EncoderCacheRole.CONSUMER, EncoderCacheRole.UNKNOWN]
