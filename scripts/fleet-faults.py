#!/usr/bin/env python3
"""The fleet's fault campaign (`make fleet-faults`, docs/fleet.md "The fault campaign"): three
backhauld nodes (short leases) on one real PostgreSQL under a mixed workload, and one fault a
round, drawn from a printed seed. Then a checker reads the history.

  scripts/fleet-faults.py [--rounds N] [--seed S] [--lease S] [--binary PATH] [--keep]

The workload, from a thread of its own while the faults go on: batches and single POSTs (with
idempotency keys, repeated on another node when the answer is lost; some without keys, not
repeated), uploads of every protocol (raw and multipart and chunked to the campaign's own sink;
raw to nginx; tus and auto to tuspyserver; s3 to moto; ietf to Apple's server when it is built)
through the campaign's recording proxy, PATCHes, cancels, and policy changes (`bandwidth_limit`,
which also keeps transfers long enough for the faults to meet them).

The faults, one a round: kill -9 of a node (started again), SIGSTOP of a node past its lease (then
SIGCONT), a node's database backends SIGSTOPped past its lease, the LISTEN connections terminated,
a connection dropped right after its COMMIT (the third node reaches PostgreSQL through a small
proxy here that can do that), PostgreSQL restarted with `-m immediate`.

The checker holds when nothing answered 2xx is lost (every such task ends completed, or cancelled
after a cancel answered 2xx, and the sink holds its bytes where it can tell), no task completes
twice (two attempts ending `completed`, or one request stored as two tasks), no two requests of
one task overlap in the sinks' logs (from the first body byte received to the last), and every
policy change is in force on every running node within 2 s of its answer. It prints
`fleet faults: N rounds, L lost, D done twice, O overlaps` and exits 1 unless all are 0 (and the
policy held). Every wait is bounded; everything listens on 127.0.0.1.
"""
import argparse, hashlib, http.client, http.server, json, os, random, select, shutil, signal, socket, socketserver
import subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import common  # noqa: E402  (run, run_nginx, dav_location)
from benchlib.common import ROOT, free_port, spawn, stop, wait_port  # noqa: E402
from benchlib.postgres import Postgres  # noqa: E402

FAULTS = ["kill", "pause", "stall", "listen", "commit", "restart"]
FINAL = ("completed", "failed", "cancelled")


def now():
    return time.monotonic()


# The sinks' history: one line per request that carried body bytes.


class History:
    """Every request body a sink or the proxy received, by task tag: (first byte, last byte, peer
    port, bytes). Thread-safe."""

    def __init__(self, path):
        self.lock = threading.Lock()
        self.out = open(path, "w")
        self.spans = {}

    def record(self, tag, first, last, size, what):
        if tag is None or first is None:
            return
        with self.lock:
            self.spans.setdefault(tag, []).append((first, last, size, what))
            self.out.write(json.dumps({"tag": tag, "first": first, "last": last, "bytes": size, "what": what}) + "\n")
            self.out.flush()

    def overlaps(self):
        """Pairs of one task's requests whose byte spans overlap."""
        found = []
        for tag, spans in self.spans.items():
            spans = sorted(spans)
            latest = None
            for span in spans:
                if latest and span[0] < latest[1]:
                    found.append((tag, latest, span))
                if not latest or span[1] > latest[1]:
                    latest = span
        return found


def read_body(handler, on_block):
    """Reads the request's body (Content-Length or chunked) and hands each block to `on_block`;
    returns (first byte time, last byte time, bytes, complete)."""
    first = last = None
    size = 0
    complete = True
    chunked = "chunked" in handler.headers.get("Transfer-Encoding", "").lower()
    remaining = int(handler.headers.get("Content-Length", "0") or 0)
    while True:
        if chunked:
            line = handler.rfile.readline()
            if not line:
                complete = False
                break
            remaining = int(line.split(b";")[0].strip() or b"0", 16)
            if remaining == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
        while remaining > 0:
            try:
                block = handler.rfile.read1(min(remaining, 1 << 16))
            except OSError:
                block = b""
            if not block:
                complete = False
                break
            first = first or now()
            last = now()
            size += len(block)
            remaining -= len(block)
            on_block(block)
        if not complete or not chunked:
            break
        handler.rfile.readline()
    return first, last, size, complete


class Server(http.server.ThreadingHTTPServer):
    """A sink's or proxy's server: a peer cut off mid-request (a node killed) is no error here."""
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def tag(self):
        return self.headers.get("X-Campaign-Task")

    def answer(self, status, headers=(), body=b""):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Sink:
    """raw (`/raw/TAG`), multipart (`/multipart/TAG`) and chunked (`/chunked/TAG`, Content-Range
    pieces assembled at their offsets, 308 + Range until the last): keeps the SHA-256 of each
    task's last complete body (raw, chunked) and logs every body's span."""

    def __init__(self, history):
        self.history = history
        self.lock = threading.Lock()
        self.complete = {}
        self.assembled = {}
        sink = self

        class SinkHandler(Handler):
            def do_PUT(self):
                kind = self.path.split("/")[1]
                if kind == "chunked":
                    return sink.chunk(self)
                digest = hashlib.sha256()
                if not sink.received(self, digest.update, f"{self.command} {self.path}"):
                    return
                with sink.lock:
                    sink.complete.setdefault(self.path, []).append(digest.hexdigest())
                self.answer(201)

            do_POST = do_PUT

        self.server = Server(("127.0.0.1", 0), SinkHandler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def chunk(self, handler):
        spec, total = handler.headers.get("Content-Range", "bytes */0").removeprefix("bytes ").split("/")
        total = int(total)
        blocks = []
        if not self.received(handler, blocks.append, f"PUT {handler.path} {spec}"):
            return
        with self.lock:
            held = self.assembled.setdefault(handler.path, bytearray())
            if spec != "*":
                start = int(spec.split("-")[0])
                if start <= len(held):
                    data = b"".join(blocks)
                    held[start:start + len(data)] = data
            if len(held) >= total:
                # The last piece completes the upload; a query (`*`) of a complete one says so too.
                if spec != "*":
                    self.complete.setdefault(handler.path, []).append(hashlib.sha256(bytes(held[:total])).hexdigest())
                return handler.answer(201)
            held_now = len(held)
        handler.answer(308, [("Range", f"bytes=0-{held_now - 1}")] if held_now else [])

    def received(self, handler, on_block, what):
        """Reads the body into `on_block` and logs its span; false (the connection to be closed,
        nothing answered) when it was cut short."""
        first, last, size, complete = read_body(handler, on_block)
        self.history.record(handler.tag(), first, last, size, what)
        handler.close_connection = not complete
        return complete

    def holds(self, path, digest):
        with self.lock:
            return digest in self.complete.get(path, [])


class Recorder:
    """An HTTP proxy in front of a peer (nginx, tuspyserver, moto, Apple's server) that logs each
    request body's span by its task's tag. Headers go through as they came (the Host a signature
    covers included); a body cut short cuts the upstream request short too."""

    def __init__(self, history, upstream_port):
        recorder = self
        self.history = history

        class ProxyHandler(Handler):
            def relay(self):
                upstream = socket.create_connection(("127.0.0.1", upstream_port), timeout=60)
                try:
                    head = f"{self.command} {self.path} HTTP/1.1\r\n"
                    for name, value in self.headers.items():
                        if name.lower() not in ("connection", "expect", "transfer-encoding", "keep-alive"):
                            head += f"{name}: {value}\r\n"
                    chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
                    if chunked:
                        # Forwarded whole (a short body is only possible for trailers' requests).
                        blocks = []
                        first, last, size, complete = read_body(self, blocks.append)
                        body = b"".join(blocks)
                        head += f"Content-Length: {len(body)}\r\n"
                        upstream.sendall((head + "Connection: close\r\n\r\n").encode() + body)
                    else:
                        upstream.sendall((head + "Connection: close\r\n\r\n").encode())
                        first, last, size, complete = read_body(self, upstream.sendall)
                    recorder.history.record(self.tag(), first, last, size, f"{self.command} {self.path}")
                    if not complete:
                        self.close_connection = True
                        return
                    status, headers, body = recorder.response(upstream.makefile("rb"), self)
                    self.send_response_only(status)
                    for name, value in headers:
                        if name.lower() not in ("connection", "transfer-encoding", "content-length", "keep-alive"):
                            self.send_header(name, value)
                    if self.command != "HEAD" or "content-length" not in (name.lower() for name, _ in headers):
                        self.send_header("Content-Length", str(len(body)))
                    else:
                        self.send_header("Content-Length", dict((n.lower(), v) for n, v in headers)["content-length"])
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(body)
                except (OSError, ValueError, IndexError):
                    self.close_connection = True
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_PATCH = do_HEAD = do_DELETE = do_OPTIONS = relay

        self.server = Server(("127.0.0.1", 0), ProxyHandler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


    @staticmethod
    def response(reader, handler):
        """The peer's final answer (status, headers, body) to a request sent with `Connection:
        close`; informational answers (an IETF `104`) are passed on to the client as they come."""
        while True:
            status_line = reader.readline()
            status = int(status_line.split()[1])
            lines = []
            while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
                lines.append(line)
            if 100 <= status < 200:
                handler.wfile.write(status_line + b"".join(lines) + b"\r\n")
                handler.wfile.flush()
                continue
            break
        headers = [tuple(part.strip() for part in line.decode("latin-1").split(":", 1)) for line in lines]
        fields = {name.lower(): value for name, value in headers}
        if handler.command == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            body = b""
            while (size := int(reader.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                body += reader.read(size)
                reader.readline()
        elif "content-length" in fields:
            body = reader.read(int(fields["content-length"]))
        else:
            body = reader.read()
        return status, headers, body


class CommitDropper:
    """A TCP proxy between one node and PostgreSQL. Armed, it drops the first connection that
    sends a COMMIT (simple or extended protocol) right after forwarding it, once the server had
    50 ms to commit: the server committed, the node never hears."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.armed = threading.Event()
        self.dropped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def arm(self):
        self.armed.set()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self.pipe, args=(client,), daemon=True).start()

    def pipe(self, client):
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            client.close()
            return
        pending = b""
        typed = False
        sockets = [client, server]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], 60)
                if client in readable:
                    data = client.recv(1 << 16)
                    if not data:
                        break
                    server.sendall(data)
                    pending += data
                    commit, pending, typed = self.scan(pending, typed)
                    if commit and self.armed.is_set():
                        self.armed.clear()
                        time.sleep(0.05)
                        self.dropped += 1
                        break
                if server in readable:
                    data = server.recv(1 << 16)
                    if not data:
                        break
                    client.sendall(data)
        except OSError:
            pass
        finally:
            for end in sockets:
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    @staticmethod
    def scan(buffer, typed):
        """Walks the frontend messages in `buffer`: whether one was a COMMIT, what is left of a
        message not whole yet, and whether the startup is behind (typed messages)."""
        commit = False
        while True:
            if not typed:
                if len(buffer) < 8:
                    return commit, buffer, typed
                length = int.from_bytes(buffer[:4], "big")
                if len(buffer) < length:
                    return commit, buffer, typed
                code = int.from_bytes(buffer[4:8], "big")
                typed = code == 196608  # a StartupMessage; SSLRequest and GSSENCRequest come before it
                buffer = buffer[length:]
                continue
            if len(buffer) < 5:
                return commit, buffer, typed
            kind, length = buffer[:1], int.from_bytes(buffer[1:5], "big")
            if len(buffer) < 1 + length:
                return commit, buffer, typed
            body = buffer[5:1 + length]
            if kind == b"Q" and body.strip(b"\0 ;").upper() == b"COMMIT":
                commit = True
            if kind == b"P" and body.split(b"\0")[1].strip(b" ;").upper() == b"COMMIT":
                commit = True
            buffer = buffer[1 + length:]


# The database and the nodes.


class Database(Postgres):
    def sql(self, query):
        result = subprocess.run([f"{self.bin}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "backhaul", "-d",
                                 "fleet", "-AtXqc", query], capture_output=True, text=True, timeout=20)
        return result.stdout.strip().splitlines()

    def restart(self, mode):
        common.run(self.as_owner + [f"{self.bin}/pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "restart"],
                  timeout=90, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Node:
    def __init__(self, index, binary, url, work, data, lease):
        self.name = f"n{index}"
        self.port = free_port()
        self.command = [binary, "--listen", f"127.0.0.1:{self.port}", "--state-dir", f"{work}/state-{self.name}",
                        "--state", url, "--node-id", self.name, "--lease-seconds", str(lease), "--shared-root", data,
                        "--allow-root", data]
        self.log = open(f"{work}/{self.name}.log", "a")
        self.process = None
        self.stopped = False

    def start(self):
        self.process = spawn(self.command, stdout=self.log, stderr=self.log)
        self.stopped = False
        wait_port(self.port, timeout=60)

    @property
    def up(self):
        return self.process is not None and self.process.poll() is None and not self.stopped

    def backend_pids(self, db):
        """Its backends: pg_stat_activity's client_port matched against the node's sockets."""
        lines = subprocess.run(["ss", "-tnpH", "dst", f"127.0.0.1:{db.port}"], capture_output=True, text=True).stdout
        ports = [line.split()[3].rsplit(":", 1)[1] for line in lines.splitlines() if f"pid={self.process.pid}," in line]
        if not ports:
            return []
        return [int(pid) for pid in db.sql(f"SELECT pid FROM pg_stat_activity WHERE client_port IN ({','.join(ports)})")]


def call(port, method, path, body=None, timeout=5.0):
    """(status, JSON) or (None, None) when there is no answer in time."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        connection.request(method, path, None if body is None else json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read()
        connection.close()
        return response.status, json.loads(text or b"null")
    except (OSError, http.client.HTTPException, ValueError):
        return None, None


class Campaign:
    def __init__(self, args):
        self.args = args
        # The faults and the workload draw from two generators of the seed (their threads'
        # timing still differs from run to run).
        self.random = random.Random(args.seed)
        self.load_random = random.Random(args.seed + 1)
        self.work = tempfile.mkdtemp(prefix="backhaul-fleet-faults-")
        self.data = f"{self.work}/data"
        os.makedirs(self.data)
        if os.geteuid() == 0:
            os.chmod(self.work, 0o755)
        self.history = History(f"{self.work}/spans.jsonl")
        self.tasks = {}  # tag -> {"file", "sha", "target", "ids": set, "acknowledged", "cancelled"}
        self.lock = threading.Lock()
        self.policy_checks = []  # (seconds until every running node showed it, fault before it)
        self.counter = 0
        self.stop_load = threading.Event()
        self.faults = {fault: 0 for fault in FAULTS}
        # The fault in progress (the workload changes no policy meanwhile: a node that cannot
        # reach the database cannot hear it), and the last one with when it ended.
        self.fault_active = threading.Event()
        self.last_fault = (None, 0.0)
        self.rounds = []  # (start, end, kind): what the spans' times are matched against

    # Setup

    def start(self):
        args = self.args
        self.db = Database()
        common.run([f"{self.db.bin}/psql", "-h", "127.0.0.1", "-p", str(self.db.port), "-U", "backhaul", "-d", "postgres",
                   "-qc", "CREATE DATABASE fleet"], timeout=60)
        direct = f"postgres://backhaul@127.0.0.1:{self.db.port}/fleet"
        self.dropper = CommitDropper(self.db.port)
        proxied = f"postgres://backhaul@127.0.0.1:{self.dropper.port}/fleet"
        self.sink = Sink(self.history)
        self.nginx = common.run_nginx(f"{self.work}/nginx", f"""  access_log off;
  server {{ listen 127.0.0.1:{(nginx_port := free_port())}; {common.dav_location(self.work + '/nginx')} }}""",
                                     [nginx_port])
        tus_port = free_port()
        spawn([sys.executable, f"{ROOT}/Tests/peers/tus_server.py", "--port", str(tus_port), "--files",
               f"{self.work}/tus", "--log", f"{self.work}/tus.log"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s3_port = free_port()
        spawn([sys.executable, f"{ROOT}/Tests/peers/s3_server.py", "--port", str(s3_port), "--credentials",
               f"{self.work}/s3.json", "--log", f"{self.work}/s3.log"], stdout=subprocess.DEVNULL,
              stderr=subprocess.DEVNULL)
        self.peers = {"nginx": Recorder(self.history, nginx_port), "tus": Recorder(self.history, tus_port),
                      "s3": Recorder(self.history, s3_port)}
        ietf = os.environ.get("BACKHAUL_IETF_PEER", f"{ROOT}/.build-ietfpeer/debug/IETFPeer")
        if os.access(ietf, os.X_OK):
            ietf_port = free_port()
            os.makedirs(f"{self.work}/ietf")
            spawn([ietf, "--port", str(ietf_port), "--dir", f"{self.work}/ietf", "--log", f"{self.work}/ietf.log"],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(ietf_port)
            self.peers["ietf"] = Recorder(self.history, ietf_port)
        else:
            print(f"(the IETF peer is not built at {ietf}: `make ietf-peer`; ietf uploads left out)")
        wait_port(tus_port, timeout=60)
        deadline = time.time() + 60
        while not os.path.exists(f"{self.work}/s3.json") and time.time() < deadline:
            time.sleep(0.1)
        with open(f"{self.work}/s3.json") as credentials:
            s3 = json.load(credentials)
        self.s3 = {"region": s3["region"], "access_key_id": s3["access_key_id"],
                   "secret_access_key": s3["secret_access_key"]}
        self.bucket = s3["bucket"]
        self.nodes = [Node(index, args.binary, proxied if index == 2 else direct, self.work, self.data, args.lease)
                      for index in range(3)]
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            self.wait_ready(node)
        status, _ = call(self.nodes[0].port, "PUT", "/v1/sessions/campaign", {"configuration": {
            "retry": {"max_attempts": 10000, "initial_backoff": 0.2, "max_backoff": 1},
            "timeout_interval_for_request": 10, "max_connections_per_host": 4}})
        assert status in (200, 201), status
        self.policy = 4 << 20
        call(self.nodes[0].port, "PUT", "/v1/policy", {"bandwidth_limit": self.policy})

    def wait_ready(self, node, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, _ = call(node.port, "GET", "/readyz", timeout=2)
            if status == 200:
                return True
            time.sleep(0.05)
        return False

    # The workload

    def make_task(self, key):
        """A new file and the task that uploads it, by a protocol drawn from `self.load_random`."""
        protocols = ["raw", "multipart", "chunked", "nginx", "tus", "auto", "s3"] + (["ietf"] if "ietf" in self.peers else [])
        protocol = self.load_random.choice(protocols)
        size = self.load_random.choice([4096, 65536, 300_000, 1 << 20, 2 << 20])
        if protocol == "s3" and self.load_random.random() < 0.2:
            size = 6 << 20
        self.counter += 1
        tag = f"t{self.counter}-{key}"
        path = f"{self.data}/{tag}.bin"
        content = self.load_random.randbytes(size)
        with open(path, "wb") as out:
            out.write(content)
        task = {"file": path, "request": {"url": "", "method": "PUT", "headers": {"X-Campaign-Task": tag}},
                "priority": round(self.load_random.random(), 2)}
        sink = f"http://127.0.0.1:{self.sink.port}"
        if protocol == "raw":
            task["request"]["url"] = f"{sink}/raw/{tag}"
        elif protocol == "multipart":
            task["request"].update(url=f"{sink}/multipart/{tag}", method="POST")
            task["upload"] = {"protocol": "multipart", "fields": {"tag": tag}}
        elif protocol == "chunked":
            task["request"]["url"] = f"{sink}/chunked/{tag}"
            task["upload"] = {"protocol": "chunked", "chunk_size": 262144}
        elif protocol == "nginx":
            task["request"]["url"] = f"http://127.0.0.1:{self.peers['nginx'].port}/{tag}"
        elif protocol in ("tus", "auto"):
            task["request"].update(url=f"http://127.0.0.1:{self.peers['tus'].port}/files", method="POST")
            task["upload"] = {"protocol": protocol, "chunk_size": 262144}
        elif protocol == "s3":
            task["request"]["url"] = f"http://127.0.0.1:{self.peers['s3'].port}/{self.bucket}/{tag}"
            task["upload"] = {"protocol": "s3", "chunk_size": 5 << 20}
            task["s3"] = self.s3
        elif protocol == "ietf":
            task["request"].update(url=f"http://127.0.0.1:{self.peers['ietf'].port}/up/{tag}", method="POST")
            task["upload"] = {"protocol": "ietf"}
        with self.lock:
            self.tasks[tag] = {"file": path, "sha": hashlib.sha256(content).hexdigest(), "protocol": protocol,
                               "url": task["request"]["url"], "ids": set(), "acknowledged": False,
                               "cancelled": False}
        return tag, task

    def live_node(self):
        live = [node for node in self.nodes if node.up]
        return self.load_random.choice(live or self.nodes)

    def post(self, tasks, keyed):
        """Posts `tasks` (one, or a batch), repeated on other nodes with the same keys while the
        answer is lost or 5xx; returns whether it was acknowledged."""
        body = tasks[0][1] if len(tasks) == 1 else {"tasks": [task for _, task in tasks]}
        for attempt in range(8 if keyed else 1):
            status, answer = call(self.live_node().port, "POST", "/v1/sessions/campaign/tasks", body, timeout=6)
            if status in (200, 201):
                answered = answer["tasks"] if "tasks" in answer else [answer]
                with self.lock:
                    for (tag, _), task in zip(tasks, answered):
                        self.tasks[tag]["ids"].add(task["id"])
                        self.tasks[tag]["acknowledged"] = True
                return True
            if status is not None and status < 500:
                print(f"  a POST refused {status}: {answer}")
                return False
            time.sleep(0.2)
        return False

    def load(self):
        """The workload's loop, until told to stop."""
        rng = self.load_random
        while not self.stop_load.is_set():
            action = rng.random()
            if action < 0.25:
                count = rng.randint(2, 8)
                tasks = [self.make_task(f"b{index}") for index in range(count)]
                keyed = rng.random() < 0.85
                if keyed:
                    for tag, task in tasks:
                        task["idempotency_key"] = tag
                self.post(tasks, keyed)
            elif action < 0.6:
                tag, task = self.make_task("s")
                keyed = rng.random() < 0.85
                if keyed:
                    task["idempotency_key"] = tag
                self.post([(tag, task)], keyed)
            elif action < 0.8:
                task_id = self.some_task()
                if task_id:
                    call(self.live_node().port, "PATCH", f"/v1/tasks/{task_id}", {"priority": round(rng.random(), 2)})
            elif action < 0.88:
                self.cancel()
            else:
                self.change_policy()
            time.sleep(rng.uniform(0.1, 0.4))

    def some_task(self):
        with self.lock:
            tags = [tag for tag, task in self.tasks.items() if task["ids"]]
            if not tags:
                return None
            return next(iter(self.tasks[self.load_random.choice(tags[-50:])]["ids"]))

    def cancel(self):
        task_id = self.some_task()
        if not task_id:
            return
        status, answer = call(self.live_node().port, "POST", f"/v1/tasks/{task_id}/cancel", {})
        if status in (200, 201) or (status == 409 and answer and answer.get("code") == "conflict"):
            with self.lock:
                for task in self.tasks.values():
                    if task_id in task["ids"]:
                        task["cancelled"] = True

    def change_policy(self, during=None):
        """Sets the bandwidth limit on one running node and waits (at most 5 s) until every other
        running node shows it; records how long that took, and the fault it came during or within
        5 s after."""
        if during is None and self.fault_active.is_set():
            return
        kind, ended = self.last_fault
        after = during or (kind if now() - ended < 5 else None)
        with self.lock:
            self.policy = (4 << 20) if self.policy != (4 << 20) else (6 << 20)
            value = self.policy
        node = self.live_node()
        status, _ = call(node.port, "PUT", "/v1/policy", {"bandwidth_limit": value})
        if status not in (200, 201):
            return
        answered = now()
        waiting = {other for other in self.nodes if other.up and other is not node}
        slow = []  # the nodes that showed it past 2 s
        while waiting and now() - answered < 5:
            for other in list(waiting):
                status, policy = call(other.port, "GET", "/v1/policy", timeout=1)
                if not other.up or (status == 200 and policy.get("bandwidth_limit") == value):
                    waiting.discard(other)
                    if now() - answered > 2:
                        slow.append(other.name)
            time.sleep(0.02)
        with self.lock:
            self.policy_checks.append((now() - answered if not waiting else float("inf"), after,
                                       sorted(other.name for other in waiting) or sorted(slow)))

    # The faults

    def fault(self, kind):
        rng = self.random
        lease = self.args.lease
        past = lease + rng.uniform(0.5, 1.5)
        if kind == "kill":
            node = rng.choice(self.nodes)
            node.process.kill()
            node.process.wait(timeout=10)
            time.sleep(rng.uniform(0, lease))
            node.start()
        elif kind == "pause":
            node = rng.choice([node for node in self.nodes if node.up])
            node.stopped = True
            node.process.send_signal(signal.SIGSTOP)
            time.sleep(past)
            node.process.send_signal(signal.SIGCONT)
            node.stopped = False
        elif kind == "stall":
            # The proxied node's backends are the proxy's: the two direct nodes are stalled.
            node = rng.choice(self.nodes[:2])
            pids = node.backend_pids(self.db)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(past)
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        elif kind == "listen":
            self.db.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'backhauld listen'")
            self.change_policy(during="listen")
        elif kind == "commit":
            self.dropper.arm()
            deadline = now() + 3
            while self.dropper.armed.is_set() and now() < deadline:
                time.sleep(0.02)
            self.dropper.armed.clear()
        elif kind == "restart":
            self.db.restart("immediate")

    def run(self):
        loader = threading.Thread(target=self.load, daemon=True)
        loader.start()
        time.sleep(1)
        for round_index in range(self.args.rounds):
            kind = self.random.choice(FAULTS)
            self.faults[kind] += 1
            started = now()
            self.fault_active.set()
            self.fault(kind)
            for node in self.nodes:
                if node.process.poll() is not None:
                    print(f"  round {round_index + 1}: {node.name} exited ({node.process.returncode}); started again")
                    node.start()
            settle = now() + self.args.lease + 1
            for node in self.nodes:
                self.wait_ready(node, timeout=max(0.1, settle - now()))
            self.last_fault = (kind, now())
            self.rounds.append((started, now(), kind))
            self.fault_active.clear()
            self.change_policy()
            if round_index % 5 == 4:
                print(f"  round {round_index + 1}/{self.args.rounds} ({kind}, {now() - started:.1f} s)", flush=True)
        self.stop_load.set()
        loader.join(timeout=60)

    # The checker

    def drain(self, timeout):
        """Waits until every acknowledged task is final; returns the tasks as the fleet shows them."""
        deadline = time.time() + timeout
        node = self.nodes[0]
        while time.time() < deadline:
            tasks = self.listed(node)
            if tasks is not None and all(task["state"] in FINAL for task in tasks.values()):
                return tasks
            time.sleep(0.5)
        return self.listed(node) or {}

    @staticmethod
    def listed(node):
        tasks, cursor = {}, None
        while True:
            status, page = call(node.port, "GET", "/v1/sessions/campaign/tasks?limit=1000" +
                                (f"&cursor={cursor}" if cursor else ""), timeout=30)
            if status != 200:
                return None
            for task in page["tasks"]:
                tasks[task["id"]] = task
            cursor = page.get("next_cursor")
            if not cursor:
                return tasks

    def check(self, tasks):
        lost, twice, problems = 0, 0, []
        by_tag = {}
        for task in tasks.values():
            tag = (task.get("request", {}).get("headers") or {}).get("X-Campaign-Task")
            by_tag.setdefault(tag, []).append(task)
        for tag, record in self.tasks.items():
            if not record["acknowledged"]:
                continue
            stored = by_tag.get(tag, [])
            if len(stored) > 1:
                twice += 1
                problems.append(f"{tag}: stored {len(stored)} times ({[task['id'] for task in stored]})")
            if not stored:
                lost += 1
                problems.append(f"{tag}: acknowledged as {sorted(record['ids'])} and not in the final state")
                continue
            for task in stored:
                state = task["state"]
                if state == "completed":
                    if not self.delivered(record):
                        lost += 1
                        problems.append(f"{tag} ({task['id']}, {record['protocol']}): completed, the sink lacks its bytes")
                    completions = self.completions(task["id"])
                    if completions > 1:
                        twice += 1
                        problems.append(f"{tag} ({task['id']}): {completions} attempts completed")
                elif not (state == "cancelled" and record["cancelled"]):
                    lost += 1
                    problems.append(f"{tag} ({task['id']}, {record['protocol']}): {state} {task.get('error')}")
        return lost, twice, problems

    def delivered(self, record):
        """Whether the peer holds the file, where the campaign can tell (its own sink, nginx)."""
        url = record["url"]
        if record["protocol"] in ("raw", "chunked"):
            return self.sink.holds(url.split(str(self.sink.port), 1)[1], record["sha"])
        if record["protocol"] == "nginx":
            stored = f"{self.work}/nginx/root/{url.rsplit('/', 1)[1]}"
            with open(stored, "rb") if os.path.exists(stored) else open(os.devnull, "rb") as out:
                return hashlib.sha256(out.read()).hexdigest() == record["sha"]
        return True

    def completions(self, task_id):
        status, attempts = call(self.nodes[0].port, "GET", f"/v1/tasks/{task_id}/attempts", timeout=30)
        entries = attempts.get("attempts", []) if isinstance(attempts, dict) else []
        return sum(1 for entry in entries if entry.get("outcome") == "completed")

    def round_at(self, moment):
        """The round (number, fault) in progress at `moment`, or the last one begun before it."""
        found = None
        for index, (start, _, kind) in enumerate(self.rounds):
            if start <= moment:
                found = f"round {index + 1} ({kind})"
        return found or "before the first round"

    def close(self):
        for node in self.nodes:
            if node.process and node.process.poll() is None:
                if node.stopped:
                    node.process.send_signal(signal.SIGCONT)
                stop(node.process)
        # nginx's master stops its worker on SIGQUIT; a SIGKILL at exit would leave the worker.
        stop(self.nginx, signal.SIGQUIT)
        self.db.stop()
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("FLEET_ROUNDS", "100")))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument(
        "--tolerate-late-after-outage", action="store_true",
        help="print, but do not fail on, a policy change late on a node within 5 s after its own backends were"
        " stalled or it was paused (a known gap: docs/fleet.md); make test's short form uses it")
    parser.add_argument("--binary", default=f"{ROOT}/.build/debug/backhauld")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, spans, nodes' logs)")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    print(f"fleet faults: seed {args.seed} ({args.rounds} rounds, lease {args.lease} s; "
          f"again: scripts/fleet-faults.py --rounds {args.rounds} --seed {args.seed})", flush=True)
    started = time.time()
    campaign = Campaign(args)
    try:
        campaign.start()
        campaign.run()
        tasks = campaign.drain(timeout=120 + 2 * args.rounds)
        lost, twice, problems = campaign.check(tasks)
        overlaps = campaign.history.overlaps()
    finally:
        campaign.close()
    acknowledged = sum(1 for task in campaign.tasks.values() if task["acknowledged"])
    late = [check for check in campaign.policy_checks if check[0] > 2]
    tolerated = [check for check in late if args.tolerate_late_after_outage and check[1] in ("stall", "pause")]
    for problem in problems[:30]:
        print(f"  {problem}")
    for tag, one, other in overlaps[:30]:
        print(f"  overlap {tag}: {one[3]} [{one[0]:.3f}, {one[1]:.3f}] and {other[3]} [{other[0]:.3f}, {other[1]:.3f}],"
              f" in {campaign.round_at(other[0])}")
    for seconds, after, nodes in late[:30]:
        print(f"  a policy change not in force on {', '.join(nodes) or 'every node'} within 2 s"
              + (f" ({seconds:.2f} s)" if seconds != float("inf") else "")
              + (f" (after {after})" if after else "")
              + (" (tolerated: the node's own outage)" if (seconds, after, nodes) in tolerated else ""))
    spread = ", ".join(f"{kind} {count}" for kind, count in campaign.faults.items())
    print(f"faults drawn: {spread}; COMMITs dropped: {campaign.dropper.dropped}; {acknowledged} tasks acknowledged, "
          f"{len(campaign.policy_checks)} policy changes ({len(late)} late); {time.time() - started:.0f} s")
    print(f"fleet faults: {args.rounds} rounds, {lost} lost, {twice} done twice, {len(overlaps)} overlaps (seed {args.seed})")
    return 0 if lost == twice == len(overlaps) == len(late) - len(tolerated) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
