"""Media the live tests send, made in the fixtures: video clips and audio clips, and their
``data:`` URLs. Different seeds give different content; the same seed the same bytes."""

from __future__ import annotations

import base64
import io
import os
import tempfile
import wave
from typing import Any

import numpy as np
from tiny_audio import SAMPLE_RATE

__all__ = ["audio_clip", "data_url_of", "input_audio", "video_clip"]


def video_clip(seed: int, *, frames: int = 4, side: int = 56, fps: float = 2.0) -> bytes:
    """An MPEG-4 clip of random frames (OpenCV's ``mp4v``, which vLLM's OpenCV loader reads).

    The tiny Qwen2-VL samples it at 2 frames a second and expands every two frames into
    144 ids: four frames are a ``video_grid_thw`` of (2, 24, 24) and 288 ids."""
    import cv2

    rng = np.random.default_rng(seed)
    handle, path = tempfile.mkstemp(suffix=".mp4")
    os.close(handle)
    try:
        writer = cv2.VideoWriter(path, cv2.VideoWriter.fourcc(*"mp4v"), fps, (side, side))
        assert writer.isOpened(), "OpenCV cannot write mp4v here"
        for _ in range(frames):
            writer.write(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
        writer.release()
        with open(path, "rb") as clip:
            return clip.read()
    finally:
        os.unlink(path)


def audio_clip(seed: int, seconds: float = 1.0) -> bytes:
    """A mono 16 kHz 16-bit WAV clip: a tone whose pitch the seed sets, under seeded noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    signal = 0.4 * np.sin(2 * np.pi * (220.0 + 110.0 * seed) * t) + 0.1 * rng.uniform(-1, 1, t.size)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes((signal * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def data_url_of(payload: bytes, media_type: str) -> str:
    """A base64 ``data:`` URL of ``payload``."""
    return f"data:{media_type};base64," + base64.b64encode(payload).decode()


def input_audio(payload: bytes) -> dict[str, Any]:
    """An OpenAI ``input_audio`` content part of a WAV clip."""
    data = base64.b64encode(payload).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
