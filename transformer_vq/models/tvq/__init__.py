"""Transformer-VQ (Lingle, ICLR 2024): the gated attention unit (:mod:`.gau`), the model (:mod:`.model`), the
compilation of its units (:mod:`.compile`) and ragged batches run row by row (:mod:`.ragged`)."""

from transformer_vq.models.tvq.gau import GatedAttentionUnit
from transformer_vq.models.tvq.model import ModelOutput, TransformerVQ
from transformer_vq.nn.state import ModelState

__all__ = ["GatedAttentionUnit", "ModelOutput", "ModelState", "TransformerVQ"]
