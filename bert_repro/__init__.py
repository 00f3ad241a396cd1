"""bert_repro: BERT (Devlin et al., 2018) rebuilt from scratch as a member of the Hugging Face ecosystem.

Importing the package registers model type "bert_repro" with AutoConfig and every AutoModel* class the
paper's tasks need, so `AutoModelForPreTraining.from_pretrained(<saved dir>)` returns our classes.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_bert_repro import PRESETS, BertReproConfig
from .modeling_bert_repro import (
    BertReproForMaskedLM,
    BertReproForMultipleChoice,
    BertReproForNextSentencePrediction,
    BertReproForPreTraining,
    BertReproForPreTrainingOutput,
    BertReproForQuestionAnswering,
    BertReproForSequenceClassification,
    BertReproForTokenClassification,
    BertReproModel,
    BertReproPreTrainedModel,
    concat_last_layers,
)

__version__ = "0.1.0"

AUTO_CLASSES = {
    AutoModel: BertReproModel,
    AutoModelForPreTraining: BertReproForPreTraining,
    AutoModelForMaskedLM: BertReproForMaskedLM,
    AutoModelForNextSentencePrediction: BertReproForNextSentencePrediction,
    AutoModelForSequenceClassification: BertReproForSequenceClassification,
    AutoModelForQuestionAnswering: BertReproForQuestionAnswering,
    AutoModelForMultipleChoice: BertReproForMultipleChoice,
    AutoModelForTokenClassification: BertReproForTokenClassification,
}

AutoConfig.register(BertReproConfig.model_type, BertReproConfig, exist_ok=True)
for _auto, _cls in AUTO_CLASSES.items():
    _auto.register(BertReproConfig, _cls, exist_ok=True)

__all__ = [
    "PRESETS",
    "BertReproConfig",
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
]
