#!/usr/bin/env python3
"""A file server for download tests that can misbehave on cue. It serves the files under
--root with a strong ETag and Last-Modified, honours Range and If-Range like a correct server,
and logs every request as a JSON line (method, path, range, if_range, status, bytes sent).

  download_server.py --port P --root DIR --log FILE [--rate BYTES_PER_S]
      [--drop-after N --drop-times K]   the first K bodies stop after N bytes (connection closed)
      [--ignore-range]                  answer every request 200 with the whole file
      [--ignore-if-range]               answer a Range request 206 even when If-Range is stale
      [--no-length]                     send bodies without Content-Length, ended by closing
      [--replace-on-drop NAME=PATH]     when a body is dropped, first move PATH over the served
                                        NAME (atomically), so the retry finds the file changed
The ETag follows the file's content, so a file replaced between attempts gets a new one.
"""
import argparse, hashlib, http.server, json, os, threading, time
from email.utils import formatdate

LOCK = threading.Lock()
DROPS = [0]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log(self, status, sent, first=None):
        entry = {"method": self.command, "path": self.path, "range": self.headers.get("range"),
                 "if_range": self.headers.get("if-range"), "status": status, "bytes": sent, "first": first}
        with LOCK, open(ARGS.log, "a") as out:
            out.write(json.dumps(entry) + "\n")

    def do_GET(self):
        path = os.path.join(ARGS.root, self.path.lstrip("/").split("?")[0])
        if not os.path.isfile(path):
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()
            self.log(404, 0)
            return
        with open(path, "rb") as source:
            data = source.read()
        size = len(data)
        modified = formatdate(os.stat(path).st_mtime, usegmt=True)
        etag = '"%s"' % hashlib.sha256(data).hexdigest()[:16]
        first, status = 0, 200
        wanted = self.headers.get("range")
        if wanted and not ARGS.ignore_range and wanted.startswith("bytes=") and wanted.endswith("-"):
            validator = self.headers.get("if-range")
            fresh = validator is None or validator in (etag, modified) or ARGS.ignore_if_range
            if fresh:
                first = int(wanted[6:-1])
                if first >= size:
                    self.send_response(416)
                    self.send_header("content-range", "bytes */%d" % size)
                    self.send_header("etag", etag)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    self.log(416, 0)
                    return
                status = 206
        body = data[first:]
        self.send_response(status)
        if ARGS.no_length:
            self.send_header("connection", "close")
            self.close_connection = True
        else:
            self.send_header("content-length", str(len(body)))
        self.send_header("etag", etag)
        self.send_header("last-modified", modified)
        self.send_header("accept-ranges", "none" if ARGS.ignore_range else "bytes")
        if status == 206:
            self.send_header("content-range", "bytes %d-%d/%d" % (first, size - 1, size))
        self.end_headers()
        limit = len(body)
        with LOCK:
            if DROPS[0] < ARGS.drop_times:
                DROPS[0] += 1
                limit = min(limit, ARGS.drop_after)
        sent = 0
        try:
            while sent < limit:
                piece = body[sent:min(limit, sent + 65536)]
                self.wfile.write(piece)
                sent += len(piece)
                if ARGS.rate:
                    time.sleep(len(piece) / ARGS.rate)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if sent < len(body) and ARGS.replace_on_drop:
            name, _, replacement = ARGS.replace_on_drop.partition("=")
            if os.path.exists(replacement):
                os.replace(replacement, os.path.join(ARGS.root, name))
        self.log(status, sent, first)
        if sent < len(body):
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(2)
            except OSError:
                pass

    def log_message(self, *args):
        pass


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--rate", type=float, default=0)
    parser.add_argument("--drop-after", type=int, default=0)
    parser.add_argument("--drop-times", type=int, default=0)
    parser.add_argument("--ignore-range", action="store_true")
    parser.add_argument("--ignore-if-range", action="store_true")
    parser.add_argument("--no-length", action="store_true")
    parser.add_argument("--replace-on-drop")
    ARGS = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
