"""Kill a recipe at its N-th file write, for every N: the harness of tests/e2e/test_crash_consistency.py.

A write point, under the scenario's folder (the run's output and its datasets cache), is a file opened for writing
(`open`, `io.open`, `os.open` with O_CREAT or O_TRUNC), a rename, or a save by torch, safetensors or tokenizers (C++
or Rust, which no Python `open` sees). SIGKILL comes right after an open (an empty file, as a kill mid-write leaves),
before a rename, or after a native save with the file cut to half (a torn write).

Importing torch and transformers takes longer than a tiny run, so as a script (one JSON plan a line on stdin, one
report a line on stdout) it imports them once and forks a child per command, run as `python recipes/x.py` would.
A plan is a list of scenarios {"root": folder, "commands": [{"argv": [...], "kill_at": N or 0, "only_if_said": text}
or {"move": [from, to]}]}: "only_if_said" runs a command only if the previous one's stderr says it. The report gives
each command's exit code, stderr's tail and the write point it was killed at. Scenarios run one per core at once
(`python tests/write_points.py JOBS`), each in a forked process of its own.

Another point, e.g. after a function that writes through a library no Python `open` sees: one line in `install`,
`module.function = after(module.function, "kind", lambda args, kwargs: path)` (the path decides whether the point is
under the scenario's folder); tests/e2e/test_crash_consistency.py's STAGES then names the stage it belongs to.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC


class _Points:
    """Counts the write points under `root` and kills the run's process group at the `kill_at`-th (0: never); the
    count is shared with forked workers (datasets' write its cache)."""

    def __init__(self, root: Path, kill_at: int, said: Path):
        import multiprocessing

        self.root, self.kill_at, self.said = str(root), kill_at, said
        self.counter = multiprocessing.Value("q", 0)  # shared memory, inherited by forked workers

    @property
    def count(self) -> int:
        return self.counter.value

    def under_root(self, path) -> bool:
        if isinstance(path, int):
            return False
        try:
            return os.path.abspath(os.fspath(path)).startswith(self.root)
        except TypeError:
            return False

    def reached(self, kind: str, path, *, tear: bool = False) -> None:
        if not self.under_root(path):
            return
        with self.counter.get_lock():
            self.counter.value += 1
            n = self.counter.value
            if not self.kill_at:  # the counting run: every point, for the test to choose from
                with builtins_open(self.said, "a") as handle:
                    handle.write(f"{n} {kind} {os.fspath(path)}\n")
        if n != self.kill_at:
            return
        with builtins_open(self.said, "w") as handle:  # where it was killed, for the report
            handle.write(f"{kind} {os.fspath(path)}")
        if tear and os.path.isfile(path):
            os.truncate(path, os.path.getsize(path) // 2)
        os.killpg(0, signal.SIGKILL)


builtins_open = builtins.open


def install(points: _Points) -> None:
    """Patch the write functions of this (child) process."""
    original_os_open, original_replace, original_rename = os.open, os.replace, os.rename

    def open_(file, mode="r", *args, **kwargs):
        handle = builtins_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax+"):
            points.reached(f"open({mode})", file)
        return handle

    def os_open(path, flags, *args, **kwargs):
        fd = original_os_open(path, flags, *args, **kwargs)
        if flags & (os.O_CREAT | os.O_TRUNC) and flags & (os.O_WRONLY | os.O_RDWR):
            points.reached("os.open", path)
        return fd

    def replace(src, dst, *args, **kwargs):
        points.reached("replace", dst)
        return original_replace(src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        points.reached("rename", dst)
        return original_rename(src, dst, *args, **kwargs)

    builtins.open = io.open = open_
    os.open, os.replace, os.rename = os_open, replace, rename

    import safetensors.torch
    import torch
    import transformers.modeling_utils

    def after(function, kind, path_of, *, tear=False):
        """`function` with a write point when it returns; `tear` cuts the file it wrote to half (a torn write)."""

        def wrapped(*args, **kwargs):
            result = function(*args, **kwargs)
            points.reached(kind, path_of(args, kwargs), tear=tear)
            return result

        return wrapped

    second = lambda name: lambda a, k: k.get(name, a[1] if len(a) > 1 else None)  # noqa: E731
    torch.save = after(torch.save, "save", second("f"), tear=True)
    safe = after(safetensors.torch.save_file, "save_file", second("filename"), tear=True)
    safetensors.torch.save_file = transformers.modeling_utils.safe_save_file = safe

    # tokenizer.json is written by the tokenizers library (Rust): the point is after transformers' call to it.
    import transformers.tokenization_utils_tokenizers as fast

    backend = fast.TokenizersBackend
    save_pretrained = backend._save_pretrained

    def tokenizer_save(self, save_directory, file_names, *args, **kwargs):
        written = save_pretrained(self, save_directory, file_names, *args, **kwargs)
        points.reached("tokenizer.save", written[-1], tear=True)
        return written

    backend._save_pretrained = tokenizer_save


def _child(argv: list[str], root: Path, kill_at: int, tag: Path) -> None:
    """Run one recipe command in this forked child, its output in `tag`.out / `tag`.err; never returns."""
    for fd, name in ((1, "out"), (2, "err")):
        target = os.open(f"{tag}.{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(root)
    os.setpgid(0, 0)  # the run and its workers: one group, killed together
    import datasets.config

    datasets.config.HF_DATASETS_CACHE = root / "datasets_cache"  # each scenario its own cache, as its own machine
    points = _Points(root, kill_at, Path(f"{tag}.killed"))
    install(points)
    sys.argv = list(argv)
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
        if not isinstance(err.code, (int, type(None))):
            print(err.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    with builtins_open(f"{tag}.count", "w") as handle:
        handle.write(str(points.count))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_command(argv: list[str], root: Path, kill_at: int, tag: Path) -> dict:
    pid = os.fork()
    if pid == 0:
        try:
            _child(argv, root, kill_at, tag)
        finally:
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    read = lambda suffix: Path(f"{tag}.{suffix}").read_text() if Path(f"{tag}.{suffix}").exists() else None  # noqa: E731
    return {
        "argv": argv,
        "kill_at": kill_at,
        "returncode": code,
        "stderr": (read("err") or "")[-6000:],
        "killed_at": read("killed") if kill_at else None,
        "points_seen": (read("killed") or "").splitlines() if not kill_at else None,
        "points": int(read("count") or 0),
    }


def run_scenario(scenario: dict) -> None:
    """The scenario's commands one after the other, in this forked process; the report in the scenario's folder."""
    root, done = Path(scenario["root"]), []
    for i, command in enumerate(scenario["commands"]):
        if "move" in command:  # a run folder moved between two commands (scratch -> project space)
            os.rename(*command["move"])
            continue
        said = command.get("only_if_said")
        if said is not None and (not done or said not in done[-1]["stderr"]):
            continue
        done.append(run_command(command["argv"], root, command.get("kill_at", 0), root / f"command{i}"))
    (root / "scenario_report.json").write_text(json.dumps(done))


def run_plan(plan: list[dict], jobs: int) -> list[list[dict]]:
    """The scenarios `jobs` at once (a tiny run keeps one core busy), each in a process of its own."""
    for i, scenario in enumerate(plan):
        Path(scenario["root"]).mkdir(parents=True, exist_ok=True)
        if i >= jobs:
            os.wait()
        if os.fork() == 0:
            try:
                run_scenario(scenario)
            except BaseException:
                traceback.print_exc()
            os._exit(0)
    for _ in range(min(jobs, len(plan))):
        os.wait()
    return [json.loads((Path(s["root"]) / "scenario_report.json").read_text()) for s in plan]


if __name__ == "__main__":
    # The recipes' imports, once (the children inherit them).
    import bert_repro.training.finetuning
    import bert_repro.training.pretraining  # noqa: F401

    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    reports = sys.stdout
    sys.stdout = sys.stderr  # anything else printed stays out of the reports
    for line in sys.stdin:  # one plan (a JSON list of scenarios) a line, one report a line
        reports.write(json.dumps(run_plan(json.loads(line), jobs)) + "\n")
        reports.flush()
