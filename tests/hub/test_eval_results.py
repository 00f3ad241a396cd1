"""huggingface_hub 2.x's evaluation results (`.eval_results/<task>.yaml`) of a fine-tuned run: written by the run
beside its card, read back with huggingface_hub's own parser, pointing at the task's benchmark dataset on the Hub."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import yaml
from huggingface_hub import HfApi, parse_eval_result_entries
from support.models import tiny_config
from support.run_records import finetuning_run

from bert_repro import BertReproForSequenceClassification
from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece
from bert_repro.hub import model_card
from bert_repro.hub.model_card import card_for_finetuning
from bert_repro.hub.push import push
from bert_repro.tasks.registry import METRICS, get_task


def one_run(root, task, scores, main, **fields):
    """A fine-tuning output directory whose grid is one run with ``scores`` ({split: {metric: value}})."""
    run = {"learning_rate": 2e-05, "seed": 42, "train_seconds": 60.0, **scores, "score": 0.5}
    return finetuning_run(root, task, {"_main": main, **run}, [run], **fields)


def mrpc_run(root, f1=0.873):
    return one_run(root, "mrpc", {"validation": {"accuracy": 0.81, "f1": f1}}, "f1")


def entries(folder, task="mrpc"):
    """`folder/.eval_results/<task>.yaml` as huggingface_hub parses it."""
    return parse_eval_result_entries(yaml.safe_load((folder / ".eval_results" / f"{task}.yaml").read_text()))


def written_by_the_run(out):
    """What the fine-tuning recipe does: the card made with the summary it is about to write as results.json."""
    return card_for_finetuning(out, "someone/model", summary=json.loads((out / "results.json").read_text()))


CONLL = {"validation": {"entity_f1": 0.951}, "test": {"entity_f1": 0.912}}
MNLI = {"validation_matched": {"accuracy": 0.8412}, "validation_mismatched": {"accuracy": 0.8455}}
BENCHMARKS = {  # task: (its scores by split, what its .eval_results give: dataset, task id, value)
    "mrpc": ({"validation": {"accuracy": 0.81, "f1": 0.873}}, [("nyu-mll/glue", "mrpc", 0.873)]),
    # SQuAD's F1 is percent already
    "squad_v2": ({"validation": {"squad_f1": 74.6, "squad_best_f1": 75.8}}, [("rajpurkar/squad_v2", "squad_v2", 74.6)]),
    "mnli": (MNLI, [("nyu-mll/glue", "mnli_matched", 0.8412), ("nyu-mll/glue", "mnli_mismatched", 0.8455)]),
    # the dev split only, not the test split's 0.912
    "conll2003": (CONLL, [("eriktks/conll2003", "conll2003", 0.951)]),
}


@pytest.mark.parametrize("task", BENCHMARKS)
def test_the_run_writes_each_dev_score_for_its_benchmark(task, tmp_path):
    """The main metric of each dev split, in the metric's own scale, under the Hub's dataset id and the configuration
    that holds the split; the command line writes the same beside the card."""
    scores, expected = BENCHMARKS[task]
    out = one_run(tmp_path, task, scores, "-", num_labels=3 if task == "mnli" else 2)
    written_by_the_run(out)
    got = entries(out, task)
    assert [(e.dataset_id, e.task_id, e.value) for e in got] == expected
    label = METRICS[get_task(task).main_metric].label
    assert all(e.notes.startswith(f"{label}, validation") and " split; " in e.notes and not e.source_url for e in got)
    elsewhere = tmp_path / "cards" / "README.md"
    model_card.main([str(out), "someone/model", "--output", str(elsewhere)])
    assert entries(elsewhere.parent, task) == got


def test_reading_a_run_or_a_run_without_a_dev_score_writes_nothing(tmp_path):
    """A card made of a finished run (a push's) leaves its folder as it was; no main metric, no file."""
    card_for_finetuning(mrpc_run(tmp_path / "a"), "someone/model")
    written_by_the_run(mrpc_run(tmp_path / "b", f1=None))
    assert not list(tmp_path.glob("*/*/.eval_results"))


def test_a_pushed_fine_tune_carries_its_eval_results(tmp_path, local_hub):
    """A fine-tuned run pushed to the (local) Hub: huggingface_hub parses its `.eval_results` back, with the dev score
    of results.json, and the README keeps the model-index for older tools."""
    out = mrpc_run(tmp_path)
    tokenizer = train_wordpiece(iterator=["the cat sat on the mat.", "a dog ran."] * 10, vocab_size=60)
    torch.manual_seed(0)
    BertReproForSequenceClassification(tiny_config(vocab_size=len(tokenizer), num_labels=2)).save_pretrained(out)
    save_tokenizer(tokenizer, out)
    (out / "README.md").write_text(str(written_by_the_run(out)))
    with local_hub.patch_client(tmp_path / "hf_home"):
        push(out, "someone/model", api=HfApi(endpoint=local_hub.endpoint, token="hf_local_test_token"))
    files = local_hub.repo_files("someone/model")
    (entry,) = parse_eval_result_entries(yaml.safe_load(files[".eval_results/mrpc.yaml"]))
    assert (entry.dataset_id, entry.task_id, entry.value) == ("nyu-mll/glue", "mrpc", 0.873)
    assert entry.value == json.loads((out / "results.json").read_text())["best"]["validation"]["f1"]
    assert b"model-index" in files["README.md"]
