"""The push's refusal to publish over a different model (`check_remote`, `_run_identity`), in the fast tier.

tests/hub/test_hub.py checks the same refusal end to end against a local Hub server (slow tier); here each rule gets its
own case against an in-memory stand-in for the two `HfApi` calls the check makes.
"""

import json
from pathlib import Path

import pytest
from huggingface_hub.errors import RemoteEntryNotFoundError
from huggingface_hub.utils import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from bert_repro.hub.push import HubPushError, _run_identity, check_remote

OURS = {"model_type": "bert_repro", "hidden_size": 32}
RUN = {"run": {"task": "mrpc"}, "training": {"seed": 42}}


def hub_error(cls):
    """A huggingface_hub error without an HTTP response (their constructors want one); only the class matters here."""
    err = cls.__new__(cls)
    Exception.__init__(err, "not found")
    return err


class FakeApi:
    """A repository as `check_remote` sees it: its file names, and the text of the ones it downloads."""

    repo_id = "someone/model"

    def __init__(self, tmp_path: Path, files: dict[str, str] | None, missing_revision: bool = False):
        self.tmp_path, self.files, self.missing_revision = tmp_path, files, missing_revision
        self.calls = []

    def list_repo_files(self, repo_id, revision=None):
        self.calls.append(("list", repo_id, revision))
        if self.files is None or repo_id != self.repo_id:
            raise hub_error(RepositoryNotFoundError)
        if self.missing_revision:
            raise hub_error(RevisionNotFoundError)
        return list(self.files)

    def hf_hub_download(self, repo_id, filename, revision=None):
        self.calls.append(("download", repo_id, filename, revision))
        if repo_id != self.repo_id:
            raise hub_error(RepositoryNotFoundError)
        if filename not in self.files:
            raise hub_error(RemoteEntryNotFoundError)
        if self.files[filename] is None:  # the download failed (no network, a refused request): no cached copy
            raise hub_error(LocalEntryNotFoundError)
        path = self.tmp_path / "downloads" / filename
        path.parent.mkdir(exist_ok=True)
        path.write_text(self.files[filename])
        return str(path)


def identity(record: dict) -> str:
    return json.dumps(record, sort_keys=True)


def check(tmp_path, files, local=identity(RUN), overwrite=False, revision=None, **kwargs):
    api = FakeApi(tmp_path, files, **kwargs)
    check_remote(api, "someone/model", revision, local, overwrite)
    return api


@pytest.mark.parametrize(
    "files, kwargs",
    [
        (None, {}),  # no such repository yet
        ({"config.json": json.dumps({"model_type": "gpt2"})}, {"missing_revision": True}),  # a new branch
        ({}, {}),  # an empty repository
        ({".gitattributes": "", "README.md": "# card"}, {}),  # what creating a repository leaves
    ],
    ids=["no-repository", "no-revision", "empty", "only-gitattributes-and-card"],
)
def test_nothing_to_overwrite_is_no_refusal(tmp_path, files, kwargs):
    api = check(tmp_path, files, **kwargs)
    assert not [c for c in api.calls if c[0] == "download"]


def test_the_same_run_is_pushed_again(tmp_path):
    # The identity is the record's content, whatever its key order and layout.
    remote = json.dumps({"training": {"seed": 42}, "run": {"task": "mrpc"}}, indent=4)
    check(tmp_path, {"config.json": json.dumps(OURS), "run_config.json": remote, "model.safetensors": "w"})


@pytest.mark.parametrize(
    "files, local, reason",
    [
        (
            {"config.json": json.dumps(OURS), "run_config.json": json.dumps({**RUN, "training": {"seed": 43}})},
            identity(RUN),
            "it holds another run (its run_config.json differs)",
        ),
        (
            {"config.json": json.dumps(OURS), "run_config.json": json.dumps(RUN)},
            None,
            "it holds another run (its run_config.json differs)",
        ),
        (
            {"config.json": json.dumps(OURS), "model.safetensors": "w"},
            identity(RUN),
            "it holds a model without a run record",
        ),
        (
            {"config.json": json.dumps({"model_type": "gpt2"})},
            identity(RUN),
            "it holds a 'gpt2' model not saved by bert_repro",
        ),
        ({"model.safetensors": "w"}, identity(RUN), "it holds files but no config.json"),
    ],
    ids=["another-run", "a-run-record-we-lack", "no-run-record", "not-ours", "no-config"],
)
def test_a_different_model_is_refused_unless_overwrite(tmp_path, files, local, reason):
    with pytest.raises(HubPushError) as refused:
        check(tmp_path, files, local=local)
    # One reason: a foreign config is not also asked for a run record.
    assert str(refused.value) == (
        f"someone/model already holds a different model: {reason}. Pass overwrite=True (--overwrite) to replace it."
    )
    check(tmp_path, files, local=local, overwrite=True)


def test_a_failed_download_is_no_refusal(tmp_path):
    # Not "it holds files but no config.json", which would ask for --overwrite: the push fails, and says why.
    with pytest.raises(LocalEntryNotFoundError):
        check(tmp_path, {"config.json": None, "model.safetensors": "w"})


def test_a_bert_repro_model_without_a_run_record_over_one_without(tmp_path):
    # Neither side has a run_config.json (e.g. converted checkpoints): nothing tells them apart, so no refusal.
    check(tmp_path, {"config.json": json.dumps(OURS), "model.safetensors": "w"}, local=None)


def test_the_revision_is_checked_and_named(tmp_path):
    files = {"config.json": json.dumps(OURS), "run_config.json": json.dumps({"run": {}})}
    with pytest.raises(HubPushError, match=r"^someone/model@step-100 already holds a different model"):
        api = FakeApi(tmp_path, files)
        check_remote(api, "someone/model", "step-100", identity(RUN), False)
    assert {c[-1] for c in api.calls} == {"step-100"}


def test_run_identity_is_the_sorted_record(tmp_path):
    assert _run_identity(tmp_path) is None
    (tmp_path / "run_config.json").write_text(json.dumps({"b": 1, "a": {"d": 2, "c": 3}}, indent=2))
    assert _run_identity(tmp_path) == '{"a": {"c": 3, "d": 2}, "b": 1}'
