"""Publishing a run on the Hugging Face Hub: safetensors, code, tokenizer, card and records, nothing else.

What a push uploads, and its options, are in docs/hub.md. A push lands whole or leaves the Hub as it found it: every
refusal comes before the first write, each revision is one commit, a failed push puts back what it created or moved
(`Publication`), and the same push again adds nothing. The local directory is only read (the card and repaired files
are staged in a temporary copy). The token comes from huggingface_hub's usual places or an argument, and is never
printed, logged or written into a file.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from huggingface_hub.constants import EVAL_RESULTS_FOLDER

from ..atomic import STAGING, process_alive
from ..data.wordpiece import LOAD_TIME_KEYS, TOKENIZER_CONFIG_FILE
from ..model import modeling_bert_repro
from ..model.checkpoint_format import config_file_dict, is_repro_checkpoint
from ..model.conversion import PICKLE_PATTERNS, TOKENIZER_FILES, CheckpointError, check_model_dir, weight_files
from ..model.modeling_bert_repro import AUTO_MAP

logger = logging.getLogger(__name__)

RECORD_FILES = (
    "run_config.json",
    "data_statistics.json",
    "results.json",
    "results.md",
    "log_history.json",
    "training_curves.png",
    "report.md",
    "report.json",
    "report.png",
)


class HubPushError(RuntimeError):
    """A push that did not complete; the message says what happened and what to do."""


STAGING_PREFIX = "bert_repro_push-"  # + the pushing process's id: a folder whose process is gone was stranded


def remove_stranded_staging() -> list[Path]:
    """Remove (and return) killed pushes' staging folders: each holds a copy of the weights (88 MB for BERT-base)."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(STAGING_PREFIX + "*"):
        pid = folder.name[len(STAGING_PREFIX) :].split("-")[0]
        if pid.isdigit() and not process_alive(int(pid)) and folder.is_dir() and os.access(folder, os.W_OK):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def staging_folder() -> tempfile.TemporaryDirectory:
    """A temporary folder for what a push stages, named after this process (see `remove_stranded_staging`)."""
    remove_stranded_staging()
    return tempfile.TemporaryDirectory(prefix=f"{STAGING_PREFIX}{os.getpid()}-")


def model_files(weights: Path) -> list[str]:
    """A saved model's weights (or shards and index), config and the `*.py` that `save_pretrained` wrote beside them."""
    names = [p.name for p in weight_files(weights)] + ["model.safetensors.index.json", "config.json"]
    return [name for name in names if (weights / name).exists()] + sorted(p.name for p in weights.glob("*.py"))


def code_files() -> list[Path]:
    """The modeling file and what it imports from its package: transformers' rule for the remote code it copies."""
    from transformers.dynamic_module_utils import get_relative_import_files

    modeling = Path(modeling_bert_repro.__file__)
    # dict.fromkeys: a sibling that imports the modeling file back lists it a second time
    return list(dict.fromkeys([modeling, *map(Path, get_relative_import_files(str(modeling)))]))


def stage(
    path: str | Path, repo_id: str, staging: Path, *, tokenizer_dir: Path | None = None, with_card: bool = True
) -> list[str]:
    """Copy what is published from `path` into `staging`; returns the relative paths staged."""
    path = Path(path)  # an output directory (its best model) or a checkpoint: the weights are at its top
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory.")
    check_model_dir(path)
    for name in model_files(path):
        shutil.copy2(path / name, staging / name)
    _complete_checkpoint(staging)
    for source in (tokenizer_dir, path, path / "tokenizer"):
        if source is not None and (source / "tokenizer.json").exists():
            for name in TOKENIZER_FILES:
                if (source / name).exists():
                    shutil.copy2(source / name, staging / name)
            config = staging / TOKENIZER_CONFIG_FILE  # a tokenizer not saved through load_tokenizer has them
            if config.exists():
                fields = json.loads(config.read_text(encoding="utf-8"))
                config.write_text(json.dumps({k: v for k, v in fields.items() if k not in LOAD_TIME_KEYS}, indent=2))
            break
    for name in RECORD_FILES:
        if (path / name).exists():
            shutil.copy2(path / name, staging / name)
    if (path / "runs").is_dir():  # TensorBoard's logs; a fine-tuning grid's runs (--keep_all_runs: their models)
        shutil.copytree(path / "runs", staging / "runs", ignore=_training_state)
    if (path / EVAL_RESULTS_FOLDER).is_dir():  # huggingface_hub 2.x's evaluation results, for the leaderboards
        shutil.copytree(path / EVAL_RESULTS_FOLDER, staging / EVAL_RESULTS_FOLDER)
    if with_card:
        _card(path, repo_id).save(staging / "README.md")
    return sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())


def _training_state(folder: str, names: list[str]) -> list[str]:
    """What `runs/` keeps only to resume training (checkpoints, unfinished saves, pickles), left out of a push."""
    pickles = {n for pattern in PICKLE_PATTERNS for n in fnmatch.filter(names, pattern)}
    return [n for n in names if n.startswith(("checkpoint-", STAGING)) or n in pickles]


def _card(path: Path, repo_id: str):
    """The README.md `bert_repro.hub.model_card` wrote when it quotes this repository's id (it may hold --benchmark,
    --study), else a fresh card: a card for another repository is never published under this one."""
    from huggingface_hub import ModelCard

    from .model_card import card_for_directory, card_path, check_no_secrets

    written = card_path(path)
    if written.is_file():
        text = written.read_text(encoding="utf-8")
        if f'"{repo_id}"' in text:
            check_no_secrets(text)
            return ModelCard(text)
        logger.info("%s is for another repository than %s: publishing a fresh card instead", written, repo_id)
    return card_for_directory(path, repo_id)


def _complete_checkpoint(staging: Path) -> None:
    """Make a staged bert_repro checkpoint open both ways without bert_repro: transformers' BERT type where it can
    be (older checkpoints say "bert_repro"), a full auto_map, and the code files beside it when it has none."""
    config = json.loads((staging / "config.json").read_text())
    if not is_repro_checkpoint(config):
        return  # e.g. an exported transformers-format checkpoint: it has no code of ours to ship
    complete = config_file_dict({**config, "auto_map": dict(AUTO_MAP)})
    if complete != config:
        (staging / "config.json").write_text(json.dumps(complete, indent=2, sort_keys=True) + "\n")
    if not (staging / "modeling_bert_repro.py").exists():
        for source in code_files():
            shutil.copy2(source, staging / source.name)


def _run_identity(directory: Path) -> str | None:
    """What identifies the run a directory came from: its run_config.json (None when there is none)."""
    record = directory / "run_config.json"
    return json.dumps(json.loads(record.read_text()), sort_keys=True) if record.exists() else None


def check_remote(api, repo_id: str, revision: str | None, local_identity: str | None, overwrite: bool) -> None:
    """Refuse to push over a different model unless asked: another run's records, or not a bert_repro model."""
    from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        files = set(api.list_repo_files(repo_id, revision=revision))
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return
    if not files - {".gitattributes", "README.md"} or overwrite:
        return
    reasons = []
    try:
        remote_config = json.loads(Path(api.hf_hub_download(repo_id, "config.json", revision=revision)).read_text())
        if not is_repro_checkpoint(remote_config):
            reasons.append(f"it holds a {remote_config.get('model_type')!r} model not saved by bert_repro")
    except RemoteEntryNotFoundError:  # not its base class: a download that failed is no answer (LocalEntryNotFound)
        reasons.append("it holds files but no config.json")
    if not reasons and "run_config.json" in files:
        remote = Path(api.hf_hub_download(repo_id, "run_config.json", revision=revision))
        if json.dumps(json.loads(remote.read_text()), sort_keys=True) != local_identity:
            reasons.append("it holds another run (its run_config.json differs)")
    elif not reasons and local_identity is not None:
        reasons.append("it holds a model without a run record")
    if reasons:
        where = f"{repo_id}@{revision}" if revision else repo_id
        raise HubPushError(
            f"{where} already holds a different model: {'; '.join(reasons)}. "
            "Pass overwrite=True (--overwrite) to replace it."
        )


def hub_error_advice(err: BaseException, repo_id: str) -> str:
    """What to do about a failed Hub call, by its cause: repeating the command helps only when the network failed."""
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalTokenNotFoundError, OfflineModeIsEnabled

    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, HFValidationError):
        return f"{repo_id!r} is not a valid repository id: use 'your-name/model-name', then run the command again."
    if isinstance(err, OfflineModeIsEnabled):
        return "The Hub is switched off here (HF_HUB_OFFLINE=1): unset it on a machine with network access."
    if isinstance(err, LocalTokenNotFoundError) or status == 401:
        return (
            "The Hub did not accept your token (or found none): log in with `hf auth login` or set HF_TOKEN to "
            "a token with write access, then run the command again."
        )
    if status == 403:
        return (
            f"Your token may not write to {repo_id}: use a token with write access to that namespace, or a "
            "repository id under your own name."
        )
    if isinstance(err, HfHubHTTPError) and status is not None and 400 <= status < 500:
        return f"The Hub refused the request (HTTP {status}): check the repository id and your rights to it."
    return "The Hub could not be reached or failed: check the network and run the same command again to complete it."


def check_hub_access(repo_id: str, *, token: str | None = None, api=None) -> None:
    """Before hours of training, a HubPushError with advice unless the id is valid and the Hub accepts the token."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
        if "/" not in repo_id:
            raise ValueError("no namespace")
        if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
            from huggingface_hub.errors import OfflineModeIsEnabled

            raise OfflineModeIsEnabled("HF_HUB_OFFLINE is set")
        (api or HfApi(token=token)).whoami()
    except ValueError as err:  # HFValidationError is a ValueError
        raise HubPushError(
            f"--hub_model_id {repo_id!r} is not a valid repository id ({err}): use 'your-name/model-name'."
        ) from None
    except Exception as err:
        raise HubPushError(
            f"Cannot push to {repo_id}: {type(err).__name__}. {hub_error_advice(err, repo_id)}"
        ) from None


@dataclass(frozen=True)
class Pushed:
    """One revision a push published, for a caller to record: its commit, new or the one that already held the same
    files (a push of the same run again adds nothing), and the tag on it. `str()` is the commit's URL."""

    repo_id: str
    revision: str
    commit: str
    url: str
    new: bool
    tag: str | None = None

    def __str__(self) -> str:
        return self.url


def holds(api, repo_id: str, commit: str, staging: Path, staged: list[str]) -> bool:
    """Whether `commit` holds exactly the staged files (and .gitattributes), by the ids the Hub lists for them: the git
    blob id, or an LFS file's sha256."""
    from huggingface_hub.hf_api import RepoFile

    remote = {
        f.path: f for f in api.list_repo_tree(repo_id, revision=commit, recursive=True) if isinstance(f, RepoFile)
    }
    if set(remote) - {".gitattributes"} != set(staged):
        return False
    for name in staged:
        lfs, path = remote[name].lfs, staging / name
        with open(path, "rb") as file:
            prefix = b"blob %d\0" % path.stat().st_size
            digest = hashlib.file_digest(file, hashlib.sha256 if lfs else lambda: hashlib.sha1(prefix)).hexdigest()
        if digest != (lfs.sha256 if lfs else remote[name].blob_id):
            return False
    return True


class Publication:
    """The revisions of one push, each one `create_commit`, and how to put the Hub back when a later step fails.

    One commit per revision: `create_commit` uploads the LFS files first, then sends every file in one commit request,
    which the Hub applies whole or not at all. `upload_folder` with hf_xet installed (the default) instead commits a
    large folder in batches (every 250 files or so, or 100 MB of non-LFS content: huggingface_hub's _upload_pipeline),
    which could land a grid kept whole (--keep_all_runs) or a study half pushed.

    "As it was" after a failed push: the repository exists only if it did; every branch the push created is gone and
    every branch it moved names its old commit again (`delete_branch`, then `create_branch` there: its history is as
    before); tags are untouched, since a tag moves only after every commit landed. What cannot be put back: main, which
    the Hub neither deletes nor moves back without a new commit, so a push commits to it last, and that commit lands
    whole or not at all (one whose answer was lost is recognised by its files and counts as landed); the push's own
    commits (unreachable once their branch is put back) and the LFS files a failed commit uploaded (in no revision).
    """

    def __init__(self, api, repo_id: str, source: str):
        self.api, self.repo_id, self.source, self.where = api, repo_id, source, repo_id
        self.before: dict[str, str] | None = None  # {branch: commit} before the push; None: no repository
        self.tags: dict[str, str] = {}
        self.heads: dict[str, str] = {}  # {branch: commit} as far as this push knows
        self.created = False  # the repository
        self.touched: list[str] = []  # the branches it created or committed to

    def refs(self) -> tuple[dict[str, str], dict[str, str]]:
        refs = self.api.list_repo_refs(self.repo_id)
        return {b.name: b.target_commit for b in refs.branches}, {t.name: t.target_commit for t in refs.tags}

    def preflight(self, revisions, identity: str | None, overwrite: bool, tag: str | None, same) -> None:
        """Every refusal of a push, before it writes: an existing `tag` without `overwrite` (unless it names the last
        revision's head and `same(head)`, that head holds what the push would: a rerun of a push that landed), and
        `check_remote` per revision (a new branch holds main's)."""
        from huggingface_hub.utils import RepositoryNotFoundError

        try:
            self.before, self.tags = self.refs()
        except RepositoryNotFoundError:
            return
        self.heads, tags = dict(self.before), self.tags
        if tag in tags and not overwrite and not (tags[tag] == self.before.get(revisions[-1]) and same(tags[tag])):
            raise HubPushError(
                f"{self.repo_id} already has the tag {tag!r} (on commit {tags[tag][:8]}): pass --overwrite to move it "
                "to this push's commit, or choose another --tag. Nothing was pushed."
            )
        for revision in dict.fromkeys(r if r in self.before else None for r in revisions):
            check_remote(self.api, self.repo_id, revision, identity, overwrite)

    def commit(self, branch: str, staging: Path, staged: list[str], message: str, private: bool, source: str) -> Pushed:
        """`staged` as the one commit of `branch` (created from main when missing), its other files deleted."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        api, repo_id = self.api, self.repo_id
        self.source, self.where = source, f"{repo_id}@{branch}" if branch != "main" else repo_id
        if self.before is None and not self.created:
            self.created = True  # first: a repository created with its answer lost is removed as well
            api.create_repo(repo_id, private=private)
            self.heads = self.refs()[0]
        self.touched.append(branch)
        if branch not in self.heads:
            api.create_branch(repo_id, branch=branch, revision=self.heads["main"])
            self.heads[branch] = self.heads["main"]
        parent = self.heads[branch]
        stale = set(api.list_repo_files(repo_id, revision=parent)) - set(staged) - {".gitattributes"}
        operations = [CommitOperationDelete(name) for name in sorted(stale)]
        operations += [CommitOperationAdd(name, staging / name) for name in staged]
        try:  # parent_commit: the deletions were listed at `parent`, so the Hub refuses if the branch moved since
            info = api.create_commit(repo_id, operations, commit_message=message, revision=branch, parent_commit=parent)
            commit, url = info.oid, str(info.commit_url)
        except Exception:  # the commit may have landed all the same, its answer lost: then the branch holds these files
            commit = None
            with contextlib.suppress(Exception):
                head = self.refs()[0].get(branch)
                commit = head if head != parent and holds(api, repo_id, head, staging, staged) else None
            if commit is None:
                raise
            url = f"{api.endpoint}/{repo_id}/commit/{commit}"
        self.heads[branch] = commit
        logger.info("pushed %d files of %s to %s", len(staged), source, self.where)
        return Pushed(repo_id, branch, commit, url, new=commit != parent)

    def set_tag(self, tag: str, pushed: Pushed) -> Pushed:
        """Name `pushed` by `tag`, moving it (deleted, then created: the Hub has no move) once the commit exists."""
        old, deleted = self.tags.get(tag), False
        try:
            if old not in (None, pushed.commit):
                self.api.delete_tag(self.repo_id, tag=tag)
                deleted = True
            if old != pushed.commit:
                self.api.create_tag(self.repo_id, tag=tag, revision=pushed.commit)
        except Exception as err:
            with contextlib.suppress(Exception):
                if self.refs()[1].get(tag) == pushed.commit:  # created, with its answer lost
                    return replace(pushed, tag=tag)
            finish = f"`hf repos tag create {self.repo_id} {tag} --revision {pushed.commit}` sets it"
            finish = "Run the same command again to set it" if old is not None and not deleted else finish
            raise HubPushError(
                f"Push of {self.source} to {self.where} landed ({pushed.url}), but the tag {tag!r} was not "
                f"{'moved from ' + old[:8] if old else 'set'} ({type(err).__name__}: {err}). {finish}. "
                f"{hub_error_advice(err, self.repo_id)}"
            ) from err
        return replace(pushed, tag=tag)

    def failed(self, err: BaseException) -> HubPushError:
        """The error for a push that failed before its tag, once the Hub is put back as it was (see the class)."""
        failed = f"Push of {self.source} to {self.where} did not complete ({type(err).__name__}: {err})."
        return HubPushError(f"{failed} {self.undo()} {hub_error_advice(err, self.repo_id)}")

    def undo(self) -> str:
        """Put back what the push created or moved (see the class); says so, or which commands are left to do it."""
        from huggingface_hub.utils import RepositoryNotFoundError

        api, repo_id = self.api, self.repo_id
        if self.created:
            try:
                api.delete_repo(repo_id)
            except RepositoryNotFoundError:  # its creation failed
                return f"Nothing in {self.source} was changed, and the Hub is as it was."
            except Exception as undo:
                name, command = type(undo).__name__, f"hf repos delete {repo_id}"
                return f"The repository {repo_id} it created was not removed ({name}): `{command}` does it."
            return f"The repository {repo_id} it created was removed again: the Hub is as it was."
        with contextlib.suppress(Exception):
            self.heads = self.refs()[0]  # else a commit whose answer was lost goes unseen
        done, left = [], []
        for branch in dict.fromkeys(reversed(self.touched)):
            old, new = self.before.get(branch), self.heads.get(branch)
            commands = [f"hf repos branch delete {repo_id} {branch}"] * (new is not None)
            commands += [f"hf repos branch create {repo_id} {branch} --revision {old}"] * (old is not None)
            try:
                if new == old:
                    continue
                if branch == "main":  # see the class
                    left.append(f"main moved to {new[:8]}: only a commit of its old files can move it back")
                    continue
                if new is not None:
                    api.delete_branch(repo_id, branch=branch)
                    commands.pop(0)
                if old is not None:
                    api.create_branch(repo_id, branch=branch, revision=old)
                what = f"moved is back on {old[:8]}" if old else "created was removed again"
                done.append(f"the branch {branch} it {what}")
            except Exception as undo:
                commands = " and ".join(f"`{command}`" for command in commands)
                left.append(f"the branch {branch} was not put back ({type(undo).__name__}): {commands} does it")
        if not done + left:
            return f"Nothing in {self.source} was changed, and the Hub is as it was."
        text = "; ".join(done + left)
        return text[0].upper() + text[1:] + ("." if left else ": the Hub is as it was.")


def push(
    path: str | Path,
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool = False,
    commit_message: str | None = None,
    token: str | None = None,
    overwrite: bool = False,
    tag: str | None = None,
    tokenizer_dir: str | Path | None = None,
    api=None,
    source_name: str | None = None,
) -> Pushed:
    """Publish one output directory (or checkpoint) to `repo_id` at `revision` (created from main when missing) as one
    commit, whole or not at all, and `tag` it. Returns what it pushed (`str()`: the commit's URL)."""
    from huggingface_hub import HfApi

    api = api or HfApi(token=token)
    path = Path(path)
    branch = revision or "main"
    publication = Publication(api, repo_id, source_name or str(path))
    with staging_folder() as tmp:
        staging = Path(tmp)
        staged = stage(path, repo_id, staging, tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None)
        try:
            same = partial(holds, api, repo_id, staging=staging, staged=staged)
            publication.preflight([branch], _run_identity(path), overwrite, tag, same)
            message = commit_message or f"Upload {path.name} with bert_repro"
            pushed = publication.commit(branch, staging, staged, message, private, source_name or str(path))
        except HubPushError:
            raise
        except Exception as err:
            raise publication.failed(err) from err
    return publication.set_tag(tag, pushed) if tag else pushed


CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def publishable_checkpoints(output_dir: Path) -> dict[int, Path]:
    """{step: folder} of the `checkpoint-N` folders whose model opens; any other folder is named and left out."""
    found = {}
    for folder in sorted(output_dir.glob("checkpoint-*")):
        match = CHECKPOINT.fullmatch(folder.name)
        if not match or not folder.is_dir():
            logger.warning("left out %s: not a checkpoint-N folder that Trainer saves", folder)
            continue
        try:
            check_model_dir(folder)
        except CheckpointError as err:
            logger.warning("left out %s: %s", folder, err)
            continue
        found[int(match.group(1))] = folder
    return dict(sorted(found.items()))


def push_checkpoints(
    output_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    overwrite: bool = False,
    api=None,
    revision: str | None = None,
    tag: str | None = None,
    commit_message: str | None = None,
) -> dict[str, Pushed]:
    """Every `checkpoint-N` of a pre-training run as branch `step-N`, and the final model on `revision` (main), which
    `tag` names: every revision is checked before the first is pushed, and lands, or none does (`Publication`)."""
    from huggingface_hub import HfApi

    api = api or HfApi(token=token)
    output_dir = Path(output_dir)
    if not output_dir.is_dir():  # before the Hub is asked anything: a local mistake is not the Hub's
        raise FileNotFoundError(f"{output_dir}: no such directory.")
    steps = publishable_checkpoints(output_dir)
    final = bool(weight_files(output_dir))
    revisions = [f"step-{step}" for step in steps] + ([revision or "main"] if final else [])
    if tag and not final:
        raise HubPushError(f"--tag names the final model's commit, and {output_dir} holds no final model.")
    publication, pushed = Publication(api, repo_id, str(output_dir)), {}
    # A checkpoint has no run records or tokenizer of its own: the run's (in tokenizer/ until the run ends).
    tokenizer_dir = output_dir / "tokenizer" if (output_dir / "tokenizer").is_dir() else output_dir
    with staging_folder() as tmp:  # the final model's first: a rerun's tag is checked against its files
        staging = Path(tmp)
        staged = stage(output_dir, repo_id, staging) if final else []
        try:
            same = partial(holds, api, repo_id, staging=staging, staged=staged)
            publication.preflight(revisions, _run_identity(output_dir), overwrite, tag, same)
            for step, checkpoint in steps.items():  # staged one at a time: each is a copy of the weights
                with staging_folder() as checkpoint_tmp:
                    view, checkpoint_staging = Path(checkpoint_tmp) / checkpoint.name, Path(checkpoint_tmp) / "staged"
                    view.mkdir()
                    checkpoint_staging.mkdir()
                    for name in model_files(checkpoint):
                        (view / name).symlink_to((checkpoint / name).resolve())
                    for name in RECORD_FILES[:2]:
                        if (output_dir / name).exists():
                            (view / name).symlink_to((output_dir / name).resolve())
                    files = stage(view, repo_id, checkpoint_staging, tokenizer_dir=tokenizer_dir)
                    message = f"Checkpoint at step {step}"
                    pushed[f"step-{step}"] = publication.commit(
                        f"step-{step}", checkpoint_staging, files, message, private, str(checkpoint)
                    )
            if final:  # main last: the one branch that cannot be moved back (`Publication`)
                message = commit_message or f"Upload {output_dir.name} with bert_repro"
                pushed[revisions[-1]] = publication.commit(
                    revisions[-1], staging, staged, message, private, str(output_dir)
                )
        except HubPushError:
            raise
        except Exception as err:
            raise publication.failed(err) from err
    if tag:
        pushed[revisions[-1]] = publication.set_tag(tag, pushed[revisions[-1]])
    return pushed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bert_repro.hub", description="Publish a bert_repro output directory on the Hub."
    )
    parser.add_argument("path", help="A pre-training, fine-tuning or benchmark output directory, or a checkpoint.")
    parser.add_argument("--repo_id", required=True)
    parser.add_argument(
        "--revision", help="Branch to push to (created from main when missing); with --checkpoints, the final model's."
    )
    parser.add_argument("--tag", help="Also tag the pushed commit.")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--commit_message")
    parser.add_argument("--overwrite", action="store_true", help="Replace a repo that holds a different model.")
    parser.add_argument(
        "--checkpoints",
        action="store_true",
        help="Also publish every checkpoint-N as branch step-N (pre-training runs).",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore"):  # one line per HTTP request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        options = {k: getattr(args, k) for k in ("private", "overwrite", "revision", "tag", "commit_message")}
        if args.checkpoints:
            for revision, url in push_checkpoints(args.path, args.repo_id, **options).items():
                print(f"{revision}: {url}")
        else:
            print(push(args.path, args.repo_id, **options))
    except (CheckpointError, HubPushError, FileNotFoundError) as err:
        # The recipes' exit code for what the user can fix, so that a script that runs both reads one convention.
        parser.exit(2, f"error: {err}\n")


if __name__ == "__main__":
    main()
