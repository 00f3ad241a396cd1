"""A push lands whole or leaves the Hub as it found it, tags included: every refusal before the first write, a failed
push removes what it created, a tag moves only with --overwrite; a fine-tuning grid kept whole and a run with stray
or broken checkpoint folders push what a user can load. In-process against the local Hub (`hub.patch_client`)."""

import json
import logging

import pytest
import torch
from huggingface_hub import HfApi
from support.damaged import damage_model_dir
from support.models import tiny_config

from bert_repro import BertReproForPreTraining
from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece
from bert_repro.hub.push import HubPushError, main, push, push_checkpoints, stage

REPO = "someone/tiny"


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(iterator=["the cat sat on the mat.", "a dog ran."] * 10, vocab_size=60, show_progress=False)


def run_dir(directory, tokenizer, seed=0, run="a"):
    """A pre-training output directory: the final model, its tokenizer and its run record."""
    torch.manual_seed(seed)
    BertReproForPreTraining(tiny_config(vocab_size=len(tokenizer))).save_pretrained(directory)
    save_tokenizer(tokenizer, directory / "tokenizer")
    record = {"run": {"preset": "tiny", "name": run}, "data": {}, "training": {}}
    (directory / "run_config.json").write_text(json.dumps(record))
    return directory


@pytest.fixture
def hub(local_hub, tmp_path):
    with local_hub.patch_client(tmp_path / "hf_home"):
        yield local_hub


@pytest.fixture
def api(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")  # for the command line's own client
    return HfApi(endpoint=hub.endpoint, token="hf_local_test_token")


def state(hub):
    """The Hub as a push may change it: every ref of the repository, and the commits each branch holds."""
    refs = hub.refs(REPO)
    return refs, {branch: hub.history(REPO, branch) for branch in refs["heads"]}


def test_an_existing_tag_is_refused_before_the_commit_and_moved_with_overwrite(tmp_path, tokenizer, hub, api, capsys):
    run = run_dir(tmp_path / "run", tokenizer)
    push(run, REPO, tag="v1", api=api)
    run_dir(run, tokenizer, seed=1)  # the same run, other weights: a new commit
    before = state(hub)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main([str(run), "--repo_id", REPO, "--tag", "v1"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "already has the tag 'v1'" in err and "--overwrite" in err
    assert len(err.strip().splitlines()) == 1, err
    assert state(hub) == before  # no commit landed

    push(run, REPO, tag="v1", overwrite=True, api=api)
    refs = hub.refs(REPO)
    assert refs["tags"]["v1"] == refs["heads"]["main"] != before[0]["tags"]["v1"]
    assert len(hub.history(REPO)) == len(before[1]["main"]) + 1


def test_a_refused_push_leaves_no_branch(tmp_path, tokenizer, hub, api):
    push(run_dir(tmp_path / "a", tokenizer), REPO, api=api)
    other = run_dir(tmp_path / "b", tokenizer, run="b")
    before = state(hub)
    for revision in ("dev", None):
        with pytest.raises(HubPushError, match="already holds a different model"):
            push(other, REPO, revision=revision, tag="v2", api=api)
        assert state(hub) == before


def test_a_failed_commit_removes_the_branch_or_repository_it_created(tmp_path, tokenizer, hub, api):
    run = run_dir(tmp_path / "run", tokenizer)
    hub.fail_next(kind="commit", mode="403")
    with pytest.raises(HubPushError, match="The repository someone/tiny it created was removed again"):
        push(run, REPO, api=api)
    assert not api.repo_exists(REPO)
    push(run, REPO, api=api)
    run_dir(run, tokenizer, seed=1)  # other weights: the branch's commit is not empty
    before = state(hub)
    hub.fail_next(kind="commit", mode="403")
    with pytest.raises(HubPushError, match="The branch dev it created was removed again"):
        push(run, REPO, revision="dev", api=api)
    assert state(hub) == before


def test_a_grid_kept_whole_stages_its_runs_models_without_training_state(tmp_path, tokenizer):
    """--keep_all_runs: each run's model, results and logs go up; its checkpoints and pickles do not."""
    out = tmp_path / "mrpc"
    run_dir(out, tokenizer)
    (out / "run_config.json").write_text(json.dumps({"run": {"task": "mrpc"}}))
    grid_run = out / "runs" / "lr2e-05_seed1"
    run_dir(grid_run / "model", tokenizer)
    run_dir(grid_run / "checkpoint-3", tokenizer)
    for pickle in (grid_run / "checkpoint-3" / "optimizer.pt", grid_run / "model" / "training_args.bin"):
        torch.save({"x": 1}, pickle)
    (grid_run / "result.json").write_text("{}")
    (grid_run / "runs").mkdir()
    (grid_run / "runs" / "events.out.tfevents.1").write_bytes(b"tb")
    staging = tmp_path / "staging"
    staging.mkdir()
    staged = stage(out, "someone/mrpc", staging, with_card=False)
    kept = "runs/lr2e-05_seed1/"
    assert {f"{kept}model/model.safetensors", f"{kept}result.json", f"{kept}runs/events.out.tfevents.1"} <= set(staged)
    assert not [name for name in staged if "checkpoint-" in name or name.endswith((".pt", ".bin"))], staged


def test_stray_and_broken_checkpoints_are_left_out_by_name(tmp_path, tokenizer, hub, api, caplog):
    run = run_dir(tmp_path / "run", tokenizer)
    for name in ("checkpoint-2", "checkpoint-4", "checkpoint-best", "checkpoint-10.bak"):
        run_dir(run / name, tokenizer)
    damage_model_dir(run / "checkpoint-4", "truncated")
    with caplog.at_level(logging.WARNING, logger="bert_repro.hub.push"):
        pushed = push_checkpoints(run, REPO, api=api)
    assert set(pushed) == {"step-2", "main"} and set(hub.refs(REPO)["heads"]) == {"step-2", "main"}
    for name in ("checkpoint-4", "checkpoint-best", "checkpoint-10.bak"):
        assert f"left out {run / name}" in caplog.text
    assert "bert_repro_push-" not in caplog.text  # the real folders are named, never a staging copy
