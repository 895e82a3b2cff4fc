"""NVRTC compiler (no GPU): arch targeting, header discovery and scanning, compile errors,
and the compile-cache key."""

from __future__ import annotations

import os

import pytest

from attnrt.runtime import cache as cache_mod
from attnrt.runtime import compiler
from attnrt.runtime.cache import CompileCache, cache_key
from attnrt.runtime.compiler import HEADER_PACKAGES, CompileError

TINY = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = 1.0f; }\n'


# -- versions and archs -------------------------------------------------------------------------

def test_nvrtc_version_and_archs():
    major, minor = compiler.nvrtc_version()
    assert isinstance(major, int) and isinstance(minor, int) and major >= 12
    archs = compiler.supported_archs()
    assert list(archs) == sorted(archs)
    assert 80 in archs and 90 in archs


@pytest.mark.parametrize("text,want", [
    ("sm_90", (90, "")), ("sm_90a", (90, "a")), ("sm_100f", (100, "f")), ("compute_80", (80, "")),
    ("86", (86, "")), (" sm_80 ", (80, "")),
])
def test_parse_arch(text, want):
    assert compiler.parse_arch(text) == want


@pytest.mark.parametrize("text", ["", "sm", "sm_", "sm90", "sm_9x", "sm_90b", "gfx90a", "sm_90aa",
                                  "sm_-90"])
def test_parse_arch_errors(text):
    with pytest.raises(ValueError):
        compiler.parse_arch(text)


def test_target_arch_exact_with_this_nvrtc():
    assert compiler.target_arch("sm_80") == ("sm_80", True)
    assert compiler.target_arch("sm_90") == ("sm_90", True)
    assert compiler.target_arch("sm_90a") == ("sm_90a", True)


def test_target_arch_caps_at_newest(monkeypatch):
    monkeypatch.setattr(compiler, "supported_archs", lambda: (75, 80, 86, 89, 90))
    assert compiler.target_arch("sm_90") == ("sm_90", True)
    assert compiler.target_arch("sm_86") == ("sm_86", True)
    # Newer than NVRTC knows: the newest older target, not exact (load PTX, driver JIT).
    assert compiler.target_arch("sm_120") == ("sm_90", False)
    assert compiler.target_arch("sm_100a") == ("sm_90", False)  # the suffix does not carry over
    # Between two supported targets: the older one.
    assert compiler.target_arch("sm_87") == ("sm_86", False)
    with pytest.raises(ValueError, match="older"):
        compiler.target_arch("sm_70")
    with pytest.raises(ValueError):
        compiler.target_arch("hopper")


# -- header discovery ---------------------------------------------------------------------------

def test_include_dirs_find_cuda_fp16():
    dirs = compiler.include_dirs()
    assert dirs, "cuda.pathfinder found no CUDA include directory (is cuda-toolkit[cudart] installed?)"
    assert all(os.path.isdir(d) for d in dirs)
    assert any(os.path.isfile(os.path.join(d, "cuda_fp16.h")) for d in dirs)


def test_full_options_sort_user_options_and_add_includes():
    a = compiler.full_options(["-DB=1", "--use_fast_math", "-DA=2"], "sm_80")
    b = compiler.full_options(["-DA=2", "-DB=1", "--use_fast_math"], "sm_80")
    assert a == b
    assert a[:2] == ["-std=c++17", "-arch=sm_80"]
    assert [o for o in a if o.startswith("-I")] == [f"-I{d}" for d in compiler.include_dirs()]


# -- resolve_includes ---------------------------------------------------------------------------

def test_resolve_in_memory_recursive_with_cycle():
    headers = {
        "a.cuh": '#pragma once\n#include "b.cuh"\nint a;\n',
        "b.cuh": '#pragma once\n#include "a.cuh"\n#include "c.cuh"\nint b;\n',  # cycle a <-> b
        "c.cuh": "int c;\n",
        "unused.cuh": "int unused;\n",
    }
    src = '#include "a.cuh"\n#include <cstdint>\n#include "not_anywhere.h"\n'
    got = compiler.resolve_includes(src, headers, dirs=())
    assert got == [("mem:a.cuh", headers["a.cuh"].encode()), ("mem:b.cuh", headers["b.cuh"].encode()),
                   ("mem:c.cuh", b"int c;\n")]


def test_resolve_follows_conditional_and_skips_commented_includes():
    headers = {"x.cuh": "1", "y.cuh": "2", "z.cuh": "3"}
    src = ('#if 0\n#include "x.cuh"\n#endif\n'       # over-approximation: conditions are ignored
           '// #include "y.cuh"\n'                   # a comment is not an include
           '  #  include   <z.cuh>\n')                # spacing and angle brackets
    names = [k for k, _ in compiler.resolve_includes(src, headers, dirs=())]
    assert names == ["mem:x.cuh", "mem:z.cuh"]


def test_resolve_accepts_bytes_headers_and_is_stable():
    headers = {"b.cuh": b"bytes\n", "a.cuh": "text\n"}
    src = '#include "b.cuh"\n#include "a.cuh"\n'
    one = compiler.resolve_includes(src, headers, dirs=())
    two = compiler.resolve_includes(src, dict(reversed(list(headers.items()))), dirs=())
    assert one == two == [("mem:a.cuh", b"text\n"), ("mem:b.cuh", b"bytes\n")]


def test_resolve_on_disk_relative_recursive_and_cyclic(tmp_path):
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "top.h").write_text('#include "sub/mid.h"\n')
    # mid.h is found relative to its own directory first ("leaf.h" lives in sub/).
    (inc / "sub" / "mid.h").write_text('#include "leaf.h"\n#include "../top.h"\n')  # cycle to top
    (inc / "sub" / "leaf.h").write_text("leaf\n")
    got = compiler.resolve_includes("#include <top.h>\n", {}, dirs=[str(inc)])
    names = [k for k, _ in got]
    assert names == sorted(names)
    # Keyed by the include name as written (not the absolute path, so a cache warmed where
    # the headers live elsewhere still hits); ../top.h is the same file: listed once.
    assert {n[len("file:"):] for n in names} == {"top.h", "sub/mid.h", "leaf.h"}
    assert dict(got)["file:leaf.h"] == b"leaf\n"


def test_resolve_in_memory_header_pulls_disk_header(tmp_path):
    (tmp_path / "disk.h").write_text("disk\n")
    got = compiler.resolve_includes('#include "mem.cuh"\n', {"mem.cuh": '#include <disk.h>\n'},
                                    dirs=[str(tmp_path)])
    assert [k for k, _ in got] == ["file:disk.h", "mem:mem.cuh"]


def test_resolve_in_memory_wins_over_disk(tmp_path):
    (tmp_path / "same.cuh").write_text("disk\n")
    got = compiler.resolve_includes('#include "same.cuh"\n', {"same.cuh": "memory\n"},
                                    dirs=[str(tmp_path)])
    assert got == [("mem:same.cuh", b"memory\n")]


def test_resolve_real_cuda_headers():
    got = compiler.resolve_includes("#include <cuda_fp16.h>\n", {})
    names = [k for k, _ in got]
    assert "file:cuda_fp16.h" in names
    assert "file:cuda_fp16.hpp" in names  # followed recursively


# -- compiling ----------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
def test_compile_tiny_kernel(arch):
    c = compiler.compile_source(TINY, "tiny.cu", arch)
    assert c.arch == arch
    assert c.cubin.startswith(b"\x7fELF")
    assert f".target {arch}".encode() in c.ptx
    assert b".entry k(" in c.ptx
    assert c.seconds > 0


def test_compile_ptx_only():
    c = compiler.compile_source(TINY, "tiny.cu", "sm_80", cubin=False)
    assert c.cubin == b"" and b".entry k(" in c.ptx


def test_compile_with_in_memory_headers_and_defines():
    src = '#include "cfg.cuh"\n#if VALUE != 7\n#error VALUE must be 7\n#endif\n' + TINY
    c = compiler.compile_source(src, "cfg.cu", "sm_80", ["-DVALUE=7"], {"cfg.cuh": "#define OK 1\n"})
    assert c.cubin.startswith(b"\x7fELF")
    with pytest.raises(CompileError) as info:
        compiler.compile_source(src, "cfg.cu", "sm_80", ["-DVALUE=8"], {"cfg.cuh": "#define OK 1\n"})
    assert "VALUE must be 7" in info.value.log


def test_compile_half_and_bf16_headers_from_pathfinder():
    src = ('#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n'
           'extern "C" __global__ void h(__half* a, __nv_bfloat16* b) {\n'
           '  a[0] = __float2half(1.0f); b[0] = __float2bfloat16(2.0f);\n}\n')
    c = compiler.compile_source(src, "half.cu", "sm_80")
    assert c.cubin.startswith(b"\x7fELF")


def test_syntax_error_carries_log_options_and_numbered_source():
    src = '// line 1\nextern "C" __global__ void k(float* x) {\n  x[0] = ;\n}\n'
    with pytest.raises(CompileError) as info:
        compiler.compile_source(src, "broken.cu", "sm_80", ["-DFOO=1"])
    err = info.value
    assert err.name == "broken.cu"
    assert err.source == src
    assert "broken.cu(3)" in err.log and "error" in err.log
    assert "-arch=sm_80" in err.options and "-DFOO=1" in err.options
    assert "broken.cu" in str(err) and "error" in str(err)
    dump = err.dump()
    assert "3 |   x[0] = ;" in dump
    assert "1 | // line 1" in dump
    assert "-DFOO=1" in dump and "broken.cu(3)" in dump


@pytest.mark.parametrize("header,prefix", [
    ("cuda_fp16_nxrt_test_missing.h", "cuda_fp16"),
    ("cuda_bf16_nxrt_test_missing.h", "cuda_bf16"),
    ("cuda/std/nxrt_test_missing", "cuda/"),
])
def test_missing_header_names_its_package(monkeypatch, header, prefix):
    # No CUDA include directory at all (a fresh machine without the cudart wheel). NVRTC
    # words this case 'could not open source file "..." (no directories in search list)'.
    monkeypatch.setattr(compiler, "include_dirs", lambda: ())
    src = f"#include <{header}>\n" + TINY
    with pytest.raises(CompileError) as info:
        compiler.compile_source(src, "needs_header.cu", "sm_80")
    msg = str(info.value)
    assert header in msg
    assert HEADER_PACKAGES[prefix] in msg
    assert "no CUDA include directory was found" in msg
    assert info.value.log and info.value.source == src


def test_missing_header_with_include_dirs_names_its_package(monkeypatch, tmp_path):
    # Include directories exist but lack the header: NVRTC says 'cannot open source file'.
    monkeypatch.setattr(compiler, "include_dirs", lambda: (str(tmp_path),))
    with pytest.raises(CompileError) as info:
        compiler.compile_source("#include <cuda_fp16_nxrt_test_missing.h>\n" + TINY, "m.cu", "sm_80")
    msg = str(info.value)
    assert "cuda_fp16_nxrt_test_missing.h" in msg
    assert HEADER_PACKAGES["cuda_fp16"] in msg
    assert str(tmp_path) in msg  # the searched directories are listed


def test_missing_header_from_in_memory_header(monkeypatch):
    monkeypatch.setattr(compiler, "include_dirs", lambda: ())
    src = '#include "wrap.cuh"\n' + TINY
    with pytest.raises(CompileError) as info:
        compiler.compile_source(src, "w.cu", "sm_80", (),
                                {"wrap.cuh": "#include <cuda_fp16_nxrt_test_missing.h>\n"})
    assert HEADER_PACKAGES["cuda_fp16"] in str(info.value)


def test_unknown_missing_header_says_so():
    with pytest.raises(CompileError) as info:
        compiler.compile_source('#include "nxrt_no_such_header.cuh"\n' + TINY, "u.cu", "sm_80")
    msg = str(info.value)
    assert "nxrt_no_such_header.cuh" in msg and "no known package provides it" in msg


# -- the cache key ------------------------------------------------------------------------------

BASE = dict(source=TINY, arch="sm_90", options=("-DA=1", "-DB=2"),
            headers=[("mem:h.cuh", b"int h;\n")], nvrtc_version=(13, 0))


def _key(**changes) -> str:
    kw = {**BASE, **changes}
    return cache_key(kw["source"], kw["arch"], kw["options"], kw["headers"], kw["nvrtc_version"])


def test_cache_key_is_deterministic_hex():
    k = _key()
    assert k == _key() and len(k) == 64 and int(k, 16) >= 0


@pytest.mark.parametrize("change", [
    dict(source=TINY + " "),
    dict(source=TINY.replace("1.0f", "2.0f")),
    dict(headers=[("mem:h.cuh", b"int h; \n")]),          # header content
    dict(headers=[("mem:g.cuh", b"int h;\n")]),           # header name
    dict(headers=[("mem:h.cuh", b"int h;\n"), ("mem:i.cuh", b"")]),  # one more header
    dict(headers=[]),
    dict(options=("-DA=1", "-DB=2", "--use_fast_math")),  # an added option
    dict(options=("-DA=1", "-DB=3")),                     # a changed option
    dict(options=("-DA=1",)),                             # a removed option
    dict(options=("-DA=1-DB=2",)),                        # field boundaries are length-prefixed
    dict(arch="sm_80"),
    dict(arch="sm_90a"),
    dict(nvrtc_version=(13, 1)),
    dict(nvrtc_version=(12, 0)),
])
def test_cache_key_changes_with_each_field(change):
    assert _key(**change) != _key()


def test_cache_key_ignores_option_order():
    assert _key(options=("-DB=2", "-DA=1")) == _key()
    assert _key(options=["-DB=2", "-DA=1"]) == _key()


def test_cache_key_changes_with_format_version(monkeypatch):
    before = _key()
    monkeypatch.setattr(cache_mod, "FORMAT_VERSION", cache_mod.FORMAT_VERSION + 1)
    assert _key() != before


def test_compile_cache_key_covers_in_memory_headers(tmp_path):
    c = CompileCache(tmp_path, disk=False)
    src = '#include "a.cuh"\n' + TINY
    k0 = c.key(src, "sm_90", ["-DX=1"], {"a.cuh": '#include "b.cuh"\n', "b.cuh": "int b;\n",
                                         "unused.cuh": "1"})
    # Content of a directly and of a transitively included header both count.
    assert c.key(src, "sm_90", ["-DX=1"], {"a.cuh": '#include "b.cuh"\n ', "b.cuh": "int b;\n",
                                           "unused.cuh": "1"}) != k0
    assert c.key(src, "sm_90", ["-DX=1"], {"a.cuh": '#include "b.cuh"\n', "b.cuh": "int b2;\n",
                                           "unused.cuh": "1"}) != k0
    # A header that is not included does not.
    assert c.key(src, "sm_90", ["-DX=1"], {"a.cuh": '#include "b.cuh"\n', "b.cuh": "int b;\n",
                                           "unused.cuh": "2"}) == k0
    assert c.key(src, "sm_80", ["-DX=1"], {"a.cuh": '#include "b.cuh"\n', "b.cuh": "int b;\n",
                                           "unused.cuh": "1"}) != k0


def test_compile_cache_key_covers_on_disk_headers(tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    inc.mkdir()
    hdr = inc / "nxrt_test_disk.h"
    hdr.write_text("#define V 1\n")
    monkeypatch.setattr(compiler, "include_dirs", lambda: (str(inc),))
    c = CompileCache(tmp_path / "cache", disk=False)
    src = "#include <nxrt_test_disk.h>\n" + TINY
    k0 = c.key(src, "sm_90")
    assert c.key(src, "sm_90") == k0
    hdr.write_text("#define V 22\n")
    assert c.key(src, "sm_90") != k0


def test_compile_cache_key_covers_nvrtc_version_and_option_order(tmp_path, monkeypatch):
    c = CompileCache(tmp_path, disk=False)
    k0 = c.key(TINY, "sm_90", ["-DA=1", "-DB=2"])
    assert c.key(TINY, "sm_90", ["-DB=2", "-DA=1"]) == k0
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (99, 9))
    assert c.key(TINY, "sm_90", ["-DA=1", "-DB=2"]) != k0
