"""Only what pyproject.toml cannot say: a wheel carries the top-level sglang/ patch set (as soarpack/sglang_patches)
and the platform's entry scripts (as soarpack/bundle/entry/), so `soarpack build` works from an installed copy."""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ENTRY_SCRIPTS = ("prepare_env.sh", "prepare_model.sh", "preprocess_model.py")


class BuildWithEntryScripts(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "soarpack" / "bundle" / "entry"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ENTRY_SCRIPTS:
            shutil.copyfile(name, dest / name)


setup(
    packages=find_packages(include=["soarpack", "soarpack.*"]) + ["soarpack.sglang_patches"],
    package_dir={"soarpack.sglang_patches": "sglang"},
    cmdclass={"build_py": BuildWithEntryScripts},
)
