"""A small local stand-in for the Hugging Face Hub HTTP API, for tests that drive the real client.

What it is
----------
An HTTP server (``http.server.ThreadingHTTPServer`` in a background thread, bound to 127.0.0.1 on a free
port, standard library only) that speaks the part of the Hub API that ``huggingface_hub`` 2.4 uses for
model repositories, so that ``create_repo``, ``upload_folder``, ``upload_file``, ``create_commit``,
``create_branch``, ``create_tag``, ``hf_hub_download``, ``snapshot_download``, ``model_info``,
``list_repo_files``, ``list_repo_refs``, ``list_repo_commits``, ``push_to_hub`` and
``transformers.AutoModel.from_pretrained(repo_id)`` run for real against it, with no mock of any client
function. The request paths, headers and JSON shapes were taken from the installed client's source
(``hf_api.py``, ``_commit_api.py``, ``_upload_pipeline.py``, ``file_download.py``, ``utils/_http.py``).

Storage is real content in a directory (``hub.root``)::

    <root>/<models|datasets|spaces>/<namespace>/<name>/
        repo.json                      # visibility, creation date, refs: branches, tags, pull requests
        commits/<40-hex sha>/commit.json   # parents, title, message, date, authors, {path: oid, size}
        commits/<40-hex sha>/files/...     # the full snapshot of the repo at that commit

Every commit is a complete snapshot; branches, tags and ``refs/pr/N`` are refs to commit ids, and any of
them (or a full or abbreviated commit id) works as a ``revision``. File ids are git blob ids, so the
client's "file unchanged" detection works as against the Hub. A new repo starts, as on the Hub, with an
"initial commit" by "system" holding a ``.gitattributes`` file.

Endpoints (``{repo}`` is ``{models|datasets|spaces}/{namespace}/{name}``):

* ``GET /api/whoami-v2``: a fake user (``hub.user``) for any valid bearer token (see Auth); 401 without.
* ``GET /api/agent-harnesses``: an empty registry (the client asks for it when telemetry is on).
* ``POST /api/repos/create`` (409 if it exists; the client turns that into success with ``exist_ok``),
  ``DELETE /api/repos/delete``.
* ``GET /api/{repo}`` and ``/api/{repo}/revision/{rev}``: repo info (id, sha, private, siblings, lastModified,
  createdAt, tags, cardData and library_name from the README front matter, config from config.json).
* ``GET /api/{repo}/tree/{rev}[/{path}]`` (``recursive``, ``expand``), ``POST /api/{repo}/paths-info/{rev}``,
  ``GET /api/{repo}/refs``, ``GET /api/{repo}/commits/{rev}``.
* ``POST /api/{repo}/preupload/{rev}``: answers ``uploadMode: "regular"`` for every file, with the remote
  blob id as ``oid`` (so unchanged files are skipped by the client).
* ``POST /api/{repo}/commit/{rev}``: NDJSON (header + ``file`` / ``deletedFile`` / ``deletedFolder`` lines,
  base64 content), ``parentCommit`` (412 if the branch moved), ``?create_pr=1`` (new ``refs/pr/N``).
* ``POST|DELETE /api/{repo}/branch/{branch}`` (``startingPoint``), ``POST /api/{repo}/tag/{rev}``,
  ``DELETE /api/{repo}/tag/{tag}``.
* ``POST /api/{repo}/discussions`` (pull requests only get a ref) and ``GET /api/{repo}/discussions/{num}``,
  enough for ``upload_folder(create_pr=True)``.
* ``HEAD|GET /[datasets/|spaces/]{namespace}/{name}/resolve/{rev}/{path}``: served directly (no redirect),
  with ``ETag`` (git blob id), ``X-Repo-Commit``, ``Content-Length`` and ``Range`` support.
* ``POST /api/validate-yaml``: parses the README front matter (with PyYAML, a dependency of
  huggingface_hub itself; without it only the ``---`` fences are checked) and answers 400 with
  ``{"errors": [{"message": ...}]}`` when it is not a YAML mapping.

Errors carry the ``X-Error-Code`` header the client maps to its exceptions: ``RepoNotFound`` ->
``RepositoryNotFoundError``, ``RevisionNotFound`` -> ``RevisionNotFoundError``, ``EntryNotFound`` ->
``RemoteEntryNotFoundError`` (an ``EntryNotFoundError``). Unknown routes answer 404 without a code and are
listed in ``hub.unhandled``.

What it does not do
-------------------
No Git LFS and no Xet storage (preupload never answers "lfs", so neither protocol is ever used: even
binary and large files travel base64-encoded inside the commit call), no git protocol (clone/push over
``.git``), no pagination (one page holds everything), no ``.gitignore`` evaluation (``shouldIgnore`` is
always false), no merging of pull requests, no Spaces runtime, no per-namespace permissions (any valid
token may write anywhere), and no single-segment legacy repo ids (``gpt2``).

Auth: with ``LocalHub(token=None)`` (the default) any bearer token is valid. With ``LocalHub(token="x")``
a different bearer token gets 401 "Invalid credentials in Authorization header". Writes need a valid
token; private repos are invisible (404 RepoNotFound) without one. Every request is recorded in
``hub.requests`` as ``(method, path_with_query, headers)`` with lower-cased header names, so a test can
check the ``authorization`` header; the server writes no log lines at all (the token is never printed).

Failure injection
-----------------
``hub.fail_next(kind="commit", mode="500", times=1)`` makes the next ``times`` requests of that kind fail
(calls queue up in order). Kinds: ``commit``, ``preupload``, ``create_repo``, ``delete_repo``,
``repo_info``, ``tree``, ``paths_info``, ``refs``, ``commits``, ``branch``, ``tag``, ``discussion``,
``validate_yaml``, ``whoami``, ``agent_harnesses``, ``resolve`` (HEAD and GET of files), ``resolve_head``,
``resolve_get``, or ``any``. Modes: ``"500"`` or any other 4xx/5xx status (the body is read, nothing is
applied, ``{"error": ...}`` is returned) and ``"drop"`` (half of the request body is read, then the
connection is closed without a response: the client reports "Server disconnected without sending a
response", an ``httpx2.RemoteProtocolError``). A failed request changes nothing. ``hub.pending_failures()``
tells how many injected failures are still armed.

Mind the client's own retries (``http_backoff``: 1, 2, 4, 8, 8 s, on 408/429/5xx and dropped connections):
``preupload`` and tree listings always retry, and in huggingface_hub 2.x so do the commits of
``upload_folder`` (with hf_xet installed it goes through a multi-commit pipeline that posts each commit with
backoff); ``create_commit``, ``upload_file`` and ``push_to_hub`` post the commit once. A file GET is retried
after a dropped connection but not after a 5xx. So one injected 500 on an ``upload_folder`` commit is
absorbed after a second; to make that push fail fast, inject a status the client does not retry
(``"400"``, ``"403"``), or ``times=6`` of ``"500"`` (about 23 s of client back-off).

By hand
-------
To try a push offline, start it in one shell (it stays up until Ctrl-C)::

    python -m tests.hub_server [--root DIR] [--port N]

and set the environment it prints in another (``HF_ENDPOINT``, ``HF_HUB_OFFLINE=0``, a token), then push as
against the Hub: ``python -m bert_repro.hub runs/mrpc --repo_id local-user/bert-mrpc``. Without ``--root`` the
repos live in a temporary directory, deleted when the server stops.

How to use it
-------------
huggingface_hub reads ``HF_ENDPOINT`` when it is imported (and tests/conftest.py puts this process in
offline mode), so run client code in a subprocess::

    from hub_server import LocalHub

    with LocalHub() as hub:
        env = hub.client_env(hf_home=tmp_path / "hf_home", token="hf_test_token")
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        assert hub.repo_files("local-user/tiny")["config.json"].startswith(b"{")

``client_env`` returns ``os.environ`` plus ``HF_ENDPOINT=hub.endpoint``, ``HF_TOKEN``, ``HF_HUB_OFFLINE=0``,
``TRANSFORMERS_OFFLINE=0``, ``HF_HUB_DISABLE_TELEMETRY=1``, ``HF_HUB_DISABLE_PROGRESS_BARS=1`` and
``HF_HOME`` (a fresh cache: nothing from the real cache leaks in), without any other HF token variable.
The pytest fixture ``local_hub`` (tests/conftest.py) yields a started ``LocalHub`` storing under
``tmp_path / "hub"``.

Inspection: ``hub.repo_files(repo_id, revision="main")`` -> ``{path: bytes}`` (``.gitattributes`` included),
``hub.history(repo_id, revision)`` -> commit ids newest first, ``hub.refs(repo_id)``,
``hub.authorization_headers()``, ``hub.unhandled`` (requests no route matched) and ``hub.server_errors``
(tracebacks of bugs in this server, answered as 500).

In-process use is possible but second best: ``with hub.patch_client(hf_home): ...`` rewrites
``huggingface_hub.constants.ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``, ``HF_URL_HOSTS``, ``HF_HUB_OFFLINE``,
``HF_HUB_CACHE`` and ``HF_HUB_DISABLE_TELEMETRY``, the endpoint of the module-level ``HfApi`` behind
``huggingface_hub.upload_folder`` & co., and drops transformers' cached ``HfApi``; all is restored on exit.
It works for the calls this module's tests make (HfApi methods, ``hf_hub_download``, and, tried by hand,
``from_pretrained`` / ``push_to_hub``), but anything that copied the endpoint at import time elsewhere is
not redirected, so prefer the subprocess.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

DEFAULT_USER = "local-user"
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
REF_NAME_RE = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._/-]{0,199}$")
SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")
PR_REF_RE = re.compile(r"^refs/pr/(\d+)$")
FAILURE_KINDS = {
    "commit",
    "preupload",
    "create_repo",
    "delete_repo",
    "repo_info",
    "tree",
    "paths_info",
    "refs",
    "commits",
    "branch",
    "tag",
    "discussion",
    "validate_yaml",
    "whoami",
    "resolve",
    "resolve_head",
    "resolve_get",
    "agent_harnesses",
    "any",
}
# The start of the file the Hub puts in every new repo.
GITATTRIBUTES = (
    "*.7z filter=lfs diff=lfs merge=lfs -text\n"
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.ckpt filter=lfs diff=lfs merge=lfs -text\n"
    "*.h5 filter=lfs diff=lfs merge=lfs -text\n"
    "*.msgpack filter=lfs diff=lfs merge=lfs -text\n"
    "*.npy filter=lfs diff=lfs merge=lfs -text\n"
    "*.onnx filter=lfs diff=lfs merge=lfs -text\n"
    "*.pt filter=lfs diff=lfs merge=lfs -text\n"
    "*.pth filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.tar.* filter=lfs diff=lfs merge=lfs -text\n"
    "*.zip filter=lfs diff=lfs merge=lfs -text\n"
    "*tfevents* filter=lfs diff=lfs merge=lfs -text\n"
)


class HubError(Exception):
    """An API error: HTTP status, message, and the X-Error-Code the client maps to an exception."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def git_blob_oid(data: bytes) -> str:
    """The git blob id of ``data`` (what the Hub reports as a regular file's oid and ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def safe_repo_path(path: str) -> str:
    """Validate a path inside a repo; raise 400 on anything that could escape the snapshot."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == ".git":
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


def check_no_file_folder_clash(paths: Iterable[str]) -> None:
    """A path cannot be both a file and a folder ("a" and "a/b") in one snapshot."""
    paths = set(paths)
    folders = {path.rsplit("/", 1)[0] for path in paths if "/" in path}
    folders |= {folder.rsplit("/", i)[0] for folder in folders for i in range(1, folder.count("/") + 1)}
    clash = sorted(paths & folders)
    if clash:
        raise HubError(400, f"Path is both a file and a folder: {clash[0]}")


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (temp file + rename), so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------- storage


@dataclass
class Commit:
    id: str
    parents: list[str]
    title: str
    message: str
    date: str
    authors: list[str]
    files: dict[str, dict[str, Any]]  # path -> {"oid": git blob id, "size": bytes}

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class Repo:
    """One repository: its metadata and refs in ``repo.json``, its commits as snapshot directories."""

    dir: Path
    repo_id: str
    repo_type: str
    meta: dict[str, Any] = field(default_factory=dict)

    # -- metadata and refs
    def load(self) -> Repo:
        self.meta = json.loads((self.dir / "repo.json").read_text())
        return self

    def save(self) -> None:
        write_json(self.dir / "repo.json", self.meta)

    @property
    def private(self) -> bool:
        return bool(self.meta.get("private"))

    def branches(self) -> dict[str, str]:
        return self.meta["refs"]["heads"]

    def tags(self) -> dict[str, str]:
        return self.meta["refs"]["tags"]

    def pulls(self) -> dict[str, str]:
        return self.meta["refs"]["pulls"]

    # -- commits
    def commit(self, sha: str) -> Commit:
        return Commit(**json.loads((self.dir / "commits" / sha / "commit.json").read_text()))

    def has_commit(self, sha: str) -> bool:
        return (self.dir / "commits" / sha / "commit.json").is_file()

    def read_file(self, sha: str, path: str) -> bytes:
        return (self.dir / "commits" / sha / "files" / path).read_bytes()

    def resolve(self, revision: str | None) -> str:
        """Branch, tag, ``refs/heads|tags/x``, ``refs/pr/N`` or (abbreviated) commit id -> commit id."""
        rev = revision or self.meta["default_branch"]
        for prefix, refs in (
            ("", self.branches()),
            ("", self.tags()),
            ("refs/heads/", self.branches()),
            ("refs/tags/", self.tags()),
        ):
            if rev.startswith(prefix) and rev[len(prefix) :] in refs:
                return refs[rev[len(prefix) :]]
        match = PR_REF_RE.match(rev)
        if match and match.group(1) in self.pulls():
            return self.pulls()[match.group(1)]
        if SHA_RE.match(rev):
            found = [p.name for p in (self.dir / "commits").iterdir() if p.name.startswith(rev)]
            if len(found) == 1 and self.has_commit(found[0]):
                return found[0]
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def write_commit(
        self, parent: str | None, files: dict[str, bytes | None], title: str, message: str, authors: list[str]
    ) -> str:
        """A snapshot of the parent's files with ``files`` applied (bytes: add/replace, None: delete)."""
        base = self.commit(parent).files if parent else {}
        manifest = {path: info for path, info in base.items() if path not in files or files[path] is not None}
        for path, data in files.items():
            if data is not None:
                manifest[path] = {"oid": git_blob_oid(data), "size": len(data)}
        check_no_file_folder_clash(manifest)
        date = now_iso()
        seed = json.dumps([parent, sorted(manifest.items()), title, message, date, uuid.uuid4().hex])
        sha = hashlib.sha1(seed.encode()).hexdigest()
        staging = self.dir / "commits" / f".{sha}.tmp"
        for path in manifest:
            target = staging / "files" / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if files.get(path) is not None:
                target.write_bytes(files[path])  # type: ignore[arg-type]
            else:
                shutil.copyfile(self.dir / "commits" / str(parent) / "files" / path, target)
        commit = Commit(sha, [parent] if parent else [], title, message, date, authors, manifest)
        staging.mkdir(parents=True, exist_ok=True)
        write_json(staging / "commit.json", commit.as_json())
        os.replace(staging, self.dir / "commits" / sha)
        return sha

    def history(self, sha: str) -> list[Commit]:
        """The commit and its ancestors, newest first (first-parent chain)."""
        out = []
        cursor: str | None = sha
        while cursor:
            commit = self.commit(cursor)
            out.append(commit)
            cursor = commit.parents[0] if commit.parents else None
        return out

    def last_commit_touching(self, sha: str, path: str) -> Commit:
        """The newest commit in the history of ``sha`` that changed ``path`` (a file or a folder)."""
        history = self.history(sha)

        def state(commit: Commit) -> list:
            inside = (p for p in commit.files if p == path or p.startswith(path + "/"))
            return sorted((p, commit.files[p]["oid"]) for p in inside)

        current = state(history[0])
        for older, newer in zip(history[1:], history):
            if state(older) != current:
                return newer
        return history[-1]


class Store:
    """All repositories under a root directory; one lock serialises every read-modify-write."""

    def __init__(self, root: Path):
        self.root = root
        self.lock = threading.RLock()

    def repo_dir(self, repo_type: str, repo_id: str) -> Path:
        parts = repo_id.split("/")
        if repo_type not in URL_PREFIX or len(parts) != 2 or not all(NAME_RE.match(p) for p in parts):
            raise HubError(404, "Repository not found", "RepoNotFound")  # also keeps paths inside the root
        return self.root / f"{repo_type}s" / repo_id

    def get(self, repo_type: str, repo_id: str) -> Repo:
        directory = self.repo_dir(repo_type, repo_id)
        if not (directory / "repo.json").is_file():
            raise HubError(404, "Repository not found", "RepoNotFound")
        return Repo(directory, repo_id, repo_type).load()

    def create(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        directory = self.repo_dir(repo_type, repo_id)
        if (directory / "repo.json").is_file():
            raise HubError(409, f"You already created this {repo_type} repo")
        (directory / "commits").mkdir(parents=True, exist_ok=True)
        repo = Repo(directory, repo_id, repo_type)
        repo.meta = {
            "id": repo_id,
            "type": repo_type,
            "private": private,
            "createdAt": now_iso(),
            "default_branch": "main",
            "refs": {"heads": {}, "tags": {}, "pulls": {}},
            "discussions": {},
        }
        initial = {".gitattributes": GITATTRIBUTES.encode()}
        sha = repo.write_commit(None, initial, "initial commit", "", ["system"])
        repo.branches()["main"] = sha
        repo.save()
        return repo

    def delete(self, repo_type: str, repo_id: str) -> None:
        self.get(repo_type, repo_id)
        shutil.rmtree(self.repo_dir(repo_type, repo_id))


# ------------------------------------------------------------------------------------------- requests


@dataclass
class Request:
    method: str
    path: str  # raw path, without the query string
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    params: dict[str, str]  # unquoted named groups of the route

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err

    def flag(self, name: str) -> bool:
        return self.query.get(name, [""])[-1].lower() in ("1", "true")

    @property
    def bearer(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_json(cls, data: Any, status: int = 200, headers: dict | None = None) -> Response:
        return cls(status, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})


@dataclass
class Route:
    methods: tuple[str, ...]
    pattern: re.Pattern
    kinds: frozenset[str]
    handler: Callable[[LocalHub, Request], Response]


@dataclass
class Failure:
    kind: str
    mode: str
    times: int


REPO_RE = r"(?P<type>models|datasets|spaces)/(?P<ns>[^/]+)/(?P<name>[^/]+)"
ROUTES: list[Route] = []


def route(methods: str, pattern: str, *kinds: str) -> Callable:
    def register(handler: Callable[[LocalHub, Request], Response]) -> Callable:
        ROUTES.append(Route(tuple(methods.split("|")), re.compile(f"^{pattern}$"), frozenset(kinds), handler))
        return handler

    return register


def repo_of(hub: LocalHub, req: Request, write: bool = False) -> Repo:
    """The repo named by the route, after the visibility and write checks."""
    repo_type = REPO_TYPES.get(req.params.get("type") or "models", "model")
    repo = hub.store.get(repo_type, f"{req.params['ns']}/{req.params['name']}")
    if (repo.private or write) and not hub.token_is_valid(req):
        if write and not repo.private:
            raise HubError(401, "You must be authenticated to write to this repo")
        raise HubError(404, "Repository not found", "RepoNotFound")
    return repo


def repo_url(hub: LocalHub, repo: Repo) -> str:
    return f"{hub.endpoint}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"


# -- account and repos


@route("GET", r"/api/whoami-v2", "whoami")
def h_whoami(hub: LocalHub, req: Request) -> Response:
    hub.require_token(req)
    return Response.of_json(
        {
            "type": "user",
            "id": hashlib.md5(hub.user.encode()).hexdigest()[:24],
            "name": hub.user,
            "fullname": "Local Test User",
            "email": f"{hub.user}@localhost",
            "emailVerified": True,
            "canPay": False,
            "isPro": False,
            "periodEnd": None,
            "avatarUrl": "",
            "orgs": [],
            "auth": {"type": "access_token", "accessToken": {"displayName": "local", "role": "write"}},
        }
    )


@route("GET", r"/api/agent-harnesses", "agent_harnesses")
def h_agent_harnesses(hub: LocalHub, req: Request) -> Response:
    """The registry the client fetches (unless telemetry is off) to name its user agent: empty here."""
    return Response.of_json({"standardEnvVars": [], "harnesses": {}})


@route("POST", r"/api/repos/create", "create_repo")
def h_create_repo(hub: LocalHub, req: Request) -> Response:
    hub.require_token(req)
    body = req.json()
    name, namespace = body.get("name") or "", body.get("organization") or hub.user
    repo_type = body.get("type") or "model"
    if repo_type not in URL_PREFIX:
        raise HubError(400, f"Invalid repo type: {repo_type}")
    if not NAME_RE.match(name) or "--" in name or ".." in name or not NAME_RE.match(namespace):
        raise HubError(400, f"Invalid repo name: {namespace}/{name}")
    private = body.get("visibility") == "private" or bool(body.get("private"))
    repo_id = f"{namespace}/{name}"
    try:
        repo = hub.store.create(repo_type, repo_id, private)
    except HubError as err:
        if err.status == 409:
            url = f"{hub.endpoint}/{URL_PREFIX[repo_type]}{repo_id}"
            return Response.of_json({"error": err.message, "url": url}, status=409)
        raise
    return Response.of_json({"url": repo_url(hub, repo), "name": repo_id, "id": uuid.uuid4().hex[:24]})


@route("DELETE", r"/api/repos/delete", "delete_repo")
def h_delete_repo(hub: LocalHub, req: Request) -> Response:
    hub.require_token(req)
    body = req.json()
    namespace = body.get("organization") or hub.user
    hub.store.delete(body.get("type") or "model", f"{namespace}/{body.get('name')}")
    return Response.of_json({})


@route("POST", r"/api/validate-yaml", "validate_yaml")
def h_validate_yaml(hub: LocalHub, req: Request) -> Response:
    content = req.json().get("content") or ""
    try:
        front_matter(content)
    except ValueError as err:
        return Response.of_json({"errors": [{"message": str(err)}], "warnings": []}, status=400)
    return Response.of_json({"errors": [], "warnings": []})


def front_matter(readme: str) -> dict[str, Any]:
    """The YAML metadata block of a model card ({} if there is none); ValueError if it is broken."""
    lines = readme.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    try:
        end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---")
    except StopIteration:
        raise ValueError("The metadata block is not closed by a '---' line") from None
    try:
        import yaml
    except ImportError:  # PyYAML ships with huggingface_hub; without it only the fences are checked
        return {}
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as err:
        raise ValueError(f"Invalid YAML in the metadata block: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"The metadata block must be a YAML mapping, not {type(data).__name__}")
    return data


# -- repo info, tree, refs, history


@route("GET", rf"/api/{REPO_RE}(?:/revision/(?P<rev>[^/]+))?", "repo_info")
def h_repo_info(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)
    sha = repo.resolve(req.params.get("rev"))
    commit = repo.commit(sha)
    with_blobs = req.flag("blobs")
    siblings = []
    for path, info in sorted(commit.files.items()):
        sibling: dict[str, Any] = {"rfilename": path}
        if with_blobs:
            sibling.update(size=info["size"], blobId=info["oid"])
        siblings.append(sibling)
    card, config = card_and_config(repo, commit)
    library = card.get("library_name") or ("transformers" if config.get("model_type") else None)
    has_safetensors = any(p.endswith(".safetensors") for p in commit.files)
    card_tags = card.get("tags")
    tags = [str(t) for t in card_tags] if isinstance(card_tags, list) else []
    for tag in (library, "safetensors" if has_safetensors else None, config.get("model_type")):
        if tag and tag not in tags:
            tags.append(tag)
    namespace = repo.repo_id.split("/")[0]
    return Response.of_json(
        {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": namespace,
            "sha": sha,
            "lastModified": commit.date,
            "createdAt": repo.meta["createdAt"],
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": tags,
            "library_name": library,
            "pipeline_tag": card.get("pipeline_tag"),
            "cardData": card or None,
            "config": config or None,
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(i["size"] for i in commit.files.values()),
        }
    )


def card_and_config(repo: Repo, commit: Commit) -> tuple[dict[str, Any], dict[str, Any]]:
    """README front matter and the Hub-visible part of config.json (both {} when absent or unreadable)."""
    card: dict[str, Any] = {}
    config: dict[str, Any] = {}
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        if "README.md" in commit.files:
            card = front_matter(repo.read_file(commit.id, "README.md").decode())
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        if "config.json" in commit.files:
            raw = json.loads(repo.read_file(commit.id, "config.json"))
            config = {k: raw[k] for k in ("architectures", "model_type", "auto_map") if k in raw}
    return card, config


def tree_entries(repo: Repo, sha: str, prefix: str, recursive: bool, expand: bool) -> list[dict[str, Any]]:
    """Files and folders under ``prefix`` ("" for the root), like the Hub's tree listing."""
    files = repo.commit(sha).files
    base = prefix + "/" if prefix else ""
    entries: dict[str, dict[str, Any]] = {}
    for path, info in sorted(files.items()):
        if not path.startswith(base):
            continue
        parts = path[len(base) :].split("/")
        for depth in range(1, len(parts)):
            folder = base + "/".join(parts[:depth])
            if folder not in entries and (recursive or depth == 1):
                entries[folder] = folder_entry(files, folder)
        if recursive or len(parts) == 1:
            entries[path] = {"type": "file", "oid": info["oid"], "size": info["size"], "path": path}
    if expand:
        for entry in entries.values():
            last = repo.last_commit_touching(sha, entry["path"])
            entry["lastCommit"] = {"id": last.id, "title": last.title, "date": last.date}
    return sorted(entries.values(), key=lambda e: (e["type"] != "directory", e["path"]))


def folder_entry(files: dict[str, dict[str, Any]], folder: str) -> dict[str, Any]:
    listing = sorted((p, i["oid"]) for p, i in files.items() if p.startswith(folder + "/"))
    oid = hashlib.sha1(json.dumps(listing).encode()).hexdigest()
    return {"type": "directory", "oid": oid, "size": 0, "path": folder}


@route("GET", rf"/api/{REPO_RE}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", "tree")
def h_tree(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)
    sha = repo.resolve(req.params["rev"])
    prefix = (req.params.get("path") or "").strip("/")
    files = repo.commit(sha).files
    if prefix and not any(p.startswith(prefix + "/") for p in files):
        raise HubError(404, f"{prefix} does not exist or is not a folder", "EntryNotFound")
    return Response.of_json(tree_entries(repo, sha, prefix, req.flag("recursive"), req.flag("expand")))


@route("POST", rf"/api/{REPO_RE}/paths-info/(?P<rev>[^/]+)", "paths_info")
def h_paths_info(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)
    sha = repo.resolve(req.params["rev"])
    if req.headers.get("content-type", "").startswith("application/json"):
        body = req.json()
        paths, expand = body.get("paths") or [], bool(body.get("expand"))
    else:
        form = parse_qs(req.body.decode(), keep_blank_values=True)
        paths, expand = form.get("paths", []), form.get("expand", [""])[-1].lower() == "true"
    files = repo.commit(sha).files
    out = []
    for path in paths:
        path = path.strip("/")
        if path in files:
            out.append({"type": "file", "oid": files[path]["oid"], "size": files[path]["size"], "path": path})
        elif any(p.startswith(path + "/") for p in files):
            out.append(folder_entry(files, path))
        else:
            continue
        if expand:
            last = repo.last_commit_touching(sha, path)
            out[-1]["lastCommit"] = {"id": last.id, "title": last.title, "date": last.date}
    return Response.of_json(out)


@route("GET", rf"/api/{REPO_RE}/refs", "refs")
def h_refs(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)

    def refs(kind: str, items: dict[str, str], name_prefix: str = "") -> list[dict[str, str]]:
        return [
            {"name": name_prefix + n, "ref": f"refs/{kind}/{n}", "targetCommit": sha}
            for n, sha in sorted(items.items())
        ]

    pulls = refs("pr", repo.pulls())
    for item in pulls:  # the Hub names a PR ref by its number
        item["name"] = item["ref"].rsplit("/", 1)[1]
    return Response.of_json(
        {
            "branches": refs("heads", repo.branches()),
            "tags": refs("tags", repo.tags()),
            "converts": [],
            "pullRequests": pulls,
        }
    )


@route("GET", rf"/api/{REPO_RE}/commits/(?P<rev>[^/]+)", "commits")
def h_commits(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)
    formatted = "formatted" in req.query.get("expand[]", [])
    out = []
    for commit in repo.history(repo.resolve(req.params["rev"])):
        item: dict[str, Any] = {
            "id": commit.id,
            "title": commit.title,
            "message": commit.message,
            "date": commit.date,
            "authors": [{"user": a} for a in commit.authors],
        }
        if formatted:
            item["formatted"] = {"title": commit.title, "message": commit.message}
        out.append(item)
    return Response.of_json(out)


# -- upload


@route("POST", rf"/api/{REPO_RE}/preupload/(?P<rev>[^/]+)", "preupload")
def h_preupload(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    files = repo.commit(repo.resolve(req.params["rev"])).files
    out = []
    for item in req.json().get("files") or []:
        path = safe_repo_path(item["path"])
        out.append(
            {"path": path, "uploadMode": "regular", "shouldIgnore": False, "oid": files.get(path, {}).get("oid")}
        )
    return Response.of_json({"files": out, "commitOid": repo.resolve(req.params["rev"])})


def parse_commit_body(body: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """NDJSON commit payload -> (header value, operations)."""
    try:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HubError(400, f"Invalid NDJSON commit payload: {err}") from err
    if not lines or lines[0].get("key") != "header":
        raise HubError(400, "The first line of a commit payload must be the header")
    return lines[0].get("value") or {}, lines[1:]


def apply_operations(files: dict[str, dict[str, Any]], operations: list[dict[str, Any]]) -> dict[str, bytes | None]:
    """Operations -> {path: new content, or None for a deletion}; checks deletions against ``files``."""
    changes: dict[str, bytes | None] = {}
    for op in operations:
        key, value = op.get("key"), op.get("value") or {}
        raw_path = str(value.get("path", ""))
        path = safe_repo_path(raw_path.rstrip("/") if key == "deletedFolder" else raw_path)
        if key == "file":
            if value.get("encoding", "base64") != "base64":
                raise HubError(400, f"Unsupported encoding {value.get('encoding')!r}")
            changes[path] = base64.b64decode(value.get("content", ""), validate=True)
        elif key == "deletedFile":
            if path not in files and changes.get(path) is None:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            changes[path] = None
        elif key == "deletedFolder":
            inside = [p for p in list(files) + list(changes) if p.startswith(path + "/")]
            if not inside:
                raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
            changes.update({p: None for p in inside})
        elif key == "lfsFile":
            raise HubError(400, "This local hub stores no LFS objects (preupload never asks for LFS)")
        else:
            raise HubError(400, f"Unknown commit operation {key!r}")
    return changes


@route("POST", rf"/api/{REPO_RE}/commit/(?P<rev>[^/]+)", "commit")
def h_commit(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    header, operations = parse_commit_body(req.body)
    target = commit_target(repo, req.params["rev"], req.flag("create_pr"))
    parent = repo.resolve(req.params["rev"])
    expected = header.get("parentCommit")
    if expected and not parent.startswith(expected.lower()):
        raise HubError(412, "A commit has happened since. Please refresh and try again.")
    changes = apply_operations(repo.commit(parent).files, operations)
    title = header.get("summary") or "Update"
    sha = repo.write_commit(parent, changes, title, header.get("description") or "", [hub.user])
    pr_url = None
    if target is None:  # create_pr: a new pull request whose ref holds the commit
        num = new_discussion(repo, title, header.get("description") or "", hub.user, pull_request=True)
        repo.pulls()[str(num)] = sha
        pr_url = f"{repo_url(hub, repo)}/discussions/{num}"
    elif target.startswith("refs/pr/"):
        repo.pulls()[target.rsplit("/", 1)[1]] = sha
    else:
        repo.branches()[target] = sha
    repo.save()
    return Response.of_json(
        {
            "success": True,
            "commitOid": sha,
            "commitUrl": f"{repo_url(hub, repo)}/commit/{sha}",
            "hookOutput": "",
            "pullRequestUrl": pr_url,
        }
    )


def commit_target(repo: Repo, revision: str, create_pr: bool) -> str | None:
    """The ref a commit moves: a branch name or ``refs/pr/N``; None for a new pull request."""
    repo.resolve(revision)  # 404 RevisionNotFound first, as on the Hub
    if create_pr:
        return None
    name = revision[len("refs/heads/") :] if revision.startswith("refs/heads/") else revision
    if name in repo.branches():
        return name
    match = PR_REF_RE.match(revision)
    if match and match.group(1) in repo.pulls():
        return revision
    raise HubError(400, f"Cannot commit to {revision!r}: not a branch or a pull request ref")


def new_discussion(repo: Repo, title: str, description: str, author: str, pull_request: bool) -> int:
    discussions = repo.meta.setdefault("discussions", {})
    num = len(discussions) + 1
    discussions[str(num)] = {
        "num": num,
        "title": title,
        "description": description,
        "author": author,
        "isPullRequest": pull_request,
        "status": "draft" if pull_request else "open",
        "createdAt": now_iso(),
    }
    return num


@route("POST", rf"/api/{REPO_RE}/discussions", "discussion")
def h_create_discussion(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    body = req.json()
    is_pr = bool(body.get("pullRequest"))
    num = new_discussion(repo, body.get("title") or "", body.get("description") or "", hub.user, is_pr)
    if is_pr:
        repo.pulls()[str(num)] = repo.resolve(None)
    repo.save()
    return Response.of_json({"num": num, "url": f"{repo_url(hub, repo)}/discussions/{num}"})


@route("GET", rf"/api/{REPO_RE}/discussions/(?P<num>\d+)", "discussion")
def h_discussion(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)
    item = repo.meta.get("discussions", {}).get(req.params["num"])
    if item is None:
        raise HubError(404, "Discussion not found")
    return Response.of_json(
        {
            **item,
            "author": {"name": item["author"]},
            "repo": {"name": repo.repo_id, "type": repo.repo_type},
            "events": [],
            "pinned": False,
            "changes": {"base": f"refs/heads/{repo.meta['default_branch']}"},
            "filesWithConflicts": [],
            "diff": "",
        }
    )


# -- branches and tags


def check_ref_name(name: str) -> str:
    bad_shape = ".." in name or name.endswith(("/", ".lock")) or name.startswith("refs/")
    if not REF_NAME_RE.match(name) or bad_shape:
        raise HubError(400, f"Invalid reference name: {name!r}")
    return name


@route("POST", rf"/api/{REPO_RE}/branch/(?P<branch>[^/]+)", "branch")
def h_create_branch(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    branch = check_ref_name(req.params["branch"])
    if branch in repo.branches():
        raise HubError(409, f"Reference already exists: refs/heads/{branch}")
    repo.branches()[branch] = repo.resolve(req.json().get("startingPoint"))
    repo.save()
    return Response.of_json({})


@route("DELETE", rf"/api/{REPO_RE}/branch/(?P<branch>[^/]+)", "branch")
def h_delete_branch(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    branch = req.params["branch"]
    if branch not in repo.branches():
        raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
    if branch == repo.meta["default_branch"]:
        raise HubError(403, "Cannot delete the default branch")
    del repo.branches()[branch]
    repo.save()
    return Response.of_json({})


@route("POST", rf"/api/{REPO_RE}/tag/(?P<rev>[^/]+)", "tag")
def h_create_tag(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    body = req.json()
    tag = check_ref_name(str(body.get("tag") or ""))
    sha = repo.resolve(req.params["rev"])
    if tag in repo.tags():
        raise HubError(409, f"Tag already exists: {tag}")
    repo.tags()[tag] = sha
    repo.save()
    return Response.of_json({})


@route("DELETE", rf"/api/{REPO_RE}/tag/(?P<tag>[^/]+)", "tag")
def h_delete_tag(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    if req.params["tag"] not in repo.tags():
        raise HubError(404, f"Invalid rev id: {req.params['tag']}", "RevisionNotFound")
    del repo.tags()[req.params["tag"]]
    repo.save()
    return Response.of_json({})


# -- file download


RESOLVE_RE = r"/(?:(?P<type>datasets|spaces)/)?(?P<ns>[^/]+)/(?P<name>[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)"


@route("HEAD", RESOLVE_RE, "resolve", "resolve_head")
@route("GET", RESOLVE_RE, "resolve", "resolve_get")
def h_resolve(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)
    sha = repo.resolve(req.params["rev"])
    path = req.params["path"]
    info = repo.commit(sha).files.get(path)
    if info is None:
        raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": sha})
    data = repo.read_file(sha, path)
    headers = {
        "Content-Type": "application/octet-stream",
        "ETag": f'"{info["oid"]}"',
        "X-Repo-Commit": sha,
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'inline; filename="{quote(path.rsplit("/", 1)[-1])}"',
    }
    byte_range = parse_range(req.headers.get("range"), len(data))
    if byte_range is None:
        return Response(200, data, headers)
    start, end = byte_range
    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    return Response(206, data[start : end + 1], headers)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """A single ``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` range, or None (whole file)."""
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not match or match.group(1) == match.group(2) == "":
        return None
    if match.group(1) == "":
        start, end = max(0, size - int(match.group(2))), size - 1
    else:
        start = int(match.group(1))
        end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
    if start >= size or start > end:
        raise HubError(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end


# ----------------------------------------------------------------------------------------------- server


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HubHTTPServer

    def do_GET(self) -> None:
        self.dispatch("GET")

    def do_HEAD(self) -> None:
        self.dispatch("HEAD")

    def do_POST(self) -> None:
        self.dispatch("POST")

    def do_PUT(self) -> None:
        self.dispatch("PUT")

    def do_DELETE(self) -> None:
        self.dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        """No logging at all: request lines and headers (tokens) never reach stderr."""

    def dispatch(self, method: str) -> None:
        hub = self.server.hub
        split = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        hub.record(method, self.path, headers)
        found = find_route(method, split.path)
        failure = hub.take_failure(found[0].kinds if found else frozenset())
        if failure is not None and failure.mode == "drop":
            self.drop_connection()
            return
        body = self.read_body()
        if failure is not None:
            error = {"error": f"Injected failure ({failure.kind})"}
            self.send(method, Response.of_json(error, int(failure.mode)))
            return
        if found is None:
            hub.unhandled.append((method, self.path))
            error = {"error": f"Not implemented by the local hub: {method} {split.path}"}
            self.send(method, Response.of_json(error, 404))
            return
        handler_route, params = found
        query = parse_qs(split.query, keep_blank_values=True)
        req = Request(method, split.path, query, headers, body, params)
        self.send(method, hub.handle(handler_route, req))

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def drop_connection(self) -> None:
        """Read half of the request body, then end the connection without an answer.

        The server closes its sending side first (the client sees the connection end before any response),
        then discards the rest of the body, so the client never gets a reset while it is still sending and
        the failure it reports is always the same ("Server disconnected without sending a response")."""
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length // 2)
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(5)
            remaining = length - length // 2
            while remaining > 0 and (chunk := self.rfile.read(min(remaining, 1 << 16))):
                remaining -= len(chunk)

    def send(self, method: str, response: Response) -> None:
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(response.body)


def find_route(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    for candidate in ROUTES:
        if method not in candidate.methods:
            continue
        match = candidate.pattern.match(path)
        if match:
            return candidate, {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
    return None


class HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    hub: LocalHub


class LocalHub:
    """The server, its storage and its test controls. ``with LocalHub() as hub:`` starts and stops it."""

    def __init__(self, root: str | Path | None = None, token: str | None = None, user: str = DEFAULT_USER):
        self._tmp = None if root is not None else tempfile.TemporaryDirectory(prefix="local-hub-")
        self.root = Path(root if root is not None else self._tmp.name)  # type: ignore[union-attr]
        self.root.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.user = user
        self.store = Store(self.root)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.server_errors: list[str] = []
        self._failures: list[Failure] = []
        self._lock = threading.Lock()
        self._server: HubHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    # -- lifecycle
    def start(self, port: int = 0) -> LocalHub:
        server = HubHTTPServer(("127.0.0.1", port), Handler)
        server.hub = self
        self._server = server
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, name="local-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- request handling
    def record(self, method: str, path: str, headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append((method, path, headers))

    def handle(self, handler_route: Route, req: Request) -> Response:
        try:
            self.check_token(req)
            with self.store.lock:
                return handler_route.handler(self, req)
        except HubError as err:
            return self.error_response(err)
        except Exception:  # a bug in this server: answer 500 and keep the traceback for the test to show
            self.server_errors.append(traceback.format_exc())
            return Response.of_json({"error": "Internal error in the local hub"}, 500)

    @staticmethod
    def error_response(err: HubError) -> Response:
        headers = dict(err.headers)
        if err.code:
            headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message.encode("latin-1", "replace").decode("latin-1")
        return Response.of_json({"error": err.message}, err.status, headers)

    def check_token(self, req: Request) -> None:
        if req.bearer is not None and self.token is not None and req.bearer != self.token:
            raise HubError(401, "Invalid credentials in Authorization header")

    def token_is_valid(self, req: Request) -> bool:
        return req.bearer is not None and (self.token is None or req.bearer == self.token)

    def require_token(self, req: Request) -> None:
        if not self.token_is_valid(req):
            raise HubError(401, "Invalid username or password.")

    # -- failure injection
    def fail_next(self, kind: str = "commit", mode: str = "500", times: int = 1) -> None:
        """Make the next ``times`` requests of ``kind`` fail with ``mode`` ("drop" or an HTTP status)."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"Unknown request kind {kind!r}; one of {sorted(FAILURE_KINDS)}")
        if mode != "drop" and not re.fullmatch(r"[45]\d\d", mode):
            raise ValueError(f"mode must be 'drop' or a 4xx/5xx status, not {mode!r}")
        with self._lock:
            self._failures.append(Failure(kind, mode, times))

    def take_failure(self, kinds: frozenset[str]) -> Failure | None:
        with self._lock:
            for failure in self._failures:
                if failure.kind == "any" or failure.kind in kinds:
                    failure.times -= 1
                    if failure.times <= 0:
                        self._failures.remove(failure)
                    return failure
        return None

    def pending_failures(self) -> int:
        with self._lock:
            return sum(f.times for f in self._failures)

    # -- inspection
    def repo_files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Every file of the repo at ``revision`` (branch, tag, ref, commit id), .gitattributes included."""
        with self.store.lock:
            repo = self.store.get(repo_type, repo_id)
            sha = repo.resolve(revision)
            return {path: repo.read_file(sha, path) for path in sorted(repo.commit(sha).files)}

    def history(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[str]:
        """Commit ids reachable from ``revision``, newest first."""
        with self.store.lock:
            repo = self.store.get(repo_type, repo_id)
            return [c.id for c in repo.history(repo.resolve(revision))]

    def refs(self, repo_id: str, repo_type: str = "model") -> dict[str, dict[str, str]]:
        """{"heads": {...}, "tags": {...}, "pulls": {...}}: ref name -> commit id."""
        with self.store.lock:
            return json.loads(json.dumps(self.store.get(repo_type, repo_id).meta["refs"]))

    def authorization_headers(self) -> list[str]:
        """The Authorization header of every recorded request ("" where there was none)."""
        with self._lock:
            return [headers.get("authorization", "") for _, _, headers in self.requests]

    # -- clients
    def client_env(
        self, hf_home: str | Path, token: str | None = "hf_local_test_token", base: dict[str, str] | None = None
    ) -> dict[str, str]:
        """Environment for a subprocess whose huggingface_hub / transformers should talk to this hub."""
        env = dict(os.environ if base is None else base)
        for name in (
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_HUB_CACHE",
            "HUGGINGFACE_HUB_CACHE",
            "TRANSFORMERS_CACHE",
            "HF_DATASETS_CACHE",
            "HF_TOKEN_PATH",
            "HUGGINGFACE_CO_STAGING",
        ):
            env.pop(name, None)
        env.update(
            {
                "HF_ENDPOINT": self.endpoint,
                "HF_HUB_OFFLINE": "0",
                "TRANSFORMERS_OFFLINE": "0",
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_HUB_DISABLE_IMPLICIT_TOKEN": "0",
                "HF_HOME": str(hf_home),
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
            }
        )
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    @contextlib.contextmanager
    def patch_client(self, hf_home: str | Path) -> Iterator[None]:
        """Point the imported huggingface_hub (and transformers' shared HfApi) at this hub, with the Hub
        cache under ``hf_home``; everything is restored on exit. See the module docstring for the limits."""
        from huggingface_hub import constants, hf_api

        values = {
            "ENDPOINT": self.endpoint,
            "HUGGINGFACE_CO_URL_TEMPLATE": self.endpoint + "/{repo_id}/resolve/{revision}/{filename}",
            "HF_URL_HOSTS": constants.HF_URL_HOSTS | {"127.0.0.1"},
            "HF_HUB_OFFLINE": False,
            "HF_HUB_CACHE": str(Path(hf_home) / "hub"),
            "HF_HUB_DISABLE_TELEMETRY": True,
        }
        saved = {name: getattr(constants, name) for name in values}
        saved_api_endpoint = hf_api.api.endpoint
        try:
            for name, value in values.items():
                setattr(constants, name, value)
            hf_api.api.endpoint = self.endpoint
            reset_transformers_api()
            yield
        finally:
            for name, value in saved.items():
                setattr(constants, name, value)
            hf_api.api.endpoint = saved_api_endpoint
            reset_transformers_api()


def reset_transformers_api() -> None:
    """transformers keeps one HfApi (with the endpoint of its creation time): drop it if it exists."""
    import sys

    hub_module = sys.modules.get("transformers.utils.hub")
    if hub_module is not None and hasattr(hub_module, "_hf_api"):
        hub_module._hf_api = None


def main(argv: list[str] | None = None) -> None:
    """`python -m tests.hub_server`: serve until interrupted, after one paragraph saying how to point a client at it."""
    import argparse
    import shlex
    import signal
    import sys

    parser = argparse.ArgumentParser(prog="python -m tests.hub_server", description="A local Hub for offline pushes.")
    parser.add_argument("--root", help="Where the repos are stored (default: a temporary directory, deleted at exit).")
    parser.add_argument("--port", type=int, default=0, help="Port on 127.0.0.1 (default: a free one).")
    args = parser.parse_args(argv)
    # Ctrl-C stops it even when started where SIGINT is ignored (a shell's background job passes that on)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        hub = LocalHub(root=args.root).start(port=args.port)
    except OSError as err:
        print(f"hub_server: error: cannot serve on 127.0.0.1:{args.port}: {err.strerror or err}", file=sys.stderr)
        sys.exit(2)
    settings = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_local_test_token"}
    print(f"local Hub at {hub.endpoint}, repos in {hub.root}; in another shell:", flush=True)
    print("    export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items()), flush=True)
    print(f"    python -m bert_repro.hub <run directory> --repo_id {hub.user}/<name>", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
