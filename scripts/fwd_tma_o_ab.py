#!/usr/bin/env python3
"""A/B of the forward epilogue's TMA store of O (session 26): FLASH_ATTN_FWD_TMA_O=0 (16-byte
stores by every consumer thread, arm A) against 1 (one TMA store per warpgroup tile, arm B), as
scripts/fwd_env_ab.py does for any run-time switch.

    python scripts/fwd_tma_o_ab.py
"""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(subprocess.call([sys.executable, os.path.join(here, "fwd_env_ab.py"), "FLASH_ATTN_FWD_TMA_O", "0", "1"]))
