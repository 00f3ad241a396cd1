"""How a card writes numbers and settings: thousands separated, scores with two decimals, times as people read them,
and "not recorded" for a value the run did not record. Each is also a filter of the cards' templates
(`card_base.template_environment`), so that a template says how it prints what its facts object holds."""

from __future__ import annotations

import json
from typing import Any

from ..tasks.metrics import is_number

NOT_RECORDED = "not recorded"


def format_setting(value: Any) -> str:
    """One recorded setting as the card shows it (JSON spelling: true/false, lists and mappings as JSON)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def plain(value: Any) -> str:
    """A setting in prose: whole floats without ".0", None as "not recorded"."""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return NOT_RECORDED if value is None else format_setting(value)


def warmup(value: Any) -> str:
    """transformers 5.x `warmup_steps`: a float below 1 is a share of the steps."""
    if is_number(value) and 0 < value < 1:
        return f"{100 * value:g}% of the steps"
    return f"{plain(value)} steps"


def plural(n: int, noun: str, ending: str = "s") -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else ending)


def duration(seconds: Any) -> str:
    """A time as people read it: "42 s", "3.1 min", "2.0 h"."""
    if not is_number(seconds):
        return NOT_RECORDED
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3570 else f"{seconds / 3600:.1f} h"


def minutes(seconds: Any) -> str:
    return f"{seconds / 60:.1f}" if is_number(seconds) else NOT_RECORDED


def score(value: Any, missing: str = NOT_RECORDED) -> str:
    return f"{value:.2f}" if is_number(value) else missing


def loss(value: Any) -> str:
    return f"{value:.4f}" if is_number(value) else NOT_RECORDED


def count(value: Any) -> str:
    return f"{value:,}" if is_number(value) else NOT_RECORDED


def share(value: Any) -> str:
    return f"{100 * value:.1f}%" if is_number(value) else NOT_RECORDED


FILTERS = {f.__name__: f for f in (plain, warmup, plural, duration, minutes, score, loss, count, share, format_setting)}
