"""pytest configuration for the flash_attn test suite.

- Registers the ``slow`` marker (the wide parameter sweep).  Slow tests are skipped unless
  the environment has FLASH_ATTN_TEST_FULL=1.
- Seeds torch's RNG per test from the test's id (and FLASH_ATTN_TEST_SEED, default 0), so a
  failure reproduces by re-running the one test.
- Keeps TF32 off, so that the fp32 reference really is fp32.
"""

import os
import sys
import zlib

import pytest
import torch

# Make the helper module importable whatever pytest's import mode is.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

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
