// `tandem ui` with many metric keys: the run page of a run with N keys (bench/ui_store_gen.c's
// "wide" run), in headless chromium (tests/ui/browser/chromium.mjs). bench_ui_keys.sh makes the
// store and starts the server.
//
//   node bench/bench_ui_keys.mjs URL RUN_ID REPS TIMEOUT_S LAST_KEY
//
// Each REPS times in a fresh tab:
//   first chart   navigation start -> the first chart drawn (performance mark tandem:first-chart)
//   run JSON      the /api/runs/ID response (start -> end of its body)
//   longest task  the longest main-thread task (PerformanceObserver longtask) from navigation
//                 to 1 s after the first chart: how long the tab did not answer input
//   blocked       the sum of those tasks' time over 50 ms (total blocking time)
//   cells         chart cells on the page
//   filter        typing a key into the filter box -> that key's chart drawn (when there is one)
import { launch, newPage, sleep } from '../tests/ui/browser/chromium.mjs';

const [url, runId, repsArg, timeoutArg, lastKey] = process.argv.slice(2);
if (!url || !runId) {
  console.error('usage: node bench/bench_ui_keys.mjs URL RUN_ID [REPS] [TIMEOUT_S] [LAST_KEY]');
  process.exit(2);
}
const reps = +(repsArg || 3);
const timeoutMs = 1000 * +(timeoutArg || 180);
const base = url.split('#')[0];
const median = (a) => {
  const s = a.filter((x) => x != null).sort((x, y) => x - y);
  return s.length ? s[Math.floor((s.length - 1) / 2)] : null;
};

const browser = await launch();
const rows = [];
for (let i = 0; i < reps; i++) {
  const page = await newPage(browser);
  await page.evaluateOnNewDocument(() => {
    window.__longtasks = [];
    try {
      new PerformanceObserver((l) => {
        for (const e of l.getEntries()) window.__longtasks.push([e.startTime, e.duration]);
      }).observe({ type: 'longtask', buffered: true });
    } catch (e) {
      /* no longtask API */
    }
  });
  const row = { first_chart_ms: null, run_json_ms: null, longest_task_ms: null, blocked_ms: null, cells: null, filter_ms: null };
  const t0 = Date.now();
  await page.goto(base + `#/run/${encodeURIComponent(runId)}`, { waitUntil: 'domcontentloaded' });
  try {
    row.first_chart_ms = await page
      .waitForFunction(
        () => {
          const e = performance.getEntriesByName('tandem:first-chart')[0];
          return e ? e.startTime : false;
        },
        { timeout: timeoutMs, polling: 50 },
      )
      .then((h) => h.jsonValue());
  } catch (e) {
    row.first_chart_ms = null; // did not come
  }
  if (row.first_chart_ms == null) {
    row.note = `no chart after ${((Date.now() - t0) / 1000).toFixed(0)} s`;
    rows.push(row);
    await page.close().catch(() => {});
    continue;
  }
  await sleep(1000);
  const m = await page.evaluate((first) => {
    const r = performance.getEntriesByType('resource').find((e) => /\/api\/runs\/[^/?]+(\?|$)/.test(e.name));
    const lt = (window.__longtasks || []).filter((t) => t[0] < first + 1000);
    return {
      run_json_ms: r ? r.responseEnd - r.startTime : null,
      longest_task_ms: lt.reduce((a, t) => Math.max(a, t[1]), 0),
      blocked_ms: lt.reduce((a, t) => a + Math.max(0, t[1] - 50), 0),
      cells: document.querySelectorAll('figure.chart').length,
      filter: !!document.querySelector('#key-filter'),
      keys: document.querySelector('#key-count')?.textContent || '',
    };
  }, row.first_chart_ms);
  Object.assign(row, m);
  if (m.filter && lastKey) {
    // The run's last key (bench_ui_keys.sh knows it): typed into the filter box, its chart drawn.
    const key = lastKey;
    const f0 = await page.evaluate(() => performance.now());
    await page.$eval(
      '#key-filter',
      (el, k) => {
        el.value = k;
        el.dispatchEvent(new Event('input'));
      },
      key,
    );
    await page.waitForFunction(
      (k) => {
        const el = document.querySelector(`figure.chart[data-key="${k}"]`);
        return el && +el.dataset.points > 0 && el.querySelector('canvas');
      },
      { timeout: 60000, polling: 10 },
      key,
    );
    row.filter_ms = (await page.evaluate(() => performance.now())) - f0;
  }
  rows.push(row);
  await page.close();
}
await browser.close();
const pick = (k) => median(rows.map((r) => r[k]));
const res = {
  first_chart_ms: pick('first_chart_ms'),
  run_json_ms: pick('run_json_ms'),
  longest_task_ms: pick('longest_task_ms'),
  blocked_ms: pick('blocked_ms'),
  cells: pick('cells'),
  filter_ms: pick('filter_ms'),
  tabs: rows.length,
  notes: rows.map((r) => r.note).filter(Boolean),
};
for (const r of rows) console.log(JSON.stringify(r));
console.log('result: ' + JSON.stringify(res));
