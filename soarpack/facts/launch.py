"""How the platform starts the server (SALA.md §1; an older copy of its entrypoint, treated as likely):

    python -m sglang.launch_server --model-path OUT --trust-remote-code --port 30000 ${SGLANG_SERVER_ARGS}
        --tp-size 1 --max-running-requests 32 --enable-metrics

Flags after ours win. `DEFAULT_SERVER_ARGS` is SGLANG_SERVER_ARGS as the platform sets it before prepare_env.sh.
"""

from typing import List, Tuple

MODULE = "sglang.launch_server"
PORT = 30000
MAX_RUNNING_REQUESTS = 32
TP_SIZE = 1
MODEL_PATH_FLAG = "--model-path"
PORT_FLAG = "--port"
TRUST_REMOTE_CODE_FLAG = "--trust-remote-code"
TP_SIZE_FLAG = "--tp-size"
MAX_RUNNING_FLAG = "--max-running-requests"
METRICS_FLAG = "--enable-metrics"
# What the platform appends after SGLANG_SERVER_ARGS.
TRAILING_ARGS: Tuple[str, ...] = (TP_SIZE_FLAG, str(TP_SIZE), MAX_RUNNING_FLAG, str(MAX_RUNNING_REQUESTS), METRICS_FLAG)
# The flags the platform sets itself: a profile that sets one is overridden (or duplicates it).
PLATFORM_FLAGS: Tuple[str, ...] = (MAX_RUNNING_FLAG, TP_SIZE_FLAG, PORT_FLAG, MODEL_PATH_FLAG)
DEFAULT_SERVER_ARGS = ("--disable-radix-cache --attention-backend minicpm_flashinfer --chunked-prefill-size 8192 "
                       "--skip-server-warmup --dense-as-sparse")


def leading_args(model_path: str, port: int = PORT) -> List[str]:
    """What comes before SGLANG_SERVER_ARGS."""
    return [MODEL_PATH_FLAG, str(model_path), TRUST_REMOTE_CODE_FLAG, PORT_FLAG, str(port)]


def server_argv(model_path: str, server_args: "list[str] | tuple[str, ...]", port: int = PORT) -> List[str]:
    """The launch line's arguments after `python -m sglang.launch_server`."""
    return [*leading_args(model_path, port), *server_args, *TRAILING_ARGS]


def overrides_phrase() -> str:
    """'--max-running-requests 32, --tp-size 1, --port, --model-path' for messages."""
    values = {MAX_RUNNING_FLAG: str(MAX_RUNNING_REQUESTS), TP_SIZE_FLAG: str(TP_SIZE)}
    return ", ".join(f"{flag} {values[flag]}" if flag in values else flag for flag in PLATFORM_FLAGS)
