// The browser's own EventSource against brook's SSE reads, in a real headless
// Chromium (Debian's /usr/bin/chromium, driven by playwright-core; nothing is
// downloaded). A page on another origin opens `new EventSource(...)` on
// `?offset=-1&live=sse` while this test appends 1,000 messages over a few
// seconds; brook ends every SSE connection after 1 s (--sse-max-duration-ms),
// so the browser reconnects several times, each time to the ORIGINAL URL with
// `Last-Event-ID`. Every message must arrive exactly once, in order.
//
// Run: node --test conformance/eventsource.test.mjs (scripts/browser does it).
// Environment: BROOK_BIN (default target/release/brook), CHROMIUM (default
// /usr/bin/chromium).
import { test } from "node:test"
import assert from "node:assert/strict"
import { spawn } from "node:child_process"
import { createServer } from "node:http"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, dirname } from "node:path"
import { fileURLToPath } from "node:url"
import { createInterface } from "node:readline"
import { chromium } from "playwright-core"

const here = dirname(fileURLToPath(import.meta.url))
const BROOK_BIN = process.env.BROOK_BIN ?? join(here, "..", "target", "release", "brook")
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium"
const MESSAGES = 1000
const BATCH = 25 // messages appended between pauses
const PAUSE_MS = 150 // 40 batches: about 6 s of appends, so several 1 s connections
const SSE_MAX_MS = 1000

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// `brook serve` on a free loopback port (port 0; the log line names it).
async function startBrook(dataDir) {
  const child = spawn(
    BROOK_BIN,
    ["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir,
     "--durability", "buffered", "--sse-max-duration-ms", String(SSE_MAX_MS)],
    { env: { ...process.env, RUST_LOG: "info", NO_COLOR: "1" }, stdio: ["ignore", "pipe", "inherit"] },
  )
  const lines = createInterface({ input: child.stdout })
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("brook did not listen within 30 s")), 30_000)
    child.once("exit", (code) => { clearTimeout(timer); reject(new Error(`brook exited (${code})`)) })
    lines.on("line", (line) => {
      const m = line.match(/listening on (http:\/\/[0-9.]+:\d+)/)
      if (m) { clearTimeout(timer); resolve(m[1]) }
    })
  })
  // Keep draining the log so brook never blocks on a full pipe.
  lines.on("line", () => {})
  return { child, base }
}

async function stopBrook(child) {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = new Promise((resolve) => child.once("exit", resolve))
  child.kill("SIGTERM")
  const timer = setTimeout(() => child.kill("SIGKILL"), 5000)
  await exited
  clearTimeout(timer)
}

// The page: another origin than brook's. It records every data event's
// messages, every open and every error of its EventSource.
function pageHtml(streamUrl) {
  return `<!doctype html><meta charset="utf-8"><title>eventsource</title><script>
  window.got = []; window.opens = 0; window.errors = 0; window.streamEnded = false
  const es = new EventSource(${JSON.stringify(streamUrl)})
  window.es = es
  es.onopen = () => { window.opens++ }
  es.onerror = () => { window.errors++ }
  es.addEventListener("data", (e) => { for (const m of JSON.parse(e.data)) window.got.push(m.n) })
  es.addEventListener("control", (e) => {
    // The protocol's rule: no reconnection once the stream is closed.
    if (JSON.parse(e.data).streamClosed) { window.streamEnded = true; es.close() }
  })
  </script>`
}

async function startPageServer(html) {
  const server = createServer((req, res) => {
    res.writeHead(200, { "content-type": "text/html; charset=utf-8" })
    res.end(html)
  })
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve))
  return { server, origin: `http://127.0.0.1:${server.address().port}` }
}

async function post(url, body, headers = {}) {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body })
  assert.equal(r.status, 204, `append: ${r.status} ${await r.text()}`)
}

test("a browser's EventSource resumes over brook's SSE without loss or duplicates", { timeout: 90_000 }, async () => {
  const work = mkdtempSync(join(tmpdir(), "brook-eventsource-"))
  let brook, page, browser
  const cleanups = []
  try {
    brook = await startBrook(join(work, "data"))
    cleanups.push(() => stopBrook(brook.child))
    const stream = `${brook.base}/v1/stream/eventsource-${process.pid}`
    const created = await fetch(stream, { method: "PUT", headers: { "content-type": "application/json" } })
    assert.equal(created.status, 201)

    page = await startPageServer(pageHtml(`${stream}?offset=-1&live=sse`))
    cleanups.push(() => new Promise((resolve) => { page.server.closeAllConnections(); page.server.close(resolve) }))
    assert.notEqual(new URL(page.origin).origin, new URL(brook.base).origin)

    // A fresh profile (--user-data-dir, which playwright takes as this first argument).
    browser = await chromium.launchPersistentContext(join(work, "profile"), {
      executablePath: CHROMIUM,
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    })
    cleanups.push(() => browser.close())
    const tab = await browser.newPage()
    // Every SSE request the browser makes, with its Last-Event-ID.
    const sseRequests = []
    tab.on("request", async (req) => {
      if (req.url().includes("live=sse") && req.method() === "GET") {
        sseRequests.push({ url: req.url(), lastEventId: (await req.allHeaders())["last-event-id"] ?? null })
      }
    })
    const consoleErrors = []
    tab.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()) })
    await tab.goto(`${page.origin}/`)
    await tab.waitForFunction(() => window.opens >= 1, null, { timeout: 10_000 })

    const started = Date.now()
    for (let n = 0; n < MESSAGES; n += BATCH) {
      for (let i = n; i < Math.min(n + BATCH, MESSAGES); i++) await post(stream, JSON.stringify({ n: i }))
      await sleep(PAUSE_MS)
    }
    const appendMs = Date.now() - started
    // Closing the stream tells the page to stop (its control handler closes).
    await post(stream, "", { "stream-closed": "true" })

    await tab.waitForFunction((want) => window.got.length >= want && window.streamEnded, MESSAGES, { timeout: 30_000 })
      .catch(() => {})
    const { got, opens, errors, closed } = await tab.evaluate(() =>
      ({ got: window.got, opens: window.opens, errors: window.errors, closed: window.streamEnded }))
    const resumed = sseRequests.filter((r) => r.lastEventId !== null)
    console.log(`eventsource: ${got.length} messages received for ${MESSAGES} appended over ${appendMs} ms; ` +
      `${opens} connections opened, ${resumed.length} with Last-Event-ID, ${errors} error events` +
      `${closed ? ", closed by streamClosed" : ""}`)

    assert.deepEqual(got, Array.from({ length: MESSAGES }, (_, i) => i), "every message exactly once, in order")
    assert.ok(opens > 1, `more than one connection opened (${opens})`)
    assert.ok(resumed.length >= 1, "reconnections sent Last-Event-ID")
    for (const r of sseRequests) assert.ok(r.url.endsWith("?offset=-1&live=sse"), `the browser keeps its URL: ${r.url}`)
    assert.ok(closed, "the page saw streamClosed")
    assert.deepEqual(consoleErrors.filter((e) => /CORS|blocked/i.test(e)), [], "no CORS errors")
  } finally {
    for (const c of cleanups.reverse()) await c().catch(() => {})
    rmSync(work, { recursive: true, force: true })
  }
})
