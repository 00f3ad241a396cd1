"""bert_repro: BERT (Devlin et al., 2018) rebuilt from scratch as a member of the Hugging Face ecosystem.

Checkpoints are saved in transformers' own BERT format, so plain transformers opens them as its BERT classes;
`BertReproForX.from_pretrained(dir)` or `trust_remote_code=True` opens them as ours, with the speed switches.
Importing the package registers model types "bert_repro" (checkpoints only our code can compute) and
"bert_repro_bilstm" (`bert_repro.model.bilstm_heads`) with the Auto classes the paper's tasks need.
"""

import transformers

# speed_paths registers the speed switches' modules with the model file (modeling_bert_repro.SPEED_PATHS).
from .model import modeling_bert_repro, speed_paths
from .model.bilstm_heads import (
    BILSTM_AUTO_MAP,
    FEATURE_SETS,
    BertReproBiLSTMConfig,
    BertReproForQuestionAnsweringWithBiLSTM,
    BertReproForSequenceClassificationWithBiLSTM,
    BertReproForTokenClassificationWithBiLSTM,
    FeatureSet,
    parse_feature_set,
)
from .model.configuration_bert_repro import PRESETS, BertReproConfig

# The model classes: the paper's (model/modeling_bert_repro.py), each built with the modules its config's speed
# switches pick.
from .model.modeling_bert_repro import (
    AUTO_MAP,
    PAPER_PARTS,
    BertReproForMaskedLM,
    BertReproForMultipleChoice,
    BertReproForNextSentencePrediction,
    BertReproForPreTraining,
    BertReproForPreTrainingOutput,
    BertReproForQuestionAnswering,
    BertReproForSequenceClassification,
    BertReproForTokenClassification,
    BertReproModel,
    BertReproParts,
    BertReproPreTrainedModel,
    concat_last_layers,
    last_tokens,
)

__version__ = "0.1.0"

for _config, _auto_map in ((BertReproConfig, AUTO_MAP), (BertReproBiLSTMConfig, BILSTM_AUTO_MAP)):
    transformers.AutoConfig.register(_config.model_type, _config, exist_ok=True)
    for _auto_name, _path in _auto_map.items():
        if _auto_name != "AutoConfig":
            getattr(transformers, _auto_name).register(_config, globals()[_path.split(".")[1]], exist_ok=True)

__all__ = [
    "PRESETS",
    "BertReproConfig",
    *modeling_bert_repro.__all__,
    "BertReproBiLSTMConfig",
    "BertReproForQuestionAnsweringWithBiLSTM",
    "BertReproForSequenceClassificationWithBiLSTM",
    "BertReproForTokenClassificationWithBiLSTM",
    "FEATURE_SETS",
    "FeatureSet",
    "parse_feature_set",
]
