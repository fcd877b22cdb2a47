// The MLflow peer of bench/bench_ui.mjs: MLflow's own UI (served by `mlflow server`) in the
// same headless chromium (tests/ui/browser/chromium.mjs), over the same runs and points
// (bench/peers/mlflow_ui_load.py). bench_ui.sh loads the store and starts the server.
//
//   node bench/bench_ui_mlflow.mjs URL EXPERIMENT_ID BIG_RUN_ID [REPS]
//
// Measures, each REPS times in a fresh tab (the browser, its HTTP cache and the server stay),
// from the tab's navigation start (MLflow's page sets no performance marks: the page is polled
// every 10 ms):
//   runs table   the experiment's runs table (an ag-grid) showing 10 rows with a run name; the
//                footer must then read as many "matching runs" as the REST API holds; and the
//                first runs/search response time;
//   first chart  the run's "Model metrics" tab with one chart's line drawn (a plotly trace
//                path through points);
//   all charts   the last of the run's metrics' charts first drawn, each section brought into
//                view in turn (the tab mounts only the charts in sight);
//   points       the most points one metric-history response carried for one metric.
import { launch, newPage, sleep } from '../tests/ui/browser/chromium.mjs';

const [url, expId, bigId, repsArg] = process.argv.slice(2);
if (!url || !expId || !bigId) {
  console.error('usage: node bench/bench_ui_mlflow.mjs URL EXPERIMENT_ID BIG_RUN_ID [REPS]');
  process.exit(2);
}
const reps = +(repsArg || 5);
const base = url.replace(/\/+$/, '');
const median = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor((s.length - 1) / 2)];
};
const fmt = (a) =>
  `median ${median(a).toFixed(0)} ms (min ${Math.min(...a).toFixed(0)}, max ${Math.max(...a).toFixed(0)}, first ${a[0].toFixed(0)})`;

// In the page: the time of the first poll at which FN(ARG) is true.
const whenTrue = (page, fn, arg, timeout = 60000) =>
  page
    .waitForFunction(
      (src, a) => {
        const f = new Function('a', `return (${src})(a)`);
        return f(a) ? performance.now() : false;
      },
      { timeout, polling: 10 },
      fn.toString(),
      arg,
    )
    .then((h) => h.jsonValue());

// The selectors of MLflow's UI (3.x) this measures by: the runs table is an ag-grid, a run's
// metric charts are plotly plots (the element carries plotly's `data`, each trace its
// `metricKey`) whose line is an SVG path.js-line. The run page mounts only the charts in sight
// of its scrolling pane and unmounts those scrolled away.
const ROWS = '.ag-center-cols-container .ag-row';

// In the page, before its scripts: every 10 ms, each plotly chart with a drawn line (a path
// through a few points at least) is recorded once by its metric key with the time it was first
// seen, so a chart unmounted after scrolling by still counts. window.__allDrawn: every mounted
// chart has its line.
function watchCharts() {
  window.__drawn = new Map();
  const drawn = (el) =>
    [...el.querySelectorAll('.scatterlayer .trace path.js-line')].some(
      (p) => (p.getAttribute('d') || '').split(/[LM]/).length > 3,
    );
  window.__allDrawn = () => {
    const els = [...document.querySelectorAll('.js-plotly-plot')];
    return els.length > 0 && els.every(drawn);
  };
  setInterval(() => {
    for (const el of document.querySelectorAll('.js-plotly-plot')) {
      if (!drawn(el)) continue;
      const key = (el.data || []).map((t) => t.metricKey).find(Boolean) || el.id || '?';
      if (!window.__drawn.has(key)) window.__drawn.set(key, performance.now());
    }
  }, 10);
}

const browser = await launch();
const version = await fetch(`${base}/version`)
  .then((r) => r.text())
  .catch(() => '?');
// The big run's metric keys, from MLflow's REST API: the charts its page should draw.
const runInfo = await fetch(`${base}/api/2.0/mlflow/runs/get?run_id=${bigId}`).then((r) => r.json());
const runKeys = (runInfo.run.data.metrics || []).map((m) => m.key).sort();
const nKeys = runKeys.length;
const sections = new Map();
for (const k of runKeys) {
  const name = k.includes('/') ? k.slice(0, k.lastIndexOf('/')) : k;
  sections.set(name, [...(sections.get(name) || []), k]);
}
const nRuns = (
  await fetch(`${base}/api/2.0/mlflow/runs/search`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ experiment_ids: [expId], max_results: 1000 }),
  }).then((r) => r.json())
).runs.length;
const out = { runs_table_ms: [], runs_api_ms: [], first_chart_ms: [], all_charts_ms: [] };
const pageErrors = new Set(); // MLflow's own console errors: printed, not failing the bench
let rowsInDom = 0,
  charts = 0,
  maxPoints = 0,
  historyRequests = 0;

for (let i = 0; i < reps; i++) {
  const page = await newPage(browser);
  await page.goto(`${base}/#/experiments/${expId}/runs`, { waitUntil: 'domcontentloaded' });
  // rows drawn: as many as the grid puts in its viewport (10 at least), each with a run name
  out.runs_table_ms.push(
    await whenTrue(
      page,
      ([sel, n]) => [...document.querySelectorAll(sel)].filter((r) => r.innerText.trim()).length >= n,
      [ROWS, Math.min(10, nRuns)],
    ),
  );
  rowsInDom = await page.evaluate((sel) => document.querySelectorAll(sel).length, ROWS);
  const matching = await page
    .waitForFunction(() => (document.body.innerText.match(/(\d+)\s+matching runs/) || [])[1], {
      timeout: 30000,
      polling: 50,
    })
    .then((h) => h.jsonValue());
  if (+matching !== nRuns) throw new Error(`MLflow's runs table says ${matching} matching runs, the API ${nRuns}`);
  out.runs_api_ms.push(
    await page.evaluate(() => {
      const e = performance.getEntriesByType('resource').find((r) => r.name.includes('runs/search'));
      return e ? e.responseEnd - e.startTime : NaN;
    }),
  );
  await page.close();
}

for (let i = 0; i < reps; i++) {
  const page = await newPage(browser);
  const sizes = [];
  page.on('response', async (r) => {
    if (!/metrics\/get-history/.test(r.url())) return;
    try {
      const d = JSON.parse(await r.text());
      const ms = d.metrics || [];
      const per = {};
      for (const m of ms) per[(m.key || '') + (m.run_id || '')] = (per[(m.key || '') + (m.run_id || '')] || 0) + 1;
      sizes.push(Math.max(0, ...Object.values(per)));
    } catch (e) {
      /* page closed */
    }
  });
  await page.evaluateOnNewDocument(watchCharts);
  await page.goto(`${base}/#/experiments/${expId}/runs/${bigId}/model-metrics`, {
    waitUntil: 'domcontentloaded',
  });
  out.first_chart_ms.push(
    await page
      .waitForFunction(() => window.__drawn && window.__drawn.size > 0 && Math.min(...window.__drawn.values()), {
        timeout: 60000,
        polling: 10,
      })
      .then((h) => h.jsonValue()),
  );
  // Every chart: the page mounts only what is in sight of its pane, so bring each section (the
  // keys sharing a prefix: "train/loss/rank0" is in section "train/loss") to the top of the
  // pane in turn, as soon as the previous one has drawn all its charts.
  for (const [name, keys] of sections) {
    await page.evaluate((n) => {
      const head = [...document.querySelectorAll('span, div, h1, h2, h3, h4, p')].find(
        (el) => el.children.length === 0 && el.textContent.trim() === n,
      );
      if (head) head.scrollIntoView({ block: 'start' });
    }, name);
    await page
      .waitForFunction((ks) => ks.every((k) => window.__drawn.has(k)), { timeout: 30000, polling: 10 }, keys)
      .catch(() => {});
  }
  out.all_charts_ms.push(
    await page
      .waitForFunction((n) => window.__drawn.size >= n && Math.max(...window.__drawn.values()), {
        timeout: 30000,
        polling: 20,
      }, nKeys)
      .then((h) => h.jsonValue())
      .catch(async (e) => {
        const drawnKeys = await page.evaluate(() => [...window.__drawn.keys()]);
        throw new Error(`MLflow drew ${drawnKeys.length} of the run's ${nKeys} charts: ${drawnKeys.join(' ')} (${e.message})`);
      }),
  );
  charts = await page.evaluate(() => window.__drawn.size);
  await sleep(200);
  maxPoints = Math.max(maxPoints, ...sizes);
  historyRequests = sizes.length;
  for (const e of page.errors) pageErrors.add(e.replace(/\s+/g, ' '));
  await page.close();
}
await browser.close();
if (pageErrors.size) console.error(`MLflow's page logged (not counted as a failure):\n  ${[...pageErrors].join('\n  ')}`);

console.log(`MLflow ${version} ui benchmark, ${reps} tabs each (headless chromium, 1280x800)`);
console.log(`runs table (${nRuns} runs) drawn, ${rowsInDom} rows in the DOM: ${fmt(out.runs_table_ms)}`);
console.log(`  runs/search response:           ${fmt(out.runs_api_ms)}`);
console.log(`first chart of ${bigId} drawn: ${fmt(out.first_chart_ms)}`);
console.log(`all ${charts} charts drawn:              ${fmt(out.all_charts_ms)}`);
console.log(`points per chart (one history response): max ${maxPoints}, ${historyRequests} requests per page`);
console.log(
  'result: ' +
    JSON.stringify({
      mlflow: version,
      runs_table_ms: median(out.runs_table_ms),
      runs_api_ms: median(out.runs_api_ms),
      first_chart_ms: median(out.first_chart_ms),
      all_charts_ms: median(out.all_charts_ms),
      max_points_per_chart: maxPoints,
      rows_in_dom: rowsInDom,
      charts,
    }),
);
