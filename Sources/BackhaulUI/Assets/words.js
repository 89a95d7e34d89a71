// Backhaul dashboard: how the page says things. The daemon's error codes, HTTP statuses and
// waiting reasons in words; sizes, durations and times; what a task is called. No DOM here.

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
  cannot_remove_file: 'The file was sent but could not be removed',
  cannot_move_file: 'The finished download cannot be moved into place',
  download_checksum_mismatch: 'The download does not match its SHA-256',
  internal_error: 'The task’s stored state is broken (see the daemon’s log); other tasks go on',
};
const STATUS_WORDS = {
  400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 408: 'Request Timeout',
  409: 'Conflict', 410: 'Gone', 413: 'Content Too Large', 415: 'Unsupported Media Type', 425: 'Too Early', 429: 'Too Many Requests',
  500: 'Internal Server Error', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout', 507: 'Insufficient Storage',
};
const WAITING_WORDS = {
  no_connectivity: 'no network', limited_connectivity: 'limited connectivity (a portal?)',
  roaming_not_allowed: 'roaming not allowed', cellular_not_allowed: 'cellular not allowed', expensive_network_not_allowed: 'expensive network not allowed',
  constrained_network_not_allowed: 'constrained network not allowed', discretionary_deferred: 'discretionary: waiting for a good moment',
  budget_exhausted: 'today’s budget is spent', scheduled: 'scheduled for later', host_connection_limit: 'host connection limit',
  session_finishing: 'session finishing', session_disabled: 'session paused', node_unavailable: 'its node is down',
};

export const statusText = (status) => `HTTP ${status}${STATUS_WORDS[status] ? ' ' + STATUS_WORDS[status] : ''}`;

function errorWords(error) {
  if (!error) return '';
  let text = ERROR_WORDS[error.name] || error.name || `error ${error.code}`;
  if (error.http_status) text += ` (${statusText(error.http_status)})`;
  // The daemon's message, unless it only repeats the status.
  if (error.message && !(error.http_status && /^the server answered \d+$/.test(error.message))) text += ` — ${error.message}`;
  return text;
}

/// Why a task needs attention, in words.
export function reason(task) {
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

export function bytes(n) {
  if (n == null) return '?';
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let value = n / 1024, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

export function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return '';
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${Math.floor(seconds % 3600 / 60)}m`;
  return `${Math.floor(seconds / 86400)}d ${Math.floor(seconds % 86400 / 3600)}h`;
}

export function relative(iso) {
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  if (!isFinite(seconds)) return '';
  if (Math.abs(seconds) < 1.5) return 'just now';
  return seconds >= 0 ? `in ${duration(seconds)}` : `${duration(-seconds)} ago`;
}

/// When something planned happens: "in 12s", or "now" once the time has come.
export function due(iso) {
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  return seconds >= 1 ? `in ${duration(seconds)}` : 'now';
}

export function taskName(task) {
  if (task.description) return task.description;
  const path = (task.file && task.file.path) || (task.download && task.download.destination) || (task.request && task.request.url) || task.id;
  return path.slice(path.lastIndexOf('/') + 1) || path;
}

/// The bytes a task has moved so far: sent, or received for a download.
export function moved(task) {
  const p = task.progress || {};
  return (task.kind === 'download' ? p.bytes_received : p.bytes_sent) || 0;
}
