#!/usr/bin/env bash
# shellcheck shell=bash
# The programs scripts/test needs, checked before anything is built: sourced by scripts/test
# (`prereqs_check`), or run alone to check only (`scripts/lib/prereqs.sh`).
#
# Every program a step of scripts/test runs, unless its SKIP_* variable skips the step. When
# some are missing and the check runs as root on a machine with apt-get (as CI does), the Debian
# packages that provide them are installed in one apt-get call; BROOK_NO_INSTALL=1 forbids that.
# Whatever is then still missing (or has no Debian package: Node 20.19+, which Debian 12 does
# not ship; the Rust toolchain) is listed, all of it at once, each with the command that
# installs it and the variable that skips its step, and the check fails: within seconds, not
# 10-20 minutes into the run.
#
# Environment (besides the SKIP_* variables, listed in README.md):
#   BROOK_NO_INSTALL=1   never install, only list what is missing
#   NGINX, CHROMIUM      the nginx and Chromium binaries (/usr/sbin/nginx, /usr/bin/chromium)

# Node.js: vite 8 and rolldown, which the conformance suite runs on, declare
# "^20.19.0 || >=22.12.0" (conformance/package-lock.json).
PREREQS_NODE="20.19+ or 22.12+"

# prereqs_node_ok VERSION: whether `node --version`'s VERSION (v20.20.2) is one PREREQS_NODE admits.
prereqs_node_ok() {
  local v=${1#v} major minor
  major=${v%%.*}; v=${v#*.}; minor=${v%%.*}
  [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] || return 1
  (( (major == 20 && minor >= 19) || (major == 22 && minor >= 12) || major >= 23 ))
}

# One line per missing prerequisite: what<TAB>why<TAB>install command<TAB>skip variable.
PREREQS_MISSING=()
# The Debian packages that would provide the missing ones (those that have one).
PREREQS_PACKAGES=()

# prereqs_missing WHAT WHY PACKAGE INSTALL SKIP
prereqs_missing() {
  PREREQS_MISSING+=("$1"$'\t'"$2"$'\t'"$4"$'\t'"$5")
  if [[ -n $3 ]]; then PREREQS_PACKAGES+=("$3"); fi
}

# prereqs_apt WHAT WHY PACKAGE [SKIP]: missing, with Debian's PACKAGE as the way to install it.
prereqs_apt() {
  prereqs_missing "$1" "$2" "$3" "apt-get install -y --no-install-recommends $3" "${4:-}"
}

prereqs_has() { command -v "$1" >/dev/null 2>&1; }

# prereqs_scan ROOT: fills PREREQS_MISSING and PREREQS_PACKAGES.
prereqs_scan() {
  local root=$1
  PREREQS_MISSING=()
  PREREQS_PACKAGES=()

  # The Rust toolchain: the one rust-toolchain.toml pins, with rustfmt and clippy.
  local pinned
  pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$root/rust-toolchain.toml" 2>/dev/null)
  if ! prereqs_has cargo; then
    prereqs_missing "cargo (the Rust toolchain)" "every step" "" \
      "rustup (https://rustup.rs), then: rustup toolchain install ${pinned:-stable} --component rustfmt,clippy" ""
  else
    (cd "$root" && cargo fmt --version) >/dev/null 2>&1 \
      || prereqs_missing "rustfmt" "cargo fmt --check" "" "rustup component add rustfmt" ""
    (cd "$root" && cargo clippy --version) >/dev/null 2>&1 \
      || prereqs_missing "clippy" "cargo clippy" "" "rustup component add clippy" ""
  fi
  # C for ring (rustls) and the linker; C++ for libFuzzer, which libfuzzer-sys builds in fuzz/.
  local cc=${CC:-cc} cxx=${CXX:-c++}
  prereqs_has "${cc%% *}" || prereqs_apt "a C compiler ($cc)" "the build (ring, linking)" gcc
  prereqs_has "${cxx%% *}" || prereqs_apt "a C++ compiler ($cxx)" "the fuzz crate (libFuzzer)" g++
  prereqs_has python3 || prereqs_apt "python3" "scripts/check-docs" python3
  prereqs_has git || prereqs_apt "git" "scripts/check-docs (files git ignores)" git
  prereqs_has openssl || prereqs_apt "openssl" "the TLS and JWT tests, scripts/conformance --tls" openssl
  prereqs_has curl || prereqs_apt "curl" "scripts/conformance, scripts/doc-examples" curl

  if [[ -z ${SKIP_NGINX:-} && ! -x ${NGINX:-/usr/sbin/nginx} ]]; then
    prereqs_apt "nginx at ${NGINX:-/usr/sbin/nginx} (or set NGINX)" "the cache test, tests/it/http_cache.rs" \
      nginx SKIP_NGINX=1
  fi
  if [[ -z ${SKIP_PROMTOOL:-} ]] && ! prereqs_has promtool; then
    prereqs_apt "promtool (Debian's prometheus package)" "the metrics test, tests/it/ops_admin.rs" \
      prometheus SKIP_PROMTOOL=1
  fi
  if [[ -z ${SKIP_S3:-} ]] && ! "$root/scripts/s3-server" --installed; then
    # scripts/s3-server makes a virtualenv and pip-installs moto into it.
    if ! prereqs_has python3; then
      :  # listed above
    elif ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
      prereqs_apt "python3's venv and pip (python3-venv)" "the cold tier's S3 tests (moto, by scripts/s3-server)" \
        python3-venv SKIP_S3=1
    fi
  fi
  if [[ -z ${SKIP_BROWSER:-} && ! -x ${CHROMIUM:-/usr/bin/chromium} ]]; then
    prereqs_apt "Chromium at ${CHROMIUM:-/usr/bin/chromium} (or set CHROMIUM)" "the browser tests, scripts/browser" \
      chromium SKIP_BROWSER=1
  fi

  # Node.js and npm: the conformance suite, the client's end-to-end test, the browser tests, and
  # the Rust tests that run the Node reference server or verify signatures with node's crypto.
  local node_version
  if ! prereqs_has node; then
    prereqs_missing "Node.js $PREREQS_NODE" "the conformance suite and Rust tests" "" \
      "Node.js $PREREQS_NODE from https://nodejs.org or NodeSource (Debian 12's nodejs is 18)" ""
  elif node_version=$(node --version 2>/dev/null) && ! prereqs_node_ok "$node_version"; then
    prereqs_missing "Node.js $PREREQS_NODE (found $node_version)" "the conformance suite (vite 8)" "" \
      "Node.js $PREREQS_NODE from https://nodejs.org or NodeSource (Debian 12's nodejs is 18)" ""
  fi
  # npm only when scripts/node-deps has to install (its stamp is not the lockfile).
  if ! prereqs_has npm && ! cmp -s "$root/conformance/package-lock.json" \
      "$root/conformance/node_modules/.brook-lock-stamp" 2>/dev/null; then
    prereqs_missing "npm" "scripts/node-deps (conformance/'s packages)" "" \
      "npm comes with Node.js from nodejs.org or NodeSource" ""
  fi
}

# prereqs_report: prints PREREQS_MISSING for a person to act on.
prereqs_report() {
  local n=${#PREREQS_MISSING[@]} line what why install skip
  echo "scripts/test: $n prerequisite$( ((n == 1)) || echo s) missing (nothing was built):" >&2
  for line in "${PREREQS_MISSING[@]}"; do
    IFS=$'\t' read -r what why install skip <<<"$line"
    echo "  - $what, for $why" >&2
    echo "      install: $install" >&2
    if [[ -n $skip ]]; then echo "      or skip the step: $skip scripts/test" >&2; fi
  done
  if ((${#PREREQS_PACKAGES[@]} > 1)); then
    echo "  Debian's packages at once: apt-get install -y --no-install-recommends ${PREREQS_PACKAGES[*]}" >&2
  fi
  if [[ ${#PREREQS_PACKAGES[@]} -gt 0 ]]; then
    if [[ -n ${PREREQS_INSTALLED:-} ]]; then
      echo "  (apt-get install ran for them, and these are still missing)" >&2
    elif [[ -n ${BROOK_NO_INSTALL:-} ]]; then
      echo "  (BROOK_NO_INSTALL is set: scripts/test installed none of them)" >&2
    elif [[ $(id -u) != 0 ]]; then
      echo "  (run as root with apt-get, scripts/test installs Debian's packages itself)" >&2
    fi
  fi
}

# prereqs_check ROOT: 0 when everything scripts/test needs is there (after installing what it
# may); otherwise lists what is missing and returns 1.
prereqs_check() {
  local root=$1
  prereqs_scan "$root"
  if ((${#PREREQS_PACKAGES[@]} > 0)) && [[ -z ${BROOK_NO_INSTALL:-} && $(id -u) == 0 ]] && prereqs_has apt-get; then
    echo "== installing Debian's ${PREREQS_PACKAGES[*]}"
    # A failed install is reported with the rest below, not by set -e here.
    apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PREREQS_PACKAGES[@]}" \
      || echo "scripts/test: apt-get could not install them all" >&2
    PREREQS_INSTALLED=1
    prereqs_scan "$root"
  fi
  if ((${#PREREQS_MISSING[@]} > 0)); then
    prereqs_report
    return 1
  fi
  echo "== prerequisites: all present"
}

# Run alone: check (and, as root, install), nothing else.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  prereqs_check "$(cd "$(dirname "$0")/../.." && pwd)"
fi
