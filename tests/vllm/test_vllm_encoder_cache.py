"""An engine's encoder-cache role, read from vLLM's own config objects, and the config that
sets it, accepted by vLLM's own validation."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from vllm.config import ECTransferConfig

from pd_policy import EncoderCacheRole
from pd_policy_vllm import EC_CONNECTOR, ec_transfer_config, encoder_cache_role


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("ec_producer", EncoderCacheRole.PRODUCER),
        ("ec_consumer", EncoderCacheRole.CONSUMER),
        ("ec_both", EncoderCacheRole.CONSUMER),
    ],
)
def test_the_role_is_read_from_vllms_config_and_agrees_with_its_own_reading(
    role: str, expected: EncoderCacheRole
) -> None:
    config = ECTransferConfig(ec_connector=EC_CONNECTOR, ec_role=role)
    vllm_config = types.SimpleNamespace(ec_transfer_config=config)
    llm = types.SimpleNamespace(llm_engine=types.SimpleNamespace(vllm_config=vllm_config))
    for source in (vllm_config, llm):
        assert encoder_cache_role(source) is expected
    # vLLM's own reading: encoder-only exactly when the role is the producer's alone.
    assert config.is_encode_only == (expected is EncoderCacheRole.PRODUCER)
    assert config.is_ec_consumer == (expected is EncoderCacheRole.CONSUMER)


def test_no_config_is_no_role_and_a_bare_model_config_does_not_know() -> None:
    assert encoder_cache_role(types.SimpleNamespace(ec_transfer_config=None)) is (
        EncoderCacheRole.NONE
    )
    assert encoder_cache_role(types.SimpleNamespace(model="m")) is EncoderCacheRole.UNKNOWN


@pytest.mark.parametrize("role", [EncoderCacheRole.PRODUCER, EncoderCacheRole.CONSUMER])
def test_the_config_it_writes_is_one_vllm_accepts(role: EncoderCacheRole, tmp_path: Path) -> None:
    written = ec_transfer_config(role, tmp_path)
    config = ECTransferConfig(**json.loads(json.dumps(written)))  # as --ec-transfer-config
    vllm_config = types.SimpleNamespace(ec_transfer_config=config)
    assert encoder_cache_role(vllm_config) is role
    assert config.get_from_extra_config("shared_storage_path", None) == str(tmp_path)


def test_an_engine_with_no_role_takes_no_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="producer or consumer"):
        ec_transfer_config(EncoderCacheRole.NONE, tmp_path)
