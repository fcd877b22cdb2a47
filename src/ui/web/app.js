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
  function fmtParams(p) {
    if (!p) return '';
    return Object.keys(p)
      .map((k) => `${k}=${typeof p[k] === 'string' ? p[k] : JSON.stringify(p[k])}`)
      .join(' ');
  }
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
    const scores = 'acc|accuracy|top\\d+|f1|auc|roc_auc|precision|recall|iou|miou|bleu|rouge\\w*|map|dice|r2|score';
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
  const settings = Object.assign(
    { x: 'step', smooth: 0.6, log: false, metrics: ['train/loss', 'test/acc'], onlyDiff: true },
    (() => {
      try {
        return JSON.parse(localStorage.getItem(SETTINGS_KEY)) || {};
      } catch (e) {
        return {};
      }
    })(),
  );
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
      if (n && (x < line.x[n - 1] || (x === line.x[n - 1] && settings.x === 'step'))) return true;
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
      if (settings.x === 'step') {
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
          ? `${points.toLocaleString()} points`
          : `${points.toLocaleString()} of ${this.total.toLocaleString()} points`;
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
      const tables = lines.map((l) => {
        const raw = log ? l.y.map((v) => (v > 0 ? v : null)) : l.y;
        if (s > 0) {
          let sm = twema(l.x, l.y, s, range);
          if (log) sm = sm.map((v) => (v > 0 ? v : null));
          return [l.x, raw, sm];
        }
        return [l.x, raw];
      });
      const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
      const shape = `${lines.map((l) => l.id).join(',')}|${s > 0}|${log}|${settings.x}`;
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

    describe(lines) {
      if (!lines.length) return `Chart of ${this.key}: no points yet`;
      const parts = lines.map(
        (l) =>
          `${l.label} last ${fmtValue(l.y[l.y.length - 1], magnitude(l.y))} at ${settings.x} ` +
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
          label: settings.x === 'time' ? 'time' : 'step',
          value: legendValue(settings.x === 'time' ? fmtTime : fmtNum),
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
      return {
        width: Math.max(200, this.plot.clientWidth || 600),
        height: 220,
        pxAlign: 0,
        series,
        scales: { x: { time: settings.x === 'time' }, y: log ? { distr: 3 } : {} },
        axes: [
          { stroke: axis, font: axisFont, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } },
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
        const x = settings.x === 'time' ? m.time : m.step;
        if (x == null || !isFinite(x)) continue;
        const px = Math.round(u.valToPos(x, 'x', true));
        if (!isFinite(px) || px < left - 1 || px > left + width + 1) continue;
        ctx.strokeStyle = m.color;
        ctx.beginPath();
        ctx.moveTo(px, top);
        ctx.lineTo(px, top + height);
        ctx.stroke();
        seen.push(`${m.label} at ${settings.x} ${settings.x === 'time' ? fmtTime(x) : x}`);
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
    return h(
      'div',
      { class: 'toolbar', role: 'toolbar', 'aria-label': 'Chart settings' },
      h(
        'fieldset',
        { class: 'segmented' },
        h('legend', null, 'x axis'),
        xSel('step', 'step'),
        xSel('time', 'wall time'),
      ),
      h('label', { for: 'smoothing' }, 'Smoothing'),
      sm,
      out,
      h('label', { class: 'check' }, logBox, 'log scale'),
      h('span', { class: 'hint muted' }, 'Drag on a chart to zoom, double-click to reset.'),
    );
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
  function runsView(main) {
    const view = { dead: false, ac: new AbortController() };
    let runs = [],
      keys = [],
      es = null,
      sortCol = 'created',
      sortDir = -1;
    const selected = new Set();
    const filter = h('input', {
      type: 'search',
      id: 'runs-filter',
      placeholder: 'id, workflow, status, params…',
      'aria-label': 'Filter runs',
      oninput: () => renderBody(),
    });
    const count = h('span', { class: 'muted', 'aria-live': 'polite' });
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
    const picker = h('details', { class: 'picker' });
    const table = h('table', { class: 'runs', id: 'runs' });
    const status = h('div');
    put(
      main,
      h('div', { class: 'pagehead' }, h('h1', null, 'Runs'), count),
      h(
        'div',
        { class: 'toolbar' },
        h('label', { for: 'runs-filter' }, 'Filter'),
        filter,
        picker,
        compareBtn,
        h('span', { class: 'hint muted' }, 'Select two or more runs to compare them.'),
      ),
      status,
      h('div', { class: 'tablewrap runswrap' }, table),
    );

    const columns = () => {
      const cols = [
        { id: 'id', label: 'ID', val: (r) => r.id },
        { id: 'workflow', label: 'Workflow', val: (r) => r.workflow },
        { id: 'status', label: 'Status', val: (r) => r.status },
        { id: 'created', label: 'Started', val: (r) => r.started || r.created },
        { id: 'duration', label: 'Duration', val: (r) => duration(r), num: true },
        { id: 'restarts', label: 'Restarts', val: (r) => r.restarts, num: true },
        { id: 'code', label: 'Code', val: (r) => r.code_version || '' },
        { id: 'params', label: 'Params', val: (r) => fmtParams(r.params) },
      ];
      for (const k of settings.metrics) {
        cols.push({
          id: 'last:' + k,
          label: k,
          sub: 'last',
          num: true,
          val: (r) => (r.metrics && r.metrics[k] ? r.metrics[k].last : null),
        });
        cols.push({
          id: 'best:' + k,
          label: k,
          sub: isLoss(k) ? 'best (min)' : 'best (max)',
          num: true,
          val: (r) => (r.metrics && r.metrics[k] ? (isLoss(k) ? r.metrics[k].min : r.metrics[k].max) : null),
        });
      }
      return cols;
    };
    const duration = (r) => (r.live && r.started ? Date.now() / 1000 - r.started : r.duration);

    /* The metric column picker: a checkbox per key, drawn only while it is open, for the chosen
     * keys and the first 200 others that match its search box (a store may hold 100,000 keys). */
    const pickerSearch = h('input', {
      type: 'search',
      id: 'picker-filter',
      placeholder: 'find a key',
      'aria-label': 'Find a metric key',
      oninput: () => renderBoxes(),
    });
    const pickerBoxes = h('div', { class: 'pickerboxes' });
    picker.addEventListener('toggle', () => {
      if (picker.open) renderBoxes();
      else put(pickerBoxes);
    });
    function renderBoxes() {
      if (!picker.open) return;
      const terms = pickerSearch.value.toLowerCase().split(/\s+/).filter(Boolean);
      const chosen = new Set(settings.metrics);
      const list = settings.metrics.slice();
      let more = 0;
      for (const k of keys) {
        if (k.startsWith('sys/') || chosen.has(k)) continue;
        if (terms.length && !terms.every((t) => k.toLowerCase().includes(t))) continue;
        if (list.length < settings.metrics.length + 200) list.push(k);
        else more++;
      }
      const boxes = list.map((k) =>
        h(
          'label',
          { class: 'check' },
          h('input', {
            type: 'checkbox',
            value: k,
            checked: chosen.has(k),
            onchange: (e) => {
              const on = e.target.checked;
              settings.metrics = on ? [...settings.metrics, k] : settings.metrics.filter((m) => m !== k);
              saveSettings();
              load();
              listen();
            },
          }),
          k,
        ),
      );
      put(
        pickerBoxes,
        boxes.length
          ? boxes
          : h('span', { class: 'muted' }, keys.length ? 'No key matches.' : 'No metrics yet.'),
        more ? h('span', { class: 'muted' }, `${more.toLocaleString()} more: type to narrow`) : null,
      );
    }
    function renderPicker() {
      if (!picker.firstChild)
        put(picker, h('summary'), h('div', { class: 'pickerbody' }, pickerSearch, pickerBoxes));
      picker.firstChild.textContent = `Metric columns (${settings.metrics.length})`;
      renderBoxes();
    }

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
                  class: (c.num ? 'num ' : '') + (c.sub ? 'metric' : `col-${c.id}`),
                  'aria-sort': sortCol === c.id ? (sortDir > 0 ? 'ascending' : 'descending') : 'none',
                },
                h(
                  'button',
                  {
                    type: 'button',
                    class: 'sort',
                    onclick: () => {
                      if (sortCol === c.id) sortDir = -sortDir;
                      else {
                        sortCol = c.id;
                        sortDir = 1;
                      }
                      renderHead();
                      renderBody();
                    },
                  },
                  c.label,
                  c.sub ? h('small', null, c.sub) : null,
                  h(
                    'span',
                    { class: 'arrow', 'aria-hidden': 'true' },
                    sortCol === c.id ? (sortDir > 0 ? '▲' : '▼') : '',
                  ),
                ),
              ),
            ),
          ),
        ),
        h('tbody'),
      );
    }

    function visible() {
      const terms = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
      if (!terms.length) return runs;
      return runs.filter((r) => {
        const hay = [
          r.id,
          r.workflow,
          r.status,
          fmtParams(r.params),
          JSON.stringify(r.params || {}),
          r.code_version || '',
          r.note || '',
          r.group || '',
          (r.tags || []).map((t) => '#' + t).join(' '),
          r.notes || '',
        ]
          .join(' ')
          .toLowerCase();
        return terms.every((t) => hay.includes(t));
      });
    }

    function renderBody() {
      const cols = columns();
      const col = cols.find((c) => c.id === sortCol) || cols[3];
      const rows = visible()
        .slice()
        .sort((a, b) => {
          const va = col.val(a),
            vb = col.val(b);
          if (va == null && vb == null) return 0;
          if (va == null || va === '') return 1;
          if (vb == null || vb === '') return -1;
          return (va < vb ? -1 : va > vb ? 1 : 0) * sortDir;
        });
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
              { class: 'id nowrap' },
              h('a', { href: `#/run/${encodeURIComponent(r.id)}` }, r.id),
              /* The user's labels (tandem tag/group): the filter box finds them as #tag. */
              r.group ? h('span', { class: 'note', title: 'group' }, `[${r.group}]`) : null,
              ...(r.tags || []).map((t) => h('span', { class: 'note', title: 'tag' }, '#' + t)),
            );
          else if (c.id === 'status')
            td = h(
              'td',
              { class: 'nowrap' },
              badge(r.status),
              r.note ? h('span', { class: 'note', title: r.note }, 'note') : null,
            );
          else if (c.id === 'created')
            /* The short form (month-day hour:minute) where the window is narrow (style.css). */
            td = h(
              'td',
              { class: 'nowrap col-created', title: fmtTime(v) },
              h('span', { class: 'long' }, fmtTime(v)),
              h('span', { class: 'short' }, fmtTime(v).slice(5, 16)),
            );
          else if (c.id === 'duration')
            td = h('td', { class: 'num nowrap', dataset: r.live ? { live: '1' } : null }, fmtDur(v));
          else if (c.id === 'code') td = h('td', { class: 'mono col-code', title: v }, shortVersion(v));
          else if (c.id === 'params') td = h('td', { class: 'params', title: v }, v);
          else if (c.id === 'restarts') td = h('td', { class: 'num col-restarts' }, fmtNum(v));
          else td = h('td', { class: c.num ? 'num' : null }, c.num ? fmtNum(v) : v);
          cells.push(td);
        }
        tbody.append(
          h('tr', { dataset: { run: r.id }, class: selected.has(r.id) ? 'selected' : null }, cells),
        );
      }
      table.tBodies[0].replaceWith(tbody);
      count.textContent =
        rows.length === runs.length ? `${runs.length} runs` : `${rows.length} of ${runs.length} runs`;
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

    async function load() {
      try {
        const q = settings.metrics.length
          ? `&metrics=${encodeURIComponent(settings.metrics.join(','))}`
          : '&metrics=';
        const d = await api(`api/runs?all=1${q}`, { signal: view.ac.signal });
        if (view.dead) return;
        runs = d.runs || [];
        keys = d.metric_keys || [];
        renderPicker();
        renderHead();
        renderBody();
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
      if (es) es.close();
      let opens = 0;
      es = new EventSource(`api/events?metrics=${encodeURIComponent(settings.metrics.join(','))}`);
      es.addEventListener('open', () => {
        setConn('● live', 'on');
        if (opens++) load();
      }); // missed changes
      es.addEventListener('runs', (e) => merge(JSON.parse(e.data).runs || []));
      es.addEventListener('error', () => setConn('○ reconnecting', 'off'));
    }
    const tick = setInterval(() => {
      table.querySelectorAll('td[data-live]').forEach((td) => {
        const r = runs.find((x) => x.id === td.parentElement.dataset.run);
        if (r) td.textContent = fmtDur(duration(r));
      });
    }, 1000);
    renderHead();
    load();
    listen();
    document.title = 'Runs · tandem';
    return {
      destroy() {
        view.dead = true;
        view.ac.abort();
        es.close();
        clearInterval(tick);
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
      let q = `key=${encodeURIComponent(key)}&x=${settings.x}&width=${width}`;
      if (range) q += `&from=${range[0]}&to=${range[1]}`;
      const d = await api(`${runUrl(run.id)}/series?${q}`, { signal });
      const series = d.series || [];
      const alias = new Map();
      /* Same values at the same steps (on the wall-time axis the ranks' clocks differ a little:
       * same values in the same order). */
      const same = (a, b) =>
        a.x.length === b.x.length &&
        a.y.every((v, i) => v === b.y[i]) &&
        (settings.x === 'time' || a.x.every((v, i) => v === b.x[i]));
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
                    view.marks
                      .map((m) => `${m.label}${m.time ? ` (${fmtTime(m.time)})` : ''}`)
                      .join('; '),
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
      const xi = settings.x === 'time' ? 3 : 2;
      for (const p of points) {
        const [key, rank] = p;
        let c = set.charts.get(key);
        if (!c) {
          grid.ensure(key);
          continue;
        } // a new key: its chart loads when in sight; a key not shown: nothing to draw
        c.append(rank, p[xi], p[4]);
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
          let q = `key=${encodeURIComponent(key)}&x=${settings.x}&width=${width}`;
          if (rank !== null) q += `&rank=${rank}`;
          if (range) q += `&from=${range[0]}&to=${range[1]}`;
          let d;
          try {
            d = await api(`${runUrl(r.id)}/series?${q}`, { signal });
          } catch (e) {
            if (e.status === 404 && rank === null) return null; // not logged by this run (yet)
            throw e;
          }
          const s = (d.series || [])[0];
          if (!s) return null;
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

    function renderParams() {
      const names = [];
      for (const r of runs)
        for (const k of Object.keys(r.params || {})) if (!names.includes(k)) names.push(k);
      names.sort();
      const show = (v) => (v === undefined ? '—' : typeof v === 'string' ? v : JSON.stringify(v));
      const rows = [
        ['workflow', (r) => r.workflow],
        ['status', (r) => r.status],
        ['code version', (r) => r.code_version || ''],
        ['started', (r) => fmtTime(r.started || r.created)],
        ['duration', (r) => fmtDur(r.duration)],
        ['restarts', (r) => String(r.restarts ?? 0)],
        ...names.map((k) => [k, (r) => show((r.params || {})[k]), true]),
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
      for (const [name, get, isParam] of rows) {
        const vals = runs.map(get);
        const differs = vals.some((v) => v !== vals[0]);
        if (settings.onlyDiff && !differs) continue;
        shown++;
        body.append(
          h(
            'tr',
            { class: differs ? 'diff' : null, dataset: { param: name } },
            h('th', { scope: 'row' }, isParam ? h('span', { class: 'mono' }, name) : name),
            vals.map((v) => h('td', { class: 'mono' }, v)),
          ),
        );
      }
      put(
        paramsRoot,
        h(
          'div',
          { class: 'panelhead' },
          h('h2', { id: 'params-title' }, 'Params'),
          h('label', { class: 'check' }, only, 'only what differs'),
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
        shown ? null : h('p', { class: 'muted' }, 'The runs have the same params.'),
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
          return h(
            'tr',
            { dataset: { metric: key, best: best || '' } },
            h('th', { scope: 'row', class: 'mono' }, key),
            stats.map((m) => {
              const k = m.get(key);
              if (!k || k.last == null) return [cell(null), cell(null), cell(null)];
              return [
                cell(k.last, 'last'),
                cell(k.min, best === 'min' ? 'min best' : 'min'),
                cell(k.max, best === 'max' ? 'max best' : 'max'),
              ];
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
            'last value, min and max of each key; the better one in bold ' +
              '(min for losses and errors, max for accuracies and scores)',
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
      view.marks = [];
      runs.forEach((r, i) => {
        for (const m of dedupeMarks(r.marks))
          view.marks.push(Object.assign({}, m, { color: color(i), label: `${r.id} ${markLabel(m)}` }));
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
              const xi = settings.x === 'time' ? 3 : 2;
              for (const p of pts) {
                const c = set.charts.get(p[0]);
                if (!c) {
                  grid.ensure(p[0]);
                  continue;
                }
                const line = c.lines.find((l) => l.id === r.id);
                const rank = line ? line.rank : rankOf(r, p[0]);
                if (rank !== null && p[1] !== rank) continue; // another rank of this run
                c.append(r.id, p[xi], p[4]);
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
  window.tandemUi = Object.freeze({ twema, fmtValue, bestOf, compareKeys, sortKeys });

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
