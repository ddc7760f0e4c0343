"""The quantization engine soarpack is written against, and the stack a bundle ships for it on the image."""

GPTQMODEL = "7.6.0"  # 7.7.0 needs a torch newer than the image's
GPTQMODEL_SPEC = f"gptqmodel=={GPTQMODEL}"
# The newest transformers for the image's Python (5.21 needs 3.11) and the numpy GPTQModel pins exactly.
BUNDLED_TRANSFORMERS = "5.20.2"
BUNDLED_NUMPY = "2.2.6"
# The CPU torch of the development install (scripts/install.sh, README): every pip command that may touch torch
# names it, or pip resolves an unpinned torch to a multi-GB CUDA build.
DEV_TORCH = "2.13.0"
DEV_TORCH_SPEC = f"torch=={DEV_TORCH}"
