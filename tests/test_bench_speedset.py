"""`soarpack speedset`: rows follow the length mix, exactly and reproducibly, and the bench can read them."""

import json

import pytest
from typer.testing import CliRunner

from tiny_tokenizer import make_tiny_tokenizer
from soarpack.measure.speed import load_speed_pairs, prepare_requests
from soarpack.measure.speedset import DEFAULT_MIX, Bucket, allocate, bucket_histogram, load_mix, make_speedset
from soarpack.measure.tokenizer import load_tokenizer
from soarpack.cli import app
from soarpack.errors import ConfigError

SMALL_MIX = """
[[input]]
min = 0
max = 40
share = 0.5
[[input]]
min = 40
max = 300
share = 0.5
[[output]]
min = 0
max = 8
share = 0.25
[[output]]
min = 8
max = 64
share = 0.75
"""


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "model")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def test_allocate_follows_shares_and_sums_to_n():
    assert allocate(20, DEFAULT_MIX["input"]) == [5, 2, 3, 7, 3]
    assert allocate(20, DEFAULT_MIX["output"]) == [7, 5, 2, 3, 3]
    assert allocate(7, DEFAULT_MIX["input"]) == [2, 1, 1, 2, 1]
    assert sum(allocate(150, DEFAULT_MIX["output"])) == 150


def test_rows_follow_the_published_mix_with_exact_lengths(tokenizer):
    rows, summary = make_speedset(tokenizer, 20, seed=3)
    assert len(rows) == 20 and set(rows[0]) == {"question", "model_response"}
    assert bucket_histogram(summary.input_tokens, DEFAULT_MIX["input"]) == [5, 2, 3, 7, 3]
    assert bucket_histogram(summary.output_tokens, DEFAULT_MIX["output"]) == [7, 5, 2, 3, 3]
    assert summary.max_abs_error == 0  # a word-level tokenizer round-trips exactly
    assert [len(tokenizer.encode(r["question"])) for r in rows] == summary.input_tokens
    assert max(summary.input_tokens) <= 160 * 1024


def test_bpe_lengths_are_corrected_after_the_cut(tmp_path):
    # Byte-level BPE does not round-trip at arbitrary cuts; the re-encode loop must still land on the target.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from soarpack.measure.speedset import BUILTIN_TEXT

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator([BUILTIN_TEXT], trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>")
    mix = {"input": (Bucket(100, 3000, 1.0),), "output": (Bucket(10, 500, 1.0),)}
    rows, summary = make_speedset(bpe, 10, mix, seed=4)
    assert summary.max_abs_error <= 1
    assert all(r["question"][:1].isupper() for r in rows)  # cuts start at a sentence boundary


def test_same_seed_same_rows_other_seed_other_rows(tmp_path, tokenizer):
    mix = tmp_path / "mix.toml"
    mix.write_text(SMALL_MIX)
    a, _ = make_speedset(tokenizer, 6, load_mix(mix), seed=5)
    b, _ = make_speedset(tokenizer, 6, load_mix(mix), seed=5)
    c, _ = make_speedset(tokenizer, 6, load_mix(mix), seed=6)
    assert a == b and a != c


def test_user_text_is_used(tokenizer):
    text = "Zebras graze quietly. Zebras run at dawn! Zebras sleep standing?"
    rows, _ = make_speedset(tokenizer, 2, {"input": (Bucket(10, 20, 1.0),), "output": (Bucket(4, 8, 1.0),)}, text=text)
    words = set(" ".join(r["question"] + " " + r["model_response"] for r in rows).split())
    assert words <= set(text.split())


def test_mix_file_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[input]]\nmin = 0\nmax = 10\nshare = 0.4\n[[output]]\nmin = 0\nmax = 10\nshare = 1.0\n")
    with pytest.raises(ConfigError, match="summing to 1"):
        load_mix(bad)
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"input": [{"min": 0, "max": 10, "share": 1}]}))
    with pytest.raises(ConfigError, match="no \\[\\[output\\]\\]"):
        load_mix(missing)


def test_cli_speedset_writes_rows_the_bench_reads(tmp_path, tokenizer_dir, tokenizer):
    mix = tmp_path / "mix.toml"
    mix.write_text(SMALL_MIX)
    out = tmp_path / "speed.jsonl"
    args = ["speedset", "--tokenizer", tokenizer_dir, "-n", "8", "--mix", str(mix), "-o", str(out), "--seed", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    pairs = load_speed_pairs(out)
    requests = prepare_requests(pairs, lambda t: len(tokenizer.encode(t)))
    assert len(requests) == 8
    mixed = load_mix(mix)
    assert bucket_histogram([r.prompt_len for r in requests], mixed["input"]) == [4, 4]
    assert bucket_histogram([r.output_len for r in requests], mixed["output"]) == [2, 6]
    before = out.read_bytes()
    again = CliRunner().invoke(app, args)  # the same rows: up to date, not an error
    assert again.exit_code == 0 and "uptodate" in "".join(again.output.split()) and out.read_bytes() == before
    other = args[:-1] + ["3"]  # another seed, other rows: refuses to overwrite without --force
    refused = CliRunner().invoke(app, other)
    assert refused.exit_code == 2 and "--force" in refused.output and out.read_bytes() == before
    assert CliRunner().invoke(app, other + ["--force"]).exit_code == 0 and out.read_bytes() != before


def test_presets_name_their_shares_and_where_they_come_from():
    from soarpack.measure.speedset import PRESETS

    assert set(PRESETS) == {"published", "long-128k", "1of16"} and load_mix(None) is PRESETS["published"]
    for name, mix in PRESETS.items():
        assert load_mix(name) is mix and mix.name == name and mix.source
        assert [b.share for b in mix.input] == [b.share for b in DEFAULT_MIX.input]  # all three: the published shares
    # 1of16 is the mix of the served runs of RESULTS.md §8 (speed-mix-1of16.toml then): every bound over 16.
    one = PRESETS["1of16"]
    assert [(b.lo, b.hi) for b in one.input] == [(0, 256), (256, 1024), (1024, 2048), (2048, 8192), (8192, 10240)]
    assert [(b.lo, b.hi) for b in one.output] == [(0, 32), (32, 128), (128, 256), (256, 1024), (1024, 2048)]
    long = PRESETS["long-128k"]
    assert (long.input, long.output) == (DEFAULT_MIX.input, DEFAULT_MIX.output)
    assert (long.input_cap, long.output_cap) == (128 * 1024, 256)


def test_caps_cut_the_drawn_lengths_and_keep_the_rows_pairing():
    import random

    from soarpack.measure.speedset import PRESETS, target_lengths

    drawn = target_lengths(40, DEFAULT_MIX.input, random.Random(3))
    capped = target_lengths(40, DEFAULT_MIX.input, random.Random(3), cap=128 * 1024)
    assert capped == [min(x, 128 * 1024) for x in drawn] and max(capped) == 128 * 1024 < max(drawn)
    outputs = target_lengths(40, PRESETS["long-128k"].output, random.Random(4), PRESETS["long-128k"].output_cap)
    assert max(outputs) == 256 and sum(x == 256 for x in outputs) >= 26  # 65 % of rows drawn above 256


def test_long_preset_rows_stay_under_their_caps(tokenizer):
    rows, summary = make_speedset(tokenizer, 3, load_mix("long-128k"), seed=1)
    assert max(summary.input_tokens) <= 128 * 1024 and max(summary.output_tokens) <= 256
    assert len(rows) == 3 and summary.max_abs_error == 0


def test_a_mix_name_that_is_no_preset_or_file_says_which_exist(tmp_path):
    with pytest.raises(ConfigError, match="no such preset or file") as err:
        load_mix("long-256k")
    assert "published, long-128k, 1of16" in err.value.hint
    capped = tmp_path / "capped.toml"
    capped.write_text("input_cap = 100\n" + SMALL_MIX)
    assert load_mix(capped).input_cap == 100 and load_mix(capped).output_cap is None
    capped.write_text("input_cap = 1.5\n" + SMALL_MIX)
    with pytest.raises(ConfigError, match="input_cap must be a whole number"):
        load_mix(capped)


def test_cli_speedset_takes_a_preset_and_reports_it(tmp_path, tokenizer_dir):
    out = tmp_path / "speed.jsonl"
    result = CliRunner().invoke(app, ["speedset", "--model-dir", tokenizer_dir, "-n", "4", "--mix", "1of16", "-o",
                                      str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    import hashlib

    assert summary["mix"]["name"] == "1of16" and summary["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
