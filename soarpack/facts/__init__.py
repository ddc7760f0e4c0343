"""The SOAR platform's facts as data, one address each (../shared/docs/SALA.md §1-2 says where each comes from).

    image     the base image: CPython, wheel tags, the fork's pins and import packages, where the fork lives
    engine    the quantization engine soarpack is written against (the GPTQModel pin) and the stack bundled for it
    launch    how the platform starts the server: its launch line and the default SGLANG_SERVER_ARGS
    limits    the upload limit, the eval's request limits, the server's start-up window
    scoring   the baseline, the C thresholds, the tier weights and the ori_accuracy lines derived from them
    gpu       what the platform's GPU answers, for the stand-ins that impersonate it on a CPU

Standard library only and nothing but values (and the few lines derived from them), so every floor may import it.
What cannot import it (pyproject.toml's extras, prepare_env.sh, the fork child) is held equal to it by a test.
A test (tests/test_facts.py) fails when one of these values is typed again anywhere else in soarpack/.
"""

from soarpack.facts import engine, gpu, image, launch, limits, scoring

__all__ = ["engine", "gpu", "image", "launch", "limits", "scoring"]
