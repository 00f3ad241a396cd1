"""The encoder on the real tokens only: the `unpad_inputs` switch (after MosaicBERT's `bert_padding.py`).

After the embeddings the padding rows are removed, so every projection and feed-forward runs on a (tokens, hidden)
matrix. Attention runs in flash attention's variable-length kernel, or with eager or SDPA over groups of
similar-length sequences (`AttentionGroups`; eager through `GroupedAttention`, whose backward is written out). Any
other kernel gets the batch padded back.

Not one graph under `torch.compile` (the token count is read from the data); on a GPU, `--packing true` is the
compilable way to drop padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils.generic import is_flash_attention_requested

from .attention_backend import measured_sdpa_attention
from .fast_dropout import eager_attention_fast_dropout, takes_fast_dropout_kernel
from .grouped_attention import GroupedAttention
from .last_layer_subset import place_rows, select_rows
from .modeling_bert_repro import (
    BertReproEncoder,
    BertReproLayer,
    BertReproParts,
    BertReproSelfAttention,
    attention_inputs,
    eager_attention,
)
from .packed_sequences import PackedSequences

# The ways attention runs over unpadded tokens; `attention_path` picks one per forward.
VARIABLE_LENGTH, WRITTEN_OUT, GROUPED, PADDED_BACK = "variable-length", "written-out", "grouped", "padded-back"


class Unpadded:
    """Where the real tokens of a padded (batch, seq) batch are.

    `unpad` takes (batch, seq, ...) to (tokens, ...) in row-major order; `pad` puts them back, zeros at the padding
    (both differentiable). `first_tokens` are the rows of each non-empty sequence's first token. The encoder also
    stores here how attention runs in this forward: `path`, `fast_dropout`, and `mask` (for PADDED_BACK).
    """

    def __init__(self, real: torch.Tensor, lengths: torch.Tensor | None = None):
        """real: (batch, seq) bool, True at real tokens. lengths: each sequence's tokens when rows hold several
        (a packed batch); by default one sequence per row."""
        self.batch, self.seq = real.shape
        self.indices = real.flatten().nonzero().flatten()
        if lengths is None:
            lengths = real.sum(dim=1, dtype=torch.int32)
        self.cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        self.max_seqlen = int(lengths.max())
        self.lengths = lengths.tolist()
        self.first_tokens = self.cu_seqlens[:-1][lengths > 0].long()
        self.path, self.fast_dropout, self.mask = PADDED_BACK, False, None
        self._groups: AttentionGroups | None = None

    @classmethod
    def from_attention_mask(cls, attention_mask: torch.Tensor | None, without_padding: bool = False) -> Unpadded | None:
        """None when there is nothing to remove (no 2-D mask, or no padding unless `without_padding`) or to keep."""
        if attention_mask is None or attention_mask.dim() != 2:
            return None
        real = attention_mask.bool()
        if (bool(real.all()) and not without_padding) or not bool(real.any()):
            return None
        return cls(real)

    def attention_groups(self, rows_per_group: int = 8) -> AttentionGroups:
        """The rows in groups of similar length, computed once per forward."""
        if self._groups is None:
            self._groups = AttentionGroups(self, rows_per_group)
        return self._groups

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.batch * self.seq, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        full = x.new_zeros(self.batch * self.seq, *x.shape[1:]).index_copy(0, self.indices, x)
        return full.view(self.batch, self.seq, *x.shape[1:])


class AttentionGroups:
    """Sequences of similar length padded together, for attention kernels that need a rectangle.

    Rows sorted longest first are cut into groups of `rows_per_group`, each a (rows, seq) grid, seq its longest row;
    the grids lie end to end in one (cells, ...) matrix. `gather` gives, per cell, the token that fills it; `scatter`,
    per token, its cell. A padding cell repeats a real token of its row (no zero-filled buffer) and `key_mask`
    ((rows, 1, 1, seq) or None when the grid is full) hides it as a key. Attention covers sum(rows * seq^2) pairs
    instead of batch * max_seqlen^2.
    """

    def __init__(self, unpadded: Unpadded, rows_per_group: int = 8):
        lengths, starts = unpadded.lengths, unpadded.cu_seqlens.tolist()
        order = sorted((r for r in range(len(lengths)) if lengths[r]), key=lambda r: -lengths[r])
        gather, scatter, self.groups = [], torch.empty(starts[-1], dtype=torch.long), []
        # `starts`: a grid's first token when its cells are consecutive tokens (one slice), else None.
        self.starts = []
        cells = 0
        for first in range(0, len(order), rows_per_group):
            members = order[first : first + rows_per_group]
            seq = lengths[members[0]]
            consecutive = members == list(range(members[0], members[0] + len(members)))
            self.starts.append(starts[members[0]] if consecutive and lengths[members[-1]] == seq else None)
            key_mask = None
            if any(lengths[r] < seq for r in members):
                real = torch.tensor([lengths[r] for r in members])
                key_mask = (torch.arange(seq)[None, :] < real[:, None])[:, None, None, :]
                key_mask = key_mask.to(unpadded.indices.device)
            self.groups.append((len(members), seq, key_mask))
            for r in members:
                n = lengths[r]
                tokens = torch.arange(starts[r], starts[r] + n)
                gather.append(torch.cat([tokens, tokens.new_full((seq - n,), starts[r])]))
                scatter[starts[r] : starts[r] + n] = torch.arange(cells, cells + n)
                cells += seq
        self.gather = torch.cat(gather).to(unpadded.indices.device)
        self.sizes = [rows * seq for rows, seq, _ in self.groups]  # cells per grid
        self.scatter = scatter.to(unpadded.indices.device)
        # `dest`: for each cell, the token it holds; padding cells name the row one past the last token.
        dest = torch.full((cells,), starts[-1], dtype=torch.long)
        dest[scatter] = torch.arange(starts[-1])
        self.dest = dest.to(unpadded.indices.device)
        # `first`: for each grid row, its sequence's index in `Unpadded.first_tokens`.
        rank = {r: i for i, r in enumerate(sorted(order))}
        self.first = torch.tensor([rank[r] for r in order], dtype=torch.long, device=unpadded.indices.device)
        self.row_sizes = [rows for rows, _, _ in self.groups]

    def per_grid(self):
        """For each grid: (rows, seq, key_mask), and its parts of `gather`, `dest` and `first`, and its start."""
        return zip(
            self.groups,
            self.gather.split(self.sizes),
            self.dest.split(self.sizes),
            self.first.split(self.row_sizes),
            self.starts,
        )


def attention_path(self_attention: BertReproSelfAttention, hidden_states: torch.Tensor) -> str:
    """How attention runs over unpadded tokens in this forward."""
    config = self_attention.config
    if is_flash_attention_requested(config):
        return VARIABLE_LENGTH
    if config._attn_implementation not in ("eager", "sdpa"):
        return PADDED_BACK
    kernel = self_attention.attention_function(hidden_states)
    return WRITTEN_OUT if kernel in (eager_attention, eager_attention_fast_dropout) else GROUPED


class SpeedSelfAttention(BertReproSelfAttention):
    """The speed paths' self-attention: over the real tokens along `unpadded.path`, else the model file's. It
    returns the context at `read_rows` (all when None), and honours the config's `fast_dropout`, `fused_qkv` and
    `measured_sdpa`."""

    def __init__(self, config):
        super().__init__(config)
        self.fast_dropout = config.fast_dropout
        self.fused_qkv = config.fused_qkv
        self.measured_sdpa = config.measured_sdpa

    def attention_function(self, hidden_states: torch.Tensor):
        if self.fast_dropout and takes_fast_dropout_kernel(self, hidden_states):
            return eager_attention_fast_dropout
        if self.measured_sdpa and self.config._attn_implementation == "sdpa":
            return measured_sdpa_attention
        return super().attention_function(hidden_states)

    def query_key_value(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Linears of another kind (torchao's Float8Linear for --fp8) keep their own products.
        plain = all(type(getattr(self, part)) is nn.Linear for part in ("query", "key", "value"))
        if not (self.fused_qkv and plain):
            return super().query_key_value(hidden_states)
        return self._fused_projection(hidden_states).chunk(3, dim=-1)

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        unpadded: Unpadded | None = None,
        read_rows: torch.Tensor | None = None,
        **kwargs,
    ):
        if unpadded is None:
            context, probs = super().forward(hidden_states, attention_mask, **kwargs)
            return select_rows(context, read_rows), probs
        dropout = self.dropout_prob if self.training else 0.0
        shape = (hidden_states.shape[0], self.num_heads, self.head_size)
        if unpadded.path == WRITTEN_OUT:
            parts, queries = ("query", "key", "value"), None
            if (
                read_rows is not None
                and read_rows.shape == unpadded.first_tokens.shape
                and torch.equal(read_rows, unpadded.first_tokens)
            ):
                # Only each sequence's first token ([CLS]) is read after this layer: queries there only.
                parts, queries, read_rows = ("key", "value"), self.query(hidden_states.index_select(0, read_rows)), None
            context = GroupedAttention.apply(
                self._fused_projection(hidden_states, parts),
                unpadded.attention_groups(),
                self.num_heads,
                self.scaling,
                dropout,
                unpadded.fast_dropout,
                queries,
            )
            return select_rows(context, read_rows), None
        kernel = self.attention_function(hidden_states)
        if unpadded.path == GROUPED:
            # One Q/K/V product, one gather into the grids, one gather back: no zero-filled buffers.
            groups = unpadded.attention_groups()
            cells = self._fused_projection(hidden_states).index_select(0, groups.gather)
            outputs = []
            # split, not slicing: its backward is one cat, where each slice's would be a full-size zero buffer
            for grid, (rows, seq, key_mask) in zip(cells.split(groups.sizes), groups.groups):
                query, key, value = (x.transpose(1, 2) for x in grid.view(rows, seq, 3, *shape[1:]).unbind(2))
                context, _ = kernel(self, query, key, value, key_mask, scaling=self.scaling, dropout=dropout, **kwargs)
                outputs.append(context.reshape(rows * seq, -1))
            return select_rows(torch.cat(outputs).index_select(0, groups.scatter), read_rows), None
        query, key, value = (x.view(shape) for x in self.query_key_value(hidden_states))
        if unpadded.path == VARIABLE_LENGTH:
            # The sequences lie one after the other in a batch of one, told apart by cu_seqlens.
            context, probs = kernel(
                self,
                *(x.unsqueeze(0).transpose(1, 2) for x in (query, key, value)),
                None,
                scaling=self.scaling,
                dropout=dropout,
                cu_seq_lens_q=unpadded.cu_seqlens,
                cu_seq_lens_k=unpadded.cu_seqlens,
                max_length_q=unpadded.max_seqlen,
                max_length_k=unpadded.max_seqlen,
                **kwargs,
            )
            return select_rows(context.reshape(shape[0], -1), read_rows), probs
        query, key, value = (unpadded.pad(x).transpose(1, 2) for x in (query, key, value))
        context, probs = kernel(self, query, key, value, unpadded.mask, scaling=self.scaling, dropout=dropout, **kwargs)
        return select_rows(unpadded.unpad(context.reshape(unpadded.batch, unpadded.seq, -1)), read_rows), probs

    def _fused_projection(self, hidden_states: torch.Tensor, parts: tuple[str, ...] = ("query", "key", "value")):
        """(tokens, len(parts) * hidden): the projections in `parts` as one matrix product."""
        weight = torch.cat([getattr(self, part).weight for part in parts])
        bias = torch.cat([getattr(self, part).bias for part in parts])
        return F.linear(hidden_states, weight, bias)


class SpeedLayer(BertReproLayer):
    """A Transformer block taking `unpadded` and `read_rows`, the rows of its output to compute (all when None).

    With `unpadded`, its input and output are the real tokens' rows, (tokens, hidden); while hidden states are
    recorded, the padded (batch, seq, hidden) batch, unpadded inside, so that every recorded state has the batch's
    shape (`capture_outputs` records each layer's input and output)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        unpadded: Unpadded | None = None,
        read_rows: torch.Tensor | None = None,
        **kwargs,
    ):
        padded_io = unpadded is not None and hidden_states.dim() == 3
        rows = unpadded.unpad(hidden_states) if padded_io else hidden_states
        context, _ = self.attention.self(rows, attention_mask, unpadded=unpadded, read_rows=read_rows, **kwargs)
        attention_output = self.attention.output(context, select_rows(rows, read_rows))
        output = self.output(self.intermediate(attention_output), attention_output)
        return unpadded.pad(output) if padded_io else output


def records(config, kwargs: dict, name: str) -> bool:
    """Whether this forward records `name` ("output_hidden_states" or "output_attentions", the argument or else the
    config), which `capture_outputs` reads from every layer."""
    return kwargs.get(name, getattr(config, name)) not in (None, False)


class SpeedEncoder(BertReproEncoder):
    """The encoder with `unpad_inputs` and `last_layer_subset`. Given `read_positions` ((batch, seq) bool), the last
    block computes those rows only and `last_hidden_state` is zero elsewhere. Recording attentions takes the paper's
    path (the unpadded kernels return no probabilities), recording hidden states every row of the last block."""

    def __init__(self, config, parts: BertReproParts):
        super().__init__(config, parts)
        self.unpad_inputs = config.unpad_inputs
        self.last_layer_subset = config.last_layer_subset

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        packed: PackedSequences | None = None,
        read_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        hidden_recorded = records(self.config, kwargs, "output_hidden_states")
        if not self.last_layer_subset or hidden_recorded:
            read_positions = None
        unpadded = None
        if self.unpad_inputs and not records(self.config, kwargs, "output_attentions"):
            path = attention_path(self.layer[0].attention.self, hidden_states)
            unpadded = (
                Unpadded(packed.real, packed.lengths)
                if packed is not None
                else Unpadded.from_attention_mask(attention_mask, without_padding=path == WRITTEN_OUT)
            )
        if unpadded is None and read_positions is None:
            return super().forward(hidden_states, attention_mask, packed=packed, **kwargs)
        shape = hidden_states.shape
        if unpadded is None:  # padded, the last block at `read_positions` only
            mask, kernel_kwargs = attention_inputs(self.config, hidden_states, attention_mask, packed)
            kwargs.update(kernel_kwargs)
            rows, positions = hidden_states, read_positions.flatten()
        else:
            unpadded.path = path
            unpadded.fast_dropout = (
                self.layer[0].attention.self.attention_function(hidden_states) is eager_attention_fast_dropout
            )
            mask = None
            if path == PADDED_BACK:
                unpadded.mask, _ = attention_inputs(self.config, hidden_states, attention_mask, packed)
            kwargs.pop("position_ids", None)  # already in the embeddings; the kernels read `unpadded` for the bounds
            rows = unpadded.unpad(hidden_states)
            rows = unpadded.pad(rows) if hidden_recorded else rows  # recorded: zeros at padding, as every layer's
            positions = None if read_positions is None else read_positions.flatten().index_select(0, unpadded.indices)
        read_rows = None if positions is None else positions.nonzero().flatten()
        for i, layer in enumerate(self.layer):
            last = i == len(self.layer) - 1
            rows = layer(rows, mask, unpadded=unpadded, read_rows=read_rows if last else None, **kwargs)
        if read_rows is not None:
            where = read_rows if unpadded is None else unpadded.indices.index_select(0, read_rows)
            return BaseModelOutput(last_hidden_state=place_rows(rows, where, shape))
        return BaseModelOutput(last_hidden_state=rows if hidden_recorded else unpadded.pad(rows))


__all__ = [
    "AttentionGroups",
    "SpeedEncoder",
    "SpeedLayer",
    "SpeedSelfAttention",
    "Unpadded",
    "attention_path",
    "records",
]
