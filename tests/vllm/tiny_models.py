"""Tiny local checkpoints for live vLLM tests: Llama, Qwen2-VL (M-RoPE) and LLaVA (grid-less).

Nothing is downloaded: each builder trains a 512-token byte-level BPE tokenizer
on a fixed generated corpus and saves a randomly initialised model, seeded with
``torch.manual_seed(0)``, so a rebuild is byte-identical. Sizes fit vLLM's CPU
attention backend (``head_dim`` 64: it rejects 16) and build in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs

__all__ = ["BUILDERS", "TinyModel", "build_llama", "build_llava", "build_qwen2vl"]

#: The words of the tokenizers' training corpus.
_VOCABULARY: Final = (
    "the quick brown fox jumps over lazy dog cat sat on mat red green blue image picture "
    "describe what you see in this photo a an is are was were hello world user assistant "
    "system question answer yes no one two three four five six seven eight nine ten"
)

# Shared by every text stack: hidden 128, 2 layers, 2 heads, 1 KV head, head_dim 64.
_TEXT: Final[dict[str, Any]] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 1024,
}


@attrs.frozen(slots=True)
class TinyModel:
    """A built checkpoint: where it is, and the placeholder its images expand into.

    ``image_token_id`` is ``None`` for a text model; ``image_tokens`` is how many
    placeholder ids one image expands into (0 when it depends on the image size).
    """

    path: Path
    image_token_id: int | None = None
    image_tokens: int = 0


def _sentences(count: int = 2000) -> Iterator[str]:
    # A linear congruential generator: a fixed corpus without touching any global RNG.
    vocabulary = _VOCABULARY.split()
    state = 12345
    for _ in range(count):
        words = []
        for _ in range(12):
            state = (1103515245 * state + 12345) % 2**31
            words.append(vocabulary[state % len(vocabulary)])
        yield " ".join(words) + "."


def _bpe(specials: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TEXT["vocab_size"],
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_sentences(), trainer)
    return tokenizer


_LLAMA_TEMPLATE: Final = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_llama(directory: Path) -> TinyModel:
    """A text-only ``LlamaForCausalLM`` (427k parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(["<s>", "</s>", "<unk>", "<pad>"]),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tokenizer.chat_template = _LLAMA_TEMPLATE
    config = LlamaConfig(
        **_TEXT,
        head_dim=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return TinyModel(directory)


_QWEN_SPECIALS: Final = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
_QWEN_TEMPLATE: Final = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] in ['image', 'image_url'] %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] in ['video', 'video_url'] %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_qwen2vl(directory: Path) -> TinyModel:
    """A ``Qwen2VLForConditionalGeneration`` (M-RoPE, image and video; 668k parameters).

    Its processor needs an importable torchvision. A 56x56 image expands to 4 ids.
    """
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    raw = _bpe(_QWEN_SPECIALS)
    ids = {s: raw.token_to_id(s) for s in _QWEN_SPECIALS}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = _QWEN_TEMPLATE
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]}
    config = Qwen2VLConfig(
        # Token ids from this tokenizer: the defaults (151643, ...) lie outside a 512 vocabulary.
        text_config={
            **_TEXT,
            "rope_parameters": rope,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 2,
            "embed_dim": 64,
            "hidden_size": 128,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        vision_token_id=ids["<|vision_pad|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(config).save_pretrained(directory)
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16),
        video_processor=Qwen2VLVideoProcessor(),
        tokenizer=tokenizer,
        chat_template=_QWEN_TEMPLATE,
    )
    processor.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return TinyModel(directory, image_token_id=ids["<|image_pad|>"])


_LLAVA_TEMPLATE: Final = (
    "{% for m in messages %}{{ m['role'] | upper }}: "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] in ['image', 'image_url'] %}<image>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
_LLAVA_SIDE: Final = 84  # (84 / 14)^2 = 36 placeholder ids per image
_PATCH: Final = 14


def _to_llava_hf_layout(checkpoint: Path) -> None:
    # transformers 5.x saves the CLIP tower as "vision_tower.<x>"; vLLM's loader wants the
    # llava-hf layout "vision_tower.vision_model.<x>" and otherwise fails to start
    # ("There is no module or parameter named 'vision_tower.embeddings'").
    import safetensors.torch

    old, new = "vision_tower.", "vision_tower.vision_model."
    tensors = safetensors.torch.load_file(checkpoint)
    renamed = {
        (new + key[len(old) :] if key.startswith(old) and not key.startswith(new) else key): value
        for key, value in tensors.items()
    }
    safetensors.torch.save_file(renamed, checkpoint, metadata={"format": "pt"})


def build_llava(directory: Path) -> TinyModel:
    """A grid-less ``LlavaForConditionalGeneration``: CLIP tower, Llama text (559k parameters).

    Every image is resized to 84x84 and expands to 36 ``<image>`` ids.
    """
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(["<s>", "</s>", "<unk>", "<pad>", "<image>"]),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )
    tokenizer.chat_template = _LLAVA_TEMPLATE
    image_token_id = int(tokenizer.convert_tokens_to_ids("<image>"))
    image_tokens = (_LLAVA_SIDE // _PATCH) ** 2
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            image_size=_LLAVA_SIDE,
            patch_size=_PATCH,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            projection_dim=64,
        ),
        text_config=LlamaConfig(
            **_TEXT, head_dim=64, bos_token_id=0, eos_token_id=1, pad_token_id=3
        ),
        image_token_index=image_token_id,
        image_seq_length=image_tokens,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(directory)
    _to_llava_hf_layout(directory / "model.safetensors")
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": _LLAVA_SIDE},
        crop_size={"height": _LLAVA_SIDE, "width": _LLAVA_SIDE},
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=_PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped by the "default" strategy
        chat_template=_LLAVA_TEMPLATE,
        image_token="<image>",
    )
    processor.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return TinyModel(directory, image_token_id=image_token_id, image_tokens=image_tokens)


#: Every builder, by the name its fixture and directory use.
BUILDERS: Final[dict[str, Callable[[Path], TinyModel]]] = {
    "llama": build_llama,
    "qwen2vl": build_qwen2vl,
    "llava": build_llava,
}
