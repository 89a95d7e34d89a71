"""The tables each section prints."""
from .common import *  # noqa: F403 (the shared helpers and modules)


def print_transfers(title, cases, width):
    """One big transfer's rows (upload or download): wall time, rate, ratio to curl, CPU, peak RSS."""
    print(f"\n{title}")
    print(f"{'case':<{width}}{'wall s':>9}{'MiB/s':>9}{'× curl':>9}{'CPU s/GiB':>11}{'peak RSS MiB':>14}   runs")
    for name, case in cases.items():
        cpu = f"{case['cpu_s_per_gib']:.2f}" if "cpu_s_per_gib" in case else "–"
        peak = f"{case['peak_rss_mib']:.1f}" if "peak_rss_mib" in case else "–"
        print(f"{name:<{width}}{case['wall_s']:>9.2f}{case['mib_per_s']:>9.0f}{case['ratio_to_curl']:>9.2f}{cpu:>11}{peak:>14}   "
              + " ".join(f"{wall:.2f}" for wall in case["walls"]))


def print_webhooks(results):
    hooks = results["webhooks"]
    print(f"\nwebhooks: {hooks['events']} task.completed events delivered (nginx 204 receiver) "
          f"{hooks['all_delivered_s']:.2f} s after enqueue, uploads done at {hooks['uploads_s']:.2f} s: "
          f"{hooks['events_per_s']:.0f} events/s end to end")


def print_many(args, cases, sink):
    print(f"\n{args.files} files of 256 KiB, one batch, to {sink}, median of {args.runs} interleaved rounds")
    print(f"{'case':<28}{'wall s':>9}{'files/s':>10}{'backhauld ÷ this':>18}   runs")
    for name, case in cases.items():
        walls = " ".join(f"{wall:.2f}" for wall in case["walls"])
        print(f"{name:<28}{case['wall_s']:>9.2f}{case['files_per_s']:>10.0f}{case['ratio_backhauld_to_this']:>18.3f}   {walls}")
    if "cpu_ms_per_task" in cases["backhauld"]:
        bh = cases["backhauld"]
        print(f"backhauld: {bh['cpu_s']:.2f} CPU-s over the run, {bh['cpu_ms_per_task']:.3f} ms per task "
              f"(run of the median: user {bh['user_s']:.2f} s, system {bh['system_s']:.2f} s, "
              f"{bh['faults_per_task']:.1f} minor page faults a task); peak RSS {bh['peak_rss_mib']:.1f} MiB")
        if bh.get("threads_ms_per_task"):
            print("  by thread, ms a task (user + system): " + ", ".join(
                f"{name} {t['user']:.3f} + {t['system']:.3f}" for name, t in bh["threads_ms_per_task"].items()))


def print_https(args, cases):
    print(f"\n{args.files} files of 256 KiB over https (a self-signed certificate) to nginx WebDAV on tmpfs, "
          f"median of {args.runs} interleaved rounds")
    print(f"{'case':<22}{'wall s':>9}{'files/s':>10}{'÷ curl -Z':>11}{'CPU ms a task':>15}   connections (each a handshake), runs")
    for name, case in cases.items():
        ratio = f"{case['ratio_to_curl_z']:.3f}" if "ratio_to_curl_z" in case else ""
        cpu = f"{case['cpu_ms_per_task']:.3f}" if "cpu_ms_per_task" in case else ""
        print(f"{name:<22}{case['wall_s']:>9.2f}{case['files_per_s']:>10.0f}{ratio:>11}{cpu:>15}   "
              f"{' '.join(str(c) for c in case['connections'])}; {' '.join(f'{w:.2f}' for w in case['walls'])}")


def print_api(args, results):
    print(f"\nAPI under load (wrk, 2 threads, 16 connections, {args.load_seconds} s)")
    for name in ("get_task", "post_task"):
        case = results[name]
        extra = ""
        if "expected_status" in case:
            extra = f"  {case['expected_status']} answered 201, {case['other_status']} otherwise"
        print(f"{name:<12}{case['requests_per_s']:>10.0f} req/s   p99 {case['p99_ms']:.2f} ms{extra}  {' '.join(case['errors'])}")


def print_scale(args, results, key="scale"):
    s = results[key]
    print(f"\n{key}: {s['tasks']:,} tasks (of {s['tasks_planned']:,}) enqueued in batches of 1,000 in {s['enqueue_s']:.1f} s "
          f"({s['enqueue_cpu_s']:.1f} CPU-s of the daemon); database {s['database_mib']:.0f} MiB")
    if s["per_tenth_s"]:
        print("  seconds per tenth of the way: " + " ".join(f"{t:.2f}" for t in s["per_tenth_s"]))
    print(f"  RSS {s['rss_mib']:.1f} MiB after the enqueue (peak {s['peak_rss_mib']:.1f}), {s['rss_after_load_mib']:.1f} after the GET load, "
          f"{s['rss_after_restart_mib']:.1f} after a restart; stop {s['stop_s']:.2f} s, start to ready "
          f"{s['restart_to_ready_s'] if s['restart_to_ready_s'] is None else round(s['restart_to_ready_s'], 3)} s")
    get = s["get_task"]
    print(f"  GET with them present: {get['requests_per_s']:.0f} req/s, p99 {get['p99_ms']:.2f} ms {' '.join(get['errors'])}")


def print_profile(results):
    profile = results["profile"]
    print(f"\ninstructions per 64 KiB task to nginx (callgrind, {profile['tasks']} tasks minus an idle run): "
          f"backhauld {profile['backhauld_per_task']:,.0f}, one curl process {profile['curl_per_task']:,.0f}")


def print_targets(args, rows):
    print("\nTargets" + (" (--quick: sizes shrunk, the verdicts are not the targets')" if args.quick else ""))
    widths = [max(len(r["section"]) for r in rows), max(len(r["row"]) for r in rows), max(len(r["figure"]) for r in rows),
              max(len(r["target"]) for r in rows)]
    for r in rows:
        verdict = "–" if r["met"] is None else ("met" if r["met"] else "NOT MET")
        print(f"{r['section']:<{widths[0]}}  {r['row']:<{widths[1]}}  {r['figure']:<{widths[2]}}  {r['target']:<{widths[3]}}  {verdict}")
    met = sum(1 for r in rows if r["met"])
    print(f"{met} of {len(rows)} met")
