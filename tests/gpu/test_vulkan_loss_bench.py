"""The Vulkan loss benchmark's own code, on a tiny workload (the full run is `make bench`)."""

from __future__ import annotations

import re

import pytest

from bench import vulkan_loss


def test_the_table_of_a_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    vulkan_loss.main(["--batch", "2", "--anchors", "96", "--classes", "80", "--rounds", "2"])
    out = capsys.readouterr().out
    rows = {line[:22].strip(): line[22:].split() for line in out.splitlines()[3:9]}
    assert {"vulkan", "vulkan kernel only", "without gradient", "numpy"} <= set(rows)
    kernel, no_grad = float(rows["vulkan kernel only"][0]), float(rows["without gradient"][0])
    assert 0 < no_grad and 0 < kernel
    assert float(rows["numpy"][2]) == 1.0  # numpy against itself
    # both backends added the same number of gradients: they agree to float32 rounding
    diff = re.search(r"gradient after 3 calls each: max \|vulkan - numpy\| / max \|numpy\| = (\S+)", out)
    assert diff is not None, out
    assert float(diff.group(1)) < 1e-5
    assert re.search(r"targets: vulkan <= 0\.45x numpy: \d+\.\d\dx best \((met|missed)\)", out)
