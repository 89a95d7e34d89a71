"""The issues' targets, each with its figure and verdict."""
from .common import *  # noqa: F403 (the shared helpers and modules)


def targets(args, results):
    """The issues' targets (16's, the earlier ones it keeps, 40's), each with its figure and verdict."""
    rows = []

    def row(section, name, figure, target, met):
        rows.append({"section": section, "row": name, "figure": figure, "target": target,
                     "met": None if met is None else bool(met)})

    if "many_files_nginx" in results:
        many = results["many_files_nginx"]
        bh = many["backhauld"]
        curl, curlz = many["curl (one process)"], many["curl -Z (16 parallel)"]
        sink = f"{args.files} × 256 KiB, nginx WebDAV"
        row(sink, "backhauld ÷ one curl process", f"{bh['wall_s'] / curl['wall_s']:.2f} ({bh['wall_s']:.2f} s / {curl['wall_s']:.2f} s)",
            "≤ 0.6", bh["wall_s"] / curl["wall_s"] <= 0.6)
        row(sink, "backhauld ÷ curl -Z --parallel-max 16",
            f"{bh['wall_s'] / curlz['wall_s']:.2f} ({bh['wall_s']:.2f} s / {curlz['wall_s']:.2f} s)",
            "≤ 1.3", bh["wall_s"] / curlz["wall_s"] <= 1.3)
        row(sink, "backhauld CPU per task (utime+stime ÷ tasks)", f"{bh['cpu_ms_per_task']:.3f} ms", "≤ 0.25 ms",
            bh["cpu_ms_per_task"] <= 0.25)
    if "profile" in results:
        profile = results["profile"]
        row(f"{profile['tasks']} × 64 KiB, nginx, callgrind", "instructions per task (minus an idle run)",
            f"{profile['backhauld_per_task']:,.0f} (one curl process: {profile['curl_per_task']:,.0f})", "≤ 500,000",
            profile["backhauld_per_task"] <= 500_000)
    if "post_task" in results:
        post = results["post_task"]
        section = "wrk, 2 threads, 16 connections"
        row(section, "single-task POSTs", f"{post['requests_per_s']:,.0f} req/s, p99 {post['p99_ms']:.2f} ms", "≥ 5,000 req/s",
            post["requests_per_s"] >= 5000)
        row(section, "every POST answered 201",
            f"{post['expected_status']:,} × 201, {post['other_status']} other{' (' + ' '.join(post['other_statuses_seen'][:5]) + ')' if post['other_status'] else ''}, "
            f"{post['socket_errors']} socket errors; {post['tasks_stored']:,} tasks stored",
            "all 201", post["other_status"] == 0 and post["socket_errors"] == 0 and post["tasks_stored"] >= post["expected_status"])
        get = results["get_task"]
        row(section, "GET /v1/tasks/{id}, a near-empty store (earlier target)", f"{get['requests_per_s']:,.0f} req/s, p99 {get['p99_ms']:.2f} ms",
            "≥ 10,000 req/s, p99 ≤ 10 ms", get["requests_per_s"] >= 10_000 and get["p99_ms"] <= 10)
    for key in ("scale", "scale_scheduled"):
        if key not in results:
            continue
        s = results[key]
        window = args.scale_window
        enqueue_target = 5.0 * window / 100_000
        complete = s["tasks"] >= s["tasks_planned"]
        held = f"{s['tasks']:,} queued" + ("" if complete else f" (of {s['tasks_planned']:,}: the {args.scale_timeout:.0f} s limit)")
        section = f"{s['tasks_planned']:,} queued, batches of 1,000" + (
            ", scheduled a month ahead in an enabled session" if s.get("scheduled") else "")
        if s["first_window_s"] is not None:
            row(section, f"the first {window:,} enqueued (an empty store)", f"{s['first_window_s']:.2f} s", f"≤ {enqueue_target:g} s",
                s["first_window_s"] <= enqueue_target)
            ratio = s["last_window_s"] / s["first_window_s"]
            row(section, f"the last {window:,} ÷ the first {window:,}",
                f"{ratio:.2f} ({s['last_window_s']:.2f} s / {s['first_window_s']:.2f} s; {held})", "≤ 1.25", complete and ratio <= 1.25)
        rss = max(s["rss_mib"], s["rss_after_restart_mib"], s["rss_after_load_mib"])
        row(section, f"RSS with {s['tasks']:,} present", f"{rss:.1f} MiB", "≤ 128 MiB", complete and rss <= 128)
        ready = s["restart_to_ready_s"]
        row(section, "SIGTERM, new process to the first 200 of /readyz",
            "never ready" if ready is None else f"{ready:.2f} s (the stop took {s['stop_s']:.2f} s)", "≤ 3 s",
            complete and ready is not None and ready <= 3)
        get = s["get_task"]
        row(section, f"GET /v1/tasks/{{id}} with {s['tasks']:,} present", f"{get['requests_per_s']:,.0f} req/s, p99 {get['p99_ms']:.2f} ms",
            "≥ 10,000 req/s, p99 ≤ 10 ms", complete and get["requests_per_s"] >= 10_000 and get["p99_ms"] <= 10
            and get["socket_errors"] == 0 and not any("Non-2xx" in e for e in get["errors"]))
    if "postgres" in results:
        pg = results["postgres"]
        section = f"the state in PostgreSQL, {pg['files']:,} × 4 KiB to nginx"
        ratio = pg["postgres"]["daemon_cpu_ms_per_task"] / pg["sqlite"]["daemon_cpu_ms_per_task"]
        row(section, "daemon CPU per task, PostgreSQL ÷ SQLite",
            f"{ratio:.2f} ({pg['postgres']['daemon_cpu_ms_per_task']:.3f} / {pg['sqlite']['daemon_cpu_ms_per_task']:.3f} ms; "
            f"the database {pg['postgres']['database_cpu_ms_per_task']:.3f} ms more)", "≤ 2", ratio <= 2)
        post = pg["post_task"]
        row(section, "single durable POSTs", f"{post['requests_per_s']:,.0f} req/s, p99 {post['p99_ms']:.2f} ms, "
            f"{post['other_status']} not 201", "≥ 2,000 req/s", post["requests_per_s"] >= 2000 and post["other_status"] == 0)
        window = pg["enqueue_window"]
        row(section, f"the first {window:,} enqueued (batches of 1,000)", f"{pg['enqueue_window_s']:.2f} s",
            f"≤ {10 * window / 100_000:g} s", pg["enqueue_window_s"] <= 10 * window / 100_000)
        three = pg["three_nodes"]
        row(section, "three nodes on one database: CPU per task (daemons + database)",
            f"{three['total_cpu_ms_per_task']:.3f} ms ({three['wall_s']:.2f} s; one node {pg['postgres']['total_cpu_ms_per_task']:.3f} ms)",
            "reported", None)
    if results.get("cases"):
        cases = results["cases"]
        section = f"{args.size_mib} MiB to nginx"
        raw = cases["backhauld raw"]
        row(section, "backhauld raw ÷ curl -T", f"{raw['ratio_to_curl']:.2f}", "≤ 1.05", raw["ratio_to_curl"] <= 1.05)
        chunked = cases["backhauld chunked"]
        row(section, "backhauld chunked (8 MiB) ÷ curl -T (earlier target)", f"{chunked['ratio_to_curl']:.2f}", "≤ 1.15",
            chunked["ratio_to_curl"] <= 1.15)
        peaks = {name: case["peak_rss_mib"] for name, case in {**cases, **results.get("download", {})}.items() if "peak_rss_mib" in case}
        worst = max(peaks, key=peaks.get)
        row(section, "peak RSS (raw, chunked, download)", f"{peaks[worst]:.1f} MiB ({worst})", "≤ 64 MiB", peaks[worst] <= 64)
    if "webhooks" in results:
        hooks = results["webhooks"]
        # "Nothing gets worse": 445 events/s on 2026-11-22, less this machine's ±15% drift.
        row(f"{hooks['events']:,} task.completed webhooks", "events delivered per second, end to end",
            f"{hooks['events_per_s']:,.0f} events/s", "≥ 378 (445 on 2026-11-22, −15% drift)", hooks["events_per_s"] >= 378)
    background = results.get("background", {})
    for target in background.get("targets", []):
        row("a 40 Mbit link, 300 ms of queue", target["row"], target["figure"], target["target"], target["met"])
    return rows


# ---------------------------------------------------------------------------------------------
