"""Packed batches: several examples in one row, each attending only to itself, each with its own [CLS].

`bert_repro.data.pack_examples` packs the rows; this is what the model needs to run them as separate sequences.
An example starts where `position_ids == 0` at a real token, the convention of transformers' variable-length
FlashAttention path. Rows whose positions never restart are not packed, and the model runs as the paper's.

- SDPA / eager: a block-diagonal (rows, 1, seq, seq) bool mask. A row's trailing padding is one more block, so no
  query row is fully masked (no NaN); its outputs are never read.
- flash-attention: no mask; `cu_seq_lens_q/k` and `max_length_q/k` over the examples laid end to end.
- The unpadding speed path: its `Unpadded` takes the examples as its sequences, so each stays to itself.
- The pooler reads every example's [CLS] (`first_tokens_of`) in row-major order: `pooler_output` is (examples,
  hidden), one row per `next_sentence_label`. Found with `nonzero` its size depends on the data (a graph break, a
  host sync). A packing collator's optional `cls_positions`, one flat index per example, make it a fixed-size
  gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.utils.generic import is_flash_attention_requested


class PackedSequences:
    """Where the examples of a packed (rows, seq) batch lie.

    `starts`: (rows, seq) bool, True at each example's first token ([CLS]). `example_ids`: (rows, seq) long, the
    example's rank within its row from 1, 0 at padding. `lengths`: tokens per example in row-major order.
    `cls_positions`: (examples,) long or None, each example's [CLS] in the flattened batch, row-major (a fixed-shape
    batch repeats position 0 for its missing examples, whose labels are ignored).
    """

    def __init__(self, starts: torch.Tensor, real: torch.Tensor, cls_positions: torch.Tensor | None = None):
        self.starts, self.real, self.cls_positions = starts, real, cls_positions
        self.example_ids = starts.cumsum(-1) * real
        self._lengths: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """Computed when first read (by the unpadding and variable-length paths: its shape is the data's)."""
        if self._lengths is None:
            # Examples in row-major order of their [CLS]: the examples of a row are consecutive real tokens.
            first = self.starts.flatten()[self.real.flatten()].nonzero().flatten()
            tokens = int(self.real.sum())
            self._lengths = torch.diff(first, append=first.new_tensor([tokens])).to(torch.int32)
        return self._lengths

    @classmethod
    def from_inputs(
        cls,
        position_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        cls_positions: torch.Tensor | None = None,
    ) -> PackedSequences | None:
        """The examples of a packed batch, or None when no row holds more than one (or no position_ids). A batch
        with `cls_positions` is read as packed even then: its pooler output is one row per position."""
        if position_ids is None or position_ids.dim() != 2:
            return None
        real = torch.ones_like(position_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if attention_mask is not None and attention_mask.dim() != 2:
            return None
        starts = (position_ids == 0) & real
        if torch.compiler.is_compiling():
            # Checking the data would split the compiled graph: every row is taken as packed (one example per
            # row is a packed row too, with the same results when it starts at position 0, as collated).
            return cls(starts, real, cls_positions)
        if cls_positions is not None:
            cls._check_cls_positions(starts, cls_positions)
        elif not bool(starts[:, 1:].any()):
            return None
        if not bool((starts[:, 0] | ~real[:, 0]).all()):
            raise ValueError(
                "a packed row must begin with an example: position_ids must be 0 at each row's first token"
            )
        return cls(starts, real, cls_positions)

    @staticmethod
    def _check_cls_positions(starts: torch.Tensor, cls_positions: torch.Tensor) -> None:
        """Every example's [CLS] in row-major order, then (missing examples) any [CLS] again."""
        flat = starts.flatten()
        first = flat.nonzero().flatten()
        listed = cls_positions[: first.numel()]
        if not torch.equal(listed, first) or not bool(flat[cls_positions].all()):
            raise ValueError(
                "cls_positions must name each example's [CLS] (position_ids == 0 at a real token) in row-major "
                "order, then only [CLS] positions"
            )

    def first_tokens_of(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(rows, seq, hidden) -> (examples, 1, hidden): each example's [CLS] as a one-token sequence (what the
        pooler reads), in row-major order; at `cls_positions` when given (a gather of their fixed size)."""
        if self.cls_positions is not None:
            return hidden_states.flatten(0, 1)[self.cls_positions].unsqueeze(1)
        return hidden_states[self.starts].unsqueeze(1)

    def block_diagonal_mask(self) -> torch.Tensor:
        """(rows, 1, seq, seq) bool: query and key in the same example (or both in the row's padding)."""
        ids = self.example_ids
        return (ids[:, :, None] == ids[:, None, :]).unsqueeze(1)

    def variable_length_kwargs(self) -> dict:
        """cu_seq_lens_q/k and max_length_q/k for the rows flattened to one sequence of rows * seq positions:
        each example, and each row's padding, one sequence."""
        rows, seq = self.real.shape
        # A sequence starts at each [CLS] and at each row's first padding position.
        padding_start = ~self.real & F.pad(self.real, (1, 0), value=True)[:, :-1]
        begins = (self.starts | padding_start).flatten().nonzero().flatten().to(torch.int32)
        cu = torch.cat([begins, begins.new_tensor([rows * seq])])
        longest = int(cu.diff().max())
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}

    def attention_inputs(self, config) -> tuple[torch.Tensor | None, dict]:
        """(the kernel's mask, extra kernel kwargs) for `config._attn_implementation`."""
        if is_flash_attention_requested(config):
            return None, self.variable_length_kwargs()
        return self.block_diagonal_mask(), {}


__all__ = ["PackedSequences"]
