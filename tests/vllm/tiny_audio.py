"""A tiny local Qwen2-Audio checkpoint: a Whisper-style audio tower and a Qwen2 text stack.

Built as the other tiny models are (``tiny_models``): the same 512-token BPE tokenizer
with the audio specials, random weights seeded with ``torch.manual_seed(0)``, so a
rebuild is byte-identical, and nothing downloaded. Its processor is a
``WhisperFeatureExtractor`` (80 mel bins, 16 kHz) with the standard 30-second window:
vLLM's Qwen2-Audio inputs fix the mel length at 3000 frames. A clip of ``s`` seconds
expands to ``((100 s - 1) // 2 + 1 - 2) // 2 + 1`` ``<|AUDIO|>`` ids (1 s: 25).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tiny_models import _TEXT, TinyModel, _bpe

__all__ = ["SAMPLE_RATE", "build_qwen2audio"]

SAMPLE_RATE: Final = 16000
_MEL_BINS: Final = 80
_SPECIALS: Final = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
]  # fmt: skip
# vLLM renders both input_audio and audio_url parts as {"type": "audio"} for the template.
_TEMPLATE: Final = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] in ['audio', 'audio_url', 'input_audio'] %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_DOUBLED: Final = "language_model.model.model."


def _to_vllm_layout(checkpoint: Path) -> None:
    # transformers 5.19 saves the text stack as "language_model.model.model.<x>"; vLLM 0.32
    # loads Qwen2-Audio's original layout "language_model.model.<x>" and otherwise fails to
    # start ("There is no module or parameter named 'model' in Qwen2Model").
    import safetensors.torch

    tensors = safetensors.torch.load_file(checkpoint)
    renamed = {
        ("language_model.model." + key[len(_DOUBLED) :] if key.startswith(_DOUBLED) else key): (
            value.contiguous()
        )
        for key, value in tensors.items()
    }
    safetensors.torch.save_file(renamed, checkpoint, metadata={"format": "pt"})


def build_qwen2audio(directory: Path) -> TinyModel:
    """A ``Qwen2AudioForConditionalGeneration`` (626k parameters, 2.5 MB)."""
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    raw = _bpe(_SPECIALS)
    ids = {s: raw.token_to_id(s) for s in _SPECIALS}
    audio_tokens = {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>",
                    "audio_eos_token": "<|audio_eos|>"}  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens=audio_tokens,
    )  # fmt: skip
    tokenizer.chat_template = _TEMPLATE
    config = Qwen2AudioConfig(
        audio_config={
            "num_mel_bins": _MEL_BINS, "encoder_layers": 2, "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128, "d_model": 64,
            "max_source_positions": 1500,  # 3000 mel frames, halved by the tower's stride
        },
        text_config={
            **_TEXT, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"], "tie_word_embeddings": False,
        },
        audio_token_index=ids["<|AUDIO|>"],
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2AudioForConditionalGeneration(config).save_pretrained(directory)
    _to_vllm_layout(directory / "model.safetensors")
    features = WhisperFeatureExtractor(
        feature_size=_MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=160, chunk_length=30,
        n_fft=400,
    )  # fmt: skip
    processor = Qwen2AudioProcessor(
        feature_extractor=features, tokenizer=tokenizer, chat_template=_TEMPLATE, **audio_tokens
    )
    processor.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return TinyModel(directory)
