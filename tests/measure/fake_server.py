"""A real HTTP server on localhost that streams OpenAI-style completions at configured speeds, for testing the
benchmark client: it waits `ttft_s` before the first token and `tpot_s` between tokens, reports usage, and
can cut every `drop_every`-th stream short after `drop_after` tokens (the socket closes mid-stream)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Speed:
    ttft_s: float = 0.1
    tpot_s: float = 0.02
    drop_every: int = 0  # 0: never
    drop_after: int = 3


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        return

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        server: _Counter = self.server.owner  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        index = server.next_index()
        chat = self.path.endswith("/chat/completions")
        if not self.path.endswith(("/completions", "/chat/completions")):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        tokens = int(body.get("max_tokens", 16))
        prompt = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")  # a stream of unknown length on a kept-alive connection
        self.end_headers()
        speed = server.speed
        drop = speed.drop_every and index % speed.drop_every == 0
        time.sleep(speed.ttft_s)
        for n in range(tokens):
            if n:
                time.sleep(speed.tpot_s)
            if drop and n == speed.drop_after:
                self.connection.shutdown(socket.SHUT_RDWR)  # cut the stream without an end
                return
            piece = {"delta": {"content": "x"}} if chat else {"text": "x"}
            self._send({"choices": [{"index": 0, **piece}]})
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens}
        self._send({"choices": [], "usage": usage})
        self._write(b"data: [DONE]\n\n")
        self._write(b"")  # the last chunk of the transfer

    def _send(self, chunk: dict) -> None:
        self._write(f"data: {json.dumps(chunk)}\n\n".encode())

    def _write(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many clients connect at once; the default backlog of 5 would refuse them

    def handle_error(self, request, client_address) -> None:  # a client hanging up is not news here
        return


class FakeServer:
    """The server in its own process (as a real engine is: no interpreter lock shared with the client)."""

    def __init__(self, speed: Speed) -> None:
        self.speed = speed
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeServer:
        args = [sys.executable, __file__, json.dumps(self.speed.__dict__)]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())
        return self

    def __exit__(self, *exc) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=10)


class _Counter:
    def __init__(self, speed: Speed) -> None:
        self.speed = speed
        self._count = 0
        self._lock = threading.Lock()

    def next_index(self) -> int:
        with self._lock:
            self._count += 1
            return self._count


def serve(speed: Speed) -> None:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.owner = _Counter(speed)  # type: ignore[attr-defined]
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    serve(Speed(**json.loads(sys.argv[1])))
