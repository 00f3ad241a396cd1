"""A push lands whole or leaves the Hub as it found it, tags included: every refusal before the first write, one commit
per revision however many files, a failure at any request puts back what the push created or moved, a tag moves only
with --overwrite and once its commit exists, the same push again adds nothing; a fine-tuning grid kept whole and a run
with stray or broken checkpoint folders push what a user can load. In-process against the local Hub."""

import json
import logging
import re
import shutil
import subprocess
import sys

import pytest
import torch
from hub_server import HubError
from huggingface_hub import HfApi, _upload_pipeline
from huggingface_hub.utils._runtime import is_xet_available
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
    try:
        refs = hub.refs(REPO)
    except HubError:
        return None  # no such repository
    return refs, {branch: hub.history(REPO, branch) for branch in refs["heads"]}


def contents(hub):
    """The Hub as a reader sees it: each branch's and tag's files, and how many commits each branch holds."""
    refs = hub.refs(REPO)
    heads = {name: (len(hub.history(REPO, name)), hub.repo_files(REPO, name)) for name in refs["heads"]}
    return heads, {name: hub.repo_files(REPO, name) for name in refs["tags"]}


def fail_everywhere(hub, push_once, tmp_path, mode="403", kind="any"):
    """Fail `push_once` at its first request of `kind`, then its second...: a push that fails leaves the Hub as it was,
    one that gets past an answer "lost" after the Hub applied the request leaves it as the push that meets no failure,
    which ends the loop and is returned. Between tries the Hub goes back to a copy of its root."""
    before, whole = state(hub), []
    shutil.copytree(hub.root, tmp_path / "hub_before")
    for after in range(200):
        hub.fail_next(kind, mode, after=after)
        try:
            pushed = push_once()
        except HubPushError as err:
            assert state(hub) == before, (after, str(err))
            assert "the Hub is as it was" in str(err), str(err)
            continue
        if hub.cancel_failures():  # no request failed: the push is whole
            assert all(found == contents(hub) for found in whole)
            return pushed
        whole.append(contents(hub))
        shutil.rmtree(hub.root)
        shutil.copytree(tmp_path / "hub_before", hub.root)
    raise AssertionError("the push never got past its failure points")


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


def test_a_folder_past_upload_folders_batches_is_one_commit_or_none(tmp_path, tokenizer, hub, api):
    # upload_folder (hf_xet installed) commits this folder in batches: the first of 250 files, then the rest
    assert is_xet_available() and _upload_pipeline.COMMIT_SIZE_SCALE[_upload_pipeline.INITIAL_COMMIT_SIZE_INDEX] < 260
    run, events = run_dir(tmp_path / "run", tokenizer), tmp_path / "run" / "runs" / "lr1e-04_seed1" / "runs"
    for seed in (0, 1):  # a --keep_all_runs grid with its TensorBoard logs, then every file changed
        events.mkdir(parents=True, exist_ok=True)
        for i in range(260):
            (events / f"events.out.tfevents.{i}").write_text(f"{seed} {i}")
        if seed == 0:
            push(run, REPO, api=api)
    before = state(hub)
    pushed = fail_everywhere(hub, lambda: push(run, REPO, api=api), tmp_path)
    commits = [commit.commit_id for commit in api.list_repo_commits(REPO)]
    assert commits == [pushed.commit, *before[1]["main"]] and pushed.new
    assert hub.repo_files(REPO)["runs/lr1e-04_seed1/runs/events.out.tfevents.259"] == b"1 259"


@pytest.mark.parametrize(
    "mode, kind", [("403", "write"), ("lost", "write"), pytest.param("403", "any", marks=pytest.mark.slow)]
)
def test_a_checkpoints_push_lands_every_revision_or_none(tmp_path, tokenizer, hub, api, mode, kind):
    run = run_dir(tmp_path / "run", tokenizer)
    run_dir(run / "checkpoint-2", tokenizer, seed=2)
    fail_everywhere(hub, lambda: push_checkpoints(run, REPO, api=api), tmp_path / "new", mode, kind)  # a new repository
    for directory, seed in ((run, 3), (run / "checkpoint-2", 4), (run / "checkpoint-4", 5)):
        run_dir(directory, tokenizer, seed=seed)  # step-2 and main move, step-4 is new
    before = state(hub)
    pushed = fail_everywhere(hub, lambda: push_checkpoints(run, REPO, api=api), tmp_path / "existing", mode, kind)
    heads = hub.refs(REPO)["heads"]
    assert {revision: p.commit for revision, p in pushed.items()} == heads
    assert {branch: len(hub.history(REPO, branch)) for branch in heads} == {"main": 3, "step-2": 3, "step-4": 3}
    assert before[0]["heads"]["step-2"] in hub.history(REPO, "step-2")


def test_a_tag_moves_once_its_commit_exists_and_a_failed_move_says_how_to_finish(tmp_path, tokenizer, hub, api):
    run = run_dir(tmp_path / "run", tokenizer)
    first = push(run, REPO, tag="v1", api=api)
    run_dir(run, tokenizer, seed=1)
    hub.fail_next("commit", "403")
    with pytest.raises(HubPushError, match="the Hub is as it was"):
        push(run, REPO, tag="v1", overwrite=True, api=api)
    assert hub.refs(REPO)["tags"]["v1"] == first.commit
    hub.fail_next("tag", "403", after=1)  # deleted from its old commit, then not created on the new one
    with pytest.raises(HubPushError) as failed:
        push(run, REPO, tag="v1", overwrite=True, api=api)
    head = hub.refs(REPO)["heads"]["main"]
    assert "v1" not in hub.refs(REPO)["tags"] and f"`hf repos tag create {REPO} v1 --revision {head}`" in str(
        failed.value
    )
    hub.fail_next("tag", "lost")  # created, its answer lost
    again = push(run, REPO, tag="v1", api=api)  # or that command
    assert (again.commit, again.new, again.tag, hub.refs(REPO)["tags"]["v1"]) == (head, False, "v1", head)


def test_the_same_push_again_adds_nothing_and_returns_its_commits(tmp_path, tokenizer, hub, api, capsys):
    """A rerun after a push whose commits landed (its record did not, say) is harmless, --tag included."""
    run = run_dir(tmp_path / "run", tokenizer)
    run_dir(run / "checkpoint-2", tokenizer, seed=2)
    first = push_checkpoints(run, REPO, tag="v1", api=api)
    before = state(hub)
    again = push_checkpoints(run, REPO, tag="v1", api=api)
    assert state(hub) == before and before[0]["tags"] == {"v1": before[0]["heads"]["main"]}
    assert {r: (p.commit, p.new) for r, p in again.items()} == {r: (p.commit, False) for r, p in first.items()}
    assert (again["main"].repo_id, again["main"].revision, again["main"].tag) == (REPO, "main", "v1")
    main([str(run), "--repo_id", REPO, "--checkpoints", "--tag", "v1"])
    assert state(hub) == before and f"main: {first['main'].url}\n" in capsys.readouterr().out


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


@pytest.mark.slow
def test_what_a_failure_could_not_put_back_is_done_by_the_commands_it_names(tmp_path, tokenizer, hub, api):
    """The `hf` commands a failed push names (the Hub refused to put a branch back, or to set the tag), run as named,
    leave the Hub as it was, or the push finished."""

    def run_named(err):
        for command in re.findall(r"`(hf [^`]+)`", str(err.value)):
            hf = [sys.executable, "-m", "huggingface_hub.cli.hf", *command.split()[1:]]
            subprocess.run(hf, env=hub.client_env(tmp_path / "hf_home"), check=True, capture_output=True, timeout=120)

    run = run_dir(tmp_path / "run", tokenizer)
    run_dir(run / "checkpoint-2", tokenizer, seed=2)
    push_checkpoints(run, REPO, tag="v1", api=api)
    for directory, seed in ((run, 3), (run / "checkpoint-2", 4), (run / "checkpoint-4", 5)):
        run_dir(directory, tokenizer, seed=seed)
    before = state(hub)
    hub.fail_next("commit", "403", after=2)  # main's, after step-2's and step-4's
    hub.fail_next("branch", "403", after=1, times=2)  # after step-4's creation: its deletion and step-2's
    with pytest.raises(HubPushError, match="was not put back") as failed:
        push_checkpoints(run, REPO, tag="v1", overwrite=True, api=api)
    run_named(failed)
    assert state(hub) == before
    hub.fail_next("tag", "403", after=1)  # deleted, not created again
    with pytest.raises(HubPushError, match="hf repos tag create") as failed:
        push_checkpoints(run, REPO, tag="v1", overwrite=True, api=api)
    run_named(failed)
    assert hub.refs(REPO)["tags"]["v1"] == hub.refs(REPO)["heads"]["main"] != before[0]["tags"]["v1"]
