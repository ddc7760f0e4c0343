"""Evidence as data and risks in every verdict: recipes and profiles carry `[[evidence]]` with sources; build, check
and inspect print the risks it implies (and the calibration's), one line each; check's exit follows them."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.rehearse import check as check_mod
from soarpack.bundle.build import build_bundle
from soarpack.rehearse.check import check_bundle
from soarpack.steps import PASS, SKIP, StepResult
from soarpack.bundle.risks import RISK_NAMES, manifest_risks, verdict
from soarpack.bundle.summary import inspect_bundle
from soarpack.cli import app
from soarpack.errors import ConfigError
from soarpack.evidence import load_evidence
from soarpack.recipe.model import list_recipes, load_recipe
from soarpack.recipe.profile import list_profiles, load_profile

REPO = Path(__file__).resolve().parent.parent
QUIET = dict(wheels=False)


def build(out, **kwargs):
    """A bundle on profile safe unless a test names another: these tests are about the recipe's and the calibration's
    risks, and safe carries none of its own (the default, fast-gla, is flagged: test_the_default_profile_names_its_risk)."""
    return build_bundle(out, **{"profile": "safe", **kwargs})


def _anchors(path: Path):
    """GitHub's heading slugs of a markdown file."""
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            out.add(re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return out


# -- evidence as data ------------------------------------------------------------------------------------------


def test_every_builtin_recipe_and_profile_carries_evidence_citing_docs_evidence():
    anchors = _anchors(REPO / "docs" / "evidence.md")
    things = [load_recipe(n) for n in list_recipes()] + [load_profile(n) for n in list_profiles()]
    assert len(things) >= 6
    for thing in things:
        assert thing.evidence, f"{thing.name} carries no [[evidence]]"
        for e in thing.evidence:
            path, _, anchor = e.source.partition("#")
            assert path == "docs/evidence.md" and anchor in anchors, (thing.name, e.source)
    # what the sources say, as data (SALA.md via docs/evidence.md), not retyped in code
    full = {e.kind: e for e in load_recipe("w4-full").evidence}
    assert full["platform"].acc_ori == 78.3 and full["platform"].stack == "unknown"
    mlp = [e for e in load_recipe("w4-mlp").evidence if e.kind == "platform"][0]
    assert (mlp.acc_ori, mlp.s1, mlp.s8, mlp.smax) == (82.18, 718, 1067, 2343)
    assert [e.kind for e in load_recipe("w4-balanced").evidence if e.relation == "this"] == ["none"]
    fp8 = [e for e in load_profile("fp8-kv").evidence if e.kind == "platform"][0]
    assert fp8.acc_range == (75.0, 77.5)


@pytest.mark.parametrize("entry, message", [
    ({"kind": "none", "source": "s", "summary": "x", "acc_ori": 80.0}, 'kind = "none"'),
    ({"kind": "platform", "source": "s", "summary": "x", "acc": 80.0}, "acc"),
    ({"kind": "peer", "source": "s", "summary": "x"}, "kind = 'peer'"),
    ({"kind": "platform", "source": "s", "summary": "x", "acc_ori": "80"}, "acc_ori = '80'"),
    ({"kind": "platform", "source": "s", "summary": "x", "acc_ori": 180.0}, "not an accuracy"),
    ({"kind": "platform", "source": "s", "summary": "x", "acc_ori_low": 79.0}, "acc_ori_low needs"),
    ({"kind": "platform", "source": "", "summary": "x"}, "must not be empty"),
    ({"kind": "platform", "summary": "x"}, "source = missing"),
])
def test_bad_evidence_is_refused_by_the_recipe_and_profile_loaders(tmp_path, entry, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_evidence({"evidence": [entry]}, "mine.toml")
    recipe = tmp_path / "r.toml"
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in entry.items())
    recipe.write_text(f'[quant]\nname = "r"\n\n[[evidence]]\n{lines}\n')
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(recipe)
    profile = tmp_path / "p.toml"
    profile.write_text(f'recipe = "w4-mlp"\n[serve]\nargs = []\n\n[[evidence]]\n{lines}\n')
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_profile(profile)
    result = CliRunner().invoke(app, ["build", "--recipe", str(recipe), "--no-wheels", "-o", str(tmp_path / "b.tar.gz")])
    assert result.exit_code == 2 and message.split()[0] in result.output


def test_evidence_must_be_an_array_of_tables(tmp_path):
    with pytest.raises(ConfigError, match="array of tables"):
        load_evidence({"evidence": {"kind": "none"}}, "x")
    assert load_evidence({}, "x") == []


def test_recipes_and_profiles_commands_show_the_evidence():
    runner = CliRunner()
    listing = runner.invoke(app, ["recipes"])
    assert listing.exit_code == 0
    assert "w4-full: every decoder linear W4 g128" in listing.stdout
    assert "ori 78.3" in listing.stdout and "(docs/evidence.md#w4-full)" in listing.stdout
    assert "none: nobody has measured w4-balanced itself" in listing.stdout
    one = runner.invoke(app, ["recipes", "w4-mlp"])
    assert one.exit_code == 0 and one.stdout == (REPO / "soarpack" / "recipes" / "w4-mlp.toml").read_text()
    assert runner.invoke(app, ["recipes", "nope"]).exit_code == 2
    as_json = json.loads(runner.invoke(app, ["recipes", "--json"]).stdout)
    assert {r["name"] for r in as_json} == set(list_recipes()) and all(r["evidence"] for r in as_json)
    profiles = runner.invoke(app, ["profiles"]).stdout
    assert "evidence platform: peers who patched fp8_e5m2 KV" in profiles and "ori 75-77.5" in profiles
    assert json.loads(runner.invoke(app, ["profiles", "--json"]).stdout)[0]["evidence"]


# -- the four bundles: build, check and inspect name their risks ------------------------------------------------


def _calib(tmp_path, n, task="qa"):
    path = tmp_path / f"rows{n}.jsonl"
    path.write_text("".join(json.dumps({"task": task, "question": f"question number {i} about the text", "gold": "x"})
                            + "\n" for i in range(n)))
    return path


def _public_mix(tmp_path, per_task):
    path = tmp_path / "mix.jsonl"
    path.write_text("".join(json.dumps({"task": t, "question": f"{t} question {i} with some words", "gold": "A"}) + "\n"
                            for t in ("mcq", "niah", "qa", "fwe", "cwe") for i in range(per_task)))
    return path


def _names(risks):
    return [r.name for r in risks]


def test_w4_full_names_its_measured_risk_with_source_and_c(tmp_path):
    logged = []
    built = build(tmp_path / "b.tar.gz", recipe="w4-full", calib=[_public_mix(tmp_path, 60)], on_event=lambda e: logged.append(e.message),
                         wheels=False)
    assert _names(built.risks) == ["recipe-below-gate"]
    line = built.risks[0].line()
    assert "recipe w4-full: peers measured ori 78.3, at or below the 79.2 full-credit line: C = 0.92" in line
    assert line.endswith("(docs/evidence.md#w4-full)") and built.risks[0].blocks
    assert line in logged
    assert built.manifest["evidence"]["recipe"][0]["acc_ori"] == 78.3
    assert [r["name"] for r in inspect_bundle(built.path)["risks"]] == ["recipe-below-gate"]
    text = CliRunner().invoke(app, ["inspect", str(built.path)]).stdout
    assert line in text and "evidence     recipe: platform: peer platform runs of full W4A16 g128" in text
    report = check_bundle(built.path, rehearse=False)
    assert _names(report.risks) == ["recipe-below-gate"]
    assert report.to_dict()["risks"][0]["source"] == "docs/evidence.md#w4-full"


def test_fp8_profile_12_rows_and_builtin_calibration_show_their_risks(tmp_path):
    cases = {
        "fp8": (dict(profile="fp8-kv", calib=[_public_mix(tmp_path, 60)]), ["profile-below-gate", "profile-flagged"]),
        "12 rows": (dict(calib=[_calib(tmp_path, 12)]), ["calib-short", "calib-tasks"]),
        "built-in": (dict(), ["calib-builtin"]),
    }
    for label, (kwargs, expected) in cases.items():
        out = tmp_path / f"{label.replace(' ', '-')}.tar.gz"
        built = build(out, **kwargs, **QUIET)
        assert _names(built.risks) == expected, label
        assert [r["name"] for r in inspect_bundle(out)["risks"]] == expected, label
        assert _names(check_bundle(out, rehearse=False).risks) == expected, label
        inspected = CliRunner().invoke(app, ["inspect", str(out)]).stdout
        checked = CliRunner().invoke(app, ["check", str(out), "--no-rehearse"])
        for risk in built.risks:
            assert risk.line() in inspected and risk.line() in checked.stdout, label
        assert checked.exit_code == 1
    fp8 = manifest_risks(json.loads(json.dumps(build(tmp_path / "f2.tar.gz", profile="fp8-kv", **QUIET).manifest)))
    assert "ori 75-77.5" in fp8[0].message and "C = 0 (elimination)" in fp8[0].message
    short = build(tmp_path / "s2.tar.gz", calib=[_calib(tmp_path, 12)], **QUIET).risks[0]
    assert "12 calibration rows shipped (calib/00-rows12.jsonl (12 rows)) against the 256 soarpack's default asks for" in short.message
    built_in = build(tmp_path / "d2.tar.gz", **QUIET)
    assert built_in.manifest["quantize"]["calibration"] == {
        "rows_asked": 256, "asked_by": "default", "builtin": True,
        "sources": [{"file": "calib/builtin.jsonl", "rows": 256,
                     "tasks": {"cwe": 51, "fwe": 51, "kv": 51, "mcq": 51, "niah": 52}}]}


def test_a_public_mix_of_256_rows_on_w4_mlp_and_safe_has_no_risk(tmp_path):
    built = build(tmp_path / "b.tar.gz", calib=[_public_mix(tmp_path, 52)], **QUIET)
    assert built.risks == []
    text = CliRunner().invoke(app, ["inspect", str(built.path)]).stdout
    assert "risks: none known" in text


# -- the verdict and check's exit code -------------------------------------------------------------------------


def test_verdict_wording_and_which_risks_block(tmp_path):
    risks = build(tmp_path / "b.tar.gz", recipe="w4-full", **QUIET).risks  # below-gate + built-in
    assert verdict(None, []) == ("uploadable", True)
    assert verdict(None, risks) == (
        "NOT uploadable (recipe-below-gate: full credit unlikely; pass --accept-risk recipe-below-gate to upload "
        "anyway); 2 risks: recipe-below-gate, calib-builtin", False)
    assert verdict(None, risks, ["recipe-below-gate"]) == (
        "uploadable, 2 risks: recipe-below-gate (accepted), calib-builtin", True)
    assert verdict(None, risks, ["recipe-below-gate"], strict=True)[1] is False
    assert verdict(None, risks, ["recipe-below-gate", "calib-builtin"], strict=True)[1] is True
    assert verdict("failed: extract", risks)[0].startswith("NOT uploadable (failed: extract); 2 risks")
    assert verdict(None, risks[1:]) == ("uploadable, 1 risk: calib-builtin", True)
    assert set(RISK_NAMES) >= {"recipe-below-gate", "profile-below-gate", "calib-short", "calib-builtin", "calib-tasks"}


@pytest.fixture
def rehearsed(monkeypatch):
    """check_bundle's static steps for real, then the rehearsal's steps recorded as passed on the image stack: the
    rehearsal itself is not under test here (tests/test_image_stack.py runs it), only what check does after it."""
    real = check_mod.check_bundle

    def fake(bundle, **kwargs):
        report = real(bundle, **{**kwargs, "rehearse": False})
        report.steps = [StepResult(s.name, PASS, gates=s.gates, needs=s.needs) if s.status == SKIP else s
                        for s in report.steps]
        return report

    monkeypatch.setattr(check_mod, "check_bundle", fake)


def test_check_exits_1_for_w4_full_unless_the_risk_is_accepted(tmp_path, rehearsed):
    bundle = build(tmp_path / "b.tar.gz", recipe="w4-full", calib=[_public_mix(tmp_path, 60)], **QUIET).path
    runner = CliRunner()
    refused = runner.invoke(app, ["check", str(bundle)])
    assert refused.exit_code == 1
    assert "risk recipe-below-gate: recipe w4-full: peers measured ori 78.3" in refused.stdout
    assert "C = 0.92" in refused.stdout and "(docs/evidence.md#w4-full)" in refused.stdout
    assert "NOT uploadable (recipe-below-gate: full credit unlikely" in refused.stdout
    accepted = runner.invoke(app, ["check", str(bundle), "--accept-risk", "recipe-below-gate"])
    assert accepted.exit_code == 0, accepted.output
    assert "risk recipe-below-gate: recipe w4-full" in accepted.stdout
    assert "uploadable, 1 risk: recipe-below-gate (accepted) -- " in accepted.stdout
    as_json = json.loads(runner.invoke(app, ["check", str(bundle), "--json", "--accept-risk", "recipe-below-gate"]).stdout)
    assert as_json["uploadable"] is True and as_json["risks"][0]["name"] == "recipe-below-gate"
    typo = runner.invoke(app, ["check", str(bundle), "--accept-risk", "below-gate"])
    assert typo.exit_code == 2 and "is not a risk name" in typo.output


def test_other_risks_exit_0_and_strict_makes_them_exit_1(tmp_path, rehearsed):
    bundle = build(tmp_path / "b.tar.gz", calib=[_calib(tmp_path, 12)], **QUIET).path
    runner = CliRunner()
    plain = runner.invoke(app, ["check", str(bundle)])
    assert plain.exit_code == 0 and "uploadable, 2 risks: calib-short, calib-tasks -- " in plain.stdout
    strict = runner.invoke(app, ["check", str(bundle), "--strict"])
    assert strict.exit_code == 1 and "NOT uploadable (--strict and 2 risks: calib-short, calib-tasks)" in strict.stdout
    both = runner.invoke(app, ["check", str(bundle), "--strict", "--accept-risk", "calib-short",
                               "--accept-risk", "calib-tasks"])
    assert both.exit_code == 0


def test_build_prints_the_risks_on_stderr_and_only_the_path_on_stdout(tmp_path):
    out = tmp_path / "b.tar.gz"
    result = CliRunner().invoke(app, ["build", "--profile", "fp8-kv", "--no-wheels", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    assert "risk profile-below-gate: profile fp8-kv: peers measured ori 75-77.5" in result.stderr
    assert "calibration: 256 rows shipped of the 256 asked (soarpack's default), from the built-in synthetic prompts" in result.stderr
    as_json = json.loads(CliRunner().invoke(app, ["build", "--profile", "fp8-kv", "--no-wheels", "-o", str(out),
                                                  "--force", "--json"]).stdout)
    assert [r["name"] for r in as_json["risks"]] == ["profile-below-gate", "profile-flagged", "calib-builtin"]


def test_a_manifest_from_before_evidence_was_recorded_gets_this_soarpacks_evidence_by_name():
    old = {"profile": {"name": "safe"}, "quantize": {"recipe": "w4-full", "calib": ["calib/builtin.jsonl"]}}
    assert _names(manifest_risks(old)) == ["recipe-below-gate", "calib-builtin"]
    user = {"profile": {"name": "mine"}, "quantize": {"recipe": "recipe.toml", "recipe_name": "w4-full",
                                                      "calib": ["calib/00-mine.jsonl"]}}
    assert manifest_risks(user) == []  # a user's files: nothing known, nothing invented


def test_the_default_profile_names_its_risk(tmp_path):
    """The default bundle says what is unmeasured about its profile: fast-gla's kernel never ran on the platform's GPU."""
    built = build_bundle(tmp_path / "d.tar.gz", calib=[_public_mix(tmp_path, 52)], **QUIET)
    assert built.manifest["profile"]["name"] == "fast-gla"
    assert _names(built.risks) == ["profile-flagged"]
    assert "sm_120" in built.risks[0].message and built.risks[0].source == "docs/evidence.md#gla-decode"
