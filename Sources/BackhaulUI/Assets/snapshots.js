// Backhaul dashboard: snapshots. Every list is read at the start and after a reconnection;
// later only the lists whose session counts disagree with what the page holds, or that were read
// long ago. Events keep them current in between.

import { api, enc, pool } from './api.js';
import { report } from './page.js';
import { refreshNetwork } from './panels.js';
import { ATTENTION, dropAttention, dropRunning, model, renderSessions, upsertAttention, upsertRunning } from './view.js';

const ATTENTION_PAGE = 100; // tasks of one state and session in the attention list

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

let countsTimer = null;

/// The session counts again soon: once for a burst of events or actions.
export function countsSoon() {
  if (countsTimer) return;
  countsTimer = setTimeout(() => { countsTimer = null; refreshSessions(false).catch(report); }, 700);
}

let refreshing = false;

/// The sessions and their lists, then the network and policy; not while a refresh is under way.
export async function refreshAll(all) {
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
