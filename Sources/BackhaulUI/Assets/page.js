// Backhaul dashboard: what every part of the page uses. Elements found by id and made whole
// (tag, class, text: never markup from strings), and the notice that says what an action did or
// why something failed.

export const $ = (id) => document.getElementById(id);

export function make(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}

/// A button whose click `actions.js` handles by its `data-act`.
export function button(action, label, className) {
  const node = make('button', className || '', label);
  node.type = 'button';
  node.dataset.act = action;
  return node;
}

let toastTimer = null;

export function toast(text, bad) {
  const node = $('toast');
  node.textContent = text;
  node.className = `toast${bad ? ' bad' : ''}`;
  node.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { node.hidden = true; }, bad ? 8000 : 4000);
}

/// An error, told in a notice; a refused token is not (the token form says it).
export function report(error) {
  if (error && error.status === 401) return;
  toast(error && error.message ? error.message : String(error), true);
}
