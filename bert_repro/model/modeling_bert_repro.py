"""The BERT model family (Devlin et al., 2018), written from the paper.

Paper section -> code:
- 3 / Figure 2, input representation: `BertReproEmbeddings`.
- 3, model architecture (Vaswani et al.'s post-LN encoder): `BertReproLayer`, `BertReproEncoder`; the attention
  kernel ("eager", "sdpa", "flash_attention_2") is chosen with `attn_implementation=...`.
- 3.1, pre-training tasks: masked LM (`BertReproMLMHead`) and NSP (a linear layer on the pooled [CLS] output).
- 4 / Figure 4, fine-tuning heads: GLUE and STS-B, SQuAD, SWAG, NER (the `BertReproFor*` classes).
- 5.3, feature-based use: `output_hidden_states=True`; `concat_last_layers` (the paper's best feature set).
- 5.1 / Table 5, pre-training objectives (`config.objective`): "mlm_nsp" (BERT), "mlm" (No NSP) and "ltr", the
  left-to-right control: causal attention in pre-training and fine-tuning, the pooler on the last real token, the
  MLM head predicting the next token.

Parameter names are the public checkpoints' (`bert.encoder.layer.0.attention.self.query.weight`, ...), so every
public checkpoint loads with `from_pretrained` and no renaming. Modules are built from `BertReproParts` passed down
the constructors (`PAPER_PARTS` here); the speed switches' subclasses live in `speed_paths.py`. This file is the code
`save_pretrained` copies for `trust_remote_code=True`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
from transformers.utils import ModelOutput, logging

from .configuration_bert_repro import EXACT_GELU, TANH_GELU, BertReproConfig
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
    """The module classes a model builds: the paper's (`PAPER_PARTS`) or the speed switches' (`speed_paths.py`)."""

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
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings)[None], persistent=False)

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
        context, probs = self.self(hidden_states, attention_mask, **kwargs)
        return self.output(context, hidden_states), probs


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
        attention_output, probs = self.attention(hidden_states, attention_mask, **kwargs)
        return self.output(self.intermediate(attention_output), attention_output), probs


def attention_inputs(
    config, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, packed: PackedSequences | None = None
) -> tuple[torch.Tensor | None, dict]:
    """The kernel's mask and arguments, from the (batch, seq) padding mask or the packing. A causal mask is always
    built (not left to SDPA's is_causal): the speed paths' eager kernels read only the mask."""
    if packed is not None:
        return packed.attention_inputs(config)
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
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        packed: PackedSequences | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        """attention_mask is the (batch, seq) padding mask: the kernel's mask is built here, so that the unpadding
        encoder can read the padding. kwargs go to every layer and on to the attention kernel."""
        mask, kernel_kwargs = attention_inputs(self.config, hidden_states, attention_mask, packed)
        kwargs.update(kernel_kwargs)
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layer:
            hidden_states, probs = layer(hidden_states, mask, **kwargs)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (probs,)
        return BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions
        )


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
    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.predictions = parts.mlm_head(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertReproOnlyMLMHead(nn.Module):
    def __init__(self, config: BertReproConfig, parts: BertReproParts):
        super().__init__()
        self.predictions = parts.mlm_head(config)


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


class BertReproPreTrainedModel(PreTrainedModel):
    config_class = BertReproConfig
    config: BertReproConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["BertReproEmbeddings", "BertReproLayer"]
    # Trainer must divide by the accumulation steps: every loss here is the mean over its own labelled items (label
    # -100 ignored), as the reference code's per TPU core.
    accepts_loss_kwargs = False
    # Some public checkpoints store the MLM output bias again under the decoder; ours is `cls.predictions.bias`.
    _keys_to_ignore_on_load_unexpected = [r"cls\.predictions\.decoder\.bias"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if self.config.initializer_distribution == "truncated_normal":
                init.trunc_normal_(module.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, BertReproMLMHead):
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


def _as_tuple_if_asked(output: ModelOutput, return_dict: bool | None, config) -> ModelOutput | tuple:
    if return_dict is None:
        return_dict = config.return_dict
    return output if return_dict else output.to_tuple()


class BertReproModel(BertReproPreTrainedModel):
    """The bare BERT encoder: embeddings, L Transformer blocks, and (optionally) the pooler."""

    def __init__(self, config: BertReproConfig, add_pooling_layer: bool = True, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.embeddings = parts.embeddings(config, parts)
        self.encoder = parts.encoder(config, parts)
        self.pooler = BertReproPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        output_hidden_states=None,
        output_attentions=None,
        return_dict=None,
        cls_positions=None,
        **kwargs,
    ) -> BaseModelOutputWithPooling | tuple:
        """input_ids: (batch, seq) `[CLS] A [SEP] B [SEP]`, padded; token_type_ids 0 for `[CLS] A [SEP]`, 1 for
        `B [SEP]`. position_ids restart at each [CLS] in a packed batch; cls_positions ((examples,), from a packing
        collator) lets the pooler gather a fixed number of rows, so a compiled step stays one graph."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if "sparse_prediction" in kwargs:  # a config field: as a forward argument it would be ignored
            raise TypeError("sparse_prediction is a config field: set model.config.sparse_prediction instead.")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_attentions and self.config._attn_implementation != "eager":
            raise ValueError(
                f"output_attentions needs the eager attention kernel, but the model uses "
                f"{self.config._attn_implementation!r}: load it with attn_implementation='eager'."
            )
        embedding_output = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        # A packed batch? Each example then attends to itself; each [CLS] is pooled.
        packed = PackedSequences.from_inputs(position_ids, attention_mask, cls_positions)
        if packed is not None and self.config.pretraining_objective.causal:
            raise ValueError(
                f"Packed batches are not supported with objective={self.config.objective!r} (they "
                "attend in both directions inside each example): pass one example per row."
            )
        encoder_outputs = self.encoder(
            embedding_output,
            attention_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            packed=packed,
            position_ids=position_ids,
            **kwargs,
        )
        sequence_output = encoder_outputs.last_hidden_state
        pooled = sequence_output if packed is None else packed.first_tokens_of(sequence_output)
        if self.config.pretraining_objective.causal:
            pooled = last_tokens(sequence_output, attention_mask)
        output = BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=self.pooler(pooled) if self.pooler is not None else None,
            hidden_states=encoder_outputs.hidden_states,
            attentions=encoder_outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


def concat_last_layers(hidden_states: tuple[torch.Tensor, ...], n: int = 4) -> torch.Tensor:
    """The paper's best feature-based representation (Table 7): the last `n` layers concatenated, (batch, seq, n*H)."""
    if n > len(hidden_states) - 1:
        raise ValueError(f"Asked for the last {n} layers, but the model has {len(hidden_states) - 1}.")
    return torch.cat(hidden_states[-n:], dim=-1)


@dataclass
class BertReproForPreTrainingOutput(ModelOutput):
    """loss: masked_lm_loss + next_sentence_loss (each present when its labels were given; training logs both).
    prediction_logits: (batch, seq, vocab), or (masked positions, vocab) with `config.sparse_prediction` and labels.
    seq_relationship_logits: (batch, 2), index 0 IsNext."""

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


class BertReproForPreTraining(_MLMHeadMixin, BertReproPreTrainedModel):
    """BERT with the two pre-training heads: masked LM and next sentence prediction (paper section 3.1)."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.bert = BertReproModel(config, parts=parts)
        self.cls = BertReproPreTrainingHeads(config, parts)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        next_sentence_label=None,
        masked_positions=None,
        cls_positions=None,
        return_dict=None,
        **kwargs,
    ) -> BertReproForPreTrainingOutput | tuple:
        """labels: (batch, seq) original token ids at masked positions, -100 elsewhere.
        next_sentence_label: (batch,) 0 = IsNext (B follows A), 1 = NotNext (B from another document), -100 ignored.
        masked_positions: (sparse prediction) flat indices of each labelled position, then unlabelled ones.
        cls_positions: (packed batches) flat index of each example's [CLS] (`BertReproModel.forward`)."""
        outputs = self.bert(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            return_dict=True,
            cls_positions=cls_positions,
            **kwargs,
        )
        prediction_logits, labels = self._mlm_logits(outputs.last_hidden_state, labels, masked_positions)
        seq_relationship_logits = self.cls.seq_relationship(outputs.pooler_output)

        mlm_loss = _cross_entropy(prediction_logits, labels) if labels is not None else None
        nsp_loss = (
            _cross_entropy(seq_relationship_logits, next_sentence_label) if next_sentence_label is not None else None
        )
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        output = BertReproForPreTrainingOutput(
            loss=sum(losses) if losses else None,
            masked_lm_loss=mlm_loss,
            next_sentence_loss=nsp_loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForMaskedLM(_MLMHeadMixin, BertReproPreTrainedModel):
    """BERT with the masked-LM head only (no pooler), e.g. for fill-mask or MLM-only pre-training."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.bert = BertReproModel(config, add_pooling_layer=False, parts=parts)
        self.cls = BertReproOnlyMLMHead(config, parts)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        masked_positions=None,
        return_dict=None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits, labels = self._mlm_logits(outputs.last_hidden_state, labels, masked_positions)
        output = MaskedLMOutput(
            loss=_cross_entropy(logits, labels) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForNextSentencePrediction(BertReproPreTrainedModel):
    """BERT with the NSP head only: does segment B follow segment A? (index 0 = IsNext)."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.bert = BertReproModel(config, parts=parts)
        self.cls = BertReproOnlyNSPHead(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        **kwargs,
    ) -> NextSentencePredictorOutput | tuple:
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.cls.seq_relationship(outputs.pooler_output)
        loss = _cross_entropy(logits, labels) if labels is not None else None
        output = NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


def _classifier_dropout(config: BertReproConfig, parts: BertReproParts) -> nn.Module:
    p = config.classifier_dropout
    return parts.dropout(p if p is not None else config.hidden_dropout_prob)


class BertReproForSequenceClassification(BertReproPreTrainedModel):
    """A linear layer on the pooled [CLS] output: classification (GLUE) or, with num_labels == 1, regression (STS-B)."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertReproModel(config, parts=parts)
        self.dropout = _classifier_dropout(config, parts)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        output = SequenceClassifierOutput(
            loss=self._loss(logits, labels) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)

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


class BertReproForQuestionAnswering(BertReproPreTrainedModel):
    """SQuAD span prediction: start logit S.T_i and end logit E.T_j for every token (`qa_outputs` holds S and E)."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.bert = BertReproModel(config, add_pooling_layer=False, parts=parts)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        return_dict=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        """start_positions / end_positions: (batch,) token indices of the answer span ([CLS] = 0 for no answer)."""
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
        loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        output = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits.contiguous(),
            end_logits=end_logits.contiguous(),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForMultipleChoice(BertReproPreTrainedModel):
    """SWAG: a vector dotted with each choice's pooled [CLS] output; softmax over the choices."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.bert = BertReproModel(config, parts=parts)
        self.dropout = _classifier_dropout(config, parts)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        **kwargs,
    ) -> MultipleChoiceModelOutput | tuple:
        """Inputs are (batch, num_choices, seq); labels (batch,) the index of the right choice."""
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(x):
            return None if x is None else x.reshape(-1, *x.shape[2:])

        outputs = self.bert(
            flat(input_ids),
            flat(attention_mask),
            flat(token_type_ids),
            flat(position_ids),
            flat(inputs_embeds),
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output)).reshape(-1, num_choices)
        loss = _cross_entropy(logits, labels) if labels is not None else None
        output = MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForTokenClassification(BertReproPreTrainedModel):
    """NER: a linear layer on every token; the paper labels the first sub-token of each word (others get -100)."""

    def __init__(self, config: BertReproConfig, parts: BertReproParts = PAPER_PARTS):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertReproModel(config, add_pooling_layer=False, parts=parts)
        self.dropout = _classifier_dropout(config, parts)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = _cross_entropy(logits, labels) if labels is not None else None
        output = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


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
