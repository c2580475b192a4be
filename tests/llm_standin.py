"""A scripted stand-in for the user's LLM: an OpenAI-compatible Chat Completions
server (GET /v1/models, POST /v1/chat/completions, streamed as the real servers
stream) that answers each request with the next step of a script the test gives,
and keeps every request it got so the test can read what the daemon sent.

A step is one of:
- ("text", "words")                       the model answers in text
- ("call", name, arguments_text)          the model calls one tool (arguments as text, sent in pieces)
- ("calls", [(name, arguments_text), ...])  several calls in one answer
- ("status", code, body_dict)             the endpoint fails with that status
- ("hang", seconds)                       nothing is sent for that long
- ("whole", "words")                      the answer in one piece (application/json), not streamed

It listens on 127.0.0.1 (the daemon's chat reaches it there); `down()` closes the
listener (the endpoint is down: connections are refused), `up()` opens it again on
the same port."""

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn:
    def __init__(self, model="stand-in"):
        self.model = model
        self.script = []
        self.requests = []
        self.lock = threading.Lock()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = None
        self.up()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, *steps):
        """The next requests' answers, in order (replacing what was left)."""
        with self.lock:
            self.script = list(steps)
            self.requests = []

    def up(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path != "/v1/models":
                    return self.reply(404, {"error": {"message": "no such route"}})
                self.reply(200, {"object": "list", "data": [{"id": standin.model, "object": "model"}]})

            def do_POST(self):
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length))
                with standin.lock:
                    standin.requests.append({"headers": dict(self.headers), "body": body})
                    step = standin.script.pop(0) if standin.script else ("text", "(the script is over)")
                if self.path != "/v1/chat/completions":
                    return self.reply(404, {"error": {"message": "no such route"}})
                kind = step[0]
                if kind == "status":
                    return self.reply(step[1], step[2])
                if kind == "hang":
                    time.sleep(step[1])
                    return self.reply(200, {"choices": [{"message": {"role": "assistant", "content": "late"}}]})
                if kind == "whole":
                    return self.reply(200, {"choices": [{"message": {"role": "assistant", "content": step[1]}}]})
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for chunk in chunks(step, standin.model):
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()

    def close(self):
        self.down()


class Server(ThreadingHTTPServer):
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # The daemon hung up (a stop, a timeout): what the tests make happen.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def chunks(step, model):
    """A streamed answer's chunks, as OpenAI's API sends them: the text in pieces,
    a tool call's name first and its arguments in pieces."""
    def chunk(delta, finish=None):
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    if step[0] == "text":
        words = step[1]
        for i in range(0, len(words), 7):
            yield chunk({"content": words[i:i + 7]})
        yield chunk({}, "stop")
        return
    calls = [(step[1], step[2])] if step[0] == "call" else step[1]
    for index, (name, arguments) in enumerate(calls):
        yield chunk({"tool_calls": [{"index": index, "id": f"call_{index}_{name}", "type": "function",
                                     "function": {"name": name, "arguments": ""}}]})
        for i in range(0, len(arguments), 9):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + 9]}}]})
    yield chunk({}, "tool_calls")
