// Backhaul dashboard: what the buttons and forms do. A task's Suspend, Resume and Cancel (a
// second click confirms), New headers for a task that waits for credentials, and the network
// override. Each answer is shown at once; the stream and the counts follow.

import { api, enc } from './api.js';
import { $, make, report, toast } from './page.js';
import { renderNetwork } from './panels.js';
import { countsSoon } from './snapshots.js';
import { place } from './view.js';
import { taskName } from './words.js';

/// The New headers form, opened under a task that waits for credentials.
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

/// Listens for the clicks and submissions: a task's on the document (rows come and go, it stays),
/// the override's on its form.
export function bindActions() {
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
}
