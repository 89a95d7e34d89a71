#!/usr/bin/env python3
"""Side-by-side benchmark on loopback, in one run: prints each section's table, then every target
the issues set (16's, the earlier ones it keeps, and 40's for PostgreSQL) beside its figure with
met / not met, and writes it all as JSON.

Sections (`--only`, comma-separated; all by default):
  big       one 1 GiB file: backhauld raw and chunked (8 MiB) vs `curl -T`, to nginx on tmpfs,
            rounds interleaved
  download  the same file the other way: backhauld download vs `curl -o`
  webhooks  N small uploads, one subscription, nginx answering 204 as the receiver
  many      2,000 × 256 KiB to nginx WebDAV (`dav_methods PUT`, tmpfs): backhauld vs one curl
            process (`-K`, one file after another) vs `curl -Z --parallel-max 16`, rounds
            interleaved; backhauld's CPU per task
  rclone    the same files to `rclone serve webdav` (rclone's WebDAV backend cannot talk to
            nginx's partial WebDAV): backhauld, curl, curl -Z and `rclone copy --transfers 8`
  https     the same files over https to nginx speaking HTTP/1.1 and HTTP/2: backhauld vs curl -Z,
            and the connections (TLS handshakes) each opened, counted in nginx's log
  api       wrk (2 threads, 16 connections) on GET /v1/tasks/{id} and on single-task POSTs,
            every POST's status counted by a Lua script
  scale     1,000,000 tasks in batches of 1,000 into a disabled session: the first 100,000 vs
            the last 100,000, RSS with them present, SIGTERM and restart to /readyz, GET under wrk;
            then the same with every task scheduled a month ahead in an enabled session
  profile   instructions per 64 KiB task under callgrind (N tasks minus an idle run) beside curl
  postgres  the state in PostgreSQL (docs/fleet.md), one node beside SQLite: CPU per small task
            (the daemon's, and the database's), single durable POSTs under wrk, the first 100,000
            enqueued; then three nodes on one database sharing the same uploads
  background  a 40 Mbit link with 300 ms of queue in network namespaces (benchlib/lab.py, root only):
            backhauld's background upload beside a plain `curl -T`, the probe's RTT, the recovery

`--quick` shrinks every size (and runs once) so the whole script is checked in a few minutes:
its verdicts are not the targets'. Every wait has a deadline; everything listens on 127.0.0.1.
"""

from benchlib.common import *  # noqa: F403 (the shared helpers and modules)
from benchlib.api import api_load
from benchlib.lab import background_section, print_background
from benchlib.many import many_files_https, many_files_nginx, many_files_rclone
from benchlib.postgres import postgres_section, print_postgres
from benchlib.printing import print_api, print_https, print_many, print_profile, print_scale, print_targets, print_transfers, print_webhooks
from benchlib.profile import profile_tasks
from benchlib.scale import scale
from benchlib.targets import targets
from benchlib.transfers import big_download, big_file
from benchlib.webhooks import webhook_throughput


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--webhook-events", type=int, default=2000)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--scale-tasks", type=int, default=1_000_000, help="tasks queued by the scale section")
    parser.add_argument("--scale-window", type=int, default=100_000, help="first and last N tasks compared")
    parser.add_argument("--scale-timeout", type=float, default=1800, help="seconds the scale enqueue may take")
    parser.add_argument("--load-seconds", type=int, default=10)
    parser.add_argument("--profile-tasks", type=int, default=300)
    parser.add_argument("--keep-profiles", default=None, help="copy the callgrind outputs into this directory")
    parser.add_argument("--only", default="big,download,webhooks,many,rclone,https,api,scale,profile,postgres,background",
                        help="comma-separated sections to run")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run: checks the script, not the figures")
    parser.add_argument("--binary", default=f"{ROOT}/.build/release/backhauld")
    parser.add_argument("--output", default=f"{ROOT}/bench-results/latest.json")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.runs, args.webhook_events, args.files, args.load_seconds = 64, 1, 200, 200, 2
        args.scale_tasks, args.scale_window, args.profile_tasks = 20_000, 2_000, 40
    if args.scale_window % 1000 or args.scale_window > args.scale_tasks:
        parser.error("--scale-window is a multiple of 1,000 and at most --scale-tasks")
    sections = set(args.only.split(","))
    unknown = sections - {"big", "download", "webhooks", "many", "rclone", "https", "api", "scale", "profile", "postgres", "background"}
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"no binary at {args.binary} (make bench builds it)")

    work = tempfile.mkdtemp(prefix="backhaul-bench-")
    sink_dir = tempfile.mkdtemp(prefix="backhaul-sink-", dir="/dev/shm")
    data = f"{work}/data"
    os.makedirs(data)
    source = f"{data}/big.bin"
    if {"big", "download"} & sections:
        with open(source, "wb") as out:
            block = os.urandom(MIB)
            for _ in range(args.size_mib):
                out.write(block)
    # The load average says how much else the shared machine was doing during the run.
    results = {"date": time.strftime("%Y-%m-%d"), "binary": args.binary, "quick": args.quick, "size_mib": args.size_mib,
               "runs": args.runs, "files": args.files, "loadavg_start": os.getloadavg(), "cases": {},
               "stolen_cpu": {}}
    nginx, nginx_port = start_nginx(sink_dir)
    chunk_sink = ChunkSink(sink_dir)
    try:
        runs = [
            ("big", lambda: results.update(cases=big_file(args, work, data, source, sink_dir, nginx_port, chunk_sink))),
            ("download", lambda: results.update(download=big_download(args, work, data, source, sink_dir, nginx_port))),
            ("webhooks", lambda: results.update(webhooks=webhook_throughput(args, work, data, nginx_port))),
            ("many", lambda: results.update(many_files_nginx=many_files_nginx(args, work, data, sink_dir, nginx_port))),
            ("rclone", lambda: results.update(many_files_rclone=many_files_rclone(args, work, data))),
            ("https", lambda: results.update(many_files_https=many_files_https(args, work, data))),
            ("api", lambda: results.update(api_load(args, work, data))),
            ("scale", lambda: results.update(scale=scale(args, work, data),
                                             scale_scheduled=scale(args, work, data, scheduled=True))),
            ("profile", lambda: results.update(profile=profile_tasks(args, work, data, nginx_port))),
            ("postgres", lambda: results.update(postgres=postgres_section(args, work, data, nginx_port))),
            ("background", lambda: results.update(background=background_section(args))),
        ]
        for name, run_section in runs:
            if name in sections:
                # What the hypervisor took from this machine meanwhile: a wall-clock or rate figure of
                # a section with a large share stolen is the host's, not the code's.
                before = stolen_cpu()
                run_section()
                results["stolen_cpu"][name] = stolen_cpu(since=before)
    finally:
        stop(nginx, signal.SIGQUIT, timeout=10)
        chunk_sink.server.shutdown()
        stop_children()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sink_dir, ignore_errors=True)

    if results["cases"]:
        print_transfers(f"{args.size_mib} MiB to nginx on loopback, median of {args.runs} interleaved rounds", results["cases"], 20)
    if "download" in results:
        print_transfers(f"{args.size_mib} MiB download from nginx into tmpfs, median of {args.runs} runs",
                        results["download"], 28)
    if "webhooks" in results:
        print_webhooks(results)
    if "many_files_nginx" in results:
        print_many(args, results["many_files_nginx"], "nginx WebDAV (dav_methods PUT) on tmpfs")
    if "many_files_rclone" in results:
        print_many(args, results["many_files_rclone"], "rclone serve webdav on tmpfs (where rclone copy works)")
    if "many_files_https" in results:
        print_https(args, results["many_files_https"])
    if "post_task" in results:
        print_api(args, results)
    for key in ("scale", "scale_scheduled"):
        if key in results:
            print_scale(args, results, key)
    if "profile" in results:
        print_profile(results)
    if "postgres" in results:
        print_postgres(args, results["postgres"])
    if "background" in results:
        print_background(results)
    results["loadavg_end"] = os.getloadavg()
    print(f"\nload average (1, 5, 15 min) at the start {' '.join(f'{x:.2f}' for x in results['loadavg_start'])}, "
          f"at the end {' '.join(f'{x:.2f}' for x in results['loadavg_end'])} (2 cores, shared)")
    print("CPU stolen by the host (steal time, /proc/stat) during each section: "
          + ", ".join(f"{name} {share:.0%}" for name, share in results["stolen_cpu"].items()))
    results["targets"] = targets(args, results)
    if results["targets"]:
        print_targets(args, results["targets"])
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as out:
        json.dump(results, out, indent=2)
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    sys.exit(main())

