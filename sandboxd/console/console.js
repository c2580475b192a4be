// sandboxd's web console: sessions, a session's code, output, figures, files and
// history, and the daemon's status, all through the v1 API of the origin that
// served this file. Written for the console, with no framework and no build step.
//
// Nothing from a run is trusted: output, file names, tracebacks and results go in
// as text (el() appends strings as text nodes, and this file sets no markup),
// figures as images made from blobs, a kernel's HTML in a frame sandboxed without
// scripts, and a download is saved as bytes, never opened as a page.
'use strict';

const TOKEN_KEY = 'sandboxd-token';
let token = sessionStorage.getItem(TOKEN_KEY) || '';
// Timers, object URLs and requests of the view on screen, dropped when it changes
// (a chat's stream aborted: the daemon stops a turn whose client went away).
let viewTimers = [];
let viewUrls = [];
let viewAborts = [];
let renderSeq = 0;

// ---- small helpers -----------------------------------------------------------

/** An element with attributes (`on*` are listeners) and children (strings become text). */
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

/** Replace `node`'s children with `kids` (absent ones left out, strings as text). */
function put(node, ...kids) {
  node.replaceChildren(...kids.flat().filter((k) => k !== undefined && k !== null && k !== false));
}

function bytes(n) {
  if (n === undefined || n === null) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(n) : n.toFixed(1)) + ' ' + units[i];
}

function ago(iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.floor(s / 60) + ' min ago';
  if (s < 86400) return Math.floor(s / 3600) + ' h ago';
  return Math.floor(s / 86400) + ' d ago';
}

function span(seconds) {
  if (seconds < 60) return Math.round(seconds) + ' s';
  if (seconds < 3600) return Math.round(seconds / 60) + ' min';
  if (seconds < 86400) return (seconds / 3600).toFixed(1) + ' h';
  return (seconds / 86400).toFixed(1) + ' d';
}

/** A workspace path as a URL path (each part percent-encoded, `/` kept). */
function filePath(sid, path) {
  return '/v1/sessions/' + encodeURIComponent(sid) + '/files/' + path.split('/').map(encodeURIComponent).join('/');
}

// ---- the API -----------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h['Authorization'] = 'Bearer ' + token;
  return h;
}

async function failure(res) {
  let code = 'http_' + res.status;
  let message = res.status + ' ' + res.statusText;
  try {
    const body = await res.json();
    if (body && body.error) { code = body.error.code; message = body.error.message; }
  } catch (_) { /* not the error envelope */ }
  if (res.status === 401) askToken('The daemon wants a token: ' + message);
  return new ApiError(res.status, code, message);
}

/** A request to the API; JSON in and out unless `raw` (then the Response). */
async function api(method, path, opts) {
  opts = opts || {};
  const init = { method, headers: headers(opts.headers), cache: 'no-store' };
  if (opts.json !== undefined) {
    init.body = JSON.stringify(opts.json);
    init.headers['Content-Type'] = 'application/json';
  } else if (opts.body !== undefined) {
    init.body = opts.body;
  }
  if (opts.signal) init.signal = opts.signal;
  const res = await fetch(path, init);
  if (!res.ok) throw await failure(res);
  if (opts.raw) return res;
  return res.json();
}

/** A file of the session as a blob of `type` (an image's own; bytes to save). */
async function fileBlob(url, type) {
  const res = await api('GET', rel(url), { raw: true });
  const data = await res.arrayBuffer();
  return new Blob([data], { type });
}

// Image types an <img> shows (an SVG runs no script in one).
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/svg+xml'];
// Larger images are offered for download, not fetched to be shown.
const MAX_SHOWN_IMAGE = 8 * 1024 * 1024;

/** An API URL as a path of this origin: a listing's and a result's `url` are made
 * with the daemon's public_url, which may name another host than the page's. */
function rel(url) {
  const u = new URL(url, location.href);
  return u.pathname + u.search;
}

function dataUrl(blob) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(blob);
  });
}

/** An <img> of a session's image file. A raster image is shown from a blob; an SVG
 * from a data: URL, never a blob: a blob's URL is of this origin, and an SVG opened
 * from it as a page would run its scripts here. */
async function imageOf(url, mime, size, urls) {
  if (size > MAX_SHOWN_IMAGE) {
    return el('p', { class: 'muted' }, 'An image of ' + bytes(size) + ': too large to show here; download it.');
  }
  const img = el('img', { alt: 'figure', class: 'figure', draggable: 'false' });
  try {
    const blob = await fileBlob(url, IMAGE_TYPES.includes(mime) ? mime : 'application/octet-stream');
    if (mime === 'image/svg+xml') img.src = await dataUrl(blob);
    else {
      img.src = URL.createObjectURL(blob);
      (urls || viewUrls).push(img.src);
    }
  } catch (e) {
    return el('p', { class: 'error' }, 'Could not load the figure: ' + e.message);
  }
  return img;
}

/** Save a file of the session: its bytes, typed as bytes, so nothing renders them. */
async function download(url, name) {
  const blob = await fileBlob(url, 'application/octet-stream');
  const a = el('a', { href: URL.createObjectURL(blob), download: name.split('/').pop() || 'file' });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---- the token -----------------------------------------------------------------

function askToken(why) {
  const dialog = document.getElementById('token-dialog');
  document.getElementById('token-error').textContent = why || '';
  if (!dialog.open) dialog.showModal();
}

function setupToken() {
  const form = document.getElementById('token-form');
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    token = document.getElementById('token-input').value.trim();
    sessionStorage.setItem(TOKEN_KEY, token);
    document.getElementById('token-input').value = '';
    document.getElementById('token-dialog').close();
    render();
  });
  document.getElementById('token-clear').addEventListener('click', () => {
    token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    document.getElementById('token-dialog').close();
    render();
  });
  document.getElementById('token-button').addEventListener('click', () => askToken(''));
}

// ---- views -----------------------------------------------------------------------

function clearView() {
  viewTimers.forEach(clearInterval);
  viewTimers = [];
  viewAborts.forEach((a) => a.abort());
  viewAborts = [];
  viewUrls.flat().forEach((u) => URL.revokeObjectURL(u));
  viewUrls = [];
}

function show(...nodes) {
  const main = document.getElementById('main');
  put(main, ...nodes);
}

function errorBox(e) {
  return el('p', { class: 'error', role: 'alert' }, e instanceof ApiError ? e.code + ': ' + e.message : String(e));
}

async function render() {
  clearView();
  const seq = ++renderSeq;
  const hash = location.hash || '#/';
  const section = hash.startsWith('#/status') ? 'status' : hash.startsWith('#/chat') ? 'chat' : 'sessions';
  for (const name of ['sessions', 'chat', 'status']) {
    document.getElementById('nav-' + name).classList.toggle('active', section === name);
  }
  try {
    if (hash.startsWith('#/s/')) await sessionView(decodeURIComponent(hash.slice(4)), seq);
    else if (hash.startsWith('#/status')) await statusView(seq);
    else if (hash.startsWith('#/chat')) {
      const [sid, cid] = hash.slice(7).split('/').map(decodeURIComponent);
      await chatView(sid || '', cid || '', seq);
    }
    else await sessionsView(seq);
  } catch (e) {
    if (seq === renderSeq) show(errorBox(e));
  }
}

// -- the sessions --

async function sessionsView(seq) {
  const [sessions, policies] = await Promise.all([api('GET', '/v1/sessions'), api('GET', '/v1/policies')]);
  if (seq !== renderSeq) return;
  const policy = el('select', { id: 'new-policy', 'aria-label': 'policy' },
    policies.map((p) => el('option', { value: p.name, selected: p.name === 'default' }, p.name)));
  const mode = el('select', { id: 'new-mode', 'aria-label': 'mode' },
    el('option', { value: 'script' }, 'script'), el('option', { value: 'kernel' }, 'kernel'));
  const error = el('p', { class: 'error', role: 'alert' });
  const create = el('form', { id: 'new-session', class: 'row', onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const s = await api('POST', '/v1/sessions', { json: { mode: mode.value, policy: policy.value } });
      location.hash = '#/s/' + encodeURIComponent(s.id);
    } catch (e) { error.textContent = e.message; }
  } }, el('label', {}, 'Mode ', mode), el('label', {}, 'Policy ', policy),
  el('button', { type: 'submit', id: 'create-session' }, 'New session'));

  const body = el('tbody', { id: 'sessions' });
  const table = el('table', {},
    el('thead', {}, el('tr', {}, ['Session', 'Mode', 'Policy', 'Created', 'Last used', 'Expires in', 'Disk', 'Status', ''].map((h) => el('th', {}, h)))),
    body);
  const fill = (list) => {
    list.sort((a, b) => b.last_used_at.localeCompare(a.last_used_at));
    put(body, ...list.map((s) => {
      const left = s.ttl_s - (Date.now() - Date.parse(s.last_used_at)) / 1000;
      return el('tr', { 'data-session': s.id },
        el('td', {}, el('a', { href: '#/s/' + encodeURIComponent(s.id), class: 'mono' }, s.id)),
        el('td', {}, s.mode), el('td', {}, s.policy), el('td', {}, ago(s.created_at)),
        el('td', {}, ago(s.last_used_at)), el('td', {}, span(Math.max(0, left))),
        el('td', { class: 'disk', title: 'the host disk its workspace and packages take' }, bytes(s.disk_bytes || 0)),
        el('td', {}, s.busy ? el('span', { class: 'badge busy' }, 'running') : el('span', { class: 'badge' }, 'idle')),
        el('td', {}, el('button', { type: 'button', class: 'quiet close-session', onclick: async () => {
          if (!confirm('Close session ' + s.id + '? Its files go with it.')) return;
          try { await api('DELETE', '/v1/sessions/' + encodeURIComponent(s.id)); render(); } catch (e) { error.textContent = e.message; }
        } }, 'Close')));
    }));
    if (!list.length) body.append(el('tr', {}, el('td', { colspan: 9, class: 'muted' }, 'No sessions yet.')));
  };
  fill(sessions);
  show(el('h1', {}, 'Sessions'), create, error, table);
  viewTimers.push(setInterval(async () => {
    try { fill(await api('GET', '/v1/sessions')); } catch (_) { /* shown on the next render */ }
  }, 5000));
}

// -- one session --

async function sessionView(sid, seq) {
  const base = '/v1/sessions/' + encodeURIComponent(sid);
  const info = await api('GET', base);
  if (seq !== renderSeq) return;
  const editor = el('textarea', { id: 'code', spellcheck: 'false', rows: 12, 'aria-label': 'code',
    placeholder: 'print("hello")   —   Ctrl-Enter runs' });
  const language = el('select', { id: 'language', 'aria-label': 'language' },
    el('option', { value: 'python' }, 'Python'), el('option', { value: 'shell' }, 'Shell'));
  const runButton = el('button', { type: 'button', id: 'run' }, 'Run');
  const stopButton = el('button', { type: 'button', id: 'stop', class: 'quiet', disabled: true }, 'Stop');
  const output = el('pre', { id: 'output', class: 'output', 'aria-live': 'polite' });
  const status = el('div', { id: 'run-status', class: 'status' });
  const figures = el('div', { id: 'figures', class: 'figures' });
  const result = el('div', { id: 'result' });
  const files = el('div', { id: 'files' });
  const history = el('div', { id: 'history' });

  let running = null;
  // The object URLs of the last run's figures, released when the next run starts.
  const runUrls = [];
  viewUrls.push(runUrls);
  const run = async () => {
    if (running) return;
    const code = editor.value;
    runUrls.splice(0).forEach((u) => URL.revokeObjectURL(u));
    put(output);
    put(status, el('span', { class: 'badge busy' }, 'running'));
    put(figures);
    put(result);
    running = new AbortController();
    runButton.disabled = true;
    stopButton.disabled = false;
    try {
      await streamRun(base + '/runs', { code, language: language.value }, running.signal, {
        output(stream, text) {
          const last = output.lastChild;
          if (last && last.dataset.stream === stream) last.append(text);
          else output.append(el('span', { class: stream, 'data-stream': stream }, text));
          output.scrollTop = output.scrollHeight;
        },
        result(r) { showResult(r, { status, figures, result, urls: runUrls }); },
        error(e) { put(status, errorBox(e)); },
      });
    } catch (e) {
      put(status, errorBox(e));
    } finally {
      running = null;
      runButton.disabled = false;
      stopButton.disabled = true;
      loadFiles(sid, files);
      loadHistory(sid, history);
    }
  };
  runButton.addEventListener('click', run);
  editor.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); run(); }
  });
  stopButton.addEventListener('click', async () => {
    try { await api('DELETE', base + '/run'); } catch (e) { status.append(errorBox(e)); }
  });

  show(
    el('h1', {}, 'Session ', el('span', { class: 'mono', id: 'session-id' }, info.id)),
    el('p', { class: 'muted' }, info.mode + ' session · policy ' + info.policy + ' · created ' + ago(info.created_at) +
      ' · closes after ' + span(info.ttl_s) + ' idle · ' + bytes(info.disk_bytes || 0) + ' on disk'),
    el('div', { class: 'columns' },
      el('section', { class: 'work' },
        editor,
        el('div', { class: 'row' }, language, runButton, stopButton, el('span', { class: 'muted' }, 'Ctrl-Enter runs')),
        status, output, figures, result,
        el('h2', {}, 'History'), history),
      el('aside', { class: 'side' }, el('h2', {}, 'Files'), files)));
  editor.focus();
  await Promise.all([loadFiles(sid, files), loadHistory(sid, history)]);
}

/** POST a run as server-sent events, handing each to `on` as it arrives. */
async function streamRun(path, body, signal, on) {
  await streamEvents(path, body, signal, (name, payload) => {
    if (name === 'stdout' || name === 'stderr') on.output(name, payload.text);
    else if (name === 'result') on.result(payload);
    else if (name === 'error') on.error(new ApiError(0, payload.error.code, payload.error.message));
  });
}

/** POST `body` and hand each server-sent event (its name, its JSON) to `on`. */
async function streamEvents(path, body, signal, on) {
  const res = await fetch(path, {
    method: 'POST', signal, cache: 'no-store',
    headers: headers({ 'Content-Type': 'application/json', 'Accept': 'text/event-stream' }),
    body: JSON.stringify(body),
  });
  if (!res.ok) throw await failure(res);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffered.indexOf('\n\n')) >= 0) {
      const block = buffered.slice(0, cut);
      buffered = buffered.slice(cut + 2);
      let name = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) name = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      }
      if (!data.length) continue; // a keep-alive comment
      on(name, JSON.parse(data.join('\n')));
    }
  }
}

/** What a run ended with: status and usage, the limits it hit, figures, a kernel's result. */
function showResult(r, where) {
  const u = r.usage || {};
  const hits = [];
  if (r.status === 'timeout') hits.push('time limit');
  if (r.status === 'oom') hits.push('memory limit');
  if (r.stdout_truncated || r.stderr_truncated) hits.push('output limit');
  if (r.artifacts_truncated) hits.push('artifact limit');
  if (u.disk_full) hits.push('workspace full');
  put(where.status,
    el('span', { class: 'badge ' + r.status, id: 'status-badge' }, r.status),
    el('span', {}, 'exit ' + (r.exit_code === null || r.exit_code === undefined ? '–' : r.exit_code) +
      (r.signal ? ' (' + r.signal + ')' : '')),
    el('span', {}, r.duration_ms + ' ms'),
    el('span', {}, 'CPU ' + (u.cpu_ms === undefined || u.cpu_ms === null ? '–' : u.cpu_ms + ' ms')),
    el('span', {}, 'memory ' + bytes(u.memory_peak_bytes)),
    hits.length ? el('span', { class: 'error' }, 'hit: ' + hits.join(', ')) : null);
  for (const a of r.artifacts || []) {
    if (a.kind === 'figure' || IMAGE_TYPES.includes(a.mime_type)) {
      imageOf(a.url, a.mime_type, a.size_bytes, where.urls)
        .then((img) => where.figures.append(el('figure', {}, img, el('figcaption', {}, a.path))));
    }
  }
  // A kernel session's cell adds these (at the result's top level).
  if (r.result) where.result.append(kernelResult(r.result));
  if (r.exception) {
    where.result.append(el('div', { class: 'exception' },
      el('strong', {}, r.exception.name + ': ' + r.exception.value),
      el('pre', {}, r.exception.traceback)));
  }
  if (r.kernel_restarted) where.result.append(el('p', { class: 'muted' }, 'The kernel was restarted: earlier variables are gone.'));
}

/** A kernel cell's value: HTML in a frame that may run no script, else its text. */
function kernelResult(bundle) {
  const box = el('div', { class: 'kernel-result' });
  if (bundle['text/html'] !== undefined) {
    const frame = el('iframe', { sandbox: '', class: 'html-result', title: 'the cell\'s HTML result', referrerpolicy: 'no-referrer' });
    frame.srcdoc = bundle['text/html'];
    box.append(frame);
  } else if (bundle['image/png'] !== undefined) {
    box.append(el('img', { class: 'figure', alt: 'result', src: 'data:image/png;base64,' + bundle['image/png'].replace(/[^A-Za-z0-9+/=]/g, '') }));
  } else if (bundle['text/plain'] !== undefined) {
    box.append(el('pre', { class: 'output' }, bundle['text/plain']));
  }
  return box;
}

// -- files --

// Files listed at first; the rest on request (a workspace may hold 200,000).
const FILES_SHOWN = 500;

async function loadFiles(sid, box) {
  let list, partial;
  try {
    const res = await api('GET', '/v1/sessions/' + encodeURIComponent(sid) + '/files', { raw: true });
    partial = res.headers.get('sandboxd-listing-partial') === 'true';
    list = await res.json();
  } catch (e) {
    put(box, errorBox(e));
    return;
  }
  const preview = el('div', { id: 'preview', class: 'preview' });
  const input = el('input', { type: 'file', multiple: true, id: 'upload-input' });
  const note = el('p', { class: 'muted', id: 'upload-note' });
  const upload = async (fileList) => {
    for (const f of fileList) {
      note.textContent = 'Uploading ' + f.name + '…';
      try {
        await api('PUT', filePath(sid, f.name), { body: f, headers: { 'Content-Type': 'application/octet-stream' } });
        note.textContent = 'Uploaded ' + f.name;
      } catch (e) {
        note.textContent = e.message;
        return;
      }
    }
    loadFiles(sid, box);
  };
  input.addEventListener('change', () => upload(input.files));
  const drop = el('div', { class: 'drop', id: 'drop' }, 'Drop files here, or ', input);
  drop.addEventListener('dragover', (ev) => { ev.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (ev) => { ev.preventDefault(); drop.classList.remove('over'); upload(ev.dataTransfer.files); });

  const row = (f, name) => el('li', { class: 'file', 'data-path': f.path },
    el('button', { type: 'button', class: 'link file-name', title: f.path, onclick: () => showPreview(f, preview) }, name),
    el('span', { class: 'muted' }, ' ' + bytes(f.size_bytes) + ' '),
    el('button', { type: 'button', class: 'quiet download', onclick: () => download(f.url, f.path).catch((e) => { note.textContent = e.message; }) }, 'Download'),
    el('button', { type: 'button', class: 'quiet delete', onclick: async () => {
      if (!confirm('Delete ' + f.path + '?')) return;
      try { await api('DELETE', rel(f.url)); loadFiles(sid, box); } catch (e) { note.textContent = e.message; }
    } }, 'Delete'));
  const tree = fileTree(row);
  list.slice(0, FILES_SHOWN).forEach(tree.add);
  let more = null;
  if (list.length > FILES_SHOWN) {
    more = el('button', { type: 'button', class: 'quiet', id: 'more-files', onclick: () => {
      list.slice(FILES_SHOWN).forEach(tree.add);
      more.remove();
    } }, 'Show all ' + list.length + ' files');
  }
  put(box, drop, note,
    partial ? el('p', { class: 'muted', id: 'listing-partial' }, 'The workspace holds more files than one listing reports: these are the first, by path.') : null,
    list.length ? tree.root : el('p', { class: 'muted' }, 'No files.'), more, preview);
}

/** A tree of files by their directories, filled one file at a time (`add`) in the
 * listing's order; `row(file, name)` makes a file's item. A directory is made when
 * its first file comes, folded open. */
function fileTree(row) {
  const root = el('ul', { class: 'files' });
  const dirs = new Map([['', root]]);
  const dirOf = (parts) => {
    const key = parts.join('/');
    let ul = dirs.get(key);
    if (!ul) {
      ul = el('ul', {});
      dirOf(parts.slice(0, -1)).append(el('li', { class: 'dir', 'data-dir': key },
        el('details', { open: true }, el('summary', {}, parts[parts.length - 1] + '/'), ul)));
      dirs.set(key, ul);
    }
    return ul;
  };
  const add = (f) => {
    const parts = f.path.split('/');
    dirOf(parts.slice(0, -1)).append(row(f, parts[parts.length - 1]));
  };
  return { root, add };
}

const PREVIEW_BYTES = 65536;

/** The first `limit` bytes of a file (the rest is not read). */
async function head(url, limit) {
  const res = await api('GET', rel(url), { raw: true });
  const reader = res.body.getReader();
  const parts = [];
  let have = 0;
  while (have < limit) {
    const { value, done } = await reader.read();
    if (done) break;
    parts.push(value);
    have += value.length;
  }
  reader.cancel().catch(() => {});
  const all = new Uint8Array(Math.min(have, limit));
  let at = 0;
  for (const p of parts) {
    const take = p.subarray(0, all.length - at);
    all.set(take, at);
    at += take.length;
  }
  return all;
}

async function showPreview(f, box) {
  put(box, el('h3', {}, f.path));
  try {
    if (IMAGE_TYPES.includes(f.mime_type)) {
      box.append(await imageOf(f.url, f.mime_type, f.size_bytes));
      return;
    }
    const text = new TextDecoder().decode(await head(f.url, PREVIEW_BYTES));
    if (f.path.toLowerCase().endsWith('.csv')) {
      box.append(csvTable(text));
    } else {
      box.append(el('pre', { class: 'output' }, text));
    }
  } catch (e) {
    box.append(errorBox(e));
  }
}

const CSV_COLUMNS = 50;
const CSV_CELL = 200;

/** The first rows of a CSV as a table (quotes and doubled quotes understood), at
 * most CSV_COLUMNS columns of at most CSV_CELL characters. */
function csvTable(text) {
  const rows = [];
  let row = [], cell = '', quoted = false;
  for (let i = 0; i < text.length && rows.length < 21; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { cell += '"'; i++; } else if (c === '"') quoted = false; else cell += c;
    } else if (c === '"') quoted = true;
    else if (c === ',') { row.push(cell); cell = ''; }
    else if (c === '\n') { row.push(cell.replace(/\r$/, '')); rows.push(row); row = []; cell = ''; }
    else cell += c;
  }
  if ((cell || row.length) && rows.length < 21) { row.push(cell); rows.push(row); }
  const cut = (r) => r.slice(0, CSV_COLUMNS).map((c) => (c.length > CSV_CELL ? c.slice(0, CSV_CELL) + '…' : c));
  const [names, ...rest] = rows.map(cut);
  return el('table', { class: 'csv' },
    el('thead', {}, el('tr', {}, (names || []).map((h) => el('th', {}, h)))),
    el('tbody', {}, rest.map((r) => el('tr', {}, r.map((c) => el('td', {}, c))))));
}

// -- history --

async function loadHistory(sid, box) {
  const base = '/v1/sessions/' + encodeURIComponent(sid);
  let page;
  try {
    page = await api('GET', base + '/runs?limit=20');
  } catch (e) {
    put(box, errorBox(e));
    return;
  }
  if (!page.runs.length) {
    put(box, el('p', { class: 'muted' }, 'No runs yet.'));
    return;
  }
  put(box, ...page.runs.map((r) => {
    const body = el('div', { class: 'record' });
    const item = el('details', { class: 'run', 'data-run': r.run_id },
      el('summary', {}, el('span', { class: 'badge ' + r.status }, r.status), ' ', r.language, ' · ', ago(r.accepted_at),
        r.duration_ms !== null && r.duration_ms !== undefined ? ' · ' + r.duration_ms + ' ms' : ''),
      body);
    let loaded = false;
    item.addEventListener('toggle', async () => {
      if (!item.open || loaded) return;
      loaded = true;
      try {
        const rec = await api('GET', base + '/runs/' + encodeURIComponent(r.run_id));
        const res = rec.result || {};
        put(body,
          el('pre', { class: 'code' }, rec.code + (rec.code_truncated ? '\n…' : '')),
          res.stdout ? el('pre', { class: 'output' }, el('span', { class: 'stdout' }, res.stdout)) : null,
          res.stderr ? el('pre', { class: 'output' }, el('span', { class: 'stderr' }, res.stderr)) : null,
          rec.error ? el('p', { class: 'error' }, rec.error) : null,
          el('button', { type: 'button', class: 'quiet', onclick: () => {
            const editor = document.getElementById('code');
            if (editor) { editor.value = rec.code; editor.focus(); }
          } }, 'Edit again'));
      } catch (e) { put(body, errorBox(e)); }
    });
    return item;
  }));
}

// -- the daemon's status --

const SERIES = [
  ['runs per second', (m) => sum(m, 'sandboxd_runs_total'), true],
  ['sessions', (m) => sum(m, 'sandboxd_sessions'), false],
  ['idle templates', (m) => sum(m, 'sandboxd_pool_idle_templates'), false],
  ['pool hits per second', (m) => sum(m, 'sandboxd_pool_hits_total'), true],
  ['pool misses per second', (m) => sum(m, 'sandboxd_pool_misses_total'), true],
];

/** The Prometheus text format's samples: name -> list of values. */
function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const v = Number(match[3]);
    if (!m.has(match[1])) m.set(match[1], []);
    m.get(match[1]).push(v);
  }
  return m;
}

function sum(m, name) {
  return (m.get(name) || []).reduce((a, b) => a + b, 0);
}

function chart(canvas, values) {
  const ctx = canvas.getContext('2d');
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  if (values.length < 2) return;
  const max = Math.max(1e-9, ...values);
  ctx.strokeStyle = '#2f6fdf';
  ctx.lineWidth = 2;
  ctx.beginPath();
  values.forEach((v, i) => {
    const x = (i / (values.length - 1)) * (w - 4) + 2;
    const y = h - 2 - (v / max) * (h - 4);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

async function statusView(seq) {
  const [health, check] = await Promise.all([api('GET', '/v1/health'), api('GET', '/v1/check').catch((e) => e)]);
  if (seq !== renderSeq) return;
  const problems = health.problems || [];
  const pool = health.pool || {};
  const healthBox = el('section', { id: 'health' },
    el('h2', {}, 'Health ', el('span', { class: 'badge ' + (health.status === 'ok' ? 'ok' : 'error'), id: 'health-status' }, health.status)),
    el('p', {}, 'version ' + health.version + (health.sessions !== undefined ? ' · ' + health.sessions + ' sessions, ' + health.busy_sessions + ' running' : '')),
    problems.length ? el('ul', {}, problems.map((p) => el('li', { class: 'error' }, p.name + ': ' + p.found + ' — ' + p.fix))) : null,
    el('h3', {}, 'Pool'),
    el('table', {}, el('tbody', {}, Object.entries(pool).filter(([, v]) => typeof v !== 'object').map(([k, v]) =>
      el('tr', {}, el('th', {}, k.replace(/_/g, ' ')), el('td', {}, k.endsWith('bytes') ? bytes(v) : String(v)))))));
  const checkBox = el('section', { id: 'check' }, el('h2', {}, 'Host check'));
  if (check instanceof Error) checkBox.append(errorBox(check));
  else {
    checkBox.append(el('table', {}, el('tbody', {}, (check.items || []).map((i) =>
      el('tr', {}, el('td', {}, el('span', { class: 'badge ' + (i.status === 'ok' ? 'ok' : i.status === 'warn' ? 'timeout' : 'error') }, i.status)),
        el('th', {}, i.name), el('td', {}, i.found), el('td', { class: 'muted' }, i.status === 'ok' ? '' : i.fix))))));
  }
  const charts = el('section', { id: 'charts' }, el('h2', {}, 'Metrics'));
  const canvases = SERIES.map(([name]) => {
    const canvas = el('canvas', { width: 280, height: 60, 'data-series': name });
    const value = el('span', { class: 'mono' }, '–');
    charts.append(el('div', { class: 'chart' }, el('div', {}, name + ': ', value), canvas));
    return { canvas, value, history: [] };
  });
  show(el('h1', {}, 'Status'), el('div', { class: 'columns' }, el('div', { class: 'work' }, healthBox, charts), el('aside', { class: 'side' }, checkBox)));
  let last = null;
  const poll = async () => {
    let text;
    try {
      text = await (await api('GET', '/metrics', { raw: true })).text();
    } catch (e) {
      put(charts, el('h2', {}, 'Metrics'), errorBox(e));
      clearView();
      return;
    }
    const now = Date.now() / 1000;
    const m = parseMetrics(text);
    SERIES.forEach(([, get, rate], i) => {
      const c = canvases[i];
      const v = get(m);
      let shown = v;
      if (rate) {
        shown = last ? Math.max(0, (v - last.values[i]) / Math.max(1e-3, now - last.at)) : 0;
      }
      c.history.push(shown);
      if (c.history.length > 60) c.history.shift();
      c.value.textContent = rate ? shown.toFixed(2) : String(shown);
      chart(c.canvas, c.history);
    });
    last = { at: now, values: SERIES.map(([, get]) => get(m)) };
  };
  await poll();
  viewTimers.push(setInterval(poll, 2000));
}

// -- the chat --

/** `#/chat/SID[/CID]`: talk to the daemon's LLM, whose tool calls run in session
 * SID; the conversation's steps stream in as they happen. */
async function chatView(sid, cid, seq) {
  const sessions = await api('GET', '/v1/sessions');
  if (seq !== renderSeq) return;
  const picker = el('select', { id: 'chat-session', 'aria-label': 'session' },
    el('option', { value: '' }, '— choose a session —'),
    sessions.map((s) => el('option', { value: s.id, selected: s.id === sid }, s.id + ' (' + s.mode + ', ' + s.policy + ')')));
  picker.addEventListener('change', () => { location.hash = picker.value ? '#/chat/' + encodeURIComponent(picker.value) : '#/chat'; });
  const fresh = el('button', { type: 'button', id: 'chat-new-session', class: 'quiet' }, 'New session');
  fresh.addEventListener('click', async () => {
    try {
      const s = await api('POST', '/v1/sessions', { json: {} });
      location.hash = '#/chat/' + encodeURIComponent(s.id);
    } catch (e) { show(errorBox(e)); }
  });
  const head = [el('h1', {}, 'Chat'), el('div', { class: 'row' }, picker, fresh)];
  if (!sid) {
    show(...head, el('p', { class: 'muted' }, 'A conversation is bound to one session: the model\'s code runs there, and its files and figures stay there.'));
    return;
  }
  const base = '/v1/sessions/' + encodeURIComponent(sid);
  const list = el('ul', { id: 'chat-list', class: 'chats' });
  const log = el('div', { id: 'chat-log', class: 'chat-log', 'aria-live': 'polite' });
  const input = el('textarea', { id: 'chat-input', rows: 3, 'aria-label': 'message',
    placeholder: 'Ask for an analysis or a plot. Enter sends, Shift-Enter starts a new line.' });
  const send = el('button', { type: 'button', id: 'chat-send' }, 'Send');
  const stop = el('button', { type: 'button', id: 'chat-stop', class: 'quiet', disabled: true }, 'Stop');
  const model = el('span', { id: 'chat-model', class: 'muted' });
  const state = el('span', { id: 'chat-state', class: 'muted' });
  const newChat = el('button', { type: 'button', id: 'chat-new', class: 'quiet' }, 'New conversation');
  newChat.addEventListener('click', () => { location.hash = '#/chat/' + encodeURIComponent(sid); });
  let chatId = cid;
  let going = false;

  const loadList = async () => {
    try {
      const got = await api('GET', base + '/chats');
      put(list, got.chats.map((c) => el('li', { class: c.chat_id === chatId ? 'current' : '' },
        el('a', { href: '#/chat/' + encodeURIComponent(sid) + '/' + c.chat_id }, c.title || '(untitled)'),
        el('div', { class: 'muted' }, ago(c.updated_at) + ' · ' + c.messages + ' messages'))));
      if (!got.chats.length) put(list, el('li', { class: 'muted' }, 'No conversations yet.'));
    } catch (e) { put(list, errorBox(e)); }
  };

  // The assistant's bubble being written, and the tool calls waiting for results.
  let writing = null;
  const pending = new Map();
  const addMessage = (m) => {
    if (m.role === 'user') log.append(el('div', { class: 'msg user' }, m.content));
    else if (m.role === 'assistant') {
      const bubble = writing || el('div', { class: 'msg assistant' });
      writing = null;
      put(bubble, m.content);
      if (!m.content) bubble.classList.add('empty');
      if (!bubble.isConnected) log.append(bubble);
      for (const c of m.tool_calls || []) log.append(toolCallBox(c, pending));
    } else if (m.role === 'tool') {
      const box = pending.get(m.tool_call_id) || el('div', { class: 'tool-call' });
      pending.delete(m.tool_call_id);
      box.classList.remove('running');
      box.append(toolResultBox(sid, m));
      if (!box.isConnected) log.append(box);
    } else if (m.role === 'notice') log.append(el('div', { class: 'notice' }, m.content));
    log.scrollTop = log.scrollHeight;
  };

  const sendMessage = async () => {
    const message = input.value;
    if (going || !message.trim()) return;
    going = true;
    send.disabled = true;
    stop.disabled = false;
    input.value = '';
    put(state, 'thinking…');
    addMessage({ role: 'user', content: message });
    const body = { session_id: sid, message };
    if (chatId) body.chat_id = chatId;
    const aborter = new AbortController();
    viewAborts.push(aborter);
    try {
      await streamEvents('/v1/chat', body, aborter.signal, (name, p) => {
        if (name === 'chat') {
          chatId = p.chat_id;
          put(model, p.model ? 'model ' + p.model : '');
          history.replaceState(null, '', '#/chat/' + encodeURIComponent(sid) + '/' + chatId);
        } else if (name === 'text') {
          if (!writing) { writing = el('div', { class: 'msg assistant' }); log.append(writing); }
          writing.append(p.text);
          log.scrollTop = log.scrollHeight;
        } else if (name === 'tool_call') {
          put(state, 'running ' + p.name + '…');
          const box = pending.get(p.id);
          if (box) box.classList.add('running');
        } else if (name === 'assistant' || name === 'tool_result' || name === 'notice') {
          if (name === 'tool_result') put(state, 'thinking…');
          addMessage(p);
        } else if (name === 'error') {
          log.append(el('div', { class: 'notice error', role: 'alert' }, p.error.code + ': ' + p.error.message));
        } else if (name === 'done') {
          put(state, p.reason === 'answered' ? '' : p.reason.replace('_', ' '));
        }
      });
    } catch (e) {
      if (!aborter.signal.aborted) log.append(errorBox(e));
      put(state, '');
    } finally {
      viewAborts = viewAborts.filter((a) => a !== aborter);
      going = false;
      send.disabled = false;
      stop.disabled = true;
      writing = null;
      loadList();
    }
  };
  send.addEventListener('click', sendMessage);
  input.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); sendMessage(); }
  });
  stop.addEventListener('click', async () => {
    try { await api('DELETE', base + '/chat'); } catch (e) { log.append(errorBox(e)); }
  });

  show(...head,
    el('div', { class: 'columns chat' },
      el('section', { class: 'work' },
        log,
        input,
        el('div', { class: 'row' }, send, stop, state, el('span', { class: 'spacer' }), model)),
      el('aside', { class: 'side' },
        el('h2', {}, 'Conversations'), newChat, list,
        el('p', {}, el('a', { href: '#/s/' + encodeURIComponent(sid) }, 'This session\'s code and files')))));
  input.focus();
  const loads = [loadList()];
  if (cid) {
    loads.push(api('GET', base + '/chats/' + encodeURIComponent(cid)).then((c) => {
      if (seq !== renderSeq) return;
      put(model, c.model ? 'model ' + c.model : '');
      c.messages.forEach(addMessage);
    }).catch((e) => log.append(errorBox(e))));
  }
  await Promise.all(loads);
}

/** A tool call the model made: its code (or arguments) as text. */
function toolCallBox(call, pending) {
  let args = null;
  try { args = JSON.parse(call.arguments); } catch (_) { /* shown as written */ }
  const code = args && typeof args === 'object' ? (args.code || args.command) : null;
  const box = el('div', { class: 'tool-call', 'data-id': call.id },
    el('div', { class: 'tool-name' }, call.name),
    el('pre', { class: 'code' }, typeof code === 'string' ? code : call.arguments));
  pending.set(call.id, box);
  return box;
}

/** A tool's result: its first line, the rest folded, and its figures. */
function toolResultBox(sid, m) {
  const first = (m.content.split('\n')[0] || '').slice(0, 200);
  const box = el('div', { class: 'tool-result' + (m.is_error ? ' failed' : '') },
    el('details', {}, el('summary', {}, first), el('pre', { class: 'output' }, m.content)));
  for (const f of m.figures || []) {
    imageOf(filePath(sid, f.path), f.mime_type, 0).then((img) => {
      box.append(el('figure', {}, img, el('figcaption', {}, f.path)));
      // The figure took room: the conversation's end stays in view.
      const log = box.closest('.chat-log');
      if (log) img.addEventListener('load', () => { log.scrollTop = log.scrollHeight; }, { once: true });
    });
  }
  return box;
}

// ---- start -----------------------------------------------------------------------

setupToken();
// A drop outside the upload area (a file, or a figure dragged from the page) must
// not navigate the tab to it.
document.addEventListener('dragover', (ev) => ev.preventDefault());
document.addEventListener('drop', (ev) => ev.preventDefault());
document.addEventListener('dragstart', (ev) => { if (ev.target instanceof HTMLImageElement) ev.preventDefault(); });
window.addEventListener('hashchange', render);
render();
