"""Issue 39, secrets that still shipped: inside compressed members (a .gz, a .tar.gz in the tree or in a wheel), in
UTF-16/UTF-32 text, and in a file's name. The scanner sees through compression (bounded: a bomb is refused, not
unpacked) and encodings, and reads names; build refuses exactly what check refuses (one function decides)."""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from soarpack.bundle import secrets
from soarpack.bundle.build import build_bundle
from soarpack.bundle.secrets import CredentialError, scan_tree
from soarpack.bundle.tarpack import safe_extract, write_tarball
from soarpack.bundle.wheels import make_pure_wheel
from soarpack.rehearse.check import check_bundle

HF_TOKEN = "hf_" + "Ab3" * 12
GH_TOKEN = "ghp_" + "B7x" * 12
UNDER = Path(__file__).resolve().parent.parent


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _tar_gz(members: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


SECRET_LINE = f"my token {HF_TOKEN} keep it\n"
# name -> (file name, bytes, refused?): each is a calibration file for build, and the same file in an upload for check
CASES = {
    "gz": ("notes.txt.gz", _gz(SECRET_LINE.encode()), True),
    "gz-any-name": ("blob.bin", _gz(SECRET_LINE.encode()), True),
    "tar.gz": ("data.tar.gz", _tar_gz({"inner/readme.txt": b"hello\n", "inner/secret.txt": f"{GH_TOKEN}\n".encode()}), True),
    "tar.gz-in-gz": ("twice.gz", _gz(_tar_gz({"s.txt": SECRET_LINE.encode()})), True),
    "bz2": ("notes.bz2", bz2.compress(SECRET_LINE.encode()), True),
    "xz": ("notes.xz", lzma.compress(SECRET_LINE.encode()), True),
    "utf-16-le-bom": ("u16le.txt", SECRET_LINE.encode("utf-16"), True),
    "utf-16-le": ("u16le-nobom.txt", SECRET_LINE.encode("utf-16-le"), True),
    "utf-16-be": ("u16be-nobom.txt", SECRET_LINE.encode("utf-16-be"), True),
    "utf-16-be-bom": ("u16be.txt", b"\xfe\xff" + SECRET_LINE.encode("utf-16-be"), True),
    "utf-32-le": ("u32.txt", SECRET_LINE.encode("utf-32"), True),
    "utf-32-be": ("u32be.txt", SECRET_LINE.encode("utf-32-be"), True),
    # a JSON string that spells the token in \u escapes, the file in UTF-16: decoded, then read as JSON
    "utf-16-json-escaped": ("u16.jsonl", ('{"text": "' + "".join(f"\\u{ord(c):04x}" for c in HF_TOKEN) + '"}\n')
                            .encode("utf-16"), True),
    "name": (f"{HF_TOKEN}.jsonl", (json.dumps({"text": "plain words"}) + "\n").encode(), True),
    "gz-clean": ("clean.txt.gz", _gz(b"just calibration prose\n" * 50), False),
    "tar.gz-clean": ("clean.tar.gz", _tar_gz({"a.txt": b"prose\n"}), False),
    "utf-16-clean": ("clean16.txt", "plain prose, caf\u00e9 \u4e2d\u6587\n".encode("utf-16"), False),
}


def test_text_encodings_are_told_by_bom_or_by_where_the_nuls_fall():
    text_encoding = secrets.text_encoding
    text = "some ASCII text, long enough to judge\n"
    assert text_encoding(text.encode("utf-16")) == "utf-16-le"
    assert text_encoding(text.encode("utf-16-le")) == "utf-16-le"
    assert text_encoding(text.encode("utf-16-be")) == "utf-16-be"
    assert text_encoding(text.encode("utf-32")) == "utf-32-le"
    assert text_encoding(text.encode("utf-32-be")) == "utf-32-be"
    assert text_encoding(text.encode()) is None and text_encoding(bytes(512)) is None


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory):
    work = tmp_path_factory.mktemp("clean")
    bundle = build_bundle(work / "b.tar.gz", wheels=False, calib_rows=8).path
    return safe_extract(bundle, work / "tree")


def _check_refuses(tree: Path, rel: str, data: bytes, work: Path) -> bool:
    """Whether check's credentials step fails on an upload that holds `data` at `rel`."""
    shutil.copytree(tree, work / "t")
    (work / "t" / rel).parent.mkdir(parents=True, exist_ok=True)
    (work / "t" / rel).write_bytes(data)
    upload = write_tarball(work / "t", work / "upload.tar.gz")
    report = check_bundle(upload, rehearse=False)
    (step,) = [s for s in report.steps if s.name == "credentials"]
    assert step.status in ("pass", "fail"), step
    return step.status == "fail"


def _build_refuses(name: str, data: bytes, work: Path) -> bool:
    """Whether build refuses a fork tree (--sglang-src, shipped as sglang/python/) that holds `data` at
    sglang/data/NAME: that route ships any file as it is."""
    src = work / "src"
    (src / "sglang" / "data").mkdir(parents=True)
    (src / "sglang" / "__init__.py").write_text("")
    (src / "sglang" / "data" / name).write_bytes(data)
    try:
        build_bundle(work / "b.tar.gz", profile="safe", sglang_src=src, wheels=False, calib_rows=8)
    except CredentialError as exc:
        assert HF_TOKEN not in exc.message and GH_TOKEN not in exc.message  # the refusal does not print the secret
        assert not (work / "b.tar.gz").exists()
        return True
    return False


@pytest.mark.parametrize("case", sorted(CASES))
def test_build_refuses_exactly_what_check_refuses(case, clean_tree, tmp_path):
    name, data, refused = CASES[case]
    built = _build_refuses(name, data, tmp_path / "b")
    checked = _check_refuses(clean_tree, f"sglang/python/sglang/data/{name}", data, tmp_path / "c")
    assert (built, checked) == (refused, refused), case


def test_build_scans_the_finished_tree_with_the_manifest(tmp_path, monkeypatch):
    """build's decision is check's: scan_tree on the very tree that is packed, MANIFEST.json already in it."""
    from soarpack.bundle import build

    seen = []
    monkeypatch.setattr(build, "scan_tree", lambda root: seen.append(sorted(p.name for p in Path(root).iterdir())))
    build_bundle(tmp_path / "b.tar.gz", wheels=False, calib_rows=8)
    assert len(seen) == 1 and "MANIFEST.json" in seen[0]


def test_a_calibration_file_whose_name_holds_a_token_is_refused_before_the_manifest_repeats_it(tmp_path):
    calib = tmp_path / f"calib-{GH_TOKEN}.txt"
    calib.write_text("plain prose\n")
    with pytest.raises(CredentialError, match="name that holds what looks like a GitHub token") as exc:
        build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], calib_rows=8)
    assert GH_TOKEN not in exc.value.message
    assert not (tmp_path / "b.tar.gz").exists()


def test_a_tar_gz_inside_a_wheel_is_opened(tmp_path):
    wheels = tmp_path / "wh"
    wheel = make_pure_wheel(wheels, "evil", "1.0", {"evil/__init__.py": ""})
    with zipfile.ZipFile(wheel, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("evil/data/fixtures.tar.gz", _tar_gz({"fixtures/conf.txt": f"token = {GH_TOKEN}\n".encode()}))
    with pytest.raises(CredentialError, match="GitHub token") as exc:
        build_bundle(tmp_path / "b.tar.gz", wheels=True, wheel_dir=wheels, calib_rows=8)
    assert "evil/data/fixtures.tar.gz!fixtures.tar!fixtures/conf.txt" in exc.value.message
    assert not (tmp_path / "b.tar.gz").exists()


def test_a_member_name_with_a_token_is_refused_in_an_archive(tmp_path):
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "x.tar.gz").write_bytes(_tar_gz({f"{HF_TOKEN}.txt": b"prose\n"}))
    with pytest.raises(CredentialError, match="name that holds what looks like a Hugging Face token") as exc:
        scan_tree(tmp_path)
    assert HF_TOKEN not in exc.value.message and "hf_Ab3...(redacted)" in exc.value.message


BOMB = """
import gzip, io, resource, sys, zipfile
resource.setrlimit(resource.RLIMIT_AS, (768 * 2**20, 768 * 2**20))
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from soarpack.bundle.secrets import CredentialError, scan_tree
root = Path(sys.argv[2])
try:
    scan_tree(root)
except CredentialError as exc:
    print("refused:", exc.message)
else:
    print("shipped")
"""


@functools.lru_cache(maxsize=1)
def _bomb_of_zeros() -> bytes:
    """1 GiB of zeros, gzip-compressed to about 1 MB (one gzip member repeated: gzip reads members back to back)."""
    one = gzip.compress(bytes(16 << 20), compresslevel=1, mtime=0)
    return one * 64


@pytest.mark.parametrize("shape", ["gzip", "nested-zip", "deep"])
def test_a_compression_bomb_is_refused_in_bounded_memory(tmp_path, shape):
    """Run in a child held to 768 MiB of address space: the scan must stop early, not unpack the bomb."""
    root = tmp_path / "tree" / "calib"
    root.mkdir(parents=True)
    if shape == "gzip":
        (root / "a.gz").write_bytes(_bomb_of_zeros())
        said = "expands past"
    elif shape == "nested-zip":  # 16 members of 1 GiB each
        with zipfile.ZipFile(root / "bomb.zip", "w", zipfile.ZIP_STORED) as zf:
            for i in range(16):
                zf.writestr(f"part{i}.gz", _bomb_of_zeros())
        said = "expands past"
    else:  # gz of gz of ... 10 deep, tiny
        data = b"prose\n"
        for _ in range(10):
            data = _gz(data)
        (root / "deep.gz").write_bytes(data)
        said = "too deep"
    proc = subprocess.run([sys.executable, "-c", BOMB, str(UNDER), str(tmp_path / "tree")], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused:") and said in proc.stdout, proc.stdout
