// Imported by the vitest files when scripts/conformance runs them with --tls: every `fetch` in
// this process then goes through undici's own Agent with HTTP/2 allowed (ALPN offers h2), trusting
// only the test certificate in $BROOK_CA. Node 20's built-in fetch bundles an older undici, so
// the global `fetch` is replaced by this undici's, which uses the same global dispatcher.
// The ALPN protocol of every new connection is appended to $BROOK_ALPN_LOG, so the script can
// check that the suite really ran over HTTP/2.
import { appendFileSync, readFileSync } from "node:fs"
import diagnostics from "node:diagnostics_channel"
import { Agent, fetch, setGlobalDispatcher } from "undici"

const ca = readFileSync(process.env.BROOK_CA)
setGlobalDispatcher(new Agent({ allowH2: true, connect: { ca } }))
globalThis.fetch = fetch

const log = process.env.BROOK_ALPN_LOG
if (log) {
  diagnostics.channel("undici:client:connected").subscribe(({ socket }) => {
    appendFileSync(log, `${socket.alpnProtocol || "none"}\n`)
  })
}
