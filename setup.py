"""Only what pyproject.toml cannot say: ship the top-level sglang/ patch set inside the package."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["soarpack", "soarpack.*"]) + ["soarpack.sglang_patches"],
    package_dir={"soarpack.sglang_patches": "sglang"},
)
