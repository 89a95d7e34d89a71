#!/usr/bin/env python3
"""Drives the dashboard in Debian's headless Chromium (chromium-driver + selenium) for
DashboardTests.swift. Each scenario prints one JSON object (its measurements) on the last line of
stdout and exits 0, or prints what went wrong and exits 1. Every wait is bounded.

  dashboard.py interact URL --running ID --auth ID --retrying ID --failed ID --screenshot PNG
  dashboard.py token URL --token T --visible SESSION --hidden SESSION
  dashboard.py reconnect URL --running ID --signal-dir DIR
  dashboard.py thousand URL --rows N --seconds S
"""
import os
import argparse
import json
import signal
import sys
import time
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By

# Installed before any of the page's scripts: long tasks (>50 ms on the main thread) as the
# browser reports them.
PERF_PROBE = """
window.__longTasks = [];
try {
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longTasks.push([e.startTime, e.duration]); })
    .observe({type: 'longtask', buffered: true});
} catch (e) {}
"""


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def wait(description, condition, timeout=20.0, interval=0.1):
    """Polls `condition` until it gives something true. An element the page re-rendered between
    being found and being read (stale) counts as not there yet: the next poll finds it anew."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {description}")
        time.sleep(interval)


def browser(width=1400, height=1000):
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--disable-default-apps"]:
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": PERF_PROBE})
    return driver


def page_state(driver):
    return driver.execute_script("return document.documentElement.dataset.state")


def requested_urls(driver):
    """Every URL the page asked for (the DevTools network log), fragments and queries kept."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def only_own_origin(driver, origin, seen):
    seen.extend(requested_urls(driver))
    resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    foreign = sorted({url for url in seen + resources
                      if not url.startswith("data:") and "{0.scheme}://{0.netloc}".format(urlsplit(url)) != origin})
    check(not foreign, f"the page asked another host: {foreign}")
    return len(set(seen + resources))


def console_errors(driver):
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def progress_of(driver, task):
    return driver.execute_script(
        "const r = document.querySelector(`#running .row[data-id='${arguments[0]}'] progress`); return r ? r.value : null", task)


def interact(arguments):
    driver = browser(1360, 900)
    origin = arguments.url.rstrip("/")
    seen = []
    try:
        driver.get(arguments.url)
        wait("the page to render", lambda: page_state(driver) == "ready")
        result = {}

        # A running upload's bar moves.
        first = wait("the running upload's row", lambda: progress_of(driver, arguments.running))
        time.sleep(3)
        second = progress_of(driver, arguments.running)
        check(second is not None and second > first, f"the bar did not move: {first} then {second}")
        result["bar"] = [first, second]
        row_text = driver.find_element(By.CSS_SELECTOR, f"#running .row[data-id='{arguments.running}']").text
        check("/s" in row_text, f"no rate in the running row: {row_text!r}")
        result["running_row"] = row_text

        # Needs attention, with the reason in words.
        def item(task):
            found = driver.find_elements(By.CSS_SELECTOR, f"#attention .item[data-id='{task}']")
            return found[0] if found else None

        def item_text(task):
            """The entry's text, read where it was found (the list re-renders as tasks change)."""
            found = item(task)
            return found.text if found else None
        auth_text = wait("the auth_required task in Needs attention", lambda: item_text(arguments.auth))
        check("401" in auth_text and "credentials" in auth_text, f"auth_required reason: {auth_text!r}")
        retrying_text = wait("the retrying task in Needs attention", lambda: item_text(arguments.retrying))
        check("503" in retrying_text and "next try" in retrying_text, f"retrying reason: {retrying_text!r}")
        failed_text = wait("the failed task in Needs attention", lambda: item_text(arguments.failed))
        check("403" in failed_text and "refused" in failed_text, f"failed reason: {failed_text!r}")
        result["reasons"] = {"auth_required": auth_text, "retrying": retrying_text, "failed": failed_text}

        # Webhooks with their failing deliveries, the policy with its budgets left.
        hooks = wait("a failing delivery under Webhooks", lambda: "failing" in driver.find_element(By.ID, "webhooks").text and
                     driver.find_element(By.ID, "webhooks").text, timeout=45)
        check("next try" in hooks, f"webhooks: {hooks!r}")
        policy = driver.find_element(By.ID, "policy").text
        check("left of" in policy and "/s" in policy, f"policy: {policy!r}")
        result["webhooks"] = hooks

        # New headers for the auth_required task, from the page.
        # The entry is looked up anew at each step: the list replaces an entry whose task changed.
        item(arguments.auth).find_element(By.CSS_SELECTOR, "button[data-act='headers']").click()
        area = wait("the headers form", lambda: driver.find_elements(
            By.CSS_SELECTOR, f"#attention .item[data-id='{arguments.auth}'] form.headers textarea"))[0]
        area.send_keys("Authorization: Bearer " + arguments.new_token)
        item(arguments.auth).find_element(By.CSS_SELECTOR, "form.headers button[type='submit']").click()
        wait("the renewed task to leave Needs attention", lambda: item(arguments.auth) is None)
        result["toast_after_headers"] = driver.find_element(By.ID, "toast").text

        # Cancel from the page: one click arms, the second confirms.
        row = driver.find_element(By.CSS_SELECTOR, f"#running .row[data-id='{arguments.running}']")
        cancel = row.find_element(By.CSS_SELECTOR, "button[data-act='cancel']")
        cancel.click()
        check(cancel.text == "Confirm", f"the first click should ask for confirmation, the button says {cancel.text!r}")
        cancel.click()
        wait("the cancelled row to leave Running",
             lambda: not driver.find_elements(By.CSS_SELECTOR, f"#running .row[data-id='{arguments.running}']"))
        recent = wait("the cancelled task in Recent",
                      lambda: [entry.text for entry in
                               driver.find_elements(By.CSS_SELECTOR, f"#recent .item[data-id='{arguments.running}']")])
        check("cancelled" in recent[0], f"recent entry: {recent[0]!r}")

        # The screenshot for the README: uploads moving, what needs attention, what just ended
        # (once the last notice has faded).
        wait("the notice to fade", lambda: not driver.find_element(By.ID, "toast").is_displayed(), timeout=10)
        driver.save_screenshot(arguments.screenshot)

        result["requests"] = only_own_origin(driver, origin, seen)
        errors = console_errors(driver)
        check(not errors, f"console errors (CSP violations show here): {errors}")
        return result
    finally:
        driver.quit()


def token(arguments):
    driver = browser()
    origin = arguments.url.rstrip("/")
    seen = []
    try:
        driver.get(arguments.url)
        wait("the token form", lambda: page_state(driver) == "login")
        field = driver.find_element(By.ID, "token")
        field.send_keys("not-a-token-at-all")
        driver.find_element(By.CSS_SELECTOR, "#login button[type='submit']").click()
        wait("the refusal", lambda: "did not accept" in driver.find_element(By.ID, "login-error").text)
        field.send_keys(arguments.token)
        driver.find_element(By.CSS_SELECTOR, "#login button[type='submit']").click()
        wait("the page to render with the token", lambda: page_state(driver) == "ready")
        stored = driver.execute_script("return sessionStorage.getItem('backhaul.token')")
        check(stored == arguments.token, "the token is kept in session storage")
        wait("the event stream to open", lambda: driver.find_element(By.ID, "stream").text == "live", timeout=10)
        sessions = driver.find_element(By.ID, "sessions").text
        check(arguments.visible in sessions, f"the client's session is listed: {sessions!r}")
        check(arguments.hidden not in sessions, f"another client's session is not listed: {sessions!r}")
        # A reload keeps the token (same tab), and asks for nothing.
        driver.refresh()
        wait("the page to render again without asking", lambda: page_state(driver) == "ready")
        # Events of the client's session arrive, others' do not (the test makes one of each).
        wait("an event of the client's session", lambda: driver.execute_script("return window.backhaulDashboard.events") > 0,
             timeout=float(arguments.event_wait))
        rows = driver.execute_script("return [...document.querySelectorAll('[data-id]')].map(e => e.dataset.id)")
        check(arguments.hidden_task not in rows, "a task of another client's session shows")
        result = {"sessions": sessions, "requests": only_own_origin(driver, origin, seen)}
        errors = [e for e in console_errors(driver) if "401" not in e]
        check(not errors, f"console errors: {errors}")
        return result
    finally:
        driver.quit()


def nodes(arguments):
    """The Nodes card lists every node of the fleet (--nodes, comma-separated) and what each runs."""
    driver = browser()
    try:
        driver.get(arguments.url)
        wait("the page to render", lambda: page_state(driver) == "ready")
        expected = arguments.nodes.split(",")
        wait("every node in the Nodes card",
             lambda: all(node in driver.find_element(By.ID, "nodes").text for node in expected))
        text = driver.find_element(By.ID, "nodes").text
        lines = [line for line in text.split("\n") if line.strip()]
        check("running" in text, f"the card says what each node runs: {text!r}")
        errors = console_errors(driver)
        check(not errors, f"console errors: {errors}")
        return {"nodes": text, "lines": len(lines)}
    finally:
        driver.quit()


def notice(arguments):
    """The line above the panels about the state database (#salvage) shows and holds --contains."""
    driver = browser()
    try:
        driver.get(arguments.url)
        wait("the page to render", lambda: page_state(driver) == "ready")
        line = driver.find_element(By.ID, "salvage")
        wait("the state line", lambda: line.is_displayed() and arguments.contains in line.text)
        errors = console_errors(driver)
        check(not errors, f"console errors: {errors}")
        return {"notice": line.text}
    finally:
        driver.quit()


def event_stream_requests(driver):
    """The headers of each request the page made for /v1/events, in order."""
    found = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent" and urlsplit(message["params"]["request"]["url"]).path == "/v1/events":
            found.append({name.lower(): value for name, value in message["params"]["request"]["headers"].items()})
    return found


def reconnect(arguments):
    """The daemon is killed and started again on the same port while the page is open (the test
    does it when DIR/ready appears): the page says so, follows the stream again with
    Last-Event-ID, and the row moves again."""
    driver = browser()
    try:
        driver.get(arguments.url)
        wait("the page to render", lambda: page_state(driver) == "ready")
        wait("the running row", lambda: progress_of(driver, arguments.running))
        wait("a first event", lambda: driver.execute_script("return window.backhaulDashboard.events") > 0)
        before = event_stream_requests(driver)
        check(len(before) == 1 and "last-event-id" not in before[0], f"the first stream starts from now: {before}")
        with open(os.path.join(arguments.signal_dir, "ready"), "w") as marker:
            marker.write("ready\n")
        wait("the page to see the stream drop", lambda: driver.find_element(By.ID, "stream").text == "reconnecting", timeout=30, interval=0.02)
        wait("the stream to be followed again", lambda: driver.find_element(By.ID, "stream").text == "live", timeout=60)
        after = event_stream_requests(driver)
        check(after and all("last-event-id" in headers for headers in after),
              f"every stream after the first sends Last-Event-ID: {after}")
        resumed_from = after[-1]["last-event-id"]
        check(resumed_from.isdigit() and int(resumed_from) > 0, f"Last-Event-ID {resumed_from!r}")
        # The daemon re-queued the interrupted upload (a raw one starts again from zero): its bar
        # changes, then moves forward.
        stale = progress_of(driver, arguments.running)
        wait("the bar to change after the restart", lambda: progress_of(driver, arguments.running) not in (None, stale), timeout=60)
        again = progress_of(driver, arguments.running)
        wait("the bar to move forward", lambda: (progress_of(driver, arguments.running) or 0) > again, timeout=60)
        return {"streams": 1 + len(after), "last_event_id": resumed_from}
    finally:
        driver.quit()


def thousand(arguments):
    driver = browser()
    origin = arguments.url.rstrip("/")
    seen = []
    try:
        started = time.monotonic()
        driver.get(arguments.url)
        wait(f"{arguments.rows} running rows", lambda: page_state(driver) == "ready" and driver.execute_script(
            "return document.querySelectorAll('#running .row').length") >= arguments.rows, timeout=60)
        wall = time.monotonic() - started
        first_render = driver.execute_script(
            "const m = performance.getEntriesByName('bh-first-render'); return m.length ? m[m.length - 1].startTime : null")
        rows = driver.execute_script("return document.querySelectorAll('#running .row').length")
        # Then the page lives with the stream for a while: frame gaps (requestAnimationFrame),
        # long tasks, and how long a click on the page waits for the main thread.
        measured = driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            const seconds = arguments[0];
            const gaps = [];
            const events = window.backhaulDashboard.events;
            const longBefore = window.__longTasks.length;
            let last = performance.now();
            // The window lasts `seconds`, longer (up to `maxSeconds`) until `minEvents` arrived: on
            // a busy machine the sink moves the 1,000 uploads slowly and progress comes in bursts.
            const end = last + seconds * 1000;
            const hardEnd = last + arguments[2] * 1000;
            const minEvents = arguments[1];
            const delays = [];
            const probe = setInterval(() => {
              const asked = performance.now();
              setTimeout(() => delays.push(performance.now() - asked), 0);
            }, 250);
            function tick(now) {
              gaps.push(now - last);
              last = now;
              const enough = window.backhaulDashboard.events - events >= minEvents;
              if (now < end || (!enough && now < hardEnd)) { requestAnimationFrame(tick); return; }
              clearInterval(probe);
              gaps.sort((a, b) => a - b);
              delays.sort((a, b) => a - b);
              const long = window.__longTasks.slice(longBefore);
              done({
                frames: gaps.length,
                frame_p50: gaps[Math.floor(gaps.length * 0.5)],
                frame_p95: gaps[Math.floor(gaps.length * 0.95)],
                frame_max: gaps[gaps.length - 1],
                input_delay_max: delays[delays.length - 1] || 0,
                long_tasks: long.length,
                long_task_max: long.reduce((m, e) => Math.max(m, e[1]), 0),
                long_task_total: long.reduce((s, e) => s + e[1], 0),
                events: window.backhaulDashboard.events - events,
                window_seconds: (now - end) / 1000 + seconds,
              });
            }
            requestAnimationFrame(tick);
        """, arguments.seconds, arguments.min_events, arguments.max_seconds)
        moving = driver.execute_script("""
            const bars = [...document.querySelectorAll('#running .row progress')];
            return bars.filter(b => b.value > 0).length;""")
        result = {"rows": rows, "first_render_ms": first_render, "wall_seconds_to_rows": round(wall, 2),
                  "bars_above_zero": moving}
        result.update(measured)
        result["requests"] = only_own_origin(driver, origin, seen)
        if arguments.screenshot:
            driver.save_screenshot(arguments.screenshot)
        return result
    finally:
        driver.quit()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["interact", "token", "reconnect", "thousand", "nodes", "notice"])
    parser.add_argument("url")
    parser.add_argument("--running")
    parser.add_argument("--auth")
    parser.add_argument("--retrying")
    parser.add_argument("--failed")
    parser.add_argument("--new-token", default="renewed-credential-1")
    parser.add_argument("--screenshot")
    parser.add_argument("--token")
    parser.add_argument("--visible")
    parser.add_argument("--hidden")
    parser.add_argument("--hidden-task", default="")
    parser.add_argument("--event-wait", default="20")
    parser.add_argument("--signal-dir")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--nodes", default="")
    parser.add_argument("--contains", default="")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--min-events", type=int, default=0, help="measure past --seconds until this many events came")
    parser.add_argument("--max-seconds", type=float, default=45, help="...but no longer than this")
    parser.add_argument("--deadline", type=int, default=240, help="seconds before the scenario gives up")
    arguments = parser.parse_args()

    # The test process blocks SIGTERM in its children; this one takes it (and its own alarm) as a
    # reason to stop, so the browser is closed on the way out instead of left behind.
    def stop(number, frame):
        raise Failure(f"stopped by signal {number} (deadline {arguments.deadline} s)")
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGALRM, signal.SIGINT})
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(arguments.deadline)
    try:
        scenarios = {"interact": interact, "token": token, "reconnect": reconnect, "thousand": thousand, "nodes": nodes,
                     "notice": notice}
        result = scenarios[arguments.scenario](arguments)
    except Failure as failure:
        print(f"FAILED: {failure}")
        sys.exit(1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
