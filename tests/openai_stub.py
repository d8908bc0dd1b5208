"""A stand-in for an OpenAI-compatible chat server, for the OpenEvolve tests: `python openai_stub.py REPLIES.json PORT_FILE`.

It listens on 127.0.0.1 only (an ephemeral port, written to PORT_FILE), answers each
POST .../chat/completions with the next of the canned replies in REPLIES.json (a JSON
list of strings, taken in turn and cycled), logs each request's number and model to
PORT_FILE.log, and exits when its stdin closes (the test that started it is done) or
after --max-seconds, whichever comes first. It never reaches out anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("replies", type=Path)
    ap.add_argument("port_file", type=Path)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    a = ap.parse_args(argv)
    replies = json.loads(a.replies.read_text())
    assert isinstance(replies, list) and replies and all(isinstance(r, str) for r in replies)
    lock = threading.Lock()
    served = [0]
    log = a.port_file.with_name(a.port_file.name + ".log")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: the test reads the .log file instead
            pass

        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [{"id": "stub", "object": "model", "owned_by": "test"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                request = {}
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            with lock:
                n = served[0]
                served[0] += 1
                with open(log, "a") as f:
                    f.write(json.dumps({"n": n, "model": request.get("model")}) + "\n")
            content = replies[n % len(replies)]
            self._json(200, {
                "id": f"chatcmpl-stub-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": request.get("model") or "stub",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = a.port_file.with_name(a.port_file.name + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(a.port_file)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    done = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # EOF: whoever started us is gone or done
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    done.wait(a.max_seconds)
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
