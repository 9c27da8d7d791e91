"""CPU checks of the packaging: requirement pins, MANIFEST.in / sdist contents, setup.py's
build-selection helpers (imported without running setup()), and a SKIP_CUDA_BUILD sdist -> wheel
round trip through setuptools' real build backend."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQ = ROOT / "requirements"
CI_RUN = ROOT / ".ci" / "run"

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")
from packaging.requirements import Requirement  # noqa: E402 - pytest depends on packaging
from packaging.utils import canonicalize_name  # noqa: E402

needs_source_tree = pytest.mark.skipif(
    not (ROOT / "setup.py").is_file() or not (ROOT / "requirements").is_dir(),
    reason="needs the source tree (setup.py, requirements/)")
pytestmark = needs_source_tree


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _read_requirements(path, seen=None):
    """{canonical name: Requirement} of a requirements file, following `-r other.txt`."""
    seen = set() if seen is None else seen
    path = Path(path).resolve()
    assert path not in seen, f"-r cycle at {path}"
    seen.add(path)
    reqs = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(("-r ", "--requirement ")):
            reqs.update(_read_requirements(path.parent / line.split(None, 1)[1], seen))
            continue
        assert not line.startswith("-"), f"{path.name}: unexpected option line {raw!r}"
        r = Requirement(line)
        reqs[canonicalize_name(r.name)] = r
    return reqs


def _pinned_version(req):
    specs = list(req.specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"{req} is not pinned with =="
    return specs[0].version


def _load_setup():
    """setup.py as a module named flash_attn_setup: setup() must not run."""
    spec = importlib.util.spec_from_file_location("flash_attn_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    import setuptools

    real_setup = setuptools.setup

    def forbidden(*a, **k):
        raise AssertionError("importing setup.py ran setup()")

    setuptools.setup = forbidden
    try:
        spec.loader.exec_module(mod)
    finally:
        setuptools.setup = real_setup
    return mod


@pytest.fixture(scope="module")
def setup_mod():
    return _load_setup()


# --------------------------------------------------------------------------------------------
# Requirement files: one source of truth for the pins
# --------------------------------------------------------------------------------------------

def test_requirement_files_are_pinned_and_layered():
    build = _read_requirements(REQ / "build.txt")
    test = _read_requirements(REQ / "test.txt")
    bench = _read_requirements(REQ / "bench.txt")
    for name in ("torch", "setuptools", "wheel", "nvidia-cutlass", "ninja", "pybind11", "numpy"):
        assert name in build, f"requirements/build.txt lacks {name}"
    for reqs in (build, test, bench):
        for r in reqs.values():
            _pinned_version(r)
    assert set(test) - set(build) == {"pytest"}
    assert set(bench) - set(build) == {"matplotlib"}
    # test.txt / bench.txt include build.txt rather than repeat its pins
    for f in ("test.txt", "bench.txt"):
        text = (REQ / f).read_text()
        assert re.search(r"^-r build\.txt\s*$", text, re.M), f"{f} must start from `-r build.txt`"
        for name in build:
            assert not re.search(rf"^{re.escape(name)}\s*[=<>!~]", text, re.M | re.I), \
                f"{f} repeats build.txt's {name}"


def test_pyproject_build_requires_accept_the_pins():
    pins = {n: _pinned_version(r) for n, r in _read_requirements(REQ / "build.txt").items()}
    requires = [Requirement(s) for s in _pyproject()["build-system"]["requires"]]
    for r in requires:
        name = canonicalize_name(r.name)
        assert name in pins, f"pyproject build requirement {r} is not pinned in requirements/build.txt"
        assert r.specifier.contains(pins[name], prereleases=True), \
            f"pyproject requires {r}, requirements/build.txt pins {name}=={pins[name]}"
    names = {canonicalize_name(r.name) for r in requires}
    # setuptools >= 77: PEP 639 license metadata and a built-in bdist_wheel (a fresh venv's
    # setuptools fails with "invalid command bdist_wheel").
    st = next(r for r in requires if canonicalize_name(r.name) == "setuptools")
    assert not st.specifier.contains("76.1") and st.specifier.contains(pins["setuptools"])
    assert {"torch", "nvidia-cutlass", "ninja", "pybind11"} <= names


def test_project_dependencies_accept_the_pins():
    pins = {n: _pinned_version(r) for n, r in _read_requirements(REQ / "build.txt").items()}
    for s in _pyproject()["project"]["dependencies"]:
        r = Requirement(s)
        name = canonicalize_name(r.name)
        if name in pins:
            assert r.specifier.contains(pins[name], prereleases=True), (s, pins[name])


def test_setup_py_minimum_setuptools_matches_pyproject(setup_mod):
    st = next(Requirement(s) for s in _pyproject()["build-system"]["requires"]
              if canonicalize_name(Requirement(s).name) == "setuptools")
    minimum = ".".join(map(str, setup_mod.MIN_SETUPTOOLS))
    assert st.specifier.contains(minimum) and not st.specifier.contains(f"{setup_mod.MIN_SETUPTOOLS[0] - 1}.99")


@pytest.mark.skipif(not CI_RUN.is_file(), reason=".ci/run not in this tree")
def test_ci_run_installs_from_the_requirement_files():
    text = CI_RUN.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r"install\b.*-r requirements/test\.txt", code), ".ci/run must install requirements/test.txt"
    pins = {n: _pinned_version(r) for n, r in _read_requirements(REQ / "test.txt").items()}
    # Any version pinned literally in .ci/run's commands must be the requirement files' (pip
    # itself is .ci/run's own pin: it is no build requirement).
    for name, version in re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*)==([\w.+!-]+)", code):
        n = canonicalize_name(name)
        if n == "pip":
            continue
        assert n in pins, f".ci/run pins {name}=={version}, which no requirements file has"
        assert pins[n] == version, f".ci/run pins {name}=={version}, requirements say {pins[n]}"
    subprocess.run(["bash", "-n", str(CI_RUN)], check=True)


def test_readme_setuptools_minimum_agrees():
    readme = ROOT / "README.md"
    if not readme.is_file():
        pytest.skip("no README.md")
    pins = {n: _pinned_version(r) for n, r in _read_requirements(REQ / "test.txt").items()}
    text = readme.read_text()
    for ref in re.findall(r"requirements/[\w.-]+\.txt", text):
        assert (ROOT / ref).is_file(), f"README names {ref}, which does not exist"
    # Version specifiers written in the README must accept the pins (no "setuptools>=64" beside
    # a pyproject that needs 77).
    for name, op, ver in re.findall(r"\b([A-Za-z][\w-]*)\s*(>=|==|~=)\s*([0-9][\w.]*)", text):
        n = canonicalize_name(name)
        if n in pins and n in ("setuptools", "wheel", "torch", "nvidia-cutlass", "ninja",
                               "pybind11", "pytest", "numpy"):
            r = Requirement(f"{name}{op}{ver}")
            assert r.specifier.contains(pins[n], prereleases=True), \
                f"README says {name}{op}{ver}, requirements pin {n}=={pins[n]}"


# --------------------------------------------------------------------------------------------
# Metadata, MANIFEST.in and the sdist
# --------------------------------------------------------------------------------------------

def test_metadata_is_complete():
    project = _pyproject()["project"]
    for key in ("name", "description", "readme", "license", "license-files", "requires-python",
                "classifiers", "dependencies"):
        assert project.get(key), f"pyproject [project] lacks {key}"
    assert project["license"] == "BSD-3-Clause"
    assert "version" in project.get("dynamic", [])
    lic = (ROOT / "LICENSE").read_text()
    assert "BSD 3-Clause" in lic and "the flash_attn authors" in lic
    assert not any(c.startswith("License ::") for c in project["classifiers"]), \
        "PEP 639: a license expression excludes License :: classifiers"


def _csrc_files():
    try:
        out = subprocess.run(["git", "ls-files", "csrc"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
    if not out:  # not a git checkout (an unpacked sdist): what is on disk
        out = [str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*") if p.is_file()
               and "__pycache__" not in p.parts]
    # A copied tree can carry a .git whose index is older than the files (the GPU machine's copy
    # did): the tracked files that are not on disk are not this tree's.
    return sorted(f for f in out if (ROOT / f).is_file())


def _manifest_files():
    """The files MANIFEST.in selects, by setuptools' own FileList logic."""
    from setuptools.command.egg_info import FileList

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        fl = FileList()
        fl.findall(".")
        for line in (ROOT / "MANIFEST.in").read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                fl.process_template_line(line)
        return {os.path.normpath(f) for f in fl.files}
    finally:
        os.chdir(cwd)


def test_manifest_covers_csrc_and_support_files():
    selected = _manifest_files()
    csrc = _csrc_files()
    assert any(f.endswith(".h") for f in csrc) and any(f.endswith(".cu") for f in csrc)
    missing = [f for f in csrc if f not in selected]
    assert not missing, f"MANIFEST.in leaves out of the sdist: {missing}"
    for f in ("LICENSE", "README.md", "pyproject.toml", "setup.py", "requirements/build.txt",
              "requirements/test.txt", "requirements/bench.txt"):
        assert f in selected, f"MANIFEST.in leaves out {f}"
    assert not any(f.endswith((".so", ".o", ".pyc")) for f in selected)


def test_every_build_source_exists_and_none_is_orphaned(setup_mod):
    full, _ = setup_mod.kernel_sources(setup_mod.NO_GPU_ARCHS, setup_mod.ALL_HEAD_DIMS,
                                       setup_mod.ALL_DTYPES)
    assert len(full) == len(set(full))
    missing = [s for s in full if not (ROOT / s).is_file()]
    assert not missing, f"setup.py compiles files that do not exist: {missing}"
    on_disk = {f"csrc/instantiations/{p.name}" for p in (ROOT / "csrc" / "instantiations").glob("*.cu")}
    assert on_disk - set(full) == set(), "instantiation units no build compiles"


def _copy_tree(dst):
    ignore = shutil.ignore_patterns(".git", "docs", "build", "dist", "*.egg-info", "*.so", "*.o",
                                    "__pycache__", ".deps", ".whl", "bench_out", ".pytest_cache")
    shutil.copytree(ROOT, dst, ignore=ignore)


def _backend(cwd, code, env=None):
    """Run setuptools' PEP 517 backend (as pip does) in a fresh process in `cwd`."""
    full_env = dict(os.environ, **(env or {}))
    res = subprocess.run([sys.executable, "-c", "import setuptools.build_meta as b; " + code],
                         cwd=cwd, capture_output=True, text=True, env=full_env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def test_sdist_and_skip_cuda_wheel_through_the_build_backend(tmp_path, setup_mod):
    """build_meta runs setup.py as __main__ (setup() guarded by it); the sdist carries all of
    csrc and builds a wheel (FLASH_ATTN_SKIP_CUDA_BUILD=1) with the license and metadata."""
    import setuptools

    have = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    if have < setup_mod.MIN_SETUPTOOLS:
        pytest.skip(f"setuptools {setuptools.__version__} cannot build this package "
                    f"(needs >= {setup_mod.MIN_SETUPTOOLS}; pip install -r requirements/build.txt)")
    src = tmp_path / "src"
    _copy_tree(src)
    # The sdist needs no torch / CUTLASS: setup.py builds no extension for sdist / egg_info.
    _backend(src, f"print(b.build_sdist({str(tmp_path / 'sd')!r}))")
    (sdist,) = (tmp_path / "sd").glob("flash_attn-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        top = names[0].split("/")[0]
        members = {n.split("/", 1)[1] for n in names if "/" in n}
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(tmp_path / "unpacked", **kw)
    missing = [f for f in _csrc_files() if f not in members]
    assert not missing, f"the sdist lacks {missing}"
    for f in ("LICENSE", "README.md", "requirements/build.txt", "requirements/test.txt",
              "requirements/bench.txt", "setup.py", "pyproject.toml", "flash_attn/__init__.py"):
        assert f in members, f"the sdist lacks {f}"

    res = _backend(tmp_path / "unpacked" / top,
                   f"print(b.build_wheel({str(tmp_path / 'wh')!r}))",
                   env={"FLASH_ATTN_SKIP_CUDA_BUILD": "1"})
    assert "FLASH_ATTN_SKIP_CUDA_BUILD=1" in res.stderr
    (wheel,) = (tmp_path / "wh").glob("flash_attn-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        wnames = zf.namelist()
        meta = zf.read(next(n for n in wnames if n.endswith(".dist-info/METADATA"))).decode()
    assert "flash_attn/__init__.py" in wnames and "flash_attn/layers/rotary.py" in wnames
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wnames)
    assert "License-Expression: BSD-3-Clause" in meta
    assert "Requires-Python: >=3.9" in meta
    assert "Classifier: " in meta and "Summary: " in meta
    assert "# flash_attn" in meta, "long_description (README.md) missing"


# --------------------------------------------------------------------------------------------
# setup.py helpers
# --------------------------------------------------------------------------------------------

def test_setup_runs_only_as_main():
    text = (ROOT / "setup.py").read_text()
    assert re.search(r'^if __name__ == "__main__":\n    main\(\)', text, re.M)
    assert "FLASH_ATTN_AB_KERNELS" not in text and "CUTE_SM90_EXTENDED_MMA_SHAPES" not in text


def test_default_max_jobs(setup_mod):
    f = setup_mod.default_max_jobs
    gb = 1e9
    assert f(2, 24 * gb) == 2          # this 2-core, 24 GB machine: the cores bound
    assert f(16, 128 * gb) == 16
    assert f(16, 20 * gb) == 5         # 20 / 3.5: memory bounds
    assert f(64, 3.5 * gb * 7 + 1) == 7
    assert f(8, 1 * gb) == 1           # at least one job
    assert f(8, 0) == 1
    assert f(4, None) == 4             # memory unknown: the cores
    assert f(0, None) == 1


def test_select_max_jobs(setup_mod):
    f = setup_mod.select_max_jobs
    assert f(environ={"MAX_JOBS": "3"}, cpus=64, mem_bytes=1e12) == (3, "MAX_JOBS set")
    jobs, why = f(environ={}, cpus=16, mem_bytes=20e9)
    assert jobs == 5 and "MAX_JOBS unset" in why and "16 cores" in why
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            f(environ={"MAX_JOBS": bad})
    jobs, _ = f(environ={})            # this machine
    assert 1 <= jobs <= (os.cpu_count() or 1)
    mem = setup_mod.available_memory_bytes()
    assert mem is None or mem > 0


def test_select_archs(setup_mod):
    f = setup_mod.select_archs
    assert f(environ={"FLASH_ATTN_CUDA_ARCHS": "90"}, gpu_archs=["80"]) == (["90"], "env")
    assert f(environ={"FLASH_ATTN_CUDA_ARCHS": "90;80"}, gpu_archs=[]) == (["80", "90"], "env")
    assert f(environ={"FLASH_ATTN_CUDA_ARCHS": "80, 86"}, gpu_archs=[]) == (["80", "86"], "env")
    assert f(environ={}, gpu_archs=["90"]) == (["90"], "gpu")
    assert f(environ={}, gpu_archs=["90", "80", "90"]) == (["80", "90"], "gpu")
    assert f(environ={}, gpu_archs=[]) == (["80", "90"], "no-gpu")
    assert f(environ={}, gpu_archs=["90", "100"]) == (["80", "90"], "unsupported-gpu")
    for bad in ("75", "90a", "sm_90"):
        with pytest.raises(SystemExit):
            f(environ={"FLASH_ATTN_CUDA_ARCHS": bad}, gpu_archs=[])
    assert setup_mod.select_head_dims({"FLASH_ATTN_HEAD_DIMS": "128,64"}) == [64, 128]
    assert setup_mod.select_head_dims({}) == list(setup_mod.ALL_HEAD_DIMS)
    assert setup_mod.select_dtypes({"FLASH_ATTN_DTYPES": "bf16"}) == ["bf16"]
    for name, bad in (("FLASH_ATTN_HEAD_DIMS", "48"), ("FLASH_ATTN_HEAD_DIMS", "x"),
                      ("FLASH_ATTN_DTYPES", "fp32")):
        with pytest.raises(SystemExit):
            setup_mod.env_list(name, (), setup_mod.ALL_HEAD_DIMS if "HEAD" in name else setup_mod.ALL_DTYPES,
                               int if "HEAD" in name else str, {name: bad})


def test_kernel_sources_and_gencode(setup_mod):
    ci, defines = setup_mod.kernel_sources(["90"], [64], ["bf16"])
    assert defines == ["-DFLASH_ATTN_BUILT_bf16_64"]
    assert any("flash_fwd_ws_sm90_hdim64_bf16" in s for s in ci)
    sm80, _ = setup_mod.kernel_sources(["80"], [64], ["bf16"])
    assert not any("sm90" in s for s in sm80) and set(sm80) < set(ci)
    full, _ = setup_mod.kernel_sources(setup_mod.NO_GPU_ARCHS, setup_mod.ALL_HEAD_DIMS, setup_mod.ALL_DTYPES)
    assert len(full) > len(ci)
    assert setup_mod.gencode_flags(["80", "90"]) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]


def test_compile_order_heaviest_first(setup_mod):
    """The warp-specialised units start first and the host units last (setuptools' name order put
    the forward ones last, and they ended the build)."""
    full, _ = setup_mod.kernel_sources(["90"], setup_mod.ALL_HEAD_DIMS, setup_mod.ALL_DTYPES)
    order = sorted(full, key=setup_mod.compile_cost, reverse=True)
    ws = [i for i, s in enumerate(order) if "_ws_sm90_" in s]
    host = [i for i, s in enumerate(order) if s.endswith(".cpp")]
    assert ws == list(range(len(ws))) and max(ws) < min(host)


def test_build_plan_messages(setup_mod):
    plan = setup_mod.build_plan
    quiet = "\n".join(plan(["90"], "env", [64], ["bf16"], 14, 2, "MAX_JOBS set"))
    assert "sm_90a" in quiet and "bf16" in quiet and "64" in quiet
    assert "14 translation units" in quiet and "MAX_JOBS=2" in quiet
    for var in ("FLASH_ATTN_CUDA_ARCHS", "FLASH_ATTN_HEAD_DIMS", "FLASH_ATTN_DTYPES", "MAX_JOBS"):
        assert var in quiet, f"the plan does not say how to cut the build with {var}"
    assert "WARNING" not in quiet
    full = setup_mod.kernel_sources(setup_mod.NO_GPU_ARCHS, setup_mod.ALL_HEAD_DIMS, setup_mod.ALL_DTYPES)[0]
    loud = "\n".join(plan(["80", "90"], "no-gpu", list(setup_mod.ALL_HEAD_DIMS),
                          list(setup_mod.ALL_DTYPES), len(full), 2, "MAX_JOBS unset"))
    assert "WARNING: no GPU is visible" in loud and "ALL archs" in loud
    assert "1-2 hours on 2 cores" in loud and setup_mod.ONE_CONFIG in loud
    assert f"{len(full)} translation units" in loud
    assert "WARNING" in "\n".join(plan(["80", "90"], "unsupported-gpu", [64], ["bf16"], 20, 1, ""))


def test_needs_extension(setup_mod):
    f = setup_mod.needs_extension
    assert not f(["setup.py", "egg_info"])
    assert not f(["setup.py", "dist_info", "--output-dir", "x"])
    assert not f(["setup.py", "sdist", "--formats", "gztar", "--dist-dir", "/tmp/bdist_wheel"])
    assert f(["setup.py", "bdist_wheel", "--dist-dir", "x"])
    assert f(["setup.py", "editable_wheel", "--dist-dir", "x"])
    assert f(["setup.py", "build_ext", "--inplace"])
    assert f(["setup.py", "develop"])
