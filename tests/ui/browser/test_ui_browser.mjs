// The page of `tandem ui` in a real browser (headless chromium through puppeteer-core), against
// the real server over a store made by real `tandem run`s. test_ui_browser.sh makes the store
// and starts the server; this script gets the printed URL.
//
//   node test_ui_browser.mjs URL      (TANDEM_HOME = the store; TANDEM_UI_SHOTS = a directory
//                                      for the run page and compare view screenshots;
//                                      TANDEM_UI_DEBUG=1 prints the page's event streams)
//
// Runs: tiny-1 (lr 0.1) and tiny-2 (lr 0.3) finished; tiny-3 running (it waits for the test),
// 2 ranks each writing train/loss, train/acc, test/acc and lr, printing log lines; rank 0 writes
// final/acc once, at the end (a chart of one point).
import { createHash } from 'node:crypto';
import { appendFileSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { launch, newPage, sleep } from './chromium.mjs';

const url = process.argv[2];
const home = process.env.TANDEM_HOME;
const shots = process.env.TANDEM_UI_SHOTS || '';
if (!url || !home) {
  console.error('usage: TANDEM_HOME=STORE node test_ui_browser.mjs URL');
  process.exit(2);
}
const base = url.split('#')[0];
// Every request needs the token, on loopback too: the page gets it from its URL (and the cookie
// that URL sets); requests made here beside the page send it as a header.
const token = new URL(url).searchParams.get('token');
const bare = base.replace(/\?token=[^#]*/, '');
const runDir = (id) => join(home, '.tandem', 'runs', id);
const results = {};
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
    console.log(
      `not ok - ${name}\n  ${String(e.stack || e)
        .split('\n')
        .join('\n  ')}`,
    );
    if (page) {
      const f = join(process.env.TANDEM_UI_FAILSHOTS || '/tmp', `ui-fail-${name.replace(/\W+/g, '-')}.png`);
      try {
        await page.screenshot({ path: f });
        console.log(`  screenshot: ${f}`);
      } catch (e2) {
        /* closed */
      }
      if (page.errors.length) console.log('  ' + page.errors.splice(0).join('\n  '));
    }
  }
}
const go = async (hash) => {
  await page.goto(base + hash, { waitUntil: 'domcontentloaded' });
};
const waitFor = (fn, arg, timeout = 15000) => page.waitForFunction(fn, { timeout, polling: 50 }, arg);

/* Pixels of the chart's canvas close to an RGB colour: a line of that colour was drawn. */
async function pixelsOf(key, rgb) {
  return page.evaluate(
    (key, rgb) => {
      const c = document.querySelector(`[data-key="${key}"] canvas`);
      if (!c) return -1;
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let i = 0; i < d.length; i += 4) {
        if (
          d[i + 3] > 200 &&
          Math.abs(d[i] - rgb[0]) < 40 &&
          Math.abs(d[i + 1] - rgb[1]) < 40 &&
          Math.abs(d[i + 2] - rgb[2]) < 40
        )
          n++;
      }
      return n;
    },
    key,
    rgb,
  );
}
const RANK0 = [0x1f, 0x77, 0xb4],
  RANK1 = [0xff, 0x7f, 0x0e];
const legend = (key) =>
  page.$$eval(`[data-key="${key}"] .u-legend .u-series:not(.raw) th`, (ths) =>
    ths.slice(1).map((t) => t.textContent.trim()),
  );
const points = (key) => page.$eval(`[data-key="${key}"]`, (el) => +(el.dataset.points || 0));
const chartReady = (key) =>
  waitFor((key) => {
    const el = document.querySelector(`[data-key="${key}"]`);
    return el && +el.dataset.points > 0 && el.querySelector('canvas');
  }, key);

const browser = await launch();
page = await newPage(browser);
page.on('dialog', (d) => d.accept());
if (process.env.TANDEM_UI_DEBUG) {
  page.on('console', (m) => console.log(`  [page ${Date.now() % 100000}] ${m.text()}`));
  await page.evaluateOnNewDocument(() => {
    const ES = window.EventSource;
    window.EventSource = function (u) {
      const e = new ES(u);
      ['open', 'error', 'points', 'status', 'log', 'reset', 'runs'].forEach((n) =>
        e.addEventListener(n, (ev) => console.log(`es ${u} ${n} ${(ev.data || '').slice(0, 100)}`)),
      );
      return e;
    };
    window.EventSource.prototype = ES.prototype;
  });
}

await step('runs table lists the runs of the store', async () => {
  await go('#/');
  await waitFor(() => document.querySelectorAll('tr[data-run]').length >= 3);
  const rows = await page.$$eval('tr[data-run]', (trs) =>
    trs.map((tr) => [tr.dataset.run, tr.querySelector('.badge').textContent]),
  );
  const ids = rows.map((r) => r[0]).sort();
  check(
    JSON.stringify(ids) === JSON.stringify(['tiny-1', 'tiny-2', 'tiny-3']),
    `rows: ${JSON.stringify(rows)}`,
  );
  const st = Object.fromEntries(rows);
  check(
    st['tiny-1'] === 'succeeded' && st['tiny-2'] === 'succeeded' && st['tiny-3'] === 'running',
    `statuses: ${JSON.stringify(st)}`,
  );
  // lr differs between the runs: it has a config column (tests/ui/browser/test_ui_config.mjs
  // checks the config columns in detail).
  const txt = await page.$eval('tr[data-run="tiny-2"] td[data-hp="lr"]', (td) => td.textContent);
  check(txt === '0.3', `tiny-2's row shows its lr param: ${txt}`);
  // The last train/loss of tiny-1 (rank 0's last point) is in its row.
  const last = JSON.parse(
    readFileSync(join(runDir('tiny-1'), 'metrics', 'rank-0.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .filter((l) => l.includes('train/loss'))
      .pop(),
  )['train/loss'];
  const row1 = await page.$eval('tr[data-run="tiny-1"]', (tr) => tr.textContent);
  check(row1.includes(String(+last.toPrecision(5))), `tiny-1's row has train/loss ${last}: ${row1}`);
});

await step('filter and sort the runs table', async () => {
  await page.type('#runs-filter', 'lr=0.3');
  await waitFor(() => document.querySelectorAll('tr[data-run]').length === 1);
  check(await page.$('tr[data-run="tiny-2"]'), 'the filter keeps tiny-2');
  await page.$eval('#runs-filter', (el) => {
    el.value = '';
    el.dispatchEvent(new Event('input'));
  });
  await waitFor(() => document.querySelectorAll('tr[data-run]').length === 3);
  // Sort by ID: ascending, then descending.
  const idHeader = 'thead th:nth-child(2) button';
  await page.click(idHeader);
  let order = await page.$$eval('tr[data-run]', (trs) => trs.map((t) => t.dataset.run));
  check(order.join() === 'tiny-1,tiny-2,tiny-3', `ascending by id: ${order}`);
  await page.click(idHeader);
  order = await page.$$eval('tr[data-run]', (trs) => trs.map((t) => t.dataset.run));
  check(order.join() === 'tiny-3,tiny-2,tiny-1', `descending by id: ${order}`);
});

await step('run page draws train/loss with a line per rank', async () => {
  await go('#/run/tiny-1');
  await chartReady('train/loss');
  const n = await points('train/loss');
  check(n > 0, `data-points ${n}`);
  results.run_page_points = n;
  const labels = await legend('train/loss');
  check(
    labels.includes('rank 0') && labels.includes('rank 1'),
    `a line per rank (the ranks differ): ${labels}`,
  );
  const p0 = await pixelsOf('train/loss', RANK0),
    p1 = await pixelsOf('train/loss', RANK1);
  check(p0 > 50 && p1 > 50, `the canvas has rank 0's (${p0}) and rank 1's (${p1}) line pixels`);
  // lr is the same on both ranks: one line.
  await chartReady('lr');
  const lr = await legend('lr');
  check(lr.length === 1 && lr[0] === 'ranks 0,1', `identical ranks drawn once: ${lr}`);
  const status = await page.$eval('#run-status', (el) => el.textContent);
  check(status === 'succeeded', `status badge: ${status}`);
  check(!(await page.$('#stop')), 'no Stop button on a finished run');
});

await step('a metric with one point is drawn (as its point)', async () => {
  await go('#/run/tiny-1');
  await chartReady('final/acc');
  check((await points('final/acc')) === 1, `final/acc has ${await points('final/acc')} points`);
  const px = await pixelsOf('final/acc', RANK0);
  check(px > 10, `the single point drawn: ${px} pixels of rank 0's colour`);
});

await step('smoothing, log scale and wall-time x axis', async () => {
  // Smoothing 0: one series per rank, no raw copy behind it.
  await page.$eval('#smoothing', (el) => {
    el.value = '0';
    el.dispatchEvent(new Event('input'));
  });
  await waitFor(() => document.querySelectorAll('[data-key="train/loss"] .u-legend .u-series').length === 3);
  await page.$eval('#smoothing', (el) => {
    el.value = '0.8';
    el.dispatchEvent(new Event('input'));
  });
  await waitFor(
    () => document.querySelectorAll('[data-key="train/loss"] .u-legend .u-series.raw').length === 2,
  );
  await page.click('#logscale');
  await sleep(200);
  check((await pixelsOf('train/loss', RANK0)) > 50, 'a line on the log scale');
  await page.click('#logscale');
  const before = page.series.length;
  await page.click('input[name=xaxis][value=time]');
  await waitFor(
    () =>
      document.querySelector('[data-key="train/loss"]').dataset.points > 0 &&
      !document.querySelector('[data-key="train/loss"]').classList.contains('loading'),
  );
  await sleep(300);
  const req = page.series.slice(before).find((u) => u.includes('key=train%2Floss'));
  check(req && req.includes('x=time'), `the time axis refetches with x=time: ${req}`);
  check((await pixelsOf('train/loss', RANK0)) > 50, 'a line on the time axis');
  await page.click('input[name=xaxis][value=step]');
  await page.$eval('#smoothing', (el) => {
    el.value = '0.6';
    el.dispatchEvent(new Event('input'));
    el.dispatchEvent(new Event('change'));
  });
  await waitFor(() => document.querySelector('[data-key="train/loss"]').dataset.lastX === '299');
});

await step('drag to zoom refetches the range at the plot width', async () => {
  await chartReady('train/loss');
  const over = await page.$('[data-key="train/loss"] .u-over');
  const box = await over.boundingBox();
  const before = page.series.length;
  await page.mouse.move(box.x + box.width * 0.25, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height / 2, { steps: 5 });
  await page.mouse.up();
  await sleep(500);
  const req = page.series.slice(before).find((u) => u.includes('key=train%2Floss'));
  check(req, 'a /series request after the drag');
  const q = new URL(req).searchParams;
  const from = +q.get('from'),
    to = +q.get('to'),
    width = +q.get('width');
  check(from > 40 && to < 200 && from < to, `from/to cover the dragged quarter: ${from}..${to}`);
  check(Math.abs(width - Math.round(box.width)) <= 2, `width ${width} is the plot's width ${box.width}`);
  await waitFor(() => !document.querySelector('[data-key="train/loss"]').classList.contains('loading'));
  const n = await points('train/loss');
  check(n > 0 && n < 600, `the zoomed chart holds the range's points: ${n}`);
  await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2, { clickCount: 2 });
  await waitFor(() => document.querySelector('[data-key="train/loss"]').dataset.lastX === '299');
});

await step("logs show each rank's last line", async () => {
  await waitFor(() =>
    (document.querySelector('#logs pre') || {}).textContent?.includes('rank 0 finished: the last line'),
  );
  await page.select(
    '#log-rank',
    await page.$$eval('#log-rank option', (os) => os.find((o) => o.textContent === 'rank 1').value),
  );
  await waitFor(() =>
    document.querySelector('#logs pre').textContent.includes('rank 1 finished: the last line'),
  );
  const text = await page.$eval('#logs pre', (el) => el.textContent);
  check(!text.includes('rank 0 finished'), "rank 1's log holds only rank 1's lines");
});

await step('artifacts: size, SHA-256 and a download link', async () => {
  const file = readFileSync(join(runDir('tiny-1'), 'artifacts', 'out', 'model.bin'));
  const sha = createHash('sha256').update(file).digest('hex');
  const row = await page.$$eval('#artifacts tbody tr', (trs) =>
    trs.map((tr) => [...tr.cells].map((c) => c.textContent)),
  );
  check(
    row.length === 1 && row[0][0] === 'out/model.bin' && row[0][2] === sha,
    `artifacts table: ${JSON.stringify(row)} (sha ${sha})`,
  );
  check(row[0][1] === '4.00 KiB', `size: ${row[0][1]}`);
  const got = await page.$eval('#artifacts a[download]', async (a) => {
    const r = await fetch(a.href);
    const b = new Uint8Array(await r.arrayBuffer());
    const d = await crypto.subtle.digest('SHA-256', b);
    return [...new Uint8Array(d)].map((x) => x.toString(16).padStart(2, '0')).join('');
  });
  check(got === sha, `the download link serves the file: ${got}`);
});

await step("instances: an aws run's record, lifetimes and instance-hours", async () => {
  const now = Date.now() / 1000;
  const inst = (id, zone, market, launched, ended, end, replaces) => ({
    id, node: 0, type: 't3.micro', market, subnet: null, zone, launched_s: launched,
    ended_s: ended, end, replaces, state: 'terminated',
  });
  writeFileSync(
    join(runDir('tiny-1'), 'instances.json'),
    JSON.stringify({
      provider: 'aws',
      region: 'us-east-1',
      instances: [
        inst('i-0aaa', 'us-east-1a', 'spot', now - 7200, now - 3600, 'interrupted (spot)', null),
        inst('i-0bbb', 'us-east-1b', 'on-demand', now - 3600, now - 1800,
             'terminated by tandem at the end of the run', 'i-0aaa'),
      ],
    }),
  );
  await go('#/run/tiny-2'); // no record: no section
  await waitFor(() => document.querySelector('#artifacts h2'));
  check(await page.$eval('#instances', (el) => el.hidden), 'tiny-2 (no record) shows no instances');
  await go('#/run/tiny-1');
  await waitFor(() => document.querySelectorAll('#instances tbody tr').length === 2);
  const rows = await page.$$eval('#instances tbody tr', (trs) =>
    trs.map((tr) => [...tr.cells].map((c) => c.textContent)),
  );
  check(
    rows[0][0] === 'i-0aaa' && rows[0][3] === 'spot' && rows[0][6] === '1h 00m' && rows[0][7] === '1.00',
    `instances row 1: ${JSON.stringify(rows[0])}`,
  );
  check(
    rows[1][7] === '0.50' && rows[1][rows[1].length - 1].includes('replaced i-0aaa'), // End: the last column
    `instances row 2: ${JSON.stringify(rows[1])}`,
  );
  const sum = await page.$eval('#instances p', (el) => el.textContent);
  check(sum.includes('1.50 instance-hours'), `the total: ${sum}`);
});

await step('a point appended to a running run appears without a reload', async () => {
  await go('#/run/tiny-3');
  await waitFor(
    () => document.querySelector('[data-key="train/loss"]')?.dataset.lastX === '299',
    null,
    30000,
  );
  check((await page.$eval('#run-status', (el) => el.textContent)) === 'running', 'status badge running');
  check(await page.$('#stop'), 'a Stop button (the URL carries the token)');
  const n0 = await points('train/loss');
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  const file = join(runDir('tiny-3'), 'metrics', 'rank-0.jsonl');
  const lastLoss = JSON.parse(
    readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .filter((l) => l.includes('train/loss'))
      .pop(),
  )['train/loss'];
  // When the point reaches the store, seen through the API (a GET every 20 ms, outside the page).
  let storedAt = 0;
  const probe = (async () => {
    const q = `${base.split('?')[0]}api/runs/tiny-3/series?key=train%2Floss&rank=0&from=300&to=300`;
    for (let i = 0; i < 1000 && !storedAt; i++) {
      const d = await (await fetch(q, { headers: { 'X-Tandem-Token': token } })).json();
      if (d.series && d.series[0] && d.series[0].n > 0) storedAt = Date.now();
      else await sleep(20);
    }
  })();
  const t0 = Date.now();
  if (process.env.TANDEM_UI_DEBUG) {
    console.log(`  [append ${t0 % 100000}]`);
    page.evaluate(() => {
      const el = document.querySelector('[data-key="train/loss"]');
      const t = setInterval(() => {
        console.log(`chart ${el.className} ${el.dataset.lastX} ${el.dataset.points}`);
        if (el.dataset.lastX === '300') clearInterval(t);
      }, 200);
    });
  }
  appendFileSync(file, JSON.stringify({ step: 300, 'train/loss': lastLoss * 0.98 }) + '\n');
  await waitFor(() => document.querySelector('[data-key="train/loss"]').dataset.lastX === '300', null, 20000);
  const seenAt = Date.now();
  await probe;
  results.live_point_latency_ms = seenAt - t0;
  results.live_point_store_to_page_ms = storedAt ? Math.max(0, seenAt - storedAt) : null;
  const n1 = await points('train/loss');
  check(n1 === n0 + 1, `data-points grew by one: ${n0} -> ${n1}`);
  check(await page.evaluate(() => window.__sameDocument === true), 'the page was not reloaded');
  console.log(
    `  live point on the page ${results.live_point_latency_ms} ms after it was appended to the metrics file, ` +
      `${results.live_point_store_to_page_ms} ms after it was in the store`,
  );
});

await step('live logs follow a running rank', async () => {
  await waitFor(() => document.querySelector('#logs pre')?.textContent.includes('rank 0 step 275'));
  const t0 = Date.now();
  writeFileSync(join(runDir('tiny-3'), 'ping'), '');
  await waitFor(
    () => document.querySelector('#logs pre').textContent.includes('rank 0 saw the ping'),
    null,
    20000,
  );
  results.live_log_latency_ms = Date.now() - t0;
  check(await page.$eval('#log-follow', (el) => el.checked), 'follow is on for a running run');
  const atBottom = await page.$eval(
    '#logs pre',
    (el) => el.scrollHeight - el.scrollTop - el.clientHeight < 8,
  );
  check(atBottom, 'follow keeps the newest line in view');
  console.log(`  log line on the page ${results.live_log_latency_ms} ms after the ping`);
});

await step('system metrics per rank', async () => {
  await page.$eval('[data-key="sys/cpu_percent"]', (el) => el.scrollIntoView());
  await chartReady('sys/cpu_percent');
  await chartReady('sys/rss_mb');
  const labels = await legend('sys/rss_mb');
  // Two like workers may sample the same RSS at every step: the page then draws one line for
  // both, by design ("ranks 0,1"), and both ranks are on it all the same.
  check(
    (labels.includes('rank 0') && labels.includes('rank 1')) || labels.includes('ranks 0,1'),
    `RSS per rank: ${labels}`,
  );
  await page.evaluate(() => window.scrollTo(0, 0));
  await sleep(300);
  if (shots) {
    mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: join(shots, 'ui-run.png') });
  }
});

await step("compare view: both runs' lines and the differing param", async () => {
  await go('#/compare/tiny-1,tiny-2');
  await chartReady('train/loss');
  const labels = await legend('train/loss');
  check(labels.includes('tiny-1') && labels.includes('tiny-2'), `a line per run: ${labels}`);
  check(
    (await pixelsOf('train/loss', RANK0)) > 50 && (await pixelsOf('train/loss', RANK1)) > 50,
    'both lines drawn',
  );
  const diff = await page.$$eval('#compare-params tbody tr', (trs) =>
    trs.map((tr) => [tr.dataset.param, ...[...tr.cells].slice(1).map((c) => c.textContent)]),
  );
  const lr = diff.find((r) => r[0] === 'lr');
  check(lr && lr[1] === '0.1' && lr[2] === '0.3', `the lr row differs: ${JSON.stringify(diff)}`);
  check(
    !diff.some((r) => r[0] === 'steps'),
    `equal params hidden with "only what differs": ${JSON.stringify(diff)}`,
  );
  await page.click('#only-diff');
  await waitFor(() => document.querySelector('#compare-params tr[data-param="steps"]'));
  await page.click('#only-diff');
  if (shots) {
    await page.evaluate(() => document.activeElement && document.activeElement.blur());
    await sleep(300);
    await page.screenshot({ path: join(shots, 'ui-compare.png') });
  }
});

await step('Stop with the token ends the running run; the badges follow live', async () => {
  // A second tab on the runs table watches the same run.
  const table = await newPage(browser);
  await table.goto(base + '#/', { waitUntil: 'domcontentloaded' });
  await table.waitForFunction(
    () => document.querySelector('tr[data-run="tiny-3"] .badge')?.textContent === 'running',
    { timeout: 15000 },
  );
  await table.evaluate(() => {
    window.__sameDocument = true;
  });
  await go('#/run/tiny-3');
  await page.waitForSelector('#stop', { timeout: 15000 });
  const t0 = Date.now();
  await page.$eval('#stop', (b) => b.click()); // the header may be redrawn under a held handle
  await waitFor(
    () =>
      ['stopped', 'preempted', 'failed', 'succeeded'].includes(
        document.querySelector('#run-status').textContent,
      ),
    null,
    60000,
  );
  const st = await page.$eval('#run-status', (el) => el.textContent);
  check(st === 'stopped', `stopped from the page: ${st}`);
  check(!(await page.$('#stop')), 'the Stop button is gone');
  results.stop_ms = Date.now() - t0;
  await table.waitForFunction(
    () => document.querySelector('tr[data-run="tiny-3"] .badge')?.textContent === 'stopped',
    { timeout: 15000, polling: 50 },
  );
  check(await table.evaluate(() => window.__sameDocument === true), 'the runs table was not reloaded');
  if (table.errors.length) throw new Error(table.errors.join('\n'));
  await table.close();
});

await step('a browser without the token gets 401 and the way in; the printed URL lets it in', async () => {
  const ctx = await browser.createBrowserContext(); // no cookie from the pages above
  try {
    const p = await ctx.newPage();
    const r = await p.goto(bare + '#/', { waitUntil: 'domcontentloaded' });
    check(r.status() === 401, `the page without the token: ${r.status()}`);
    const text = await p.evaluate(() => document.body.innerText);
    check(/needs the access token/.test(text) && /token=/.test(text), `the 401 says how: ${text}`);
    const api = await fetch(`${bare}api/runs`);
    check(api.status === 401, `/api/runs without the token: ${api.status}`);
    await p.goto(base + '#/', { waitUntil: 'domcontentloaded' });
    await p.waitForSelector('tr[data-run="tiny-1"]', { timeout: 15000 });
    // The URL set the cookie: the bare address (a reload, a new tab) opens now, streams too.
    await p.goto(bare + '#/run/tiny-1', { waitUntil: 'domcontentloaded' });
    await p.waitForSelector('#run-status', { timeout: 15000 });
  } finally {
    await ctx.close();
  }
});

await step('opened without the token in its URL (the cookie reads): no Stop button', async () => {
  const p2 = await newPage(browser);
  await p2.goto(bare + '#/run/tiny-1');
  await p2.waitForSelector('#run-status');
  check(!(await p2.$('#stop')), 'no Stop button');
  await p2.close();
});

await step("the smoothing is W&B's time-weighted EMA", async () => {
  const r = await page.evaluate(() => {
    const f = window.tandemUi.twema;
    const flat = f([0, 1, 2, 3], [5, 5, 5, 5], 0.9, 3);
    const id = f([0, 1, 2], [1, 2, 3], 0, 2);
    // Twice as many points over the same x range smooth the same: time-weighted, not per point.
    const xs = [...Array(101).keys()],
      ys = xs.map((x) => (x < 50 ? 0 : 1));
    const x2 = [...Array(201).keys()].map((i) => i / 2),
      y2 = x2.map((x) => (x < 50 ? 0 : 1));
    const a = f(xs, ys, 0.6, 100)[60],
      b = f(x2, y2, 0.6, 100)[120];
    return { flat, id, a, b };
  });
  check(
    r.flat.every((v) => Math.abs(v - 5) < 1e-12),
    `debiased: a flat line stays flat ${r.flat}`,
  );
  check(r.id.join() === '1,2,3', `smoothing 0 is the raw line ${r.id}`);
  check(Math.abs(r.a - r.b) < 0.05, `weights follow the x gap: ${r.a} vs ${r.b}`);
});

await browser.close();
console.log(`results: ${JSON.stringify(results)}`);
if (failed) {
  console.log(`FAIL: ${failed} check(s) failed`);
  process.exit(1);
}
console.log('PASS');
