"""Compile ``gpu/shaders/*.comp`` to SPIR-V beside them: ``python -m gpu.build_shaders``.

``--check`` compiles into memory and exits non-zero when a committed ``.spv`` is
missing or differs from a fresh compile. The comparison skips the SPIR-V header's
generator word (word 2), which only carries the glslang build number, so the check
holds across glslang releases that emit the same code. ``*.glsl`` files in the same
folder are include files (``#include "loss_common.glsl"``), not modules.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu.errors import ShaderError, VulkanUnavailable

SHADER_DIR = Path(__file__).resolve().parent / "shaders"
TARGET_ENV = "vulkan1.1"


def glslang() -> str:
    """Path of glslangValidator; VulkanUnavailable naming the Debian package when missing."""
    path = shutil.which("glslangValidator")
    if path is None:
        raise VulkanUnavailable(
            "glslangValidator is not on PATH; install the Debian package glslang-tools",
            package="glslang-tools",
        )
    return path


def shader_path(name: str) -> Path:
    """The compiled module ``gpu/shaders/<name>.spv``; ShaderError naming the shaders there are."""
    path = SHADER_DIR / f"{name}.spv"
    if not path.exists():
        have = ", ".join(sorted(p.stem for p in SHADER_DIR.glob("*.spv")))
        raise ShaderError(f"Unknown shader {name!r}; available: {have}; run python -m gpu.build_shaders")
    return path


def compile_shader(source: Path, defines: dict[str, str] | None = None) -> bytes:
    """SPIR-V bytes of the GLSL compute shader ``source`` (includes resolve beside it)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.spv"
        cmd = [glslang(), "-V", "--target-env", TARGET_ENV, f"-I{source.parent}", "-o", str(out)]
        cmd += [f"-D{k}={v}" for k, v in (defines or {}).items()]
        proc = subprocess.run(cmd + [str(source)], capture_output=True, text=True)
        if proc.returncode != 0:
            detail = (proc.stdout + proc.stderr).strip()
            raise ShaderError(f"glslangValidator failed on {source.name}:\n{detail}")
        return out.read_bytes()


def same_code(a: bytes, b: bytes) -> bool:
    """Whether two SPIR-V modules are equal apart from the generator word."""
    return len(a) == len(b) and a[:8] == b[:8] and a[12:] == b[12:]


def sources(folder: Path = SHADER_DIR) -> list[Path]:
    """The compute shaders of ``folder``, sorted."""
    return sorted(folder.glob("*.comp"))


def stale(folder: Path = SHADER_DIR) -> list[str]:
    """Names of shaders whose ``.spv`` is missing or differs from a fresh compile."""
    out = []
    for src in sources(folder):
        spv = src.with_suffix(".spv")
        if not spv.exists() or not same_code(spv.read_bytes(), compile_shader(src)):
            out.append(src.name)
    return out


def build(folder: Path = SHADER_DIR) -> list[str]:
    """Compile every shader of ``folder``; returns the names whose ``.spv`` changed."""
    changed = []
    for src in sources(folder):
        spv = src.with_suffix(".spv")
        code = compile_shader(src)
        if not spv.exists() or not same_code(spv.read_bytes(), code):
            spv.write_bytes(code)
            changed.append(src.name)
    return changed


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m gpu.build_shaders", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a .spv is stale; write nothing")
    parser.add_argument("--dir", type=Path, default=SHADER_DIR, help="shader folder (default: gpu/shaders)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            bad = stale(args.dir)
            for name in bad:
                print(f"stale: {name} (run python -m gpu.build_shaders)", file=sys.stderr)
            return 1 if bad else 0
        for name in build(args.dir):
            print(f"compiled {name}")
    except (ShaderError, VulkanUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
