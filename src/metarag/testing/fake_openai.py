"""A tiny OpenAI-compatible server on loopback, for tests and for measuring failure handling by hand.

It answers `GET /v1/models`, `POST /v1/chat/completions` and `POST /v1/completions` with the text
`answer(prompt)` gives (a constant by default). `mode` switches it at any time: "ok" answers,
"hang" accepts requests and never answers (until stopped), "error" answers HTTP 500; "hang-completions"
and "error-completions" do so to completions only, `GET /v1/models` still answering (a server whose
health looks fine). It can be stopped and started again on the same port, as a server that dies and
comes back.

    python -m metarag.testing.fake_openai --port 8011 [--answer Paris] [--mode ok|hang|error|...] [--delay SECONDS]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAIServer:
    """The server in a background thread; `requests` counts the completion requests answered,
    `peak_in_flight` the most it was answering at once (a thread each: unlimited concurrency)."""

    def __init__(self, port: int = 0, answer: Callable[[str], str] | str = "Paris", mode: str = "ok",
                 delay_s: float = 0.0, choice_fields: dict | None = None, response_fields: dict | None = None):
        self.answer = answer if callable(answer) else (lambda prompt, text=answer: text)
        # extra fields a real server adds (vLLM's choice `stop_reason`, llama-server's `__verbose`)
        self.choice_fields = dict(choice_fields or {})
        self.response_fields = dict(response_fields or {})
        self.mode = mode
        self.delay_s = delay_s  # before each completion, as a model would take
        self.port = port
        self.requests = 0
        self.received = 0  # completion requests received, answered or not
        self.in_flight = 0  # completions being answered now, and the most at once so far
        self.peak_in_flight = 0
        self._counting = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._released = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAIServer:
        self._released.clear()
        self._httpd = _Server(("127.0.0.1", self.port), _handler(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the listening socket: new connections are refused, hung requests are released."""
        self._released.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # hundreds of clients connect at once (the default backlog is 5)


def _handler(server: FakeOpenAIServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _answer(self, body: dict) -> None:
            body["choices"][0].update(server.choice_fields)
            self._send(200, {**body, **server.response_fields})

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _misbehave(self, completion: bool = False) -> bool:
            mode = server.mode.removesuffix("-completions") if completion else server.mode
            if mode == "hang":
                server._released.wait()
                self.close_connection = True
                return True
            if mode == "error":
                self._send(500, {"error": {"message": "fake server error", "type": "server_error"}})
                return True
            return False

        def do_GET(self) -> None:
            if self._misbehave():
                return
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model", "created": 0,
                                                             "owned_by": "tests"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with server._counting:
                server.received += 1
            if self._misbehave(completion=True):
                return
            with server._counting:
                server.in_flight += 1
                server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
            try:
                time.sleep(server.delay_s)
            finally:
                with server._counting:
                    server.in_flight -= 1
            usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
            if self.path == "/v1/chat/completions":
                prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
                server.requests += 1
                self._answer({"id": "c", "object": "chat.completion", "created": int(time.time()),
                                 "model": body.get("model", "fake"), "usage": usage,
                                 "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                              "message": {"role": "assistant", "content": server.answer(prompt)}}]})
            elif self.path == "/v1/completions":
                server.requests += 1
                self._answer({"id": "c", "object": "text_completion", "created": int(time.time()),
                                 "model": body.get("model", "fake"), "usage": usage,
                                 "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                              "text": server.answer(str(body.get("prompt", "")))}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})
    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answer", default="Paris")
    parser.add_argument("--mode", default="ok", choices=("ok", "hang", "error", "hang-completions",
                                                        "error-completions"))
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each completion")
    args = parser.parse_args()
    server = FakeOpenAIServer(args.port, args.answer, args.mode, args.delay).start()
    print(f"fake OpenAI server on {server.url} ({args.mode})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
