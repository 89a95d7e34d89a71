"""Section postgres: the state in PostgreSQL, one node beside SQLite, then three nodes."""
from .common import *  # noqa: F403 (the shared helpers and modules)
from .api import disabled_session, one_file, post_batches, post_load
from .many import make_files, many_session, post_many


class Postgres:
    """PostgreSQL (Debian's, the newest installed) in a temporary directory, on a free port of 127.0.0.1,
    trusting local connections (a benchmark's own server), with its defaults otherwise (fsync on,
    synchronous_commit on). As root it runs as the `postgres` user."""

    def __init__(self):
        # Its own directory under /tmp: the benchmark's work directory is private to root.
        directory = tempfile.mkdtemp(prefix="backhaul-bench-pg-")
        self.directory = directory
        self.bin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.data = f"{directory}/data"
        self.sockets = f"{directory}/sockets"
        os.makedirs(self.sockets)
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_owner:
            shutil.chown(directory, "postgres")
            shutil.chown(self.sockets, "postgres")
        run(self.as_owner + [f"{self.bin}/initdb", "-D", self.data, "-U", "backhaul", "--auth=trust", "-E", "UTF8",
                             "--no-instructions"], timeout=120, stdout=subprocess.DEVNULL)
        self.port = free_port()
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.sockets} -c max_connections=200"
        run(self.as_owner + [f"{self.bin}/pg_ctl", "-D", self.data, "-o", options, "-l", f"{directory}/server.log", "-w",
                             "start"], timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.databases = 0

    def fresh(self):
        """A new empty database's URL."""
        self.databases += 1
        name = f"bench{self.databases}"
        run([f"{self.bin}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "backhaul", "-d", "postgres", "-qc",
             f"CREATE DATABASE {name}"], timeout=60)
        return f"postgres://backhaul@127.0.0.1:{self.port}/{name}"

    def cpu_seconds(self):
        """CPU of the server: the postmaster with what its ended children used, and the live ones."""
        with open(f"{self.data}/postmaster.pid") as pidfile:
            postmaster = int(pidfile.readline())
        _, fields = proc_stat(f"/proc/{postmaster}/stat")
        ticks = os.sysconf("SC_CLK_TCK")
        total = sum(int(fields[index]) for index in (11, 12, 13, 14)) / ticks
        for child in subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split():
            try:
                total += proc_cpu_seconds(int(child))
            except (FileNotFoundError, ProcessLookupError):
                pass
        return total

    def stop(self):
        run(self.as_owner + [f"{self.bin}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], timeout=60,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.directory, ignore_errors=True)


def fleet_run(args, work, data, source, nginx_port, label, states, database=None):
    """`args.files` small uploads posted to the first of `len(states)` daemons (each given its
    extra flags in `states`), waited for on that node; the wall time, every daemon's CPU and, with
    `database`, the server's, per task."""
    daemons = [start_daemon(args.binary, f"{work}/state-{label}-{index}", data, extra) for index, extra in enumerate(states)]
    try:
        port = daemons[0][1]
        body = many_session(port, source, f"http://127.0.0.1:{nginx_port}/{label}", args.files)
        cpu_before = [proc_cpu_seconds(process.pid) for process, _ in daemons]
        database_before = database.cpu_seconds() if database else 0
        started = time.time()
        post_many(port, body, args.files, interval=0.05)
        wall = time.time() - started
        daemon_cpu = sum(proc_cpu_seconds(process.pid) - before for (process, _), before in zip(daemons, cpu_before))
        database_cpu = database.cpu_seconds() - database_before if database else 0
        return {"nodes": len(daemons), "wall_s": wall, "files_per_s": args.files / wall,
                "daemon_cpu_ms_per_task": daemon_cpu * 1000 / args.files,
                "database_cpu_ms_per_task": database_cpu * 1000 / args.files,
                "total_cpu_ms_per_task": (daemon_cpu + database_cpu) * 1000 / args.files}
    finally:
        for process, _ in daemons:
            stop(process)


def postgres_section(args, work, data, nginx_port):
    """One node on SQLite and one on PostgreSQL, the same small uploads, rounds interleaved; then
    single-task POSTs under wrk and the first `--scale-window` (100,000) enqueued on PostgreSQL; then three nodes on
    one database. 2 cores show what a node costs, not how a fleet scales."""
    source = make_files(data, "small", args.files, 4096)
    database = Postgres()
    results = {"files": args.files, "file_bytes": 4096}
    try:
        runs = {"sqlite": [], "postgres": []}
        for round_index in range(args.runs):
            runs["sqlite"].append(fleet_run(args, work, data, source, nginx_port, f"pg-sqlite-{round_index}", [[]]))
            url = database.fresh()
            runs["postgres"].append(fleet_run(
                args, work, data, source, nginx_port, f"pg-one-{round_index}",
                [["--state", url, "--node-id", "a", "--shared-root", data]], database))
        for name, values in runs.items():
            cpus = [value["daemon_cpu_ms_per_task"] for value in values]
            results[name] = values[cpus.index(statistics.median_low(cpus))]
        url = database.fresh()
        results["three_nodes"] = fleet_run(
            args, work, data, source, nginx_port, "pg-three",
            [["--state", url, "--node-id", f"n{index}", "--shared-root", data] for index in range(3)], database)
        # Single durable POSTs, and the first `--scale-window` (100,000), into a disabled session.
        url = database.fresh()
        daemon, port = start_daemon(args.binary, f"{work}/state-pg-api", data, ["--state", url, "--node-id", "api"])
        try:
            one = one_file(data)
            disabled_session(port, "api")
            results["post_task"] = post_load(args, work, port, one, "api")
            disabled_session(port, "bulk")
            batch = json.dumps({"tasks": [{"file": one, "request": {"url": f"http://127.0.0.1:9/q/{index}"}}
                                          for index in range(1000)]}).encode()
            marks, _ = post_batches(port, "bulk", batch, args.scale_window // 1000)
            results["enqueue_window"] = args.scale_window
            results["enqueue_window_s"] = marks[-1] - marks[0]
        finally:
            stop(daemon)
    finally:
        database.stop()
    return results


def print_postgres(args, results):
    print(f"\nThe state in PostgreSQL: {results['files']:,} × 4 KiB to nginx, median of {args.runs} rounds "
          "(CPU in ms per task)")
    print(f"  {'':34} {'wall':>8} {'files/s':>8} {'daemon':>8} {'database':>9} {'total':>8}")
    for name, label in (("sqlite", "one node, SQLite"), ("postgres", "one node, PostgreSQL"),
                        ("three_nodes", "three nodes, one PostgreSQL")):
        case = results[name]
        print(f"  {label:34} {case['wall_s']:7.2f}s {case['files_per_s']:8.0f} {case['daemon_cpu_ms_per_task']:8.3f} "
              f"{case['database_cpu_ms_per_task']:9.3f} {case['total_cpu_ms_per_task']:8.3f}")
    post = results["post_task"]
    print(f"  single-task POSTs (wrk, 16 connections): {post['requests_per_s']:,.0f}/s, p99 {post['p99_ms']:.2f} ms; "
          f"the first {results['enqueue_window']:,} in batches of 1,000: {results['enqueue_window_s']:.2f} s")


# ---------------------------------------------------------------------------------------------
