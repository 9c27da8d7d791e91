"""Upstream's import path for the rotary kernel. Ours is the PyTorch implementation in
flash_attn.layers.rotary (no Triton needed); this module keeps `from flash_attn.ops.triton.rotary
import apply_rotary` working."""
from flash_attn.layers.rotary import apply_rotary

__all__ = ["apply_rotary"]
