/* The page of `tandem ui`: the runs table (#/), a run (#/run/ID) and a comparison
 * (#/compare/ID,ID,...). Vanilla JS and uPlot; the JSON API and the event streams it reads are
 * described in docs/ui-api.md, what the page shows in docs/ui.md. No build step: this file is
 * embedded into the tandem binary as it is (rebuild to see a change). Formatted with
 * `npx prettier@3 --single-quote --print-width 110`. */
'use strict';
(() => {
  /* ---------- small helpers ---------- */
  const $ = (sel, root = document) => root.querySelector(sel);

  /* h('a', {href: '#/', class: 'x', onclick: fn}, 'text', child, [more]) */
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const k in attrs) {
        const v = attrs[k];
        if (v == null || v === false) continue;
        if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
        else if (k === 'class') el.className = v;
        else if (k === 'dataset') Object.assign(el.dataset, v);
        else if (k === 'checked' || k === 'value' || k === 'disabled' || k === 'selected') el[k] = v;
        else el.setAttribute(k, v === true ? '' : v);
      }
    }
    append(el, kids);
    return el;
  }
  /* el.replaceChildren(...kids) that skips null/false like h() does (the DOM would print "null"). */
  function put(el, ...kids) {
    el.replaceChildren();
    append(el, kids);
    return el;
  }
  function append(el, kids) {
    for (const k of kids) {
      if (k == null || k === false) continue;
      if (Array.isArray(k)) append(el, k);
      else el.append(k instanceof Node ? k : String(k));
    }
  }

  const pad2 = (n) => String(n).padStart(2, '0');
  function fmtTime(t) {
    if (!t) return '';
    const d = new Date(t * 1000);
    return (
      `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ` +
      `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`
    );
  }
  function fmtDur(s) {
    if (s == null || !isFinite(s)) return '';
    s = Math.max(0, Math.round(s));
    const d = Math.floor(s / 86400),
      hr = Math.floor(s / 3600) % 24,
      m = Math.floor(s / 60) % 60;
    if (d) return `${d}d ${hr}h`;
    if (hr) return `${hr}h ${pad2(m)}m`;
    if (m) return `${m}m ${pad2(s % 60)}s`;
    return `${s}s`;
  }
  function fmtNum(v) {
    if (v == null || typeof v !== 'number') return v == null ? '' : String(v);
    if (!isFinite(v)) return String(v);
    if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return String(+v.toPrecision(5));
  }
  /* A value of a chart line (legend, tooltip): `sig` significant digits, trailing zeros cut,
   * exponent form below 1e-4 and from 1e9; a value below 1e-10 of the line's largest magnitude
   * `mag` is 0 (the smoothing's residual of a line that is really 0 can be any tiny number, such
   * as 1.001e-109; float32 metrics carry 7 digits anyway). */
  function fmtValue(v, mag, sig = 5) {
    if (v == null || typeof v !== 'number') return v == null ? '' : String(v);
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a === 0 || (mag > 0 && a < mag * 1e-10)) return '0';
    if (Number.isInteger(v) && a < 1e9) return String(v);
    if (a < 1e-4 || a >= 1e9) {
      const [m, e] = v.toExponential(sig - 1).split('e');
      return `${m.includes('.') ? m.replace(/\.?0+$/, '') : m}e${e.replace('+', '')}`;
    }
    return String(+v.toPrecision(sig));
  }
  /* The largest finite magnitude of a line's values (0 when none). */
  function magnitude(ys) {
    let m = 0;
    for (const y of ys) if (y != null && isFinite(y) && Math.abs(y) > m) m = Math.abs(y);
    return m;
  }
  function fmtBytes(n) {
    if (n == null) return '';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0,
      v = n;
    while (v >= 1024 && i < u.length - 1) {
      v /= 1024;
      i++;
    }
    return i ? `${v.toFixed(v < 10 ? 2 : 1)} ${u[i]}` : `${n} B`;
  }
  /* A config value as recorded: numbers in JS's shortest exact form (0.2; tandem train's float
   * lr as 0.200000003), text as is. */
  const fmtHp = (v) => (v == null ? '' : typeof v === 'string' ? v : String(v));
  /* The same for a table cell: a fraction to 7 significant digits, what a float32 holds
   * (tandem train's lr 0.00999999978 reads 0.01; the cell's title has it exactly), an integer
   * whole (a seed keeps its digits). */
  const showHp = (v) =>
    typeof v === 'number' && isFinite(v) && !Number.isInteger(v) ? String(+v.toPrecision(7)) : fmtHp(v);
  /* The runs' config filter: KEY=V, KEY!=V, KEY<N, KEY<=N, KEY>N, KEY>=N (tandem ps --filter and
   * GET /api/runs?filter= read the same forms: src/track/query.c). Numbers are equal within a
   * relative 1e-6; a run without KEY never matches. null when term is not one. */
  function parseFilter(term) {
    const m = /^([^=!<>\s]+)(!=|>=|<=|=|>|<)(.*)$/.exec(term);
    if (!m) return null;
    const [, key, op, text] = m;
    const num = text !== '' && isFinite(+text) ? +text : null;
    return { key, op, text, num };
  }
  const numEq = (a, b) => a === b || Math.abs(a - b) <= 1e-6 * Math.max(Math.abs(a), Math.abs(b));
  function filterMatch(f, hp) {
    if (!hp || !(f.key in hp)) return false;
    const v = hp[f.key];
    const vnum = typeof v === 'number' ? v : typeof v === 'boolean' ? +v : null;
    if (f.op === '=' || f.op === '!=') {
      const eq =
        f.num != null && vnum != null && typeof v !== 'boolean' ? numEq(vnum, f.num) : fmtHp(v) === f.text;
      return f.op === '=' ? eq : !eq;
    }
    if (vnum == null || f.num == null) return false;
    if (f.op === '<') return vnum < f.num && !numEq(vnum, f.num);
    if (f.op === '<=') return vnum <= f.num || numEq(vnum, f.num);
    if (f.op === '>') return vnum > f.num && !numEq(vnum, f.num);
    return vnum >= f.num || numEq(vnum, f.num);
  }
  /* Sort order of two cell values: numbers before text, missing ones last (either direction). */
  function cmpVal(a, b, dir) {
    const none = (v) => v == null || v === '';
    if (none(a) || none(b)) return none(a) - none(b);
    const na = typeof a === 'number',
      nb = typeof b === 'number';
    if (na !== nb) return na ? -1 : 1;
    return (a < b ? -1 : a > b ? 1 : 0) * dir;
  }
  const plural = (n, one, many) => `${n.toLocaleString()} ${n === 1 ? one : many || one + 's'}`;
  /* An accuracy-like key (its values a fraction or a percent, depending on who logged it). */
  const isAccuracy = (key) => bestOf(key) === 'max' && /(^|[^a-z])(acc|accuracy|top\d+)([^a-z]|$)/i.test(key);
  /* How a run logged an accuracy: percent when any value is over 1 (tandem train's test/acc),
   * else a fraction (what scripts and HF log). */
  const accUnit = (m) => (m && Math.max(Math.abs(m.max), Math.abs(m.min)) > 1 ? '%' : '0–1');
  /* Seconds a live run has been silent (nothing from its workers), when at least `after`. */
  function silentFor(r, after, now) {
    if (!r.live || !after) return 0;
    if (r.last_activity) {
      const q = now - r.last_activity;
      return q >= after ? q : 0;
    }
    return r.silent_s || 0;
  }
  const fmtSilent = (s) =>
    s >= 60 ? `silent for ${Math.floor(s / 60)} min` : `silent for ${Math.floor(s)} s`;
  function shortVersion(v) {
    if (!v) return '';
    const m = /^([0-9a-f]{40})(\+dirty.*)?$/.exec(v);
    return m ? m[1].slice(0, 10) + (m[2] ? '+dirty' : '') : v;
  }
  const isLoss = (key) => /loss/i.test(key);
  /* Which way is better for a key (the compare view's summary table): 'min' for losses and
   * errors, 'max' for accuracies and scores, null when the name does not say (lr, grad_norm). */
  function bestOf(key) {
    const word = (names) => new RegExp(`(^|[^a-z])(${names})([^a-z]|$)`, 'i').test(key);
    if (/loss|error/i.test(key) || word('err|nll|ppl|perplexity|mse|mae|rmse|wer|cer')) return 'min';
    const scores =
      'acc|accuracy|top\\d+|f1|auc|roc_auc|precision|recall|iou|miou|bleu|rouge\\w*|map|dice|r2|score';
    if (word(scores)) return 'max';
    return null;
  }
  const FINAL = new Set(['succeeded', 'failed', 'stopped', 'preempted']);

  /* A series palette readable on white and dark backgrounds (Tableau 10). */
  const PALETTE = [
    '#1f77b4',
    '#ff7f0e',
    '#2ca02c',
    '#d62728',
    '#9467bd',
    '#8c564b',
    '#e377c2',
    '#7f7f7f',
    '#bcbd22',
    '#17becf',
  ];
  const color = (i) => PALETTE[i % PALETTE.length];

  /* ---------- settings (kept in localStorage) ---------- */
  const SETTINGS_KEY = 'tandem.ui.settings';
  /* columns / configCols: the runs table's metric and config columns the user picked (null:
   * chosen from what the runs logged and recorded). An older page kept `metrics` here, always
   * train/loss and test/acc: it is ignored. */
  const settings = Object.assign(
    { x: 'step', smooth: 0.6, log: false, columns: null, configCols: null, onlyDiff: true },
    (() => {
      try {
        return JSON.parse(localStorage.getItem(SETTINGS_KEY)) || {};
      } catch (e) {
        return {};
      }
    })(),
  );
  delete settings.metrics;
  function saveSettings() {
    try {
      localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
    } catch (e) {
      /* private mode */
    }
  }

  /* ---------- the token and the API ---------- */
  const token = (() => {
    const t = new URLSearchParams(location.search).get('token');
    try {
      if (t) sessionStorage.setItem('tandem.token', t);
      return t || sessionStorage.getItem('tandem.token') || '';
    } catch (e) {
      return t || '';
    }
  })();

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }
  async function api(path, opts = {}) {
    const headers = Object.assign({ Accept: 'application/json' }, opts.headers || {});
    if (token) headers['X-Tandem-Token'] = token;
    const r = await fetch(path, Object.assign({}, opts, { headers, credentials: 'same-origin' }));
    let body = null;
    const text = await r.text();
    try {
      body = text ? JSON.parse(text) : null;
    } catch (e) {
      body = null;
    }
    if (!r.ok)
      throw new ApiError(
        r.status,
        (body && body.error) || `${r.status} ${r.statusText}: ${text.slice(0, 200)}`,
      );
    return body;
  }
  const runUrl = (id) => `api/runs/${encodeURIComponent(id)}`;
  const isAbort = (e) => e && e.name === 'AbortError';

  /* Performance marks the benchmark reads (bench/bench_ui.mjs). */
  const marked = new Set();
  function markOnce(name) {
    if (marked.has(name)) return;
    marked.add(name);
    try {
      performance.mark(name);
    } catch (e) {
      /* old browsers */
    }
  }

  function setConn(text, cls) {
    const el = $('#conn');
    el.textContent = text;
    el.className = 'conn ' + (cls || '');
  }

  function errorBox(msg) {
    return h('p', { class: 'error', role: 'alert' }, msg);
  }

  /* At most n jobs at a time: the browser has 6 connections per host, the event streams hold some. */
  function queue(n) {
    let active = 0;
    const waiting = [];
    const pump = () => {
      while (active < n && waiting.length) {
        const job = waiting.shift();
        active++;
        job().finally(() => {
          active--;
          pump();
        });
      }
    };
    return (fn) =>
      new Promise((resolve, reject) => {
        waiting.push(() => fn().then(resolve, reject));
        pump();
      });
  }

  /* ---------- smoothing: W&B's time-weighted EMA ----------
   * weight = min(sqrt(s), 0.999); each point's weight decays by weight^(dx / range * 1000), so
   * the smoothing depends on the x distance between points, not on how many there are (the
   * downsampled series and the raw one smooth alike); debiased so the start is not pulled to 0. */
  function twema(xs, ys, s, range) {
    const n = ys.length;
    const out = new Array(n);
    const w = Math.min(Math.sqrt(s), 0.999);
    const scale = 1000 / (range > 0 ? range : 1);
    let last = 0,
      debias = 0,
      prevX = null;
    for (let i = 0; i < n; i++) {
      const y = ys[i];
      if (y == null || !isFinite(y)) {
        out[i] = null;
        continue;
      }
      const adj = prevX === null ? 1 : Math.pow(w, (xs[i] - prevX) * scale);
      prevX = xs[i];
      last = last * adj + y;
      debias = debias * adj + 1;
      out[i] = last / debias;
    }
    return out;
  }

  /* ---------- charts ----------
   * A chart shows one key: lines (one per rank, or one per run in a comparison), each {id, label,
   * color, x[], y[]}, fetched by loader(range, width, signal) -> {lines, total}. Live points are
   * appended with append(id, x, y); drag selects a range and refetches it at the plot's width;
   * double-click goes back to the whole range. */
  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function niceKey(key) {
    const names = {
      'sys/cpu_percent': 'CPU %',
      'sys/rss_mb': 'RSS (MiB)',
      'sys/gpu_mem_mb': 'GPU memory (MiB)',
      'sys/gpu_util_percent': 'GPU use %',
    };
    return names[key] || null;
  }

  /* Restart and resume marks (the run object's "marks", docs/ui-api.md): one per kind and step,
   * whichever ranks wrote it; a restart in magenta, a resume in violet (colours no rank has). */
  const MARK_COLORS = { restart: '#e6007e', resume: '#8a2be2' };
  function dedupeMarks(marks) {
    const seen = new Map();
    for (const m of marks || []) {
      const k = `${m.kind}|${m.step}`;
      const had = seen.get(k);
      if (!had) seen.set(k, Object.assign({}, m));
      else if (had.time == null && m.time != null) had.time = m.time;
    }
    return [...seen.values()];
  }
  const markLabel = (m) => (m.kind === 'restart' ? 'restarted' : 'resumed') + ` from step ${m.step}`;

  /* A line on the wall-time axis with a null put into each long pause (a preemption, a stop and
   * resume): uPlot then breaks the line there instead of drawing a straight line across hours in
   * which nothing ran. A pause is a gap over 20 times the line's median spacing and over 60 s. */
  function breakGaps(l) {
    const n = l.x.length;
    if (n < 3) return l;
    const d = [];
    for (let i = 1; i < n; i++) d.push(l.x[i] - l.x[i - 1]);
    const med = d.slice().sort((a, b) => a - b)[d.length >> 1];
    const limit = Math.max(20 * med, 60);
    if (!d.some((g) => g > limit)) return l;
    const x = [l.x[0]],
      y = [l.y[0]];
    for (let i = 1; i < n; i++) {
      if (l.x[i] - l.x[i - 1] > limit) {
        x.push((l.x[i] + l.x[i - 1]) / 2);
        y.push(null);
      }
      x.push(l.x[i]);
      y.push(l.y[i]);
    }
    return Object.assign({}, l, { x, y });
  }
  /* Time-axis ticks in ISO order: the date where it changes (and at the first tick), then HH:MM
   * (HH:MM:SS when ticks are under a minute apart). */
  function isoTicks(u, splits, axisIdx, space, incr) {
    let lastDay = '';
    return splits.map((v) => {
      if (v == null) return '';
      const d = new Date(v * 1000);
      const day = `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}`;
      const time =
        `${pad2(d.getHours())}:${pad2(d.getMinutes())}` + (incr < 60 ? `:${pad2(d.getSeconds())}` : '');
      const show = incr >= 86400 ? day : day !== lastDay ? `${day}\n${time}` : time;
      lastDay = day;
      return show;
    });
  }

  /* ---------- what a run's cloud instances cost (issue 31, RUN/instances.json) ---------- */
  function fmtCost(v) {
    return v == null ? '—' : '$' + v.toFixed(2);
  }
  /* A run's cost now: the API's cost_usd at cost_as_of, grown by what still bills per hour. */
  function costNow(r, now) {
    if (r.cost_usd == null) return null;
    if (!r.live || !r.cost_usd_per_hour || !r.cost_as_of) return r.cost_usd;
    return r.cost_usd + (r.cost_usd_per_hour * Math.max(0, now - r.cost_as_of)) / 3600;
  }
  /* Dollars accrued by wall time t (the store's td_run_cost_at): each priced instance's price
   * times its lifetime before t. null for a run without a priced instance (no cost axis). */
  function costCurve(instances) {
    const priced = (instances || []).filter((i) => i.usd_per_hour > 0 && i.launched > 0);
    if (!priced.length) return null;
    const at = (t) => {
      let usd = 0;
      for (const i of priced) {
        const end = i.ended > 0 && i.ended < t ? i.ended : t;
        if (end > i.launched) usd += (i.usd_per_hour * (end - i.launched)) / 3600;
      }
      return usd;
    };
    /* The first time by which usd had accrued: a zoom on the cost axis asks the server for
     * that wall-time range (cost never falls, so a bisection finds it). */
    const timeOf = (usd) => {
      let lo = Math.min(...priced.map((i) => i.launched));
      let hi = Math.max(Date.now() / 1000, ...priced.map((i) => i.ended || 0));
      if (at(hi) < usd) return hi;
      for (let k = 0; k < 64; k++) {
        const mid = (lo + hi) / 2;
        if (at(mid) < usd) lo = mid;
        else hi = mid;
      }
      return hi;
    };
    return { at, timeOf };
  }
  /* The charts' x axis: the setting, but step where it says cost and the view has none. */
  function xMode(view) {
    if (settings.x === 'cost') return view && view.cost ? 'cost' : 'step';
    return settings.x;
  }

  class Chart {
    constructor(view, key, loader) {
      this.view = view;
      this.key = key;
      this.loader = loader;
      this.lines = [];
      this.alias = new Map(); // line id -> the id of the line it was merged into (identical ranks)
      this.total = 0;
      this.range = null; // [from, to] when zoomed
      this.state = 'idle'; // idle | loading | ready | error
      this.pending = []; // live points that came while loading
      this.u = null;
      this.shape = '';
      this.appended = 0;
      const nice = niceKey(key);
      this.info = h('span', { class: 'info' });
      this.marksInfo = h('span', { class: 'marks' });
      this.plot = h('div', { class: 'plot', role: 'img', 'aria-label': `Chart of ${key}: loading` });
      this.el = h(
        'figure',
        { class: 'chart', dataset: { key } },
        h(
          'figcaption',
          null,
          h('span', { class: 'key' }, nice ? [nice, ' ', h('code', null, key)] : key),
          this.marksInfo,
          this.info,
        ),
        this.plot,
      );
    }

    width() {
      if (this.u) return Math.max(1, Math.round(this.u.over.clientWidth));
      return Math.max(1, Math.round((this.plot.clientWidth || 600) - 60));
    }

    async load() {
      if (this.state === 'loading') {
        this.reloadAfter = true;
        return;
      }
      this.state = 'loading';
      this.el.classList.add('loading');
      const range = this.range;
      try {
        const res = await this.view.fetchQueue(async () =>
          this.dead ? { lines: [], total: 0 } : this.loader(range, this.width(), this.view.signal),
        );
        if (this.view.dead || this.dead) return;
        this.lines = res.lines;
        this.alias = res.alias || new Map();
        this.total = res.total;
        this.appended = 0;
        this.state = 'ready';
        const pend = this.pending;
        this.pending = [];
        for (const p of pend) this.append(p[0], p[1], p[2], true);
        this.render();
      } catch (e) {
        if (isAbort(e) || this.view.dead || this.dead) return;
        this.state = 'error';
        put(this.plot, errorBox(`${this.key}: ${e.message}`));
        this.destroyPlot();
      } finally {
        this.el.classList.remove('loading');
        if (this.reloadAfter && !this.view.dead && !this.dead) {
          this.reloadAfter = false;
          this.state = 'ready';
          this.load();
        }
      }
    }

    /* A live point. Returns false when it names a line the chart does not have (a new rank). */
    append(id, x, y, quiet) {
      if (this.state === 'idle' || this.state === 'error') return true;
      if (this.state === 'loading') {
        this.pending.push([id, x, y]);
        return true;
      }
      if (this.alias.has(id)) id = this.alias.get(id);
      const line = this.lines.find((l) => l.id === id);
      if (!line) {
        this.scheduleReload();
        return false;
      }
      const n = line.x.length;
      /* Already there (fetched after it was stored). Wall times may repeat (points stored by one
       * ingest without a time of their own share it), steps may not. */
      if (n && (x < line.x[n - 1] || (x === line.x[n - 1] && xMode(this.view) === 'step'))) return true;
      line.x.push(x);
      line.y.push(y);
      this.total++;
      this.appended++;
      if (!quiet) this.view.redraw(this);
      /* Appended points are raw: once there are many, ask the server to downsample again. */
      if (this.appended > 2000 && !this.range) this.scheduleReload();
      return true;
    }

    scheduleReload() {
      if (this.reloadTimer) return;
      this.reloadTimer = setTimeout(() => {
        this.reloadTimer = null;
        if (!this.view.dead && !this.dead) this.load();
      }, 1000);
    }

    zoom(from, to) {
      if (!(to > from)) return;
      if (xMode(this.view) === 'step') {
        from = Math.floor(from);
        to = Math.ceil(to);
      }
      this.range = [from, to];
      if (this.u) this.u.setScale('x', { min: from, max: to });
      this.load();
    }

    resetZoom() {
      if (!this.range) return;
      this.range = null;
      this.load();
    }

    destroyPlot() {
      if (this.u) {
        this.u.destroy();
        this.u = null;
        this.el.__u = null;
      }
      this.shape = '';
    }

    destroy() {
      this.dead = true;
      clearTimeout(this.reloadTimer);
      this.destroyPlot();
    }

    render() {
      if (this.state !== 'ready' || this.dead) return;
      const lines = this.lines.filter((l) => l.x.length);
      let points = 0,
        maxX = -Infinity,
        minX = Infinity;
      for (const l of lines) {
        points += l.x.length;
        minX = Math.min(minX, l.x[0]);
        maxX = Math.max(maxX, l.x[l.x.length - 1]);
      }
      this.el.dataset.points = String(points);
      if (lines.length) this.el.dataset.lastX = String(maxX);
      this.info.textContent =
        points === this.total || !this.total
          ? plural(points, 'point')
          : `${points.toLocaleString()} of ${plural(this.total, 'point')}`;
      this.info.title =
        'Points drawn; the server keeps the first, last, min and max of each pixel-wide bucket.';
      this.plot.setAttribute('aria-label', this.describe(lines));
      if (!lines.length) {
        this.destroyPlot();
        put(this.plot, h('p', { class: 'muted empty' }, 'No points yet.'));
        return;
      }
      const s = settings.smooth,
        log = settings.log;
      const range = maxX - minX;
      const tables = lines.map((line) => {
        const l = xMode(this.view) === 'time' ? breakGaps(line) : line;
        const raw = log ? l.y.map((v) => (v > 0 ? v : null)) : l.y;
        if (s > 0) {
          let sm = twema(l.x, l.y, s, range);
          if (log) sm = sm.map((v) => (v > 0 ? v : null));
          return [l.x, raw, sm];
        }
        return [l.x, raw];
      });
      const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
      const shape = `${lines.map((l) => l.id).join(',')}|${s > 0}|${log}|${xMode(this.view)}`;
      if (!this.u || shape !== this.shape) {
        this.destroyPlot();
        put(this.plot);
        this.shape = shape;
        this.u = new uPlot(this.options(lines, s > 0, log), data, this.plot);
        this.el.__u = this.u; // for tests (tests/ui/browser): the plot's scales
        this.hideRawLegend(lines, s > 0);
        if (this.range) this.u.setScale('x', { min: this.range[0], max: this.range[1] });
      } else if (this.range) {
        this.u.setData(data, false);
        this.u.setScale('x', { min: this.range[0], max: this.range[1] });
      } else {
        this.u.setData(data, true);
      }
    }

    /* What the x axis counts: a step, the wall time, or for system metrics (sampled by the
     * supervisor, stepped in seconds since the run was created) seconds. */
    xName() {
      const mode = xMode(this.view);
      if (mode === 'time' || mode === 'cost') return mode;
      return isSys(this.key) ? 'second' : 'step';
    }

    describe(lines) {
      if (!lines.length) return `Chart of ${this.key}: no points yet`;
      const parts = lines.map(
        (l) =>
          `${l.label} last ${fmtValue(l.y[l.y.length - 1], magnitude(l.y))} at ${this.xName()} ` +
          fmtNum(l.x[l.x.length - 1]),
      );
      return `Chart of ${this.key}: ${parts.join('; ')}`;
    }

    hideRawLegend(lines, smooth) {
      if (!smooth) return;
      const rows = this.u.root.querySelectorAll('.u-legend .u-series');
      lines.forEach((l, i) => {
        const r = rows[1 + 2 * i];
        if (r) r.classList.add('raw');
      });
    }

    options(lines, smooth, log) {
      const axis = cssVar('--axis') || '#555';
      const grid = cssVar('--grid') || '#e5e5e5';
      /* The legend shows the values under the cursor, and the last ones when it is elsewhere. */
      const legendValue = (fmt) => (u, v, sidx, idx) => {
        if (this.dead) return '';
        if (idx == null) {
          const d = u.data[sidx];
          for (let i = d.length - 1; i >= 0; i--) if (d[i] != null) return fmt(d[i]);
          return '';
        }
        return v == null ? '' : fmt(v);
      };
      const series = [
        {
          label: this.xName() === 'second' ? 'seconds' : this.xName(),
          value: legendValue(
            this.xName() === 'time' ? fmtTime : this.xName() === 'cost' ? (v) => '$' + fmtNum(v) : fmtNum,
          ),
        },
      ];
      for (const l of lines) {
        /* A line of one point draws nothing: a metric logged once (a one-epoch run's test
         * accuracy) is drawn as its point. */
        const lone = l.x.length < 2;
        const mag = magnitude(l.y);
        const fmtLine = (v) => fmtValue(v, mag);
        series.push({
          label: smooth ? `${l.label} (raw)` : l.label,
          stroke: smooth ? l.color + '40' : l.color,
          width: 1,
          points: lone ? { show: true, size: 7, fill: l.color } : { show: false },
          value: legendValue(fmtLine),
        });
        if (smooth) {
          series.push({
            label: l.label,
            stroke: l.color,
            width: 1.75,
            points: { show: false },
            value: legendValue(fmtLine),
          });
        }
      }
      const axisFont = '11px system-ui, sans-serif';
      const xAxis = {
        stroke: axis,
        font: axisFont,
        grid: { stroke: grid, width: 1 },
        ticks: { stroke: grid },
      };
      /* ISO dates and 24-hour times on the time axis (uPlot's own are US: 11/29, 2:05pm). */
      if (this.xName() === 'time') Object.assign(xAxis, { values: isoTicks, size: 44 });
      else if (this.xName() === 'cost')
        Object.assign(xAxis, {
          values: (u, vals) => vals.map((v) => '$' + fmtValue(v, 0, 4)),
          label: 'USD accrued by the run\'s cloud instances',
          labelSize: 18,
          labelFont: axisFont,
        });
      else if (this.xName() === 'second')
        Object.assign(xAxis, {
          label: 'seconds since the run was created',
          labelSize: 18,
          labelFont: axisFont,
        });
      return {
        width: Math.max(200, this.plot.clientWidth || 600),
        height: 220,
        pxAlign: 0,
        series,
        scales: { x: { time: this.xName() === 'time' }, y: log ? { distr: 3 } : {} },
        axes: [
          xAxis,
          {
            stroke: axis,
            font: axisFont,
            size: 56,
            grid: { stroke: grid, width: 1 },
            ticks: { stroke: grid },
            values: (u, vals) => vals.map((v) => fmtValue(v, 0, 4)),
          },
        ],
        cursor: {
          drag: { x: true, y: false, setScale: false },
          /* The crosshair follows the same x on every chart of the page (system metrics, whose
           * step is seconds since the run began, among themselves); zoom stays per chart. */
          sync: {
            key: this.view.syncKey + (isSys(this.key) ? ':sys' : ''),
            filters: { pub: (type) => type === 'mousemove' || type === 'mouseleave' },
          },
          points: { size: 5 },
        },
        legend: { live: true },
        hooks: {
          setSelect: [
            (u) => {
              const sel = u.select;
              if (sel.width < 4) return;
              const from = u.posToVal(sel.left, 'x'),
                to = u.posToVal(sel.left + sel.width, 'x');
              u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
              this.zoom(from, to);
            },
          ],
          draw: [
            (u) => {
              this.drawMarks(u);
              markOnce('tandem:first-chart');
            },
          ],
          ready: [
            (u) => {
              u.over.addEventListener('dblclick', () => this.resetZoom());
              u.over.title = 'Drag to zoom (refetches that range at full detail); double-click to reset';
            },
          ],
        },
      };
    }

    /* Where the run restarted or resumed (view.marks: {kind, step, time, color, label}), a dashed
     * vertical line over the plot at that step (or wall time); data-marks counts those drawn. */
    drawMarks(u) {
      const marks = this.view.marks || [];
      const { left, top, width, height } = u.bbox;
      const ctx = u.ctx;
      const seen = [];
      ctx.save();
      ctx.lineWidth = Math.max(1, Math.round(2 * (window.devicePixelRatio || 1)));
      ctx.setLineDash([8, 4]);
      for (const m of marks) {
        const mode = xMode(this.view);
        /* on the cost axis, the dollars of the mark's own run (compare: each run's instances) */
        const at = m.costAt || (this.view.cost && this.view.cost.at);
        const x = mode === 'time' ? m.time : mode === 'cost' ? (m.time && at ? at(m.time) : null) : m.step;
        if (x == null || !isFinite(x)) continue;
        const px = Math.round(u.valToPos(x, 'x', true));
        if (!isFinite(px) || px < left - 1 || px > left + width + 1) continue;
        ctx.strokeStyle = m.color;
        ctx.beginPath();
        ctx.moveTo(px, top);
        ctx.lineTo(px, top + height);
        ctx.stroke();
        seen.push(`${m.label} at ${this.xName()} ${mode === 'time' ? fmtTime(x) : mode === 'cost' ? fmtCost(x) : x}`);
      }
      ctx.restore();
      this.el.dataset.marks = String(seen.length);
      this.marksInfo.textContent = seen.length === 1 ? seen[0] : seen.length ? `${seen.length} marks` : '';
      this.marksInfo.title = seen.join('\n');
    }

    resize() {
      if (this.u) this.u.setSize({ width: Math.max(200, this.plot.clientWidth), height: 220 });
    }
  }

  /* A view that holds charts: lazy loading as they scroll into sight, a fetch queue, redraws
   * coalesced per animation frame, resize. */
  class ChartSet {
    constructor(view) {
      this.view = view;
      this.charts = new Map();
      this.dirty = new Set();
      this.frame = 0;
      this.io = new IntersectionObserver(
        (entries) => {
          for (const e of entries) {
            if (!e.isIntersecting) continue;
            const c = this.byEl.get(e.target);
            if (c && c.state === 'idle') c.load();
            this.io.unobserve(e.target);
          }
        },
        { rootMargin: '300px 0px' },
      );
      this.byEl = new Map();
      this.onResize = () => {
        clearTimeout(this.resizeTimer);
        this.resizeTimer = setTimeout(() => this.charts.forEach((c) => c.resize()), 150);
      };
      window.addEventListener('resize', this.onResize);
    }
    add(chart) {
      this.charts.set(chart.key, chart);
      this.byEl.set(chart.el, chart);
      this.io.observe(chart.el);
    }
    remove(chart) {
      this.io.unobserve(chart.el);
      this.charts.delete(chart.key);
      this.byEl.delete(chart.el);
      this.dirty.delete(chart);
      chart.destroy();
    }
    /* Live points are drawn at the next frame, or after 100 ms where frames are not coming (a
     * hidden tab, a busy compositor), whichever is first. */
    redraw(chart) {
      this.dirty.add(chart);
      if (this.frame) return;
      const flush = () => {
        cancelAnimationFrame(this.frame);
        clearTimeout(this.timer);
        this.frame = 0;
        const d = [...this.dirty];
        this.dirty.clear();
        d.forEach((c) => c.render());
      };
      this.frame = requestAnimationFrame(flush);
      this.timer = setTimeout(flush, 100);
    }
    renderAll() {
      this.charts.forEach((c) => c.render());
    }
    reloadAll() {
      this.charts.forEach((c) => {
        c.range = null;
        if (c.state !== 'idle') c.load();
      });
    }
    destroy() {
      this.io.disconnect();
      window.removeEventListener('resize', this.onResize);
      cancelAnimationFrame(this.frame);
      clearTimeout(this.timer);
      this.charts.forEach((c) => c.destroy());
    }
  }

  /* Charts in two sections: the metrics (train/... first, then validation and test, then the
   * rest; in each group the loss first, then by name) and the system metrics (sys/...). */
  const GROUP_ORDER = ['train', 'val', 'valid', 'validation', 'eval', 'test'];
  /* A key's place as an array that sorts like compareKeys: group order, group, loss first, key. */
  function keyOrder(key) {
    const i = key.indexOf('/');
    const g = i > 0 ? key.slice(0, i) : '';
    const o = GROUP_ORDER.indexOf(g);
    const rank = o >= 0 ? o : g ? GROUP_ORDER.length : GROUP_ORDER.length + 1;
    return [rank, g, isLoss(key) ? 0 : 1, key];
  }
  function cmpOrder(a, b) {
    for (let i = 0; i < 4; i++) if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
  }
  function compareKeys(a, b) {
    return cmpOrder(keyOrder(a), keyOrder(b));
  }
  /* Sorted by compareKeys, each key's order computed once (n log n comparisons of arrays). */
  function sortKeys(keys) {
    return keys
      .map((k) => keyOrder(k))
      .sort(cmpOrder)
      .map((o) => o[3]);
  }
  const isSys = (key) => key.startsWith('sys/');

  /* The charts of a view. A run may have 100,000 keys: the keys are kept sorted in an array
   * (a new key goes in by binary search), and only the first `limit` keys that match the filter
   * box have a chart cell, drawn in one pass; "Show more" raises the limit. Charts load when
   * they come into sight (ChartSet). A chart whose key leaves the shown set is destroyed. */
  const PAGE_CHARTS = 60;
  class ChartGrid {
    constructor(root, set, makeChart) {
      this.set = set;
      this.makeChart = makeChart;
      this.known = new Set();
      this.terms = [];
      const section = (id) => {
        const grid = h('div', { class: 'grid' });
        const more = h('button', { type: 'button', class: 'more', hidden: true });
        const sec = { id, keys: [], limit: PAGE_CHARTS, grid, more, shown: 0, matched: 0 };
        more.addEventListener('click', () => {
          sec.limit += PAGE_CHARTS * 4;
          this.render();
        });
        return sec;
      };
      this.main = section('metrics');
      this.sys = section('sys');
      this.filter = h('input', {
        type: 'search',
        id: 'key-filter',
        placeholder: 'filter charts: train/ loss …',
        'aria-label': 'Filter the charts by key',
      });
      let timer = 0;
      this.filter.addEventListener('input', () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.setFilter(this.filter.value), 120);
      });
      this.count = h('span', { id: 'key-count', class: 'muted', 'aria-live': 'polite' });
      this.bar = h('div', { class: 'keybar', hidden: true }, this.filter, this.count);
      this.sysSec = h(
        'section',
        { class: 'group', hidden: true, 'aria-labelledby': 'sys-title' },
        h(
          'h2',
          { id: 'sys-title' },
          'System',
          h('span', { class: 'muted sub' }, ' CPU, memory and GPU of each rank'),
        ),
        this.sys.grid,
        this.sys.more,
      );
      root.append(
        this.bar,
        h('section', { class: 'group', 'aria-label': 'Metrics' }, this.main.grid, this.main.more),
        this.sysSec,
      );
    }
    /* Every key at once (the view's first load). */
    setKeys(keys) {
      const fresh = keys.filter((k) => !this.known.has(k));
      for (const k of fresh) this.known.add(k);
      const main = fresh.filter((k) => !isSys(k)),
        sys = fresh.filter(isSys);
      this.main.keys = sortKeys(this.main.keys.concat(main));
      this.sys.keys = sortKeys(this.sys.keys.concat(sys));
      this.render();
    }
    /* One key (a live point's): its chart, or null when it is not among the shown ones. */
    ensure(key) {
      const c = this.set.charts.get(key);
      if (c) return c;
      if (this.known.has(key)) return null;
      this.known.add(key);
      const sec = isSys(key) ? this.sys : this.main;
      const o = keyOrder(key);
      let lo = 0,
        hi = sec.keys.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (cmpOrder(keyOrder(sec.keys[mid]), o) < 0) lo = mid + 1;
        else hi = mid;
      }
      sec.keys.splice(lo, 0, key);
      this.scheduleRender();
      return null;
    }
    matches(key) {
      const k = key.toLowerCase();
      return this.terms.every((t) => k.includes(t));
    }
    setFilter(text) {
      this.terms = text.toLowerCase().split(/\s+/).filter(Boolean);
      this.main.limit = this.sys.limit = PAGE_CHARTS;
      this.render();
    }
    scheduleRender() {
      if (this.pending) return;
      this.pending = requestAnimationFrame(() => this.render());
      this.pendingTimer = setTimeout(() => this.render(), 100);
    }
    render() {
      cancelAnimationFrame(this.pending);
      clearTimeout(this.pendingTimer);
      this.pending = 0;
      const want = new Set();
      for (const sec of [this.main, this.sys]) {
        const shown = [];
        let matched = 0;
        for (const k of sec.keys) {
          if (this.terms.length && !this.matches(k)) continue;
          matched++;
          if (shown.length < sec.limit) shown.push(k);
          else if (!this.terms.length) {
            matched = sec.keys.length;
            break;
          }
        }
        sec.matched = matched;
        sec.shown = shown.length;
        const els = shown.map((k) => {
          want.add(k);
          let c = this.set.charts.get(k);
          if (!c) {
            c = this.makeChart(k);
            this.set.add(c);
          }
          return c.el;
        });
        sec.cells = els;
        const left = matched - shown.length;
        sec.more.hidden = left <= 0;
        const next = Math.min(left, PAGE_CHARTS * 4);
        sec.more.textContent = `Show ${next.toLocaleString()} more (${left.toLocaleString()} not shown)`;
      }
      for (const c of [...this.set.charts.values()]) if (!want.has(c.key)) this.set.remove(c);
      for (const sec of [this.main, this.sys]) {
        const g = sec.grid;
        /* One pass: only when the order changed (a live key in the middle, a filter). */
        const same =
          g.children.length === sec.cells.length && sec.cells.every((el, i) => g.children[i] === el);
        if (!same) g.replaceChildren(...sec.cells);
      }
      this.sysSec.hidden = this.sys.matched === 0;
      const total = this.main.keys.length + this.sys.keys.length;
      const matched = this.main.matched + this.sys.matched,
        shown = this.main.shown + this.sys.shown;
      /* The filter box for runs with more keys than one page. */
      if (total > PAGE_CHARTS || this.terms.length) this.bar.hidden = false;
      this.count.textContent = this.terms.length
        ? `${matched.toLocaleString()} of ${total.toLocaleString()} keys match; ` +
          `${shown.toLocaleString()} charts shown`
        : shown < total
          ? `${shown.toLocaleString()} of ${total.toLocaleString()} charts shown: filter to find a key`
          : `${total.toLocaleString()} charts`;
      if (this.onRender) this.onRender();
    }
  }

  /* The x / smoothing / log-scale toolbar shared by the run and compare views. */
  function chartToolbar(onChange) {
    const sm = h('input', {
      type: 'range',
      id: 'smoothing',
      min: '0',
      max: '0.99',
      step: '0.01',
      value: String(settings.smooth),
      'aria-describedby': 'smoothing-value',
    });
    const out = h('output', { id: 'smoothing-value', for: 'smoothing' }, settings.smooth.toFixed(2));
    let pending = 0;
    sm.addEventListener('input', () => {
      settings.smooth = +sm.value;
      out.textContent = settings.smooth.toFixed(2);
      if (!pending)
        pending = requestAnimationFrame(() => {
          pending = 0;
          onChange('smooth');
        });
    });
    sm.addEventListener('change', saveSettings);
    const xSel = (v, label) =>
      h(
        'label',
        { class: 'seg' },
        h('input', {
          type: 'radio',
          name: 'xaxis',
          value: v,
          checked: settings.x === v,
          onchange: () => {
            settings.x = v;
            saveSettings();
            onChange('x');
          },
        }),
        label,
      );
    const logBox = h('input', {
      type: 'checkbox',
      id: 'logscale',
      checked: settings.log,
      onchange: () => {
        settings.log = logBox.checked;
        saveSettings();
        onChange('log');
      },
    });
    const xField = h(
      'fieldset',
      { class: 'segmented' },
      h('legend', null, 'x axis'),
      xSel('step', 'step'),
      xSel('time', 'wall time'),
    );
    const bar = h(
      'div',
      { class: 'toolbar', role: 'toolbar', 'aria-label': 'Chart settings' },
      xField,
      h('label', { for: 'smoothing' }, 'Smoothing'),
      sm,
      out,
      h('label', { class: 'check' }, logBox, 'log scale'),
      h('span', { class: 'hint muted' }, 'Drag on a chart to zoom, double-click to reset.'),
    );
    /* The cost axis is offered only once the run is known to have a priced instance. */
    bar.addCost = () => {
      if (!$('input[value="cost"]', xField)) xField.append(xSel('cost', 'cost ($)'));
    };
    return bar;
  }

  /* ---------- the run's event stream (points, status, logs) ---------- */
  function runEvents(view, id, handlers) {
    let cursor = null,
      es = null,
      retry = 0,
      closed = false,
      opened = false;
    const open = () => {
      if (closed || view.dead) return;
      const url = `${runUrl(id)}/events` + (cursor != null ? `?since=${cursor}` : '');
      es = new EventSource(url);
      es.addEventListener('open', () => {
        /* A reconnection that has no cursor to resume from starts at "now": refetch instead. */
        if (opened && cursor == null && handlers.reset) handlers.reset();
        opened = true;
        retry = 0;
        handlers.conn && handlers.conn(true);
      });
      es.addEventListener('points', (e) => {
        const d = JSON.parse(e.data);
        if (d.cursor != null) cursor = d.cursor;
        handlers.points && handlers.points(d.points || []);
      });
      es.addEventListener('status', (e) => {
        const st = JSON.parse(e.data);
        handlers.status && handlers.status(st);
        /* The final status is the stream's last event (logs and points are flushed before it). */
        if (st.live === false) {
          closed = true;
          es.close();
          handlers.conn && handlers.conn(false);
        }
      });
      es.addEventListener('log', (e) => handlers.log && handlers.log(JSON.parse(e.data)));
      es.addEventListener('reset', (e) => {
        try {
          const d = JSON.parse(e.data);
          if (d && d.cursor != null) cursor = d.cursor;
        } catch (err) {
          /* no body */
        }
        handlers.reset && handlers.reset();
      });
      es.addEventListener('error', () => {
        es.close();
        es = null;
        handlers.conn && handlers.conn(false);
        if (closed || view.dead || (handlers.isFinal && handlers.isFinal())) return;
        retry = Math.min(retry + 1, 5);
        setTimeout(open, 500 * retry);
      });
    };
    open();
    return {
      close() {
        closed = true;
        if (es) es.close();
      },
    };
  }

  /* ---------- view: the runs table ---------- */
  /* The metric columns chosen from what the runs logged (GET /api/runs's common_keys: how many of
   * the newest runs logged each key): the most common loss-like key (a training loss before an
   * eval one), the most common accuracy or score, then the next most common key. */
  function autoMetricColumns(common) {
    const keys = (common || []).filter((c) => !isSys(c.key));
    const heldOut = (k) => /(^|[^a-z])(eval|val|valid|validation|test)([^a-z]|$)/i.test(k);
    const pick = (want, preferTrain) =>
      keys
        .filter((c) => bestOf(c.key) === want)
        .sort(
          (a, b) =>
            b.runs - a.runs ||
            (preferTrain ? heldOut(a.key) - heldOut(b.key) : heldOut(b.key) - heldOut(a.key)) ||
            compareKeys(a.key, b.key),
        )[0];
    const out = [];
    const loss = pick('min', true),
      score = pick('max', false);
    if (loss) out.push(loss.key);
    if (score) out.push(score.key);
    for (const c of keys) {
      if (out.length >= 3) break;
      if (!out.includes(c.key) && bestOf(c.key)) out.push(c.key);
    }
    for (const c of keys) {
      if (out.length >= 2) break;
      if (!out.includes(c.key)) out.push(c.key);
    }
    return out;
  }
  /* The config columns chosen from what the runs recorded: the keys two runs hold with different
   * values (a sweep's lr; tandem ps's CONFIG column takes the same), the keys more runs have first; when nothing differs, the params
   * (tandem run --param, a workflow's params:). At most 4. */
  function autoConfigColumns(runs) {
    const seen = new Map(); // key -> {n, values: Set}
    for (const r of runs)
      for (const [k, v] of Object.entries(r.hparams || {})) {
        let e = seen.get(k);
        if (!e) seen.set(k, (e = { n: 0, values: new Set() }));
        e.n++;
        e.values.add(fmtHp(v));
      }
    const differ = [...seen]
      .filter(([, e]) => e.values.size > 1)
      .sort((a, b) => b[1].n - a[1].n || (a[0] < b[0] ? -1 : 1))
      .map(([k]) => k);
    if (differ.length) return differ.slice(0, 4);
    const params = new Set();
    for (const r of runs) for (const k of Object.keys(r.params || {})) params.add(k);
    return [...params].sort().slice(0, 4);
  }

  function runsView(main) {
    const view = { dead: false, ac: new AbortController() };
    let runs = [],
      keys = [],
      common = [],
      silentAfter = 900,
      metricCols = settings.columns || [],
      configCols = settings.configCols || [],
      es = null,
      sortCol = 'created',
      sortDir = -1,
      listenedFor = '';
    const selected = new Set();
    const filter = h('input', {
      type: 'search',
      id: 'runs-filter',
      placeholder: 'lr>0.01, id, status, tag…',
      title:
        'Words match id, workflow, status, tags, notes and config values; KEY=V, KEY!=V, KEY<N, ' +
        'KEY>N (<=, >=) select by a config key or param, as tandem ps --filter does',
      'aria-label': 'Filter runs',
      oninput: () => renderBody(),
    });
    const count = h('span', { class: 'muted', 'aria-live': 'polite' });
    const filterNote = h('span', { class: 'muted', id: 'filter-note', 'aria-live': 'polite' });
    const compareBtn = h(
      'button',
      {
        type: 'button',
        id: 'compare',
        disabled: true,
        onclick: () => {
          location.hash = '#/compare/' + [...selected].map(encodeURIComponent).join(',');
        },
      },
      'Compare',
    );
    const picker = h('details', { class: 'picker', id: 'metric-picker' });
    const cpicker = h('details', { class: 'picker', id: 'config-picker' });
    const table = h('table', { class: 'runs', id: 'runs' });
    const status = h('div');
    const wrap = h('div', { class: 'tablewrap runswrap', id: 'runs-wrap' }, table);
    put(
      main,
      h('div', { class: 'pagehead' }, h('h1', null, 'Runs'), count),
      h(
        'div',
        { class: 'toolbar' },
        h('label', { for: 'runs-filter' }, 'Filter'),
        filter,
        cpicker,
        picker,
        compareBtn,
        filterNote,
      ),
      status,
      wrap,
    );

    /* Units of a metric column: an accuracy is a percent from tandem train and a fraction from
     * most scripts; the header says which, and when the runs shown mix both, each cell says. */
    const unitOf = (k) => {
      if (niceKey(k)) return { head: '' };
      if (!isAccuracy(k)) return { head: '' };
      const units = new Set(runs.filter((r) => r.metrics && r.metrics[k]).map((r) => accUnit(r.metrics[k])));
      if (units.size > 1) return { head: '% and 0–1 mixed', mixed: true };
      const u = [...units][0];
      return { head: u === '%' ? 'percent' : u ? 'fraction 0–1' : '' };
    };
    const bestVal = (r, k) => {
      const m = r.metrics && r.metrics[k];
      if (!m) return null;
      const b = bestOf(k);
      return b === 'min' ? m.min : b === 'max' ? m.max : null;
    };

    const columns = () => {
      const cols = [
        { id: 'id', label: 'ID', val: (r) => r.id },
        { id: 'workflow', label: 'Workflow', val: (r) => r.workflow },
        { id: 'status', label: 'Status', val: (r) => r.status },
        { id: 'created', label: 'Started', val: (r) => r.started || r.created },
        { id: 'duration', label: 'Duration', val: (r) => duration(r), num: true },
        { id: 'restarts', label: 'Restarts', val: (r) => r.restarts, num: true },
        { id: 'code', label: 'Code', val: (r) => r.code_version || '' },
      ];
      /* Cost only when a listed run has a priced cloud instance (as tandem ps does). */
      if (runs.some((r) => r.cost_usd != null))
        cols.splice(6, 0, {
          id: 'cost',
          label: 'Cost',
          val: (r) => costNow(r, Date.now() / 1000),
          num: true,
        });
      for (const k of configCols)
        cols.push({
          id: 'hp:' + k,
          label: k,
          sub: 'config',
          hp: true,
          val: (r) => {
            const v = (r.hparams || {})[k];
            return typeof v === 'boolean' ? String(v) : v;
          },
        });
      for (const k of metricCols) {
        const unit = unitOf(k);
        const b = bestOf(k);
        cols.push({
          id: 'last:' + k,
          label: niceKey(k) || k,
          key: k,
          sub: `last${b ? ` · best (${b})` : ''}${unit.head ? ` · ${unit.head}` : ''}`,
          num: true,
          metric: true,
          unit,
          val: (r) => (r.metrics && r.metrics[k] ? r.metrics[k].last : null),
          best: (r) => bestVal(r, k),
        });
      }
      return cols;
    };
    const duration = (r) => (r.live && r.started ? Date.now() / 1000 - r.started : r.duration);

    /* A column picker: a checkbox per key, drawn only while it is open, for the chosen keys and
     * the first 200 others that match its search box (a store may hold 100,000 keys). Picking
     * is remembered (localStorage); "automatic" goes back to the columns chosen from the runs. */
    function makePicker(el, id, title, chosenNow, allKeys, countOf, onPick) {
      const search = h('input', {
        type: 'search',
        id: `${id}-filter`,
        placeholder: 'find a key',
        'aria-label': `Find a ${title.toLowerCase()} key`,
        oninput: () => boxes(),
      });
      const list = h('div', { class: 'pickerboxes' });
      const auto = h('button', { type: 'button', class: 'auto', onclick: () => onPick(null) }, 'automatic');
      el.addEventListener('toggle', () => (el.open ? boxes() : put(list)));
      function boxes() {
        if (!el.open) return;
        const terms = search.value.toLowerCase().split(/\s+/).filter(Boolean);
        const chosen = new Set(chosenNow());
        const keysShown = chosenNow().slice();
        let more = 0;
        for (const k of allKeys()) {
          if (chosen.has(k)) continue;
          if (terms.length && !terms.every((t) => k.toLowerCase().includes(t))) continue;
          if (keysShown.length < chosen.size + 200) keysShown.push(k);
          else more++;
        }
        put(
          list,
          keysShown.length
            ? keysShown.map((k) =>
                h(
                  'label',
                  { class: 'check' },
                  h('input', {
                    type: 'checkbox',
                    value: k,
                    checked: chosen.has(k),
                    onchange: (e) =>
                      onPick(e.target.checked ? [...chosenNow(), k] : chosenNow().filter((m) => m !== k)),
                  }),
                  k,
                  countOf(k) ? h('small', { class: 'muted' }, ` ${countOf(k)}`) : null,
                ),
              )
            : h('span', { class: 'muted' }, allKeys().length ? 'No key matches.' : 'None yet.'),
          more ? h('span', { class: 'muted' }, `${more.toLocaleString()} more: type to narrow`) : null,
        );
      }
      return {
        render(isAuto) {
          if (!el.firstChild)
            put(
              el,
              h('summary'),
              h('div', { class: 'pickerbody' }, h('div', { class: 'pickerhead' }, search, auto), list),
            );
          el.firstChild.textContent = `${title} (${chosenNow().length}${isAuto ? ', automatic' : ''})`;
          auto.disabled = isAuto;
          boxes();
        },
      };
    }
    const commonCount = (k) => {
      const c = common.find((x) => x.key === k);
      return c ? `${c.runs} run${c.runs === 1 ? '' : 's'}` : '';
    };
    const metricPicker = makePicker(
      picker,
      'picker',
      'Metric columns',
      () => metricCols,
      () => {
        const top = common.map((c) => c.key).filter((k) => !isSys(k));
        const seen = new Set(top);
        return top.concat(keys.filter((k) => !isSys(k) && !seen.has(k)));
      },
      commonCount,
      (cols) => {
        settings.columns = cols;
        saveSettings();
        load();
      },
    );
    const configKeys = () => {
      const n = new Map();
      for (const r of runs) for (const k of Object.keys(r.hparams || {})) n.set(k, (n.get(k) || 0) + 1);
      return [...n].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([k]) => k);
    };
    const configPicker = makePicker(
      cpicker,
      'config-picker',
      'Config columns',
      () => configCols,
      configKeys,
      (k) => {
        const n = runs.filter((r) => r.hparams && k in r.hparams).length;
        return `${n} run${n === 1 ? '' : 's'}`;
      },
      (cols) => {
        settings.configCols = cols;
        saveSettings();
        configCols = cols || autoConfigColumns(runs);
        renderPickers();
        renderHead();
        renderBody();
      },
    );
    function renderPickers() {
      metricPicker.render(!settings.columns);
      configPicker.render(!settings.configCols);
    }

    /* A key as a header: it may break after '/', '_' or '.', never inside a word. */
    const breakable = (text) =>
      h(
        'span',
        null,
        ...String(text)
          .split(/(?<=[/_.])/)
          .flatMap((part, i) => (i ? [h('wbr'), part] : [part])),
      );

    function renderHead() {
      const cols = columns();
      const sel = h('input', {
        type: 'checkbox',
        'aria-label': 'Select every run shown',
        onchange: (e) => {
          visible().forEach((r) => (e.target.checked ? selected.add(r.id) : selected.delete(r.id)));
          renderBody();
        },
      });
      const sortBy = (id) => {
        if (sortCol === id) sortDir = -sortDir;
        else {
          sortCol = id;
          sortDir = 1;
        }
        renderHead();
        renderBody();
      };
      const arrow = (id) =>
        h('span', { class: 'arrow', 'aria-hidden': 'true' }, sortCol === id ? (sortDir > 0 ? '▲' : '▼') : '');
      put(
        table,
        h(
          'thead',
          null,
          h(
            'tr',
            null,
            h('th', { class: 'sel' }, sel),
            cols.map((c) =>
              h(
                'th',
                {
                  scope: 'col',
                  class: (c.num ? 'num ' : '') + (c.metric ? 'metric' : c.hp ? 'hp' : `col-${c.id}`),
                  'aria-sort':
                    sortCol === c.id || sortCol === 'best:' + c.key
                      ? sortDir > 0
                        ? 'ascending'
                        : 'descending'
                      : 'none',
                  dataset: { col: c.id },
                  title: c.metric ? c.key : c.hp ? `${c.label}: a param or config key` : null,
                },
                h(
                  'button',
                  { type: 'button', class: 'sort', onclick: () => sortBy(c.id) },
                  c.metric || c.hp ? breakable(c.label) : c.label,
                  c.sub && !c.metric && !c.hp ? h('small', null, c.sub) : null,
                  arrow(c.id),
                ),
                c.metric
                  ? h(
                      'small',
                      { class: 'sub' },
                      c.sub.split(' · ').map((part, i) =>
                        i === 1 && bestOf(c.key)
                          ? [
                              ' · ',
                              h(
                                'button',
                                {
                                  type: 'button',
                                  class: 'sort best',
                                  onclick: () => sortBy('best:' + c.key),
                                },
                                part,
                                arrow('best:' + c.key),
                              ),
                            ]
                          : [i ? ' · ' : '', part],
                      ),
                    )
                  : null,
              ),
            ),
          ),
        ),
        h('tbody'),
      );
    }

    function visible() {
      const terms = filter.value.split(/\s+/).filter(Boolean);
      if (!terms.length) {
        filterNote.textContent = '';
        return runs;
      }
      const preds = [],
        words = [],
        bad = [];
      for (const t of terms) {
        const f = parseFilter(t);
        if (!f) words.push(t.toLowerCase());
        else if ((f.op === '<' || f.op === '>' || f.op === '<=' || f.op === '>=') && f.num == null)
          bad.push(t);
        else preds.push(f);
      }
      filterNote.textContent = bad.length ? `${bad.join(', ')}: < and > compare numbers` : '';
      return runs.filter((r) => {
        if (bad.length) return false;
        if (!preds.every((f) => filterMatch(f, r.hparams))) return false;
        if (!words.length) return true;
        const hay = [
          r.id,
          r.workflow,
          r.status,
          Object.entries(r.hparams || {})
            .map(([k, v]) => `${k}=${fmtHp(v)}`)
            .join(' '),
          r.code_version || '',
          r.note || '',
          r.group || '',
          (r.tags || []).map((t) => '#' + t).join(' '),
          r.notes || '',
        ]
          .join(' ')
          .toLowerCase();
        return words.every((t) => hay.includes(t));
      });
    }

    function renderBody() {
      const cols = columns();
      const now = Date.now() / 1000;
      let get = (cols.find((c) => c.id === sortCol) || cols[3]).val;
      if (sortCol.startsWith('best:')) {
        const c = cols.find((x) => x.key === sortCol.slice(5));
        if (c) get = c.best;
      }
      const rows = visible()
        .slice()
        .sort((a, b) => cmpVal(get(a), get(b), sortDir));
      const tbody = h('tbody');
      for (const r of rows) {
        const cells = [
          h(
            'td',
            { class: 'sel' },
            h('input', {
              type: 'checkbox',
              checked: selected.has(r.id),
              'aria-label': `Select run ${r.id}`,
              onchange: (e) => {
                e.target.checked ? selected.add(r.id) : selected.delete(r.id);
                updateCompare();
              },
            }),
          ),
        ];
        for (const c of cols) {
          const v = c.val(r);
          let td;
          if (c.id === 'id')
            td = h(
              'td',
              { class: 'id' },
              h('a', { href: `#/run/${encodeURIComponent(r.id)}` }, r.id),
              /* The user's labels (tandem tag/group): the filter box finds them as #tag. */
              r.group ? h('span', { class: 'note', title: 'group' }, `[${r.group}]`) : null,
              ...(r.tags || []).map((t) => h('span', { class: 'note', title: 'tag' }, '#' + t)),
            );
          else if (c.id === 'status') {
            const quiet = silentFor(r, silentAfter, now);
            td = h(
              'td',
              { class: 'status' },
              badge(r.status),
              quiet
                ? h(
                    'span',
                    {
                      class: 'badge st-silent',
                      dataset: { silent: '1' },
                      title:
                        `No metric or log line from its workers since ${fmtTime(r.last_activity)} ` +
                        `(the mark comes after ${Math.round(silentAfter / 60)} min: TANDEM_SILENT_S of tandem ui)`,
                    },
                    fmtSilent(quiet),
                  )
                : null,
              r.note ? h('span', { class: 'note', title: r.note }, 'note') : null,
            );
          } else if (c.id === 'created')
            /* The short form (month-day hour:minute) where the window is narrow (style.css). */
            td = h(
              'td',
              { class: 'nowrap col-created', title: fmtTime(v) },
              h('span', { class: 'long' }, fmtTime(v)),
              h('span', { class: 'short' }, fmtTime(v).slice(0, 16)),
            );
          else if (c.id === 'duration')
            td = h('td', { class: 'num nowrap', dataset: r.live ? { live: '1' } : null }, fmtDur(v));
          else if (c.id === 'code') td = h('td', { class: 'mono col-code', title: v }, shortVersion(v));
          else if (c.id === 'restarts') td = h('td', { class: 'num col-restarts' }, fmtNum(v));
          else if (c.id === 'cost')
            td = h(
              'td',
              {
                class: 'num col-cost',
                dataset: { usd: r.cost_usd ?? '' },
                title:
                  r.cost_usd == null
                    ? 'No cloud instance with a known price'
                    : `${r.live && r.cost_usd_per_hour ? `billing $${r.cost_usd_per_hour.toFixed(4)}/h now; ` : ''}` +
                      `${r.cost_unpriced ? `${r.cost_unpriced} instance(s) without a price left out; ` : ''}` +
                      'the instances and their prices are on the run\'s page',
              },
              fmtCost(v),
            );
          else if (c.hp)
            td = h(
              'td',
              {
                class: 'hp mono' + (typeof v === 'number' ? ' num' : ''),
                title: fmtHp(v),
                dataset: { hp: c.label },
              },
              showHp(v),
            );
          else if (c.metric) {
            const m = r.metrics && r.metrics[c.key];
            const pct = c.unit.mixed && m && accUnit(m) === '%' ? ' %' : '';
            const best = c.best(r);
            td = h(
              'td',
              { class: 'num metric', dataset: { metric: c.key } },
              v == null ? '' : h('span', { class: 'last' }, fmtNum(v) + pct),
              best != null ? h('small', { class: 'best muted' }, `best ${fmtNum(best)}${pct}`) : null,
            );
          } else td = h('td', { class: c.num ? 'num' : null }, c.num ? fmtNum(v) : v);
          cells.push(td);
        }
        tbody.append(
          h('tr', { dataset: { run: r.id }, class: selected.has(r.id) ? 'selected' : null }, cells),
        );
      }
      table.tBodies[0].replaceWith(tbody);
      count.textContent =
        rows.length === runs.length
          ? plural(runs.length, 'run')
          : `${rows.length} of ${plural(runs.length, 'run')}`;
      if (!runs.length)
        put(
          status,
          h(
            'p',
            { class: 'muted' },
            'No runs in this store yet: start one with ',
            h('code', null, 'tandem run WORKFLOW'),
            '.',
          ),
        );
      else put(status);
      updateCompare();
    }

    function updateCompare() {
      for (const id of [...selected]) if (!runs.some((r) => r.id === id)) selected.delete(id);
      compareBtn.disabled = selected.size < 2;
      compareBtn.textContent = selected.size >= 2 ? `Compare ${selected.size}` : 'Compare';
      table
        .querySelectorAll('tbody tr')
        .forEach((tr) => tr.classList.toggle('selected', selected.has(tr.dataset.run)));
    }

    /* The list with the metric columns' values; with automatic columns, the first answer says
     * which keys the runs logged, and a second one brings those columns' values. */
    async function load() {
      try {
        for (let pass = 0; pass < 2; pass++) {
          const want = settings.columns || metricCols;
          const d = await api(`api/runs?all=1&metrics=${encodeURIComponent(want.join(','))}`, {
            signal: view.ac.signal,
          });
          if (view.dead) return;
          runs = d.runs || [];
          keys = d.metric_keys || [];
          common = d.common_keys || [];
          if (d.silent_after_s != null) silentAfter = d.silent_after_s;
          configCols = settings.configCols || autoConfigColumns(runs);
          metricCols = settings.columns || autoMetricColumns(common);
          if (metricCols.join(',') === want.join(',')) break;
        }
        renderPickers();
        renderHead();
        renderBody();
        listen();
        requestAnimationFrame(() => markOnce('tandem:runs-table'));
      } catch (e) {
        if (!isAbort(e)) put(status, errorBox(`Could not load the runs: ${e.message}`));
      }
    }

    /* Changed runs arrive on /api/events (status, restarts, end; every 2 s the metric columns of
     * live runs), for the chosen metric columns. */
    function merge(changed) {
      for (const c of changed) {
        const i = runs.findIndex((r) => r.id === c.id);
        if (i >= 0)
          runs[i] = Object.assign({}, runs[i], c, { metrics: Object.assign({}, runs[i].metrics, c.metrics) });
        else runs.unshift(c);
      }
      renderBody();
    }

    function listen() {
      const want = metricCols.join(',');
      if (es && want === listenedFor) return;
      if (es) es.close();
      listenedFor = want;
      let opens = 0;
      es = new EventSource(`api/events?metrics=${encodeURIComponent(want)}`);
      es.addEventListener('open', () => {
        setConn('● live', 'on');
        if (opens++) load();
      }); // missed changes
      es.addEventListener('runs', (e) => merge(JSON.parse(e.data).runs || []));
      es.addEventListener('error', () => setConn('○ reconnecting', 'off'));
    }
    /* Durations of live runs tick; a run that falls silent (or speaks again) is redrawn; every
     * minute with live runs the list is read again, for their last activity. */
    let ticks = 0;
    const tick = setInterval(() => {
      const now = Date.now() / 1000;
      table.querySelectorAll('td[data-live]').forEach((td) => {
        const r = runs.find((x) => x.id === td.parentElement.dataset.run);
        if (r) td.textContent = fmtDur(duration(r));
      });
      const flip = runs.some((r) => {
        const tr = table.querySelector(`tr[data-run="${CSS.escape(r.id)}"]`);
        return tr && !!silentFor(r, silentAfter, now) !== !!tr.querySelector('[data-silent]');
      });
      if (flip) renderBody();
      if (++ticks % 60 === 0 && runs.some((r) => r.live)) load();
    }, 1000);
    /* An open picker closes on a click elsewhere (it lies over the table). */
    const closePickers = (e) => {
      for (const d of [picker, cpicker]) if (d.open && !d.contains(e.target)) d.open = false;
    };
    document.addEventListener('click', closePickers);
    renderHead();
    load();
    document.title = 'Runs · tandem';
    return {
      destroy() {
        view.dead = true;
        view.ac.abort();
        if (es) es.close();
        clearInterval(tick);
        document.removeEventListener('click', closePickers);
      },
    };
  }

  function badge(status) {
    return h('span', { class: `badge st-${status}` }, status);
  }

  /* ---------- view: one run ---------- */
  function runView(main, id) {
    const view = { dead: false, ac: new AbortController(), syncKey: 'run' };
    view.signal = view.ac.signal;
    view.fetchQueue = queue(2);
    const set = new ChartSet(view);
    view.redraw = (c) => set.redraw(c);
    let run = null,
      events = null,
      logs = null,
      tick = 0,
      stopping = false,
      headKey = '';

    const head = h('div', { class: 'runhead' });
    const chartsRoot = h('div', { class: 'charts', id: 'charts' });
    const logsRoot = h('section', { id: 'logs', class: 'panel', 'aria-labelledby': 'logs-title' });
    const artsRoot = h('section', { id: 'artifacts', class: 'panel', 'aria-labelledby': 'artifacts-title' });
    const instRoot = h('section', { id: 'instances', class: 'panel', 'aria-labelledby': 'instances-title' });
    const toolbar = chartToolbar((what) => {
      if (what === 'x') set.reloadAll();
      else set.renderAll();
    });
    put(
      main,
      h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Runs'), ' / ', id),
      head,
      h('div', { class: 'sticky' }, toolbar),
      chartsRoot,
      logsRoot,
      artsRoot,
      instRoot,
    );

    /* One line per rank; ranks whose points are all equal (rank 0 logs what every rank has, or a
     * metric reduced over ranks) become one line. */
    const loader = (key) => async (range, width, signal) => {
      /* The cost axis is the wall-time series with each point's time turned into the dollars
       * accrued by then (view.cost, from the run's instances and their prices). */
      const mode = xMode(view);
      let q = `key=${encodeURIComponent(key)}&x=${mode === 'cost' ? 'time' : mode}&width=${width}`;
      if (range && mode === 'cost') range = [view.cost.timeOf(range[0]), view.cost.timeOf(range[1])];
      if (range) q += `&from=${range[0]}&to=${range[1]}`;
      const d = await api(`${runUrl(run.id)}/series?${q}`, { signal });
      const series = d.series || [];
      if (mode === 'cost') for (const s of series) s.x = s.x.map(view.cost.at);
      const alias = new Map();
      /* Same values at the same steps (on the wall-time axis the ranks' clocks differ a little:
       * same values in the same order). */
      const same = (a, b) =>
        a.x.length === b.x.length &&
        a.y.every((v, i) => v === b.y[i]) &&
        (mode !== 'step' || a.x.every((v, i) => v === b.x[i]));
      const lines = [];
      for (const s of series) {
        const twin = lines.find((l) => same(l.src, s));
        if (twin) {
          alias.set(s.rank, twin.id);
          twin.ranks.push(s.rank);
          continue;
        }
        lines.push({
          id: s.rank,
          src: s,
          ranks: [s.rank],
          x: s.x.slice(),
          y: s.y.slice(),
          color: color(s.rank),
        });
      }
      let total = 0;
      for (const l of lines) {
        l.label = l.ranks.length > 1 ? `ranks ${l.ranks.join(',')}` : `rank ${l.id}`;
        total += l.src.n != null ? l.src.n : l.src.x.length;
        delete l.src;
      }
      return { lines, alias, total };
    };
    const grid = new ChartGrid(chartsRoot, set, (key) => new Chart(view, key, loader(key)));

    /* The run's restart/resume marks, drawn on every chart (Chart.drawMarks). */
    function setMarks(marks) {
      view.marks = dedupeMarks(marks).map((m) =>
        Object.assign(m, { color: MARK_COLORS[m.kind] || MARK_COLORS.resume, label: markLabel(m) }),
      );
    }
    /* A key/value table of an object (the run's config or summary); null when it is empty. */
    function kvTable(title, id, obj) {
      const names = obj && typeof obj === 'object' && !Array.isArray(obj) ? Object.keys(obj) : [];
      if (!names.length) return null;
      const show = (v) =>
        typeof v === 'number' ? fmtValue(v, 0, 6) : typeof v === 'string' ? v : JSON.stringify(v);
      return h(
        'div',
        { class: 'params', id },
        h('h2', null, title),
        h(
          'table',
          { class: 'kv' },
          h(
            'tbody',
            null,
            names.map((k) =>
              h(
                'tr',
                { dataset: { name: k } },
                h('th', { scope: 'row' }, k),
                h('td', { class: 'mono' }, show(obj[k])),
              ),
            ),
          ),
        ),
      );
    }

    /* The run's cost ($X.XX, "—" when no instance has a price); its tooltip names each instance
     * with its price, where the price came from and what it cost. */
    function costCell(r) {
      const insts = (r.instances && r.instances.instances) || [];
      const lines = insts.map(
        (i) =>
          `${i.id} ${i.type || ''} ${i.market || ''}: ` +
          (i.usd_per_hour > 0
            ? `$${i.usd_per_hour}/h (${i.price_source || 'price source not recorded'}), ${fmtCost(i.cost_usd)}`
            : 'no price known'),
      );
      if (r.cost_unpriced) lines.push(`${r.cost_unpriced} instance(s) without a price are left out`);
      return h(
        'span',
        { id: 'run-cost', title: lines.join('\n') || null, dataset: { usd: r.cost_usd ?? '' } },
        fmtCost(costNow(r, Date.now() / 1000)),
      );
    }

    function renderHead() {
      const r = run;
      const stop =
        r.live && token
          ? h(
              'button',
              {
                type: 'button',
                class: 'danger',
                id: 'stop',
                onclick: stopRun,
                disabled: stopping,
                title: 'Stop the run as tandem stop does: SIGTERM to its workers, which may checkpoint',
              },
              stopping ? 'Stopping…' : 'Stop',
            )
          : null;
      const params = Object.keys(r.params || {});
      const dl = (pairs) =>
        h(
          'dl',
          { class: 'meta' },
          pairs
            .filter((p) => p[1] !== '' && p[1] != null)
            .map(([k, v, wide]) =>
              h('div', { class: wide ? 'wide' : null }, h('dt', null, k), h('dd', null, v)),
            ),
        );
      put(
        head,
        h(
          'div',
          { class: 'titlebar' },
          h('h1', null, r.id),
          h(
            'span',
            { id: 'run-status', class: `badge st-${r.status}`, role: 'status', 'aria-live': 'polite' },
            r.status,
          ),
          /* Silent as the server saw it when the page loaded (the runs table follows it live). */
          r.live && r.silent_s
            ? h(
                'span',
                {
                  class: 'badge st-silent',
                  id: 'run-silent',
                  title: `No metric or log line from its workers since ${fmtTime(r.last_activity)}`,
                },
                fmtSilent(r.silent_s),
              )
            : null,
          stop,
        ),
        h(
          'div',
          { class: 'cols' },
          dl([
            ['Workflow', r.workflow],
            ['Started', fmtTime(r.started || r.created)],
            ['Ended', fmtTime(r.ended)],
            [
              'Duration',
              h(
                'span',
                { id: 'run-duration' },
                fmtDur(r.live && r.started ? Date.now() / 1000 - r.started : r.duration),
              ),
            ],
            ['Restarts', String(r.restarts ?? 0)],
            ['Cost', r.instances || r.cost_usd != null ? costCell(r) : ''],
            ['Exit code', r.exit_code != null && r.exit_code >= 0 ? String(r.exit_code) : ''],
            [
              'Workers',
              r.nodes != null ? `${r.nodes} node${r.nodes === 1 ? '' : 's'} × ${r.nproc_per_node}` : '',
            ],
            [
              'Code version',
              r.code_version ? h('code', { title: r.code_version }, shortVersion(r.code_version)) : '',
            ],
            ['Note', r.note || '', true],
            ['Group', r.group || ''],
            ['Tags', (r.tags || []).join(', ')],
            ['Notes', r.notes || '', true],
            [
              'Restarts and resumes',
              (view.marks || []).length
                ? h(
                    'span',
                    { id: 'run-marks' },
                    view.marks.map((m) => `${m.label}${m.time ? ` (${fmtTime(m.time)})` : ''}`).join('; '),
                  )
                : '',
              true,
            ],
          ]),
          h(
            'div',
            { class: 'side' },
            h(
              'div',
              { class: 'params' },
              h('h2', null, 'Params'),
              params.length
                ? h(
                    'table',
                    { class: 'kv' },
                    h(
                      'tbody',
                      null,
                      params.map((k) =>
                        h(
                          'tr',
                          null,
                          h('th', { scope: 'row' }, k),
                          h(
                            'td',
                            { class: 'mono' },
                            typeof r.params[k] === 'string' ? r.params[k] : JSON.stringify(r.params[k]),
                          ),
                        ),
                      ),
                    ),
                  )
                : h('p', { class: 'muted' }, 'none'),
            ),
            kvTable('Config', 'run-config', r.config),
            kvTable('Summary', 'run-summary', r.summary),
          ),
        ),
        r.command
          ? h(
              'details',
              { class: 'command' },
              h('summary', null, 'Command and run directory'),
              h('pre', null, r.command),
              h('p', { class: 'mono muted' }, r.run_dir || ''),
            )
          : null,
      );
      document.title = `${r.id} (${r.status}) · tandem`;
    }

    async function stopRun() {
      if (
        !confirm(
          `Stop run ${run.id}? Its workers get SIGTERM and may checkpoint first (what tandem stop does).`,
        )
      )
        return;
      stopping = true;
      renderHead();
      try {
        await api(`${runUrl(run.id)}/stop`, { method: 'POST', signal: view.signal });
      } catch (e) {
        if (isAbort(e)) return;
        stopping = false;
        renderHead();
        head.append(errorBox(`Could not stop the run: ${e.message}`));
      }
    }

    function renderArtifacts(arts) {
      put(
        artsRoot,
        h('h2', { id: 'artifacts-title' }, 'Artifacts'),
        arts && arts.length
          ? h(
              'table',
              { class: 'arts' },
              h(
                'thead',
                null,
                h(
                  'tr',
                  null,
                  h('th', { scope: 'col' }, 'Name'),
                  h('th', { scope: 'col', class: 'num' }, 'Size'),
                  h('th', { scope: 'col' }, 'SHA-256'),
                  h('th', { scope: 'col' }, h('span', { class: 'sr' }, 'Download')),
                ),
              ),
              h(
                'tbody',
                null,
                arts.map((a) =>
                  h(
                    'tr',
                    null,
                    h('td', { class: 'mono' }, a.name),
                    h('td', { class: 'num', title: `${a.size} bytes` }, fmtBytes(a.size)),
                    h('td', { class: 'mono sha' }, h('code', { title: a.sha256 }, a.sha256)),
                    h(
                      'td',
                      null,
                      h(
                        'a',
                        {
                          href: a.url,
                          download: a.name.split('/').pop(),
                          'aria-label': `Download ${a.name}`,
                        },
                        'Download',
                      ),
                    ),
                  ),
                ),
              ),
            )
          : h(
              'p',
              { class: 'muted' },
              run.live ? 'Artifacts are collected when the run ends.' : 'No artifacts.',
            ),
      );
    }

    /* The cloud instances of an aws run (RUN/instances.json): what it ran on and what it cost.
     * Hidden for a run without any. */
    function renderInstances(rec) {
      /* the cost axis follows the record: a replacement's price counts from its launch */
      view.cost = rec ? costCurve(rec.instances) : null;
      if (view.cost) toolbar.addCost();
      instRoot.hidden = !rec;
      if (!rec) return put(instRoot);
      const hours = (x) => x.toFixed(2);
      const th = (t, cls) => h('th', { scope: 'col', class: cls || null }, t);
      put(
        instRoot,
        h('h2', { id: 'instances-title' }, 'Instances'),
        h(
          'p',
          { class: 'muted' },
          `${rec.instances.length} on ${rec.provider} ${rec.region || ''}: ` +
            `${hours(rec.instance_hours)} instance-hours`,
        ),
        h(
          'table',
          { class: 'arts instances' },
          h(
            'thead',
            null,
            h(
              'tr',
              null,
              th('Instance'),
              th('Node', 'num'),
              th('Type'),
              th('Market'),
              th('Zone'),
              th('Launched'),
              th('Lifetime', 'num'),
              th('Instance-hours', 'num'),
              th('$/hour', 'num'),
              th('Cost', 'num'),
              th('End'),
            ),
          ),
          h(
            'tbody',
            null,
            rec.instances.map((i) =>
              h(
                'tr',
                null,
                h('td', { class: 'mono' }, i.id),
                h('td', { class: 'num' }, i.node == null ? '-' : String(i.node)),
                h('td', { class: 'mono' }, i.type || '-'),
                h('td', null, i.market || '-'),
                h('td', null, i.zone || '-'),
                h('td', null, fmtTime(i.launched)),
                h('td', { class: 'num' }, fmtDur(i.lifetime)),
                h('td', { class: 'num' }, hours(i.instance_hours)),
                h(
                  'td',
                  { class: 'num', title: i.price_source || 'no price known' },
                  i.usd_per_hour > 0 ? '$' + i.usd_per_hour : '—',
                ),
                h('td', { class: 'num' }, fmtCost(i.cost_usd)),
                h(
                  'td',
                  null,
                  (i.end || (i.live ? 'alive' : i.state || '-')) +
                    (i.replaces ? ` (replaced ${i.replaces})` : ''),
                ),
              ),
            ),
          ),
        ),
      );
    }

    function onPoints(points) {
      const mode = xMode(view);
      const xi = mode === 'step' ? 2 : 3;
      for (const p of points) {
        const [key, rank] = p;
        let c = set.charts.get(key);
        if (!c) {
          grid.ensure(key);
          continue;
        } // a new key: its chart loads when in sight; a key not shown: nothing to draw
        c.append(rank, mode === 'cost' ? view.cost.at(p[xi]) : p[xi], p[4]);
      }
    }

    async function load() {
      try {
        run = await api(runUrl(id), { signal: view.signal });
      } catch (e) {
        if (isAbort(e)) return;
        put(
          head,
          errorBox(
            e.status === 404 ? `No run ${id}: ${e.message}` : `Could not load run ${id}: ${e.message}`,
          ),
          h('p', null, h('a', { href: '#/' }, 'Back to the runs')),
        );
        return;
      }
      if (view.dead) return;
      /* before the charts: on the cost axis they need the instances' prices */
      view.cost = run.instances ? costCurve(run.instances.instances) : null;
      if (view.cost) toolbar.addCost();
      setMarks(run.marks);
      renderHead();
      const keys = (run.keys || []).map((k) => k.key);
      grid.setKeys(keys);
      if (!keys.length)
        chartsRoot.append(
          h(
            'p',
            { class: 'muted empty-charts' },
            run.live ? 'No metrics yet: charts appear as points arrive.' : 'This run stored no metrics.',
          ),
        );
      logs = logsPanel(logsRoot, run, view);
      renderArtifacts(run.artifacts);
      renderInstances(run.instances);
      if (run.live) {
        events = runEvents(view, run.id, {
          points: (pts) => {
            const e = $('.empty-charts', chartsRoot);
            if (e && pts.length) e.remove();
            onPoints(pts);
          },
          status: (s) => {
            const was = run.live;
            run = Object.assign(run, s);
            if (!run.live) stopping = false;
            /* Redraw the header only when what it shows changed (not the ticking duration). */
            const key = JSON.stringify([
              run.status,
              run.restarts,
              run.note,
              run.ended,
              run.exit_code,
              run.code_version,
            ]);
            if (key !== headKey) {
              headKey = key;
              renderHead();
            }
            if (was && !run.live) {
              /* The end: artifacts and logs are collected now. */
              api(runUrl(run.id), { signal: view.signal })
                .then((d) => {
                  if (!view.dead) {
                    renderArtifacts(d.artifacts);
                    renderInstances(d.instances);
                    logs.update(d.logs);
                  }
                })
                .catch(() => {});
            }
          },
          log: (l) => logs.onLog(l),
          /* A resume cut the metrics back: refetch the charts and the marks. */
          reset: () => {
            set.reloadAll();
            api(runUrl(run.id), { signal: view.signal })
              .then((d) => {
                if (view.dead) return;
                setMarks(d.marks);
                renderHead();
                set.renderAll();
              })
              .catch(() => {});
          },
          isFinal: () => !run.live,
          conn: (on) => setConn(on ? '● live' : run.live ? '○ reconnecting' : '', on ? 'on' : 'off'),
        });
        tick = setInterval(() => {
          const el = $('#run-duration');
          if (el && run.live && run.started) el.textContent = fmtDur(Date.now() / 1000 - run.started);
        }, 1000);
      }
    }
    load();
    return {
      destroy() {
        view.dead = true;
        view.ac.abort();
        if (events) events.close();
        clearInterval(tick);
        set.destroy();
        if (logs) logs.destroy();
      },
    };
  }

  /* ---------- the logs panel ---------- */
  const LOG_KEEP = 2 << 20; // characters kept on the page; older text is dropped from the top
  function logsPanel(root, run, view) {
    let files = (run.logs || []).slice();
    let cur = null,
      end = 0,
      loading = null;
    const sel = h('select', { id: 'log-rank', 'aria-label': 'Log file' });
    const follow = h('input', { type: 'checkbox', id: 'log-follow', checked: !!run.live });
    const pre = h('pre', { tabindex: '0', 'aria-label': 'Log text', 'aria-live': 'off' });
    const info = h('span', { class: 'muted' });
    const label = (f) => (f.rank >= 0 ? `rank ${f.rank}` : decodeURIComponent(f.url.split('/').pop()));
    function options() {
      const keep = sel.value;
      put(sel, ...files.map((f, i) => h('option', { value: String(i) }, label(f))));
      if (keep) sel.value = keep;
    }
    sel.addEventListener('change', () => show(files[+sel.value]));
    follow.addEventListener('change', () => {
      if (follow.checked) pre.scrollTop = pre.scrollHeight;
    });
    pre.addEventListener('scroll', () => {
      const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 4;
      if (!atBottom && follow.checked && !pre.dataset.auto) follow.checked = false;
      else if (atBottom && !follow.checked && run.live) follow.checked = true;
      delete pre.dataset.auto;
    });
    function scrollDown() {
      if (!follow.checked) return;
      pre.dataset.auto = '1';
      pre.scrollTop = pre.scrollHeight;
    }
    function addText(text) {
      if (!text) return;
      pre.append(text);
      if (pre.textContent.length > LOG_KEEP) {
        const t = pre.textContent;
        const cut = t.indexOf('\n', t.length - LOG_KEEP / 2);
        pre.textContent = t.slice(cut + 1);
      }
      info.textContent = `${fmtBytes(end)}`;
      scrollDown();
    }
    async function show(f) {
      cur = f;
      pre.textContent = '';
      if (!f) {
        pre.textContent = run.live ? '(no log yet)' : '(no logs)';
        return;
      }
      const mine = (loading = api(`${f.url}?tail=2000`, { signal: view.signal }));
      try {
        const d = await mine;
        if (loading !== mine || view.dead) return;
        pre.textContent = '';
        end = d.end;
        addText(d.text);
        if (!d.text) pre.textContent = '';
        pre.dataset.rank = String(f.rank);
      } catch (e) {
        if (!isAbort(e)) pre.textContent = `Could not read the log: ${e.message}`;
      } finally {
        if (loading === mine) loading = null;
      }
    }
    async function catchUp() {
      if (!cur || loading) return;
      const mine = (loading = api(`${cur.url}?offset=${end}`, { signal: view.signal }));
      try {
        const d = await mine;
        if (loading !== mine) return;
        end = d.end;
        addText(d.text);
      } catch (e) {
        /* the next event tries again */
      } finally {
        if (loading === mine) loading = null;
      }
    }
    put(
      root,
      h(
        'div',
        { class: 'panelhead' },
        h('h2', { id: 'logs-title' }, 'Logs'),
        h('label', { for: 'log-rank' }, 'Log'),
        sel,
        h('label', { class: 'check' }, follow, 'follow'),
        info,
      ),
      pre,
    );
    options();
    const first = files.findIndex((f) => f.rank >= 0);
    sel.value = String(first >= 0 ? first : 0);
    show(files[first >= 0 ? first : 0]);
    return {
      onLog(ev) {
        let f = files.find((x) => x.rank === ev.rank);
        if (!f) {
          files.push({ rank: ev.rank, url: `${runUrl(run.id)}/logs/${ev.rank}`, size: ev.end });
          const order = (x) => (typeof x.rank === 'number' && x.rank >= 0 ? x.rank : 1e9);
          files.sort((a, b) => order(a) - order(b));
          options();
          if (!cur) {
            sel.value = String(files.findIndex((x) => x.rank === ev.rank));
            show(files[+sel.value]);
          }
          return;
        }
        if (f !== cur || loading) return;
        if (ev.offset === end) {
          end = ev.end;
          addText(ev.text);
        } else if (ev.end > end) catchUp();
      },
      update(list) {
        if (!list) return;
        files = list.slice();
        options();
        if (cur) catchUp();
        else if (files.length) {
          sel.value = '0';
          show(files[0]);
        }
      },
      destroy() {},
    };
  }

  /* ---------- view: compare runs ---------- */
  function compareView(main, ids) {
    const view = { dead: false, ac: new AbortController(), syncKey: 'compare' };
    view.signal = view.ac.signal;
    view.fetchQueue = queue(2);
    const set = new ChartSet(view);
    view.redraw = (c) => set.redraw(c);
    const streams = [];
    let runs = [],
      lastTerms = '';
    const head = h('div');
    const paramsRoot = h('section', {
      class: 'panel',
      id: 'compare-params',
      'aria-labelledby': 'params-title',
    });
    const chartsRoot = h('div', { class: 'charts', id: 'charts' });
    const summaryRoot = h('section', {
      class: 'panel',
      id: 'compare-metrics',
      'aria-labelledby': 'metrics-title',
    });
    const toolbar = chartToolbar((what) => {
      if (what === 'x') set.reloadAll();
      else set.renderAll();
    });
    put(
      main,
      h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Runs'), ' / compare'),
      head,
      paramsRoot,
      summaryRoot,
      h('div', { class: 'sticky' }, toolbar),
      chartsRoot,
    );
    document.title = `Compare ${ids.join(', ')} · tandem`;

    /* Each run's line is its lowest rank (rank 0: what a DDP trainer logs, already reduced).
     * A live run is asked even for a key it did not have when the page loaded. */
    const lowest = new Map(); // run -> Map(key -> its lowest rank)
    const rankOf = (r, key) => {
      let m = lowest.get(r);
      if (!m) {
        m = new Map((r.keys || []).map((k) => [k.key, Math.min(...k.ranks)]));
        lowest.set(r, m);
      }
      return m.has(key) ? m.get(key) : null;
    };
    const loader = (key) => async (range, width, signal) => {
      const have = runs
        .map((r, i) => ({ r, i, rank: rankOf(r, key) }))
        .filter((o) => o.rank !== null || o.r.live);
      const results = await Promise.all(
        have.map(async ({ r, i, rank }) => {
          /* the cost axis: each run's wall times turned into its own instances' dollars */
          const mode = xMode(view);
          let q = `key=${encodeURIComponent(key)}&x=${mode === 'cost' ? 'time' : mode}&width=${width}`;
          if (rank !== null) q += `&rank=${rank}`;
          const span = range && mode === 'cost' ? range.map(r.costCurve.timeOf) : range;
          if (span) q += `&from=${span[0]}&to=${span[1]}`;
          let d;
          try {
            d = await api(`${runUrl(r.id)}/series?${q}`, { signal });
          } catch (e) {
            if (e.status === 404 && rank === null) return null; // not logged by this run (yet)
            throw e;
          }
          const s = (d.series || [])[0];
          if (!s) return null;
          if (mode === 'cost') s.x = s.x.map(r.costCurve.at);
          return {
            line: { id: r.id, label: r.id, color: color(i), x: s.x.slice(), y: s.y.slice(), rank: s.rank },
            n: s.n != null ? s.n : s.x.length,
          };
        }),
      );
      const got = results.filter(Boolean);
      return { lines: got.map((o) => o.line), total: got.reduce((a, o) => a + o.n, 0) };
    };
    const grid = new ChartGrid(chartsRoot, set, (key) => new Chart(view, key, loader(key)));

    function renderHead() {
      put(
        head,
        h('div', { class: 'titlebar' }, h('h1', null, `Compare ${runs.length} runs`)),
        h(
          'ul',
          { class: 'legend-runs' },
          runs.map((r, i) =>
            h(
              'li',
              null,
              h('span', { class: 'swatch', style: `background:${color(i)}`, 'aria-hidden': 'true' }),
              h('a', { href: `#/run/${encodeURIComponent(r.id)}` }, r.id),
              ' ',
              h('span', { class: `badge st-${r.status}`, dataset: { run: r.id } }, r.status),
            ),
          ),
        ),
      );
    }

    /* The runs' config (params and what the scripts recorded, one namespace: hparams) first, the
     * keys whose values differ at the top; then workflow, status, code version and restarts;
     * start and duration last (they differ between any two runs, and say nothing about why the
     * lines differ). "only what differs" hides the rows where every run agrees. */
    function renderParams() {
      const names = [];
      for (const r of runs)
        for (const k of Object.keys(r.hparams || {})) if (!names.includes(k)) names.push(k);
      names.sort();
      const show = (v) => (v === undefined ? '—' : showHp(v));
      const config = names.map((k) => [k, (r) => show((r.hparams || {})[k]), true]);
      const differs = (get) => {
        const vals = runs.map(get);
        return vals.some((v) => v !== vals[0]);
      };
      const rows = [
        ...config.filter((row) => differs(row[1])),
        ...config.filter((row) => !differs(row[1])),
        ['workflow', (r) => r.workflow],
        ['status', (r) => r.status],
        ['code version', (r) => r.code_version || ''],
        ['restarts', (r) => String(r.restarts ?? 0)],
        ['started', (r) => fmtTime(r.started || r.created)],
        ['duration', (r) => fmtDur(r.duration)],
      ];
      const only = h('input', {
        type: 'checkbox',
        id: 'only-diff',
        checked: settings.onlyDiff,
        onchange: () => {
          settings.onlyDiff = only.checked;
          saveSettings();
          renderParams();
        },
      });
      const body = h('tbody');
      let shown = 0;
      for (const [name, get, isConfig] of rows) {
        const vals = runs.map(get);
        const diff = vals.some((v) => v !== vals[0]);
        if (settings.onlyDiff && !diff) continue;
        shown++;
        body.append(
          h(
            'tr',
            { class: (diff ? 'diff' : '') + (isConfig ? ' config' : ' meta'), dataset: { param: name } },
            h('th', { scope: 'row' }, isConfig ? h('span', { class: 'mono' }, name) : name),
            vals.map((v) => h('td', { class: 'mono' }, v)),
          ),
        );
      }
      put(
        paramsRoot,
        h(
          'div',
          { class: 'panelhead' },
          h('h2', { id: 'params-title' }, 'Config'),
          h('label', { class: 'check' }, only, 'only what differs'),
          h('span', { class: 'muted' }, 'params and the config the scripts recorded; differing keys first'),
        ),
        h(
          'div',
          { class: 'tablewrap' },
          h(
            'table',
            { class: 'kv compare' },
            h(
              'thead',
              null,
              h(
                'tr',
                null,
                h('th', { scope: 'col' }, h('span', { class: 'sr' }, 'Name')),
                runs.map((r, i) =>
                  h(
                    'th',
                    { scope: 'col' },
                    h('span', { class: 'swatch', style: `background:${color(i)}`, 'aria-hidden': 'true' }),
                    r.id,
                  ),
                ),
              ),
            ),
            body,
          ),
        ),
        shown ? null : h('p', { class: 'muted' }, 'The runs have the same config.'),
      );
    }

    /* One row per metric key (those the chart filter matches, 100 at a time), per run its last
     * value (lowest rank, highest step), min and max over ranks and steps; the better of min and
     * max (bestOf) is marked. */
    let summaryLimit = 100;
    function renderSummary() {
      const stats = runs.map((r) => new Map((r.keys || []).map((k) => [k.key, k])));
      const all = grid.main.keys.concat(grid.sys.keys).filter((k) => !grid.terms.length || grid.matches(k));
      const keys = all.slice(0, summaryLimit);
      const cell = (v, cls) =>
        h('td', { class: cls ? `num ${cls}` : 'num' }, v == null ? '—' : fmtValue(v, 0, 5));
      const body = h(
        'tbody',
        null,
        keys.map((key) => {
          const best = bestOf(key);
          /* The best run of this key: the lowest min of a loss, the highest max of an accuracy;
           * only its cell is bold (ties: each run that reaches it). */
          let top = null;
          if (best)
            for (const m of stats) {
              const k = m.get(key);
              const v = k && k[best];
              if (v != null && isFinite(v) && (top == null || (best === 'min' ? v < top : v > top))) top = v;
            }
          return h(
            'tr',
            { dataset: { metric: key, best: best || '' } },
            h('th', { scope: 'row', class: 'mono' }, key),
            stats.map((m, i) => {
              const k = m.get(key);
              if (!k || k.last == null) return [cell(null), cell(null), cell(null)];
              const win = (which) => (best === which && k[which] === top ? `${which} best` : which);
              const c = [cell(k.last, 'last'), cell(k.min, win('min')), cell(k.max, win('max'))];
              if (best && k[best] === top) c[best === 'min' ? 1 : 2].dataset.bestRun = runs[i].id;
              return c;
            }),
          );
        }),
      );
      const more =
        all.length > keys.length
          ? h(
              'button',
              {
                type: 'button',
                class: 'more',
                onclick: () => {
                  summaryLimit += 400;
                  renderSummary();
                },
              },
              `Show more (${(all.length - keys.length).toLocaleString()} keys not shown)`,
            )
          : null;
      put(
        summaryRoot,
        h(
          'div',
          { class: 'panelhead' },
          h('h2', { id: 'metrics-title' }, 'Metrics'),
          h(
            'span',
            { class: 'muted' },
            'last value, min and max of each key; the best run in bold ' +
              '(the lowest min for losses and errors, the highest max for accuracies and scores)',
          ),
        ),
        h(
          'div',
          { class: 'tablewrap' },
          h(
            'table',
            { class: 'kv compare metrics' },
            h(
              'thead',
              null,
              h(
                'tr',
                null,
                h('th', { scope: 'col', rowspan: '2' }, 'Key'),
                runs.map((r, i) =>
                  h(
                    'th',
                    { scope: 'colgroup', colspan: '3', class: 'run' },
                    h('span', { class: 'swatch', style: `background:${color(i)}`, 'aria-hidden': 'true' }),
                    r.id,
                  ),
                ),
              ),
              h(
                'tr',
                null,
                runs.map(() =>
                  ['last', 'min', 'max'].map((c) => h('th', { scope: 'col', class: 'num sub' }, c)),
                ),
              ),
            ),
            body,
          ),
        ),
        more,
        all.length ? null : h('p', { class: 'muted' }, 'No metrics.'),
      );
    }

    async function load() {
      try {
        runs = await Promise.all(ids.map((id) => api(`${runUrl(id)}?stats=1`, { signal: view.signal })));
      } catch (e) {
        if (!isAbort(e)) put(head, errorBox(`Could not load the runs: ${e.message}`));
        return;
      }
      if (view.dead) return;
      renderHead();
      renderParams();
      const keys = new Set();
      for (const r of runs) for (const k of r.keys || []) keys.add(k.key);
      /* A cost axis when every compared run ran on priced instances: each line on its own
       * run's dollars. */
      for (const r of runs) r.costCurve = r.instances ? costCurve(r.instances.instances) : null;
      view.cost = runs.every((r) => r.costCurve) ? {} : null;
      if (view.cost) toolbar.addCost();
      view.marks = [];
      runs.forEach((r, i) => {
        for (const m of dedupeMarks(r.marks))
          view.marks.push(
            Object.assign({}, m, {
              color: color(i),
              label: `${r.id} ${markLabel(m)}`,
              costAt: r.costCurve && r.costCurve.at,
            }),
          );
      });
      grid.onRender = () => {
        if (grid.terms.join(' ') !== lastTerms) {
          lastTerms = grid.terms.join(' ');
          summaryLimit = 100;
        }
        renderSummary();
      };
      grid.setKeys([...keys]);
      runs.forEach((r, i) => {
        if (!r.live) return;
        streams.push(
          runEvents(view, r.id, {
            points: (pts) => {
              const mode = xMode(view);
              const xi = mode === 'step' ? 2 : 3;
              for (const p of pts) {
                const c = set.charts.get(p[0]);
                if (!c) {
                  grid.ensure(p[0]);
                  continue;
                }
                const line = c.lines.find((l) => l.id === r.id);
                const rank = line ? line.rank : rankOf(r, p[0]);
                if (rank !== null && p[1] !== rank) continue; // another rank of this run
                c.append(r.id, mode === 'cost' ? r.costCurve.at(p[xi]) : p[xi], p[4]);
              }
            },
            status: (s) => {
              runs[i] = Object.assign(runs[i], s);
              renderHead();
              renderParams();
            },
            reset: () => set.reloadAll(),
            isFinal: () => !runs[i].live,
            conn: (on) => setConn(on ? '● live' : '', on ? 'on' : 'off'),
          }),
        );
      });
    }
    load();
    return {
      destroy() {
        view.dead = true;
        view.ac.abort();
        streams.forEach((s) => s.close());
        set.destroy();
      },
    };
  }

  /* For tests (tests/ui/browser): the smoothing function itself. */
  window.tandemUi = Object.freeze({ twema, fmtValue, bestOf, compareKeys, sortKeys, isoTicks, breakGaps });

  /* ---------- routing ---------- */
  let current = null;
  function route() {
    const hash = location.hash || '#/';
    if (!hash.startsWith('#/')) return;
    if (current) current.destroy();
    current = null;
    setConn('', '');
    const main = $('#main');
    let m;
    if ((m = /^#\/run\/([^/?]+)/.exec(hash))) current = runView(main, decodeURIComponent(m[1]));
    else if ((m = /^#\/compare\/([^/?]+)/.exec(hash))) {
      const ids = m[1].split(',').map(decodeURIComponent).filter(Boolean);
      current = compareView(main, ids);
    } else current = runsView(main);
    window.scrollTo(0, 0);
  }
  window.addEventListener('hashchange', route);
  $('#skip').addEventListener('click', (e) => {
    e.preventDefault();
    $('#main').focus();
  });
  if (typeof uPlot === 'undefined') {
    $('#main').replaceChildren(
      errorBox('The chart library (uPlot) did not load: this tandem binary was built without it.'),
    );
    return;
  }
  route();
})();
