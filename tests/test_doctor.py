"""`metarag doctor`: system-info parsing, crash diagnosis in a child process, exit codes."""
from __future__ import annotations

import pytest

from metarag import doctor
from metarag.cli import main

SYSTEM_INFO_AMX = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | "
                   "AVX512_VNNI = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
SYSTEM_INFO_NO_AMX = SYSTEM_INFO_AMX.replace("AMX_INT8 = 1 | ", "")


def test_system_info_features_and_amx():
    with_amx = doctor.parse_system_info(SYSTEM_INFO_AMX)
    assert with_amx["AVX2"] == "1" and with_amx["AMX_INT8"] == "1" and with_amx["SSE3"] == "1"
    assert doctor.amx_compiled(with_amx)
    assert not doctor.amx_compiled(doctor.parse_system_info(SYSTEM_INFO_NO_AMX))
    assert not doctor.amx_compiled(doctor.parse_system_info(SYSTEM_INFO_AMX.replace("AMX_INT8 = 1", "AMX_INT8 = 0")))


def test_cpu_flags_read_the_first_processor():
    info = "processor\t: 0\nflags\t\t: fpu avx2 amx_int8 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert doctor.cpu_flags(info) == {"fpu", "avx2", "amx_int8", "amx_tile"}
    assert doctor.cpu_flags("no flags here") == set()


def test_a_crashing_decode_becomes_a_one_line_diagnosis(monkeypatch):
    monkeypatch.setattr(doctor, "DECODE_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(doctor, "installed", lambda module: True)
    check = doctor.check_decode()
    assert check.ok is False
    assert "SIGSEGV" in check.detail and "scripts/install-llama-cpp" in check.detail
    assert "\n" not in check.detail


def test_an_illegal_instruction_names_a_foreign_build():
    assert "another" in doctor.diagnose_crash(-4, "")  # SIGILL: a wheel built for another CPU (or AMX)


def test_a_failing_decode_child_reports_its_last_error_line(monkeypatch):
    monkeypatch.setattr(doctor, "DECODE_CHILD", "import sys; sys.exit('the GGUF is missing')")
    monkeypatch.setattr(doctor, "installed", lambda module: True)
    check = doctor.check_decode()
    assert check.ok is False and check.detail.endswith("the GGUF is missing")


def test_report_counts_failures_and_prints_every_check():
    lines: list[str] = []
    checks = [doctor.Check("a", True, "fine"), doctor.Check("b", False, "broken"), doctor.Check("c", None, "info")]
    assert doctor.report(checks, show=lines.append) == 1
    assert lines[:3] == ["ok    a: fine", "FAIL  b: broken", "info  c: info"]
    assert lines[-1] == "doctor: 1 check(s) failed"


def test_doctor_exits_non_zero_on_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: iter([doctor.Check("llama.cpp build", False, "AMX")]))
    assert main(["doctor", "--no-decode", "--no-encoder"]) == 1
    assert "FAIL  llama.cpp build: AMX" in capsys.readouterr().out
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: iter([doctor.Check("x", True, "fine")]))
    assert main(["doctor"]) == 0


def test_doctor_refuses_an_unknown_decode_model(capsys):
    assert main(["doctor", "--decode-model", "qwen-7b"]) == 1
    assert "unknown embedded model 'qwen-7b'" in capsys.readouterr().err


@pytest.mark.embedded
def test_doctor_on_this_installation():
    """The real checks: this machine's llama.cpp build has no AMX kernels where the CPU has AMX, the
    0.5B model decodes one token in a child process, and the encoder loads."""
    build = doctor.check_llama_build()
    assert build.ok, build.detail
    assert "AMX kernels compiled in: no" in build.detail or "this CPU has AMX: no" in build.detail
    decode = doctor.check_decode("qwen2.5-coder-0.5b-instruct")
    assert decode.ok, decode.detail
    assert "1 generated" in decode.detail
