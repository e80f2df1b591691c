"""Video and audio through P/D and E/P/D on this CPU, and new content at one URL.

``make demo-media`` runs it. It builds the tests' tiny Qwen2-VL and Qwen2-Audio (locally,
no model hub) and, one model at a time, starts real ``vllm serve`` workers on 127.0.0.1:
for Qwen2-VL a full-vision prefill (also the full server to match), a
``--language-model-only`` decode, an encoder and an E/P/D prefill; for Qwen2-Audio a
full prefill and a ``--language-model-only`` decode. The KV goes over vLLM's
``NixlConnector``, NIXL's progress thread off by the tests' switch
(``PD_POLICY_TEST_NIXL_PROGRESS_THREAD=on`` runs it as shipped); each row says what NIXL
moved for it, from the decode's ``/metrics``. No worker runs vLLM's development mode:
a configuration file the demo writes (printed) tells the proxy what each is. A proxy in
this process sends each request through them, and the same request goes to the full
server. A media host on
127.0.0.1 serves one URL whose content changes between requests. It prints one table,
with the columns of ``make demo-live``, and stops every process it started, by id.

Run: ``python examples/live_media.py`` (in the venv ``make test`` builds). About five
minutes, most of it the servers starting.
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # the model builders and server helpers

Row = list[str]


def _run(url: str, request: dict[str, Any]) -> tuple[list[int], list[float], dict[str, Any]]:
    from http_peers import http_json

    status, reply = http_json(f"{url}/v1/chat/completions", request)
    assert status == 200, reply
    choice = reply["choices"][0]
    logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
    return choice["token_ids"], logprobs, reply.get("kv_transfer_params") or {}


def _row(label: str, proxy: str, full: str, request: dict[str, Any], leg: Any, decode: str) -> Row:
    """One request through the proxy and to the full server; ``leg`` reads the decode leg,
    and the decode's NIXL counters say what NIXL moved for it."""
    from nixl_peers import nixl_counters

    before = nixl_counters(decode)
    tokens, logprobs, _ = _run(proxy, request)
    moved = nixl_counters(decode) - before
    want, want_logprobs, _ = _run(full, request)
    worst = max(abs(a - b) for a, b in zip(logprobs, want_logprobs, strict=True))
    match = "yes" if tokens == want and worst <= 1e-5 else "NO"
    kv = f"{moved.bytes / 1024:.0f} KiB in {moved.transfers:.0f}"
    kv += f", {moved.failed:.0f} FAILED" if moved.failed else ""
    return [label, str(tokens), str(want), match, kv, leg()]


def _described(*argv: str) -> list[str]:
    """The proxy's worker flags ``argv``, the workers in a configuration file: printed."""
    from described import described_argv, shown

    described = described_argv(argv)
    print(shown(described), flush=True)
    return described


def _body(parts: list[dict[str, Any]], words: str) -> dict[str, Any]:
    content = [*parts, {"type": "text", "text": words}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 6,
            "temperature": 0, "logprobs": True, "return_token_ids": True}  # fmt: skip


def _media_bytes(leg: dict[str, Any]) -> str:
    # What of the media a decode leg carried: a generate leg's items (a grid is ~100 bytes),
    # or a chat leg's media parts (none).
    features = leg.get("features") or {}
    items = sum(len(i) for data in (features.get("kwargs_data") or {}).values() for i in data)
    if features:
        return f"ids, hash, grid ({items} B of items); no pixels"
    parts = [p for m in leg.get("messages", []) if isinstance(m.get("content"), list)
             for p in m["content"] if p.get("type") != "text"]  # fmt: skip
    return f"ids, salt {leg.get('cache_salt', '')[:8]}; {len(parts)} media parts"


def qwen_rows(work: Path) -> list[Row]:
    from epd_peers import epd_fleet
    from http_fleets import http_fleet
    from http_peers import InProcessProxy, MediaHost, data_url, read_fleet
    from media_clips import data_url_of, video_clip
    from qwen_prompts import _WORDS, A, B
    from tiny_models import build_qwen2vl

    from pd_policy_vllm.http.media.guard import MediaLimits
    from pd_policy_vllm.http.proxy import Proxy

    words = " ".join(_WORDS[(i * 7) % len(_WORDS)] for i in range(40))
    clips = {
        name: {
            "type": "video_url",
            "video_url": {"url": data_url_of(video_clip(seed), "video/mp4")},
        }
        for name, seed in (("A", 1), ("B", 2))
    }
    model = build_qwen2vl(work / "qwen2vl")
    rows: list[Row] = []
    limits = {"image": 1, "video": 1}
    servers_ = http_fleet(model, work / "qwen-servers", scale_out=True, limits=limits, nixl=True)
    with servers_ as servers:
        prefill, decodes = read_fleet(*_described("--prefill", servers.prefill,
                                                  "--decode", servers.decode))  # fmt: skip
        # The media host is on 127.0.0.1, which the proxy refuses by default.
        lab = MediaLimits(allow_private_hosts=True)
        proxy = Proxy(prefill, decodes, mrope=True, media_limits=lab)
        with InProcessProxy(proxy) as pd, MediaHost() as host:

            def last(proxy: InProcessProxy = pd) -> str:
                generates = [s.body for s in proxy.sent_to(servers.decode)]
                return _media_bytes(next(b for b in reversed(generates) if "features" in b))

            for name in ("A", "B", "A"):
                rows.append(
                    _row(
                        f"video {name}, P/D",
                        pd.url,
                        servers.baseline,
                        _body([clips[name]], f"pd {words}"),
                        last,
                        servers.decode,
                    )
                )
            both = [{"type": "image_url", "image_url": {"url": data_url(A)}}, clips["B"]]
            rows.append(
                _row(
                    "image A + video B, P/D",
                    pd.url,
                    servers.baseline,
                    _body(both, f"both {words}"),
                    last,
                    servers.decode,
                )
            )
            for name, picture in (("A", A), ("B", B)):
                buffer = io.BytesIO()
                picture.save(buffer, format="PNG")
                url = host.serve("latest.png", buffer.getvalue(), "image/png")
                part = {"type": "image_url", "image_url": {"url": url}}
                # The full server fetches the URL itself, and gets what it serves now.
                rows.append(
                    _row(
                        f"one URL, now image {name}",
                        pd.url,
                        servers.baseline,
                        _body([part], f"url {words}"),
                        last,
                        servers.decode,
                    )
                )
        with epd_fleet(servers, mrope=True) as epd:

            def epd_last() -> str:
                return last(epd.proxy)

            for name in ("A", "B"):
                rows.append(_row(f"video {name}, E/P/D", epd.proxy.url, servers.baseline,
                                 _body([clips[name]], f"epd {words}"), epd_last,
                                 servers.decode))  # fmt: skip
    return rows


def audio_rows(work: Path) -> list[Row]:
    from http_fleets import pd_fleet
    from http_peers import InProcessProxy, MediaHost, read_fleet
    from media_clips import audio_clip, data_url_of, input_audio
    from tiny_audio import build_qwen2audio

    from pd_policy_vllm.http.media.guard import MediaLimits
    from pd_policy_vllm.http.proxy import Proxy

    model = build_qwen2audio(work / "qwen2audio")
    clips = {"A": audio_clip(1), "B": audio_clip(2)}
    rows: list[Row] = []
    with pd_fleet(model, work / "audio-servers", limits={"audio": 1}, nixl=True) as servers:
        prefill, decodes = read_fleet(*_described("--prefill", servers.prefill,
                                                  "--decode", servers.decode))  # fmt: skip
        # The media host is on 127.0.0.1, which the proxy refuses by default.
        lab = MediaLimits(allow_private_hosts=True)
        proxy = Proxy(prefill, decodes, mrope=False, media_limits=lab)
        with InProcessProxy(proxy) as pd, MediaHost() as host:

            def last() -> str:
                return _media_bytes(pd.sent_to(servers.decode)[-1].body)

            for name in ("A", "B", "A"):
                request = _body([input_audio(clips[name])], "what is this sound")
                rows.append(
                    _row(
                        f"audio {name} (input_audio), P/D",
                        pd.url,
                        servers.baseline,
                        request,
                        last,
                        servers.decode,
                    )
                )
            url = data_url_of(clips["B"], "audio/wav")
            part = {"type": "audio_url", "audio_url": {"url": url}}
            rows.append(
                _row(
                    "audio B (audio_url), P/D",
                    pd.url,
                    servers.baseline,
                    _body([part], "what is this sound"),
                    last,
                    servers.decode,
                )
            )
            for name in ("A", "B"):
                url = host.serve("latest.wav", clips[name], "audio/wav")
                remote = {"type": "audio_url", "audio_url": {"url": url}}
                rows.append(
                    _row(
                        f"one URL, now audio {name}",
                        pd.url,
                        servers.baseline,
                        _body([remote], "what is this sound"),
                        last,
                        servers.decode,
                    )
                )
    return rows


def main() -> int:
    from nixl_peers import nixl_note

    print(nixl_note("the workers"), flush=True)
    work = Path(tempfile.mkdtemp(prefix="pd-policy-media-demo-"))
    header = ["request", "decode output", "one full server", "match", "NIXL moved",
              "decode leg"]  # fmt: skip
    rows = [header, *qwen_rows(work), *audio_rows(work)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print()
    print("Video and audio on language-model-only decode workers: tiny Qwen2-VL, Qwen2-Audio")
    print()
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print("Match: the tokens, and every logprob to 1e-5, equal one full server's. Video goes")
    print("over the metadata path: the decode worker gets each clip's grid and hash and no")
    print("frame; in E/P/D the pixels stop at the encoder. Audio's decode leg carries the ids")
    print("and a salt folded from each clip's bytes. One URL serving new content is answered")
    print("as the new content, because the item is named by its bytes, never by its URL.")
    print(json.dumps({"rows": len(rows) - 1, "all_match": all(r[3] == "yes" for r in rows[1:])}))
    return 0 if all(r[3] == "yes" for r in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
