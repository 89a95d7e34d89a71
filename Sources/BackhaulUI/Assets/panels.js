// Backhaul dashboard: the right-hand cards. The network in force and the policy (bandwidth,
// discretionary window, daily budgets left), the nodes sharing the state, and each session's
// webhooks with their failing deliveries.

import { api, enc, pool } from './api.js';
import { $, make } from './page.js';
import { model } from './view.js';
import { bytes, due, statusText } from './words.js';

function facts(list, pairs) {
  const fragment = document.createDocumentFragment();
  for (const [term, value] of pairs) fragment.append(make('dt', '', term), make('dd', '', value));
  list.replaceChildren(fragment);
}

export function renderNetwork(network) {
  const flags = [network.expensive && 'expensive', network.constrained && 'constrained', network.roaming && 'roaming']
    .filter(Boolean).join(', ');
  const sources = {
    override: 'set by a host agent or operator (override)',
    networkmanager: 'NetworkManager (the system bus)',
    routing_table: 'the routing table',
  };
  facts($('network'), [
    ['Network', `${network.type}${network.interface ? ' (' + network.interface + ')' : ''}${flags ? ', ' + flags : ''}`],
    ['Connectivity', network.connectivity || 'unknown'],
    ['Source', sources[network.source] || network.source],
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

/// The daemons that share the state (GET /v1/nodes): one line each, with its heartbeat's age.
function renderNodes(nodes) {
  const fragment = document.createDocumentFragment();
  for (const node of nodes) {
    const el = make('div', 'item');
    const line = make('div', 'line');
    const age = (Date.now() - Date.parse(node.last_heartbeat_at)) / 1000;
    const network = node.network ? `${node.network.type}${node.network.interface ? ' (' + node.network.interface + ')' : ''}` : '';
    line.append(make('span', `badge ${age < 60 ? 'd-ok' : 'd-failed'}`, age < 60 ? 'up' : 'silent'),
      make('span', 'name', node.id), make('span', 'muted', `${node.running} running`), make('span', 'muted', network),
      make('span', 'muted', `v${node.version}`));
    el.append(line);
    fragment.append(el);
  }
  $('nodes').replaceChildren(fragment);
}

export async function refreshNetwork() {
  const [network, policy, nodes] = await Promise.all([api('GET', '/v1/network'), api('GET', '/v1/policy'), api('GET', '/v1/nodes')]);
  renderNetwork(network);
  renderPolicy(policy);
  renderNodes(nodes.nodes || []);
}

export async function refreshWebhooks() {
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
