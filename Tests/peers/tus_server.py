#!/usr/bin/env python3
"""A tus 1.0.0 server for tests: the PyPI `tuspyserver` router under uvicorn, wrapped in an ASGI
layer that logs every request (method, path, status, Upload-Offset, Content-Length, whether an
Upload-Checksum came) as one JSON line and can misbehave on cue.

  tus_server.py --port P --files DIR --log FILE [--fail-patch N] [--checksum] [--corrupt-patch N]
                [--locked-after-head N]

--fail-patch N     answers 503 to the Nth PATCH (1-based) without storing it.
--locked-after-head N  answers `423 Locked` to the first N PATCHes after the first HEAD, without
                   storing them: a server that still holds the lock of a request whose client died
                   (tusd's locker) while its socket drains, as a restarted client meets it.
--checksum         adds the checksum extension, which tuspyserver lacks: OPTIONS lists
                   `checksum` and the algorithms sha1 and sha256, and a PATCH whose body does not
                   match its Upload-Checksum is answered 460 and not stored.
--corrupt-patch N  flips one byte of the Nth PATCH body on its way in, as a bad link would.
"""
import argparse, base64, hashlib, json

import uvicorn
from fastapi import FastAPI
from tuspyserver import create_tus_router

ALGORITHMS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--files", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail-patch", type=int, default=0)
    parser.add_argument("--checksum", action="store_true")
    parser.add_argument("--corrupt-patch", type=int, default=0)
    parser.add_argument("--locked-after-head", type=int, default=0)
    args = parser.parse_args()
    patches = {"count": 0}
    lock = {"headed": False, "left": args.locked_after_head}
    inner = FastAPI()
    inner.include_router(create_tus_router(prefix="files", files_dir=args.files))

    def log(entry):
        with open(args.log, "a") as out:
            out.write(json.dumps(entry) + "\n")

    async def send_status(send, status, headers=()):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"tus-resumable", b"1.0.0"), (b"content-length", b"0"), *headers]})
        await send({"type": "http.response.body", "body": b""})

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return await inner(scope, receive, send)
        method = scope["method"]
        if method == "OPTIONS" and scope["path"] == "/files":
            # tuspyserver answers OPTIONS only at /files/; clients ask at the creation URL.
            scope = dict(scope, path="/files/", raw_path=b"/files/")
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        entry = {"method": method, "path": scope["path"], "upload_offset": headers.get("upload-offset"),
                 "content_length": int(headers.get("content-length") or 0),
                 "upload_checksum": headers.get("upload-checksum")}
        body = b""
        if method == "HEAD":
            lock["headed"] = True
        if method == "PATCH":
            patches["count"] += 1
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            if patches["count"] == args.corrupt_patch and body:
                body = bytes([body[0] ^ 0xFF]) + body[1:]
                entry["corrupted"] = True
            if lock["headed"] and lock["left"] > 0:
                lock["left"] -= 1
                entry["status"] = 423
                log(entry)
                return await send_status(send, 423)
            if patches["count"] == args.fail_patch:
                entry["status"] = 503
                log(entry)
                return await send_status(send, 503)
            if args.checksum and headers.get("upload-checksum"):
                name, _, value = headers["upload-checksum"].partition(" ")
                if name not in ALGORITHMS:
                    entry["status"] = 400
                    log(entry)
                    return await send_status(send, 400)
                if base64.b64encode(ALGORITHMS[name](body).digest()).decode() != value:
                    entry["status"] = 460
                    log(entry)
                    return await send_status(send, 460)

        replayed = {"done": False}

        async def replay():
            if method == "PATCH":
                if replayed["done"]:
                    return {"type": "http.disconnect"}
                replayed["done"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def record(message):
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
                if args.checksum and method == "OPTIONS":
                    kept = [(k, v) for k, v in message["headers"] if k.lower() not in (b"tus-extension", b"tus-checksum-algorithm")]
                    extensions = dict(message["headers"]).get(b"tus-extension", b"creation,termination")
                    message = dict(message, headers=kept + [(b"tus-extension", extensions + b",checksum"),
                                                            (b"tus-checksum-algorithm", b"sha1,sha256")])
                log(entry)
            await send(message)

        await inner(scope, replay, record)

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
