"""The platform's limits: the upload, the eval's requests, the server's start-up window."""

UPLOAD_MAX_BYTES = 2_000_000_000  # "2 GB", read as 10^9 bytes, the stricter reading
UPLOAD_WARN_FRACTION = 0.9  # where soarpack starts warning


def upload_limit_words() -> str:
    return f"{UPLOAD_MAX_BYTES / 1e9:g} GB"


EVAL_MAX_TOKENS = 65536  # max_tokens of every eval request
EVAL_TIMEOUT_S = 3000.0  # per request; an error scores 0
SERVER_READY_S = 600.0  # the platform gives the server about 10 minutes to be healthy
