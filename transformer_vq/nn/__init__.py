"""Layers the model families of :mod:`transformer_vq.models` share: the vector quantizer, positions, the RMS norm, the
choice of attention operator, the classifier head, the codebook interface, sampling, the checks of a model's call
(:mod:`.inputs`) and the state it carries (:mod:`.state`). Modules hold parameters and state
and call the pure functions of :mod:`transformer_vq.ops`; nothing here imports a model."""
