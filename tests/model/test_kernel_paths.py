"""How a process picks its bfloat16 GEMM path (`radixkv.model.kernels.paths`): measured once per
build and recorded, stable under noise, forced by $RADIXKV_BF16_GEMM; and what the real module
reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.model.kernels import paths


class FakeModule:
    """The module's path API over a fixed set of served paths, counting products."""

    def __init__(self, served: list[str]) -> None:
        self.served = served
        self.path = served[0] if served else ""
        self.products: dict[str, int] = {}

    def bf16_gemm_paths(self) -> list[str]:
        return list(self.served)

    def set_bf16_gemm(self, name: str) -> None:
        if name not in self.served:
            raise RuntimeError(f"bfloat16 GEMM path '{name}' is not served on this CPU")
        self.path = name

    def bf16_gemm(self) -> str:
        return self.path

    def gemm_pack(self, w: object) -> object:
        return w

    def gemm(self, x: object, packed: object, n: int, bias: object) -> None:
        self.products[self.path] = self.products.get(self.path, 0) + 1


def test_choose_prefers_in_order_unless_a_later_path_is_clearly_faster() -> None:
    assert paths.choose({"fma": 1.0, "dot": 1.0}, ["fma", "dot"]) == "dot"
    assert paths.choose({"fma": 1.0, "dot": 1.2}, ["fma", "dot"]) == "dot"  # within the margin
    assert paths.choose({"fma": 1.0, "dot": 2.0}, ["fma", "dot"]) == "fma"
    assert paths.choose({"fma": 2.0, "dot": 1.0, "amx": 0.2}, ["fma", "dot", "amx"]) == "amx"
    # a path the CPU no longer serves (RADIXKV_AMX=0) is not chosen, whatever its time
    assert paths.choose({"fma": 2.0, "dot": 1.0, "amx": 0.2}, ["fma", "dot"]) == "dot"


def test_the_first_process_measures_and_later_ones_reuse_the_record(tmp_path: Path) -> None:
    first = FakeModule(["fma", "dot"])
    chosen = paths.select_bf16_gemm(first, tmp_path)
    assert chosen == first.bf16_gemm() and chosen in ("fma", "dot")
    assert first.products["fma"] > 0 and first.products["dot"] > 0  # both were timed
    record = json.loads((tmp_path / paths.RECORD).read_text())
    assert set(record["seconds"]) == {"fma", "dot"}
    record["seconds"] = {"fma": 1.0, "dot": 3.0}  # as if fma had measured 3x faster
    (tmp_path / paths.RECORD).write_text(json.dumps(record))
    later = FakeModule(["dot", "fma"])
    assert paths.select_bf16_gemm(later, tmp_path) == "fma" == later.bf16_gemm()
    assert later.products == {}  # nothing measured again


def test_a_newly_served_path_is_measured_and_added(tmp_path: Path) -> None:
    (tmp_path / paths.RECORD).write_text(json.dumps({"seconds": {"fma": 1.0, "dot": 1.0}}))
    module = FakeModule(["fma", "dot", "amx"])
    paths.select_bf16_gemm(module, tmp_path)
    assert set(module.products) == {"amx"}
    assert set(json.loads((tmp_path / paths.RECORD).read_text())["seconds"]) == {
        "fma",
        "dot",
        "amx",
    }


def test_a_damaged_record_is_measured_anew(tmp_path: Path) -> None:
    (tmp_path / paths.RECORD).write_text("{not json")
    module = FakeModule(["fma", "dot"])
    paths.select_bf16_gemm(module, tmp_path)
    assert set(module.products) == {"fma", "dot"}


def test_the_environment_forces_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.ENV, "fma")
    module = FakeModule(["dot", "fma"])
    assert paths.select_bf16_gemm(module, tmp_path) == "fma" == module.bf16_gemm()
    assert module.products == {} and not (tmp_path / paths.RECORD).exists()
    monkeypatch.setenv(paths.ENV, "amx")
    with pytest.raises(ValueError, match="RADIXKV_BF16_GEMM=amx: this CPU serves dot, fma"):
        paths.select_bf16_gemm(module, tmp_path)


def test_no_bfloat16_kernel_means_no_path(tmp_path: Path) -> None:
    assert paths.select_bf16_gemm(FakeModule([]), tmp_path) == ""


def test_the_report_names_the_cpu_and_the_paths_this_process_took() -> None:
    from radixkv.model.kernels import cpu_kernels, kernel_paths

    report = kernel_paths()
    assert report["cpu"] == paths.cpu_model() and report["cpu"]
    module = cpu_kernels()
    if module is None:
        assert report["kernels"] == "none (torch's)"
        return
    if module.gemm_bf16_supported():
        assert report["bfloat16_gemm"] == module.bf16_gemm() in module.bf16_gemm_paths()
    else:
        assert report["bfloat16_gemm"] == "onednn"
