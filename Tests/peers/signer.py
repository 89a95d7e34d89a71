#!/usr/bin/env python3
"""A session's signer for tests (docs/credentials.md), with a sink that checks what it signed.

  signer.py --port P --secret-file FILE --log FILE [--mode-file FILE] [--lifetime S] [--files DIR]
            [--s3 CREDENTIALS.json] [--outside-host HOST] [--s3-errors]

POST /sign: the daemon's question, whose Standard Webhook signature is checked with the
`standardwebhooks` package (the secret is read from --secret-file at each request, so the test
can write the one the daemon answered the session PUT with); a bad signature is answered 401.
What it answers depends on the mode, read from --mode-file at each question ("ok" without one):

  ok       200 {"url": the request's URL + expires=E&token=T, "headers": {"X-Upload-Token": H},
           "expires_at"} where T = HMAC(key, "METHOD path E") and H = HMAC(key, "header E"),
           valid --lifetime seconds; with --s3, a presigned S3 URL (boto3, SigV4, ExpiresIn
           --lifetime) for the step instead (create/part/complete/resume/abort)
  expiredfirst  the first answer in this mode as ok, but with E already past while its
           expires_at claims --lifetime seconds (so the daemon keeps it and the sink finds it
           expired); later answers as ok
  mismatch as ok, and the sink answers every request 403 with S3's SignatureDoesNotMatch,
           repeating the token (SignatureProvided), the query (CanonicalRequest, XML-escaped)
           and the X-Upload-Token header in its body, and the query in an X-Echo-Query header
  badjson  200 with a body that is not JSON
  nourl    200 {"expires_at": …} (JSON without url)
  outside  200 with a URL on --outside-host
  hang     answers nothing for 30 s, then 200 ok
  5xx      503
  4xx      403

Every other request is the sink: accepted (201, the body stored under --files) only with a valid,
unexpired token in the query and the matching X-Upload-Token header, else 403 (with --s3-errors,
an expired token is answered as S3 does: AccessDenied, "Request has expired"). A GET of
/download/NAME answers the file --files/NAME under the same rule. Each question and each request
to the sink is a JSON line in --log (the tokens handed out included, for the test to grep).
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


def mismatch(method, url, given, header):
    """S3's SignatureDoesNotMatch, which repeats what it was given: the signature, the canonical
    request (its query XML-escaped) and its bytes in hex."""
    canonical = f"{method}\n{url.path}\n{url.query}\nx-upload-token:{header}\n\nx-upload-token\nUNSIGNED-PAYLOAD"
    escaped = canonical.replace("&", "&amp;")
    return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code>"
            "<Message>The request signature we calculated does not match the signature you provided.</Message>"
            f"<SignatureProvided>{given}</SignatureProvided><CanonicalRequest>{escaped}</CanonicalRequest>"
            f"<CanonicalRequestBytes>{' '.join(f'{b:02x}' for b in canonical.encode())}</CanonicalRequestBytes>"
            "<RequestId>4442587FB7D0A2F9</RequestId></Error>").encode()


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
    parser.add_argument("--s3-errors", action="store_true", help="answer an expired token as S3 does")
    args = parser.parse_args()
    lock = threading.Lock()
    handed_expired = []

    def current_mode():
        if args.mode_file and os.path.exists(args.mode_file):
            with open(args.mode_file) as f:
                return f.read().strip() or "ok"
        return "ok"

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
            mode = current_mode()
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
                with lock:
                    if mode == "expiredfirst" and not handed_expired:
                        handed_expired.append(True)
                        mark = f"{int(time.time()) - 5}"
                        entry["expired_token"] = True
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

        def do_GET(self):
            self.sink()

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
            if current_mode() == "mismatch":
                reason = "signature does not match"
            log({"sink": True, "method": self.command, "path": url.path, "at": time.time(), "accepted": reason is None,
                 "reason": reason, "length": len(body)})
            if reason == "signature does not match":
                return self.answer(403, mismatch(self.command, url, given, self.headers.get("X-Upload-Token", "")),
                                   [("Content-Type", "application/xml"), ("X-Echo-Query", url.query)])
            if reason == "expired" and args.s3_errors:
                return self.answer(403, b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code>"
                                        b"<Message>Request has expired</Message></Error>",
                                   [("Content-Type", "application/xml")])
            if reason:
                return self.answer(403, reason.encode())
            if self.command == "GET":
                if not args.files or not url.path.startswith("/download/"):
                    return self.answer(404)
                try:
                    with open(os.path.join(args.files, os.path.basename(url.path)), "rb") as source:
                        data = source.read()
                except OSError:
                    return self.answer(404)
                return self.answer(200, data, [("Content-Type", "application/octet-stream")])
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
