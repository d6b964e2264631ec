"""bench_json.py - one attnkit-bench run read as its first JSON row's median.

The rule the GPU scripts (gpu_sdpa.py, ab.py) share: a time counts only when
the row's status is ok; otherwise the reason (the row's, or the exit status
and the last lines of stderr) comes back instead.
"""

import json
import subprocess


def bench_median_ms(cmd, timeout=None):
    """Runs cmd (an attnkit-bench command with --json); returns (median ms, "")
    or (None, why)."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except ValueError:
                return None, "a line that is not JSON: %s" % line[:80]
            if row.get("median_ms") is not None and row.get("status") == "ok":
                return float(row["median_ms"]), ""
            return None, row.get("reason") or row.get("status", "no time")
    return None, "attnkit-bench exit %d: %s" % (proc.returncode, " | ".join(proc.stderr.strip().splitlines()[-2:]))
