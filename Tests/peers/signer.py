#!/usr/bin/env python3
"""A session's signer for tests (docs/credentials.md), with a sink that checks what it signed.

  signer.py --port P --secret-file FILE --log FILE [--mode-file FILE] [--lifetime S] [--files DIR]
            [--s3 CREDENTIALS.json] [--outside-host HOST]

POST /sign: the daemon's question, whose Standard Webhook signature is checked with the
`standardwebhooks` package (the secret is read from --secret-file at each request, so the test
can write the one the daemon answered the session PUT with); a bad signature is answered 401.
What it answers depends on the mode, read from --mode-file at each question ("ok" without one):

  ok       200 {"url": the request's URL + expires=E&token=T, "headers": {"X-Upload-Token": H},
           "expires_at"} where T = HMAC(key, "METHOD path E") and H = HMAC(key, "header E"),
           valid --lifetime seconds; with --s3, a presigned S3 URL (boto3, SigV4, ExpiresIn
           --lifetime) for the step instead (create/part/complete/resume/abort)
  badjson  200 with a body that is not JSON
  nourl    200 {"expires_at": …} (JSON without url)
  outside  200 with a URL on --outside-host
  hang     answers nothing for 30 s, then 200 ok
  5xx      503
  4xx      403

Every other request is the sink: accepted (201, the body stored under --files) only with a valid,
unexpired token in the query and the matching X-Upload-Token header, else 403. Each question
and each upload is a JSON line in --log (the tokens handed out included, for the test to grep).
"""
import argparse, hashlib, hmac, json, os, threading, time, urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

KEY = os.urandom(32)


def token(message):
    return hmac.new(KEY, message.encode(), hashlib.sha256).hexdigest()


def rfc3339(seconds):
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--mode-file", default=None)
    parser.add_argument("--lifetime", type=float, default=3)
    parser.add_argument("--files", default=None)
    parser.add_argument("--s3", default=None, help="the S3 server's credentials file: presign with boto3")
    parser.add_argument("--outside-host", default="127.0.0.2")
    args = parser.parse_args()
    lock = threading.Lock()

    def log(entry):
        with lock, open(args.log, "a") as out:
            out.write(json.dumps(entry) + "\n")

    def presign(question):
        import boto3
        from botocore.config import Config
        creds = json.load(open(args.s3))
        url = urllib.parse.urlsplit(question["request"]["url"])
        bucket, _, key = url.path.lstrip("/").partition("/")
        client = boto3.client("s3", endpoint_url=f"{url.scheme}://{url.netloc}", region_name=creds["region"],
                              aws_access_key_id=creds["access_key_id"], aws_secret_access_key=creds["secret_access_key"],
                              config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
        params = {"Bucket": bucket, "Key": urllib.parse.unquote(key)}
        if question.get("upload_id"):
            params["UploadId"] = question["upload_id"]
        step = question["step"]
        if step == "part":
            params["PartNumber"] = question["part_number"]
        operation = {"create": "create_multipart_upload", "part": "upload_part", "complete": "complete_multipart_upload",
                     "resume": "list_parts", "abort": "abort_multipart_upload"}[step]
        return client.generate_presigned_url(operation, Params=params, ExpiresIn=int(args.lifetime))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def answer(self, status, body=b"", headers=()):
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def body(self):
            length = int(self.headers.get("Content-Length") or 0)
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(length)

        def do_POST(self):
            if self.path == "/sign":
                return self.sign()
            self.sink()

        def sign(self):
            body = self.body()
            asked = time.time()
            with open(args.secret_file) as f:
                secret = f.read().strip()
            try:
                question = Webhook(secret).verify(body, {k.lower(): v for k, v in self.headers.items()})
            except Exception as error:
                log({"sign": True, "verified": False, "error": str(error)})
                return self.answer(401)
            mode = "ok"
            if args.mode_file and os.path.exists(args.mode_file):
                with open(args.mode_file) as f:
                    mode = f.read().strip() or "ok"
            entry = {"sign": True, "verified": True, "at": asked, "mode": mode, "step": question.get("step"),
                     "part_number": question.get("part_number"), "upload_id": question.get("upload_id"),
                     "task": question.get("task"), "request": question.get("request")}
            if mode == "hang":
                log(entry)
                time.sleep(30)
                mode = "ok"
            if mode == "5xx":
                log(entry)
                return self.answer(503)
            if mode == "4xx":
                log(entry)
                return self.answer(403, b'{"error": "not yours"}', [("Content-Type", "application/json")])
            if mode == "badjson":
                log(entry)
                return self.answer(200, b"<html>not json", [("Content-Type", "application/json")])
            expires = time.time() + args.lifetime
            if mode == "nourl":
                log(entry)
                return self.answer(200, json.dumps({"expires_at": rfc3339(expires)}).encode())
            request = question["request"]
            if args.s3:
                url = presign(question)
                headers = {}
                entry["token"] = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("X-Amz-Signature", [""])[0]
            else:
                target = urllib.parse.urlsplit(request["url"])
                if mode == "outside":
                    target = target._replace(netloc=f"{args.outside_host}:{target.port}")
                mark = f"{int(expires)}"
                query_token = token(f"{request['method']} {target.path} {mark}")
                header_token = token(f"header {mark}")
                query = (target.query + "&" if target.query else "") + f"expires={mark}&token={query_token}"
                url = urllib.parse.urlunsplit(target._replace(query=query))
                headers = {"X-Upload-Token": header_token}
                entry["token"], entry["header"] = query_token, header_token
            entry["expires_at"] = expires
            log(entry)
            self.answer(200, json.dumps({"url": url, "headers": headers, "expires_at": rfc3339(expires)}).encode(),
                        [("Content-Type", "application/json")])

        def sink(self):
            body = self.body()
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            mark = query.get("expires", [""])[0]
            given = query.get("token", [""])[0]
            reason = None
            if not mark or not given:
                reason = "no token"
            elif not hmac.compare_digest(given, token(f"{self.command} {url.path} {mark}")):
                reason = "bad token"
            elif not hmac.compare_digest(self.headers.get("X-Upload-Token", ""), token(f"header {mark}")):
                reason = "bad header"
            elif int(mark) < time.time():
                reason = "expired"
            log({"sink": True, "method": self.command, "path": url.path, "at": time.time(), "accepted": reason is None,
                 "reason": reason, "length": len(body)})
            if reason:
                return self.answer(403, reason.encode())
            if args.files:
                name = os.path.join(args.files, os.path.basename(url.path))
                with open(name, "wb") as out:
                    out.write(body)
            self.answer(201, b'{"ok": true}', [("Content-Type", "application/json")])

        do_PUT = do_PATCH = sink

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
