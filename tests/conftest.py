"""pytest configuration for the flash_attn test suite.

- Registers the ``slow`` marker (the wide parameter sweep).  Slow tests are skipped unless
  the environment has FLASH_ATTN_TEST_FULL=1.
- Seeds torch's RNG per test from the test's id (and FLASH_ATTN_TEST_SEED, default 0), so a
  failure reproduces by re-running the one test.
- Keeps TF32 off, so that the fp32 reference really is fp32.
- Tests the installed package when one is installed: `python -m pytest tests` from the repo root
  puts the root on sys.path, so after a non-editable `pip install .` the source tree's
  flash_attn (which has no compiled _C) would shadow the installed one. When the source tree has
  no compiled _C and a flash_attn is importable from outside it, the root is dropped from
  sys.path before anything imports flash_attn. An editable install, or a source tree with its
  _C built in place, is tested as it is. The report header says which flash_attn runs.
"""

import importlib.util
import os
import sys
import zlib
from pathlib import Path

import pytest
import torch

# Make the helper module importable whatever pytest's import mode is.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

_ROOT = Path(_TESTS_DIR).resolve().parent


def _is_root(entry):
    try:
        return Path(entry or os.getcwd()).resolve() == _ROOT
    except (OSError, ValueError):
        return False


def _inside_root(path):
    try:
        return Path(path).resolve().is_relative_to(_ROOT)
    except (OSError, ValueError):
        return False


def _prefer_installed_flash_attn(sys_path=None):
    """Drop the repo root from `sys_path` (default sys.path) when the source tree's flash_attn has
    no compiled _C and another flash_attn is importable without the root. Returns the removed
    entries ([] when nothing changed)."""
    sys_path = sys.path if sys_path is None else sys_path
    src_pkg = _ROOT / "flash_attn"
    if not (src_pkg / "__init__.py").is_file():
        return []
    if any(src_pkg.glob("_C*.so")) or any(src_pkg.glob("_C*.pyd")):
        return []  # built in place (an editable install, or build_ext --inplace): test it
    removed = [p for p in sys_path if _is_root(p)]
    if not removed:
        return []
    saved = list(sys_path)
    sys_path[:] = [p for p in sys_path if not _is_root(p)]
    cached = {k: v for k, v in sys.modules.items() if k == "flash_attn" or k.startswith("flash_attn.")}
    for k in cached:
        del sys.modules[k]
    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    if origin and not _inside_root(origin):
        return removed  # an installed flash_attn outside the source tree: use it
    sys_path[:] = saved  # nothing installed elsewhere (or an editable install): the source tree
    sys.modules.update(cached)
    return []


_DROPPED_FROM_SYS_PATH = _prefer_installed_flash_attn()

FULL = os.environ.get("FLASH_ATTN_TEST_FULL", "0") not in ("", "0", "false", "False")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: the wide parameter sweep; runs only with FLASH_ATTN_TEST_FULL=1",
    )
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and the compiled extension")


def pytest_collection_modifyitems(config, items):
    """Deselect the slow sweep unless FLASH_ATTN_TEST_FULL=1 (or `-m` names it)."""
    if FULL or "slow" in (config.getoption("markexpr", "") or ""):
        return
    keep, slow = [], []
    for item in items:
        (slow if "slow" in item.keywords else keep).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


def pytest_report_header(config):
    lines = [f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"]
    spec = importlib.util.find_spec("flash_attn")
    where = os.path.dirname(spec.origin) if spec and spec.origin else "not importable"
    note = " (installed; the source tree has no compiled _C)" if _DROPPED_FROM_SYS_PATH else ""
    lines.append(f"flash_attn from {where}{note}")
    try:
        import fa_test_utils

        lines.append(fa_test_utils.extension_summary())
    except Exception as e:  # the header must never break collection
        lines.append(f"flash_attn extension: could not be summarised ({e})")
    lines.append(f"FLASH_ATTN_TEST_FULL={'1' if FULL else '0'}")
    return lines


@pytest.fixture(autouse=True)
def _seed_and_precision(request):
    base = int(os.environ.get("FLASH_ATTN_TEST_SEED", "0"))
    torch.manual_seed(base + zlib.crc32(request.node.nodeid.encode()))
    old_matmul = torch.backends.cuda.matmul.allow_tf32
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old_matmul
    torch.backends.cudnn.allow_tf32 = old_cudnn
