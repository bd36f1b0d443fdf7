"""Modules: they hold parameters and state and call the pure functions of :mod:`transformer_vq.ops`."""
