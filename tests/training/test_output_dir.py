"""A stored result, checkpoint or vocabulary is used only by the run its record names: another run's folder is
refused, or under `--overwrite_output_dir true` moved aside whole (never deleted, never mixed with the new run)."""

import json
import os

from support.pretraining_runs import write_config

from bert_repro.training.cli import check_output_dir
from bert_repro.training.cluster import _HELD, lock_output_dir


def aside_of(out):
    """The folder `out` was moved to, the only one."""
    (moved,) = out.parent.glob(f"{out.name}.replaced-*")
    return moved


def test_overwrite_moves_the_folder_aside_under_its_lock_only(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps({"run": {"preset": "base"}}))
    (out / "results.json").write_text("{}")
    new = {"run": {"preset": "tiny"}}
    check_output_dir(out, new, resume=False, overwrite=True)  # the check before the lock: nothing moves
    assert (out / "results.json").exists() and not list(tmp_path.glob("run.replaced-*"))
    lock_output_dir(out)
    try:
        check_output_dir(out, new, resume=False, overwrite=True)
        moved = aside_of(out)
        assert json.loads((moved / "run_config.json").read_text()) == {"run": {"preset": "base"}}
        assert (moved / "results.json").exists()
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # a fresh folder, locked again
        fd = _HELD[str(out.resolve())]
        assert os.fstat(fd).st_ino == os.stat(out / "run.lock").st_ino
        check_output_dir(out, new, resume=False, overwrite=True)  # nothing left to move
        assert len(list(tmp_path.glob("run.replaced-*"))) == 1
    finally:
        os.close(_HELD.pop(str(out.resolve())))


def pretrain(config, out, *flags):
    from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining

    return run_pretraining(PreTrainingRecipe.from_args(["--config", str(config), "--output_dir", str(out), *flags]))


def vocabulary(folder):
    return len((folder / "vocab.txt").read_text().splitlines())


def test_an_overwritten_pretraining_run_uses_its_own_vocabulary_and_resumes_itself(tmp_path, corpus_and_tokenizer):
    # The old tokenizer/ was reused (500 entries where the record said 800, a --tokenizer given ignored), and the
    # overwriting run, stopped after its first checkpoint, was then "already finished" with the old weights.
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(tmp_path / "c.yaml", corpus, tokenizer, max_steps=4, save_steps=2)
    config.write_text(config.read_text().replace(f"tokenizer: {tokenizer}\n", ""))  # a vocabulary of its own
    out = tmp_path / "out"
    pretrain(config, out, "--vocab_size", "100")
    first = vocabulary(out / "tokenizer")
    pretrain(config, out, "--vocab_size", "140", "--overwrite_output_dir", "true", "--stop_after_steps", "2")
    moved = aside_of(out)
    assert (moved / "results.json").exists() and vocabulary(moved / "tokenizer") == first
    assert not (out / "results.json").exists() and vocabulary(out / "tokenizer") > first
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    results = pretrain(config, out, "--vocab_size", "140", "--resume_from_checkpoint", "true")
    assert results["global_step"] == 4 and "stopped_at_step" not in results
    assert json.loads((out / "config.json").read_text())["vocab_size"] == vocabulary(out / "tokenizer") > first
    pretrain(config, out, "--tokenizer", str(tokenizer), "--overwrite_output_dir", "true")
    assert (
        vocabulary(out / "tokenizer")
        == vocabulary(tokenizer)
        == json.loads((out / "config.json").read_text())["vocab_size"]
    )
    assert len(list(tmp_path.glob("out.replaced-*"))) == 2
