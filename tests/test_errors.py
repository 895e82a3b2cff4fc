"""The exception hierarchy: fields, messages, pickling, and the driver-result door (_check)."""

from __future__ import annotations

import copy
import pickle

import pytest

from attnrt.runtime import _check
from attnrt.runtime.errors import (
    AttnrtError,
    CaptureError,
    CompileError,
    CudaError,
    KernelError,
    PerformanceWarning,
    Unsupported,
    WorkspaceError,
)


def _roundtrip(err: Exception) -> Exception:
    out = pickle.loads(pickle.dumps(err, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(out) is type(err)
    assert str(out) == str(err)
    assert out.args == err.args
    return out


@pytest.mark.parametrize("cls", [CudaError, CompileError, KernelError, Unsupported, CaptureError,
                                 WorkspaceError])
def test_every_error_is_an_nxrt_error(cls):
    assert issubclass(cls, AttnrtError)
    assert issubclass(cls, Exception)


def test_cuda_error_fields_message_and_pickle():
    err = CudaError(2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc(1073741824)", "out of memory")
    assert (err.code, err.name, err.call, err.detail) == (
        2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc(1073741824)", "out of memory")
    msg = str(err)
    assert "cuMemAlloc(1073741824)" in msg and "CUDA_ERROR_OUT_OF_MEMORY" in msg and "(2)" in msg
    assert "out of memory" in msg
    out = _roundtrip(err)
    assert (out.code, out.name, out.call, out.detail) == (err.code, err.name, err.call, err.detail)
    assert isinstance(out.code, int)


def test_cuda_error_code_is_int_and_detail_optional():
    class FakeEnum(int):
        pass

    err = CudaError(FakeEnum(700), "CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize")
    assert type(err.code) is int and err.code == 700
    assert err.detail == ""
    assert str(err).endswith("(700)")
    assert _roundtrip(err).code == 700


def test_compile_error_fields_dump_and_pickle():
    src = "line one\nline two\nline three\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n"
    err = CompileError("NVRTC failed to compile k.cu: k.cu(2): error: x", name="k.cu",
                       log="k.cu(2): error: x\n", source=src, options=["-arch=sm_90", "-DX=1"])
    assert err.name == "k.cu"
    assert err.log == "k.cu(2): error: x\n"
    assert err.source == src
    assert err.options == ("-arch=sm_90", "-DX=1")  # stored as a tuple

    numbered = err.numbered_source().splitlines()
    assert len(numbered) == 11
    # Right-aligned 1-based numbers, width of the largest line number.
    assert numbered[0] == " 1 | line one"
    assert numbered[1] == " 2 | line two"
    assert numbered[10] == "11 | eleven"

    dump = err.dump()
    assert str(err) in dump
    assert "-arch=sm_90 -DX=1" in dump
    assert "k.cu(2): error: x" in dump
    assert " 2 | line two" in dump
    # Order: message, options, log, source.
    assert dump.index("--- options ---") < dump.index("--- log ---") < dump.index("--- source")

    out = _roundtrip(err)
    assert (out.name, out.log, out.source, out.options) == (err.name, err.log, err.source, err.options)
    assert out.dump() == err.dump()


def test_performance_warning_fields_message_and_pickle():
    line = "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized"
    w = PerformanceWarning("k.cu", "sm_90a", [line])
    assert issubclass(PerformanceWarning, UserWarning) and not issubclass(PerformanceWarning, AttnrtError)
    assert (w.name, w.arch, w.lines) == ("k.cu", "sm_90a", (line,))
    assert str(w).startswith("k.cu (sm_90a): ptxas reports a performance loss: ptxas info")
    out = _roundtrip(w)
    assert (out.name, out.arch, out.lines) == (w.name, w.arch, w.lines)


def test_compile_error_empty_source():
    err = CompileError("boom")
    assert err.numbered_source() == ""
    assert err.options == () and err.log == "" and err.source == ""
    assert "boom" in err.dump()


def test_capture_error_fields_and_pickle():
    err = CaptureError("latch set", bits=512 | 1024, names=["IndexShare x", "Paged y"])
    assert err.bits == 1536
    assert err.names == ("IndexShare x", "Paged y")
    out = _roundtrip(err)
    assert out.bits == 1536 and out.names == ("IndexShare x", "Paged y")
    plain = CaptureError("alloc_raw while capturing")
    assert plain.bits == 0 and plain.names == ()
    assert _roundtrip(plain).bits == 0


def test_workspace_error_fields_and_pickle():
    err = WorkspaceError("short", required=4096, provided=100)
    assert (err.required, err.provided) == (4096, 100)
    out = _roundtrip(err)
    assert (out.required, out.provided) == (4096, 100)


@pytest.mark.parametrize("cls", [KernelError, Unsupported, AttnrtError])
def test_plain_errors_pickle(cls):
    err = cls("input 'q' has dtype INT32; expected FLOAT, FLOAT16 or BFLOAT16")
    assert _roundtrip(err).args == err.args


def test_errors_keep_extra_attributes_and_copy():
    err = WorkspaceError("short", required=8, provided=4)
    if hasattr(err, "add_note"):  # Python >= 3.11
        err.add_note("while planning step 3")
    err.custom = "kept"
    out = _roundtrip(err)
    assert out.custom == "kept"
    assert getattr(out, "__notes__", None) == getattr(err, "__notes__", None)
    c = copy.deepcopy(err)
    assert (c.required, c.provided, c.custom) == (8, 4, "kept")


def test_errors_pickle_with_old_protocol():
    # Exceptions travel through pickle with protocol 2 in some pools; fields must survive.
    err = CudaError(1, "CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel(k)")
    out = pickle.loads(pickle.dumps(err, protocol=2))
    assert (out.code, out.name, out.call) == (1, "CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel(k)")


# -- _check: the single door to cuda.bindings results ---------------------------------------

def test_check_unwraps_values():
    ok = _check.driver.CUresult.CUDA_SUCCESS
    assert _check.check((ok,), "c") is None
    assert _check.check((ok, 5), "c") == 5
    assert _check.check((ok, 5, 6), "c") == (5, 6)


def test_check_raises_cuda_error_with_name_and_call():
    bad = _check.driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError) as info:
        _check.check((bad, None), "cuMemAlloc(5)")
    err = info.value
    assert err.code == int(bad)
    assert err.name == "CUDA_ERROR_INVALID_VALUE"
    assert err.call == "cuMemAlloc(5)"
    assert "cuMemAlloc(5)" in str(err)


def test_check_nvrtc_raises_cuda_error():
    ok = _check.nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert _check.check_nvrtc((ok, 3), "nvrtcX") == 3
    bad = _check.nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_INPUT
    with pytest.raises(CudaError) as info:
        _check.check_nvrtc((bad,), "nvrtcCreateProgram")
    assert info.value.code == int(bad)
    assert info.value.name == "NVRTC_ERROR_INVALID_INPUT"
    assert info.value.call == "nvrtcCreateProgram"


def test_missing_gpu_is_one_sentence_not_a_crash():
    reason = _check.driver_missing_reason()
    if reason is None:
        pytest.skip("this machine has a usable GPU")
    assert reason.startswith("no usable CUDA device")
    # Repeated calls give the cached answer (cuInit is attempted once per process).
    assert _check.driver_missing_reason() == reason
    with pytest.raises(CudaError) as info:
        _check.load_driver()
    assert info.value.name.startswith("CUDA_ERROR")


# -- the latch's names (no device needed for registering and decoding) ------------------------

def test_latch_registry_and_decode_without_a_device():
    from attnrt.runtime.latch import (
        INDEX_SHARE_SELECTED_INDICES,
        PAGED_BLOCK_OUT_OF_RANGE,
        PAGED_POSITION_OUT_OF_RANGE,
        PAGED_SLOT_OUT_OF_RANGE,
        WELL_KNOWN_BITS,
        Latch,
    )

    latch = Latch(None, 0)  # register/decode never touch the runtime
    assert INDEX_SHARE_SELECTED_INDICES == 512
    assert set(WELL_KNOWN_BITS) == {512, PAGED_SLOT_OUT_OF_RANGE, PAGED_BLOCK_OUT_OF_RANGE,
                                    PAGED_POSITION_OUT_OF_RANGE}
    assert latch.names == WELL_KNOWN_BITS
    assert "IndexShare" in latch.names[512]
    assert latch.register(512, WELL_KNOWN_BITS[512]) == 512  # same name again: no-op
    with pytest.raises(ValueError, match="already registered"):
        latch.register(512, "another name")
    for bad in (0, -1, 3, 12, 2**32, 2**33, 1.0, "4"):
        with pytest.raises(ValueError):
            latch.register(bad, "bad")  # type: ignore[arg-type]
    assert latch.register(2**31, "top bit") == 2**31
    assert latch.decode(0) == []
    assert latch.decode(512 | 2**31 | 8) == ["unregistered bit 0x8", WELL_KNOWN_BITS[512], "top bit"]
    # names is a copy: mutating it does not register anything.
    latch.names[64] = "sneaky"
    assert 64 not in latch.names
    # Each latch has its own registry.
    assert 2**31 not in Latch(None, 0).names


def test_status_helpers_answer_without_raising():
    ok = _check.driver.CUresult.CUDA_SUCCESS
    bad = _check.driver.CUresult.CUDA_ERROR_INVALID_VALUE
    assert _check.succeeded((ok,)) and _check.succeeded((ok, 7))
    assert not _check.succeeded((bad, None))
    assert _check.value_or_none((ok, 7)) == 7
    assert _check.value_or_none((ok, 7, 8)) == (7, 8)
    assert _check.value_or_none((bad, 7)) is None
    assert _check.failed_with((bad, None), "CUDA_ERROR_INVALID_VALUE")
    assert not _check.failed_with((ok, 1), "CUDA_ERROR_INVALID_VALUE")
    assert not _check.failed_with((bad,), "CUDA_ERROR_OUT_OF_MEMORY")
    with pytest.raises(AttributeError):
        _check.failed_with((bad,), "CUDA_ERROR_NO_SUCH_NAME")
