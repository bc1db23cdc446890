// The official Durable Streams server conformance suite, run against the server
// at $BROOK_URL (started by scripts/conformance). The suite's own CLI finds no
// tests under vitest 4, so we call runConformanceTests from a test file instead.
// `subscriptions: true` runs the 6 subscription tests too (PROTOCOL.md sections 6-7).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

// Over TLS (scripts/conformance --tls): every fetch speaks HTTP/2 and trusts the test CA.
if (process.env.BROOK_CA) await import("./h2-setup.mjs")

const baseUrl = process.env.BROOK_URL
if (!baseUrl) {
  throw new Error("BROOK_URL is required (e.g. BROOK_URL=http://127.0.0.1:4499)")
}

runConformanceTests({ baseUrl, subscriptions: true })
