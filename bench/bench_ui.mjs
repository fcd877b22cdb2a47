// `tandem ui` in headless chromium (the browser test's own invocation, tests/ui/browser/
// chromium.mjs) over the benchmark store of bench/ui_store_gen.c. bench_ui.sh makes the store
// and starts the server; this script gets the printed URL and the big run's id.
//
//   node bench/bench_ui.mjs URL BIG_RUN_ID [REPS]
//
// Measures, each REPS times in a fresh tab (the browser, its HTTP cache and the server stay):
//   runs table      navigation start -> the table's rows rendered (performance mark
//                   tandem:runs-table), and the /api/runs response time;
//   first chart     navigation start -> the first chart of the big run drawn on its canvas
//                   (mark tandem:first-chart, set by uPlot's draw hook);
//   all charts      navigation start -> every chart of the page drawn (scrolled into sight);
//   points          the most points one /series response carried (what a chart receives);
//   zoom            a drag over a quarter of train/loss -> that range refetched and drawn.
import { launch, newPage, sleep } from '../tests/ui/browser/chromium.mjs';

const [url, bigId, repsArg] = process.argv.slice(2);
if (!url || !bigId) {
  console.error('usage: node bench/bench_ui.mjs URL BIG_RUN_ID [REPS]');
  process.exit(2);
}
const reps = +(repsArg || 5);
const base = url.split('#')[0];
const median = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor((s.length - 1) / 2)];
};
const fmt = (a) =>
  `median ${median(a).toFixed(0)} ms (min ${Math.min(...a).toFixed(0)}, max ${Math.max(...a).toFixed(0)}, first ${a[0].toFixed(0)})`;

const browser = await launch();
const out = { runs_table_ms: [], runs_api_ms: [], first_chart_ms: [], all_charts_ms: [], zoom_ms: [] };
let maxPoints = 0,
  maxPerRank = 0,
  charts = 0,
  series = 0,
  maxBytes = 0;

const markTime = (page, name, timeout = 30000) =>
  page
    .waitForFunction(
      (n) => {
        const e = performance.getEntriesByName(n)[0];
        return e ? e.startTime : false;
      },
      { timeout, polling: 10 },
      name,
    )
    .then((h) => h.jsonValue());

for (let i = 0; i < reps; i++) {
  const page = await newPage(browser);
  await page.goto(base + '#/', { waitUntil: 'domcontentloaded' });
  out.runs_table_ms.push(await markTime(page, 'tandem:runs-table'));
  const rows = await page.$$eval('tr[data-run]', (t) => t.length);
  if (rows < 100) throw new Error(`the runs table has ${rows} rows, expected 100`);
  out.runs_api_ms.push(
    await page.evaluate(() => {
      const e = performance.getEntriesByType('resource').find((r) => r.name.includes('/api/runs?'));
      return e ? e.responseEnd - e.startTime : NaN;
    }),
  );
  await page.close();
}

for (let i = 0; i < reps; i++) {
  const page = await newPage(browser);
  const sizes = [];
  page.on('response', async (r) => {
    if (!r.url().includes('/series?')) return;
    try {
      const body = await r.text();
      const d = JSON.parse(body);
      const per = (d.series || []).map((s) => s.x.length);
      sizes.push({ total: per.reduce((a, b) => a + b, 0), max: Math.max(0, ...per), bytes: body.length });
    } catch (e) {
      /* page closed */
    }
  });
  await page.goto(base + `#/run/${encodeURIComponent(bigId)}`, { waitUntil: 'domcontentloaded' });
  out.first_chart_ms.push(await markTime(page, 'tandem:first-chart'));
  // Every chart: scroll through the page so the lazy ones load too.
  const n = await page.$$eval('[data-key]', (els) => els.length);
  for (let y = 0; y < 20; y++) {
    await page.evaluate(() => window.scrollBy(0, 700));
    await sleep(50);
  }
  await page.waitForFunction(
    () =>
      [...document.querySelectorAll('[data-key]')].every(
        (el) => +el.dataset.points > 0 && el.querySelector('canvas'),
      ),
    { timeout: 60000, polling: 20 },
  );
  out.all_charts_ms.push(await page.evaluate(() => performance.now()));
  charts = n;
  // The zoom: drag over the second quarter of train/loss.
  await page.evaluate(() => {
    window.scrollTo(0, 0);
  });
  await sleep(100);
  const el = await page.$('[data-key="train/loss"] .u-over');
  const box = await el.boundingBox();
  await page.mouse.move(box.x + box.width * 0.25, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height / 2, { steps: 4 });
  const t0 = await page.evaluate(() => performance.now());
  await page.mouse.up();
  await page
    .waitForFunction(() => document.querySelector('[data-key="train/loss"]').classList.contains('loading'), {
      timeout: 5000,
      polling: 5,
    })
    .catch(() => {});
  await page.waitForFunction(
    () => !document.querySelector('[data-key="train/loss"]').classList.contains('loading'),
    { timeout: 30000, polling: 5 },
  );
  out.zoom_ms.push((await page.evaluate(() => performance.now())) - t0);
  await sleep(200);
  for (const s of sizes) {
    maxPoints = Math.max(maxPoints, s.total);
    maxPerRank = Math.max(maxPerRank, s.max);
    maxBytes = Math.max(maxBytes, s.bytes);
  }
  series = sizes.length;
  if (page.errors.length) throw new Error(page.errors.join('\n'));
  await page.close();
}
await browser.close();

console.log(`tandem ui benchmark, ${reps} tabs each (headless chromium, 1280x800)`);
console.log(`runs table (100 runs) rendered:   ${fmt(out.runs_table_ms)}   target <= 500 ms`);
console.log(`  /api/runs response:             ${fmt(out.runs_api_ms)}`);
console.log(`first chart of ${bigId} drawn:     ${fmt(out.first_chart_ms)}   target <= 1000 ms`);
console.log(`all ${charts} charts drawn:              ${fmt(out.all_charts_ms)}`);
console.log(`zoom to a quarter, redrawn:       ${fmt(out.zoom_ms)}`);
console.log(
  `points per chart (one /series):   max ${maxPoints} (max ${maxPerRank} per rank), largest response ${(maxBytes / 1024).toFixed(0)} KiB, ${series} requests per page`,
);
console.log(
  'result: ' +
    JSON.stringify({
      runs_table_ms: median(out.runs_table_ms),
      runs_api_ms: median(out.runs_api_ms),
      first_chart_ms: median(out.first_chart_ms),
      all_charts_ms: median(out.all_charts_ms),
      zoom_ms: median(out.zoom_ms),
      max_points_per_chart: maxPoints,
      max_points_per_rank: maxPerRank,
      charts,
    }),
);
