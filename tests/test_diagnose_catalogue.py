"""The diagnose catalogue: every entry cites where its signature's text comes from, the source holds that text, and
diagnose names the entry from a log the entry cites (a log produced here) and from its example line."""

from __future__ import annotations

import importlib.metadata as md
import re
import tarfile
from pathlib import Path

import pytest

from soarpack.diagnosis import diagnose, diagnose_text
from soarpack.diagnosis.catalogue import RESULT_KINDS, TEXT_KINDS, Entry, load_catalogue

REPO = Path(__file__).resolve().parent.parent
ENTRIES = load_catalogue()
TEXT_ENTRIES = [e for e in ENTRIES if e.patterns]
SOURCES = [(e, s) for e in ENTRIES for s in e.sources]

# What SALA.md §§4-6 and issue 26 ask the catalogue to cover (each must be there, sourced).
REQUIRED = {
    "torchao-scalingtype", "tokenizer-rewritten", "qzeros-rewritten", "derived-config-key", "flash-attn-missing",
    "sparse-dtype-fp16", "cuda-oom", "cuda-graph-capture", "cuda-graph-disabled", "gptqmodel-module-not-found",
    "gptqmodel-cpu-workers", "server-not-ready", "prepare-model-error", "eval-repetition-collapse",
    "eval-empty-answer", "eval-request-error",
}


def _fork_archives():
    for base in (REPO, *REPO.parents):
        candidate = base / "shared" / "data" / "sglang-fork"
        if candidate.is_dir():
            return candidate
    return None


def _installed_file(dist: str, rel: str) -> Path:
    try:
        return Path(md.distribution(dist).locate_file(rel))
    except md.PackageNotFoundError:
        pytest.skip(f"not run: {dist} is not installed in this environment")


def _image_site_packages() -> Path:
    from soarpack.imagestack import stack_dir

    found = sorted((stack_dir() / "lib").glob("python3.10/site-packages"))
    if not found:
        pytest.skip("not run: the image stand-in (~/.cache/soarpack/image-stack) is not built here")
    return found[0]


def test_the_catalogue_covers_what_the_issue_lists_and_each_is_sourced():
    ids = {e.id for e in ENTRIES}
    assert REQUIRED <= ids, sorted(REQUIRED - ids)
    for entry in ENTRIES:
        if entry.id in REQUIRED:
            assert entry.sources and not entry.unverified, entry.id
        # No source, no claim: an entry without one must say it is a guess.
        assert entry.sources or entry.unverified, entry.id


def test_an_unsourced_entry_is_refused_unless_marked_unverified(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[failure]]\nid = "x"\ntitle = "t"\ncause = "c"\nfix = "f"\npatterns = ["boom"]\n')
    with pytest.raises(ValueError, match="no source"):
        load_catalogue(path)
    path.write_text(path.read_text() + "unverified = true\n")
    assert load_catalogue(path)[0].unverified


def test_bad_catalogue_entries_are_refused(tmp_path):
    path = tmp_path / "c.toml"
    base = 'id = "x"\ntitle = "t"\ncause = "c"\nfix = "f"\nunverified = true\n'
    for extra, message in (('patterns = ["("]', "does not compile"), ('patterns = ["a"]\nkinds = ["gpu"]', "unknown kind"),
                           ('patterns = ["a"]\nseverity = "fatal"', "severity"), ("", "needs at least one pattern"),
                           ('patterns = ["a"]\ncolour = 1', "unknown key")):
        path.write_text("[[failure]]\n" + base + extra + "\n")
        with pytest.raises(ValueError, match=message):
            load_catalogue(path)


@pytest.mark.parametrize("entry,source", SOURCES, ids=[f"{e.id}:{s.kind}:{Path(s.where).name}" for e, s in SOURCES])
def test_each_source_holds_the_signature_text(entry: Entry, source):
    if source.kind in ("log", "soarpack"):
        path = REPO / source.where
        assert path.is_file(), source.where
        assert source.text in path.read_text(encoding="utf-8"), f"{source.where} no longer holds {source.text!r}"
    elif source.kind == "fork":
        commit, member, line = re.fullmatch(r"([0-9a-f]+):(.+):(\d+)", source.where).groups()
        archives = _fork_archives()
        if archives is None:
            pytest.skip("not run: ../shared/data/sglang-fork is not beside the checkout")
        with tarfile.open(archives / f"{commit}-python.tar.gz") as tar:
            lines = tar.extractfile(member).read().decode("utf-8").splitlines()
        assert source.text in lines[int(line) - 1], f"{member}:{line} is {lines[int(line) - 1]!r}"
    elif source.kind == "package":
        spec, rel, *line = source.where.split(":")
        dist, version = spec.split("==")
        if source.stack == "image":
            path = _image_site_packages() / rel
            assert source.text.encode() in path.read_bytes()
            return
        path = _installed_file(dist, rel)
        text = path.read_text(encoding="utf-8")
        if md.version(dist) == version and line:  # the cited version: the cited line
            assert source.text in text.splitlines()[int(line[0]) - 1], f"{rel}:{line[0]}"
        else:  # another version installed: the text must still be in the file
            assert source.text in text
    else:  # a peer's file, read with the fetch/search tools: pinned to a commit, its text quoted by the example
        assert source.kind == "peer" and re.match(r"[\w.-]+/[\w.-]+@[0-9a-f]{7,40}:\S+", source.where)
        assert source.text in entry.example


@pytest.mark.parametrize("entry", TEXT_ENTRIES, ids=[e.id for e in TEXT_ENTRIES])
def test_each_entry_is_named_from_its_example_line(entry: Entry):
    # The example is the source's own text, so it tests the pattern against what the source writes.
    assert entry.example, f"{entry.id} has no example line"
    assert any(s.text in entry.example for s in entry.sources) or entry.unverified, entry.id
    kind = next(k for k in TEXT_KINDS if entry.applies_to(k))
    found = {f.entry_id for f in diagnose_text(entry.example, kind=kind).findings}
    assert entry.id in found


@pytest.mark.parametrize("entry,source", [(e, s) for e, s in SOURCES if s.kind == "log"],
                         ids=[e.id for e, s in SOURCES if s.kind == "log"])
def test_each_entry_is_named_from_the_log_it_cites(entry, source):
    diagnosis = diagnose([REPO / source.where])
    assert entry.id in {f.entry_id for f in diagnosis.findings}
    assert diagnosis.exit_code == 1


def test_result_entries_are_only_for_results():
    for entry in ENTRIES:
        if not entry.patterns:
            assert set(entry.kinds) <= set(RESULT_KINDS), entry.id


def test_the_image_torch_writes_the_oom_text_the_entry_matches():
    entry = next(e for e in ENTRIES if e.id == "cuda-oom")
    lib = _image_site_packages() / "torch" / "lib" / "libc10_cuda.so"
    data = lib.read_bytes()
    start = data.index(b"CUDA out of memory. Tried to allocate ")
    fragment = data[start:start + 60].split(b"\0")[0].decode() + "2.00 GiB."
    assert "cuda-oom" in {f.entry_id for f in diagnose_text(fragment, kind="server").findings}
    assert entry.patterns[0].search(fragment)
