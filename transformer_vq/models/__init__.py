"""Whole models, one package per family: each holds the layers only it uses and the models built from them.

* :mod:`~transformer_vq.models.tvq`: Transformer-VQ (Lingle 2024), the gated attention unit and the language model
  (decoder, or encoder with ``causal=False``), its ``torch.compile`` and its ragged-batch runner.
* :mod:`~transformer_vq.models.longvq`: LongVQ (Liu et al. 2024), the damped-EMA SSM module, the layer and block, the
  classifier and the language model.
* :mod:`~transformer_vq.models.baselines`: the classifiers LongVQ is compared with.

The layers the families share (quantizer, positions, norms, pooling head, codebook interface, sampling, the choice of
attention operator) are in :mod:`transformer_vq.nn`; the math in :mod:`transformer_vq.ops`. A family imports those,
never the training code; Transformer-VQ imports no other family.
"""
