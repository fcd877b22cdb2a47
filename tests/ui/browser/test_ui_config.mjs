// Issue 33's runs table, compare view and chart nits in a real browser (headless chromium through
// puppeteer-core), against the real server over a store made by real `tandem run`s
// (test_ui_config.sh). Every expected value is computed here from the runs' own files (run.json's
// params, sdk.json's config, the metrics files), never taken from the server's answers.
//
//   node test_ui_config.mjs URL QUIET_RUN   (TANDEM_HOME = the store; TANDEM_UI_SHOTS = where the
//                                            1024 and 1280 px screenshots go)
//
// Runs: tiny-1 (lr 0.1, a 2-hour gap in its wall times), tiny-2 (lr 0.3), tiny-3 (lr 0.03):
// params of a workflow, fractions for accuracies; hf-1: the SDK's config (lr 0.05, warmup_steps,
// optim.name) and HF's key names; pct-1: the SDK's config (lr 0.2) and test/acc in percent, as
// tandem train logs it, and final/acc once; QUIET_RUN: live, silent after its first line.
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { launch, newPage, sleep } from './chromium.mjs';

const url = process.argv[2];
const quiet = process.argv[3];
const home = process.env.TANDEM_HOME;
const shots = process.env.TANDEM_UI_SHOTS || '/tmp';
if (!url || !home || !quiet) {
  console.error('usage: TANDEM_HOME=STORE node test_ui_config.mjs URL QUIET_RUN');
  process.exit(2);
}
const base = url.split('#')[0];
const runsDir = join(home, '.tandem', 'runs');
let failed = 0;
let page;

function check(cond, what) {
  if (!cond) throw new Error(what);
}
async function step(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    if (page && page.errors.length) throw new Error(page.errors.splice(0).join('\n'));
    console.log(`ok - ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}\n  ${String(e.stack || e).split('\n').join('\n  ')}`);
    if (page) {
      const f = join(process.env.TANDEM_UI_FAILSHOTS || '/tmp', `ui-fail-${name.replace(/\W+/g, '-')}.png`);
      try {
        await page.screenshot({ path: f });
        console.log(`  screenshot: ${f}`);
      } catch (e2) {
        /* closed */
      }
    }
  }
}
const go = async (hash) => page.goto(base + hash, { waitUntil: 'domcontentloaded' });
const waitFor = (fn, arg, timeout = 20000) => page.waitForFunction(fn, { timeout, polling: 50 }, arg);

/* ---- the reference: each run's config from its own files ---- */
const runs = {};
for (const id of readdirSync(runsDir)) {
  const rec = JSON.parse(readFileSync(join(runsDir, id, 'run.json'), 'utf8'));
  const params = typeof rec.params === 'string' ? JSON.parse(rec.params) : rec.params || {};
  const sdkPath = join(runsDir, id, 'sdk.json');
  const config = existsSync(sdkPath) ? JSON.parse(readFileSync(sdkPath, 'utf8')).config || {} : {};
  const flat = {};
  const walk = (o, pre) => {
    for (const [k, v] of Object.entries(o)) {
      if (v && typeof v === 'object' && !Array.isArray(v)) walk(v, pre + k + '.');
      else if (!(pre + k in flat)) flat[pre + k] = v;
    }
  };
  walk(params, '');
  walk(config, '');
  runs[id] = { id, flat };
}
const ids = Object.keys(runs);
const lrOf = (id) => runs[id].flat.lr;
/* The min / max of a key over a run's metrics files. */
function extreme(id, key, which) {
  let best = null;
  const dir = join(runsDir, id, 'metrics');
  for (const f of readdirSync(dir)) {
    if (!/^rank-\d+\.jsonl$/.test(f)) continue;
    for (const line of readFileSync(join(dir, f), 'utf8').split('\n')) {
      if (!line.includes(key)) continue;
      let o;
      try {
        o = JSON.parse(line);
      } catch (e) {
        continue;
      }
      const v = o[key] ?? (o.key === key ? o.value : undefined);
      if (typeof v !== 'number') continue;
      if (best == null || (which === 'min' ? v < best : v > best)) best = v;
    }
  }
  return best;
}

const rowIds = () => page.$$eval('#runs tbody tr[data-run]', (trs) => trs.map((t) => t.dataset.run));
async function setFilter(text) {
  await page.$eval(
    '#runs-filter',
    (el, text) => {
      el.value = text;
      el.dispatchEvent(new Event('input'));
    },
    text,
  );
}

const browser = await launch();
page = await newPage(browser);

await step('the runs table has a column per differing config key, with each run’s value', async () => {
  await go('#/');
  await waitFor((n) => document.querySelectorAll('#runs tbody tr[data-run]').length >= n, ids.length);
  check(await page.$('th[data-col="hp:lr"]'), 'an lr column (lr differs between the runs)');
  const cells = await page.$$eval('#runs tbody tr[data-run]', (trs) =>
    Object.fromEntries(trs.map((t) => [t.dataset.run, t.querySelector('td[data-hp="lr"]')?.textContent ?? null])),
  );
  for (const id of ids) {
    const want = lrOf(id) == null ? '' : String(lrOf(id));
    check(cells[id] === want, `${id}: lr cell '${cells[id]}', its records say '${want}' (${JSON.stringify(cells)})`);
  }
  // A param of a command's workflow (tiny) and an SDK config key (hf-1) both: one namespace.
  check(cells['tiny-2'] === '0.3' && cells['hf-1'] === '0.05', `params and SDK config: ${JSON.stringify(cells)}`);
});

await step('sort by a config key: numerically, runs without it last', async () => {
  const want = ids
    .filter((id) => typeof lrOf(id) === 'number')
    .sort((a, b) => lrOf(a) - lrOf(b));
  const none = ids.filter((id) => typeof lrOf(id) !== 'number');
  await page.click('th[data-col="hp:lr"] button.sort');
  let order = await rowIds();
  check(order.join() === [...want, ...none].join(), `ascending by lr: ${order}, expected ${[...want, ...none]}`);
  await page.click('th[data-col="hp:lr"] button.sort');
  order = await rowIds();
  check(
    order.join() === [...want.slice().reverse(), ...none].join(),
    `descending by lr, the runs without lr still last: ${order}`,
  );
});

await step('filter by a config key: =, <, >, a nested SDK key, text', async () => {
  const cases = [
    ['lr=0.3', (f) => f.lr === 0.3],
    ['lr>0.1', (f) => typeof f.lr === 'number' && f.lr > 0.1],
    ['lr<=0.05', (f) => typeof f.lr === 'number' && f.lr <= 0.05],
    ['optim.name=adamw', (f) => f['optim.name'] === 'adamw'],
    ['lr>0.01 tiny', (f, id) => f.lr > 0.01 && id.startsWith('tiny')],
  ];
  for (const [text, pred] of cases) {
    const want = ids.filter((id) => pred(runs[id].flat, id)).sort();
    check(want.length > 0, `${text} selects something (a useless case otherwise)`);
    await setFilter(text);
    await waitFor((n) => document.querySelectorAll('#runs tbody tr[data-run]').length === n, want.length);
    const got = (await rowIds()).sort();
    check(got.join() === want.join(), `filter '${text}': ${got}, expected ${want}`);
  }
  await setFilter('lr>fast');
  await waitFor(() => document.querySelector('#filter-note').textContent.includes('compare numbers'));
  await setFilter('');
  await waitFor((n) => document.querySelectorAll('#runs tbody tr[data-run]').length === n, ids.length);
});

await step('metric columns come from what the runs logged; units are stated', async () => {
  const cols = await page.$$eval('#runs th.metric', (ths) => ths.map((t) => t.dataset.col));
  // train/loss and test/acc are the most common loss and accuracy (tiny-1..3 and pct-1 log them).
  check(cols.includes('last:train/loss') && cols.includes('last:test/acc'), `metric columns: ${cols}`);
  const head = await page.$eval('th[data-col="last:test/acc"]', (th) => th.textContent);
  check(head.includes('mixed'), `test/acc is a percent in pct-1 and a fraction in tiny-*: the header says so: ${head}`);
  const pct = await page.$eval('tr[data-run="pct-1"] td[data-metric="test/acc"]', (td) => td.textContent);
  const frac = await page.$eval('tr[data-run="tiny-1"] td[data-metric="test/acc"]', (td) => td.textContent);
  check(pct.includes('%') && !frac.includes('%'), `each cell says its unit when mixed: pct-1 '${pct}', tiny-1 '${frac}'`);
  const best = extreme('tiny-1', 'train/loss', 'min');
  const cell = await page.$eval('tr[data-run="tiny-1"] td[data-metric="train/loss"]', (td) => td.textContent);
  check(cell.includes(`best ${+best.toPrecision(5)}`), `tiny-1's best train/loss ${best}: '${cell}'`);
});

await step('a picked metric column is kept (localStorage) and states its unit', async () => {
  await page.click('#metric-picker summary');
  await page.type('#picker-filter', 'eval_acc');
  // Found and clicked in one task of the page: the list re-renders as the filter and the live
  // refresh update it, and puppeteer's click of a node found a moment before once hit a
  // detached one ("Node is either not clickable or not an Element").
  await waitFor(() => {
    const box = document.querySelector('#metric-picker input[value="eval_accuracy"]');
    if (box && !box.checked) box.click();
    return box && box.checked;
  });
  await waitFor(() => document.querySelector('th[data-col="last:eval_accuracy"]'));
  await go('#/');
  await page.reload({ waitUntil: 'domcontentloaded' });
  await waitFor(() => document.querySelector('th[data-col="last:eval_accuracy"]'));
  const head = await page.$eval('th[data-col="last:eval_accuracy"]', (th) => th.textContent);
  check(head.includes('fraction'), `eval_accuracy is a fraction in hf-1: ${head}`);
  const saved = await page.evaluate(() => JSON.parse(localStorage.getItem('tandem.ui.settings')).columns);
  check(saved && saved.includes('eval_accuracy'), `kept in localStorage: ${JSON.stringify(saved)}`);
  const v = await page.$eval('tr[data-run="hf-1"] td[data-metric="eval_accuracy"] .last', (e) => e.textContent);
  check(Math.abs(+v - 0.88) < 1e-9, `hf-1's last eval_accuracy (0.5 + 19 * 0.02): ${v}`);
  // Back to the automatic columns.
  await page.click('#metric-picker summary');
  await page.click('#metric-picker button.auto');
  await waitFor(() => !document.querySelector('th[data-col="last:eval_accuracy"]'));
  const back = await page.evaluate(() => JSON.parse(localStorage.getItem('tandem.ui.settings')).columns);
  check(back === null, `automatic again: ${back}`);
  await page.click('h1'); // a click elsewhere closes the picker
  await waitFor(() => !document.querySelector('#metric-picker').open);
});

await step('a live run that logs nothing shows "silent for N"', async () => {
  await waitFor(
    (id) => {
      const b = document.querySelector(`tr[data-run="${id}"] [data-silent]`);
      return b && /^silent for \d+ (s|min)$/.test(b.textContent);
    },
    quiet,
    60000,
  );
  const st = await page.$eval(`tr[data-run="${quiet}"] .badge`, (b) => b.textContent);
  check(st === 'running', `still running underneath: ${st}`);
  check(!(await page.$('tr[data-run="tiny-1"] [data-silent]')), 'a finished run is never silent');
});

await step('the runs table fits its box at 1024 and 1280 px (screenshots)', async () => {
  for (const width of [1024, 1280]) {
    await page.setViewport({ width, height: 800, deviceScaleFactor: 1 });
    await sleep(100); // one layout; the measure below is what decides
    await waitFor(() => document.querySelectorAll('#runs tbody tr').length > 0);
    const m = await page.evaluate(() => {
      const wrap = document.querySelector('#runs-wrap');
      const table = document.querySelector('#runs');
      return {
        scroll: wrap.scrollWidth,
        client: wrap.clientWidth,
        table: table.getBoundingClientRect().width,
        doc: document.documentElement.scrollWidth,
        cols: document.querySelectorAll('#runs thead th').length,
        hp: document.querySelectorAll('#runs thead th.hp').length,
        metric: document.querySelectorAll('#runs thead th.metric').length,
      };
    });
    console.log(`  ${width} px: table ${m.table.toFixed(0)} px in a ${m.client} px box, ${m.cols} columns`);
    check(m.scroll <= m.client + 1, `${width} px: the table overflows its box (${m.scroll} > ${m.client})`);
    check(m.doc <= width + 1, `${width} px: the page scrolls sideways (${m.doc})`);
    check(m.hp === 4 && m.metric === 3, `the widest automatic table: 4 config and 3 metric columns (${m.hp}, ${m.metric})`);
    await page.screenshot({ path: join(shots, `runs-${width}.png`) });
  }
  await page.setViewport({ width: 1280, height: 800, deviceScaleFactor: 1 });
});

await step('compare: the differing config first, then the rest; the best run in bold', async () => {
  await go('#/compare/tiny-1,tiny-2');
  await waitFor(() => document.querySelectorAll('#compare-params tbody tr').length > 0);
  const rows = await page.$$eval('#compare-params tbody tr', (trs) =>
    trs.map((t) => [t.dataset.param, t.classList.contains('config')]),
  );
  const differ = Object.keys({ ...runs['tiny-1'].flat, ...runs['tiny-2'].flat })
    .filter((k) => runs['tiny-1'].flat[k] !== runs['tiny-2'].flat[k])
    .sort();
  const firstMeta = rows.findIndex((r) => !r[1]);
  const config = rows.slice(0, firstMeta < 0 ? rows.length : firstMeta).map((r) => r[0]);
  check(config.join() === differ.join(), `the differing config first: ${config}, expected ${differ} (${JSON.stringify(rows)})`);
  check(rows.slice(config.length).every((r) => !r[1]), `no config row after the others: ${JSON.stringify(rows)}`);
  // Everything shown: the config first (the differing keys at its top), start and duration
  // after it, never before.
  await page.click('#only-diff');
  await waitFor(() => document.querySelector('#compare-params tr[data-param="started"]'));
  const all = await page.$$eval('#compare-params tbody tr', (trs) =>
    trs.map((t) => [t.dataset.param, t.classList.contains('config')]),
  );
  const lastConfig = all.map((r) => r[1]).lastIndexOf(true);
  const started = all.findIndex((r) => r[0] === 'started'),
    duration = all.findIndex((r) => r[0] === 'duration');
  check(started > lastConfig && duration > lastConfig, `start and duration after the config: ${JSON.stringify(all)}`);
  check(
    all.slice(0, differ.length).map((r) => r[0]).join() === differ.join(),
    `the differing keys lead: ${JSON.stringify(all)}`,
  );
  check(all.some((r) => r[0] === 'steps' && r[1]), `equal config shown without "only what differs": ${JSON.stringify(all)}`);
  await page.click('#only-diff');
  // Bold: the run with the lowest train/loss and the one with the highest train/acc, once each.
  await waitFor(() => document.querySelector('#compare-metrics tr[data-metric="train/loss"]'));
  for (const [key, which] of [
    ['train/loss', 'min'],
    ['train/acc', 'max'],
  ]) {
    const a = extreme('tiny-1', key, which),
      b = extreme('tiny-2', key, which);
    const want = (which === 'min' ? a < b : a > b) ? 'tiny-1' : 'tiny-2';
    const bold = await page.$$eval(`#compare-metrics tr[data-metric="${key}"] td.best`, (tds) =>
      tds.map((t) => t.dataset.bestRun),
    );
    check(bold.length === 1 && bold[0] === want, `${key}: bold ${JSON.stringify(bold)}, the best run is ${want}`);
  }
  await page.screenshot({ path: join(shots, 'compare-1280.png') });
});

await step('compare an SDK run with a workflow run: the config keys of both, differing first', async () => {
  await go('#/compare/tiny-1,hf-1');
  await waitFor(() => document.querySelectorAll('#compare-params tbody tr').length > 0);
  const rows = await page.$$eval('#compare-params tbody tr', (trs) => trs.map((t) => t.dataset.param));
  for (const k of ['lr', 'warmup_steps', 'optim.name', 'steps'])
    check(rows.indexOf(k) >= 0 && rows.indexOf(k) < rows.indexOf('workflow'), `${k} before workflow: ${rows}`);
});

await step('chart nits: no "Show 0 more", "1 point", seconds on system charts', async () => {
  await go('#/run/pct-1');
  await waitFor(() => +(document.querySelector('[data-key="final/acc"]')?.dataset.points || 0) === 1);
  const info = await page.$eval('[data-key="final/acc"] .info', (e) => e.textContent);
  check(info === '1 point', `caption: '${info}'`);
  const more = await page.$$eval('button.more', (bs) =>
    bs.filter((b) => b.offsetParent !== null).map((b) => b.textContent),
  );
  check(more.length === 0, `no visible "Show more" button: ${JSON.stringify(more)}`);
  await go(`#/run/${quiet}`);
  await waitFor(() => document.querySelector('[data-key="sys/cpu_percent"] canvas'), null, 60000);
  const x = await page.$eval('[data-key="sys/cpu_percent"] .u-legend .u-series th', (th) => th.textContent.trim());
  check(x === 'seconds', `the system chart's x is seconds: '${x}'`);
  const silent = await page.$eval('#run-silent', (e) => e.textContent);
  check(/^silent for \d+ (s|min)$/.test(silent), `the quiet run's page says it is silent: '${silent}'`);
  await page.$eval('[data-key="sys/cpu_percent"]', (el) => el.scrollIntoView());
  await page.screenshot({ path: join(shots, 'run-sys-1280.png') });
});

await step('wall-time axis: a gap breaks the line, ISO dates', async () => {
  await go('#/run/tiny-1');
  await waitFor(() => document.querySelector('[data-key="train/loss"] canvas'));
  await page.click('input[name="xaxis"][value="time"]');
  await waitFor(() => {
    const el = document.querySelector('[data-key="train/loss"]');
    return el && el.__u && el.__u.scales.x.time && el.__u.data[0].length > 0;
  });
  const nulls = await page.$eval('[data-key="train/loss"]', (el) => el.__u.data[1].filter((v) => v === null).length);
  check(nulls === 1, `one break in tiny-1's train/loss (the two-hour gap): ${nulls}`);
  const legendX = await page.$eval('[data-key="train/loss"] .u-legend .u-series td', (td) => td.textContent.trim());
  check(/^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$/.test(legendX), `legend time ISO: '${legendX}'`);
  const ticks = await page.evaluate(() => {
    const t = new Date(2026, 10, 29, 14, 5, 0).getTime() / 1000;
    return [window.tandemUi.isoTicks(null, [t, t + 3600], 0, 50, 3600), window.tandemUi.isoTicks(null, [t, t + 86400], 0, 50, 86400)];
  });
  check(ticks[0][0] === '2026-11-29\n14:05' && ticks[0][1] === '15:05', `hour ticks: ${JSON.stringify(ticks[0])}`);
  check(ticks[1].join() === '2026-11-29,2026-11-30', `day ticks: ${JSON.stringify(ticks[1])}`);
  await go('#/run/tiny-2');
  await waitFor(() => {
    const el = document.querySelector('[data-key="train/loss"]');
    return el && el.__u && el.__u.scales.x.time && el.__u.data[0].length > 0;
  });
  const none = await page.$eval('[data-key="train/loss"]', (el) => el.__u.data[1].filter((v) => v === null).length);
  check(none === 0, `no break without a gap (tiny-2): ${none}`);
  await page.evaluate(() => localStorage.removeItem('tandem.ui.settings'));
});

await browser.close();
if (failed) {
  console.log(`FAIL: ${failed} check(s) failed`);
  process.exit(1);
}
console.log('PASS');
