"""vLLM's own multimodal-input check, asked the way each vLLM version answers it.

- vLLM 0.31 and later: the ``ModelConfig.supports_multimodal_inputs`` property.
- vLLM 0.30 and earlier: ``MULTIMODAL_REGISTRY.supports_multimodal_inputs(model_config)``,
  which raises ``ValueError`` when the model class has no registered processor.

The answer is recorded as a [`pd_policy.MmInputProbe`][pd_policy.capability.MmInputProbe], never as
an
exception: the core decides what each answer means.
"""

from __future__ import annotations

import inspect
import logging
from typing import Final

from pd_policy import MmInputProbe

from .model_config import is_multimodal_model

__all__ = ["probe_mm_inputs"]

logger = logging.getLogger(__name__)

_ABSENT: Final = object()


def _answer(value: object) -> MmInputProbe:
    return MmInputProbe.SUPPORTED if value else MmInputProbe.UNSUPPORTED


def _probe_property(model_config: object) -> MmInputProbe:
    try:
        return _answer(model_config.supports_multimodal_inputs)  # type: ignore[attr-defined]
    except Exception:
        logger.warning("ModelConfig.supports_multimodal_inputs failed", exc_info=True)
        return MmInputProbe.FAILED


def _probe_registry(model_config: object) -> MmInputProbe:
    try:
        from vllm.multimodal import MULTIMODAL_REGISTRY
    except ImportError:
        return MmInputProbe.UNAVAILABLE
    except Exception:
        # vLLM is installed but broken (a CUDA-only torchvision, say): the probe failed.
        logger.warning("importing vllm.multimodal failed", exc_info=True)
        return MmInputProbe.FAILED
    try:
        return _answer(MULTIMODAL_REGISTRY.supports_multimodal_inputs(model_config))
    except ValueError:
        return MmInputProbe.NO_PROCESSOR
    except Exception:
        logger.warning("MULTIMODAL_REGISTRY.supports_multimodal_inputs failed", exc_info=True)
        return MmInputProbe.FAILED


def probe_mm_inputs(model_config: object) -> MmInputProbe:
    """What vLLM's own check answers for ``model_config``; never raises.

    - A text-only architecture is not probed: ``UNSUPPORTED``, which is what
      every version's check answers for it.
    - A ``supports_multimodal_inputs`` attribute (vLLM 0.31+) answers
      ``SUPPORTED`` or ``UNSUPPORTED``; if reading it raises, ``FAILED``.
    - Otherwise the registry method (vLLM 0.30 and earlier): ``ValueError`` gives
      ``NO_PROCESSOR``, any other exception ``FAILED``, and a vLLM that cannot be
      imported (``ImportError``) ``UNAVAILABLE``.

    Failures are logged as warnings, with the traceback.
    """
    if not is_multimodal_model(model_config):
        return MmInputProbe.UNSUPPORTED
    # Look the attribute up without running it: a property that raises must count as
    # FAILED, not as "this vLLM has no property".
    if inspect.getattr_static(model_config, "supports_multimodal_inputs", _ABSENT) is _ABSENT:
        return _probe_registry(model_config)
    return _probe_property(model_config)
