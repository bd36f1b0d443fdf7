"""The Transformer-VQ language model: embeddings, 2 * n_layers gated attention units, output head."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from transformer_vq.config import TransformerVQConfig
from transformer_vq.config.fields import is_integer
from transformer_vq.models.tvq.chunks import agree_chunks
from transformer_vq.models.tvq.gau import GatedAttentionUnit, chunk_start as equal_chunk_start
from transformer_vq.nn.codebooks import Codebooks
from transformer_vq.nn.inference import evaluating
from transformer_vq.nn.inputs import LEFT_PADDING_HF, as_mask, causal_padding, check_token_ids
from transformer_vq.nn.norm import rms_norm
from transformer_vq.nn.outputs import module_output
from transformer_vq.nn.position import sinusoids
from transformer_vq.nn.quantizer import VectorQuantizer
from transformer_vq.nn.sampling import check_sampling, sample_next_token
from transformer_vq.nn.state import ModelState, check_continued_state
from transformer_vq.nn.token_mean import token_mean
from transformer_vq.ops.documents import document_positions, document_starts
from transformer_vq.ops.protocol import check_bool


@module_output
@dataclass
class ModelOutput:
    """What a language model's call returns (Transformer-VQ's and LongVQ's): the logits, the state to continue with,
    and the losses when targets are given."""

    logits: torch.Tensor
    """``[B, T, V]`` next-token logits."""
    state: ModelState | None
    """State to continue these sequences with (``None`` after ``attention='quadratic'``)."""
    commit_loss: torch.Tensor
    """Scalar: per-token commitment loss summed over units (Eq. 37), before the coefficient."""
    ce_loss: torch.Tensor | None = None
    """Mean next-token cross-entropy in nats over the positions selected by ``loss_mask`` (with targets)."""
    loss: torch.Tensor | None = None
    """``ce_loss + cfg.commit_coef * commit_loss`` (Eq. 35), when targets are given."""


def continued_positions(state: ModelState | None, positions: torch.Tensor | None, length: int,
                        chunks) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(positions [B, T] of this call's tokens in their documents or None (the row's own), the state's next
    positions [B] or None)`` for an absolute position embedding: a packed call's own (``positions``), else those a
    packed call before it left in ``state`` continued (a document continued from a state otherwise took the row's
    positions, 19 where its own was 11), ``chunks`` placing this rank's share under context parallelism."""
    if positions is not None:
        return positions, positions[:, -1] + 1
    if state is None or state.positions is None:
        return None, None
    start = state.positions[:, None] + (0 if chunks is None else chunks.start)
    total = length if chunks is None else chunks.total
    return start + torch.arange(length, device=start.device), state.positions + total


class TransformerVQ(Codebooks, nn.Module):
    """Decoder-only Transformer-VQ.

    ``model(input_ids, state=None)`` processes ``[B, T]`` token ids in time linear in ``T``; passing the
    returned ``state`` back continues the same sequences (training windows, long evaluation, sampling). The codebook
    methods (:class:`~transformer_vq.nn.codebooks.Codebooks`) see the units' key quantizers, then their query
    quantizers (``quantize_queries``).
    """

    def __init__(self, cfg: TransformerVQConfig):
        super().__init__()
        self.cfg = cfg
        # an encoder has one more input id than output classes: the mask token (cfg.mask_token_id)
        self.embed = nn.Embedding(cfg.vocab_size + (0 if cfg.causal else 1), cfg.d_model)
        self.abs_pos_scale = nn.Parameter(torch.zeros(())) if cfg.abs_pos else None
        self.units = nn.ModuleList(GatedAttentionUnit(cfg) for _ in range(2 * cfg.n_layers))
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings N(0, 1); untied head N(0, 1/Dm) with zero bias (App. C; Chowdhery et al.)."""
        nn.init.normal_(self.embed.weight, std=1.0)
        if self.head is not None:
            nn.init.normal_(self.head.weight, std=self.cfg.d_model ** -0.5)
            nn.init.zeros_(self.head.bias)

    def num_parameters(self) -> int:
        """Trainable parameters (the EMA codebooks are buffers and not counted)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def _key_quantizers(self) -> list[VectorQuantizer]:
        return [unit.quantizer for unit in self.units if unit.quantizer is not None]

    @property
    def _query_quantizers(self) -> list[VectorQuantizer]:
        return [unit.query_quantizer for unit in self.units if unit.query_quantizer is not None]

    def forward(self, input_ids: torch.Tensor, state: ModelState | None = None, *,
                targets: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, attention: str = "linear",
                context_parallel=None, position_ids: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> ModelOutput:
        """Run the model on ``input_ids`` ``[B, T]``.

        Args:
            state: the state returned for the previous tokens of the same sequences, or ``None`` (always ``None``
                for an encoder, ``cfg.causal`` false, which reads whole sequences).
            targets: ``[B, T]`` target ids (the next tokens; an encoder's: the original tokens); when given,
                ``ce_loss`` and ``loss`` are computed.
            mask: ``[B, T]`` bool, True for real tokens: padding takes no part in attention, the commitment loss
                or the codebook statistics; ``None`` means every position is real. A causal model takes trailing
                padding only, and the state of a padded call is not continued: rows of different lengths run
                exactly through :mod:`transformer_vq.models.tvq.ragged`.
            loss_mask: ``[B, T]`` bool, the positions whose targets count in ``ce_loss`` (default: ``mask``).
            attention: ``"linear"`` (the operator) or ``"quadratic"`` (the dense reference, same parameters).
            context_parallel: a process group whose ranks each pass one chunk of the same sequences, whole blocks
                in rank order, without padding (context parallelism, docs/distributed.md): ``logits`` and the losses
                are this chunk's, ``state`` is shared by the ranks (the sequences' start in, their end out). What
                one rank refuses of its input, every rank raises.
            position_ids, cu_seqlens: packed documents (:mod:`transformer_vq.ops.documents`), at most one of them:
                ``[B, T]`` positions restarting at 0 where a document begins, or flash-attention's cumulative lengths
                over the flattened tokens. No token attends a token of another document, nor is scored on one
                (``ce_loss`` leaves out the target of a document's last token); a row whose first position
                is not 0 continues a document begun before it: the one of ``state`` when a state is given; without
                one (a training window cut inside a document) its earlier tokens are not there to attend, and only
                the positions (``abs_pos``) say where the row stands in it.
        """
        mask, loss_mask, padded, chunks = self._check_call(input_ids, state, targets, mask, loss_mask,
                                                           context_parallel)  # before any work
        B, T = input_ids.shape
        doc_start = document_starts(B, T, position_ids=position_ids, cu_seqlens=cu_seqlens, device=input_ids.device)
        positions = None if doc_start is None or self.abs_pos_scale is None else \
            document_positions(doc_start, position_ids)
        # (an encoder's state is refused by features(), below)
        positions, next_positions = continued_positions(state if self.cfg.causal else None, positions, T, chunks)
        x, states, commit_loss = self.features(input_ids, state, mask=mask, attention=attention,
                                               context_parallel=context_parallel, doc_start=doc_start,
                                               positions=positions,
                                               chunk_start=None if chunks is None else chunks.start)
        offset = 0 if state is None else state.offset
        if self.head is None:
            # tied, scaled to unit variance (an encoder's mask token is an input only)
            logits = x @ self.embed.weight[:self.cfg.vocab_size].t() * self.cfg.d_model ** -0.5
        else:
            logits = self.head(x)
        new_state = None if attention == "quadratic" or not self.cfg.causal else \
            ModelState(offset + (T if chunks is None else chunks.total), states, padded, next_positions)
        result = ModelOutput(logits=logits, state=new_state, commit_loss=commit_loss)
        if targets is not None:
            result.ce_loss = self._ce_loss(logits, targets, mask if loss_mask is None else loss_mask, doc_start)
            result.loss = result.ce_loss + self.cfg.commit_coef * commit_loss
        return result

    def _ce_loss(self, logits, targets, loss_mask, doc_start) -> torch.Tensor:
        """The mean cross-entropy of ``targets`` ``[B, T]`` over ``loss_mask`` (None: every position), float32 at
        least (under autocast too)."""
        if doc_start is not None and self.cfg.causal:
            # a document's last token is not scored on the next document's first: nothing is predicted from
            # another document (the last column's next token lies outside the call: loss_mask says)
            crosses = F.pad(doc_start[:, 1:], (0, 1), value=False)
            loss_mask = ~crosses if loss_mask is None else loss_mask & ~crosses
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        ce = F.cross_entropy(logits.reshape(targets.numel(), -1), targets.reshape(-1), reduction="none")
        return token_mean(ce, None if loss_mask is None else loss_mask.reshape(-1))

    def features(self, input_ids: torch.Tensor, state: ModelState | None = None, *, mask: torch.Tensor | None = None,
                 attention: str = "linear", context_parallel=None, doc_start: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None,
                 chunk_start: int | None = None) -> tuple[torch.Tensor, list[Any], torch.Tensor]:
        """``(x [B, T, Dm], unit states, commit_loss)``: the residual stream after every unit (and the final norm),
        before the output head. A classifier pools ``x``; :meth:`forward` turns it into logits. ``input_ids`` are
        not checked here (:meth:`forward` checks them); ``doc_start [B, T]``: where packed documents begin;
        ``positions [B, T]``: each token's position in its document, for ``abs_pos`` (``None``: the row's);
        ``chunk_start``: under context parallelism, where this rank's chunk begins (:func:`agree_chunks`; ``None``:
        the rank times the chunk's length, chunks of equal length)."""
        if state is not None and not self.cfg.causal:
            raise ValueError("an encoder (causal=False) reads whole sequences and carries no state: pass state=None")
        if chunk_start is None:
            chunk_start = equal_chunk_start(context_parallel, input_ids.shape[1])
        offset = (0 if state is None else state.offset) + chunk_start
        x = self.embed(input_ids)  # (B, T, Dm)
        if self.abs_pos_scale is not None:
            if positions is None:
                positions = torch.arange(offset, offset + input_ids.shape[1], device=input_ids.device)
            x = x + self.abs_pos_scale * sinusoids(positions, self.cfg.d_model, self.cfg.max_wavelength, x.dtype)
        states, commit_loss = [], x.new_zeros((), dtype=torch.promote_types(x.dtype, torch.float32))
        for i, unit in enumerate(self.units):
            out = unit(x, state=None if state is None else state.layers[i], mask=mask, attention=attention,
                       context_parallel=context_parallel, doc_start=doc_start)
            x, commit_loss = out.x, commit_loss + out.commit_loss
            states.append(out.state)
        if self.cfg.final_norm:
            x = rms_norm(x)
        return x, states, commit_loss

    def _check_call(self, input_ids, state, targets, mask, loss_mask, context_parallel=None) -> tuple:
        """Refuse a bad call (:mod:`transformer_vq.nn.inputs`) before any work; ``(mask, loss_mask, padded,
        chunks)``: the masks as bool, whether ``mask`` holds padding (a causal model's, trailing: the state it returns
        is not continued), and under context parallelism the :class:`Chunks` the ranks agreed (``None`` without),
        every rank refusing when one does."""
        problem, padded = None, False
        try:
            check_token_ids(input_ids, self.embed.num_embeddings, "input_ids")
            if targets is not None:
                check_token_ids(targets, self.cfg.vocab_size, "targets", shape=input_ids.shape)
            mask, loss_mask = as_mask(mask, input_ids.shape, "mask"), as_mask(loss_mask, input_ids.shape, "loss_mask")
            if state is not None and self.cfg.causal:  # an encoder's is refused by features(), which takes one too
                check_continued_state(state, len(self.units), type(self).__name__)
            padded = self.cfg.causal and causal_padding(mask, LEFT_PADDING_HF)
            if context_parallel is not None and padded:  # (causal: context parallelism refuses encoders)
                raise ValueError("context parallelism takes whole sequences without padding (mask all True): the "
                                 "ranks after a chunk would read its padding as real tokens")
        except (ValueError, TypeError) as error:
            if context_parallel is None:
                raise
            problem = str(error)  # raised by every rank, after the exchange
        chunks = None if context_parallel is None else agree_chunks(context_parallel, input_ids.shape[-1],
                                                                    input_ids.device, problem)
        return mask, loss_mask, padded, chunks

    # ------------------------------------------------------------------ sampling

    def stream(self, input_ids: torch.Tensor, max_new_tokens: int, *, state: ModelState | None = None,
               temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
               generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        """Yield ``max_new_tokens`` sampled tokens (``[B]`` each) continuing ``input_ids`` ``[B, T]``.

        The prompt is read once; each new token then costs one linear-time step with the carried state,
        whatever the context length. The arguments are checked at the call, not at the first token. Each step runs
        in eval mode without gradients, and the model is back in its own mode between two tokens: a stream may be
        held across training steps (they get dropout and codebook statistics). ``state``: the state this model
        returned for the earlier tokens of the same rows (``generate(..., return_state=True)`` or a forward call);
        ``input_ids`` then holds only the tokens after them, and nothing before is read again.
        """
        steps = self._sampled(input_ids, max_new_tokens, state, temperature, top_k, top_p, generator)
        return (token for token, _ in steps)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, state: ModelState | None = None,
                 return_state: bool = False, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                 generator: torch.Generator | None = None):
        """``[B, T + max_new_tokens]``: ``input_ids`` followed by sampled tokens (``temperature=0``: greedy).

        ``state`` as in :meth:`stream`. ``return_state``: ``(ids, state)``, the state having read every token of
        ``ids`` (one more step, for the newest), so that a conversation continues with its next tokens alone:
        ``generate(reply_ids, n, state=state)``.
        """
        check_bool(return_state, "return_state")
        new, before = [], state  # before: the state that has read every token but the newest
        for token, before in self._sampled(input_ids, max_new_tokens, state, temperature, top_k, top_p, generator):
            new.append(token[:, None])
        ids = torch.cat([input_ids, *new], dim=1)
        if not return_state:
            return ids
        with evaluating(self):
            return ids, self(new[-1] if new else input_ids, before).state

    def _sampled(self, input_ids, max_new_tokens, state, temperature, top_k, top_p, generator):
        """An iterator of ``(token, state)`` per sampled token, the state having read every token before that one;
        the arguments are checked now, before the prompt is read."""
        if not is_integer(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        max_new_tokens = operator.index(max_new_tokens)
        if not self.cfg.causal:
            raise ValueError("sampling needs a causal model; this one is an encoder (causal=False)")
        check_sampling(temperature, top_k, top_p)
        return self._sampling_steps(input_ids, max_new_tokens, state, temperature, top_k, top_p, generator)

    @torch.no_grad()
    def _sampling_steps(self, input_ids, max_new_tokens, state, temperature, top_k, top_p, generator):
        if max_new_tokens == 0:  # nothing to sample: the prompt is not read (generate's return_state reads it once)
            return
        with evaluating(self):  # per step, not across a yield: the caller may train between two tokens
            out = self(input_ids, state)
        for i in range(max_new_tokens):
            token = sample_next_token(out.logits[:, -1], temperature=temperature, top_k=top_k,
                                      top_p=top_p, generator=generator)
            yield token, out.state
            if i + 1 < max_new_tokens:
                with evaluating(self):
                    out = self(token[:, None], out.state)
