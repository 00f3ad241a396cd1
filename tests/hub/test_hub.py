"""Publishing against the local Hub server with the real, unmocked client, run in subprocesses since
huggingface_hub reads HF_ENDPOINT when it is imported."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hub_server import LocalHub
from support import ROOT, file_digests
from support.models import padded_batch, tiny_config
from support.pretraining_runs import launch, write_config
from support.run_records import finetuning_run, make_pretraining_run
from support.task_files import finetune_args, fixture_files, write

from bert_repro import BertReproForPreTraining, BertReproForSequenceClassification
from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece

pytestmark = pytest.mark.slow

TOKEN = "hf_test_token_never_in_files_0123456789"


def client_env(hub, tmp_path):
    return {**hub.client_env(tmp_path / "hf_home", TOKEN), "PYTHONPATH": str(ROOT)}


def run(cmd, env, check=True):
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def push_cli(env, *args, check=True):
    return run([sys.executable, "-m", "bert_repro.hub", *map(str, args)], env, check=check)


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["the cat sat on the mat.", "a dog ran in the park.", "bert reads both directions."] * 20
    return train_wordpiece(iterator=texts, vocab_size=80, show_progress=False)


def pretraining_output(directory: Path, tokenizer) -> BertReproForPreTraining:
    """What recipes/pretrain.py leaves: final model, a checkpoint with Trainer's pickles, records."""
    make_pretraining_run(directory.parent, name=directory.name)  # the model's config.json replaces the records'
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(tokenizer))
    model = BertReproForPreTraining(config).eval()
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    save_tokenizer(tokenizer, directory / "tokenizer")
    checkpoint = directory / "checkpoint-2"
    torch.manual_seed(1)
    BertReproForPreTraining(config).save_pretrained(checkpoint)
    for pickle_name in ("optimizer.pt", "rng_state.pth", "training_args.bin"):
        torch.save({"x": 1}, checkpoint / pickle_name)
    torch.save({"x": 1}, directory / "training_args.bin")
    return model


CHILD = textwrap.dedent("""
    import json, sys
    sys.modules["bert_repro"] = None  # a user who never installed bert_repro
    import torch, transformers
    from huggingface_hub import ModelCard
    repo, revision, auto_name, batch_file, out = sys.argv[1:6]
    model = getattr(transformers, auto_name).from_pretrained(
        repo, revision=None if revision == "-" else revision, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    batch = torch.load(batch_file, weights_only=True)
    with torch.no_grad():
        first = model(**batch)[0]
    card = ModelCard.load(repo) if revision == "-" else None
    if card is not None:
        card.validate()  # the Hub's /api/validate-yaml (here: the local server's)
    results = [] if card is None else [(r.metric_type, r.metric_value) for r in (card.data.eval_results or [])]
    torch.save({"first": first, "eval_results": results}, out)
""")


def load_without_package(env, tmp_path, repo, revision, auto_name, batch):
    torch.save(batch, tmp_path / "batch.pt")
    args = [repo, revision or "-", auto_name, tmp_path / "batch.pt", tmp_path / "out.pt"]
    run([sys.executable, "-c", CHILD, *map(str, args)], env)
    return torch.load(tmp_path / "out.pt", weights_only=True)


def test_pretrained_round_trip_with_revisions(tmp_path, tokenizer):
    local = tmp_path / "run"
    model = pretraining_output(local, tokenizer)
    before = file_digests(local)
    batch = padded_batch(len(tokenizer))
    with LocalHub() as hub:
        env = client_env(hub, tmp_path)
        push_cli(env, local, "--repo_id", "someone/tiny-bert", "--checkpoints")
        assert file_digests(local) == before  # nothing written into the user's directory

        files = hub.repo_files("someone/tiny-bert")
        assert {
            "model.safetensors",
            "config.json",
            "modeling_bert_repro.py",
            "configuration_bert_repro.py",
            "vocab.txt",
            "tokenizer.json",
            "README.md",
            "run_config.json",
            "data_statistics.json",
        } <= set(files)
        for revision in ("main", "step-2"):
            names = hub.repo_files("someone/tiny-bert", revision)
            assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl"))], names
        assert all(TOKEN.encode() not in content for content in files.values())
        assert any(TOKEN in str(headers) for _, _, headers in hub.requests)  # it was sent, as a header only
        config = json.loads(files["config.json"])
        assert len(config["auto_map"]) == 9

        got = load_without_package(env, tmp_path, "someone/tiny-bert", None, "AutoModelForPreTraining", batch)
        with torch.no_grad():
            expected = model(**batch).prediction_logits
        assert torch.equal(got["first"], expected)
        assert ("accuracy", 0.0976) in [(t, round(v, 4)) for t, v in got["eval_results"]]

        checkpoint = BertReproForPreTraining.from_pretrained(local / "checkpoint-2").eval()
        got = load_without_package(env, tmp_path, "someone/tiny-bert", "step-2", "AutoModelForPreTraining", batch)
        with torch.no_grad():
            assert torch.equal(got["first"], checkpoint(**batch).prediction_logits)


def test_shards_and_the_written_card_are_staged(tmp_path, tokenizer):
    """A model saved in shards stages every shard and the index; the card `python -m bert_repro.hub.model_card`
    wrote for this repository goes up as written (it may hold a study the push knows nothing of), while a card
    written for another repository is replaced by a fresh one."""
    from bert_repro.hub import model_card
    from bert_repro.hub.push import stage

    local = tmp_path / "run"
    model = pretraining_output(local, tokenizer)
    (local / "model.safetensors").unlink()
    model.save_pretrained(local, max_shard_size="20KB")
    shards = {p.name for p in local.glob("model-*-of-*.safetensors")}
    assert len(shards) > 1
    written = model_card.main([str(local), "someone/tiny-bert"])
    written.write_text(written.read_text() + "\nA line only the written card has.\n")
    for repo_id, kept in (("someone/tiny-bert", True), ("someone/another", False)):
        staging = tmp_path / repo_id
        staging.mkdir(parents=True)
        staged = stage(local, repo_id, staging)
        assert shards | {"model.safetensors.index.json", "config.json", "README.md"} <= set(staged)
        card = (staging / "README.md").read_text()
        assert ("A line only the written card has." in card) is kept and f'"{repo_id}"' in card


def test_failed_push_is_clear_and_a_second_push_completes(tmp_path, tokenizer):
    local = tmp_path / "run"
    pretraining_output(local, tokenizer)
    before = file_digests(local)
    with LocalHub() as hub:
        env = client_env(hub, tmp_path)
        # Refused, then dropped half-way through the body (create_commit does not retry): what it put back, see
        # tests/hub/test_push_whole.py
        for mode in ("403", "drop"):
            hub.fail_next(kind="commit", mode=mode)
            failed = push_cli(env, local, "--repo_id", "someone/flaky", check=False)
            assert failed.returncode != 0, mode
            assert "did not complete" in failed.stderr
            # advice by cause: a refusal is not cured by repeating the command, a dropped connection is
            advice = "may not write to someone/flaky" if mode == "403" else "run the same command again"
            assert advice in failed.stderr, failed.stderr[-2000:]
            assert TOKEN not in failed.stderr + failed.stdout
            assert file_digests(local) == before and "it created was removed again" in failed.stderr
        push_cli(env, local, "--repo_id", "someone/flaky")
        assert "model.safetensors" in hub.repo_files("someone/flaky")


def test_different_model_needs_overwrite(tmp_path, tokenizer):
    pretrained = tmp_path / "run"
    pretraining_output(pretrained, tokenizer)
    validation = {"accuracy": 0.83, "f1": 0.873}
    best = {"_main": "f1", "learning_rate": 2e-5, "seed": 42, "train_seconds": 4.0, "score": 0.873}
    finetuned = finetuning_run(tmp_path, "mrpc", {**best, "validation": validation}, [], model="someone/tiny-bert")
    torch.manual_seed(0)
    classifier = BertReproForSequenceClassification(tiny_config(vocab_size=len(tokenizer), num_labels=2)).eval()
    classifier.save_pretrained(finetuned)  # its config.json replaces the record's
    save_tokenizer(tokenizer, finetuned)
    with LocalHub() as hub:
        env = client_env(hub, tmp_path)
        push_cli(env, pretrained, "--repo_id", "someone/model")
        refused = push_cli(env, finetuned, "--repo_id", "someone/model", check=False)
        assert refused.returncode != 0 and "already holds a different model" in refused.stderr
        assert "--overwrite" in refused.stderr
        push_cli(env, finetuned, "--repo_id", "someone/model", "--overwrite", "--private")
        files = hub.repo_files("someone/model")
        assert "results.json" in files and "data_statistics.json" not in files  # mirrors the new model only
        batch = padded_batch(len(tokenizer))
        got = load_without_package(env, tmp_path, "someone/model", None, "AutoModelForSequenceClassification", batch)
        with torch.no_grad():
            assert torch.equal(got["first"], classifier(**batch).logits)
        assert ("f1", 0.873) in [(t, round(v, 4)) for t, v in got["eval_results"]]  # a fraction, as evaluate's


def test_push_advice_fits_the_cause(tmp_path, tokenizer):
    local = tmp_path / "run"
    pretraining_output(local, tokenizer)
    with LocalHub(token="the-right-token") as hub:
        env = client_env(hub, tmp_path)  # its HF_TOKEN is another one: the server answers 401
        failed = push_cli(env, local, "--repo_id", "someone/model", check=False)
        assert failed.returncode != 0
        assert "did not accept your token" in failed.stderr and "hf auth login" in failed.stderr
        assert "run the same command again" not in failed.stderr
        assert TOKEN not in failed.stderr + failed.stdout


@pytest.mark.parametrize(
    "case, expected",
    [
        ("refused token", "did not accept your token"),
        ("offline", "HF_HUB_OFFLINE"),
        ("invalid id", "is not a valid repository id"),
    ],
)
def test_finetune_push_to_hub_checks_the_hub_before_training(tmp_path, case, expected, tiny_model):
    """--push_to_hub fails in seconds, before any data or training, with advice that fits the cause."""
    data = write(tmp_path / "MRPC", fixture_files("mrpc"))
    repo_id = "not a valid id!" if case == "invalid id" else "someone/tiny-mrpc"
    with LocalHub(token="the-right-token") as hub:
        env = client_env(hub, tmp_path)
        if case == "offline":
            env["HF_HUB_OFFLINE"] = "1"
        out = tmp_path / "out"
        args = finetune_args("mrpc", tiny_model, data, out, cpu=False, push_to_hub=True, hub_model_id=repo_id)
        result = run([sys.executable, str(ROOT / "recipes" / "finetune.py"), *args], env, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert expected in result.stderr, result.stderr[-3000:]
    assert not (out / "run_config.json").exists()
    assert TOKEN not in result.stderr + result.stdout


def every_byte_without(folder: Path, secret: str) -> list[str]:
    """The files under `folder` (pickles, logs, cards, checkpoints: all of them) whose bytes hold `secret`."""
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_both_recipes_push_every_revision_with_hub_token_and_write_it_nowhere(
    tmp_path, corpus_and_tokenizer, tiny_model
):
    """Both recipes push with --hub_token (command line, or a config's hub_token) to a Hub that requires it and no
    other token around: every checkpoint as a branch, the final model on --hub_revision (main by default), no pickle;
    no byte of the run's folder (training_args.bin, run_config.json, checkpoints, logs) holds the token."""
    secret = "hf_only_on_the_command_line_5678"
    with LocalHub(token=secret) as hub:
        env = {k: v for k, v in client_env(hub, tmp_path).items() if k != "HF_TOKEN"}
        corpus, tokenizer_dir = corpus_and_tokenizer
        config = write_config(tmp_path / "tiny.yaml", corpus, tokenizer_dir, max_steps=4, save_steps=2)
        out = tmp_path / "run"
        push = ("--push_to_hub", "true", "--hub_model_id", "someone/tiny")
        result = launch(config, out, *push, "--hub_token", secret, env=env)
        assert {"main", "step-2", "step-4"} <= set(hub.refs("someone/tiny")["heads"])  # checkpoints as revisions
        for revision in ("main", "step-2"):
            files = hub.repo_files("someone/tiny", revision)
            assert "model.safetensors" in files and "vocab.txt" in files
            assert not [n for n in files if n.endswith((".bin", ".pt", ".pth"))]
        assert b"model-index" in hub.repo_files("someone/tiny")["README.md"]
        assert every_byte_without(out, secret) == []
        assert secret not in result.stdout + result.stderr

        data = write(tmp_path / "MRPC", fixture_files("mrpc"))
        finetune_config = tmp_path / "finetune.yaml"
        finetune_config.write_text(f"hub_token: {secret}\nhub_model_id: someone/tiny-mrpc\nhub_revision: v2\n")
        out = tmp_path / "mrpc"
        flags = finetune_args("mrpc", tiny_model, data, out, learning_rates=1e-4, max_steps=2, push_to_hub=True)
        result = run(
            [sys.executable, str(ROOT / "recipes" / "finetune.py"), "--config", str(finetune_config), *flags], env
        )
        files = hub.repo_files("someone/tiny-mrpc", "v2")  # our publishing, not Trainer's (no pickles)
        assert {"model.safetensors", "config.json", "modeling_bert_repro.py", "vocab.txt", "results.json"} <= set(files)
        assert not [n for n in files if n.endswith((".bin", ".pt", ".pth"))] and b"model-index" in files["README.md"]
        assert every_byte_without(out, secret) == []
        assert secret not in result.stdout + result.stderr


def test_a_failed_final_push_is_one_line_exit_2(tmp_path, corpus_and_tokenizer):
    """A push that fails after training (the Hub refuses the commits: a token revoked during the run) is exit code 2
    with the command that publishes the finished run, not a traceback; that command exits 2 for the same cause."""
    corpus, tokenizer_dir = corpus_and_tokenizer
    config = write_config(tmp_path / "tiny.yaml", corpus, tokenizer_dir, max_steps=2, save_steps=2)
    out = tmp_path / "run"
    with LocalHub() as hub:
        env = client_env(hub, tmp_path)
        hub.fail_next(kind="commit", mode="401", times=100)  # whoami, before training, still answers
        recipe = [sys.executable, str(ROOT / "recipes" / "pretrain.py"), "--config", str(config), "--output_dir"]
        result = run([*recipe, str(out), "--push_to_hub", "true", "--hub_model_id", "someone/tiny"], env, check=False)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        assert "did not accept your token" in result.stderr
        assert f"python -m bert_repro.hub {out} --repo_id someone/tiny --checkpoints" in result.stderr
        again = push_cli(env, out, "--repo_id", "someone/tiny", "--checkpoints", check=False)
        assert again.returncode == 2 and "did not accept your token" in again.stderr
