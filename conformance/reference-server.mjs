// Starts the Node reference Durable Streams server (@durable-streams/server).
// Used to validate this harness (scripts/conformance --server-cmd ...) and as a
// benchmark rival. Not part of brook.
//
//   node reference-server.mjs --port 4437 [--host 127.0.0.1] [--data-dir DIR]
//                             [--long-poll-timeout-ms 500]
//
// Without --data-dir the server keeps streams in memory; with it, it uses its
// file-backed store (append-only logs + LMDB metadata).
import { parseArgs } from "node:util"
import { DurableStreamTestServer } from "@durable-streams/server"

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "4437" },
    host: { type: "string", default: "127.0.0.1" },
    "data-dir": { type: "string" },
    "long-poll-timeout-ms": { type: "string", default: "500" },
  },
})

const server = new DurableStreamTestServer({
  port: Number(values.port),
  host: values.host,
  dataDir: values["data-dir"],
  longPollTimeout: Number(values["long-poll-timeout-ms"]),
})
await server.start()
console.log(
  `reference server listening on ${server.url} (${values["data-dir"] ? `file-backed: ${values["data-dir"]}` : "in-memory"})`
)

// Stop cleanly on SIGINT/SIGTERM so the file-backed store is closed.
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, async () => {
    await server.stop()
    process.exit(0)
  })
}
