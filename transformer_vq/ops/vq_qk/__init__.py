"""VQ attention with quantized queries as well as keys: causal and non-causal, through a table of code-pair scores.

:mod:`~transformer_vq.ops.vq_qk.table` holds the table ``T = C_Q C_K^T`` and the lookup of a query's scores;
:mod:`~transformer_vq.ops.vq_qk.attention` the causal operator (the key-only one fed with table scores);
:mod:`~transformer_vq.ops.vq_qk.noncausal` the non-causal one (one output row per query code);
:mod:`~transformer_vq.ops.vq_qk.naive` the dense formulas. docs/operator.md holds the contract.
"""

from transformer_vq.ops.vq_qk.attention import vq_qk_attention
from transformer_vq.ops.vq_qk.naive import vq_qk_attention_naive, vq_qk_attention_noncausal_naive
from transformer_vq.ops.vq_qk.noncausal import vq_qk_attention_noncausal
from transformer_vq.ops.vq_qk.table import code_pair_table, lookup_code_scores

__all__ = ["vq_qk_attention", "vq_qk_attention_noncausal", "vq_qk_attention_naive", "vq_qk_attention_noncausal_naive",
           "code_pair_table", "lookup_code_scores"]
