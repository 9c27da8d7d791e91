"""Runs each case of a GPU check script in its own Python process under a timeout, so that a
kernel that hangs (a wrong barrier or counter order) shows up as a FAIL line instead of stopping
the whole check. Used by check_bwd_ws_det.py and check_bwd_ws_dropout.py: the script re-runs
itself with `--case i`, prints one PASS / FAIL line per case and returns the number of failures.
"""

import subprocess
import sys


def run_cases_in_processes(script, cases, timeout, label_width=60):
    failed = 0
    for i, case in enumerate(cases):
        label = " ".join(str(x) for x in case)
        try:
            r = subprocess.run([sys.executable, script, "--case", str(i)], capture_output=True, text=True,
                               timeout=timeout)
            ok = r.returncode == 0
            msg = (r.stdout.strip().splitlines() or [""])[-1] if ok else (r.stdout + r.stderr).strip()[-600:]
        except subprocess.TimeoutExpired:
            ok, msg = False, f"TIMEOUT after {timeout:.0f} s (hang?)"
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {label:<{label_width}} {msg}", flush=True)
    print("ALL PASS" if not failed else f"{failed} FAILED")
    return failed
