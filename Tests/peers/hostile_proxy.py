#!/usr/bin/env python3
"""An HTTP proxy on 127.0.0.1 that lies: each request goes to the real peer behind it, and the
real answer comes back mutated, at random (seeded), as a hostile or broken server would answer.

  hostile_proxy.py --port P --target PORT --seed S --rate R --log FILE [--stall SECONDS]

One request per connection (the answer says Connection: close). The request is forwarded as it
came (Expect: 100-continue is answered here); the peer's answer is read whole, its 1xx answers
kept, its body de-chunked. Then, with probability R, one mutation from MUTATIONS is applied
before the answer goes back; the peer has acted on the request either way, so the next request
finds it where it really is. Every answer is logged as a JSON line: method, path, status, the
mutation (null: passed as it was).
"""
import argparse, json, random, socket, threading, time

LOCK = threading.Lock()

MUTATIONS = [
    "duplicate_header", "negative_offset", "offset_backwards", "offset_past_size", "content_range_shift",
    "range_past_size", "location_other_scheme", "truncate_body", "oversize_body", "flood_104",
    "endless_body", "broken_header_line", "garbage_status", "drop", "status_swap", "stall", "huge_header",
]


def read_head(sock, buffer):
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            return None, buffer
        buffer += data
        if len(buffer) > 1 << 20:
            return None, buffer
    head, rest = buffer.split(b"\r\n\r\n", 1)
    return head.decode("latin-1"), rest


def headers_of(lines):
    out = []
    for line in lines:
        if ":" in line:
            name, value = line.split(":", 1)
            out.append((name.strip(), value.strip()))
    return out


def find(headers, name):
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def read_body(sock, rest, headers, until_close):
    """The body after the head: Content-Length, chunked, or (answers only) up to the close."""
    if (find(headers, "transfer-encoding") or "").lower() == "chunked":
        body, buffer = b"", rest
        while True:
            while b"\r\n" not in buffer:
                data = sock.recv(65536)
                if not data:
                    return body
                buffer += data
            size_line, buffer = buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            while len(buffer) < size + 2:
                data = sock.recv(65536)
                if not data:
                    return body + buffer[:size]
                buffer += data
            if size == 0:
                # Trailers up to the empty line.
                while not buffer.startswith(b"\r\n") and b"\r\n\r\n" not in buffer:
                    data = sock.recv(65536)
                    if not data:
                        break
                    buffer += data
                return body
            body += buffer[:size]
            buffer = buffer[size + 2:]
    length = find(headers, "content-length")
    if length is not None:
        length = int(length)
        body = rest
        while len(body) < length:
            data = sock.recv(min(1 << 20, length - len(body)))
            if not data:
                break
            body += data
        return body[:length]
    if not until_close:
        return rest
    body = rest
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return body
        body += data


def number(value):
    try:
        return int(value.split(";")[0].strip())
    except (ValueError, AttributeError):
        return None


def mutate(kind, rng, status, headers, body):
    """The answer as the lie makes it: (status line, header lines, informational block, body, how it ends)."""
    reason = "Mutated"
    lines = [f"{k}: {v}" for k, v in headers]
    informational = b""
    ending = "close"
    offset = number(find(headers, "upload-offset"))

    def replaced(name, value):
        return [l for l in lines if not l.lower().startswith(name.lower() + ":")] + [f"{name}: {value}"]

    if kind == "duplicate_header":
        name, value = rng.choice(headers) if headers else ("Upload-Offset", "0")
        lines.append(f"{name}: {rng.choice(['-5', '0', '999999999999', 'garbage', value + value])}")
    elif kind == "negative_offset":
        lines = replaced("Upload-Offset", -5)
    elif kind == "offset_backwards":
        lines = replaced("Upload-Offset", max(0, (offset or 0) - rng.randint(1, 1 << 20)))
    elif kind == "offset_past_size":
        lines = replaced("Upload-Offset", (offset or 0) + rng.randint(1, 1 << 40))
    elif kind == "content_range_shift":
        first = rng.randint(-10, 1 << 20)
        total = rng.choice(["*", str(rng.randint(0, 1 << 30))])
        lines = replaced("Content-Range", f"bytes {first}-{first + rng.randint(-5, 1 << 20)}/{total}")
    elif kind == "range_past_size":
        lines = replaced("Range", f"bytes=0-{rng.choice([-1, 1 << 62, rng.randint(0, 1 << 30)])}")
    elif kind == "location_other_scheme":
        lines = replaced("Location", rng.choice(["ftp://127.0.0.1/x", "file:///etc/passwd", "gopher://h/1", "//evil/x", "javascript:1"]))
    elif kind == "truncate_body":
        body = body[: rng.randint(0, max(0, len(body) - 1))] if body else b"<Error><Code>Internal"
    elif kind == "oversize_body":
        filler = b"<Part><PartNumber>1</PartNumber><ETag>\"x\"</ETag></Part>" * rng.randint(1000, 40000)
        body = (body[:-20] if body else b"<Error>") + filler + (body[-20:] if body else b"</Error>")
    elif kind == "flood_104":
        count = rng.randint(100, 3000)
        informational = b"".join(
            f"HTTP/1.1 104 Upload Resumption Supported\r\nLocation: /flood/{i}\r\nUpload-Draft-Interop-Version: 6\r\n\r\n".encode()
            for i in range(count))
    elif kind == "endless_body":
        ending = "endless"
    elif kind == "broken_header_line":
        lines.insert(rng.randint(0, len(lines)), rng.choice(["Upload-Offset 100", ": empty-name", "X-Bin: \x01\x7f\xff", "no colon at all"]))
    elif kind == "garbage_status":
        return rng.choice(["HTTP/1.1 abc Nope", "HTTP/1.1 2000 Big", "HTTP/9 200", "garbage", "HTTP/1.1 -1 Neg"]), lines, b"", body, ending
    elif kind == "status_swap":
        # Errors only: an error answered as a success is a lie no client can see through.
        status = rng.choice([308, 400, 404, 409, 410, 416, 460, 500, 503])
    elif kind == "huge_header":
        lines.append("X-Huge: " + "a" * rng.randint(10000, 200000))
    return f"HTTP/1.1 {status} {reason}", lines, informational, body, ending


def serve(client, args, rng_seed):
    rng = random.Random(rng_seed)
    upstream = None
    try:
        client.settimeout(60)
        head, rest = read_head(client, b"")
        if head is None:
            return
        request_line, *lines = head.split("\r\n")
        method = request_line.split(" ")[0]
        headers = headers_of(lines)
        if (find(headers, "expect") or "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = read_body(client, rest, headers, until_close=False)
        forwarded = [l for l in lines if l.split(":", 1)[0].strip().lower() not in
                     ("expect", "connection", "transfer-encoding", "content-length", "keep-alive")]
        forwarded += ["Connection: close"]
        if body or method in ("PUT", "POST", "PATCH"):
            forwarded.append(f"Content-Length: {len(body)}")
        upstream = socket.create_connection(("127.0.0.1", args.target), timeout=60)
        upstream.sendall(("\r\n".join([request_line] + forwarded) + "\r\n\r\n").encode("latin-1") + body)
        informational_blocks = b""
        buffer = b""
        while True:
            answer, buffer = read_head(upstream, buffer)
            if answer is None:
                return
            status_line, *answer_lines = answer.split("\r\n")
            status = int(status_line.split(" ")[1])
            if 100 <= status < 200:
                informational_blocks += answer.encode("latin-1") + b"\r\n\r\n"
                continue
            break
        answer_headers = headers_of(answer_lines)
        no_body = method == "HEAD" or status in (204, 304)
        answer_body = b"" if no_body else read_body(upstream, buffer, answer_headers, until_close=True)
        kept = [(k, v) for k, v in answer_headers if k.lower() not in ("content-length", "transfer-encoding", "connection")]
        kind = rng.choice(MUTATIONS) if rng.random() < args.rate else None
        if kind is None:
            status_text = status_line
            out_lines = [f"{k}: {v}" for k, v in kept]
            informational, out_body, ending = b"", answer_body, "close"
        else:
            status_text, out_lines, informational, out_body, ending = mutate(kind, rng, status, kept, answer_body)
        with LOCK, open(args.log, "a") as log:
            log.write(json.dumps({"method": method, "path": request_line.split(" ")[1] if " " in request_line else "",
                                  "status": status, "mutation": kind}) + "\n")
        if kind == "drop":
            return
        if kind == "stall":
            time.sleep(args.stall)
        length = len(out_body) + (1 << 30 if ending == "endless" else 0)
        out_lines += [f"Content-Length: {length}" if not no_body or ending == "endless" else f"Content-Length: {len(out_body)}",
                      "Connection: close"]
        payload = informational_blocks + informational
        payload += (status_text + "\r\n" + "\r\n".join(out_lines) + "\r\n\r\n").encode("latin-1", "replace")
        if not no_body or ending == "endless":
            payload += out_body
        client.sendall(payload)
        if ending == "endless":
            # A body that never ends: a byte a second until the client gives up.
            deadline = time.monotonic() + args.stall
            while time.monotonic() < deadline:
                client.sendall(b"x")
                time.sleep(1)
    except (OSError, ValueError, IndexError):
        pass
    finally:
        for end in (client, upstream):
            if end is not None:
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument("--stall", type=float, default=30)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    open(args.log, "a").close()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(128)
    seeds = random.Random(args.seed)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client, args, seeds.getrandbits(64)), daemon=True).start()


if __name__ == "__main__":
    main()
