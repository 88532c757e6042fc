"""Models built from the layers: the tiny language models, and the published models' presets."""

from kda_lib.models.tiny_lm import ModelConfig, TinyLM

__all__ = ["ModelConfig", "TinyLM"]
