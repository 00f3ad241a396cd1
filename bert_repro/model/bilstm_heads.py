"""A BiLSTM between BERT and the task's output layer: the paper's feature-based approach (section 5.3, Table 7)
and its "+ BiLSTM" fine-tuning head (section 5.1, Table 5).

Feature-based (``freeze_encoder=True``): the frozen encoder's ``feature_set`` (Table 7's rows) feeds "a randomly
initialized two-layer 768-dimensional BiLSTM before the classification layer" (section 5.3). "+ BiLSTM" fine-tuning
(the default): everything is fine-tuned and the BiLSTM reads the last layer.

Where the paper is silent: "768-dimensional" is units per direction (``bilstm_hidden_size``); "Weighted Sum" is
ELMo's scalar mix, and "All 12 Layers" the Transformer layers 1..L, not the embeddings. The BiLSTM reads each
right-padded sequence up to its length; dropout only before the output layer.

transformers has no BiLSTM head, so checkpoints open with bert_repro imported or `trust_remote_code=True`; hence this
file imports only torch, transformers, huggingface_hub and its siblings.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import PreTrainedConfig
from transformers import initialization as init
from transformers.modeling_outputs import QuestionAnsweringModelOutput, SequenceClassifierOutput, TokenClassifierOutput
from transformers.utils import can_return_tuple

from .configuration_bert_repro import BertReproConfig
from .modeling_bert_repro import (
    BertReproForSequenceClassification,
    BertReproModel,
    BertReproPreTrainedModel,
    _classifier_dropout,
    _cross_entropy,
    span_loss,
)

# --- Token features (paper Table 7) ------------------------------------------------------------------------------


class FeatureSetError(ValueError):
    """A feature set that does not exist, or that names a layer the model does not have."""


@dataclass(frozen=True)
class FeatureSet:
    """Which hidden states feed the BiLSTM, and how they are combined.

    layers: indices into the L + 1 hidden states (0 = the embeddings, -1 = the last layer); None = layers 1..L.
    weighted: their learned weighted sum (ELMo's scalar mix) instead of their concatenation.
    """

    name: str
    layers: tuple[int, ...] | None
    weighted: bool = False
    table7_row: str = ""

    def indices(self, num_hidden_layers: int) -> tuple[int, ...]:
        """The hidden states read, as positions 0..L; raises `FeatureSetError` for a layer the model lacks."""
        if self.layers is None:
            return tuple(range(1, num_hidden_layers + 1))
        states = num_hidden_layers + 1
        for index in self.layers:
            if not -states <= index < states:
                raise FeatureSetError(
                    f"feature layer index {index} of feature set {self.name!r} is out of range: the model has "
                    f"{num_hidden_layers} layers, so a layer index is 0..{num_hidden_layers} (0 = the embeddings, "
                    f"{num_hidden_layers} = the last layer) or -{states}..-1 from the end."
                )
        return tuple(index % states for index in self.layers)


_LAST_FOUR = (-4, -3, -2, -1)
# Table 7's feature sets, in the paper's order; `parse_feature_set` also takes an explicit list of layers.
FEATURE_SETS: dict[str, FeatureSet] = {
    f.name: f
    for f in (
        FeatureSet("embeddings", (0,), table7_row="Embeddings"),
        FeatureSet("second_to_last_hidden", (-2,), table7_row="Second-to-Last Hidden"),
        FeatureSet("last_hidden", (-1,), table7_row="Last Hidden"),
        FeatureSet("weighted_sum_last_four", _LAST_FOUR, weighted=True, table7_row="Weighted Sum Last Four Hidden"),
        FeatureSet("concat_last_four", _LAST_FOUR, table7_row="Concat Last Four Hidden"),
        FeatureSet("weighted_sum_all", None, weighted=True, table7_row="Weighted Sum All 12 Layers"),
    )
}
EXPLICIT_FORMS = {"layers": False, "weighted_layers": True}
FEATURE_SET_HELP = (
    ", ".join(FEATURE_SETS) + "; or layers=I[,J...] (those hidden states concatenated: 0 = the "
    "embeddings, -1 = the last layer) or weighted_layers=I[,J...] (their learned weighted sum)"
)


def parse_feature_set(spec: str | FeatureSet) -> FeatureSet:
    """A feature set named in `FEATURE_SETS`, or an explicit form: "layers=-4,-3,-2,-1", "weighted_layers=1,2"."""
    if isinstance(spec, FeatureSet):
        return spec
    spec = str(spec).strip()
    if spec in FEATURE_SETS:
        return FEATURE_SETS[spec]
    form, _, values = spec.partition("=")
    if form.strip() in EXPLICIT_FORMS:
        try:
            layers = tuple(int(v) for v in values.split(","))
        except ValueError:
            layers = ()
        if layers:
            name = f"{form.strip()}={','.join(map(str, layers))}"
            return FeatureSet(name, layers, weighted=EXPLICIT_FORMS[form.strip()])
        raise FeatureSetError(
            f"feature set {spec!r}: after {form.strip()}= give layer indices as integers "
            "separated by commas, e.g. layers=-2 or layers=-4,-3,-2,-1."
        )
    raise FeatureSetError(f"unknown feature set {spec!r}; choose one of: {FEATURE_SET_HELP}.")


class ScalarMix(nn.Module):
    """ELMo's weighted sum of layers: gamma * sum_j softmax(weights)_j h_j (weights start equal, gamma at 1)."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: list[torch.Tensor]) -> torch.Tensor:
        mix = torch.softmax(self.weights, dim=0).to(layers[0].dtype)
        return self.gamma.to(layers[0].dtype) * torch.einsum("l,l...->...", mix, torch.stack(layers))


class TokenFeatures(nn.Module):
    """The feature set's token features from the encoder's L + 1 hidden states."""

    def __init__(self, feature_set: FeatureSet, num_hidden_layers: int, hidden_size: int):
        super().__init__()
        self.feature_set = feature_set
        self.indices = feature_set.indices(num_hidden_layers)
        self.needs_hidden_states = feature_set.weighted or self.indices != (num_hidden_layers,)
        self.mix = ScalarMix(len(self.indices)) if feature_set.weighted else None
        self.width = hidden_size * (1 if feature_set.weighted else len(self.indices))

    def forward(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        layers = [hidden_states[i] for i in self.indices]
        if self.mix is not None:
            return self.mix(layers)
        return layers[0] if len(layers) == 1 else torch.cat(layers, dim=-1)


# --- The BiLSTM ------------------------------------------------------------------------------------------------


class BiLSTM(nn.Module):
    """A bidirectional LSTM over each sequence's real tokens (packed by the attention mask's lengths)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers, batch_first=True, bidirectional=True)

    def forward(self, features: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, seq, in) -> outputs (batch, seq, 2 x hidden), zero at padding, and the final states
        (batch, 2 x hidden): forward at each sequence's last real token, backward at its first."""
        seq = features.shape[1]
        if attention_mask is None:
            outputs, (final, _) = self.lstm(features)
        else:
            mask = attention_mask.bool()
            lengths = mask.sum(dim=1)
            if not torch.equal(mask, torch.arange(seq, device=mask.device)[None] < lengths[:, None]):
                raise ValueError(
                    "The BiLSTM head needs right-padded batches (attention_mask 1...1 0...0 in every "
                    "row); pad on the right (tokenizer.padding_side = 'right')."
                )
            packed = nn.utils.rnn.pack_padded_sequence(
                features, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
            )
            packed_outputs, (final, _) = self.lstm(packed)
            outputs, _ = nn.utils.rnn.pad_packed_sequence(packed_outputs, batch_first=True, total_length=seq)
        return outputs, torch.cat([final[-2], final[-1]], dim=-1)


# --- Config ----------------------------------------------------------------------------------------------------


@strict(accept_kwargs=True)
class BertReproBiLSTMConfig(BertReproConfig):
    r"""A BERT encoder's config (every field of `BertReproConfig`) and the BiLSTM head's.

    Args:
        feature_set (`str`, "last_hidden"): the token features the BiLSTM reads: a name in `FEATURE_SETS` (Table 7)
            or "layers=I[,J...]" / "weighted_layers=I[,J...]" (`parse_feature_set`).
        freeze_encoder (`bool`, False): the feature-based approach: no gradient, no update and no dropout for the
            encoder. False: "+ BiLSTM" fine-tuning of every parameter.
        bilstm_hidden_size (`int`, *optional*): units per direction; `hidden_size` when unset (the paper's "768").
        bilstm_num_layers (`int`, 2): the paper's "two-layer".
    """

    model_type = "bert_repro_bilstm"

    feature_set: str = "last_hidden"
    freeze_encoder: bool = False
    bilstm_hidden_size: int | None = None
    bilstm_num_layers: int = 2

    def validate_architecture(self):
        super().validate_architecture()
        for name in ("bilstm_hidden_size", "bilstm_num_layers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        self.features.indices(self.num_hidden_layers)  # raises FeatureSetError naming the model's layer count

    @property
    def features(self) -> FeatureSet:
        return parse_feature_set(self.feature_set)

    @property
    def lstm_size(self) -> int:
        """Units per direction of the BiLSTM."""
        return self.bilstm_hidden_size or self.hidden_size

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        # A pre-trained BERT (model_type "bert" or "bert_repro") starts a BiLSTM model: read its config as ours.
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") in ("bert", BertReproConfig.model_type):
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs

    def to_json_file(self, json_file_path, use_diff: bool = True):
        # transformers' own writer: its BERT has no BiLSTM head, so there is no transformers-format config to write.
        PreTrainedConfig.to_json_file(self, json_file_path, use_diff)


# --- The models ------------------------------------------------------------------------------------------------

BILSTM_AUTO_MAP = {
    "AutoConfig": "bilstm_heads.BertReproBiLSTMConfig",
    "AutoModelForSequenceClassification": "bilstm_heads.BertReproForSequenceClassificationWithBiLSTM",
    "AutoModelForQuestionAnswering": "bilstm_heads.BertReproForQuestionAnsweringWithBiLSTM",
    "AutoModelForTokenClassification": "bilstm_heads.BertReproForTokenClassificationWithBiLSTM",
}


class BertReproBiLSTMPreTrainedModel(BertReproPreTrainedModel):
    config_class = BertReproBiLSTMConfig
    config: BertReproBiLSTMConfig

    def _build_encoder_and_bilstm(self, config: BertReproBiLSTMConfig) -> None:
        self.bert = BertReproModel(config, add_pooling_layer=False)
        self.token_features = TokenFeatures(config.features, config.num_hidden_layers, config.hidden_size)
        self.bilstm = BiLSTM(self.token_features.width, config.lstm_size, config.bilstm_num_layers)
        self.dropout = _classifier_dropout(config)
        self._freeze_encoder()

    def _freeze_encoder(self) -> None:  # no gradient, so that no optimizer updates (or decays) them
        self.bert.requires_grad_(not self.config.freeze_encoder)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        # Loading replaces the parameters (and their requires_grad): freeze again what the config freezes.
        loaded = super().from_pretrained(*args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded)._freeze_encoder()
        return loaded

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.LSTM):  # PyTorch's own LSTM initialisation, through transformers' init functions
            bound = module.hidden_size**-0.5
            for parameter in module.parameters():
                init.uniform_(parameter, -bound, bound)
        elif isinstance(module, ScalarMix):
            init.zeros_(module.weights)
            init.ones_(module.gamma)
        else:
            super()._init_weights(module)

    def train(self, mode: bool = True):
        """A frozen encoder stays in eval mode (no dropout)."""
        super().train(mode)
        if self.config.freeze_encoder:
            self.bert.train(False)
        return self

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Weights, config, this file's code and an `auto_map` for every Auto class of the BiLSTM heads."""
        self.config.auto_map = dict(BILSTM_AUTO_MAP)
        return super(BertReproPreTrainedModel, self).save_pretrained(save_directory, *args, **kwargs)

    def _bilstm(
        self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_hidden_states, kwargs
    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The BiLSTM's outputs at every token, its final states, and the encoder outputs the task output carries."""
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        needs_states = self.token_features.needs_hidden_states
        with torch.no_grad() if self.config.freeze_encoder else contextlib.nullcontext():
            outputs = self.bert(
                input_ids,
                attention_mask,
                token_type_ids,
                position_ids,
                inputs_embeds,
                output_hidden_states=bool(output_hidden_states) or needs_states,
                return_dict=True,
                **kwargs,
            )
        features = self.token_features(outputs.hidden_states) if needs_states else outputs.last_hidden_state
        if attention_mask is None and input_ids is not None:
            attention_mask = torch.ones_like(input_ids)
        tokens, final = self.bilstm(features, attention_mask)
        carried = {
            "hidden_states": outputs.hidden_states if output_hidden_states else None,
            "attentions": outputs.attentions,
        }
        return tokens, final, carried


class BertReproForTokenClassificationWithBiLSTM(BertReproBiLSTMPreTrainedModel):
    """NER with a BiLSTM before the output layer: feature-based (Table 7) or fine-tuned."""

    def __init__(self, config: BertReproBiLSTMConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._build_encoder_and_bilstm(config)
        self.classifier = nn.Linear(2 * config.lstm_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_hidden_states=None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        tokens, _, carried = self._bilstm(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_hidden_states, kwargs
        )
        logits = self.classifier(self.dropout(tokens))
        loss = _cross_entropy(logits, labels) if labels is not None else None
        return TokenClassifierOutput(loss=loss, logits=logits, **carried)


class BertReproForQuestionAnsweringWithBiLSTM(BertReproBiLSTMPreTrainedModel):
    """SQuAD span prediction with a BiLSTM before S and E (paper Table 5, "+ BiLSTM")."""

    def __init__(self, config: BertReproBiLSTMConfig):
        super().__init__(config)
        self._build_encoder_and_bilstm(config)
        self.qa_outputs = nn.Linear(2 * config.lstm_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_hidden_states=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        tokens, _, carried = self._bilstm(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_hidden_states, kwargs
        )
        start_logits, end_logits = self.qa_outputs(tokens).unbind(dim=-1)
        loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits.contiguous(), end_logits=end_logits.contiguous(), **carried
        )


class BertReproForSequenceClassificationWithBiLSTM(BertReproBiLSTMPreTrainedModel):
    """Classification (or, with num_labels == 1, regression) from the BiLSTM's final states over the tokens."""

    def __init__(self, config: BertReproBiLSTMConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._build_encoder_and_bilstm(config)
        self.classifier = nn.Linear(2 * config.lstm_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_hidden_states=None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        _, final, carried = self._bilstm(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_hidden_states, kwargs
        )
        logits = self.classifier(self.dropout(final))
        loss = BertReproForSequenceClassification._loss(self, logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits, **carried)


# So that `save_pretrained` copies this file next to the weights.
BertReproBiLSTMConfig.register_for_auto_class()
for _auto_class, _path in BILSTM_AUTO_MAP.items():
    if _auto_class != "AutoConfig":
        globals()[_path.split(".")[1]].register_for_auto_class(_auto_class)

__all__ = [
    "BILSTM_AUTO_MAP",
    "FEATURE_SETS",
    "BertReproBiLSTMConfig",
    "BertReproBiLSTMPreTrainedModel",
    "BertReproForQuestionAnsweringWithBiLSTM",
    "BertReproForSequenceClassificationWithBiLSTM",
    "BertReproForTokenClassificationWithBiLSTM",
    "BiLSTM",
    "FeatureSet",
    "FeatureSetError",
    "ScalarMix",
    "TokenFeatures",
    "parse_feature_set",
]
