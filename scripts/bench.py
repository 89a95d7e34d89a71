#!/usr/bin/env python3
"""Side-by-side upload benchmark on loopback: backhauld vs curl -T to the same nginx sink.

The sink's root is on tmpfs (/dev/shm) so the disk does not bound the figures. Each case runs
several times; the table shows medians. Usage: scripts/bench.py [--size-mib 1024] [--runs 3]
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def api(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(directory):
    port = free_port()
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
  access_log off;
  client_body_temp_path {directory}/tmp;
  server {{
    listen 127.0.0.1:{port};
    location / {{ root {directory}/root; dav_methods PUT; create_full_put_path on; client_max_body_size 0; }}
    location /hooks {{ return 204; }}
  }}
}}
""")
    process = subprocess.Popen(["nginx", "-c", f"{directory}/nginx.conf", "-p", f"{directory}/"])
    time.sleep(0.5)
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


def proc_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start_daemon(binary, state, root):
    log = open(state + ".log", "w")
    process = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--state-dir", state, "--allow-root", root],
                               stderr=log, stdout=log)
    deadline = time.time() + 20
    while time.time() < deadline:
        with open(state + ".log") as lines:
            for line in lines:
                if '"msg":"listening"' in line:
                    return process, int(json.loads(line)["http.port"])
        time.sleep(0.05)
    raise RuntimeError("backhauld did not start")


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
        time.sleep(0.02)
    if pending:
        raise RuntimeError(f"{len(pending)} tasks did not finish")


def webhook_throughput(args, work, data, nginx_port):
    files = []
    for index in range(args.webhook_events):
        path = f"{data}/w{index}.bin"
        with open(path, "wb") as out:
            out.write(b"x" * 1024)
        files.append(path)
    state = f"{work}/state-webhooks"
    daemon, port = start_daemon(args.binary, state, data)
    try:
        api(port, "PUT", "/v1/sessions/hooks", {"configuration": {}})
        status, webhook = api(port, "POST", "/v1/sessions/hooks/webhooks",
                              {"url": f"http://127.0.0.1:{nginx_port}/hooks", "events": ["task.completed"]})
        assert status == 201, webhook
        started = time.time()
        tasks = [{"file": path, "request": {"url": f"http://127.0.0.1:{nginx_port}/w/{i}.bin"}} for i, path in enumerate(files)]
        status, created = api(port, "POST", "/v1/sessions/hooks/tasks", {"tasks": tasks})
        assert status == 201, created
        uploads_done = None
        deadline = time.time() + 600
        while time.time() < deadline:
            _, session = api(port, "GET", "/v1/sessions/hooks")
            if uploads_done is None and session["task_counts"]["completed"] == len(files):
                uploads_done = time.time() - started
            if uploads_done is not None:
                _, pending = api(port, "GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=pending&limit=1")
                _, delivered = api(port, "GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=delivered&limit=1000")
                if not pending["deliveries"]:
                    break
            time.sleep(0.02)
        delivered_at = time.time() - started
        count = 0
        cursor = ""
        while True:
            _, page = api(port, "GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=delivered&limit=1000&cursor={cursor}")
            count += len(page["deliveries"])
            if not page["next_cursor"]:
                break
            cursor = page["next_cursor"]
        return {"events": count, "uploads_s": uploads_done, "all_delivered_s": delivered_at,
                "events_per_s": count / delivered_at}
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--webhook-events", type=int, default=2000)
    parser.add_argument("--binary", default=f"{ROOT}/.build/release/backhauld")
    parser.add_argument("--output", default=f"{ROOT}/bench-results/latest.json")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="backhaul-bench-")
    sink_dir = tempfile.mkdtemp(prefix="backhaul-sink-", dir="/dev/shm")
    data = f"{work}/data"
    os.makedirs(data)
    source = f"{data}/big.bin"
    with open(source, "wb") as out:
        block = os.urandom(1 << 20)
        for _ in range(args.size_mib):
            out.write(block)
    nginx, nginx_port = start_nginx(sink_dir)
    chunk_sink = ChunkSink(sink_dir)

    def sink_port(upload):
        return nginx_port if upload["protocol"] == "raw" else chunk_sink.port

    results = {"size_mib": args.size_mib, "runs": args.runs, "cases": {}}
    try:
        # curl -T, the baseline.
        walls = []
        for run in range(args.runs):
            target = f"http://127.0.0.1:{nginx_port}/curl/{run}.bin"
            subprocess.run(["sync"])
            started = time.time()
            subprocess.run(["curl", "-sS", "-o", "/dev/null", "-T", source, target], check=True)
            walls.append(time.time() - started)
            os.remove(f"{sink_dir}/root/curl/{run}.bin")
        results["cases"]["curl -T"] = {"wall_s": statistics.median(walls)}

        # backhauld, raw and chunked (8 MiB), to the same sink.
        gib = args.size_mib / 1024
        for name, upload in [("backhauld raw", {"protocol": "raw"}), ("backhauld chunked", {"protocol": "chunked"})]:
            walls, cpus, rss = [], [], []
            for run in range(args.runs):
                state = f"{work}/state-{name.split()[1]}-{run}"
                daemon, port = start_daemon(args.binary, state, data)
                try:
                    api(port, "PUT", "/v1/sessions/bench", {"configuration": {}})
                    cpu_before = proc_cpu_seconds(daemon.pid)
                    subprocess.run(["sync"])
                    started = time.time()
                    status, task = api(port, "POST", "/v1/sessions/bench/tasks", {
                        "file": source, "upload": upload, "request": {"url": f"http://127.0.0.1:{sink_port(upload)}/bh/{run}.bin"}})
                    assert status == 201, task
                    wait_done(port, [task["id"]])
                    walls.append(time.time() - started)
                    cpus.append(proc_cpu_seconds(daemon.pid) - cpu_before)
                    rss.append(proc_peak_rss_mib(daemon.pid))
                    target = f"{sink_dir}/root/bh/{run}.bin" if upload["protocol"] == "raw" else chunk_sink.assembled(f"/bh/{run}.bin")
                    if subprocess.run(["cmp", "-s", source, target]).returncode != 0:
                        raise RuntimeError(f"{name}: the uploaded file differs")
                    os.remove(target)
                finally:
                    daemon.send_signal(signal.SIGTERM)
                    daemon.wait(timeout=30)
            results["cases"][name] = {"wall_s": statistics.median(walls), "cpu_s_per_gib": statistics.median(cpus) / gib,
                                      "peak_rss_mib": max(rss)}

        # Webhook deliveries: N small uploads, one subscription, nginx answering 204 as receiver.
        results["webhooks"] = webhook_throughput(args, work, data, nginx_port)
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sink_dir, ignore_errors=True)

    base = results["cases"]["curl -T"]["wall_s"]
    print(f"{args.size_mib} MiB to nginx on loopback, median of {args.runs} runs")
    print(f"{'case':<20}{'wall s':>9}{'MiB/s':>9}{'× curl':>8}{'CPU s/GiB':>11}{'peak RSS MiB':>14}")
    for name, case in results["cases"].items():
        case["mib_per_s"] = args.size_mib / case["wall_s"]
        case["ratio_to_curl"] = case["wall_s"] / base
        print(f"{name:<20}{case['wall_s']:>9.2f}{case['mib_per_s']:>9.0f}{case['ratio_to_curl']:>8.2f}"
              f"{case.get('cpu_s_per_gib', float('nan')):>11.2f}{case.get('peak_rss_mib', float('nan')):>14.1f}")
    hooks = results["webhooks"]
    print(f"webhooks: {hooks['events']} task.completed events delivered (nginx 204 receiver) "
          f"{hooks['all_delivered_s']:.2f} s after enqueue, uploads done at {hooks['uploads_s']:.2f} s: "
          f"{hooks['events_per_s']:.0f} events/s end to end")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as out:
        json.dump(results, out, indent=2)


if __name__ == "__main__":
    sys.exit(main())
