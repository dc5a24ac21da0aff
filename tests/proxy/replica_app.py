"""A small stdlib HTTP app that service replicas in the tests run (HTTP/1.1, keep-alive).

GET /whoami: the job's id. GET /headers: the path and headers it got, as JSON. GET /health: 200 unless
the file ``sick`` exists in its directory (GET /sick creates it, GET /well removes it). GET /sse: three
server-sent events, 0.3 s apart, chunked. POST /echo: the body back (Content-Length or chunked). POST /probe:
200 only with the header ``X-Probe: yes`` and the body ``ping``. GET /die:
the process kills itself with SIGKILL. GET /version: ``$VERSION``. GET /long-sse?n=N: N events 0.25 s
apart, then ``data: [DONE]``. POST /v1/chat/completions: an OpenAI-style answer naming ``$MODEL``
(streamed as SSE chunks and ``data: [DONE]`` with ``"stream": true``). GET /ws (WebSocket): every message
echoed back as ``echo:<message>``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
SICK = os.path.join(os.getcwd(), "sick")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: str | bytes, ctype: str = "text/plain") -> None:
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _websocket(self) -> None:
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            b1, b2 = self.rfile.read(2)
            opcode, length = b1 & 0x0F, b2 & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self.rfile.read(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", self.rfile.read(8))
            mask = self.rfile.read(4) if b2 & 0x80 else b"\0\0\0\0"
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self.wfile.write(b"\x88\x02" + data[:2])
                self.wfile.flush()
                return
            if opcode in (1, 2):
                out = b"echo:" + data
                head = bytes([0x80 | opcode])
                head += bytes([len(out)]) if len(out) < 126 else b"\x7e" + struct.pack("!H", len(out))
                self.wfile.write(head + out)
                self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self._websocket()
            self.close_connection = True
        elif self.path == "/whoami":
            self._send(200, os.environ.get("DSTACK_JOB_ID", "?"))
        elif self.path.startswith("/headers"):
            self._send(200, json.dumps({"path": self.path, "headers": dict(self.headers.items())}), "application/json")
        elif self.path == "/health":
            self._send(500 if os.path.exists(SICK) else 200, "health")
        elif self.path == "/sick":
            open(SICK, "w").close()
            self._send(200, os.environ.get("DSTACK_JOB_ID", "?"))
        elif self.path == "/well":
            if os.path.exists(SICK):
                os.remove(SICK)
            self._send(200, "well")
        elif self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                data = f"data: {i} {time.time()}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.3)
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/version":
            self._send(200, os.environ.get("VERSION", "?"))
        elif self.path.startswith("/long-sse"):
            n = int(self.path.partition("n=")[2] or 8)
            self._chunked([f"data: {i}\n\n".encode() for i in range(n)] + [b"data: [DONE]\n\n"], 0.25)
        elif self.path == "/die":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            self._send(404, "no such path: " + self.path)

    def _chunked(self, events: list[bytes], pause: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for data in events:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(pause)
        self.wfile.write(b"0\r\n\r\n")

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/chat/completions":
            req = json.loads(body or b"{}")
            model = os.environ.get("MODEL", "?")
            if req.get("stream"):
                chunks = [{"model": model, "choices": [{"delta": {"content": w}}]} for w in ("hello ", "from ", model)]
                self._chunked(
                    [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"], 0.05
                )
            else:
                answer = {
                    "model": model,
                    "choices": [{"message": {"role": "assistant", "content": "hello from " + model}}],
                }
                self._send(200, json.dumps(answer), "application/json")
            return
        if self.path == "/probe":
            self._send(200 if self.headers.get("X-Probe") == "yes" and body == b"ping" else 400, "probe")
            return
        self._send(200, body, "application/octet-stream")


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
