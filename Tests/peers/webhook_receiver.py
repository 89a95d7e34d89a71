#!/usr/bin/env python3
"""A webhook receiver for tests: verifies every delivery with the `standardwebhooks` library
(an implementation independent of Backhaul's) and records it as one JSON line.

  webhook_receiver.py --port P --secret whsec_... --log FILE [--fail-first N] [--status S]

--fail-first N answers 500 to the first N verified deliveries; --status S answers S to all of
them (e.g. 410). Each line also has `received_at` (Unix seconds, when the body was read) and
the task's `finished_at`, from which a test measures event lag. Prints "listening <port>" once
ready. Exits on SIGTERM.
"""
import argparse, json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--secret", action="append", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--status", type=int, default=204)
    args = parser.parse_args()
    verifiers = [Webhook(secret) for secret in args.secret]
    lock = threading.Lock()
    state = {"failures_left": args.fail_first}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            received_at = time.time()
            headers = {name.lower(): value for name, value in self.headers.items()}
            verified_with = []
            for index, verifier in enumerate(verifiers):
                try:
                    verifier.verify(body, headers)
                    verified_with.append(index)
                except WebhookVerificationError:
                    pass
            payload = json.loads(body) if body else None
            with lock:
                if not verified_with:
                    status = 400
                elif state["failures_left"] > 0:
                    state["failures_left"] -= 1
                    status = 500
                else:
                    status = args.status
                record = {
                    "webhook_id": headers.get("webhook-id"), "timestamp": headers.get("webhook-timestamp"),
                    "signature": headers.get("webhook-signature"), "verified_with": verified_with, "status": status,
                    "type": payload and payload.get("type"),
                    "task_id": payload and isinstance(payload.get("data"), dict) and payload["data"].get("id"),
                    "session_id": payload and isinstance(payload.get("data"), dict) and payload["data"].get("session_id"),
                    "state": payload and isinstance(payload.get("data"), dict) and payload["data"].get("state"),
                    "finished_at": payload and isinstance(payload.get("data"), dict) and payload["data"].get("finished_at"),
                    "received_at": received_at,
                    "body": body.decode("utf-8", "replace"),
                }
                with open(args.log, "a") as log:
                    log.write(json.dumps(record) + "\n")
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
