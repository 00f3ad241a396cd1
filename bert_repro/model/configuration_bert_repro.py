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
"""BERT configuration (Devlin et al., 2018, section 3 and appendix A; Turc et al., 2019 for the small BERTs).

`BertReproConfig` uses transformers' `BertConfig` field names, so every BERT `config.json` reads as it is, and
`BertReproConfig.from_preset("base")` gives a named size. Where the paper and Google's reference code differ, the
default follows the paper (where it is silent, the reference code) and the other behaviour is an option.

This file is copied next to the weights by `save_pretrained`, so it imports only torch-free standard libraries,
`transformers` and `huggingface_hub`.
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.utils import auto_docstring

# The paper's BASE and LARGE and the reference code's named small BERTs.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "medium": dict(num_hidden_layers=8, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
}

# Activation names accepted in `hidden_act` (transformers' spellings, so converted configs keep theirs).
EXACT_GELU = ("gelu",)
TANH_GELU = ("gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "gelu_fast")
ACTIVATIONS = EXACT_GELU + TANH_GELU + ("relu", "silu", "swish")
INIT_DISTRIBUTIONS = ("truncated_normal", "normal")
# The config fields that change speed only, with their help; the recipes' flags are made from this list.
SPEED_SWITCHES = {
    "unpad_inputs": "Speed: run the encoder on the real tokens only, padding removed (same outputs at real tokens).",
    "last_layer_subset": "Speed: the last Transformer block computes only the positions the heads read "
    "([CLS], masked positions); the same losses and logits.",
    "fast_dropout": "Speed on CPU: dropout masks from 15-bit random numbers (p rounded to a multiple of 1/32768).",
    "tied_gradients": "Speed: the token lookup adds its gradient rows into the tied MLM decoder's gradient "
    "(one vocab-sized buffer instead of three); the same gradients.",
    "fused_dropout_add_norm": "Speed on CUDA: dropout + residual add + LayerNorm of every block in one Triton kernel, "
    "forward and backward (the mask regenerated, not stored; p rounded to a multiple of 1/65536).",
    "fused_qkv": "Speed: the query, key and value projections as one (hidden -> 3 x hidden) matrix product "
    "(the same parameters and checkpoints).",
    "measured_sdpa": "Speed on CUDA: SDPA runs under the backend measured fastest at the shape (cuDNN, "
    "memory-efficient; never one that drops the padding mask or dropout).",
}
# The switches that keep a `torch.compile`d step one graph (no data-dependent shapes or Python-side randomness).
ONE_GRAPH_SWITCHES = ("fused_dropout_add_norm", "fused_qkv", "measured_sdpa")
RESIDUAL_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class PreTrainingObjective:
    """A pre-training objective of the paper's Table 5, and so how the model attends.

    causal: left-only attention, in pre-training and fine-tuning (the paper's "LTR & No NSP" keeps it at fine-tuning).
    next_sentence: `[CLS] A [SEP] B [SEP]` pairs with the NSP task; without it, `[CLS] text [SEP]` and no NSP loss.
    masked_lm: predict the masked tokens (15%, 80/10/10); False: the next token at every position, same head.
    """

    name: str
    table5_row: str
    causal: bool
    next_sentence: bool
    masked_lm: bool

    @property
    def token_task(self) -> str:
        """The prefix of the token-level loss and accuracy in training logs: "mlm" (masked LM) or "lm" (next token)."""
        return "mlm" if self.masked_lm else "lm"


PRETRAINING_OBJECTIVES: dict[str, PreTrainingObjective] = {
    o.name: o
    for o in (
        PreTrainingObjective("mlm_nsp", "BERT-BASE", causal=False, next_sentence=True, masked_lm=True),
        PreTrainingObjective("mlm", "No NSP", causal=False, next_sentence=False, masked_lm=True),
        PreTrainingObjective("ltr", "LTR & No NSP", causal=True, next_sentence=False, masked_lm=False),
    )
}
DEFAULT_OBJECTIVE = "mlm_nsp"
# Speed switches that assume bidirectional attention pooled at [CLS]; a causal model pools its last token.
BIDIRECTIONAL_ONLY_SWITCHES = ("unpad_inputs", "last_layer_subset")


class ObjectiveConflictError(ValueError):
    """A setting that a pre-training objective rules out (e.g. bidirectional fine-tuning of a causal checkpoint)."""


def pretraining_objective(name: str) -> PreTrainingObjective:
    """The objective called `name`; an unknown name raises a ValueError listing the choices."""
    if name not in PRETRAINING_OBJECTIVES:
        raise ValueError(
            f"objective must be one of {', '.join(PRETRAINING_OBJECTIVES)} (the paper's Table 5: "
            + ", ".join(f"{o.name} = {o.table5_row}" for o in PRETRAINING_OBJECTIVES.values())
            + f"), got {name!r}."
        )
    return PRETRAINING_OBJECTIVES[name]


def check_objective_kept(saved: str, asked: str, source) -> None:
    """Refuse to load a checkpoint pre-trained as `saved` as objective `asked` with the other attention direction."""
    was, now = pretraining_objective(saved), pretraining_objective(asked)
    if was.causal != now.causal:
        raise ObjectiveConflictError(
            f"{source} was pre-trained with objective={saved!r} "
            f"({'causal, left-to-right' if was.causal else 'bidirectional'} attention); objective={asked!r} would "
            f"run it with {'causal' if now.causal else 'bidirectional'} attention, "
            f"which its weights never learned. Keep the checkpoint's objective (do not override it)."
        )


def check_objective_switches(config) -> None:
    """The speed switches `config` turns on must keep its objective's attention (`BIDIRECTIONAL_ONLY_SWITCHES`)."""
    objective = pretraining_objective(config.objective)
    refused = [name for name in BIDIRECTIONAL_ONLY_SWITCHES if objective.causal and getattr(config, name, False)]
    if refused:
        raise ObjectiveConflictError(
            f"{', '.join(refused)} cannot be used with objective={objective.name!r}: the speed path assumes "
            "bidirectional attention pooled at [CLS], and would break the causal model's attention or pooling. "
            f"Turn {' and '.join(refused)} off."
        )


@auto_docstring(
    custom_intro="Configuration of a BERT encoder and its heads.", checkpoint="google-bert/bert-base-uncased"
)
@strict
class BertReproConfig(PreTrainedConfig):
    r"""
    vocab_size (`int`, *optional*, defaults to 30522):
        WordPiece vocabulary size (30,522 uncased, 28,996 cased in the paper's models).
    hidden_size (`int`, *optional*, defaults to 768):
        H, the width of every hidden state.
    num_hidden_layers (`int`, *optional*, defaults to 12):
        L, the number of Transformer blocks.
    num_attention_heads (`int`, *optional*, defaults to 12):
        A; `hidden_size` must be divisible by it (head size H/A = 64 in the paper).
    intermediate_size (`int`, *optional*, defaults to 3072):
        Width of the feed-forward layer, 4H in the paper.
    hidden_act (`str`, *optional*, defaults to `"gelu"`):
        Activation of the feed-forward layer and the MLM head transform: "gelu" (exact, as the paper names it) or
        "gelu_new" / "gelu_tanh" (the tanh form Google's reference code computes).
    hidden_dropout_prob (`float`, *optional*, defaults to 0.1):
        Dropout on embeddings, sub-layer outputs and the pooled output of classification heads (unless
        `classifier_dropout` is set).
    attention_probs_dropout_prob (`float`, *optional*, defaults to 0.1):
        Dropout on the attention probabilities.
    max_position_embeddings (`int`, *optional*, defaults to 512):
        Number of learned absolute positions.
    type_vocab_size (`int`, *optional*, defaults to 2):
        Number of segment (token type) embeddings: segment A = 0, segment B = 1.
    initializer_range (`float`, *optional*, defaults to 0.02):
        Standard deviation of the weight initialisation.
    initializer_distribution (`str`, *optional*, defaults to `"truncated_normal"`):
        "truncated_normal" (reference code: cut at two standard deviations) or "normal" (transformers).
    layer_norm_eps (`float`, *optional*, defaults to 1e-12):
        LayerNorm epsilon.
    pad_token_id (`int`, *optional*, defaults to 0):
        Id of `[PAD]`.
    classifier_dropout (`float`, *optional*):
        Dropout before the task heads; `hidden_dropout_prob` when unset.
    position_embedding_type (`str`, *optional*, defaults to `"absolute"`):
        Only learned absolute positions, as in the paper.
    tie_word_embeddings (`bool`, *optional*, defaults to `True`):
        Tie the MLM decoder to the token embeddings, as the paper does (declared here: transformers 5.x's base class
        does not).
    unpad_inputs (`bool`, *optional*, defaults to `False`):
        Speed switch (`SPEED_SWITCHES`, docs/speed.md), as are `fast_dropout`, `last_layer_subset`,
        `tied_gradients`, `fused_dropout_add_norm`, `fused_qkv` and `measured_sdpa`: they keep losses, logits and
        gradients to float rounding.
    fast_dropout (`bool`, *optional*, defaults to `False`):
        Speed switch: dropout masks from 15-bit random numbers on CPU.
    last_layer_subset (`bool`, *optional*, defaults to `False`):
        Speed switch: the last block computes only the positions the heads read.
    tied_gradients (`bool`, *optional*, defaults to `False`):
        Speed switch: one gradient buffer for the token embeddings and the tied MLM decoder.
    fused_dropout_add_norm (`bool`, *optional*, defaults to `False`):
        Speed switch: dropout + residual + LayerNorm in one Triton kernel (CUDA).
    residual_dtype (`str`, *optional*, defaults to `"float32"`):
        "float32" or "bfloat16" (which changes the numerics), with `fused_dropout_add_norm`.
    fused_qkv (`bool`, *optional*, defaults to `False`):
        Speed switch: the query, key and value projections as one matrix product.
    measured_sdpa (`bool`, *optional*, defaults to `False`):
        Speed switch: SDPA under the CUDA backend measured fastest at the shape.
    sparse_prediction (`bool`, *optional*, defaults to `False`):
        With MLM labels, run the decoder only where labels != -100 (MosaicBERT's trick: the same loss, ~20% fewer
        FLOPs at BASE); the logits are then (masked positions, vocab).
    objective (`str`, *optional*, defaults to `"mlm_nsp"`):
        The paper's Table 5 pre-training objective (`PRETRAINING_OBJECTIVES`), kept in config.json so a fine-tune
        attends as the checkpoint was pre-trained.
    """

    model_type = "bert_repro"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    initializer_distribution: str = "truncated_normal"
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    position_embedding_type: str = "absolute"
    tie_word_embeddings: bool = True
    unpad_inputs: bool = False
    fast_dropout: bool = False
    last_layer_subset: bool = False
    tied_gradients: bool = False
    fused_dropout_add_norm: bool = False
    residual_dtype: str = "float32"
    fused_qkv: bool = False
    measured_sdpa: bool = False
    sparse_prediction: bool = False
    objective: str = DEFAULT_OBJECTIVE

    def validate_architecture(self):
        """Checked on construction (through `@strict`): a wrong config fails here, not deep inside a forward."""
        super().validate_architecture()
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1
            ):
                raise ValueError(f"{name} must be a dropout probability in [0, 1), got {value!r}.")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}): each head has hidden_size / num_attention_heads dimensions."
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}.")
        if self.initializer_distribution not in INIT_DISTRIBUTIONS:
            raise ValueError(
                f"initializer_distribution must be one of {INIT_DISTRIBUTIONS}, got {self.initializer_distribution!r}."
            )
        if self.residual_dtype not in RESIDUAL_DTYPES:
            raise ValueError(f"residual_dtype must be one of {RESIDUAL_DTYPES}, got {self.residual_dtype!r}.")
        if self.position_embedding_type != "absolute":
            raise ValueError(
                f"position_embedding_type={self.position_embedding_type!r} is not supported: BERT uses learned "
                "absolute positions ('absolute')."
            )
        check_objective_switches(self)  # also checks the objective's name

    @property
    def pretraining_objective(self) -> PreTrainingObjective:
        """The `PreTrainingObjective` named by `objective`."""
        return pretraining_objective(self.objective)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> BertReproConfig:
        """A config of a named size (`PRESETS`: "tiny" ... "large"); any field can be overridden."""
        key = name.lower().removeprefix("bert-").removeprefix("bert_")
        if key not in PRESETS:
            raise ValueError(f"Unknown BERT preset {name!r}; choose one of: {', '.join(PRESETS)}.")
        return cls(**{**PRESETS[key], **overrides})

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        # Public BERT checkpoints (model_type "bert") use our field names: read them as ours, without a warning.
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == "bert":
            if config_dict.get("is_decoder") or config_dict.get("add_cross_attention"):
                raise ValueError(
                    f"The BERT config at {pretrained_model_name_or_path} is a decoder (is_decoder / "
                    "add_cross_attention); bert_repro implements the paper's bidirectional encoder only."
                )
            config_dict = {**config_dict, "model_type": cls.model_type}
        if kwargs.get("objective") is not None:  # from_pretrained(..., objective=...): keep the attention learned
            check_objective_kept(
                config_dict.get("objective", DEFAULT_OBJECTIVE), kwargs["objective"], pretrained_model_name_or_path
            )
        return config_dict, kwargs

    def to_json_file(self, json_file_path, use_diff: bool = True):
        # config.json says transformers' BERT type where its classes compute this model (checkpoint_format.py).
        import json

        from .checkpoint_format import config_file_dict

        with open(json_file_path, "w", encoding="utf-8") as writer:
            json.dump(config_file_dict(json.loads(self.to_json_string(use_diff))), writer, indent=2, sort_keys=True)
            writer.write("\n")


__all__ = [
    "BertReproConfig",
    "ObjectiveConflictError",
    "PRESETS",
    "PRETRAINING_OBJECTIVES",
    "PreTrainingObjective",
    "ONE_GRAPH_SWITCHES",
    "SPEED_SWITCHES",
    "pretraining_objective",
]
