"""The Hub push at the end of a run (`--push_to_hub`): checked before any work, done by `bert_repro.hub.push` once
the run is complete; kept out of the command line's module, which the model card reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .cli import ConfigurationError


@dataclass
class PushRequest:
    """What `--push_to_hub` asks for; the token only here, as Trainer pickles its arguments into checkpoints."""

    repo_id: str
    private: bool = False
    revision: str | None = None
    token: str | None = field(default=None, repr=False)

    @property
    def target(self) -> dict:
        """Where the push goes: the "push" stage is done only for the same target."""
        return {"repo_id": self.repo_id, "revision": self.revision}

    def push_command(self, output_dir: str | Path, *extra: str) -> str:
        """The command that publishes the run again without training (the token never written out)."""
        revision = ("--revision", self.revision) if self.revision else ()
        private = ("--private",) if self.private else ()
        return " ".join(
            ["python -m bert_repro.hub", str(output_dir), "--repo_id", self.repo_id, *revision, *private, *extra]
        )

    def push(self, output_dir: str | Path, push, *extra: str, **kwargs):
        """Call `push` (of `bert_repro.hub.push`); a failure gives the command that publishes the complete run."""
        from ..hub.push import HubPushError

        try:
            return push(
                output_dir, self.repo_id, revision=self.revision, private=self.private, token=self.token, **kwargs
            )
        except HubPushError as err:
            raise HubPushError(
                f"{err} The run is complete in {output_dir}; to publish it without training again: "
                f"{self.push_command(output_dir, *extra)}"
            ) from None


def take_push_request(training) -> PushRequest | None:
    """`--push_to_hub --hub_model_id ID` is done by `bert_repro.hub.push` at the end, not by Trainer, whose own push
    would upload pickles (training_args.bin) and no model card. The token moves from `training` into the request."""
    token, training.hub_token = training.hub_token, None
    if not training.push_to_hub:
        return None
    if not training.hub_model_id:
        raise ConfigurationError("--push_to_hub needs --hub_model_id (e.g. your-name/bert-base-repro).")
    from ..hub.push import HubPushError, check_hub_access

    try:  # now, not after training: a wrong id, a refused token or no network fail in seconds
        check_hub_access(training.hub_model_id, token=token)
    except HubPushError as err:
        raise ConfigurationError(str(err)) from None
    training.push_to_hub = False
    return PushRequest(training.hub_model_id, bool(training.hub_private_repo), training.hub_revision, token)
