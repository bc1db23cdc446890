// Twenty live SSE tails from one page over HTTP/2, in a real headless Chromium
// (Debian's /usr/bin/chromium, driven by playwright-core). Over HTTP/1.1 a
// browser opens at most six connections per origin, so a page with more live
// tails than that starves; over TLS brook negotiates HTTP/2 by ALPN and every
// EventSource shares one connection. brook serves a certificate made here with
// the openssl command line, which the browser accepts through
// --ignore-certificate-errors. Each tail must receive exactly its stream's
// events, and every SSE response must have come over h2.
//
// Run: node --test conformance/h2-tails.test.mjs (scripts/browser does it).
// Environment: BROOK_BIN (default target/release/brook), CHROMIUM (default
// /usr/bin/chromium).
import { test } from "node:test"
import assert from "node:assert/strict"
import { spawn, execFileSync } from "node:child_process"
import { createServer } from "node:http"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, dirname } from "node:path"
import { fileURLToPath } from "node:url"
import { createInterface } from "node:readline"
import { chromium } from "playwright-core"
import { Agent, fetch } from "undici"

const here = dirname(fileURLToPath(import.meta.url))
const BROOK_BIN = process.env.BROOK_BIN ?? join(here, "..", "target", "release", "brook")
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium"
const TAILS = 20
const EVENTS = 5 // per tail

// A throwaway self-signed certificate for 127.0.0.1.
function makeCert(dir) {
  const cert = join(dir, "cert.pem")
  const key = join(dir, "key.pem")
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
    "-nodes", "-days", "2", "-subj", "/CN=brook browser test",
    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
  { stdio: "ignore" })
  return { cert, key }
}

// `brook serve` over TLS on a free loopback port (the log line names it).
async function startBrook(dataDir, { cert, key }) {
  const child = spawn(
    BROOK_BIN,
    ["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir, "--durability", "buffered",
     "--tls-cert", cert, "--tls-key", key],
    { env: { ...process.env, RUST_LOG: "info", NO_COLOR: "1" }, stdio: ["ignore", "pipe", "inherit"] },
  )
  const lines = createInterface({ input: child.stdout })
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("brook did not listen within 30 s")), 30_000)
    child.once("exit", (code) => { clearTimeout(timer); reject(new Error(`brook exited (${code})`)) })
    lines.on("line", (line) => {
      const m = line.match(/listening on (https:\/\/[0-9.]+:\d+)/)
      if (m) { clearTimeout(timer); resolve(m[1]) }
    })
  })
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

// The page: one EventSource per stream, recording each data event's messages.
function pageHtml(urls) {
  return `<!doctype html><meta charset="utf-8"><title>h2 tails</title><script>
  window.got = ${JSON.stringify(urls)}.map(() => []); window.opens = 0;
  ${JSON.stringify(urls)}.forEach((url, i) => {
    const es = new EventSource(url)
    es.onopen = () => { window.opens++ }
    es.addEventListener("data", (e) => { for (const m of JSON.parse(e.data)) window.got[i].push(m) })
  })
  </script>`
}

test("twenty live SSE tails from one page share HTTP/2 and each gets its events", { timeout: 90_000 }, async () => {
  const work = mkdtempSync(join(tmpdir(), "brook-h2-tails-"))
  const cleanups = []
  try {
    const tls = makeCert(work)
    const brook = await startBrook(join(work, "data"), tls)
    cleanups.push(() => stopBrook(brook.child))
    const agent = new Agent({ allowH2: true, connect: { ca: readFileSync(tls.cert) } })
    cleanups.push(() => agent.close())
    const call = (url, init) => fetch(url, { ...init, dispatcher: agent })
    const streams = Array.from({ length: TAILS }, (_, i) => `${brook.base}/v1/stream/h2-tail-${process.pid}-${i}`)
    for (const s of streams) {
      const r = await call(s, { method: "PUT", headers: { "content-type": "application/json" } })
      assert.equal(r.status, 201)
    }

    const html = pageHtml(streams.map((s) => `${s}?offset=-1&live=sse`))
    const page = createServer((req, res) => {
      res.writeHead(200, { "content-type": "text/html; charset=utf-8" })
      res.end(html)
    })
    await new Promise((resolve) => page.listen(0, "127.0.0.1", resolve))
    cleanups.push(() => new Promise((resolve) => { page.closeAllConnections(); page.close(resolve) }))

    const browser = await chromium.launchPersistentContext(join(work, "profile"), {
      executablePath: CHROMIUM,
      headless: true,
      ignoreHTTPSErrors: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--ignore-certificate-errors", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"],
    })
    cleanups.push(() => browser.close())
    const tab = await browser.newPage()
    // The protocol of every SSE response, as the browser's network stack saw it.
    const protocols = []
    const cdp = await browser.newCDPSession(tab)
    await cdp.send("Network.enable")
    cdp.on("Network.responseReceived", (e) => {
      if (e.response.url.includes("live=sse")) protocols.push(e.response.protocol)
    })
    await tab.goto(`http://127.0.0.1:${page.address().port}/`)
    tab.on("console", (m) => console.log(`page: ${m.type()}: ${m.text()}`))
    cdp.on("Network.loadingFailed", (e) => console.log("failed", JSON.stringify(e)))
    await tab.waitForFunction((want) => window.opens >= want, TAILS, { timeout: 20_000 })
      .catch(async (e) => { console.log("opens", await tab.evaluate(() => window.opens), protocols); throw e })

    for (let k = 0; k < EVENTS; k++) {
      for (let i = 0; i < TAILS; i++) {
        const r = await call(streams[i], {
          method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ tail: i, k }),
        })
        assert.equal(r.status, 204)
      }
    }
    await tab.waitForFunction((want) => window.got.every((g) => g.length >= want), EVENTS, { timeout: 20_000 })
      .catch(() => {})
    const got = await tab.evaluate(() => window.got)
    console.log(`h2-tails: ${got.filter((g) => g.length === EVENTS).length} of ${TAILS} tails got all ${EVENTS} events; ` +
      `SSE responses by protocol: ${JSON.stringify(protocols.reduce((m, p) => ({ ...m, [p]: (m[p] ?? 0) + 1 }), {}))}`)
    for (let i = 0; i < TAILS; i++) {
      assert.deepEqual(got[i], Array.from({ length: EVENTS }, (_, k) => ({ tail: i, k })), `tail ${i}`)
    }
    assert.equal(protocols.length, TAILS, "one SSE response per tail")
    assert.ok(protocols.every((p) => p === "h2"), `every SSE response over h2: ${protocols}`)
  } finally {
    for (const c of cleanups.reverse()) await c().catch(() => {})
    rmSync(work, { recursive: true, force: true })
  }
})
