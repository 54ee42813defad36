"""A stand-in for llama.cpp's `llama-server` binary in tests of `bench serve
--llama-server`: takes its flags (and refuses others), answers GET /health, GET /v1/models
and a streamed POST /v1/completions of ``max_tokens`` text chunks, ended as llama-server
ends a stream: one chunk with an empty text, the finish_reason and the usage together. Like
llama-server, it ignores cache_salt and reports a prompt it has seen before as cached."""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--model", "--host", "--port", "--parallel", "--ctx-size", "--threads",
                 "--threads-batch"):
        p.add_argument(flag, required=True)
    p.add_argument("--no-webui", action="store_true", required=True)
    args = p.parse_args()
    seen: set[tuple[int, ...]] = set()
    flags = {"parallel": int(args.parallel), "ctx_size": int(args.ctx_size),
             "threads": int(args.threads), "model": args.model}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _json(self, obj: object) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._json({"status": "ok"} if self.path == "/health"
                       else {"data": [{"id": "fake.gguf"}]})

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            n, prompt = int(req["max_tokens"]), tuple(req["prompt"])
            cached = len(prompt) if prompt in seen else 0
            seen.add(prompt)
            for _ in range(n):
                chunk = {"choices": [{"index": 0, "text": " x"}], "flags": flags}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                     "usage": {"prompt_tokens": len(prompt), "completion_tokens": n,
                               "prompt_tokens_details": {"cached_tokens": cached}}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    ThreadingHTTPServer((args.host, int(args.port)), Handler).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
