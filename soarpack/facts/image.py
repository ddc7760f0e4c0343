"""The platform's base image: its Python, the wheel tags it accepts, the OpenBMB fork and the fork's pins."""

PYTHON = "3.10"  # the image's CPython, major.minor
PYTHON_FULL = "3.10.12"  # what a wheel's Requires-Python and markers are evaluated against
PYTHON_TAG = "cp310"  # the same, as a wheel tag (abi and interpreter)
# The platform tags pip is asked for when it downloads wheels for the image (x86_64 manylinux, glibc 2.34).
MANYLINUX_TAGS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")
PLATFORM_WORDS = "manylinux x86_64"  # how messages name the tags above

# The fork's own pins (python/pyproject.toml at 377b0b5eb and d29fb130c), which the image installs.
TORCH = "2.9.1"
TORCHAO = "0.9.0"
TRANSFORMERS = "4.57.1"
PINS = {"torch": TORCH, "torchao": TORCHAO, "transformers": TRANSFORMERS}
PIN_SPECS = tuple(f"{name}=={version}" for name, version in PINS.items())

# What the fork's model code imports besides torch (the fork check needs them to import it on a CPU); in the image
# through the fork's `python[all]`. pyproject.toml's `fork-check` extra lists the same (a test keeps them equal).
FORK_IMPORT_PACKAGES = (
    "pybase64", "ipython", "aiohttp", "orjson", "pyzmq", "fastapi", "openai==2.6.1", "partial_json_parser",
    "sentencepiece", "compressed-tensors", "gguf", "einops", "msgspec", "xgrammar==0.1.27", "uvicorn", "uvloop",
    "psutil", "requests", "setproctitle", "interegular", "prometheus-client", "python-multipart", "pillow", "scipy",
    "nvidia-ml-py", "packaging", "safetensors", "dill",
)

# The fork's checkout, installed editable (prepare_env.sh patches it in place; a test keeps its default equal).
FORK_CHECKOUT = "/opt/SGLang-MiniCPM-SALA/packages/sglang-minicpm"


def describe() -> str:
    """One phrase for messages: 'CPython 3.10, torch ..., torchao ..., transformers ...'."""
    return f"CPython {PYTHON}, " + ", ".join(f"{name} {version}" for name, version in PINS.items())


def describe_short() -> str:
    return f"CPython {PYTHON}, torch {TORCH}"
