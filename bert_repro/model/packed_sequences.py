"""Packed batches: several examples in one row, each attending only to itself, each with its own [CLS].

`bert_repro.data.pack_examples` packs the rows. An example starts where `position_ids == 0` at a real token, the
convention of transformers' variable-length FlashAttention path; rows whose positions never restart are not packed.
SDPA and eager get a block-diagonal mask (a row's padding is one more block, so no query row is fully masked: no
NaN), flash attention `cu_seq_lens_*`; flex attention refuses them. `pooler_output` is (examples, hidden), one row
per `next_sentence_label`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.utils.generic import is_flash_attention_requested


class PackedSequences:
    """Where the examples of a packed (rows, seq) batch lie.

    `starts`: (rows, seq) bool, True at each example's [CLS]. `example_ids`: each example's rank in its row from 1,
    0 at padding. `cls_positions`: (examples,) flat index of each [CLS], row-major (a fixed-shape batch repeats
    position 0 for its missing examples, whose labels are ignored); without it the pooler's gather has a data-dependent
    size (a graph break).
    """

    def __init__(self, starts: torch.Tensor, real: torch.Tensor, cls_positions: torch.Tensor | None = None):
        self.starts, self.real, self.cls_positions = starts, real, cls_positions
        self.example_ids = starts.cumsum(-1) * real
        self._lengths: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """Tokens per example, row-major; computed when first read (its shape is the data's)."""
        if self._lengths is None:
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
        """The examples of a packed batch, or None when no row holds more than one and there are no
        `cls_positions`."""
        if position_ids is None or position_ids.dim() != 2:
            return None
        real = torch.ones_like(position_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if attention_mask is not None and attention_mask.dim() != 2:
            return None
        starts = (position_ids == 0) & real
        if torch.compiler.is_compiling():
            # Checking the data would split the graph: every row is taken as packed (the same results).
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
        """(rows, seq, hidden) -> (examples, 1, hidden): each example's [CLS], what the pooler reads."""
        if self.cls_positions is not None:
            return hidden_states.flatten(0, 1)[self.cls_positions].unsqueeze(1)
        return hidden_states[self.starts].unsqueeze(1)

    def block_diagonal_mask(self) -> torch.Tensor:
        """(rows, 1, seq, seq) bool: query and key in the same example (or both in the row's padding)."""
        ids = self.example_ids
        return (ids[:, :, None] == ids[:, None, :]).unsqueeze(1)

    def variable_length_kwargs(self) -> dict:
        """cu_seq_lens_q/k and max_length_q/k over the flattened rows: each example and each row's padding one
        sequence."""
        rows, seq = self.real.shape
        padding_start = ~self.real & F.pad(self.real, (1, 0), value=True)[:, :-1]
        begins = (self.starts | padding_start).flatten().nonzero().flatten().to(torch.int32)
        cu = torch.cat([begins, begins.new_tensor([rows * seq])])
        longest = int(cu.diff().max())
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}

    def attention_inputs(self, config) -> tuple[torch.Tensor | None, dict]:
        """(the kernel's mask, extra kernel kwargs) for `config._attn_implementation`."""
        if is_flash_attention_requested(config):
            return None, self.variable_length_kwargs()
        if config._attn_implementation == "flex_attention":  # it would add a boolean mask to the scores
            raise ValueError(
                "Packed batches (position_ids restarting inside a row) are not supported with "
                "attn_implementation='flex_attention': use 'sdpa', 'eager' or 'flash_attention_2', or pack no rows."
            )
        return self.block_diagonal_mask(), {}


__all__ = ["PackedSequences"]
