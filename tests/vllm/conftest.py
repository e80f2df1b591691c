"""Live vLLM on CPU: tiny local models and in-process engines, shared by the whole session.

Engines run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: 0.2-3 s to start
instead of 20-45 s) with a 64 MiB KV cache (unbounded, vLLM sizes it to 90% of
RAM and touches it all). No test may reach a model hub (``HF_HUB_OFFLINE=1``).
At most four engines are alive at once: every engine fixture is session-scoped.

The ``vllm serve`` fleets the HTTP modules share (``llava_http``, ``qwen_http``) run one
at a time, and stop as soon as the run leaves the last module that uses them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from fleets import Fleets
from http_fleets import HttpFleet, PdFleet, http_fleet, pd_fleet
from live_engines import BLOCK_SIZE, connector, start_engine
from pool_fleet import Pool, pool_fleet
from ray_fleet import RayFleet, ray_fleet, ray_nixl_fleet
from tiny_audio import build_qwen2audio
from tiny_models import BUILDERS, TinyModel

# vLLM's environment is set by tests/conftest.py, before any test directory imports vLLM
# (tests/grpc's KV-routing tests run vLLM's publisher).


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    """Every tiny checkpoint, built once per session (about 6 s)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: build(root / name) for name, build in BUILDERS.items()}


@pytest.fixture(scope="session")
def qwen2audio(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """The tiny Qwen2-Audio, built on first use (only the audio modules need it)."""
    return build_qwen2audio(tmp_path_factory.mktemp("tiny-audio") / "qwen2audio")


@pytest.fixture(scope="session")
def llama(tiny_models: dict[str, TinyModel]) -> TinyModel:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def qwen2vl(tiny_models: dict[str, TinyModel]) -> TinyModel:
    return tiny_models["qwen2vl"]


@pytest.fixture(scope="session")
def llava(tiny_models: dict[str, TinyModel]) -> TinyModel:
    return tiny_models["llava"]


def _engine(model: TinyModel, **overrides: Any) -> Iterator[Any]:
    llm = start_engine(model, **overrides)
    yield llm
    # Free the engine's KV cache and workers before the next session-scoped one goes.
    llm.llm_engine.engine_core.shutdown()


# A vLLM 0.32 trap, measured: in one process, a full-vision Qwen2-VL engine created after a
# language-model-only one of the same model fails on its first image ("Tensor on device meta
# is not on the expected device cpu": the vision tower meets a module built on the meta device
# for the tower-less engine). Every language-model-only Qwen2-VL fixture therefore depends on
# the full-vision ones, so they are always created first.


@pytest.fixture(scope="session")
def qwen2vl_engine(qwen2vl: TinyModel) -> Iterator[Any]:
    """Qwen2-VL with its vision encoder (default limits)."""
    yield from _engine(qwen2vl)


QWEN_LIMITS: Final = {"image": 1, "video": 0}


@pytest.fixture(scope="session")
def qwen_transfers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen2-VL P/D engines' transfer directory."""
    return tmp_path_factory.mktemp("qwen-transfers")


@pytest.fixture(scope="session")
def qwen_baseline(qwen2vl: TinyModel, qwen_transfers: Path) -> Iterator[Any]:
    """One full-vision Qwen2-VL engine, no P/D: the answer to match (block size 32)."""
    yield from _engine(
        qwen2vl,
        block_size=BLOCK_SIZE,
        limit_mm_per_prompt=QWEN_LIMITS,
        kv_transfer_config=connector("kv_producer", qwen_transfers),
    )


@pytest.fixture(scope="session")
def qwen_prefill(qwen2vl: TinyModel, qwen_transfers: Path) -> Iterator[Any]:
    """The full-vision Qwen2-VL prefill engine, a KV producer (block size 32)."""
    yield from _engine(
        qwen2vl,
        block_size=BLOCK_SIZE,
        limit_mm_per_prompt=QWEN_LIMITS,
        kv_transfer_config=connector("kv_producer", qwen_transfers),
    )


@pytest.fixture(scope="session")
def qwen_vision_engines(qwen2vl_engine: Any, qwen_baseline: Any, qwen_prefill: Any) -> None:
    """Every full-vision Qwen2-VL engine, created (see the trap above)."""


@pytest.fixture(scope="session")
def qwen2vl_lm_only_engine(qwen2vl: TinyModel, qwen_vision_engines: None) -> Iterator[Any]:
    """Qwen2-VL with ``language_model_only=True``: no vision tower, encoder budget 0."""
    yield from _engine(qwen2vl, language_model_only=True, block_size=BLOCK_SIZE)


@pytest.fixture(scope="session")
def qwen_decode(
    qwen2vl: TinyModel, qwen_transfers: Path, qwen_vision_engines: None
) -> Iterator[Any]:
    """``language_model_only`` and a KV consumer: no vision tower, takes metadata."""
    yield from _engine(
        qwen2vl,
        block_size=BLOCK_SIZE,
        language_model_only=True,
        kv_transfer_config=connector("kv_consumer", qwen_transfers),
    )


@pytest.fixture(scope="session")
def llava_lm_only_engine(llava: TinyModel) -> Iterator[Any]:
    """Grid-less LLaVA with ``language_model_only=True``: the decode worker of the policy."""
    yield from _engine(llava, language_model_only=True, block_size=BLOCK_SIZE)


@pytest.fixture(scope="session")
def llama_engine(llama: TinyModel) -> Iterator[Any]:
    """A text-only model."""
    yield from _engine(llama)


@pytest.fixture(scope="session")
def kv_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Storage for a KV connector's configuration (no test moves KV through it)."""
    return tmp_path_factory.mktemp("kv-store")


_FLEETS: Final = pytest.StashKey[Fleets]()


@pytest.fixture(scope="session")
def fleets(request: pytest.FixtureRequest) -> Iterator[Fleets]:
    """The session's shared server fleets (see ``fleets.py``)."""
    registry = request.config.stash[_FLEETS] = Fleets()
    yield registry
    registry.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the running fleet once the run leaves a module for one that does not use it,
    after the module's own fixtures (proxies in front of the fleet) are torn down."""
    yield
    registry = item.config.stash.get(_FLEETS, None)
    if registry is None or registry.running is None:
        return
    following = getattr(nextitem, "module", None), getattr(nextitem, "fixturenames", ())
    if following[0] is not getattr(item, "module", None) and registry.running not in following[1]:
        registry.close()


def _shared_fleet(request: pytest.FixtureRequest, fleets: Fleets, start: Any) -> Any:
    # Keyed by the fixture's name: the teardown hook finds a fleet's users by that name.
    key = request.fixturename
    assert key is not None

    def enter() -> Any:
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        return start(factory.mktemp(key))

    return fleets.get(key, enter, user=request.module.__name__)


#: What the LLaVA fleet's plain prefill (the baseline too) takes beyond images: per-request
#: processing options and image embeddings, which the media identity tests send.
LLAVA_PREFILL_FLAGS: Final = ("--trust-request-mm-kwargs", "--enable-mm-embeds")
#: The Qwen2-VL fleet takes one image and one video per request.
QWEN_HTTP_LIMITS: Final = {"image": 1, "video": 1}


@pytest.fixture(scope="module")
def llava_http(request: pytest.FixtureRequest, fleets: Fleets, llava: TinyModel) -> HttpFleet:
    """The LLaVA ``vllm serve`` fleet (``http_fleets.py``), shared by its HTTP modules."""

    def start(root: Path) -> Any:
        return http_fleet(llava, root, scale_out=False, limits={"image": 1},
                          prefill_extra=LLAVA_PREFILL_FLAGS)  # fmt: skip

    fleet: HttpFleet = _shared_fleet(request, fleets, start)
    return fleet


@pytest.fixture(scope="module")
def qwen_http(request: pytest.FixtureRequest, fleets: Fleets, qwen2vl: TinyModel) -> HttpFleet:
    """The Qwen2-VL ``vllm serve`` fleet, with ``--enable-scale-out`` (the metadata path)."""

    def start(root: Path) -> Any:
        # The E/P/D module holds the proxy reading the encoder-cache roles from /server_info.
        return http_fleet(qwen2vl, root, scale_out=True, limits=QWEN_HTTP_LIMITS,
                          epd_dev_mode=True)  # fmt: skip

    fleet: HttpFleet = _shared_fleet(request, fleets, start)
    return fleet


@pytest.fixture(scope="module")
def audio_http(request: pytest.FixtureRequest, fleets: Fleets, qwen2audio: TinyModel) -> PdFleet:
    """The Qwen2-Audio P/D pair (``http_fleets.pd_fleet``), shared by its HTTP modules."""

    def start(root: Path) -> Any:
        return pd_fleet(qwen2audio, root, limits={"audio": 1})

    fleet: PdFleet = _shared_fleet(request, fleets, start)
    return fleet


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """How often each shared fleet started: more than once means its modules were split."""
    registry = config.stash.get(_FLEETS, None)
    if registry is not None and registry.starts:
        starts = ", ".join(f"{key} {count}" for key, count in sorted(registry.starts.items()))
        terminalreporter.write_line(f"shared fleets started: {starts}")


@pytest.fixture(scope="module")
def llava_pool(request: pytest.FixtureRequest, fleets: Fleets, llava: TinyModel) -> Pool:
    """Two LLaVA prefills and two language-model-only decodes, each killable and
    restartable (``pool_fleet.py``), behind the fleet proxy's tests."""

    def start(root: Path) -> Any:
        # Its tests hold the proxy describing a restarted member anew from its /server_info.
        return pool_fleet(llava, root, dev_mode=True)

    pool: Pool = _shared_fleet(request, fleets, start)
    return pool


@pytest.fixture(scope="module")
def ray_pd(
    request: pytest.FixtureRequest, fleets: Fleets, llava: TinyModel, qwen2vl: TinyModel
) -> RayFleet:
    """Ray Serve LLM's P/D (``ray_fleet.py``): of the tiny LLaVA, the policy's application
    with two language-model-only decode replicas, and Ray's own beside it; of the tiny
    Qwen2-VL, the policy's with one language-model-only decode replica that takes M-RoPE
    metadata. Seven engines, about 13 GB: every other fleet is stopped while it runs."""

    def start(root: Path) -> Any:
        return ray_fleet(root, llava.path, qwen2vl.path)

    fleet: RayFleet = _shared_fleet(request, fleets, start)
    return fleet


@pytest.fixture(scope="module")
def ray_nixl(request: pytest.FixtureRequest, fleets: Fleets, llava: TinyModel) -> RayFleet:
    """Ray Serve LLM's P/D on vLLM's ``NixlConnector`` (``ray_fleet.ray_nixl_fleet``): the
    policy's application of the tiny LLaVA, a full-vision prefill and one
    language-model-only decode replica, and the cluster's metrics port. Two engines, a
    fleet like the others."""

    def start(root: Path) -> Any:
        return ray_nixl_fleet(root, llava.path)

    fleet: RayFleet = _shared_fleet(request, fleets, start)
    return fleet
