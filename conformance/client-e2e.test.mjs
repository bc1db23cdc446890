// End-to-end test: the official TypeScript client (@durable-streams/client)
// against the server at $BROOK_URL (started by scripts/conformance).
// The conformance suite checks the wire protocol request by request; this file
// checks that a real client, with its batching, SSE parsing and producer
// pipelining, works against the server.
import { describe, test, expect } from "vitest"
import {
  DurableStream,
  IdempotentProducer,
  StaleEpochError,
} from "@durable-streams/client"

// Over TLS (scripts/conformance --tls): every fetch speaks HTTP/2 and trusts the test CA.
if (process.env.BROOK_CA) await import("./h2-setup.mjs")

const baseUrl = process.env.BROOK_URL
if (!baseUrl) {
  throw new Error("BROOK_URL is required (e.g. BROOK_URL=http://127.0.0.1:4499)")
}

// A fresh stream URL per test, so reruns against a long-lived server never collide.
let counter = 0
const streamUrl = (name) =>
  `${baseUrl}/v1/stream/client-e2e-${name}-${Date.now()}-${process.pid}-${counter++}`

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor(what, predicate, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

// A fetch that records the URL of every request, to check which live mode the
// client really used (it silently falls back from SSE to long-poll when SSE
// connections keep closing early).
function recordingFetch() {
  const urls = []
  const fetchFn = (input, init) => {
    urls.push(typeof input === "string" ? input : input.url ?? String(input))
    return fetch(input, init)
  }
  return { urls, fetchFn }
}

describe("@durable-streams/client end-to-end", () => {
  test("text stream: create, append, catch-up read from the start and from a saved offset", async () => {
    const url = streamUrl("text")
    const handle = await DurableStream.create({ url, contentType: "text/plain" })

    const empty = await handle.head()
    expect(empty.exists).toBe(true)
    expect(empty.contentType).toMatch(/^text\/plain/)

    await handle.append("hello, ")
    const middle = await handle.head()
    expect(middle.offset).toBeTruthy()
    expect(middle.offset).not.toBe(empty.offset)
    await handle.append("world")
    const tail = await handle.head()

    // Catch-up from the start with a separate handle (as another process would).
    const reader = await DurableStream.connect({ url })
    const all = await reader.stream({ live: false })
    expect(await all.text()).toBe("hello, world")
    expect(all.upToDate).toBe(true)
    expect(all.offset).toBe(tail.offset)

    // Resume from the offset saved after the first append.
    const rest = await reader.stream({ offset: middle.offset, live: false })
    expect(await rest.text()).toBe("world")

    // Reading from the tail gives nothing.
    const none = await reader.stream({ offset: tail.offset, live: false })
    expect(await none.text()).toBe("")

    // Re-creating with a different content type is a conflict.
    await expect(
      DurableStream.create({ url, contentType: "application/json" })
    ).rejects.toThrow()
  })

  test("JSON stream: each append is one message, read back in order", async () => {
    const url = streamUrl("json")
    const handle = await DurableStream.create({ url, contentType: "application/json" })
    const values = [{ n: 1 }, "two", 3, [4, 5], { nested: { six: [6] } }, null]
    for (const v of values) await handle.append(JSON.stringify(v))
    // Concurrent appends are batched by the client into one POST; order is kept.
    await Promise.all(
      [7, 8, 9].map((n) => handle.append(JSON.stringify({ n })))
    )

    const res = await (await DurableStream.connect({ url })).stream({ live: false })
    expect(await res.json()).toEqual([...values, { n: 7 }, { n: 8 }, { n: 9 }])
  })

  test("JSON stream: a live SSE tail receives an append made after subscribing", async () => {
    const url = streamUrl("sse-json")
    const writer = await DurableStream.create({ url, contentType: "application/json" })
    await writer.append(JSON.stringify({ seq: 0 }))

    const { urls, fetchFn } = recordingFetch()
    const reader = new DurableStream({ url, fetch: fetchFn })
    const res = await reader.stream({ live: "sse" })
    const items = []
    let sawUpToDate = false
    const unsubscribe = res.subscribeJson(async (batch) => {
      items.push(...batch.items)
      if (batch.upToDate) sawUpToDate = true
    })
    try {
      await waitFor("the SSE catch-up", () => sawUpToDate && items.length >= 1)
      expect(items).toEqual([{ seq: 0 }])

      // Idle longer than the server's long-poll timeout (500 ms in
      // scripts/conformance), so keep-alives happen before the append.
      await sleep(1200)
      await writer.append(JSON.stringify({ seq: 1 }))
      await writer.append(JSON.stringify({ seq: 2 }))
      await waitFor("the live appends over SSE", () => items.length >= 3)
      await sleep(200) // anything extra (a duplicate) would show up now
      expect(items).toEqual([{ seq: 0 }, { seq: 1 }, { seq: 2 }])
    } finally {
      unsubscribe()
      res.cancel()
    }

    expect(urls.some((u) => u.includes("live=sse"))).toBe(true)
    expect(urls.filter((u) => u.includes("live=long-poll"))).toEqual([])
  })

  test("text stream: a live SSE tail from the tail offset sees only new data", async () => {
    const url = streamUrl("sse-text")
    const writer = await DurableStream.create({ url, contentType: "text/plain" })
    await writer.append("old ")
    const { offset } = await writer.head()

    const { urls, fetchFn } = recordingFetch()
    const res = await new DurableStream({ url, fetch: fetchFn }).stream({
      offset,
      live: "sse",
    })
    let text = ""
    let sawUpToDate = false
    const unsubscribe = res.subscribeText(async (chunk) => {
      text += chunk.text
      if (chunk.upToDate) sawUpToDate = true
    })
    try {
      await waitFor("the SSE connection to catch up", () => sawUpToDate)
      await writer.append("new")
      await waitFor("the live append over SSE", () => text.length >= 3)
      await sleep(200)
      expect(text).toBe("new")
    } finally {
      unsubscribe()
      res.cancel()
    }
    expect(urls.some((u) => u.includes("live=sse"))).toBe(true)
    expect(urls.filter((u) => u.includes("live=long-poll"))).toEqual([])
  })

  test("byte stream: a long-poll tail receives an append and sees the stream close", async () => {
    const url = streamUrl("long-poll")
    const writer = await DurableStream.create({
      url,
      contentType: "application/octet-stream",
    })
    const res = await new DurableStream({ url }).stream({ live: "long-poll" })
    const chunks = []
    let closed = false
    const unsubscribe = res.subscribeBytes(async (chunk) => {
      if (chunk.data.length > 0) chunks.push(...chunk.data)
      if (chunk.streamClosed) closed = true
    })
    try {
      await sleep(700) // let at least one long-poll time out (server: 500 ms)
      await writer.append(new Uint8Array([0, 1, 2, 255]))
      await waitFor("the long-poll append", () => chunks.length >= 4)
      expect(chunks).toEqual([0, 1, 2, 255])
      await writer.close()
      await waitFor("the reader to see the close", () => closed)
    } finally {
      unsubscribe()
      res.cancel()
    }
    // Appending to a closed stream is refused (409 Conflict).
    await expect(writer.append(new Uint8Array([9]))).rejects.toMatchObject({
      status: 409,
    })
    // Closing again with a final body is refused too (a plain close would be
    // an idempotent no-op).
    await expect(writer.close({ body: new Uint8Array([9]) })).rejects.toMatchObject({
      status: 409,
    })
    await writer.close()
  })

  test("IdempotentProducer: pipelined, re-sent batches land exactly once and in order", async () => {
    const url = streamUrl("producer")
    const stream = await DurableStream.create({ url, contentType: "application/json" })

    // Every producer request is sent twice, as if the first response had been
    // lost and the request retried: the server must deduplicate the second.
    let duplicatedRequests = 0
    const twiceFetch = async (input, init) => {
      await fetch(input, init)
      duplicatedRequests++
      return fetch(input, init)
    }
    const errors = []
    const producer = new IdempotentProducer(stream, "e2e-producer", {
      lingerMs: 1,
      maxBatchBytes: 512, // small batches, so several are in flight at once
      maxInFlight: 5,
      fetch: twiceFetch,
      onError: (e) => errors.push(e),
    })
    const N = 200
    for (let i = 0; i < N; i++) {
      producer.append(JSON.stringify({ i, pad: "x".repeat(16) }))
    }
    await producer.flush()
    expect(errors).toEqual([])
    expect(producer.nextSeq).toBeGreaterThan(5) // many batches were sent
    expect(duplicatedRequests).toBeGreaterThanOrEqual(producer.nextSeq)

    // A raw replay of the last batch's (id, epoch, seq) with a different body
    // must be accepted as a duplicate and change nothing.
    const replay = await fetch(url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "Producer-Id": "e2e-producer",
        "Producer-Epoch": String(producer.epoch),
        "Producer-Seq": String(producer.nextSeq - 1),
      },
      body: JSON.stringify([{ i: -1 }]),
    })
    expect(replay.ok).toBe(true)

    const read = async () =>
      (await (await DurableStream.connect({ url })).stream({ live: false })).json()
    const firstRead = await read()
    expect(firstRead.map((m) => m.i)).toEqual([...Array(N).keys()])

    // A new producer session with a higher epoch fences the old one (zombie).
    const successor = new IdempotentProducer(stream, "e2e-producer", {
      epoch: producer.epoch + 1,
      lingerMs: 1,
      onError: (e) => errors.push(e),
    })
    for (let i = N; i < N + 10; i++) successor.append(JSON.stringify({ i }))
    await successor.flush()
    expect(errors).toEqual([])

    producer.append(JSON.stringify({ i: "zombie" }))
    await producer.flush()
    expect(errors.length).toBe(1)
    expect(errors[0]).toBeInstanceOf(StaleEpochError)

    // Closing through the producer closes the stream (EOF) for readers.
    await successor.close()
    expect((await stream.head()).streamClosed).toBe(true)

    const finalRead = await read()
    expect(finalRead.map((m) => m.i)).toEqual([...Array(N + 10).keys()])
  })
})
