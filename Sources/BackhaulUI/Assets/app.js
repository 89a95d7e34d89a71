// Backhaul dashboard (docs/dashboard.md), the entry point: the token form, the start, the timers. It
// talks only to the daemon that served it: the REST API for snapshots and actions, GET /v1/events
// for live changes. The page loads this file as an ES module; the rest it imports:
//   api.js        requests and the bearer token
//   stream.js     the event stream, followed again after a drop
//   snapshots.js  reading the lists and the session counts
//   view.js       what the page holds, drawn in animation frames
//   panels.js     network and policy, webhooks
//   actions.js    what the buttons and forms do
//   words.js      errors, states and figures in words
//   page.js       finding and making elements, notices

import { bindActions } from './actions.js';
import { api, forgetToken, hasToken, useToken, whenRefused } from './api.js';
import { $, report } from './page.js';
import { refreshWebhooks } from './panels.js';
import { refreshAll } from './snapshots.js';
import { eventCount, follow, setStream, stopFollowing } from './stream.js';
import { announceReady, setProgressInterval, tick } from './view.js';

let started = false;

function askForToken(message) {
  stopFollowing();
  started = false;
  announceReady(false);
  document.documentElement.dataset.state = 'login';
  $('main').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message || '';
  $('token').focus();
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
  $('forget').hidden = !hasToken();
  $('version').textContent = `backhauld ${info.version || ''}`;
  setProgressInterval(info.progress_interval);
  showState(info.state);
  document.documentElement.dataset.state = 'loading';
  // The snapshot is read once the stream is open, so no change falls between the two.
  await new Promise((resolve) => { follow(resolve); setTimeout(resolve, 5000); });
  await refreshAll(true);
  started = true;
  announceReady(true);
  refreshWebhooks().catch(report);
}

/// The state database's health (GET /v1/info `state`): a salvage, shown until the daemon reports
/// none (the operator removes the corrupt-* directory it names); damage found since the start,
/// which the next start salvages. Read again every 30 s, since damage is found while it runs.
function showState(state) {
  const line = $('salvage');
  const lines = [];
  if (state && state.salvaged_at) {
    const lost = state.rows_lost === null ? 'an unknown number of rows' : `${state.rows_lost} rows`;
    lines.push(`The state database was found damaged (${state.salvage_reason}) and salvaged at ` +
      `${state.salvaged_at}: ${state.rows_copied} rows kept, ${lost} lost. The damaged files are kept in ` +
      `${state.salvaged_from}.`);
  }
  if (state && state.damage_found_at) {
    lines.push(`The state database is damaged: ${state.damage_found_by} found it at ${state.damage_found_at} ` +
      `(${state.damage}). Restart backhauld: the next start salvages it.`);
  }
  line.hidden = lines.length === 0;
  line.textContent = lines.join(' ');
}

setInterval(() => {
  if (started) api('GET', '/v1/info').then((info) => showState(info.state), () => {});
}, 30000);

whenRefused(askForToken);
bindActions();

$('login').addEventListener('submit', (event) => {
  event.preventDefault();
  useToken($('token').value.trim());
  $('token').value = '';
  start();
});

$('forget').addEventListener('click', () => {
  forgetToken();
  location.reload();
});

// What the browser tests read: how many events arrived, and when the first full render was.
window.backhaulDashboard = Object.freeze({ get events() { return eventCount(); } });

setInterval(tick, 1000);
setInterval(() => { if (started && !document.hidden) refreshAll(false); }, 5000);
setInterval(() => { if (started && !document.hidden) refreshWebhooks().catch(report); }, 10000);
start();
