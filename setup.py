"""Build script for flash_attn: the CUDA extension flash_attn._C.

The package's metadata (name, version, license, description, classifiers, ...) lives in
pyproject.toml; this file only describes the extension. Install with
`pip install -r requirements/build.txt && pip install --no-build-isolation .`.

Kernel selection comes from environment variables so that a developer build of one
configuration takes minutes rather than hours (see docs/design.md):

    FLASH_ATTN_CUDA_ARCHS   SM targets to build machine code for; default: the visible GPUs'
                            (when all are sm_80/86/89/90), else "80;90". "90" means sm_90a.
    FLASH_ATTN_HEAD_DIMS    "32,64,96,128,192,256,512" (default) -- head-dim tiles to instantiate (512: sm_90a forward only)
    FLASH_ATTN_DTYPES       "fp16,bf16" (default)
    FLASH_ATTN_SKIP_CUDA_BUILD=1  -- install the Python package only
    FLASH_ATTN_PTXAS_VERBOSE=1    -- print registers / spills / shared memory per kernel
    CUTLASS_PATH            -- CUTLASS headers (a checkout or an include folder); default: the
                               pinned nvidia-cutlass wheel
    MAX_JOBS                -- parallel compile jobs (ninja); default: what the machine's memory
                               allows, min(cores, available memory / 3.5 GB), at least 1

A one-configuration build (CI's): FLASH_ATTN_CUDA_ARCHS=90 FLASH_ATTN_HEAD_DIMS=64
FLASH_ATTN_DTYPES=bf16. The build prints (to stderr; `pip install -v` shows it) what it compiles,
how many translation units, and the MAX_JOBS it chose.

The C++ standard is torch's own choice (C++17 for torch < 2.9ish, C++20 after); the kernels
compile under either.

setup() runs only when this file runs as a script (`__main__`, which is also how setuptools'
build backend executes it), so tests can import the helpers below without building anything.
"""
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).parent.resolve()
CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"
MIN_SETUPTOOLS = (77, 0)  # PEP 639 license metadata in pyproject.toml; bdist_wheel built in
ALL_ARCHS = ("80", "86", "89", "90")
NO_GPU_ARCHS = ("80", "90")
ALL_HEAD_DIMS = (32, 64, 96, 128, 192, 256, 512)
ALL_DTYPES = ("fp16", "bf16")
# Peak resident memory of one nvcc process on the heaviest (sm_90a warp-specialised) units,
# measured ~3.3 GB; the MAX_JOBS default leaves room for that per job.
GB_PER_JOB = 3.5
ONE_CONFIG = "FLASH_ATTN_CUDA_ARCHS=90 FLASH_ATTN_HEAD_DIMS=128 FLASH_ATTN_DTYPES=bf16"
# Commands that compile the extension; any other (egg_info, dist_info, sdist, ...) only needs
# the metadata, so it runs without torch, CUDA or CUTLASS.
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "bdist", "bdist_egg", "install",
                  "develop", "editable_wheel"}


def log(msg):
    """Build messages go to stderr: unbuffered, and shown by `pip install -v`."""
    print(f"flash_attn build: {msg}", file=sys.stderr, flush=True)


def env_list(name, default, allowed, cast=str, environ=None):
    """The comma / semicolon / space separated list in environment variable `name`, in the
    order of `allowed`, or `default` when it is unset or empty."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name, "").strip()
    if not raw:
        return list(default)
    try:
        values = [cast(v) for v in re.split(r"[,;\s]+", raw) if v]
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: not a list of {cast.__name__}; choose from {list(allowed)}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise SystemExit(f"{name}={raw!r}: {bad} not allowed; choose from {list(allowed)}")
    return sorted(set(values), key=list(allowed).index)


def visible_gpu_archs():
    """The visible GPUs' compute capabilities as "80", "90", ...; [] when there are none (or
    no torch / no CUDA at build time)."""
    try:
        import torch

        if torch.cuda.is_available():
            return sorted({"%d%d" % torch.cuda.get_device_capability(i)
                           for i in range(torch.cuda.device_count())})
    except Exception:  # noqa: BLE001 - no torch/CUDA at build time: no GPUs
        pass
    return []


def select_archs(environ=None, gpu_archs=None):
    """(archs, why): FLASH_ATTN_CUDA_ARCHS when set ("env"); else the visible GPUs' when all are
    supported ("gpu"); else sm_80 + sm_90 ("no-gpu" or "unsupported-gpu")."""
    environ = os.environ if environ is None else environ
    if environ.get("FLASH_ATTN_CUDA_ARCHS", "").strip():
        return env_list("FLASH_ATTN_CUDA_ARCHS", NO_GPU_ARCHS, ALL_ARCHS, environ=environ), "env"
    gpus = visible_gpu_archs() if gpu_archs is None else list(gpu_archs)
    if gpus and set(gpus) <= set(ALL_ARCHS):
        return sorted(set(gpus), key=ALL_ARCHS.index), "gpu"
    return list(NO_GPU_ARCHS), ("unsupported-gpu" if gpus else "no-gpu")


def select_head_dims(environ=None):
    return env_list("FLASH_ATTN_HEAD_DIMS", ALL_HEAD_DIMS, ALL_HEAD_DIMS, int, environ)


def select_dtypes(environ=None):
    return env_list("FLASH_ATTN_DTYPES", ALL_DTYPES, ALL_DTYPES, str, environ)


def kernel_sources(archs, head_dims, dtypes):
    """(sources, defines): the translation units (paths relative to the repo root) and the
    -DFLASH_ATTN_BUILT_<dtype>_<hdim> defines of a build for these archs, head dims, dtypes."""
    sources = ["csrc/api/params.cpp", "csrc/api/dense.cpp", "csrc/api/varlen.cpp", "csrc/api/kvcache.cpp",
               "csrc/api/module.cpp", "csrc/api/index_checks.cpp", "csrc/api/sdpa.cpp",
               "csrc/dispatch/flash_dispatch.cpp",
               "csrc/api/flash_varlen_util.cu", "csrc/api/index_guard.cu", "csrc/api/sink_grad.cu"]
    defines = []
    sm90 = "90" in archs
    for dt in dtypes:
        for d in head_dims:
            if d == 512:
                # Head dims 257-512: a plain forward on the warp-specialised sm_90a kernel only
                # (nothing for other archs, no backward).
                if sm90:
                    sources.append(f"csrc/instantiations/flash_fwd_ws_sm90_hdim512_{dt}.cu")
                    defines.append(f"-DFLASH_ATTN_BUILT_{dt}_512")
                continue
            # Plain kernels and the softcap / ALiBi / dropout / deterministic variants ("_feat"),
            # one translation unit each so that they compile in parallel.
            sources += [f"csrc/instantiations/flash_{direction}_hdim{d}_{dt}{variant}.cu"
                        for direction in ("fwd", "bwd") for variant in ("", "_feat")]
            sources.append(f"csrc/instantiations/flash_fwd_split_hdim{d}_{dt}.cu")
            if sm90 and d in (64, 128):
                # The sm_90a bulk-copy decode kernel (sm90/flash_fwd_decode_sm90.h).
                sources.append(f"csrc/instantiations/flash_fwd_split_sm90_hdim{d}_{dt}.cu")
            if sm90 and d in (64, 128, 256):
                # The warp-specialised sm_90a forward (sm90/flash_fwd_ws_*), plain and softcap /
                # ALiBi / dropout ("_feat") variants.
                sources += [f"csrc/instantiations/flash_fwd_ws_sm90_hdim{d}_{dt}{variant}.cu"
                            for variant in ("", "_feat")]
            if sm90 and d in (64, 128):
                # The warp-specialised sm_90a backward (sm90/flash_bwd_ws_*): plain, softcap / ALiBi
                # / deterministic ("_mod") and dropout ("_drop") calls.
                sources += [f"csrc/instantiations/flash_bwd_ws_sm90_hdim{d}_{dt}{variant}.cu"
                            for variant in ("", "_mod", "_drop")]
            if sm90 and d == 128:
                # Its d128 form on 80-row query blocks (plain calls without a window).
                sources.append(f"csrc/instantiations/flash_bwd_ws_sm90_hdim128m80_{dt}.cu")
            if sm90 and d == 256:
                # Its split-d form at head dim 256: plain and feature calls.
                sources.append(f"csrc/instantiations/flash_bwd_ws_sm90_hdim256_{dt}.cu")
            if sm90 and d in (128, 192):
                # The warp-specialised forward with a V head dim of its own: Q / K 192 with V 128
                # (DeepSeek MLA), Q / K 128 with V 64.
                sources.append(f"csrc/instantiations/flash_fwd_ws_sm90_hdim{d}x{d // 2 if d == 128 else 128}_{dt}.cu")
            if sm90 and d == 192:
                # The warp-specialised backward with a V head dim of its own: Q / K 192 with V 128
                # on the split-d kernel, plain and softcap / ALiBi / deterministic calls.
                sources.append(f"csrc/instantiations/flash_bwd_ws_sm90_hdim192x128_{dt}.cu")
            defines.append(f"-DFLASH_ATTN_BUILT_{dt}_{d}")
    return sources, defines


# Relative compile time of a translation unit by its family. Ninja starts the units in the order
# they are listed and the build lasts until the last one ends, so FlashBuildExt lists the heaviest
# first (setuptools sorts the sources by name: the warp-specialised forward units came last and
# were the last dozen to finish, 290-326 s into a 337 s build on the 16-core H200 machine).
# Larger head dims compile longer within a family.
_FAMILY_COST = (("flash_bwd_ws_sm90", 100), ("flash_fwd_ws_sm90", 100), ("flash_bwd_hdim", 40),
                ("flash_fwd_split_sm90", 15), ("flash_fwd_split", 25), ("flash_fwd_hdim", 25))


def compile_cost(source):
    name = os.path.basename(source)
    cost = next((c for prefix, c in _FAMILY_COST if name.startswith(prefix)), 10)
    if any(tag in name for tag in ("_feat", "_mod", "_drop")):
        cost *= 1.5
    hdim = re.search(r"hdim(\d+)", name)
    return cost * (1 + int(hdim.group(1)) / 256) if hdim else cost


def gencode_flags(archs):
    # sm_90 builds target sm_90a, which adds the wgmma (Hopper) kernels; sm_90a code runs only on
    # compute capability 9.0 exactly, hence the SM80-class kernels remain for everything else.
    return [f"-gencode=arch=compute_{a}a,code=sm_{a}a" if a == "90"
            else f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]


def _read_int(path):
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory_bytes():
    """Memory available to this build: /proc/meminfo's MemAvailable, capped by the cgroup's
    limit (v2 memory.max - memory.current, or v1 limit_in_bytes - usage_in_bytes); None when
    unknown."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < (1 << 60):
            found.append(max(limit - usage, 0))
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return min(found)


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_max_jobs(cpus, mem_bytes, gb_per_job=GB_PER_JOB):
    """min(cpus, mem_bytes / gb_per_job GB), at least 1; cpus alone when memory is unknown."""
    jobs = max(int(cpus or 1), 1)
    if mem_bytes is not None:
        jobs = min(jobs, int(mem_bytes // int(gb_per_job * 1e9)))
    return max(jobs, 1)


def select_max_jobs(environ=None, cpus=None, mem_bytes=None):
    """(jobs, why): MAX_JOBS when set to a positive integer, else default_max_jobs() of this
    machine's cores and available memory."""
    environ = os.environ if environ is None else environ
    raw = environ.get("MAX_JOBS", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise SystemExit(f"MAX_JOBS={raw!r}: must be a positive integer")
        return int(raw), "MAX_JOBS set"
    cpus = cpu_count() if cpus is None else cpus
    mem_bytes = available_memory_bytes() if mem_bytes is None else mem_bytes
    mem = "unknown" if mem_bytes is None else f"{mem_bytes / 1e9:.1f} GB"
    return (default_max_jobs(cpus, mem_bytes),
            f"MAX_JOBS unset: min({cpus} cores, {mem} available / {GB_PER_JOB} GB per nvcc job)")


def build_plan(archs, archs_why, head_dims, dtypes, n_units, jobs, jobs_why):
    """The lines the build prints before compiling."""
    lines = [
        f"archs sm_{', sm_'.join(a + 'a' if a == '90' else a for a in archs)}"
        f" ({'FLASH_ATTN_CUDA_ARCHS' if archs_why == 'env' else 'default: ' + archs_why});"
        f" dtypes {','.join(dtypes)}; head dims {','.join(map(str, head_dims))}",
        f"{n_units} translation units, MAX_JOBS={jobs} ({jobs_why})",
    ]
    if archs_why in ("no-gpu", "unsupported-gpu"):
        what = "no GPU is visible" if archs_why == "no-gpu" else "the visible GPUs are not sm_80/86/89/90"
        n_all = len(kernel_sources(NO_GPU_ARCHS, ALL_HEAD_DIMS, ALL_DTYPES)[0])
        cost = "1-2 hours" if n_units >= n_all else f"less than the full build's ({n_all} units) 1-2 hours"
        lines += [
            f"WARNING: {what} and FLASH_ATTN_CUDA_ARCHS is unset, so ALL archs "
            f"({';'.join(NO_GPU_ARCHS)}) are being built: {n_units} units, {cost} on 2 cores "
            f"(~{GB_PER_JOB} GB of memory per compile job).",
            f"WARNING: to build one configuration (minutes), set e.g. {ONE_CONFIG}",
        ]
    lines.append("to build less: FLASH_ATTN_CUDA_ARCHS (80;86;89;90), FLASH_ATTN_HEAD_DIMS "
                 "(32,64,96,128,192,256,512), FLASH_ATTN_DTYPES (fp16,bf16); MAX_JOBS sets the "
                 "parallel compile jobs")
    return lines


def needs_extension(argv):
    """Whether the setup.py command line compiles the extension (see BUILD_COMMANDS)."""
    return any(a in BUILD_COMMANDS for a in argv[1:])


def _check_setuptools():
    import setuptools

    have = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    if have < MIN_SETUPTOOLS:
        raise SystemExit(
            f"flash_attn: setuptools {setuptools.__version__} is too old (>= "
            f"{'.'.join(map(str, MIN_SETUPTOOLS))} needed). Run `pip install -r "
            "requirements/build.txt` first, then `pip install --no-build-isolation .`.")


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


def _extensions():
    if os.environ.get("FLASH_ATTN_SKIP_CUDA_BUILD", "0") == "1":
        log("FLASH_ATTN_SKIP_CUDA_BUILD=1: the Python package only, no CUDA extension")
        return [], {}
    _set_cuda_home()
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    archs, archs_why = select_archs()
    head_dims = select_head_dims()
    dtypes = select_dtypes()
    sources, defines = kernel_sources(archs, head_dims, dtypes)
    if "90" in archs:
        defines.append("-DFLASH_ATTN_SM90A")
    nvcc_flags = [
        "-O3", "--use_fast_math", "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        # torch disables the half operators by default; CUTLASS wants them.
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
        "-DNDEBUG", *gencode_flags(archs), *[d for d in defines if d == "-DFLASH_ATTN_SM90A"],
    ]
    if os.environ.get("FLASH_ATTN_PTXAS_VERBOSE", "0") == "1":
        nvcc_flags += ["-Xptxas=-v"]
    ext = CUDAExtension(
        name="flash_attn._C",
        sources=sources,
        include_dirs=[str(ROOT / "csrc"), _cutlass_include()],
        # -g0: Python's default flags add -g, which makes the host units' torch headers ~90% of
        # the extension's size and slows their compile and the link.
        extra_compile_args={"cxx": ["-O3", "-g0", *defines], "nvcc": nvcc_flags},
    )

    class FlashBuildExt(BuildExtension.with_options(use_ninja=True)):
        """torch's BuildExtension (ninja) that first prints the build plan and sets MAX_JOBS
        (torch's ninja runner reads it from the environment)."""

        def build_extensions(self):
            jobs, jobs_why = select_max_jobs()
            os.environ["MAX_JOBS"] = str(jobs)
            for line in build_plan(archs, archs_why, head_dims, dtypes, len(sources), jobs, jobs_why):
                log(line)
            super().build_extensions()

        def build_extension(self, ext):
            # setuptools sorts the sources by name before compiling them: hand ninja (torch's
            # compile wrapper, installed by build_extensions) the heaviest first instead.
            compile_sorted = self.compiler.compile

            def compile_heaviest_first(sources, *args, **kwargs):
                return compile_sorted(sorted(sources, key=compile_cost, reverse=True), *args, **kwargs)

            self.compiler.compile = compile_heaviest_first
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile = compile_sorted

    return [ext], {"build_ext": FlashBuildExt}


def main():
    _check_setuptools()
    from setuptools import setup

    ext_modules, cmdclass = _extensions() if needs_extension(sys.argv) else ([], {})
    setup(ext_modules=ext_modules, cmdclass=cmdclass)


if __name__ == "__main__":
    main()
