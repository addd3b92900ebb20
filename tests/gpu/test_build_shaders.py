"""Committed SPIR-V is current, and the staleness check notices when it is not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu import build_shaders
from gpu.errors import ShaderError, VulkanUnavailable

ROOT = Path(__file__).resolve().parents[2]


def test_committed_spirv_is_current() -> None:
    out = subprocess.run([sys.executable, "-m", "gpu.build_shaders", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_source_has_its_module() -> None:
    sources = {p.stem for p in build_shaders.sources()}
    modules = {p.stem for p in build_shaders.SHADER_DIR.glob("*.spv")}
    assert sources == modules
    assert {"bce_f32", "focal_f16", "reduce_sum", "echo_push"} <= sources


@pytest.fixture
def shader_dir(tmp_path: Path) -> Path:
    for name in ("echo_tight.comp", "reduce_sum.comp", "reduce.glsl"):
        shutil.copy(build_shaders.SHADER_DIR / name, tmp_path / name)
    assert build_shaders.build(tmp_path) == ["echo_tight.comp", "reduce_sum.comp"]
    return tmp_path


def test_check_fails_on_a_stale_or_missing_module(shader_dir: Path) -> None:
    assert build_shaders.main(["--check", "--dir", str(shader_dir)]) == 0
    src = shader_dir / "echo_tight.comp"
    src.write_text(src.read_text().replace("result.c = pc.c;", "result.c = pc.c * 2.0;"))
    assert build_shaders.stale(shader_dir) == ["echo_tight.comp"]
    assert build_shaders.main(["--check", "--dir", str(shader_dir)]) == 1
    (shader_dir / "reduce_sum.spv").unlink()
    assert build_shaders.stale(shader_dir) == ["echo_tight.comp", "reduce_sum.comp"]
    assert build_shaders.main(["--dir", str(shader_dir)]) == 0
    assert build_shaders.stale(shader_dir) == []


def test_an_edited_include_makes_its_users_stale(shader_dir: Path) -> None:
    inc = shader_dir / "reduce.glsl"
    inc.write_text(inc.read_text().replace("const uint ROWS_PER_LANE = 16u;", "const uint ROWS_PER_LANE = 8u;"))
    assert build_shaders.stale(shader_dir) == ["reduce_sum.comp"]


def test_generator_word_is_ignored() -> None:
    code = (build_shaders.SHADER_DIR / "echo_tight.spv").read_bytes()
    other = code[:8] + b"\x01\x00\x0b\x00" + code[12:]
    assert build_shaders.same_code(code, other)
    assert not build_shaders.same_code(code, code[:-4] + b"\x00\x00\x00\x00")


def test_compile_errors_carry_glslang_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.comp"
    bad.write_text("#version 450\nvoid main() { undefined_name = 1; }\n")
    with pytest.raises(ShaderError, match="bad.comp.*undefined_name"):
        build_shaders.compile_shader(bad)


def test_missing_glslang_names_the_package(monkeypatch: pytest.MonkeyPatch, shader_dir: Path) -> None:
    monkeypatch.setattr(build_shaders.shutil, "which", lambda name: None)
    with pytest.raises(VulkanUnavailable, match="glslang-tools") as exc:
        build_shaders.glslang()
    assert exc.value.package == "glslang-tools"
    assert build_shaders.main(["--check", "--dir", str(shader_dir)]) == 2
