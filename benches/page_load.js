// How long a report page takes to open in headless Chromium, in real time (issue 52).
//
//     node benches/page_load.js PAGE.html [HASH]
//
// Starts Chromium with the page, talks to it over the DevTools protocol on a pipe (no
// network, no package), and prints what the page measured itself when it became ready
// (report.js sets body[data-load-ms]: performance.now() since the navigation began, and
// data-view-ms: the last view's computation, the zoom's with `#selftest-zoom`). The browser
// tests use --virtual-time-budget, under which the page's clock is virtual; this does not.
"use strict";
const { spawn } = require("child_process");
const fs = require("fs"), os = require("os"), path = require("path");

const page = path.resolve(process.argv[2]);
const hash = process.argv[3] || "";
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "allocsim-load-"));
const browser = spawn("chromium", ["--headless", "--no-sandbox", "--disable-gpu",
  "--remote-debugging-pipe", `--user-data-dir=${profile}`, `file://${page}${hash}`],
{ stdio: ["ignore", "ignore", "ignore", "pipe", "pipe"] });
const [toBrowser, fromBrowser] = [browser.stdio[3], browser.stdio[4]];
let nextId = 1, buffered = "";
const waiting = new Map();
fromBrowser.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf("\0")) >= 0) {
    const message = JSON.parse(buffered.slice(0, end));
    buffered = buffered.slice(end + 1);
    if (waiting.has(message.id)) { waiting.get(message.id)(message); waiting.delete(message.id); }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  toBrowser.write(JSON.stringify({ id, method, params, sessionId }) + "\0");
  return new Promise((resolve) => waiting.set(id, resolve));
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

(async () => {
  const started = Date.now();
  let target;
  while (!target) {
    const { result } = await send("Target.getTargets");
    target = result.targetInfos.find((t) => t.type === "page" && t.url.startsWith("file:"));
    if (!target) await sleep(20);
  }
  const { result: { sessionId } } = await send("Target.attachToTarget", { targetId: target.targetId, flatten: true });
  const read = "JSON.stringify(document.body ? {...document.body.dataset} : {})";
  for (;;) {
    const { result } = await send("Runtime.evaluate", { expression: read, returnByValue: true }, sessionId);
    const data = JSON.parse(result.result.value || "{}");
    if (data.status === "ready" || data.errors || Date.now() - started > 60000) {
      console.log(JSON.stringify({ page: path.basename(page), hash, load_ms: +data.loadMs, unpacked_ms: +data.unpackedMs,
        view_ms: +data.viewMs, drawn: +data.drawn, errors: data.errors || null,
        wall_ms_since_launch: Date.now() - started }));
      break;
    }
    await sleep(25);
  }
  browser.on("exit", () => fs.rmSync(profile, { recursive: true, force: true }));
  browser.kill();
})();
