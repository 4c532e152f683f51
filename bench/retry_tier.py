#!/usr/bin/env python3
"""A tier of bench/retry-storm.sh: an HTTP/1.1 server that answers each call
by calling the next tier through its own gov-agent's outbound listener and
answering with that call's status, or (the bottom tier) fails a share of its
calls with 503 and counts every call it receives.

  retry_tier.py PORT --next HOST:PORT --next-service NAME   (a middle tier)
  retry_tier.py PORT --fail 0.5 --seed 1                     (the bottom tier)

GET /count on any tier answers the calls it has received so far.
"""
import argparse
import http.client
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("port", type=int)
parser.add_argument("--next")
parser.add_argument("--next-service")
parser.add_argument("--fail", type=float, default=0.0)
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()

lock = threading.Lock()
calls = 0
rng = random.Random(args.seed)
local = threading.local()


def downstream():
    conn = getattr(local, "conn", None)
    if conn is None:
        host, port = args.next.rsplit(":", 1)
        conn = local.conn = http.client.HTTPConnection(host, int(port), timeout=10)
    return conn


class Tier(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        global calls
        if self.path == "/count":
            with lock:
                self.answer(200, str(calls).encode())
            return
        with lock:
            calls += 1
            fail = rng.random() < args.fail
        if args.next is None:
            self.answer(503 if fail else 200)
            return
        try:
            conn = downstream()
            conn.request("GET", self.path, headers={"gov-service": args.next_service})
            response = conn.getresponse()
            response.read()
            self.answer(response.status)
        except (OSError, http.client.HTTPException):
            local.conn = None
            self.answer(502)


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", args.port), Tier).serve_forever()
