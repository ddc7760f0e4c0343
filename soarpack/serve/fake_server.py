"""A stand-in for an SGLang server: a real HTTP/1.1 server on 127.0.0.1 (stdlib, one thread per connection) that
answers in SGLang's and OpenAI's formats with made-up text. Its answers and its speed mean nothing; it lets eval,
bench and compare be tried without a GPU (`soarpack fake-server`), and it is what the tests run them against.

It speaks the endpoints the platform's eval and bench use: `GET /v1/models`, `POST /v1/chat/completions`,
streaming `POST /generate` (SGLang's `data: {json}` lines, cumulative `text`, `meta_info.completion_tokens`,
`data: [DONE]`), `POST /flush_cache` and `GET /get_server_info` (bench_serving asks it at the end of each run). Answers, delays and failures are scripted per question; it counts
requests in flight per endpoint and records every body so tests can check what a client sent.

Every loop is bounded (token count capped, sleeps interrupted on stop) so a broken client cannot hang a test.

    with FakeSGLang(chat=lambda q: ChatReply("</think>ANSWER: B")) as server:
        run_eval(EvalConfig(api_base=server.url, ...))
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Union

MAX_STREAM_TOKENS = 200_000
# How long a scripted broken reply holds its connection open (cut short when the server stops).
MAX_HOLD_S = 30.0


@dataclass
class ChatReply:
    """One chat answer. Broken-server modes: `content` of any JSON type; `raw` sent as the body instead of a
    completion (malformed JSON, HTML, `{"choices": []}`; with a `status` other than 200, the error body);
    `missing_bytes` > 0 announces a Content-Length that many bytes longer than the body sent, then holds the
    connection open; `trickle_s` > 0 sends the body one byte every `trickle_s` seconds (at most MAX_HOLD_S)."""

    content: Any = "ok"
    delay_s: float = 0.0
    status: int = 200
    completion_tokens: Optional[int] = None
    raw: Optional[bytes] = None
    missing_bytes: int = 0
    trickle_s: float = 0.0
    hold_until_in_flight: int = 0  # before answering, wait until this many chat requests are in flight (see below)


@dataclass
class GenerateScript:
    """Timing of one streamed /generate: first chunk after ttft_s, then tokens_per_chunk tokens every
    token_delay_s × tokens_per_chunk seconds, until max_new_tokens."""

    ttft_s: float = 0.0
    token_delay_s: float = 0.0
    tokens_per_chunk: int = 1
    status: int = 200
    stop_after: Optional[int] = None  # send at most this many tokens, then [DONE]: shorter than asked
    stall_after: Optional[int] = None  # after this many tokens, hold the stream open and send nothing
    claim_tokens: Optional[int] = None  # from the second chunk on, claim this completion_tokens (a lying server)
    # Before the first chunk, wait until this many /generate requests are in flight (at most MAX_HOLD_S): a test
    # gives it to one wave of requests, so that the wave is surely in flight at once however slow the machine is.
    hold_until_in_flight: int = 0


class FakeSGLang:
    def __init__(self, model_id: str = "fake-sala",
                 chat: Union[Callable[[str], ChatReply], Dict[str, ChatReply], None] = None,
                 generate: Union[Callable[[str], GenerateScript], GenerateScript, None] = None, port: int = 0,
                 server_info: Optional[dict] = None):
        self.model_id = model_id
        # SGLang answers /get_server_info with its ServerArgs and scheduler state; the stand-in says what it is.
        self.server_info = server_info if server_info is not None else {
            "model_path": model_id, "served_model_name": model_id, "quantization": None, "dtype": "auto",
            "version": "soarpack fake-server (not SGLang)"}
        self.port = port
        self._chat = chat
        self._generate = generate or GenerateScript()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when a count in flight changes, and on stop
        self.in_flight: Dict[str, int] = {"chat": 0, "generate": 0}
        self.max_in_flight: Dict[str, int] = {"chat": 0, "generate": 0}
        self.chat_bodies: List[dict] = []
        self.generate_bodies: List[dict] = []
        self.events: List[tuple] = []  # (time.perf_counter(), what): "flush", "generate_start", "generate_end",
        # "server_info"
        self.flushes = 0
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- scripting -------------------------------------------------------------------------------------------
    def chat_reply(self, question: str) -> ChatReply:
        if self._chat is None:
            return ChatReply()
        if callable(self._chat):
            return self._chat(question)
        return self._chat.get(question, ChatReply())

    def generate_script(self, prompt: str) -> GenerateScript:
        return self._generate(prompt) if callable(self._generate) else self._generate

    # -- bookkeeping -----------------------------------------------------------------------------------------
    def enter(self, kind: str) -> None:
        with self._lock:
            self.in_flight[kind] += 1
            self.max_in_flight[kind] = max(self.max_in_flight[kind], self.in_flight[kind])
            self._changed.notify_all()

    def leave(self, kind: str) -> None:
        with self._lock:
            self.in_flight[kind] -= 1
            self._changed.notify_all()

    def hold_until_in_flight(self, kind: str, count: int) -> bool:
        """Wait until `count` requests of `kind` are in flight (the server's own count, not a timer); False when
        the server stops first or MAX_HOLD_S passes."""
        with self._changed:
            return self._changed.wait_for(lambda: self.in_flight[kind] >= count or self.stopping.is_set(),
                                          timeout=MAX_HOLD_S) and not self.stopping.is_set()

    def record(self, what: str, body: Optional[dict] = None) -> None:
        with self._lock:
            self.events.append((time.perf_counter(), what))
            if what == "chat":
                self.chat_bodies.append(body)
            elif what == "generate_start":
                self.generate_bodies.append(body)
            elif what == "flush":
                self.flushes += 1

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.stopping.wait(seconds)

    def sleep_until(self, deadline: float) -> None:
        """Sleep to a time.perf_counter() deadline: a stream paced by deadlines does not add up each sleep's lateness
        (on a loaded machine a late wake-up delays one chunk, not every chunk after it)."""
        self.sleep(deadline - time.perf_counter())

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> "FakeSGLang":
        handler = type("BoundHandler", (_Handler,), {"fake": self})
        self._httpd = _Server(("127.0.0.1", self.port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeSGLang":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops SYNs when many clients connect at once (Smax): a 1 s retransmit.
    request_queue_size = 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Without TCP_NODELAY, Nagle + delayed ACK add ~40 ms to every small streamed write; uvicorn sets it too.
    disable_nagle_algorithm = True
    fake: FakeSGLang

    def log_message(self, format, *args):  # noqa: A002 - keep test output quiet
        pass

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _send_json(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        if self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": self.fake.model_id, "object": "model"}]})
        elif self.path in ("/health", "/health_generate"):
            self._send_json(200, {})
        elif self.path == "/get_server_info":
            self.fake.record("server_info")
            self._send_json(200, self.fake.server_info)
        else:
            self._send_json(404, {"error": "not found"})

    def do_POST(self):
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a scripted timeout); nothing to answer

    def _post(self):
        body = self._body()
        if self.path == "/v1/chat/completions":
            self._chat(body)
        elif self.path == "/generate":
            self._generate(body)
        elif self.path == "/flush_cache":
            self.fake.record("flush")
            self._send_json(200, {"message": "Cache flushed."})
        else:
            self._send_json(404, {"error": "not found"})

    def _chat(self, body: dict) -> None:
        fake = self.fake
        fake.enter("chat")
        fake.record("chat", body)
        try:
            question = body["messages"][0]["content"]
            reply = fake.chat_reply(question)
            if reply.hold_until_in_flight:
                fake.hold_until_in_flight("chat", reply.hold_until_in_flight)
            fake.sleep(reply.delay_s)
        finally:
            # Leave before the client can see the answer, so in-flight counts never overlap a finished request.
            fake.leave("chat")
        if reply.status != 200 and reply.raw is None:
            self._send_json(reply.status, {"object": "error", "message": "scripted failure"})
            return
        if reply.raw is not None or reply.missing_bytes:
            self._send_raw(reply)
            return
        tokens = reply.completion_tokens if reply.completion_tokens is not None else len(str(reply.content).split())
        completion = {
            "id": "fake", "object": "chat.completion", "model": fake.model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(question.split()), "completion_tokens": tokens,
                      "total_tokens": len(question.split()) + tokens},
        }
        if reply.trickle_s:
            self._trickle(json.dumps(completion).encode(), reply.trickle_s)
            return
        self._send_json(200, completion)

    def _trickle(self, data: bytes, every_s: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        deadline = time.monotonic() + MAX_HOLD_S
        for i in range(len(data)):
            if self.fake.stopping.is_set() or time.monotonic() > deadline:
                self.close_connection = True
                return
            self.wfile.write(data[i:i + 1])
            self.wfile.flush()
            self.fake.sleep(every_s)

    def _send_raw(self, reply: ChatReply) -> None:
        data = reply.raw if reply.raw is not None else json.dumps({"choices": [{"message": {"content": "x"}}]}).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data) + reply.missing_bytes))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        if reply.missing_bytes:
            self.fake.sleep(MAX_HOLD_S)
            self.close_connection = True

    def _generate(self, body: dict) -> None:
        fake = self.fake
        fake.enter("generate")
        fake.record("generate_start", body)
        left = False
        try:
            script = fake.generate_script(body.get("text", ""))
            if script.status != 200:
                fake.leave("generate")
                left = True
                self._send_json(script.status, {"error": "scripted failure"})
                return
            total = min(int(body["sampling_params"]["max_new_tokens"]), MAX_STREAM_TOKENS, script.stop_after or MAX_STREAM_TOKENS)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if script.hold_until_in_flight:
                fake.hold_until_in_flight("generate", script.hold_until_in_flight)
            first_token_at = time.perf_counter() + script.ttft_s
            fake.sleep_until(first_token_at)
            sent = 0
            step = max(1, script.tokens_per_chunk)
            while sent < total and not fake.stopping.is_set():
                if script.stall_after is not None and sent >= script.stall_after:
                    fake.sleep(MAX_HOLD_S)
                    self.close_connection = True
                    return
                if sent:
                    fake.sleep_until(first_token_at + script.token_delay_s * sent)
                sent = min(total, sent + step)
                claimed = script.claim_tokens if script.claim_tokens is not None and sent > step else sent
                event = {"text": " ".join(["tok"] * sent), "meta_info": {"completion_tokens": claimed, "prompt_tokens": 0},
                         "index": 0}
                self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            fake.record("generate_end")
            fake.leave("generate")
            left = True
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if not left:
                fake.leave("generate")


def made_up_reply(question: str) -> ChatReply:
    """`soarpack fake-server`'s answer: a choice letter in the platform's answer format, made up from the question
    (the same question gets the same letter); right about a quarter of the time on multiple choice, never else."""
    letter = "ABCD"[zlib.crc32(question.encode("utf-8")) % 4]
    return ChatReply(f"<think>made up by soarpack fake-server</think>ANSWER: {letter}")
