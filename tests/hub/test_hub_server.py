"""The local Hub server against the real huggingface_hub client (and transformers), run in subprocesses.

Nothing of huggingface_hub is mocked: each client script runs in a fresh interpreter whose HF_ENDPOINT points
at the server (see tests/hub_server.py), so the requests, headers and error mapping are the client's own.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hub_server import LocalHub
from support import ROOT

TOKEN = "hf_local_test_token_0123456789"
BINARY = bytes(range(256)) * 40 + b"\x00\xff" * 7  # not UTF-8, bigger than the preupload sample

# Every script starts with this and prints `out` as JSON on its last stdout line.
PRELUDE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import huggingface_hub
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    api = HfApi()
    WORK = Path(os.environ["CLIENT_WORK"])
    out = {}

    def error_name(call):
        # None if call() succeeds, else "ErrorClass [status]: first line of the message"
        try:
            call()
        except Exception as err:
            response = getattr(err, "response", None)
            status = f" {response.status_code}" if response is not None else ""
            return f"{type(err).__name__}{status}: " + (str(err).strip().splitlines() or [""])[0][:200]
        return None
    """
)


def run_client(
    hub: LocalHub,
    work: Path,
    script: str,
    extra_env: dict[str, str] | None = None,
    token: str | None = TOKEN,
    timeout: float = 120,
) -> dict[str, Any]:
    """Run PRELUDE + script in a fresh interpreter pointed at ``hub``; return the JSON it printed last."""
    work.mkdir(parents=True, exist_ok=True)
    env = hub.client_env(hf_home=work / "hf_home", token=token)
    env.update(extra_env or {}, CLIENT_WORK=str(work))
    code = PRELUDE + textwrap.dedent(script) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=work, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"client failed:\n{proc.stderr[-4000:]}\nserver errors: {hub.server_errors}"
    assert token is None or token not in proc.stdout + proc.stderr, "the token was printed by the client"
    assert not hub.server_errors, hub.server_errors
    return json.loads(proc.stdout.strip().splitlines()[-1])


def new_repo(hub: LocalHub, repo_id: str) -> str:
    """Create a repo directly in the storage (no client round trip)."""
    hub.store.create("model", repo_id, private=False)
    return repo_id


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHub]:
    with LocalHub(root=tmp_path_factory.mktemp("hub")) as server:
        yield server


# ------------------------------------------------------------------------------------- publish and read


PUBLISH = """
    payload = bytes.fromhex(os.environ["BINARY_HEX"])
    folder = WORK / "folder"
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("step 0\\n")
    (folder / "sub" / "weights.bin").write_bytes(payload)
    repo = "local-user/publish-demo"
    out["whoami"] = api.whoami()["name"]
    out["repo_url"] = str(api.create_repo(repo))
    out["exist_ok"] = str(api.create_repo(repo, exist_ok=True))
    out["create_again"] = error_name(lambda: api.create_repo(repo))
    main = api.upload_folder(repo_id=repo, folder_path=folder, commit_message="first upload")
    out["main_sha"] = main.oid
    api.create_branch(repo, branch="step-1000")
    branch = api.upload_file(path_or_fileobj=b"step 1000\\n", path_in_repo="notes.txt", repo_id=repo,
                             revision="step-1000", commit_message="checkpoint 1000")
    out["branch_sha"] = branch.oid
    api.create_tag(repo, tag="v1.0", revision="step-1000")
    out["files"] = {rev: Path(hf_hub_download(repo, "notes.txt", revision=rev)).read_text()
                    for rev in ("main", "step-1000", "v1.0", main.oid)}
    out["binary_ok"] = Path(hf_hub_download(repo, "sub/weights.bin")).read_bytes() == payload
    snap = Path(snapshot_download(repo, revision="step-1000"))
    out["snapshot"] = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())
    out["snapshot_notes"] = (snap / "notes.txt").read_text()
    info = api.model_info(repo, files_metadata=True)
    out["info"] = {"id": info.id, "sha": info.sha, "private": info.private,
                   "siblings": {s.rfilename: [s.size, s.blob_id] for s in info.siblings}}
    out["info_branch_sha"] = api.model_info(repo, revision="step-1000").sha
    refs = api.list_repo_refs(repo)
    out["branches"] = {r.name: r.target_commit for r in refs.branches}
    out["tags"] = {r.name: r.target_commit for r in refs.tags}
    out["commits"] = [c.title for c in api.list_repo_commits(repo, revision="step-1000")]
    out["list_files"] = api.list_repo_files(repo, revision="v1.0")
    out["file_exists"] = [api.file_exists(repo, "sub/weights.bin"), api.file_exists(repo, "nope.txt")]
    out["unchanged_sha"] = api.upload_folder(repo_id=repo, folder_path=folder).oid
"""


@pytest.fixture(scope="module")
def published(hub: LocalHub, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One client session publishes a repo and reads it back in every way; the tests check pieces of it."""
    first = len(hub.requests)
    out = run_client(hub, tmp_path_factory.mktemp("publish"), PUBLISH, {"BINARY_HEX": BINARY.hex()})
    out["requests"] = hub.requests[first:]
    return out


def test_create_repo(published: dict[str, Any], hub: LocalHub) -> None:
    assert published["whoami"] == "local-user"
    assert published["repo_url"] == f"{hub.endpoint}/local-user/publish-demo"
    assert published["exist_ok"] == published["repo_url"]
    assert published["create_again"].startswith("HfHubHTTPError 409")


def test_upload_folder_stores_text_and_binary_files(published: dict[str, Any], hub: LocalHub) -> None:
    files = hub.repo_files("local-user/publish-demo")
    assert set(files) == {".gitattributes", "notes.txt", "sub/weights.bin"}
    assert files["notes.txt"] == b"step 0\n"
    assert files["sub/weights.bin"] == BINARY
    assert hub.history("local-user/publish-demo")[0] == published["main_sha"]
    assert len(published["main_sha"]) == 40


def test_branch_and_tag(published: dict[str, Any], hub: LocalHub) -> None:
    assert hub.repo_files("local-user/publish-demo", revision="step-1000")["notes.txt"] == b"step 1000\n"
    assert hub.repo_files("local-user/publish-demo", revision="v1.0")["notes.txt"] == b"step 1000\n"
    refs = hub.refs("local-user/publish-demo")
    assert refs["heads"] == {"main": published["main_sha"], "step-1000": published["branch_sha"]}
    assert refs["tags"] == {"v1.0": published["branch_sha"]}
    assert published["commits"] == ["checkpoint 1000", "first upload", "initial commit"]


def test_hf_hub_download_by_branch_tag_and_sha(published: dict[str, Any]) -> None:
    main_sha = published["main_sha"]
    expected = {"main": "step 0\n", "step-1000": "step 1000\n", "v1.0": "step 1000\n", main_sha: "step 0\n"}
    assert published["files"] == expected
    assert published["binary_ok"]


def test_snapshot_download(published: dict[str, Any]) -> None:
    assert published["snapshot"] == [".gitattributes", "notes.txt", "sub/weights.bin"]
    assert published["snapshot_notes"] == "step 1000\n"


def test_model_info_siblings(published: dict[str, Any]) -> None:
    info = published["info"]
    assert info["id"] == "local-user/publish-demo" and info["sha"] == published["main_sha"]
    assert info["private"] is False
    assert set(info["siblings"]) == {".gitattributes", "notes.txt", "sub/weights.bin"}
    assert info["siblings"]["sub/weights.bin"][0] == len(BINARY)
    assert published["info_branch_sha"] == published["branch_sha"]
    assert published["list_files"] == [".gitattributes", "notes.txt", "sub/weights.bin"]
    assert published["file_exists"] == [True, False]


def test_list_repo_refs(published: dict[str, Any]) -> None:
    assert published["branches"] == {"main": published["main_sha"], "step-1000": published["branch_sha"]}
    assert published["tags"] == {"v1.0": published["branch_sha"]}


def test_unchanged_upload_makes_no_commit(published: dict[str, Any]) -> None:
    # preupload answers each file's remote blob id, so the client sees nothing changed and skips the commit
    assert published["unchanged_sha"] == published["main_sha"]


def test_every_request_carries_the_token(published: dict[str, Any]) -> None:
    requests = published["requests"]
    assert len(requests) > 20
    assert {headers.get("authorization") for _, _, headers in requests} == {f"Bearer {TOKEN}"}
    endpoints = {(method, path.split("?")[0].split("/")[-2]) for method, path, _ in requests}
    assert ("POST", "commit") in endpoints and ("POST", "preupload") in endpoints


def test_server_logs_nothing(hub: LocalHub, capfd: pytest.CaptureFixture) -> None:
    """Good requests, errors and unknown routes: nothing reaches stdout/stderr, so no token can leak there."""
    for path in ("/api/whoami-v2", "/api/models/local-user/missing", "/api/no/such/route"):
        request = urllib.request.Request(hub.endpoint + path, headers={"Authorization": f"Bearer {TOKEN}"})
        with contextlib.nullcontext() if "whoami" in path else pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=10).read()
    assert hub.requests[-1][2]["authorization"] == f"Bearer {TOKEN}"
    assert hub.unhandled[-1] == ("GET", "/api/no/such/route")
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


# ------------------------------------------------------------------------------------------------ errors


ERRORS = """
    repo, missing = "local-user/errors-demo", "local-user/does-not-exist"
    good_card = b"---\\nlicense: apache-2.0\\ntags: [bert]\\n---\\n# Card\\n"
    bad_card = b"---\\nlicense: [unclosed\\n---\\n# Card\\n"
    api.create_repo(repo)
    out["missing_repo"] = error_name(lambda: api.model_info(missing))
    out["missing_repo_download"] = error_name(lambda: hf_hub_download(missing, "config.json"))
    out["missing_revision"] = error_name(lambda: hf_hub_download(repo, ".gitattributes", revision="nope"))
    out["missing_file"] = error_name(lambda: hf_hub_download(repo, "missing.txt"))
    out["upload_to_missing_repo"] = error_name(
        lambda: api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=missing))
    out["stale_parent"] = error_name(lambda: api.upload_file(
        path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo, parent_commit="0" * 40))
    out["good_card"] = api.upload_file(path_or_fileobj=good_card, path_in_repo="README.md", repo_id=repo).oid
    out["bad_card"] = error_name(
        lambda: api.upload_file(path_or_fileobj=bad_card, path_in_repo="README.md", repo_id=repo))
    out["card_tags"] = api.model_info(repo).tags
    out["delete_missing_file"] = error_name(lambda: api.delete_file("nope.txt", repo_id=repo))
    api.delete_repo(repo)
    out["deleted"] = api.repo_exists(repo)
"""


def test_client_errors_are_mapped(hub: LocalHub, tmp_path: Path) -> None:
    out = run_client(hub, tmp_path, ERRORS)
    assert out["missing_repo"].startswith("RepositoryNotFoundError 404")
    assert out["missing_repo_download"].startswith("RepositoryNotFoundError 404")
    assert out["missing_revision"].startswith("RevisionNotFoundError 404")
    assert out["missing_file"].startswith("RemoteEntryNotFoundError 404")
    assert out["upload_to_missing_repo"].startswith("RepositoryNotFoundError 404")
    assert out["stale_parent"].startswith("HfHubHTTPError 412")
    assert len(out["good_card"]) == 40
    assert out["bad_card"].startswith("ValueError: Invalid metadata in README.md")
    assert "bert" in out["card_tags"]
    assert out["delete_missing_file"].startswith("RemoteEntryNotFoundError 404")
    assert out["deleted"] is False


# ------------------------------------------------------------------------------------- failure injection


PUSH_TWICE = """
    from huggingface_hub import CommitOperationAdd

    def push():
        operations = [CommitOperationAdd(f"part-{i}.txt", f"{i}".encode()) for i in range(3)]
        api.create_commit(os.environ["REPO"], operations, commit_message="push")

    out["first"] = error_name(push)
    out["second"] = error_name(push)
"""


@pytest.mark.parametrize("mode", ["500", "drop"])
def test_failed_commit_changes_nothing_and_a_second_push_completes(hub: LocalHub, tmp_path: Path, mode: str) -> None:
    repo = new_repo(hub, f"local-user/fail-{mode}")
    before = hub.history(repo)
    hub.fail_next("commit", mode)
    out = run_client(hub, tmp_path, PUSH_TWICE, {"REPO": repo})
    expected = "HfHubHTTPError 500" if mode == "500" else "RemoteProtocolError"  # create_commit: no retry
    assert out["first"] is not None and out["first"].startswith(expected), out["first"]
    assert out["second"] is None
    assert hub.history(repo)[1:] == before  # exactly one new commit: the failed push left no trace
    files = hub.repo_files(repo)
    assert {k: v for k, v in files.items() if k != ".gitattributes"} == {
        "part-0.txt": b"0",
        "part-1.txt": b"1",
        "part-2.txt": b"2",
    }
    assert hub.pending_failures() == 0


UPLOAD_FOLDER = """
    folder = WORK / "folder"
    folder.mkdir(exist_ok=True)
    (folder / "a.txt").write_text("retried")
    out["oid"] = api.upload_folder(repo_id=os.environ["REPO"], folder_path=folder).oid
"""


def test_upload_folder_retries_a_failed_commit(hub: LocalHub, tmp_path: Path) -> None:
    """upload_folder (the Xet pipeline of huggingface_hub 2.x) retries a commit after a 500: no error."""
    repo = new_repo(hub, "local-user/retried")
    hub.fail_next("commit", "500")
    first = len(hub.requests)
    out = run_client(hub, tmp_path, UPLOAD_FOLDER, {"REPO": repo})
    commits = [path for method, path, _ in hub.requests[first:] if method == "POST" and "/commit/" in path]
    assert len(commits) == 2
    assert hub.history(repo)[0] == out["oid"]
    assert hub.repo_files(repo)["a.txt"] == b"retried"


def test_fail_next_other_request_kinds(hub: LocalHub, tmp_path: Path) -> None:
    hub.fail_next("create_repo", "503")
    hub.fail_next("resolve_get", "500")
    hub.fail_next("resolve_get", "drop")
    first = len(hub.requests)
    out = run_client(
        hub,
        tmp_path,
        """
        out["create_1"] = error_name(lambda: api.create_repo("local-user/flaky"))
        out["create_2"] = error_name(lambda: api.create_repo("local-user/flaky"))
        api.upload_file(path_or_fileobj=b"data", path_in_repo="d.txt", repo_id="local-user/flaky")
        out["download_1"] = error_name(lambda: hf_hub_download("local-user/flaky", "d.txt"))
        out["download_2"] = Path(hf_hub_download("local-user/flaky", "d.txt")).read_text()
    """,
    )
    assert out["create_1"].startswith("HfHubHTTPError 503")
    assert out["create_2"] is None
    assert out["download_1"].startswith("HfHubHTTPError 500")  # a file GET is not retried on a 5xx...
    assert out["download_2"] == "data"  # ...but it is retried after a dropped connection
    gets = [path for method, path, _ in hub.requests[first:] if method == "GET" and path.endswith("/d.txt")]
    assert len(gets) == 3
    assert hub.pending_failures() == 0
    with pytest.raises(ValueError):
        hub.fail_next("no-such-kind")


# --------------------------------------------------------------------------------- auth and in-process


def test_token_private_repos_and_in_process_patch(tmp_path: Path) -> None:
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    endpoint_before, offline_before = constants.ENDPOINT, constants.HF_HUB_OFFLINE
    with LocalHub(root=tmp_path / "hub", token="right-token") as hub, hub.patch_client(tmp_path / "hf_home"):
        api = HfApi(token="right-token")
        api.create_repo("local-user/secret", private=True)
        api.upload_file(path_or_fileobj=b"s3cret", path_in_repo="s.txt", repo_id="local-user/secret")
        downloaded = hf_hub_download("local-user/secret", "s.txt", token="right-token")
        assert Path(downloaded).read_bytes() == b"s3cret"
        assert downloaded.startswith(str(tmp_path / "hf_home"))
        assert api.model_info("local-user/secret").private is True
        with pytest.raises(HfHubHTTPError) as wrong:
            HfApi(token="wrong-token").whoami()
        assert wrong.value.response.status_code == 401
        anonymous = HfApi(token=False)
        with pytest.raises(RepositoryNotFoundError):
            anonymous.model_info("local-user/secret")
        with pytest.raises(RepositoryNotFoundError):
            anonymous.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="local-user/secret")
    assert (constants.ENDPOINT, constants.HF_HUB_OFFLINE) == (endpoint_before, offline_before)


# -------------------------------------------------------------------------------- transformers round trip


LOAD_MODEL = """
    import torch, transformers
    model = transformers.AutoModel.from_pretrained(os.environ["REPO"])
    torch.save({"weight": model.embeddings.word_embeddings.weight.detach().clone()}, WORK / "loaded.pt")
    out["class"] = type(model).__name__
"""


def test_transformers_round_trip(hub: LocalHub, tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
    )
    model = BertModel(config)
    model.save_pretrained(tmp_path / "saved")
    env = {"REPO": "local-user/tiny-bert", "SAVED": str(tmp_path / "saved")}
    run_client(
        hub,
        tmp_path / "upload",
        """
        api.create_repo(os.environ["REPO"])
        api.upload_folder(repo_id=os.environ["REPO"], folder_path=os.environ["SAVED"])
    """,
        env,
    )
    first = len(hub.requests)
    out = run_client(hub, tmp_path / "load", LOAD_MODEL, env)
    assert out["class"] == "BertModel"
    stored = hub.repo_files("local-user/tiny-bert")["model.safetensors"]
    assert stored == (tmp_path / "saved" / "model.safetensors").read_bytes()
    loaded = torch.load(tmp_path / "load" / "loaded.pt", weights_only=True)
    assert torch.equal(loaded["weight"], model.embeddings.word_embeddings.weight.detach())
    downloads = [path for method, path, _ in hub.requests[first:] if method == "GET" and "/resolve/" in path]
    assert any(path.endswith("/model.safetensors") for path in downloads)


def test_the_server_runs_by_hand_with_python_m(tmp_path):
    # `python -m tests.hub_server`: a user tries a push offline (its first lines say how), Ctrl-C stops it.
    import signal

    root = ROOT
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.hub_server", "--root", str(tmp_path / "repos")],
        cwd=root,
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
