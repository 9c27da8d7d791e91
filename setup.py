"""Build script for flash_attn.

Kernel selection comes from environment variables so that a developer build of one
configuration takes a minute or two (see docs/design.md):

    FLASH_ATTN_CUDA_ARCHS   SM targets to build machine code for; default: the visible GPUs'
                            (when all are sm_80/86/89/90), else "80;90". "90" means sm_90a.
    FLASH_ATTN_HEAD_DIMS    "32,64,96,128,192,256" (default) -- head-dim tiles to instantiate
    FLASH_ATTN_DTYPES       "fp16,bf16" (default)
    FLASH_ATTN_SKIP_CUDA_BUILD=1  -- install the Python package only
    FLASH_ATTN_PTXAS_VERBOSE=1    -- print registers / spills / shared memory per kernel
    FLASH_ATTN_AB_KERNELS=1       -- also compile the A/B-only kernels (measured slower than the
                                     defaults; their run-time switches need them)
    CUTLASS_PATH            -- CUTLASS headers (a checkout or an include folder); default: the
                               pinned nvidia-cutlass wheel
    MAX_JOBS                -- parallel compile jobs (ninja), default: all cores

The C++ standard is torch's own choice (C++17 for torch < 2.9ish, C++20 after); the kernels
compile under either.
"""
import os
import re
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent.resolve()
CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"
ALL_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
ALL_DTYPES = ("fp16", "bf16")


def _env_list(name, default, allowed, cast=str):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return list(default)
    values = [cast(v) for v in re.split(r"[,;\s]+", raw) if v]
    bad = [v for v in values if v not in allowed]
    if bad:
        raise SystemExit(f"{name}={raw!r}: {bad} not allowed; choose from {list(allowed)}")
    return sorted(set(values), key=list(allowed).index)


def _cutlass_include():
    candidates = []
    if os.environ.get("CUTLASS_PATH"):
        p = Path(os.environ["CUTLASS_PATH"]).expanduser().resolve()
        candidates += [p / "include", p]
    try:
        import cutlass_library  # the nvidia-cutlass wheel ships the headers here

        candidates.append(Path(cutlass_library.__file__).parent / "source" / "include")
    except ImportError:
        pass
    for c in candidates:
        if (c / "cute" / "tensor.hpp").exists() and (c / "cutlass" / "cutlass.h").exists():
            return str(c)
    raise SystemExit(
        "flash_attn: CUTLASS/CuTe headers not found. Install them with "
        f"`pip install {CUTLASS_PIN}` or point CUTLASS_PATH at a CUTLASS checkout "
        f"(looked in: {[str(c) for c in candidates] or 'nothing: CUTLASS_PATH unset, wheel missing'})."
    )


def _set_cuda_home():
    """torch guesses CUDA_HOME from `which nvcc`; where nvcc sits outside the toolkit (a
    /usr/local/bin wrapper), point it at the first folder that has the CUDA headers."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    import glob
    import shutil

    nvcc = shutil.which("nvcc")
    guess = Path(nvcc).resolve().parent.parent if nvcc else None
    if guess and (guess / "include" / "cuda_runtime.h").exists():
        return
    for cand in ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]:
        if (Path(cand) / "include" / "cuda_runtime.h").exists() and (Path(cand) / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = cand
            return


def _default_archs():
    """The visible GPUs' architectures when there are GPUs (a build for the machine at hand takes
    half the time), else sm_80 and sm_90."""
    supported = ("80", "86", "89", "90")
    try:
        import torch

        if torch.cuda.is_available():
            found = {"%d%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
            if found and found <= set(supported):
                return sorted(found)
    except Exception:  # noqa: BLE001 - no torch/CUDA at build time: fall back to the default
        pass
    return ["80", "90"]


def _extensions():
    if os.environ.get("FLASH_ATTN_SKIP_CUDA_BUILD", "0") == "1":
        return [], {}
    _set_cuda_home()
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    archs = _env_list("FLASH_ATTN_CUDA_ARCHS", _default_archs(), ("80", "86", "89", "90"))
    head_dims = _env_list("FLASH_ATTN_HEAD_DIMS", ALL_HEAD_DIMS, ALL_HEAD_DIMS, int)
    dtypes = _env_list("FLASH_ATTN_DTYPES", ALL_DTYPES, ALL_DTYPES)

    sources = ["csrc/api/params.cpp", "csrc/api/dense.cpp", "csrc/api/varlen.cpp", "csrc/api/kvcache.cpp",
               "csrc/api/module.cpp", "csrc/dispatch/flash_dispatch.cpp", "csrc/api/flash_varlen_util.cu"]
    defines = []
    for dt in dtypes:
        for d in head_dims:
            # Plain kernels and the softcap / ALiBi / dropout / deterministic variants ("_feat"),
            # one translation unit each so that they compile in parallel.
            sources += [f"csrc/instantiations/flash_{direction}_hdim{d}_{dt}{variant}.cu"
                        for direction in ("fwd", "bwd") for variant in ("", "_feat")]
            sources.append(f"csrc/instantiations/flash_fwd_split_hdim{d}_{dt}.cu")
            if "90" in archs and d in (64, 128):
                # The sm_90a bulk-copy decode kernel (hopper/flash_fwd_decode_sm90.h).
                sources.append(f"csrc/instantiations/flash_fwd_split_sm90_hdim{d}_{dt}.cu")
            if "90" in archs and d in (64, 128, 256):
                # The warp-specialised sm_90a forward (FLASH_ATTN_FWD_WS=1; hopper/flash_fwd_ws_*),
                # plain and softcap / ALiBi / dropout ("_feat") variants.
                sources += [f"csrc/instantiations/flash_fwd_ws_sm90_hdim{d}_{dt}{variant}.cu"
                            for variant in ("", "_feat")]
            if "90" in archs and d in (64, 128):
                # The warp-specialised sm_90a backward (hopper/flash_bwd_ws_*; default on,
                # FLASH_ATTN_BWD_WS=0 turns it off): plain, softcap / ALiBi / deterministic ("_mod")
                # and dropout ("_drop") calls.
                sources += [f"csrc/instantiations/flash_bwd_ws_sm90_hdim{d}_{dt}{variant}.cu"
                            for variant in ("", "_mod", "_drop")]
            if "90" in archs and d == 256:
                # Its split-d form at head dim 256: plain and feature calls.
                sources.append(f"csrc/instantiations/flash_bwd_ws_sm90_hdim256_{dt}.cu")
            defines.append(f"-DFLASH_ATTN_BUILT_{dt}_{d}")

    # sm_90 builds target sm_90a, which adds the wgmma (Hopper) kernels; sm_90a code runs only on
    # compute capability 9.0 exactly, hence the SM80-class kernels remain for everything else.
    gencode = [f"-gencode=arch=compute_{a}a,code=sm_{a}a" if a == "90" else f"-gencode=arch=compute_{a},code=sm_{a}"
               for a in archs]
    if "90" in archs:
        defines.append("-DFLASH_ATTN_SM90A")
    if os.environ.get("FLASH_ATTN_AB_KERNELS", "0") == "1":
        defines.append("-DFLASH_ATTN_AB_KERNELS")
    nvcc_flags = [
        "-O3", "--use_fast_math", "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        # torch disables the half operators by default; CUTLASS wants them.
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
        "-DNDEBUG", *gencode, *[d for d in defines if d in ("-DFLASH_ATTN_SM90A", "-DFLASH_ATTN_AB_KERNELS")],
    ]
    if "-DFLASH_ATTN_AB_KERNELS" in defines:
        # Every wgmma N (8..256 in steps of 8) for CuTe's GMMA op selectors, as FA3 builds. Without
        # it a tile N outside the basic set (176, 80, ...) becomes a chain of 64x16 (or 64x8)
        # instructions: 11 HGMMA.64x16x16 per K step for a 176-key S tile (found in session 23;
        # why FA3's d128 / d256 key tiles, A/B-only kernels, measured 20-25% slower here). The
        # default tiles' N values are all in the basic set (their SASS is identical with it), so
        # the default build leaves out its 3.4 MB of extra headers.
        nvcc_flags.append("-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED")
    if os.environ.get("FLASH_ATTN_PTXAS_VERBOSE", "0") == "1":
        nvcc_flags += ["-Xptxas=-v"]
    ext = CUDAExtension(
        name="flash_attn._C",
        sources=sources,
        include_dirs=[str(ROOT / "csrc"), _cutlass_include()],
        extra_compile_args={"cxx": ["-O3", *defines], "nvcc": nvcc_flags},
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()

setup(
    name="flash_attn",
    version="2.8.3",
    description="FlashAttention written from scratch: fast exact attention as a PyTorch CUDA extension",
    packages=find_packages(include=["flash_attn", "flash_attn.*"]),
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
)
