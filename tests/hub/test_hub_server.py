"""The local Hub server (tests/hub_server.py) against the real, unmocked huggingface_hub client in this process
(`hub.patch_client`): what the push tests rely on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hub_server import LocalHub
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, constants, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from support import ROOT

TOKEN = "hf_local_test_token_0123456789"
REPO = "local-user/demo"
BINARY = bytes(range(256)) * 40 + b"\x00\xff" * 7  # not UTF-8, bigger than the preupload sample


@pytest.fixture
def hub(tmp_path, monkeypatch):
    # The client in this process sends HF_TOKEN where a call passes no token: this hub's, whatever the shell holds.
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with LocalHub(root=tmp_path / "hub", token=TOKEN) as server, server.patch_client(tmp_path / "hf_home"):
        yield server
        assert not server.server_errors, server.server_errors


@pytest.fixture
def api(hub):
    return HfApi(token=TOKEN)


def test_publish_and_read_back_by_branch_tag_and_commit(hub, api, tmp_path):
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("step 0\n")
    (folder / "stale.txt").write_text("removed by the next push\n")
    (folder / "sub" / "weights.bin").write_bytes(BINARY)
    assert api.whoami()["name"] == "local-user"
    url = str(api.create_repo(REPO))
    assert url == f"{hub.endpoint}/{REPO}" == str(api.create_repo(REPO, exist_ok=True))
    with pytest.raises(HfHubHTTPError, match="409"):
        api.create_repo(REPO)
    first = api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="first upload").oid
    (folder / "stale.txt").unlink()
    main = api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="second", delete_patterns="*").oid
    assert api.upload_folder(repo_id=REPO, folder_path=folder).oid == main  # unchanged: no commit
    api.create_branch(REPO, branch="step-1000")
    branch = api.upload_file(
        path_or_fileobj=b"step 1000\n", path_in_repo="notes.txt", repo_id=REPO, revision="step-1000"
    )
    api.create_tag(REPO, tag="v1.0", revision="step-1000")

    assert hub.repo_files(REPO) == {
        ".gitattributes": hub.repo_files(REPO)[".gitattributes"],
        "notes.txt": b"step 0\n",
        "sub/weights.bin": BINARY,
    }
    assert hub.history(REPO)[:2] == [main, first] and len(hub.history(REPO)) == 3
    assert hub.refs(REPO) == {"heads": {"main": main, "step-1000": branch.oid}, "tags": {"v1.0": branch.oid}}
    refs = api.list_repo_refs(REPO)
    assert {r.name: r.target_commit for r in refs.branches} == {"main": main, "step-1000": branch.oid}
    assert {r.name: r.target_commit for r in refs.tags} == {"v1.0": branch.oid}
    expected = {"main": "step 0\n", "step-1000": "step 1000\n", "v1.0": "step 1000\n", first[:7]: "step 0\n"}
    for revision, text in expected.items():
        assert Path(hf_hub_download(REPO, "notes.txt", revision=revision)).read_text() == text
    assert Path(hf_hub_download(REPO, "sub/weights.bin")).read_bytes() == BINARY
    assert api.list_repo_files(REPO, revision="v1.0") == [".gitattributes", "notes.txt", "sub/weights.bin"]
    info = api.model_info(REPO, revision="step-1000")
    assert (info.id, info.sha, info.private) == (REPO, branch.oid, False)
    assert api.repo_exists(REPO) and api.file_exists(REPO, "sub/weights.bin") and not api.file_exists(REPO, "x")

    api.delete_tag(REPO, tag="v1.0")
    api.delete_branch(REPO, branch="step-1000")
    assert hub.refs(REPO) == {"heads": {"main": main}, "tags": {}}
    api.delete_repo(REPO)
    assert not api.repo_exists(REPO)


def test_errors_are_the_clients_exceptions(hub, api):
    api.create_repo(REPO)
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_refs("local-user/missing")
    with pytest.raises(RepositoryNotFoundError):
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="local-user/missing")
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_files(REPO, revision="nope")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(REPO, "missing.txt")
    with pytest.raises(EntryNotFoundError):
        api.delete_file("missing.txt", repo_id=REPO)
    # the Hub's /api/validate-yaml (what ModelCard.validate asks): a front matter that is not a YAML mapping is refused
    ModelCard("---\nlicense: apache-2.0\ntags: [bert]\n---\n# Card\n").validate()
    for broken in (b"---\nlicense: [unclosed\n---\n# Card\n", b"---\n- a list\n---\n", b"---\nlicense: mit\n"):
        with pytest.raises(ValueError, match="Invalid metadata in README.md"):
            api.upload_file(path_or_fileobj=broken, path_in_repo="README.md", repo_id=REPO)


def test_token_private_repos_and_patch_client(tmp_path):
    endpoint, offline = constants.ENDPOINT, constants.HF_HUB_OFFLINE
    with LocalHub(root=tmp_path / "hub", token=TOKEN) as hub, hub.patch_client(tmp_path / "hf_home"):
        api = HfApi(token=TOKEN)
        api.create_repo("local-user/secret", private=True)
        api.upload_file(path_or_fileobj=b"s3cret", path_in_repo="s.txt", repo_id="local-user/secret")
        downloaded = hf_hub_download("local-user/secret", "s.txt", token=TOKEN)
        assert Path(downloaded).read_bytes() == b"s3cret" and downloaded.startswith(str(tmp_path / "hf_home"))
        assert api.model_info("local-user/secret").private is True
        assert {headers.get("authorization") for _, _, headers in hub.requests} == {f"Bearer {TOKEN}"}
        with pytest.raises(HfHubHTTPError) as wrong:
            HfApi(token="wrong-token").whoami()
        assert wrong.value.response.status_code == 401
        anonymous = HfApi(token=False)
        with pytest.raises(RepositoryNotFoundError):
            anonymous.model_info("local-user/secret")
        with pytest.raises(RepositoryNotFoundError):
            anonymous.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="local-user/secret")
    assert (constants.ENDPOINT, constants.HF_HUB_OFFLINE) == (endpoint, offline)


@pytest.mark.parametrize("mode", ["500", "drop"])
def test_failed_commit_changes_nothing_and_a_second_push_completes(hub, api, mode):
    api.create_repo(REPO)
    before = hub.history(REPO)
    hub.fail_next("commit", mode)
    operations = [CommitOperationAdd(f"part-{i}.txt", f"{i}".encode()) for i in range(3)]
    with pytest.raises(Exception, match="500" if mode == "500" else "disconnected"):  # create_commit: no retry
        api.create_commit(REPO, operations, commit_message="push")
    assert hub.history(REPO) == before
    api.create_commit(REPO, operations, commit_message="push")
    assert hub.history(REPO)[1:] == before
    assert hub.repo_files(REPO)["part-2.txt"] == b"2"
    with pytest.raises(ValueError, match="Unknown request kind"):
        hub.fail_next("no-such-kind")


def test_server_logs_nothing(hub, capfd):
    """Good requests, errors and unknown routes: nothing reaches stdout/stderr, so no token can leak there."""
    for path in ("/api/whoami-v2", "/api/models/local-user/missing", "/api/no/such/route"):
        request = urllib.request.Request(hub.endpoint + path, headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            urllib.request.urlopen(request, timeout=10).read()
        except urllib.error.HTTPError as err:
            assert err.code == 404 and "whoami" not in path
    assert hub.unhandled == [("GET", "/api/no/such/route")]
    assert capfd.readouterr() == ("", "")


def test_the_server_runs_by_hand_with_python_m(tmp_path):
    # `python -m tests.hub_server`: a user tries a push offline (its first lines say how), Ctrl-C stops it.
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.hub_server", "--root", str(tmp_path / "repos")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = server.stdout.readline()
        assert first.startswith("local Hub at http://127.0.0.1:"), first + server.stderr.read()
        endpoint = first.split()[3].rstrip(",")
        assert f"export HF_ENDPOINT={endpoint} HF_HUB_OFFLINE=0 HF_TOKEN=" in server.stdout.readline()
        request = urllib.request.Request(
            f"{endpoint}/api/whoami-v2", headers={"Authorization": "Bearer hf_local_test_token"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["name"] == "local-user"
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=10) == 0, server.stderr.read()
    assert (tmp_path / "repos").is_dir()  # kept: the user's --root
