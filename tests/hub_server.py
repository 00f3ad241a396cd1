"""A local stand-in for the Hugging Face Hub HTTP API, so tests drive the real huggingface_hub client unmocked.

A ``ThreadingHTTPServer`` on 127.0.0.1 answers what this project uses (whoami, create/delete repo, model_info,
list_repo_files/tree/refs/commits, create_commit and upload_folder (``parent_commit`` checked), branches, tags,
hf_hub_download, ModelCard.validate), with
the paths and JSON shapes of the installed client's source; anything else answers 404 and lands in ``hub.unhandled``.
Repos live under ``hub.root`` as ``repo.json`` (refs, every commit as a full ``{path: git blob id}`` snapshot) plus
``blobs/``; file ids are git blob ids, so the client's "file unchanged" detection works as on the Hub. No LFS/Xet
(every file travels base64 in the commit), pull requests, pagination or per-namespace permissions.

Errors carry the ``X-Error-Code`` the client maps to its exceptions. ``LocalHub(token="x")`` rejects other tokens
(``token=None`` accepts any); writes need a token and private repos are 404 without one. Requests are recorded in
``hub.requests`` and never logged, so no token is printed. ``hub.fail_next(kind, mode, times, after)`` fails the next
requests of a route kind ("any", or "write": those that change a repo) once ``after`` of them passed, with a status,
a dropped connection ("drop") or a lost answer ("lost": applied, then the connection drops); mind the client's retries
on 5xx and drops (1, 2, 4, 8, 8 s): to fail a push fast inject "403" or ``times=6``.

huggingface_hub reads ``HF_ENDPOINT`` at import, so run clients in a subprocess with ``env=hub.client_env(hf_home)``,
or in-process under ``hub.patch_client(hf_home)``. The ``local_hub`` fixture (tests/conftest.py) yields a started hub;
``python -m tests.hub_server [--root DIR] [--port N]`` serves one by hand for an offline push.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_USER = "local-user"
DEFAULT_TOKEN = "hf_local_test_token"
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")
GITATTRIBUTES = "*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"


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


# --------------------------------------------------------------------------------------------- storage


class Repo:
    """One repository: ``repo.json`` (visibility, refs, commits) and its ``blobs/``."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.meta = json.loads((directory / "repo.json").read_text())

    def save(self) -> None:
        (self.dir / "repo.json").write_text(json.dumps(self.meta, indent=1))

    @property
    def repo_id(self) -> str:
        return self.meta["id"]

    def branches(self) -> dict[str, str]:
        return self.meta["refs"]["heads"]

    def tags(self) -> dict[str, str]:
        return self.meta["refs"]["tags"]

    def files(self, sha: str) -> dict[str, str]:
        """{path: git blob id} of the snapshot at commit ``sha``."""
        return self.meta["commits"][sha]["files"]

    def read(self, oid: str) -> bytes:
        return (self.dir / "blobs" / oid).read_bytes()

    def size(self, oid: str) -> int:
        return (self.dir / "blobs" / oid).stat().st_size

    def resolve(self, revision: str | None) -> str:
        """Branch, tag or (abbreviated) commit id -> commit id."""
        rev = revision or "main"
        for refs in (self.branches(), self.tags()):
            if rev in refs:
                return refs[rev]
        found = [sha for sha in self.meta["commits"] if sha.startswith(rev)] if SHA_RE.match(rev) else []
        if len(found) == 1:
            return found[0]
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def write_commit(self, parent: str | None, changes: dict[str, bytes | None], title: str, author: str) -> str:
        """A snapshot of the parent's files with ``changes`` applied (bytes: add or replace, None: delete)."""
        files = dict(self.files(parent)) if parent else {}
        for path, data in changes.items():
            if data is None:
                del files[path]
                continue
            files[path] = git_blob_oid(data)
            (self.dir / "blobs" / files[path]).write_bytes(data)
        date = now_iso()
        sha = hashlib.sha1(json.dumps([parent, files, title, date, uuid.uuid4().hex]).encode()).hexdigest()
        self.meta["commits"][sha] = {"parents": [parent] if parent else [], "title": title, "date": date}
        self.meta["commits"][sha].update(authors=[author], files=files)
        return sha

    def history(self, sha: str) -> list[str]:
        """The commit and its ancestors, newest first."""
        out = [sha]
        while parents := self.meta["commits"][out[-1]]["parents"]:
            out.append(parents[0])
        return out


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
        return Repo(directory)

    def create(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        directory = self.repo_dir(repo_type, repo_id)
        if (directory / "repo.json").is_file():
            raise HubError(409, f"You already created this {repo_type} repo")
        (directory / "blobs").mkdir(parents=True, exist_ok=True)
        meta = {"id": repo_id, "type": repo_type, "private": private, "createdAt": now_iso()}
        meta.update(refs={"heads": {}, "tags": {}}, commits={})
        (directory / "repo.json").write_text(json.dumps(meta))
        repo = Repo(directory)
        initial = {".gitattributes": GITATTRIBUTES.encode()}
        repo.branches()["main"] = repo.write_commit(None, initial, "initial commit", "system")
        repo.save()
        return repo


# ------------------------------------------------------------------------------------------- requests


@dataclass
class Request:
    path: str  # without the query string
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    params: dict[str, str]  # unquoted named groups of the route

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err

    @property
    def bearer(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] | None = None

    @classmethod
    def of_json(cls, data: Any, status: int = 200, headers: dict | None = None) -> Response:
        return cls(status, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})


@dataclass
class Route:
    method: str
    pattern: re.Pattern
    kind: str
    handler: Callable[[LocalHub, Request], Response]


@dataclass
class Failure:
    kind: str
    mode: str
    times: int
    after: int = 0


WRITES = {"create_repo", "delete_repo", "commit", "branch", "tag"}
REPO_RE = r"(?P<type>models|datasets|spaces)/(?P<ns>[^/]+)/(?P<name>[^/]+)"
ROUTES: list[Route] = []


def route(method: str, pattern: str, kind: str) -> Callable:
    def register(handler: Callable[[LocalHub, Request], Response]) -> Callable:
        ROUTES.append(Route(method, re.compile(f"^{pattern}$"), kind, handler))
        return handler

    return register


def repo_of(hub: LocalHub, req: Request, write: bool = False) -> Repo:
    """The repo named by the route, after the visibility and write checks."""
    repo_type = REPO_TYPES[req.params.get("type") or "models"]
    repo = hub.store.get(repo_type, f"{req.params['ns']}/{req.params['name']}")
    if (repo.meta["private"] or write) and not hub.token_is_valid(req):
        if write and not repo.meta["private"]:
            raise HubError(401, "You must be authenticated to write to this repo")
        raise HubError(404, "Repository not found", "RepoNotFound")
    return repo


def repo_url(hub: LocalHub, repo_type: str, repo_id: str) -> str:
    return f"{hub.endpoint}/{URL_PREFIX[repo_type]}{repo_id}"


@route("GET", r"/api/whoami-v2", "whoami")
def h_whoami(hub: LocalHub, req: Request) -> Response:
    hub.require_token(req)
    access = {"type": "access_token", "accessToken": {"displayName": "local", "role": "write"}}
    return Response.of_json({"type": "user", "name": hub.user, "fullname": "Local User", "orgs": [], "auth": access})


@route("POST", r"/api/repos/create", "create_repo")
def h_create_repo(hub: LocalHub, req: Request) -> Response:
    hub.require_token(req)
    body = req.json()
    repo_id, repo_type = f"{body.get('organization') or hub.user}/{body.get('name')}", body.get("type") or "model"
    url = repo_url(hub, repo_type, repo_id)
    try:
        hub.store.create(repo_type, repo_id, body.get("visibility") == "private" or bool(body.get("private")))
    except HubError as err:
        if err.status == 409:  # the client turns this answer into success with exist_ok
            return Response.of_json({"error": err.message, "url": url}, status=409)
        raise
    return Response.of_json({"url": url, "name": repo_id})


@route("DELETE", r"/api/repos/delete", "delete_repo")
def h_delete_repo(hub: LocalHub, req: Request) -> Response:
    hub.require_token(req)
    body = req.json()
    repo_type, repo_id = body.get("type") or "model", f"{body.get('organization') or hub.user}/{body.get('name')}"
    hub.store.get(repo_type, repo_id)
    shutil.rmtree(hub.store.repo_dir(repo_type, repo_id))
    return Response.of_json({})


@route("POST", r"/api/validate-yaml", "validate_yaml")
def h_validate_yaml(hub: LocalHub, req: Request) -> Response:
    """``ModelCard.validate``: the README's front matter must be a YAML mapping between ``---`` fences."""
    import yaml  # a dependency of huggingface_hub

    lines = (req.json().get("content") or "").lstrip("\ufeff").splitlines()
    error = None
    if lines and lines[0].strip() == "---":
        end = next((i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---"), None)
        try:
            data = yaml.safe_load("\n".join(lines[1:end])) if end else None
            if end is None or not isinstance(data, dict | None):
                error = "The metadata block must be a YAML mapping between '---' lines"
        except yaml.YAMLError as err:
            error = f"Invalid YAML in the metadata block: {err}"
    if error:
        return Response.of_json({"errors": [{"message": error}], "warnings": []}, status=400)
    return Response.of_json({"errors": [], "warnings": []})


@route("GET", rf"/api/{REPO_RE}(?:/revision/(?P<rev>[^/]+))?", "repo_info")
def h_repo_info(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)
    sha = repo.resolve(req.params.get("rev"))
    files = repo.files(sha)
    siblings = [{"rfilename": path, "size": repo.size(oid), "blobId": oid} for path, oid in sorted(files.items())]
    info = {"id": repo.repo_id, "sha": sha, "private": repo.meta["private"], "siblings": siblings, "tags": []}
    info.update(createdAt=repo.meta["createdAt"], lastModified=repo.meta["commits"][sha]["date"])
    return Response.of_json(info)


@route("GET", rf"/api/{REPO_RE}/tree/(?P<rev>[^/]+)", "tree")
def h_tree(hub: LocalHub, req: Request) -> Response:
    """The recursive listing of ``list_repo_files`` (files only: it drops the folders)."""
    repo = repo_of(hub, req)
    files = repo.files(repo.resolve(req.params["rev"]))
    return Response.of_json(
        [{"type": "file", "oid": oid, "size": repo.size(oid), "path": path} for path, oid in sorted(files.items())]
    )


@route("GET", rf"/api/{REPO_RE}/refs", "refs")
def h_refs(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req)

    def refs(kind: str, items: dict[str, str]) -> list[dict[str, str]]:
        return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": sha} for n, sha in sorted(items.items())]

    branches, tags = refs("heads", repo.branches()), refs("tags", repo.tags())
    return Response.of_json({"branches": branches, "tags": tags, "converts": [], "pullRequests": []})


@route("GET", rf"/api/{REPO_RE}/commits/(?P<rev>[^/]+)", "commits")
def h_commits(hub: LocalHub, req: Request) -> Response:
    """``list_repo_commits``, newest first, in one page."""
    repo = repo_of(hub, req)
    commits = [(sha, repo.meta["commits"][sha]) for sha in repo.history(repo.resolve(req.params["rev"]))]
    return Response.of_json(
        [{**c, "id": sha, "message": "", "authors": [{"user": a} for a in c["authors"]]} for sha, c in commits]
    )


@route("POST", rf"/api/{REPO_RE}/preupload/(?P<rev>[^/]+)", "preupload")
def h_preupload(hub: LocalHub, req: Request) -> Response:
    """Every file is "regular" (no LFS), with the remote blob id as ``oid``, so the client skips unchanged files."""
    repo = repo_of(hub, req, write=True)
    sha = repo.resolve(req.params["rev"])
    files = repo.files(sha)
    out = [
        {"path": item["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": files.get(item["path"])}
        for item in req.json().get("files") or []
    ]
    return Response.of_json({"files": out, "commitOid": sha})


def safe_repo_path(path: str) -> str:
    """A path inside a repo; 400 on anything that could escape it."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == ".git":
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


@route("POST", rf"/api/{REPO_RE}/commit/(?P<rev>[^/]+)", "commit")
def h_commit(hub: LocalHub, req: Request) -> Response:
    """An NDJSON body: a header line (``summary``), then ``file`` (base64 content) and ``deletedFile`` lines."""
    repo = repo_of(hub, req, write=True)
    branch = req.params["rev"].removeprefix("refs/heads/")
    parent = repo.resolve(branch)
    if branch not in repo.branches():
        raise HubError(400, f"Cannot commit to {branch!r}: not a branch")
    try:
        header, *operations = [json.loads(line) for line in req.body.decode().splitlines() if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as err:
        raise HubError(400, f"Invalid NDJSON commit payload: {err}") from err
    expected = header.get("value", {}).get("parentCommit")
    if expected and not parent.startswith(expected):
        raise HubError(412, f"A commit has happened since. Please refresh and try again: {branch} is at {parent}")
    changes: dict[str, bytes | None] = {}
    for op in operations:
        key, value = op.get("key"), op.get("value") or {}
        path = safe_repo_path(str(value.get("path", "")))
        if key == "file":
            changes[path] = base64.b64decode(value.get("content", ""), validate=True)
        elif key == "deletedFile" and path in repo.files(parent):
            changes[path] = None
        elif key == "deletedFile":
            raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
        else:
            raise HubError(400, f"Unsupported commit operation {key!r} (this local hub stores no LFS objects)")
    sha = repo.write_commit(parent, changes, header.get("value", {}).get("summary") or "Update", hub.user)
    repo.branches()[branch] = sha
    repo.save()
    url = f"{repo_url(hub, repo.meta['type'], repo.repo_id)}/commit/{sha}"
    return Response.of_json({"success": True, "commitOid": sha, "commitUrl": url, "pullRequestUrl": None})


@route("POST", rf"/api/{REPO_RE}/branch/(?P<branch>[^/]+)", "branch")
def h_create_branch(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    branch = req.params["branch"]
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
    if branch == "main":
        raise HubError(403, "Cannot delete the default branch")
    del repo.branches()[branch]
    repo.save()
    return Response.of_json({})


@route("POST", rf"/api/{REPO_RE}/tag/(?P<rev>[^/]+)", "tag")
def h_create_tag(hub: LocalHub, req: Request) -> Response:
    repo = repo_of(hub, req, write=True)
    tag = str(req.json().get("tag") or "")
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


RESOLVE_RE = r"/(?:(?P<type>datasets|spaces)/)?(?P<ns>[^/]+)/(?P<name>[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)"


@route("HEAD", RESOLVE_RE, "resolve")
@route("GET", RESOLVE_RE, "resolve")
def h_resolve(hub: LocalHub, req: Request) -> Response:
    """A file, served directly (no redirect) with the headers ``hf_hub_download`` reads."""
    repo = repo_of(hub, req)
    sha = repo.resolve(req.params["rev"])
    oid = repo.files(sha).get(req.params["path"])
    if oid is None:
        raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": sha})
    headers = {"Content-Type": "application/octet-stream", "ETag": f'"{oid}"', "X-Repo-Commit": sha}
    return Response(200, repo.read(oid), headers)


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
        failure = hub.take_failure(found[0].kind if found else None)
        if failure is not None and failure.mode == "drop":
            self.drop_connection()
            return
        body = self.read_body()
        if failure is not None and failure.mode == "lost" and found is not None:
            hub.handle(found[0], Request(split.path, parse_qs(split.query), headers, body, found[1]))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if failure is not None:
            self.send(method, Response.of_json({"error": f"Injected failure ({failure.kind})"}, int(failure.mode)))
            return
        if found is None:
            hub.unhandled.append((method, self.path))
            error = {"error": f"Not implemented by the local hub: {method} {split.path}"}
            self.send(method, Response.of_json(error, 404))
            return
        handler_route, params = found
        req = Request(split.path, parse_qs(split.query, keep_blank_values=True), headers, body, params)
        self.send(method, hub.handle(handler_route, req))

    def read_body(self) -> bytes:
        """The body, also when sent in chunks (the client streams a commit's NDJSON)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def drop_connection(self) -> None:
        """Read half the body and close without an answer; closing our side first (and draining the rest) means the
        client always reports "Server disconnected without sending a response", never a reset."""
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
        for name, value in (response.headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(response.body)


def find_route(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    for candidate in ROUTES:
        match = candidate.pattern.match(path) if method == candidate.method else None
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
        self.endpoint = ""

    def start(self, port: int = 0) -> LocalHub:
        self._server = HubHTTPServer(("127.0.0.1", port), Handler)
        self._server.hub = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True).start()
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
            if req.bearer is not None and not self.token_is_valid(req):
                raise HubError(401, "Invalid credentials in Authorization header")
            with self.store.lock:
                return handler_route.handler(self, req)
        except HubError as err:
            headers = {**err.headers, "X-Error-Message": err.message.encode("latin-1", "replace").decode("latin-1")}
            if err.code:
                headers["X-Error-Code"] = err.code
            return Response.of_json({"error": err.message}, err.status, headers)
        except Exception:  # a bug in this server: answer 500 and keep the traceback for the test to show
            self.server_errors.append(traceback.format_exc())
            return Response.of_json({"error": "Internal error in the local hub"}, 500)

    def token_is_valid(self, req: Request) -> bool:
        return req.bearer is not None and (self.token is None or req.bearer == self.token)

    def require_token(self, req: Request) -> None:
        if not self.token_is_valid(req):
            raise HubError(401, "Invalid username or password.")

    # -- failure injection
    def fail_next(self, kind: str = "commit", mode: str = "500", times: int = 1, after: int = 0) -> None:
        """Make the next ``times`` requests of ``kind``, once ``after`` of them passed, fail with ``mode`` ("drop",
        "lost" or an HTTP status)."""
        kinds = {r.kind for r in ROUTES} | {"any", "write"}
        if kind not in kinds:
            raise ValueError(f"Unknown request kind {kind!r}; one of {sorted(kinds)}")
        if mode not in ("drop", "lost") and not re.fullmatch(r"[45]\d\d", mode):
            raise ValueError(f"mode must be 'drop', 'lost' or a 4xx/5xx status, not {mode!r}")
        with self._lock:
            self._failures.append(Failure(kind, mode, times, after))

    def cancel_failures(self) -> int:
        """Drop the failures not injected yet; returns how many there were."""
        with self._lock:
            pending, self._failures = len(self._failures), []
        return pending

    def take_failure(self, kind: str | None) -> Failure | None:
        with self._lock:
            for failure in self._failures:
                if failure.kind not in ("any", kind) and (failure.kind != "write" or kind not in WRITES):
                    continue
                if failure.after > 0:
                    failure.after -= 1
                    return None
                failure.times -= 1
                if failure.times <= 0:
                    self._failures.remove(failure)
                return failure
        return None

    # -- inspection
    def repo_files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Every file of the repo at ``revision`` (branch, tag, commit id), .gitattributes included."""
        with self.store.lock:
            repo = self.store.get(repo_type, repo_id)
            return {path: repo.read(oid) for path, oid in sorted(repo.files(repo.resolve(revision)).items())}

    def history(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[str]:
        """Commit ids reachable from ``revision``, newest first."""
        with self.store.lock:
            repo = self.store.get(repo_type, repo_id)
            return repo.history(repo.resolve(revision))

    def refs(self, repo_id: str, repo_type: str = "model") -> dict[str, dict[str, str]]:
        """{"heads": {...}, "tags": {...}}: ref name -> commit id."""
        with self.store.lock:
            return json.loads(json.dumps(self.store.get(repo_type, repo_id).meta["refs"]))

    # -- clients
    def client_env(self, hf_home: str | Path, token: str | None = DEFAULT_TOKEN) -> dict[str, str]:
        """``os.environ`` for a client subprocess of this hub, with a fresh cache and no other token."""
        drop = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN_PATH")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(HF_ENDPOINT=self.endpoint, HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0", HF_HOME=str(hf_home))
        env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", NO_PROXY="127.0.0.1,localhost")
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    @contextlib.contextmanager
    def patch_client(self, hf_home: str | Path) -> Iterator[None]:
        """Point the imported huggingface_hub (and transformers' shared HfApi) at this hub, restored on exit."""
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
    settings = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": DEFAULT_TOKEN}
    try:  # Ctrl-C while the first lines print (a user quick to stop it) ends it as well as later
        print(f"local Hub at {hub.endpoint}, repos in {hub.root}; in another shell:", flush=True)
        print("    export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items()), flush=True)
        print(f"    python -m bert_repro.hub <run directory> --repo_id {hub.user}/<name>", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
