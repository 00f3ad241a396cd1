# Copyright 2026 The bert-repro Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The BERT model family (Devlin et al., 2018), written from the paper.

Paper section -> code:
- 3 / Figure 2, input representation: `BertReproEmbeddings`.
- 3, model architecture (Vaswani et al.'s post-LN encoder): `BertReproLayer`, `BertReproEncoder`; the attention
  kernel ("eager", "sdpa", "flex_attention", "flash_attention_2") is chosen with `attn_implementation=...`.
- 3.1, pre-training tasks: masked LM (`BertReproMLMHead`) and NSP (a linear layer on the pooled [CLS] output).
- 4 / Figure 4, fine-tuning heads: GLUE and STS-B, SQuAD, SWAG, NER (the `BertReproFor*` classes).
- 5.3, feature-based use: `output_hidden_states=True`; `concat_last_layers` (the paper's best feature set).
  Hidden states and attentions are recorded from the layers by transformers' `capture_outputs`, as in its BERT.
- 5.1 / Table 5, pre-training objectives (`config.objective`): "mlm_nsp" (BERT), "mlm" (No NSP) and "ltr", the
  left-to-right control: causal attention in pre-training and fine-tuning, the pooler on the last real token, the
  MLM head predicting the next token.

Parameter names are the public checkpoints' (`bert.encoder.layer.0.attention.self.query.weight`, ...), so every
public checkpoint loads with `from_pretrained` and no renaming. Modules are built from the `BertReproParts` that
`model_parts(config)` picks: the paper's (`PAPER_PARTS`), but for the speed switches that are on, whose module classes
`speed_paths.py` registers in `SPEED_PATHS` when the package is imported. This file is the code `save_pretrained` copies
for `trust_remote_code=True`; alone it has no speed modules, so it computes the paper's model whatever the switches say,
as transformers' BERT does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import custom_object_save
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput, auto_docstring, can_return_tuple, logging
from transformers.utils.output_capturing import capture_outputs

from .configuration_bert_repro import EXACT_GELU, TANH_GELU, BertReproConfig, check_objective_switches
from .packed_sequences import PackedSequences

logger = logging.get_logger(__name__)


def activation(name: str):
    """The feed-forward activation named in the config (transformers' spellings)."""
    if name in EXACT_GELU:
        return F.gelu
    if name in TANH_GELU:
        return lambda x: F.gelu(x, approximate="tanh")
    return {"relu": F.relu, "silu": F.silu, "swish": F.silu}[name]


@dataclass(frozen=True)
class BertReproParts:
    """The module classes a model builds: the paper's (`PAPER_PARTS`), or per switch the speed paths'."""

    embeddings: type[nn.Module]
    encoder: type[nn.Module]
    layer: type[nn.Module]
    self_attention: type[nn.Module]
    self_output: type[nn.Module]
    output: type[nn.Module]
    dropout: type[nn.Module]
    mlm_head: type[nn.Module]


# --- Embeddings and encoder ------------------------------------------------------------------------------------


class BertReproEmbeddings(nn.Module):
    """Token + learned absolute position + segment (A = 0, B = 1) embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = parts.dropout(config.hidden_dropout_prob)
        self.position_ids = nn.Buffer(torch.arange(config.max_position_embeddings)[None], persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(batch, seq) ids -> (batch, seq, hidden). position_ids default to 0, 1, 2, ... (packing restarts them)."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        seq_length = inputs_embeds.shape[1]
        if seq_length > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"Input of {seq_length} tokens is longer than the model's "
                f"{self.position_embeddings.num_embeddings} positions (max_position_embeddings); truncate it."
            )
        if position_ids is None:
            position_ids = self.position_ids[:, :seq_length]
        if token_type_ids is None:
            segment_embeddings = self.token_type_embeddings.weight[0]
        else:
            segment_embeddings = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds + segment_embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    """softmax(Q K^T * scaling + mask) V for (batch, heads, seq, head_size) inputs; the mask is additive
    (batch, 1, seq, seq), boolean (True = attend) or None. Returns the context (batch, seq, heads, head_size) and
    the probabilities (batch, heads, seq, seq)."""
    # Scaling and masking in place: the product's backward needs its inputs only, so no new (.., seq, seq) buffer.
    scores = torch.matmul(query, key.transpose(-1, -2))
    scores.mul_(scaling)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores.add_(attention_mask)
    probs = F.dropout(F.softmax(scores, dim=-1), p=dropout, training=module.training)
    context = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return context, probs


class BertReproSelfAttention(nn.Module):
    """Multi-head self-attention; the kernel is picked by `config._attn_implementation`."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.config = config
        # Read by the sdpa / flash-attention interfaces: BERT attends in both directions, the LTR control left-only.
        self.is_causal = config.pretraining_objective.causal
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_size**-0.5
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob

    def attention_function(self, hidden_states: torch.Tensor):
        """The kernel for `config._attn_implementation` (a seam: `fast_dropout.py` overrides it)."""
        return ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention)

    def query_key_value(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V, each (..., hidden) (a seam: the speed paths compute them as one product, `fused_qkv`)."""
        return self.query(hidden_states), self.key(hidden_states), self.value(hidden_states)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        """(batch, seq, hidden) -> context of that shape and the probabilities (eager kernel) or None; kwargs go to
        the kernel (e.g. cu_seq_lens_* for packed sequences with flash attention)."""
        input_shape = hidden_states.shape[:-1]
        shape = (*input_shape, self.num_heads, self.head_size)
        query, key, value = (x.view(shape).transpose(1, 2) for x in self.query_key_value(hidden_states))
        context, probs = self.attention_function(hidden_states)(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.dropout_prob if self.training else 0.0,
            **kwargs,
        )
        if probs is None and kwargs.get("output_attentions", self.config.output_attentions):
            raise ValueError(
                f"output_attentions needs the attention probabilities, which the {self.config._attn_implementation!r} "
                "kernel does not return: load the model with attn_implementation='eager'."
            )
        return context.reshape(*input_shape, -1), probs


class BertReproSelfOutput(nn.Module):
    """Projection of the attention context, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = parts.dropout(config.hidden_dropout_prob)

    def forward(self, context: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(context)))


class BertReproAttention(nn.Module):
    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.self = parts.self_attention(config)
        self.output = parts.self_output(config, parts)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        context, _ = self.self(hidden_states, attention_mask, **kwargs)
        return self.output(context, hidden_states)


class BertReproIntermediate(nn.Module):
    """W1 and the activation of the position-wise feed-forward network."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(hidden_states))


class BertReproOutput(nn.Module):
    """W2 of the feed-forward network, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = parts.dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(hidden_states)))


class BertReproLayer(GradientCheckpointingLayer):
    """One Transformer encoder block: x = LN(x + Drop(SelfAttn(x))); x = LN(x + Drop(W2 gelu(W1 x)))."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.attention = BertReproAttention(config, parts)
        self.intermediate = BertReproIntermediate(config)
        self.output = parts.output(config, parts)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        attention_output = self.attention(hidden_states, attention_mask, **kwargs)
        return self.output(self.intermediate(attention_output), attention_output)


def attention_inputs(
    config, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, packed: PackedSequences | None = None
) -> tuple[torch.Tensor | None, dict]:
    """The kernel's mask and arguments, from the (batch, seq) padding mask or the packing. A causal mask is always
    built (not left to SDPA's is_causal): the speed paths' eager kernels read only the mask."""
    if packed is not None:
        return packed.attention_inputs(config)
    # CODEPATH: checkpoints pre-trained with objective="ltr" (Table 5's left-to-right control) attend causally;
    # BERT's ("mlm_nsp", "mlm"), every public one among them, in both directions.
    if config.pretraining_objective.causal:
        return create_causal_mask(config, hidden_states, attention_mask, None, allow_is_causal_skip=False), {}
    return create_bidirectional_mask(config=config, inputs_embeds=hidden_states, attention_mask=attention_mask), {}


class BertReproEncoder(nn.Module):
    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([parts.layer(config, parts) for _ in range(config.num_hidden_layers)])

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        packed: PackedSequences | None = None,
        read_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        """attention_mask is the (batch, seq) padding mask: the kernel's mask is built here, so that the unpadding
        encoder can read the padding. kwargs go to every layer and on to the attention kernel. `read_positions` is
        for the speed paths' encoder (`last_layer_subset`); this one computes every position."""
        mask, kernel_kwargs = attention_inputs(self.config, hidden_states, attention_mask, packed)
        kwargs.update(kernel_kwargs)
        for layer in self.layer:
            hidden_states = layer(hidden_states, mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


def last_tokens(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(batch, seq, hidden) -> (batch, 1, hidden): each sequence's last real token (the last 1 of the mask)."""
    if attention_mask is None:
        return hidden_states[:, -1:]
    last = (attention_mask.bool() * torch.arange(attention_mask.shape[-1], device=attention_mask.device)).argmax(-1)
    return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), last].unsqueeze(1)


class BertReproPooler(nn.Module):
    """tanh(W h_[CLS]), for NSP and the classification heads. A causal model pools its last real token instead, as
    GPT does, since its [CLS] sees only itself (the paper does not say what its LTR model pools)."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))


# --- Pre-training heads ----------------------------------------------------------------------------------------


class BertReproMLMTransform(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden_states)))


class BertReproMLMHead(nn.Module):
    """Masked-LM head: transform, then a decoder tied to the token embeddings plus an output-only bias."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.transform = BertReproMLMTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states)) + self.bias


class BertReproPreTrainingHeads(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.predictions = model_parts(config).mlm_head(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertReproOnlyMLMHead(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.predictions = model_parts(config).mlm_head(config)


class BertReproOnlyNSPHead(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


PAPER_PARTS = BertReproParts(
    embeddings=BertReproEmbeddings,
    encoder=BertReproEncoder,
    layer=BertReproLayer,
    self_attention=BertReproSelfAttention,
    self_output=BertReproSelfOutput,
    output=BertReproOutput,
    dropout=nn.Dropout,
    mlm_head=BertReproMLMHead,
)
# Per speed switch (`SPEED_SWITCHES`), the parts it swaps in: filled by `speed_paths.py`, which the package imports.
# Saved code (`trust_remote_code=True`) has no speed modules, so there this stays empty.
SPEED_PATHS: dict[str, dict[str, type[nn.Module]]] = {}


def model_parts(config: BertReproConfig) -> BertReproParts:
    """The paper's parts, but for those `SPEED_PATHS` names for each switch that is on. Switches the objective rules
    out raise `ObjectiveConflictError`, also when set after the config was built."""
    check_objective_switches(config)
    picked: dict[str, type[nn.Module]] = {}
    for switch, parts in SPEED_PATHS.items():
        if getattr(config, switch, False):
            picked.update(parts)
    return replace(PAPER_PARTS, **picked)


# --- Base class: initialisation, flags, loading checks, saving with remote code -------------------------------

# Every Auto class a saved directory can be opened with (transformers writes only the saved class by default).
AUTO_MAP = {
    "AutoConfig": "configuration_bert_repro.BertReproConfig",
    "AutoModel": "modeling_bert_repro.BertReproModel",
    "AutoModelForPreTraining": "modeling_bert_repro.BertReproForPreTraining",
    "AutoModelForMaskedLM": "modeling_bert_repro.BertReproForMaskedLM",
    "AutoModelForNextSentencePrediction": "modeling_bert_repro.BertReproForNextSentencePrediction",
    "AutoModelForSequenceClassification": "modeling_bert_repro.BertReproForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_bert_repro.BertReproForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_bert_repro.BertReproForMultipleChoice",
    "AutoModelForTokenClassification": "modeling_bert_repro.BertReproForTokenClassification",
}


def _safetensors_files(path) -> str:
    """The safetensors file(s) a local checkpoint directory holds, for error messages."""
    if os.path.isdir(path):
        names = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        return ", ".join(os.path.join(path, f) for f in names) or str(path)
    return str(path)


@auto_docstring
class BertReproPreTrainedModel(PreTrainedModel):
    config_class = BertReproConfig
    config: BertReproConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    # Every kernel transformers' BERT takes; each checked against eager in tests/model/test_attention_backend.py.
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # What `capture_outputs` records: each block's output (`hidden_states`) and each attention's probabilities.
    _can_record_outputs = {"hidden_states": BertReproLayer, "attentions": BertReproSelfAttention}
    _no_split_modules = ["BertReproEmbeddings", "BertReproLayer"]
    # Trainer must divide by the accumulation steps: every loss here is the mean over its own labelled items (label
    # -100 ignored), as the reference code's per TPU core.
    accepts_loss_kwargs = False
    # Some public checkpoints store the MLM output bias again under the decoder; ours is `cls.predictions.bias`.
    _keys_to_ignore_on_load_unexpected = [r"cls\.predictions\.decoder\.bias"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # CODEPATH: "truncated_normal" (the default) draws as Google's reference code did for the paper's checkpoints,
        # cut at two standard deviations; "normal" is transformers' BERT init, which super() does.
        if self.config.initializer_distribution == "truncated_normal" and isinstance(module, (nn.Linear, nn.Embedding)):
            std = self.config.initializer_range
            init.trunc_normal_(module.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        else:
            super()._init_weights(module)
        if isinstance(module, BertReproMLMHead):
            init.zeros_(module.bias)
        elif isinstance(module, BertReproEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1])[None])

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, allow_missing_encoder_weights=False, **kwargs):
        """`PreTrainedModel.from_pretrained`, but missing encoder weights raise unless
        `allow_missing_encoder_weights=True` (missing head weights only warn). Reads safetensors only unless
        `use_safetensors=False` (pickles run code when unpickled; `bert_repro.model.conversion`)."""
        return_info = kwargs.pop("output_loading_info", False)
        kwargs.setdefault("use_safetensors", True)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        except SafetensorError as err:
            raise OSError(
                f"Could not read the weights of {pretrained_model_name_or_path}: "
                f"{_safetensors_files(pretrained_model_name_or_path)} "
                f"is not a valid safetensors file ({err}). It is damaged or incomplete: download or save it again."
            ) from err
        except RuntimeError as err:
            if "ignore_mismatched_sizes" not in str(err):
                raise
            raise ValueError(
                f"Weights in {pretrained_model_name_or_path} have other shapes than its config describes (the table "
                "above lists each one with both shapes). Check vocab_size, hidden_size, num_attention_heads and "
                "intermediate_size in config.json, or pass ignore_mismatched_sizes=True to re-initialise those "
                "weights (e.g. a classification head with a new number of labels)."
            ) from err
        prefix = f"{cls.base_model_prefix}."
        head_free = isinstance(model, BertReproModel)
        missing_encoder = sorted(k for k in info["missing_keys"] if head_free or k.startswith(prefix))
        if missing_encoder and not allow_missing_encoder_weights:
            shown = ", ".join(missing_encoder[:8]) + (" ..." if len(missing_encoder) > 8 else "")
            raise ValueError(
                f"{pretrained_model_name_or_path} lacks {len(missing_encoder)} weights of the BERT encoder that "
                f"{cls.__name__} needs: {shown}. They would be randomly initialised. Check that this is a BERT "
                "checkpoint of the same architecture, or pass allow_missing_encoder_weights=True."
            )
        missing_heads = sorted(set(info["missing_keys"]) - set(missing_encoder))
        if missing_heads:
            logger.warning(
                f"{cls.__name__}: newly initialised (not in {pretrained_model_name_or_path}): "
                f"{', '.join(missing_heads)}"
            )
        return (model, info) if return_info else model

    def compile_layers(self, **compile_kwargs) -> BertReproPreTrainedModel:
        """`torch.compile` every Transformer block in place and return the model. The L blocks share one graph, so
        compiling takes seconds, and unpadding and sparse MLM selection stay eager. Meant for GPUs: on CPU it did not
        reliably beat eager (benchmarks/LOG.md, "Pre-training step")."""
        for module in self.modules():
            if isinstance(module, BertReproLayer):
                module.compile(**compile_kwargs)
        return self

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save weights, config, this file's code and an `auto_map`, so `trust_remote_code=True` opens the directory
        as the paper's classes (also when saved from a speed subclass)."""
        self.config.auto_map = dict(AUTO_MAP)
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            custom_object_save(BertReproPreTrainedModel, save_directory)
        return result


# --- The encoder and the task models ---------------------------------------------------------------------------


def read_positions(
    config: BertReproConfig,
    cls: bool,
    masked: bool,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """(batch, seq) bool: the positions of the last layer a head reads, each example's [CLS] (`cls`) and its masked
    tokens (`masked`: the labelled ones, read alone with `config.sparse_prediction`); None when it reads them all."""
    # CODEPATH: the `last_layer_subset` speed switch (any checkpoint, for training) passes these to the speed paths'
    # encoder; off, as in transformers' BERT, every position is computed and nothing is gathered here.
    if not config.last_layer_subset:
        return None
    if masked:
        # CODEPATH: with `sparse_prediction` (bert_repro's pre-training recipe) the MLM head reads the labelled
        # tokens only; dense, as in transformers' BERT, every position.
        if labels is None or not config.sparse_prediction:
            return None
        read = labels.reshape(-1, labels.shape[-1]) != -100
    else:
        tokens = input_ids if input_ids is not None else inputs_embeds[..., 0]
        read = torch.zeros_like(tokens, dtype=torch.bool).reshape(-1, tokens.shape[-1])
    if cls:  # each sequence's first token; in a packed batch each example's ([CLS]: position 0)
        if position_ids is None:
            read[:, 0] = True
        else:
            first = position_ids.reshape(read.shape) == 0
            read |= first if attention_mask is None else first & attention_mask.reshape(read.shape).bool()
    return read


@auto_docstring(custom_intro="The bare BERT encoder: embeddings, L Transformer blocks, and (optionally) the pooler.")
class BertReproModel(BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig, add_pooling_layer: bool = True):
        r"""
        add_pooling_layer (`bool`, *optional*, defaults to `True`):
            Whether to add the pooler (tanh(W h_[CLS])), which NSP and the sequence-level heads read.
        """
        super().__init__(config)
        parts = model_parts(config)
        self.embeddings = parts.embeddings(config, parts)
        self.encoder = parts.encoder(config, parts)
        self.pooler = BertReproPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @capture_outputs
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cls_positions: torch.Tensor | None = None,
        read_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        r"""
        cls_positions (`torch.Tensor` of shape `(examples,)`, *optional*):
            In a packed batch (`position_ids` restart at each [CLS]), the flat index of each example's [CLS], from a
            packing collator: the pooler then gathers a fixed number of rows, so a compiled step stays one graph.
        read_positions (`torch.BoolTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The positions of the last layer that will be read (the heads pass them). With the `last_layer_subset`
            switch the last block computes those only and `last_hidden_state` is zero elsewhere.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if "sparse_prediction" in kwargs:  # a config field: as a forward argument it would be ignored
            raise TypeError("sparse_prediction is a config field: set model.config.sparse_prediction instead.")
        embedding_output = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        # A packed batch? Each example then attends to itself; each [CLS] is pooled.
        packed = PackedSequences.from_inputs(position_ids, attention_mask, cls_positions)
        if packed is not None and self.config.pretraining_objective.causal:
            raise ValueError(
                f"Packed batches are not supported with objective={self.config.objective!r} (they "
                "attend in both directions inside each example): pass one example per row."
            )
        sequence_output = self.encoder(
            embedding_output,
            attention_mask,
            packed=packed,
            read_positions=read_positions,
            position_ids=position_ids,
            **kwargs,
        ).last_hidden_state
        pooled = sequence_output if packed is None else packed.first_tokens_of(sequence_output)
        # CODEPATH: a checkpoint pre-trained with objective="ltr" (Table 5's left-to-right control) pools its last
        # real token, the only one that saw the whole input; BERT's, every public one among them, pool [CLS].
        if self.config.pretraining_objective.causal:
            pooled = last_tokens(sequence_output, attention_mask)
        return BaseModelOutputWithPooling(
            last_hidden_state=sequence_output, pooler_output=self.pooler(pooled) if self.pooler is not None else None
        )


def concat_last_layers(hidden_states: tuple[torch.Tensor, ...], n: int = 4) -> torch.Tensor:
    """The paper's best feature-based representation (Table 7): the last `n` layers concatenated, (batch, seq, n*H)."""
    if n > len(hidden_states) - 1:
        raise ValueError(f"Asked for the last {n} layers, but the model has {len(hidden_states) - 1}.")
    return torch.cat(hidden_states[-n:], dim=-1)


@auto_docstring(custom_intro="Output type of [`BertReproForPreTraining`].")
@dataclass
class BertReproForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.Tensor` of shape `()`, *optional*):
        masked_lm_loss + next_sentence_loss, each present when its labels were given (training logs both).
    masked_lm_loss (`torch.Tensor` of shape `()`, *optional*):
        Mean cross-entropy over the labelled (masked) tokens.
    next_sentence_loss (`torch.Tensor` of shape `()`, *optional*):
        Mean cross-entropy of the IsNext / NotNext prediction.
    prediction_logits (`torch.Tensor` of shape `(batch_size, sequence_length, config.vocab_size)`):
        The MLM head's logits; (masked positions, vocab) with `config.sparse_prediction` and labels.
    seq_relationship_logits (`torch.Tensor` of shape `(batch_size, 2)`):
        The NSP head's logits, index 0 IsNext.
    """

    loss: torch.Tensor | None = None
    masked_lm_loss: torch.Tensor | None = None
    next_sentence_loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in float32 over the labelled items (labels != -100)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)


class _MLMHeadMixin:
    """The MLM head's logits, its decoder tied to the input embeddings, and vocabulary resizing."""

    _tied_weights_keys = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"}

    def _mlm_logits(self, sequence_output: torch.Tensor, labels: torch.Tensor | None, masked_positions=None):
        """(MLM logits, their labels). With `config.sparse_prediction` and labels, only at the ~15% labelled
        positions, or at `masked_positions` (a fixed number, as Google's reference gathers them)."""
        # CODEPATH: `sparse_prediction` (bert_repro's pre-training recipe, any checkpoint) runs the decoder at the
        # labelled tokens only; off, as in transformers' BERT, at every position.
        if self.config.sparse_prediction and labels is not None:
            flat = labels.reshape(-1)
            rows = flat.ne(-100).nonzero()[:, 0] if masked_positions is None else masked_positions.reshape(-1)
            return self.cls.predictions(sequence_output.flatten(0, -2)[rows]), flat[rows]
        return self.cls.predictions(sequence_output), labels

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings

    def resize_token_embeddings(self, *args, **kwargs):
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        bias = self.cls.predictions.bias
        new_size = embeddings.weight.shape[0]
        if bias.shape[0] != new_size:  # the output bias follows the vocabulary; new entries start at 0
            resized = bias.new_zeros(new_size)
            kept = min(new_size, bias.shape[0])
            resized[:kept] = bias.data[:kept]
            self.cls.predictions.bias = nn.Parameter(resized)
        return embeddings


@auto_docstring(
    custom_intro="BERT with the two pre-training heads: masked LM and next sentence prediction (paper section 3.1)."
)
class BertReproForPreTraining(_MLMHeadMixin, BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config)
        self.cls = BertReproPreTrainingHeads(config)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
        cls_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> BertReproForPreTrainingOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The original token ids at the masked positions, -100 elsewhere.
        next_sentence_label (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            0 = IsNext (segment B follows A), 1 = NotNext (B from another document), -100 ignored.
        masked_positions (`torch.LongTensor` of shape `(batch_size, max_predictions_per_seq)`, *optional*):
            With sparse prediction: the flat index of each labelled position, then unlabelled ones.
        cls_positions (`torch.LongTensor` of shape `(examples,)`, *optional*):
            In a packed batch, the flat index of each example's [CLS] (see [`BertReproModel`]).
        """
        outputs = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            cls_positions=cls_positions,
            read_positions=read_positions(
                self.config, True, True, input_ids, inputs_embeds, position_ids, attention_mask, labels
            ),
            return_dict=True,
            **kwargs,
        )
        prediction_logits, labels = self._mlm_logits(outputs.last_hidden_state, labels, masked_positions)
        seq_relationship_logits = self.cls.seq_relationship(outputs.pooler_output)
        mlm_loss = _cross_entropy(prediction_logits, labels) if labels is not None else None
        nsp_loss = (
            _cross_entropy(seq_relationship_logits, next_sentence_label) if next_sentence_label is not None else None
        )
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        return BertReproForPreTrainingOutput(
            loss=sum(losses) if losses else None,
            masked_lm_loss=mlm_loss,
            next_sentence_loss=nsp_loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


@auto_docstring(
    custom_intro="BERT with the masked-LM head only (no pooler), e.g. for fill-mask or MLM-only pre-training."
)
class BertReproForMaskedLM(_MLMHeadMixin, BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config, add_pooling_layer=False)
        self.cls = BertReproOnlyMLMHead(config)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> MaskedLMOutput:
        r"""
        masked_positions (`torch.LongTensor` of shape `(batch_size, max_predictions_per_seq)`, *optional*):
            With sparse prediction: the flat index of each labelled position, then unlabelled ones.
        """
        outputs = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            read_positions=read_positions(
                self.config, False, True, input_ids, inputs_embeds, position_ids, attention_mask, labels
            ),
            return_dict=True,
            **kwargs,
        )
        logits, labels = self._mlm_logits(outputs.last_hidden_state, labels, masked_positions)
        return MaskedLMOutput(
            loss=_cross_entropy(logits, labels) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


@auto_docstring(custom_intro="BERT with the NSP head only: does segment B follow segment A? (index 0 = IsNext).")
class BertReproForNextSentencePrediction(BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config)
        self.cls = BertReproOnlyNSPHead(config)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> NextSentencePredictorOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            0 = IsNext (segment B follows A), 1 = NotNext (B from another document), -100 ignored.
        """
        outputs = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            read_positions=read_positions(
                self.config, True, False, input_ids, inputs_embeds, position_ids, attention_mask
            ),
            return_dict=True,
            **kwargs,
        )
        logits = self.cls.seq_relationship(outputs.pooler_output)
        loss = _cross_entropy(logits, labels) if labels is not None else None
        return NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


def _classifier_dropout(config: BertReproConfig) -> nn.Module:
    p = config.classifier_dropout
    return model_parts(config).dropout(p if p is not None else config.hidden_dropout_prob)


@auto_docstring(
    custom_intro="A linear layer on the pooled [CLS] output: classification (GLUE), or regression (STS-B, one label)."
)
class BertReproForSequenceClassification(BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertReproModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        outputs = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            read_positions=read_positions(
                self.config, True, False, input_ids, inputs_embeds, position_ids, attention_mask
            ),
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        return SequenceClassifierOutput(
            loss=self._loss(logits, labels) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        problem_type = self.config.problem_type
        if problem_type is None:  # the transformers convention
            if self.num_labels == 1:
                problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                problem_type = "single_label_classification"
            else:
                problem_type = "multi_label_classification"
        if problem_type == "regression":
            return F.mse_loss(logits.float(), labels.reshape(logits.shape).float())
        if problem_type == "single_label_classification":
            return _cross_entropy(logits, labels)
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def span_loss(start_logits, end_logits, start_positions, end_positions) -> torch.Tensor | None:
    """Mean of the start and end cross-entropies; positions outside the window (clamped to seq) are ignored."""
    if start_positions is None or end_positions is None:
        return None
    seq = start_logits.shape[1]
    start, end = start_positions.reshape(-1).clamp(0, seq), end_positions.reshape(-1).clamp(0, seq)
    return (
        F.cross_entropy(start_logits.float(), start, ignore_index=seq)
        + F.cross_entropy(end_logits.float(), end, ignore_index=seq)
    ) / 2


@auto_docstring(
    custom_intro="SQuAD span prediction: start logit S.T_i and end logit E.T_j per token (`qa_outputs` holds S and E)."
)
class BertReproForQuestionAnswering(BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        r"""
        start_positions (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Token index of the answer's first token ([CLS] = 0 for no answer); outside the window: ignored.
        end_positions (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Token index of the answer's last token ([CLS] = 0 for no answer); outside the window: ignored.
        """
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
        return QuestionAnsweringModelOutput(
            loss=span_loss(start_logits, end_logits, start_positions, end_positions),
            start_logits=start_logits.contiguous(),
            end_logits=end_logits.contiguous(),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


@auto_docstring(custom_intro="SWAG: a vector dotted with each choice's pooled [CLS] output; softmax over the choices.")
class BertReproForMultipleChoice(BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> MultipleChoiceModelOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            The index of the right choice; the inputs are (batch_size, num_choices, sequence_length).
        """
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds = (
            None if x is None else x.reshape(-1, *x.shape[2:])
            for x in (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        )
        outputs = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            read_positions=read_positions(
                self.config, True, False, input_ids, inputs_embeds, position_ids, attention_mask
            ),
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output)).reshape(-1, num_choices)
        loss = _cross_entropy(logits, labels) if labels is not None else None
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


@auto_docstring(
    custom_intro="NER: a linear layer on every token; the paper labels each word's first sub-token (others: -100)."
)
class BertReproForTokenClassification(BertReproPreTrainedModel):
    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertReproModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = _cross_entropy(logits, labels) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


# So that saving a config copies its file.
BertReproConfig.register_for_auto_class()

__all__ = [
    "PAPER_PARTS",
    "BertReproParts",
    "BertReproModel",
    "BertReproPreTrainedModel",
    "BertReproForPreTraining",
    "BertReproForPreTrainingOutput",
    "BertReproForMaskedLM",
    "BertReproForNextSentencePrediction",
    "BertReproForSequenceClassification",
    "BertReproForQuestionAnswering",
    "BertReproForMultipleChoice",
    "BertReproForTokenClassification",
    "concat_last_layers",
    "last_tokens",
]
