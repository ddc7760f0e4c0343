"""`soarpack fake-server`: start the SGLang stand-in (soarpack.serve.fake_server) to try eval, bench and compare
without a GPU. Its answers are made up and its timings are its own scripted delays: nothing it yields is a result."""

from __future__ import annotations

import signal
import threading

import typer

from soarpack.cli import command
from soarpack.cli.output import sink
from soarpack.errors import ConfigError
from soarpack.facts import launch


@command("fake-server")
def fake_server_cmd(
    port: int = typer.Option(launch.PORT, "--port", metavar="N", min=0, max=65535,
                             help="Port on 127.0.0.1 (0: a free one; the address is printed)."),
    model_id: str = typer.Option("fake-sala", "--model-id", metavar="NAME", help="The id /v1/models reports."),
    ttft: float = typer.Option(0.05, "--ttft", metavar="SECONDS", min=0.0,
                               help="Delay before the first streamed token of /generate."),
    token_delay: float = typer.Option(0.0005, "--token-delay", metavar="SECONDS", min=0.0,
                                      help="Delay per streamed token (sent 16 to a chunk)."),
) -> None:
    """A stand-in, not SGLang: answers in the SGLang/OpenAI format with made-up text.

    Serves /v1/models, /v1/chat/completions, streaming /generate and
    /flush_cache on 127.0.0.1 until Ctrl-C (or SIGTERM), so that eval, bench
    and compare can be tried without a GPU. Its answers are made up (a choice letter
    picked from the question's hash), its speed is the delays given here:
    the numbers eval and bench report against it mean nothing.

    Example:

    \b
      soarpack fake-server --port 30000 &
      soarpack tiny-model tiny
      soarpack speedset --model-dir tiny -n 8 -o s1.jsonl
      soarpack eval --api-base http://127.0.0.1:30000 \\
        --data perf_public_set.jsonl -n 10
      soarpack bench --api-base http://127.0.0.1:30000 \\
        --model-dir tiny --s1 s1.jsonl
    """
    from soarpack.serve.fake_server import FakeSGLang, GenerateScript, made_up_reply

    out = sink()
    server = FakeSGLang(model_id=model_id, port=port, chat=made_up_reply,
                        generate=GenerateScript(ttft_s=ttft, token_delay_s=token_delay, tokens_per_chunk=16))
    try:
        server.start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror or exc})",
                          "pick another --port, or --port 0 for a free one") from None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        out.result({"url": server.url, "model_id": model_id, "stand_in": True}, server.url)
        out.say("a stand-in, not SGLang: its answers are made up and its numbers mean nothing; Ctrl-C (or kill PID) stops it")
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
    out.say(f"stopped after {len(server.chat_bodies)} chat and {len(server.generate_bodies)} generate requests")
