// Issue 31's cost in a real browser (headless chromium through puppeteer-core) against the real
// server (test_ui_cost.sh). The expected dollars are computed here from the run's own files
// (RUN/instances.json's prices and lifetimes, the metrics file's point times), never taken from
// the server's answers.
//
//   node test_ui_cost.mjs URL   (TANDEM_HOME = the store: cloud-1 with an instance record,
//                                plain-1 without)
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { launch, newPage } from './chromium.mjs';

const url = process.argv[2];
const home = process.env.TANDEM_HOME;
if (!url || !home) {
  console.error('usage: TANDEM_HOME=STORE node test_ui_cost.mjs URL');
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
const waitFor = (fn, arg, timeout = 30000) => page.waitForFunction(fn, { timeout, polling: 50 }, arg);

/* ---- the reference: price x hours from the record, at each point's time ---- */
const recordOf = (id) => JSON.parse(readFileSync(join(runsDir, id, 'instances.json'), 'utf8'));
const record = recordOf('cloud-1');
function dollarsAt(t, rec = record) {
  let usd = 0;
  for (const i of rec.instances) {
    if (!i.usd_per_hour) continue;
    const end = Math.min(i.ended_s, t);
    if (end > i.launched_s) usd += (i.usd_per_hour * (end - i.launched_s)) / 3600;
  }
  return usd;
}
/* Each train/loss point of a run at the dollars its record says it had cost by the point's time. */
function pointsOf(id) {
  const rec = recordOf(id);
  const out = [];
  for (const f of readdirSync(join(runsDir, id, 'metrics')))
    if (f.startsWith('rank-'))
      for (const line of readFileSync(join(runsDir, id, 'metrics', f), 'utf8').split('\n'))
        if (line.trim()) {
          const o = JSON.parse(line);
          if (o['train/loss'] != null) out.push({ x: dollarsAt(o.time, rec), y: o['train/loss'] });
        }
  return out;
}
/* How many plotted (x, y) pairs are not a point of the reference (same loss at the same dollars). */
function offPoints(xs, ys, ref) {
  const off = [];
  for (let k = 0; k < xs.length; k++) {
    const p = ref.find((q) => q.y === ys[k]);
    if (!p || Math.abs(p.x - xs[k]) > 1e-9 * Math.max(1, p.x)) off.push(`loss ${ys[k]} at $${xs[k]}, want $${p && p.x}`);
  }
  return off;
}
const points = pointsOf('cloud-1');
const total = dollarsAt(Infinity);
const money = (v) => '$' + v.toFixed(2);

const browser = await launch();
page = await newPage(browser);

await step('the runs table: a Cost column, $X.XX for the cloud run and — for the other', async () => {
  await go('#/'); // a fresh browser: the x axis setting is the default (step)
  await waitFor(() => document.querySelectorAll('#runs tbody tr[data-run]').length >= 3);
  check(await page.$('th[data-col="cost"]'), 'a Cost column (a listed run has a priced instance)');
  const cell = (id) =>
    page.$eval(`#runs tbody tr[data-run="${id}"] td.col-cost`, (td) => [td.textContent.trim(), td.title]);
  const [cloud, tip] = await cell('cloud-1');
  check(cloud === money(total), `cloud-1's cost ${cloud}, want ${money(total)} (price x hours of its record)`);
  check(/without a price/.test(tip), `the tooltip says an instance had no price: '${tip}'`);
  const [plain] = await cell('plain-1');
  check(plain === '—', `plain-1 (no instance record) shows —, got '${plain}'`);
});

await step('the run page: the cost with each instance and its price in the tooltip', async () => {
  await go('#/run/cloud-1');
  await waitFor(() => document.querySelector('#run-cost'));
  const [text, tip] = await page.$eval('#run-cost', (e) => [e.textContent.trim(), e.title]);
  check(text === money(total), `the run page's cost ${text}, want ${money(total)}`);
  for (const i of record.instances) {
    check(tip.includes(i.id), `the tooltip names ${i.id}: '${tip}'`);
    if (i.usd_per_hour) check(tip.includes(`$${i.usd_per_hour}/h`), `the tooltip has ${i.id}'s price: '${tip}'`);
  }
});

await step('the cost axis: each point at the dollars accrued by its time', async () => {
  await waitFor(() => document.querySelector('input[name="xaxis"][value="cost"]'));
  await page.click('input[name="xaxis"][value="cost"]');
  await waitFor(
    (n) => {
      const el = document.querySelector('[data-key="train/loss"]');
      return el && el.__u && !el.__u.scales.x.time && el.__u.data[0].length === n && el.__u.series[0].label === 'cost';
    },
    points.length,
  );
  const [xs, ys] = await page.$eval('[data-key="train/loss"]', (el) => [Array.from(el.__u.data[0]), Array.from(el.__u.data[1])]);
  check(xs.length === points.length, `${xs.length} points plotted, want ${points.length}`);
  /* Matched by value: a point is right when a metrics line has its loss at its dollars. */
  const off = offPoints(xs, ys, points);
  check(!off.length, `${off.length} points off their dollars: ${off.slice(0, 3).join('; ')}`);
  const last = points[points.length - 1].x;
  check(Math.abs(xs[xs.length - 1] - last) < 1e-9, `the last point at $${xs[xs.length - 1]}, want $${last}`);
  /* the gap between the two instances bills nothing: points in it share their x */
  const flat = points.filter((p) => Math.abs(p.x - dollarsAt(1700000030)) < 1e-12).length;
  check(flat >= 5, `points between the instances at one cost: ${flat}`);
});

await step('a run without a priced instance has no cost axis (its charts stay on step)', async () => {
  await go('#/run/plain-1');
  await waitFor(() => {
    const el = document.querySelector('[data-key="train/loss"]');
    return el && el.__u && el.__u.data[0].length > 0;
  });
  check(!(await page.$('input[name="xaxis"][value="cost"]')), 'no cost choice for plain-1');
  const label = await page.$eval('[data-key="train/loss"]', (el) => el.__u.series[0].label);
  check(label === 'step', `plain-1's x axis is step while the setting says cost: '${label}'`);
  const cost = await page.$eval('#run-cost', (e) => e.textContent).catch(() => null);
  check(cost === null, `no Cost on plain-1's page: '${cost}'`);
});

await step('compare: each run on its own dollars; no cost axis beside a run without a price', async () => {
  await go('#/compare/cloud-1,cloud-2');
  await waitFor(() => document.querySelector('input[name="xaxis"][value="cost"]'));
  const want = { 'cloud-1': pointsOf('cloud-1'), 'cloud-2': pointsOf('cloud-2') };
  /* still on cost (the run page set it): wait for both lines drawn against dollars */
  await waitFor(() => {
    const el = document.querySelector('[data-key="train/loss"]');
    return el && el.__u && el.__u.series[0].label === 'cost' && el.__u.series.length >= 3;
  });
  const lines = await page.$eval('[data-key="train/loss"]', (el) => {
    const u = el.__u;
    const out = {};
    /* uPlot.join: one x for all lines, null where a line has no point; raw lines are the
     * series labelled "(raw)" when smoothing is on */
    u.series.forEach((s, k) => {
      if (!k || !/^cloud-\d( \(raw\))?$/.test(s.label) || (u.series.some((t) => t.label === s.label + ' (raw)'))) return;
      const xs = [],
        ys = [];
      u.data[0].forEach((x, j) => {
        if (u.data[k][j] != null) {
          xs.push(x);
          ys.push(u.data[k][j]);
        }
      });
      out[s.label.split(' ')[0]] = [xs, ys];
    });
    return out;
  });
  for (const id of ['cloud-1', 'cloud-2']) {
    check(lines[id], `a line for ${id}: ${Object.keys(lines)}`);
    const [xs, ys] = lines[id];
    /* lines joined on one x (uPlot.join) keep one point per dollar figure: the points of a
     * stretch with nothing billing (cloud-1's 10 s gap) share one */
    const distinct = new Set(want[id].map((p) => p.x)).size;
    check(new Set(xs).size === distinct, `${id}: ${new Set(xs).size} distinct dollar figures, want ${distinct}`);
    const off = offPoints(xs, ys, want[id]);
    check(!off.length, `${id}: ${off.length} points off its dollars: ${off.slice(0, 3).join('; ')}`);
  }
  await go('#/compare/cloud-1,plain-1');
  await waitFor(() => {
    const el = document.querySelector('[data-key="train/loss"]');
    return el && el.__u && el.__u.data[0].length > 0;
  });
  check(!(await page.$('input[name="xaxis"][value="cost"]')), 'no cost choice when plain-1 is compared');
  const label = await page.$eval('[data-key="train/loss"]', (el) => el.__u.series[0].label);
  check(label === 'step', `the compare view stays on step: '${label}'`);
});

await browser.close();
if (failed) {
  console.log(`FAIL: ${failed} check(s) failed`);
  process.exit(1);
}
console.log('PASS');
