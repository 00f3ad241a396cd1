"""A saved directory opens through every Auto class with trust_remote_code=True in a process where bert_repro
cannot be imported, as our classes, and gives the same outputs as the in-process model (without
trust_remote_code it opens as transformers' own BERT: tests/model/test_native_loading.py)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from support.models import padded_batch, tiny_config

import bert_repro
from bert_repro.hub.push import code_files
from bert_repro.model.checkpoint_format import NotTransformersBertWarning
from bert_repro.model.modeling_bert_repro import AUTO_MAP

pytestmark = pytest.mark.slow

MODEL_CLASSES = {auto: path.split(".")[1] for auto, path in AUTO_MAP.items() if auto != "AutoConfig"}

CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["bert_repro"] = None  # make `import bert_repro` fail, as on a machine without the package
    import torch, transformers
    try:
        import bert_repro  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("bert_repro is importable in the child process")
    root, out = sys.argv[1], sys.argv[2]
    batch = torch.load(f"{root}/batch.pt", weights_only=True)
    results = {}
    for auto_name in json.load(open(f"{root}/classes.json")):
        auto = getattr(transformers, auto_name)
        model = auto.from_pretrained(f"{root}/{auto_name}", trust_remote_code=True).eval()
        module = type(model).__module__
        assert module.startswith("transformers_modules"), module
        inputs = batch[auto_name]
        with torch.no_grad():
            output = model(**inputs)
        results[auto_name] = {"class": type(model).__name__, "first": output[0]}
    # One pre-trained directory opened through every Auto class: same encoder, heads added where needed.
    pretrained = f"{root}/AutoModelForPreTraining"
    for auto_name in json.load(open(f"{root}/classes.json")):
        model = getattr(transformers, auto_name).from_pretrained(pretrained, trust_remote_code=True).eval()
        with torch.no_grad():
            encoded = model.base_model(**batch["AutoModel"]).last_hidden_state
        results["from_pretrained_dir/" + auto_name] = encoded
    config = transformers.AutoConfig.from_pretrained(f"{root}/AutoModel", trust_remote_code=True)
    results["config"] = type(config).__name__
    torch.save(results, out)
    """
)


def inputs_for(auto_name, config):
    batch = padded_batch(config.vocab_size, batch=4, seq=12)
    if auto_name == "AutoModelForMultipleChoice":
        return {k: v.reshape(2, 2, -1) for k, v in batch.items()}
    return batch


def test_every_auto_class_loads_without_the_package(tmp_path):
    config = tiny_config(num_labels=3)
    batch, expected = {}, {}
    for auto_name, class_name in MODEL_CLASSES.items():
        torch.manual_seed(0)
        model = getattr(bert_repro, class_name)(config).eval()
        if auto_name == "AutoModelForQuestionAnswering":  # said aloud on save: remote code only (see below)
            with pytest.warns(NotTransformersBertWarning, match="num_labels=3"):
                model.save_pretrained(tmp_path / auto_name)
        else:
            model.save_pretrained(tmp_path / auto_name)
        saved = json.loads((tmp_path / auto_name / "config.json").read_text())
        assert saved["auto_map"] == AUTO_MAP  # complete, whatever class was saved
        # transformers' own type, the auto_map serving trust_remote_code=True; with num_labels=3 the
        # question-answering head is one transformers' BERT would build otherwise: remote code only.
        assert saved["model_type"] == ("bert_repro" if auto_name == "AutoModelForQuestionAnswering" else "bert")
        # Every module the modeling code imports is saved beside it, and the Hub push ships the same list.
        assert {"model.safetensors", *(p.name for p in code_files())} <= set(os.listdir(tmp_path / auto_name))
        batch[auto_name] = inputs_for(auto_name, config)
        with torch.no_grad():
            expected[auto_name] = (class_name, model(**batch[auto_name])[0])
    torch.save(batch, tmp_path / "batch.pt")
    (tmp_path / "classes.json").write_text(json.dumps(list(MODEL_CLASSES)))

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    # Run from a directory where the source tree is not on sys.path either.
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), str(tmp_path / "out.pt")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    assert got["config"] == "BertReproConfig"
    for auto_name, (class_name, tensor) in expected.items():
        assert got[auto_name]["class"] == class_name
        diff = (got[auto_name]["first"] - tensor).abs().max().item()
        print(f"[remote code] {auto_name}: max diff {diff:.2e}")
        assert diff == 0.0
    with torch.no_grad():
        torch.manual_seed(0)
        pretrained = bert_repro.BertReproForPreTraining.from_pretrained(tmp_path / "AutoModelForPreTraining").eval()
        encoded = pretrained.bert(**batch["AutoModel"]).last_hidden_state
    for auto_name in MODEL_CLASSES:
        assert torch.equal(got["from_pretrained_dir/" + auto_name], encoded), auto_name
