"""``pd-policy-proxy``: run the P/D proxy in front of ``vllm serve`` workers.

    pd-policy-proxy --prefill URL --decode URL [--decode URL ...] [--no-mrope | --mrope]
                    [--encode URL]

At start-up it asks each worker for its configuration (``GET /server_info``,
served when the worker runs with ``VLLM_SERVER_DEV_MODE=1``) and takes the
prefill's KV connector and each decode worker's capability from it. For a
worker that does not say, the flags do: ``--kv-mode`` (the prefill's handoff
contract) and ``--decode-capability`` (a decode worker's). Whether the model's
positions are M-RoPE no worker says: ``--mrope`` or ``--no-mrope`` is required
when a decode worker is language-model-only. ``--encode`` adds an encoder-only
worker, for E/P/D. It binds to 127.0.0.1 by default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs

from pd_policy import (
    EncoderCacheRole,
    InvalidConfiguration,
    KvConnectorMode,
    MediaFetchRules,
    PrefillKv,
    Support,
    WorkerCapability,
)

from .aio import access_logger, aiohttp, web
from .identity import WorkerMedia
from .pin import RemoteMedia
from .proxy import Proxy
from .scale_out import DERENDER, GENERATE, RENDER
from .workers import HttpWorker, capability_from_config, media_from_config, prefill_kv_from_config

__all__ = ["main", "parser", "read_encoder", "read_workers"]

logger = logging.getLogger("pd_policy_vllm.http")

_CAPABILITIES = {
    "vision": WorkerCapability(Support.TRUE),
    "lm-only": WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.FALSE),
    "lm-only+metadata": WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE),
}


async def _server_info(session: aiohttp.ClientSession, url: str, deadline: float) -> Any:
    """The worker's ``/server_info`` (``None`` when it does not serve it), once it is up:
    its ``vllm_config`` and its ``vllm_env``."""
    while True:
        try:
            async with session.get(f"{url}/server_info", params={"config_format": "json"}) as r:
                if r.status != 200:
                    return None
                info = await r.json()
                return info if isinstance(info, dict) else None
        except aiohttp.ClientConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def _scale_out(session: aiohttp.ClientSession, url: str, route: str) -> bool:
    """Whether the worker serves vLLM's scale-out ``route``: without --enable-scale-out it
    answers every such route 403, and a server without the route 404; with it, an
    empty body is a validation error (400 or 422)."""
    async with session.post(url + route, json={}) as response:
        return response.status in (400, 422)


async def read_workers(args: argparse.Namespace) -> tuple[HttpWorker, list[HttpWorker]]:
    """The prefill and decode workers, as their servers describe them or the flags say.

    A decode worker takes M-RoPE metadata only when its configuration (or the flag)
    says so and both it and the prefill serve vLLM's scale-out routes, which the
    metadata path takes. Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] when
    neither says what the proxy needs: the prefill's KV connector, or (with a
    language-model-only decode worker) whether the model uses M-RoPE.
    """
    deadline = time.monotonic() + args.startup_timeout
    async with aiohttp.ClientSession() as session:
        prefill_info = await _server_info(session, args.prefill, deadline)
        decode_configs = [_config(await _server_info(session, u, deadline)) for u in args.decode]
        renders = await _scale_out(session, args.prefill, RENDER)
        derenders = [await _scale_out(session, url, DERENDER) for url in args.decode]
    mode = KvConnectorMode(args.kv_mode) if args.kv_mode else None
    prefill_config = _config(prefill_info)
    if prefill_config is not None:
        kv = prefill_kv_from_config(
            prefill_config, args.prefill, mode=mode, bootstrap_port=args.bootstrap_port
        )
    elif mode is None:
        raise InvalidConfiguration(
            "the prefill worker does not describe its KV connector (run it with "
            "VLLM_SERVER_DEV_MODE=1): pass --kv-mode",
            param="kv_mode",
        )
    else:
        host = args.prefill.split("//")[-1].split(":")[0]
        kv = PrefillKv(mode, bootstrap_host=host, bootstrap_port=args.bootstrap_port or 8998)
    decode = []
    for url, config, derender in zip(args.decode, decode_configs, derenders, strict=True):
        if config is not None:
            capability = capability_from_config(config)
        elif args.decode_capability:
            capability = _CAPABILITIES[args.decode_capability]
        else:
            logger.warning("%s does not describe itself: its capability is unknown", url)
            capability = WorkerCapability()
        if capability.takes_mm_metadata and not (renders and derender):
            logger.warning(
                "%s takes M-RoPE metadata, but the metadata path needs --enable-scale-out on "
                "it and on the prefill: it is served as language-model-only without it",
                url,
            )
            capability = attrs.evolve(capability, accepts_mm_metadata=Support.FALSE)
        decode.append(HttpWorker(url, capability, renders=derender))
    own = (
        capability_from_config(prefill_config) if prefill_config is not None else WorkerCapability()
    )
    media = WorkerMedia()
    if prefill_config is not None:
        media = media_from_config(prefill_config, prefill_info.get("vllm_env"))
    elif args.allowed_media_domains is not None:
        # The operator states the worker's rules: an empty list is vLLM's "any host".
        media = WorkerMedia(MediaFetchRules(allowed_domains=args.allowed_media_domains, known=True))
    return HttpWorker(args.prefill, own, kv=kv, renders=renders, media=media), decode


def _config(info: Any) -> Any:
    return info.get("vllm_config") if isinstance(info, dict) else None


async def read_encoder(args: argparse.Namespace, prefill: HttpWorker) -> HttpWorker | None:
    """The encoder-only worker of ``--encode``, for E/P/D; ``None`` without the flag.

    Its role comes from its server (``ec_transfer_config``) or, when it does not say,
    from the flag. Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration]
    when the encoder says it is not encoder-only, when it does not serve the render
    route, when the prefill worker does not serve the generate route, or when the
    prefill says it does not consume the encoder cache: a prefill that misses its
    cache kills its engine.
    """
    if not args.encode:
        return None
    deadline = time.monotonic() + args.startup_timeout
    async with aiohttp.ClientSession() as session:
        config = _config(await _server_info(session, args.encode, deadline))
        renders = await _scale_out(session, args.encode, RENDER)
        generates = await _scale_out(session, prefill.url, GENERATE)
    producer = EncoderCacheRole.PRODUCER
    capability = capability_from_config(config) if config is not None else WorkerCapability()
    if capability.encoder_cache is EncoderCacheRole.UNKNOWN:
        capability = attrs.evolve(capability, encoder_cache=producer)  # the flag says
    problems = {
        "encode": capability.encoder_cache is not producer or not renders,
        "prefill": prefill.capability.encoder_cache
        not in (EncoderCacheRole.CONSUMER, EncoderCacheRole.UNKNOWN)
        or not generates,
    }
    for param, bad in problems.items():
        if bad:
            raise InvalidConfiguration(
                "E/P/D needs an encoder-only worker (ec_producer) serving --enable-scale-out "
                "and a prefill worker that consumes its cache (ec_consumer) serving it too",
                param=param,
            )
    return HttpWorker(args.encode, capability, renders=True)


def parser() -> argparse.ArgumentParser:
    """The command line of ``pd-policy-proxy`` (what its flags mean, and their defaults)."""
    cli = argparse.ArgumentParser(prog="pd-policy-proxy", description=__doc__.splitlines()[0])
    cli.add_argument("--prefill", required=True, help="the prefill worker's base URL")
    cli.add_argument(
        "--decode", required=True, action="append", help="a decode worker's base URL (repeat)"
    )
    cli.add_argument(
        "--encode",
        help="an encoder-only worker's base URL (vLLM's ec_producer): runs E/P/D for media",
    )
    cli.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    cli.add_argument("--port", type=int, default=8000, help="port to bind (8000)")
    mrope = cli.add_mutually_exclusive_group()
    mrope.add_argument("--mrope", action="store_true", default=None, help="the model uses M-RoPE")
    mrope.add_argument("--no-mrope", dest="mrope", action="store_false", help="it does not")
    cli.add_argument(
        "--kv-mode",
        choices=[m.value for m in KvConnectorMode],
        help="the prefill's handoff contract, when its server does not say (or to override)",
    )
    cli.add_argument("--bootstrap-port", type=int, help="the Mooncake bootstrap port (8998)")
    cli.add_argument(
        "--decode-capability",
        choices=sorted(_CAPABILITIES),
        help="the capability of a decode worker that does not describe itself",
    )
    cli.add_argument(
        "--remote-media",
        choices=[m.value for m in RemoteMedia],
        help="what to do with a remote media URL: fetch it once for every leg (the default "
        "when the prefill describes its media rules), leave it uncached (the default "
        "otherwise), or refuse it",
    )
    cli.add_argument(
        "--allowed-media-domains",
        nargs="*",
        metavar="HOST",
        help="the prefill worker's --allowed-media-domains, when its server does not say "
        "(none: any host); with it the proxy may fetch remote media for the worker",
    )
    cli.add_argument(
        "--startup-timeout", type=float, default=120.0, help="seconds to wait for the workers"
    )
    cli.add_argument(
        "--no-access-log", dest="access_log", action="store_false", help="log no requests"
    )
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy until interrupted. Exit status 2 for a configuration it cannot serve."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    try:
        prefill, decode = asyncio.run(read_workers(args))
        encoder = asyncio.run(read_encoder(args, prefill))
        lm_only = any(w.capability.language_model_only for w in decode)
        remote = RemoteMedia(args.remote_media) if args.remote_media else None
        if remote is RemoteMedia.FETCH and not prefill.media.rules.known:
            raise InvalidConfiguration(
                "--remote-media fetch needs the prefill worker's media rules: run it with "
                "VLLM_SERVER_DEV_MODE=1, or pass --allowed-media-domains",
                param="remote_media",
            )
        if args.mrope is None and lm_only:
            raise InvalidConfiguration(
                "a decode worker is language-model-only and no worker says whether the model "
                "uses M-RoPE: pass --mrope or --no-mrope",
                param="mrope",
            )
    except (InvalidConfiguration, aiohttp.ClientError) as exc:
        print(f"pd-policy-proxy: {exc}", file=sys.stderr)
        return 2
    for worker in decode:
        logger.info("decode %s: %s", worker.url, worker.capability)
    logger.info("prefill %s: %s", prefill.url, prefill.kv.mode.value)
    if encoder is not None:
        logger.info("encode %s: E/P/D for requests with media", encoder.url)
    proxy = Proxy(prefill, decode, mrope=bool(args.mrope), encoder=encoder, remote_media=remote)
    logger.info("remote media: %s", proxy.remote_media.value)
    web.run_app(
        proxy.app(),
        host=args.host,
        port=args.port,
        print=None,
        handler_cancellation=True,
        access_log=access_logger if args.access_log else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
