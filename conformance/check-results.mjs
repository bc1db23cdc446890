// Compares a vitest JSON report of the conformance suite with the list of known
// failures. Used by scripts/conformance.
//
//   node check-results.mjs REPORT.json KNOWN_FAILURES.txt [LABEL]
//
// A test's name is its describe blocks and its title joined by " > ", as vitest
// prints it after "FAIL  conformance.test.mjs > ". The set of failed tests must
// equal the list exactly: a new failure is a regression, and a listed test that
// now passes must be removed from the list (it may only shrink).
// Prints "LABEL: N passed, M failed, K skipped" as its last line.
// Exit status: 0 if the failures are exactly the known ones, 1 otherwise.
import { readFileSync } from "node:fs"

const [reportPath, knownPath, label = "conformance"] = process.argv.slice(2)
if (!reportPath || !knownPath) {
  console.error("usage: node check-results.mjs REPORT.json KNOWN_FAILURES.txt [LABEL]")
  process.exit(2)
}

const report = JSON.parse(readFileSync(reportPath, "utf8"))
const known = readFileSync(knownPath, "utf8")
  .split("\n")
  .map((line) => line.trim())
  .filter((line) => line !== "" && !line.startsWith("#"))

const results = new Map() // name -> status ("passed" | "failed" | "skipped" | ...)
const problems = []
for (const file of report.testResults) {
  // A file that failed outside any test (import error, failing hook) has no
  // assertion results to compare: that is always an error.
  if (file.status === "failed" && file.message) {
    problems.push(`${file.name} failed outside of a test: ${file.message}`)
  }
  for (const t of file.assertionResults) {
    const name = [...t.ancestorTitles, t.title].join(" > ")
    if (results.has(name)) problems.push(`two tests are named "${name}"`)
    results.set(name, t.status)
  }
}

const count = (status) => [...results.values()].filter((s) => s === status).length
const passed = count("passed")
const failed = count("failed")
const skipped = results.size - passed - failed // skipped, pending, todo

if (results.size === 0) problems.push("no test ran")

const knownSet = new Set(known)
for (const name of known) {
  if (known.indexOf(name) !== known.lastIndexOf(name)) {
    problems.push(`listed twice in ${knownPath}: ${name}`)
    knownSet.delete(name) // report once
  }
}
for (const [name, status] of results) {
  if (status === "failed" && !knownSet.has(name)) {
    problems.push(`new failure (not in ${knownPath}): ${name}`)
  }
}
for (const name of new Set(known)) {
  const status = results.get(name)
  if (status === undefined) {
    problems.push(
      `listed in ${knownPath} but not a test of the suite (renamed? typo?): ${name}`
    )
  } else if (status !== "failed") {
    problems.push(
      `${status === "passed" ? "now passes" : `is ${status}`}: ${name}\n` +
        `    -> remove it from ${knownPath}, the list may only shrink`
    )
  }
}

if (failed > 0 && problems.length === 0) {
  console.log(`${failed} known failure(s), as listed in ${knownPath}`)
}
// Name every problem, but keep a crashed server's flood of failures readable.
const MAX_SHOWN = 60
for (const p of problems.slice(0, MAX_SHOWN)) console.log(`ERROR: ${p}`)
if (problems.length > MAX_SHOWN) {
  console.log(`ERROR: ... and ${problems.length - MAX_SHOWN} more (see the vitest output above)`)
}
console.log(`${label}: ${passed} passed, ${failed} failed, ${skipped} skipped`)
process.exit(problems.length === 0 ? 0 : 1)
