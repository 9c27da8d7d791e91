"""CPU checks of the developer scripts (no GPU needed): the shell scripts parse, and the A/B
harness's cell list and slow-cell summary (what decides whether a change lost speed) are right."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"
# The sdist carries the tests but not the developer scripts.
pytestmark = pytest.mark.skipif(not (SCRIPTS / "ab_two_builds.py").is_file(),
                                reason="no scripts/ here (an unpacked sdist)")


def _ab_module():
    spec = importlib.util.spec_from_file_location("ab_two_builds", SCRIPTS / "ab_two_builds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)


def test_ab_harness_help_needs_no_gpu():
    r = subprocess.run([sys.executable, str(SCRIPTS / "ab_two_builds.py"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "grid" in r.stdout


def test_ab_harness_cells():
    ab = _ab_module()
    grid = ab.make_cells({"grid"})
    # 3 head dims x causal off / on x 6 seqlens x fwd / bwd, all names distinct.
    assert len(grid) == 72 and len({ab.cell_name(c) for c in grid}) == 72
    assert len(ab.make_cells({"decode"})) == 6 and len(ab.make_cells({"varlen"})) == 6
    lens = ab.varlen_lengths()
    assert sum(lens) == 16384 and (min(lens), max(lens), len(lens)) == (293, 3774, 8)


def test_ab_harness_summary():
    ab = _ab_module()
    names = ["a", "b", "c", "d"]
    base = {"a": 100.0, "b": 100.0, "c": 100.0, "d": None}
    new = {"a": 97.9, "b": 98.5, "c": 104.0, "d": 50.0}
    ratios, geo, slower, worst = ab.summarize(names, base, new, 0.02)
    assert ratios["d"] is None and slower == ["a"] and worst == "a"
    assert geo == pytest.approx((0.979 * 0.985 * 1.04) ** (1 / 3))
