"""Mega's multi-dimensional damped EMA (the SSM of LongVQ's eq. 9), causal and bidirectional: the FFT convolution
(:func:`ema_conv`, :func:`ema_bidir_conv`) and the recurrence it is tested against (:func:`ema_naive`,
:func:`ema_bidir_naive`, also the one-token decoding step). Pure functions of the sequence and the coefficients; the
parameters live in :class:`~transformer_vq.models.longvq.ssm.DampedEMA`."""

from transformer_vq.ops.ema.coefficients import EMACoefficients
from transformer_vq.ops.ema.conv import ema_bidir_conv, ema_conv, ema_kernel
from transformer_vq.ops.ema.naive import ema_bidir_naive, ema_naive

__all__ = ["EMACoefficients", "ema_conv", "ema_bidir_conv", "ema_kernel", "ema_naive", "ema_bidir_naive"]
