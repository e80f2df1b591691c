"""Break the code on purpose, one mutation at a time, and check that the tests guarding it fail.

Each mutant is a textual edit of one source file (swap two checks, drop a field, drop a
guard), applied to a copy of ``src/`` that is put first on ``PYTHONPATH``; the tests
that claim to guard the rule then run against it. A mutant that no test kills is a rule
the suite does not prove. The tests run under the CI profile, with a fixed seed so that a
verdict can be reproduced. Run with ``make mutants`` (about five minutes); it prints a
table and exits 1 if any mutant survives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final, NamedTuple

ROOT: Final = Path(__file__).resolve().parent.parent


class Mutant(NamedTuple):
    name: str
    path: str  # under src/
    old: str
    new: str
    tests: tuple[str, ...]  # what must fail


PROPERTIES: Final = ("tests/test_properties.py", "tests/test_rules.py")
_EXCHANGE: Final = ("tests/test_exchange_properties.py", "tests/test_exchange_reach.py")
_HOSTILE: Final = (
    "tests/http/test_http_upstream_hostile.py",
    "tests/http/test_http_hostile_worker.py",
)
_ROUTER_FIELDS: Final = ("tests/http/test_http_router_fields.py",)
_SECRETS: Final = ("tests/http/test_http_relayed_secrets.py",)
#: Hostile JSON: parsed (both paths), and through a live proxy.
_JSON: Final = ("tests/http/test_http_strict_json.py", "tests/http/test_http_malformed_bodies.py")
_FLOW: Final = ("tests/http/test_http_stream_backpressure.py",)
_CANCEL: Final = ("tests/http/test_http_upstream_cancel.py",)
_GATE: Final = ("tests/http/test_http_client_gate.py", "tests/http/test_http_front_door.py")
_PARTS: Final = ("tests/http/test_http_content_parts.py",)
_LAYOUT: Final = ("tests/test_import_graph.py", "tests/test_vendoring.py")
#: The choice of a worker, and through a roster and a placement.
_CHOICE: Final = ("tests/test_balance.py", "tests/test_roster.py", "tests/test_placement.py")
#: The KV wires: the core's table and selection, and the proxy over described stand-ins.
_WIRES_CORE: Final = ("tests/test_connectors.py", "tests/test_selection.py")
_WIRES_HTTP: Final = ("tests/http/test_http_wires.py",)
#: The proxy's configuration: its precedence and its errors, the fleet it describes, and
#: the proxy's life (readiness, the drain) against a real process and real signals.
_CONFIG: Final = ("tests/http/test_http_config.py",)
_CONFIG_FLEET: Final = ("tests/http/test_http_config_fleet.py",)
_LIFECYCLE: Final = ("tests/http/test_http_lifecycle.py",)
#: Render once: the plan's choice, and through the proxy over KV stand-ins.
_RENDER_ONCE: Final = (
    "tests/http/test_http_render_once.py",
    "tests/http/test_http_render_once_proxy.py",
)
#: A failed transfer: the prefill's lease, in the core and through the proxy, and a stream's
#: head held until the decode says whether its leg started.
_LEASE: Final = ("tests/test_kv_lease.py",)
_FAILED_TRANSFER: Final = ("tests/http/test_http_failed_transfer.py",)
MUTANTS: Final = (
    Mutant(
        "the seed's policy imports a sub-package",
        "pd_policy/decision.py",
        "from .media_errors import MissingMediaIdentity\n",
        "from .media_errors import MissingMediaIdentity\n"
        "from .media import identity as _identity\n",
        _LAYOUT,
    ),
    Mutant(
        "the fleet's rules import the exchange, for types only",
        "pd_policy/fleet/balance.py",
        "from ..errors import MalformedRequest, NoWorkerAvailable\n",
        "from ..errors import MalformedRequest, NoWorkerAvailable\n\n"
        "if False:  # as TYPE_CHECKING: a circle a checker walks, never run\n"
        "    from ..exchange import events as _events\n",
        ("tests/test_import_graph.py",),
    ),
    Mutant(
        "the package's front needs its sub-packages",
        "pd_policy/__init__.py",
        "    if exc.name is None or not exc.name.startswith(_SUBPACKAGES):\n        raise\n",
        "    raise\n",
        ("tests/test_vendoring.py",),
    ),
    Mutant(
        "a request's messages and parts are never counted",
        "pd_policy_vllm/http/parsing.py",
        "            check_parts(count_parts(body, max_parts + 1), max_parts)\n",
        "",
        _PARTS,
    ),
    Mutant(
        "a large body is parsed on the loop",
        "pd_policy_vllm/http/front_door.py",
        "    body = parse() if len(raw) < OFF_THE_LOOP else await asyncio.to_thread(parse)",
        "    body = parse()",
        _PARTS,
    ),
    Mutant(
        "a large body's prefill leg is spliced on the loop",
        "pd_policy_vllm/http/send.py",
        "spliced = splice() if len(raw) < OFF_THE_LOOP else await asyncio.to_thread(splice)",
        "spliced = splice()",
        _PARTS,
    ),
    Mutant(
        "the front door forwards a client's router-owned fields",
        "pd_policy_vllm/http/front_door.py",
        "    dropped = check_client_fields(body)\n",
        "    dropped = ()\n",
        _ROUTER_FIELDS,
    ),
    Mutant(
        "the core lets a client's extension arguments carry the handoff",
        "pd_policy/router_fields.py",
        '        ("vllm_xargs", "kv_transfer_params"),\n        OnClient.REFUSE,',
        '        ("vllm_xargs", "kv_transfer_params"),\n        OnClient.DROP,',
        ("tests/test_router_fields.py", *_ROUTER_FIELDS),
    ),
    Mutant(
        "a prefill leg spliced from the client's bytes keeps the client's request_id",
        "pd_policy_vllm/openai/plan/legs.py",
        'drop = {"stream_options", "min_tokens", *_DROPPED}',
        'drop = {"stream_options", "min_tokens"}',
        _ROUTER_FIELDS,
    ),
    Mutant(
        "the workers see the client's X-Request-Id",
        "pd_policy_vllm/http/driver.py",
        "        request_id = uuid.uuid4().hex\n",
        "        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex\n",
        _ROUTER_FIELDS,
    ),
    Mutant(
        "the exchange retries after the client has seen a byte",
        "pd_policy/exchange/machine.py",
        "if error.retryable and not self.seen and self.attempt < self.attempts:",
        "if error.retryable and self.attempt < self.attempts:",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange sends the decode without checking the handoff",
        "pd_policy/exchange/machine.py",
        "        except MissingKvTransferParams as exc:\n"
        "            return self._fail(exc, None, None)\n",
        "        except MissingKvTransferParams:\n            pass\n",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange blames the prefill for any leg",
        "pd_policy/exchange/machine.py",
        "return self._fail(event.error, self._member(event.leg), event.leg)",
        "return self._fail(event.error, self._member(Leg.PREFILL), event.leg)",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange makes one attempt more than its budget",
        "pd_policy/exchange/machine.py",
        "self.attempt < self.attempts:",
        "self.attempt <= self.attempts:",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange holds a worker's 4xx against its health",
        "pd_policy/exchange/machine.py",
        "error.status >= 500",
        "error.status >= 400",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange renders on the prefill in E/P/D",
        "pd_policy/exchange/machine.py",
        "if (leg is Leg.RENDER and self._encodes) or leg is Leg.ENCODE:",
        "if leg is Leg.ENCODE:",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange keeps a failed attempt's load held",
        "pd_policy/exchange/machine.py",
        "            actions = self._release() + actions\n",
        "            self.placement = None\n",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange tries a failed member again",
        "pd_policy/exchange/machine.py",
        "                self.excluded += (blamed.name,)\n",
        "                pass\n",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange answers a 503 for the fleet instead of the failure that made it try",
        "pd_policy/exchange/machine.py",
        "                exc = after  # no other worker to try: the failure that made it try\n",
        "                pass\n",
        _EXCHANGE,
    ),
    Mutant(
        "the exchange retries a refusal",
        "pd_policy/exchange/machine.py",
        "if error.retryable and not self.seen",
        "if not self.seen",
        _EXCHANGE,
    ),
    Mutant(
        "the proxy never tells its exchange of the first byte",
        "pd_policy_vllm/http/driver.py",
        "first_byte = functools.partial(exchange.handle, FirstByte())",
        "first_byte = functools.partial(int)",
        ("tests/http/test_http_proxy_faults.py", "tests/http/test_http_fleet.py"),
    ),
    Mutant(
        "the gRPC routers never tell their exchange of the first response",
        "pd_policy_grpc/driver.py",
        "                            if not exchange.seen:\n"
        "                                exchange.handle(FirstByte())\n",
        "",
        ("tests/grpc/test_grpc_fleet.py",),
    ),
    Mutant(
        "carve-outs swapped: media references before M-RoPE grids",
        "pd_policy/decision.py",
        "    if has_mrope_grids:\n        if not takes_mm_metadata:",
        "    if has_media_refs and not takes_mm_metadata:\n"
        "        raise MediaRefsOnLanguageModelOnlyDecode()\n"
        "    if has_mrope_grids:\n        if not takes_mm_metadata:",
        PROPERTIES,
    ),
    Mutant(
        "n>1 carve-out dropped for grid-less batches",
        "pd_policy/decision.py",
        "    if not relay_kv and has_mm_inputs:\n"
        "        raise NSamplesOnLanguageModelOnlyDecode()\n",
        "",
        PROPERTIES,
    ),
    Mutant(
        "the 502 forgets the M-RoPE metadata leg",
        "pd_policy/handoff.py",
        " or form is DecodeForm.MROPE_METADATA:",
        ":",
        ("tests/test_properties.py", "tests/grpc/test_grpc_handoff_rule.py"),
    ),
    Mutant(
        "the 502 fires for text requests too",
        "pd_policy/handoff.py",
        "(form is DecodeForm.TEXT_PLUS_HASHES and has_mm_inputs)",
        "(form is DecodeForm.TEXT_PLUS_HASHES)",
        ("tests/test_properties.py", "tests/grpc/test_grpc_handoff_rule.py"),
    ),
    Mutant(
        "an empty kv_transfer_params is a handoff again",
        "pd_policy/handoff_fields.py",
        "    return _gaps(mode, params)\n",
        "    return _gaps(mode, params) if params else ()\n",
        ("tests/test_handoff_fields.py",),
    ),
    Mutant(
        "a NIXL handoff without its block ids is taken",
        "pd_policy/handoff_fields.py",
        '    "remote_block_ids",\n',
        "",
        ("tests/test_handoff_fields.py",),
    ),
    Mutant(
        "do_remote_prefill: false counts as a handoff",
        "pd_policy/handoff_fields.py",
        "        return value is True\n",
        "        return value is not None\n",
        ("tests/test_handoff_fields.py",),
    ),
    Mutant(
        "an IPv6 zone id goes into a URL unescaped",
        "pd_policy/authority.py",
        "return f\"[{v6.replace('%', '%25', 1)}]\"",
        'return f"[{v6}]"',
        ("tests/test_authority.py", "tests/http/test_http_ipv6.py"),
    ),
    Mutant(
        "a bare IPv6 address is split at its last colon",
        "pd_policy/authority.py",
        "    elif _ipv6(text) is not None:\n        host, port_text = text, None\n",
        "",
        ("tests/test_authority.py", "tests/grpc/test_grpc_ipv6.py"),
    ),
    Mutant(
        "the salt fold drops the modality",
        "pd_policy/salt.py",
        "h.update(_MODALITY_TAG[modality] + _field(digest))",
        "h.update(_field(digest))",
        ("tests/test_properties.py",),
    ),
    Mutant(
        "the salt fold lets no salt and an empty salt alias",
        "pd_policy/salt.py",
        'h.update(b"-" if caller_salt is None else b"+" + _field(caller_salt))',
        'h.update(_field(caller_salt or ""))',
        ("tests/test_properties.py",),
    ),
    Mutant(
        "the salt fold drops its length prefixes (separators can be forged)",
        "pd_policy/salt.py",
        '    return len(raw).to_bytes(8, "big") + raw',
        "    return raw",
        ("tests/test_properties.py",),
    ),
    Mutant(
        "a hash-less batch kept as an empty identity",
        "pd_policy/legs.py",
        "    if not batch.mm_hashes:\n        return None\n    return batch.hashes_only()",
        "    return batch.hashes_only()",
        ("tests/test_properties.py",),
    ),
    Mutant(
        "the wire ignores M-RoPE grids in extra batches",
        "pd_policy_grpc/facts.py",
        "    return any(_has_grid(extra) for extra in request.extra_mm_inputs)",
        "    return False",
        ("tests/grpc/test_grpc_legs.py",),
    ),
    Mutant(
        "the wire's stripped leg drops the extra batches",
        "pd_policy_grpc/legs.py",
        "            leg.extra_mm_inputs.append(identity)",
        "            pass",
        ("tests/grpc/test_grpc_legs.py", "tests/grpc/test_grpc_handoff_rule.py"),
    ),
    Mutant(
        "the wire relays KV to an n>1 decode",
        "pd_policy_grpc/kv.py",
        "    if leg.sampling_params.n > 1:\n        return leg\n",
        "",
        ("tests/grpc/test_grpc_handoff_rule.py",),
    ),
    Mutant(
        "the byte reader takes the sizes tensors of the last primary occurrence only",
        "pd_policy_grpc/raw/reader.py",
        "            primary |= names",
        "            primary = names",
        ("tests/grpc/test_raw_legs.py",),
    ),
    Mutant(
        "the byte prefill leg leaves an extra batch's grids off the CPU list",
        "pd_policy_grpc/raw/legs.py",
        "        missing = _missing_grids(next(extras))\n        if missing:",
        "        missing = _missing_grids(next(extras))\n        if False:",
        ("tests/grpc/test_raw_legs.py",),
    ),
    Mutant(
        "the byte relay puts KV on an n>1 decode",
        "pd_policy_grpc/raw/legs.py",
        "    if leg.n > 1:\n        return leg\n",
        "",
        ("tests/grpc/test_raw_legs.py",),
    ),
    Mutant(
        "the byte decode leg drops the fields this proto does not know",
        "pd_policy_grpc/raw/legs.py",
        "    return form, whole.without(*_MM).plus(*batches)",
        "    return form, RawLeg(tuple(e for e in whole.without(*_MM).entries if e.number < 100), "
        "whole.n).plus(*batches)",
        ("tests/grpc/test_raw_legs.py",),
    ),
    Mutant(
        "E/P/D builds a prefill for an item the encoder did not answer for",
        "pd_policy/encoder_cache.py",
        "            if digest not in outputs:",
        "            if False:",
        ("tests/test_epd.py", "tests/http/test_http_epd.py"),
    ),
    Mutant(
        "E/P/D strips the pixels when only some items have metadata",
        "pd_policy/epd.py",
        "PrefillForm.METADATA if all(outputs[h].metadata for h in items) else PrefillForm.IMAGE",
        "PrefillForm.METADATA if any(outputs[h].metadata for h in items) else PrefillForm.IMAGE",
        ("tests/test_epd.py",),
    ),
    Mutant(
        "E/P/D's metadata prefill leg keeps the pixels",
        "pd_policy_vllm/openai/plan/encode.py",
        '        features.pop("kwargs_data", None)',
        "        pass",
        ("tests/http/test_http_epd.py",),
    ),
    Mutant(
        "a failed prefill is not aborted",
        "pd_policy_grpc/calls.py",
        "                call.cancel()\n"
        "                await self._abort(self._prefill, request_id)",
        "                call.cancel()",
        ("tests/grpc/test_grpc_load.py",),
    ),
    Mutant(
        "a decode cancelled mid-handoff is aborted at once",
        "pd_policy_grpc/calls.py",
        "                if first.done():",
        "                if True:",
        ("tests/grpc/test_grpc_load.py",),
    ),
    Mutant(
        "a request's repr shows its KV parameters",
        "pd_policy/request.py",
        "default=None, converter=kv_params_text, repr=redacted_repr",
        "default=None, converter=kv_params_text",
        ("tests/test_no_leak.py",),
    ),
    Mutant(
        "media identity: the bytes win over the client's uuid",
        "pd_policy/media/identity.py",
        "    if has_uuid:\n        return IdentityBasis.CLIENT\n"
        "    if source is MediaSource.INLINE or pinned:\n        return IdentityBasis.CONTENT\n",
        "    if source is MediaSource.INLINE or pinned:\n        return IdentityBasis.CONTENT\n"
        "    if has_uuid:\n        return IdentityBasis.CLIENT\n",
        ("tests/test_media_identity.py", "tests/http/test_http_media_identity.py"),
    ),
    Mutant(
        "client uuids: forwarded as sent, whatever the tenant",
        "pd_policy/media/uuid_scope.py",
        "    if mode is ClientUuids.TRUSTED:\n        return uuid\n",
        "    return uuid\n",
        ("tests/test_uuid_scope.py", "tests/http/test_http_tenant.py"),
    ),
    Mutant(
        "client uuids: one that looks forwarded is passed on",
        "pd_policy/media/uuid_scope.py",
        "    if mode is ClientUuids.TRUSTED:\n",
        "    if mode is ClientUuids.TRUSTED or uuid.startswith(SCOPED_UUID_PREFIX):\n",
        ("tests/test_uuid_scope.py",),
    ),
    Mutant(
        "client uuids: the prefill leg is spliced from the client's bytes",
        "pd_policy_vllm/openai/media/tenant.py",
        "    return (body, raw) if scoped is body else (scoped, None)",
        "    return scoped, raw",
        ("tests/http/test_http_tenant.py",),
    ),
    Mutant(
        "media identity: the hash factors are left out",
        "pd_policy/media/identity.py",
        "    for factor in _factor_values(inputs.factors):",
        "    for factor in ():",
        ("tests/test_media_identity.py",),
    ),
    Mutant(
        "media identity: a remote URL is named by its text (the incident)",
        "pd_policy_vllm/openai/media/identity.py",
        '            value = f"{nonce}/{index}"',
        "            value = str(part.url)",
        ("tests/http/test_http_media_identity.py", "tests/http/test_http_proxy_media.py"),
    ),
    Mutant(
        "media rules: a subdomain passes for its parent",
        "pd_policy/media/rules.py",
        "return host is not None and host.lower() in self.allowed_domains",
        "return host is not None and any(host.lower().endswith(d) for d in self.allowed_domains)",
        ("tests/test_media_rules.py",),
    ),
    Mutant(
        "media without hashes is dropped from a stripped leg again",
        "pd_policy/decision.py",
        "        raise NSamplesOnLanguageModelOnlyDecode()\n"
        "    if unidentified is not None:\n"
        "        raise MissingMediaIdentity(param=unidentified)\n",
        "        raise NSamplesOnLanguageModelOnlyDecode()\n",
        PROPERTIES,
    ),
    Mutant(
        "the wire forgets placeholders without hashes",
        "pd_policy_grpc/facts.py",
        "        or len(batch.mm_placeholders) > 0",
        "        or False",
        ("tests/grpc/test_grpc_legs.py",),
    ),
    Mutant(
        "the stripped HTTP leg keeps the request's processing options",
        "pd_policy_vllm/openai/plan/legs.py",
        "    for option in _MEDIA_OPTIONS:\n        out.pop(option, None)",
        "    pass",
        ("tests/http/test_http_media_identity.py",),
    ),
    Mutant(
        "an uncached URL on a vision decode keeps the caller's salt",
        "pd_policy_vllm/openai/plan/legs.py",
        "        if uncached and leg.relays_kv and leg.has_mm_inputs:",
        "        if False:",
        ("tests/http/test_http_media_identity.py",),
    ),
    Mutant(
        "a fetch follows a redirect to a host the worker does not allow",
        "pd_policy_vllm/http/media/fetch.py",
        "    if check_media_url(url, rules, param=param) is not MediaSource.REMOTE:",
        '    if url.startswith("ftp"):',
        ("tests/http/test_http_pin.py", "tests/http/test_http_media_fetch_ssrf.py"),
    ),
    Mutant(
        "the byte reader refuses a ten-byte varint (a negative int32)",
        "pd_policy_grpc/raw/protowire.py",
        "    for i in range(pos, min(pos + 10, end)):",
        "    for i in range(pos, min(pos + 9, end)):",
        ("tests/grpc/test_raw_legs.py",),
    ),
    Mutant(
        "the byte reader lets a length-delimited field run one byte past its message",
        "pd_policy_grpc/raw/protowire.py",
        "            if size > end - value:",
        "            if size > end - value + 1:",
        ("tests/grpc/test_grpc_robustness.py", "tests/grpc/test_raw_legs.py"),
    ),
    Mutant(
        "the prefill's ids pass the byte check whatever they hold",
        "pd_policy_vllm/openai/wire/token_ids.py",
        "        if compact[1:-1].translate(None, _DIGITS_AND_COMMAS):",
        "        if False:",
        ("tests/http/test_http_token_ids.py",),
    ),
    Mutant(
        "placement: a fleet that cannot serve the media is a retryable 503, not a 400",
        "pd_policy/fleet/placement.py",
        "    if listed and not prefills:",
        "    if False:",
        ("tests/test_placement.py",),
    ),
    Mutant(
        "placement: the decode leaves out no worker an earlier attempt failed on",
        "pd_policy/fleet/placement.py",
        '    decode = roster.choose("decode", compatible, exclude=exclude)',
        '    decode = roster.choose("decode", compatible)',
        ("tests/test_placement.py",),
    ),
    Mutant(
        "placement: after an encoder, any prefill (not a cache consumer) takes the leg",
        "pd_policy/fleet/placement.py",
        "    prefills = select_prefill_workers(request, listed, encoded=encoded)",
        "    prefills = select_prefill_workers(request, listed, encoded=False)",
        ("tests/test_placement.py",),
    ),
    Mutant(
        "a stripped batch made without its checks forgets its modality",
        "pd_policy/batch.py",
        '        object.__setattr__(new, "modality", self.modality)\n',
        "",
        ("tests/test_properties.py",),
    ),
    Mutant(
        "relayed KV parameters set without the constructor's check",
        "pd_policy/handoff.py",
        'changes["kv_transfer_params"] = kv_params_text(kv_transfer_params)',
        'changes["kv_transfer_params"] = kv_transfer_params',
        ("tests/test_properties.py",),
    ),
    Mutant(
        "one routable worker: the first compatible one is taken instead",
        "pd_policy/fleet/balance.py",
        "        return up[0]",
        "        return compatible[0]",
        ("tests/test_balance.py", "tests/test_placement.py"),
    ),
    Mutant(
        "the splice ends a string at an escaped quote",
        "pd_policy_vllm/openai/wire/splice.py",
        "        if not escaped(raw, quote):",
        "        if True:",
        ("tests/http/test_http_splice.py",),
    ),
    Mutant(
        "the spliced prefill leg keeps the members it should drop",
        "pd_policy_vllm/openai/wire/splice.py",
        "        if key in drop:\n            continue\n",
        "",
        ("tests/http/test_http_splice.py",),
    ),
    Mutant(
        "a Responses API request's bytes spliced as if they were its chat equivalent",
        "pd_policy_vllm/http/front_door.py",
        "        body, spliceable = chat_equivalent(body), None",
        "        body = chat_equivalent(body)",
        ("tests/http/test_http_proxy_faults.py",),
    ),
    Mutant(
        "a key written twice is let through when msgspec parsed the body",
        "pd_policy_vllm/openai/wire/strict.py",
        "    return written_once(raw, colons, value, encode)",
        "    return True",
        _JSON,
    ),
    Mutant(
        "a key written twice is let through by the standard library's parse",
        "pd_policy_vllm/openai/wire/codec.py",
        "    object_pairs_hook=unique, parse_constant=_constant",
        "    parse_constant=_constant",
        _JSON,
    ),
    Mutant(
        "the count of colons forgets that an escape makes one",
        "pd_policy_vllm/openai/wire/strict.py",
        "    return True if colons == written - escapes else None",
        "    return True if colons >= written - escapes else None",
        _JSON,
    ),
    Mutant(
        "a body nested past the limit is parsed and walked",
        "pd_policy_vllm/openai/wire/strict.py",
        "        raise TooDeep()",
        "        pass",
        _JSON,
    ),
    Mutant(
        "a large body's objects are not counted before its depth is judged",
        "pd_policy_vllm/openai/wire/strict.py",
        '            return count(raw, b"[") + count(raw, b"{"), colons',
        '            return count(raw, b"["), colons',
        _JSON,
    ),
    Mutant(
        "the parser's RecursionError escapes: a 500",
        "pd_policy_vllm/openai/wire/codec.py",
        "    except RecursionError:\n"
        '        raise MalformedRequest(_deeper(what), param="body") from None\n'
        "    except UnicodeError:",
        "    except UnicodeError:",
        _JSON,
    ),
    Mutant(
        "a worker's handoff nested past the limit is relayed",
        "pd_policy_vllm/openai/wire/codec.py",
        "    if too_deep(opened, reply.kv_transfer_params) or too_deep(opened, reply.usage):",
        "    if False:",
        _JSON,
    ),
    Mutant(
        "a worker's reply is never walked for its depth: counted as opening nothing",
        "pd_policy_vllm/openai/wire/codec.py",
        '    opened = count(raw, b"[") + count(raw, b"{")',
        "    opened = 0",
        _JSON,
    ),
    Mutant(
        "a stream that is not a boolean is taken for one",
        "pd_policy_vllm/http/parsing.py",
        "    if stream is not None and not isinstance(stream, bool):",
        "    if False:",
        ("tests/http/test_http_malformed_bodies.py",),
    ),
    Mutant(
        "the Ray decode server sends Ray's own decode leg: the client's request, images in",
        "pd_policy_ray/driver.py",
        "            return replica.decode(self.route, body, self.raw)",
        "            return replica.decode(self.route, self.body, self.raw)",
        ("tests/vllm/ray/test_ray_server.py",),
    ),
    Mutant(
        "the Ray decode server reads a prefill's error as its reply",
        "pd_policy_ray/driver.py",
        "                answered = await replica.prefill(self.route, body, self.raw)\n"
        "            if _failed(answered):",
        "                answered = await replica.prefill(self.route, body, self.raw)\n"
        "            if False:",
        ("tests/vllm/ray/test_ray_server.py",),
    ),
    Mutant(
        "the Ray decode server forwards a client's router fields",
        "pd_policy_ray/driver.py",
        "            dropped = check_client_fields(self.body)",
        "            dropped = ()",
        ("tests/ray/test_ray_hostile.py",),
    ),
    Mutant(
        "the Ray decode server runs the legs under the client's request id",
        "pd_policy_ray/server.py",
        '        request_id = f"pd-{uuid.uuid4().hex}"',
        '        request_id = body.get("request_id") or f"pd-{uuid.uuid4().hex}"',
        ("tests/ray/test_ray_hostile.py",),
    ),
    Mutant(
        "the Ray decode server leaves a gone client's prefill running on its replica",
        "pd_policy_ray/server.py",
        "            responses.cancel()",
        "            pass",
        ("tests/ray/test_ray_hostile.py",),
    ),
    Mutant(
        "the gRPC router on messages forwards a caller's kv_transfer_params_json",
        "pd_policy_grpc/owned.py",
        "        if request.HasField(name):",
        '        if request.HasField(name) and name != "kv_transfer_params_json":',
        ("tests/grpc/test_grpc_router_fields.py",),
    ),
    Mutant(
        "the gRPC router on bytes forwards a caller's KV handoff",
        "pd_policy_grpc/raw/admission.py",
        "    check_numbers(field.number for field in request.fields)",
        "    check_numbers(())",
        ("tests/grpc/test_grpc_router_fields.py",),
    ),
    Mutant(
        "the gRPC fleet admits a message unchecked",
        "pd_policy_grpc/fleet.py",
        "            return admit_message(request, self.max_media_items)",
        "            return request",
        ("tests/grpc/test_grpc_router_fields.py",),
    ),
    Mutant(
        "the gRPC routers run the legs under the caller's request id",
        "pd_policy_grpc/calls.py",
        "        own = router_request_id()",
        "        own = caller_id",
        ("tests/grpc/test_grpc_router_fields.py",),
    ),
    Mutant(
        "a gRPC request that ends early keeps its members' load",
        "pd_policy_grpc/driver.py",
        "            settle(roster, exchange.handle(ClientLeft()))",
        "            pass",
        ("tests/grpc/test_grpc_fleet_cancel.py",),
    ),
    Mutant(
        "the gRPC router on messages takes any number of media items",
        "pd_policy_grpc/admission.py",
        "    check_message_media_items(request, max_media_items)",
        "    pass",
        ("tests/grpc/test_grpc_media_items.py",),
    ),
    Mutant(
        "the gRPC reader parses a request past the media cap before refusing it",
        "pd_policy_grpc/raw/reader.py",
        "        tally.top(buf, field)",
        "        pass",
        ("tests/grpc/test_grpc_media_items.py",),
    ),
    Mutant(
        "a Ray deployment without a connector read as one that needs no handoff",
        "pd_policy_ray/legs.py",
        "    if not isinstance(name, str) or not name:",
        "    if not isinstance(name, str):",
        ("tests/ray/test_ray_legs.py",),
    ),
    Mutant(
        "the workers' framing parsed leniently (chunk sizes, Transfer-Encoding, bare LF)",
        "pd_policy_vllm/http/upstream/connection.py",
        "        self._parser = httptools.HttpResponseParser(self)\n",
        "        self._parser = httptools.HttpResponseParser(self)\n"
        "        self._parser.set_dangerous_leniencies(lenient_chunked_length=True,\n"
        "            lenient_transfer_encoding=True, lenient_optional_cr_before_lf=True,\n"
        "            lenient_headers=True)\n",
        _HOSTILE,
    ),
    Mutant(
        "a Transfer-Encoding other than chunked is taken",
        "pd_policy_vllm/http/upstream/connection.py",
        '        if self._codings and self._codings != [b"chunked"]:',
        "        if False:",
        _HOSTILE,
    ),
    Mutant(
        "a 1xx is taken as the final answer",
        "pd_policy_vllm/http/upstream/connection.py",
        "        if 100 <= status < 200:",
        "        if status == 101:",
        _HOSTILE,
    ),
    Mutant(
        "no response-size cap on a body as it arrives",
        "pd_policy_vllm/http/upstream/connection.py",
        "        if self._body_bytes > self.limits.max_response_bytes:",
        "        if False:",
        _HOSTILE,
    ),
    Mutant(
        "a silent worker is waited for a thousand times the read timeout",
        "pd_policy_vllm/http/upstream/connection.py",
        "        timer = loop.call_later(timeout, self._timed_out)",
        "        timer = loop.call_later(timeout * 1000, self._timed_out)",
        _HOSTILE,
    ),
    Mutant(
        "the connection cap per worker is not held",
        "pd_policy_vllm/http/upstream/client.py",
        "        if self.busy < limits.max_connections and not self.waiters:",
        "        if True:",
        _HOSTILE,
    ),
    Mutant(
        "a worker's stream is read on when its reader stops: no window",
        "pd_policy_vllm/http/upstream/connection.py",
        "            self._paused = True\n            self.transport.pause_reading()\n",
        "            pass\n",
        _FLOW,
    ),
    Mutant(
        "a paused worker's stream is never read again",
        "pd_policy_vllm/http/upstream/connection.py",
        "        if self._buffered <= WINDOW_LOW:\n            self._resume()\n",
        "",
        _FLOW,
    ),
    Mutant(
        "a leg handed a slot as it is cancelled keeps it",
        "pd_policy_vllm/http/upstream/client.py",
        "                self.give()  # handed a slot as it was cancelled: pass it on\n",
        "                pass\n",
        _CANCEL,
    ),
    Mutant(
        "a leg that fails or is cancelled before its head keeps its slot",
        "pd_policy_vllm/http/upstream/client.py",
        "        except BaseException:\n            pool.give()\n            raise\n",
        "        except BaseException:\n            raise\n",
        _CANCEL,
    ),
    Mutant(
        "a leg whose block is left by an error or a cancellation keeps its slot",
        "pd_policy_vllm/http/upstream/client.py",
        "        if held is not None:\n"
        "            self._upstream._leave(*held, whole=kind is None)\n",
        "        if held is not None and kind is None:\n"
        "            self._upstream._leave(*held, whole=True)\n",
        _CANCEL,
    ),
    Mutant(
        "a leg's connect is run by wait_for, which loses a cancellation as it connects",
        "pd_policy_vllm/http/upstream/client.py",
        "            async with asyncio.timeout(limits.connect_timeout):\n"
        "                _, connection = await loop.create_connection(\n"
        "                    lambda: Connection(limits), target.host, target.port, ssl=tls\n"
        "                )\n",
        "            _, connection = await asyncio.wait_for(loop.create_connection(\n"
        "                lambda: Connection(limits), target.host, target.port, ssl=tls\n"
        "            ), limits.connect_timeout)\n",
        _CANCEL,
    ),
    Mutant(
        "a leg's connection is not closed when its head fails or is cancelled",
        "pd_policy_vllm/http/upstream/client.py",
        "            except BaseException:\n"
        "                connection.close()\n                raise\n",
        "            except BaseException:\n                raise\n",
        _CANCEL,
    ),
    Mutant(
        "the cap on client connections is never enforced",
        "pd_policy_vllm/http/client_gate.py",
        "        if len(self.held) >= self.door.max_connections:",
        "        if False:",
        _GATE,
    ),
    Mutant(
        "a closed client connection keeps its slot",
        "pd_policy_vllm/http/client_gate.py",
        "        self._gate.held.pop(self.handler, None)\n",
        "",
        _GATE,
    ),
    Mutant(
        "a head's deadline never starts: a trickled head holds its connection",
        "pd_policy_vllm/http/client_gate.py",
        "        if not self._busy and self._since is None:\n",
        "        if False:\n",
        _GATE,
    ),
    Mutant(
        "a whole head does not end its deadline: a long request is cut",
        "pd_policy_vllm/http/client_gate.py",
        "        self._busy = True\n        self._since = None\n",
        "        pass\n",
        _GATE,
    ),
    Mutant(
        "the head's deadline is armed again after each request: idle connections are cut",
        "pd_policy_vllm/http/client_gate.py",
        '        """Its request is over: the next head\'s deadline runs from its first byte."""\n'
        "        self._busy = False\n",
        '        """Its request is over: the next head\'s deadline runs from its first byte."""\n'
        "        self._busy = False\n        self._since = asyncio.get_running_loop().time()\n",
        _GATE,
    ),
    Mutant(
        "a head begun while the last one's timer runs is never timed: it is left to trickle",
        "pd_policy_vllm/http/client_gate.py",
        "            self._timer = loop.call_at(deadline, self._late)\n",
        "            pass\n",
        _GATE,
    ),
    Mutant(
        "the cache rule ignores the load bound: one hot prefix floods its holder",
        "pd_policy/fleet/balance.py",
        "    holders = [w for w in up if w.cached and w.outstanding + 1 <= held_cap]",
        "    holders = [w for w in up if w.cached]",
        ("tests/test_balance.py",),
    ),
    Mutant(
        "the cache rule prefers the busier of two equal holders",
        "pd_policy/fleet/balance.py",
        "    return worker.cached, -worker.outstanding",
        "    return worker.cached, worker.outstanding",
        ("tests/test_balance.py",),
    ),
    Mutant(
        "the salt keys every block, not the first",
        "pd_policy/cache/kv_blocks.py",
        "            if start == 0 and cache_salt:",
        "            if cache_salt:",
        ("tests/vllm/test_kv_hashes.py",),
    ),
    Mutant(
        "a media item's offset is taken from the prompt's start, not the block's",
        "pd_policy/cache/kv_blocks.py",
        '                keys.append(("mm", _fresh(spans[at].identifier),'
        " spans[at].offset - start))",
        '                keys.append(("mm", _fresh(spans[at].identifier), spans[at].offset))',
        ("tests/vllm/test_kv_hashes.py",),
    ),
    Mutant(
        "an item that ends on a block's first token is left out of that block",
        "pd_policy/cache/kv_blocks.py",
        "            while item < len(spans) and spans[item].offset + spans[item].length <= start:",
        "            while item < len(spans) and spans[item].offset + spans[item].length"
        " <= start + 1:",
        ("tests/vllm/test_kv_hashes.py",),
    ),
    Mutant(
        "the keys share one identifier object, as no served worker's do",
        "pd_policy/cache/kv_blocks.py",
        '                keys.append(("mm", _fresh(spans[at].identifier),'
        " spans[at].offset - start))",
        '                keys.append(("mm", spans[at].identifier, spans[at].offset - start))',
        ("tests/vllm/test_kv_hashes.py",),
    ),
    Mutant(
        "a lost batch goes unnoticed: the index counts blocks it may not have",
        "pd_policy/cache/prefix_index.py",
        "        if last is not None and seq > last + 1:",
        "        if False:",
        ("tests/test_prefix_index.py",),
    ),
    Mutant(
        "a restarted worker keeps the blocks its old engine held",
        "pd_policy/cache/prefix_index.py",
        "                state.blocks.clear()\n                self._apply(state, seq, events)",
        "                self._apply(state, seq, events)",
        ("tests/test_prefix_index.py",),
    ),
    Mutant(
        "the proxy looks a request up and places it blind",
        "pd_policy_vllm/http/fleet/routing.py",
        "            cached=self.cached,",
        "            cached=None,",
        ("tests/http/test_http_kv_routing.py",),
    ),
    Mutant(
        "a lookup renders a body whose remote media the proxy has not yet decided on",
        "pd_policy_vllm/http/fleet/kv_routing.py",
        "            or any(part.source in _UNREAD for part in media_parts(",
        "            or any(False for part in media_parts(",
        ("tests/http/test_http_kv_routing.py",),
    ),
    Mutant(
        "a lookup reads a completions body for chat media, and never renders it",
        "pd_policy_vllm/http/fleet/kv_routing.py",
        "        if placer.route is Route.CHAT and (",
        "        if (",
        _RENDER_ONCE,
    ),
    Mutant(
        "render once moves a NIXL push prefill leg off the decode leg's route",
        "pd_policy_vllm/openai/plan/render_once.py",
        "        check_leg_routes(plan.handoff.mode, GENERATE, decode_route)\n",
        "        pass\n",
        _RENDER_ONCE,
    ),
    Mutant(
        "render once takes a render without every item's processed tensors",
        "pd_policy_vllm/openai/plan/render_once.py",
        '            raise _bad(f"does not carry every {modality}\'s processed tensors")',
        "            pass",
        _RENDER_ONCE,
    ),
    Mutant(
        "render once takes a render whose media the generate route would expand again",
        "pd_policy_vllm/openai/plan/render_once.py",
        '    if answer.get("content_parts") is not None:',
        "    if False:",
        _RENDER_ONCE,
    ),
    Mutant(
        "render once takes a render for an item the proxy did not fetch",
        "pd_policy_vllm/openai/plan/render_once.py",
        "    if plan.epd or plan.uncached or not serves_generate:",
        "    if plan.epd or not serves_generate:",
        _RENDER_ONCE,
    ),
    Mutant(
        "render once sends a generate leg to a prefill without the scale-out routes",
        "pd_policy_vllm/openai/plan/render_once.py",
        "    if plan.epd or plan.uncached or not serves_generate:",
        "    if plan.epd or plan.uncached:",
        _RENDER_ONCE,
    ),
    Mutant(
        "the lookup's render carries no tensors for a plan rendered once",
        "pd_policy_vllm/openai/plan/render_once.py",
        "    return mrope or (render_once and any(not mode.legs_share_route for mode in modes))",
        "    return mrope",
        _RENDER_ONCE,
    ),
    Mutant(
        "the lookup's render carries tensors under NIXL push, where no plan takes them",
        "pd_policy_vllm/openai/plan/render_once.py",
        "    return mrope or (render_once and any(not mode.legs_share_route for mode in modes))",
        "    return mrope or render_once",
        _RENDER_ONCE,
    ),
    Mutant(
        "the proxy renders once under --no-render-once",
        "pd_policy_vllm/http/planning.py",
        "        if not render_once:\n            return plan\n",
        "",
        _RENDER_ONCE,
    ),
    Mutant(
        "a lookup renders a request the policy refuses",
        "pd_policy_vllm/http/fleet/kv_routing.py",
        "            request = placer.request  # the policy's refusals come first,"
        " before any worker\n"
        "            if request.n > 1:\n"
        "                return None  # no prefill runs\n",
        "",
        ("tests/http/test_http_kv_routing.py",),
    ),
    Mutant(
        "FleetPd names a request's blocks without its salt",
        "pd_policy_grpc/kv_routing.py",
        "cache_salt=prompt.cache_salt",
        "cache_salt=None",
        ("tests/grpc/test_grpc_kv_routing.py",),
    ),
    Mutant(
        "FleetPd takes a batch with placeholders for one with its payload",
        "pd_policy_grpc/blocks.py",
        "if _has_payload(batch)",
        "if batch.mm_placeholders",
        ("tests/grpc/test_grpc_kv_routing.py",),
    ),
    # Issue #43: the routing rules, each held by a test that fails when it breaks.
    Mutant(
        "the cache's slack is gone: a holder serving one request loses every hit past the cap",
        "pd_policy/fleet/balance.py",
        "    held_cap = max(cap, 1 + CACHE_SLACK)",
        "    held_cap = cap",
        _CHOICE,
    ),
    Mutant(
        "the cache's slack is two requests, not one",
        "pd_policy/fleet/balance.py",
        "CACHE_SLACK: Final = 1",
        "CACHE_SLACK: Final = 2",
        _CHOICE,
    ),
    Mutant(
        "equal holders: the first in the caller's order takes every request",
        "pd_policy/fleet/balance.py",
        "        return tied[turn % len(tied)]",
        "        return tied[0]",
        _CHOICE,
    ),
    Mutant(
        "a bound that is not a number gets past the check",
        "pd_policy/fleet/balance.py",
        "    if not bound >= 1.0:",
        "    if bound < 1.0:",
        ("tests/test_balance.py",),
    ),
    Mutant(
        "an infinite or huge affinity bound overflows the cap",
        "pd_policy/fleet/balance.py",
        "math.ceil(min(bound, len(up)) * (",
        "math.ceil(bound * (",
        ("tests/test_balance.py",),
    ),
    Mutant(
        "the roster's turns are shared by every role: a prefill's equal holders skip turns",
        "pd_policy/fleet/roster.py",
        "        turn = self._turns[role] = self._turns.get(role, -1) + 1",
        "        turn = self._draws",
        _CHOICE,
    ),
    Mutant(
        "the roster's turns never move",
        "pd_policy/fleet/roster.py",
        "        turn = self._turns[role] = self._turns.get(role, -1) + 1",
        "        turn = 0",
        _CHOICE,
    ),
    Mutant(
        "the roster's draws never move: two choices always take the first worker",
        "pd_policy/fleet/roster.py",
        "        self._draws += 1\n",
        "",
        ("tests/test_roster.py",),
    ),
    Mutant(
        "the roster chooses by the default bound, not its own",
        "pd_policy/fleet/roster.py",
        "            bound=self.bound,\n",
        "",
        ("tests/test_roster.py",),
    ),
    Mutant(
        "the roster chooses by the default balance, not its own",
        "pd_policy/fleet/roster.py",
        "            balance=self.balance,\n",
        "",
        ("tests/test_roster.py",),
    ),
    Mutant(
        "the roster ignores the blocks each member holds",
        "pd_policy/fleet/roster.py",
        "                held.get(m.name, 0),",
        "                0,",
        _CHOICE,
    ),
    Mutant(
        "placement places the prefill blind to the blocks it holds",
        "pd_policy/fleet/placement.py",
        "        cached=cached,\n",
        "",
        ("tests/test_placement.py",),
    ),
    Mutant(
        "placement places the prefill without its media's affinity",
        "pd_policy/fleet/placement.py",
        "        affinity=affinity,\n        exclude=exclude,\n        cached=cached,",
        "        exclude=exclude,\n        cached=cached,",
        ("tests/test_placement.py",),
    ),
    Mutant(
        "placement places the encoder without its media's affinity",
        "pd_policy/fleet/placement.py",
        '"encode", [c.handle for c in encoders], affinity=affinity, exclude=exclude',
        '"encode", [c.handle for c in encoders], exclude=exclude',
        ("tests/test_placement.py",),
    ),
    Mutant(
        "placement sends the encoder leg back to a worker an earlier attempt failed on",
        "pd_policy/fleet/placement.py",
        '"encode", [c.handle for c in encoders], affinity=affinity, exclude=exclude',
        '"encode", [c.handle for c in encoders], affinity=affinity',
        ("tests/test_placement.py",),
    ),
    Mutant(
        "the affinity key names the first batch's media only",
        "pd_policy/fleet/placement.py",
        "for b in request.batches for h in b.mm_hashes",
        "for b in request.batches[:1] for h in b.mm_hashes",
        ("tests/test_placement.py",),
    ),
    Mutant(
        "the decode is decided as if no encoder had run",
        "pd_policy/fleet/placement.py",
        "    seen = decided(prefill, encoded) if",
        "    seen = decided(prefill, False) if",
        ("tests/test_placement.py",),
    ),
    Mutant(
        "a fleet refusing the media gives the other reason",
        "pd_policy/fleet/placement.py",
        "            if encoded\n            else",
        "            if not encoded\n            else",
        ("tests/test_placement.py",),
    ),
    Mutant(
        "a pool without an encoder takes media references",
        "pd_policy/selection.py",
        "    if not (request.has_mm_inputs or request.media_refs):",
        "    if not request.has_mm_inputs:",
        ("tests/test_selection.py",),
    ),
    Mutant(
        "an unsynced worker takes a batch past the lost one as the next",
        "pd_policy/cache/prefix_index.py",
        "        if last is not None and seq > last + 1:",
        "        if last is not None and seq > last + 1 and state.synced:",
        ("tests/test_prefix_index.py", "tests/vllm/test_kv_feed_replay.py"),
    ),
    Mutant(
        "a worker the index never heard from is in sync",
        "pd_policy/cache/prefix_index.py",
        "        return state is not None and state.synced",
        "        return state is None or state.synced",
        ("tests/test_prefix_index.py",),
    ),
    Mutant(
        "a forgotten worker's blocks still count",
        "pd_policy/cache/prefix_index.py",
        "        self._workers.pop(worker, None)",
        "        self._workers.get(worker)",
        ("tests/test_prefix_index.py",),
    ),
    Mutant(
        "an unsynced worker takes a batch it had for a new publisher's",
        "pd_policy/cache/prefix_index.py",
        "            if state.synced:\n",
        "            if True:\n",
        ("tests/test_prefix_index.py",),
    ),
    Mutant(
        "a replay that cannot give the lost batches leaves the worker unsynced for good",
        "pd_policy_vllm/kv_events/feed.py",
        "        if self.index.missing(self.name) is not None:\n            self._resync()",
        "        if False:\n            self._resync()",
        ("tests/vllm/test_kv_feed_replay.py",),
    ),
    Mutant(
        "a new engine's batches under the replay's numbers are taken for its copies",
        "pd_policy_vllm/kv_events/feed.py",
        "                if ts <= self._replayed_ts:",
        "                if True:",
        ("tests/vllm/test_kv_feed_replay.py",),
    ),
    Mutant(
        "a new engine's batch numbered as the last the index applied is left to the index",
        "pd_policy_vllm/kv_events/feed.py",
        "read anew from this batch.\n                self.index.resync(self.name)",
        "read anew from this batch.\n                pass",
        ("tests/vllm/test_kv_feed_replay.py",),
    ),
    Mutant(
        "FleetPd salts a bare-identity request with its first batch's hashes only",
        "pd_policy_grpc/blocks.py",
        "upstream_cache_salt(h for batch in batches for h in batch.mm_hashes)",
        "upstream_cache_salt(h for batch in batches[:1] for h in batch.mm_hashes)",
        ("tests/grpc/test_grpc_kv_routing.py",),
    ),
    Mutant(
        "the front door does not check a request's media items against the cap",
        "pd_policy_vllm/http/parsing.py",
        "            check_media_items(count_media_items(body, most + 1), most)\n",
        "            count_media_items(body, most + 1)\n",
        ("tests/http/test_http_media_items_cap.py",),
    ),
    Mutant(
        "the front door counts every media item of a request past the cap",
        "pd_policy_vllm/openai/media/parts.py",
        "                    if found >= most:\n                        return found\n",
        "",
        ("tests/http/test_http_media_items_cap.py",),
    ),
    Mutant(
        "the media session keeps a cookie jar shared by every tenant's fetches",
        "pd_policy_vllm/http/media/guard.py",
        "        cookie_jar=aiohttp.DummyCookieJar(),\n",
        "",
        ("tests/http/test_http_media_isolation.py",),
    ),
    Mutant(
        "the media session keeps a connection from one fetch to the next",
        "pd_policy_vllm/http/media/guard.py",
        "        connector = aiohttp.TCPConnector(resolver=resolver, force_close=True)",
        "        connector = aiohttp.TCPConnector(resolver=resolver)",
        ("tests/http/test_http_media_isolation.py",),
    ),
    Mutant(
        "the guarded media session keeps a connection from one fetch to the next",
        "pd_policy_vllm/http/media/guard.py",
        "            force_close=True,\n",
        "",
        ("tests/http/test_http_media_isolation.py",),
    ),
    Mutant(
        "the proxy fetches a media URL carrying credentials",
        "pd_policy_vllm/http/media/fetch.py",
        "    if parts.username is not None or parts.password is not None:",
        "    if False:",
        ("tests/http/test_http_media_isolation.py",),
    ),
    Mutant(
        "a data URL's digest is memoized by its text's head, not on the item itself",
        "pd_policy_vllm/openai/wire/data_url.py",
        "        if self._sha256 is None:\n"
        "            self._sha256 = hashlib.sha256(self.view).hexdigest()\n"
        "        return self._sha256\n",
        "        memo = globals().setdefault('_MEMO', {})\n"
        "        return memo.setdefault(self.head(), hashlib.sha256(self.view).hexdigest())\n",
        ("tests/http/test_http_media_digests.py", "tests/http/test_http_proxy_media.py"),
    ),
    Mutant(
        "pinned media is memoized by the remote URL's text, across requests",
        "pd_policy_vllm/http/planning.py",
        "            attempt.fetches = Fetches(Budget(self.fetch_budget), fetched=self.fetched)",
        "            attempt.fetches = globals().setdefault('_F', Fetches(Budget(1 << 40)))",
        ("tests/http/test_http_media_digests.py", "tests/http/test_http_media_fetch_once.py"),
    ),
    Mutant(
        "a request's large media items are hashed on the event loop",
        "pd_policy_vllm/http/front_door.py",
        "        body = await asyncio.to_thread(work)",
        "        body = work()",
        ("tests/http/test_http_media_digests.py",),
    ),
    Mutant(
        "remote media is fetched again on every attempt",
        "pd_policy_vllm/http/planning.py",
        "        if attempt.fetches is None:\n",
        "        if True:\n",
        ("tests/http/test_http_media_fetch_once.py",),
    ),
    Mutant(
        "an item fetched for one prefill is sent to another without its rules",
        "pd_policy_vllm/http/media/pinning.py",
        "            recheck(kept, part, rules, limits)\n",
        "            pass\n",
        ("tests/http/test_http_media_fetch_once.py",),
    ),
    Mutant(
        "a request's media fetches together are not bounded",
        "pd_policy_vllm/http/media/fetch.py",
        "        if self.left < 0:",
        "        if False:",
        ("tests/http/test_http_media_fetch_once.py",),
    ),
    Mutant(
        "a KV lookup names every block of a prompt however long",
        "pd_policy_vllm/http/fleet/kv_routing.py",
        "        prompt = prompt.leading(self.max_tokens)",
        "        prompt = prompt.leading(1 << 62)",
        ("tests/http/test_http_kv_lookup_bound.py",),
    ),
    Mutant(
        "a large client body is joined on the event loop",
        "pd_policy_vllm/openai/wire/body.py",
        '            return await asyncio.to_thread(b"".join, chunks)',
        '            return b"".join(chunks)',
        ("tests/http/test_http_door_fairness.py",),
    ),
    Mutant(
        "the front door parses a body with the cycle collector on",
        "pd_policy_vllm/http/parsing.py",
        "    gc.disable()\n",
        "",
        ("tests/http/test_http_door_fairness.py",),
    ),
    Mutant(
        "skim looks at every data: string of a body, however many",
        "pd_policy_vllm/openai/wire/skim.py",
        "        if looked > most:\n            return []\n",
        "",
        ("tests/http/test_http_door_fairness.py",),
    ),
    Mutant(
        "a leg copies its long data URLs into one buffer",
        "pd_policy_vllm/openai/wire/splice.py",
        "    if not urls:\n        return dumps(body)\n",
        "    return dumps(body)\n",
        ("tests/http/test_http_written.py",),
    ),
    Mutant(
        "a live batch the replay already applied is applied again as a restart",
        "pd_policy_vllm/kv_events/feed.py",
        "            if seq <= self._replayed_to:",
        "            if False:",
        ("tests/vllm/test_kv_feed.py",),
    ),
    Mutant(
        "a worker's error message keeps the keys it quotes",
        "pd_policy_vllm/http/calls.py",
        "detail = redactor.text(str(loads(",
        "detail = str(str(loads(",
        ("tests/http/test_http_redact.py",),
    ),
    Mutant(
        "a worker's error page is cut before its keys are redacted",
        "pd_policy_vllm/http/calls.py",
        "detail = redactor.text(start)[:_RAW_DETAIL]",
        "detail = redactor.text(start[:_RAW_DETAIL])",
        _SECRETS,
    ),
    Mutant(
        "the proxy answers a leg's error unredacted",
        "pd_policy_vllm/http/driver.py",
        "return upstream.redactor.error_response(action.error)",
        "return type(upstream.redactor)().error_response(action.error)",
        _SECRETS,
    ),
    Mutant(
        "the decode's whole answer is relayed unredacted",
        "pd_policy_vllm/http/relay.py",
        "body = self._redactor.data(raw)",
        "body = raw",
        _SECRETS,
    ),
    Mutant(
        "the decode's stream is relayed unredacted",
        "pd_policy_vllm/http/relay.py",
        "if sent := redacting.piece(piece):",
        "if sent := piece:",
        _SECRETS,
    ),
    Mutant(
        "a stream holds back no tail that may start a key",
        "pd_policy_vllm/http/redact.py",
        "        keep = redactor.held(data)\n",
        "        keep = 0\n",
        (*_SECRETS, "tests/http/test_http_redact.py"),
    ),
    Mutant(
        "a derendered event is relayed unredacted",
        "pd_policy_vllm/http/relay.py",
        'b"data: " + self._redactor.data(event) + b"\\n\\n"',
        'b"data: " + event + b"\\n\\n"',
        _SECRETS,
    ),
    Mutant(
        "the models the workers list are relayed unredacted",
        "pd_policy_vllm/http/proxy.py",
        "models.body = request.app[_CLIENTS].legs.redactor.data(models.body)",
        "models.body = models.body",
        _SECRETS,
    ),
    Mutant(
        "the proxy does not install its log filter",
        "pd_policy_vllm/http/proxy.py",
        "        redact_logs(self.keys)\n",
        "",
        ("tests/http/test_http_log_secrets.py",),
    ),
    Mutant(
        "the log filter leaves a traceback as it is",
        "pd_policy_vllm/http/log_filter.py",
        "                record.exc_text, record.exc_info = clean, None\n",
        "                pass\n",
        ("tests/http/test_http_log_secrets.py",),
    ),
    Mutant(
        "a keys file's comment is checked before its line is stripped",
        "pd_policy_vllm/http/auth.py",
        '    return [line for line in stripped if line and not line.startswith("#")]',
        "    return [line.strip() for line in text.splitlines()"
        ' if line.strip() and line[0] != "#"]',
        ("tests/http/test_http_keys_files.py",),
    ),
    Mutant(
        "a refused connector is served as passthrough",
        "pd_policy/wires.py",
        "    if wire.mode is None:\n        raise _refusal(kv_connector, wire.why)\n",
        "    if wire.mode is None:\n        return KvConnectorMode.PASSTHROUGH\n",
        _WIRES_CORE,
    ),
    Mutant(
        "the OffloadingConnector's P2P tier is served as passthrough",
        "pd_policy/wires.py",
        "if wire.mode is KvConnectorMode.PASSTHROUGH and _p2p_tier(config):",
        "if False:",
        _WIRES_CORE,
    ),
    Mutant(
        "a MultiConnector takes a hazard beside its handoff",
        "pd_policy/wires.py",
        "if wire.mode is None and not (nested and wire.beside_a_handoff):",
        "if wire.mode is None and not nested:",
        _WIRES_CORE,
    ),
    Mutant(
        "push legs may go to two routes (the route check off)",
        "pd_policy/wires.py",
        "if mode.legs_share_route and prefill_route != decode_route:",
        "if False:",
        (*_WIRES_CORE, *_WIRES_HTTP),
    ),
    Mutant(
        "the plan forgets the Responses API decodes on its own route",
        "pd_policy_vllm/openai/plan/steps.py",
        "to = GENERATE if metadata else served_as or route.value",
        "to = GENERATE if metadata else route.value",
        _WIRES_HTTP,
    ),
    Mutant(
        "the plan forgets E/P/D prefills on generate",
        "pd_policy_vllm/openai/plan/steps.py",
        "GENERATE if epd or metadata else route.value, to)",
        "GENERATE if metadata else route.value, to)",
        _WIRES_HTTP,
    ),
    Mutant(
        "a hash-matched decode gets a stripped image leg (the P2P check off)",
        "pd_policy/decode_kv.py",
        "self.loads in (KvLoad.BY_CONTENT, KvLoad.NONE)",
        "self.loads is KvLoad.NONE",
        (*_WIRES_CORE, *_WIRES_HTTP),
    ),
    Mutant(
        "a recomputing decode gets a stripped image leg (the recompute check off)",
        "pd_policy/decode_kv.py",
        "or self.on_failure is LoadFailure.RECOMPUTE",
        "or False",
        (*_WIRES_CORE, *_WIRES_HTTP),
    ),
    Mutant(
        "a blind decode gets a stripped image leg (the decision's check off)",
        "pd_policy/decision.py",
        "    if blind_to_stripped_media and has_mm_inputs:\n",
        "    if False:\n",
        (*_WIRES_CORE, *_WIRES_HTTP),
    ),
    Mutant(
        "a blind decode gets a metadata leg",
        "pd_policy/decision.py",
        "        if blind_to_stripped_media:\n            raise MediaOnBlindDecode()\n",
        "",
        _WIRES_CORE,
    ),
    Mutant(
        "selection reuses a sighted decode's decision for a blind one",
        "pd_policy/selection.py",
        "request, language_model_only=kind[0], metadata=kind[1], blind=kind[2]",
        "request, language_model_only=kind[0], metadata=kind[1], blind=False",
        _WIRES_CORE,
    ),
    Mutant(
        "the proxy does not read a decode's connector from its /server_info",
        "pd_policy_vllm/openai/workers.py",
        'decode_kv=decode_kv_from_config(_section(config, "kv_transfer_config")),',
        'decode_kv=decode_kv_from_config({"kv_connector": "NixlConnector"}),',
        _WIRES_HTTP,
    ),
    Mutant(
        "the gRPC router does not read a decode's connector",
        "pd_policy_grpc/capability.py",
        'read = decode_kv_from_config({"kv_connector": server_info.kv_connector})',
        'read = decode_kv_from_config({"kv_connector": "NixlConnector"})',
        ("tests/grpc/test_grpc_capability.py",),
    ),
    Mutant(
        "the gRPC leg builder forgets a blind decode",
        "pd_policy_grpc/legs.py",
        "        blind_to_stripped_media=decode_worker.blind_to_stripped_media,\n",
        "",
        ("tests/grpc/test_grpc_legs.py",),
    ),
    # A failed transfer on the real wire (issue #44): the prefill's lease, a stream's head.
    Mutant(
        "the exchange relays a handoff past its prefill's lease",
        "pd_policy/exchange/machine.py",
        "            if self._check is not None and self._check.lease_ran_out(event.kv):\n",
        "            if False:\n",
        ("tests/test_exchange.py", *_EXCHANGE),
    ),
    Mutant(
        "the lease check keeps no margin for the decode",
        "pd_policy/kv_lease.py",
        "age >= lease - lease_margin(lease)",
        "age >= lease",
        (*_LEASE, "tests/test_exchange.py"),
    ),
    Mutant(
        "a MultiConnector's NIXL lease is read from its first connector",
        "pd_policy/kv_lease.py",
        "        if wire is not None and wire.mode in _LEASED:\n",
        "        if True:\n",
        _LEASE,
    ),
    Mutant(
        "a planned handoff forgets the prefill's lease",
        "pd_policy/connectors.py",
        "            lease=kv.lease,\n",
        "",
        _LEASE,
    ),
    Mutant(
        "the proxy does not read a prefill's lease from its /server_info",
        "pd_policy_vllm/openai/workers.py",
        "        lease=prefill_lease(kv, contract),\n",
        "        lease=prefill_lease({}, contract),\n",
        _FAILED_TRANSFER,
    ),
    Mutant(
        "the proxy ages a handoff from the prefill's answer, not from its leg",
        "pd_policy_vllm/http/send.py",
        "kv_facts(attempt.leg, time.monotonic() - sent)",
        "kv_facts(attempt.leg)",
        _FAILED_TRANSFER,
    ),
    Mutant(
        "the proxy sends a stream's head before the decode says the leg started",
        "pd_policy_vllm/http/relay.py",
        "            for data in event_data(held):\n                if decisive(data):\n",
        "            for data in event_data(held):\n                if True:\n",
        _FAILED_TRANSFER,
    ),
    Mutant(
        "the proxy relays a stream whose decode failed before its first output",
        "pd_policy_vllm/http/relay.py",
        "                    if failure is not None:\n                        raise failure\n",
        "",
        _FAILED_TRANSFER,
    ),
    Mutant(
        "a decode nothing describes is taken as vision-capable (fail open)",
        "pd_policy_vllm/http/fleet/describe.py",
        "            stated = UNDESCRIBED_DECODE\n",
        "            stated = WorkerCapability(Support.TRUE)\n",
        _CONFIG_FLEET,
    ),
    Mutant(
        "the file wins over the environment",
        "pd_policy_vllm/http/config/layers.py",
        """        elif environ.get(setting.env, "") != "":
            values[key], sources[key] = _from_env(setting, environ[setting.env]), "env"
        elif key in file:
            values[key], sources[key] = _from_file(setting, file[key], path), "file"
""",
        """        elif key in file:
            values[key], sources[key] = _from_file(setting, file[key], path), "file"
        elif environ.get(setting.env, "") != "":
            values[key], sources[key] = _from_env(setting, environ[setting.env]), "env"
""",
        _CONFIG,
    ),
    Mutant(
        "an unknown key of the file is ignored",
        "pd_policy_vllm/http/config/layers.py",
        "    _check_keys(file, [s.key for s in settings], path)\n",
        "",
        _CONFIG,
    ),
    Mutant(
        "--print-config shows a secret",
        "pd_policy_vllm/http/config/shown.py",
        "        if setting.secret:\n",
        "        if setting.secret and False:\n",
        _CONFIG,
    ),
    Mutant(
        "a worker the file describes is described by the flags when it comes back",
        "pd_policy_vllm/http/fleet/probe.py",
        "        return self.stated.get((member.role, member.name), self.says)\n",
        "        return self.says\n",
        _CONFIG_FLEET,
    ),
    Mutant(
        "ready while draining",
        "pd_policy/fleet/readiness.py",
        '    why = ["draining: stopping, its requests in flight finishing"] if draining else []\n',
        "    why: list[str] = []\n",
        _LIFECYCLE,
    ),
    Mutant(
        "ready with no routable decode",
        "pd_policy/fleet/readiness.py",
        'NEEDED_ROLES = ("prefill", "decode")\n',
        'NEEDED_ROLES = ("prefill",)\n',
        _LIFECYCLE,
    ),
    Mutant(
        "SIGTERM stops serving at once, no pre-stop",
        "pd_policy_vllm/http/serving.py",
        "    if received == signal.SIGTERM and args.pre_stop_seconds > 0:\n",
        "    if False:\n",
        _LIFECYCLE,
    ),
    Mutant(
        "a proxy process that dies is not restarted",
        "pd_policy_vllm/http/serving.py",
        "        start(slot, restarted=True)\n",
        "",
        ("tests/http/test_http_processes.py",),
    ),
    Mutant(
        "each process binds port 0 on its own",
        "pd_policy_vllm/http/serving.py",
        '    holders, shared = [holder], {"port": port}\n',
        "    holders, shared = [holder], {}\n",
        ("tests/http/test_http_processes.py",),
    ),
    Mutant(
        "a reload keeps a revoked client key",
        "pd_policy_vllm/http/reload.py",
        "    proxy.keys = Keys(proxy.keys.worker, keys.clients, keys.admins)\n",
        "",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a reload leaves a worker the file no longer lists in service",
        "pd_policy_vllm/http/reload.py",
        "            proxy.fleet.drain(member)\n",
        "            pass\n",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a reload applies a setting that takes a restart",
        "pd_policy_vllm/http/reload.py",
        "        **{key: getattr(new, key) for key in RELOADED if hasattr(new, key)},\n",
        "        **vars(new),\n",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a worker that leaves DNS keeps serving",
        "pd_policy_vllm/http/fleet/discovery.py",
        "        fleet.drain(member)\n",
        "        pass\n",
        ("tests/http/test_http_discovery.py",),
    ),
    Mutant(
        "a reload drains the workers a followed name found",
        "pd_policy_vllm/http/reload.py",
        "(role, name) in wanted or (role, name) in found  # DNS's",
        "(role, name) in wanted  # DNS's",
        ("tests/http/test_http_discovery.py",),
    ),
    Mutant(
        "a reload keeps following the names it started with",
        "pd_policy_vllm/http/reload.py",
        "    _follow(proxy, applied)\n",
        "",
        ("tests/http/test_http_discovery.py",),
    ),
    Mutant(
        "a restarted process serves the configuration read at start",
        "pd_policy_vllm/http/serving.py",
        '{"restarted": restarted,',
        '{"restarted": False,',
        ("tests/http/test_http_processes.py",),
    ),
    Mutant(
        "a watched file is read once, at start",
        "pd_policy_vllm/http/watch.py",
        "        if now == last:\n",
        "        if True:\n",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "the watched file is hashed without the keys files it names",
        "pd_policy_vllm/http/watch.py",
        "    return (Path(config), *(Path(path) for path in keys if path))\n",
        "    return (Path(config),)\n",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a scrape of several processes answers for the one that took it",
        "pd_policy_vllm/http/proxy.py",
        "            body = await self.siblings.metrics(body)\n",
        "            pass\n",
        ("tests/http/test_http_metrics_merge.py",),
    ),
    Mutant(
        "merged processes' series are not told apart",
        "pd_policy_vllm/http/fleet/metrics_merge.py",
        "                labels = {**sample.labels, PROCESS_LABEL: process}\n",
        "                labels = dict(sample.labels)\n",
        ("tests/http/test_http_metrics_merge.py",),
    ),
    Mutant(
        "a restart is not counted",
        "pd_policy_vllm/http/serving.py",
        "        restarts[slot] += 1  # counted in /metrics by the child in its slot\n",
        "",
        ("tests/http/test_http_metrics_merge.py",),
    ),
    Mutant(
        "a proxy process reads no KV events",
        "pd_policy_vllm/http/background.py",
        "if kv_routing is None else kv_routing.running(fleet)",
        "",
        ("tests/http/test_http_processes.py",),
    ),
    Mutant(
        "a key a reload adds is not redacted from the log",
        "pd_policy_vllm/http/reload.py",
        "    redact_logs(keys)  # the filter adds them: an old key stays redacted, once a secret\n",
        "",
        ("tests/http/test_http_log_secrets.py",),
    ),
    Mutant(
        "a whole answer's time is counted as its time to first token",
        "pd_policy_vllm/http/driver.py",
        "if decode and streamed else None,",
        "if decode and answered else None,",
        ("tests/http/test_http_metrics_meaning.py",),
    ),
    Mutant(
        "a refusal at the door has no latency",
        "pd_policy_vllm/http/driver.py",
        "            self.metrics.observe_duration(path, time.monotonic() - arrived)\n",
        "",
        ("tests/http/test_http_metrics_meaning.py",),
    ),
    Mutant(
        "the latency buckets end at a minute",
        "pd_policy_vllm/http/fleet/metrics.py",
        "    while buckets[-1] < longest:\n",
        "    while False:\n",
        ("tests/http/test_http_metrics_meaning.py",),
    ),
    Mutant(
        "a leg queued for a connection is not counted",
        "pd_policy_vllm/http/upstream/client.py",
        "        self.queued += 1\n",
        "",
        ("tests/http/test_http_metrics_meaning.py",),
    ),
    Mutant(
        "a leg goes without its span's trace context",
        "pd_policy_vllm/http/tracing.py",
        "            inject(carrier)  # the leg span's context, W3C Trace Context\n",
        "",
        ("tests/http/test_http_tracing.py",),
    ),
    Mutant(
        "tracing off, a client's trace context is dropped",
        "pd_policy_vllm/http/driver.py",
        "            headers.update(traced.passed)\n",
        "            pass\n",
        ("tests/http/test_http_tracing.py",),
    ),
    Mutant(
        "a leg's large part is copied by a join",
        "pd_policy_vllm/http/upstream/connection.py",
        "            if len(part) >= _JOINED:\n",
        "            if False:\n",
        ("tests/http/test_http_upstream_writes.py",),
    ),
    Mutant(
        "a leg's small parts go a write each",
        "pd_policy_vllm/http/upstream/connection.py",
        "            if pending and size + len(part) > _JOINED:\n",
        "            if pending:\n",
        ("tests/http/test_http_upstream_writes.py",),
    ),
    Mutant(
        "a reload's limits are never applied",
        "pd_policy_vllm/http/reload.py",
        "    proxy.relimit(front_door(applied), upstream_limits(applied), "
        "applied.request_timeout)\n",
        "",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a reload's limits on clients miss the requests (the driver keeps the start's)",
        "pd_policy_vllm/http/proxy.py",
        "            self._driver.front_door, self._driver.deadline = front_door, timeout\n",
        "            pass\n",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a reload's cap on client connections misses the gate",
        "pd_policy_vllm/http/proxy.py",
        "            self.gate.door = front_door\n",
        "            pass\n",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a reload's limits on workers miss the legs' client",
        "pd_policy_vllm/http/proxy.py",
        "            self._clients.legs.limits = limits\n",
        "            pass\n",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "a kept-alive connection to a worker keeps the limits it was made with",
        "pd_policy_vllm/http/upstream/client.py",
        "                connection.limits = self.limits  # a reload's, from its next leg on\n",
        "",
        ("tests/http/test_http_reload.py",),
    ),
    Mutant(
        "the gRPC routers' legs go without the caller's trace context",
        "pd_policy_grpc/driver.py",
        "                    attempt.metadata = metadata\n",
        "                    pass\n",
        ("tests/grpc/test_grpc_trace_context.py",),
    ),
    Mutant(
        "the Ray decode server's legs carry a client's trace context unchecked",
        "pd_policy_ray/tracing.py",
        "    headers.update(passed_on({k.lower(): v for k, v in sent.items()}))\n",
        "    headers.update(sent)\n",
        ("tests/ray/test_ray_tracing.py",),
    ),
    Mutant(
        "a client's traceparent is passed on unchecked",
        "pd_policy/trace_context.py",
        "    if parent is None or trace_id_of(parent) is None:\n",
        "    if not parent:\n",
        ("tests/http/test_http_tracing.py", "tests/test_trace_context.py"),
    ),
    Mutant(
        "a failing resolution empties the fleet",
        "pd_policy_vllm/http/fleet/discovery.py",
        "            urls = set(mine.values())\n",
        "            urls = set()\n",
        ("tests/http/test_http_discovery.py",),
    ),
    Mutant(
        "an SRV record's port is read as the source's",
        "pd_policy_vllm/http/fleet/discovery.py",
        "            _url(source.scheme, record.target.to_text(), record.port)\n",
        "            _url(source.scheme, record.target.to_text(), 80)\n",
        ("tests/http/test_http_discovery.py",),
    ),
    Mutant(
        "a name's answer is taken whole, however long",
        "pd_policy_vllm/http/fleet/discovery.py",
        "        if len(urls) > MAX_FOUND:\n",
        "        if False:\n",
        ("tests/http/test_http_discovery.py",),
    ),
    Mutant(
        "the drain waits for no request in flight",
        "pd_policy_vllm/http/serving.py",
        "        shutdown_timeout=args.drain_seconds,\n",
        "        shutdown_timeout=0,\n",
        _LIFECYCLE,
    ),
)


def run(mutant: Mutant, scratch: Path) -> tuple[bool, float]:
    """Apply ``mutant`` to a fresh copy of src/ and run its tests; True if they failed."""
    src = scratch / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    target = src / mutant.path
    text = target.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"{mutant.name}: the text to mutate is not in {mutant.path} once")
    target.write_text(text.replace(mutant.old, mutant.new))
    env = {**os.environ, "PYTHONPATH": str(src), "HYPOTHESIS_PROFILE": "ci"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    where = subprocess.run(
        [sys.executable, "-c", "import pd_policy, pd_policy_grpc; print(pd_policy.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(src)), f"the mutant is not what imports: {where.stdout}"
    started = time.monotonic()
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
         "--hypothesis-seed=0", *mutant.tests],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    return tests.returncode != 0, time.monotonic() - started


def main(argv: list[str]) -> int:
    """Run every mutant, or (``-k TEXT``) those whose name holds ``TEXT``."""
    chosen: tuple[Mutant, ...] = MUTANTS
    if argv[:1] == ["-k"] and len(argv) == 2:
        chosen = tuple(m for m in MUTANTS if argv[1] in m.name)
    survivors = []
    with tempfile.TemporaryDirectory(prefix="pd-mutants-") as scratch:
        for mutant in chosen:
            killed, seconds = run(mutant, Path(scratch))
            print(
                f"{'killed ' if killed else 'SURVIVED'} {seconds:5.1f}s  {mutant.name}", flush=True
            )
            if not killed:
                survivors.append(mutant.name)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
