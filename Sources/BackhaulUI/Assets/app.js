// Backhaul dashboard (SPEC §4.3). It talks only to the daemon that served it: the REST API for
// snapshots and actions, GET /v1/events for live changes. DOM work is done in animation frames,
// in batches, writing only (nothing reads layout), and rows off screen are not repainted.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const TOKEN_KEY = 'backhaul.token';
  const FINAL = new Set(['completed', 'failed', 'cancelled']);
  const ATTENTION = ['auth_required', 'retrying', 'suspended', 'failed'];
  const COUNTED = ['running', 'queued', 'waiting', 'retrying', 'suspended', 'auth_required', 'completed', 'failed', 'cancelled'];
  const BATCH = 200;          // rows created per frame
  const ATTENTION_PAGE = 100; // tasks of one state and session in the attention list
  const RECENT = 30;

  let token = sessionStorage.getItem(TOKEN_KEY) || '';
  let extrapolate = 10; // seconds a bar moves on at its last rate without news: twice the progress interval
  let streamAbort = null;
  let started = false;

  const model = {
    sessions: [],
    counts: new Map(),    // session id → task_counts last seen
    running: new Map(),   // task id → row {task, at, el, bar, cells, shown, visible, stale}
    attention: new Map(), // task id → {task, at, el}
    recent: [],
    latest: new Map(),    // task id → when the newest word about it arrived (older snapshots lose)
    loadedAt: new Map(),  // "session state" → when its list was last read
  };

  /// Whether news about a task dated `at` is the newest yet (and notes it).
  function newest(id, at) {
    const known = model.latest.get(id);
    if (known !== undefined && known > at) return false;
    model.latest.set(id, at);
    return true;
  }

  // MARK: API

  class APIError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
      this.status = status;
    }
  }

  function headers(extra) {
    const h = Object.assign({ Accept: 'application/json' }, extra);
    if (token) h.Authorization = 'Bearer ' + token;
    return h;
  }

  async function api(method, path, body) {
    const init = { method, headers: headers(body === undefined ? {} : { 'Content-Type': 'application/json' }), cache: 'no-store' };
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await fetch(path, init);
    const text = await response.text();
    let value = null;
    try { value = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
    if (response.status === 401) {
      askForToken(token ? 'The daemon did not accept this token.' : '');
      throw new APIError(401, value);
    }
    if (!response.ok) throw new APIError(response.status, value);
    return value;
  }

  const enc = encodeURIComponent;

  /// Runs `jobs` (functions returning promises) at most `width` at a time: the browser keeps six
  /// connections to a host and the event stream holds one.
  async function pool(jobs, width) {
    let next = 0;
    const worker = async () => { while (next < jobs.length) { const job = jobs[next++]; try { await job(); } catch (e) { report(e); } } };
    await Promise.all(Array.from({ length: Math.min(width, jobs.length) }, worker));
  }

  // MARK: Words

  const ERROR_WORDS = {
    cancelled: 'Cancelled',
    timed_out: 'Timed out: no byte moved for too long, or the task outlived its resource timeout',
    cannot_find_host: 'The server’s name does not resolve (DNS)',
    cannot_connect_to_host: 'Cannot connect to the server (refused or unreachable)',
    network_connection_lost: 'The connection dropped during the transfer',
    not_connected_to_internet: 'No network, and the task may not wait for one',
    bad_server_response: 'The server refused the request',
    user_authentication_required: 'The server asked for credentials that never came',
    data_not_allowed: 'The network in force is not allowed for this task',
    file_does_not_exist: 'The file is gone',
    no_permissions_to_read_file: 'The file can no longer be read',
    data_length_exceeds_maximum: 'The file is too large for the protocol',
    secure_connection_failed: 'TLS failed (certificate or handshake)',
    file_changed: 'The file changed while it was being sent',
    cannot_create_file: 'The destination cannot be created',
    cannot_write_to_file: 'The destination cannot be written (disk full?)',
    cannot_move_file: 'The finished download cannot be moved into place',
    download_checksum_mismatch: 'The download does not match its SHA-256',
  };
  const STATUS_WORDS = {
    400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 408: 'Request Timeout',
    409: 'Conflict', 410: 'Gone', 413: 'Content Too Large', 415: 'Unsupported Media Type', 425: 'Too Early', 429: 'Too Many Requests',
    500: 'Internal Server Error', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout', 507: 'Insufficient Storage',
  };
  const WAITING_WORDS = {
    no_connectivity: 'no network', cellular_not_allowed: 'cellular not allowed', expensive_network_not_allowed: 'expensive network not allowed',
    constrained_network_not_allowed: 'constrained network not allowed', discretionary_deferred: 'discretionary: waiting for a good moment',
    budget_exhausted: 'today’s budget is spent', scheduled: 'scheduled for later', host_connection_limit: 'host connection limit',
    session_finishing: 'session finishing', session_disabled: 'session paused',
  };

  const statusText = (status) => `HTTP ${status}${STATUS_WORDS[status] ? ' ' + STATUS_WORDS[status] : ''}`;

  function errorWords(error) {
    if (!error) return '';
    let text = ERROR_WORDS[error.name] || error.name || `error ${error.code}`;
    if (error.http_status) text += ` (${statusText(error.http_status)})`;
    // The daemon's message, unless it only repeats the status.
    if (error.message && !(error.http_status && /^the server answered \d+$/.test(error.message))) text += ` — ${error.message}`;
    return text;
  }

  /// Why a task needs attention, in words.
  function reason(task) {
    const last = task.last_error !== undefined ? task.last_error : task.error;
    const status = task.response && task.response.status;
    switch (task.state) {
      case 'auth_required':
        return `The server answered ${statusText(status || 401)}: the transfer waits for new credentials. Send new headers to queue it again.`;
      case 'retrying': {
        const why = last ? errorWords(last) : status ? `The server answered ${statusText(status)}` : 'A transient failure';
        const when = task.next_attempt_at ? `, next try ${due(task.next_attempt_at)}` : '';
        return `${why}. Attempt ${task.attempts || 1} failed${when}.`;
      }
      case 'suspended': return 'Suspended by a client; resume it to go on.';
      case 'failed': return errorWords(task.error) || 'Failed';
      case 'cancelled': return task.cancellation ? `Cancelled: ${task.cancellation.reason.replace(/_/g, ' ')}` : 'Cancelled';
      case 'waiting': return `Waiting: ${WAITING_WORDS[task.waiting_reason] || task.waiting_reason || ''}`;
      default: return '';
    }
  }

  // MARK: Formatting

  function bytes(n) {
    if (n == null) return '?';
    if (n < 1024) return `${n} B`;
    const units = ['KiB', 'MiB', 'GiB', 'TiB'];
    let value = n / 1024, unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
    return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
  }

  function duration(seconds) {
    if (seconds == null || !isFinite(seconds)) return '';
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 60) return `${seconds}s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${Math.floor(seconds % 3600 / 60)}m`;
    return `${Math.floor(seconds / 86400)}d ${Math.floor(seconds % 86400 / 3600)}h`;
  }

  function relative(iso) {
    const seconds = (Date.parse(iso) - Date.now()) / 1000;
    if (!isFinite(seconds)) return '';
    if (Math.abs(seconds) < 1.5) return 'just now';
    return seconds >= 0 ? `in ${duration(seconds)}` : `${duration(-seconds)} ago`;
  }

  /// When something planned happens: "in 12s", or "now" once the time has come.
  function due(iso) {
    const seconds = (Date.parse(iso) - Date.now()) / 1000;
    return seconds >= 1 ? `in ${duration(seconds)}` : 'now';
  }

  function taskName(task) {
    if (task.description) return task.description;
    const path = (task.file && task.file.path) || (task.download && task.download.destination) || (task.request && task.request.url) || task.id;
    return path.slice(path.lastIndexOf('/') + 1) || path;
  }

  function moved(task) {
    const p = task.progress || {};
    return (task.kind === 'download' ? p.bytes_received : p.bytes_sent) || 0;
  }

  function make(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text != null) node.textContent = text;
    return node;
  }

  function button(action, label, className) {
    const node = make('button', className || '', label);
    node.type = 'button';
    node.dataset.act = action;
    return node;
  }

  // MARK: Rendering: one frame at a time

  let frameWanted = false;
  const dirty = new Set();     // running rows to repaint
  let toCreate = [];           // running rows without an element yet
  const stale = { attention: false, recent: false, totals: false };
  let firstRender = false;

  function schedule() {
    if (frameWanted) return;
    frameWanted = true;
    requestAnimationFrame(frame);
  }

  function frame(now) {
    frameWanted = false;
    if (toCreate.length) {
      const fragment = document.createDocumentFragment();
      const batch = toCreate.splice(0, BATCH);
      for (const row of batch) {
        if (row.el || model.running.get(row.task.id) !== row) continue;
        build(row);
        paint(row, now);
        fragment.appendChild(row.el);
      }
      $('running').appendChild(fragment);
    }
    for (const row of dirty) if (row.el) paint(row, now);
    dirty.clear();
    if (stale.attention) renderAttention();
    if (stale.recent) renderRecent();
    if (stale.totals) renderTotals();
    if (toCreate.length) schedule();
    else if (started && !firstRender) {
      firstRender = true;
      performance.mark('bh-first-render');
      document.documentElement.dataset.state = 'ready';
    }
  }

  const visibility = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const row = entry.target.bhRow;
      if (!row) continue;
      row.visible = entry.isIntersecting;
      if (row.visible && row.stale) { dirty.add(row); schedule(); }
    }
  });

  function build(row) {
    const task = row.task;
    const el = make('div', 'row');
    el.dataset.id = task.id;
    const name = make('span', 'name', taskName(task));
    name.title = `${task.id}\n${(task.file && task.file.path) || (task.download && task.download.destination) || ''}\n→ ${task.request ? task.request.url : ''}`;
    const session = make('span', 'muted', task.session_id);
    const bar = make('progress', 'bar');
    bar.max = 1;
    const amount = make('span', 'num');
    const rate = make('span', 'num');
    const eta = make('span', 'num');
    const acts = make('span', 'acts');
    acts.append(button('suspend', 'Suspend'), button('cancel', 'Cancel', 'danger'));
    el.append(name, session, bar, amount, rate, eta, acts);
    el.bhRow = row;
    Object.assign(row, { el, bar, amount, rate, eta, shown: {}, visible: true });
    visibility.observe(el);
  }

  /// Writes a running row's figures: the last ones the daemon sent, moved on at the last rate
  /// until the next event sets them right. Only changed values are written.
  function paint(row, now) {
    row.stale = false;
    const task = row.task, p = task.progress || {};
    const total = p.bytes_total, rate = p.bytes_per_second || 0;
    let done = moved(task) + rate * Math.min(Math.max(0, (now - row.at) / 1000), extrapolate);
    if (total != null) done = Math.min(done, total);
    const shown = row.shown;
    const fraction = total ? Math.round(done / total * 1000) / 1000 : 0;
    if (shown.fraction !== fraction) { row.bar.value = fraction; shown.fraction = fraction; }
    const amount = total != null ? `${bytes(Math.round(done))} / ${bytes(total)}` : bytes(Math.round(done));
    if (shown.amount !== amount) { row.amount.textContent = amount; shown.amount = amount; }
    const rateText = rate > 0 ? `${bytes(rate)}/s` : '';
    if (shown.rate !== rateText) { row.rate.textContent = rateText; shown.rate = rateText; }
    const eta = rate > 0 && total != null ? duration((total - done) / rate) : '';
    if (shown.eta !== eta) { row.eta.textContent = eta; shown.eta = eta; }
  }

  // Rows move on between events: once a second, the visible ones.
  setInterval(() => {
    if (document.hidden) return;
    for (const row of model.running.values()) {
      if (!row.el || !(row.task.progress && row.task.progress.bytes_per_second)) continue;
      if (row.visible) dirty.add(row); else row.stale = true;
    }
    stale.totals = true;
    // "next try in 12s" counts down.
    for (const item of model.attention.values()) if (item.task.state === 'retrying') stale.attention = true;
    schedule();
  }, 1000);

  function upsertRunning(task, at) {
    if (!newest(task.id, at)) return; // an event newer than this snapshot already said more
    let row = model.running.get(task.id);
    dropAttention(task.id);
    if (!row) {
      row = { task, at, el: null };
      model.running.set(task.id, row);
      toCreate.push(row);
    } else {
      row.task = task;
      row.at = at;
      if (row.visible) dirty.add(row); else row.stale = true;
    }
    stale.totals = true;
    schedule();
  }

  function dropRunning(id) {
    const row = model.running.get(id);
    if (!row) return;
    model.running.delete(id);
    if (row.el) { visibility.unobserve(row.el); row.el.remove(); }
    stale.totals = true;
    schedule();
  }

  function upsertAttention(task, at) {
    if (!newest(task.id, at)) return;
    const item = model.attention.get(task.id);
    dropRunning(task.id);
    model.attention.set(task.id, Object.assign(item || {}, { task, at }));
    stale.attention = true;
    schedule();
  }

  function dropAttention(id) {
    const item = model.attention.get(id);
    if (!item) return;
    model.attention.delete(id);
    if (item.el) item.el.remove();
    stale.attention = true;
    schedule();
  }

  const ORDER = { auth_required: 0, retrying: 1, suspended: 2, failed: 3 };

  function renderAttention() {
    stale.attention = false;
    const list = $('attention');
    const items = [...model.attention.values()].sort((a, b) =>
      ORDER[a.task.state] - ORDER[b.task.state] || (b.task.finished_at || '').localeCompare(a.task.finished_at || ''));
    let previous = null;
    for (const item of items) {
      if (!item.el || item.el.dataset.state !== item.task.state) {
        const fresh = attentionItem(item.task);
        if (item.el) item.el.replaceWith(fresh);
        item.el = fresh;
      } else {
        const why = reason(item.task);
        if (item.why !== why) item.el.querySelector('.why').textContent = why;
      }
      item.why = reason(item.task);
      // Moved only when out of place, so an open form keeps its text and focus.
      const expected = previous ? previous.nextSibling : list.firstChild;
      if (expected !== item.el) list.insertBefore(item.el, expected);
      previous = item.el;
    }
    $('attention-empty').hidden = items.length > 0;
    $('attention-count').textContent = items.length ? `(${items.length})` : '';
  }

  function attentionItem(task) {
    const el = make('div', 'item');
    el.dataset.id = task.id;
    el.dataset.state = task.state;
    const line = make('div', 'line');
    const name = make('span', 'name', taskName(task));
    name.title = `${task.id} (${task.session_id})`;
    const acts = make('span', 'acts');
    if (task.state === 'auth_required') acts.append(button('headers', 'New headers'));
    if (task.state === 'suspended') acts.append(button('resume', 'Resume'));
    if (task.state === 'retrying') acts.append(button('suspend', 'Suspend'));
    if (task.state !== 'failed') acts.append(button('cancel', 'Cancel', 'danger'));
    line.append(make('span', `badge s-${task.state}`, task.state.replace('_', ' ')), name, make('span', 'muted', task.session_id), acts);
    el.append(line, make('div', 'why', reason(task)));
    return el;
  }

  function headersForm() {
    const form = make('form', 'headers');
    const area = make('textarea');
    area.name = 'headers';
    area.rows = 3;
    area.required = true;
    area.placeholder = 'Authorization: Bearer …\nX-Other-Header: value';
    area.spellcheck = false;
    const send = make('button', '', 'Send headers');
    send.type = 'submit';
    form.append(make('label', 'muted', 'One header a line, Name: value. They replace headers of the same name; the task is queued again.'), area, send);
    return form;
  }

  function addRecent(task) {
    model.recent = [task, ...model.recent.filter((t) => t.id !== task.id)].slice(0, RECENT);
    stale.recent = true;
    schedule();
  }

  function renderRecent() {
    stale.recent = false;
    const list = $('recent');
    const fragment = document.createDocumentFragment();
    for (const task of model.recent) {
      const el = make('div', 'item');
      el.dataset.id = task.id;
      const line = make('div', 'line');
      const size = task.progress && task.progress.bytes_total;
      line.append(make('span', `badge s-${task.state}`, task.state), make('span', 'name', taskName(task)),
        make('span', 'muted', `${task.session_id} · ${size != null ? bytes(size) + ' · ' : ''}${task.finished_at ? relative(task.finished_at) : ''}`));
      el.append(line);
      if (task.state !== 'completed') el.append(make('div', 'why', reason(task)));
      fragment.append(el);
    }
    list.replaceChildren(fragment);
    $('recent-empty').hidden = model.recent.length > 0;
  }

  function renderTotals() {
    stale.totals = false;
    const totals = {};
    for (const session of model.sessions) {
      for (const state of COUNTED) totals[state] = (totals[state] || 0) + ((session.task_counts || {})[state] || 0);
    }
    const ul = $('totals');
    const fragment = document.createDocumentFragment();
    for (const state of COUNTED) {
      if (!totals[state] && !['running', 'queued'].includes(state)) continue;
      const li = make('li', `s-${state}`);
      li.append(make('b', '', (totals[state] || 0).toLocaleString()), ` ${state.replace('_', ' ')}`);
      fragment.append(li);
    }
    ul.replaceChildren(fragment);
    let rate = 0;
    for (const row of model.running.values()) rate += (row.task.progress && row.task.progress.bytes_per_second) || 0;
    $('rate').textContent = rate ? `${bytes(rate)}/s` : '';
    $('running-count').textContent = model.running.size ? `(${model.running.size.toLocaleString()})` : '';
    $('running-empty').hidden = model.running.size > 0;
  }

  function renderSessions() {
    const table = $('sessions');
    const head = make('tr');
    head.append(make('th', '', 'Session'));
    // Running and queued always; other states once some session has such tasks.
    const columns = COUNTED.filter((state) => state === 'running' || state === 'queued' ||
      model.sessions.some((session) => (session.task_counts || {})[state]));
    for (const state of columns) head.append(make('th', `s-${state}`, state.replace('_', ' ')));
    const rows = [head];
    for (const session of model.sessions) {
      const tr = make('tr');
      const name = make('td', '', session.id + (session.enabled === false ? ' (paused)' : ''));
      tr.append(name);
      for (const state of columns) tr.append(make('td', '', ((session.task_counts || {})[state] || 0).toLocaleString()));
      rows.push(tr);
    }
    if (!model.sessions.length) {
      const tr = make('tr');
      const td = make('td', 'muted', 'No session yet.');
      td.colSpan = columns.length + 1;
      tr.append(td);
      rows.push(tr);
    }
    table.replaceChildren(...rows);
    stale.totals = true;
    schedule();
  }

  function facts(list, pairs) {
    const fragment = document.createDocumentFragment();
    for (const [term, value] of pairs) fragment.append(make('dt', '', term), make('dd', '', value));
    list.replaceChildren(fragment);
  }

  function renderNetwork(network) {
    const flags = [network.expensive && 'expensive', network.constrained && 'constrained'].filter(Boolean).join(', ');
    facts($('network'), [
      ['Network', `${network.type}${network.interface ? ' (' + network.interface + ')' : ''}${flags ? ', ' + flags : ''}`],
      ['Source', network.source === 'override' ? 'set by a host agent or operator (override)' : 'detected from the routing table'],
    ]);
    if (document.activeElement === null || !$('override').contains(document.activeElement)) {
      $('net-type').value = network.type;
      $('net-expensive').checked = !!network.expensive;
      $('net-constrained').checked = !!network.constrained;
    }
  }

  function renderPolicy(policy) {
    const byType = (map) => Object.entries(map || {}).map(([type, value]) => `${type} ${bytes(value)}/s`).join(', ');
    const limits = [];
    if (policy.bandwidth_limit) limits.push(`${bytes(policy.bandwidth_limit)}/s`);
    if (byType(policy.bandwidth_limit_by_network)) limits.push(byType(policy.bandwidth_limit_by_network));
    for (const entry of policy.bandwidth_schedule || []) limits.push(`${entry.from}–${entry.to} ${bytes(entry.limit)}/s`);
    const budgets = Object.entries(policy.discretionary_daily_budget || {}).map(([type, budget]) => {
      const left = (policy.budget_remaining || {})[type];
      return `${type}: ${left != null ? bytes(left) + ' left of ' : ''}${bytes(budget)}`;
    });
    const window = policy.discretionary_window;
    facts($('policy'), [
      ['Transfers', policy.transfers_enabled === false ? 'turned off (new tasks refused)' : 'on'],
      ['Bandwidth', limits.length ? limits.join('; ') : 'no limit'],
      ['Discretionary window', window ? `${window.from}–${window.to} (daemon’s local time)` : 'any time'],
      ['Daily budgets', budgets.length ? budgets.join('; ') : 'none'],
    ]);
  }

  function renderWebhooks(hooks) {
    const fragment = document.createDocumentFragment();
    for (const { hook, failing } of hooks) {
      const el = make('div', 'item');
      const line = make('div', 'line');
      const state = hook.enabled ? (failing.length ? 'd-failed' : 'd-ok') : 's-cancelled';
      line.append(make('span', `badge ${state}`, hook.enabled ? (failing.length ? `${failing.length} failing` : 'ok') : 'disabled'),
        make('span', 'name', hook.url), make('span', 'muted', hook.session_id));
      el.append(line);
      if (!hook.enabled && hook.disabled_reason) el.append(make('div', 'why', `Disabled: ${hook.disabled_reason}`));
      for (const delivery of failing.slice(0, 5)) {
        const why = delivery.last_status ? statusText(delivery.last_status) : delivery.last_error || 'no answer';
        const next = delivery.state === 'pending' && delivery.next_attempt_at ? `, next try ${due(delivery.next_attempt_at)}` : ', given up';
        el.append(make('div', 'why muted', `${delivery.event_type}: ${why} after ${delivery.attempts} attempt${delivery.attempts === 1 ? '' : 's'}${next}`));
      }
      fragment.append(el);
    }
    $('webhooks').replaceChildren(fragment);
    $('webhooks-empty').hidden = hooks.length > 0;
  }

  // MARK: Snapshots

  /// Reads one session's tasks in one state and makes the model agree with it, except where an
  /// event that arrived after the read began already said something newer.
  async function loadList(sessionID, state) {
    const at = performance.now();
    const tasks = [];
    let cursor = null, pages = 0;
    const limit = state === 'running' ? 1000 : ATTENTION_PAGE;
    do {
      const page = await api('GET', `/v1/sessions/${enc(sessionID)}/tasks?state=${state}&limit=${limit}${cursor ? '&cursor=' + enc(cursor) : ''}`);
      tasks.push(...page.tasks);
      cursor = page.next_cursor;
      pages++;
    } while (cursor && state === 'running' && pages < 10);
    model.loadedAt.set(`${sessionID} ${state}`, at);
    const seen = new Set();
    for (const task of tasks) {
      seen.add(task.id);
      if (state === 'running') upsertRunning(task, at); else upsertAttention(task, at);
    }
    const held = state === 'running' ? model.running : model.attention;
    for (const [id, entry] of held) {
      if (entry.task.session_id === sessionID && entry.task.state === state && !seen.has(id) && entry.at <= at) {
        if (state === 'running') dropRunning(id); else dropAttention(id);
      }
    }
  }

  function heldCount(map, sessionID, state) {
    let n = 0;
    for (const entry of map.values()) if (entry.task.session_id === sessionID && entry.task.state === state) n++;
    return n;
  }

  /// Session counts, then the lists whose counts disagree with what the page holds (or that
  /// were read long ago). `all`: every list again (start, reconnection).
  async function refreshSessions(all) {
    const value = await api('GET', '/v1/sessions');
    model.sessions = value.sessions || [];
    renderSessions();
    const ids = new Set(model.sessions.map((s) => s.id));
    for (const [id, row] of model.running) if (!ids.has(row.task.session_id)) dropRunning(id);
    for (const [id, item] of model.attention) if (!ids.has(item.task.session_id)) dropAttention(id);
    const now = performance.now();
    const jobs = [];
    for (const session of model.sessions) {
      const counts = session.task_counts || {};
      for (const state of ['running', ...ATTENTION]) {
        const count = counts[state] || 0;
        const map = state === 'running' ? model.running : model.attention;
        const held = heldCount(map, session.id, state);
        const last = model.loadedAt.get(`${session.id} ${state}`);
        const age = last === undefined ? Infinity : now - last;
        // A big running list is read again at most every 15 s: events keep it current between.
        const minimum = state === 'running' && held > 200 ? 15000 : 4000;
        const disagrees = held !== Math.min(count, state === 'running' ? Infinity : ATTENTION_PAGE);
        if (all || (disagrees && age > minimum) || (count > 0 && age > 60000)) jobs.push(() => loadList(session.id, state));
      }
    }
    await pool(jobs, 4);
    for (const [id, at] of model.latest) {
      if (now - at > 120000 && !model.running.has(id) && !model.attention.has(id)) model.latest.delete(id);
    }
  }

  async function refreshNetwork() {
    const [network, policy] = await Promise.all([api('GET', '/v1/network'), api('GET', '/v1/policy')]);
    renderNetwork(network);
    renderPolicy(policy);
  }

  async function refreshWebhooks() {
    const hooks = [];
    const jobs = model.sessions.slice(0, 50).map((session) => async () => {
      const list = await api('GET', `/v1/sessions/${enc(session.id)}/webhooks`);
      for (const hook of (list.webhooks || []).slice(0, 20)) {
        const base = `/v1/webhooks/${enc(hook.id)}/deliveries`;
        const [failed, pending] = await Promise.all([api('GET', `${base}?state=failed&limit=20`), api('GET', `${base}?state=pending&limit=100`)]);
        const failing = [...pending.deliveries.filter((d) => d.attempts > 0), ...failed.deliveries];
        hooks.push({ hook, failing });
      }
    });
    await pool(jobs, 3);
    hooks.sort((a, b) => a.hook.session_id.localeCompare(b.hook.session_id) || a.hook.url.localeCompare(b.hook.url));
    renderWebhooks(hooks);
  }

  // MARK: Events

  /// A task as an event, or an action's answer, shows it: placed in the list its state belongs to.
  function place(task, at) {
    if (task.state === 'running') { upsertRunning(task, at); return; }
    if (ATTENTION.includes(task.state)) { upsertAttention(task, at); } else if (newest(task.id, at)) {
      dropRunning(task.id);
      dropAttention(task.id);
    }
    if (FINAL.has(task.state)) addRecent(task);
  }

  let countsTimer = null;
  function countsSoon() {
    if (countsTimer) return;
    countsTimer = setTimeout(() => { countsTimer = null; refreshSessions(false).catch(report); }, 700);
  }

  const stats = { events: 0 };

  function onEvent(type, data) {
    stats.events++;
    let payload;
    try { payload = JSON.parse(data); } catch (_) { return; }
    const task = payload && payload.data;
    const at = performance.now();
    if (type === 'task.progress' && task && task.state === 'running') { upsertRunning(task, at); return; }
    if (task && task.id && type.startsWith('task.')) place(task, at);
    countsSoon();
  }

  function setStream(text, className) {
    const pill = $('stream');
    pill.textContent = text;
    pill.className = `pill ${className || ''}`;
  }

  /// `GET /v1/events` read with fetch (EventSource cannot send a bearer token), parsed as
  /// Server-Sent Events, followed again after a drop from the last id seen (Last-Event-ID).
  async function follow(connected) {
    let lastID = null, retry = 2000, first = true;
    for (;;) {
      const controller = new AbortController();
      streamAbort = controller;
      let watchdog = null;
      try {
        const extra = lastID ? { 'Last-Event-ID': lastID } : {};
        const response = await fetch('/v1/events', { headers: headers(Object.assign({ Accept: 'text/event-stream' }, extra)),
                                                     cache: 'no-store', signal: controller.signal });
        if (response.status === 401) { askForToken('The daemon did not accept this token.'); return; }
        if (!response.ok) throw new APIError(response.status, null);
        setStream('live', 'live');
        connected();
        if (!first) refreshAll(true);
        first = false;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        const arm = () => { clearTimeout(watchdog); watchdog = setTimeout(() => controller.abort(), 45000); };
        arm();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          arm();
          buffer += value.indexOf('\r') >= 0 ? value.replace(/\r\n?/g, '\n') : value;
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            let type = 'message', data = '';
            for (const line of block.split('\n')) {
              const colon = line.indexOf(':');
              if (colon === 0) continue;
              const field = colon < 0 ? line : line.slice(0, colon);
              const content = colon < 0 ? '' : line.slice(colon + (line[colon + 1] === ' ' ? 2 : 1));
              if (field === 'id') lastID = content;
              else if (field === 'event') type = content;
              else if (field === 'data') data += (data ? '\n' : '') + content;
              else if (field === 'retry' && /^\d+$/.test(content)) retry = Math.min(30000, Math.max(500, +content));
            }
            if (data) onEvent(type, data);
          }
        }
      } catch (error) {
        if (streamAbort !== controller) return; // a new token started another stream
      } finally {
        clearTimeout(watchdog);
      }
      if (streamAbort !== controller) return;
      connected();
      setStream('reconnecting', 'down');
      await new Promise((resolve) => setTimeout(resolve, retry));
    }
  }

  // MARK: Actions

  let toastTimer = null;
  function toast(text, bad) {
    const node = $('toast');
    node.textContent = text;
    node.className = `toast${bad ? ' bad' : ''}`;
    node.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { node.hidden = true; }, bad ? 8000 : 4000);
  }

  function report(error) {
    if (error && error.status === 401) return;
    toast(error && error.message ? error.message : String(error), true);
  }

  document.addEventListener('click', async (event) => {
    const target = event.target.closest('button[data-act]');
    if (!target) return;
    const holder = target.closest('[data-id]');
    const id = holder && holder.dataset.id;
    const action = target.dataset.act;
    if (action === 'headers') {
      const form = holder.querySelector('form.headers');
      if (form) form.remove(); else { holder.append(headersForm()); holder.querySelector('textarea').focus(); }
      return;
    }
    if (action === 'cancel' && !target.classList.contains('armed')) {
      // A second click within three seconds confirms.
      target.classList.add('armed');
      target.textContent = 'Confirm';
      setTimeout(() => { target.classList.remove('armed'); target.textContent = 'Cancel'; }, 3000);
      return;
    }
    target.disabled = true;
    try {
      const task = await api('POST', `/v1/tasks/${enc(id)}/${action}`);
      place(task, performance.now());
      toast(`${taskName(task)}: ${task.state}`);
      countsSoon();
    } catch (error) {
      report(error);
    } finally {
      target.disabled = false;
    }
  });

  document.addEventListener('submit', async (event) => {
    const form = event.target;
    if (!form.classList.contains('headers')) return;
    event.preventDefault();
    const id = form.closest('[data-id]').dataset.id;
    const headers = {};
    for (const line of form.elements.headers.value.split('\n')) {
      if (!line.trim()) continue;
      const colon = line.indexOf(':');
      if (colon <= 0) { toast(`Not a header line: ${line}`, true); return; }
      headers[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
    }
    try {
      const task = await api('PATCH', `/v1/tasks/${enc(id)}`, { request: { headers } });
      place(task, performance.now());
      toast(`${taskName(task)}: new headers sent, ${task.state}`);
      countsSoon();
    } catch (error) {
      report(error);
    }
  });

  $('override').addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      renderNetwork(await api('PUT', '/v1/network', { type: $('net-type').value, expensive: $('net-expensive').checked,
                                                       constrained: $('net-constrained').checked }));
      toast('Network override set');
    } catch (error) { report(error); }
  });

  $('net-detect').addEventListener('click', async () => {
    try {
      renderNetwork(await api('DELETE', '/v1/network'));
      toast('Back to detection');
    } catch (error) { report(error); }
  });

  // MARK: Token and start

  function askForToken(message) {
    if (streamAbort) { streamAbort.abort(); streamAbort = null; }
    started = false;
    document.documentElement.dataset.state = 'login';
    $('main').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = message || '';
    $('token').focus();
  }

  $('login').addEventListener('submit', (event) => {
    event.preventDefault();
    token = $('token').value.trim();
    sessionStorage.setItem(TOKEN_KEY, token);
    $('token').value = '';
    start();
  });

  $('forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    token = '';
    location.reload();
  });

  let refreshing = false;
  async function refreshAll(all) {
    if (refreshing) return;
    refreshing = true;
    try {
      await refreshSessions(all);
      await refreshNetwork();
    } catch (error) {
      report(error);
    } finally {
      refreshing = false;
    }
  }

  async function start() {
    let info;
    try {
      info = await api('GET', '/v1/info');
    } catch (error) {
      if (error.status !== 401) { setStream('unreachable', 'down'); report(error); setTimeout(start, 3000); }
      return;
    }
    $('login').hidden = true;
    $('main').hidden = false;
    $('forget').hidden = !token;
    $('version').textContent = `backhauld ${info.version || ''}`;
    if (info.progress_interval > 0) extrapolate = Math.min(60, 2 * info.progress_interval);
    document.documentElement.dataset.state = 'loading';
    firstRender = false;
    // The snapshot is read once the stream is open, so no change falls between the two.
    await new Promise((resolve) => { follow(resolve); setTimeout(resolve, 5000); });
    await refreshAll(true);
    started = true;
    schedule();
    refreshWebhooks().catch(report);
  }

  // What the browser tests read: how many events arrived, and when the first full render was.
  window.backhaulDashboard = Object.freeze({ get events() { return stats.events; } });

  setInterval(() => { if (started && !document.hidden) refreshAll(false); }, 5000);
  setInterval(() => { if (started && !document.hidden) refreshWebhooks().catch(report); }, 10000);
  start();
})();
