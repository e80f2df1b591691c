"""A live vLLM engine serving decode legs, with the guard its capability calls for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pd_policy import EngineFacts, Request, derive_supports_vision

from .facts import engine_facts
from .model_config import model_config_of
from .prompt import DecodeInputs, decode_inputs

if TYPE_CHECKING:
    from vllm import LLM, RequestOutput, SamplingParams

__all__ = ["DecodeEngine"]


class DecodeEngine:
    """A vLLM ``LLM`` that generates from decode legs.

    Reads the engine's :class:`pd_policy.EngineFacts` once, at construction: the
    flags they come from are fixed for the engine's life. An engine that cannot
    encode media (``supports_vision`` is false: ``--language-model-only``,
    embeds-only, all limits 0, or a text model) is exactly the worker a router
    sends stripped legs to, so every leg it is given passes the core's
    language-model-only guard first; a leg that does not gets the core's typed
    error and never reaches vLLM. On an M-RoPE model (``uses_mrope``) such an
    engine also refuses legs that carry media identities
    (:func:`~pd_policy_vllm.decode_inputs`).

    Raises ``TypeError`` at construction when ``llm`` is not a vLLM engine.
    """

    __slots__ = ("_llm", "facts", "supports_vision", "uses_mrope")

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        #: What the engine is, as far as vision goes.
        self.facts: EngineFacts = engine_facts(llm)
        #: The ``supports_vision`` its worker reports.
        self.supports_vision: bool = derive_supports_vision(self.facts)
        #: Whether the model's positions are M-RoPE (vLLM's ``ModelConfig.uses_mrope``).
        self.uses_mrope: bool = bool(getattr(model_config_of(llm), "uses_mrope", False))

    @property
    def guarded(self) -> bool:
        """Whether legs pass the language-model-only guard: the engine encodes no media."""
        return not self.supports_vision

    def inputs(self, leg: Request, sampling_params: SamplingParams) -> DecodeInputs:
        """The engine input for ``leg`` (:func:`~pd_policy_vllm.decode_inputs`), guarded."""
        return decode_inputs(
            leg, sampling_params, language_model_only=self.guarded, uses_mrope=self.uses_mrope
        )

    def generate(self, leg: Request, sampling_params: SamplingParams) -> RequestOutput:
        """Generate from one decode leg and return vLLM's ``RequestOutput``.

        Raises the errors of :meth:`inputs` before the engine is called; the
        engine's own errors pass through.
        """
        built = self.inputs(leg, sampling_params)
        (output,) = self._llm.generate([built.prompt], built.sampling_params, use_tqdm=False)
        return output
