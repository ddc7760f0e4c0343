"""Start the OpenBMB fork's real server on the lent GPU in the dense variant, with the sgl_kernel shim.

    python benchmarks/gpu_serve/launch.py --model-path CKPT --port 30000 --fork-src /tmp/fork/python \
        --site /tmp/serve-site [--marlin-so sgl_marlin.so] [--bf16] [--profile dense-bf16.toml] [--print] [-- EXTRA]

It runs `python -m sglang.launch_server` with the platform's launch line (SALA.md §1: --model-path,
--trust-remote-code, --port, the profile's args, then the platform's own --tp-size 1 --max-running-requests 32)
in an environment where PYTHONPATH is shim/ (its sitecustomize installs the shim in every server process), the fork's
python/ tree, then --site (the carried wheels' --target folder). --bf16 serves an unquantized checkpoint (drops the
profile's --quantization). --print writes the argv and environment as JSON and starts nothing. --write-python PATH
writes an executable that runs this Python in that environment and starts nothing: a `--python` for `soarpack
rehearse-server`, which builds the platform's launch line itself. Standard library only:
it runs under the device's Python 3.12 before anything is installed.
"""

import argparse
import json
import os
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.join(HERE, "shim")
DEFAULT_PROFILE = os.path.join(HERE, "dense-bf16.toml")
PLATFORM_TAIL = ["--tp-size", "1", "--max-running-requests", "32"]
# engine.py's _set_envs_and_config checks importlib.metadata.version("sgl-kernel") >= 0.3.20: the distribution here is
# sglang-kernel 0.4.5, so the check fails although the kernels load (flashinfer_python 0.5.3, checked by the same
# switch, is carried at the pinned version). NCCL_NVLS_ENABLE=0: NVLink multicast stays off (device README).
SERVER_ENV = {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1", "NCCL_NVLS_ENABLE": "0"}


def read_profile_args(path):
    """[serve].args of a profile TOML (tomllib on 3.11+, else a reader for the plain list this format uses)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        import tomllib

        return list(tomllib.loads(raw.decode("utf-8"))["serve"]["args"])
    except ImportError:
        pass
    text = raw.decode("utf-8")
    start = text.index("args = [", text.index("[serve]"))
    body = text[start + len("args = ["): text.index("]", start)]
    import ast

    lines = [line.split("#", 1)[0] for line in body.splitlines()]
    return list(ast.literal_eval("[" + "\n".join(lines) + "]"))


def drop_flag(args, flag):
    out, skip = [], False
    for i, tok in enumerate(args):
        if skip:
            skip = False
            continue
        if tok == flag:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(tok)
    return out


def server_argv(model_path, port, profile_args, bf16=False, extra=()):
    args = drop_flag(list(profile_args), "--quantization") if bf16 else list(profile_args)
    return ["--model-path", str(model_path), "--trust-remote-code", "--port", str(port), *args, *PLATFORM_TAIL,
            *extra]


def server_env(fork_src, site=None, marlin_so=None, base=None):
    env = dict(os.environ if base is None else base)
    paths = [SHIM_DIR, os.path.abspath(fork_src)] + ([os.path.abspath(site)] if site else [])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if marlin_so:
        env["SOARPACK_MARLIN_SO"] = os.path.abspath(marlin_so)
    env.update(SERVER_ENV)
    env.setdefault("SOARPACK_GPU_SHIM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--fork-src", required=True, help="the fork's python/ folder (d29fb130c)")
    ap.add_argument("--site", help="the --target folder the carried wheels were installed into")
    ap.add_argument("--marlin-so", help="the device-built Marlin extension (needed for W4 checkpoints)")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--bf16", action="store_true", help="an unquantized checkpoint: drop --quantization")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--print", action="store_true", help="print argv and environment as JSON, start nothing")
    ap.add_argument("--write-python", metavar="PATH", help="write a python wrapper with the server environment, start nothing")
    ap.add_argument("extra", nargs="*", help="more server flags, after --")
    a = ap.parse_args(argv)
    if not a.model_path and not a.write_python:
        ap.error("--model-path is required")
    return a


ENV_KEYS = ("PYTHONPATH", "SOARPACK_MARLIN_SO", "SOARPACK_GPU_SHIM", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE", *SERVER_ENV)


def write_python(path, python, env):
    lines = ["#!/bin/sh", "# The server's environment (benchmarks/gpu_serve/launch.py --write-python), then the Python."]
    lines += [f"export {k}={shlex.quote(env[k])}" for k in ENV_KEYS if k in env]
    lines.append(f'exec {shlex.quote(python)} "$@"')
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    os.chmod(path, 0o755)


def main(argv=None):
    a = parse(argv)
    if not a.bf16 and not a.marlin_so and not a.print:
        print("error: a W4 checkpoint needs --marlin-so (the Marlin extension built on the device); "
              "pass --bf16 for an unquantized one", file=sys.stderr)
        return 2
    env = server_env(a.fork_src, a.site, a.marlin_so)
    if a.write_python:
        write_python(a.write_python, a.python, env)
        print(f"wrote {a.write_python}", flush=True)
        return 0
    args = server_argv(a.model_path, a.port, read_profile_args(a.profile), a.bf16, a.extra)
    cmd = [a.python, "-m", "sglang.launch_server", *args]
    if a.print:
        print(json.dumps({"cmd": cmd, "server_args": args, "env": {k: env[k] for k in ENV_KEYS if k in env}}, indent=1))
        return 0
    print("launch: " + shlex.join(cmd), flush=True)
    os.execvpe(cmd[0], cmd, env)  # the server takes this process's id: a caller's kill reaches it


if __name__ == "__main__":
    raise SystemExit(main())
