// How the browser tests and bench/bench_ui.mjs start Debian's chromium: headless, through
// puppeteer-core from src/ui/web/node_modules (npm ci --prefix src/ui/web), --no-sandbox when
// running as root (chromium refuses its sandbox there). One place, so the test and the
// benchmark drive the same browser the same way.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';

export const CHROMIUM = process.env.TANDEM_CHROMIUM || '/usr/bin/chromium';
const webPackage = new URL('../../../src/ui/web/package.json', import.meta.url);

export async function launch() {
  const require = createRequire(webPackage);
  const puppeteer = (await import(require.resolve('puppeteer-core'))).default;
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing (apt-get install chromium)`);
  const args = [
    '--disable-gpu',
    '--disable-dev-shm-usage',
    '--no-first-run',
    '--disable-extensions',
    '--disable-background-networking',
    '--hide-scrollbars',
    '--force-color-profile=srgb',
  ];
  if (process.getuid && process.getuid() === 0) args.push('--no-sandbox');
  return puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args,
    defaultViewport: { width: 1280, height: 800, deviceScaleFactor: 1 },
    protocolTimeout: 120000,
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A page that fails the caller on any page error or console error, and records /series requests.
export async function newPage(browser, { onError } = {}) {
  const page = await browser.newPage();
  page.errors = [];
  page.series = [];
  page.on('pageerror', (e) => {
    page.errors.push(`page error: ${e.message}`);
    onError && onError(e);
  });
  page.on('console', (m) => {
    if (m.type() === 'error' && !/favicon/.test(m.location()?.url || ''))
      page.errors.push(`console error: ${m.text()} (${m.location()?.url || ''})`);
  });
  page.on('request', (r) => {
    if (r.url().includes('/series?')) page.series.push(r.url());
  });
  return page;
}
