"""pyproject.toml: setuptools reads it without a licence warning (SPDX string, no classifier)."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_licence_is_an_spdx_expression_without_setuptools_warnings() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    about_licence = [str(w.message) for w in caught if "licen" in str(w.message).lower()]
    assert about_licence == []
    assert dist.metadata.license_expression == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in dist.metadata.classifiers or [])
