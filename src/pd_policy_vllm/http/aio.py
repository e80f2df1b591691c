"""``aiohttp``, which the proxy, its relay and its CLI run on: the ``http`` extra.

They import it from here, so that a missing extra is one ``ModuleNotFoundError``
that names the extra to install, whichever of them is imported first. The
request-shaping modules never import it.
"""

from __future__ import annotations

try:
    import aiohttp
    from aiohttp import web
    from aiohttp.log import access_logger
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        f"the pd-policy proxy needs the http extra ({exc.name} is missing): "
        "pip install 'pd-policy[http]'",
        name=exc.name,
    ) from exc

__all__ = ["access_logger", "aiohttp", "web"]
