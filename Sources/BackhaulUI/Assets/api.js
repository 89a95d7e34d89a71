// Backhaul dashboard: the API client. Every request carries the bearer token when this tab has
// one (kept in session storage: this tab only, until it closes); a 401 asks for another.

import { report } from './page.js';

const TOKEN_KEY = 'backhaul.token';

let token = sessionStorage.getItem(TOKEN_KEY) || '';
let refused = () => {};

/// Whether this tab sends a token.
export const hasToken = () => token !== '';

/// Sends `value` from now on, and keeps it for this tab.
export function useToken(value) {
  token = value;
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  token = '';
}

/// What a refused token (401) does: the entry point shows the token form with `message`.
export function whenRefused(handler) {
  refused = handler;
}

export function tokenRefused(message) {
  refused(message);
}

export class APIError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
  }
}

export function headers(extra) {
  const h = Object.assign({ Accept: 'application/json' }, extra);
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

/// One request; the answer's JSON, or an APIError with the problem's detail.
export async function api(method, path, body) {
  const init = { method, headers: headers(body === undefined ? {} : { 'Content-Type': 'application/json' }), cache: 'no-store' };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  const text = await response.text();
  let value = null;
  try { value = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
  if (response.status === 401) {
    tokenRefused(token ? 'The daemon did not accept this token.' : '');
    throw new APIError(401, value);
  }
  if (!response.ok) throw new APIError(response.status, value);
  return value;
}

export const enc = encodeURIComponent;

/// Runs `jobs` (functions returning promises) at most `width` at a time: the browser keeps six
/// connections to a host and the event stream holds one.
export async function pool(jobs, width) {
  let next = 0;
  const worker = async () => { while (next < jobs.length) { const job = jobs[next++]; try { await job(); } catch (e) { report(e); } } };
  await Promise.all(Array.from({ length: Math.min(width, jobs.length) }, worker));
}
