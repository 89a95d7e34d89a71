// Backhaul dashboard: what the page holds and how it is drawn. DOM work is done in animation
// frames, in batches, writing only (nothing reads layout), and rows off screen are not
// repainted. A running row moves on at its last rate until the next event sets it right.

import { $, button, make } from './page.js';
import { bytes, duration, moved, reason, relative, taskName } from './words.js';

const FINAL = new Set(['completed', 'failed', 'cancelled']);
export const ATTENTION = ['auth_required', 'retrying', 'suspended', 'failed'];
const COUNTED = ['running', 'queued', 'waiting', 'retrying', 'suspended', 'auth_required', 'completed', 'failed', 'cancelled'];
const BATCH = 200; // rows created per frame
const RECENT = 30;

let extrapolate = 10; // seconds a bar moves on at its last rate without news: twice the progress interval

/// The daemon's progress interval (GET /v1/info), when it says one.
export function setProgressInterval(seconds) {
  if (seconds > 0) extrapolate = Math.min(60, 2 * seconds);
}

export const model = {
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

// MARK: Rendering: one frame at a time

let frameWanted = false;
const dirty = new Set();     // running rows to repaint
let toCreate = [];           // running rows without an element yet
const stale = { attention: false, recent: false, totals: false };
let readyWanted = false;     // the next frame with no row left to create marks the page ready

function schedule() {
  if (frameWanted) return;
  frameWanted = true;
  requestAnimationFrame(frame);
}

/// Whether the page is marked ready (data-state, and the 'bh-first-render' mark the browser tests
/// read) once its rows are drawn: wanted when a snapshot is in, no longer when the token form shows.
export function announceReady(wanted) {
  readyWanted = wanted;
  if (wanted) schedule();
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
  else if (readyWanted) {
    readyWanted = false;
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
  // A background transfer says it is yielding: the rate it paces at and the queue it measures.
  const paced = p.background ? ` · background, paced at ${bytes(p.background.rate_bytes_per_second)}/s, queue ${Math.round(p.background.queue_delay_ms)} ms` : '';
  const rateText = (rate > 0 ? `${bytes(rate)}/s` : '') + paced;
  if (shown.rate !== rateText) { row.rate.textContent = rateText; shown.rate = rateText; }
  const eta = rate > 0 && total != null ? duration((total - done) / rate) : '';
  if (shown.eta !== eta) { row.eta.textContent = eta; shown.eta = eta; }
}

/// Rows move on between events: once a second, the visible ones.
export function tick() {
  if (document.hidden) return;
  for (const row of model.running.values()) {
    if (!row.el || !(row.task.progress && row.task.progress.bytes_per_second)) continue;
    if (row.visible) dirty.add(row); else row.stale = true;
  }
  stale.totals = true;
  // "next try in 12s" counts down.
  for (const item of model.attention.values()) if (item.task.state === 'retrying') stale.attention = true;
  schedule();
}

export function upsertRunning(task, at) {
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

export function dropRunning(id) {
  const row = model.running.get(id);
  if (!row) return;
  model.running.delete(id);
  if (row.el) { visibility.unobserve(row.el); row.el.remove(); }
  stale.totals = true;
  schedule();
}

export function upsertAttention(task, at) {
  if (!newest(task.id, at)) return;
  const item = model.attention.get(task.id);
  dropRunning(task.id);
  model.attention.set(task.id, Object.assign(item || {}, { task, at }));
  stale.attention = true;
  schedule();
}

export function dropAttention(id) {
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

export function renderSessions() {
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

/// A task as an event, or an action's answer, shows it: placed in the list its state belongs to.
export function place(task, at) {
  if (task.state === 'running') { upsertRunning(task, at); return; }
  if (ATTENTION.includes(task.state)) { upsertAttention(task, at); } else if (newest(task.id, at)) {
    dropRunning(task.id);
    dropAttention(task.id);
  }
  if (FINAL.has(task.state)) addRecent(task);
}
