"""`soarpack inspect`: a bundle's summary from its MANIFEST.json, without extracting it."""

import hashlib
import io
import json
import tarfile

import pytest
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.bundle.summary import inspect_bundle
from soarpack.bundle.tarpack import UnsafeArchiveError
from soarpack.bundle.wheels import make_pure_wheel
from soarpack.cli import app
from soarpack.recipe.profile import load_profile


def test_inspect_summarises_a_built_bundle(tmp_path):
    calib = tmp_path / "mine.jsonl"
    calib.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(5)))
    wheels = tmp_path / "wh"
    make_pure_wheel(wheels, "probe", "1.0", {"probe.py": "X = 1\n"})
    built = build_bundle(tmp_path / "b.tar.gz", profile="fp8-kv", calib=[calib], wheel_dir=wheels)
    summary = inspect_bundle(built.path)
    assert summary["sha256"] == hashlib.sha256(built.path.read_bytes()).hexdigest()
    assert summary["profile"] == "fp8-kv" and summary["server_args"] == load_profile("fp8-kv").args_string()
    assert summary["recipe"] == built.manifest["quantize"]["recipe_name"]
    assert summary["calibration"] == {"rows": 5, "sources": [{"file": "calib/00-mine.jsonl", "rows": 5}]}
    assert summary["wheels"] == {"count": 1, "source": "dir"}
    assert summary["soarpack_version"] == built.manifest["soarpack_version"]

    result = CliRunner().invoke(app, ["inspect", str(built.path), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout) == summary
    text = CliRunner().invoke(app, ["inspect", str(built.path)]).stdout
    assert "5 rows from calib/00-mine.jsonl (5)" in text and summary["sha256"] in text


def _tar_with(tmp_path, member: tarfile.TarInfo, data: bytes = b""):
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return path


def test_inspect_refuses_a_manifest_that_is_a_link_and_a_tarball_without_one(tmp_path):
    link = tarfile.TarInfo("MANIFEST.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(UnsafeArchiveError, match="absolute path"):
        inspect_bundle(_tar_with(tmp_path, link))
    other = tarfile.TarInfo("README")
    other.size = 2
    result = CliRunner().invoke(app, ["inspect", str(_tar_with(tmp_path, other, b"hi"))])
    assert result.exit_code == 2 and "holds no MANIFEST.json" in result.output
