// app.js — the ckpt dashboard: plain JavaScript over the daemon's JSON API
// (the same /v1/... endpoints the CLI uses). Pages by the URL fragment:
//   #/jobs, #/jobs/ID, #/store, #/store/REF, #/schedules, #/overview
// (the README's "The web dashboard" lists each page with the API it calls).
// The token is typed once, kept in sessionStorage and sent as the
// Authorization header; it never goes into a URL. Every value from the
// server is put in the page as text (textContent), never as HTML.
'use strict';

const TOKEN_KEY = 'ckpt.token';
const POLL_MS = 1000;
const PAGE_SIZE = 25;
const STATES = ['queued', 'running', 'retrying', 'succeeded', 'failed', 'cancelled'];

const ui = {
  paused: false,
  timer: null,
  refresh: null,      // the current page's update, called by the poll
  jobsTab: 'all',
  jobsQuery: '',
  jobsPage: 0,
  refreshes: 0,       // refreshes run (shown in #updated's data-refreshes)
  lastUpdate: 0,      // when the last refresh succeeded (ms)
};

// ---- small helpers ----

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function fmtBytes(n) {
  if (n === undefined || n === null || isNaN(n)) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + ' ' + u[i];
}

function fmtTime(t) {
  if (!t) return '';
  const d = new Date(t * 1000);
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function fmtDuration(s) {
  if (s === undefined || s === null || !isFinite(s) || s < 0) return '';
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s';
  return Math.floor(s / 3600) + ' h ' + Math.round((s % 3600) / 60) + ' min';
}

function flash(msg, ok) {
  const f = document.getElementById('flash');
  f.textContent = msg;
  f.className = ok ? 'ok' : '';
  f.hidden = !msg;
}

function table(headers, rows, id) {
  return el('div', {class: 'table-wrap', id: id ? id + '-wrap' : null},
    el('table', {id},
      el('thead', {}, el('tr', {}, headers.map(h => el('th', typeof h === 'string' ? {text: h} : h)))),
      el('tbody', {}, rows)));
}

function stateBadge(s) { return el('span', {class: 'state state-' + s, text: s}); }

// A queued job that has run before waits for its retry.
function jobState(j) { return j.state === 'queued' && j.attempt > 0 ? 'retrying' : j.state; }

function jobLabel(j) {
  const a = j.args || {};
  const what = a.ref || (a.repo ? a.repo + (a.revision ? '@' + a.revision : '') : '') || a.dir || a.src || '';
  return what + (a.layout ? ' → ' + a.layout + (a.tp ? '-tp' + a.tp : '') : '');
}

// ---- the API ----

class ApiError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

async function api(method, path, body, headers) {
  const h = Object.assign({}, headers || {});
  const tok = sessionStorage.getItem(TOKEN_KEY);
  if (tok) h['Authorization'] = 'Bearer ' + tok;
  if (body !== undefined) h['Content-Type'] = 'application/json';
  const r = await fetch(path, {method, headers: h, body: body === undefined ? undefined : JSON.stringify(body),
                               cache: 'no-store', credentials: 'omit'});
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!r.ok) {
    const why = data && data.error ? data.error : text || r.statusText;
    if (r.status === 401) throw new ApiError(401, 'The server needs a token (401): ' + why + '. Enter one above.');
    if (r.status === 403) throw new ApiError(403, 'Refused by the server (403): ' + why);
    throw new ApiError(r.status, method + ' ' + path + ': ' + r.status + ' ' + why);
  }
  return data;
}

// Bytes [a, b] of a stored file (a Range request), as an ArrayBuffer.
async function fileRange(ref, path, a, b) {
  const h = {Range: 'bytes=' + a + '-' + b};
  const tok = sessionStorage.getItem(TOKEN_KEY);
  if (tok) h['Authorization'] = 'Bearer ' + tok;
  const url = '/v1/checkpoints/' + encodeURIComponent(ref) + '/files/' + path.split('/').map(encodeURIComponent).join('/');
  const r = await fetch(url, {headers: h, cache: 'no-store', credentials: 'omit'});
  if (!r.ok) throw new ApiError(r.status, 'GET ' + path + ': ' + r.status);
  return r.arrayBuffer();
}

// A safetensors file's header (8-byte little-endian length, then JSON),
// read with two Range requests: the tensor table without the tensor bytes.
async function safetensorsHeader(ref, path) {
  const len = new DataView(await fileRange(ref, path, 0, 7)).getBigUint64(0, true);
  if (len > 100000000n) throw new Error(path + ': header of ' + len + ' bytes');
  if (len === 0n) return {};
  const buf = await fileRange(ref, path, 8, 8 + Number(len) - 1);
  return JSON.parse(new TextDecoder().decode(buf));
}

async function act(what, fn) {
  try {
    const msg = await fn();
    flash(typeof msg === 'string' ? msg : what, true);
    ui.pollError = false; // the message stays until the next page, not the next refresh
  } catch (e) {
    flash(e.message);
  }
  await poll(true);
}

// ---- pages ----

function progressCell(j) {
  const p = j.progress || {};
  if (!p.total && !p.phase) return el('span', {class: 'muted', text: ''});
  const pct = p.total ? Math.min(100, 100 * p.done / p.total) : 0;
  const parts = [];
  if (p.total) parts.push(fmtBytes(p.done) + ' / ' + fmtBytes(p.total) + ' (' + pct.toFixed(0) + '%)');
  // A running job's rate and time left, as its worker measured them at its
  // last report (GET /v1/jobs: progress.rate, progress.eta_seconds).
  const rate = j.state === 'running' && p.rate > 0 ? p.rate : 0;
  const eta = rate && p.eta_seconds > 0 ? p.eta_seconds : null;
  return el('div', {class: 'progress', 'data-job': j.id},
    p.total ? el('span', {class: 'bar'}, el('span', {'data-pct': pct.toFixed(0)})) : null,
    el('div', {class: 'progress-phase', text: p.phase || ''}),
    el('div', {class: 'progress-text', text: parts.join(' · ')}),
    rate ? el('div', {class: 'progress-rate', 'data-rate': rate, 'data-eta': eta === null ? '' : eta},
              el('span', {class: 'rate', text: fmtBytes(Math.round(rate)) + '/s'}),
              eta === null ? null : [' · ', el('span', {class: 'eta', text: 'ETA ' + fmtDuration(eta)})]) : null,
    // Tensors done of total, when the phase counts them (a download does not).
    p.tensors_total ? el('div', {class: 'progress-tensors', 'data-done': p.tensors_done, 'data-total': p.tensors_total,
                                 text: p.tensors_done + ' / ' + p.tensors_total + ' tensors'}) : null);
}

// Bars are sized after insertion: the page's CSP forbids inline style attributes.
function sizeBars(root) {
  for (const s of root.querySelectorAll('.bar > span[data-pct]')) s.style.width = s.dataset.pct + '%';
}

// The page's controls (tabs, search, pager, form) are made once and kept:
// each poll only rewrites counts and rows, so typing and clicking are never
// lost to a redraw.
function jobsSkeleton(main) {
  const search = el('input', {type: 'search', id: 'job-search', placeholder: 'search kind, repo, layout'});
  search.value = ui.jobsQuery;
  search.addEventListener('input', () => { ui.jobsQuery = search.value; ui.jobsPage = 0; poll(true); });
  const turn = d => () => { ui.jobsPage += d; poll(true); };
  main.replaceChildren(el('div', {id: 'jobs-view'},
    el('h1', {text: 'Jobs'}),
    el('div', {class: 'tabs', id: 'job-tabs'}, ['all', ...STATES].map(s =>
      el('button', {type: 'button', 'data-state': s, onclick: () => { ui.jobsTab = s; ui.jobsPage = 0; poll(true); }},
         s, el('span', {class: 'count', text: ''})))),
    el('div', {class: 'toolbar'}, search,
      el('span', {class: 'muted', id: 'bulk-label', text: 'all matching:'}),
      ['cancel', 'retry', 'delete'].map(a => el('button', {type: 'button', id: 'bulk-' + a, class: a === 'retry' ? null : 'danger',
        onclick: () => bulkAction(a)}, a[0].toUpperCase() + a.slice(1) + ' all'))),
    table(['id', 'state', 'kind', 'what', 'progress', {text: 'created', class: 'hide-narrow'},
           {text: 'error', class: 'hide-narrow'}], [], 'jobs-table'),
    el('div', {class: 'toolbar', id: 'pager'},
      el('button', {type: 'button', id: 'page-prev', onclick: turn(-1)}, '‹ newer'),
      el('span', {id: 'page-info'}),
      el('button', {type: 'button', id: 'page-next', onclick: turn(1)}, 'older ›')),
    el('h2', {text: 'Fetch and convert'}),
    submitForm()));
}

// The filter of the jobs page, as the API takes it (GET /v1/jobs, /v1/jobs/counts, POST /v1/jobs/bulk).
function jobsFilter() {
  const f = {};
  if (ui.jobsTab !== 'all') f.state = ui.jobsTab;
  if (ui.jobsQuery.trim()) f.q = ui.jobsQuery.trim();
  return f;
}

function query(params) {
  const p = new URLSearchParams(params).toString();
  return p ? '?' + p : '';
}

// Cancel, retry or delete every job the tab and search match, once confirmed.
function bulkAction(action) {
  const f = jobsFilter();
  const what = (f.state ? f.state + ' ' : '') + 'jobs' + (f.q ? ' matching "' + f.q + '"' : '');
  const n = ui.jobsShown || 0;
  if (!confirm(action[0].toUpperCase() + action.slice(1) + ' all ' + n + ' ' + what + '?')) return;
  act('', async () => {
    const r = await api('POST', '/v1/jobs/bulk', Object.assign({action}, f));
    return action + ': ' + r.done + ' of ' + r.matched + ' ' + what;
  });
}

async function jobsPage(main) {
  const f = jobsFilter();
  const [counts, data] = await Promise.all([
    api('GET', '/v1/jobs/counts' + query(f.q ? {q: f.q} : {})),
    api('GET', '/v1/jobs' + query(Object.assign({limit: PAGE_SIZE, offset: ui.jobsPage * PAGE_SIZE}, f)))]);
  if (!main.querySelector('#jobs-view')) jobsSkeleton(main);
  const jobs = data.jobs || [];
  const total = data.total || 0;
  const pages = Math.max(1, Math.ceil(total / PAGE_SIZE));
  if (ui.jobsPage >= pages && ui.jobsPage > 0) { ui.jobsPage = pages - 1; ui.again = true; return; }
  ui.jobsShown = total;
  for (const b of main.querySelectorAll('#job-tabs button')) {
    b.classList.toggle('active', b.dataset.state === ui.jobsTab);
    b.querySelector('.count').textContent = counts[b.dataset.state] || 0;
  }
  // A bulk action needs a filter: a tab or a search.
  for (const b of main.querySelectorAll('[id^="bulk-"]')) b.disabled = !f.state && !f.q || total === 0;
  main.querySelector('#page-prev').disabled = ui.jobsPage === 0;
  main.querySelector('#page-next').disabled = ui.jobsPage >= pages - 1;
  main.querySelector('#page-info').textContent = 'page ' + (ui.jobsPage + 1) + ' of ' + pages + ' (' + total + ' jobs)';
  const rows = jobs.map(j => el('tr', {'data-id': j.id, 'data-state': jobState(j)},
    el('td', {class: 'num'}, el('a', {href: '#/jobs/' + j.id, text: j.id})),
    el('td', {}, stateBadge(jobState(j))),
    el('td', {text: j.kind}),
    el('td', {class: 'mono', text: jobLabel(j)}),
    el('td', {}, progressCell(j)),
    el('td', {class: 'hide-narrow', text: fmtTime(j.created_at)}),
    el('td', {class: 'hide-narrow', text: j.error || ''})));
  const tbody = main.querySelector('#jobs-table tbody');
  tbody.replaceChildren(...rows);
  sizeBars(tbody);
}

function submitForm() {
  const f = el('form', {class: 'submit', id: 'submit-form'},
    el('label', {}, 'repository (ORG/NAME)', el('input', {name: 'repo', id: 'f-repo', required: true, placeholder: 'Qwen/Qwen2-0.5B'})),
    el('label', {}, 'revision', el('input', {name: 'revision', id: 'f-revision', value: 'main'})),
    el('label', {}, 'layout (empty: fetch only)', el('input', {name: 'layout', id: 'f-layout', placeholder: 'neuron'})),
    el('label', {}, 'tp', el('input', {name: 'tp', id: 'f-tp', type: 'number', min: '1', placeholder: '8'})),
    el('button', {type: 'submit', id: 'f-submit'}, 'Submit'));
  f.addEventListener('submit', ev => {
    ev.preventDefault();
    const repo = f.repo.value.trim(), rev = f.revision.value.trim() || 'main', layout = f.layout.value.trim();
    const tp = parseInt(f.tp.value, 10);
    act('Submitted', async () => {
      const fetchJob = await api('POST', '/v1/jobs', {kind: 'fetch', args: {repo, revision: rev}});
      let last = fetchJob;
      if (layout) {
        const args = {ref: repo + '@' + rev, layout};
        if (tp > 0) args.tp = tp;
        last = await api('POST', '/v1/jobs', {kind: 'convert', args, depends_on: fetchJob.id});
      }
      ui.keepFlash = true;
      location.hash = '#/jobs/' + last.id;
      return 'Submitted job ' + fetchJob.id + (last !== fetchJob ? ' (fetch) and job ' + last.id + ' (convert)' : '');
    });
  });
  return f;
}

async function jobPage(main, id) {
  const j = await api('GET', '/v1/jobs/' + id);
  const st = jobState(j);
  // The job it waits for, with its state (it may have been deleted since).
  let dep = null;
  if (j.depends_on) dep = await api('GET', '/v1/jobs/' + j.depends_on).catch(e => { if (e.status === 404) return null; throw e; });
  const fields = el('dl', {class: 'fields', id: 'job-fields'},
    el('dt', {text: 'state'}), el('dd', {id: 'job-state'}, stateBadge(st), j.cancel_requested ? ' (cancel requested)' : ''),
    el('dt', {text: 'kind'}), el('dd', {text: j.kind}),
    el('dt', {text: 'attempt'}), el('dd', {id: 'job-attempt', text: j.attempt + ' of ' + j.max_attempts}),
    el('dt', {text: 'priority'}), el('dd', {text: j.priority}),
    el('dt', {text: 'created'}), el('dd', {text: fmtTime(j.created_at)}),
    el('dt', {text: 'started'}), el('dd', {text: fmtTime(j.started_at)}),
    el('dt', {text: 'finished'}), el('dd', {text: fmtTime(j.finished_at)}),
    el('dt', {text: 'duration'}), el('dd', {text: j.started_at ? fmtDuration((j.finished_at || Date.now() / 1000) - j.started_at) : ''}),
    j.run_after ? [el('dt', {text: 'next attempt'}), el('dd', {text: fmtTime(j.run_after)})] : null,
    j.depends_on ? [el('dt', {text: 'after job'}), el('dd', {id: 'job-dep'}, el('a', {href: '#/jobs/' + j.depends_on, text: j.depends_on}),
      dep ? [' ', dep.kind, ' ', jobLabel(dep), ' ', stateBadge(jobState(dep))] : ' (deleted)')] : null,
    // The jobs that wait for this one (GET /v1/jobs/{id} lists them), each with its state.
    (j.dependents || []).length ? [el('dt', {text: 'waited on by'}), el('dd', {id: 'job-dependents'},
      j.dependents.map((x, i) => el('span', {class: 'dependent', 'data-id': x.id}, i ? ', ' : '',
        el('a', {href: '#/jobs/' + x.id, text: x.id}), ' ', x.kind, ' ', stateBadge(jobState(x)))),
      j.dependents.length >= 100 ? ' (the first 100)' : '')] : null,
    j.worker_pid ? [el('dt', {text: 'worker pid'}), el('dd', {text: j.worker_pid})] : null,
    el('dt', {text: 'progress'}), el('dd', {}, progressCell(j)),
    el('dt', {text: 'last error'}), el('dd', {id: 'job-error', class: 'mono', text: j.error || ''}),
    j.result !== undefined ? [el('dt', {text: 'result'}), el('dd', {class: 'mono', text: JSON.stringify(j.result)})] : null);
  let view = main.querySelector('#job-view[data-id="' + id + '"]');
  if (!view) {
    view = el('div', {id: 'job-view', 'data-id': id},
      el('p', {}, el('a', {href: '#/jobs', text: '‹ all jobs'})),
      el('h1', {id: 'job-title'}),
      el('div', {class: 'toolbar', id: 'job-actions'}),
      el('dl', {id: 'job-fields'}),
      el('h2', {text: 'Arguments'}), el('pre', {id: 'job-args'}),
      el('h2', {text: 'Attempts'}),
      table(['attempt', 'started', 'ended', 'duration', 'outcome', 'error'], [], 'attempts-table'),
      el('h2', {text: 'Log'}), el('pre', {id: 'job-log', 'data-last': '0'}));
    main.replaceChildren(view);
  }
  view.querySelector('#job-title').textContent = 'Job ' + id + ' · ' + j.kind + ' ' + jobLabel(j);
  view.querySelector('#job-args').textContent = JSON.stringify(j.args, null, 2);
  view.querySelector('#job-fields').replaceWith(fields);
  // Each attempt that ended, oldest first (the server keeps the last 20).
  view.querySelector('#attempts-table tbody').replaceChildren(...(j.attempts || []).map((a, i) => el('tr', {'data-attempt': a.attempt, 'data-outcome': a.outcome},
    el('td', {class: 'num', text: a.attempt}),
    el('td', {text: fmtTime(a.started_at)}),
    el('td', {text: fmtTime(a.finished_at)}),
    el('td', {text: a.started_at ? fmtDuration(a.finished_at - a.started_at) : ''}),
    el('td', {}, stateBadge(a.outcome)),
    el('td', {class: 'mono', text: a.error || ''}))));
  // The buttons are made again only when the state changes: a click is never lost to a poll.
  const actions = view.querySelector('#job-actions');
  if (actions.dataset.state !== j.state) {
    actions.dataset.state = j.state;
    actions.replaceChildren(
      (j.state === 'queued' || j.state === 'running') ? el('button', {type: 'button', id: 'job-cancel', class: 'danger',
        onclick: () => { if (confirm('Cancel job ' + id + '?')) act('Cancel requested for job ' + id, () => api('DELETE', '/v1/jobs/' + id)); }}, 'Cancel') : '',
      (j.state === 'failed' || j.state === 'cancelled') ? el('button', {type: 'button', id: 'job-retry',
        onclick: () => { if (confirm('Retry job ' + id + '?')) act('Job ' + id + ' queued again', () => api('POST', '/v1/jobs/' + id + '/retry')); }}, 'Retry') : '',
      (j.state !== 'queued' && j.state !== 'running') ? el('button', {type: 'button', id: 'job-delete', class: 'danger',
        onclick: () => {
          if (!confirm('Delete job ' + id + ' with its log and attempts? This cannot be undone.')) return;
          act('', async () => {
            await api('POST', '/v1/jobs/' + id + '/delete');
            ui.keepFlash = true;
            location.hash = '#/jobs';
            ui.refresh = route(); // now: the refresh after an action must not ask for the deleted job
            return 'Job ' + id + ' deleted';
          });
        }}, 'Delete') : '');
  }
  sizeBars(view);
  const log = view.querySelector('#job-log');
  // The log follows: only lines after the last one shown are asked for.
  const logs = await api('GET', '/v1/jobs/' + id + '/logs?after=' + log.dataset.last);
  const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  for (const l of logs.lines || []) log.append(document.createTextNode(fmtTime(l.at) + '  ' + l.line + '\n'));
  log.dataset.last = String(logs.last || log.dataset.last);
  if (atEnd) log.scrollTop = log.scrollHeight;
}

function verifyText(v) {
  if (!v) return 'never verified';
  return (v.ok ? 'ok' : 'DAMAGED') + ' · ' + fmtTime(v.at) + (v.error ? ' · ' + v.error : '');
}

async function storePage(main) {
  const [data, du] = await Promise.all([api('GET', '/v1/checkpoints'), api('GET', '/v1/store')]);
  const cks = data.checkpoints || [];
  const sig = JSON.stringify([cks, du]);
  const shown = main.querySelector('#store-table');
  if (shown && shown.dataset.sig === sig) return; // unchanged: links stay clickable
  const lv = du.last_verify;
  const rows = cks.map(c => el('tr', {'data-ref': c.ref},
    el('td', {class: 'mono'}, el('a', {href: '#/store/' + encodeURIComponent(c.ref), text: c.ref})),
    el('td', {text: c.layout || '(original)'}),
    el('td', {class: 'mono hide-narrow', text: (c.commit || '').slice(0, 12)}),
    el('td', {class: 'num', text: fmtBytes(c.total_size)}),
    el('td', {class: 'verify', 'data-ok': c.last_verify ? String(c.last_verify.ok) : '', text: c.last_verify ? (c.last_verify.ok ? 'ok' : 'DAMAGED') : ''}),
    el('td', {class: 'hide-narrow', text: fmtTime(c.created_at)})));
  main.replaceChildren(el('h1', {text: 'Store'}),
    el('dl', {class: 'fields', id: 'store-fields'},
      el('dt', {text: 'checkpoints'}), el('dd', {id: 'st-checkpoints', text: du.checkpoints}),
      el('dt', {text: 'logical bytes'}), el('dd', {id: 'st-logical', 'data-bytes': du.logical_bytes, text: fmtBytes(du.logical_bytes) + ' (every file of every checkpoint)'}),
      el('dt', {text: 'physical bytes'}), el('dd', {id: 'st-physical', 'data-bytes': du.physical_bytes, text: fmtBytes(du.physical_bytes) + ' in ' + du.blobs + ' blobs'}),
      el('dt', {text: 'dedup ratio'}), el('dd', {id: 'st-dedup', text: (du.dedup_ratio || 0).toFixed(2) + '×'}),
      el('dt', {text: 'catalog'}), el('dd', {text: fmtBytes(du.catalog_bytes)}),
      el('dt', {text: 'last verify'}), el('dd', {id: 'st-verify', 'data-clean': lv ? String(lv.clean) : ''},
        lv ? (lv.clean ? 'clean' : 'DAMAGED') + ' · ' + fmtTime(lv.at) + ' · ' + (lv.ref || 'whole store') + ' · ' +
             lv.checkpoints_checked + ' checkpoints checked, ' + lv.damaged_blobs + ' damaged blobs, ' +
             lv.broken_checkpoints + ' not rebuilding' : 'never (ckpt verify, or a verify job)')),
    table(['ref', 'layout', {text: 'commit', class: 'hide-narrow'}, {text: 'size', class: 'num'}, 'verified',
           {text: 'stored', class: 'hide-narrow'}], rows, 'store-table'));
  main.querySelector('#store-table').dataset.sig = sig;
}

function copyable(text, id) {
  const code = el('code', {text, id});
  return el('div', {class: 'cmd'}, code, el('button', {type: 'button', onclick: async () => {
    try { await navigator.clipboard.writeText(text); flash('Copied', true); }
    catch (e) { getSelection().selectAllChildren(code); flash('Selected: press Ctrl+C to copy', true); }
  }}, 'Copy'));
}

// One rank's view of a TP layout: the rows of the files under tp_rank_NN/.
function rankPicker(tbody, ranks) {
  const sel = el('select', {id: 'rank-picker', 'aria-label': 'rank'}, el('option', {value: '', text: 'all ranks'}),
    Array.from({length: ranks}, (_, r) => el('option', {value: 'tp_rank_' + String(r).padStart(2, '0') + '/', text: 'rank ' + r})));
  sel.addEventListener('change', () => {
    for (const tr of tbody.rows) tr.hidden = !!sel.value && !tr.dataset.file.startsWith(sel.value);
  });
  return el('div', {class: 'toolbar'}, sel);
}

async function checkpointPage(main, ref) {
  if (main.querySelector('#ckpt-view[data-ref="' + CSS.escape(ref) + '"]')) return; // stored checkpoints do not change
  const c = await api('GET', '/v1/checkpoints/' + encodeURIComponent(ref));
  const server = location.origin;
  const tp = /-tp(\d+)/.exec(c.layout || '');
  const cmds = [copyable('ckpt pull ' + c.ref + ' -o DIR --server ' + server, 'pull-cmd'),
                copyable('ckpt pull ' + c.ref + ' -o DIR', 'pull-local-cmd')];
  if (tp) cmds.push(copyable('ckpt pull ' + c.ref + ' --rank 0 -o DIR --server ' + server, 'pull-rank-cmd'));
  const [org, name] = c.repo.split('/');
  const rev = c.layout ? c.commit + '.' + c.layout : c.commit;
  cmds.push(copyable('HF_ENDPOINT=' + server + ' huggingface-cli download ' + c.repo + ' --revision ' + rev, 'hub-cmd'));
  const files = c.files || [];
  const fileRows = files.map(f => el('tr', {'data-path': f.path},
    el('td', {class: 'mono', text: f.path}),
    el('td', {class: 'num', text: fmtBytes(f.size), title: f.size + ' bytes'}),
    el('td', {class: 'num', text: f.safetensors ? f.tensors : ''}),
    el('td', {class: 'mono', text: f.sha256 || 'pending (computed on first pull or download)'})));
  const tbody = el('tbody', {});
  const tensors = el('div', {class: 'table-wrap', id: 'tensors-table-wrap'},
    el('table', {id: 'tensors-table'},
      el('thead', {}, el('tr', {}, ['name', 'dtype', 'shape', 'size', 'file'].map(h => el('th', {text: h})))), tbody));
  const status = el('p', {id: 'tensors-status', class: 'muted', text: 'reading safetensors headers…'});
  main.replaceChildren(el('div', {id: 'ckpt-view', 'data-ref': ref},
    el('p', {}, el('a', {href: '#/store', text: '‹ all checkpoints'})),
    el('h1', {text: c.ref}),
    el('dl', {class: 'fields'},
      el('dt', {text: 'repo'}), el('dd', {text: c.repo}),
      el('dt', {text: 'revision'}), el('dd', {text: c.revision}),
      el('dt', {text: 'commit'}), el('dd', {class: 'mono', text: c.commit}),
      el('dt', {text: 'layout'}), el('dd', {text: c.layout || '(original)'}),
      c.source ? [el('dt', {text: 'converted from'}), el('dd', {}, el('a', {href: '#/store/' + encodeURIComponent(c.source), text: c.source}))] : null,
      el('dt', {text: 'size'}), el('dd', {text: fmtBytes(c.total_size) + ' in ' + files.length + ' files'}),
      el('dt', {text: 'last verify'}), el('dd', {id: 'ckpt-verify', text: verifyText(c.last_verify)}),
      el('dt', {text: 'Hub API'}), el('dd', {class: 'mono', id: 'hub-url', text: server + '/api/models/' + org + '/' + name + '/revision/' + rev})),
    el('h2', {text: 'Pull'}), cmds,
    el('h2', {text: 'Files'}),
    table(['path', {text: 'size', class: 'num'}, {text: 'tensors', class: 'num'}, 'sha256'], fileRows, 'files-table'),
    el('h2', {text: 'Tensors'}), tp ? rankPicker(tbody, +tp[1]) : null, status, tensors));
  let n = 0;
  for (const f of files.filter(x => x.safetensors)) {
    const hdr = await safetensorsHeader(c.ref, f.path);
    for (const name of Object.keys(hdr).filter(k => k !== '__metadata__').sort()) {
      const t = hdr[name], size = t.data_offsets[1] - t.data_offsets[0];
      tbody.append(el('tr', {'data-name': name, 'data-file': f.path},
        el('td', {class: 'mono', text: name}), el('td', {text: t.dtype}),
        el('td', {class: 'mono', text: '[' + t.shape.join(', ') + ']'}),
        el('td', {class: 'num', text: fmtBytes(size), 'data-bytes': size}),
        el('td', {class: 'mono', text: f.path})));
      n++;
    }
  }
  status.textContent = n + ' tensors';
  status.dataset.done = '1';
}

// "90", "90s", "30m", "6h", "1d", "2w" -> seconds (as `ckpt sync add --every`), or NaN.
function parseEvery(text) {
  const m = /^(\d+)\s*([smhdw]?)$/.exec(text.trim());
  if (!m) return NaN;
  return +m[1] * {'': 1, s: 1, m: 60, h: 3600, d: 86400, w: 604800}[m[2]];
}

// Adds a schedule (POST /v1/schedules): a period or a cron expression, and
// the layouts to convert each new commit to ("neuron-tp2, gguf").
function scheduleForm() {
  const f = el('form', {class: 'submit', id: 'schedule-form'},
    el('label', {}, 'repository (ORG/NAME)', el('input', {name: 'repo', id: 's-repo', required: true, placeholder: 'Qwen/Qwen2-0.5B'})),
    el('label', {}, 'revision', el('input', {name: 'revision', id: 's-revision', value: 'main'})),
    el('label', {}, 'every (90s, 30m, 6h, 1d)', el('input', {name: 'every', id: 's-every', placeholder: '6h'})),
    el('label', {}, 'or cron (UTC)', el('input', {name: 'cron', id: 's-cron', placeholder: '0 3 * * *'})),
    el('label', {}, 'layouts (L or L-tpN, comma-separated)', el('input', {name: 'layouts', id: 's-layouts', placeholder: 'neuron-tp2'})),
    el('button', {type: 'submit', id: 's-add'}, 'Add schedule'));
  f.addEventListener('submit', ev => {
    ev.preventDefault();
    const body = {repo: f.repo.value.trim(), revision: f.revision.value.trim() || 'main'};
    const cron = f.cron.value.trim(), every = f.every.value.trim();
    if (cron) body.cron = cron;
    if (every) body.every_seconds = parseEvery(every);
    if (every && !(body.every_seconds > 0)) { flash('every: "' + every + '" is not a period like 90s, 30m, 6h or 1d'); return; }
    body.layouts = f.layouts.value.split(',').map(x => x.trim()).filter(Boolean).map(x => {
      const m = /^(.*)-tp(\d+)$/.exec(x);
      return m ? {layout: m[1], tp: +m[2]} : {layout: x};
    });
    act('', async () => {
      const sc = await api('POST', '/v1/schedules', body);
      f.reset();
      return 'Schedule ' + sc.id + ' added';
    });
  });
  return f;
}

async function schedulesPage(main) {
  const data = await api('GET', '/v1/schedules');
  const list = data.schedules || [];
  if (!main.querySelector('#schedules-view')) {
    main.replaceChildren(el('div', {id: 'schedules-view'}, el('h1', {text: 'Schedules'}),
      el('div', {id: 'schedules-list'}), el('h2', {text: 'Add a schedule'}), scheduleForm()));
  }
  const sig = JSON.stringify(list);
  const shown = main.querySelector('#schedules-table');
  if (shown && shown.dataset.sig === sig) return; // unchanged: buttons stay clickable
  // The fields of `ckpt sync ls --json` (service/jobs/schedule.c).
  const layouts = s => (s.layouts || []).map(l => l.layout + (l.tp ? '-tp' + l.tp : '')).join(', ');
  const action = (s, label, cls, question, done, method, path) => el('button', {type: 'button', class: cls, onclick: () => {
    if (confirm(question)) act(done, () => api(method, path));
  }}, label);
  const rows = list.map(s => el('tr', {'data-id': s.id, 'data-paused': String(!!s.paused)},
    el('td', {class: 'num', text: s.id}),
    el('td', {class: 'mono', text: s.repo + (s.revision ? '@' + s.revision : '')}),
    el('td', {text: s.cron ? 'cron ' + s.cron : s.every_seconds ? 'every ' + fmtDuration(s.every_seconds) : ''}),
    el('td', {class: 'hide-narrow', text: layouts(s)}),
    el('td', {class: 'next-run', text: s.paused ? 'paused' : fmtTime(s.next_run_at)}),
    el('td', {class: 'hide-narrow', text: fmtTime(s.last_run_at)}),
    el('td', {class: 'mono hide-narrow', text: (s.last_commit || '').slice(0, 12)}),
    el('td', {}, s.last_outcome || '', s.last_job_id ? [' (', el('a', {href: '#/jobs/' + s.last_job_id, text: 'job ' + s.last_job_id}), ')'] : null),
    el('td', {class: 'actions'},
      action(s, 'Run now', 'run-now', 'Run schedule ' + s.id + ' now?', 'Schedule ' + s.id + ' queued', 'POST', '/v1/schedules/' + s.id + '/run'),
      s.paused ? action(s, 'Resume', 'resume', 'Resume schedule ' + s.id + '?', 'Schedule ' + s.id + ' resumed', 'POST', '/v1/schedules/' + s.id + '/resume')
               : action(s, 'Pause', 'pause', 'Pause schedule ' + s.id + '?', 'Schedule ' + s.id + ' paused', 'POST', '/v1/schedules/' + s.id + '/pause'),
      action(s, 'Remove', 'remove danger', 'Remove schedule ' + s.id + ' (' + s.repo + ')? Its checkpoints stay.', 'Schedule ' + s.id + ' removed', 'DELETE', '/v1/schedules/' + s.id))));
  main.querySelector('#schedules-list').replaceChildren(list.length ? table(['id', 'repo', 'period', {text: 'layouts', class: 'hide-narrow'}, 'next run',
      {text: 'last run', class: 'hide-narrow'}, {text: 'last commit', class: 'hide-narrow'}, 'last outcome', ''], rows, 'schedules-table')
    : el('p', {id: 'schedules-table', class: 'muted', text: 'No schedules yet.'}));
  main.querySelector('#schedules-table').dataset.sig = sig;
}

const CHART_HOURS = 6;
const CHART_STEP = 600; // one bar per 10 minutes

// The per-minute rows of GET /v1/stats summed (or, for samples, maxed) into
// CHART_STEP bars: {name: [v per bar]}. A figure per kind is summed over kinds.
function chartSeries(stats, names, max) {
  const end = Math.floor(stats.now / CHART_STEP) * CHART_STEP, n = CHART_HOURS * 3600 / CHART_STEP;
  const start = end - (n - 1) * CHART_STEP;
  const out = {};
  for (const name of names) out[name] = new Array(n).fill(0);
  for (const r of stats.rows || []) {
    const v = out[r.name], i = Math.floor((r.t - start) / CHART_STEP);
    if (!v || i < 0 || i >= n) continue;
    v[i] = max ? Math.max(v[i], r.value) : v[i] + r.value;
  }
  return {start, values: out};
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

// A small bar chart of one series over the last hours, with its total (or peak).
function chart(id, title, values, start, fmt, peak) {
  const W = 240, H = 48, n = values.length, bw = W / n, top = Math.max(1, ...values);
  const total = peak ? Math.max(0, ...values) : values.reduce((a, b) => a + b, 0);
  const g = svg('svg', {viewBox: '0 0 ' + W + ' ' + H, class: 'chart-svg', role: 'img', 'aria-label': title});
  g.append(svg('line', {x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: 'axis'}));
  values.forEach((v, i) => {
    if (!v) return;
    const h = Math.max(1, (H - 2) * v / top);
    const r = svg('rect', {x: (i * bw + 0.5).toFixed(1), y: (H - 1 - h).toFixed(1), width: Math.max(1, bw - 1).toFixed(1), height: h.toFixed(1)});
    const t = svg('title');
    t.textContent = fmtTime(start + i * CHART_STEP).slice(11, 16) + ' UTC: ' + fmt(v);
    r.append(t);
    g.append(r);
  });
  return el('figure', {class: 'chart', id, 'data-total': total},
    el('figcaption', {}, el('span', {text: title}), el('strong', {text: (peak ? 'peak ' : '') + fmt(total)})), g);
}

async function overviewPage(main) {
  const [health, counts, running, stats] = await Promise.all([
    fetch('/healthz', {cache: 'no-store'}).then(r => r.json()),
    api('GET', '/v1/jobs/counts'),
    api('GET', '/v1/jobs?state=running&limit=100'),
    api('GET', '/v1/stats?hours=' + CHART_HOURS)]);
  const jobsOf = chartSeries(stats, ['jobs.succeeded', 'jobs.failed'], false);
  const bytes = chartSeries(stats, ['bytes.fetch', 'bytes.convert', 'bytes.merge-lora', 'bytes.unmerge-lora', 'bytes.served'], false);
  const samples = chartSeries(stats, ['queue.depth', 'workers.busy'], true);
  const converted = bytes.values['bytes.convert'].map((v, i) => v + bytes.values['bytes.merge-lora'][i] + bytes.values['bytes.unmerge-lora'][i]);
  const hour = (stats.rows || []).filter(r => r.t >= stats.now - 3600);
  const inHour = name => hour.filter(r => r.name === name).reduce((a, r) => a + r.value, 0);
  const num = v => String(v);
  const list = running.jobs || [];
  main.replaceChildren(el('h1', {text: 'Overview'}),
    el('dl', {class: 'fields', id: 'overview-fields'},
      el('dt', {text: 'workers busy'}), el('dd', {id: 'ov-workers', text: health.workers}),
      el('dt', {text: 'queue depth'}), el('dd', {id: 'ov-queue', text: counts.queued || 0}),
      el('dt', {text: 'in the last hour'}), el('dd', {id: 'ov-hour', text: inHour('jobs.succeeded') + ' jobs succeeded, ' + inHour('jobs.failed') + ' failed'}),
      el('dt', {text: 'jobs kept'}), el('dd', {text: counts.all || 0})),
    el('h2', {text: 'Workers'}),
    table(['job', 'worker pid', 'kind', 'what', 'progress'], list.map(j => el('tr', {'data-id': j.id},
      el('td', {}, el('a', {href: '#/jobs/' + j.id, text: j.id})), el('td', {class: 'num', text: j.worker_pid || ''}),
      el('td', {text: j.kind}), el('td', {class: 'mono', text: jobLabel(j)}), el('td', {}, progressCell(j)))), 'running-table'),
    el('h2', {text: 'The last ' + CHART_HOURS + ' hours (per 10 minutes)'}),
    el('div', {class: 'charts', id: 'charts'},
      chart('chart-succeeded', 'jobs succeeded', jobsOf.values['jobs.succeeded'], jobsOf.start, num),
      chart('chart-failed', 'jobs failed', jobsOf.values['jobs.failed'], jobsOf.start, num),
      chart('chart-fetched', 'bytes fetched', bytes.values['bytes.fetch'], bytes.start, fmtBytes),
      chart('chart-converted', 'bytes converted', converted, bytes.start, fmtBytes),
      chart('chart-served', 'bytes served', bytes.values['bytes.served'], bytes.start, fmtBytes),
      chart('chart-queue', 'queue depth', samples.values['queue.depth'], samples.start, num, true),
      chart('chart-workers', 'workers busy', samples.values['workers.busy'], samples.start, num, true)),
    el('h2', {text: 'Jobs by state'}),
    table(STATES, [el('tr', {}, STATES.map(s => el('td', {class: 'num', text: counts[s] || 0})))], 'state-table'));
  sizeBars(main);
}

// ---- routing and polling ----

function route() {
  const h = location.hash.replace(/^#\/?/, '');
  const [page, ...rest] = h.split('/');
  const arg = rest.join('/');
  for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('active', a.id === 'nav-' + (page || 'jobs'));
  const main = document.getElementById('main');
  if (page === 'store' && arg) return () => checkpointPage(main, decodeURIComponent(arg));
  if (page === 'store') return () => storePage(main);
  if (page === 'schedules') return () => schedulesPage(main);
  if (page === 'overview') return () => overviewPage(main);
  if (page === 'jobs' && /^\d+$/.test(arg)) return () => jobPage(main, arg);
  return () => jobsPage(main);
}

// One refresh at a time; a request for another while one runs (a click, a
// keystroke) runs it right after. Errors of a refresh are shown until one
// succeeds; those of an action stay until the next page.
let inFlight = null;
async function poll(again) {
  if (inFlight) {
    if (again) ui.again = true;
    return inFlight;
  }
  clearTimeout(ui.timer);
  inFlight = (async () => {
    do {
      ui.again = false;
      const page = ui.refresh;
      ui.refreshes++;
      try {
        await page();
        if (ui.pollError) { flash(''); ui.pollError = false; }
        ui.lastUpdate = Date.now();
        document.body.dataset.loaded = String(ui.lastUpdate);
      } catch (e) {
        // The error of a page left meanwhile (a job just deleted) is no news.
        if (page === ui.refresh) { flash(e.message); ui.pollError = true; }
      }
    } while (ui.again);
  })();
  await inFlight;
  inFlight = null;
  if (!ui.paused) ui.timer = setTimeout(poll, POLL_MS);
  showUpdated();
}

// The header's "updated HH:MM:SS UTC" ("paused · updated ..." while paused).
// Its data-paused is "true" once updates are paused and no refresh is under
// way: from then on the page changes only when the user acts or moves to
// another page, until updates resume. data-refreshes counts the refreshes.
function showUpdated() {
  const u = document.getElementById('updated');
  const at = ui.lastUpdate ? 'updated ' + fmtTime(ui.lastUpdate / 1000).slice(11, 19) + ' UTC' : '';
  u.textContent = ui.paused ? 'paused · ' + at : at;
  u.dataset.paused = String(ui.paused && !inFlight);
  u.dataset.refreshes = String(ui.refreshes);
}

function start() {
  const tokenForm = document.getElementById('token-form');
  const tokenInput = document.getElementById('token');
  tokenInput.value = '';
  tokenInput.placeholder = sessionStorage.getItem(TOKEN_KEY) ? 'token set (this tab)' : 'API token';
  tokenForm.addEventListener('submit', ev => {
    ev.preventDefault();
    if (tokenInput.value) sessionStorage.setItem(TOKEN_KEY, tokenInput.value);
    tokenInput.value = '';
    tokenInput.placeholder = 'token set (this tab)';
    flash('');
    poll(true);
  });
  document.getElementById('token-forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    tokenInput.placeholder = 'API token';
    poll();
  });
  const pause = document.getElementById('pause');
  pause.addEventListener('click', () => {
    ui.paused = !ui.paused;
    pause.textContent = ui.paused ? 'Resume updates' : 'Pause updates';
    pause.setAttribute('aria-pressed', String(ui.paused));
    if (ui.paused) clearTimeout(ui.timer); else poll();
    showUpdated();
  });
  window.addEventListener('hashchange', () => {
    ui.refresh = route();
    document.getElementById('main').replaceChildren(el('p', {text: 'Loading…'}));
    if (!ui.keepFlash) flash('');
    ui.keepFlash = false;
    poll(true);
  });
  ui.refresh = route();
  poll();
}

start();
