"""The reliability sweep (docs/reliability-sweep-2026-11-30.md), filesystem rows: inputs are sacred, outputs are
atomic, disk full and read-only outputs are one line, bundles extract safely, killed runs leave nothing that passes
for a result. One test (or parametrized case) per row; the id names the row.

Read-only folders and full disks are real mounts (tmpfs, a read-only bind mount): root ignores permission bits.
Where mounting is not allowed the test is skipped with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.errors import SoarpackError

from soarpack.bundle.build import build_bundle
from soarpack.bundle.tarpack import MAX_ENTRIES, UnsafeArchiveError, pack_tree, safe_extract
from soarpack.cli import app
from tar_helpers import write_tar
from soarpack.placement.owner import INCOMPLETE_MARKER, read_incomplete_marker

REPO = Path(__file__).resolve().parent.parent
QUANT_FAST = ["--rows", "4", "--max-len", "128", "--device", "cpu", "--no-report"]


def run_cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_clean_error(res, *names: str, code: int = 2) -> None:
    out = res.output
    assert res.exit_code == code, out
    assert "Traceback" not in out, out
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    flat = "".join(out.split())  # rich wraps long lines
    for name in names:
        assert "".join(name.split()) in flat, (name, out)


def tree_hash(root: Path) -> str:
    """Every name, type, mode, link target and byte under root (root itself included)."""
    h = hashlib.sha256()
    paths = [root] + sorted(root.rglob("*")) if root.is_dir() else [root]
    for p in paths:
        st = p.lstat()
        h.update(f"{p.relative_to(root.parent)}|{st.st_mode:o}|".encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _mount(args: list[str]) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({proc.stderr.strip() or 'not root'}): a real read-only or full disk is needed")


@pytest.fixture()
def read_only_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    _mount(["--bind", str(ro), str(ro)])
    try:
        _mount(["-o", "remount,bind,ro", str(ro)])
        yield ro
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


@pytest.fixture()
def full_disk(tmp_path):
    """A 64 KiB tmpfs: room for a marker file or a small old output, not for a checkpoint or a bundle."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    _mount(["-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)])
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def leftovers(folder: Path, stem: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{stem}.") or p.name.endswith(".part"))


# -- quantize -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing-folder", "a-directory"])
def test_row_021_quantize_log_path_unwritable(tiny_model_dir, tmp_path, where):
    log = tmp_path / "nonexistent" / "x.log" if where == "missing-folder" else tmp_path
    res = run_cli("quantize", tiny_model_dir, tmp_path / "q", "--log", log)
    assert_clean_error(res, "--log", str(log))
    assert not (tmp_path / "q").exists()


def test_row_031_quantize_out_parent_of_model(tiny_model_dir, tmp_path):
    """Data loss before: OUT = a parent of MODEL with --force deleted the model. Now refused; nothing changes."""
    anc = tmp_path / "anc"
    shutil.copytree(tiny_model_dir, anc / "models" / "tiny")
    (anc / "NOTES.txt").write_text("mine\n")
    before = tree_hash(anc)
    res = run_cli("quantize", anc / "models" / "tiny", anc, "--force", *QUANT_FAST)
    assert_clean_error(res, f"output {anc} contains the input {anc / 'models' / 'tiny'}")
    assert tree_hash(anc) == before


def test_row_034_a_new_output_inside_the_model_stays_allowed(tmp_path):
    """OK row kept OK (quantize's check phase): `quantize tin tin/quant` writes a new folder inside the input; with
    --force over an existing, non-empty tin/quant it would delete part of the input, so that is refused."""
    from soarpack.placement.write import prepare_output_dir

    tin = tmp_path / "tin"
    tin.mkdir()
    (tin / "config.json").write_text("{}")
    assert prepare_output_dir(tin / "quant", inputs=[tin]) == tin / "quant"
    (tin / "quant").mkdir()
    (tin / "quant" / "model.safetensors").write_text("x")
    with pytest.raises(SoarpackError, match="would replace something inside the input"):
        prepare_output_dir(tin / "quant", force=True, inputs=[tin])


def test_row_038_quantize_out_read_only_found_at_check(tiny_model_dir, read_only_dir):
    res = run_cli("quantize", tiny_model_dir, read_only_dir / "q", *QUANT_FAST)
    assert_clean_error(res, str(read_only_dir / "q"), "cannot be written", "Read-only file system")
    assert "calibration" not in res.output  # stopped in the check phase, before any work


def test_row_039_quantize_disk_full_while_saving(tiny_model_dir, full_disk):
    res = run_cli("quantize", tiny_model_dir, full_disk / "q", *QUANT_FAST)
    assert_clean_error(res, f"no space left on the device while writing {full_disk / 'q'}")
    # the temp folder is gone, nothing at OUT; what stays is the failed run's log, whose path the error printed
    assert os.listdir(full_disk) == ["q.log"] and "q.log" in "".join(res.output.split())


def _quantize_killed(tiny: Path, out: Path, patch: str, sig: int, *extra: str) -> subprocess.CompletedProcess:
    """`soarpack quantize` in a child that sends itself `sig` inside `patch` (module:function), after it ran."""
    module, func = patch.split(":")
    # Python's own SIGINT handler, also where the tests run with SIGINT ignored (nohup, `&`: inherited by the child).
    code = textwrap.dedent(f"""
        import os, signal, sys, {module} as m
        signal.signal(signal.SIGINT, signal.default_int_handler)
        real = m.{func}
        def hooked(*a, **k):
            result = real(*a, **k)
            os.kill(os.getpid(), {int(sig)})
            return result
        m.{func} = hooked
        from soarpack.cli import main
        main(sys.argv[1:])
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), GPTQMODEL_CPU_WORKERS="2")
    return subprocess.run([sys.executable, "-c", code, "quantize", str(tiny), str(out), *QUANT_FAST, *extra],
                          capture_output=True, text=True, env=env, timeout=600)


def _temps(out: Path) -> list[Path]:
    """The temp folders of runs writing `out` (each has a `.lock` file beside it while its owner lives)."""
    return sorted(p for p in out.parent.glob(f".{out.name}.tmp-*") if p.is_dir())


@pytest.mark.slow
def test_row_144_sigkill_at_save_leaves_a_marked_temp_folder(tiny_model_dir, tmp_path):
    out = tmp_path / "q"
    proc = _quantize_killed(tiny_model_dir, out, "soarpack.sala.checkpoint:save_state_dict", signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not out.exists()
    (tmp,) = _temps(out)
    assert (tmp / "model.safetensors").is_file()
    owner = read_incomplete_marker(tmp)
    assert owner["target"] == "q" and owner["pid"] != os.getpid()


@pytest.fixture(scope="module")
def killed_in_verify(tiny_model_dir, tmp_path_factory):
    """A run with --force over an existing output, SIGKILLed while it verifies its finished temp folder."""
    out = tmp_path_factory.mktemp("killed") / "q"
    out.mkdir()
    (out / "config.json").write_text('{"an": "earlier good output"}\n')
    before = tree_hash(out)
    proc = _quantize_killed(tiny_model_dir, out, "soarpack.quant.verify:verify_report", signal.SIGKILL, "--force")
    return out, before, proc


@pytest.mark.slow
def test_row_145_sigkill_in_verify_temp_folder_is_reported_by_verify(killed_in_verify):
    out, _, proc = killed_in_verify
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    (tmp,) = _temps(out)
    assert {"config.json", "quantize_config.json", "model.safetensors", INCOMPLETE_MARKER} <= set(os.listdir(tmp))
    res = run_cli("verify", tmp)  # complete-looking, but not a result: now a verify problem (exit 1)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "[incomplete]" in res.output and "killedbeforeitfinished" in "".join(res.output.split())


@pytest.mark.slow
def test_row_146_sigint_at_verify_removes_the_temp_folder(tiny_model_dir, tmp_path):
    out = tmp_path / "q"
    proc = _quantize_killed(tiny_model_dir, out, "soarpack.quant.verify:verify_report", signal.SIGINT)
    assert proc.returncode != 0
    assert not out.exists() and list(out.parent.glob(f".{out.name}.*")) == []  # no temp, no lock file


@pytest.mark.slow
def test_row_147_sigkill_in_verify_with_force_keeps_the_old_output(killed_in_verify):
    out, before, proc = killed_in_verify
    assert proc.returncode == -signal.SIGKILL
    assert tree_hash(out) == before


def _killed_atomic_dir(target: Path) -> None:
    code = ("import os, signal, sys\nfrom soarpack.placement.write import atomic_dir\n"
            "with atomic_dir(sys.argv[1], force=True) as tmp:\n"
            "    (tmp / 'model.safetensors').write_bytes(b'x' * 100)\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", code, str(target)], env=dict(os.environ, PYTHONPATH=str(REPO)), check=False)


def test_row_148_rerun_removes_stale_temp_folders_of_dead_owners_only(tiny_model_dir, tmp_path):
    out = tmp_path / "q"
    live_code = ("import sys, time\nfrom soarpack.placement.write import atomic_dir\n"
                 "with atomic_dir(sys.argv[1], force=True) as tmp:\n    print(tmp, flush=True)\n    time.sleep(120)\n")
    live = subprocess.Popen([sys.executable, "-c", live_code, str(out)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        live_tmp = Path(live.stdout.readline().strip())
        _killed_atomic_dir(out)  # after the live one started: its own start would clean this up otherwise
        (stale,) = [t for t in _temps(out) if t != live_tmp]
        # --max-len over dense_len fails right after the check phase: enough to see the cleanup, no gptq.
        res = run_cli("quantize", tiny_model_dir, out, *QUANT_FAST[:2], "--max-len", "8192", "--device", "cpu")
        assert res.exit_code == 2
        text = "".join(res.output.split())
        assert f"removed{stale}" in text and "killed" in text
        assert not stale.exists()
        assert live_tmp.is_dir(), "a running owner's temp folder must be kept"
    finally:
        live.kill()
        live.wait()


# -- tiny-model and verify ----------------------------------------------------------------------------------------


@pytest.mark.needs_torch
@pytest.mark.parametrize("layers", ["0", "-2"])
def test_row_125_tiny_model_layers_below_one_is_an_error(tmp_path, layers):
    """Silent wrong before (a 1-layer model); now an error."""
    res = run_cli("tiny-model", tmp_path / "m", "--layers", layers)
    assert_clean_error(res, f"--layers {layers}")
    assert not (tmp_path / "m").exists()


@pytest.mark.needs_torch
def test_row_126_tiny_model_out_read_only(read_only_dir):
    res = run_cli("tiny-model", read_only_dir / "m")
    assert_clean_error(res, str(read_only_dir / "m"), "cannot be written")


@pytest.mark.needs_torch
def test_row_128_verify_truncated_safetensors(tmp_path):
    from soarpack.sala.tiny import make_tiny_model

    ckpt = make_tiny_model(tmp_path / "m", num_layers=2, max_shard_bytes=1 << 30)
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True,
                                     "desc_act": False, "checkpoint_format": "gptq", "dynamic": {}}
    (ckpt / "config.json").write_text(json.dumps(config))
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    res = run_cli("verify", ckpt)
    assert_clean_error(res, code=1)  # verify's exit code for a checkpoint with problems
    assert f"cannotread{weights}" in "".join(res.output.split())


# -- build ----------------------------------------------------------------------------------------------------------

BUILD = ["build", "--no-wheels"]


def test_row_060_build_output_is_a_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "emptydir").mkdir()
    res = run_cli(*BUILD, "-o", "emptydir")
    assert_clean_error(res, "-o emptydir is a directory")
    assert sorted(os.listdir(tmp_path)) == ["emptydir"] and os.listdir(tmp_path / "emptydir") == []


def test_row_061_build_output_read_only(read_only_dir):
    res = run_cli(*BUILD, "-o", read_only_dir / "b.tar.gz")
    assert_clean_error(res, str(read_only_dir / "b.tar.gz"), "cannot be written", "Read-only file system")


@pytest.mark.parametrize("older", [False, True], ids=["no-older-bundle", "older-bundle-kept"])
def test_row_062_build_disk_full(full_disk, older):
    target = full_disk / "b.tar.gz"
    if older:
        target.write_bytes(b"an older bundle\n" * 100)
    before = target.read_bytes() if older else None
    res = run_cli(*BUILD, "-o", target, *(["--force"] if older else []))
    assert_clean_error(res, f"no space left on the device while writing {target}")
    assert (target.read_bytes() if older else None) == before
    assert sorted(os.listdir(full_disk)) == (["b.tar.gz"] if older else [])


def test_row_063_build_output_is_the_calibration_input(tmp_path):
    cal = tmp_path / "cal" / "selfout.jsonl"
    cal.parent.mkdir()
    cal.write_text('{"text": "hello"}\n')
    before = tree_hash(cal.parent)
    res = run_cli(*BUILD, "--calib", cal, "-o", cal)
    assert_clean_error(res, f"-o {cal} is the input {cal}")
    assert tree_hash(cal.parent) == before


def test_row_066_build_sglang_src_with_links_out_of_the_tree(tmp_path):
    """Silent wrong before (packed); now an error at build naming the link."""
    py = tmp_path / "fork" / "python"
    (py / "sglang").mkdir(parents=True)
    (py / "sglang" / "__init__.py").write_text("")
    (py / "sglang" / "passwd").symlink_to("/etc/passwd")
    (py / "home").symlink_to(Path.home())
    res = run_cli(*BUILD, "--sglang-src", py, "-o", tmp_path / "b.tar.gz")
    assert_clean_error(res, "symlink out of the tree", "home -> ", "and 1 more")
    assert not (tmp_path / "b.tar.gz").exists()


# -- check and extraction ---------------------------------------------------------------------------------------------


@pytest.mark.needs_torch
@pytest.mark.slow
def test_row_092_check_of_a_no_wheels_bundle_is_not_uploadable(tmp_path):
    """Silent wrong before ("ok: 11 passed"); now an error: the bundled-wheels step fails (the image has no
    gptqmodel or transformers 5), the verdict says NOT uploadable, exit 1. Rehearsed on the dev stack for speed:
    the verdict does not depend on the stack here."""
    bundle = tmp_path / "b.tar.gz"
    assert run_cli(*BUILD, "-o", bundle).exit_code == 0
    res = run_cli("check", bundle, "--dev-stack")
    flat = "".join(res.output.split())
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "FAILbundledwheels" in flat and "--no-wheels" in res.output and "NOTuploadable" in flat


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "b.tar.gz"
    return build_bundle(out, wheels=False, calib_rows=8).path


def _info(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
    return info


def _check_fails(tar: Path, *names: str, code: int = 1):
    res = run_cli("check", tar, "--no-rehearse")
    assert_clean_error(res, *names, code=code)
    return res


def test_row_075_check_hardlink_to_a_missing_member(tmp_path):
    tar = write_tar(tmp_path / "e.tar.gz", [(_info("ok.txt"), b"ok"), (_info("h", tarfile.LNKTYPE, "etc/passwd"), b"")])
    _check_fails(tar, "FAIL", "'h'", "hard link to etc/passwd")
    with pytest.raises(UnsafeArchiveError):
        safe_extract(tar, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("order", ["link-first", "chain-first"])
@pytest.mark.parametrize("data_filter", [True, False], ids=["with-data-filter", "without-data-filter"])
def test_row_079_symlink_chain_out_of_the_tree(tmp_path, monkeypatch, order, data_filter):
    if not data_filter:  # Python < 3.10.12 has no tarfile data filter: our own check must stand alone
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    up = (_info("d1/d2/up", tarfile.SYMTYPE, "../.."), b"")
    chain = (_info("chain", tarfile.SYMTYPE, "d1/d2/up/.."), b"")
    dirs = [(_info("d1", tarfile.DIRTYPE), b""), (_info("d1/d2", tarfile.DIRTYPE), b"")]
    members = dirs + ([up, chain] if order == "link-first" else [chain, up])
    tar = write_tar(tmp_path / "e.tar.gz", members)
    with pytest.raises(UnsafeArchiveError, match="'chain'.*out of the tree"):
        safe_extract(tar, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    _check_fails(tar, "FAIL", "chain")


def test_row_083_check_too_many_entries(tmp_path):
    """Silent before (100,000 files extracted); now refused from the headers, before writing."""
    tar = write_tar(tmp_path / "many.tar.gz", [(_info(f"f{i}"), b"") for i in range(MAX_ENTRIES + 1)])
    with pytest.raises(UnsafeArchiveError, match="20,001 entries, over soarpack's cap of 20,000"):
        safe_extract(tar, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    _check_fails(tar, "FAIL", "entries")


def test_row_084_check_decompression_bomb(tmp_path):
    """Silent before (3 GiB from 14 MB written); now refused from the headers, before writing."""
    zeros = tmp_path / "zeros.bin"
    with open(zeros, "wb") as fh:
        fh.truncate(600 * 2**20)  # sparse: costs no disk here
    tar = tmp_path / "bomb.tar.gz"
    with tarfile.open(tar, "w:gz", compresslevel=1) as t:
        t.add(zeros, arcname="zeros.bin")
    zeros.unlink()
    with pytest.raises(UnsafeArchiveError, match="unpacks to 600 MiB, over soarpack's cap"):
        safe_extract(tar, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_row_085_check_extraction_disk_full(tmp_path, full_disk, monkeypatch):
    tar = write_tar(tmp_path / "big.tar.gz", [(_info("big.bin"), os.urandom(256 * 1024))])
    monkeypatch.setattr("tempfile.tempdir", str(full_disk))  # TMPDIR on a full disk
    _check_fails(tar, "FAIL", "no space left on the device while extracting")
    assert os.listdir(full_disk) == []


def test_row_088_check_truncated_bundle(bundle, tmp_path):
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(bundle.read_bytes()[: bundle.stat().st_size * 2 // 3])
    res = _check_fails(cut, "FAIL", "is truncated or corrupt")
    assert "Aborted" not in res.output


def test_row_090_check_keep_is_a_file(bundle, tmp_path):
    keep = tmp_path / "afile"
    keep.write_text("mine\n")
    res = run_cli("check", bundle, "--keep", keep)
    assert_clean_error(res, f"--keep {keep} is a file")
    assert keep.read_text() == "mine\n"


def test_row_091_check_sglang_fork_not_a_fork(bundle, tmp_path):
    res = run_cli("check", bundle, "--sglang-fork", tmp_path)
    assert_clean_error(res, f"{tmp_path} holds no sglang/ package")


@pytest.mark.parametrize("entry", ["/etc/hostname", "../../../../etc/passwd"])
def test_row_093_manifest_calibration_outside_the_bundle(bundle, tmp_path, entry):
    """Silent wrong before (structure passed, preprocess_model.py passed them on); now a failure in both."""
    root = safe_extract(bundle, tmp_path / "tree")
    manifest = json.loads((root / "MANIFEST.json").read_text())
    manifest["quantize"]["calib"] = [entry]
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    _check_fails(pack_tree(root, tmp_path / "evil.tar.gz"), "FAIL", "structure", f"calibration entry '{entry}'")

    import importlib.util

    spec = importlib.util.spec_from_file_location("bundled_preprocess", root / "preprocess_model.py")
    pre = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre)
    with pytest.raises(pre.Failure, match="not a path inside the bundle"):
        pre.quantize_command(manifest, tmp_path / "in", tmp_path / "out", False)


# -- sglang apply/check -----------------------------------------------------------------------------------------------


@pytest.fixture()
def fork(tmp_path):
    from test_serve_patches import write_anchor_tree

    return write_anchor_tree(tmp_path / "fork")


def _third_patch_file(fork: Path) -> Path:
    from soarpack.serve.patches import load_patches

    return fork / load_patches()[2].files[0].path


@pytest.mark.parametrize("mode", ["in-place", "to-out"])
def test_row_134_edited_line_is_not_called_partly_patched(fork, tmp_path, mode):
    from soarpack.serve.patches import load_patches

    target = _third_patch_file(fork)
    hunk = load_patches()[2].files[0].hunks[1]
    removed = next(t for tag, t in hunk.lines if tag == "-")
    lines = target.read_text().split("\n")
    at = lines.index(removed, hunk.old_start - 3)
    lines[at] = removed + "  # edited"
    target.write_text("\n".join(lines))
    before = tree_hash(fork)
    out = fork if mode == "in-place" else tmp_path / "out"
    res = run_cli("sglang", "apply", "--src", fork, "--out", out)
    assert_clean_error(res, "taken by hunk 2", "nothing was written")
    assert "partly patched" not in res.output
    assert tree_hash(fork) == before and (mode == "in-place" or not out.exists())


@pytest.mark.parametrize("cmd", ["apply", "check"])
def test_row_137_non_utf8_target_file(fork, tmp_path, cmd):
    target = _third_patch_file(fork)
    target.write_bytes(target.read_bytes() + b"\n# caf\xe9\n")
    before = tree_hash(fork)
    extra = ["--out", tmp_path / "out"] if cmd == "apply" else []
    res = run_cli("sglang", cmd, "--src", fork, *extra)
    assert_clean_error(res, f"{target} is not UTF-8 text")
    assert tree_hash(fork) == before


def test_row_139_out_inside_src_is_patched_without_copying_itself(fork):
    """OK row kept OK: a new output inside the source is written, and no .patched.tmp-* or copy of the output ends up
    inside it; replacing an existing output inside the source is refused, since that deletes part of an input."""
    from soarpack.serve.patches import apply_patches

    apply_patches(fork, fork / "patched", verify_compile=False)  # the anchor tree holds fragments, not modules
    assert (fork / "patched" / "sglang").is_dir() and not (fork / "patched" / "patched").exists()
    assert not [p for p in (fork / "patched").rglob("*") if ".tmp-" in p.name]
    (fork / "patched" / "mine.txt").write_text("kept\n")
    before = tree_hash(fork)
    res = run_cli("sglang", "apply", "--src", fork, "--out", fork / "patched", "--force")
    assert_clean_error(res, f"{fork / 'patched'} would replace something inside the input {fork}")
    assert tree_hash(fork) == before


def test_row_140_out_containing_src_with_force(fork):
    home = fork.parent
    (home / ".git").mkdir()
    (home / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (home / "NOTES.md").write_text("mine\n")
    before = tree_hash(home)
    res = run_cli("sglang", "apply", "--src", fork, "--out", home, "--force")
    assert_clean_error(res, f"output {home} contains the input {fork}")
    assert tree_hash(home) == before


def test_row_141_in_place_apply_is_all_or_nothing(fork):
    from soarpack.serve.patches import PatchError, apply_patches, check_tree

    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: an immutable file is needed")
    touched = [f.path for f in check_tree(fork).patches[0].files] + [f.path for p in check_tree(fork).patches[1:] for f in p.files]
    third = fork / list(dict.fromkeys(touched))[2]
    if subprocess.run(["chattr", "+i", str(third)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem does not support chattr +i")
    try:
        before = tree_hash(fork)
        # the library, not the CLI: the anchor tree is code fragments that the CLI's compile check refuses
        with pytest.raises(PatchError, match=f"cannot replace {third}.*nothing was changed"):
            apply_patches(fork, fork, verify_compile=False)
        assert tree_hash(fork) == before
        assert {p.status for p in check_tree(fork).patches} == {"apply"}  # not "mixed"
    finally:
        subprocess.run(["chattr", "-i", str(third)], check=False)
