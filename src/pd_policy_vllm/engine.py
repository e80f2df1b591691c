"""A live vLLM engine serving decode legs, with the guard its capability calls for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pd_policy import EngineFacts, Request, derive_accepts_mm_metadata, derive_supports_vision

from .facts import engine_facts
from .metadata_input import GridValues
from .model_config import model_config_of
from .prompt import DecodeInputs, decode_inputs

if TYPE_CHECKING:
    from vllm import LLM, RequestOutput, SamplingParams

__all__ = ["DecodeEngine", "generate_one"]


def generate_one(llm: LLM, inputs: DecodeInputs, request_id: str) -> RequestOutput:
    """Run one decode input on an in-process ``LLM`` and return its ``RequestOutput``.

    A token or text prompt goes through ``LLM.generate``. A pre-rendered input
    (an M-RoPE metadata leg) goes through ``llm_engine.add_request`` and the
    engine's step loop, as ``LLM.generate`` runs it: ``LLM.generate`` itself
    re-renders such an input as plain tokens, silently dropping its grids and
    hashes (measured: text positions, logprobs off by 5e-3, and another
    image's cached blocks). ``request_id`` names the request to the engine;
    no other request may be running on it.
    """
    if not inputs.prerendered:
        (output,) = llm.generate([inputs.prompt], inputs.sampling_params, use_tqdm=False)
        return output
    engine = llm.llm_engine
    engine.add_request(request_id, inputs.prompt, inputs.sampling_params)
    finished = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished and output.request_id == request_id:
                finished = output
    if finished is None:
        raise RuntimeError(f"the engine finished without an output for {request_id!r}")
    return finished


class DecodeEngine:
    """A vLLM ``LLM`` that generates from decode legs.

    Reads the engine's [`pd_policy.EngineFacts`][pd_policy.capability.EngineFacts] once, at
    construction: the
    flags they come from are fixed for the engine's life. An engine that cannot
    encode media (``supports_vision`` is false: ``--language-model-only``,
    embeds-only, all limits 0, or a text model) is exactly the worker a router
    sends stripped legs to, so every leg it is given passes the core's
    language-model-only guard first; a leg that does not gets the core's typed
    error and never reaches vLLM. On an M-RoPE model (``uses_mrope``) such an
    engine also refuses legs that carry media identities
    ([`decode_inputs`][pd_policy_vllm.prompt.decode_inputs]), unless it takes multimodal
    metadata (a KV consumer allowing missing embeddings), in which case it
    serves complete M-RoPE metadata legs that carry the prefill's KV.

    Raises ``TypeError`` at construction when ``llm`` is not a vLLM engine.
    """

    __slots__ = ("_llm", "facts", "supports_vision", "takes_mm_metadata", "uses_mrope")

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        #: What the engine is, as far as vision goes.
        self.facts: EngineFacts = engine_facts(llm)
        #: The ``supports_vision`` its worker reports.
        self.supports_vision: bool = derive_supports_vision(self.facts)
        #: Whether the model's positions are M-RoPE (vLLM's ``ModelConfig.uses_mrope``).
        self.uses_mrope: bool = bool(getattr(model_config_of(llm), "uses_mrope", False))
        #: Whether it takes multimodal metadata without an encoder (``accepts_mm_metadata``).
        self.takes_mm_metadata: bool = derive_accepts_mm_metadata(self.facts)

    @property
    def guarded(self) -> bool:
        """Whether legs pass the language-model-only guard: the engine encodes no media."""
        return not self.supports_vision

    def inputs(
        self, leg: Request, sampling_params: SamplingParams, grids: GridValues | None = None
    ) -> DecodeInputs:
        """The engine input for ``leg`` ([`decode_inputs`][pd_policy_vllm.prompt.decode_inputs]),
        guarded;
        ``grids``: the values of a metadata leg's grids, per batch."""
        return decode_inputs(
            leg,
            sampling_params,
            language_model_only=self.guarded,
            uses_mrope=self.uses_mrope,
            takes_mm_metadata=self.takes_mm_metadata,
            grids=grids,
        )

    def generate(
        self, leg: Request, sampling_params: SamplingParams, grids: GridValues | None = None
    ) -> RequestOutput:
        """Generate from one decode leg and return vLLM's ``RequestOutput``.

        Raises the errors of [`inputs`][pd_policy_vllm.engine.DecodeEngine.inputs] before the engine
        is called; the
        engine's own errors pass through.
        """
        return generate_one(self._llm, self.inputs(leg, sampling_params, grids), leg.request_id)
