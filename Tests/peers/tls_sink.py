#!/usr/bin/env python3
"""An https sink for tests: answers 201 to PUT and POST after reading the body, with the given
certificate (self-signed in tests, so a client must be told to trust it).

  tls_sink.py --port P --cert CERT --key KEY
"""
import argparse, http.server, ssl


class Handler(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(201)
        self.send_header("content-length", "0")
        self.end_headers()

    do_POST = do_PUT

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
