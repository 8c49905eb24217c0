// humanset browse: the page side. Plain DOM, no framework, no network but this server.
// Every string from the catalog is set as textContent or an attribute, never parsed as HTML.
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';
const FILTER_KEYS = ['keep', 'stage', 'reason', 'shard', 'source', 'id', 'dup',
  'person_min', 'person_max', 'text_min', 'text_max', 'watermark_min', 'watermark_max', 'art_min', 'art_max',
  'sort', 'order'];
const PAGE_KEYS = ['offset', 'after'];
const KEYS = { p: ['person', 1], P: ['person', 0], t: ['text', 1], T: ['text', 0],
  w: ['watermark', 1], W: ['watermark', 0], a: ['art', 1], A: ['art', 0] };
const KEY_OF = {};
for (const [k, [stage, v]] of Object.entries(KEYS)) KEY_OF[stage + v] = k;
// COCO-17 skeleton (0-based keypoint indices)
const SKELETON = [[15, 13], [13, 11], [16, 14], [14, 12], [11, 12], [5, 11], [6, 12], [5, 6], [5, 7], [6, 8],
  [7, 9], [8, 10], [1, 2], [0, 1], [0, 2], [1, 3], [2, 4], [3, 5], [4, 6]];
const KP_MIN_CONF = 0.3;

const state = { summary: null, funnel: null, funnelReady: null, funnelError: null, grid: null, sample: null, view: null };

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, String(v));
  return e;
}

async function api(path, options) {
  const r = await fetch(path, options);
  let body;
  try { body = await r.json(); } catch (e) { body = { error: `${r.status} ${r.statusText}` }; }
  if (!r.ok) throw new Error(body.error || `${r.status}`);
  return body;
}

function fmt(v) {
  if (v === null || v === undefined) return '–';
  if (typeof v === 'number') {
    if (Number.isInteger(v)) return v.toLocaleString('en');
    return Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(3);
  }
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (Array.isArray(v) || typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

function toast(text) {
  const t = document.getElementById('toast');
  t.textContent = text;
  t.classList.add('show');
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.remove('show'), 1600);
}

function showError(where, err) {
  where.replaceChildren(el('div', { class: 'error', text: String(err.message || err) }));
}

function parseHash() {
  const h = location.hash.replace(/^#/, '') || '/grid';
  const i = h.indexOf('?');
  return { path: i < 0 ? h : h.slice(0, i), params: new URLSearchParams(i < 0 ? '' : h.slice(i + 1)) };
}

function pick(params, keys) {
  const out = new URLSearchParams();
  for (const k of keys) if (params.get(k)) out.set(k, params.get(k));
  return out;
}

function sampleHref(row) {
  const q = row.shard ? `?shard=${encodeURIComponent(row.shard)}` : '';
  return `#/sample/${encodeURIComponent(row.sample_id)}${q}`;
}

function imgSrc(size, row) {
  const q = row.shard ? `?shard=${encodeURIComponent(row.shard)}` : '';
  return `/img/${size}/${encodeURIComponent(row.sample_id)}${q}`;
}

// --- the header and the labels -------------------------------------------------------------------
function renderHeader() {
  const s = state.summary;
  const f = state.funnel;
  document.getElementById('run-name').textContent = `${s.run}${f ? ` · ${fmt(f.inputs)} samples, ${fmt(f.kept)} kept` : ''}`
    + (s.finished ? '' : ' · run not finished: counts refresh');
  const l = s.labels;
  const node = document.getElementById('labels-state');
  node.textContent = l.enabled ? `labels: ${l.path} (${fmt(l.samples)} samples)` : 'read-only: start with --labels FILE to label';
}

async function setLabel(sampleId, stage, value, current) {
  if (!state.summary.labels.enabled) { toast('read-only: start humanset browse with --labels FILE'); return null; }
  const next = current === value ? null : value;
  try {
    const r = await api('/api/label', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ sample_id: sampleId, stage, value: next }) });
    state.summary.labels = r.summary;
    renderHeader();
    toast(next === null ? `${stage} label cleared` : `${stage}=${next} (${state.summary.labels.meaning[stage][next ? 0 : 1]})`);
    return r.labels;
  } catch (e) {
    toast(`label not saved: ${e.message}`);
    return null;
  }
}

function labelBadges(labels) {
  const meaning = state.summary.labels.meaning;
  return Object.entries(labels || {}).map(([stage, v]) =>
    el('span', { class: `badge l${v}`, title: `${stage}=${v}`, text: meaning[stage][v ? 0 : 1] }));
}

// --- the grid ------------------------------------------------------------------------------------
function filterForm(params) {
  const s = state.summary;
  const opt = (value, text, current) => el('option', { value, selected: value === (current || '') }, text);
  const select = (name, options) => el('select', { name }, options.map(([v, t]) => opt(v, t, params.get(name))));
  // the stage and reason choices come with the funnel (its own request: the first page does not wait)
  const current = (name) => (params.get(name) ? [[params.get(name), params.get(name)]] : []);
  const stageSelect = select('stage', [['', 'any'], ...current('stage')]);
  const reasonSelect = select('reason', [['', 'any'], ...current('reason')]);
  state.funnelReady.then((f) => {
    if (!f) return;
    const stages = f.funnel.filter((x) => !['inputs', 'kept'].includes(x.stage) && x.dropped > 0);
    stageSelect.replaceChildren(...[['', 'any'], ...stages.map((x) => [x.stage, `${x.stage} (${fmt(x.dropped)})`])]
      .map(([v, t]) => opt(v, t, params.get('stage'))));
    reasonSelect.replaceChildren(...[['', 'any'], ...f.reasons.map((r) => [r.reason, `${r.reason} (${fmt(r.first)})`])]
      .map(([v, t]) => opt(v, t, params.get('reason'))));
    stageSelect.dataset.ready = reasonSelect.dataset.ready = 'true';
  });
  const form = el('form', { class: 'filters', id: 'filters' },
    el('label', { text: 'decision' }),
    select('keep', [['', 'any'], ['kept', 'kept'], ['rejected', 'rejected']]),
    el('label', { text: 'rejected by stage' }),
    stageSelect,
    el('label', { text: 'reject reason' }),
    reasonSelect,
    ...Object.entries(s.thresholds).map(([name, t]) => [
      el('label', { text: `${name} ${t.score_label || 'score'} (${t.column})${t.value !== null ? `, cut ${t.keep === '<=' ? 'max' : 'min'} ${t.value}` : ''}` }),
      el('div', { class: 'range' },
        el('input', { name: `${name}_min`, type: 'number', step: 'any', placeholder: 'min', value: params.get(`${name}_min`) || '' }),
        el('input', { name: `${name}_max`, type: 'number', step: 'any', placeholder: 'max', value: params.get(`${name}_max`) || '' })),
    ]),
    el('label', { text: 'duplicates' }),
    select('dup', [['', 'any'], ['duplicate', 'a duplicate (not the kept member)'], ['exact', 'exact duplicate'],
      ['near', 'near duplicate'], ['kept_member', "its cluster's kept member"], ['in_cluster', 'in a cluster'],
      ['unique', 'unique']]),
    el('label', { text: 'input unit (shard column, exact)' }),
    el('input', { name: 'shard', value: params.get('shard') || '', placeholder: 'crawl-00017.tar' }),
    el('label', { text: 'source_uri starts with' }),
    el('input', { name: 'source', value: params.get('source') || '', placeholder: 's3://bucket/crawl/' }),
    el('label', { text: 'sample_id starts with' }),
    el('input', { name: 'id', value: params.get('id') || '' }),
    el('label', { text: 'sort' }),
    select('sort', s.sorts.map((x) => [x === 'catalog' ? '' : x, x === 'catalog' ? 'catalog order' : x])),
    select('order', [['', 'descending'], ['asc', 'ascending']]),
    el('div', { class: 'buttons' },
      el('button', { type: 'submit', id: 'apply' }, 'Apply'),
      el('button', { type: 'button', id: 'clear', onclick: () => { location.hash = '#/grid'; } }, 'Clear')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (String(v).trim()) q.set(k, String(v).trim());
    sessionStorage.removeItem(`trail:${q}`);
    location.hash = `#/grid?${q}`;
  });
  return form;
}

function tile(row) {
  const chips = [['p', row[state.summary.thresholds.person.column]], ['txt', row.text_area_frac], ['wm', row.watermark_score], ['art', row.art_score]]
    .filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => `${k} ${fmt(v)}`);
  if (row.n_persons !== null && row.n_persons !== undefined) chips.unshift(`persons ${fmt(row.person_n_pass)}/${fmt(row.n_persons)}`);
  const scores = chips.join(' · ');
  const decision = row.keep ? el('span', { class: 'kept', text: 'kept' })
    : el('span', { class: 'rej', text: row.reject_reason || 'rejected' });
  const dup = row.dup_cluster_size > 1 ? ` · cluster ${row.dup_cluster_size}${row.dup_of ? ` (${row.dup_kind} dup)` : ' (kept member)'}` : '';
  return el('a', { class: 'tile', href: sampleHref(row), 'data-id': row.sample_id, tabindex: 0 },
    el('div', { class: 'thumb' }, el('img', { src: imgSrc('s', row), alt: row.key || row.sample_id, loading: 'lazy' })),
    el('div', { class: 'cap', title: row.reject_reason || 'kept' }, decision, ` ${row.key || ''}`),
    el('div', { class: 'scores', text: (scores || 'no scores') + dup }),
    el('div', { class: 'badges' }, labelBadges(row.labels)));
}

async function showGrid(params) {
  const view = document.getElementById('view');
  const filter = pick(params, FILTER_KEYS);
  const page = pick(params, PAGE_KEYS);
  const trailKey = `trail:${filter}`;
  const trail = JSON.parse(sessionStorage.getItem(trailKey) || '[]');
  const count = el('span', { id: 'count', class: 'muted', text: 'counting…' });
  const range = el('span', { id: 'range', class: 'muted' });
  const prev = el('button', { id: 'prev', disabled: !page.toString() }, '← prev');
  const next = el('button', { id: 'next', disabled: true }, 'next →');
  const tiles = el('div', { class: 'tiles', id: 'tiles' }, el('p', { class: 'muted', text: 'loading…' }));
  view.replaceChildren(el('div', { class: 'grid-view' }, filterForm(params),
    el('section', { class: 'results' }, el('div', { class: 'status' }, count, range, prev, next), tiles)));
  prev.addEventListener('click', () => {
    const back = trail.pop();
    sessionStorage.setItem(trailKey, JSON.stringify(trail));
    location.hash = `#/grid?${back !== undefined ? back : filter}`;
  });
  api(`/api/count?${filter}`).then((r) => { count.textContent = `${fmt(r.count)} samples match`; },
    (e) => { count.textContent = `count failed: ${e.message}`; });
  let data;
  try {
    data = await api(`/api/samples?${filter}&${page}`);
  } catch (e) { showError(tiles, e); return; }
  state.grid = { hash: location.hash, rows: data.rows };
  const first = (data.offset || trail.length * state.summary.page_size) + 1;
  range.textContent = data.rows.length ? `showing ${fmt(first)}–${fmt(first + data.rows.length - 1)}` : '';
  tiles.replaceChildren(...(data.rows.length ? data.rows.map(tile) : [el('p', { class: 'muted', text: 'no sample matches this filter' })]));
  if (data.next) {
    next.disabled = false;
    next.addEventListener('click', () => {
      trail.push(`${filter}${page.toString() ? `&${page}` : ''}`);
      sessionStorage.setItem(trailKey, JSON.stringify(trail));
      const q = new URLSearchParams(filter);
      for (const [k, v] of Object.entries(data.next)) q.set(k, String(v));
      location.hash = `#/grid?${q}`;
    });
  }
}

function gridKey(ev) {
  const tiles = Array.from(document.querySelectorAll('.tile'));
  const at = tiles.indexOf(document.activeElement);
  if (ev.key === 'ArrowRight' || ev.key === 'ArrowLeft') {
    const to = tiles[Math.max(0, Math.min(tiles.length - 1, at + (ev.key === 'ArrowRight' ? 1 : -1)))];
    if (to) { to.focus(); ev.preventDefault(); }
    return;
  }
  if (KEYS[ev.key] && at >= 0) {
    const row = state.grid.rows.find((r) => r.sample_id === tiles[at].dataset.id);
    const [stage, value] = KEYS[ev.key];
    setLabel(row.sample_id, stage, value, (row.labels || {})[stage]).then((labels) => {
      if (labels) { row.labels = labels; tiles[at].querySelector('.badges').replaceChildren(...labelBadges(labels)); }
    });
  }
}

// --- the funnel ----------------------------------------------------------------------------------
function barRow(name, value, max, text, href, kind, title) {
  const bar = el('div', { class: `bar ${kind || ''}`, style: null });
  bar.style.width = `${max ? (100 * value) / max : 0}%`;
  const kids = [el('span', { class: 'name', text: name, title: title || name }),
    el('div', { class: 'track' }, bar), el('span', { class: 'num', text })];
  return href ? el('a', { class: 'bar-row', href, 'data-target': href }, kids) : el('div', { class: 'bar-row skipped' }, kids);
}

async function showFunnel() {
  const s = await state.funnelReady;
  if (!s) { showError(document.getElementById('view'), new Error(`funnel: ${state.funnelError}`)); return; }
  const n = s.inputs;
  const funnel = el('div', { class: 'chart', id: 'funnel-chart' }, el('h2', { text: 'Funnel: samples left after each stage (click: the samples it rejected)' }),
    s.funnel.map((f) => {
      if (f.skipped) return barRow(f.stage, 0, n, `skipped: ${f.skipped}`, null, '');
      const href = f.stage === 'inputs' ? '#/grid' : f.stage === 'kept' ? '#/grid?keep=kept'
        : f.dropped ? `#/grid?${new URLSearchParams({ stage: f.stage })}` : null;
      const text = `${fmt(f.count)} (${f.pct.toFixed(1)}%)${f.dropped ? ` −${fmt(f.dropped)}` : ''}`;
      return barRow(f.stage, f.count, n, text, href, f.stage === 'kept' ? 'keep' : '');
    }));
  const maxReason = Math.max(1, ...s.reasons.map((r) => r.first));
  const reasons = el('div', { class: 'chart', id: 'reasons-chart' }, el('h2', { text: 'Reject reasons (first failing stage; click: those samples)' }),
    s.reasons.length ? s.reasons.map((r) => barRow(r.reason, r.first, maxReason,
      `${fmt(r.first)} (${r.pct.toFixed(1)}%)${r.any !== r.first ? `, failed at all ${fmt(r.any)}` : ''}`,
      `#/grid?${new URLSearchParams({ reason: r.reason })}`, 'reason', r.example)) : el('p', { class: 'muted', text: 'nothing was rejected' }));
  document.getElementById('view').replaceChildren(funnel, reasons);
}

// --- one sample ----------------------------------------------------------------------------------
function kvTable(pairs) {
  return el('table', { class: 'kv' }, pairs.map(([k, v]) => el('tr', {}, el('td', { text: k }), el('td', { text: fmt(v) }))));
}

const DRAWN = new Set(['person_boxes', 'person_scores', 'person_keypoints', 'text_det_boxes', 'text_det_scores',
  'text_det_strings', 'text_det_rec_scores']);

function drawOverlay(svg, data, size, show) {
  const [w, h] = size;
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.replaceChildren();
  const r = Math.max(w, h) / 180;
  if (show.text) {
    for (const t of data.text_boxes) {
      if (!t.quad) continue;
      const pts = [0, 2, 4, 6].map((i) => `${t.quad[i]},${t.quad[i + 1]}`).join(' ');
      const p = svgEl('polygon', { points: pts, fill: 'none', class: t.mark ? 'mark-box' : 'text-box',
        stroke: t.mark ? '#e08a00' : '#2b6cb0', 'stroke-width': 2, 'vector-effect': 'non-scaling-stroke',
        'stroke-dasharray': t.text ? null : '5 4' });
      p.append(svgEl('title', {}));
      p.firstChild.textContent = `${t.text === null ? '(not read)' : t.text} · det ${fmt(t.score)}${t.mark ? ' · read by the watermark stage' : ''}`;
      svg.append(p);
    }
  }
  data.persons.forEach((p, i) => {
    const color = p.passes === true ? '#1a9850' : p.passes === false ? '#d73027' : '#888';
    if (show.persons && p.box) {
      const b = p.box;
      const rect = svgEl('rect', { x: b[0], y: b[1], width: b[2] - b[0], height: b[3] - b[1], fill: 'none', stroke: color,
        'stroke-width': 3, 'vector-effect': 'non-scaling-stroke', class: 'person-box', 'data-index': i });
      svg.append(rect);
      const label = svgEl('text', { x: b[0] + r, y: b[1] + 4 * r, fill: color, 'font-size': 4 * r, 'font-family': 'sans-serif' });
      label.textContent = `${i} · ${fmt(p.score)}`;
      svg.append(label);
    }
    if (show.keypoints && p.keypoints) {
      const kp = p.keypoints;
      for (const [a, b] of SKELETON) {
        if (kp[a] && kp[b] && kp[a][2] >= KP_MIN_CONF && kp[b][2] >= KP_MIN_CONF) {
          svg.append(svgEl('line', { x1: kp[a][0], y1: kp[a][1], x2: kp[b][0], y2: kp[b][1], stroke: '#00b7c7',
            'stroke-width': 2, 'vector-effect': 'non-scaling-stroke', class: 'limb' }));
        }
      }
      for (const k of kp) {
        if (k && k[2] >= KP_MIN_CONF) svg.append(svgEl('circle', { cx: k[0], cy: k[1], r, fill: '#ff3d9a', class: 'keypoint' }));
      }
    }
  });
}

function labelsPanel(data) {
  const s = state.summary.labels;
  const panel = el('div', { class: 'panel labels', id: 'labels-panel' }, el('h3', { text: s.enabled ? 'Labels' : 'Labels (read-only: start with --labels FILE)' }));
  for (const [stage, [yes, no]] of Object.entries(s.meaning)) {
    const current = (data.labels || {})[stage];
    const button = (value, text) => el('button', { type: 'button', class: current === value ? 'on' : '', disabled: !s.enabled,
      'data-stage': stage, 'data-value': value, title: `${stage}=${value}`,
      onclick: () => labelSample(stage, value) }, `${text} `, el('kbd', { text: KEY_OF[stage + value] }));
    panel.append(el('div', { class: 'row' }, el('span', { class: 'stage', text: stage }), button(1, yes), button(0, no)));
  }
  return panel;
}

async function labelSample(stage, value) {
  const data = state.sample;
  if (!data) return;
  const labels = await setLabel(data.row.sample_id, stage, value, (data.labels || {})[stage]);
  if (labels) {
    data.labels = labels;
    document.getElementById('labels-panel').replaceWith(labelsPanel(data));
    const row = state.grid && state.grid.rows.find((r) => r.sample_id === data.row.sample_id);
    if (row) row.labels = labels;
  }
}

function clusterSection(data) {
  const c = data.cluster;
  if (!c) return el('div', { class: 'panel', id: 'cluster' }, el('h3', { text: 'Duplicate cluster' }), el('p', { class: 'muted', text: 'unique: no duplicate in this run' }));
  const members = c.members.map((m) => el('div', {
    class: `member${m.sample_id === c.kept_id ? ' kept-member' : ''}${m.sample_id === data.row.sample_id ? ' current' : ''}`,
    'data-id': m.sample_id },
  el('a', { href: sampleHref(m) }, el('img', { src: imgSrc('s', m), alt: m.key || m.sample_id, loading: 'lazy' })),
  el('div', { text: `rank ${fmt(m.dup_rank)} · ${m.dup_kind || 'canonical'} · ${fmt(m.width)}×${fmt(m.height)}` }),
  el('div', { class: m.sample_id === c.kept_id ? 'kept' : 'muted', text: m.sample_id === c.kept_id ? "dedup's pick" : `${m.dup_kind || 'a'} duplicate of the pick` }),
  el('div', { class: m.keep ? 'kept' : 'rej', text: m.keep ? 'kept' : (m.reject_reason || 'rejected') }),
  el('div', { class: 'muted', text: m.sample_id })));
  return el('div', { class: 'panel', id: 'cluster' },
    el('h3', { text: `Duplicate cluster: ${fmt(c.size)} members${c.listed < c.size ? ` (first ${c.listed} by dup_rank)` : ''}` }),
    el('p', { id: 'cluster-why', text: `kept member ${c.kept_id}: ${c.why}` }), el('div', { class: 'members' }, members));
}

async function showSample(id, params) {
  const view = document.getElementById('view');
  view.replaceChildren(el('p', { class: 'muted', text: 'loading…' }));
  const shard = params.get('shard');
  let data;
  try {
    data = await api(`/api/sample/${encodeURIComponent(id)}${shard ? `?shard=${encodeURIComponent(shard)}` : ''}`);
  } catch (e) { showError(view, e); return; }
  state.sample = data;
  const row = data.row;
  const rows = state.grid ? state.grid.rows : [];
  const at = rows.findIndex((r) => r.sample_id === row.sample_id);
  const nav = el('div', { class: 'nav' },
    el('a', { href: state.grid ? state.grid.hash : '#/grid', id: 'back' }, '← grid'),
    el('button', { id: 'prev-sample', disabled: at <= 0, onclick: () => { location.hash = sampleHref(rows[at - 1]); } }, '← prev'),
    el('button', { id: 'next-sample', disabled: at < 0 || at >= rows.length - 1, onclick: () => { location.hash = sampleHref(rows[at + 1]); } }, 'next →'),
    el('strong', { text: row.key || row.sample_id }), el('span', { class: 'muted', text: row.sample_id }));
  const img = el('img', { id: 'main-img', alt: row.key || row.sample_id });
  const overlay = svgEl('svg', { id: 'overlay' });
  const note = el('p', { id: 'img-note', class: 'muted' });
  const show = { persons: true, keypoints: true, text: true };
  let size = null;
  const redraw = () => { if (size) drawOverlay(overlay, data, size, show); };
  const toggles = el('div', { class: 'toggles' }, Object.keys(show).map((k) => el('label', {},
    el('input', { type: 'checkbox', checked: true, 'data-toggle': k, onchange: (ev) => { show[k] = ev.target.checked; redraw(); } }), ` ${k === 'text' ? 'text boxes' : k}`)));
  const decision = el('div', { class: 'panel', id: 'decision' }, el('h3', { text: 'Decision' }),
    el('p', {}, row.keep ? el('span', { class: 'kept', text: 'kept' }) : el('span', { class: 'rej', text: row.reject_reason || 'rejected' })),
    kvTable([['reject_reasons', row.reject_reasons], ['scored_stages', row.scored_stages], ['decode_error', row.decode_error]]));
  const src = data.source;
  const source = el('div', { class: 'panel', id: 'source' }, el('h3', { text: 'Source' }),
    kvTable([['shard (input unit)', src.shard], ['key', src.key], ['file', src.file], ['member', src.member], ['url', src.url], ['source_uri', src.uri]]));
  // per box only the raw score is stored; under a calibrated cut the image's calibrated score and the
  // stage's count of passing persons are the verdict, and a box is marked only where they decide it
  const pr = data.person_rule;
  const raw = pr.score_kind === 'raw';
  const persons = el('div', { class: 'panel', id: 'persons' }, el('h3', { text: `Persons (${data.persons.length}; rule: ${pr.score_label} > ${fmt(pr.min_score)}, box ${pr.box_rule || 'longer_side'} > ${fmt(pr.min_box_px)} px)` }),
    raw ? null : el('p', { class: 'muted', id: 'person-image-verdict', text: `image: ${pr.column} ${fmt(row[pr.column])}, persons passing ${fmt(row.person_n_pass)}/${fmt(row.n_persons)} (calibrated scores are stored per image, not per box)` }),
    kvTable(data.persons.map((p, i) => [`#${i} ${p.passes === true ? 'passes' : p.passes === false ? 'fails' : raw ? '' : 'undecided'}`, `${raw ? 'score' : 'raw score'} ${fmt(p.score)} · box ${p.box ? p.box.map((v) => Math.round(v)).join(',') : '–'}${p.keypoints ? ' · keypoints' : ''}`])));
  const texts = el('div', { class: 'panel', id: 'texts' }, el('h3', { text: `Text boxes (${data.text_boxes.length}; orange: read by the watermark stage too)` }),
    kvTable(data.text_boxes.map((t, i) => [`#${i}${t.mark ? ' mark' : ''}`, `${t.text === null ? '(not read)' : t.text} · det ${fmt(t.score)}`])));
  const all = el('div', { class: 'panel', id: 'row' }, el('h3', { text: 'Every column of the row' }),
    kvTable(Object.entries(row).filter(([k]) => !DRAWN.has(k))));
  view.replaceChildren(el('div', { class: 'sample-view' }, nav,
    el('div', { class: 'cols' },
      el('div', { class: 'figure' }, el('div', { class: 'stage-img' }, img, overlay), toggles, note),
      el('div', { class: 'side' }, labelsPanel(data), decision, persons, texts, source, all)),
    clusterSection(data)));
  try {
    const r = await fetch(`/img/l/${encodeURIComponent(row.sample_id)}${shard ? `?shard=${encodeURIComponent(shard)}` : ''}`);
    const unreadable = r.headers.get('X-Humanset-Unreadable');
    const decoded = r.headers.get('X-Humanset-Decoded');
    img.src = URL.createObjectURL(await r.blob());
    if (unreadable) {
      note.textContent = `no image: ${unreadable}`;
      note.className = 'error';
      img.dataset.placeholder = 'true';
      return;
    }
    await img.decode().catch(() => {});
    size = row.width && row.height ? [row.width, row.height] : decoded ? decoded.split('x').map(Number) : [img.naturalWidth, img.naturalHeight];
    redraw();
    img.dataset.ready = 'true';
  } catch (e) {
    note.textContent = `image failed: ${e.message}`;
  }
}

function sampleKey(ev) {
  if (KEYS[ev.key]) { labelSample(...KEYS[ev.key]); return; }
  const go = (id) => { const b = document.getElementById(id); if (b && !b.disabled) b.click(); };
  if (ev.key === 'ArrowRight' || ev.key === 'j') go('next-sample');
  else if (ev.key === 'ArrowLeft' || ev.key === 'k') go('prev-sample');
  else if (ev.key === 'Escape' || ev.key === 'g') location.hash = state.grid ? state.grid.hash : '#/grid';
}

// --- routing -------------------------------------------------------------------------------------
async function route() {
  const { path, params } = parseHash();
  const hash = location.hash;
  delete document.body.dataset.route;
  state.view = path.startsWith('/sample/') ? 'sample' : path === '/funnel' ? 'funnel' : 'grid';
  document.getElementById('nav-grid').classList.toggle('active', state.view === 'grid');
  document.getElementById('nav-funnel').classList.toggle('active', state.view === 'funnel');
  if (state.view === 'sample') {
    let id = path.slice('/sample/'.length);
    try { id = decodeURIComponent(id); } catch (e) { /* shown as not found */ }
    await showSample(id, params);
  } else if (state.view === 'funnel') await showFunnel();
  else await showGrid(params);
  document.body.dataset.view = state.view;
  if (location.hash === hash) document.body.dataset.route = hash;  // rendered: what tests wait for
}

document.addEventListener('keydown', (ev) => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.target.closest && ev.target.closest('input, select, textarea')) return;
  if (state.view === 'sample') sampleKey(ev);
  else if (state.view === 'grid') gridKey(ev);
});

async function main() {
  try {
    state.summary = await api('/api/summary');
  } catch (e) { showError(document.getElementById('view'), e); return; }
  state.funnelReady = api('/api/funnel').then((f) => { state.funnel = f; renderHeader(); return f; },
    (e) => { state.funnelError = e.message; return null; });
  renderHeader();
  window.addEventListener('hashchange', route);
  await route();
}

main();
