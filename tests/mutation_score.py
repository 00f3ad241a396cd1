"""The mutation score per module from mutmut's results in mutants/ (`make mutation` prints it).

Killed counts timeouts, type-check catches and segfaults (a datasets map whose workers fail can end that way); the
score divides by every mutant but the skipped and unchecked, so those no test reached count as survivors.
Run from the repository root: python tests/mutation_score.py
"""

import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

KILLED = {"killed", "timeout", "caught by type check", "segfault"}
NOT_RUN = {"not checked", "skipped"}


def main() -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run([str(mutmut), "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    counts: dict[str, Counter] = defaultdict(Counter)
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if not sep or "__mutmut_" not in name:
            continue
        module = name.split(".x")[0]
        counts[module][status] += 1
    print(f"{'module':45} {'mutants':>7} {'killed':>7} {'survived':>8} {'not run':>7} {'score':>6}")
    for module, c in sorted(counts.items()):
        run = sum(n for s, n in c.items() if s not in NOT_RUN)
        killed = sum(n for s, n in c.items() if s in KILLED)
        score = f"{100 * killed / run:.1f}%" if run else "-"
        print(f"{module:45} {sum(c.values()):7} {killed:7} {run - killed:8} {sum(c.values()) - run:7} {score:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
