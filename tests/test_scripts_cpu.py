"""CPU checks of the developer scripts (no GPU needed)."""
import collections
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
VALIDATE = ROOT / "scripts" / "validate_h200.sh"


def test_validate_parts_are_unique_and_parse():
    # `case` takes the first matching label: a second part with an existing name never runs
    # (session 13 lost its last device minutes to that).
    text = VALIDATE.read_text()
    labels = re.findall(r"^  ([A-Za-z0-9_]+)\)\s*$", text, flags=re.M)
    assert labels, "no PART labels found"
    dups = [name for name, n in collections.Counter(labels).items() if n > 1]
    assert not dups, f"duplicate PART labels in {VALIDATE.name}: {dups}"
    subprocess.run(["bash", "-n", str(VALIDATE)], check=True)
