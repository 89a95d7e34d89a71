// Backhaul dashboard: the event stream. GET /v1/events moves the running bars (task.progress)
// and places a task in its list when its state changes; the session counts follow soon after.

import { APIError, headers, tokenRefused } from './api.js';
import { $ } from './page.js';
import { countsSoon, refreshAll } from './snapshots.js';
import { place, upsertRunning } from './view.js';

let streamAbort = null;
let events = 0;

/// How many events have arrived (the browser tests read it).
export const eventCount = () => events;

/// Ends the stream being followed (a new token starts another).
export function stopFollowing() {
  if (streamAbort) { streamAbort.abort(); streamAbort = null; }
}

function onEvent(type, data) {
  events++;
  let payload;
  try { payload = JSON.parse(data); } catch (_) { return; }
  const task = payload && payload.data;
  const at = performance.now();
  if (type === 'task.progress' && task && task.state === 'running') { upsertRunning(task, at); return; }
  if (task && task.id && type.startsWith('task.')) place(task, at);
  countsSoon();
}

export function setStream(text, className) {
  const pill = $('stream');
  pill.textContent = text;
  pill.className = `pill ${className || ''}`;
}

/// `GET /v1/events` read with fetch (EventSource cannot send a bearer token), parsed as
/// Server-Sent Events, followed again after a drop from the last id seen (Last-Event-ID).
export async function follow(connected) {
  let lastID = null, retry = 2000, first = true;
  for (;;) {
    const controller = new AbortController();
    streamAbort = controller;
    let watchdog = null;
    try {
      const extra = lastID ? { 'Last-Event-ID': lastID } : {};
      const response = await fetch('/v1/events', { headers: headers(Object.assign({ Accept: 'text/event-stream' }, extra)),
                                                   cache: 'no-store', signal: controller.signal });
      if (response.status === 401) { tokenRefused('The daemon did not accept this token.'); return; }
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
