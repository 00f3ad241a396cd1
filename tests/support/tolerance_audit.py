"""How much room each tolerance check of the tests has, as a pytest plugin: `make tolerances`, or
`pytest -p support.tolerance_audit -m "not slow" tests/...`.

A check passing at 0.9 of its tolerance fails on the next machine, and a mistake that moves a result by 1.3
tolerances is caught by luck (a LayerNorm ignoring its eps moved the parity outputs by 1.3e-5 against 1e-5). The
plugin measures every `torch.testing.assert_close`, `torch.allclose`, `torch.isclose`, `numpy.testing.assert_allclose`
and `pytest.approx` in units of its own tolerance (atol + rtol * |expected|) and reports per line "near the edge"
(0.5 < distance <= 1) and "narrowly apart" (1 < distance < 2); exact comparisons are not counted. tests/MUTATION.md,
"Tolerances with a margin", says what the last audit found.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from support.models import PARITY_REPORT, PARITY_TOLERANCE

TESTS = Path(__file__).resolve().parents[1]
# torch.testing.assert_close's documented defaults (rtol, atol) by dtype
ASSERT_CLOSE_DEFAULTS = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
NEAR, APART = 0.5, 2.0

_worst: dict[tuple[str, str], float] = {}  # (test line, what) -> its distance closest to the tolerance
_current_test = ["?"]


def _where() -> str:
    """file:line of the innermost frame in a test file (the check's own line, not a helper's in support/)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if TESTS in path.parents and "support" not in path.parts[len(TESTS.parts) :][:1]:
            return f"{path.relative_to(TESTS.parent)}:{frame.f_lineno}"
        frame = frame.f_back
    return _current_test[0]


def _distance(actual, expected, rtol: float, atol: float) -> float | None:
    if rtol == 0 and atol == 0:
        return None
    try:
        a, b = torch.broadcast_tensors(_as_float64(actual), _as_float64(expected))
    except (TypeError, ValueError, RuntimeError):
        return None
    same = (a == b) | (a.isnan() & b.isnan())
    gap = ((a - b).abs() / (atol + rtol * b.abs())).masked_fill(same, 0.0)
    return float(gap.max()) if gap.numel() else 0.0


def _as_float64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x.detach().cpu() if torch.is_tensor(x) else x), dtype=torch.float64)


def _record(what: str, distance: float | None) -> None:
    if distance is None or not (NEAR < distance < APART) or math.isnan(distance):
        return
    key = (_where(), what)
    # the worst of each band: the closest to the tolerance from either side
    if key not in _worst or abs(distance - 1) < abs(_worst[key] - 1):
        _worst[key] = distance


def _wrap_assert_close(original):
    def assert_close(actual, expected, *args, rtol=None, atol=None, **kwargs):
        dtype = actual.dtype if torch.is_tensor(actual) else torch.float64
        default_rtol, default_atol = ASSERT_CLOSE_DEFAULTS.get(dtype, (0.0, 0.0))
        tolerances = (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)
        if torch.is_tensor(actual) or isinstance(actual, float):
            _record("assert_close", _distance(actual, expected, *tolerances))
        return original(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)

    return assert_close


def _wrap_allclose(original, what):
    def allclose(input, other, rtol=1e-05, atol=1e-08, *args, **kwargs):
        _record(what, _distance(input, other, rtol, atol))
        return original(input, other, rtol, atol, *args, **kwargs)

    return allclose


def _wrap_np_allclose(original):
    def assert_allclose(actual, desired, rtol=1e-07, atol=0, *args, **kwargs):
        _record("assert_allclose", _distance(actual, desired, rtol, atol))
        return original(actual, desired, rtol, atol, *args, **kwargs)

    return assert_allclose


def _wrap_approx_eq(original):
    def __eq__(self, actual):
        try:
            tolerance = self.tolerance
            if tolerance and isinstance(self.expected, (int, float)) and isinstance(actual, (int, float)):
                _record("approx", abs(actual - self.expected) / tolerance)
        except (TypeError, ValueError, OverflowError):
            pass
        return original(self, actual)

    return __eq__


def pytest_configure(config):
    mp = pytest.MonkeyPatch()  # for the whole session: the process ends with it
    mp.setattr(torch.testing, "assert_close", _wrap_assert_close(torch.testing.assert_close))
    mp.setattr(torch, "allclose", _wrap_allclose(torch.allclose, "allclose"))
    mp.setattr(torch, "isclose", _wrap_allclose(torch.isclose, "isclose"))
    mp.setattr(np.testing, "assert_allclose", _wrap_np_allclose(np.testing.assert_allclose))
    # pytest.approx's scalar comparison: sequences and mappings of approx compare element by element through it
    scalar = type(pytest.approx(1.0))
    mp.setattr(scalar, "__eq__", _wrap_approx_eq(scalar.__eq__))


def pytest_runtest_setup(item):
    _current_test[0] = item.nodeid


def pytest_terminal_summary(terminalreporter):
    for name, diff in PARITY_REPORT:  # the parity tests' own check: diff <= PARITY_TOLERANCE
        _worst[(name, "parity")] = diff / PARITY_TOLERANCE
    bands = defaultdict(list)
    for (where, what), distance in sorted(_worst.items()):
        if not NEAR < distance < APART:
            continue
        bands["near the edge" if distance <= 1 else "narrowly apart"].append((where, what, distance))
    write = terminalreporter.write_line
    write(f"tolerance audit: {sum(map(len, bands.values()))} checks within a factor of 2 of their tolerance")
    for band in ("near the edge", "narrowly apart"):
        for where, what, distance in bands[band]:
            write(f"  {band:15} {distance:5.2f} x tolerance  {what:15} {where}")
