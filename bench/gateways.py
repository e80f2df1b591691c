"""Router CPU per request beside SMG's own gateway (``smg`` 1.13.0, Rust), in one run.

Every router is a process of its own, in front of stub engines that answer at once,
on loopback, driven by this process with ``IN_FLIGHT`` requests at a time, at three
media sizes (none, 100 KB, 4 MB). What each router does per request:

- *SMG gateway* (``smg launch --pd-disaggregation``, gRPC to the engines): takes an
  OpenAI chat request with a PNG data URL, tokenizes it, decodes and preprocesses
  the image, sends the prefill leg (pixels included) and a decode leg to the engines
  (``bench/grpc_stubs.py``);
- *SequentialPd* and *SequentialPdBytes* (``bench/grpc_router.py``, gRPC front and
  back): take a tokenized ``GenerateRequest`` whose pixels are already preprocessed
  (that many bytes of ``pixel_values``), check it, decide, and send the sanitised
  prefill leg and a pixel-free decode leg to the same engines; the first on messages,
  the second on bytes end to end, and once more on worker channels with gRPC's
  retries off;
- *pd-policy-proxy* (HTTP front and back, ``bench/http_stubs.py``): takes the same chat
  request as SMG, hashes each image, decides, sends the prefill leg (the image as
  it came) and a pixel-free decode leg with the prefill's 4096 expanded ids.

Every request is not streamed (SMG's gateway then sends its decode leg with
``stream`` off), and again streamed at 100 KB for SMG and the byte routers. Per
router and size: its processes' CPU time per request (the steadiest figure on
two shared cores), requests per second and p99 latency, as medians over rounds that
alternate the routers' order. The SMG gateway and the proxy pay for the text and the
image's form they get; the gRPC routers get their requests tokenized.

Needs the SMG venv (``make bench`` builds ``.venv-smg``) and the test venv (torch and
transformers build the tiny model directory SMG reads its tokenizer from).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Final

import aiohttp
from grpc_load import TOKENS
from http_proxy import _port, _process
from measuring import percentile

import grpc
from pd_policy import Modality
from pd_policy_grpc.wire import modality_to_wire, pb

#: The section of docs/performance.md this bench writes.
NAME: Final = "performance-gateways"
HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
SMG: Final = ROOT / ".venv-smg" / "bin" / "smg"
IN_FLIGHT: Final = 64
SIZES: Final = {"none": 0, "100KB": 100_000, "4MB": 4_000_000}
#: SequentialPdBytes on worker channels with gRPC's retries off (see bench/grpc_router.py).
NO_RETRIES: Final = "SequentialPdBytes, no retries"
ROUTERS: Final = ("SMG gateway", "SequentialPd", "SequentialPdBytes", NO_RETRIES, "pd-policy-proxy")
#: Streamed requests, at 100 KB: every router then relays a message per token.
STREAMED: Final = "100KB, streamed"
STREAMED_ROUTERS: Final = ("SMG gateway", "SequentialPdBytes", NO_RETRIES)
CASES: Final = {**dict.fromkeys(SIZES, ROUTERS), STREAMED: STREAMED_ROUTERS}
_BYTES = "SequentialPdBytes ÷ SMG, CPU per request"
_PROXY = "pd-policy-proxy ÷ SMG, CPU per request"
TARGETS: Final = {
    "SequentialPdBytes_over_smg_100KB": (f"{_BYTES}, 100 KB", "<=", 1.0),
    "SequentialPdBytes_over_smg_4MB": (f"{_BYTES}, 4 MB", "<=", 1.0),
    "proxy_over_smg_100KB": (f"{_PROXY}, 100 KB", "<=", 1.0),
    "proxy_over_smg_4MB": (f"{_PROXY}, 4 MB", "<=", 1.0),
    "proxy_user_growth_over_hash": (
        "pd-policy-proxy user-space CPU growth, 100 KB → 4 MB ÷ one SHA-256 pass of the 3.9 MB",
        "<=",
        1.5,
    ),
}
_SERVICE: Final = pb.DESCRIPTOR.services_by_name["VllmEngine"].full_name


# --- media -------------------------------------------------------------------------


def png(size: int) -> bytes:
    """A PNG of random pixels of about ``size`` bytes (noise does not compress)."""
    from PIL import Image

    side = max(int((size / 3) ** 0.5), 1)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, "PNG")
    return out.getvalue()


def chat_body(model: str, size: int, *, stream: bool = False) -> bytes:
    content: list[dict[str, Any]] = [{"type": "text", "text": "what is in the picture?"}]
    if size:
        url = "data:image/png;base64," + base64.b64encode(png(size)).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": TOKENS}  # fmt: skip
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def generate_request(size: int, *, stream: bool = False) -> bytes:
    """A tokenized request as a gRPC router receives it: ``size`` bytes of preprocessed
    pixels behind 16 placeholder ids (none for ``size`` 0). Not streamed unless
    ``stream``, as the chat requests SMG's gateway and the proxy get are not."""
    msg = pb.GenerateRequest(request_id="bench", stream=stream)
    head, tail = [1, 3148, 338, 445], [13, 22550, 29901]
    msg.sampling_params.max_tokens = TOKENS
    if not size:
        msg.tokenized.input_ids.extend(head + tail)
        return msg.SerializeToString()
    msg.tokenized.input_ids.extend(head + [32000] * 16 + tail)
    batch = msg.mm_inputs
    batch.modality = modality_to_wire(Modality.IMAGE)
    batch.mm_hashes.append(hashlib.sha256(b"bench").hexdigest())
    batch.im_token_id = 32000
    batch.pixel_values.shape.extend([1, size])
    batch.pixel_values.dtype = "uint8"
    batch.pixel_values.inline = os.urandom(size)
    batch.mm_placeholders.add(offset=len(head), length=16)
    return msg.SerializeToString()


# --- processes and their CPU -------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    out = [pid]
    with contextlib.suppress(FileNotFoundError):  # a thread or process that just ended
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                for child in (task / "children").read_text().split():
                    out += _descendants(int(child))
    return out


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU of ``pid`` and every process under it, and the system part."""
    total = kernel = 0
    for p in _descendants(pid):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{p}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            kernel += int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return total / tick, kernel / tick


# --- load --------------------------------------------------------------------------

Call = Callable[[], Awaitable[bool]]


def http_call(session: aiohttp.ClientSession, url: str, body: bytes) -> Call:
    async def call() -> bool:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
            await r.read()
            return r.status == 200

    return call


def grpc_call(channel: grpc.aio.Channel, data: bytes) -> Call:
    generate: Any = channel.unary_stream(f"/{_SERVICE}/Generate")
    # A streamed request gets a chunk per token and the completion; one that is not,
    # the completion alone (see grpc_load.DecodeEngine).
    expected = TOKENS + 1 if pb.GenerateRequest.FromString(data).stream else 1

    async def call() -> bool:
        try:
            responses = [r async for r in generate(data)]
        except grpc.aio.AioRpcError:
            return False
        return len(responses) == expected

    return call


async def run_load(call: Call, requests: int, pid: int) -> dict[str, float]:
    """``requests`` calls, ``IN_FLIGHT`` at a time: CPU per request, rate, p99, failures."""
    latencies: list[float] = []
    failed = 0
    queue = iter(range(requests))

    async def worker() -> None:
        nonlocal failed
        for _ in queue:
            start = time.perf_counter()
            ok = await call()
            latencies.append(time.perf_counter() - start)
            failed += not ok

    (before, kernel_before), began = cpu_times(pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    wall, (after, kernel_after) = time.perf_counter() - began, cpu_times(pid)
    cpu, kernel = after - before, kernel_after - kernel_before
    return {"cpu_ms_per_request": cpu / requests * 1e3, "requests_per_second": requests / wall,
            "kernel_ms_per_request": kernel / requests * 1e3,
            "user_ms_per_request": (cpu - kernel) / requests * 1e3,
            "p99_ms": percentile(latencies, 0.99) * 1e3, "failed": failed}  # fmt: skip


@contextlib.contextmanager
def model_directory() -> Iterator[Path]:
    # SMG picks its image processor by a substring of the model's name: "llava-1.5".
    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    from tiny_models import build_llava  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "llava-1.5-tiny"
        build_llava(directory)
        yield directory


def _hash_ms(body: bytes) -> float:
    """The proxy's SHA-256 of this body's data URL, timed here (the target leaves it out)."""
    start = body.find(b"data:")
    if start < 0:
        return 0.0
    url = body[start : body.index(b'"', start)]
    began, count = time.perf_counter(), 20
    for _ in range(count):
        hashlib.sha256(url).digest()
    return (time.perf_counter() - began) / count * 1e3


async def _until(call: Call, what: str) -> None:
    deadline = time.monotonic() + 90
    while not await _quiet(call):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer within 90 s")
        await asyncio.sleep(0.3)


async def _quiet(call: Call) -> bool:
    try:
        return await call()
    except (aiohttp.ClientError, OSError):
        return False


async def _measure(model: Path, quick: bool) -> dict[str, Any]:
    ports = {name: _port() for name in ("prefill", "decode", "hp", "hd", "smg", "smg_metrics",
                                        "messages", "bytes", "no_retries", "proxy")}  # fmt: skip
    engines = (f"127.0.0.1:{ports['prefill']}", f"127.0.0.1:{ports['decode']}")
    http_workers = (f"http://127.0.0.1:{ports['hp']}", f"http://127.0.0.1:{ports['hd']}")
    counts = {"none": 96, "100KB": 96, "4MB": 16} if quick else {"none": 640, "100KB": 640,
                                                                 "4MB": 128}  # fmt: skip
    counts[STREAMED] = counts["100KB"]
    rounds = 2 if quick else 3
    smg_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_process(str(HERE / "grpc_stubs.py"), str(ports["prefill"]),
                                     str(ports["decode"]), str(model)))  # fmt: skip
        stack.enter_context(_process(str(HERE / "http_stubs.py"), str(ports["hp"]),
                                     str(ports["hd"])))  # fmt: skip
        pids = {
            "SMG gateway": stack.enter_context(_process(
                "launch", "--pd-disaggregation", "--prefill", f"grpc://{engines[0]}",
                "--decode", f"grpc://{engines[1]}", "--model-path", str(model),
                "--host", "127.0.0.1", "--port", str(ports["smg"]),
                "--prometheus-host", "127.0.0.1", "--prometheus-port",
                str(ports["smg_metrics"]), "--policy", "round_robin",
                "--mm-processing", "router", "--log-level", "warn",
                program=str(SMG), env=smg_env)).pid,
            "SequentialPd": stack.enter_context(_process(
                str(HERE / "grpc_router.py"), str(ports["messages"]), *engines, "messages")).pid,
            "SequentialPdBytes": stack.enter_context(_process(
                str(HERE / "grpc_router.py"), str(ports["bytes"]), *engines, "bytes")).pid,
            NO_RETRIES: stack.enter_context(_process(
                str(HERE / "grpc_router.py"), str(ports["no_retries"]), *engines, "bytes",
                "no-retries")).pid,
            "pd-policy-proxy": stack.enter_context(_process(
                "-m", "pd_policy_vllm.http.cli", "--prefill", http_workers[0], "--decode",
                http_workers[1], "--port", str(ports["proxy"]), "--kv-mode", "nixl",
                "--decode-capability", "lm-only", "--no-mrope", "--no-access-log")).pid,
        }  # fmt: skip
        options = [("grpc.max_send_message_length", 2**30),
                   ("grpc.max_receive_message_length", 2**30)]  # fmt: skip
        channels = {name: grpc.aio.insecure_channel(f"127.0.0.1:{ports[key]}", options=options)
                    for name, key in (("SequentialPd", "messages"),
                                      ("SequentialPdBytes", "bytes"),
                                      (NO_RETRIES, "no_retries"))}  # fmt: skip
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            smg_url = f"http://127.0.0.1:{ports['smg']}/v1/chat/completions"
            proxy_url = f"http://127.0.0.1:{ports['proxy']}/v1/chat/completions"

            def calls(label: str) -> dict[str, Call]:
                stream = label == STREAMED
                size = SIZES["100KB" if stream else label]
                chat = chat_body(str(model), size, stream=stream)
                wire = generate_request(size, stream=stream)
                return {
                    "SMG gateway": http_call(session, smg_url, chat),
                    "SequentialPd": grpc_call(channels["SequentialPd"], wire),
                    "SequentialPdBytes": grpc_call(channels["SequentialPdBytes"], wire),
                    NO_RETRIES: grpc_call(channels[NO_RETRIES], wire),
                    "pd-policy-proxy": http_call(session, proxy_url, chat_body("m", size)),
                }

            warm = calls("100KB")
            for name, call in warm.items():
                await _until(call, name)
            results: dict[str, Any] = {}
            for label, routers in CASES.items():
                by_size = calls(label)
                per_round: dict[str, list[dict[str, float]]] = {n: [] for n in routers}
                for name in routers:  # warm-up at this size
                    await run_load(by_size[name], IN_FLIGHT, pids[name])
                for i in range(rounds):
                    for name in routers if i % 2 == 0 else routers[::-1]:
                        figures = await run_load(by_size[name], counts[label], pids[name])
                        per_round[name].append(figures)
                results[label] = {
                    name: {key: statistics.median(r[key] for r in per_round[name])
                           for key in per_round[name][0]}
                    for name in routers
                }  # fmt: skip
                if label in SIZES:
                    results[label]["hash_ms"] = _hash_ms(chat_body("m", SIZES[label]))
        for channel in channels.values():
            await channel.close()
    return results


def _ratios(results: dict[str, Any]) -> dict[str, float]:
    def cpu(label: str, name: str) -> float:
        value: float = results[label][name]["cpu_ms_per_request"]
        return value

    out = {}
    for label in ("100KB", "4MB"):
        smg = cpu(label, "SMG gateway")
        out[f"SequentialPdBytes_over_smg_{label}"] = cpu(label, "SequentialPdBytes") / smg
        out[f"proxy_over_smg_{label}"] = cpu(label, "pd-policy-proxy") / smg
    out["bytes_over_smg_streamed"] = cpu(STREAMED, "SequentialPdBytes") / cpu(
        STREAMED, "SMG gateway"
    )
    # What the proxy's own code spends on the image's 3.9 MB more, against the one pass
    # over them it cannot avoid (the content hash of its identity). The kernel's copies
    # (the sockets, the page faults of fresh buffers) are left out and shown beside it.
    proxy = {label: results[label]["pd-policy-proxy"] for label in ("100KB", "4MB")}
    hashed = results["4MB"]["hash_ms"] - results["100KB"]["hash_ms"]
    user = proxy["4MB"]["user_ms_per_request"] - proxy["100KB"]["user_ms_per_request"]
    out["proxy_user_growth_over_hash"] = user / hashed
    out["proxy_user_growth_ms"] = user
    out["proxy_kernel_growth_ms"] = (
        proxy["4MB"]["kernel_ms_per_request"] - proxy["100KB"]["kernel_ms_per_request"]
    )
    return out


def measure(quick: bool = False) -> dict[str, Any]:
    """Run the routers benchmark; see the module docs. Raises ``FileNotFoundError`` when
    the SMG venv is missing."""
    if not SMG.exists():
        raise FileNotFoundError(f"{SMG} is missing: make bench builds it (make .venv-smg/.smg)")
    began = time.perf_counter()
    with model_directory() as model:
        results = asyncio.run(_measure(model, quick))
    results["ratios"] = _ratios(results)
    results["seconds"] = time.perf_counter() - began
    results["in_flight"] = IN_FLIGHT
    return results


def table(results: dict[str, Any]) -> str:
    """The routers side by side, one row per router and size, with the targets."""
    rows = [
        "| router | media | CPU per request | requests/s | p99 | failed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in ROUTERS:
        for label, routers in CASES.items():
            if name not in routers:
                continue
            r = results[label][name]
            rows.append(
                f"| {name} | {label} | {r['cpu_ms_per_request']:.2f} ms | "
                f"{r['requests_per_second']:.0f} | {r['p99_ms']:.1f} ms | {r['failed']:.0f} |"
            )
    rows += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for key, (label, op, goal) in TARGETS.items():
        value = results["ratios"][key]
        met = value <= goal if op == "<=" else value >= goal
        rows.append(f"| {label} | {value:.2f} | {op} {goal} | {'yes' if met else 'no'} |")
    rows.append("")
    rows.append(
        f"{results['in_flight']} requests in flight, not streamed but in the streamed rows; "
        f"streamed, SequentialPdBytes ÷ SMG is {results['ratios']['bytes_over_smg_streamed']:.2f} "
        "(informative). The last target's hash pass: "
        f"{results['4MB']['hash_ms'] - results['100KB']['hash_ms']:.2f} ms (SHA-256 of the "
        "data URL at 4 MB less at 100 KB, timed in the driver). From 100 KB to 4 MB the "
        f"proxy's user-space CPU per request grew {results['ratios']['proxy_user_growth_ms']:.2f}"
        f" ms and its kernel time {results['ratios']['proxy_kernel_growth_ms']:.2f} ms (the "
        "sockets' copies and fresh pages; no proxy in a process avoids them). "
        f"{results['seconds']:.0f} s in all."
    )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(measure(quick="--quick" in sys.argv)))
