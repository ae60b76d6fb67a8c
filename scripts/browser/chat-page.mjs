// Drives the server's chat page (GET /) in headless Chromium: sends a prompt, waits for the
// answer, checks that it is coloured by provenance and that the live numbers are filled in,
// saves a screenshot. Usage: node chat-page.mjs URL SCREENSHOT PROMPT
import { chromium } from "playwright-core";

const [url, screenshot, prompt] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const fail = async (why) => { console.error("FAIL: " + why); await browser.close(); process.exit(1); };
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  await page.goto(url);
  // Two turns: the second repeats the first answer's request, so it can copy.
  for (const text of [prompt, "Now also handle intervals given as lists of length 2. Return the whole function again."]) {
    await page.fill("#prompt", text);
    await page.click("#send");
    await page.waitForFunction(() => !document.getElementById("send").disabled
      && document.querySelectorAll(".assistant").length > 0, null, { timeout: 240000 });
    await page.waitForFunction((n) => document.querySelectorAll(".assistant").length >= n
      && !document.getElementById("send").disabled, text === prompt ? 1 : 2, { timeout: 240000 });
  }
  const errors = await page.$$eval(".error", (e) => e.map((x) => x.textContent));
  if (errors.length) await fail("the page shows errors: " + errors.join(" | "));
  const counts = await page.$$eval(".assistant span", (spans) => {
    const c = {};
    for (const s of spans) c[s.className] = (c[s.className] || 0) + s.textContent.length;
    return c;
  });
  const numbers = {
    rate: await page.textContent("#rate"),
    perForward: await page.textContent("#per-forward"),
    speedup: await page.textContent("#speedup"),
  };
  console.log(JSON.stringify({ characters_by_provenance: counts, numbers }));
  if (!counts["by-target"]) await fail("no target-coloured text");
  if (!(counts["by-copied"] || counts["by-drafted"] || counts["by-forced"])) await fail("no drafted text coloured");
  if (!(parseFloat(numbers.rate) > 0)) await fail("tokens/s not shown");
  if (!(parseFloat(numbers.perForward) >= 1)) await fail("tokens per forward not shown");
  // The picture: the first answer (the copy of the function), with the last turn's numbers.
  await page.evaluate(() => { document.querySelectorAll(".assistant")[0].scrollIntoView(); });
  await page.screenshot({ path: screenshot, fullPage: false });
} catch (e) {
  await fail(String(e));
}
await browser.close();
