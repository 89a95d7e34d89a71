"""The background lab: a 40 Mbit bottleneck with a modem-sized queue, on this machine.

host --veth-- router namespace --veth-- far namespace. The router forwards; a `tbf rate 40mbit
burst 32kb limit 1500000` on its egress toward far is the bottleneck (about 300 ms of queue). The
host's route to far uses `congctl cubic` (the host's default may be bbr, which keeps the queue short
by itself; most real senders are loss-based). A `tbf` on the host's own veth would build no queue:
TCP Small Queues keep a local socket's bytes out of the qdisc (shared/TOOLCHAIN.md).

In far run a sink (HTTP PUT, bytes counted per first path segment and written every 50 ms to a
file, so that nothing is read back over the shaped link) and a TCP echo for the latency probe.
Needs root (`ip netns`, `tc`); everything is removed on the way out, whatever fails.

`python3 -m benchlib.lab --binary B` (from scripts/) runs the phases against the daemon B and
prints the figures as one JSON object: the end-to-end test (Tests/EndToEndTests/BackgroundLabTests)
asserts them, `make bench`'s background section prints them.
"""
import argparse, atexit, json, os, shutil, signal, socket, subprocess, sys, tempfile, threading, time
import urllib.request

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "benchlib"

from .common import api, proc_cpu_seconds, spawn, start_daemon, stop, stop_children  # noqa: E402

LINK_BYTES = 40_000_000 // 8
HOST_ADDRESS, ROUTER_NEAR, ROUTER_FAR, FAR_ADDRESS = "10.248.0.1", "10.248.0.2", "10.248.1.1", "10.248.1.2"
SINK_PORT, ECHO_PORT = 8480, 8481

# The far namespace's two peers, run there with `ip netns exec` (python3 -c).
PEERS = r'''
import json, os, socket, sys, threading, time
counts_path, sink_port, echo_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
counts, lock = {}, threading.Lock()

def sink(connection):
    with connection:
        buffered = b""
        while True:
            while b"\r\n\r\n" not in buffered:
                data = connection.recv(65536)
                if not data:
                    return
                buffered += data
            head, buffered = buffered.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            key = lines[0].split(" ")[1].split("/")[1]
            headers = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
            if headers.get("expect", "").lower() == "100-continue":
                connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            left = int(headers.get("content-length", "0"))
            while left > 0:
                data = buffered or connection.recv(262144)
                buffered = b""
                if not data:
                    return
                take = min(left, len(data))
                left -= take
                buffered = data[take:]
                with lock:
                    counts[key] = counts.get(key, 0) + take
            connection.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")

def echo(connection):
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with connection:
        while True:
            data = connection.recv(4096)
            if not data:
                return
            connection.sendall(data)

def serve(port, handler):
    listener = socket.create_server(("0.0.0.0", port), backlog=64)
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=handler, args=(connection,), daemon=True).start()

threading.Thread(target=serve, args=(sink_port, sink), daemon=True).start()
threading.Thread(target=serve, args=(echo_port, echo), daemon=True).start()
with open(counts_path, "a") as out:
    while True:
        with lock:
            line = json.dumps({"t": time.monotonic(), "counts": dict(counts)})
        out.write(line + "\n")
        out.flush()
        time.sleep(0.05)
'''


def sh(*command):
    subprocess.run(command, check=True, timeout=30, stdout=subprocess.DEVNULL)


class Lab:
    """The namespaces, links, shaping and peers; `close` (also at exit and on SIGTERM) removes them."""

    def __init__(self, work):
        tag = f"bh{os.getpid() % 100000}"
        self.router, self.far = f"{tag}rt", f"{tag}far"
        self.host_link, self.work = f"{tag}h", work
        self.counts_path = f"{work}/far-counts.jsonl"
        self.closed = False
        atexit.register(self.close)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        r, f = self.router, self.far
        sh("ip", "netns", "add", r)
        sh("ip", "netns", "add", f)
        sh("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", "rt-near", "netns", r)
        sh("ip", "-n", r, "link", "add", "rt-far", "type", "veth", "peer", "name", "far0", "netns", f)
        sh("ip", "addr", "add", f"{HOST_ADDRESS}/30", "dev", self.host_link)
        sh("ip", "link", "set", self.host_link, "up")
        sh("ip", "-n", r, "addr", "add", f"{ROUTER_NEAR}/30", "dev", "rt-near")
        sh("ip", "-n", r, "addr", "add", f"{ROUTER_FAR}/30", "dev", "rt-far")
        for link in ("rt-near", "rt-far", "lo"):
            sh("ip", "-n", r, "link", "set", link, "up")
        sh("ip", "-n", f, "addr", "add", f"{FAR_ADDRESS}/30", "dev", "far0")
        sh("ip", "-n", f, "link", "set", "far0", "up")
        sh("ip", "-n", f, "link", "set", "lo", "up")
        sh("ip", "-n", f, "route", "add", "default", "via", ROUTER_FAR)
        sh("ip", "netns", "exec", r, "sysctl", "-q", "net.ipv4.ip_forward=1")
        sh("tc", "-n", r, "qdisc", "add", "dev", "rt-far", "root", "tbf", "rate", "40mbit", "burst", "32kb", "limit", "1500000")
        sh("ip", "route", "add", f"{FAR_ADDRESS}/32", "via", ROUTER_NEAR, "congctl", "cubic")
        self.peers = spawn(["ip", "netns", "exec", f, sys.executable, "-c", PEERS, self.counts_path, str(SINK_PORT), str(ECHO_PORT)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                probe.settimeout(1)
                if probe.connect_ex((FAR_ADDRESS, ECHO_PORT)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("the far namespace's peers did not start")

    def close(self):
        if self.closed:
            return
        self.closed = True
        if getattr(self, "peers", None):
            stop(self.peers, timeout=5)
        subprocess.run(["ip", "route", "del", f"{FAR_ADDRESS}/32"], timeout=30, stderr=subprocess.DEVNULL)
        for namespace in (self.router, self.far):
            subprocess.run(["ip", "netns", "del", namespace], timeout=30, stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", self.host_link], timeout=30, stderr=subprocess.DEVNULL)

    def url(self, key, name="f.bin"):
        return f"http://{FAR_ADDRESS}:{SINK_PORT}/{key}/{name}"

    def counts(self):
        """[(t, {key: bytes})] as the sink wrote them."""
        rows = []
        with open(self.counts_path) as lines:
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # the line being written
                rows.append((row["t"], row["counts"]))
        return rows

    def rate(self, key, start, end):
        """Bytes/s the sink received under `key` between two monotonic times."""
        rows = self.counts()

        def at(moment):
            before = [c.get(key, 0) for t, c in rows if t <= moment]
            return before[-1] if before else 0

        return (at(end) - at(start)) / (end - start)


class Probe:
    """Latency probes: 16 bytes over one TCP connection to far's echo every 20 ms; RTTs in ms."""

    def __init__(self):
        self.samples, self.running = [], True
        self.connection = socket.create_connection((FAR_ADDRESS, ECHO_PORT), timeout=5)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            started = time.monotonic()
            try:
                self.connection.sendall(b"x" * 16)
                got = 0
                while got < 16:
                    data = self.connection.recv(16 - got)
                    if not data:
                        return
                    got += len(data)
            except OSError:
                return
            self.samples.append((started, (time.monotonic() - started) * 1000))
            time.sleep(max(0, 0.02 - (time.monotonic() - started)))

    def between(self, start, end):
        return [rtt for t, rtt in self.samples if start <= t <= end]

    def close(self):
        self.running = False
        self.thread.join(timeout=5)
        self.connection.close()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def run_phases(binary, seconds=5.0):
    """Every phase, one after the other; the figures as a dict. `seconds` is each measuring window."""
    work = tempfile.mkdtemp(prefix="backhaul-lab-", dir="/dev/shm")
    lab = probe = curl = daemon = None
    try:
        lab = Lab(work)
        data = f"{work}/data"
        os.makedirs(data)
        source = f"{data}/big.bin"
        with open(source, "wb") as out:
            out.truncate(1 << 30)  # sparse: reads zeros at memory speed
        probe = Probe()
        figures = {"link_bytes_per_second": LINK_BYTES, "window_s": seconds}

        def window(settle=1.5):
            time.sleep(settle)
            start = time.monotonic()
            time.sleep(seconds)
            return start, time.monotonic()

        def rtts(start, end):
            values = probe.between(start, end)
            return {"p50_ms": percentile(values, 0.5), "p95_ms": percentile(values, 0.95), "samples": len(values)}

        start, end = window(settle=0.5)
        figures["idle"] = rtts(start, end)
        # Plain curl -T alone: its rate (the foreground's own) and what it does to the probe.
        curl = spawn(["curl", "-sS", "-o", "/dev/null", "-T", source, lab.url("curl")])
        start, end = window(settle=2)
        stop(curl, timeout=5)
        figures["curl_alone"] = {"bytes_per_second": lab.rate("curl", start, end), **rtts(start, end)}
        time.sleep(1.5)  # the queue drains

        daemon, port = start_daemon(binary, f"{work}/state", data)
        daemon_pid = daemon.pid
        for session, service in (("fg", "default"), ("bg", "background")):
            status, body = api(port, "PUT", f"/v1/sessions/{session}", {"configuration": {"network_service_type": service}})
            assert status in (200, 201), body

        def upload(session, key):
            status, task = api(port, "POST", f"/v1/sessions/{session}/tasks",
                               {"file": source, "upload": {"protocol": "raw"}, "request": {"url": lab.url(key)}})
            assert status == 201, task
            return task["id"]

        def cancel(task_id):
            api(port, "POST", f"/v1/tasks/{task_id}/cancel", {})

        # A `default` upload alone.
        task = upload("fg", "default")
        time.sleep(2)
        cpu_before, start = proc_cpu_seconds(daemon_pid), time.monotonic()
        time.sleep(seconds)
        end = time.monotonic()
        cpu_default = proc_cpu_seconds(daemon_pid) - cpu_before
        rate = lab.rate("default", start, end)
        figures["default_alone"] = {"bytes_per_second": rate, **rtts(start, end), "cpu_s": cpu_default,
                                    "bytes": rate * (end - start)}
        cancel(task)
        time.sleep(1.5)

        # A background upload alone, then beside curl -T, then alone again.
        task = upload("bg", "background")
        time.sleep(3)
        cpu_before, start = proc_cpu_seconds(daemon_pid), time.monotonic()
        pacing = []
        while time.monotonic() < start + seconds:
            _, shown = api(port, "GET", f"/v1/tasks/{task}")
            pacing.append(shown["progress"]["background"])
            time.sleep(0.5)
        end = time.monotonic()
        cpu_background = proc_cpu_seconds(daemon_pid) - cpu_before
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = {line.split()[0]: float(line.split()[1]) for line in response.read().decode().splitlines()
                       if line.startswith(("backhaul_background_rate_bytes", "backhaul_queue_delay_seconds"))}
        rate = lab.rate("background", start, end)
        figures["background_alone"] = {"bytes_per_second": rate, **rtts(start, end), "cpu_s": cpu_background,
                                       "bytes": rate * (end - start), "progress_background": pacing[-1] if pacing else None,
                                       "metrics": metrics}
        curl = spawn(["curl", "-sS", "-o", "/dev/null", "-T", source, lab.url("foreground")])
        start, end = window(settle=2)
        figures["foreground_beside_background"] = {"bytes_per_second": lab.rate("foreground", start, end),
                                                   "background_bytes_per_second": lab.rate("background", start, end),
                                                   **rtts(start, end)}
        stop(curl, timeout=5)
        stopped = time.monotonic()
        back, trace = None, []
        while time.monotonic() < stopped + 10:
            time.sleep(0.25)
            now = time.monotonic()
            _, shown = api(port, "GET", f"/v1/tasks/{task}")
            trace.append((round(now - stopped, 2), round(lab.rate("background", now - 0.25, now)), shown["progress"]["background"]))
            if os.environ.get("LAB_SS"):
                print(subprocess.run(["ss", "-tinH", "dst", FAR_ADDRESS], capture_output=True, text=True).stdout, file=sys.stderr)
            if now - stopped >= 0.5 and lab.rate("background", now - 0.5, now) >= 0.7 * LINK_BYTES:
                back = now - stopped
                break
        figures["recovery_s"] = back
        figures["recovery_trace"] = trace
        cancel(task)
        # The controller's cost: the daemon's CPU a byte, background over default, at the link's rate.
        if figures["default_alone"]["bytes"] > 0 and figures["background_alone"]["bytes"] > 0:
            per_byte_default = cpu_default / figures["default_alone"]["bytes"]
            per_byte_background = cpu_background / figures["background_alone"]["bytes"]
            figures["controller_core_fraction"] = max(0.0, per_byte_background - per_byte_default) * LINK_BYTES
        else:
            figures["controller_core_fraction"] = None
        return figures
    finally:
        if probe:
            probe.close()
        for process in (curl, daemon):
            if process:
                stop(process, timeout=10)
        if lab:
            lab.close()
        shutil.rmtree(work, ignore_errors=True)


def verdicts(figures):
    """Each target of the background section: (name, figure text, target text, met)."""
    link, idle = LINK_BYTES, figures["idle"]
    bg, curl = figures["background_alone"], figures["curl_alone"]
    fg = figures["foreground_beside_background"]
    mbit = lambda rate: f"{rate * 8 / 1e6:.1f} Mbit/s"
    rows = [
        ("background upload alone, share of the link", f"{bg['bytes_per_second'] / link:.0%} ({mbit(bg['bytes_per_second'])}; "
         f"plain curl {curl['bytes_per_second'] / link:.0%})", "≥ 80 %", bg["bytes_per_second"] >= 0.8 * link),
        ("probe RTT p50 beside it", f"{bg['p50_ms']:.1f} ms (idle {idle['p50_ms']:.1f}; plain curl {curl['p50_ms']:.1f})",
         "≤ idle + 25 ms", bg["p50_ms"] <= idle["p50_ms"] + 25),
        ("probe RTT p95 beside it", f"{bg['p95_ms']:.1f} ms (idle {idle['p95_ms']:.1f}; plain curl {curl['p95_ms']:.1f})",
         "≤ idle + 60 ms", bg["p95_ms"] <= idle["p50_ms"] + 60),
        ("foreground curl -T beside it, share of its rate alone",
         f"{fg['bytes_per_second'] / curl['bytes_per_second']:.0%} ({mbit(fg['bytes_per_second'])} of {mbit(curl['bytes_per_second'])}; "
         f"background {mbit(fg['background_bytes_per_second'])})", "≥ 80 %", fg["bytes_per_second"] >= 0.8 * curl["bytes_per_second"]),
        ("background back at 70 % of the link after the foreground stops",
         "never (10 s)" if figures["recovery_s"] is None else f"{figures['recovery_s']:.1f} s", "≤ 5 s",
         figures["recovery_s"] is not None and figures["recovery_s"] <= 5),
        ("default upload alone, share of the link", f"{figures['default_alone']['bytes_per_second'] / link:.0%} "
         f"(p50 RTT {figures['default_alone']['p50_ms']:.0f} ms)", "≥ 85 %", figures["default_alone"]["bytes_per_second"] >= 0.85 * link),
        ("controller's cost, one core per running transfer",
         "no bytes to compare" if figures["controller_core_fraction"] is None else f"{figures['controller_core_fraction']:.2%}",
         "≤ 2 %", figures["controller_core_fraction"] is not None and figures["controller_core_fraction"] <= 0.02),
    ]
    return rows


def background_section(args):
    """`make bench`'s background section: the phases on the release build (10 s windows; 4 s with
    --quick). Not root: skipped, and said so."""
    if os.geteuid() != 0:
        print("\nbackground: SKIPPED, the lab needs root (ip netns, tc)")
        return {"skipped": "the lab needs root"}
    figures = run_phases(args.binary, 4.0 if args.quick else 10.0)
    figures["targets"] = [{"row": r, "figure": f, "target": t, "met": m} for r, f, t, m in verdicts(figures)]
    return figures


def print_background(results):
    figures = results["background"]
    if "skipped" in figures:
        return
    print(f"\nbackground: a 40 Mbit link with 300 ms of queue (network namespaces), {figures['window_s']:g} s windows")
    print(f"{'case':<40}{'Mbit/s':>8}{'RTT p50 ms':>12}{'RTT p95 ms':>12}")
    for name, key in (("idle link", "idle"), ("plain curl -T alone", "curl_alone"), ("backhauld default alone", "default_alone"),
                      ("backhauld background alone", "background_alone"),
                      ("curl -T beside background", "foreground_beside_background")):
        case = figures[key]
        rate = f"{case['bytes_per_second'] * 8 / 1e6:.1f}" if "bytes_per_second" in case else "-"
        print(f"{name:<40}{rate:>8}{case['p50_ms']:>12.1f}{case['p95_ms']:>12.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--seconds", type=float, default=5.0, help="each measuring window")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"skipped": "the lab needs root (ip netns, tc)"}))
        return 0
    try:
        figures = run_phases(args.binary, args.seconds)
    finally:
        stop_children()
    figures["targets"] = [{"row": r, "figure": f, "target": t, "met": m} for r, f, t, m in verdicts(figures)]
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
