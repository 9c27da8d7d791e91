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


def test_benchmark_sink_cost_alternates_the_order():
    """benchmarks/benchmark_attn.py --sinks times the sink and the plain call in alternating order
    (the later of two sequential timings reads slower at the power cap)."""
    import torch

    path = SCRIPTS.parent / "benchmarks" / "benchmark_attn.py"
    spec = importlib.util.spec_from_file_location("benchmark_attn", path)
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    bm.DEVICE = "cpu"
    order = []

    class StubBench:
        timer_kind, ours_error = "stub", None

        def __init__(self):
            self.torch = torch
            self.ours = lambda q, k, v, **kw: "learnable_sink" in kw

        def n_rotations(self, set_bytes):
            return 1

        def make_inputs(self, cfg, n_sets, dtype):
            return [(None, None, None)]

        def time_phase(self, backend, phase, cfg, sets, fn=None):
            with_sink = fn(*sets[0])
            order.append(with_sink)
            return (2.0 if with_sink else 1.0) * (1 if phase == "fwd" else 3)

    rows = []
    bm.run_sink_cost(StubBench(), bm.parse_args(["--sinks", "--sink-rounds", "2"]), rows)
    # per window: round 0 plain then sink, round 1 sink then plain (fwd and bwd each)
    assert order[:8] == [False, False, True, True, True, True, False, False]
    assert [(r["backend"], r["fwd_ms"], r["bwd_ms"]) for r in rows[:2]] == [("ours", 1.0, 3.0), ("ours:sink", 2.0, 6.0)]
    assert len(rows) == 2 * len(bm.SINK_WINDOWS)


def test_benchmark_sdpa_ab_alternates_the_order():
    """benchmarks/benchmark_attn.py --sdpa-ab times flash_attn_func and SDPA on our kernels in
    alternating order per cell and reports their ratio."""
    import torch

    path = SCRIPTS.parent / "benchmarks" / "benchmark_attn.py"
    spec = importlib.util.spec_from_file_location("benchmark_attn", path)
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    order = []

    class StubBench:
        timer_kind = "stub"

        def __init__(self):
            self.torch = torch

        def n_rotations(self, set_bytes):
            return 1

        def make_inputs(self, cfg, n_sets, dtype):
            return [(None, None, None)]

        def time_phase(self, backend, phase, cfg, sets):
            order.append(backend)
            return (1.25 if backend == "sdpa_ours" else 1.0) * (1 if phase == "fwd" else 3)

    rows = []
    args = bm.parse_args(["--sdpa-ab", "--ab-rounds", "2", "--seqlens", "1024", "--headdims", "64", "--causal", "0"])
    bm.run_sdpa_ab(StubBench(), args, rows)
    # round 0: ours (fwd, bwd) then SDPA; round 1: SDPA then ours
    assert order == ["ours", "ours", "sdpa_ours", "sdpa_ours", "sdpa_ours", "sdpa_ours", "ours", "ours"]
    assert [(r["backend"], r["fwd_ms"], r["bwd_ms"]) for r in rows] == [("ours", 1.0, 3.0), ("sdpa_ours", 1.25, 3.75)]


def test_benchmark_compares_with_fa3_through_cudnn():
    """The grid summary puts ours beside FA3 as (ours / cuDNN) / (FA3 / cuDNN), the ratio the
    anchors file holds per cell."""
    path = SCRIPTS.parent / "benchmarks" / "benchmark_attn.py"
    spec = importlib.util.spec_from_file_location("benchmark_attn", path)
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    anchors = bm.load_fa3_anchors()
    assert anchors[(128, 1, 8192)]["bwd"] > 0 and len(anchors) == 36
    fa3 = anchors[(128, 0, 4096)]
    by = {("bf16", 0, 128, 4096): {"ours": {"fwd_tflops": 2.0 * fa3["fwd"], "bwd_tflops": fa3["bwd"]},
                                   "cudnn": {"fwd_tflops": 1.0, "bwd_tflops": 1.0}}}
    lines, summary = bm.fa3_comparison(by, anchors)
    assert summary["bf16 causal=0 d=128"] == pytest.approx({"fwd": 2.0, "bwd": 1.0})
    assert any("fwd: geometric mean 2.000, 1 of 1 cells >= 1.05" in line for line in lines)
    assert any("bwd: geometric mean 1.000, 0 of 1 cells >= 1.05" in line for line in lines)
