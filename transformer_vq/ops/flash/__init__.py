"""The FLASH baselines (Hua et al. 2022): FLASH-Quad and mixed-chunk FLASH, their state, their defining formulas."""

from transformer_vq.ops.flash.attention import flash_attention, flash_quad_attention
from transformer_vq.ops.flash.naive import flash_attention_naive, flash_quad_attention_naive
from transformer_vq.ops.flash.state import FlashState

__all__ = ["flash_attention", "flash_quad_attention", "flash_attention_naive", "flash_quad_attention_naive",
           "FlashState"]
