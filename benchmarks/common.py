"""Shared by the benchmark scripts: the machine's measured matmul peak and a one-line description of the machine."""

from __future__ import annotations

import os
import platform
import shutil
import time
from pathlib import Path

import torch


def import_checkpoint(source: str, out: Path) -> None:
    """A public BERT checkpoint (transformers' format, a Hub id or Google's TensorFlow) as a bert_repro directory
    with the base model's head, its tokenizer files beside it: what `python -m bert_repro.model.conversion import
    SOURCE OUT --head base` writes."""
    from bert_repro.model import TOKENIZER_FILES, load_bert

    load_bert(source, "base").save_pretrained(out)
    for name in TOKENIZER_FILES:
        if Path(source, name).is_file():
            shutil.copy2(Path(source, name), Path(out, name))


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 2048, device: str = "cpu", seconds: float = 1.0) -> float:
    """Measured GFLOP/s of an n x n x n matrix product in `dtype` (the machine's practical peak), in about `seconds`:
    where one product would take longer (bf16 on a CPU without bf16 units runs at a fraction of a GFLOP/s), a
    smaller n."""
    while True:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        a @ b  # first call: allocation and kernel choice
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        one = time.perf_counter() - start
        if one * 4 <= seconds or n <= 128:
            break
        n //= 2
    reps = max(3, int(seconds / max(one, 1e-6)))
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def machine() -> str:
    if torch.cuda.is_available():
        where = torch.cuda.get_device_name()
    else:
        where = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"
    return f"{where}; torch {torch.__version__}, {torch.get_num_threads()} threads"
