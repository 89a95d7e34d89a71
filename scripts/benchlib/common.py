"""Shared by every section: the processes the bench starts (and stops whatever fails), the sinks
(nginx, the chunk sink), the daemon, /proc readings and timing."""

import argparse, atexit, glob, http.client, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20

# Every process this script starts, so that none outlives it whatever fails.
CHILDREN = []


def spawn(command, **kwargs):
    process = subprocess.Popen(command, **kwargs)
    CHILDREN.append(process)
    return process


def stop(process, sig=signal.SIGTERM, timeout=30):
    """Signals `process` and waits for it; SIGKILL when it outlives `timeout`. Returns the seconds
    it took to exit after the signal."""
    if process.poll() is not None:
        return 0.0
    started = time.time()
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    return time.time() - started


@atexit.register
def stop_children():
    for process in CHILDREN:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def api(port, method, path, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def run(command, timeout, **kwargs):
    """subprocess.run with a time limit and check=True."""
    return subprocess.run(command, check=True, timeout=timeout, **kwargs)


def timed(command, timeout, **kwargs):
    """Runs `command` to a successful end and returns its wall time, from before its start to its
    exit, in seconds (the monotonic clock). The wait blocks in waitpid: subprocess.run's timed wait
    polls, sleeping up to 50 ms between looks, which adds 0-50 ms to a wall timed around it. A timer
    kills the command past `timeout`."""
    started = time.monotonic()
    process = spawn(command, **kwargs)
    expired = threading.Event()

    def expire():
        expired.set()
        process.kill()

    watchdog = threading.Timer(timeout, expire)
    watchdog.start()
    try:
        code = process.wait()
    finally:
        watchdog.cancel()
    elapsed = time.monotonic() - started
    if expired.is_set():
        raise subprocess.TimeoutExpired(command, timeout)
    if code != 0:
        raise subprocess.CalledProcessError(code, command)
    return elapsed


def dav_location(directory):
    """nginx's WebDAV PUT sink under `directory`/root (as BackhaulTesting's NginxServer)."""
    return f"location / {{ root {directory}/root; dav_methods PUT; create_full_put_path on; client_max_body_size 0; }}"


def run_nginx(directory, http, ports):
    """nginx with one worker in its own prefix `directory` (its root and body files there), the
    `http` block's contents as given; returns the process once every one of `ports` listens."""
    os.makedirs(f"{directory}/root", exist_ok=True)
    os.makedirs(f"{directory}/tmp", exist_ok=True)
    user = "user root;" if os.getuid() == 0 else ""
    with open(f"{directory}/nginx.conf", "w") as conf:
        conf.write(f"""{user}
worker_processes 1;
daemon off;
error_log {directory}/error.log;
pid {directory}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  client_body_temp_path {directory}/tmp;
{http}
}}
""")
    process = spawn(["nginx", "-c", f"{directory}/nginx.conf", "-p", f"{directory}/"])
    for port in ports:
        wait_port(port)
    return process


def start_nginx(directory):
    """nginx as a WebDAV PUT sink (`dav_methods PUT`, `create_full_put_path on`), its root on
    tmpfs, and a 204 webhook receiver at /hooks."""
    port = free_port()
    process = run_nginx(directory, f"""  access_log off;
  server {{
    listen 127.0.0.1:{port};
    {dav_location(directory)}
    location /hooks {{ return 204; }}
  }}""", [port])
    return process, port


class ChunkSink:
    """A resumable Content-Range sink on tmpfs (nginx answers 501 to ranged PUTs): writes each
    chunk at its offset, 308 + Range for intermediate chunks, 201 for the last."""

    def __init__(self, directory):
        import http.server, threading
        self.directory = directory
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def do_PUT(self):
                length = int(self.headers.get("Content-Length", "0"))
                first, last, total = sink.parse(self.headers.get("Content-Range", ""))
                path = sink.assembled(self.path)
                mode = "r+b" if os.path.exists(path) else "wb"
                with open(path, mode) as out:
                    out.seek(first)
                    remaining = length
                    while remaining > 0:
                        block = self.rfile.read(min(remaining, 1 << 20))
                        if not block:
                            break
                        out.write(block)
                        remaining -= len(block)
                size = os.path.getsize(path)
                status = 201 if size >= total else 308
                self.send_response(status)
                if status == 308:
                    self.send_header("Range", f"bytes=0-{size - 1}")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def assembled(self, path):
        return f"{self.directory}/assembled" + path.replace("/", "_")

    @staticmethod
    def parse(header):
        spec, total = header.removeprefix("bytes ").split("/")
        first, last = spec.split("-")
        return int(first), int(last), int(total)


def proc_stat(path):
    """A /proc stat file: the name in its parentheses, and the fields after them."""
    with open(path) as stat:
        text = stat.read()
    return text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 1:].split()


def proc_times(pid):
    """The process's utime and stime (seconds) and its minor page faults so far."""
    _, fields = proc_stat(f"/proc/{pid}/stat")
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def proc_thread_times(pid):
    """utime and stime (seconds) of each of the process's threads that carries a name of its own
    (the daemon's `bh-*` threads), summed by name."""
    tick = os.sysconf("SC_CLK_TCK")
    times = {}
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            name, fields = proc_stat(f"/proc/{pid}/task/{thread}/stat")
        except OSError:
            continue  # the thread ended meanwhile
        if name.startswith("bh-"):
            user, system = times.get(name, (0.0, 0.0))
            times[name] = (user + int(fields[11]) / tick, system + int(fields[12]) / tick)
    return times


def proc_cpu_seconds(pid):
    """utime + stime of the process so far."""
    user, system, _ = proc_times(pid)
    return user + system


def stolen_cpu(since=None):
    """The machine's CPU counters (/proc/stat's `cpu` line: steal and the total, in ticks); with
    `since` (an earlier reading), the share of the time between that the hypervisor gave to others."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    now = (fields[7], sum(fields))
    if since is None:
        return now
    return (now[0] - since[0]) / max(1, now[1] - since[1])


def proc_status_mib(pid, key):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def proc_peak_rss_mib(pid):
    return proc_status_mib(pid, "VmHWM")


def proc_rss_mib(pid):
    return proc_status_mib(pid, "VmRSS")


def start_daemon(binary, state, root, extra=(), port=0):
    """Starts backhauld and returns (process, port) once it listens (read from its log)."""
    log = open(state + ".log", "a")
    skip = listening_lines(state)
    process = spawn([binary, "--listen", f"127.0.0.1:{port}", "--state-dir", state, "--allow-root", root, *extra],
                    stderr=log, stdout=log)
    deadline = time.time() + 60
    while time.time() < deadline and process.poll() is None:
        with open(state + ".log") as lines:
            for line in list(lines)[skip:]:
                if '"msg":"listening"' in line:
                    return process, int(json.loads(line)["http.port"])
        time.sleep(0.02)
    stop(process)
    raise RuntimeError(f"backhauld did not start; see {state}.log")


def listening_lines(state):
    try:
        with open(state + ".log") as lines:
            return len(list(lines))
    except FileNotFoundError:
        return 0


def wait_done(port, ids, timeout=900):
    deadline = time.time() + timeout
    pending = set(ids)
    while pending and time.time() < deadline:
        for task_id in list(pending):
            status, task = api(port, "GET", f"/v1/tasks/{task_id}")
            if task["state"] in ("completed", "failed", "cancelled"):
                if task["state"] != "completed":
                    raise RuntimeError(f"task {task_id} {task['state']}: {task['error']}")
                pending.discard(task_id)
        time.sleep(0.01)
    if pending:
        raise RuntimeError(f"{len(pending)} tasks did not finish")


def wait_session_done(port, session, count, timeout=600, interval=0.01):
    """Polls the session's counts until `count` tasks ended; their counts. The polls share one
    kept-alive connection, as an HTTP client library's would: a connection each 10 ms cost the
    daemon an accept and a thread started and ended each time, 0.006 ms of CPU a small task
    (threads other than the curl one and the writer: 0.024 → 0.018 ms a task over 2,000)."""
    deadline = time.time() + timeout
    connection, counts = None, None
    try:
        while time.time() < deadline:
            try:
                connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                connection.request("GET", f"/v1/sessions/{session}")
                body = json.loads(connection.getresponse().read())
            except (OSError, http.client.HTTPException):
                # The daemon closed the kept connection (its idle timeout): a new one.
                if connection:
                    connection.close()
                connection = None
                time.sleep(interval)
                continue
            counts = body["task_counts"]
            if counts["completed"] + counts["failed"] + counts.get("cancelled", 0) >= count:
                break
            time.sleep(interval)
    finally:
        if connection:
            connection.close()
    if counts is None:
        raise RuntimeError(f"session {session}: no answer to its polls within {timeout} s")
    if counts["completed"] != count:
        _, failed = api(port, "GET", f"/v1/sessions/{session}/tasks?state=failed&limit=1")
        raise RuntimeError(f"session {session}: {counts}; first failure: {failed.get('tasks', [{}])[:1]}")
    return counts
